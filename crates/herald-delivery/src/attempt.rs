//! One attempt of one delivery: sign, send, classify, decide the next step, report.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use herald_core::clock::{self, Millis};
use herald_core::id::AttemptId;
use herald_core::model::{Attempt, AttemptTrigger, DeliveryStatus, Endpoint, Headers, Message, PreviousSecret};
use herald_core::outcome::{AttemptResult, NextStep, OutcomeClass, endpoint_hold, next_step};
use herald_core::retry::RetrySchedule;
use herald_core::scheduler::{Finished, Queued, Verdict};
use herald_signature::{HeaderNames, SecretError, SigningKey};
use herald_store::AttemptRecord;
use http::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use tracing::Instrument as _;

use crate::client::{DeliveryClient, Destination, Response};
use crate::metrics::AttemptReport;

/// One delivery as the scheduler holds it.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    /// The delivery's store sequence number.
    pub(crate) seq: i64,
    /// The message, shared by every delivery of its fan-out.
    pub(crate) message: Arc<Message>,
    /// Attempts already made.
    pub(crate) attempts: u32,
    /// When its time window starts (the message's creation, or when it was re-queued).
    pub(crate) window_start: Millis,
    /// Why its next attempt is made.
    pub(crate) trigger: AttemptTrigger,
}

impl Job {
    /// The scheduler's job for a delivery read from the store.
    pub(crate) fn of(delivery: herald_store::PendingDelivery) -> Self {
        Self {
            seq: delivery.seq,
            message: delivery.message,
            attempts: delivery.attempts,
            window_start: delivery.window_start,
            trigger: delivery.trigger,
        }
    }
}

impl Queued for Job {
    fn ordering_key(&self) -> Option<&str> {
        self.message.ordering_key.as_deref()
    }

    fn attempts(&self) -> u32 {
        self.attempts
    }

    fn pending_since(&self) -> Millis {
        self.window_start
    }
}

/// What an attempt tells the engine's loop.
pub(crate) struct Outcome {
    /// How the scheduler should treat the delivery now.
    pub(crate) finished: Finished<Job>,
    /// What the attempt says about the endpoint (for its breaker and `Retry-After` hold).
    pub(crate) verdict: Verdict,
    /// The endpoint answered 410 Gone: pause it at once.
    pub(crate) disable_endpoint: bool,
    /// What the attempt counts for in the endpoint's metrics.
    pub(crate) report: AttemptReport,
}

/// An endpoint's signing keys: the current one, and those it rotated away from, each signing until it
/// expires (so an expiry needs no reload: every attempt picks the keys valid when it signs).
#[derive(Debug)]
pub(crate) struct EndpointKeys {
    current: SigningKey,
    previous: Vec<(SigningKey, Millis)>,
}

impl EndpointKeys {
    /// Parse the stored keys. The current key must parse; a previous one that does not is skipped (and
    /// logged): it only ever signs next to the current one.
    pub(crate) fn parse(endpoint: &Endpoint, previous: &[PreviousSecret]) -> Result<Self, SecretError> {
        let current = SigningKey::parse(&endpoint.secret)?;
        let previous = previous
            .iter()
            .filter_map(|p| match SigningKey::parse(&p.secret) {
                Ok(key) => Some((key, p.expires_at)),
                Err(error) => {
                    tracing::error!(%error, endpoint = %endpoint.id, "a previous signing key is invalid; skipped");
                    None
                }
            })
            .collect();
        Ok(Self { current, previous })
    }

    /// The keys that sign at `now`: the current one first.
    pub(crate) fn signing_at(&self, now: Millis) -> Vec<&SigningKey> {
        std::iter::once(&self.current)
            .chain(
                self.previous
                    .iter()
                    .filter(|(_, expires)| *expires > now)
                    .map(|(key, _)| key),
            )
            .collect()
    }
}

