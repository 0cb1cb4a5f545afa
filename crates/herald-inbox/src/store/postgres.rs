//! The inbox on PostgreSQL: the same statements and behaviour as on SQLite (see `sql`), on a pool of
//! connections.
//!
//! - Custody: an event is inserted by one autocommitted statement, so when [`InboxStore::insert`] returns
//!   the row is committed, and a commit with `synchronous_commit = on` is flushed to the WAL on disk.
//!   The pool's connections set `synchronous_commit = on` themselves, so a server or database whose
//!   default is `off` (or `local`/`remote_write` meaning less than a flush) cannot weaken the 2xx.
//! - Concurrency: PostgreSQL takes many writers at once, so there is no group-commit writer; concurrent
//!   inserts of the same `(source, event_id)` are serialised by the unique index (see
//!   `sql::insert_one`), and an outcome is recorded in its own transaction.
//! - Text: PostgreSQL's `text` cannot hold NUL, which event ids, resource keys and versions read from the
//!   network may contain; every text value is stored escaped (the sender's scheme,
//!   [`herald_sql::text`]) and unescaped when read, so it round-trips exactly and equality
//!   and uniqueness behave as on the original values. Headers are JSON text, in which NUL is `\u0000`.
//! - Coexistence: the tables are `inbox_…` and the migrations are recorded in `_herald_inbox_migrations`,
//!   so the sender's store may use the same database.
//! - One forwarder per database: several processes may receive into one database (every node of a
//!   cluster running `herald serve --inbox`), but only the one holding a session advisory lock forwards
//!   (see [`Forwarding`]); when it dies its connection closes, the lock is released and another process
//!   takes over within [`LOCK_CHECK`]. The holder looks for due events every [`POLL`], since events
//!   received by other processes cannot wake it.
//!
//! [`InboxStore::insert`]: super::InboxStore::insert

use std::time::Duration;

use herald_sql::custody::{Bound, DatabaseTimeouts};
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, PgConnection, PgPool};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::sql::{self, Backend, Record};
use super::{Forwarding, Inserted, NewEvent, StoreResult};

/// Connections: ingress inserts, the forwarder's outcomes and reads, admin reads.
const POOL_SIZE: u32 = 16;

/// The session advisory lock held by the one process that forwards ("hinbox" in ASCII; the sender's
/// locks are "herald" and "heralE").
const FORWARDER_LOCK: i64 = 0x6869_6e62_6f78;
/// How often a process that does not hold the forwarder lock tries to take it, and the holder checks that
/// its lock connection still answers (within as long again).
pub const LOCK_CHECK: Duration = Duration::from_secs(2);
/// How often the forwarder looks for due events that another process received.
pub const POLL: Duration = Duration::from_secs(1);

/// The PostgreSQL implementation of [`InboxStore`](super::InboxStore).
#[derive(Debug)]
pub struct PgInbox {
    pool: PgPool,
    forwarding: watch::Receiver<bool>,
    lock_keeper: JoinHandle<()>,
}

impl Drop for PgInbox {
    fn drop(&mut self) {
        // Its connection closes with it, which releases the forwarder lock for another process at once.
        self.lock_keeper.abort();
    }
}

impl PgInbox {
    /// Connect to the database at `url` (`postgres://…`; it must exist) with these timeouts and run the
    /// inbox's migrations; with the bound its calls are to be held to (see [`super::BoundedInbox`]),
    /// which its pool's release check shares.
    ///
    /// # Errors
    ///
    /// Database and migration errors.
    pub async fn open(url: &str, timeouts: DatabaseTimeouts) -> StoreResult<(Self, Bound)> {
        let options = herald_sql::loopback::connect_options(url)?
            .application_name("herald-inbox")
            .options([("synchronous_commit", "on")]);
        // While the database refuses or stops answering, providers hear 503 within the acquire timeout
        // and retry later instead of piling up; the server cancels a statement or lock wait that runs
        // longer than the statement timeout.
        let bound = timeouts.bound();
        let pool = timeouts
            .pool(&bound)
            .max_connections(POOL_SIZE)
            .connect_with(timeouts.session(options.clone()))
            .await?;
        // sqlx's migrator takes an advisory lock, so processes starting together migrate once.
        sql::migrator(sqlx::migrate!("./migrations/postgres"))
            .run(&pool)
            .await?;
        let (holding, forwarding) = watch::channel(false);
        // The server side of the lock's connection probes it, so that the lock of a holder cut off by the
        // network (no FIN ever arrives) is released within seconds, not after the kernel's two hours.
        let lock_options = options.options([
            ("tcp_keepalives_idle", "5"),
            ("tcp_keepalives_interval", "2"),
            ("tcp_keepalives_count", "3"),
        ]);
        let lock_keeper = tokio::spawn(keep_forwarder_lock(lock_options, holding));
        let inbox = Self {
            pool,
            forwarding,
            lock_keeper,
        };
        Ok((inbox, bound))
    }
}

/// Hold the forwarder lock whenever possible, publishing whether this process holds it.
async fn keep_forwarder_lock(options: PgConnectOptions, holding: watch::Sender<bool>) {
    loop {
        if let Err(error) = hold_forwarder_lock(&options, &holding).await {
            tracing::warn!(%error, "inbox: lost the forwarder lock's connection; trying again");
        }
        if holding.send_replace(false) {
            tracing::warn!("inbox: this process no longer forwards (another one may take over)");
        }
        tokio::time::sleep(LOCK_CHECK).await;
    }
}

/// Take the lock (waiting for it while another process holds it), then keep checking its connection;
/// returns with an error when the connection fails.
async fn hold_forwarder_lock(options: &PgConnectOptions, holding: &watch::Sender<bool>) -> StoreResult<()> {
    let mut conn: PgConnection = options.connect().await?;
    loop {
        let taken: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(FORWARDER_LOCK)
            .fetch_one(&mut conn)
            .await?;
        if taken {
            break;
        }
        tokio::time::sleep(LOCK_CHECK).await;
    }
    tracing::info!("inbox: this process holds the forwarder lock and forwards");
    holding.send_replace(true);
    loop {
        tokio::time::sleep(LOCK_CHECK).await;
        // A connection that hangs (the network dropped it silently) counts as lost: stop starting forwards
        // before the server releases the lock to another process.
        match tokio::time::timeout(LOCK_CHECK, sqlx::query("SELECT 1").execute(&mut conn)).await {
            Ok(answer) => {
                answer?;
            }
            Err(_) => return Err(sqlx::Error::PoolTimedOut.into()),
        }
    }
}

#[async_trait::async_trait]
impl Backend for PgInbox {
    type Connection = sqlx::PgConnection;
    type Pooled = PoolConnection<sqlx::Postgres>;

    async fn read(&self) -> StoreResult<Self::Pooled> {
        Ok(self.pool.acquire().await?)
    }

    async fn write(&self) -> StoreResult<Self::Pooled> {
        Ok(self.pool.acquire().await?)
    }

    async fn insert_event(&self, event: NewEvent) -> StoreResult<Inserted> {
        let mut conn = self.pool.acquire().await?;
        sql::insert_one(&mut *conn, &event, herald_core::clock::now()).await
    }

    async fn record_outcome(&self, record: Record) -> StoreResult<bool> {
        let mut tx = self.pool.begin().await?;
        let recorded = sql::record_one(&mut *tx, &record).await?;
        tx.commit().await?;
        Ok(recorded)
    }

    fn forwarding(&self) -> Forwarding {
        Forwarding {
            allowed: self.forwarding.clone(),
            poll: Some(POLL),
        }
    }
}
