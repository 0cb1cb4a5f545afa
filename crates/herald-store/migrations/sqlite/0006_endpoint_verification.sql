-- Applications may require every new endpoint to prove it is owned by whoever created it: Herald sends a
-- signed challenge and enables the endpoint only when it is echoed.
ALTER TABLE application ADD COLUMN verify_endpoints INTEGER NOT NULL DEFAULT 0;
