-- The names an endpoint's signature headers are sent under: `webhook`, `svix` or `both`; NULL (every
-- endpoint before this migration) for the operator's setting, HERALD_SIGNATURE_HEADERS.
ALTER TABLE endpoint ADD COLUMN signature_headers TEXT;
