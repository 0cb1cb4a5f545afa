-- The session an application token was issued for (`sessionId` of app-portal-access), so that
-- `expire-all` with `sessionIds` ends only those sessions' tokens. NULL: issued without one.
ALTER TABLE app_token ADD COLUMN session_id TEXT;
CREATE INDEX app_token_session ON app_token (app_id, session_id);
