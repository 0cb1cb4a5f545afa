//! Decoding SQLite rows into domain records, and encoding the JSON-text columns.

use std::sync::Arc;

use herald_core::model::{
    Application, Attempt, AttemptTrigger, Endpoint, EventType, Headers, Message, Metadata, Ordering,
};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use super::secrets;
use crate::crypto::SecretCipher;
use crate::{StoreError, StoreResult};

pub(crate) fn encode_list(list: &Option<Vec<String>>) -> Option<String> {
    list.as_ref()
        .map(|items| serde_json::Value::from(items.clone()).to_string())
}

pub(crate) fn encode_metadata(metadata: &Metadata) -> String {
    serde_json::to_string(metadata).unwrap_or_else(|_| "{}".to_owned())
}

pub(crate) fn decode_list(text: Option<String>) -> StoreResult<Option<Vec<String>>> {
    text.map(|t| serde_json::from_str(&t).map_err(|e| StoreError::Corrupt(format!("list column: {e}"))))
        .transpose()
}

fn decode_metadata(text: &str) -> StoreResult<Metadata> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("metadata column: {e}")))
}

fn u32_opt(value: Option<i64>) -> Option<u32> {
    value.and_then(|v| u32::try_from(v).ok())
}

pub(crate) fn application(row: &SqliteRow) -> StoreResult<Application> {
    Ok(Application {
        id: row.try_get("id")?,
        uid: row.try_get("uid")?,
        name: row.try_get("name")?,
        rate_limit: u32_opt(row.try_get("rate_limit")?),
        verify_endpoints: row.try_get("verify_endpoints")?,
        metadata: decode_metadata(row.try_get::<&str, _>("metadata")?)?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

pub(crate) fn event_type(row: &SqliteRow) -> StoreResult<EventType> {
    Ok(EventType {
        name: row.try_get("name")?,
        description: row.try_get("description")?,
        archived: row.try_get("archived")?,
        deprecated: row.try_get("deprecated")?,
        feature_flag: row.try_get("feature_flag")?,
        schemas: row.try_get("schemas")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

/// Decode an endpoint, decrypting its secret and headers with `cipher`. Without a cipher they are left
/// empty: for the ingest fan-out, which needs only the subscription fields and should not pay for
/// decryption on the hot path.
pub(crate) fn endpoint(row: &SqliteRow, cipher: Option<&SecretCipher>) -> StoreResult<Endpoint> {
    let id: String = row.try_get("id")?;
    let (secret, headers) = match cipher {
        Some(cipher) => (
            secrets::open_secret(cipher, &id, row.try_get("secret")?)?,
            secrets::open_headers(cipher, &id, row.try_get("headers")?)?,
        ),
        None => (String::new(), Headers::new()),
    };
    Ok(Endpoint {
        id,
        app_id: row.try_get("app_id")?,
        uid: row.try_get("uid")?,
        url: row.try_get("url")?,
        description: row.try_get("description")?,
        filter_types: decode_list(row.try_get("filter_types")?)?,
        channels: decode_list(row.try_get("channels")?)?,
        disabled: row.try_get("disabled")?,
        disabled_reason: row.try_get("disabled_reason")?,
        rate_limit: u32_opt(row.try_get("rate_limit")?),
        max_concurrency: u32_opt(row.try_get("max_concurrency")?),
        request_timeout_ms: u32_opt(row.try_get("request_timeout_ms")?),
        ordering: {
            let name: &str = row.try_get("ordering")?;
            Ordering::parse(name).ok_or_else(|| StoreError::Corrupt(format!("ordering column: {name:?}")))?
        },
        version: row.try_get("version")?,
        metadata: decode_metadata(row.try_get::<&str, _>("metadata")?)?,
        secret,
        headers,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

/// Decode a message from columns prefixed `m_` (so it can be joined with other tables).
pub(crate) fn message(row: &SqliteRow) -> StoreResult<Message> {
    let payload: Vec<u8> = row.try_get("m_payload")?;
    Ok(Message {
        id: row.try_get("m_id")?,
        app_id: row.try_get("m_app_id")?,
        event_id: row.try_get("m_event_id")?,
        event_type: row.try_get("m_event_type")?,
        channels: decode_list(row.try_get("m_channels")?)?,
        payload: Arc::from(payload),
        ordering_key: row.try_get("m_ordering_key")?,
        created_at: row.try_get("m_created_at")?,
    })
}

/// The column list that [`message`] decodes, for table alias `m`.
pub(crate) const MESSAGE_COLUMNS: &str = "m.id AS m_id, m.app_id AS m_app_id, m.event_id AS m_event_id, \
     m.event_type AS m_event_type, m.channels AS m_channels, m.payload AS m_payload, m.created_at AS m_created_at, \
     m.ordering_key AS m_ordering_key";

pub(crate) fn attempt(row: &SqliteRow) -> StoreResult<Attempt> {
    let trigger: i64 = row.try_get("trigger_type")?;
    Ok(Attempt {
        id: row.try_get("id")?,
        message_id: row.try_get("message_id")?,
        endpoint_id: row.try_get("endpoint_id")?,
        url: row.try_get("url")?,
        attempt_number: u32_opt(Some(row.try_get("attempt_number")?)).unwrap_or(0),
        success: row.try_get("success")?,
        outcome: row.try_get("outcome")?,
        response_status: row
            .try_get::<Option<i64>, _>("response_status")?
            .and_then(|s| u16::try_from(s).ok()),
        response: row.try_get("response")?,
        duration_ms: row.try_get("duration_ms")?,
        trigger: AttemptTrigger::from_code(trigger),
        created_at: row.try_get("created_at")?,
    })
}
