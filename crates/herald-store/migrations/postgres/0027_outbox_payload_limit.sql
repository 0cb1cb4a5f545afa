-- Herald's max_payload_bytes holds for its outbox as for the API (docs/outbox.md): a producer learns of a
-- payload the API would refuse with 413 in its own transaction, not after its commit.
--
-- Creating the trigger below locks herald_outbox against writes until this migration commits, and waits
-- for the producers' open transactions that wrote to it; while it waits, their new writes queue behind it.
-- So it waits 5 s at most and then fails (the node does not start, says why, and the next start tries
-- again), rather than stall every producer behind a long transaction.
SET LOCAL lock_timeout = '5s';
--
-- Each node writes its limit here when it starts (the last to start wins: give every node the same). NULL
-- until a node has: then only the reader checks. The reader also checks every row against its own node's
-- limit, for rows that got in under a larger one (another node's, or before its node started).
CREATE TABLE herald_outbox_limit (
    singleton         BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    max_payload_bytes BIGINT
);
INSERT INTO herald_outbox_limit DEFAULT VALUES;
-- Producers' roles run the trigger below: the table says nothing secret.
GRANT SELECT ON herald_outbox_limit TO PUBLIC;

-- Why an outbox row with a payload of `bytes` bytes (as the row keeps it: payload::text, which becomes the
-- message's payload) is refused under the limit `max_payload_bytes`; NULL when it is not (or no limit is
-- known). The one text of the rule: the trigger below raises it, the reader marks a row with it.
CREATE FUNCTION herald_outbox_payload_refusal(bytes BIGINT, max_payload_bytes BIGINT) RETURNS TEXT
    LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN bytes > max_payload_bytes
        THEN format('payload of %s bytes is larger than Herald''s max_payload_bytes (%s)', bytes, max_payload_bytes)
    END
$$;
-- Producers' roles call it through the trigger, also where an operator revoked EXECUTE from PUBLIC by
-- default. Every call passes exactly (bigint, bigint), so an overload a producer might create with other
-- argument types (say integer, reached before this one by an implicit cast) is never chosen.
GRANT EXECUTE ON FUNCTION herald_outbox_payload_refusal(BIGINT, BIGINT) TO PUBLIC;

-- Refuse a row whose payload the API would refuse, in the inserting transaction (herald_publish's, or a
-- producer's own INSERT): SQLSTATE 54000 (program_limit_exceeded), as the API's 413. Run by producers'
-- roles under their own search_path: the function looks its tables up where Herald's migrations ran.
CREATE FUNCTION herald_outbox_check_payload() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    refusal TEXT;
BEGIN
    SELECT herald_outbox_payload_refusal(octet_length(NEW.payload::text)::bigint, l.max_payload_bytes) INTO refusal
        FROM herald_outbox_limit l;
    IF refusal IS NOT NULL THEN
        RAISE EXCEPTION 'herald_outbox: %', refusal USING ERRCODE = '54000';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER herald_outbox_check_payload BEFORE INSERT ON herald_outbox
    FOR EACH ROW EXECUTE FUNCTION herald_outbox_check_payload();
