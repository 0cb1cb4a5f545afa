-- Herald's schema on SQLite. Times are Unix milliseconds; JSON lists and maps are stored as JSON text.

CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE application (
    id         TEXT PRIMARY KEY,
    uid        TEXT UNIQUE,
    name       TEXT NOT NULL,
    rate_limit INTEGER,
    metadata   TEXT NOT NULL DEFAULT '{}',
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);

CREATE TABLE event_type (
    name         TEXT PRIMARY KEY,
    description  TEXT NOT NULL,
    archived     INTEGER NOT NULL DEFAULT 0,
    deprecated   INTEGER NOT NULL DEFAULT 0,
    feature_flag TEXT,
    schemas      TEXT,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL
);

CREATE TABLE endpoint (
    id              TEXT PRIMARY KEY,
    app_id          TEXT NOT NULL REFERENCES application(id) ON DELETE CASCADE,
    uid             TEXT,
    url             TEXT NOT NULL,
    description     TEXT NOT NULL DEFAULT '',
    filter_types    TEXT,
    channels        TEXT,
    disabled        INTEGER NOT NULL DEFAULT 0,
    disabled_reason TEXT,
    rate_limit      INTEGER,
    version         INTEGER NOT NULL DEFAULT 1,
    metadata        TEXT NOT NULL DEFAULT '{}',
    secret          TEXT NOT NULL,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    UNIQUE (app_id, uid)
);
CREATE INDEX endpoint_app ON endpoint (app_id, id);

CREATE TABLE message (
    id              TEXT PRIMARY KEY,
    app_id          TEXT NOT NULL REFERENCES application(id) ON DELETE CASCADE,
    event_id        TEXT,
    idempotency_key TEXT,
    event_type      TEXT NOT NULL,
    channels        TEXT,
    payload         BLOB NOT NULL,
    created_at      INTEGER NOT NULL,
    UNIQUE (app_id, event_id),
    UNIQUE (app_id, idempotency_key)
);
CREATE INDEX message_app_created ON message (app_id, created_at);
CREATE INDEX message_app_id ON message (app_id, id);

-- One row per message x subscribed endpoint, written in the same transaction as the message.
-- seq grows in commit order (one writer), which the scheduler's refill cursor relies on; AUTOINCREMENT
-- guarantees a seq is never reused, so a late result for a deleted delivery can never land on another one.
CREATE TABLE delivery (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id      TEXT NOT NULL REFERENCES message(id) ON DELETE CASCADE,
    endpoint_id     TEXT NOT NULL REFERENCES endpoint(id) ON DELETE CASCADE,
    status          INTEGER NOT NULL DEFAULT 0,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
);
-- Only pending rows are indexed, so the working set stays small while history grows.
CREATE INDEX delivery_pending ON delivery (endpoint_id, seq) WHERE status = 0;
CREATE INDEX delivery_message ON delivery (message_id);
CREATE INDEX delivery_endpoint ON delivery (endpoint_id);

-- Append-only attempt log.
CREATE TABLE attempt (
    id              TEXT PRIMARY KEY,
    delivery_seq    INTEGER NOT NULL,
    app_id          TEXT NOT NULL,
    message_id      TEXT NOT NULL,
    endpoint_id     TEXT NOT NULL,
    url             TEXT NOT NULL,
    attempt_number  INTEGER NOT NULL,
    success         INTEGER NOT NULL,
    outcome         TEXT NOT NULL,
    response_status INTEGER,
    response        TEXT NOT NULL,
    duration_ms     INTEGER NOT NULL,
    trigger_type    INTEGER NOT NULL,
    created_at      INTEGER NOT NULL
);
CREATE INDEX attempt_message ON attempt (message_id, id);
CREATE INDEX attempt_endpoint ON attempt (endpoint_id, id);
CREATE INDEX attempt_app ON attempt (app_id, id);
