-- Herald outbox table for MariaDB 10.6+ / MySQL 8+ (see docs/outbox.md). Write a row in the same
-- transaction as the change it announces: `herald relay` publishes it and deletes it (or sets relayed_at).
CREATE TABLE IF NOT EXISTS herald_outbox (
    seq          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    event_id     VARCHAR(256) NOT NULL,           -- sent as eventId: Herald keeps one message per event id
    app          VARCHAR(256) NOT NULL,           -- the application's id or uid
    event_type   VARCHAR(256) NOT NULL,
    payload      LONGTEXT     NOT NULL CHECK (JSON_VALID(payload)),   -- a JSON object
    channels     TEXT         CHECK (channels IS NULL OR JSON_VALID(channels)),  -- JSON array or NULL
    ordering_key VARCHAR(256),                    -- rows with one key are published in seq order
    created_at   TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    relayed_at   TIMESTAMP(6) NULL,               -- set instead of deleting (herald relay --keep)
    relay_error  TEXT,                            -- why Herald refused the row (clear it to retry)
    KEY herald_outbox_ordering (ordering_key, seq)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
