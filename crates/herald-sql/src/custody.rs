//! Custody under storage faults: a write that did not commit is never acknowledged.
//!
//! Three pieces, shared by the sender's store and the inbox's:
//!
//! - [`fault_of`] tells a *storage* fault (the disk is full, an I/O or fsync error, a read-only or
//!   corrupt file, a database that refuses or stops answering) from an error of one request (a
//!   constraint, a bad value). After a storage fault SQLite may have rolled the whole transaction back
//!   on its own (it does on `SQLITE_FULL`, `SQLITE_IOERR`, `SQLITE_NOMEM`, …), so nothing written in it
//!   may be kept or replayed statement by statement: the batch fails as a whole.
//! - [`sqlite_writer_pool`] builds the single-connection pool SQLite writes through, with a check on
//!   every release: a connection whose transaction state is not exactly "none open" (sqlx still counts
//!   a transaction that SQLite already rolled back, or SQLite holds one that sqlx does not know of) is
//!   closed instead of reused, and the pool opens a fresh one. Reusing it would run the next writes
//!   inside a transaction that is never committed — acknowledged and lost. The same check puts back
//!   `synchronous = FULL`, which a write may lower for its own transaction.
//! - [`DatabaseTimeouts`] bound how long PostgreSQL may keep a request waiting before it is answered 503,
//!   and [`Bound`] holds every call to a PostgreSQL store (the sender's and the inbox's) to it on the
//!   client's side, whatever the call does: a server that goes silent fails the call within the bound
//!   instead of after TCP's own timeout (about 15 minutes). See [`bounded_trait!`](crate::bounded_trait).
//! - [`WriteHealth`] remembers whether the last write failed on a storage fault, so that `/health`
//!   reports the store as failing while it fails, and probes recovery.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use sqlx::error::DatabaseError;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnection, SqlitePoolOptions};
use sqlx::{Connection, Executor};

/// What kind of storage fault an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The disk (or the database's quota) is full: writes succeed again once space is freed.
    Full,
    /// The storage failed otherwise (I/O error, failing fsync, read-only file, database refused, timed
    /// out or gone).
    Unavailable,
    /// The database reports its file damaged (SQLite's `SQLITE_CORRUPT` or `SQLITE_NOTADB`,
    /// PostgreSQL's `data_corrupted` or `index_corrupted`): retrying does not help until an operator
    /// restores or recovers it (see [`crate::integrity`]).
    Corrupt,
}

impl Fault {
    /// The stable error code clients see (`storage_full` or `store_unavailable`).
    pub fn code(self) -> &'static str {
        match self {
            Fault::Full => "storage_full",
            Fault::Unavailable => "store_unavailable",
            Fault::Corrupt => "store_corrupt",
        }
    }

    /// What `/api/v1/health` says of the database while writes fail on this fault (`database`): `full`,
    /// `corrupt` or `unreachable`.
    pub fn health(self) -> &'static str {
        match self {
            Fault::Full => "full",
            Fault::Unavailable => "unreachable",
            Fault::Corrupt => "corrupt",
        }
    }
}

/// SQLite's primary result codes that mean the storage failed (<https://sqlite.org/rescode.html>).
mod sqlite_code {
    pub(super) const BUSY: i32 = 5;
    pub(super) const LOCKED: i32 = 6;
    pub(super) const NOMEM: i32 = 7;
    pub(super) const READONLY: i32 = 8;
    pub(super) const INTERRUPT: i32 = 9;
    pub(super) const IOERR: i32 = 10;
    pub(super) const CORRUPT: i32 = 11;
    pub(super) const FULL: i32 = 13;
    pub(super) const CANTOPEN: i32 = 14;
    pub(super) const PROTOCOL: i32 = 15;
    pub(super) const NOTADB: i32 = 26;
}

/// Whether `error` is a storage fault, and which; `None` for an error of the request itself.
pub fn fault_of(error: &sqlx::Error) -> Option<Fault> {
    match error {
        sqlx::Error::Database(db) => {
            if let Some(sqlite) = db.try_downcast_ref::<sqlx::sqlite::SqliteError>() {
                let extended: i32 = sqlite.code()?.parse().ok()?;
                return sqlite_fault(extended & 0xff);
            }
            postgres_fault(&db.code()?)
        }
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::BeginFailed => Some(Fault::Unavailable),
        _ => None,
    }
}

