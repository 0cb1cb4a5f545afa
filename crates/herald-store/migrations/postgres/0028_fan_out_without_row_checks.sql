-- Fan-out without a check per delivery row (docs/performance.md, "PostgreSQL's fan-out without per-row
-- checks"). Writing 1,000 deliveries spent half its time in the two foreign keys' per-row checks and the
-- batch read (and share-locked) every endpoint of the application for every message.
--
-- Every node must run this version once it has run: an older node's endpoint or application delete
-- relies on the cascades dropped below and would leave deliveries behind (README, "Upgrading").
-- The statements below lock `application`, `endpoint` and `delivery`: wait 5 s at most for the locks,
-- and otherwise fail the start with the reason, rather than stall every ingest behind a long transaction.
SET LOCAL lock_timeout = '5s';
--
-- 1. A counter per application that changes whenever one of its endpoints is added or deleted or changes
--    what fan-out reads of it (SQLite's migration 0026 adds one that changes at every endpoint write): the ingest writer caches each application's endpoint list and uses it only while the
--    counter, read under the batch's share lock on the application row, still has the value the list was
--    read at (crates/herald-store/src/subscribers.rs). The trigger bumps it in the transaction that
--    changes the endpoint, so no write path can leave a stale list in use, and its row lock on the
--    application makes an endpoint write wait for the batches fanning out to that application, and the
--    batches after it wait for the write.
ALTER TABLE application ADD COLUMN endpoints_version BIGINT NOT NULL DEFAULT 0;

--    Only a change of what fan-out reads of an endpoint (`subscribers::COLUMNS`: its application, event
--    types and channels; disabled endpoints are subscribers too) bumps it: a secret rotation, a state
--    change or a re-seal neither empties every node's cache nor waits for the application's batches.
--    Every write that does bump it locks the endpoint's row before the application's; `delete_app` takes
--    them in that order too (and starts again when an endpoint was added between the two).
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

CREATE TRIGGER endpoint_added_or_deleted_bumps_version AFTER INSERT OR DELETE ON endpoint
    FOR EACH ROW EXECUTE FUNCTION herald_endpoint_bumps_version();
CREATE TRIGGER endpoint_subscription_changed_bumps_version AFTER UPDATE ON endpoint
    FOR EACH ROW WHEN (OLD.app_id IS DISTINCT FROM NEW.app_id OR OLD.filter_types IS DISTINCT FROM NEW.filter_types
        OR OLD.channels IS DISTINCT FROM NEW.channels)
    EXECUTE FUNCTION herald_endpoint_bumps_version();

-- 2. No foreign keys from `delivery`: what they guarded is kept by lock order instead. Every path that
--    adds deliveries holds what they point at — ingest the application row (above) and the message it
--    has just inserted; re-queues and replays their endpoint `FOR KEY SHARE` — and deleting an endpoint
--    or an application deletes its deliveries itself, after the endpoint row (crates/herald-store/src/
--    portable/mod.rs, `delete_endpoint` and `delete_app`). Messages are deleted only with their
--    application, whose endpoints, and with them every delivery of its messages, go first.
ALTER TABLE delivery DROP CONSTRAINT delivery_message_id_fkey, DROP CONSTRAINT delivery_endpoint_id_fkey;

-- 3. Two indexes fewer to write per delivery (1,000 rows took 14.4 ms with five indexes, 10.5 ms with
--    four, 3.6 ms into the bare table). `delivery_endpoint_status (endpoint_id, status,
--    seq)` serves every lookup by endpoint, and with `status = 0` it walks an endpoint's pending
--    deliveries in `seq` order, as `delivery_pending (endpoint_id, seq) WHERE status = 0` did (the
--    scheduler's reads, the backlog count, expiry's head); the pending endpoints of a partition come from
--    `delivery_pending_partition`. SQLite keeps both: there `delivery_endpoint`'s entries are in `seq`
--    order (see portable/operations.rs), and its start-up read of every endpoint with pending work scans
--    `delivery_pending` (PostgreSQL's reads that by partition).
DROP INDEX delivery_endpoint;
DROP INDEX delivery_pending;
