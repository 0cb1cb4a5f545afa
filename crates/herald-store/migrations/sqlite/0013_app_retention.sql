-- An application's default payload retention (days; payloadRetentionPeriod), applied at ingest to messages
-- that set none of their own. NULL keeps their payloads.
ALTER TABLE application ADD COLUMN payload_retention_period INTEGER;
