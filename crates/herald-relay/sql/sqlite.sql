-- Herald outbox table for SQLite (see docs/outbox.md). Write a row in the same transaction as the change
-- it announces: `herald relay` publishes it and deletes it (or sets relayed_at with --keep).
CREATE TABLE IF NOT EXISTS herald_outbox (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused, so seq order is insertion order
    event_id     TEXT    NOT NULL,                   -- sent as eventId: one message per event id
    app          TEXT    NOT NULL,                   -- the application's id or uid
    event_type   TEXT    NOT NULL,
    payload      TEXT    NOT NULL CHECK (json_valid(payload)),   -- a JSON object
    channels     TEXT    CHECK (channels IS NULL OR json_valid(channels)),  -- JSON array or NULL
    ordering_key TEXT,                               -- rows with one key are published in seq order
    created_at   INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),  -- Unix ms
    relayed_at   INTEGER,                            -- set instead of deleting (herald relay --keep)
    relay_error  TEXT                                -- why Herald refused the row (clear it to retry)
);
CREATE INDEX IF NOT EXISTS herald_outbox_ordering ON herald_outbox (ordering_key, seq)
    WHERE relayed_at IS NULL AND relay_error IS NULL AND ordering_key IS NOT NULL;
