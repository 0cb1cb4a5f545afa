//! Application-scoped tokens and payload retention on PostgreSQL (the same contract as SQLite's).
//!
//! The attempt log is partitioned by day and whole days past retention are dropped ([`super::retention`]);
//! a retention step deletes only what remains older than the cut-off inside days not yet droppable, in
//! small batches.

use sqlx::PgPool;

use crate::sql::{limit, map_constraint};
use crate::{AppToken, RetentionStep, StoreResult};

pub(super) async fn create(pool: &PgPool, token: &AppToken) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO app_token (token_sha256, app_id, read_only, created_at, expires_at) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(&token.token_sha256)
    .bind(&token.app_id)
    .bind(token.read_only)
    .bind(token.created_at)
    .bind(token.expires_at)
    .execute(pool)
    .await
    .map_err(map_constraint)?;
    Ok(())
}

pub(super) async fn find(pool: &PgPool, token_sha256: &str, now: i64) -> StoreResult<Option<AppToken>> {
    let row = sqlx::query("SELECT * FROM app_token WHERE token_sha256 = $1 AND expires_at > $2")
        .bind(token_sha256)
        .bind(now)
        .fetch_optional(pool)
        .await?;
    row.as_ref().map(crate::rows::app_token).transpose()
}

pub(super) async fn expire(pool: &PgPool, app_id: &str, at: i64) -> StoreResult<u64> {
    let result = sqlx::query("UPDATE app_token SET expires_at = $1 WHERE app_id = $2 AND expires_at > $1")
        .bind(at)
        .bind(app_id)
        .execute(pool)
        .await?;
    Ok(result.rows_affected())
}

pub(super) async fn retention_step(
    pool: &PgPool,
    attempts_before: i64,
    now: i64,
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