fn sqlite_fault(primary: i32) -> Option<Fault> {
    use sqlite_code::*;
    match primary {
        FULL => Some(Fault::Full),
        CORRUPT | NOTADB => Some(Fault::Corrupt),
        BUSY | LOCKED | NOMEM | READONLY | INTERRUPT | IOERR | CANTOPEN | PROTOCOL => Some(Fault::Unavailable),
        _ => None,
    }
}

/// PostgreSQL SQLSTATEs (<https://www.postgresql.org/docs/current/errcodes-appendix.html>).
fn postgres_fault(sqlstate: &str) -> Option<Fault> {
    match sqlstate {
        // disk_full
        "53100" => Some(Fault::Full),
        // data_corrupted, index_corrupted
        "XX001" | "XX002" => Some(Fault::Corrupt),
        // query_canceled (statement_timeout), lock_not_available (lock_timeout), idle-session timeouts
        "57014" | "55P03" | "25P03" | "57P05" => Some(Fault::Unavailable),
        // connection exceptions, insufficient resources, operator intervention (shutdown, crash),
        // system errors (I/O)
        s if s.starts_with("08") || s.starts_with("53") || s.starts_with("57P") || s.starts_with("58") => {
            Some(Fault::Unavailable)
        }
        _ => None,
    }
}

/// How long PostgreSQL may keep a request waiting before it is answered 503, for the sender's store and
/// the inbox's alike.
///
/// - `acquire`: the pool's acquire timeout — waiting for a free connection, opening a new one (a refused
///   or black-holed server) and the liveness check of an idle one all count against it.
/// - `statement`: every session's `statement_timeout` and `lock_timeout` (the server cancels what runs
///   or waits longer), and, on the client's side, the bound on a whole write transaction, after which
///   its connection is dropped: a connection whose server went silent mid-statement would otherwise
///   wait for TCP to give up (about 15 minutes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatabaseTimeouts {
    /// See the type's documentation.
    pub acquire: Duration,
    /// See the type's documentation.
    pub statement: Duration,
}

impl Default for DatabaseTimeouts {
    fn default() -> Self {
        Self {
            acquire: Duration::from_secs(1),
            statement: Duration::from_secs(5),
        }
    }
}

impl DatabaseTimeouts {
    /// These timeouts with the settings given as text (`database_timeout`, `database_statement_timeout`:
    /// durations such as `1s` or `250ms`, more than zero) in place of their values; `None` keeps a
    /// value. The error names the key at fault.
    pub fn with_settings(self, acquire: Option<&str>, statement: Option<&str>) -> Result<Self, String> {
        let parse = |key: &str, text: Option<&str>, kept: Duration| match text.map(herald_core::retry::parse_duration) {
            None => Ok(kept),
            Some(Ok(duration)) if !duration.is_zero() => Ok(duration),
            Some(Ok(_)) => Err(format!("{key}: must be more than 0")),
            Some(Err(error)) => Err(format!("{key}: {error}")),
        };
        Ok(Self {
            acquire: parse("database_timeout", acquire, self.acquire)?,
            statement: parse("database_statement_timeout", statement, self.statement)?,
        })
    }

    /// The session settings that make the server enforce `statement` (added to `options`).
    pub fn session(&self, options: PgConnectOptions) -> PgConnectOptions {
        let statement = self.statement.as_millis().to_string();
        options.options([
            ("statement_timeout", statement.as_str()),
            ("lock_timeout", statement.as_str()),
            // A client that vanished mid-transaction must not hold its locks (the ingest order lock
            // among them) for longer than a statement may run.
            ("idle_in_transaction_session_timeout", statement.as_str()),
        ])
    }

    /// Pool options with the acquire timeout, the release check of `bound` (see [`Bound::pool`]), and
    /// `TCP_NODELAY` on each new connection over TCP ([`crate::tcp_nodelay`]).
    pub fn pool(&self, bound: &Bound) -> PgPoolOptions {
        bound.pool(
            PgPoolOptions::new()
                .acquire_timeout(self.acquire)
                .after_connect(|conn, _| crate::tcp_nodelay::set_on(conn).boxed()),
        )
    }

