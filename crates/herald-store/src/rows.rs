//! Decoding rows into domain records, and encoding the JSON-text columns, for every backend.
//!
//! Both schemas use the same column names and the same representations (times as integer milliseconds,
//! lists and maps as JSON text, payloads as bytes), so one decoder serves both; [`Columns`] is the
//! handful of typed reads each backend's row type provides.

use std::sync::Arc;

use herald_core::clock::Millis;
use herald_core::id::{EndpointId, Id, Kind, MessageId};
use herald_core::model::{
    Application, Attempt, AttemptTrigger, BackgroundTask, DeliveryStatus, DisabledReason, Endpoint, EventType,
    HeaderNames, Headers, Message, Metadata, OperationalEvent, Ordering, TaskKind, TaskState,
};
use herald_core::outcome::OutcomeClass;
use sqlx::Row;

use crate::crypto::SecretCipher;
use crate::{AppToken, DeliveryRecord, DeliveryStats, StoreError, StoreResult, sealing};

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

    /// An id column, checked as an id of kind `K` (a malformed one is corrupt data).
    fn id<K: Kind>(&self, column: &str) -> StoreResult<Id<K>> {
        id_of(column, self.text(column)?)
    }

    /// An optional id column (see [`Columns::id`]).
    fn opt_id<K: Kind>(&self, column: &str) -> StoreResult<Option<Id<K>>> {
        self.opt_text(column)?.map(|text| id_of(column, text)).transpose()
    }

    /// A time column: integer Unix milliseconds on both dialects.
    fn time(&self, column: &str) -> StoreResult<Millis> {
        self.int(column).map(Millis::from_unix_ms)
    }

    /// An optional time column (see [`Columns::time`]).
    fn opt_time(&self, column: &str) -> StoreResult<Option<Millis>> {
        Ok(self.opt_int(column)?.map(Millis::from_unix_ms))
    }
}

/// `text`, read from `column`, as an id of kind `K`.
pub(crate) fn id_of<K: Kind>(column: &str, text: String) -> StoreResult<Id<K>> {
    Id::try_from(text).map_err(|error| StoreError::Corrupt(format!("{column} column: {error}")))
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
impl_columns!(sqlx::postgres::PgRow, herald_sql::text::unescape);

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

pub(crate) fn decode_metadata(text: &str) -> StoreResult<Metadata> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("metadata column: {e}")))
}

/// A column holding one of a closed set of names (a state, a kind, an outcome), read by `parse`; a name
/// it does not know is corrupt data, not a new value to pass on.
pub(crate) fn named<T>(row: &impl Columns, column: &str, parse: fn(&str) -> Option<T>) -> StoreResult<T> {
    let name = row.text(column)?;
    parse(&name).ok_or_else(|| StoreError::Corrupt(format!("{column} column: unknown name {name:?}")))
}

fn version_of(value: i64) -> StoreResult<i32> {
    i32::try_from(value).map_err(|_| StoreError::Corrupt(format!("endpoint version {value}")))
}

fn u32_opt(value: Option<i64>) -> Option<u32> {
    value.and_then(|v| u32::try_from(v).ok())
}

pub(crate) fn application(row: &impl Columns) -> StoreResult<Application> {
    Ok(Application {
        id: row.id("id")?,
        uid: row.opt_text("uid")?,
        name: row.free_text("name")?,
        rate_limit: u32_opt(row.opt_int("rate_limit")?),
        verify_endpoints: row.flag("verify_endpoints")?,
        payload_retention_days: u32_opt(row.opt_int("payload_retention_period")?),
        metadata: decode_metadata(&row.text("metadata")?)?,
        created_at: row.time("created_at")?,
        updated_at: row.time("updated_at")?,
    })
}

pub(crate) fn event_type(row: &impl Columns) -> StoreResult<EventType> {
    Ok(EventType {
        name: row.text("name")?,
        description: row.free_text("description")?,
        archived: row.flag("archived")?,
        deprecated: row.flag("deprecated")?,
        feature_flag: row.opt_free_text("feature_flag")?,
        feature_flags: decode_list(row.opt_text("feature_flags")?)?,
        group_name: row.opt_free_text("group_name")?,
        schemas: row.opt_free_text("schemas")?,
        created_at: row.time("created_at")?,
        updated_at: row.time("updated_at")?,
    })
}

