-- `app_token.session_id` (0022) compares byte by byte like every other text column of Herald's tables
-- (see 0007: a column of another collation cannot be compared with theirs, and the store suite checks that
-- none is left). Changing a column's collation rebuilds the index on it (`app_token_session`).
ALTER TABLE app_token ALTER COLUMN session_id TYPE TEXT COLLATE "C";
