//! Attempts and deliveries: Svix's status and trigger enums, the attempt listings (`routes/attempts.rs`),
//! a message's endpoints (`routes/messages.rs`) and an endpoint's messages (`routes/operations.rs`).

use herald_core::id::{AttemptId, EndpointId, MessageId};
use serde::de::{Deserialize, Deserializer};
use serde::ser::{Serialize, Serializer};
use time::OffsetDateTime;

use super::endpoints::EndpointOut;
use super::messages::MessageOut;

/// Delivery status, serialized as an integer (0 Success, 1 Pending, 2 Fail, 3 Sending,
/// 4 Canceled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MessageStatus {
    /// Delivered (2xx).
    Success = 0,
    /// Waiting for a (re)try.
    Pending = 1,
    /// Failed for good (terminal 4xx, or retries exhausted).
    Fail = 2,
    /// An attempt is in flight.
    Sending = 3,
    /// Cancelled; Svix only reports it when the caller passes `expanded_statuses=true`
    /// (otherwise it is reported as Success).
    Canceled = 4,
}

impl MessageStatus {
    /// The matching `statusText` value.
    pub fn text(self) -> MessageStatusText {
        match self {
            MessageStatus::Success => MessageStatusText::Success,
            MessageStatus::Pending => MessageStatusText::Pending,
            MessageStatus::Fail => MessageStatusText::Fail,
            MessageStatus::Sending => MessageStatusText::Sending,
            MessageStatus::Canceled => MessageStatusText::Canceled,
        }
    }

    /// Parses the integer form (e.g. the `status` query parameter).
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => MessageStatus::Success,
            1 => MessageStatus::Pending,
            2 => MessageStatus::Fail,
            3 => MessageStatus::Sending,
            4 => MessageStatus::Canceled,
            _ => return None,
        })
    }
}

impl Serialize for MessageStatus {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u8(*self as u8)
    }
}

impl<'de> Deserialize<'de> for MessageStatus {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let code = u8::deserialize(deserializer)?;
        MessageStatus::from_code(code)
            .ok_or_else(|| serde::de::Error::custom(format_args!("invalid message status {code}, expected 0-4")))
    }
}

/// Delivery status as text (`statusText`, required by SDK 2.9.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageStatusText {
    /// `"success"`.
    Success,
    /// `"pending"`.
    Pending,
    /// `"fail"`.
    Fail,
    /// `"sending"`.
    Sending,
    /// `"canceled"`.
    Canceled,
}

/// Why an attempt was made, serialized as an integer (0 Scheduled, 1 Manual).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MessageAttemptTriggerType {
    /// Normal delivery or scheduled retry.
    Scheduled = 0,
    /// Resend requested by a user (resend / replay / recover).
    Manual = 1,
}

impl Serialize for MessageAttemptTriggerType {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u8(*self as u8)
    }
}

impl<'de> Deserialize<'de> for MessageAttemptTriggerType {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match u8::deserialize(deserializer)? {
            0 => Ok(MessageAttemptTriggerType::Scheduled),
            1 => Ok(MessageAttemptTriggerType::Manual),
            other => Err(serde::de::Error::custom(format_args!(
                "invalid trigger type {other}, expected 0 or 1"
            ))),
        }
    }
}

/// One delivery attempt as returned by the attempt listings (all fields but `msg` required).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageAttemptOut {
    /// Attempt id (`atmpt_…`).
    pub id: AttemptId,
    /// Id of the message delivered.
    pub msg_id: MessageId,
    /// Id of the endpoint attempted.
    pub endpoint_id: EndpointId,
    /// URL the attempt was sent to.
    pub url: String,
    /// Response body (capped), or an error description when there was no response.
    pub response: String,
    /// HTTP status of the response; 0 when no response was received.
    pub response_status_code: u16,
    /// Time from sending to the end of the response, in milliseconds.
    pub response_duration_ms: i64,
    /// Outcome of this attempt (integer enum).
    pub status: MessageStatus,
    /// Outcome of this attempt as text; must match `status` (see [`MessageStatus::text`]).
    pub status_text: MessageStatusText,
    /// Why the attempt was made (integer enum).
    pub trigger_type: MessageAttemptTriggerType,
    /// Why the attempt was made: `scheduled`, `manual` (resend) or `recover` (Herald extension).
    pub trigger: &'static str,
    /// Herald extension: the outcome class (`success`, `server_error`, `client_error`, `gone`,
    /// `retryable_client_error`, `unexpected_status`, `timeout`, `connect_error`, `blocked`), which says
    /// *why* an attempt failed when there was no HTTP status to tell
    /// ([`herald_core::outcome::OutcomeClass::as_str`]).
    pub outcome: &'static str,
    /// Time of the attempt.
    #[serde(with = "time::serde::rfc3339")]
    pub timestamp: OffsetDateTime,
    /// The message itself, when the listing was asked to expand it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub msg: Option<MessageOut>,
}