/// Decode an endpoint, decrypting its secret and headers with `cipher`. Without a cipher they are left
/// empty: for the ingest fan-out, which needs only the subscription fields and should not pay for
/// decryption on the hot path.
pub(crate) fn endpoint(row: &impl Columns, cipher: Option<&SecretCipher>) -> StoreResult<Endpoint> {
    let id = row.id("id")?;
    let (secret, headers) = match cipher {
        Some(cipher) => (
            sealing::open_secret(cipher, &id, &row.text("secret")?)?,
            sealing::open_headers(cipher, &id, &row.text("headers")?)?,
        ),
        None => (String::new(), Headers::new()),
    };
    Ok(Endpoint {
        id,
        app_id: row.id("app_id")?,
        uid: row.opt_text("uid")?,
        url: row.text("url")?,
        description: row.free_text("description")?,
        filter_types: decode_list(row.opt_text("filter_types")?)?,
        channels: decode_list(row.opt_text("channels")?)?,
        disabled: row.flag("disabled")?,
        disabled_reason: row
            .opt_free_text("disabled_reason")?
            .as_deref()
            .map(DisabledReason::parse),
        rate_limit: u32_opt(row.opt_int("rate_limit")?),
        max_concurrency: u32_opt(row.opt_int("max_concurrency")?),
        request_timeout_ms: u32_opt(row.opt_int("request_timeout_ms")?),
        signature_headers: row
            .opt_text("signature_headers")?
            .map(|names| {
                names
                    .parse::<HeaderNames>()
                    .map_err(|e| StoreError::Corrupt(format!("signature_headers column: {e}")))
            })
            .transpose()?,
        ordering: {
            let name = row.text("ordering")?;
            Ordering::parse(&name).ok_or_else(|| StoreError::Corrupt(format!("ordering column: {name:?}")))?
        },
        version: version_of(row.int("version")?)?,
        metadata: decode_metadata(&row.text("metadata")?)?,
        secret,
        headers,
        created_at: row.time("created_at")?,
        updated_at: row.time("updated_at")?,
    })
}

/// Decode a message from columns prefixed `m_` (so it can be joined with other tables).
pub(crate) fn message(row: &impl Columns) -> StoreResult<Message> {
    let payload = row.bytes("m_payload")?;
    Ok(Message {
        id: row.id("m_id")?,
        app_id: row.id("m_app_id")?,
        event_id: row.opt_free_text("m_event_id")?,
        event_type: row.text("m_event_type")?,
        channels: decode_list(row.opt_text("m_channels")?)?,
        payload: Arc::from(payload),
        ordering_key: row.opt_free_text("m_ordering_key")?,
        tags: decode_list(row.opt_text("m_tags")?)?,
        deliver_at: row.opt_time("m_deliver_at")?,
        created_at: row.time("m_created_at")?,
    })
}

/// The column list that [`message`] decodes, for table alias `m`.
pub(crate) const MESSAGE_COLUMNS: &str = "m.id AS m_id, m.app_id AS m_app_id, m.event_id AS m_event_id, \
     m.event_type AS m_event_type, m.channels AS m_channels, m.payload AS m_payload, m.created_at AS m_created_at, \
     m.ordering_key AS m_ordering_key, m.tags AS m_tags, m.deliver_at AS m_deliver_at";

pub(crate) fn attempt(row: &impl Columns) -> StoreResult<Attempt> {
    let trigger = row.int("trigger_type")?;
    Ok(Attempt {
        id: row.id("id")?,
        message_id: row.id("message_id")?,
        endpoint_id: row.id("endpoint_id")?,
        url: row.free_text("url")?,
        attempt_number: u32_opt(Some(row.int("attempt_number")?)).unwrap_or(0),
        success: row.flag("success")?,
        outcome: named(row, "outcome", OutcomeClass::parse)?,
        response_status: row.opt_int("response_status")?.and_then(|s| u16::try_from(s).ok()),
        response: row.free_text("response")?,
        duration_ms: row.int("duration_ms")?,
        trigger: AttemptTrigger::from_code(trigger),
        created_at: row.time("created_at")?,
    })
}

/// A pending delivery about to expire, read with [`crate::events::EXPIRING`].
pub(crate) fn expired(row: &impl Columns) -> StoreResult<crate::events::Expired> {
    let last_attempt = match row.opt_id("last_id")? {
        Some(id) => Some(crate::events::LastAttempt {
            id,
            response_status: row.opt_int("last_status")?.and_then(|s| u16::try_from(s).ok()),
            outcome: named(row, "last_outcome", OutcomeClass::parse)?,
            created_at: row.opt_time("last_at")?.unwrap_or(Millis::EPOCH),
        }),
        None => None,
    };
    Ok(crate::events::Expired {
        seq: row.int("seq")?,
        app_id: row.id("app_id")?,
        message_id: row.id("message_id")?,
        endpoint_id: row.id("endpoint_id")?,
        attempts: u32_opt(Some(row.int("attempts")?)).unwrap_or(0),
        last_attempt,
    })
}

