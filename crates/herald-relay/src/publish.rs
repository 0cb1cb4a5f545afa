//! Publishing a row through the Svix-compatible API: `POST /api/v1/app/{app}/msg` with `eventId` = the
//! row's event id, so that publishing a row twice (after a crash between publish and delete) is answered
//! with the original message and adds nothing.
//!
//! Where the server offers it (its OpenAPI document lists [`BATCH_PATH`]: Herald does, Svix does not),
//! many rows of one app go in one `POST /api/v1/app/{app}/msg-batch`, answered per row; each still
//! carries its `eventId`, so a repeated batch adds nothing either.

use std::time::Duration;

use reqwest::StatusCode;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::row::OutboxRow;

/// What became of one publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Published {
    /// Herald holds the message (new, or the one it already had for this event id).
    Accepted,
    /// Herald refused this row for good (unknown app, invalid event type or payload…): it is marked with
    /// the reason and never retried by itself.
    Rejected(String),
}

/// A publish that failed for a reason that is not the row's: try it again later.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Transient {
    /// No answer (connection refused, reset, timed out).
    #[error("Herald at {url} is unreachable: {detail}")]
    Unreachable {
        /// Herald's base URL.
        url: String,
        /// What failed.
        detail: String,
    },
    /// An answer that says "not now" (5xx, 429, 408) or "not you" (401, 403: the token is wrong, which is
    /// no row's fault).
    #[error("Herald at {url} answered {status}: {detail}")]
    Refused {
        /// Herald's base URL.
        url: String,
        /// The status.
        status: u16,
        /// The answer's `detail`, or its start.
        detail: String,
    },
}

/// The body of `POST /app/{app}/msg`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MessageIn<'a> {
    event_type: &'a str,
    event_id: &'a str,
    payload: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    channels: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ordering_key: Option<&'a str>,
}

/// The batch call's path in the server's OpenAPI document.
pub const BATCH_PATH: &str = "/api/v1/app/{app_id}/msg-batch";

/// The body of `POST /app/{app}/msg-batch`.
#[derive(Serialize)]
struct BatchIn<'a> {
    messages: Vec<&'a RawValue>,
}

/// The answer of `POST /app/{app}/msg-batch`: one result per message, in order.
#[derive(serde::Deserialize)]
struct BatchOut {
    data: Vec<BatchItemOut>,
}

#[derive(serde::Deserialize)]
struct BatchItemOut {
    status: u16,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

/// What became of a batch request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchPublished {
    /// The server answered each row (in the order given).
    Each(Vec<Result<Published, Transient>>),
    /// The server refused the request as a whole for a reason of its content (400, 413, 422: a row it
    /// would refuse, or a body too large for it): publish these rows one by one to learn which.
    OneByOne,
}

/// A client of one Herald (or any Svix-compatible server).
pub struct Publisher {
    http: reqwest::Client,
    base: String,
    api: String,
    token: String,
    /// Whether the server offers [`BATCH_PATH`], once known (`None`: not asked yet, or the question
    /// failed; `Some(false)` also when the relay is told to publish one row per request).
    batch: tokio::sync::OnceCell<bool>,
}

