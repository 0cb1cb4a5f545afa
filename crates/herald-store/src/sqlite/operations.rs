//! Operators' repairs on SQLite: re-queueing (resend, recover) and replay of missing deliveries, in
//! chunks of multi-row statements on the one writer.
//!
//! A re-queued delivery gets a *new* sequence number (its row is re-inserted, then the old one deleted, in
//! one transaction): the scheduler reads each endpoint's backlog in `seq` order from a cursor, so a
//! delivery that becomes pending again must sort after everything already read.

use herald_core::id::MessageId;
use herald_core::model::{AttemptTrigger, DeliveryStatus, Endpoint};
use sqlx::{Acquire, AssertSqlSafe, Row, SqliteConnection, SqlitePool};

use super::Sqlite;
use super::chunk::{ROWS_PER_INSERT, marks};
use crate::dialect::{Dialect, On};
use crate::portable::selected;
use crate::rows::Columns;
use crate::{Requeue, RequeueChunk, RequeueSelection, StoreError, StoreResult, rows};

/// Re-insert the deliveries `seqs` as pending with a fresh schedule, then delete the old rows; returns
/// the new sequence numbers.
async fn reinsert(
    conn: &mut SqliteConnection,
    seqs: &[i64],
    trigger: AttemptTrigger,
    now: i64,
) -> StoreResult<Vec<i64>> {
    let mut fresh = Vec::with_capacity(seqs.len());
    for chunk in seqs.chunks(ROWS_PER_INSERT) {
        let list = marks(chunk.len());
        let insert = format!(
            "INSERT INTO delivery (message_id, endpoint_id, status, attempts, next_attempt_at, updated_at, \
             window_start, next_trigger) \
             SELECT message_id, endpoint_id, 0, 0, ?, ?, ?, ? FROM delivery WHERE seq IN ({list}) ORDER BY seq \
             RETURNING seq"
        );
        let mut query = sqlx::query_scalar::<_, i64>(AssertSqlSafe(insert))
            .bind(now)
            .bind(now)
            .bind(now)
            .bind(trigger.code());
        for seq in chunk {
            query = query.bind(seq);
        }
        fresh.extend(query.fetch_all(&mut *conn).await?);
        let delete = format!("DELETE FROM delivery WHERE seq IN ({list})");
        let mut query = sqlx::query(AssertSqlSafe(delete));
        for seq in chunk {
            query = query.bind(seq);
        }
        query.execute(&mut *conn).await?;
    }
    Ok(fresh)
}

pub(super) async fn requeue_delivery(
    write: &SqlitePool,
    message_id: &str,
    endpoint_id: &str,
    trigger: AttemptTrigger,
    now: i64,
) -> StoreResult<Requeue> {
    let mut conn = write.acquire().await?;
    let mut tx = conn.begin().await?;
    let row = sqlx::query(
        "SELECT d.seq, d.status, m.expunged FROM delivery d JOIN message m ON m.id = d.message_id \
         WHERE d.message_id = ? AND d.endpoint_id = ?",
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
    write: &SqlitePool,
    selection: &RequeueSelection,
    limit: usize,
    now: i64,
) -> StoreResult<RequeueChunk> {
    let mut sql = selected::<Sqlite>("d.seq", selection);
    sql.push(" ORDER BY d.seq LIMIT ").push_bind(crate::sql::limit(limit));
    let mut tx = write.begin().await?;
    let found = Sqlite::fetch_all(On::Tx(&mut tx), &sql).await?;
    let seqs = found.iter().map(|row| row.int("seq")).collect::<Result<Vec<_>, _>>()?;
    let fresh = reinsert(&mut tx, &seqs, selection.trigger, now).await?;
    tx.commit().await?;
    Ok(RequeueChunk {
        queued: fresh.len() as u64,
        last_seq: seqs.last().copied(),
    })
}

pub(super) async fn add_missing_deliveries(
    write: &SqlitePool,
    endpoint: &Endpoint,
    since: i64,
    until: i64,
    after: Option<&MessageId>,
    limit: usize,
    now: i64,
) -> StoreResult<(Option<MessageId>, u64)> {
    let mut conn = write.acquire().await?;
    let mut tx = conn.begin().await?;
    let found = sqlx::query(
        "SELECT m.id, m.event_type, m.channels, m.expunged, \
         EXISTS (SELECT 1 FROM delivery d WHERE d.message_id = m.id AND d.endpoint_id = ?) AS has_delivery \
         FROM message m WHERE m.app_id = ? AND m.created_at >= ? AND m.created_at < ? AND m.id > ? \
         ORDER BY m.id LIMIT ?",
    )
    .bind(endpoint.id.as_str())
    .bind(endpoint.app_id.as_str())
    .bind(since)
    .bind(until)
    .bind(after.map_or("", |id| id.as_str()))
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    .fetch_all(&mut *tx)
    .await?;
    let missing = rows::missing_for(endpoint, &found)?;
    for chunk in missing.chunks(ROWS_PER_INSERT) {
        let values = vec!["(?, ?, 0, 0, ?, ?, ?, ?)"; chunk.len()].join(", ");
        let sql = format!(
            "INSERT INTO delivery (message_id, endpoint_id, status, attempts, next_attempt_at, updated_at, \
             window_start, next_trigger) VALUES {values}"
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for message_id in chunk {
            query = query
                .bind(message_id.as_str())
                .bind(endpoint.id.as_str())
                .bind(now)
                .bind(now)
                .bind(now)
                .bind(AttemptTrigger::Recover.code());
        }
        query.execute(&mut *tx).await?;
    }
    tx.commit().await?;
    let last = if found.len() < limit {
        None
    } else {
        found.last().map(|row| row.id("id")).transpose()?
    };
    Ok((last, missing.len() as u64))
}
