//! The PostgreSQL dialect: the same contract as SQLite, for production and for many nodes on one database.
//! The store's statements are `crate::portable`'s; this module runs them on sqlx's PostgreSQL driver
//! (free text escaped, see [`herald_sql::text`]) and holds what PostgreSQL does its own way:
//!
//! - Custody: ingest goes through the shared group-commit writer (`crate::group_commit`); a batch is one
//!   transaction, committed (and so durable, with PostgreSQL's default `synchronous_commit`) before any
//!   of its requests is answered.
//! - Order: ingest transactions hold one advisory lock from their first insert to their commit, so
//!   delivery `seq`s and message-stream positions follow commit order across nodes, and message ids do
//!   up to the nodes' clock skew (and, for a batch of one statement, the moment between drawing its ids
//!   and taking the lock; see `remembered`).
//! - Scale-out: delivery work is split into [`crate::PARTITIONS`] partitions owned through leases
//!   (`lease`); every write an owner makes is fenced on its lease's epoch.
//! - History: attempts are partitioned by day and old days are dropped whole (`retention`).
//! - Changes: an endpoint change is announced with `NOTIFY`, so its owner on any node reloads it.
//! - Long polls: while one waits on this node, the node reads the message stream's head every 25 ms, so
//!   another node's commit wakes it too (`stream_watcher`) while ingest notifies nothing.

mod bulk;
mod channels;
mod events;
mod lease;
mod outbox;
mod outbox_pace;
mod remembered;
mod retention;
mod stream_watcher;

use herald_core::clock::Millis;
use herald_core::id::EndpointId;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::{PgArguments, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, PgPool};
use tokio::sync::mpsc;

pub use self::channels::INGEST_LOCK;
use self::channels::{ENDPOINT_CHANNEL, REPAIR_PAYLOAD, WORK_CHANNEL};
use crate::crypto::SecretCipher;
use crate::dialect::{Dialect, SqlStore, Tx};
use crate::events::NewEvent;
use crate::portable::expiry::settle_expired;
use crate::portable::secrets;
use crate::statement::{Arg, Sql};
use crate::{AttemptRecord, Ownership, RetentionStep, StoreOptions, StoreResult, group_commit, rows, subscribers};
use herald_sql::custody::{Bound, DatabaseTimeouts, WriteHealth};
use herald_sql::text::escape;

/// How many ingest requests may wait for the writer before callers queue on the channel itself.
const INGEST_QUEUE: usize = 1_024;
/// Connections per node: the ingest writer, the result writer, the lease keeper, API reads.
const POOL_SIZE: u32 = 16;

