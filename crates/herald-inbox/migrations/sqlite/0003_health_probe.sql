-- One row the health check writes while writes fail: only a committed write tells whether the storage
-- (a full disk, a failing device) takes writes again, and no event row may be touched to find out.
CREATE TABLE IF NOT EXISTS inbox_health_probe (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    probed_at BIGINT NOT NULL
);
