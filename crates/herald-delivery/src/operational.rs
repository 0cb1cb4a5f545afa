//! The operational webhook: every operational event (`endpoint.disabled`, `message.attempt.exhausted`, …)
//! is pushed to one URL the operator configured, signed like any webhook.
//!
//! The store records each event in the transaction of the change it reports, and its table is the outbox:
//! this task reads the events not yet sent, oldest first, sends each one (retrying with backoff until the
//! receiver answers 2xx), and only then marks it sent. A crash between sending and marking sends the event
//! again after restart — at least once, with the same `webhook-id` ([`webhook_id`]), so receivers
//! deduplicate as for any webhook. Events go one at a time, in order: a receiver that is down holds back the later
//! events rather than getting them out of order.
//!
//! Requests go through the same address-checked [`DeliveryClient`] as deliveries: the operator's URL gets
//! no exemption from the SSRF policy.

use std::time::Duration;

use bytes::Bytes;
use herald_core::clock;
use herald_core::model::OperationalEvent;
use herald_core::outcome::OutcomeClass;
use herald_signature::HmacSecret;
use herald_store::SharedDeliveryStore;
use serde_json::json;
use tokio::task::JoinHandle;

use crate::attempt::signed_headers;
use crate::client::DeliveryClient;

/// Where and how operational events are sent.
#[derive(Clone)]
pub struct OperationalWebhookConfig {
    /// The receiver's URL.
    pub url: String,
    /// The key the requests are signed with (`whsec_…`).
    pub secret: HmacSecret,
    /// How often the outbox is read when it was empty.
    pub poll: Duration,
}

/// Events read per outbox query.
const BATCH: usize = 100;
/// The first wait after a failed send; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// The longest wait between two sends of one event.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Start the sender.
pub fn spawn(store: SharedDeliveryStore, client: DeliveryClient, config: OperationalWebhookConfig) -> JoinHandle<()> {
    tokio::spawn(run(store, client, config))
}

async fn run(store: SharedDeliveryStore, client: DeliveryClient, config: OperationalWebhookConfig) {
    // Only unsent events are read, so starting from the beginning costs nothing after the first batch.
    let mut after = 0;
    loop {
        let batch = match store.unsent_operational_events(after, BATCH).await {
            Ok(batch) => batch,
            Err(error) => {
                tracing::warn!(%error, "reading operational events failed; retrying");
                tokio::time::sleep(config.poll).await;
                continue;
            }
        };
        if batch.is_empty() {
            tokio::time::sleep(config.poll).await;
            continue;
        }
        for event in batch {
            deliver(&store, &client, &config, &event).await;
            after = event.seq;
        }
    }
}

/// The body of an event's webhook, as Svix's operational webhooks: `{type, timestamp, data}`.
pub fn payload(event: &OperationalEvent) -> String {
    let data: serde_json::Value = serde_json::from_str(&event.data).unwrap_or_else(|_| json!({}));
    let timestamp = event.created_at.to_rfc3339();
    json!({ "type": event.event_type, "timestamp": timestamp, "data": data }).to_string()
}

/// The `webhook-id` of an event: `opevt_{seq}_{created_at in ms}`, the same at every send of the event,
/// and never that of another event. The `seq` alone would not do: an event can be sent as soon as it is
/// visible, and one that a crash takes back afterwards (a store whose last commits may be lost, such as
/// PostgreSQL with `synchronous_commit = off`) leaves its `seq` to the next event recorded — which
/// receivers, deduplicating on the id, would drop. That next event is recorded after the restart, so at
/// another millisecond.
pub fn webhook_id(event: &OperationalEvent) -> String {
    format!("opevt_{}_{}", event.seq, event.created_at.as_unix_ms())
}

/// Send one event until the receiver takes it (or refuses it for good), then mark it sent.
async fn deliver(
    store: &SharedDeliveryStore,
    client: &DeliveryClient,
    config: &OperationalWebhookConfig,
    event: &OperationalEvent,
) {
    let body = Bytes::from(payload(event));
    let id = webhook_id(event);
    let mut wait = FIRST_BACKOFF;
    loop {
        // Signed per attempt: the timestamp is part of the signature and must be fresh.
        // Operational webhooks are signed like endpoints (HMAC), with no custom headers.
        let key = herald_signature::SigningKey::from(config.secret.clone());
        let headers = signed_headers(
            &[&key],
            &Default::default(),
            &id,
            &body,
            clock::now().as_unix_secs(),
            client.signature_headers(),
        );
        let response = client.post(&config.url, headers, body.clone()).await;
        let class = OutcomeClass::of(&response.result);
        if class == OutcomeClass::Success {
            break;
        }
        if !class.is_retryable() {
            // A 4xx says the receiver will never take these bytes: sending them again cannot help.
            tracing::error!(event = %id, kind = %event.event_type, outcome = class.as_str(), response = %response.body,
                "the operational webhook refused an event; it is not sent again");
            break;
        }
        tracing::warn!(event = %id, outcome = class.as_str(), response = %response.body, retry_in = ?wait,
            "sending an operational event failed; retrying");
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(MAX_BACKOFF);
    }
    let mut retry = FIRST_BACKOFF;
    while let Err(error) = store.mark_operational_event_sent(event.seq, clock::now()).await {
        // Unmarked, it would be sent again after a restart (at least once); keep trying meanwhile.
        tracing::warn!(%error, event = %id, "marking an operational event sent failed; retrying");
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(MAX_BACKOFF);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::clock::Millis;
    use herald_core::id::AppId;

    fn event(seq: i64, created_ms: i64) -> OperationalEvent {
        OperationalEvent {
            seq,
            event_type: "endpoint.disabled".to_owned(),
            app_id: AppId::new(),
            data: "{}".to_owned(),
            created_at: Millis::from_unix_ms(created_ms),
        }
    }

    #[test]
    fn an_event_keeps_its_id_and_a_reused_seq_gets_another() {
        let sent = event(42, 1_767_225_600_000);
        assert_eq!(webhook_id(&sent), webhook_id(&sent.clone()));
        assert_eq!(webhook_id(&sent), "opevt_42_1767225600000");
        // The event a crash took back left seq 42 to one recorded after the restart.
        let after_restart = event(42, 1_767_225_607_250);
        assert_ne!(webhook_id(&sent), webhook_id(&after_restart));
    }
}
