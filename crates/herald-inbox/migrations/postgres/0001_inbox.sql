-- herald inbox on PostgreSQL: the same tables as on SQLite (migrations/sqlite), with BYTEA for the body
-- and BIGINT for every integer (the shared decoder reads them as i64). Times are Unix milliseconds.
--
-- Every text column may hold a value from the network; Herald stores text escaped so that NUL (which
-- PostgreSQL's text cannot hold) round-trips. The tables are named inbox_… and the migrations are recorded
-- in _herald_inbox_migrations, so this schema sits beside the sender's in one database.

CREATE TABLE inbox_event (
    -- evt_…, time-ordered in byte order: "C" so that listings (ORDER BY id, id < cursor) follow time
    -- whatever the database's collation (under en_US, 'a' sorts before 'B' and the order would break).
    id              TEXT COLLATE "C" PRIMARY KEY,
    source          TEXT NOT NULL,             -- the configured source's name
    event_id        TEXT NOT NULL,             -- the provider's id for the event: the deduplication key
    headers         TEXT NOT NULL,             -- the request headers to forward, JSON [[name, value], …]
    body            BYTEA NOT NULL,            -- the raw body, byte for byte
    received_at     BIGINT NOT NULL,
    status          TEXT NOT NULL,             -- pending, forwarded, stale, bad_input, dead
    attempts        BIGINT NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    last_error      TEXT,
    resource_key    TEXT,
    version         TEXT,
    replays         BIGINT NOT NULL DEFAULT 0, -- bumped by every replay; fences out a stale in-flight result
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
