-- Flow control (issue 3): per-endpoint concurrency cap and ordering mode, per-message ordering key, and
-- the operational events Herald records (e.g. an endpoint disabled because it answered 410 Gone).

ALTER TABLE endpoint ADD COLUMN max_concurrency INTEGER;
ALTER TABLE endpoint ADD COLUMN ordering TEXT NOT NULL DEFAULT 'none';
ALTER TABLE message ADD COLUMN ordering_key TEXT;

CREATE TABLE operational_event (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    event_type TEXT NOT NULL,
    app_id     TEXT NOT NULL,
    data       TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX operational_event_app ON operational_event (app_id, seq);
