//! Group commit: one task inserts every waiting event in one transaction and one fsync; another records
//! every waiting forwarding outcome the same way.
//!
//! Handlers send their event here and wait on a oneshot. The writer takes whatever is queued (up to
//! [`MAX_BATCH`]), inserts it all in one transaction, commits once and only then answers each handler.
//! Idle, a lone event commits at once; under load the batches grow by themselves, so throughput scales
//! with concurrency while every acknowledged event is on disk. Outcomes are batched for the same reason:
//! with `synchronous=FULL` a commit costs an fsync, and one per forwarded event would cap forwarding at
//! the disk's fsync rate.

use std::sync::Arc;

use futures::future::BoxFuture;
use herald_core::clock::Millis;
use herald_sql::custody::WriteHealth;
use sqlx::{SqliteConnection, SqlitePool};
use tokio::sync::{mpsc, oneshot};

use super::sql::{self, Record};
use super::{Inserted, NewEvent, StoreError, StoreResult};

/// The most events committed in one transaction.
pub(super) const MAX_BATCH: usize = 256;

pub(super) struct InsertJob {
    pub(super) event: NewEvent,
    pub(super) received_at: Millis,
    pub(super) reply: oneshot::Sender<StoreResult<Inserted>>,
}

/// Insert events until every sender is gone, reporting each commit's outcome to `health`.
pub(super) async fn run(pool: SqlitePool, mut jobs: mpsc::Receiver<InsertJob>, health: Arc<WriteHealth>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while jobs.recv_many(&mut batch, MAX_BATCH).await > 0 {
        match health.watch(write_batch(&pool, &batch).await, StoreError::fault) {
            Ok(answers) => {
                for (job, answer) in batch.drain(..).zip(answers) {
                    // A handler that gave up (client went away) no longer listens; its row is stored all
                    // the same and will be forwarded.
                    let _ = job.reply.send(Ok(answer));
                }
            }
            Err(error) => {
                // Nothing of the batch was committed, so nobody gets a 2xx: each sender retries.
                tracing::error!(%error, events = batch.len(), "inbox commit failed");
                for job in batch.drain(..) {
                    let _ = job.reply.send(Err(error.shared_by_batch()));
                }
            }
        }
    }
}

async fn write_batch(pool: &SqlitePool, batch: &[InsertJob]) -> StoreResult<Vec<Inserted>> {
    commit_each(pool, batch, |tx, job| {
        Box::pin(sql::insert_one(tx, &job.event, job.received_at))
    })
    .await
}

pub(super) struct RecordJob {
    pub(super) record: Record,
    pub(super) reply: oneshot::Sender<StoreResult<bool>>,
}

/// Record outcomes until every sender is gone, reporting each commit's outcome to `health`.
pub(super) async fn run_records(pool: SqlitePool, mut jobs: mpsc::Receiver<RecordJob>, health: Arc<WriteHealth>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while jobs.recv_many(&mut batch, MAX_BATCH).await > 0 {
        match health.watch(record_batch(&pool, &batch).await, StoreError::fault) {
            Ok(answers) => {
                for (job, answer) in batch.drain(..).zip(answers) {
                    let _ = job.reply.send(Ok(answer));
                }
            }
            Err(error) => {
                // Nothing was recorded: the events stay pending and are forwarded again (at least once).
                tracing::error!(%error, outcomes = batch.len(), "recording forwarding outcomes failed");
                for job in batch.drain(..) {
                    let _ = job.reply.send(Err(error.shared_by_batch()));
                }
            }
        }
    }
}

async fn record_batch(pool: &SqlitePool, batch: &[RecordJob]) -> StoreResult<Vec<bool>> {
    commit_each(pool, batch, |tx, job| Box::pin(sql::record_one(tx, &job.record))).await
}

/// Run `one` for every job in one transaction and commit it; the answers in order. After a failure the
/// connection is closed, never reused: SQLite may have rolled the transaction back on its own (disk
/// full, I/O error), and a connection whose transaction state nobody can vouch for would run the next
/// batch inside a transaction that is never committed (see [`herald_sql::custody`]).
async fn commit_each<J, A>(
    pool: &SqlitePool,
    batch: &[J],
    one: impl for<'c> Fn(&'c mut SqliteConnection, &'c J) -> BoxFuture<'c, StoreResult<A>>,
) -> StoreResult<Vec<A>> {
    let mut conn = pool.acquire().await?;
    let committed = async {
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        let mut answers = Vec::with_capacity(batch.len());
        for job in batch {
            answers.push(one(&mut tx, job).await?);
        }
        tx.commit().await?;
        Ok(answers)
    }
    .await;
    if committed.is_err() {
        conn.close_on_drop();
    }
    committed
}