    /// The client-side bound of every store call: [`DatabaseTimeouts::transaction`].
    pub fn bound(&self) -> Bound {
        Bound::new(self.transaction())
    }

    /// The client-side bound of one write transaction: the server's own bound, plus the time to get a
    /// connection and to hear back. The sender's group-commit writer gives a batch up after it, and a
    /// request waits for its group commit no longer than it.
    pub fn transaction(&self) -> Duration {
        self.statement + self.acquire
    }
}

/// A store call that ran out of its [`Bound`] (how long it had). Each store's error type converts it
/// into its own `TimedOut`, a storage fault ([`Fault::Unavailable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedOut(pub Duration);

/// How long after a call was given up the pool still checks every connection it gets back (see
/// [`Bound::pool`]): an abandoned call drops its connection at once, so this only has to outlast the
/// moment between the two.
const ABANDONED_WINDOW: Duration = Duration::from_secs(60);

/// The client-side bound of every call to a PostgreSQL store ([`DatabaseTimeouts::bound`]).
///
/// The server enforces `statement_timeout` itself, but a server (or a network path) that went silent
/// enforces nothing: the call would wait until TCP gives up. [`Bound::run`] gives the call up after
/// the bound with [`TimedOut`] instead, so the request is answered 503 and a background task (the result
/// writer, retention, the inbox forwarder) retries on its own schedule. A connection the call held is
/// then left mid-statement; the pool's release check ([`Bound::pool`]) closes it if it does not answer
/// within the bound either, so that no pool slot waits on a dead connection.
#[derive(Debug, Clone)]
pub struct Bound {
    limit: Duration,
    /// When a call was last given up.
    abandoned: Arc<Mutex<Option<Instant>>>,
}

/// A call of [`Bound::run`] in progress: dropped before [`Unfinished::finished`], it marks its bound
/// abandoned.
struct Unfinished<'a>(Option<&'a Bound>);

impl Unfinished<'_> {
    fn finished(mut self) {
        self.0 = None;
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(bound) = self.0 {
            bound.mark_abandoned();
        }
    }
}

impl Bound {
    /// A bound of `limit` on each call.
    pub fn new(limit: Duration) -> Self {
        Self {
            limit,
            abandoned: Arc::default(),
        }
    }

    /// How long a call may take.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// Run `work`, giving it up after the bound with [`TimedOut`]. Its outcome is then unknown (a write
    /// may still commit), so the caller must not acknowledge it.
    pub async fn run<T, E: From<TimedOut>>(&self, work: impl Future<Output = Result<T, E>>) -> Result<T, E> {
        let mut work = std::pin::pin!(work);
        // Declared after `work`, so dropped before it: should the caller itself go away mid-call (a
        // client that disconnected drops its request's future), the mark is set before the connection
        // `work` holds goes back to the pool, whose release check then bounds its ping too.
        let unfinished = Unfinished(Some(self));
        let outcome = tokio::time::timeout(self.limit, work.as_mut()).await;
        unfinished.finished();
        match outcome {
            Ok(done) => done,
            Err(_) => {
                // Marked before `work` (and the connection it holds) is dropped at the end of this scope,
                // so the pool's release check sees the mark.
                self.mark_abandoned();
                Err(TimedOut(self.limit).into())
            }
        }
    }

    /// [`Bound::run`] for work without a result (shutting down): whether it finished in time.
    pub async fn run_quietly(&self, work: impl Future<Output = ()>) -> bool {
        self.run(async {
            work.await;
            Ok::<(), TimedOut>(())
        })
        .await
        .is_ok()
    }

    /// Whether a call was given up (or dropped unfinished) lately: what the release check acts on.
    fn abandoned_lately(&self) -> bool {
        self.abandoned
            .lock()
            .ok()
            .and_then(|abandoned| *abandoned)
            .is_some_and(|at| at.elapsed() < ABANDONED_WINDOW)
    }

    fn mark_abandoned(&self) {
        if let Ok(mut abandoned) = self.abandoned.lock() {
            *abandoned = Some(Instant::now());
        }
    }

