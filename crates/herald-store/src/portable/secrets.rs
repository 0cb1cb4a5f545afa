//! Endpoint secrets: the SQL around the shared sealing rules (`crate::sealing`): the start-up key check
//! and migration of rows written before encryption, and key rotation (`endpoint_secret` rows). Several
//! nodes may run this at once against one PostgreSQL database.

use std::collections::HashMap;

use herald_core::clock::Millis;
use herald_core::id::EndpointId;
use herald_core::model::PreviousSecret;
use serde_json::json;

use crate::crypto::SecretCipher;
use crate::dialect::{Dialect, On, SqlStore};
use crate::events::{ENDPOINT_UPDATED, NewEvent};
use crate::rows::Columns;
use crate::sealing::{self, KEY_CHECK};
use crate::statement::{Arg, Sql};
use crate::{StoreError, StoreResult};

/// At open: refuse a key that is not the one the stored secrets were sealed with, then seal every secret
/// and header set still stored in plain text (rows from before encryption).
pub(crate) async fn prepare<D: Dialect>(pool: &D::Pool, cipher: &SecretCipher) -> StoreResult<()> {
    let key_check = Sql::new("SELECT value FROM meta WHERE key = $1").bind(KEY_CHECK);
    match key_check.fetch_optional(On::<D>::Pool(pool)).await? {
        Some(row) => sealing::verify_key_check(cipher, &row.text("value")?)?,
        None => {
            // No check value yet, but maybe sealed rows (the value was lost): one of them must open.
            let sample = Sql::new("SELECT id, secret FROM endpoint WHERE secret LIKE $1 LIMIT 1")
                .bind(sealing::sealed_pattern())
                .fetch_optional(On::<D>::Pool(pool))
                .await?;
            if let Some(row) = sample {
                sealing::verify_sample(cipher, &row.text("id")?, &row.text("secret")?)?;
            }
            // Another process opening the same new database may have written its value first: keep the
            // first one, and check this key against it.
            Sql::new("INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING")
                .bind(KEY_CHECK)
                .bind(sealing::new_key_check(cipher))
                .execute(On::<D>::Pool(pool))
                .await?;
            let stored = key_check.fetch_one(On::<D>::Pool(pool)).await?;
            sealing::verify_key_check(cipher, &stored.text("value")?)?;
        }
    }
    // In id order, the order every other transaction that writes several endpoints locks them in.
    let plain = Sql::new(
        "SELECT id, secret, headers FROM endpoint WHERE secret NOT LIKE $1 OR headers NOT LIKE $1 ORDER BY id",
    )
    .bind(sealing::sealed_pattern())
    .fetch_all(On::<D>::Pool(pool))
    .await?;
    if plain.is_empty() {
        return Ok(());
    }
    let mut tx = D::begin(pool).await?;
    for row in &plain {
        let id = row.text("id")?;
        let stored_secret = row.text("secret")?;
        let stored_headers = row.text("headers")?;
        let (secret, headers) = sealing::reseal(cipher, &id, &stored_secret, &stored_headers)?;
        // Only if unchanged since read: a node already serving may have rotated the secret meanwhile.
        Sql::new("UPDATE endpoint SET secret = $1, headers = $2 WHERE id = $3 AND secret = $4 AND headers = $5")
            .bind(secret)
            .bind(headers)
            .bind(&id)
            .bind(&stored_secret)
            .bind(&stored_headers)
            .execute(tx.on())
            .await?;
    }
    tx.commit().await?;
    tracing::info!(
        endpoints = plain.len(),
        "encrypted endpoint secrets stored in plain text"
    );
    Ok(())
}

