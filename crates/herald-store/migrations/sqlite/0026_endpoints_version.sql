-- A counter per application that changes whenever one of its endpoints does: the ingest writer caches each
-- application's endpoint list and uses it only while this counter still has the value it was read at
-- (crates/herald-store/src/subscribers.rs). Triggers bump it in the same transaction as the change, so no
-- write path, present or future, can leave a stale list in use.
ALTER TABLE application ADD COLUMN endpoints_version INTEGER NOT NULL DEFAULT 0;

CREATE TRIGGER endpoint_inserted_bumps_version AFTER INSERT ON endpoint BEGIN
    UPDATE application SET endpoints_version = endpoints_version + 1 WHERE id = NEW.app_id;
END;

CREATE TRIGGER endpoint_updated_bumps_version AFTER UPDATE ON endpoint BEGIN
    UPDATE application SET endpoints_version = endpoints_version + 1 WHERE id IN (OLD.app_id, NEW.app_id);
END;

CREATE TRIGGER endpoint_deleted_bumps_version AFTER DELETE ON endpoint BEGIN
    UPDATE application SET endpoints_version = endpoints_version + 1 WHERE id = OLD.app_id;
END;