/// An endpoint a message was fanned out to, and where that delivery stands (Svix's
/// `MessageEndpointOut`, plus Herald's `deliveryStatus` and `attempts`).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageEndpointOut {
    /// The endpoint, as `EndpointOut`.
    #[serde(flatten)]
    pub endpoint: EndpointOut,
    /// Svix status: 0 delivered, 1 pending, 2 failed (terminal or dead), 4 cancelled.
    pub status: MessageStatus,
    /// `status` as text.
    pub status_text: MessageStatusText,
    /// When the next attempt is due, while pending.
    #[serde(skip_serializing_if = "Option::is_none", with = "time::serde::rfc3339::option")]
    pub next_attempt: Option<OffsetDateTime>,
    /// Herald extension: `pending`, `delivered`, `failed` (a terminal answer), `dead` (every scheduled
    /// attempt failed) or `cancelled`.
    pub delivery_status: &'static str,
    /// Herald extension: attempts made so far.
    pub attempts: u32,
}

/// A message as attempted to one endpoint (Svix `EndpointMessageOut`), with Herald's delivery fields.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointMessageOut {
    /// The message's fields.
    #[serde(flatten)]
    pub message: MessageOut,
    /// The delivery's status as Svix's integer.
    pub status: MessageStatus,
    /// The same as text.
    pub status_text: MessageStatusText,
    /// When the next attempt is due, while pending.
    #[serde(with = "time::serde::rfc3339::option")]
    pub next_attempt: Option<OffsetDateTime>,
    /// The endpoint (Herald extension).
    pub endpoint_id: EndpointId,
    /// `pending`, `delivered`, `failed`, `dead` or `cancelled` (Herald extension).
    pub delivery_status: &'static str,
    /// Attempts made (Herald extension).
    pub attempts: u32,
    /// The latest attempt, if any (Herald extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_attempt: Option<MessageAttemptOut>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;
    use serde_json::{Value, json};
    use time::macros::datetime;

    use crate::model::common::ListResponse;

    #[test]
    fn message_and_attempt_out_shapes() {
        let msg_id = MessageId::new();
        let endpoint_id = EndpointId::new();
        let msg = MessageOut {
            id: msg_id.clone(),
            event_id: None,
            event_type: "a.b".into(),
            payload: RawValue::from_string(r#"{"x": 1.50}"#.into()).unwrap(),
            channels: None,
            tags: None,
            timestamp: datetime!(2024-05-01 12:00 UTC),
            deliver_at: None,
        };
        let text = serde_json::to_string(&msg).unwrap();
        assert!(text.contains(r#""payload":{"x": 1.50}"#), "{text}");
        assert!(!text.contains("eventId") && !text.contains("deliverAt"));

        let att = MessageAttemptOut {
            id: AttemptId::new(),
            msg_id: msg_id.clone(),
            endpoint_id: endpoint_id.clone(),
            url: "https://x".into(),
            response: "ok".into(),
            response_status_code: 200,
            response_duration_ms: 12,
            status: MessageStatus::Success,
            status_text: MessageStatus::Success.text(),
            trigger_type: MessageAttemptTriggerType::Scheduled,
            trigger: "scheduled",
            outcome: "success",
            timestamp: datetime!(2024-05-01 12:00 UTC),
            msg: None,
        };
        let v = serde_json::to_value(&att).unwrap();
        assert_eq!(v["status"], json!(0));
        assert_eq!(v["statusText"], json!("success"));
        assert_eq!(v["triggerType"], json!(0));
        assert_eq!(v["responseStatusCode"], json!(200));
        assert_eq!(v["responseDurationMs"], json!(12));
        assert_eq!(v["id"], json!(att.id.as_str()));
        assert_eq!(v["msgId"], json!(msg_id.as_str()));
        assert_eq!(v["endpointId"], json!(endpoint_id.as_str()));

        let page = ListResponse {
            data: vec![att],
            iterator: None,
            prev_iterator: None,
            done: true,
        };
        let v = serde_json::to_value(&page).unwrap();
        assert_eq!(v["iterator"], Value::Null);
        assert!(v.as_object().unwrap().contains_key("iterator"));
        assert_eq!(v["prevIterator"], Value::Null);
        assert_eq!(v["done"], json!(true));

        assert_eq!(serde_json::from_str::<MessageStatus>("2").unwrap(), MessageStatus::Fail);
        assert!(serde_json::from_str::<MessageStatus>("9").is_err());
    }
}
