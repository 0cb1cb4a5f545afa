//! The benchmark harness behind `herald bench`.
//!
//! A run starts a Herald node in-process on a temporary SQLite store (or points at a running server
//! through its public, Svix-compatible API), starts its own receivers ([`receiver`]) and its own load
//! generator ([`load`]), runs one named scenario ([`scenario`]) and returns a report ([`report`]) that
//! prints as a table or as JSON.
//!
//! Lag is always measured the same way, so it works against any server: the load generator writes its
//! send time (`"sent_at_us"`, Unix microseconds) into every payload, and the receiver subtracts it from
//! its own arrival time. Load generator, receivers and server share one machine, hence one clock.
//!
//! The in-process node runs on its own Tokio runtime (threads named `herald-node`), apart from the
//! harness's runtime, so that [`cpu`] can tell how the CPU was split between Herald and the harness.

pub mod api;
pub mod calibration;
pub mod cpu;
pub mod env;
pub mod load;
pub mod local_node;
pub mod poster;
pub mod progress;
pub mod receiver;
pub mod report;
pub mod scenario;
pub mod server_id;
pub mod stats;
pub mod table;

use std::time::UNIX_EPOCH;

pub use env::{Options, Target};
pub use report::Report;
pub use scenario::Scenario;
pub use table::Table;

/// Run one scenario and return its report.
pub async fn run(options: &Options, scenario: &Scenario) -> anyhow::Result<Report> {
    scenario.run(options).await
}

/// The wall clock in Unix microseconds (the unit of `sent_at_us` and of arrival times).
pub fn unix_micros() -> u64 {
    herald_core::clock::system_now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
