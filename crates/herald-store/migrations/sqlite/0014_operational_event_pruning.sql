-- The retention job deletes operational events older than the retention period, oldest first, in small
-- batches: this index finds each batch without a scan.
CREATE INDEX operational_event_created ON operational_event (created_at);
