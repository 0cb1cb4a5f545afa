//! Group commit: one task inserts every waiting event in one transaction and one fsync; another records
//! every waiting forwarding outcome the same way.
//!
//! Handlers send their event here and wait on a oneshot. The writer takes whatever is queued (up to
//! [`MAX_BATCH`]), inserts it all in one transaction, commits once and only then answers each handler.
//! Idle, a lone event commits at once; under load the batches grow by themselves, so throughput scales
//! with concurrency while every acknowledged event is on disk. Outcomes are batched for the same reason:
//! with `synchronous=FULL` a commit costs an fsync, and one per forwarded event would cap forwarding at
//! the disk's fsync rate.

use sqlx::SqlitePool;
use tokio::sync::{mpsc, oneshot};

use super::sql::{self, Record};
use super::{Inserted, NewEvent, StoreError, StoreResult};

/// The most events committed in one transaction.
pub(super) const MAX_BATCH: usize = 256;

pub(super) struct InsertJob {
    pub(super) event: NewEvent,
    pub(super) received_at: i64,
    pub(super) reply: oneshot::Sender<StoreResult<Inserted>>,
}

pub(super) async fn run(pool: SqlitePool, mut jobs: mpsc::Receiver<InsertJob>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while jobs.recv_many(&mut batch, MAX_BATCH).await > 0 {
        match write_batch(&pool, &batch).await {
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
                let text = error.to_string();
                for job in batch.drain(..) {
                    let _ = job.reply.send(Err(StoreError::Batch(text.clone())));
                }
            }
        }
    }
}

async fn write_batch(pool: &SqlitePool, batch: &[InsertJob]) -> StoreResult<Vec<Inserted>> {
    let mut tx = pool.begin().await?;
    let mut answers = Vec::with_capacity(batch.len());
    for job in batch {
        answers.push(sql::insert_one(&mut *tx, &job.event, job.received_at).await?);
    }
    tx.commit().await?;
    Ok(answers)
}

pub(super) struct RecordJob {
    pub(super) record: Record,
    pub(super) reply: oneshot::Sender<StoreResult<bool>>,
}

pub(super) async fn run_records(pool: SqlitePool, mut jobs: mpsc::Receiver<RecordJob>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while jobs.recv_many(&mut batch, MAX_BATCH).await > 0 {
        match record_batch(&pool, &batch).await {
            Ok(answers) => {
                for (job, answer) in batch.drain(..).zip(answers) {
                    let _ = job.reply.send(Ok(answer));
                }
            }
            Err(error) => {
                // Nothing was recorded: the events stay pending and are forwarded again (at least once).
                tracing::error!(%error, outcomes = batch.len(), "recording forwarding outcomes failed");
                let text = error.to_string();
                for job in batch.drain(..) {
                    let _ = job.reply.send(Err(StoreError::Batch(text.clone())));
                }
            }
        }
    }
}

async fn record_batch(pool: &SqlitePool, batch: &[RecordJob]) -> StoreResult<Vec<bool>> {
    let mut tx = pool.begin().await?;
    let mut answers = Vec::with_capacity(batch.len());
    for job in batch {
        answers.push(sql::record_one(&mut *tx, &job.record).await?);
    }
    tx.commit().await?;
    Ok(answers)
}
