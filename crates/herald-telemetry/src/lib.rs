//! Herald's telemetry plumbing, shared by every crate that reports something.
//!
//! - [`registry`]: the process's Prometheus registry. Crates record through the `metrics` facade (each
//!   has a `metrics` module owning its names); the registry keeps the values and renders them as
//!   Prometheus text for `/metrics`.
//! - [`text`]: a small writer of the Prometheus text format, for the series rendered at scrape time from
//!   memory (the per-endpoint figures the delivery engine holds), which do not live in the registry.
//! - [`logs`]: the log subscriber (text or JSON lines) and, when configured, OpenTelemetry trace export
//!   over OTLP/HTTP.

pub mod logs;
pub mod registry;
pub mod text;

pub use logs::{LogFormat, Telemetry, TelemetryError, TraceExport};

/// Whether a hot-path span (an ingest request's, an attempt's) should enclose its work: when its traces
/// are exported (`exported`), which time it, or when the filter lets `debug` through, whose lines inside
/// it carry its fields. Otherwise the span would format its fields at opening and at each record for
/// nobody (docs/performance.md): callers open none, or open it only around the line that needs it.
pub fn span_wanted(exported: bool) -> bool {
    exported || tracing::level_enabled!(tracing::Level::DEBUG)
}
