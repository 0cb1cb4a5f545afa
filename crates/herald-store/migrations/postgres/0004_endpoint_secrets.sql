-- Secrets (as SQLite's 0007): keys an endpoint rotated away from keep signing until they expire; custom
-- headers per endpoint. Both secrets and headers are stored sealed (`enc1:…`, see crypto.rs); rows written
-- before encryption are sealed when the store opens.

CREATE TABLE endpoint_secret (
    id          BIGSERIAL PRIMARY KEY,
    endpoint_id TEXT NOT NULL REFERENCES endpoint(id) ON DELETE CASCADE,
    secret      TEXT NOT NULL,
    rotated_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL
);
CREATE INDEX endpoint_secret_endpoint ON endpoint_secret (endpoint_id, expires_at);

-- '{}' in plaintext for rows from before: read as no headers, then sealed at start like the secrets.
ALTER TABLE endpoint ADD COLUMN headers TEXT NOT NULL DEFAULT '{}';