/// The PostgreSQL dialect (see [`PgStore`]): this node's partition leases and its background tasks.
pub struct Postgres {
    leases: Arc<lease::Leases>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The client-side bound of every call, shared with the pool's release check.
    bound: Bound,
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // The lease keeper and the watcher hold the pool; without this they would outlive the store.
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The PostgreSQL implementation of [`crate::Store`].
pub type PgStore = SqlStore<Postgres>;

/// The node's pool: every session with the statement and lock timeouts, every acquire bounded (see
/// [`DatabaseTimeouts`]) — while the database refuses or stops answering, requests hear so quickly
/// instead of piling up.
async fn connect(url: &str, timeouts: &DatabaseTimeouts, bound: &Bound) -> StoreResult<PgPool> {
    let options = timeouts.session(herald_sql::loopback::connect_options(url)?.application_name("herald"));
    Ok(timeouts
        .pool(bound)
        .max_connections(POOL_SIZE)
        .connect_with(options)
        .await?)
}

/// Run the migrations and return (`herald migrate`, and every start): on a connection of their own,
/// without the statement timeout, since a migration on a large table may take long.
pub async fn migrate(url: &str) -> StoreResult<()> {
    let options = herald_sql::loopback::connect_options(url)?.application_name("herald-migrate");
    let pool = PgPoolOptions::new().max_connections(1).connect_with(options).await?;
    sqlx::migrate!("./migrations/postgres").run(&pool).await?;
    pool.close().await;
    Ok(())
}

impl SqlStore<Postgres> {
    /// Connect, run migrations, check the secret key (and encrypt secrets stored before encryption),
    /// create the attempt partitions ahead, join the cluster (take this node's share of the delivery
    /// partitions) and start the group-commit writer.
    pub async fn open(url: &str, cipher: SecretCipher, options: &StoreOptions) -> StoreResult<Self> {
        // sqlx's migrator takes an advisory lock, so nodes starting together migrate once.
        migrate(url).await?;
        let bound = options.database.bound();
        let pool = connect(url, &options.database, &bound).await?;
        secrets::prepare::<Postgres>(&pool, &cipher).await?;
        let payload_limit = outbox::PayloadLimit::of(options.max_payload_bytes);
        outbox::write_limit(&pool, payload_limit).await?;
        retention::maintain(&pool, options.attempt_retention).await?;
        let (feed_tx, feed_rx) = mpsc::unbounded_channel();
        let (leases, lease_tasks) = lease::start(pool.clone(), options, feed_tx.clone()).await?;
        let (ingest, jobs) = mpsc::channel(INGEST_QUEUE);
        let writer = bulk::PgBatches {
            leases: leases.clone(),
            subscribers: subscribers::Cache::default(),
            remembered: remembered::Remembered::default(),
        };
        let stream = crate::polling::StreamSignals::new();
        let health = Arc::new(WriteHealth::default());
        // The writer gives a batch up after the server's own bound plus the time to get a connection and
        // to hear back (and closes its connection); a request waits that long at most for the writer to
        // take its message, then for that batch (see `crate::group_commit::Ticket`).
        tokio::spawn(group_commit::run(
            pool.clone(),
            writer,
            // Each attempt-result batch takes a connection of the pool's own (`record_attempts`).
            group_commit::Inbox {
                ingest: jobs,
                results: None,
            },
            feed_tx.clone(),
            health.clone(),
            Some(bound.limit()),
            stream.clone(),
        ));
        let mut tasks = lease_tasks;
        tasks.push(tokio::spawn(outbox::run(
            pool.clone(),
            ingest.clone(),
            bound.clone(),
            payload_limit,
        )));
        tasks.push(tokio::spawn(stream_watcher::run(
            pool.clone(),
            stream.clone(),
            bound.clone(),
        )));
        tasks.push(tokio::spawn(retention::run(
            pool.clone(),
            options.attempt_retention,
            bound.clone(),
        )));
        Ok(Self {
            reads: pool.clone(),
            writes: pool,
            write_demand: Arc::default(),
            ingest,
            ingest_wait: Some(bound.limit()),
            changes: Mutex::new(Some(feed_rx)),
            change_tx: feed_tx,
            stream,
            cipher,
            health,
            dialect: Postgres { leases, tasks, bound },
        })
    }

    /// The client-side bound of this store's calls, for its [`crate::bounded::BoundedStore`].
    pub fn bound(&self) -> Bound {
        self.dialect.bound.clone()
    }

    /// This node's id in the `node` table.
    pub fn node_id(&self) -> &str {
        self.dialect.leases.node_id()
    }
}

/// A portable statement on sqlx's PostgreSQL driver. Free text is bound escaped (see [`herald_sql::text`]):
/// values that could never contain NUL are unchanged by it, and a NUL in a lookup then finds nothing, as on
/// SQLite, instead of failing the statement. Text the store made holds no NUL; where a client's value
/// reached a filter as such (an event type or channel in a query string) and holds one, it is escaped
/// too, so that it matches nothing rather than failing the statement with a 503. Lists are bound as
/// arrays.
fn query<'q>(sql: &'q Sql<'_>) -> sqlx::query::Query<'q, sqlx::Postgres, PgArguments> {
    let mut query = sqlx::query(AssertSqlSafe(sql.text()));
    for arg in sql.args() {
        query = match arg {
            Arg::Text(text) => query.bind(text.as_deref().map(made_text)),
            Arg::Free(text) => query.bind(text.as_deref().map(escape)),
            Arg::Int(n) => query.bind(*n),
            Arg::Bool(flag) => query.bind(*flag),
            Arg::Bytes(bytes) => query.bind(&**bytes),
            Arg::Ints(list) => query.bind(&**list),
            Arg::Texts(list) => query.bind(list.iter().map(|t| made_text(t).into_owned()).collect::<Vec<_>>()),
        };
    }
    query
}

/// Text the store made, as bound: itself, unless it holds a NUL (see [`query`]).
fn made_text(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') { escape(text) } else { text.into() }
}

impl Dialect for Postgres {
    type Pool = PgPool;
    type Tx = sqlx::Transaction<'static, sqlx::Postgres>;
    type Row = PgRow;

    const LEAST: &'static str = "LEAST";
    const PARTITIONED: bool = true;
    const INSERTION_ORDER: &'static str = "id";
    // Several nodes share the table; a running task records progress after every chunk, so only one
    // that has made none for a minute can be the orphan of a stopped node.
    const TASK_ORPHANED_AFTER: Option<Duration> = Some(Duration::from_secs(60));
    const KEY_SHARE: &'static str = " FOR KEY SHARE";
    const LATERAL: bool = true;

    /// Many: each call takes a pooled connection of its own, beside ingest's, so a large batch makes
    /// nobody wait and spares commits.
    const RESULTS_PER_CALL: usize = 1_024;

