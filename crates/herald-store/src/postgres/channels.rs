//! The names every node sharing a PostgreSQL database agrees on: its notification channels and the
//! advisory lock that orders ingest.

use sqlx::PgConnection;

use crate::StoreResult;

/// The advisory lock key that orders ingest transactions ("herald" in ASCII); public so that tests can
/// hold the writer at its `BEGIN` (re-exported as `herald_store::postgres::INGEST_LOCK`).
pub const INGEST_LOCK: i64 = 0x6865_7261_6c64;

/// [`INGEST_LOCK`] written out, for statements that take it in their own text (a simple query takes no
/// parameters, and a prepared statement's text is fixed); a test checks it.
macro_rules! ingest_lock_key {
    () => {
        "114784919972964"
    };
}
pub(crate) use ingest_lock_key;

/// `BEGIN`, then [`INGEST_LOCK`] taken as [`order_lock`] takes it, sent as one simple query: one round
/// trip for both (the ingest writer's batches; see `crate::group_commit::BatchWriter::BEGIN`).
pub(crate) const BEGIN_IN_ORDER: &str = concat!("BEGIN; SELECT pg_advisory_xact_lock(", ingest_lock_key!(), ")");

/// Take [`INGEST_LOCK`] until the transaction on `conn` commits: transactions that draw delivery `seq`s
/// (ingest, re-queueing) then commit in the order they drew them, across nodes, so an owner's cursor
/// (`seq > n`) never skips a row that commits late.
pub(crate) async fn order_lock(conn: &mut PgConnection) -> StoreResult<()> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(INGEST_LOCK)
        .execute(conn)
        .await?;
    Ok(())
}

/// The channel ingest notifies when it committed deliveries; the payload is the node id.
pub(crate) const WORK_CHANNEL: &str = "herald_work";

/// The work-channel payload of a repair (deliveries re-queued or added outside ingest): no node's id, so
/// every node's watcher looks.
pub(crate) const REPAIR_PAYLOAD: &str = "repair";

/// The channel notified with an endpoint's id when it changes, so that its owner — maybe another node —
/// reloads it.
pub(crate) const ENDPOINT_CHANNEL: &str = "herald_endpoint";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_begin_takes_the_ingest_lock() {
        assert_eq!(
            BEGIN_IN_ORDER,
            format!("BEGIN; SELECT pg_advisory_xact_lock({INGEST_LOCK})")
        );
    }
}
