//! The outbound HTTP client: address-checked, pinned, no redirects, no ambient proxies, capped reads.
//!
//! The client is hyper's (hyper-util's pooled client) with a connector of Herald's own, [`PinnedConnector`],
//! because the defences below have to sit exactly where the connection is made, and reqwest's connector can be
//! neither replaced nor told which address to use behind a proxy:
//!
//! - **Every destination is vetted where it is connected to.** The connector takes the host out of the request
//!   URI (the very string the connection uses), checks an IP literal against the [`AddressPolicy`], or resolves
//!   a name once with the pluggable [`HostResolver`] and checks every answer. If *any* answer is denied the
//!   whole name is refused: a public name that also points inside is either misconfigured or a DNS-rebinding
//!   attempt (multiple-answer rebinding relies on the client falling back to the internal address).
//! - **The connection is pinned.** It goes to one of the addresses just checked; nothing looks the name up a
//!   second time, so a rebinding answer can never be used. TLS SNI and `Host` stay the hostname.
//! - **Optional egress proxy** (HTTP CONNECT): the address is checked first, then the proxy is asked to CONNECT
//!   to the checked `IP:port`, so the proxy's own DNS never gets a say.
//! - **No redirects** (hyper never follows them), **no environment proxies** (hyper never reads
//!   `HTTP(S)_PROXY`), **no decompression** (no gzip/brotli bombs).
//! - **Hostile responses are bounded**: connect timeout, a total deadline over connect, request, response head
//!   and body (a slow-drip body cannot hold a worker past it), a cap on response header count and bytes
//!   (HTTP/1 read buffer and HTTP/2 header list), and at most `max_response_bytes` of the body read: reading
//!   stops there and the connection is dropped rather than drained.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use herald_core::address::AddressPolicy;
use herald_core::outcome::{AttemptResult, parse_retry_after};
use herald_signature::HeaderNames;
use http::header::{AUTHORIZATION, HeaderMap, HeaderValue, RETRY_AFTER, USER_AGENT};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

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

/// Why no connection was made (or the one made is unusable). The `Display` of each variant is what the
/// attempt log shows, so none of them carries anything the target sent.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The address policy refused the destination; the text names the rule. No connection was attempted.
    #[error("blocked: {0}")]
    Blocked(String),
    /// The name could not be resolved, or has no addresses.
    #[error("resolving {host}: {reason}")]
    Resolve {
        /// The name.
        host: String,
        /// The resolver's reason.
        reason: String,
    },
    /// No connection (including the proxy tunnel and the TLS handshake) within the connect timeout.
    #[error("connect timeout after {0:?}")]
    Timeout(Duration),
    /// The TCP connection failed.
    #[error("connecting to {addr}: {source}")]
    Io {
        /// The address (the proxy's, when one is used).
        addr: String,
        /// The operating system's reason.
        source: io::Error,
    },
    /// The egress proxy refused or broke the tunnel.
    #[error("egress proxy: {0}")]
    Proxy(String),
    /// The TLS handshake failed.
    #[error("TLS with {host}: {source}")]
    Tls {
        /// The server name.
        host: String,
        /// rustls's reason.
        source: io::Error,
    },
    /// The request URI cannot be connected to (it passed the URL check, so this is a bug if it happens).
    #[error("invalid destination: {0}")]
    Destination(String),
}

