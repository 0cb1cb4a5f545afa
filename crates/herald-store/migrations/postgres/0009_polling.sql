-- Pull delivery (issue 20), as on SQLite (migration 0015 there): polling endpoints, their consumers'
-- offsets, and the per-application message stream they read. Text columns compare byte by byte (COLLATE
-- "C"), as everywhere in the schema (migration 0007).
--
-- Ingest transactions hold one advisory lock from their first insert to their commit (see the store's
-- `bulk`), so identity values taken by the trigger below follow commit order across every node, and a
-- reader paging by `seq` never skips a message that committed late. The trigger is per statement, over
-- the statement's new rows in id order, so a batch of messages is numbered in one insert.
CREATE TABLE message_stream (
    seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    app_id     TEXT COLLATE "C" NOT NULL REFERENCES application(id) ON DELETE CASCADE,
    message_id TEXT COLLATE "C" NOT NULL CONSTRAINT message_stream_message UNIQUE
);
CREATE INDEX message_stream_app ON message_stream (app_id, seq);

INSERT INTO message_stream (app_id, message_id) SELECT app_id, id FROM message ORDER BY id;

CREATE FUNCTION message_stream_append() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO message_stream (app_id, message_id) SELECT app_id, id FROM appended ORDER BY id;
    RETURN NULL;
END
$$;

CREATE TRIGGER message_stream_append AFTER INSERT ON message
    REFERENCING NEW TABLE AS appended FOR EACH STATEMENT EXECUTE FUNCTION message_stream_append();

CREATE TABLE polling_endpoint (
    id           TEXT COLLATE "C" PRIMARY KEY,
    app_id       TEXT COLLATE "C" NOT NULL REFERENCES application(id) ON DELETE CASCADE,
    uid          TEXT COLLATE "C",
    description  TEXT COLLATE "C" NOT NULL DEFAULT '',
    filter_types TEXT COLLATE "C",
    channels     TEXT COLLATE "C",
    metadata     TEXT COLLATE "C" NOT NULL DEFAULT '{}',
    secret       TEXT COLLATE "C" NOT NULL,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL,
    CONSTRAINT polling_endpoint_app_uid UNIQUE (app_id, uid)
);
CREATE INDEX polling_endpoint_app ON polling_endpoint (app_id, id);

CREATE TABLE polling_consumer (
    sink_id          TEXT COLLATE "C" NOT NULL REFERENCES polling_endpoint(id) ON DELETE CASCADE,
    consumer_id      TEXT COLLATE "C" NOT NULL,
    committed_seq    BIGINT NOT NULL,
    leased_seq       BIGINT NOT NULL,
    lease_expires_at BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    PRIMARY KEY (sink_id, consumer_id)
);
