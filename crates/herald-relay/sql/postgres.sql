-- Herald outbox table for PostgreSQL (see docs/outbox.md). Write a row in the same transaction as the
-- change it announces: `herald relay` publishes it and deletes it (or sets relayed_at with --keep).
CREATE TABLE IF NOT EXISTS herald_outbox (
    seq          BIGSERIAL PRIMARY KEY,
    event_id     TEXT        NOT NULL,            -- sent as eventId: Herald keeps one message per event id
    app          TEXT        NOT NULL,            -- the application's id or uid
    event_type   TEXT        NOT NULL,
    payload      JSONB       NOT NULL,            -- a JSON object
    channels     JSONB,                           -- a JSON array of channel names, or NULL
    ordering_key TEXT,                            -- rows with one key are published in seq order
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    relayed_at   TIMESTAMPTZ,                     -- set instead of deleting (herald relay --keep)
    relay_error  TEXT                             -- why Herald refused the row (clear it to retry)
);
CREATE INDEX IF NOT EXISTS herald_outbox_unrelayed ON herald_outbox (seq)
    WHERE relayed_at IS NULL AND relay_error IS NULL;
CREATE INDEX IF NOT EXISTS herald_outbox_ordering ON herald_outbox (ordering_key, seq)
    WHERE relayed_at IS NULL AND relay_error IS NULL AND ordering_key IS NOT NULL;
