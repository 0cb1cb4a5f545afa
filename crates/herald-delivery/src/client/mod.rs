//! The outbound HTTP client: address-checked, pinned, no redirects, no ambient proxies, capped reads.
//!
//! The client is hyper's (hyper-util's pooled client) with a connector of Herald's own, [`PinnedConnector`],
//! because the defences below have to sit exactly where the connection is made, and reqwest's connector can be
//! neither replaced nor told which address to use behind a proxy:
//!
//! - **Every destination is vetted where it is connected to.** The connector takes the host out of the request
//!   URI (the very string the connection uses), checks an IP literal against the [`AddressPolicy`](herald_core::address::AddressPolicy), or resolves
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
//!
//! One job a file: [`resolve`](HostResolver) vets where a delivery may go, `proxy` tunnels through the egress
//! proxy, `connector` makes the pinned connection (TLS from `herald-tls`, shared with the inbox's
//! forwarder), `conn` is that connection as hyper sees it, `config` holds the limits, `post` sends the POST
//! and classifies it; `error` holds the reasons none of it worked.

mod config;
mod conn;
mod connector;
mod error;
mod post;
mod proxy;
mod resolve;

pub use config::ClientConfig;
pub use conn::Conn;
pub use connector::PinnedConnector;
pub use error::{ClientError, ConnectError};
pub use post::{DeliveryClient, Destination, Response};
pub use resolve::{HostResolver, SystemResolver, checked_addresses};
