//! Application-scoped tokens on SQLite: stored by digest, looked up on every request that presents one.

use sqlx::SqlitePool;

use super::map_constraint;
use crate::{AppToken, StoreResult};

pub(super) async fn create(write: &SqlitePool, token: &AppToken) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO app_token (token_sha256, app_id, read_only, created_at, expires_at) VALUES (?, ?, ?, ?, ?)",
    )
    .bind(&token.token_sha256)
    .bind(&token.app_id)
    .bind(token.read_only)
    .bind(token.created_at)
    .bind(token.expires_at)
    .execute(write)
    .await
    .map_err(map_constraint)?;
    Ok(())
}

pub(super) async fn find(read: &SqlitePool, token_sha256: &str, now: i64) -> StoreResult<Option<AppToken>> {
    let row = sqlx::query("SELECT * FROM app_token WHERE token_sha256 = ? AND expires_at > ?")
        .bind(token_sha256)
        .bind(now)
        .fetch_optional(read)
        .await?;
    row.as_ref().map(crate::rows::app_token).transpose()
}

pub(super) async fn expire(write: &SqlitePool, app_id: &str, at: i64) -> StoreResult<u64> {
    let result = sqlx::query("UPDATE app_token SET expires_at = ? WHERE app_id = ? AND expires_at > ?")
        .bind(at)
        .bind(app_id)
        .bind(at)
        .execute(write)
        .await?;
    Ok(result.rows_affected())
}
