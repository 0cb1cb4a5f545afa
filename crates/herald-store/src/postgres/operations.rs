//! Operators' repairs on PostgreSQL: the same contract as `sqlite::operations`.
//!
//! A re-queued delivery gets a new `seq` (re-inserted, old row deleted, one transaction). Like ingest, the
//! transaction holds the ingest advisory lock so `seq`s keep following commit order across nodes (the
//! owners' cursors rely on it), and it notifies the work channel so the endpoint's owner — on whichever
//! node — reads it. These writes come from the API on any node, like ingest, so they are not fenced.

use herald_core::id::MessageId;
use herald_core::model::{AttemptTrigger, DeliveryStatus, Endpoint};
use sqlx::{PgConnection, PgPool, Row};

use super::Postgres;
use super::channels::{INGEST_LOCK, WORK_CHANNEL};
use crate::dialect::{Dialect, On};
use crate::portable::selected;
use crate::rows::Columns;
use crate::sql::limit;
use crate::{Requeue, RequeueChunk, RequeueSelection, StoreError, StoreResult, rows};

/// The work-channel payload of a repair: no node's id, so every node's watcher looks.
const REPAIR_PAYLOAD: &str = "repair";

/// Take the ingest lock (until commit) so the new `seq`s are in commit order.
async fn order_lock(conn: &mut PgConnection) -> StoreResult<()> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(INGEST_LOCK)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Wake the owners' watchers at commit.
async fn notify_work(conn: &mut PgConnection) -> StoreResult<()> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(WORK_CHANNEL)
        .bind(REPAIR_PAYLOAD)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Re-insert the deliveries `seqs` as pending with a fresh schedule and delete the old rows; returns the
/// new sequence numbers. The caller holds the ingest lock.
async fn reinsert(conn: &mut PgConnection, seqs: &[i64], trigger: AttemptTrigger, now: i64) -> StoreResult<Vec<i64>> {
    if seqs.is_empty() {
        return Ok(Vec::new());
    }
    let fresh: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO delivery (message_id, endpoint_id, partition, status, attempts, next_attempt_at, updated_at, \
         window_start, next_trigger) \
         SELECT message_id, endpoint_id, partition, 0, 0, $1, $1, $1, $2 FROM delivery \
         WHERE seq = ANY($3) ORDER BY seq RETURNING seq",
    )
    .bind(now)
    .bind(trigger.code())
    .bind(seqs)
    .fetch_all(&mut *conn)
    .await?;
    sqlx::query("DELETE FROM delivery WHERE seq = ANY($1)")
        .bind(seqs)
        .execute(&mut *conn)
        .await?;
    notify_work(conn).await?;
    Ok(fresh)
}

pub(super) async fn requeue_delivery(
    pool: &PgPool,
    message_id: &str,
    endpoint_id: &str,
    trigger: AttemptTrigger,
    now: i64,
) -> StoreResult<Requeue> {
    let mut tx = pool.begin().await?;
    order_lock(&mut tx).await?;
    let row = sqlx::query(
        "SELECT d.seq, d.status, m.expunged FROM delivery d JOIN message m ON m.id = d.message_id \
         WHERE d.message_id = $1 AND d.endpoint_id = $2 FOR UPDATE OF d",
    )
    .bind(message_id)
    .bind(endpoint_id)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or(StoreError::NotFound)?;
    let seq: i64 = row.try_get("seq")?;
    let status: i64 = row.try_get("status")?;
    if status == DeliveryStatus::Pending.code() {
        return Ok(Requeue::AlreadyPending);
    }
    if row.try_get::<bool, _>("expunged")? {
        return Ok(Requeue::Expunged);
    }
    let fresh = reinsert(&mut tx, &[seq], trigger, now).await?;
    tx.commit().await?;
    fresh.first().copied().map(Requeue::Queued).ok_or(StoreError::NotFound)
}

pub(super) async fn requeue_selected(
    pool: &PgPool,
    selection: &RequeueSelection,
    limit_n: usize,
    now: i64,
) -> StoreResult<RequeueChunk> {
    let mut sql = selected::<Postgres>("d.seq", selection);
    sql.push(" ORDER BY d.seq LIMIT ")
        .push_bind(limit(limit_n))
        .push(" FOR UPDATE OF d");
    let mut tx = pool.begin().await?;
    order_lock(&mut tx).await?;
    let found = Postgres::fetch_all(On::Tx(&mut tx), &sql).await?;
    let seqs = found.iter().map(|row| row.int("seq")).collect::<Result<Vec<_>, _>>()?;
    let fresh = reinsert(&mut tx, &seqs, selection.trigger, now).await?;
    tx.commit().await?;
    Ok(RequeueChunk {
        queued: fresh.len() as u64,
        last_seq: seqs.last().copied(),
    })
}

pub(super) async fn add_missing_deliveries(
    pool: &PgPool,
    endpoint: &Endpoint,
    since: i64,
    until: i64,
    after: Option<&MessageId>,
    limit_n: usize,
    now: i64,
) -> StoreResult<(Option<MessageId>, u64)> {
    let mut tx = pool.begin().await?;
    order_lock(&mut tx).await?;
    let found = sqlx::query(
        "SELECT m.id, m.event_type, m.channels, m.expunged, \
         EXISTS (SELECT 1 FROM delivery d WHERE d.message_id = m.id AND d.endpoint_id = $1) AS has_delivery \
         FROM message m WHERE m.app_id = $2 AND m.created_at >= $3 AND m.created_at < $4 AND m.id > $5 \
         ORDER BY m.id LIMIT $6",
    )
    .bind(endpoint.id.as_str())
    .bind(endpoint.app_id.as_str())
    .bind(since)
    .bind(until)
    .bind(after.map_or("", |id| id.as_str()))
    .bind(limit(limit_n))
    .fetch_all(&mut *tx)
    .await?;
    let missing = rows::missing_for(endpoint, &found)?;
    if !missing.is_empty() {
        sqlx::query(
            "INSERT INTO delivery (message_id, endpoint_id, partition, status, attempts, next_attempt_at, \
             updated_at, window_start, next_trigger) \
             SELECT v.message_id, $2, $3, 0, 0, $4, $4, $4, $5 FROM UNNEST($1::text[]) WITH ORDINALITY \
             AS v (message_id, n) ORDER BY n",
        )
        .bind(missing.iter().map(|id| id.as_str()).collect::<Vec<_>>())
        .bind(endpoint.id.as_str())
        .bind(crate::partition_of(&endpoint.id))
        .bind(now)
        .bind(AttemptTrigger::Recover.code())
        .execute(&mut *tx)
        .await?;
        notify_work(&mut tx).await?;
    }
    tx.commit().await?;
    let last = if found.len() < limit_n {
        None
    } else {
        found.last().map(|row| row.id("id")).transpose()?
    };
    Ok((last, missing.len() as u64))
}
