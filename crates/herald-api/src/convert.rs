//! Domain records to wire types.

use std::collections::BTreeSet;

use herald_core::clock::Millis;
use herald_core::model::{
    Application, Attempt, AttemptTrigger, BackgroundTask, DeliveryStatus, DisabledReason, Endpoint, EventType,
    HeaderNames, Message, OperationalEvent,
};
use herald_store::{DeliveryRecord, DeliveryView};
use serde_json::value::RawValue;

use crate::model::{
    ApplicationOut, BackgroundTaskOut, EndpointMessageOut, EndpointOut, EventTypeOut, FilterTypesOut, ListResponse,
    MessageAttemptOut, MessageAttemptTriggerType, MessageEndpointOut, MessageOut, MessageStatus, OperationalEventOut,
    ThrottleRateOut, empty_payload,
};

fn set(list: &Option<Vec<String>>) -> Option<BTreeSet<String>> {
    list.as_ref().map(|items| items.iter().cloned().collect())
}

fn rate(limit: Option<u32>) -> ThrottleRateOut {
    ThrottleRateOut(limit.and_then(|l| u16::try_from(l).ok()))
}

/// An application on the wire.
pub(crate) fn application(app: Application) -> ApplicationOut {
    ApplicationOut {
        id: app.id,
        uid: app.uid,
        name: app.name,
        throttle_rate: rate(app.rate_limit),
        verify_endpoints: app.verify_endpoints,
        payload_retention_period: app.payload_retention_days,
        metadata: app.metadata,
        created_at: app.created_at.to_datetime(),
        updated_at: app.updated_at.to_datetime(),
    }
}

/// An event type on the wire.
pub(crate) fn event_type(et: EventType) -> EventTypeOut {
    EventTypeOut {
        name: et.name,
        description: et.description,
        archived: et.archived,
        deprecated: et.deprecated,
        schemas: et.schemas.and_then(|text| serde_json::from_str(&text).ok()),
        feature_flag: et.feature_flag,
        feature_flags: et.feature_flags,
        group_name: et.group_name,
        created_at: et.created_at.to_datetime(),
        updated_at: et.updated_at.to_datetime(),
    }
}

/// An endpoint on the wire (the secret is never part of it).
pub(crate) fn endpoint(ep: Endpoint) -> EndpointOut {
    let key = herald_signature::SigningKey::parse(&ep.secret).ok();
    EndpointOut {
        signature_type: crate::keys::signature_type(key.as_ref()),
        public_key: key.and_then(|k| k.public_key()).map(|k| k.to_whpk()),
        filter_types: FilterTypesOut(set(&ep.filter_types)),
        channels: set(&ep.channels),
        throttle_rate: rate(ep.rate_limit),
        max_concurrency: ep.max_concurrency,
        ordering: ep.ordering.as_str(),
        request_timeout_ms: ep.request_timeout_ms,
        signature_headers: ep.signature_headers.map(HeaderNames::as_str),
        disabled_reason: ep.disabled_reason.map(DisabledReason::into_text),
        health: None,
        id: ep.id,
        uid: ep.uid,
        // Endpoints stored before URL credentials were moved to the sealed headers show them masked.
        url: herald_core::redact::userinfo(&ep.url),
        description: ep.description,
        disabled: ep.disabled,
        metadata: ep.metadata,
        version: u16::try_from(ep.version).unwrap_or(1),
        created_at: ep.created_at.to_datetime(),
        updated_at: ep.updated_at.to_datetime(),
    }
}

/// A message on the wire; `with_content = false` sends `{}` as the payload, as Svix does.
pub(crate) fn message(msg: &Message, with_content: bool) -> MessageOut {
    let payload = if with_content {
        std::str::from_utf8(&msg.payload)
            .ok()
            .and_then(|text| RawValue::from_string(text.to_owned()).ok())
            .unwrap_or_else(empty_payload)
    } else {
        empty_payload()
    };
    MessageOut {
        id: msg.id.clone(),
        event_id: msg.event_id.clone(),
        event_type: msg.event_type.clone(),
        payload,
        channels: set(&msg.channels),
        tags: set(&msg.tags),
        timestamp: msg.created_at.to_datetime(),
        deliver_at: msg.deliver_at.map(Millis::to_datetime),
    }
}

