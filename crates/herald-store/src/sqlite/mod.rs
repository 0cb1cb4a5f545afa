//! The SQLite dialect: one file, WAL mode, `synchronous=FULL` (every commit is fsynced, so an acknowledged
//! message survives `kill -9` and a power cut; batches of first-try successes among the attempt results
//! written alone commit without waiting for the disk, see `results_begin`), one writer connection and a
//! pool of readers. Attempt results go to the group-commit writer, which writes them in its next ingest
//! batch's transaction (`group_commit::results`). The store's statements are `crate::portable`'s; this
//! module runs them on sqlx's SQLite driver and holds what SQLite does its own way: lists bound as JSON
//! arrays (read with `json_each`), multi-row inserts in chunks (`bulk`), expiry on its one writer,
//! row-by-row retention (`retention`).

mod bulk;
mod chunk;
mod events;
mod retention;

use herald_core::clock::Millis;
use herald_core::id::EndpointId;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::sqlite::{
    SqliteArguments, SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Acquire, AssertSqlSafe, Connection, SqlitePool};
use tokio::sync::mpsc;

use crate::crypto::SecretCipher;
use crate::dialect::{Dialect, SqlStore, Tx};
use crate::events::NewEvent;
use crate::portable::expiry::settle_expired;
use crate::portable::secrets;
use crate::statement::{Arg, Sql};
use crate::{AttemptRecord, Ownership, RetentionStep, StoreResult, group_commit, rows};
use herald_sql::custody::{self, WriteHealth};

/// How many ingest requests may wait for the writer before callers queue on the channel itself.
const INGEST_QUEUE: usize = 1_024;

/// How many batches of attempt results may wait for the writer (the sender's result writer hands over
/// one at a time and waits for it, so one is the most that waits in practice).
const RESULTS_QUEUE: usize = 16;

/// How long a write waits for the write connection (held by another write) before it fails with 503:
/// the busy timeout's bound, so a write never waits on a wedged writer forever.
const WRITE_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// The SQLite dialect (see [`SqliteStore`]).
#[derive(Debug)]
pub struct Sqlite {
    /// Where attempt results go: to the group-commit writer, which writes them on the one write
    /// connection it keeps (see `group_commit::results`).
    results: mpsc::Sender<group_commit::ResultsJob>,
}

/// The SQLite implementation of [`crate::Store`].
pub type SqliteStore = SqlStore<Sqlite>;

impl SqlStore<Sqlite> {
    /// Open (creating if needed) the database at `url` (`sqlite://PATH`), run migrations, check the secret
    /// key (and encrypt secrets stored before encryption) and start the group-commit writer.
    pub async fn open(url: &str, cipher: SecretCipher) -> StoreResult<Self> {
        let (base, writes) = migrated(url).await?;
        secrets::prepare::<Sqlite>(&writes, &cipher).await?;
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode").fetch_one(&writes).await?;
        let reads = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(base.read_only(true))
            .await?;
        let (ingest, jobs) = mpsc::channel(INGEST_QUEUE);
        let (results, results_queue) = mpsc::channel(RESULTS_QUEUE);
        let (feed_tx, feed_rx) = mpsc::unbounded_channel();
        let stream = crate::polling::StreamSignals::new();
        let health = Arc::new(WriteHealth::default());
        let write_demand = Arc::new(group_commit::WriteDemand::default());
        tokio::spawn(group_commit::run(
            writes.clone(),
            bulk::SqliteBatches::new(write_demand.clone(), mode.eq_ignore_ascii_case("wal")),
            group_commit::Inbox {
                ingest: jobs,
                results: Some(results_queue),
            },
            feed_tx.clone(),
            health.clone(),
            // SQLite's work cannot be cancelled half-way (it runs on its own thread); a local file's
            // commit is bounded by its busy timeout and the disk.
            None,
            stream.clone(),
        ));
        Ok(Self {
            reads,
            writes,
            write_demand,
            ingest,
            ingest_wait: None,
            changes: Mutex::new(Some(feed_rx)),
            change_tx: feed_tx,
            stream,
            cipher,
            health,
            dialect: Sqlite { results },
        })
    }
}