    /// `options` with the release check: for a while after a call was given up, a connection coming
    /// back to the pool must answer a ping within the bound, or it is closed. sqlx pings every released
    /// connection itself, but without a bound: a connection left mid-statement on a silent server would
    /// hold its pool slot until TCP gives up. Otherwise (no call given up lately) the check costs nothing.
    pub fn pool(&self, options: PgPoolOptions) -> PgPoolOptions {
        let bound = self.clone();
        options.after_release(move |conn, _| {
            let bound = bound.clone();
            async move {
                if !bound.abandoned_lately() {
                    return Ok(true);
                }
                match tokio::time::timeout(bound.limit, conn.ping()).await {
                    Ok(answered) => answered.map(|()| true),
                    Err(_) => {
                        tracing::warn!(bound = ?bound.limit, "closing a database connection that stopped answering");
                        // An error closes it without the goodbye it would never answer.
                        Err(sqlx::Error::PoolTimedOut)
                    }
                }
            }
            .boxed()
        })
    }
}

/// Options of the one-connection pool every SQLite write goes through: a connection is reused only if
/// no transaction is open on it, neither by sqlx's count nor by SQLite's; otherwise it is closed and the
/// next write opens a clean one, and it is fully durable again (`synchronous = FULL`, whatever the last
/// write set; see `in_clean_state`). `acquire_timeout` bounds how long a write waits for the connection.
///
/// Every write acquires and releases this connection (herald-store's ingest writer keeps it across
/// batches while it is busy and no other write waits), and each call to SQLite is a round trip to the
/// connection's own thread, so the pool makes as few as it can: no ping before an acquire (the release
/// already checked the connection, and a local file does not hang up), and the release check in one call.
pub fn sqlite_writer_pool(acquire_timeout: Duration) -> SqlitePoolOptions {
    SqlitePoolOptions::new()
        .max_connections(1)
        .acquire_timeout(acquire_timeout)
        .test_before_acquire(false)
        .after_release(|conn, _| async move { Ok(in_clean_state(conn).await) }.boxed())
}

/// Whether no transaction is open on the connection. SQLite refuses `BEGIN` inside a transaction, so a
/// `BEGIN` that succeeds (and is rolled back at once, in the same call) proves there is none; it takes
/// no lock.
///
/// The same call puts back `synchronous = FULL` (every commit fsynced), which a write may have lowered
/// for its own transaction — the sender's attempt results written alone do (herald-store's
/// `sqlite::results_begin`):
/// every write that takes the connection next finds it fully durable again, at no round trip of its own.
async fn in_clean_state(conn: &mut SqliteConnection) -> bool {
    if conn.is_in_transaction() {
        tracing::warn!("discarding the SQLite write connection: a transaction it opened was not closed");
        return false;
    }
    if let Err(error) = conn.execute("BEGIN; ROLLBACK; PRAGMA synchronous = FULL").await {
        tracing::warn!(%error, "discarding the SQLite write connection: SQLite refused to open (or close) a transaction or to restore `synchronous = FULL`, so it may hold a transaction sqlx does not know of");
        return false;
    }
    true
}

/// Whether the last write failed on a storage fault, and how. Writers report every commit's outcome;
/// health checks read it (and, while it is failing, probe with a real write, since a node that is taken
/// out of rotation gets no other writes to tell it the storage is back).
///
/// A [`Fault::Corrupt`] stays reported until the process restarts, even when later writes commit: a
/// damaged file does not heal, and its other pages may still hold the damage (the restart's check,
/// [`crate::integrity`], decides whether the file is served again).
#[derive(Debug, Default)]
pub struct WriteHealth {
    failing: Mutex<Option<(Fault, String)>>,
    corrupt: Mutex<Option<String>>,
}

impl WriteHealth {
    /// A write committed.
    pub fn succeeded(&self) {
        if let Ok(mut failing) = self.failing.lock()
            && failing.take().is_some()
        {
            tracing::info!("store writes succeed again");
        }
    }

    /// A write failed on a storage fault (`detail`: the error, for logs and health).
    pub fn failed(&self, fault: Fault, detail: impl Into<String>) {
        let detail = detail.into();
        if fault == Fault::Corrupt
            && let Ok(mut corrupt) = self.corrupt.lock()
            && corrupt.is_none()
        {
            tracing::error!(%detail, "the database reports its file damaged; restore or recover it (docs/reliability.md)");
            *corrupt = Some(detail.clone());
        }
        if let Ok(mut failing) = self.failing.lock() {
            *failing = Some((fault, detail));
        }
    }

