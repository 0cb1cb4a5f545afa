//! The HTTP client that forwards events to the operator's handlers.
//!
//! Handlers are the operator's own services (loopback or private network), named in the configuration
//! only, so Herald's SSRF address policy does not apply here. The other outbound rules do: no proxy
//! from the environment, no redirects (a 3xx is a failure, not a hop to somewhere unconfigured),
//! bounded connect and total time, and only the start of a response body is read.

use std::time::Duration;

use bytes::Bytes;
use herald_core::id::InboxEventId;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

/// The most response-body bytes kept for `last_error`.
const MAX_ERROR_BODY: usize = 512;

/// Building the client failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// TLS configuration failed.
    #[error("TLS setup: {0}")]
    Tls(String),
    /// The HTTP client could not be built.
    #[error("HTTP client: {0}")]
    Build(#[from] reqwest::Error),
}

/// What one forwarding attempt produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivered {
    /// The handler answered 2xx.
    Accepted,
    /// Anything else: a non-2xx status, a timeout, a refused connection. The text says which.
    Failed(String),
}

/// The forwarding client. Cheap to clone (one connection pool).
#[derive(Debug, Clone)]
pub struct ForwardClient {
    http: reqwest::Client,
}

impl ForwardClient {
    /// A client whose attempts take at most `timeout` in all.
    ///
    /// # Errors
    ///
    /// TLS or client construction errors.
    pub fn new(timeout: Duration) -> Result<Self, ClientError> {
        // The same roots, versions and ALPN as the delivery client's.
        let tls = herald_tls::client_config().map_err(|e| ClientError::Tls(e.to_string()))?;
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .timeout(timeout)
            .pool_idle_timeout(Duration::from_secs(60))
            .build()?;
        Ok(Self { http })
    }

    /// POST `body` with `headers` (the original request's, as stored) plus `herald-inbox-id: {inbox_id}`.
    pub async fn forward(
        &self,
        url: &url::Url,
        headers: &[(String, String)],
        inbox_id: &InboxEventId,
        body: Bytes,
    ) -> Delivered {
        let mut map = HeaderMap::with_capacity(headers.len() + 1);
        for (name, value) in headers {
            // Stored headers came from a valid request, so they parse; skip any that would not rather
            // than fail the event.
            if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(value)) {
                map.append(name, value);
            }
        }
        if let Ok(value) = HeaderValue::from_str(inbox_id) {
            map.insert(crate::ingress::INBOX_ID_HEADER, value);
        }
        let sent = self.http.post(url.clone()).headers(map).body(body).send().await;
        let mut response = match sent {
            Ok(response) => response,
            Err(error) => return Delivered::Failed(describe(&error.without_url())),
        };
        let status = response.status();
        if status.is_success() {
            return Delivered::Accepted;
        }
        let mut kept = Vec::new();
        while kept.len() < MAX_ERROR_BODY {
            match response.chunk().await {
                Ok(Some(chunk)) => kept.extend_from_slice(&chunk[..chunk.len().min(MAX_ERROR_BODY - kept.len())]),
                Ok(None) | Err(_) => break,
            }
        }
        let text = String::from_utf8_lossy(&kept);
        Delivered::Failed(format!("HTTP {}: {}", status.as_u16(), text.trim()))
    }
}

/// A one-line description of a transport error with its causes.
fn describe(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        // Named as a timeout first, whatever reqwest's outermost text says.
        let causes = std::error::Error::source(error).map(herald_core::error_text::with_causes);
        return causes.map_or_else(|| "timeout".to_owned(), |causes| format!("timeout: {causes}"));
    }
    herald_core::error_text::with_causes(error)
}