/// Why a publisher could not be built.
#[derive(Debug, thiserror::Error)]
#[error("building the HTTP client: {0}")]
pub struct ClientError(#[from] reqwest::Error);

impl Publisher {
    /// A publisher to the server at `base` (`http://herald:8040`), authenticating with `token`, keeping up
    /// to `connections` keep-alive connections; a publish taking longer than `timeout` is retried.
    pub fn new(base: &str, token: &str, connections: usize, timeout: Duration) -> Result<Self, ClientError> {
        // reqwest is built without a default TLS provider: https servers need one (a no-op if installed).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(connections)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .timeout(timeout)
            .build()?;
        let base = base.trim_end_matches('/').to_owned();
        Ok(Self {
            http,
            api: format!("{base}/api/v1"),
            // Only shown (logs, errors): a password in it (for a proxy in front of Herald) is masked.
            base: herald_core::redact::url(&base),
            token: token.to_owned(),
            batch: tokio::sync::OnceCell::new(),
        })
    }

    /// Never publish more than one row per request.
    pub fn one_per_request(self) -> Self {
        Self {
            batch: tokio::sync::OnceCell::new_with(Some(false)),
            ..self
        }
    }

    /// Whether the server takes many messages per request: asked once, from its OpenAPI document. A
    /// server that cannot be asked now (unreachable) is asked again next time; one whose document cannot
    /// be read or does not list the batch call is published to one row per request.
    pub async fn offers_batch(&self) -> bool {
        if let Some(known) = self.batch.get() {
            return *known;
        }
        let asked = self
            .http
            .get(format!("{}/openapi.json", self.api))
            .bearer_auth(&self.token)
            .send()
            .await;
        let offered = match asked {
            Err(_) => return false,
            Ok(answer) if answer.status().is_server_error() => return false,
            Ok(answer) if answer.status().is_success() => {
                let document: Option<serde_json::Value> = answer.json().await.ok();
                document.as_ref().is_some_and(lists_batch)
            }
            Ok(_) => false,
        };
        tracing::info!(herald = %self.base, batch = offered, "publishing {}", if offered { "many rows per request (msg-batch)" } else { "one row per request" });
        *self.batch.get_or_init(|| async { offered }).await
    }

    /// Publish rows of one app in one request, in the order given.
    pub async fn publish_batch(&self, app: &str, rows: &[&OutboxRow]) -> Result<BatchPublished, Transient> {
        let bodies: Result<Vec<Box<RawValue>>, String> = rows
            .iter()
            .map(|row| body(row).and_then(|b| RawValue::from_string(b).map_err(|e| format!("encoding: {e}"))))
            .collect();
        // A row that can never be JSON is refused row by row (with its reason); its batch goes that way.
        let Ok(bodies) = bodies else {
            return Ok(BatchPublished::OneByOne);
        };
        let body = serde_json::to_string(&BatchIn {
            messages: bodies.iter().map(AsRef::as_ref).collect(),
        })
        .map_err(|e| self.malformed(StatusCode::OK, &format!("encoding the batch: {e}")))?;
        let url = format!("{}/app/{}/msg-batch?with_content=false", self.api, path_segment(app));
        let answer = self.send(url, body).await?;
        let status = answer.status();
        let text = answer.text().await.unwrap_or_default();
        if status.is_success() {
            let parsed: BatchOut = serde_json::from_str(&text).map_err(|e| self.malformed(status, &e.to_string()))?;
            if parsed.data.len() != rows.len() {
                let why = format!("{} results for {} messages", parsed.data.len(), rows.len());
                return Err(self.malformed(status, &why));
            }
            return Ok(BatchPublished::Each(
                parsed.data.into_iter().map(|item| self.outcome(item)).collect(),
            ));
        }
        if retryable(status) {
            return Err(Transient::Refused {
                url: self.base.clone(),
                status: status.as_u16(),
                detail: detail_of(&text),
            });
        }
        // The rows' fault (a row Herald refuses, a body too large, an unknown app): row by row, each row
        // gets its own answer.
        Ok(BatchPublished::OneByOne)
    }

    /// One row's result in a batch answer.
    fn outcome(&self, item: BatchItemOut) -> Result<Published, Transient> {
        let status = StatusCode::from_u16(item.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_success() {
            return Ok(Published::Accepted);
        }
        let detail = item.error.map(|e| detail_of(&e.to_string())).unwrap_or_default();
        self.refused(status, detail)
    }

    /// A refusal by the server: worth another try later (`Transient`), or final for that row.
    fn refused(&self, status: StatusCode, detail: String) -> Result<Published, Transient> {
        if retryable(status) {
            Err(Transient::Refused {
                url: self.base.clone(),
                status: status.as_u16(),
                detail,
            })
        } else {
            Ok(Published::Rejected(format!("{}: {detail}", status.as_u16())))
        }
    }

    fn malformed(&self, status: StatusCode, why: &str) -> Transient {
        Transient::Refused {
            url: self.base.clone(),
            status: status.as_u16(),
            detail: format!("unreadable batch answer: {why}"),
        }
    }

    /// POST `body` (JSON) to `url`.
    async fn send(&self, url: String, body: String) -> Result<reqwest::Response, Transient> {
        self.http
            .post(url)
            .bearer_auth(&self.token)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| Transient::Unreachable {
                url: self.base.clone(),
                // reqwest's text names the URL as given, password and all; `url` shows it masked.
                detail: herald_core::error_text::with_causes(&e.without_url()),
            })
    }

    /// The server's base URL, as logs and errors show it (a password masked).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Publish one row.
    pub async fn publish(&self, row: &OutboxRow) -> Result<Published, Transient> {
        let body = match body(row) {
            Ok(body) => body,
            Err(reason) => return Ok(Published::Rejected(reason)),
        };
        let url = format!("{}/app/{}/msg", self.api, path_segment(&row.app));
        let answer = self.send(url, body).await?;
        let status = answer.status();
        if status.is_success() {
            return Ok(Published::Accepted);
        }
        let text = answer.text().await.unwrap_or_default();
        self.refused(status, detail_of(&text))
    }
}

/// The JSON body for a row, or why the row can never be published.
fn body(row: &OutboxRow) -> Result<String, String> {
    let payload: &RawValue = serde_json::from_str(&row.payload).map_err(|e| format!("payload: not JSON: {e}"))?;
    let channels = match &row.channels {
        None => None,
        Some(text) => Some(
            serde_json::from_str::<Vec<String>>(text)
                .map_err(|e| format!("channels: not a JSON array of strings: {e}"))?,
        ),
    };
    let message = MessageIn {
        event_type: &row.event_type,
        event_id: &row.event_id,
        payload,
        channels,
        ordering_key: row.ordering_key.as_deref(),
    };
    serde_json::to_string(&message).map_err(|e| format!("encoding the message: {e}"))
}

/// Whether an OpenAPI document lists the batch call.
fn lists_batch(document: &serde_json::Value) -> bool {
    document
        .get("paths")
        .and_then(|paths| paths.get(BATCH_PATH))
        .is_some_and(|path| path.get("post").is_some())
}

/// Statuses that are not the row's fault: the server is overloaded, down, or the relay's token is wrong.
fn retryable(status: StatusCode) -> bool {
    status.is_server_error()
        || matches!(
            status,
            StatusCode::TOO_MANY_REQUESTS
                | StatusCode::REQUEST_TIMEOUT
                | StatusCode::UNAUTHORIZED
                | StatusCode::FORBIDDEN
        )
}

/// The answer's `detail` (a string, or Svix's validation list), else its first 200 characters.
fn detail_of(text: &str) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_str(text).ok();
    match parsed.as_ref().and_then(|v| v.get("detail")) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => text.chars().take(200).collect(),
    }
}

