//! The delivery client's limits and settings.

use std::time::Duration;

use herald_signature::HeaderNames;

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
pub(super) const MIN_HEADER_BYTES: usize = 8 * 1024;
