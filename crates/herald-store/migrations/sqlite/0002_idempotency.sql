-- Responses remembered per idempotency key, so a client retrying a POST (the Svix SDKs send a key with
-- every POST and retry on timeouts and 5xx) gets the first answer instead of a second object.
CREATE TABLE idempotency (
    scope      TEXT NOT NULL,
    key        TEXT NOT NULL,
    status     INTEGER NOT NULL,
    body       BLOB NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_created ON idempotency (created_at);
