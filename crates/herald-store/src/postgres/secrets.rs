//! Endpoint secrets on PostgreSQL: the SQL around the shared sealing rules (`crate::sealing`): the
//! start-up key check and migration of rows written before encryption, and key rotation
//! (`endpoint_secret` rows). Several nodes may run this at once against one database.

use herald_core::model::PreviousSecret;
use serde_json::json;
use sqlx::{PgPool, Row};

use super::events;
use crate::crypto::SecretCipher;
use crate::events::{ENDPOINT_UPDATED, NewEvent};
use crate::sealing::{self, KEY_CHECK};
use crate::{StoreError, StoreResult};

/// At open: refuse a key that is not the one the stored secrets were sealed with, then seal every secret
/// and header set still stored in plain text (rows from before encryption).
pub(crate) async fn prepare(pool: &PgPool, cipher: &SecretCipher) -> StoreResult<()> {
    let check: Option<String> = sqlx::query_scalar("SELECT value FROM meta WHERE key = $1")
        .bind(KEY_CHECK)
        .fetch_optional(pool)
        .await?;
    match check {
        Some(sealed) => sealing::verify_key_check(cipher, &sealed)?,
        None => {
            // No check value yet, but maybe sealed rows (the value was lost): one of them must open.
            let sample: Option<(String, String)> =
                sqlx::query_as("SELECT id, secret FROM endpoint WHERE secret LIKE $1 LIMIT 1")
                    .bind(sealing::sealed_pattern())
                    .fetch_optional(pool)
                    .await?;
            if let Some((id, sealed)) = sample {
                sealing::verify_sample(cipher, &id, &sealed)?;
            }
            // Another node opening the same new database may have written its value first: keep the first
            // one, and check this key against it.
            sqlx::query("INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING")
                .bind(KEY_CHECK)
                .bind(sealing::new_key_check(cipher))
                .execute(pool)
                .await?;
            let stored: String = sqlx::query_scalar("SELECT value FROM meta WHERE key = $1")
                .bind(KEY_CHECK)
                .fetch_one(pool)
                .await?;
            sealing::verify_key_check(cipher, &stored)?;
        }
    }
    let plain = sqlx::query("SELECT id, secret, headers FROM endpoint WHERE secret NOT LIKE $1 OR headers NOT LIKE $1")
        .bind(sealing::sealed_pattern())
        .fetch_all(pool)
        .await?;
    if plain.is_empty() {
        return Ok(());
    }
    let mut tx = pool.begin().await?;
    for row in &plain {
        let id: String = row.try_get("id")?;
        let stored_secret: String = row.try_get("secret")?;
        let stored_headers: String = row.try_get("headers")?;
        let (secret, headers) = sealing::reseal(cipher, &id, &stored_secret, &stored_headers)?;
        // Only if unchanged since read: a node already serving may have rotated the secret meanwhile.
        sqlx::query("UPDATE endpoint SET secret = $1, headers = $2 WHERE id = $3 AND secret = $4 AND headers = $5")
            .bind(secret)
            .bind(headers)
            .bind(&id)
            .bind(&stored_secret)
            .bind(&stored_headers)
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
    pool: &PgPool,
    cipher: &SecretCipher,
    endpoint_id: &str,
    new_secret: &str,
    old_expires_at: i64,
    now: i64,
) -> StoreResult<()> {
    let mut tx = pool.begin().await?;
    // Locks the row: concurrent rotations of one endpoint run one after the other.
    let found: Option<(String, String, Option<String>)> =
        sqlx::query_as("SELECT secret, app_id, uid FROM endpoint WHERE id = $1 FOR UPDATE")
            .bind(endpoint_id)
            .fetch_optional(&mut *tx)
            .await?;
    let (current, app_id, uid) = found.ok_or(StoreError::NotFound)?;
    // Older keys never outlive the one rotated away now; expired ones are dropped.
    sqlx::query("UPDATE endpoint_secret SET expires_at = LEAST(expires_at, $1) WHERE endpoint_id = $2")
        .bind(old_expires_at)
        .bind(endpoint_id)
        .execute(&mut *tx)
        .await?;
    sqlx::query("DELETE FROM endpoint_secret WHERE endpoint_id = $1 AND expires_at <= $2")
        .bind(endpoint_id)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    if old_expires_at > now {
        // Re-sealed (fresh nonce) rather than copied: the stored value may predate encryption.
        let plain = sealing::open_secret(cipher, endpoint_id, &current)?;
        sqlx::query(
            "INSERT INTO endpoint_secret (endpoint_id, secret, rotated_at, expires_at) VALUES ($1, $2, $3, $4)",
        )
        .bind(endpoint_id)
        .bind(sealing::seal_secret(cipher, endpoint_id, &plain))
        .bind(now)
        .bind(old_expires_at)
        .execute(&mut *tx)
        .await?;
    }
    sqlx::query("UPDATE endpoint SET secret = $1, updated_at = $2 WHERE id = $3")
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
    pool: &PgPool,
    cipher: &SecretCipher,
    endpoint_id: &str,
    now: i64,
) -> StoreResult<Vec<PreviousSecret>> {
    let rows = sqlx::query(
        "SELECT secret, rotated_at, expires_at FROM endpoint_secret WHERE endpoint_id = $1 AND expires_at > $2 \
         ORDER BY rotated_at DESC, id DESC",
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
