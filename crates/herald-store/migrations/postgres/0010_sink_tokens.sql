-- As on SQLite (migration 0016 there): a token scoped to one polling endpoint, NULL for every other
-- application token; deleting the polling endpoint deletes its tokens.
ALTER TABLE app_token ADD COLUMN sink_id TEXT COLLATE "C" REFERENCES polling_endpoint(id) ON DELETE CASCADE;
CREATE INDEX app_token_sink ON app_token (sink_id) WHERE sink_id IS NOT NULL;
