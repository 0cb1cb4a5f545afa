//! Endpoint secrets on SQLite: sealing on write, opening on read, the start-up key check and migration
//! of rows written before encryption, and key rotation (`endpoint_secret` rows).

use herald_core::model::{Headers, PreviousSecret};
use sqlx::{Row, SqlitePool};

use crate::crypto::{CryptoError, SecretCipher};
use crate::{StoreError, StoreResult};

/// The meta key of a value sealed with the store's key, opened at every start to prove the key is right
/// before anything is signed with it.
const KEY_CHECK: &str = "secret_key_check";
const KEY_CHECK_TEXT: &str = "herald secret key check";

/// What a sealed endpoint secret is bound to (its row), so it cannot be moved to another endpoint.
fn secret_context(endpoint_id: &str) -> String {
    format!("{endpoint_id}/secret")
}

fn headers_context(endpoint_id: &str) -> String {
    format!("{endpoint_id}/headers")
}

pub(crate) fn seal_secret(cipher: &SecretCipher, endpoint_id: &str, secret: &str) -> String {
    cipher.seal(secret, &secret_context(endpoint_id))
}

pub(crate) fn seal_headers(cipher: &SecretCipher, endpoint_id: &str, headers: &Headers) -> String {
    let json = serde_json::to_string(headers).unwrap_or_else(|_| "{}".to_owned());
    cipher.seal(&json, &headers_context(endpoint_id))
}

/// Open a stored value; a value that is not sealed is a row from before encryption, read as it is (the
/// start-up migration seals those, so this only matters for rows it has not reached).
fn open_value(cipher: &SecretCipher, stored: &str, context: &str) -> StoreResult<String> {
    match cipher.open(stored, context) {
        Ok(plain) => Ok(plain.as_str().to_owned()),
        Err(CryptoError::NotSealed) => Ok(stored.to_owned()),
        Err(error) => Err(StoreError::SecretKey(format!("{context}: {error}"))),
    }
}

pub(crate) fn open_secret(cipher: &SecretCipher, endpoint_id: &str, stored: &str) -> StoreResult<String> {
    open_value(cipher, stored, &secret_context(endpoint_id))
}

pub(crate) fn open_headers(cipher: &SecretCipher, endpoint_id: &str, stored: &str) -> StoreResult<Headers> {
    let json = open_value(cipher, stored, &headers_context(endpoint_id))?;
    serde_json::from_str(&json).map_err(|e| StoreError::Corrupt(format!("headers column: {e}")))
}

/// At open: refuse a key that is not the one the stored secrets were sealed with, then seal every secret
/// and header set still stored in plain text (rows from before encryption).
pub(crate) async fn prepare(pool: &SqlitePool, cipher: &SecretCipher) -> StoreResult<()> {
    let wrong_key = || {
        StoreError::SecretKey(
            "the configured secret key does not decrypt this database's endpoint secrets; start with the key \
             they were encrypted with"
                .to_owned(),
        )
    };
    let check: Option<String> = sqlx::query_scalar("SELECT value FROM meta WHERE key = ?")
        .bind(KEY_CHECK)
        .fetch_optional(pool)
        .await?;
    match check {
        Some(sealed) => {
            cipher.open(&sealed, KEY_CHECK).map_err(|_| wrong_key())?;
        }
        None => {
            // No check value yet, but maybe sealed rows (the value was lost): one of them must open.
            let sample: Option<(String, String)> =
                sqlx::query_as("SELECT id, secret FROM endpoint WHERE secret LIKE 'enc1:%' LIMIT 1")
                    .fetch_optional(pool)
                    .await?;
            if let Some((id, sealed)) = sample {
                cipher.open(&sealed, &secret_context(&id)).map_err(|_| wrong_key())?;
            }
            // Another process opening the same new database may have written its value first: keep the first
            // one, and check this key against it.
            sqlx::query("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING")
                .bind(KEY_CHECK)
                .bind(cipher.seal(KEY_CHECK_TEXT, KEY_CHECK))
                .execute(pool)
                .await?;
            let stored: String = sqlx::query_scalar("SELECT value FROM meta WHERE key = ?")
                .bind(KEY_CHECK)
                .fetch_one(pool)
                .await?;
            cipher.open(&stored, KEY_CHECK).map_err(|_| wrong_key())?;
        }
    }
    let plain = sqlx::query(
        "SELECT id, secret, headers FROM endpoint WHERE secret NOT LIKE 'enc1:%' OR headers NOT LIKE 'enc1:%'",
    )
    .fetch_all(pool)
    .await?;
    if plain.is_empty() {
        return Ok(());
    }
    let mut tx = pool.begin().await?;
    for row in &plain {
        let id: String = row.try_get("id")?;
        let secret = open_secret(cipher, &id, row.try_get("secret")?)?;
        let headers = open_headers(cipher, &id, row.try_get("headers")?)?;
        sqlx::query("UPDATE endpoint SET secret = ?, headers = ? WHERE id = ?")
            .bind(seal_secret(cipher, &id, &secret))
            .bind(seal_headers(cipher, &id, &headers))
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
    let current: Option<String> = sqlx::query_scalar("SELECT secret FROM endpoint WHERE id = ?")
        .bind(endpoint_id)
        .fetch_optional(&mut *tx)
        .await?;
    let current = current.ok_or(StoreError::NotFound)?;
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
        let plain = open_secret(cipher, endpoint_id, &current)?;
        sqlx::query("INSERT INTO endpoint_secret (endpoint_id, secret, rotated_at, expires_at) VALUES (?, ?, ?, ?)")
            .bind(endpoint_id)
            .bind(seal_secret(cipher, endpoint_id, &plain))
            .bind(now)
            .bind(old_expires_at)
            .execute(&mut *tx)
            .await?;
    }
    sqlx::query("UPDATE endpoint SET secret = ?, updated_at = ? WHERE id = ?")
        .bind(seal_secret(cipher, endpoint_id, new_secret))
        .bind(now)
        .bind(endpoint_id)
        .execute(&mut *tx)
        .await?;
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
                secret: open_secret(cipher, endpoint_id, row.try_get("secret")?)?,
                rotated_at: row.try_get("rotated_at")?,
                expires_at: row.try_get("expires_at")?,
            })
        })
        .collect()
}