/// Resolves `host` (or takes it as an IP literal) and vets every address against `policy`: the addresses a
/// connection to `host:port` may use, in the resolver's order.
///
/// IPv4-mapped answers are unmapped first (a dual-stack socket would connect to the IPv4 address). A name with
/// any denied answer is refused as a whole, with the rule of the first denied address; a literal is checked as
/// written. Pure policy plus one lookup, no sockets: tests can drive it with any address.
pub async fn checked_addresses(
    policy: &AddressPolicy,
    resolver: &dyn HostResolver,
    host: &str,
    port: u16,
) -> Result<Vec<SocketAddr>, ConnectError> {
    policy
        .check_port(port)
        .map_err(|rejected| ConnectError::Blocked(rejected.to_string()))?;
    // `Uri::host` keeps the brackets of an IPv6 literal.
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        policy
            .check_ip(ip)
            .map_err(|denied| ConnectError::Blocked(denied.to_string()))?;
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let found = resolver.lookup(bare).await.map_err(|reason| ConnectError::Resolve {
        host: bare.to_owned(),
        reason,
    })?;
    if found.is_empty() {
        return Err(ConnectError::Resolve {
            host: bare.to_owned(),
            reason: "no addresses".to_owned(),
        });
    }
    let mut allowed = Vec::with_capacity(found.len());
    for ip in found.into_iter().map(unmap) {
        if let Err(denied) = policy.check_ip(ip) {
            return Err(ConnectError::Blocked(format!(
                "{bare} resolved to a denied address: {denied}"
            )));
        }
        allowed.push(SocketAddr::new(ip, port));
    }
    Ok(allowed)
}

/// `::ffff:a.b.c.d` is the IPv4 address a.b.c.d on a dual-stack socket; connect to (and report) it as such.
fn unmap(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// An HTTP CONNECT egress proxy: where it listens and how to authenticate to it.
#[derive(Clone)]
struct Proxy {
    /// `host:port` of the proxy (operator-configured, so trusted: it is not checked against the policy).
    authority: String,
    /// `Proxy-Authorization` value from the proxy URL's userinfo.
    authorization: Option<String>,
}

impl std::fmt::Debug for Proxy {
    /// Never prints the credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("authority", &self.authority)
            .finish_non_exhaustive()
    }
}

impl Proxy {
    fn parse(url: &str) -> Result<Self, ClientError> {
        let bad = |why: &str| ClientError::Proxy(format!("{why} (expected http://[user:password@]host:port)"));
        let parsed = url::Url::parse(url).map_err(|e| bad(&format!("not a URL: {e}")))?;
        if parsed.scheme() != "http" {
            return Err(bad(&format!("scheme `{}` is not supported", parsed.scheme())));
        }
        let host = parsed.host().ok_or_else(|| bad("no host"))?;
        let port = parsed.port_or_known_default().unwrap_or(80);
        let authority = match host {
            url::Host::Ipv6(ip) => format!("[{ip}]:{port}"),
            other => format!("{other}:{port}"),
        };
        let authorization = basic_credentials(&parsed);
        Ok(Self {
            authority,
            authorization,
        })
    }

    /// Open a tunnel through the proxy to `target` (an address that already passed the policy).
    async fn tunnel(&self, target: SocketAddr) -> Result<TcpStream, ConnectError> {
        let mut tcp = TcpStream::connect(&self.authority)
            .await
            .map_err(|source| ConnectError::Io {
                addr: format!("proxy {}", self.authority),
                source,
            })?;
        // The target is the checked IP, never the name: the proxy's own DNS cannot pick another address.
        let mut request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
        if let Some(credentials) = &self.authorization {
            request.push_str(&format!("Proxy-Authorization: {credentials}\r\n"));
        }
        request.push_str("\r\n");
        let broken = |e: io::Error| ConnectError::Proxy(format!("tunnel to {target}: {e}"));
        tcp.write_all(request.as_bytes()).await.map_err(broken)?;
        // Read the proxy's answer byte by byte: after its blank line the stream belongs to the target, so
        // nothing past it may be consumed here.
        let mut head = Vec::with_capacity(128);
        while !head.ends_with(b"\r\n\r\n") {
            if head.len() >= MAX_PROXY_HEAD {
                return Err(ConnectError::Proxy(format!(
                    "answer to CONNECT {target} exceeds {MAX_PROXY_HEAD} bytes"
                )));
            }
            head.push(tcp.read_u8().await.map_err(broken)?);
        }
        let status = head
            .split(|b| *b == b' ')
            .nth(1)
            .and_then(|code| std::str::from_utf8(code).ok())
            .and_then(|code| code.parse::<u16>().ok());
        match status {
            Some(200..=299) if head.starts_with(b"HTTP/1.") => Ok(tcp),
            // Only the status code: the rest of the answer is not ours to log.
            Some(code) => Err(ConnectError::Proxy(format!("CONNECT {target} answered {code}"))),
            None => Err(ConnectError::Proxy(format!("CONNECT {target}: the answer is not HTTP"))),
        }
    }
}

