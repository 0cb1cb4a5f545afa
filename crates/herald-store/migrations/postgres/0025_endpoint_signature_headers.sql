-- The names an endpoint's signature headers are sent under: `webhook`, `svix` or `both`; NULL (every
-- endpoint before this migration) for the operator's setting, HERALD_SIGNATURE_HEADERS. Text columns
-- compare in byte order, like every text column of the sender (0007_byte_order_text.sql).
ALTER TABLE endpoint ADD COLUMN signature_headers TEXT COLLATE "C";
