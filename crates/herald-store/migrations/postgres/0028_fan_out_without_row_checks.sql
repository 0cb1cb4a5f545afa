-- Fan-out without a check per delivery row (docs/performance.md, "Fan-out on PostgreSQL without row
-- checks"). Writing 1,000 deliveries spent half its time in the two foreign keys' per-row checks and the
-- batch read (and share-locked) every endpoint of the application for every message.
--
-- 1. A counter per application that changes whenever one of its endpoints does, as SQLite's migration
--    0026 adds: the ingest writer caches each application's endpoint list and uses it only while the
--    counter, read under the batch's share lock on the application row, still has the value the list was
--    read at (crates/herald-store/src/subscribers.rs). The trigger bumps it in the transaction that
--    changes the endpoint, so no write path can leave a stale list in use, and its row lock on the
--    application makes an endpoint write wait for the batches fanning out to that application, and the
--    batches after it wait for the write.
ALTER TABLE application ADD COLUMN endpoints_version BIGINT NOT NULL DEFAULT 0;

CREATE FUNCTION herald_endpoint_bumps_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE application SET endpoints_version = endpoints_version + 1 WHERE id = NEW.app_id;
    ELSIF TG_OP = 'DELETE' THEN
        UPDATE application SET endpoints_version = endpoints_version + 1 WHERE id = OLD.app_id;
    ELSE
        UPDATE application SET endpoints_version = endpoints_version + 1 WHERE id IN (OLD.app_id, NEW.app_id);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER endpoint_bumps_version AFTER INSERT OR UPDATE OR DELETE ON endpoint
    FOR EACH ROW EXECUTE FUNCTION herald_endpoint_bumps_version();

-- 2. No foreign keys from `delivery`: what they guarded is kept by lock order instead. Every path that
--    adds deliveries holds what they point at — ingest the application row (above) and the message it
--    has just inserted; re-queues and replays their endpoint `FOR KEY SHARE` — and deleting an endpoint
--    or an application deletes its deliveries itself, after the endpoint row (crates/herald-store/src/
--    portable/mod.rs, `delete_endpoint` and `delete_app`). Messages are deleted only with their
--    application, whose endpoints, and with them every delivery of its messages, go first.
ALTER TABLE delivery DROP CONSTRAINT delivery_message_id_fkey, DROP CONSTRAINT delivery_endpoint_id_fkey;

-- 3. `delivery_endpoint_status (endpoint_id, status, seq)` serves every lookup by endpoint; on
--    PostgreSQL `delivery_endpoint (endpoint_id)` was one more index to write per delivery (SQLite keeps
--    its own: there its entries are in `seq` order, see portable/operations.rs).
DROP INDEX delivery_endpoint;