/// The largest proxy answer to CONNECT read before giving up.
const MAX_PROXY_HEAD: usize = 8 * 1024;

/// `Basic base64(user:password)` from a URL's userinfo, percent-decoded, when there is a user name.
fn basic_credentials(url: &url::Url) -> Option<String> {
    if url.username().is_empty() && url.password().is_none() {
        return None;
    }
    let decode = |s: &str| percent_encoding::percent_decode_str(s).collect::<Vec<u8>>();
    let mut raw = decode(url.username());
    raw.push(b':');
    raw.extend(decode(url.password().unwrap_or("")));
    Some(format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(raw)
    ))
}

/// The connector: vet, pin, optionally tunnel, then TLS with the hostname as SNI.
#[derive(Clone)]
pub struct PinnedConnector {
    inner: Arc<ConnectorInner>,
}

struct ConnectorInner {
    policy: Arc<AddressPolicy>,
    resolver: Arc<dyn HostResolver>,
    tls: tokio_rustls::TlsConnector,
    proxy: Option<Proxy>,
    connect_timeout: Duration,
}

impl ConnectorInner {
    async fn connect(&self, uri: Uri) -> Result<Conn, ConnectError> {
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            other => return Err(ConnectError::Destination(format!("scheme {other:?}"))),
        };
        let host = uri
            .host()
            .ok_or_else(|| ConnectError::Destination("no host".to_owned()))?
            .to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let addrs = checked_addresses(&self.policy, self.resolver.as_ref(), &host, port).await?;
        let connect = async {
            let tcp = self.tcp(&addrs).await?;
            // Small request heads and bodies: send them now rather than waiting on Nagle.
            let _ = tcp.set_nodelay(true);
            if !https {
                return Ok(Conn::plain(tcp));
            }
            let bare = host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(&host);
            // SNI and certificate check use the name from the URL, never the pinned address.
            let name = rustls::pki_types::ServerName::try_from(bare.to_owned())
                .map_err(|e| ConnectError::Destination(format!("server name {bare:?}: {e}")))?;
            let tls = self.tls.connect(name, tcp).await.map_err(|source| ConnectError::Tls {
                host: bare.to_owned(),
                source,
            })?;
            Ok(Conn::tls(tls))
        };
        tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| ConnectError::Timeout(self.connect_timeout))?
    }

    /// A TCP stream to the first of the checked addresses that answers (through the proxy when one is set).
    async fn tcp(&self, addrs: &[SocketAddr]) -> Result<TcpStream, ConnectError> {
        let mut last = ConnectError::Destination("no address".to_owned());
        for addr in addrs {
            let attempt = match &self.proxy {
                Some(proxy) => proxy.tunnel(*addr).await,
                None => TcpStream::connect(addr).await.map_err(|source| ConnectError::Io {
                    addr: addr.to_string(),
                    source,
                }),
            };
            match attempt {
                Ok(tcp) => return Ok(tcp),
                Err(error) => last = error,
            }
        }
        Err(last)
    }
}

impl tower_service::Service<Uri> for PinnedConnector {
    type Response = Conn;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Conn, ConnectError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move { inner.connect(uri).await })
    }
}

/// A plain or TLS stream to a vetted address.
enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A connection as hyper sees it: the stream, and whether ALPN chose HTTP/2.
pub struct Conn {
    io: TokioIo<Stream>,
    h2: bool,
}

impl Conn {
    fn plain(tcp: TcpStream) -> Self {
        Self {
            io: TokioIo::new(Stream::Plain(tcp)),
            h2: false,
        }
    }

    fn tls(tls: tokio_rustls::client::TlsStream<TcpStream>) -> Self {
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        Self {
            io: TokioIo::new(Stream::Tls(Box::new(tls))),
            h2,
        }
    }
}

