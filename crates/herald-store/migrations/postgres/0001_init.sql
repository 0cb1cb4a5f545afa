-- Herald's schema on PostgreSQL. The same tables, columns and representations as on SQLite (times are
-- Unix milliseconds, JSON lists and maps are JSON text, payloads are bytes), so the row decoding is
-- shared. Unique constraints are named after their columns: the store reads the name to tell the API
-- which field conflicts.

CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE application (
    id         TEXT PRIMARY KEY,
    uid        TEXT CONSTRAINT application_uid UNIQUE,
    name       TEXT NOT NULL,
    rate_limit BIGINT,
    metadata   TEXT NOT NULL DEFAULT '{}',
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE event_type (
    name         TEXT CONSTRAINT event_type_name PRIMARY KEY,
    description  TEXT NOT NULL,
    archived     BOOLEAN NOT NULL DEFAULT false,
    deprecated   BOOLEAN NOT NULL DEFAULT false,
    feature_flag TEXT,
    schemas      TEXT,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL
);

CREATE TABLE endpoint (
    id              TEXT PRIMARY KEY,
    app_id          TEXT NOT NULL REFERENCES application(id) ON DELETE CASCADE,
    uid             TEXT,
    url             TEXT NOT NULL,
    description     TEXT NOT NULL DEFAULT '',
    filter_types    TEXT,
    channels        TEXT,
    disabled        BOOLEAN NOT NULL DEFAULT false,
    disabled_reason TEXT,
    rate_limit      BIGINT,
    max_concurrency BIGINT,
    ordering        TEXT NOT NULL DEFAULT 'none',
    version         BIGINT NOT NULL DEFAULT 1,
    metadata        TEXT NOT NULL DEFAULT '{}',
    secret          TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    CONSTRAINT endpoint_app_uid UNIQUE (app_id, uid)
);
CREATE INDEX endpoint_app ON endpoint (app_id, id);

CREATE TABLE message (
    id              TEXT PRIMARY KEY,
    app_id          TEXT NOT NULL REFERENCES application(id) ON DELETE CASCADE,
    event_id        TEXT,
    idempotency_key TEXT,
    event_type      TEXT NOT NULL,
    channels        TEXT,
    payload         BYTEA NOT NULL,
    ordering_key    TEXT,
    created_at      BIGINT NOT NULL,
    CONSTRAINT message_event_id UNIQUE (app_id, event_id),
    CONSTRAINT message_idempotency_key UNIQUE (app_id, idempotency_key)
);
CREATE INDEX message_app_created ON message (app_id, created_at);
CREATE INDEX message_app_id ON message (app_id, id);

-- One row per message x subscribed endpoint, written in the same transaction as the message. Ingest
-- transactions take one advisory lock from before their first insert until they commit, so seq grows in
-- commit order across every node: the schedulers' refill cursors and the work watcher rely on it.
-- `partition` is the endpoint's delivery partition (see partition_lease).
CREATE TABLE delivery (
    seq             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id      TEXT NOT NULL REFERENCES message(id) ON DELETE CASCADE,
    endpoint_id     TEXT NOT NULL REFERENCES endpoint(id) ON DELETE CASCADE,
    partition       INTEGER NOT NULL,
    status          BIGINT NOT NULL DEFAULT 0,
    attempts        BIGINT NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL
);
-- Only pending rows are indexed, so the working set stays small while history grows.
CREATE INDEX delivery_pending ON delivery (endpoint_id, seq) WHERE status = 0;
CREATE INDEX delivery_pending_partition ON delivery (partition, endpoint_id) WHERE status = 0;
CREATE INDEX delivery_message ON delivery (message_id);
CREATE INDEX delivery_endpoint ON delivery (endpoint_id);

-- Append-only attempt log, partitioned by day (of created_at, in milliseconds) so that retention drops
-- whole partitions instead of deleting rows. The store creates the partitions a few days ahead; the
-- default partition only catches rows outside them (e.g. a clock far off).
CREATE TABLE attempt (
    id              TEXT NOT NULL,
    delivery_seq    BIGINT NOT NULL,
    app_id          TEXT NOT NULL,
    message_id      TEXT NOT NULL,
    endpoint_id     TEXT NOT NULL,
    url             TEXT NOT NULL,
    attempt_number  BIGINT NOT NULL,
    success         BOOLEAN NOT NULL,
    outcome         TEXT NOT NULL,
    response_status BIGINT,
    response        TEXT NOT NULL,
    duration_ms     BIGINT NOT NULL,
    trigger_type    BIGINT NOT NULL,
    created_at      BIGINT NOT NULL,
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
CREATE TABLE attempt_default PARTITION OF attempt DEFAULT;
CREATE INDEX attempt_message ON attempt (message_id, id);
CREATE INDEX attempt_endpoint ON attempt (endpoint_id, id);
CREATE INDEX attempt_app ON attempt (app_id, id);

CREATE TABLE idempotency (
    scope      TEXT NOT NULL,
    key        TEXT NOT NULL,
    status     BIGINT NOT NULL,
    body       BYTEA NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_created ON idempotency (created_at);

CREATE TABLE operational_event (
    seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_type TEXT NOT NULL,
    app_id     TEXT NOT NULL,
    data       TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX operational_event_app ON operational_event (app_id, seq);

-- Scale-out. Every node heartbeats here; a node is live while its heartbeat is younger than the lease
-- time. Times here are the database's clock, so nodes' clocks need not agree.
CREATE TABLE node (
    id           TEXT PRIMARY KEY,
    started_at   TIMESTAMPTZ NOT NULL,
    heartbeat_at TIMESTAMPTZ NOT NULL
);

-- Delivery work is split by endpoint into a fixed number of partitions, each owned by at most one node
-- at a time through a lease. `epoch` grows at every change of owner; every write an owner makes is
-- fenced on (partition, owner, epoch), so a paused-then-revived owner cannot overwrite its successor.
CREATE TABLE partition_lease (
    partition  INTEGER PRIMARY KEY,
    owner      TEXT,
    epoch      BIGINT NOT NULL DEFAULT 0,
    expires_at TIMESTAMPTZ NOT NULL DEFAULT '-infinity'
);
INSERT INTO partition_lease (partition) SELECT generate_series(0, 255);