/// Open (creating if needed) the database at `url` and run its migrations: its connection options and
/// the writer pool.
async fn migrated(url: &str) -> StoreResult<(SqliteConnectOptions, SqlitePool)> {
    let base = SqliteConnectOptions::from_str(url)?
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true)
        .busy_timeout(Duration::from_secs(10));
    // The writer keeps its statement journals in memory. Each multi-row statement of an ingest batch
    // may fail half-way (a constraint), so SQLite copies every page it changes into a statement journal
    // first; past 64 KiB that journal spills to a temporary file, and a batch's inserts cross that (the
    // profile of `ingest --paused` had 6 % of the node's CPU in those copies, half of it `pwrite`s). The
    // journal only undoes one statement; durability is the WAL's and is unchanged.
    let write = custody::sqlite_writer_pool(WRITE_ACQUIRE_TIMEOUT)
        .connect_with(base.clone().create_if_missing(true).pragma("temp_store", "memory"))
        .await?;
    sqlx::migrate!("./migrations/sqlite").run(&write).await?;
    Ok((base, write))
}

/// What opens a transaction of these attempt results: `synchronous = NORMAL` first when the file is in
/// WAL mode (`wal`) and the batch records no operational event, [`BEGIN_DURABLE`] otherwise.
///
/// Only results the group-commit writer writes alone, with no ingest batch to ride on, get a transaction
/// of their own (see `group_commit::results`). A result needs no custody: one lost in a power cut leaves
/// its delivery pending, and it is sent again after the restart the power cut forces anyway
/// (at-least-once, the same `webhook-id`). So such a batch commits without waiting for an fsync — the
/// next commit that does (every ingest batch, every API write) carries it to the disk — and the one write
/// connection is free for the next ingest batch sooner. WAL mode is what makes that safe: a power cut
/// may then take back the last commits, never corrupt the file. An operational event is different: its
/// sender may post it as soon as it is visible, and the operator must not be told of a change a power
/// cut then takes back — so a batch that may record one ([`crate::events::may_record_events`]) waits for
/// the disk. The setting is allowed only outside a
/// transaction, so it comes before `BEGIN` in the same call; every transaction of the writer's that must
/// wait for the disk sets `FULL` again in its first call ([`BEGIN_DURABLE`]: ingest batches, and results
/// that may record an event), and the write pool puts `FULL` back when the connection is released
/// (`herald_sql::custody`), so no other write ever commits with it.
fn results_begin(wal: bool, records: &[AttemptRecord]) -> &'static str {
    if wal && !crate::events::may_record_events(records) {
        "PRAGMA synchronous = NORMAL; BEGIN"
    } else {
        BEGIN_DURABLE
    }
}

/// What opens a transaction that must wait for the disk at its commit, on a connection a transaction
/// before it may have left at `synchronous = NORMAL` (the group-commit writer keeps its connection from
/// one transaction to the next, see [`results_begin`]): the setting rides on the `BEGIN`'s call.
const BEGIN_DURABLE: &str = "PRAGMA synchronous = FULL; BEGIN";

/// Run the migrations of the database at `url` (creating it if needed) and nothing else: no key is
/// needed (secrets stored in plain text are encrypted by the next [`SqliteStore::open`]).
pub async fn migrate(url: &str) -> StoreResult<()> {
    let (_, write) = migrated(url).await?;
    write.close().await;
    Ok(())
}

