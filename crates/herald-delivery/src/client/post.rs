//! The delivery client: one POST through the pinned connector, under a deadline over the whole attempt,
//! its response body read up to the cap, the outcome classified.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use herald_core::address::AddressPolicy;
use herald_core::outcome::{AttemptResult, parse_retry_after};
use herald_signature::HeaderNames;
use http::header::{AUTHORIZATION, HeaderMap, HeaderValue, RETRY_AFTER, USER_AGENT};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::config::{ClientConfig, MIN_HEADER_BYTES};
use super::connector::PinnedConnector;
use super::error::{ClientError, ConnectError};
use super::proxy::{Proxy, basic_credentials};
use super::resolve::HostResolver;

/// What one POST produced.
#[derive(Debug, Clone)]
pub struct Response {
    /// The classified result.
    pub result: AttemptResult,
    /// The start of the response body, or a description of the failure.
    pub body: String,
    /// How long it took.
    pub duration: Duration,
}

/// The delivery client. Cheap to clone (one shared connection pool).
#[derive(Clone)]
pub struct DeliveryClient {
    http: Client<PinnedConnector, Full<Bytes>>,
    policy: Arc<AddressPolicy>,
    config: Arc<ClientConfig>,
    user_agent: HeaderValue,
}

impl DeliveryClient {
    /// Build a client enforcing `policy`, resolving names with `resolver`.
    pub fn new(
        config: ClientConfig,
        policy: Arc<AddressPolicy>,
        resolver: Arc<dyn HostResolver>,
    ) -> Result<Self, ClientError> {
        let tls = herald_tls::client_config().map_err(|e| ClientError::Tls(e.to_string()))?;
        let proxy = config.proxy_url.as_deref().map(Proxy::parse).transpose()?;
        let connector = PinnedConnector::new(
            policy.clone(),
            resolver,
            tokio_rustls::TlsConnector::from(Arc::new(tls)),
            proxy,
            config.connect_timeout,
        );
        let header_bytes = config.max_response_header_bytes.max(MIN_HEADER_BYTES);
        let http = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(60))
            // The HTTP/1 read buffer bounds the response head: a head that does not fit fails the attempt.
            .http1_max_buf_size(header_bytes)
            .http1_max_headers(config.max_response_headers)
            .http2_max_header_list_size(u32::try_from(header_bytes).unwrap_or(u32::MAX))
            .build(connector);
        let user_agent =
            HeaderValue::from_str(&config.user_agent).unwrap_or_else(|_| HeaderValue::from_static("Herald-Webhooks"));
        Ok(Self {
            http,
            policy,
            config: Arc::new(config),
            user_agent,
        })
    }

    /// The address policy in force.
    pub fn policy(&self) -> &AddressPolicy {
        &self.policy
    }

    /// The time allowed for a whole attempt when the endpoint sets none.
    pub fn default_timeout(&self) -> Duration {
        self.config.total_timeout
    }

    /// The names signature headers go out under where the endpoint does not choose (`HERALD_SIGNATURE_HEADERS`).
    pub fn signature_headers(&self) -> HeaderNames {
        self.config.signature_headers
    }

    /// POST `body` to `url` with `headers`, and classify what happened.
    pub async fn post(&self, url: &str, headers: HeaderMap, body: Bytes) -> Response {
        self.post_within(url, headers, body, self.config.total_timeout).await
    }

    /// As [`DeliveryClient::post`], with `timeout` for the whole attempt instead of the configured one (an
    /// endpoint's own setting, already held within the operator's bounds).
    pub async fn post_within(&self, url: &str, headers: HeaderMap, body: Bytes, timeout: Duration) -> Response {
        self.post_to(&self.destination(url), headers, body, timeout).await
    }

    /// Vet `url` against the address policy and prepare what a request to it needs: scheme, host shape,
    /// literal addresses and port are checked here, and the connector checks the host it actually connects
    /// to again at every connection (and resolves and checks names). The delivery engine keeps one per
    /// endpoint, so an attempt neither parses nor checks the URL again.
    pub fn destination(&self, url: &str) -> Destination {
        match self.policy.check_url(url) {
            Ok(target) => match bare_uri(&target.url) {
                Ok(uri) => Destination::Ready {
                    uri,
                    // Userinfo becomes Basic authorization, as browsers and other webhook senders do.
                    authorization: basic_credentials(&target.url).and_then(|c| HeaderValue::from_str(&c).ok()),
                },
                Err(reason) => Destination::Invalid(reason),
            },
            Err(rejected) => Destination::Blocked(format!("blocked: {rejected}")),
        }
    }

    /// POST `body` to a prepared destination with `headers`, within `timeout`, and classify what happened.
    pub async fn post_to(
        &self,
        destination: &Destination,
        headers: HeaderMap,
        body: Bytes,
        timeout: Duration,
    ) -> Response {
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + timeout;
        let finish = |result, body: String| Response {
            result,
            body,
            duration: started.elapsed(),
        };
        let request = match destination {
            Destination::Ready { uri, authorization } => {
                build_request(uri.clone(), authorization.as_ref(), headers, body, &self.user_agent)
            }
            Destination::Blocked(reason) => return finish(AttemptResult::Blocked, reason.clone()),
            Destination::Invalid(reason) => return finish(AttemptResult::ConnectError, reason.clone()),
        };
        let response = match tokio::time::timeout_at(deadline, self.http.request(request)).await {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => return finish(classify_error(&error), self.describe_error(&error)),
            Err(_) => {
                return finish(
                    AttemptResult::Timeout,
                    format!("timeout: no response within {timeout:?}"),
                );
            }
        };
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, herald_core::clock::now().to_system_time()));
        let body = read_capped(response.into_body(), self.config.max_response_bytes, deadline).await;
        finish(AttemptResult::Response { status, retry_after }, body)
    }

    /// A one-line description of a failure (never anything the target sent, never the request body or URL).
    fn describe_error(&self, error: &hyper_util::client::legacy::Error) -> String {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
        while let Some(current) = source {
            if let Some(connect) = current.downcast_ref::<ConnectError>() {
                return connect.to_string();
            }
            if let Some(hyper) = current.downcast_ref::<hyper::Error>()
                && hyper.is_parse_too_large()
            {
                return format!(
                    "response headers exceed the cap ({} fields, {} bytes)",
                    self.config.max_response_headers,
                    self.config.max_response_header_bytes.max(MIN_HEADER_BYTES)
                );
            }
            source = current.source();
        }
        herald_core::error_text::with_causes(error)
    }
}

