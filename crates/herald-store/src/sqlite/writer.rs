//! Group commit for ingest: one task writes every waiting message in one transaction and one fsync.
//!
//! Handlers send their message here and wait on a oneshot. The writer takes whatever is queued (up to
//! [`MAX_BATCH`]), writes it all in one transaction, commits once, publishes the new deliveries to the
//! commit feed *in commit order*, and only then answers the handlers. Idle, a lone request commits at
//! once; under load the batches grow by themselves, so throughput scales with concurrency while every
//! acknowledged message is on disk.
//!
//! The writer also decides the fan-out. It reads the apps' endpoints inside the transaction, on the one
//! write connection that every endpoint change also goes through, so a message can never be fanned out
//! to a stale list of endpoints (a deleted one, or missing a new one). How a batch is written is in
//! [`super::bulk`]; should a batch fail as a whole, it is replayed one message per savepoint, so one
//! failing message fails alone and never half-stores.

use std::sync::Arc;

use sqlx::{Acquire, SqlitePool};
use tokio::sync::{mpsc, oneshot};

use herald_core::model::AttemptTrigger;

use crate::{Ingested, NewMessage, PendingDelivery, StoreError, StoreResult};

/// The most messages committed in one transaction.
pub(crate) const MAX_BATCH: usize = 512;

pub(crate) struct IngestJob {
    pub(crate) new: NewMessage,
    pub(crate) reply: oneshot::Sender<StoreResult<Ingested>>,
}

pub(crate) async fn run(
    pool: SqlitePool,
    mut jobs: mpsc::Receiver<IngestJob>,
    feed: mpsc::UnboundedSender<Vec<PendingDelivery>>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while jobs.recv_many(&mut batch, MAX_BATCH).await > 0 {
        match write_batch(&pool, &batch).await {
            Ok(outcomes) => {
                let committed: Vec<PendingDelivery> = outcomes
                    .iter()
                    .filter_map(|o| o.as_ref().ok())
                    .flat_map(pending_of)
                    .collect();
                if !committed.is_empty() {
                    // The receiver is gone only when the node is shutting down; the rows are durable and
                    // are picked up from the store at the next start.
                    let _ = feed.send(committed);
                }
                for (job, outcome) in batch.drain(..).zip(outcomes) {
                    let _ = job.reply.send(outcome);
                }
            }
            Err(error) => {
                tracing::error!(%error, "ingest batch failed");
                let text = error.to_string();
                for job in batch.drain(..) {
                    let _ = job.reply.send(Err(StoreError::Batch(text.clone())));
                }
            }
        }
    }
}

fn pending_of(ingested: &Ingested) -> Vec<PendingDelivery> {
    match ingested {
        Ingested::Created { message, deliveries } => {
            let shared = Arc::new(message.clone());
            deliveries
                .iter()
                .map(|d| PendingDelivery {
                    seq: d.seq,
                    endpoint_id: d.endpoint_id.clone(),
                    message: shared.clone(),
                    attempts: 0,
                    next_attempt_at: message.created_at,
                    window_start: message.created_at,
                    trigger: AttemptTrigger::Scheduled,
                })
                .collect()
        }
        Ingested::Duplicate(_) => Vec::new(),
    }
}

/// Write a batch; the outer error means the transaction itself failed (nothing was committed).
///
/// The fast path writes the whole batch with a few multi-row statements; if anything in it fails, the
/// batch is rolled back and written again message by message, each in its own savepoint, so that one
/// bad message fails alone.
async fn write_batch(pool: &SqlitePool, batch: &[IngestJob]) -> Result<Vec<StoreResult<Ingested>>, StoreError> {
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin().await?;
    match super::bulk::write(&mut tx, batch).await {
        Ok(outcomes) => {
            tx.commit().await?;
            return Ok(outcomes);
        }
        Err(error) => {
            tracing::warn!(%error, messages = batch.len(), "bulk ingest failed; writing the batch message by message");
            tx.rollback().await?;
        }
    }
    let mut tx = conn.begin().await?;
    let mut outcomes = Vec::with_capacity(batch.len());
    for job in batch {
        let mut savepoint = tx.begin().await?;
        match super::bulk::write(&mut savepoint, std::slice::from_ref(job)).await {
            Ok(mut single) => {
                savepoint.commit().await?;
                outcomes.push(single.pop().unwrap_or(Err(StoreError::Closed)));
            }
            Err(error) => {
                savepoint.rollback().await?;
                outcomes.push(Err(error));
            }
        }
    }
    tx.commit().await?;
    Ok(outcomes)
}