/// A portable statement on sqlx's SQLite driver (free text needs no escaping: SQLite's text holds NUL; a
/// list is bound as the text of a JSON array, which [`Dialect::in_list`] and [`Dialect::list_rows`] read).
fn query<'q>(sql: &'q Sql<'_>) -> sqlx::query::Query<'q, sqlx::Sqlite, SqliteArguments> {
    let mut query = sqlx::query(AssertSqlSafe(sql.text()));
    for arg in sql.args() {
        query = match arg {
            Arg::Text(text) | Arg::Free(text) => query.bind(text.as_deref()),
            Arg::Int(n) => query.bind(*n),
            Arg::Bool(flag) => query.bind(*flag),
            Arg::Bytes(bytes) => query.bind(&**bytes),
            Arg::Ints(list) => query.bind(serde_json::Value::from(&**list).to_string()),
            Arg::Texts(list) => query.bind(serde_json::Value::from(list.as_slice()).to_string()),
        };
    }
    query
}

impl Dialect for Sqlite {
    type Pool = SqlitePool;
    type Tx = sqlx::Transaction<'static, sqlx::Sqlite>;
    type Row = SqliteRow;

    const LEAST: &'static str = "MIN";
    const PARTITIONED: bool = false;
    const INSERTION_ORDER: &'static str = "rowid";
    const TASK_ORPHANED_AFTER: Option<Duration> = None;
    const KEY_SHARE: &'static str = "";
    const LATERAL: bool = false;

    /// Few: the group-commit writer writes results on the store's one write connection, so a message
    /// waits behind a results-only transaction, or carries the results in its own (see
    /// `group_commit::results`). With 1,024, a fan-out to 1,000 endpoints made the next message wait for
    /// its thousand results (docs/performance.md, "results-in-smaller-batches").
    const RESULTS_PER_CALL: usize = 128;

    fn json_array_contains(column: &str, mark: &str) -> String {
        format!("EXISTS (SELECT 1 FROM json_each({column}) WHERE json_each.value = {mark})")
    }

    fn in_list(column: &str, mark: &str) -> String {
        format!("{column} IN (SELECT value FROM json_each({mark}))")
    }

    fn list_rows(mark: &str, alias: &str) -> String {
        // `key` is the item's index in the array.
        format!("(SELECT value, key AS n FROM json_each({mark})) AS {alias}")
    }

    fn for_update(_of: Option<&str>) -> String {
        String::new()
    }

    async fn order_seqs(_tx: &mut Tx<Self>) -> StoreResult<()> {
        // The one writer connection: transactions that draw `seq`s commit in the order they draw them.
        Ok(())
    }

    async fn work_queued(_tx: &mut Tx<Self>) -> StoreResult<()> {
        // One process owns a SQLite file: the store's change stream tells its engine.
        Ok(())
    }

    crate::dialect::run_statements!();

