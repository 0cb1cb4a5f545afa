//! Attempt history on PostgreSQL: one partition per UTC day, created ahead, dropped whole when older
//! than the retention period (dropping a partition is instant and leaves no dead rows to vacuum).

use std::time::Duration;

use herald_core::clock::Millis;
use sqlx::{AssertSqlSafe, PgPool};
use time::{Date, Month, OffsetDateTime};

use crate::sql::limit;
use crate::{RetentionStep, StoreResult};
use herald_sql::custody::Bound;

const DAY_MS: i64 = 24 * 3600 * 1000;
/// Partitions are created this many days ahead, so a node that stops maintaining still writes into
/// day partitions for a while.
const DAYS_AHEAD: i64 = 3;
/// The maintenance runs this often.
const EVERY: Duration = Duration::from_secs(3600);
/// The advisory lock that keeps two nodes from running maintenance (DDL) at once.
const MAINTENANCE_LOCK: i64 = 0x6865_7261_6c65;

/// The partition of the day starting at `day` (days since the Unix epoch): `attempt_yYYYYMMDD`.
fn partition_name(day: i64) -> Option<String> {
    let date = OffsetDateTime::from_unix_timestamp(day.checked_mul(86_400)?)
        .ok()?
        .date();
    Some(format!(
        "attempt_y{:04}{:02}{:02}",
        date.year(),
        u8::from(date.month()),
        date.day()
    ))
}

/// The day (since the epoch) a partition name stands for.
fn day_of(name: &str) -> Option<i64> {
    let digits = name.strip_prefix("attempt_y")?;
    if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let year: i32 = digits[0..4].parse().ok()?;
    let month = Month::try_from(digits[4..6].parse::<u8>().ok()?).ok()?;
    let day: u8 = digits[6..8].parse().ok()?;
    let date = Date::from_calendar_date(year, month, day).ok()?;
    Some(date.midnight().assume_utc().unix_timestamp() / 86_400)
}

/// Create the day partitions from yesterday to a few days ahead and drop those older than `retention`.
pub(crate) async fn maintain(pool: &PgPool, retention: Duration) -> StoreResult<()> {
    // Partitions are bounded in the stored unit, whole days of Unix milliseconds.
    let today = herald_core::clock::now().as_unix_ms().div_euclid(DAY_MS);
    let mut tx = pool.begin().await?;
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
        .bind(MAINTENANCE_LOCK)
        .fetch_one(&mut *tx)
        .await?;
    if !locked {
        // Another node is doing it right now.
        return Ok(());
    }
    let existing: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'attempt' AND p.relnamespace = c.relnamespace",
    )
    .fetch_all(&mut *tx)
    .await?;
    for day in today - 1..=today + DAYS_AHEAD {
        let Some(name) = partition_name(day) else { continue };
        if existing.contains(&name) {
            continue;
        }
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {name} PARTITION OF attempt FOR VALUES FROM ({}) TO ({})",
            day * DAY_MS,
            (day + 1) * DAY_MS
        );
        sqlx::query(AssertSqlSafe(sql)).execute(&mut *tx).await?;
    }
    let keep_days = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX) / DAY_MS;
    let oldest_kept = today - keep_days;
    for name in &existing {
        if day_of(name).is_some_and(|day| day < oldest_kept) {
            tracing::info!(partition = %name, "dropping attempts past the retention period");
            sqlx::query(AssertSqlSafe(format!("DROP TABLE IF EXISTS {name}")))
                .execute(&mut *tx)
                .await?;
        }
    }
    // Rows that fell outside the day partitions (a clock far off) are few: delete them the slow way.
    sqlx::query("DELETE FROM attempt_default WHERE created_at < $1")
        .bind(oldest_kept * DAY_MS)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Run [`maintain`] periodically.
pub(crate) async fn run(pool: PgPool, retention: Duration, bound: Bound) {
    loop {
        tokio::time::sleep(EVERY).await;
        // Bounded like every store call (a silent server would otherwise stop the maintenance for as
        // long as TCP takes to give up).
        if let Err(error) = bound.run(maintain(&pool, retention)).await {
            tracing::warn!(%error, "attempt partition maintenance failed; retrying later");
        }
    }
}

/// One retention batch (see [`crate::Store::retention_step`]): beside the day partitions dropped whole,
/// rows of the partitions kept are deleted in small batches.
pub(super) async fn step(
    pool: &PgPool,
    attempts_before: Millis,
    now: Millis,
    limit_n: usize,
) -> StoreResult<RetentionStep> {
    let attempts = sqlx::query(
        "DELETE FROM attempt WHERE (id, created_at) IN \
         (SELECT id, created_at FROM attempt WHERE created_at < $1 ORDER BY created_at LIMIT $2)",
    )
    .bind(attempts_before)
    .bind(limit(limit_n))
    .execute(pool)
    .await?;
    // A payload a pending delivery still has to send is kept until that delivery ends.
    let payloads = sqlx::query(
        "UPDATE message SET payload = $1, expunged = true WHERE id IN \
         (SELECT m.id FROM message m WHERE m.payload_expires_at IS NOT NULL AND NOT m.expunged \
          AND m.payload_expires_at <= $2 \
          AND NOT EXISTS (SELECT 1 FROM delivery d WHERE d.message_id = m.id AND d.status = 0) \
          ORDER BY m.payload_expires_at LIMIT $3)",
    )
    .bind(&b"{}"[..])
    .bind(now)
    .bind(limit(limit_n))
    .execute(pool)
    .await?;
    // Sent or not: without an operational webhook nothing is ever sent, and the log must stay bounded.
    let events = sqlx::query(
        "DELETE FROM operational_event WHERE seq IN \
         (SELECT seq FROM operational_event WHERE created_at < $1 \
          ORDER BY created_at LIMIT $2)",
    )
    .bind(attempts_before)
    .bind(limit(limit_n))
    .execute(pool)
    .await?;
    Ok(RetentionStep {
        attempts_deleted: attempts.rows_affected(),
        payloads_expunged: payloads.rows_affected(),
        events_deleted: events.rows_affected(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_names_round_trip() {
        let day = 20_000; // 2024-10-04
        let name = partition_name(day).unwrap();
        assert_eq!(name, "attempt_y20241004");
        assert_eq!(day_of(&name), Some(day));
        assert_eq!(day_of("attempt_default"), None);
    }
}
