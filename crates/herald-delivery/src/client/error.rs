//! Why a connection or the client could not be made. The connector's error is what the attempt log
//! shows, so it stays apart from the pieces that raise it.

use std::io;
use std::time::Duration;

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
