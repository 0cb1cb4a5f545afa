//! Operational events, backend-neutral: what each change reports ([`NewEvent`]) and which events a batch
//! of attempt results causes ([`attempt_events`]). Each backend records them in the transaction of the
//! change they report, so an event exists if and only if its change committed; the `operational_event`
//! table doubles as the outbox the operational webhook's sender reads (`sent_at IS NULL` until sent).

use std::collections::HashSet;

use herald_core::clock::Millis;
use herald_core::id::{AppId, AttemptId, EndpointId, MessageId};
use herald_core::model::{Attempt, DeliveryStatus, Endpoint};
use herald_core::outcome::OutcomeClass;
use serde_json::{Value, json};

use crate::AttemptRecord;

/// A delivery's attempt number whose failure is reported (Svix: "failed 4 times").
pub(crate) const FAILING_AFTER_ATTEMPTS: u32 = 4;

pub(crate) const ENDPOINT_CREATED: &str = "endpoint.created";
pub(crate) const ENDPOINT_UPDATED: &str = "endpoint.updated";
pub(crate) const ENDPOINT_DELETED: &str = "endpoint.deleted";
pub(crate) const ENDPOINT_DISABLED: &str = "endpoint.disabled";
pub(crate) const ATTEMPT_FAILING: &str = "message.attempt.failing";
pub(crate) const ATTEMPT_EXHAUSTED: &str = "message.attempt.exhausted";
pub(crate) const ATTEMPT_RECOVERED: &str = "message.attempt.recovered";

/// An event to record.
pub(crate) struct NewEvent {
    pub(crate) event_type: &'static str,
    pub(crate) app_id: AppId,
    /// Set for events about one delivery.
    pub(crate) message_id: Option<MessageId>,
    pub(crate) endpoint_id: Option<EndpointId>,
    pub(crate) data: Value,
    pub(crate) created_at: Millis,
}

impl NewEvent {
    /// An `endpoint.*` event; `extra` fields are added to the data.
    pub(crate) fn endpoint(event_type: &'static str, endpoint: &Endpoint, extra: Value, now: Millis) -> Self {
        Self::about_endpoint(
            event_type,
            &endpoint.app_id,
            &endpoint.id,
            endpoint.uid.as_deref(),
            extra,
            now,
        )
    }

    pub(crate) fn about_endpoint(
        event_type: &'static str,
        app_id: &AppId,
        endpoint_id: &EndpointId,
        endpoint_uid: Option<&str>,
        extra: Value,
        now: Millis,
    ) -> Self {
        let mut data = json!({ "appId": app_id, "endpointId": endpoint_id });
        if let Some(uid) = endpoint_uid {
            data["endpointUid"] = json!(uid);
        }
        merge(&mut data, extra);
        Self {
            event_type,
            app_id: app_id.clone(),
            message_id: None,
            endpoint_id: Some(endpoint_id.clone()),
            data,
            created_at: now,
        }
    }

    /// A `message.attempt.*` event about the delivery an attempt belongs to.
    pub(crate) fn attempt(event_type: &'static str, record: &AttemptRecord, extra: Value) -> Self {
        let a = &record.attempt;
        let finished = a.finished_at();
        let mut data = json!({
            "appId": record.app_id,
            "endpointId": a.endpoint_id,
            "msgId": a.message_id,
            "attempts": a.attempt_number,
            "lastAttempt": LastAttempt::of(a).json(),
        });
        merge(&mut data, extra);
        Self {
            event_type,
            app_id: record.app_id.clone(),
            message_id: Some(a.message_id.clone()),
            endpoint_id: Some(a.endpoint_id.clone()),
            data,
            created_at: finished,
        }
    }
}

/// A pending delivery that dies without a final attempt: its time window ended while it waited (its
/// endpoint paused, its breaker open, or held by a `Retry-After`), as the backends read it back in the
/// transaction that marks it dead.
pub(crate) struct Expired {
    pub(crate) seq: i64,
    pub(crate) app_id: AppId,
    pub(crate) message_id: MessageId,
    pub(crate) endpoint_id: EndpointId,
    /// Attempts the delivery made in its window.
    pub(crate) attempts: u32,
    /// The latest attempt of this message to this endpoint, if one was ever made (and is still kept).
    pub(crate) last_attempt: Option<LastAttempt>,
}

