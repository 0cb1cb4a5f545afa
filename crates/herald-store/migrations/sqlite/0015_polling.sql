-- Pull delivery (issue 20): polling endpoints, their consumers' offsets, and the per-application message
-- stream they read.
--
-- `message_stream` numbers every message of an application in commit order: one writer commits on SQLite,
-- so AUTOINCREMENT order is commit order and a reader paging by `seq` never skips a message that committed
-- late. It is filled by a trigger so that every way a message is written is numbered, and so the ingest
-- path stays as it is. A consumer's offset is a `seq`; AUTOINCREMENT never reuses one, not even after the
-- newest rows are deleted, so an offset can never come to mean another message.
CREATE TABLE message_stream (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    app_id     TEXT NOT NULL REFERENCES application(id) ON DELETE CASCADE,
    message_id TEXT NOT NULL UNIQUE
);
-- The poll: an index range read of one application's stream from an offset.
CREATE INDEX message_stream_app ON message_stream (app_id, seq);

INSERT INTO message_stream (app_id, message_id) SELECT app_id, id FROM message ORDER BY id;

CREATE TRIGGER message_stream_append AFTER INSERT ON message
BEGIN
    INSERT INTO message_stream (app_id, message_id) VALUES (NEW.app_id, NEW.id);
END;

-- A polling endpoint ("sink"): an application's stream filtered like an endpoint, with its own signing key
-- (sealed like an endpoint's) for `herald listen`.
CREATE TABLE polling_endpoint (
    id           TEXT PRIMARY KEY,
    app_id       TEXT NOT NULL REFERENCES application(id) ON DELETE CASCADE,
    uid          TEXT,
    description  TEXT NOT NULL DEFAULT '',
    filter_types TEXT,
    channels     TEXT,
    metadata     TEXT NOT NULL DEFAULT '{}',
    secret       TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    UNIQUE (app_id, uid)
);
CREATE INDEX polling_endpoint_app ON polling_endpoint (app_id, id);

-- A consumer's position in a polling endpoint's stream: everything up to `committed_seq` is processed.
-- `leased_seq`/`lease_expires_at` hold the batch the last v2 poll handed out, not yet committed: until the
-- lease expires the next poll continues after it, then it is served again (at least once).
CREATE TABLE polling_consumer (
    sink_id          TEXT NOT NULL REFERENCES polling_endpoint(id) ON DELETE CASCADE,
    consumer_id      TEXT NOT NULL,
    committed_seq    INTEGER NOT NULL,
    leased_seq       INTEGER NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    PRIMARY KEY (sink_id, consumer_id)
);
