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
//!   [`herald_store::postgres::text`]) and unescaped when read, so it round-trips exactly and equality
//!   and uniqueness behave as on the original values. Headers are JSON text, in which NUL is `\u0000`.
//! - Coexistence: the tables are `inbox_…` and the migrations are recorded in `_herald_inbox_migrations`,
//!   so the sender's store may use the same database.
//!
//! [`InboxStore::insert`]: super::InboxStore::insert

use std::str::FromStr;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use super::sql::{self, Backend, Record};
use super::{Inserted, NewEvent, StoreResult};

/// Connections: ingress inserts, the forwarder's outcomes and reads, admin reads.
const POOL_SIZE: u32 = 16;
/// How long a request waits for a connection before it fails (503): short, so that while the database
/// is unreachable providers hear so quickly and retry later instead of piling up.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// The PostgreSQL implementation of [`InboxStore`](super::InboxStore).
#[derive(Debug)]
pub struct PgInbox {
    pool: PgPool,
}

impl PgInbox {
    /// Connect to the database at `url` (`postgres://…`; it must exist) and run the inbox's migrations.
    ///
    /// # Errors
    ///
    /// Database and migration errors.
    pub async fn open(url: &str) -> StoreResult<Self> {
        let options = PgConnectOptions::from_str(url)?
            .application_name("herald-inbox")
            .options([("synchronous_commit", "on")]);
        let pool = PgPoolOptions::new()
            .max_connections(POOL_SIZE)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await?;
        // sqlx's migrator takes an advisory lock, so processes starting together migrate once.
        sql::migrator(sqlx::migrate!("./migrations/postgres"))
            .run(&pool)
            .await?;
        Ok(Self { pool })
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
        sql::insert_one(&mut *conn, &event, herald_core::clock::now_ms()).await
    }

    async fn record_outcome(&self, record: Record) -> StoreResult<bool> {
        let mut tx = self.pool.begin().await?;
        let recorded = sql::record_one(&mut *tx, &record).await?;
        tx.commit().await?;
        Ok(recorded)
    }
}
