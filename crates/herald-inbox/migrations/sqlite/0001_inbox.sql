-- herald inbox: events received from providers, and the version guard.
--
-- Standard SQL only (PostgreSQL has its own copy, migrations/postgres, with BYTEA for BLOB). Times are
-- Unix milliseconds.
--
-- The migrations are recorded in _herald_inbox_migrations, so that an inbox may share a file with the
-- sender. Files made before that recorded this migration in sqlx's default _sqlx_migrations; hence IF NOT
-- EXISTS: on such a file the migration is recorded anew and changes nothing.

CREATE TABLE IF NOT EXISTS inbox_event (
    id              TEXT PRIMARY KEY,          -- evt_…, time-ordered
    source          TEXT NOT NULL,             -- the configured source's name
    event_id        TEXT NOT NULL,             -- the provider's id for the event: the deduplication key
    headers         TEXT NOT NULL,             -- the request headers to forward, JSON [[name, value], …]
    body            BLOB NOT NULL,             -- the raw body, byte for byte
    received_at     BIGINT NOT NULL,
    status          TEXT NOT NULL,             -- pending, forwarded, stale, bad_input, dead
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    last_error      TEXT,
    resource_key    TEXT,
    version         TEXT,
    replays         INTEGER NOT NULL DEFAULT 0, -- bumped by every replay; fences out a stale in-flight result
    updated_at      BIGINT NOT NULL,
    UNIQUE (source, event_id)
);

-- The forwarder's work queue: only pending rows, so it stays small while history grows.
CREATE INDEX IF NOT EXISTS inbox_event_due ON inbox_event (next_attempt_at) WHERE status = 'pending';
-- Window replays.
CREATE INDEX IF NOT EXISTS inbox_event_source_received ON inbox_event (source, received_at);
-- Listings by status.
CREATE INDEX IF NOT EXISTS inbox_event_status ON inbox_event (status, id);

-- The newest version forwarded per resource of a source.
CREATE TABLE IF NOT EXISTS inbox_version (
    source       TEXT NOT NULL,
    resource_key TEXT NOT NULL,
    version      TEXT NOT NULL,
    inbox_id     TEXT NOT NULL,                -- the event that set it
    updated_at   BIGINT NOT NULL,
    PRIMARY KEY (source, resource_key)
);
