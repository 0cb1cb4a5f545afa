-- Operational webhooks: the operational_event table is also the outbox the sender reads. sent_at is NULL
-- until the event was delivered to the operator's URL (or given up on); the partial index keeps the
-- sender's scan to the unsent rows. Events about one delivery name its message and endpoint, so a later
-- success can tell whether a failure was reported before (message.attempt.recovered).
ALTER TABLE operational_event ADD COLUMN message_id TEXT;
ALTER TABLE operational_event ADD COLUMN endpoint_id TEXT;
ALTER TABLE operational_event ADD COLUMN sent_at INTEGER;
CREATE INDEX operational_event_unsent ON operational_event (seq) WHERE sent_at IS NULL;
CREATE INDEX operational_event_delivery ON operational_event (message_id, endpoint_id) WHERE message_id IS NOT NULL;
