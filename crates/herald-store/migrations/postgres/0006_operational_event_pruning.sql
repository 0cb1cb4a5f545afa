-- The retention job deletes operational events the operational webhook has handled once they are older than
-- the retention period, oldest first, in small batches: this index finds each batch without a scan (unsent
-- events, which may be old when no webhook is configured, are not in it).
CREATE INDEX operational_event_sent ON operational_event (created_at) WHERE sent_at IS NOT NULL;
