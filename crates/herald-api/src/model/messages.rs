//! Messages: the bodies of `/app/{app_id}/msg` and `/msg-batch` (`routes/messages.rs`) and of the
//! precheck (`routes/precheck.rs`).

use std::collections::BTreeSet;

use herald_core::id::MessageId;
use serde_json::value::RawValue;
use time::OffsetDateTime;

use super::apps::ApplicationIn;

/// Body of `POST /api/v1/app/{app_id}/msg`: a message to fan out to the subscribed endpoints.
///
/// Fields that change delivery semantics and that Herald must either implement or refuse with a
/// 422 naming the field (never silently ignore):
/// * `deliverAt` — scheduled delivery: its deliveries' first attempt is due then (at most
///   24 hours ahead, `validate::MAX_SCHEDULE_AHEAD`; a past time means at once);
/// * `transformationsParams` — `rawPayload` replaces the delivered body and `headers` (e.g.
///   `content-type`) change the request; the SDK's `message_in_raw()` sends `payload: {}` with
///   `transformationsParams.rawPayload`, so ignoring it would deliver `{}`;
/// * `application` — implicitly creates the application when the path's id/uid does not exist
///   (ignored by Svix when the application exists).
///
/// `tags` are stored, echoed and indexed for the `tag` filter; they do not change delivery. `payloadRetentionPeriod` and
/// `payloadRetentionHours` set when the retention job expunges the payload.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageIn {
    /// Producer's idempotency id, unique per application (`eventId`).
    #[serde(default)]
    pub event_id: Option<String>,
    /// Event type name (required).
    pub event_type: String,
    /// The webhook body exactly as posted (must be a JSON object; alias `data`).
    #[serde(alias = "data")]
    pub payload: Box<RawValue>,
    /// Channels the message is sent on (1–5 items when present).
    #[serde(default, deserialize_with = "crate::sets::option::<_, 5>")]
    pub channels: Option<BTreeSet<String>>,
    /// Deliveries with the same key go one at a time to endpoints with `ordering: "key"` (Herald
    /// extension; e.g. the id of the resource the event is about).
    #[serde(default)]
    pub ordering_key: Option<String>,
    /// Free-form tags the message can be listed by (at most five, capped as sent).
    #[serde(
        default,
        deserialize_with = "crate::sets::option::<_, { crate::validate::MAX_TAGS }>"
    )]
    pub tags: Option<BTreeSet<String>>,
    /// Create-application-on-the-fly request (changes semantics, see above).
    #[serde(default)]
    pub application: Option<ApplicationIn>,
    /// Transformation parameters incl. `rawPayload` / `headers` (changes semantics, see above).
    #[serde(default)]
    pub transformations_params: Option<serde_json::Value>,
    /// When the deliveries are first attempted (scheduled delivery, see above).
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub deliver_at: Option<OffsetDateTime>,
    /// Payload retention in days: the retention job expunges the payload after that.
    #[serde(default, deserialize_with = "crate::whole::option")]
    pub payload_retention_period: Option<i64>,
    /// Payload retention in hours (exclusive with the period).
    #[serde(default, deserialize_with = "crate::whole::option")]
    pub payload_retention_hours: Option<i64>,
}

impl MessageIn {
    /// Names (wire spelling) of the fields set in this body whose semantics Herald does not
    /// implement yet and must refuse with a 422.
    pub fn unsupported_fields(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.transformations_params.is_some() {
            out.push("transformationsParams");
        }
        out
    }

    /// True when the payload is a JSON object, as Svix requires (and as the SDK's `MessageOut`
    /// needs to parse it back).
    pub fn payload_is_object(&self) -> bool {
        self.payload.get().starts_with('{')
    }
}

/// The payload written back when the caller asked `with_content=false` (SDK 2.x default).
pub fn empty_payload() -> Box<RawValue> {
    RawValue::from_string("{}".to_owned()).expect("`{}` is valid JSON")
}

/// A message as returned by the API. `payload` is required by the SDK and must be an object.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageOut {
    /// Message id (`msg_…`).
    pub id: MessageId,
    /// Producer's idempotency id, if given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    /// Event type name.
    pub event_type: String,
    /// Stored body byte-for-byte, or [`empty_payload`] when `with_content=false`.
    pub payload: Box<RawValue>,
    /// Channels the message was sent on, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channels: Option<BTreeSet<String>>,
    /// Tags of the message, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tags: Option<BTreeSet<String>>,
    /// Ingest time.
    #[serde(with = "time::serde::rfc3339")]
    pub timestamp: OffsetDateTime,
    /// When its deliveries were scheduled for (`deliverAt`), if they were.
    #[serde(skip_serializing_if = "Option::is_none", with = "time::serde::rfc3339::option")]
    pub deliver_at: Option<OffsetDateTime>,
}

/// Body of `POST /app/{app_id}/msg-batch` (Herald extension): many messages in one request.
#[derive(Debug, serde::Deserialize)]
pub struct MessageBatchIn {
    /// The messages, in the order they are to be created (1 to [`MAX_BATCH_MESSAGES`]).
    pub messages: Vec<MessageIn>,
}

/// Most messages one `POST /app/{app_id}/msg-batch` may carry.
pub const MAX_BATCH_MESSAGES: usize = 500;

/// Answer of `POST /app/{app_id}/msg-batch`: one result per message, in the order given.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MessageBatchOut {
    /// The results.
    pub data: Vec<MessageBatchItemOut>,
}

/// One message's result in a [`MessageBatchOut`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct MessageBatchItemOut {
    /// What `POST /app/{app_id}/msg` would have answered for this message alone: 202, or the error's
    /// status.
    pub status: u16,
    /// The message (new, or the one this `eventId` already names), when `status` is 202.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<MessageOut>,
    /// Why the message was not stored, otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<crate::error::ErrorOut>,
}

/// Body of `POST /app/{app_id}/msg/precheck/active` (Svix `MessagePrecheckIn`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessagePrecheckIn {
    /// The event type the message would have.
    pub event_type: String,
    /// The channels it would be sent on, if any.
    #[serde(default)]
    pub channels: Option<BTreeSet<String>>,
}

/// Answer of the precheck (Svix `MessagePrecheckOut`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct MessagePrecheckOut {
    /// Whether any enabled endpoint would get such a message.
    pub active: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn message_in_keeps_payload_bytes_and_flags_unsupported_fields() {
        let body = r#"{"eventId":"evt-1","eventType":"user.signup",
            "payload": {"b": 1.50, "a":"\u00e9"  },"tags":["t"]}"#;
        let m: MessageIn = serde_json::from_str(body).unwrap();
        assert_eq!(m.payload.get(), r#"{"b": 1.50, "a":"\u00e9"  }"#);
        assert!(m.payload_is_object());
        assert_eq!(m.event_id.as_deref(), Some("evt-1"));
        assert!(m.unsupported_fields().is_empty());

        let m: MessageIn = serde_json::from_str(
            r#"{"eventType":"x","data":{},"deliverAt":"2030-01-01T00:00:00Z",
                "transformationsParams":{"rawPayload":"hi"}}"#,
        )
        .unwrap();
        assert_eq!(m.payload.get(), "{}");
        assert_eq!(m.deliver_at, Some(datetime!(2030-01-01 0:00 UTC)));
        assert_eq!(m.unsupported_fields(), vec!["transformationsParams"]);

        let m: MessageIn = serde_json::from_str(r#"{"eventType":"x","payload":[1]}"#).unwrap();
        assert!(!m.payload_is_object());
    }
}
