-- Retention: a message may carry when its payload expires (payloadRetentionPeriod); attempts are removed
-- by age. Both indexes let the retention job find its next small batch without scanning the tables.
ALTER TABLE message ADD COLUMN payload_expires_at INTEGER;
CREATE INDEX message_payload_expiry ON message (payload_expires_at) WHERE payload_expires_at IS NOT NULL AND expunged = 0;
CREATE INDEX attempt_created ON attempt (created_at);
