//! The outbound HTTP client: address-checked, pinned, no redirects, no proxies, capped reads.
//!
//! Every destination is vetted by the [`AddressPolicy`]: IP literals before each attempt (HTTP clients never
//! call a resolver for them), names inside the resolver, which drops every denied address so the connection
//! can only go to an address that was checked — a second lookup that might answer differently (DNS rebinding)
//! never happens. Redirects are failures, environment proxy variables are ignored (they would bypass the
//! check), and at most `max_response_bytes` of a response body are read.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use herald_core::address::AddressPolicy;
use herald_core::outcome::{AttemptResult, parse_retry_after};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Looks up the addresses of a host name. Pluggable so tests can answer without DNS.
pub trait HostResolver: Send + Sync + 'static {
    /// Resolve `host` to its addresses.
    fn lookup(&self, host: &str) -> futures::future::BoxFuture<'static, Result<Vec<IpAddr>, String>>;
}

/// The system resolver (hickory, configured from `/etc/resolv.conf`).
pub struct SystemResolver {
    inner: hickory_resolver::TokioResolver,
}

impl SystemResolver {
    /// Build from the system configuration.
    pub fn new() -> Result<Self, String> {
        let inner = hickory_resolver::Resolver::builder_tokio()
            .map_err(|e| format!("resolver configuration: {e}"))?
            .build()
            .map_err(|e| format!("resolver: {e}"))?;
        Ok(Self { inner })
    }
}

impl HostResolver for SystemResolver {
    fn lookup(&self, host: &str) -> futures::future::BoxFuture<'static, Result<Vec<IpAddr>, String>> {
        let resolver = self.inner.clone();
        let host = host.to_owned();
        Box::pin(async move {
            let found = resolver.lookup_ip(host.as_str()).await.map_err(|e| e.to_string())?;
            Ok(found.iter().collect())
        })
    }
}

/// Resolves with a [`HostResolver`] and keeps only the addresses the policy allows.
struct CheckedResolver {
    resolver: Arc<dyn HostResolver>,
    policy: Arc<AddressPolicy>,
}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let lookup = self.resolver.lookup(name.as_str());
        let policy = self.policy.clone();
        Box::pin(async move {
            let found = lookup.await?;
            let mut denied = None;
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .map(unmap)
                .filter(|ip| match policy.check_ip(*ip) {
                    Ok(()) => true,
                    Err(reason) => {
                        denied = Some(reason);
                        false
                    }
                })
                .map(|ip| SocketAddr::new(ip, 0))
                .collect();
            if allowed.is_empty() {
                let reason = match denied {
                    Some(reason) => BlockedAddress(reason.to_string()),
                    None => BlockedAddress("the name has no addresses".to_owned()),
                };
                return Err(Box::new(reason) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// `::ffff:a.b.c.d` is the IPv4 address a.b.c.d on a dual-stack socket; connect to (and report) it as such.
fn unmap(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The error a resolution fails with when the policy refused every address.
#[derive(Debug)]
struct BlockedAddress(String);

impl std::fmt::Display for BlockedAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "blocked by the address policy: {}", self.0)
    }
}

impl std::error::Error for BlockedAddress {}

/// Limits of the delivery client.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Time to establish a connection.
    pub connect_timeout: Duration,
    /// Time for the whole attempt, body included.
    pub total_timeout: Duration,
    /// The most response-body bytes read and kept.
    pub max_response_bytes: usize,
    /// The `user-agent` header.
    pub user_agent: String,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            total_timeout: Duration::from_secs(15),
            max_response_bytes: 4 * 1024,
            user_agent: format!("Herald-Webhooks/{}", env!("CARGO_PKG_VERSION")),
        }
    }
}

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

/// The delivery client. Cheap to clone (one shared connection pool).
#[derive(Clone)]
pub struct DeliveryClient {
    http: reqwest::Client,
    policy: Arc<AddressPolicy>,
    config: ClientConfig,
}

impl DeliveryClient {
    /// Build a client enforcing `policy`, resolving names with `resolver`.
    pub fn new(
        config: ClientConfig,
        policy: Arc<AddressPolicy>,
        resolver: Arc<dyn HostResolver>,
    ) -> Result<Self, ClientError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ClientError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        // Without ALPN, HTTP/2 is never negotiated.
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(config.connect_timeout)
            .timeout(config.total_timeout)
            .user_agent(config.user_agent.clone())
            .pool_idle_timeout(Duration::from_secs(60))
            .dns_resolver(Arc::new(CheckedResolver {
                resolver,
                policy: policy.clone(),
            }))
            .build()?;
        Ok(Self { http, policy, config })
    }

    /// The address policy in force.
    pub fn policy(&self) -> &AddressPolicy {
        &self.policy
    }

    /// POST `body` to `url` with `headers`, and classify what happened.
    pub async fn post(&self, url: &str, headers: reqwest::header::HeaderMap, body: bytes::Bytes) -> Response {
        let started = Instant::now();
        let finish = |result, body: String| Response {
            result,
            body,
            duration: started.elapsed(),
        };
        let target = match self.policy.check_url(url) {
            Ok(target) => target,
            Err(rejected) => return finish(AttemptResult::Blocked, format!("blocked: {rejected}")),
        };
        // IP literals never reach the resolver; check_url has vetted them (mapped forms included).
        let sent = self.http.post(target.url).headers(headers).body(body).send().await;
        let response = match sent {
            Ok(response) => response,
            // Without the URL: it may carry userinfo credentials, which must not reach the attempt log.
            Err(error) => return finish(classify_error(&error), describe_error(&error.without_url())),
        };
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        let body = read_capped(response, self.config.max_response_bytes).await;
        finish(AttemptResult::Response { status, retry_after }, body)
    }
}

/// Read at most `cap` bytes of the body, then drop the connection's remaining body.
async fn read_capped(response: reqwest::Response, cap: usize) -> String {
    let mut kept = Vec::with_capacity(cap.min(1024));
    let mut stream = response.bytes_stream();
    while kept.len() < cap {
        match stream.next().await {
            Some(Ok(chunk)) => {
                let room = cap - kept.len();
                kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            // A body that breaks or times out after the status line: the status still counts.
            Some(Err(_)) | None => break,
        }
    }
    String::from_utf8_lossy(&kept).into_owned()
}

fn classify_error(error: &reqwest::Error) -> AttemptResult {
    if is_blocked(error) {
        AttemptResult::Blocked
    } else if error.is_timeout() {
        AttemptResult::Timeout
    } else {
        AttemptResult::ConnectError
    }
}

fn is_blocked(error: &reqwest::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if current.is::<BlockedAddress>() {
            return true;
        }
        source = current.source();
    }
    false
}

/// A one-line description of a transport error, with its causes (never the request body).
fn describe_error(error: &reqwest::Error) -> String {
    let mut text = if error.is_timeout() {
        "timeout".to_owned()
    } else {
        error.to_string()
    };
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
