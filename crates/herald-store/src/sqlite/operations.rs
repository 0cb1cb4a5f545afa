//! Operators' repairs and listings on SQLite: re-queueing (resend, recover), replay of missing
//! deliveries, cancellation, payload expunging, delivery listings and statistics, background tasks.
//!
//! A re-queued delivery gets a *new* sequence number (its row is re-inserted, then the old one deleted, in
//! one transaction): the scheduler reads each endpoint's backlog in `seq` order from a cursor, so a
//! delivery that becomes pending again must sort after everything already read.

use herald_core::model::{AttemptTrigger, BackgroundTask, DeliveryStatus, Endpoint};
use sqlx::{Acquire, AssertSqlSafe, Row, SqliteConnection, SqlitePool};

use super::bulk::{ROWS_PER_INSERT, marks};
use super::{decode_all, keyset, limit_plus_one};
use crate::rows;
use crate::{DeliveryRecord, DeliveryStats, Page, PageRequest, Requeue, StoreError, StoreResult};

const FAILED: i64 = DeliveryStatus::Failed.code();
const DEAD: i64 = DeliveryStatus::Dead.code();

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

/// The failed or dead deliveries of an endpoint over messages created in a window (SQL tail and binds).
const FAILED_IN_WINDOW: &str = "FROM delivery d JOIN message m ON m.id = d.message_id \
     WHERE d.endpoint_id = ? AND d.status IN (?, ?) AND m.created_at >= ? AND m.created_at < ? AND m.expunged = 0";

pub(super) async fn count_failed(read: &SqlitePool, endpoint_id: &str, since: i64, until: i64) -> StoreResult<u64> {
    let sql = format!("SELECT COUNT(*) {FAILED_IN_WINDOW}");
    let count: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(endpoint_id)
        .bind(FAILED)
        .bind(DEAD)
        .bind(since)
        .bind(until)
        .fetch_one(read)
        .await?;
    Ok(u64::try_from(count).unwrap_or(0))
}

pub(super) async fn requeue_failed(
    write: &SqlitePool,
    endpoint_id: &str,
    since: i64,
    until: i64,
    limit: usize,
    now: i64,
) -> StoreResult<u64> {
    let mut conn = write.acquire().await?;
    let mut tx = conn.begin().await?;
    let sql = format!("SELECT d.seq {FAILED_IN_WINDOW} ORDER BY d.seq LIMIT ?");
    let seqs: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(endpoint_id)
        .bind(FAILED)
        .bind(DEAD)
        .bind(since)
        .bind(until)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&mut *tx)
        .await?;
    let fresh = reinsert(&mut tx, &seqs, AttemptTrigger::Recover, now).await?;
    tx.commit().await?;
    Ok(fresh.len() as u64)
}

pub(super) async fn count_messages(read: &SqlitePool, app_id: &str, since: i64, until: i64) -> StoreResult<u64> {
    let count: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM message WHERE app_id = ? AND created_at >= ? AND created_at < ?")
            .bind(app_id)
            .bind(since)
            .bind(until)
            .fetch_one(read)
            .await?;
    Ok(u64::try_from(count).unwrap_or(0))
}

pub(super) async fn add_missing_deliveries(
    write: &SqlitePool,
    endpoint: &Endpoint,
    since: i64,
    until: i64,
    after: Option<&str>,
    limit: usize,
    now: i64,
) -> StoreResult<(Option<String>, u64)> {
    let mut conn = write.acquire().await?;
    let mut tx = conn.begin().await?;
    let found = sqlx::query(
        "SELECT m.id, m.event_type, m.channels, m.expunged, \
         EXISTS (SELECT 1 FROM delivery d WHERE d.message_id = m.id AND d.endpoint_id = ?) AS has_delivery \
         FROM message m WHERE m.app_id = ? AND m.created_at >= ? AND m.created_at < ? AND m.id > ? \
         ORDER BY m.id LIMIT ?",
    )
    .bind(&endpoint.id)
    .bind(&endpoint.app_id)
    .bind(since)
    .bind(until)
    .bind(after.unwrap_or(""))
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
                .bind(message_id)
                .bind(&endpoint.id)
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
        found.last().map(|row| row.try_get::<String, _>("id")).transpose()?
    };
    Ok((last, missing.len() as u64))
}