    fn json_array_contains(column: &str, mark: &str) -> String {
        format!("EXISTS (SELECT 1 FROM jsonb_array_elements_text({column}::jsonb) c WHERE c = {mark})")
    }

    fn in_list(column: &str, mark: &str) -> String {
        format!("{column} = ANY({mark})")
    }

    fn list_rows(mark: &str, alias: &str) -> String {
        format!("UNNEST({mark}) WITH ORDINALITY AS {alias} (value, n)")
    }

    fn for_update(of: Option<&str>) -> String {
        match of {
            Some(table) => format!(" FOR UPDATE OF {table}"),
            None => " FOR UPDATE".to_owned(),
        }
    }

    async fn order_seqs(tx: &mut Tx<Self>) -> StoreResult<()> {
        channels::order_lock(&mut tx.0).await
    }

    async fn work_queued(tx: &mut Tx<Self>) -> StoreResult<()> {
        // No node's id in the payload, so every node's watcher looks.
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(WORK_CHANNEL)
            .bind(REPAIR_PAYLOAD)
            .execute(&mut *tx.0)
            .await?;
        Ok(())
    }

    crate::dialect::run_statements!();

    async fn record_events<'a>(tx: &'a mut Tx<Self>, events: &'a [NewEvent]) -> StoreResult<()> {
        events::record(&mut tx.0, events).await
    }

    /// Tell every node (the endpoint's owner among them) that an endpoint changed. Best effort: the
    /// change is committed already, and an owner that misses it reloads the endpoint when it takes it over.
    async fn endpoint_changed<'a>(store: &'a PgStore, endpoint_id: &'a EndpointId) {
        let result = sqlx::query("SELECT pg_notify($1, $2)")
            .bind(ENDPOINT_CHANNEL)
            .bind(endpoint_id.as_str())
            .execute(&store.writes)
            .await;
        if let Err(error) = result {
            tracing::warn!(%error, endpoint = endpoint_id.as_str(), "announcing an endpoint change failed");
        }
    }

    async fn record_attempts<'a>(store: &'a PgStore, records: &'a [AttemptRecord]) -> StoreResult<()> {
        bulk::write_results(&store.writes, &store.dialect.leases, records).await
    }

    async fn expire_deliveries<'a>(store: &'a PgStore, seqs: &'a [i64], now: Millis) -> StoreResult<()> {
        let mut tx = store.begin().await?;
        let held = store.dialect.leases.fence(&mut tx.0).await?;
        let sql = format!(
            "{} AND d.seq = ANY($1) AND d.partition = ANY($2) FOR UPDATE OF d",
            crate::events::EXPIRING
        );
        let found = sqlx::query(AssertSqlSafe(sql))
            .bind(seqs)
            .bind(&held)
            .fetch_all(&mut *tx.0)
            .await?;
        let expiring = found.iter().map(rows::expired).collect::<StoreResult<Vec<_>>>()?;
        settle_expired(&mut tx, &expiring, now).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn expire_waiting<'a>(
        store: &'a PgStore,
        endpoint_id: &'a EndpointId,
        created_before: Millis,
        now: Millis,
    ) -> StoreResult<u64> {
        // The head of the pending index, one short transaction per pass (see `EXPIRY_SCAN`). A re-queued
        // delivery's window starts when it was re-queued, not when its message was created.
        let sql = format!(
            "{} FOR UPDATE OF d",
            crate::events::expiring_head("$1", "$1", "$3", "$2")
        );
        let mut total = 0;
        loop {
            let mut tx = store.begin().await?;
            let held = store.dialect.leases.fence(&mut tx.0).await?;
            if !held.contains(&crate::partition_of(endpoint_id)) {
                // Another node owns the endpoint now; it settles its deliveries.
                return Ok(total);
            }
            let found = sqlx::query(AssertSqlSafe(sql.as_str()))
                .bind(escape(endpoint_id))
                .bind(created_before)
                .bind(crate::events::EXPIRY_SCAN)
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
        store: &PgStore,
        attempts_before: Millis,
        now: Millis,
        limit: usize,
    ) -> StoreResult<RetentionStep> {
        retention::step(&store.writes, attempts_before, now, limit).await
    }

    async fn shutdown(store: &PgStore) {
        for task in &store.dialect.tasks {
            task.abort();
        }
        if let Err(error) = store.dialect.leases.leave(&store.writes).await {
            tracing::warn!(%error, "releasing partition leases at shutdown failed; they expire instead");
        }
    }

    fn ownership(store: &PgStore) -> Option<Arc<dyn Ownership>> {
        Some(store.dialect.leases.clone())
    }
}