    async fn record_events<'a>(tx: &'a mut Tx<Self>, events: &'a [NewEvent]) -> StoreResult<()> {
        events::record(&mut tx.0, events).await
    }

    async fn endpoint_changed<'a>(_store: &'a SqliteStore, _endpoint_id: &'a EndpointId) {
        // One process owns a SQLite file: the API that made the change tells its engine itself.
    }

    async fn record_attempts<'a>(store: &'a SqliteStore, records: &'a [AttemptRecord]) -> StoreResult<()> {
        group_commit::ResultsJob::send(&store.dialect.results, records).await
    }

    async fn expire_deliveries<'a>(store: &'a SqliteStore, seqs: &'a [i64], now: Millis) -> StoreResult<()> {
        let mut tx = store.begin().await?;
        let found = Sql::new(format!(
            "{} AND {}",
            crate::events::EXPIRING,
            Self::in_list("d.seq", "$1")
        ))
        .bind(Arg::Ints(seqs.into()))
        .fetch_all(tx.on())
        .await?;
        let expiring = found.iter().map(rows::expired).collect::<StoreResult<Vec<_>>>()?;
        settle_expired(&mut tx, &expiring, now).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn expire_waiting<'a>(
        store: &'a SqliteStore,
        endpoint_id: &'a EndpointId,
        created_before: Millis,
        now: Millis,
    ) -> StoreResult<u64> {
        // The head of the pending index, one short transaction per pass (see `EXPIRY_SCAN`). A re-queued
        // delivery's window starts when it was re-queued, not when its message was created.
        let sql = crate::events::expiring_head("?", "?", "?", "?");
        let mut total = 0;
        loop {
            let mut tx = store.begin().await?;
            let found = sqlx::query(AssertSqlSafe(sql.as_str()))
                .bind(endpoint_id.as_str())
                .bind(endpoint_id.as_str())
                .bind(crate::events::EXPIRY_SCAN)
                .bind(created_before)
                .fetch_all(&mut *tx.0)
                .await?;
            let expiring = found.iter().map(rows::expired).collect::<StoreResult<Vec<_>>>()?;
            settle_expired(&mut tx, &expiring, now).await?;
            tx.commit().await?;
            if expiring.is_empty() {
                return Ok(total);
            }
            total += expiring.len() as u64;
        }
    }

    async fn retention_step(
        store: &SqliteStore,
        attempts_before: Millis,
        now: Millis,
        limit: usize,
    ) -> StoreResult<RetentionStep> {
        let _wanting = store.write_demand.want();
        retention::step(&store.writes, attempts_before, now, limit).await
    }

    async fn shutdown(_store: &SqliteStore) {}

    fn ownership(_store: &SqliteStore) -> Option<Arc<dyn Ownership>> {
        None
    }
}

/// Append attempts and move their deliveries on (the group-commit writer's results written alone, see
/// `group_commit::results`): all in one go (in a transaction of the batch's
/// [own](bulk::Frame::Own), most often a single call), or — if that fails on an error of one record —
/// one savepoint per record, so a record that cannot be written is logged and skipped instead of
/// wedging every result behind it. A storage fault fails the whole call (SQLite may have rolled the
/// transaction back already; see [`crate::custody`]) and the caller retries it. `begin` opens each
/// transaction (see [`results_begin`]).
async fn write_results(
    conn: &mut sqlx::SqliteConnection,
    begin: &'static str,
    records: &[AttemptRecord],
) -> StoreResult<()> {
    let written = bulk::write_attempts(conn, records, bulk::Frame::Own(begin)).await;
    match group_commit::close_own_transaction(written, || bulk::roll_back(conn)).await {
        Ok(()) => return Ok(()),
        Err(error) if error.fault().is_some() => return Err(error),
        Err(error) => {
            tracing::warn!(%error, records = records.len(), "bulk attempt write failed; writing one by one");
        }
    }
    let mut tx = conn.begin_with(begin).await?;
    for record in records {
        let mut savepoint = tx.begin().await?;
        match bulk::write_attempts(&mut savepoint, std::slice::from_ref(record), bulk::Frame::Callers).await {
            Ok(()) => savepoint.commit().await?,
            Err(error) if error.fault().is_some() => return Err(error),
            Err(error) => {
                tracing::error!(%error, attempt = %record.attempt.id, "dropping an attempt record that cannot be stored");
                savepoint.rollback().await?;
            }
        }
    }
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::tests::record;
    use herald_core::model::AttemptTrigger;

    #[test]
    fn only_results_that_record_no_event_skip_the_fsync_and_only_in_wal_mode() {
        const WITHOUT_FSYNC: &str = "PRAGMA synchronous = NORMAL; BEGIN";
        let first_try = [record(1, true, AttemptTrigger::Scheduled)];
        let with_a_failure = [
            record(1, true, AttemptTrigger::Scheduled),
            record(1, false, AttemptTrigger::Scheduled),
        ];
        assert_eq!(results_begin(true, &first_try), WITHOUT_FSYNC);
        assert_eq!(results_begin(true, &with_a_failure), BEGIN_DURABLE);
        assert_eq!(results_begin(false, &first_try), BEGIN_DURABLE);
    }
}