/// Everything one attempt needs.
pub(crate) struct AttemptTask {
    pub(crate) endpoint: Arc<Endpoint>,
    pub(crate) keys: Option<Arc<EndpointKeys>>,
    /// The endpoint's URL, vetted and prepared when its record was loaded.
    pub(crate) destination: Arc<Destination>,
    pub(crate) job: Job,
    pub(crate) client: DeliveryClient,
    pub(crate) schedule: RetrySchedule,
    /// Spans are exported as traces: each attempt's span must enclose its request.
    pub(crate) traced: bool,
}

impl AttemptTask {
    /// The attempt's span; `outcome` and `status` are recorded once known.
    fn span(&self, attempt_number: u32) -> tracing::Span {
        let message = &self.job.message;
        tracing::info_span!(
            "attempt",
            msg = %message.id,
            endpoint = %self.endpoint.id,
            app = %message.app_id,
            attempt = attempt_number,
            outcome = tracing::field::Empty,
            status = tracing::field::Empty,
        )
    }

    /// Make the attempt; returns the record for the attempt log and the outcome for the scheduler.
    pub(crate) async fn run(self) -> (AttemptRecord, Outcome) {
        let message = &self.job.message;
        let started_at = clock::now();
        let attempt_number = self.job.attempts + 1;
        // One span per attempt: its log lines and its trace carry the message, the endpoint and, once
        // known, the outcome, so they join the attempt log and the dashboard on `msg_…`. It encloses the
        // request only when something inside the request may use it — an exported trace, which times
        // the request, or lines at `debug` and below from the HTTP client. Otherwise it is opened after
        // the answer, for the outcome line alone, and not at all when that line is filtered out: a
        // span's fields are formatted when it opens, and a fan-out's successes, logged at `debug`,
        // would pay that for nothing (docs/performance.md).
        let early_span = herald_telemetry::span_wanted(self.traced).then(|| self.span(attempt_number));
        let response = match &self.keys {
            Some(keys) => {
                let headers = signed_headers(
                    &keys.signing_at(started_at),
                    &self.endpoint.headers,
                    &message.id,
                    &message.payload,
                    started_at.as_unix_secs(),
                    self.endpoint
                        .signature_headers
                        .unwrap_or_else(|| self.client.signature_headers()),
                );
                // The body shares the message's bytes: a fan-out or a retry never copies the payload.
                let timeout = self.endpoint.request_timeout_ms.map_or_else(
                    || self.client.default_timeout(),
                    |ms| Duration::from_millis(u64::from(ms)),
                );
                let request = self.client.post_to(
                    &self.destination,
                    headers,
                    Bytes::from_owner(Arc::clone(&message.payload)),
                    timeout,
                );
                match &early_span {
                    Some(span) => request.instrument(span.clone()).await,
                    None => request.await,
                }
            }
            None => Response {
                result: AttemptResult::ConnectError,
                body: "not sent: the endpoint's signing secret is invalid".to_owned(),
                duration: Duration::ZERO,
            },
        };
        let outcome = OutcomeClass::of(&response.result);
        let jitter = rand::random_range(-1.0..=1.0);
        let step = next_step(&response.result, attempt_number, &self.schedule, jitter);
        let finished_at = started_at + response.duration;
        let (status, next_attempt_at, finished, disable_endpoint) = match step {
            NextStep::Delivered => (
                DeliveryStatus::Delivered,
                finished_at,
                Finished::Done(self.job.clone()),
                false,
            ),
            NextStep::Failed { disable_endpoint } => (
                DeliveryStatus::Failed,
                finished_at,
                Finished::Done(self.job.clone()),
                disable_endpoint,
            ),
            NextStep::Dead => (
                DeliveryStatus::Dead,
                finished_at,
                Finished::Done(self.job.clone()),
                false,
            ),
            NextStep::RetryIn(delay) => {
                let due = finished_at + delay;
                let job = Job {
                    attempts: attempt_number,
                    trigger: AttemptTrigger::Scheduled,
                    ..self.job.clone()
                };
                (DeliveryStatus::Pending, due, Finished::RetryAt(due, job), false)
            }
        };
        let verdict = if status == DeliveryStatus::Delivered {
            Verdict::Success
        } else if !outcome.is_health_failure() {
            Verdict::Rejected
        } else {
            let hold = endpoint_hold(&response.result).map(|wait| finished_at + wait);
            Verdict::Failure { hold_until: hold }
        };
        let response_status = match response.result {
            AttemptResult::Response { status, .. } => Some(status),
            _ => None,
        };
        let report = AttemptReport {
            class: outcome,
            duration_ms: finished_at.ms_since(started_at),
            delivered_lag_ms: (status == DeliveryStatus::Delivered)
                .then(|| finished_at.ms_since(self.job.window_start)),
            dead: status == DeliveryStatus::Dead,
        };
        report.record();
        let logged = match status {
            DeliveryStatus::Delivered => tracing::enabled!(tracing::Level::DEBUG),
            DeliveryStatus::Dead => tracing::enabled!(tracing::Level::WARN),
            DeliveryStatus::Failed | DeliveryStatus::Pending | DeliveryStatus::Cancelled => {
                tracing::enabled!(tracing::Level::INFO)
            }
        };
        let span = early_span.or_else(|| logged.then(|| self.span(attempt_number)));
        let span = span.unwrap_or_else(tracing::Span::none);
        span.record("outcome", outcome.as_str());
        if let Some(status) = response_status {
            span.record("status", status);
        }
        span.in_scope(|| match status {
            DeliveryStatus::Delivered => tracing::debug!(duration_ms = report.duration_ms, "delivered"),
            // Named here too: under a `warn` filter the span itself is not recorded.
            DeliveryStatus::Dead => tracing::warn!(
                msg = %message.id,
                endpoint = %self.endpoint.id,
                duration_ms = report.duration_ms,
                "attempt failed; the delivery is dead"
            ),
            DeliveryStatus::Failed => {
                tracing::info!(duration_ms = report.duration_ms, "attempt refused; the delivery failed")
            }
            DeliveryStatus::Pending | DeliveryStatus::Cancelled => {
                tracing::info!(duration_ms = report.duration_ms, "attempt failed; retrying");
            }
        });
        let record = AttemptRecord {
            delivery_seq: self.job.seq,
            app_id: message.app_id.clone(),
            attempt: Attempt {
                id: AttemptId::new(),
                message_id: message.id.clone(),
                endpoint_id: self.endpoint.id.clone(),
                url: without_userinfo(&self.endpoint.url),
                attempt_number,
                success: status == DeliveryStatus::Delivered,
                outcome,
                response_status,
                response: response.body,
                duration_ms: finished_at.ms_since(started_at),
                trigger: self.job.trigger,
                created_at: started_at,
            },
            status,
            next_attempt_at,
        };
        (
            record,
            Outcome {
                finished,
                verdict,
                disable_endpoint,
                report,
            },
        )
    }
}