/// An attempt on the wire.
pub(crate) fn attempt(a: Attempt) -> MessageAttemptOut {
    let status = if a.success {
        MessageStatus::Success
    } else {
        MessageStatus::Fail
    };
    MessageAttemptOut {
        id: a.id,
        msg_id: a.message_id,
        endpoint_id: a.endpoint_id,
        url: herald_core::redact::userinfo(&a.url),
        response: a.response,
        // Svix requires an integer; 0 says "no HTTP answer" (timeout, connection error, blocked).
        response_status_code: a.response_status.unwrap_or(0),
        response_duration_ms: a.duration_ms,
        status,
        status_text: status.text(),
        // Svix knows two triggers; a recover is an operator's doing, so it reads as manual there, and the
        // `trigger` extension names it exactly.
        trigger_type: match a.trigger {
            AttemptTrigger::Scheduled => MessageAttemptTriggerType::Scheduled,
            AttemptTrigger::Manual | AttemptTrigger::Recover => MessageAttemptTriggerType::Manual,
        },
        trigger: a.trigger.as_str(),
        outcome: a.outcome.as_str(),
        timestamp: a.created_at.to_datetime(),
        msg: None,
    }
}

/// A delivery status as Svix's integer and as Herald's name.
pub(crate) fn delivery_status(status: DeliveryStatus) -> (MessageStatus, &'static str) {
    match status {
        DeliveryStatus::Pending => (MessageStatus::Pending, "pending"),
        DeliveryStatus::Delivered => (MessageStatus::Success, "delivered"),
        DeliveryStatus::Failed => (MessageStatus::Fail, "failed"),
        DeliveryStatus::Dead => (MessageStatus::Fail, "dead"),
        DeliveryStatus::Cancelled => (MessageStatus::Canceled, "cancelled"),
    }
}

/// The delivery status named `name` (`pending`, `delivered`, `failed`, `dead`, `cancelled`).
pub(crate) fn delivery_status_named(name: &str) -> Option<DeliveryStatus> {
    [
        DeliveryStatus::Pending,
        DeliveryStatus::Delivered,
        DeliveryStatus::Failed,
        DeliveryStatus::Dead,
        DeliveryStatus::Cancelled,
    ]
    .into_iter()
    .find(|status| delivery_status(*status).1 == name)
}

/// A delivery with its message on the wire.
pub(crate) fn endpoint_message(record: DeliveryRecord, with_content: bool) -> EndpointMessageOut {
    let (status, name) = delivery_status(record.status);
    EndpointMessageOut {
        message: message(&record.message, with_content),
        status,
        status_text: status.text(),
        next_attempt: (record.status == DeliveryStatus::Pending).then(|| record.next_attempt_at.to_datetime()),
        endpoint_id: record.endpoint_id,
        delivery_status: name,
        attempts: record.attempts,
        last_attempt: record.last_attempt.map(attempt),
    }
}

/// A background task on the wire.
pub(crate) fn task(task: BackgroundTask) -> BackgroundTaskOut {
    BackgroundTaskOut {
        id: task.id,
        status: task.state.as_str(),
        task: task.kind.as_str(),
        data: serde_json::from_str(&task.data).unwrap_or(serde_json::Value::Null),
        processed: task.processed,
        total: task.total,
        created_at: task.created_at.to_datetime(),
        updated_at: task.updated_at.to_datetime(),
    }
}

/// A message's delivery to one endpoint on the wire.
pub(crate) fn message_endpoint(view: DeliveryView) -> MessageEndpointOut {
    let (status, delivery_status) = delivery_status(view.status);
    MessageEndpointOut {
        endpoint: endpoint(view.endpoint),
        status,
        status_text: status.text(),
        next_attempt: (view.status == DeliveryStatus::Pending).then(|| view.next_attempt_at.to_datetime()),
        delivery_status,
        attempts: view.attempts,
    }
}

/// A store page on the wire.
pub(crate) fn list<T, U>(page: herald_store::Page<T>, f: impl FnMut(T) -> U) -> ListResponse<U> {
    let page = page.map(f);
    ListResponse {
        data: page.items,
        iterator: page.iterator,
        prev_iterator: page.prev_iterator,
        done: page.done,
    }
}

/// An operational event on the wire.
pub(crate) fn operational_event(event: OperationalEvent) -> OperationalEventOut {
    OperationalEventOut {
        id: event.seq.to_string(),
        event_type: event.event_type,
        app_id: event.app_id,
        data: serde_json::from_str(&event.data).unwrap_or(serde_json::Value::Null),
        timestamp: event.created_at.to_datetime(),
    }
}
