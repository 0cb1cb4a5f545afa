//! The process-wide Prometheus registry behind the `metrics` facade.
//!
//! [`install`] sets it up once per process (further calls are no-ops); [`render`] is the text a scrape
//! gets. Until it is installed every `metrics` call is a no-op, so libraries and tests that start no node
//! pay nothing.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Bucket bounds (seconds) of the latency histograms: API requests, store commits, attempts.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Bucket bounds (seconds) of lags that span retries: message created → delivered.
pub const LAG_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0,
];
/// Bucket bounds of batch sizes (group commit, result writer).
pub const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];
/// Bucket bounds (seconds) of clock skews (inbox: `webhook-timestamp` against receipt, either way).
pub const SKEW_BUCKETS: &[f64] = &[0.1, 0.5, 1.0, 5.0, 30.0, 60.0, 300.0, 600.0, 3600.0];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Install the registry as the process's `metrics` recorder (once; later calls return the same answer).
/// `false` when another recorder was installed first: Herald's series are then not collected here.
pub fn install() -> bool {
    HANDLE
        .get_or_init(|| {
            let handle = builder().and_then(PrometheusBuilder::install_recorder);
            match handle {
                Ok(handle) => {
                    let upkeep = handle.clone();
                    // Histograms are buffered per thread and folded in by upkeep; without it they grow
                    // between scrapes. A thread, not a task: the registry outlives any one runtime.
                    let _ = std::thread::Builder::new()
                        .name("herald-metrics-upkeep".into())
                        .spawn(move || {
                            loop {
                                std::thread::sleep(Duration::from_secs(5));
                                upkeep.run_upkeep();
                            }
                        });
                    Some(handle)
                }
                Err(error) => {
                    tracing::warn!(%error, "metrics are not collected: the Prometheus registry could not be installed");
                    None
                }
            }
        })
        .is_some()
}

fn builder() -> Result<PrometheusBuilder, metrics_exporter_prometheus::BuildError> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_duration_seconds".into()), LATENCY_BUCKETS)?
        .set_buckets_for_metric(Matcher::Suffix("_lag_seconds".into()), LAG_BUCKETS)?
        .set_buckets_for_metric(Matcher::Suffix("_batch_size".into()), BATCH_BUCKETS)?
        .set_buckets_for_metric(Matcher::Suffix("_skew_seconds".into()), SKEW_BUCKETS)
}

/// The registry's series as Prometheus text (empty before [`install`]).
pub fn render() -> String {
    match HANDLE.get() {
        Some(Some(handle)) => {
            handle.run_upkeep();
            handle.render()
        }
        _ => String::new(),
    }
}
