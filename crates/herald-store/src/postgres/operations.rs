//! Operators' repairs and listings on PostgreSQL: the same contract as `sqlite::operations`.
//!
//! A re-queued delivery gets a new `seq` (re-inserted, old row deleted, one transaction). Like ingest, the
//! transaction holds the ingest advisory lock so `seq`s keep following commit order across nodes (the
//! owners' cursors rely on it), and it notifies the work channel so the endpoint's owner — on whichever
//! node — reads it. These writes come from the API on any node, like ingest, so they are not fenced.

use herald_core::model::{AttemptTrigger, BackgroundTask, DeliveryStatus, Endpoint};
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row};

use super::bulk::{INGEST_LOCK, WORK_CHANNEL};
use super::{decode_all, status_of};
use crate::sql::{keyset, limit, limit_plus_one};
use crate::{DeliveryRecord, DeliveryStats, Page, PageRequest, Requeue, StoreError, StoreResult, rows};

const FAILED: i64 = DeliveryStatus::Failed.code();
const DEAD: i64 = DeliveryStatus::Dead.code();
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

/// The failed or dead deliveries of an endpoint over messages created in a window (`$1`…`$5`).
const FAILED_IN_WINDOW: &str = "FROM delivery d JOIN message m ON m.id = d.message_id \
     WHERE d.endpoint_id = $1 AND d.status IN ($2, $3) AND m.created_at >= $4 AND m.created_at < $5 \
     AND NOT m.expunged";