/// An app id or uid as one URL path segment.
fn path_segment(app: &str) -> String {
    url::form_urlencoded::byte_serialize(app.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_password_in_heralds_url_is_never_shown() {
        let publisher =
            Publisher::new("http://relay:Hunter2pw@127.0.0.1:1", "t", 1, Duration::from_secs(2)).expect("publisher");
        assert!(!publisher.base().contains("Hunter2pw"), "{}", publisher.base());
        let refused = publisher
            .send(format!("{}/app", publisher.api), "{}".to_owned())
            .await
            .expect_err("nothing listens there");
        let shown = format!("{refused} {refused:?}");
        assert!(!shown.contains("Hunter2pw") && shown.contains("127.0.0.1:1"), "{shown}");
    }

    fn row(payload: &str, channels: Option<&str>) -> OutboxRow {
        OutboxRow {
            seq: 1,
            event_id: "evt_1".into(),
            app: "app".into(),
            event_type: "invoice.paid".into(),
            payload: payload.into(),
            channels: channels.map(str::to_owned),
            ordering_key: Some("inv_1".into()),
            created_at_ms: 0,
        }
    }

    #[test]
    fn body_keeps_the_payload_bytes_and_names_fields_as_svix() {
        let body = body(&row(r#"{"b": 1,  "a":2}"#, Some(r#"["x","y"]"#))).expect("body");
        assert_eq!(
            body,
            r#"{"eventType":"invoice.paid","eventId":"evt_1","payload":{"b": 1,  "a":2},"channels":["x","y"],"orderingKey":"inv_1"}"#
        );
    }

    #[test]
    fn rows_that_cannot_be_json_are_rejected() {
        assert!(body(&row("{not json", None)).unwrap_err().starts_with("payload"));
        assert!(body(&row("{}", Some("x,y"))).unwrap_err().starts_with("channels"));
    }

    #[test]
    fn only_the_rows_fault_is_final() {
        for status in [400, 404, 409, 413, 422] {
            assert!(!retryable(StatusCode::from_u16(status).expect("status")), "{status}");
        }
        for status in [401, 403, 408, 429, 500, 502, 503] {
            assert!(retryable(StatusCode::from_u16(status).expect("status")), "{status}");
        }
    }

    #[test]
    fn the_batch_call_is_used_only_where_the_document_lists_it() {
        let herald = serde_json::json!({"paths": {BATCH_PATH: {"post": {}}, "/api/v1/app/{app_id}/msg": {"post": {}}}});
        assert!(lists_batch(&herald));
        let svix = serde_json::json!({"paths": {"/api/v1/app/{app_id}/msg": {"post": {}}}});
        assert!(!lists_batch(&svix));
        assert!(!lists_batch(&serde_json::json!({"paths": {BATCH_PATH: {"get": {}}}})));
        assert!(!lists_batch(&serde_json::json!("not a document")));
    }

    #[test]
    fn details_and_path_segments() {
        assert_eq!(detail_of(r#"{"code":"not_found","detail":"no app"}"#), "no app");
        assert_eq!(detail_of("plain"), "plain");
        assert_eq!(path_segment("app_1"), "app_1");
        assert_eq!(path_segment("a/b c"), "a%2Fb%20c");
    }
}
