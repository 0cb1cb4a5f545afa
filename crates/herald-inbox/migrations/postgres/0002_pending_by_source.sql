-- The metrics' backlog per source: the oldest pending event of a source is the first entry of this index
-- (one index probe per source, however many events wait), and the capped count walks only pending rows.
CREATE INDEX IF NOT EXISTS inbox_event_pending_source ON inbox_event (source, received_at) WHERE status = 'pending';