pub(super) async fn cancel_pending(
    write: &SqlitePool,
    app_id: &str,
    message_id: Option<&str>,
    endpoint_id: Option<&str>,
    now: i64,
) -> StoreResult<Vec<(String, i64)>> {
    let mut sql = String::from(
        "UPDATE delivery SET status = ?, updated_at = ? WHERE status = 0 \
         AND endpoint_id IN (SELECT id FROM endpoint WHERE app_id = ?)",
    );
    if message_id.is_some() {
        sql.push_str(" AND message_id = ?");
    }
    if endpoint_id.is_some() {
        sql.push_str(" AND endpoint_id = ?");
    }
    sql.push_str(" RETURNING endpoint_id, seq");
    let mut query = sqlx::query(AssertSqlSafe(sql))
        .bind(DeliveryStatus::Cancelled.code())
        .bind(now)
        .bind(app_id);
    if let Some(id) = message_id {
        query = query.bind(id);
    }
    if let Some(id) = endpoint_id {
        query = query.bind(id);
    }
    query
        .fetch_all(write)
        .await?
        .iter()
        .map(|row| Ok((row.try_get("endpoint_id")?, row.try_get("seq")?)))
        .collect()
}

pub(super) async fn expunge_payload(write: &SqlitePool, app_id: &str, message_id: &str) -> StoreResult<()> {
    let result = sqlx::query("UPDATE message SET payload = ?, expunged = 1 WHERE app_id = ? AND id = ?")
        .bind(&b"{}"[..])
        .bind(app_id)
        .bind(message_id)
        .execute(write)
        .await?;
    if result.rows_affected() == 0 {
        return Err(StoreError::NotFound);
    }
    Ok(())
}

pub(super) async fn list_deliveries(
    read: &SqlitePool,
    app_id: &str,
    endpoint_id: Option<&str>,
    status: Option<DeliveryStatus>,
    page: &PageRequest,
) -> StoreResult<Page<DeliveryRecord>> {
    let after = page
        .after
        .as_deref()
        .map(|text| text.parse::<i64>().map_err(|_| StoreError::BadIterator))
        .transpose()?;
    let (condition, order) = keyset("d.seq", page, true);
    let mut sql = format!(
        "SELECT d.seq, d.endpoint_id, d.status, d.attempts, d.next_attempt_at, d.updated_at, {} \
         FROM delivery d JOIN message m ON m.id = d.message_id WHERE m.app_id = ? AND {condition}",
        rows::MESSAGE_COLUMNS
    );
    if endpoint_id.is_some() {
        sql.push_str(" AND d.endpoint_id = ?");
    }
    if status.is_some() {
        sql.push_str(" AND d.status = ?");
    }
    sql.push_str(&format!(" {order} LIMIT ?"));
    let mut query = sqlx::query(AssertSqlSafe(sql)).bind(app_id);
    if let Some(after) = after {
        query = query.bind(after);
    }
    if let Some(id) = endpoint_id {
        query = query.bind(id);
    }
    if let Some(status) = status {
        query = query.bind(status.code());
    }
    let found = query.bind(limit_plus_one(page)).fetch_all(read).await?;
    let mut records = found
        .iter()
        .map(|row| {
            let code: i64 = row.try_get("status")?;
            Ok(DeliveryRecord {
                seq: row.try_get("seq")?,
                endpoint_id: row.try_get("endpoint_id")?,
                message: rows::message(row)?,
                status: DeliveryStatus::from_code(code)
                    .ok_or_else(|| StoreError::Corrupt(format!("delivery status {code}")))?,
                attempts: u32::try_from(row.try_get::<i64, _>("attempts")?).unwrap_or(0),
                next_attempt_at: row.try_get("next_attempt_at")?,
                updated_at: row.try_get("updated_at")?,
                last_attempt: None,
            })
        })
        .collect::<StoreResult<Vec<_>>>()?;
    attach_last_attempts(read, &mut records).await?;
    Ok(Page::assemble(records, page, |r| r.seq.to_string()))
}

