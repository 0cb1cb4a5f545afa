//! The inbox on one SQLite file: WAL mode and `synchronous=FULL`, so that an acknowledged event survives
//! `kill -9` and a power cut; one writer connection (inserts and forwarding outcomes each go through a
//! group-commit writer) and a small pool of readers.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use herald_sql::custody::{self, WriteHealth};
use sqlx::SqlitePool;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tokio::sync::{mpsc, oneshot, watch};

use super::sql::{self, Backend, Record};
use super::writer::{self, InsertJob, RecordJob};
use super::{Forwarding, Inserted, NewEvent, StoreError, StoreResult};

/// Inserts that may wait for the writer before callers queue on the channel itself.
const INSERT_QUEUE: usize = 1_024;
/// How long a write waits for the write connection before it fails with 503.
const WRITE_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// The SQLite implementation of [`InboxStore`](super::InboxStore).
#[derive(Debug)]
pub struct SqliteInbox {
    read: SqlitePool,
    write: SqlitePool,
    inserts: mpsc::Sender<InsertJob>,
    records: mpsc::Sender<RecordJob>,
    /// Always true: one inbox process per file. Kept so that its receivers never see it closed.
    forwarding: watch::Sender<bool>,
    /// Whether the last commit failed on a storage fault (see [`custody::WriteHealth`]).
    health: Arc<WriteHealth>,
}

impl SqliteInbox {
    /// Open (creating if needed) the database at `url` (`sqlite://PATH`), run the inbox's migrations and
    /// start the group-commit writer.
    ///
    /// # Errors
    ///
    /// Database and migration errors.
    pub async fn open(url: &str) -> StoreResult<Self> {
        let base = SqliteConnectOptions::from_str(url)?
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10));
        let write = custody::sqlite_writer_pool(WRITE_ACQUIRE_TIMEOUT)
            .connect_with(base.clone().create_if_missing(true))
            .await?;
        sql::migrator(sqlx::migrate!("./migrations/sqlite")).run(&write).await?;
        let read = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(base.read_only(true))
            .await?;
        let health = Arc::new(WriteHealth::default());
        let (inserts, jobs) = mpsc::channel(INSERT_QUEUE);
        tokio::spawn(writer::run(write.clone(), jobs, health.clone()));
        let (records, outcomes) = mpsc::channel(INSERT_QUEUE);
        tokio::spawn(writer::run_records(write.clone(), outcomes, health.clone()));
        Ok(Self {
            read,
            write,
            inserts,
            records,
            forwarding: watch::Sender::new(true),
            health,
        })
    }
}

#[async_trait::async_trait]
impl Backend for SqliteInbox {
    type Connection = sqlx::SqliteConnection;
    type Pooled = PoolConnection<sqlx::Sqlite>;

    async fn read(&self) -> StoreResult<Self::Pooled> {
        Ok(self.read.acquire().await?)
    }

    async fn write(&self) -> StoreResult<Self::Pooled> {
        Ok(self.write.acquire().await?)
    }

    async fn insert_event(&self, event: NewEvent) -> StoreResult<Inserted> {
        let (reply, answer) = oneshot::channel();
        let job = InsertJob {
            event,
            received_at: herald_core::clock::now(),
            reply,
        };
        self.inserts.send(job).await.map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    async fn record_outcome(&self, record: Record) -> StoreResult<bool> {
        let (reply, answer) = oneshot::channel();
        self.records
            .send(RecordJob { record, reply })
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    fn write_health(&self) -> Option<&WriteHealth> {
        Some(&self.health)
    }

    fn forwarding(&self) -> Forwarding {
        Forwarding {
            allowed: self.forwarding.subscribe(),
            poll: None,
        }
    }
}
