-- Application-scoped bearer tokens (tenancy): only the SHA-256 of each token is kept, like the admin token's.
-- Deleting the application deletes its tokens.
CREATE TABLE app_token (
    token_sha256 TEXT PRIMARY KEY,
    app_id       TEXT NOT NULL REFERENCES application(id) ON DELETE CASCADE,
    read_only    INTEGER NOT NULL DEFAULT 0,
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL
);
CREATE INDEX app_token_app ON app_token (app_id);
