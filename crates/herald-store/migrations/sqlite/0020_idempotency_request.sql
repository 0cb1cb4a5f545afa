-- A digest of the request each remembered idempotent answer was for: reusing a key for a different
-- request (another body, path or query) is refused instead of answered with the first request's answer.
-- Rows remembered before this have none and are replayed as before until they expire (24 hours).
ALTER TABLE idempotency ADD COLUMN request_digest TEXT;
