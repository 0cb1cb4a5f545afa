//! The endpoint ownership check (opt-in per application): before a new endpoint receives anything, Herald
//! sends it a signed `webhook.verification` event carrying a random challenge, and enables the endpoint
//! only if it answers 2xx with the challenge in its body (`{"challenge": "…"}` or the bare value).
//!
//! It proves that whoever runs the URL holds the endpoint's secret and agreed to receive webhooks: without
//! it, anyone with API access could aim webhook traffic at a third party's server. The request goes
//! through the same address-checked client as every delivery, so the check itself cannot be used for SSRF.

use herald_core::clock;
use herald_core::id::{EndpointId, MessageId};
use herald_core::model::{DisabledReason, Endpoint};
use herald_core::outcome::AttemptResult;
use herald_signature::SigningKey;
use herald_store::SharedDeliveryStore;

use crate::attempt::signed_headers;
use crate::client::DeliveryClient;

/// How many times one request runs the check when the endpoint is written again while it runs (each run
/// checks the latest URL and key; a client rewriting it faster than it can answer gets its next write's
/// check).
const RUNS: usize = 3;

/// Run the check for an endpoint awaiting it and record its result; the store announces the endpoint's
/// change (so the engine reloads it). The result is recorded only if the endpoint was not written while
/// the check ran (a new URL or key must prove itself, not inherit the old one's pass): then the check runs
/// again on the endpoint as it now is. An endpoint no longer awaiting its check is left alone.
pub(crate) async fn verify(store: &SharedDeliveryStore, client: &DeliveryClient, endpoint_id: &EndpointId) {
    for _ in 0..RUNS {
        let endpoint = match store.get_endpoint_by_id(endpoint_id).await {
            Ok(endpoint) => endpoint,
            Err(error) => {
                tracing::warn!(%error, endpoint = %endpoint_id, "ownership check: endpoint not readable");
                return;
            }
        };
        if endpoint.disabled_reason != Some(DisabledReason::AwaitingVerification) {
            return;
        }
        let verdict = challenge(client, &endpoint).await;
        let (disabled, reason) = match &verdict {
            Ok(()) => (false, None),
            Err(why) => (true, Some(DisabledReason::verification_failed(why))),
        };
        match store
            .set_endpoint_state(
                endpoint_id,
                &DisabledReason::AwaitingVerification,
                endpoint.updated_at,
                disabled,
                reason.as_ref(),
                clock::now(),
            )
            .await
        {
            Ok(true) => {
                tracing::info!(endpoint = %endpoint_id, passed = verdict.is_ok(), "ownership check done");
                return;
            }
            // Written meanwhile: check it as it is now (or find it no longer held).
            Ok(false) => tracing::debug!(endpoint = %endpoint_id, "endpoint changed during its ownership check"),
            Err(error) => {
                tracing::warn!(%error, endpoint = %endpoint_id, "ownership check: recording the result failed");
                return;
            }
        }
    }
}

/// Send the challenge; `Err` says why the endpoint did not pass (never quoting what it answered).
async fn challenge(client: &DeliveryClient, endpoint: &Endpoint) -> Result<(), String> {
    let key = SigningKey::parse(&endpoint.secret).map_err(|_| "the endpoint's secret is invalid".to_owned())?;
    // 128 random bits as hex: nothing in it needs escaping in JSON.
    let token = format!("{:032x}", rand::random::<u128>());
    let payload = format!(r#"{{"type":"webhook.verification","challenge":"{token}"}}"#);
    let id = MessageId::new();
    // Signed with the current key only: the challenge proves the receiver holds it.
    let headers = signed_headers(
        &[&key],
        &endpoint.headers,
        &id,
        payload.as_bytes(),
        clock::now().as_unix_secs(),
        endpoint.signature_headers.unwrap_or_else(|| client.signature_headers()),
    );
    let response = client.post(&endpoint.url, headers, bytes::Bytes::from(payload)).await;
    match response.result {
        AttemptResult::Response { status, .. } if (200..300).contains(&status) => {
            if response.body.contains(&token) {
                Ok(())
            } else {
                Err(format!("the endpoint answered {status} without echoing the challenge"))
            }
        }
        AttemptResult::Response { status, .. } => Err(format!("the endpoint answered {status}")),
        AttemptResult::Timeout => Err("the endpoint did not answer in time".to_owned()),
        AttemptResult::ConnectError => Err("the endpoint could not be reached".to_owned()),
        AttemptResult::Blocked => Err(response.body),
    }
}