/// The headers of one request: the endpoint's custom headers, then the Standard Webhooks headers signed
/// by every key given, space-separated (the timestamp, hence the signature, is per attempt), under each
/// set of names `names` asks for (`webhook-*`, `svix-*` or both, the same values in each).
///
/// The API refuses custom headers that would clash with these; they are inserted last all the same, so a
/// custom header can never replace the signature or the content type.
pub fn signed_headers(
    keys: &[&SigningKey],
    custom: &Headers,
    id: &str,
    payload: &[u8],
    timestamp: i64,
    names: HeaderNames,
) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(7 + custom.len());
    for (name, value) in custom {
        // Validated by the API; anything that does not parse (written by other means) is left out.
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(value)) {
            headers.insert(name, value);
        }
    }
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let signatures: Vec<String> = keys.iter().map(|key| key.sign(id, timestamp, payload)).collect();
    let signature = herald_signature::signature_header(&signatures);
    let values = [id.to_owned(), timestamp.to_string(), signature];
    for set in names.sets() {
        for (name, value) in set.iter().zip(&values) {
            // Ids are ASCII by construction, signatures are base64, timestamps digits: these never fail.
            if let Ok(value) = HeaderValue::from_str(value) {
                headers.insert(*name, value);
            }
        }
    }
    headers
}

