-- While Herald's outbox reader is busy it polls the outbox on its own, so producers' commits need not
-- notify it: a notifying commit holds PostgreSQL's cluster-wide notification lock until its WAL is
-- flushed, so at a thousand commits a second the producers' commits went one flush at a time and
-- crowded the node's own. The reader marks itself awake here (a moment ahead) while it polls; the
-- trigger notifies only when it is not. A commit that finds it awake but lands after it stopped polling
-- is still read by its poll once a second.
CREATE TABLE herald_outbox_reader (
    singleton   BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    awake_until TIMESTAMPTZ NOT NULL DEFAULT '-infinity'
);
INSERT INTO herald_outbox_reader DEFAULT VALUES;
-- Producers' roles run the trigger: the table says nothing secret.
GRANT SELECT ON herald_outbox_reader TO PUBLIC;

-- Run by producers' roles under their own search_path, which need not name Herald's schema (an INSERT into
-- schema.herald_outbox): the function looks its table up where Herald's migrations ran.
CREATE OR REPLACE FUNCTION herald_outbox_notify() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM herald_outbox_reader WHERE awake_until > clock_timestamp()) THEN
        PERFORM pg_notify('herald_outbox', '');
    END IF;
    RETURN NULL;
END
$$;