/// Where a request goes, prepared once per URL by [`DeliveryClient::destination`].
#[derive(Debug, Clone)]
pub enum Destination {
    /// The policy lets the URL through.
    Ready {
        /// Origin and path, without userinfo or fragment.
        uri: Uri,
        /// The URL's userinfo as Basic authorization, if it has any.
        authorization: Option<HeaderValue>,
    },
    /// The policy refuses the URL: every attempt ends `blocked`, with this reason.
    Blocked(String),
    /// The URL cannot be made into a request: every attempt ends as a connection error, with this reason.
    Invalid(String),
}

/// A vetted URL's origin and path, without userinfo or fragment.
fn bare_uri(url: &url::Url) -> Result<Uri, String> {
    let mut bare = url.clone();
    // Both setters only fail for URLs that cannot carry credentials; http(s) URLs can.
    let _ = bare.set_username("");
    let _ = bare.set_password(None);
    bare.set_fragment(None);
    bare.as_str().parse().map_err(|e| format!("invalid destination: {e}"))
}

/// The request to a prepared destination: Herald's headers (with the URL's credentials unless the
/// endpoint sets its own `Authorization`), the body.
fn build_request(
    uri: Uri,
    authorization: Option<&HeaderValue>,
    mut headers: HeaderMap,
    body: Bytes,
    user_agent: &HeaderValue,
) -> Request<Full<Bytes>> {
    if let Some(value) = authorization {
        headers.entry(AUTHORIZATION).or_insert_with(|| value.clone());
    }
    headers.entry(USER_AGENT).or_insert_with(|| user_agent.clone());
    let mut request = Request::new(Full::new(body));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    request
}

/// Read at most `cap` bytes of the body before `deadline`, then stop: the rest is never read, and dropping the
/// body closes the connection instead of draining it. A body that breaks or runs out of time after the status
/// line keeps what arrived (the status still counts). The text kept never exceeds `cap` bytes.
async fn read_capped(mut body: hyper::body::Incoming, cap: usize, deadline: tokio::time::Instant) -> String {
    let mut kept = Vec::with_capacity(cap.min(1024));
    while kept.len() < cap {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Ok(chunk) = frame.into_data() {
                    let room = cap - kept.len();
                    kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
                }
            }
            Ok(Some(Err(_)) | None) | Err(_) => break,
        }
    }
    drop(body);
    let mut text = String::from_utf8_lossy(&kept).into_owned();
    // Replacement characters are three bytes for one: cut back to the cap on a character boundary.
    if text.len() > cap {
        let mut end = cap;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

fn classify_error(error: &hyper_util::client::legacy::Error) -> AttemptResult {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        match current.downcast_ref::<ConnectError>() {
            Some(ConnectError::Blocked(_)) => return AttemptResult::Blocked,
            Some(ConnectError::Timeout(_)) => return AttemptResult::Timeout,
            Some(_) => return AttemptResult::ConnectError,
            None => source = current.source(),
        }
    }
    AttemptResult::ConnectError
}