    /// What the database said when it first reported its file damaged, if it ever did.
    pub fn corruption(&self) -> Option<String> {
        self.corrupt.lock().ok()?.clone()
    }

    /// Report a write's outcome (`fault` classifies its error) and pass it on.
    pub fn watch<T, E: std::fmt::Display>(
        &self,
        result: Result<T, E>,
        fault: impl Fn(&E) -> Option<Fault>,
    ) -> Result<T, E> {
        match &result {
            Ok(_) => self.succeeded(),
            Err(error) => {
                if let Some(fault) = fault(error) {
                    self.failed(fault, error.to_string());
                }
            }
        }
        result
    }

    /// For health checks: while writes fail, run `probe` (one small committed write) and report its
    /// outcome — only a committed write tells whether the storage is back, and a node taken out of
    /// rotation gets no other write to find out. Healthy, nothing is written. Once the file was reported
    /// damaged, `damaged` makes the error (with what the database said), probe or not.
    pub async fn recheck<E: std::fmt::Display>(
        &self,
        probe: impl Future<Output = Result<(), E>>,
        fault: impl Fn(&E) -> Option<Fault>,
        damaged: impl FnOnce(String) -> E,
    ) -> Result<(), E> {
        if let Some(detail) = self.corruption() {
            return Err(damaged(detail));
        }
        match self.failure() {
            Some((fault, detail)) => {
                tracing::debug!(code = fault.code(), %detail, "store writes failing; probing");
            }
            None => return Ok(()),
        }
        self.watch(probe.await, fault)
    }

    /// The fault of the last write and its error text, while writes fail.
    pub fn failure(&self) -> Option<(Fault, String)> {
        self.failing.lock().ok()?.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The write pool of a fresh SQLite file (WAL, as the stores open theirs), and a second connection
    /// to read it from outside.
    async fn writer_pool(name: &str) -> (sqlx::SqlitePool, SqliteConnection, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("herald-custody-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temporary directory");
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(dir.join("w.db"))
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal);
        let pool = sqlite_writer_pool(Duration::from_secs(5))
            .connect_with(options.clone())
            .await
            .expect("write pool");
        sqlx::query("CREATE TABLE t (n INTEGER)")
            .execute(&pool)
            .await
            .expect("table");
        let outside = SqliteConnection::connect_with(&options).await.expect("outside");
        (pool, outside, dir)
    }

    async fn rows(conn: &mut SqliteConnection) -> Vec<i64> {
        sqlx::query_scalar("SELECT n FROM t ORDER BY n")
            .fetch_all(conn)
            .await
            .expect("read")
    }

