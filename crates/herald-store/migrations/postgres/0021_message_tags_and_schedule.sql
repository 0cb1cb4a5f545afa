-- Message tags (Svix's `tags`) and scheduled delivery (`deliverAt`).
--
-- `tags` is the message's list as JSON text (echoed in every MessageOut); `message_tag` holds one row per
-- tag, so a listing filtered by `tag` walks this index, newest message first, instead of every message
-- of the application. `deliver_at` is the time the producer asked for; the message's deliveries are
-- committed with their first attempt due then (`delivery.next_attempt_at`, as a retry is). Text columns
-- compare in byte order, like every text column of the sender (0007_byte_order_text.sql).
ALTER TABLE message ADD COLUMN tags TEXT COLLATE "C";
ALTER TABLE message ADD COLUMN deliver_at BIGINT;

CREATE TABLE message_tag (
    app_id     TEXT COLLATE "C" NOT NULL,
    tag        TEXT COLLATE "C" NOT NULL,
    message_id TEXT COLLATE "C" NOT NULL REFERENCES message(id) ON DELETE CASCADE,
    PRIMARY KEY (app_id, tag, message_id)
);
-- For the cascade when a message (or its application) is deleted.
CREATE INDEX message_tag_message ON message_tag (message_id);