/// What an event says of an attempt.
pub(crate) struct LastAttempt {
    pub(crate) id: AttemptId,
    pub(crate) response_status: Option<u16>,
    pub(crate) outcome: OutcomeClass,
    pub(crate) created_at: Millis,
}

impl LastAttempt {
    fn of(attempt: &Attempt) -> Self {
        Self {
            id: attempt.id.clone(),
            response_status: attempt.response_status,
            outcome: attempt.outcome,
            created_at: attempt.created_at,
        }
    }

    fn json(&self) -> Value {
        json!({
            "id": self.id,
            "responseStatusCode": self.response_status.unwrap_or(0),
            "outcome": self.outcome.as_str(),
            "timestamp": rfc3339(self.created_at),
        })
    }
}

/// How many of an endpoint's oldest pending deliveries one expiry pass examines.
///
/// Expiry walks the head of the endpoint's pending queue (an index on `(endpoint_id, seq)` of the pending
/// rows: SQLite's `delivery_pending`, PostgreSQL's `delivery_endpoint_status` at `status = 0`), never
/// the whole backlog: windows start in `seq` order (a message's creation), so the expired deliveries are
/// the head, and a pass that finds some removes them and looks at the new head. Scanning a backlog of a
/// million deliveries on every sweep held SQLite's single writer for seconds, stalling every other
/// endpoint's ingest. (A re-queued delivery keeps its old `seq` with a later window, so only a head made
/// wholly of re-queued, unexpired deliveries would hide expired ones behind it until those settle.)
pub(crate) const EXPIRY_SCAN: i64 = 500;

/// One expiry pass over an endpoint's pending head (both dialects): [`EXPIRING`] rows among its
/// [`EXPIRY_SCAN`] oldest pending deliveries whose window started before the cutoff. The arguments are the
/// placeholders, in the order they appear, of the endpoint id (twice), the scan size and the cutoff.
pub(crate) fn expiring_head(endpoint: &str, endpoint_again: &str, scan: &str, cutoff: &str) -> String {
    format!(
        "{EXPIRING} AND d.endpoint_id = {endpoint} AND d.seq IN (SELECT seq FROM delivery \
         WHERE endpoint_id = {endpoint_again} AND status = 0 ORDER BY seq LIMIT {scan}) \
         AND COALESCE(d.window_start, m.created_at) < {cutoff}"
    )
}

/// The SELECT (both dialects) that reads pending deliveries about to expire as [`Expired`] rows (decoded
/// by `rows::expired`); the caller appends its conditions on `d` and `m`. The latest attempt comes from
/// the `(message_id, id)` attempt index.
pub(crate) const EXPIRING: &str = "SELECT d.seq, d.message_id, d.endpoint_id, d.attempts, m.app_id, \
     a.id AS last_id, a.response_status AS last_status, a.outcome AS last_outcome, a.created_at AS last_at \
     FROM delivery d JOIN message m ON m.id = d.message_id \
     LEFT JOIN attempt a ON a.message_id = d.message_id AND a.id = \
     (SELECT MAX(x.id) FROM attempt x WHERE x.message_id = d.message_id AND x.endpoint_id = d.endpoint_id) \
     WHERE d.status = 0";

/// The `message.attempt.exhausted` events of deliveries that died of old age, at `now`. They say so
/// (`reason: "expired"`), and name the latest attempt when there was one.
pub(crate) fn expired_events(expired: &[Expired], now: Millis) -> Vec<NewEvent> {
    expired
        .iter()
        .map(|e| {
            let mut data = json!({
                "appId": e.app_id,
                "endpointId": e.endpoint_id,
                "msgId": e.message_id,
                "attempts": e.attempts,
                "deliveryStatus": "dead",
                "reason": "expired",
            });
            if let Some(last) = &e.last_attempt {
                data["lastAttempt"] = last.json();
            }
            NewEvent {
                event_type: ATTEMPT_EXHAUSTED,
                app_id: e.app_id.clone(),
                message_id: Some(e.message_id.clone()),
                endpoint_id: Some(e.endpoint_id.clone()),
                data,
                created_at: now,
            }
        })
        .collect()
}

fn merge(data: &mut Value, extra: Value) {
    if let (Some(target), Value::Object(extra)) = (data.as_object_mut(), extra) {
        target.extend(extra);
    }
}

