-- Every text column of Herald's tables compares byte by byte (COLLATE "C"), whatever the database's default.
--
-- Ids are time-ordered only in byte order, and listings page by them: the reconciliation listing promises
-- that a message created after a page was read sorts after that page. Under a linguistic default collation
-- (a server initialised with en_US.UTF-8, the common case) "msg_2Ab" and "msg_2aB" compare
-- case-insensitively first, so a new message could sort before a cursor and never be listed. Every text
-- column, not only ids: comparing two columns of different collations is an error in PostgreSQL, so the
-- schema must not mix them. Later migrations must declare new text columns COLLATE "C" too (the store
-- suite checks it on a database with a linguistic default).
--
-- Partitions of `attempt` follow their parent. The inbox's tables (`inbox_…`), when they share this
-- database, are the inbox's own business and are left alone.
DO $$
DECLARE
    col record;
BEGIN
    FOR col IN
        SELECT c.relname AS tab, a.attname AS name
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = current_schema()
          AND c.relkind IN ('r', 'p')
          AND NOT c.relispartition
          AND c.relname = ANY (ARRAY['meta', 'application', 'event_type', 'endpoint', 'message', 'delivery',
              'attempt', 'idempotency', 'operational_event', 'node', 'partition_lease', 'background_task',
              'app_token', 'endpoint_secret'])
          AND a.attnum > 0
          AND NOT a.attisdropped
          AND a.atttypid = 'text'::regtype
          AND a.attcollation <> (SELECT oid FROM pg_collation WHERE collname = 'C' AND collnamespace =
              'pg_catalog'::regnamespace)
    LOOP
        EXECUTE format('ALTER TABLE %I ALTER COLUMN %I TYPE text COLLATE "C"', col.tab, col.name);
    END LOOP;
END
$$;
