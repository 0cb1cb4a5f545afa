-- An endpoint may set its own attempt timeout (milliseconds), within the operator's bound.
ALTER TABLE endpoint ADD COLUMN request_timeout_ms INTEGER;