/// A time as RFC 3339 (what the API shows everywhere).
pub(crate) fn rfc3339(at: Millis) -> String {
    at.to_rfc3339().unwrap_or_default()
}

/// Whether a batch of attempt results may record an operational event: it holds a failure (`failing`,
/// `exhausted`) or a success that may be a recovery ([`may_recover`]). A batch of first-try successes
/// records none.
pub(crate) fn may_record_events(records: &[AttemptRecord]) -> bool {
    records.iter().any(|r| !r.attempt.success) || !may_recover(records).is_empty()
}

/// The successes of a batch that may be recoveries: a later attempt, or the first attempt of a re-queued
/// delivery (resend, recover). Only these need the backend to look up earlier trouble, so the common
/// first-try success costs nothing.
pub(crate) fn may_recover(records: &[AttemptRecord]) -> Vec<&AttemptRecord> {
    records
        .iter()
        .filter(|r| r.attempt.success && (r.attempt.attempt_number > 1 || r.attempt.trigger.code() != 0))
        .collect()
}

/// The `message.attempt.*` events a batch of attempt results causes, given the (message, endpoint) pairs
/// with a `failing` or `exhausted` event newer than their latest `recovered` one ([`may_recover`]'s pairs
/// looked up by the backend): a success is `recovered` exactly when operators heard of the trouble.
pub(crate) fn attempt_events(
    records: &[AttemptRecord],
    mut troubled: HashSet<(MessageId, EndpointId)>,
) -> Vec<NewEvent> {
    let mut events = Vec::new();
    for record in records {
        let a = &record.attempt;
        let pair = (a.message_id.clone(), a.endpoint_id.clone());
        if a.success {
            if troubled.remove(&pair) {
                events.push(NewEvent::attempt(ATTEMPT_RECOVERED, record, json!({})));
            }
            continue;
        }
        if a.attempt_number == FAILING_AFTER_ATTEMPTS {
            events.push(NewEvent::attempt(ATTEMPT_FAILING, record, json!({})));
            troubled.insert(pair.clone());
        }
        let ended = match record.status {
            DeliveryStatus::Dead => Some("dead"),
            DeliveryStatus::Failed => Some("failed"),
            _ => None,
        };
        if let Some(status) = ended {
            events.push(NewEvent::attempt(
                ATTEMPT_EXHAUSTED,
                record,
                json!({ "deliveryStatus": status }),
            ));
            troubled.insert(pair);
        }
    }
    events
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use herald_core::clock::Millis;
    use herald_core::id::{AppId, AttemptId};
    use herald_core::model::{Attempt, AttemptTrigger, DeliveryStatus};
    use herald_core::outcome::OutcomeClass;

    /// An attempt result: the attempt `attempt_number` of a delivery, a success or a `500`, made for
    /// `trigger`.
    pub(crate) fn record(attempt_number: u32, success: bool, trigger: AttemptTrigger) -> AttemptRecord {
        AttemptRecord {
            delivery_seq: 1,
            app_id: AppId::new(),
            attempt: Attempt {
                id: AttemptId::new(),
                message_id: MessageId::new(),
                endpoint_id: EndpointId::new(),
                url: "https://example.com/hook".into(),
                attempt_number,
                success,
                outcome: if success {
                    OutcomeClass::Success
                } else {
                    OutcomeClass::ServerError
                },
                response_status: Some(if success { 200 } else { 500 }),
                response: String::new(),
                duration_ms: 3,
                trigger,
                created_at: Millis::from_unix_ms(1),
            },
            status: if success {
                DeliveryStatus::Delivered
            } else {
                DeliveryStatus::Pending
            },
            next_attempt_at: Millis::from_unix_ms(1),
        }
    }

    #[test]
    fn only_a_batch_of_first_try_successes_records_no_event() {
        let first_try = || record(1, true, AttemptTrigger::Scheduled);
        assert!(!may_record_events(&[first_try(), first_try()]));
        assert!(may_record_events(&[
            first_try(),
            record(1, false, AttemptTrigger::Scheduled)
        ]));
        assert!(may_record_events(&[
            first_try(),
            record(2, true, AttemptTrigger::Scheduled)
        ]));
        assert!(may_record_events(&[record(1, true, AttemptTrigger::Manual)]));
    }
}
