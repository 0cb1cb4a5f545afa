-- Wide fan-outs written in two steps (crates/herald-store/src/split.rs): a message with more than 128
-- deliveries is committed with rows here, each the ids of up to 250 endpoints it goes to (a JSON array),
-- instead of its delivery rows; the writer inserts those right after, a row per transaction, deleting
-- the row in the same statement. Rows older than a few seconds were left by a node that stopped in
-- between: every node's writer takes them up. The rows go with their message (an application's delete).
CREATE TABLE fan_out_pending (
    message_id   TEXT COLLATE "C" NOT NULL REFERENCES message(id) ON DELETE CASCADE,
    chunk        INTEGER NOT NULL,
    endpoint_ids TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (message_id, chunk)
);
