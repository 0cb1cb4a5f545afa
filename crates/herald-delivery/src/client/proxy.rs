//! The optional HTTP CONNECT egress proxy: parsed from the operator's URL, asked to tunnel to an address
//! that already passed the policy.

use std::io;
use std::net::SocketAddr;

use base64::Engine as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::error::{ClientError, ConnectError};

/// An HTTP CONNECT egress proxy: where it listens and how to authenticate to it.
#[derive(Clone)]
pub(super) struct Proxy {
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
    pub(super) fn parse(url: &str) -> Result<Self, ClientError> {
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
    pub(super) async fn tunnel(&self, target: SocketAddr) -> Result<TcpStream, ConnectError> {
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
pub(super) fn basic_credentials(url: &url::Url) -> Option<String> {
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
