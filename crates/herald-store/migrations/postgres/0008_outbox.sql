-- The transactional outbox for producers on Herald's own PostgreSQL (docs/outbox.md).
--
-- A producer calls herald_publish(...) inside its own transaction: the row commits with the producer's
-- change or not at all. Herald turns each committed row into a message and deletes it in one transaction
-- (the ingest batch that inserts the message), so a row becomes exactly one message.
-- Text compares byte by byte, as everywhere in Herald's schema (0007_byte_order_text).
CREATE TABLE herald_outbox (
    seq          BIGSERIAL PRIMARY KEY,
    app_id       TEXT COLLATE "C" NOT NULL,   -- resolved by herald_publish from an id or a uid
    event_type   TEXT COLLATE "C" NOT NULL,
    payload      JSONB       NOT NULL,
    event_id     TEXT COLLATE "C" NOT NULL,   -- the message's eventId: idempotency on replays and retries
    channels     TEXT[],
    ordering_key TEXT COLLATE "C",
    created_at   TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    error        TEXT COLLATE "C"        -- why Herald could not make a message of it (skipped until cleared)
);
CREATE INDEX herald_outbox_pending ON herald_outbox (seq) WHERE error IS NULL;

-- Wake Herald's outbox reader when rows commit (a notification is delivered at commit, never on rollback).
CREATE FUNCTION herald_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('herald_outbox', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER herald_outbox_notify AFTER INSERT ON herald_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION herald_outbox_notify();

-- Publish an event from inside the caller's transaction; checks what POST /app/{app}/msg checks and
-- raises (SQLSTATE 22023, or P0002 for an unknown app) instead of queueing a message that would be
-- refused. `channels`: comma-separated names. Returns the outbox row's seq.
CREATE FUNCTION herald_publish(
    app          TEXT,
    event_type   TEXT,
    payload      JSONB,
    event_id     TEXT,
    channels     TEXT DEFAULT NULL,
    ordering_key TEXT DEFAULT NULL
) RETURNS BIGINT LANGUAGE plpgsql AS $$
DECLARE
    resolved TEXT;
    names    TEXT[];
    channel  TEXT;
    new_seq  BIGINT;
BEGIN
    SELECT a.id INTO resolved FROM application a WHERE a.id = app OR a.uid = app ORDER BY (a.id = app) DESC LIMIT 1;
    IF resolved IS NULL THEN
        RAISE EXCEPTION 'herald_publish: application % not found', app USING ERRCODE = 'P0002';
    END IF;
    IF event_type IS NULL OR event_type !~ '^[A-Za-z0-9._-]+$' OR octet_length(event_type) > 256 THEN
        RAISE EXCEPTION 'herald_publish: event_type must be 1 to 256 characters of letters, digits, ''-'', ''_'', ''.'''
            USING ERRCODE = '22023';
    END IF;
    IF payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
        RAISE EXCEPTION 'herald_publish: payload must be a JSON object' USING ERRCODE = '22023';
    END IF;
    IF event_id IS NULL OR btrim(event_id) = '' OR octet_length(event_id) > 256 THEN
        RAISE EXCEPTION 'herald_publish: event_id must be 1 to 256 bytes' USING ERRCODE = '22023';
    END IF;
    IF ordering_key IS NOT NULL AND (btrim(ordering_key) = '' OR octet_length(ordering_key) > 256) THEN
        RAISE EXCEPTION 'herald_publish: ordering_key must be 1 to 256 bytes' USING ERRCODE = '22023';
    END IF;
    IF channels IS NOT NULL THEN
        names := ARRAY(SELECT btrim(c) FROM unnest(string_to_array(channels, ',')) AS c);
        IF cardinality(names) > 5 THEN
            RAISE EXCEPTION 'herald_publish: at most 5 channels' USING ERRCODE = '22023';
        END IF;
        FOREACH channel IN ARRAY names LOOP
            IF channel !~ '^[A-Za-z0-9._:-]+$' OR octet_length(channel) > 256 THEN
                RAISE EXCEPTION 'herald_publish: channel % must be 1 to 256 characters of letters, digits, ''-'', ''_'', ''.'', '':''', quote_literal(channel)
                    USING ERRCODE = '22023';
            END IF;
        END LOOP;
    END IF;
    INSERT INTO herald_outbox (app_id, event_type, payload, event_id, channels, ordering_key)
        VALUES (resolved, event_type, payload, event_id, names, ordering_key)
        RETURNING herald_outbox.seq INTO new_seq;
    RETURN new_seq;
END
$$;
