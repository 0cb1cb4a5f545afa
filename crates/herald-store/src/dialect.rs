//! What a SQL backend is to the portable store ([`crate::portable`]): a way to run a [`Sql`] statement,
//! the few fragments the dialects spell differently (list binds, row locks, the partition column), the
//! hooks where one does more (the ingest order lock and the work notification on PostgreSQL), and the
//! store operations whose SQL truly differs (bulk writes, leases, retention, notifications); and
//! [`SqlStore`], what every SQL backend holds.

use herald_core::clock::Millis;
use herald_core::id::EndpointId;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::crypto::SecretCipher;
use crate::events::NewEvent;
use crate::group_commit::{IngestJob, Wanting, WriteDemand};
use crate::rows::Columns;
use crate::statement::Sql;
use crate::{AttemptRecord, Change, ChangeStream, Ownership, RetentionStep, StoreResult};
use herald_sql::custody::WriteHealth;

/// A SQL store of dialect `D` ([`crate::sqlite::SqliteStore`], [`crate::postgres::PgStore`]).
#[allow(private_bounds)] // The dialects are this crate's two; nothing outside names the trait.
pub struct SqlStore<D: Dialect> {
    /// Where reads go (SQLite: a read-only pool beside the one writer).
    pub(crate) reads: D::Pool,
    /// Where writes go (SQLite: its one writer connection). Take it through [`writes`](Self::writes)
    /// or [`begin`](Self::begin); a write that acquires it itself must hold a
    /// [`write_demand`](Self::write_demand) claim while it waits, or it waits behind a busy ingest
    /// writer for a whole run of its batches (see [`WriteDemand::hands_back`]).
    pub(crate) writes: D::Pool,
    /// Who wants a write connection besides the group-commit writer: SQLite's writer keeps the one
    /// write connection while it is busy and gives it back when another write wants it (see
    /// [`WriteDemand`]). Counted on PostgreSQL too, where nobody reads it.
    pub(crate) write_demand: Arc<WriteDemand>,
    /// The group-commit writer's queue.
    pub(crate) ingest: mpsc::Sender<IngestJob>,
    /// How long an ingest request waits for the group-commit writer to take its message before it is
    /// answered `TimedOut` and the message given back unwritten (see [`crate::group_commit::Ticket`]);
    /// PostgreSQL: the bound of every call, which also bounds the writer's batches; SQLite: no limit (a
    /// local file's commit is bounded by its busy timeout and the disk).
    pub(crate) ingest_wait: Option<Duration>,
    /// The change stream, until the engine takes it.
    pub(crate) changes: Mutex<Option<ChangeStream>>,
    /// Where the store announces what it committed (the group-commit writer holds a clone).
    pub(crate) change_tx: mpsc::UnboundedSender<Change>,
    /// Seals endpoint secrets and headers.
    pub(crate) cipher: SecretCipher,
    /// What long polls wait on (see [`crate::PollingStore::stream_signal`]), moved by the group-commit
    /// writer (which holds a clone) at each commit of a new message.
    pub(crate) stream: crate::polling::StreamSignals,
    /// Whether writes fail on a storage fault (what `/health` reports), shared with the group-commit writer.
    pub(crate) health: Arc<WriteHealth>,
    /// What only this dialect has (PostgreSQL: its leases and background tasks).
    pub(crate) dialect: D,
}

#[allow(private_bounds)]
impl<D: Dialect> SqlStore<D> {
    /// Statements on the read pool.
    pub(crate) fn reads(&self) -> On<'_, D> {
        On::Pool(&self.reads)
    }

    /// Statements on the write pool, each wanting a connection of it while it waits and runs (see
    /// [`WriteDemand`]).
    pub(crate) fn writes(&self) -> On<'_, D> {
        On::Writes(&self.writes, &self.write_demand)
    }

    /// Report a write's outcome to the write health (storage faults only), and pass it on.
    pub(crate) fn watched<T>(&self, result: StoreResult<T>) -> StoreResult<T> {
        self.health.watch(result, crate::StoreError::fault)
    }

    /// A transaction on the write pool.
    pub(crate) async fn begin(&self) -> StoreResult<Tx<D>> {
        let _wanting = self.write_demand.want();
        Ok(D::begin(&self.writes).await?)
    }
}

