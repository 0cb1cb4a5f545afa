//! Decoding rows into domain records, and encoding the JSON-text columns, for every backend.
//!
//! Both schemas use the same column names and the same representations (times as integer milliseconds,
//! lists and maps as JSON text, payloads as bytes), so one decoder serves both; [`Columns`] is the
//! handful of typed reads each backend's row type provides.

use std::sync::Arc;

use herald_core::model::{
    Application, Attempt, AttemptTrigger, Endpoint, EventType, Headers, Message, Metadata, Ordering,
};
use sqlx::Row;

use crate::crypto::SecretCipher;
use crate::{StoreError, StoreResult, sealing};

/// Typed column reads, implemented by each backend's row type.
pub(crate) trait Columns {
    fn text(&self, column: &str) -> StoreResult<String>;
    fn opt_text(&self, column: &str) -> StoreResult<Option<String>>;
    fn int(&self, column: &str) -> StoreResult<i64>;
    fn opt_int(&self, column: &str) -> StoreResult<Option<i64>>;
    fn flag(&self, column: &str) -> StoreResult<bool>;
    fn bytes(&self, column: &str) -> StoreResult<Vec<u8>>;
    /// A free-text column: one a user or a receiver fills, which may contain any character (PostgreSQL
    /// stores these escaped, see `postgres::text`).
    fn free_text(&self, column: &str) -> StoreResult<String>;
    fn opt_free_text(&self, column: &str) -> StoreResult<Option<String>>;
}

macro_rules! impl_columns {
    ($row:ty, $decode:expr) => {
        impl Columns for $row {
            fn text(&self, column: &str) -> StoreResult<String> {
                Ok(self.try_get(column)?)
            }
            fn opt_text(&self, column: &str) -> StoreResult<Option<String>> {
                Ok(self.try_get(column)?)
            }
            fn int(&self, column: &str) -> StoreResult<i64> {
                Ok(self.try_get(column)?)
            }
            fn opt_int(&self, column: &str) -> StoreResult<Option<i64>> {
                Ok(self.try_get(column)?)
            }
            fn flag(&self, column: &str) -> StoreResult<bool> {
                Ok(self.try_get(column)?)
            }
            fn bytes(&self, column: &str) -> StoreResult<Vec<u8>> {
                Ok(self.try_get(column)?)
            }
            fn free_text(&self, column: &str) -> StoreResult<String> {
                Ok($decode(self.try_get::<String, _>(column)?))
            }
            fn opt_free_text(&self, column: &str) -> StoreResult<Option<String>> {
                Ok(self.try_get::<Option<String>, _>(column)?.map($decode))
            }
        }
    };
}

impl_columns!(sqlx::sqlite::SqliteRow, std::convert::identity);
impl_columns!(sqlx::postgres::PgRow, crate::postgres::text::unescape);

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

fn version_of(value: i64) -> StoreResult<i32> {
    i32::try_from(value).map_err(|_| StoreError::Corrupt(format!("endpoint version {value}")))
}

fn u32_opt(value: Option<i64>) -> Option<u32> {
    value.and_then(|v| u32::try_from(v).ok())
}

pub(crate) fn application(row: &impl Columns) -> StoreResult<Application> {
    Ok(Application {
        id: row.text("id")?,
        uid: row.opt_text("uid")?,
        name: row.free_text("name")?,
        rate_limit: u32_opt(row.opt_int("rate_limit")?),
        verify_endpoints: row.flag("verify_endpoints")?,
        metadata: decode_metadata(&row.text("metadata")?)?,
        created_at: row.int("created_at")?,
        updated_at: row.int("updated_at")?,
    })
}

pub(crate) fn event_type(row: &impl Columns) -> StoreResult<EventType> {
    Ok(EventType {
        name: row.text("name")?,
        description: row.free_text("description")?,
        archived: row.flag("archived")?,
        deprecated: row.flag("deprecated")?,
        feature_flag: row.opt_free_text("feature_flag")?,
        schemas: row.opt_free_text("schemas")?,
        created_at: row.int("created_at")?,
        updated_at: row.int("updated_at")?,
    })
}

/// Decode an endpoint, decrypting its secret and headers with `cipher`. Without a cipher they are left
/// empty: for the ingest fan-out, which needs only the subscription fields and should not pay for
/// decryption on the hot path.
pub(crate) fn endpoint(row: &impl Columns, cipher: Option<&SecretCipher>) -> StoreResult<Endpoint> {
    let id = row.text("id")?;
    let (secret, headers) = match cipher {
        Some(cipher) => (
            sealing::open_secret(cipher, &id, &row.text("secret")?)?,
            sealing::open_headers(cipher, &id, &row.text("headers")?)?,
        ),
        None => (String::new(), Headers::new()),
    };
    Ok(Endpoint {
        id,
        app_id: row.text("app_id")?,
        uid: row.opt_text("uid")?,
        url: row.text("url")?,
        description: row.free_text("description")?,
        filter_types: decode_list(row.opt_text("filter_types")?)?,
        channels: decode_list(row.opt_text("channels")?)?,
        disabled: row.flag("disabled")?,
        disabled_reason: row.opt_free_text("disabled_reason")?,
        rate_limit: u32_opt(row.opt_int("rate_limit")?),
        max_concurrency: u32_opt(row.opt_int("max_concurrency")?),
        request_timeout_ms: u32_opt(row.opt_int("request_timeout_ms")?),
        ordering: {
            let name = row.text("ordering")?;
            Ordering::parse(&name).ok_or_else(|| StoreError::Corrupt(format!("ordering column: {name:?}")))?
        },
        version: version_of(row.int("version")?)?,
        metadata: decode_metadata(&row.text("metadata")?)?,
        secret,
        headers,
        created_at: row.int("created_at")?,
        updated_at: row.int("updated_at")?,
    })
}

/// Decode a message from columns prefixed `m_` (so it can be joined with other tables).
pub(crate) fn message(row: &impl Columns) -> StoreResult<Message> {
    let payload = row.bytes("m_payload")?;
    Ok(Message {
        id: row.text("m_id")?,
        app_id: row.text("m_app_id")?,
        event_id: row.opt_free_text("m_event_id")?,
        event_type: row.text("m_event_type")?,
        channels: decode_list(row.opt_text("m_channels")?)?,
        payload: Arc::from(payload),
        ordering_key: row.opt_free_text("m_ordering_key")?,
        created_at: row.int("m_created_at")?,
    })
}

/// The column list that [`message`] decodes, for table alias `m`.
pub(crate) const MESSAGE_COLUMNS: &str = "m.id AS m_id, m.app_id AS m_app_id, m.event_id AS m_event_id, \
     m.event_type AS m_event_type, m.channels AS m_channels, m.payload AS m_payload, m.created_at AS m_created_at, \
     m.ordering_key AS m_ordering_key";

pub(crate) fn attempt(row: &impl Columns) -> StoreResult<Attempt> {
    let trigger = row.int("trigger_type")?;
    Ok(Attempt {
        id: row.text("id")?,
        message_id: row.text("message_id")?,
        endpoint_id: row.text("endpoint_id")?,
        url: row.free_text("url")?,
        attempt_number: u32_opt(Some(row.int("attempt_number")?)).unwrap_or(0),
        success: row.flag("success")?,
        outcome: row.free_text("outcome")?,
        response_status: row.opt_int("response_status")?.and_then(|s| u16::try_from(s).ok()),
        response: row.free_text("response")?,
        duration_ms: row.int("duration_ms")?,
        trigger: AttemptTrigger::from_code(trigger),
        created_at: row.int("created_at")?,
    })
}
