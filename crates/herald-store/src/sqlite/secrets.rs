//! Endpoint secrets on SQLite: the SQL around the shared sealing rules (`crate::sealing`): the start-up
//! key check and migration of rows written before encryption, and key rotation (`endpoint_secret`
//! rows).

use herald_core::model::PreviousSecret;
use serde_json::json;
use sqlx::{Row, SqlitePool};

use super::events::{self, ENDPOINT_UPDATED, NewEvent};
use crate::crypto::SecretCipher;
use crate::sealing::{self, KEY_CHECK};
use crate::{StoreError, StoreResult};

/// At open: refuse a key that is not the one the stored secrets were sealed with, then seal every secret
/// and header set still stored in plain text (rows from before encryption).
pub(crate) async fn prepare(pool: &SqlitePool, cipher: &SecretCipher) -> StoreResult<()> {
    let check: Option<String> = sqlx::query_scalar("SELECT value FROM meta WHERE key = ?")
        .bind(KEY_CHECK)
        .fetch_optional(pool)
        .await?;
    match check {
        Some(sealed) => sealing::verify_key_check(cipher, &sealed)?,
        None => {
            // No check value yet, but maybe sealed rows (the value was lost): one of them must open.
            let sample: Option<(String, String)> =
                sqlx::query_as("SELECT id, secret FROM endpoint WHERE secret LIKE ? LIMIT 1")
                    .bind(sealing::sealed_pattern())
                    .fetch_optional(pool)
                    .await?;
            if let Some((id, sealed)) = sample {
                sealing::verify_sample(cipher, &id, &sealed)?;
            }
            // Another process opening the same new database may have written its value first: keep the first
            // one, and check this key against it.
            sqlx::query("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING")
                .bind(KEY_CHECK)
                .bind(sealing::new_key_check(cipher))
                .execute(pool)
                .await?;
            let stored: String = sqlx::query_scalar("SELECT value FROM meta WHERE key = ?")
                .bind(KEY_CHECK)
                .fetch_one(pool)
                .await?;
            sealing::verify_key_check(cipher, &stored)?;
        }
    }
    let plain = sqlx::query("SELECT id, secret, headers FROM endpoint WHERE secret NOT LIKE ? OR headers NOT LIKE ?")
        .bind(sealing::sealed_pattern())
        .bind(sealing::sealed_pattern())
        .fetch_all(pool)
        .await?;
    if plain.is_empty() {
        return Ok(());
    }
    let mut tx = pool.begin().await?;
    for row in &plain {
        let id: String = row.try_get("id")?;
        let (secret, headers) = sealing::reseal(cipher, &id, row.try_get("secret")?, row.try_get("headers")?)?;
        sqlx::query("UPDATE endpoint SET secret = ?, headers = ? WHERE id = ?")
            .bind(secret)
            .bind(headers)
            .bind(&id)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    tracing::info!(
        endpoints = plain.len(),
        "encrypted endpoint secrets stored in plain text"
    );
    Ok(())
}

pub(crate) async fn rotate(
    pool: &SqlitePool,
    cipher: &SecretCipher,
    endpoint_id: &str,
    new_secret: &str,
    old_expires_at: i64,
    now: i64,
) -> StoreResult<()> {
    let mut tx = pool.begin().await?;
    let found: Option<(String, String, Option<String>)> =
        sqlx::query_as("SELECT secret, app_id, uid FROM endpoint WHERE id = ?")
            .bind(endpoint_id)
            .fetch_optional(&mut *tx)
            .await?;
    let (current, app_id, uid) = found.ok_or(StoreError::NotFound)?;
    // Older keys never outlive the one rotated away now; expired ones are dropped.
    sqlx::query("UPDATE endpoint_secret SET expires_at = MIN(expires_at, ?) WHERE endpoint_id = ?")
        .bind(old_expires_at)
        .bind(endpoint_id)
        .execute(&mut *tx)
        .await?;
    sqlx::query("DELETE FROM endpoint_secret WHERE endpoint_id = ? AND expires_at <= ?")
        .bind(endpoint_id)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    if old_expires_at > now {
        // Re-sealed (fresh nonce) rather than copied: the stored value may predate encryption.
        let plain = sealing::open_secret(cipher, endpoint_id, &current)?;
        sqlx::query("INSERT INTO endpoint_secret (endpoint_id, secret, rotated_at, expires_at) VALUES (?, ?, ?, ?)")
            .bind(endpoint_id)
            .bind(sealing::seal_secret(cipher, endpoint_id, &plain))
            .bind(now)
            .bind(old_expires_at)
            .execute(&mut *tx)
            .await?;
    }
    sqlx::query("UPDATE endpoint SET secret = ?, updated_at = ? WHERE id = ?")
        .bind(sealing::seal_secret(cipher, endpoint_id, new_secret))
        .bind(now)
        .bind(endpoint_id)
        .execute(&mut *tx)
        .await?;
    // A rotation changes the endpoint (its signing key): operators hear of it as of any other change.
    let event = NewEvent::about_endpoint(ENDPOINT_UPDATED, &app_id, endpoint_id, uid.as_deref(), json!({}), now);
    events::record(&mut tx, &[event]).await?;
    tx.commit().await?;
    Ok(())
}

pub(crate) async fn previous(
    pool: &SqlitePool,
    cipher: &SecretCipher,
    endpoint_id: &str,
    now: i64,
) -> StoreResult<Vec<PreviousSecret>> {
    let rows = sqlx::query(
        "SELECT secret, rotated_at, expires_at FROM endpoint_secret WHERE endpoint_id = ? AND expires_at > ? \
         ORDER BY rotated_at DESC, rowid DESC",
    )
    .bind(endpoint_id)
    .bind(now)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(PreviousSecret {
                secret: sealing::open_secret(cipher, endpoint_id, row.try_get("secret")?)?,
                rotated_at: row.try_get("rotated_at")?,
                expires_at: row.try_get("expires_at")?,
            })
        })
        .collect()
}