    #[tokio::test]
    async fn a_released_write_connection_with_a_transaction_sqlite_holds_is_closed_not_reused() {
        let (pool, mut outside, dir) = writer_pool("held").await;
        let mut conn = pool.acquire().await.expect("acquire");
        // A transaction sqlx does not count (its own `begin` would), with a write in it.
        conn.execute("BEGIN; INSERT INTO t VALUES (1)").await.expect("begin");
        assert!(!conn.is_in_transaction(), "sqlx does not know of it");
        drop(conn);
        // Had the connection come back, this write would join that transaction and never commit.
        sqlx::query("INSERT INTO t VALUES (2)")
            .execute(&pool)
            .await
            .expect("write");
        assert_eq!(
            rows(&mut outside).await,
            [2],
            "only the write after the release committed"
        );
        pool.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Reads the temporary table [`mark_connection`] made: fails on any other connection.
    const SAME_CONNECTION: &str = "SELECT COUNT(*) FROM temp.mine";

    /// Mark the pool's connection with a temporary table, which lives as long as the connection: reading
    /// it ([`SAME_CONNECTION`]) again means the same connection came back.
    async fn mark_connection(pool: &sqlx::SqlitePool) {
        sqlx::query("CREATE TEMP TABLE mine (n INTEGER)")
            .execute(pool)
            .await
            .expect("temp table");
    }

    #[tokio::test]
    async fn a_clean_released_write_connection_is_reused() {
        let (pool, _outside, dir) = writer_pool("clean").await;
        mark_connection(&pool).await;
        for _ in 0..3 {
            sqlx::query(SAME_CONNECTION)
                .execute(&pool)
                .await
                .expect("the same connection, checked clean and reused");
        }
        pool.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn a_released_write_connection_is_fully_durable_again_whatever_a_write_lowered() {
        let (pool, _outside, dir) = writer_pool("synchronous").await;
        // A fresh connection would be fully durable anyway: the test reads the reused one.
        mark_connection(&pool).await;
        let synchronous = |pool: sqlx::SqlitePool| async move {
            let mut conn = pool.acquire().await.expect("acquire");
            sqlx::query(SAME_CONNECTION)
                .execute(&mut *conn)
                .await
                .expect("the same connection, reused");
            let level: i64 = sqlx::query_scalar("PRAGMA synchronous")
                .fetch_one(&mut *conn)
                .await
                .expect("read the setting");
            level
        };
        const FULL: i64 = 2;
        assert_eq!(synchronous(pool.clone()).await, FULL, "as opened");
        let mut conn = pool.acquire().await.expect("acquire");
        // What a batch of attempt results begins with (herald-store's `sqlite::write_results`).
        let mut tx = conn
            .begin_with("PRAGMA synchronous = NORMAL; BEGIN")
            .await
            .expect("begin");
        sqlx::query("INSERT INTO t VALUES (1)")
            .execute(&mut *tx)
            .await
            .expect("write");
        tx.commit().await.expect("commit");
        drop(conn);
        assert_eq!(
            synchronous(pool.clone()).await,
            FULL,
            "the next write on the (reused) connection fsyncs its commit"
        );
        pool.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn a_call_dropped_unfinished_marks_its_bound_as_a_call_given_up() {
        let bound = Bound::new(Duration::from_secs(60));
        let finished: Result<(), TimedOut> = bound.run(async { Ok(()) }).await;
        assert!(finished.is_ok());
        assert!(!bound.abandoned_lately(), "a finished call marks nothing");
        // The caller goes away while the call waits on a silent server.
        let dropped = tokio::time::timeout(
            Duration::from_millis(20),
            bound.run(std::future::pending::<Result<(), TimedOut>>()),
        )
        .await;
        assert!(dropped.is_err());
        assert!(
            bound.abandoned_lately(),
            "the dropped call's connection must be checked on release"
        );
    }

    #[test]
    fn sqlite_codes_are_classified_on_their_primary_code() {
        assert_eq!(sqlite_fault(sqlite_code::FULL), Some(Fault::Full));
        // SQLITE_IOERR_FSYNC = IOERR | (4 << 8)
        assert_eq!(
            sqlite_fault((sqlite_code::IOERR | (4 << 8)) & 0xff),
            Some(Fault::Unavailable)
        );
        // SQLITE_CONSTRAINT: an error of the request, not of the storage.
        assert_eq!(sqlite_fault(19), None);
    }

    #[test]
    fn postgres_states_are_classified() {
        assert_eq!(postgres_fault("53100"), Some(Fault::Full));
        assert_eq!(postgres_fault("57014"), Some(Fault::Unavailable));
        assert_eq!(postgres_fault("08006"), Some(Fault::Unavailable));
        assert_eq!(postgres_fault("23505"), None);
    }

    #[test]
    fn health_fails_until_a_write_succeeds() {
        let health = WriteHealth::default();
        assert!(health.failure().is_none());
        assert_eq!(fault_of(&sqlx::Error::RowNotFound), None);
        health.failed(Fault::Full, "disk full");
        assert_eq!(health.failure().map(|f| f.0), Some(Fault::Full));
        health.succeeded();
        assert!(health.failure().is_none());
    }

    #[test]
    fn a_damaged_file_stays_reported_after_writes_succeed() {
        let health = WriteHealth::default();
        health.failed(Fault::Corrupt, "database disk image is malformed");
        health.succeeded();
        assert!(health.failure().is_none());
        assert_eq!(health.corruption().as_deref(), Some("database disk image is malformed"));
        assert_eq!(sqlite_fault(sqlite_code::CORRUPT), Some(Fault::Corrupt));
        assert_eq!(sqlite_fault(sqlite_code::NOTADB), Some(Fault::Corrupt));
        assert_eq!(postgres_fault("XX001"), Some(Fault::Corrupt));
    }
}