impl Connection for Conn {
    fn connected(&self) -> Connected {
        // Never `proxy(true)`: a CONNECT tunnel is end to end, so requests keep their origin form.
        let connected = Connected::new();
        if self.h2 { connected.negotiated_h2() } else { connected }
    }
}

impl Read for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl Write for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Limits of the delivery client.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Time to establish a connection (TCP, proxy tunnel and TLS handshake).
    pub connect_timeout: Duration,
    /// Time for the whole attempt, body included.
    pub total_timeout: Duration,
    /// The most response-body bytes read and kept.
    pub max_response_bytes: usize,
    /// The most response header fields accepted (HTTP/1).
    pub max_response_headers: usize,
    /// The most bytes of response head (status line and headers) accepted; at least 8 KiB (hyper's minimum
    /// read buffer), raised to that when lower.
    pub max_response_header_bytes: usize,
    /// The `user-agent` header.
    pub user_agent: String,
    /// An HTTP CONNECT egress proxy, `http://[user:password@]host:port`; `None` connects directly.
    pub proxy_url: Option<String>,
    /// The names the signature headers go out under (`webhook-*`, `svix-*` or both).
    pub signature_headers: HeaderNames,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            total_timeout: Duration::from_secs(15),
            max_response_bytes: 4 * 1024,
            // A webhook receiver's answer needs a handful of headers; 64 fields and 16 KiB leave room for the
            // security headers CDNs add, and cap the memory a hostile receiver can make Herald hold.
            max_response_headers: 64,
            max_response_header_bytes: 16 * 1024,
            user_agent: format!("Herald-Webhooks/{}", env!("CARGO_PKG_VERSION")),
            proxy_url: None,
            signature_headers: HeaderNames::Webhook,
        }
    }
}

/// hyper refuses a read buffer smaller than this (and panics if asked).
const MIN_HEADER_BYTES: usize = 8 * 1024;

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
    /// The egress proxy URL is unusable.
    #[error("proxy_url: {0}")]
    Proxy(String),
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
        let proxy = config.proxy_url.as_deref().map(Proxy::parse).transpose()?;
        let connector = PinnedConnector {
            inner: Arc::new(ConnectorInner {
                policy: policy.clone(),
                resolver,
                tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
                proxy,
                connect_timeout: config.connect_timeout,
            }),
        };
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

    /// The names every request's signature headers go out under.
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
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + timeout;
        let finish = |result, body: String| Response {
            result,
            body,
            duration: started.elapsed(),
        };
        // Scheme, host shape, literal addresses and port, before anything else; the connector checks the
        // host it actually connects to again (and resolves and checks names).
        let target = match self.policy.check_url(url) {
            Ok(target) => target,
            Err(rejected) => return finish(AttemptResult::Blocked, format!("blocked: {rejected}")),
        };
        let request = match build_request(&target.url, headers, body, &self.user_agent) {
            Ok(request) => request,
            Err(reason) => return finish(AttemptResult::ConnectError, reason),
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
            .and_then(|v| parse_retry_after(v, herald_core::clock::now()));
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
        let mut text = error.to_string();
        let mut source = std::error::Error::source(error);
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        text
    }
}

/// The request for a vetted URL: origin and path without userinfo or fragment (userinfo becomes Basic
/// authorization, as browsers and other webhook senders do), Herald's headers, the body.
fn build_request(
    url: &url::Url,
    mut headers: HeaderMap,
    body: Bytes,
    user_agent: &HeaderValue,
) -> Result<Request<Full<Bytes>>, String> {
    let mut bare = url.clone();
    // Both setters only fail for URLs that cannot carry credentials; http(s) URLs can.
    let _ = bare.set_username("");
    let _ = bare.set_password(None);
    bare.set_fragment(None);
    let uri: Uri = bare.as_str().parse().map_err(|e| format!("invalid destination: {e}"))?;
    if let Some(credentials) = basic_credentials(url)
        && let Ok(value) = HeaderValue::from_str(&credentials)
    {
        headers.entry(AUTHORIZATION).or_insert(value);
    }
    headers.entry(USER_AGENT).or_insert_with(|| user_agent.clone());
    let mut request = Request::new(Full::new(body));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    Ok(request)
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