/// The URL as it may appear in the attempt log: any `user:password@` removed.
fn without_userinfo(url: &str) -> String {
    // Credentials are written `user[:password]@`: a URL without an `@` has none, and is logged as it is
    // without being parsed (a parse is a few percent of the node's CPU in a wide fan-out).
    if !url.contains('@') {
        return url.to_owned();
    }
    match url::Url::parse(url) {
        Ok(mut parsed) if !parsed.username().is_empty() || parsed.password().is_some() => {
            // Both setters only fail for URLs that cannot have credentials, which these just had.
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.to_string()
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_valid_key_signs_and_custom_headers_never_replace_the_signature() {
        let endpoint = Endpoint {
            secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
            ..test_endpoint()
        };
        let previous = [
            PreviousSecret {
                secret: "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD".into(),
                rotated_at: Millis::from_unix_ms(0),
                expires_at: Millis::from_unix_ms(2_000),
            },
            PreviousSecret {
                secret: "not a key!".into(),
                rotated_at: Millis::from_unix_ms(0),
                expires_at: Millis::from_unix_ms(9_000),
            },
        ];
        let keys = EndpointKeys::parse(&endpoint, &previous).unwrap();
        assert_eq!(keys.signing_at(Millis::from_unix_ms(1_999)).len(), 2);
        assert_eq!(
            keys.signing_at(Millis::from_unix_ms(2_000)).len(),
            1,
            "an expired key stops signing"
        );
        let custom = Headers::from([
            ("webhook-signature".to_owned(), "v1,forged".to_owned()),
            ("x-tenant".to_owned(), "acme".to_owned()),
        ]);
        let headers = signed_headers(
            &keys.signing_at(Millis::from_unix_ms(0)),
            &custom,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            b"{\"test\": 2432232314}",
            1614265330,
            HeaderNames::Webhook,
        );
        let signature = headers["webhook-signature"].to_str().unwrap();
        assert!(signature.starts_with("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= v1,"));
        assert_eq!(signature.split(' ').count(), 2);
        assert_eq!(headers["x-tenant"], "acme");
        assert_eq!(headers.get_all("webhook-signature").iter().count(), 1);
        assert!(headers.get("svix-signature").is_none());
    }

    #[test]
    fn svix_names_carry_the_same_values() {
        let key = SigningKey::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let sign = |names| signed_headers(&[&key], &Headers::new(), "msg_1", b"{}", 1614265330, names);
        let svix = sign(HeaderNames::Svix);
        assert!(svix.get("webhook-signature").is_none());
        let both = sign(HeaderNames::Both);
        for (webhook, svix_name) in [
            ("webhook-id", "svix-id"),
            ("webhook-timestamp", "svix-timestamp"),
            ("webhook-signature", "svix-signature"),
        ] {
            assert_eq!(both[webhook], both[svix_name]);
            assert_eq!(svix[svix_name], both[svix_name]);
        }
    }

    fn test_endpoint() -> Endpoint {
        Endpoint {
            id: herald_core::id::EndpointId::new(),
            app_id: herald_core::id::AppId::new(),
            uid: None,
            url: "https://example.com".into(),
            description: String::new(),
            filter_types: None,
            channels: None,
            disabled: false,
            disabled_reason: None,
            rate_limit: None,
            max_concurrency: None,
            ordering: herald_core::model::Ordering::Unordered,
            request_timeout_ms: None,
            signature_headers: None,
            version: 1,
            metadata: Default::default(),
            secret: String::new(),
            headers: Headers::new(),
            created_at: Millis::from_unix_ms(0),
            updated_at: Millis::from_unix_ms(0),
        }
    }

    #[test]
    fn credentials_never_reach_the_attempt_log() {
        assert_eq!(
            without_userinfo("https://user:pass@example.com/hook"),
            "https://example.com/hook"
        );
        assert_eq!(without_userinfo("https://token@example.com/"), "https://example.com/");
        assert_eq!(
            without_userinfo("https://example.com/a?b=c"),
            "https://example.com/a?b=c"
        );
    }
}
