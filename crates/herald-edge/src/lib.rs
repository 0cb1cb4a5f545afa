//! Herald's HTTP edge: the one serving loop of the sender (`herald serve`) and the inbox
//! (`herald inbox`), on hyper's HTTP/1 connection and a front of its own, made to face the public
//! internet with nothing in between.
//!
//! - **Timeouts** on every phase of a connection: the request head ([`Limits::header_read_timeout`]),
//!   the wait between requests ([`Limits::keep_alive_timeout`]), the body
//!   ([`Limits::request_body_timeout`]) and the reading of the response by the client
//!   ([`Limits::response_write_timeout`]). Slowloris heads and stalled bodies get 408; idle and
//!   non-reading connections are closed.
//! - **A cap on open connections** ([`Limits::max_connections`], kept below the file-descriptor limit):
//!   at the cap the longest-idle connections are closed to make room; when every connection is busy, a
//!   newcomer gets a 503 and is closed. `accept` failures for want of descriptors back off rather than spin.
//! - **A cap on request bodies received at once** ([`Limits::max_request_bodies`]): a request beyond it
//!   waits up to a second for its turn, then gets a 503.
//! - **Bounded pipelining**: a connection's next request is read only once the previous response is
//!   written out, so a client that sends requests without reading the answers holds at most one.
//! - **JSON everywhere**: a malformed head (414, 431, 400, 505), a timeout (408), overload (503) and a
//!   panicking handler (500) are all answered `{code, detail}`, never hyper's empty bodies.
//!
//! docs/edge.md tells operators what is limited, what is shed and how.

mod answer;
pub mod config;
mod fd;
mod front;
pub mod head;
pub mod problem;
mod registry;
mod serve;
mod service;

pub use config::{EdgeConfig, InvalidSetting, Limits, METRICS_CONNECTIONS};
pub use serve::{Edge, SHUTDOWN_GRACE};
pub use service::BoxError;
