-- herald inbox: events received from providers, and the version guard.
--
-- Standard SQL only (PostgreSQL gets its own copy of this folder, with BYTEA for BLOB). Times are Unix
-- milliseconds.

CREATE TABLE inbox_event (
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
CREATE INDEX inbox_event_due ON inbox_event (next_attempt_at) WHERE status = 'pending';
-- Window replays.
CREATE INDEX inbox_event_source_received ON inbox_event (source, received_at);
-- Listings by status.
CREATE INDEX inbox_event_status ON inbox_event (status, id);

-- The newest version forwarded per resource of a source.
CREATE TABLE inbox_version (
    source       TEXT NOT NULL,
    resource_key TEXT NOT NULL,
    version      TEXT NOT NULL,
    inbox_id     TEXT NOT NULL,                -- the event that set it
    updated_at   BIGINT NOT NULL,
    PRIMARY KEY (source, resource_key)
);
