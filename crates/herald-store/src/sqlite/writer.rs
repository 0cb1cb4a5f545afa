//! Group commit for ingest: one task writes every waiting message in one transaction and one fsync.
//!
//! Handlers send their message here and wait on a oneshot. The writer takes whatever is queued (up to
//! [`MAX_BATCH`]), writes it all in one transaction, commits once, publishes the new deliveries to the
//! commit feed *in commit order*, and only then answers the handlers. Idle, a lone request commits at
//! once; under load the batches grow by themselves, so throughput scales with concurrency while every
//! acknowledged message is on disk.
//!
//! The writer also decides the fan-out. It reads the app's endpoints inside the transaction, on the one
//! write connection that every endpoint change also goes through, so a message can never be fanned out
//! to a stale list of endpoints (a deleted one, or missing a new one). Each message sits in its own
//! savepoint, so one failing message fails alone and never half-stores.

use std::collections::HashMap;
use std::sync::Arc;

use herald_core::id::{IdKind, new_id};
use herald_core::model::{Endpoint, Message};
use sqlx::{Acquire, Row, SqliteConnection, SqlitePool};
use tokio::sync::{mpsc, oneshot};

use super::rows;
use crate::{CreatedDelivery, Ingested, NewMessage, PendingDelivery, StoreError, StoreResult};

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
                })
                .collect()
        }
        Ingested::Duplicate(_) => Vec::new(),
    }
}

/// Each app's endpoints, read once per batch inside the batch's transaction.
type EndpointsByApp = HashMap<String, Vec<Endpoint>>;

/// Write a batch; the outer error means the transaction itself failed (nothing was committed).
async fn write_batch(pool: &SqlitePool, batch: &[IngestJob]) -> Result<Vec<StoreResult<Ingested>>, StoreError> {
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin().await?;
    let mut endpoints = EndpointsByApp::new();
    let mut outcomes = Vec::with_capacity(batch.len());
    for job in batch {
        let mut savepoint = tx.begin().await?;
        match write_one(&mut savepoint, &job.new, &mut endpoints).await {
            Ok(outcome) => {
                savepoint.commit().await?;
                outcomes.push(Ok(outcome));
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

async fn find_duplicate(conn: &mut SqliteConnection, new: &NewMessage) -> StoreResult<Option<Message>> {
    if new.event_id.is_none() && new.idempotency_key.is_none() {
        return Ok(None);
    }
    let sql = format!(
        "SELECT {} FROM message m WHERE m.app_id = ? AND (m.event_id = ? OR m.idempotency_key = ?) LIMIT 1",
        rows::MESSAGE_COLUMNS
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(&new.app_id)
        .bind(&new.event_id)
        .bind(&new.idempotency_key)
        .fetch_optional(&mut *conn)
        .await?;
    row.as_ref().map(rows::message).transpose()
}

async fn subscribers<'a>(
    conn: &mut SqliteConnection,
    cache: &'a mut EndpointsByApp,
    app_id: &str,
) -> StoreResult<&'a [Endpoint]> {
    if !cache.contains_key(app_id) {
        let found = sqlx::query("SELECT * FROM endpoint WHERE app_id = ? AND disabled = 0")
            .bind(app_id)
            .fetch_all(&mut *conn)
            .await?;
        let list = found.iter().map(rows::endpoint).collect::<StoreResult<Vec<_>>>()?;
        cache.insert(app_id.to_owned(), list);
    }
    Ok(cache.get(app_id).map_or(&[], Vec::as_slice))
}

async fn write_one(conn: &mut SqliteConnection, new: &NewMessage, cache: &mut EndpointsByApp) -> StoreResult<Ingested> {
    if let Some(original) = find_duplicate(conn, new).await? {
        return Ok(Ingested::Duplicate(original));
    }
    let message = Message {
        id: new_id(IdKind::Message),
        app_id: new.app_id.clone(),
        event_id: new.event_id.clone(),
        event_type: new.event_type.clone(),
        channels: new.channels.clone(),
        payload: new.payload.clone(),
        created_at: herald_core::clock::now_ms(),
    };
    sqlx::query(
        "INSERT INTO message (id, app_id, event_id, idempotency_key, event_type, channels, payload, created_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&message.id)
    .bind(&message.app_id)
    .bind(&message.event_id)
    .bind(&new.idempotency_key)
    .bind(&message.event_type)
    .bind(rows::encode_list(&message.channels))
    .bind(&*message.payload)
    .bind(message.created_at)
    .execute(&mut *conn)
    .await
    .map_err(super::map_constraint)?;
    let targets: Vec<String> = subscribers(conn, cache, &message.app_id)
        .await?
        .iter()
        .filter(|ep| ep.subscribes_to(&message.event_type, message.channels.as_deref()))
        .map(|ep| ep.id.clone())
        .collect();
    let mut deliveries = Vec::with_capacity(targets.len());
    for endpoint_id in targets {
        let row = sqlx::query(
            "INSERT INTO delivery (message_id, endpoint_id, status, attempts, next_attempt_at, updated_at) \
             VALUES (?, ?, 0, 0, ?, ?) RETURNING seq",
        )
        .bind(&message.id)
        .bind(&endpoint_id)
        .bind(message.created_at)
        .bind(message.created_at)
        .fetch_one(&mut *conn)
        .await?;
        deliveries.push(CreatedDelivery {
            seq: row.try_get(0)?,
            endpoint_id,
        });
    }
    Ok(Ingested::Created { message, deliveries })
}
