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
use sha2::{Digest, Sha256};
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

/// The `webhook-id` of an event: `opevt_{seq}_{digest}`, the digest (16 hex digits) of what the event
/// says — its type, application, data and time. Every send of the event carries the same id; another
/// event never does, even one that takes the `seq` of an event a crash took back after it was sent (a
/// database whose last commits may be lost, such as PostgreSQL with `synchronous_commit = off`), which
/// receivers, deduplicating on the id, would otherwise drop. Its time alone would not tell them apart: an
/// attempt's event carries the attempt's end, which may be from before the crash. Only an event that says
/// exactly what the lost one said gets its id again — the receiver has that one already.
pub fn webhook_id(event: &OperationalEvent) -> String {
    let mut digest = Sha256::new();
    for part in [
        event.event_type.as_bytes(),
        event.app_id.as_bytes(),
        event.data.as_bytes(),
    ] {
        // Each part with its length, so that no two events' parts run together into the same bytes.
        digest.update((part.len() as u64).to_be_bytes());
        digest.update(part);
    }
    digest.update(event.created_at.as_unix_ms().to_be_bytes());
    let digest = digest.finalize();
    let short: String = digest.iter().take(8).map(|byte| format!("{byte:02x}")).collect();
    format!("opevt_{}_{short}", event.seq)
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

    fn event(seq: i64, created_ms: i64, data: &str) -> OperationalEvent {
        OperationalEvent {
            seq,
            event_type: "message.attempt.failing".to_owned(),
            app_id: AppId::parse("app_2bTGkCsR1a4fBNhgvuXyZ0").expect("an application id"),
            data: data.to_owned(),
            created_at: Millis::from_unix_ms(created_ms),
        }
    }

    #[test]
    fn an_event_keeps_its_id_and_another_with_its_seq_gets_another() {
        let sent = event(42, 1_767_225_600_000, r#"{"endpointId":"ep_1","attempts":1}"#);
        let id = webhook_id(&sent);
        assert_eq!(id, webhook_id(&sent.clone()), "every send carries the same id");
        assert!(
            id.starts_with("opevt_42_") && id.len() == "opevt_42_".len() + 16,
            "{id}"
        );
        // A crash took the sent event back; seq 42 went to the next event recorded: an attempt that
        // ended at the same millisecond, on another endpoint ...
        let same_time = event(42, 1_767_225_600_000, r#"{"endpointId":"ep_2","attempts":1}"#);
        assert_ne!(id, webhook_id(&same_time));
        // ... or the same report, later.
        let later = event(42, 1_767_225_607_250, r#"{"endpointId":"ep_1","attempts":1}"#);
        assert_ne!(id, webhook_id(&later));
    }
}