pub(super) async fn count_failed(pool: &PgPool, endpoint_id: &str, since: i64, until: i64) -> StoreResult<u64> {
    let sql = format!("SELECT COUNT(*) {FAILED_IN_WINDOW}");
    let n: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(endpoint_id)
        .bind(FAILED)
        .bind(DEAD)
        .bind(since)
        .bind(until)
        .fetch_one(pool)
        .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

pub(super) async fn requeue_failed(
    pool: &PgPool,
    endpoint_id: &str,
    since: i64,
    until: i64,
    limit_n: usize,
    now: i64,
) -> StoreResult<u64> {
    let mut tx = pool.begin().await?;
    order_lock(&mut tx).await?;
    let sql = format!("SELECT d.seq {FAILED_IN_WINDOW} ORDER BY d.seq LIMIT $6 FOR UPDATE OF d");
    let seqs: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(endpoint_id)
        .bind(FAILED)
        .bind(DEAD)
        .bind(since)
        .bind(until)
        .bind(limit(limit_n))
        .fetch_all(&mut *tx)
        .await?;
    let fresh = reinsert(&mut tx, &seqs, AttemptTrigger::Recover, now).await?;
    tx.commit().await?;
    Ok(fresh.len() as u64)
}

pub(super) async fn count_messages(pool: &PgPool, app_id: &str, since: i64, until: i64) -> StoreResult<u64> {
    let n: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM message WHERE app_id = $1 AND created_at >= $2 AND created_at < $3")
            .bind(app_id)
            .bind(since)
            .bind(until)
            .fetch_one(pool)
            .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

pub(super) async fn add_missing_deliveries(
    pool: &PgPool,
    endpoint: &Endpoint,
    since: i64,
    until: i64,
    after: Option<&str>,
    limit_n: usize,
    now: i64,
) -> StoreResult<(Option<String>, u64)> {
    let mut tx = pool.begin().await?;
    order_lock(&mut tx).await?;
    let found = sqlx::query(
        "SELECT m.id, m.event_type, m.channels, m.expunged, \
         EXISTS (SELECT 1 FROM delivery d WHERE d.message_id = m.id AND d.endpoint_id = $1) AS has_delivery \
         FROM message m WHERE m.app_id = $2 AND m.created_at >= $3 AND m.created_at < $4 AND m.id > $5 \
         ORDER BY m.id LIMIT $6",
    )
    .bind(&endpoint.id)
    .bind(&endpoint.app_id)
    .bind(since)
    .bind(until)
    .bind(after.unwrap_or(""))
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
        .bind(&missing)
        .bind(&endpoint.id)
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
        found.last().map(|row| row.try_get::<String, _>("id")).transpose()?
    };
    Ok((last, missing.len() as u64))
}

pub(super) async fn cancel_pending(
    pool: &PgPool,
    app_id: &str,
    message_id: Option<&str>,
    endpoint_id: Option<&str>,
    now: i64,
) -> StoreResult<Vec<(String, i64)>> {
    let found = sqlx::query(
        "UPDATE delivery SET status = $1, updated_at = $2 WHERE status = 0 \
         AND endpoint_id IN (SELECT id FROM endpoint WHERE app_id = $3) \
         AND ($4::text IS NULL OR message_id = $4) AND ($5::text IS NULL OR endpoint_id = $5) \
         RETURNING endpoint_id, seq",
    )
    .bind(DeliveryStatus::Cancelled.code())
    .bind(now)
    .bind(app_id)
    .bind(message_id)
    .bind(endpoint_id)
    .fetch_all(pool)
    .await?;
    found
        .iter()
        .map(|row| Ok((row.try_get("endpoint_id")?, row.try_get("seq")?)))
        .collect()
}

pub(super) async fn expunge_payload(pool: &PgPool, app_id: &str, message_id: &str) -> StoreResult<()> {
    let result = sqlx::query("UPDATE message SET payload = $1, expunged = true WHERE app_id = $2 AND id = $3")
        .bind(&b"{}"[..])
        .bind(app_id)
        .bind(message_id)
        .execute(pool)
        .await?;
    if result.rows_affected() == 0 {
        return Err(StoreError::NotFound);
    }
    Ok(())
}

pub(super) async fn list_deliveries(
    pool: &PgPool,
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
    let (condition, order) = keyset("d.seq", page, true, "$4");
    let sql = format!(
        "SELECT d.seq, d.endpoint_id, d.status, d.attempts, d.next_attempt_at, d.updated_at, {} \
         FROM delivery d JOIN message m ON m.id = d.message_id \
         WHERE m.app_id = $1 AND ($2::text IS NULL OR d.endpoint_id = $2) AND ($3::bigint IS NULL OR d.status = $3) \
         AND {condition} {order} LIMIT $5",
        rows::MESSAGE_COLUMNS
    );
    let found = sqlx::query(AssertSqlSafe(sql))
        .bind(app_id)
        .bind(endpoint_id)
        .bind(status.map(DeliveryStatus::code))
        .bind(after.unwrap_or(0))
        .bind(limit_plus_one(page))
        .fetch_all(pool)
        .await?;
    let mut records = found
        .iter()
        .map(|row| {
            Ok(DeliveryRecord {
                seq: row.try_get("seq")?,
                endpoint_id: row.try_get("endpoint_id")?,
                message: rows::message(row)?,
                status: status_of(row.try_get("status")?)?,
                attempts: u32::try_from(row.try_get::<i64, _>("attempts")?).unwrap_or(0),
                next_attempt_at: row.try_get("next_attempt_at")?,
                updated_at: row.try_get("updated_at")?,
                last_attempt: None,
            })
        })
        .collect::<StoreResult<Vec<_>>>()?;
    attach_last_attempts(pool, &mut records).await?;
    Ok(Page::assemble(records, page, |r| r.seq.to_string()))
}

async fn attach_last_attempts(pool: &PgPool, records: &mut [DeliveryRecord]) -> StoreResult<()> {
    if records.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = records.iter().map(|r| r.message.id.as_str()).collect();
    let found = sqlx::query(
        "SELECT DISTINCT ON (message_id, endpoint_id) * FROM attempt WHERE message_id = ANY($1) \
         ORDER BY message_id, endpoint_id, id DESC",
    )
    .bind(&ids)
    .fetch_all(pool)
    .await?;
    let latest = decode_all(&found, rows::attempt)?;
    rows::attach_last_attempts(records, latest);
    Ok(())
}

pub(super) async fn endpoint_stats(
    pool: &PgPool,
    endpoint_id: &str,
    since: i64,
    until: i64,
) -> StoreResult<DeliveryStats> {
    let found = sqlx::query(
        "SELECT d.status, COUNT(*) AS n FROM delivery d JOIN message m ON m.id = d.message_id \
         WHERE d.endpoint_id = $1 AND m.created_at >= $2 AND m.created_at < $3 GROUP BY d.status",
    )
    .bind(endpoint_id)
    .bind(since)
    .bind(until)
    .fetch_all(pool)
    .await?;
    rows::delivery_stats(&found)
}

pub(super) async fn create_task(pool: &PgPool, t: &BackgroundTask) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO background_task (id, kind, app_id, state, processed, total, data, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
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
    .execute(pool)
    .await?;
    Ok(())
}

pub(super) async fn update_task(pool: &PgPool, t: &BackgroundTask) -> StoreResult<()> {
    let result = sqlx::query(
        "UPDATE background_task SET state = $1, processed = $2, total = $3, data = $4, updated_at = $5 WHERE id = $6",
    )
    .bind(&t.state)
    .bind(rows::count_param(t.processed))
    .bind(rows::count_param(t.total))
    .bind(&t.data)
    .bind(t.updated_at)
    .bind(&t.id)
    .execute(pool)
    .await?;
    if result.rows_affected() == 0 {
        return Err(StoreError::NotFound);
    }
    Ok(())
}

pub(super) async fn get_task(pool: &PgPool, id: &str, app_id: Option<&str>) -> StoreResult<BackgroundTask> {
    let row = sqlx::query("SELECT * FROM background_task WHERE id = $1 AND ($2::text IS NULL OR app_id = $2)")
        .bind(id)
        .bind(app_id)
        .fetch_optional(pool)
        .await?
        .ok_or(StoreError::NotFound)?;
    rows::background_task(&row)
}

/// On PostgreSQL several nodes share the table: only a task that has made no progress for a while can be
/// an orphan of a stopped node (a running task records progress after every chunk).
pub(super) async fn fail_interrupted_tasks(pool: &PgPool, now: i64) -> StoreResult<u64> {
    const STALE_MS: i64 = 60_000;
    let result = sqlx::query(
        "UPDATE background_task SET state = 'failed', updated_at = $1 WHERE state = 'running' AND updated_at < $2",
    )
    .bind(now)
    .bind(now - STALE_MS)
    .execute(pool)
    .await?;
    Ok(result.rows_affected())
}

pub(super) async fn set_endpoint_state(
    pool: &PgPool,
    endpoint_id: &str,
    expected_reason: &str,
    disabled: bool,
    reason: Option<&str>,
    now: i64,
) -> StoreResult<bool> {
    let result = sqlx::query(
        "UPDATE endpoint SET disabled = $1, disabled_reason = $2, updated_at = $3 WHERE id = $4 AND disabled_reason = $5",
    )
    .bind(disabled)
    .bind(reason)
    .bind(now)
    .bind(endpoint_id)
    .bind(expected_reason)
    .execute(pool)
    .await?;
    Ok(result.rows_affected() == 1)
}
