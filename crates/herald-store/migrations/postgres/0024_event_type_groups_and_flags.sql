-- Event types keep Svix's `featureFlags` (a JSON list of names, as endpoint filters are kept) and
-- `groupName` (the display group), both optional, beside the older single `feature_flag`. Text columns
-- compare in byte order, like every text column of the sender (0007_byte_order_text.sql).
ALTER TABLE event_type ADD COLUMN feature_flags TEXT COLLATE "C";
ALTER TABLE event_type ADD COLUMN group_name TEXT COLLATE "C";
