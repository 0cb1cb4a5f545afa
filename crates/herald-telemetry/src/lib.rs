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
