//! The HTTP edge's options (connection timeouts and caps), shared by `herald serve` and `herald inbox`.

use clap::Args;
use figment::Figment;
use figment::providers::Serialized;
use herald_edge::{EdgeConfig, Limits};
use serde::Serialize;

/// Connection timeouts and caps of the HTTP listener (see docs/edge.md).
#[derive(Args, Serialize)]
pub(crate) struct EdgeArgs {
    /// Time for a request line and headers to arrive, from the connection's opening (first request) or
    /// from their first byte (later ones); a head still arriving then gets 408 [default: 10s].
    #[arg(long, env = "HERALD_HEADER_READ_TIMEOUT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    header_read_timeout: Option<String>,
    /// How long a connection may stay open with no request in progress [default: 60s].
    #[arg(long, env = "HERALD_KEEP_ALIVE_TIMEOUT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    keep_alive_timeout: Option<String>,
    /// Time for a whole request body to arrive, from the end of its headers; slower gets 408 [default: 30s].
    #[arg(long, env = "HERALD_REQUEST_BODY_TIMEOUT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    request_body_timeout: Option<String>,
    /// Time for the client to read a response, from its first byte; then the connection is closed
    /// [default: 30s].
    #[arg(long, env = "HERALD_RESPONSE_WRITE_TIMEOUT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    response_write_timeout: Option<String>,
    /// Open client connections at most, lowered to what the open-file limit allows; at the cap the
    /// longest-idle connections are closed, and when all are busy newcomers get 503 [default: 4096].
    #[arg(long, env = "HERALD_MAX_CONNECTIONS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_connections: Option<usize>,
    /// Request bodies received at once at most; a request waits up to 1 s for its turn, then gets 503
    /// [default: 256].
    #[arg(long, env = "HERALD_MAX_REQUEST_BODIES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_request_bodies: Option<usize>,
    /// Response bytes waiting for clients to read them, over all connections, at most; past it the
    /// connections that have left theirs unread longest are closed [default: 67108864 (64 MiB)].
    #[arg(long, env = "HERALD_MAX_UNREAD_RESPONSE_BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_unread_response_bytes: Option<u64>,
}

impl EdgeArgs {
    /// The limits these options give over the defaults (`herald inbox`, which reads no TOML for them;
    /// `herald serve` merges the options into its configuration instead).
    pub(crate) fn limits(&self) -> anyhow::Result<Limits> {
        let config: EdgeConfig = Figment::from(Serialized::defaults(EdgeConfig::default()))
            .merge(Serialized::defaults(self))
            .extract()?;
        Ok(config.limits()?)
    }
}
