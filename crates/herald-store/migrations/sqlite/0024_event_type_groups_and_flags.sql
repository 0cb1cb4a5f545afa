-- Event types keep Svix's `featureFlags` (a JSON list of names, as endpoint filters are kept) and
-- `groupName` (the display group), both optional, beside the older single `feature_flag`.
ALTER TABLE event_type ADD COLUMN feature_flags TEXT;
ALTER TABLE event_type ADD COLUMN group_name TEXT;