impl Sql<'_> {
    /// Every row it returns.
    pub(crate) async fn fetch_all<D: Dialect>(&self, on: On<'_, D>) -> Result<Vec<D::Row>, sqlx::Error> {
        D::fetch_all(on, self).await
    }

    /// The row it returns, if any.
    pub(crate) async fn fetch_optional<D: Dialect>(&self, on: On<'_, D>) -> Result<Option<D::Row>, sqlx::Error> {
        D::fetch_optional(on, self).await
    }

    /// The one row it returns (`RowNotFound` otherwise).
    pub(crate) async fn fetch_one<D: Dialect>(&self, on: On<'_, D>) -> Result<D::Row, sqlx::Error> {
        D::fetch_optional(on, self).await?.ok_or(sqlx::Error::RowNotFound)
    }

    /// Run it; the number of rows it changed.
    pub(crate) async fn execute<D: Dialect>(&self, on: On<'_, D>) -> Result<u64, sqlx::Error> {
        D::execute(on, self).await
    }
}

/// Where a statement runs: on a pool, or inside an open transaction.
pub(crate) enum On<'a, D: Dialect> {
    /// Any connection of the pool.
    Pool(&'a D::Pool),
    /// Any connection of the store's write pool, wanted ([`WriteDemand`]) while the statement waits
    /// for it and runs.
    Writes(&'a D::Pool, &'a WriteDemand),
    /// The transaction's connection.
    Tx(&'a mut D::Tx),
}

impl<'a, D: Dialect> On<'a, D> {
    /// The claim a statement on the write pool holds on it while it waits and runs; none otherwise.
    pub(crate) fn wanting(&self) -> Option<Wanting<'a>> {
        match self {
            On::Writes(_, demand) => Some(demand.want()),
            On::Pool(_) | On::Tx(_) => None,
        }
    }
}

/// An open transaction of dialect `D` (rolled back when dropped uncommitted).
pub(crate) struct Tx<D: Dialect>(pub(crate) D::Tx);

impl<D: Dialect> Tx<D> {
    /// Statements run inside the transaction.
    pub(crate) fn on(&mut self) -> On<'_, D> {
        On::Tx(&mut self.0)
    }

    /// Commit it.
    pub(crate) async fn commit(self) -> Result<(), sqlx::Error> {
        D::commit(self.0).await
    }
}

/// The [`Dialect`] methods that run portable statements (`begin`, `commit`, `fetch_all`, `fetch_optional`,
/// `execute`), for a dialect on sqlx's pool and transaction types: written once, since the dialects differ
/// only in how they bind a statement's arguments, which the function `query` in scope where it is expanded
/// does (`fn query<'q>(sql: &'q Sql<'_>) -> sqlx::query::Query<'q, …>`).
macro_rules! run_statements {
    () => {
        async fn begin(pool: &Self::Pool) -> Result<$crate::dialect::Tx<Self>, sqlx::Error> {
            Ok($crate::dialect::Tx(pool.begin().await?))
        }

        async fn commit(tx: Self::Tx) -> Result<(), sqlx::Error> {
            tx.commit().await
        }

        async fn fetch_all<'a>(
            on: $crate::dialect::On<'a, Self>,
            sql: &'a $crate::statement::Sql<'_>,
        ) -> Result<Vec<Self::Row>, sqlx::Error> {
            let _wanting = on.wanting();
            match on {
                $crate::dialect::On::Pool(pool) | $crate::dialect::On::Writes(pool, _) => {
                    query(sql).fetch_all(pool).await
                }
                $crate::dialect::On::Tx(tx) => query(sql).fetch_all(&mut **tx).await,
            }
        }

        async fn fetch_optional<'a>(
            on: $crate::dialect::On<'a, Self>,
            sql: &'a $crate::statement::Sql<'_>,
        ) -> Result<Option<Self::Row>, sqlx::Error> {
            let _wanting = on.wanting();
            match on {
                $crate::dialect::On::Pool(pool) | $crate::dialect::On::Writes(pool, _) => {
                    query(sql).fetch_optional(pool).await
                }
                $crate::dialect::On::Tx(tx) => query(sql).fetch_optional(&mut **tx).await,
            }
        }

        async fn execute<'a>(
            on: $crate::dialect::On<'a, Self>,
            sql: &'a $crate::statement::Sql<'_>,
        ) -> Result<u64, sqlx::Error> {
            let _wanting = on.wanting();
            let done = match on {
                $crate::dialect::On::Pool(pool) | $crate::dialect::On::Writes(pool, _) => {
                    query(sql).execute(pool).await?
                }
                $crate::dialect::On::Tx(tx) => query(sql).execute(&mut **tx).await?,
            };
            Ok(done.rows_affected())
        }
    };
}