/// Fill in each record's latest attempt with one query.
async fn attach_last_attempts(read: &SqlitePool, records: &mut [DeliveryRecord]) -> StoreResult<()> {
    if records.is_empty() {
        return Ok(());
    }
    let sql = format!(
        "SELECT * FROM attempt WHERE id IN (SELECT MAX(id) FROM attempt WHERE message_id IN ({}) \
         GROUP BY message_id, endpoint_id)",
        marks(records.len())
    );
    let mut query = sqlx::query(AssertSqlSafe(sql));
    for record in records.iter() {
        query = query.bind(&record.message.id);
    }
    let latest = decode_all(&query.fetch_all(read).await?, rows::attempt)?;
    rows::attach_last_attempts(records, latest);
    Ok(())
}

pub(super) async fn endpoint_stats(
    read: &SqlitePool,
    endpoint_id: &str,
    since: i64,
    until: i64,
) -> StoreResult<DeliveryStats> {
    let found = sqlx::query(
        "SELECT d.status, COUNT(*) AS n FROM delivery d JOIN message m ON m.id = d.message_id \
         WHERE d.endpoint_id = ? AND m.created_at >= ? AND m.created_at < ? GROUP BY d.status",
    )
    .bind(endpoint_id)
    .bind(since)
    .bind(until)
    .fetch_all(read)
    .await?;
    rows::delivery_stats(&found)
}

pub(super) async fn create_task(write: &SqlitePool, t: &BackgroundTask) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO background_task (id, kind, app_id, state, processed, total, data, created_at, updated_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&t.id)
    .bind(&t.kind)
    .bind(&t.app_id)
    .bind(&t.state)
    .bind(rows::count_param(t.processed))
    .bind(rows::count_param(t.total))
    .bind(&t.data)
    .bind(t.created_at)
    .bind(t.updated_at)
    .execute(write)
    .await?;
    Ok(())
}

pub(super) async fn update_task(write: &SqlitePool, t: &BackgroundTask) -> StoreResult<()> {
    let result = sqlx::query(
        "UPDATE background_task SET state = ?, processed = ?, total = ?, data = ?, updated_at = ? WHERE id = ?",
    )
    .bind(&t.state)
    .bind(rows::count_param(t.processed))
    .bind(rows::count_param(t.total))
    .bind(&t.data)
    .bind(t.updated_at)
    .bind(&t.id)
    .execute(write)
    .await?;
    if result.rows_affected() == 0 {
        return Err(StoreError::NotFound);
    }
    Ok(())
}

pub(super) async fn get_task(read: &SqlitePool, id: &str, app_id: Option<&str>) -> StoreResult<BackgroundTask> {
    let row = sqlx::query("SELECT * FROM background_task WHERE id = ? AND (? IS NULL OR app_id = ?)")
        .bind(id)
        .bind(app_id)
        .bind(app_id)
        .fetch_optional(read)
        .await?
        .ok_or(StoreError::NotFound)?;
    rows::background_task(&row)
}

pub(super) async fn fail_interrupted_tasks(write: &SqlitePool, now: i64) -> StoreResult<u64> {
    let result = sqlx::query("UPDATE background_task SET state = 'failed', updated_at = ? WHERE state = 'running'")
        .bind(now)
        .execute(write)
        .await?;
    Ok(result.rows_affected())
}
