//! Group commit: one task inserts every waiting event in one transaction and one fsync; another records
//! every waiting forwarding outcome the same way.
//!
//! Handlers send their event here and wait on a oneshot. The writer takes whatever is queued (up to
//! [`MAX_BATCH`]), inserts it all in one transaction, commits once and only then answers each handler.
//! Idle, a lone event commits at once; under load the batches grow by themselves, so throughput scales
//! with concurrency while every acknowledged event is on disk. Outcomes are batched for the same reason:
//! with `synchronous=FULL` a commit costs an fsync, and one per forwarded event would cap forwarding at
//! the disk's fsync rate.

use sqlx::{Acquire, Row, SqlitePool};
use tokio::sync::{mpsc, oneshot};

use super::{Inserted, NewEvent, Outcome, Status, StoreError, StoreResult};
use herald_core::id::{IdKind, new_id};

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
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin().await?;
    let mut answers = Vec::with_capacity(batch.len());
    for job in batch {
        let event = &job.event;
        let id = new_id(IdKind::InboxEvent);
        let headers =
            serde_json::to_string(&event.headers).map_err(|e| StoreError::Corrupt(format!("headers: {e}")))?;
        let inserted = sqlx::query(
            "INSERT INTO inbox_event (id, source, event_id, headers, body, received_at, status, attempts, \
             next_attempt_at, last_error, resource_key, version, replays, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, 0, ?) \
             ON CONFLICT (source, event_id) DO NOTHING",
        )
        .bind(&id)
        .bind(&event.source)
        .bind(&event.event_id)
        .bind(headers)
        .bind(event.body.as_ref())
        .bind(job.received_at)
        .bind(event.status.as_str())
        .bind(job.received_at)
        .bind(&event.last_error)
        .bind(&event.resource_key)
        .bind(&event.version)
        .bind(job.received_at)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 1 {
            answers.push(Inserted { id, duplicate: false });
        } else {
            // Already stored (earlier, or earlier in this very batch): answer with the original's id.
            let row = sqlx::query("SELECT id FROM inbox_event WHERE source = ? AND event_id = ?")
                .bind(&event.source)
                .bind(&event.event_id)
                .fetch_one(&mut *tx)
                .await?;
            answers.push(Inserted {
                id: row.try_get("id")?,
                duplicate: true,
            });
        }
    }
    tx.commit().await?;
    Ok(answers)
}

pub(super) struct RecordJob {
    pub(super) id: String,
    pub(super) replays: i64,
    pub(super) attempts: u32,
    pub(super) outcome: Outcome,
    pub(super) now: i64,
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
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin().await?;
    let mut answers = Vec::with_capacity(batch.len());
    for job in batch {
        answers.push(record_one(&mut tx, job).await?);
    }
    tx.commit().await?;
    Ok(answers)
}

/// Apply one outcome unless the event was replayed meanwhile or is no longer pending.
async fn record_one(tx: &mut sqlx::SqliteConnection, job: &RecordJob) -> StoreResult<bool> {
    let (status, next_attempt_at, error) = match &job.outcome {
        Outcome::Forwarded { .. } => (Status::Forwarded, None, None),
        Outcome::Retry { next_attempt_at, error } => (Status::Pending, Some(*next_attempt_at), Some(error)),
        Outcome::Dead { error } => (Status::Dead, None, Some(error)),
        Outcome::Stale { reason } => (Status::Stale, None, Some(reason)),
    };
    let updated = sqlx::query(
        "UPDATE inbox_event SET status = ?, attempts = ?, next_attempt_at = COALESCE(?, next_attempt_at), \
         last_error = ?, updated_at = ? WHERE id = ? AND replays = ? AND status = 'pending'",
    )
    .bind(status.as_str())
    .bind(i64::from(job.attempts))
    .bind(next_attempt_at)
    .bind(error)
    .bind(job.now)
    .bind(&job.id)
    .bind(job.replays)
    .execute(&mut *tx)
    .await?;
    if updated.rows_affected() == 0 {
        return Ok(false);
    }
    if let Outcome::Forwarded {
        guard: Some((resource_key, version)),
    } = &job.outcome
    {
        let source: String = sqlx::query_scalar("SELECT source FROM inbox_event WHERE id = ?")
            .bind(&job.id)
            .fetch_one(&mut *tx)
            .await?;
        let newest: Option<String> =
            sqlx::query_scalar("SELECT version FROM inbox_version WHERE source = ? AND resource_key = ?")
                .bind(&source)
                .bind(resource_key)
                .fetch_optional(&mut *tx)
                .await?;
        // A replayed older version is forwarded but must not lower the mark.
        if newest.is_none_or(|newest| crate::version::is_newer(version, &newest)) {
            sqlx::query(
                "INSERT INTO inbox_version (source, resource_key, version, inbox_id, updated_at) \
                 VALUES (?, ?, ?, ?, ?) ON CONFLICT (source, resource_key) DO UPDATE SET \
                 version = excluded.version, inbox_id = excluded.inbox_id, updated_at = excluded.updated_at",
            )
            .bind(&source)
            .bind(resource_key)
            .bind(version)
            .bind(&job.id)
            .bind(job.now)
            .execute(&mut *tx)
            .await?;
        }
    }
    Ok(true)
}