/// A count column (never negative) as `u64`.
fn count_of(row: &impl Columns, column: &str) -> StoreResult<u64> {
    Ok(u64::try_from(row.int(column)?).unwrap_or(0))
}

/// A count as a bind parameter.
pub(crate) fn count_param(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

pub(crate) fn background_task(row: &impl Columns) -> StoreResult<BackgroundTask> {
    Ok(BackgroundTask {
        id: row.id("id")?,
        kind: named(row, "kind", TaskKind::parse)?,
        app_id: row.id("app_id")?,
        state: named(row, "state", TaskState::parse)?,
        processed: count_of(row, "processed")?,
        total: count_of(row, "total")?,
        data: row.text("data")?,
        created_at: row.time("created_at")?,
        updated_at: row.time("updated_at")?,
    })
}

pub(crate) fn remembered(row: &impl Columns) -> StoreResult<crate::Remembered> {
    let status = row.int("status")?;
    Ok(crate::Remembered {
        status: u16::try_from(status).map_err(|_| StoreError::Corrupt(format!("stored status {status}")))?,
        body: row.bytes("body")?,
        request_digest: row.opt_text("request_digest")?,
    })
}

pub(crate) fn app_token(row: &impl Columns) -> StoreResult<AppToken> {
    Ok(AppToken {
        token_sha256: row.text("token_sha256")?,
        app_id: row.id("app_id")?,
        read_only: row.flag("read_only")?,
        sink_id: row.opt_id("sink_id")?,
        session_id: row.opt_text("session_id")?,
        created_at: row.time("created_at")?,
        expires_at: row.time("expires_at")?,
    })
}

pub(crate) fn operational_event(row: &impl Columns) -> StoreResult<OperationalEvent> {
    Ok(OperationalEvent {
        seq: row.int("seq")?,
        event_type: row.text("event_type")?,
        app_id: row.id("app_id")?,
        data: row.text("data")?,
        created_at: row.time("created_at")?,
    })
}

/// Delivery counts from `(status, n)` rows (`status`, `n` columns), as [`DeliveryStats`].
pub(crate) fn delivery_stats<R: Columns>(found: &[R]) -> StoreResult<DeliveryStats> {
    let mut stats = DeliveryStats::default();
    for row in found {
        let n = count_of(row, "n")?;
        match DeliveryStatus::from_code(row.int("status")?) {
            Some(DeliveryStatus::Delivered) => stats.delivered += n,
            Some(DeliveryStatus::Pending) => stats.pending += n,
            Some(DeliveryStatus::Failed | DeliveryStatus::Dead) => stats.failed += n,
            Some(DeliveryStatus::Cancelled) => stats.cancelled += n,
            None => {}
        }
    }
    Ok(stats)
}

/// Of a replay-missing scan's rows (`id`, `event_type`, `channels`, `expunged`, `has_delivery`), the ids of
/// the messages the endpoint subscribes to and never got.
pub(crate) fn missing_for<R: Columns>(endpoint: &Endpoint, found: &[R]) -> StoreResult<Vec<MessageId>> {
    let mut missing = Vec::new();
    for row in found {
        let channels = decode_list(row.opt_text("channels")?)?;
        let wanted = !row.flag("has_delivery")?
            && !row.flag("expunged")?
            && endpoint.subscribes_to(&row.text("event_type")?, channels.as_deref());
        if wanted {
            missing.push(row.id("id")?);
        }
    }
    Ok(missing)
}

/// Attach each record's latest attempt from `latest` (one per message and endpoint).
pub(crate) fn attach_last_attempts(records: &mut [DeliveryRecord], latest: Vec<Attempt>) {
    let mut by_pair: std::collections::HashMap<(MessageId, EndpointId), Attempt> = latest
        .into_iter()
        .map(|a| ((a.message_id.clone(), a.endpoint_id.clone()), a))
        .collect();
    for record in records.iter_mut() {
        record.last_attempt = by_pair.remove(&(record.message.id.clone(), record.endpoint_id.clone()));
    }
}
