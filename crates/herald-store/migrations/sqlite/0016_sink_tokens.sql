-- A token scoped to one polling endpoint (issue 20): an application token that may only read that
-- polling endpoint's stream and move its consumers' offsets. NULL for every other application token.
-- Deleting the polling endpoint deletes its tokens.
ALTER TABLE app_token ADD COLUMN sink_id TEXT REFERENCES polling_endpoint(id) ON DELETE CASCADE;
CREATE INDEX app_token_sink ON app_token (sink_id) WHERE sink_id IS NOT NULL;
