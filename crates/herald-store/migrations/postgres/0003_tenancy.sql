-- As on SQLite (migrations 0010-0012 there): application-scoped tokens, the operational-event outbox,
-- and payload retention.

CREATE TABLE app_token (
    token_sha256 TEXT PRIMARY KEY,
    app_id       TEXT NOT NULL REFERENCES application(id) ON DELETE CASCADE,
    read_only    BOOLEAN NOT NULL DEFAULT false,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL
);
CREATE INDEX app_token_app ON app_token (app_id);

ALTER TABLE operational_event ADD COLUMN message_id TEXT;
ALTER TABLE operational_event ADD COLUMN endpoint_id TEXT;
ALTER TABLE operational_event ADD COLUMN sent_at BIGINT;
CREATE INDEX operational_event_unsent ON operational_event (seq) WHERE sent_at IS NULL;
CREATE INDEX operational_event_delivery ON operational_event (message_id, endpoint_id) WHERE message_id IS NOT NULL;

ALTER TABLE message ADD COLUMN payload_expires_at BIGINT;
CREATE INDEX message_payload_expiry ON message (payload_expires_at) WHERE payload_expires_at IS NOT NULL AND NOT expunged;
