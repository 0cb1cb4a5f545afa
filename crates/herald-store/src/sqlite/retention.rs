//! Retention on SQLite: old attempts and old operational events deleted and expired payloads expunged
//! in small batches, each one statement (its own short transaction) on the write connection, so ingest and
//! results never wait long behind it. Every scan is served by an index (`attempt_created`,
//! `message_payload_expiry`, `operational_event_created`).

use herald_core::clock::Millis;
use sqlx::SqlitePool;

use crate::{RetentionStep, StoreResult};

pub(super) async fn step(
    write: &SqlitePool,
    attempts_before: Millis,
    now: Millis,
    limit: usize,
) -> StoreResult<RetentionStep> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let attempts = sqlx::query(
        "DELETE FROM attempt WHERE rowid IN \
         (SELECT rowid FROM attempt WHERE created_at < ? ORDER BY created_at LIMIT ?)",
    )
    .bind(attempts_before)
    .bind(limit)
    .execute(write)
    .await?;
    // A payload that a pending delivery still has to send is kept until that delivery ends (the next run
    // expunges it): retention must never turn a queued webhook into an empty one.
    let payloads = sqlx::query(
        "UPDATE message SET payload = ?, expunged = 1 WHERE id IN \
         (SELECT m.id FROM message m WHERE m.payload_expires_at IS NOT NULL AND m.expunged = 0 \
          AND m.payload_expires_at <= ? \
          AND NOT EXISTS (SELECT 1 FROM delivery d WHERE d.message_id = m.id AND d.status = 0) \
          ORDER BY m.payload_expires_at LIMIT ?)",
    )
    .bind(&b"{}"[..])
    .bind(now)
    .bind(limit)
    .execute(write)
    .await?;
    let events = sqlx::query(
        "DELETE FROM operational_event WHERE seq IN \
         (SELECT seq FROM operational_event WHERE created_at < ? \
          ORDER BY created_at LIMIT ?)",
    )
    .bind(attempts_before)
    .bind(limit)
    .execute(write)
    .await?;
    Ok(RetentionStep {
        attempts_deleted: attempts.rows_affected(),
        payloads_expunged: payloads.rows_affected(),
        events_deleted: events.rows_affected(),
    })
}
