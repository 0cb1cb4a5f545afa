-- Operations (issue 8): re-queued deliveries carry when their time window starts and why their next
-- attempt is made; bulk operations run as tracked background tasks; payloads can be expunged.

-- NULL: the window starts at the message's creation (every delivery made by ingest).
ALTER TABLE delivery ADD COLUMN window_start INTEGER;
-- 0 scheduled, 1 manual (resend), 2 recover (recover, replay-missing).
ALTER TABLE delivery ADD COLUMN next_trigger INTEGER NOT NULL DEFAULT 0;
-- Deliveries of an endpoint by status, for recover, listings and stats.
CREATE INDEX delivery_endpoint_status ON delivery (endpoint_id, status, seq);

ALTER TABLE message ADD COLUMN expunged INTEGER NOT NULL DEFAULT 0;

CREATE TABLE background_task (
    id         TEXT PRIMARY KEY,
    kind       TEXT NOT NULL,
    app_id     TEXT NOT NULL,
    state      TEXT NOT NULL,
    processed  INTEGER NOT NULL DEFAULT 0,
    total      INTEGER NOT NULL DEFAULT 0,
    data       TEXT NOT NULL DEFAULT '{}',
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX background_task_app ON background_task (app_id, id);