pub(crate) use run_statements;

/// A SQL backend: how it runs portable statements, the fragments it spells its own way, the hooks where it
/// does more than the other, and the store operations whose SQL differs. Implemented by [`crate::sqlite::Sqlite`] and [`crate::postgres::Postgres`]
/// only.
pub(crate) trait Dialect: Sized + Send + Sync + 'static {
    /// Its connection pool.
    type Pool: Send + Sync;
    /// An open transaction.
    type Tx: Send;
    /// A result row.
    type Row: Columns + Send + Sync;

    /// The smaller of two values (`MIN(a, b)` on SQLite, `LEAST(a, b)` on PostgreSQL).
    const LEAST: &'static str;
    /// Whether a delivery row carries its endpoint's partition ([`crate::partition_of`]): PostgreSQL's do,
    /// since its nodes lease delivery work by partition.
    const PARTITIONED: bool;
    /// The column that orders rows of one table by insertion (SQLite's `rowid`, a serial `id` on
    /// PostgreSQL) — for `endpoint_secret`.
    const INSERTION_ORDER: &'static str;
    /// How long a running background task must have made no progress before another process may take it
    /// as interrupted; `None` where one process runs all of them (SQLite), so that every task still
    /// running when it starts was interrupted, and none is while it runs.
    const TASK_ORPHANED_AFTER: Option<Duration>;
    /// What keeps the rows a `SELECT` read from being deleted (or their keys changed) until commit, and
    /// lets every other write of them through: what a foreign key's check takes of the row it references
    /// (` FOR KEY SHARE` on PostgreSQL; empty on SQLite, as [`Dialect::for_update`]).
    const KEY_SHARE: &'static str;
    /// Whether a subquery in `FROM` may refer to the tables before it (`CROSS JOIN LATERAL`, PostgreSQL),
    /// so that one statement reads the first rows of each of many keys; SQLite reads in-process and runs
    /// a statement per key instead, at no round trip's cost.
    const LATERAL: bool;

    /// The most attempt results one [`crate::DeliveryStore::record_attempts`] call should carry (see
    /// [`crate::DeliveryStore::results_per_call`]).
    const RESULTS_PER_CALL: usize;

    /// A condition: the JSON-array text column `column` holds the string bound at `mark`.
    fn json_array_contains(column: &str, mark: &str) -> String;
    /// A condition: `column` is one of the list ([`crate::statement::Arg::Ints`] or
    /// [`crate::statement::Arg::Texts`]) bound at `mark`.
    fn in_list(column: &str, mark: &str) -> String;
    /// A table for `FROM`: the list bound at `mark`, one row `(value, n)` per item, `n` rising in list
    /// order, named `alias`.
    fn list_rows(mark: &str, alias: &str) -> String;
    /// What locks the rows a `SELECT` read until commit (those of table `of` only, in a join), where rows
    /// can be locked (empty on SQLite: its one writer already excludes every other).
    fn for_update(of: Option<&str>) -> String;

    /// Make the `seq`s this write transaction gives out follow commit order, as ingest's do (PostgreSQL:
    /// hold the ingest order lock until commit, as concurrent nodes draw `seq`s; SQLite: nothing, its one
    /// writer commits in order).
    fn order_seqs<'a>(tx: &'a mut Tx<Self>) -> impl Future<Output = StoreResult<()>> + Send + 'a;
    /// Deliveries became pending in this transaction outside ingest: wake the endpoints' owners when it
    /// commits (PostgreSQL: notify the work channel, for an owner on any node; SQLite: nothing, the store's
    /// change stream tells its one engine).
    fn work_queued<'a>(tx: &'a mut Tx<Self>) -> impl Future<Output = StoreResult<()>> + Send + 'a;

    /// Open a transaction.
    fn begin(pool: &Self::Pool) -> impl Future<Output = Result<Tx<Self>, sqlx::Error>> + Send;
    /// Commit a transaction.
    fn commit(tx: Self::Tx) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Run a statement; every row.
    fn fetch_all<'a>(
        on: On<'a, Self>,
        sql: &'a Sql<'_>,
    ) -> impl Future<Output = Result<Vec<Self::Row>, sqlx::Error>> + Send + 'a;
    /// Run a statement; the first row, if any.
    fn fetch_optional<'a>(
        on: On<'a, Self>,
        sql: &'a Sql<'_>,
    ) -> impl Future<Output = Result<Option<Self::Row>, sqlx::Error>> + Send + 'a;
    /// Run a statement; rows changed.
    fn execute<'a>(on: On<'a, Self>, sql: &'a Sql<'_>) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    /// Append operational events inside `tx` (bulk inserts differ).
    fn record_events<'a>(
        tx: &'a mut Tx<Self>,
        events: &'a [NewEvent],
    ) -> impl Future<Output = StoreResult<()>> + Send + 'a;
    /// An endpoint changed (committed): tell the delivery engine of every node that may own it.
    fn endpoint_changed<'a>(
        store: &'a SqlStore<Self>,
        endpoint_id: &'a EndpointId,
    ) -> impl Future<Output = ()> + Send + 'a;

    /// See [`crate::DeliveryStore::record_attempts`] (bulk writes; fenced on PostgreSQL).
    fn record_attempts<'a>(
        store: &'a SqlStore<Self>,
        records: &'a [AttemptRecord],
    ) -> impl Future<Output = StoreResult<()>> + Send + 'a;
    /// See [`crate::DeliveryStore::expire_deliveries`] (fenced on PostgreSQL).
    fn expire_deliveries<'a>(
        store: &'a SqlStore<Self>,
        seqs: &'a [i64],
        now: Millis,
    ) -> impl Future<Output = StoreResult<()>> + Send + 'a;
    /// See [`crate::DeliveryStore::expire_waiting`] (fenced on PostgreSQL).
    fn expire_waiting<'a>(
        store: &'a SqlStore<Self>,
        endpoint_id: &'a EndpointId,
        created_before: Millis,
        now: Millis,
    ) -> impl Future<Output = StoreResult<u64>> + Send + 'a;
    /// See [`crate::Store::retention_step`] (PostgreSQL drops day partitions besides).
    fn retention_step(
        store: &SqlStore<Self>,
        attempts_before: Millis,
        now: Millis,
        limit: usize,
    ) -> impl Future<Output = StoreResult<RetentionStep>> + Send + '_;
    /// See [`crate::Store::shutdown`].
    fn shutdown(store: &SqlStore<Self>) -> impl Future<Output = ()> + Send + '_;
    /// See [`crate::DeliveryStore::ownership`].
    fn ownership(store: &SqlStore<Self>) -> Option<std::sync::Arc<dyn Ownership>>;
}
