-- Flow control and operations, as on SQLite (migrations 0004-0006 there): per-endpoint attempt timeout,
-- the per-application ownership check, re-queued deliveries' window start and trigger, expunged
-- payloads, and background tasks.

ALTER TABLE endpoint ADD COLUMN request_timeout_ms BIGINT;
ALTER TABLE application ADD COLUMN verify_endpoints BOOLEAN NOT NULL DEFAULT false;

-- NULL: the window starts at the message's creation (every delivery made by ingest).
ALTER TABLE delivery ADD COLUMN window_start BIGINT;
-- 0 scheduled, 1 manual (resend), 2 recover (recover, replay-missing).
ALTER TABLE delivery ADD COLUMN next_trigger BIGINT NOT NULL DEFAULT 0;
CREATE INDEX delivery_endpoint_status ON delivery (endpoint_id, status, seq);

ALTER TABLE message ADD COLUMN expunged BOOLEAN NOT NULL DEFAULT false;

CREATE TABLE background_task (
    id         TEXT PRIMARY KEY,
    kind       TEXT NOT NULL,
    app_id     TEXT NOT NULL,
    state      TEXT NOT NULL,
    processed  BIGINT NOT NULL DEFAULT 0,
    total      BIGINT NOT NULL DEFAULT 0,
    data       TEXT NOT NULL DEFAULT '{}',
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX background_task_app ON background_task (app_id, id);
