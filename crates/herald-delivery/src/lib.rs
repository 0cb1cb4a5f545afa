//! Herald's delivery engine.
//!
//! - [`client`]: the address-checked HTTP client that makes each attempt.
//! - [`engine`]: the thin async shell around the pure [`herald_core::scheduler::Scheduler`]: it feeds the
//!   scheduler new deliveries, results and clock ticks, and runs the sends it decides on.
//! - `attempt`: one attempt (sign, send, classify, decide the next step).
//! - `recorder`: the batched writer of attempt results.
//! - [`verification`]: the endpoint ownership check (a signed challenge the endpoint must echo).
//! - `ownership`: which endpoints this node delivers for when several nodes share a store.
//! - [`metrics`]: the engine's metric names, node totals and the per-endpoint series of a scrape.
//! - [`operational`]: the operational webhook, which pushes operational events to the operator's URL.

mod attempt;
pub mod client;
pub mod engine;
mod feed_gate;
mod handover;
mod loader;
pub mod metrics;
pub mod operational;
mod ownership;
mod recorder;
pub mod verification;

pub use attempt::signed_headers;
pub use client::{ClientConfig, ConnectError, DeliveryClient, HostResolver, SystemResolver, checked_addresses};
pub use engine::{Engine, EngineConfig, EngineHandle};
