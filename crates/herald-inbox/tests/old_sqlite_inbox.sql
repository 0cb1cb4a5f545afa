-- An inbox file as the first release left it: the inbox's schema (migrations/sqlite/0001_inbox.sql as it
-- was then, recorded in sqlx's default _sqlx_migrations) and one event.

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

CREATE INDEX inbox_event_due ON inbox_event (next_attempt_at) WHERE status = 'pending';
CREATE INDEX inbox_event_source_received ON inbox_event (source, received_at);
CREATE INDEX inbox_event_status ON inbox_event (status, id);

CREATE TABLE inbox_version (
    source       TEXT NOT NULL,
    resource_key TEXT NOT NULL,
    version      TEXT NOT NULL,
    inbox_id     TEXT NOT NULL,                -- the event that set it
    updated_at   BIGINT NOT NULL,
    PRIMARY KEY (source, resource_key)
);

CREATE TABLE _sqlx_migrations (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
    success BOOLEAN NOT NULL,
    checksum BLOB NOT NULL,
    execution_time BIGINT NOT NULL
);
INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
VALUES (1, 'inbox', TRUE, X'00', 1);

-- An id of the form every release has made (`evt_` and 22 base62 characters): the store reads ids back checked.
INSERT INTO inbox_event (id, source, event_id, headers, body, received_at, status, attempts, next_attempt_at,
    last_error, resource_key, version, replays, updated_at)
VALUES ('evt_0000000000000000000old', 's', 'old', '[]', X'7B7D', 1, 'forwarded', 1, 1, NULL, NULL, NULL, 0, 1);