/// See [`crate::Store::rotate_endpoint_secret`].
pub(super) async fn rotate<D: Dialect>(
    store: &SqlStore<D>,
    endpoint_id: &EndpointId,
    new_secret: &str,
    old_expires_at: Millis,
    now: Millis,
) -> StoreResult<()> {
    let cipher = &store.cipher;
    let mut tx = store.begin().await?;
    // Locks the row where rows can be locked: concurrent rotations of one endpoint run one after the other.
    let found = Sql::new(format!(
        "SELECT secret, app_id, uid FROM endpoint WHERE id = $1{}",
        D::for_update(None)
    ))
    .bind(endpoint_id)
    .fetch_optional(tx.on())
    .await?
    .ok_or(StoreError::NotFound)?;
    let (current, app_id, uid) = (found.text("secret")?, found.id("app_id")?, found.opt_text("uid")?);
    // Older keys never outlive the one rotated away now; expired ones are dropped.
    Sql::new(format!(
        "UPDATE endpoint_secret SET expires_at = {}(expires_at, $1) WHERE endpoint_id = $2",
        D::LEAST
    ))
    .bind(old_expires_at)
    .bind(endpoint_id)
    .execute(tx.on())
    .await?;
    Sql::new("DELETE FROM endpoint_secret WHERE endpoint_id = $1 AND expires_at <= $2")
        .bind(endpoint_id)
        .bind(now)
        .execute(tx.on())
        .await?;
    if old_expires_at > now {
        // Re-sealed (fresh nonce) rather than copied: the stored value may predate encryption.
        let plain = sealing::open_secret(cipher, endpoint_id, &current)?;
        Sql::new("INSERT INTO endpoint_secret (endpoint_id, secret, rotated_at, expires_at) VALUES ($1, $2, $3, $4)")
            .bind(endpoint_id)
            .bind(sealing::seal_secret(cipher, endpoint_id, &plain))
            .bind(now)
            .bind(old_expires_at)
            .execute(tx.on())
            .await?;
    }
    Sql::new("UPDATE endpoint SET secret = $1, updated_at = $2 WHERE id = $3")
        .bind(sealing::seal_secret(cipher, endpoint_id, new_secret))
        .bind(now)
        .bind(endpoint_id)
        .execute(tx.on())
        .await?;
    // A rotation changes the endpoint (its signing key): operators hear of it as of any other change.
    let event = NewEvent::about_endpoint(ENDPOINT_UPDATED, &app_id, endpoint_id, uid.as_deref(), json!({}), now);
    D::record_events(&mut tx, &[event]).await?;
    tx.commit().await?;
    Ok(())
}

/// The keys each of `endpoint_ids` rotated away from that still sign at `now`, most recently rotated
/// first (see [`crate::DeliveryStore::previous_secrets`]); an endpoint with none is absent.
pub(super) async fn previous<D: Dialect>(
    store: &SqlStore<D>,
    endpoint_ids: &[EndpointId],
    now: Millis,
) -> StoreResult<HashMap<EndpointId, Vec<PreviousSecret>>> {
    let mut previous: HashMap<EndpointId, Vec<PreviousSecret>> = HashMap::new();
    if endpoint_ids.is_empty() {
        return Ok(previous);
    }
    let found = Sql::new(format!(
        "SELECT endpoint_id, secret, rotated_at, expires_at FROM endpoint_secret WHERE {} AND expires_at > $2 \
         ORDER BY endpoint_id, rotated_at DESC, {} DESC",
        D::in_list("endpoint_id", "$1"),
        D::INSERTION_ORDER
    ))
    .bind(Arg::Texts(endpoint_ids.iter().map(EndpointId::as_str).collect()))
    .bind(now)
    .fetch_all(store.reads())
    .await?;
    for row in &found {
        let endpoint_id = row.id("endpoint_id")?;
        let secret = PreviousSecret {
            secret: sealing::open_secret(&store.cipher, &endpoint_id, &row.text("secret")?)?,
            rotated_at: row.time("rotated_at")?,
            expires_at: row.time("expires_at")?,
        };
        previous.entry(endpoint_id).or_default().push(secret);
    }
    Ok(previous)
}
