//! The delivery engine's metrics: their names, what records them, and the per-endpoint series rendered
//! from the engine's memory at scrape time.
//!
//! Two kinds of series:
//! - **node totals** (every endpoint together) go through the `metrics` facade into the process registry:
//!   attempts by outcome class, attempt durations, message-to-delivery lag, dead deliveries, the result
//!   writer's batches, queue and lag;
//! - **per-endpoint series** (labels `app` and `endpoint`, each its uid where set, else its id) are not in
//!   the registry: they are read from the scheduler's queues and from the counters below at scrape time,
//!   and only for the endpoints that need attention — every endpoint whose breaker is not closed, plus the
//!   `top_n` with the oldest pending delivery. The others are summed into the `herald_endpoints_unlisted*`
//!   series. So a scrape costs one pass over the endpoints the node holds (no store query) and its size is
//!   bounded by `top_n` plus the open breakers, however many endpoints there are.

use std::collections::BinaryHeap;
use std::time::Duration;

use herald_core::breaker::BreakerState;
use herald_core::clock::Millis;
use herald_core::outcome::OutcomeClass;
use herald_core::scheduler::EndpointGauges;
use herald_telemetry::text::{Kind, Text};

/// Attempts by outcome class (node total), label `outcome`.
pub const ATTEMPTS: &str = "herald_attempts_total";
/// Attempt durations (node total).
pub const ATTEMPT_DURATION: &str = "herald_attempt_duration_seconds";
/// Message created (or re-queued) → delivered (node total).
pub const DELIVERY_LAG: &str = "herald_delivery_lag_seconds";
/// Deliveries that died (node total).
pub const DEAD: &str = "herald_deliveries_dead_total";
/// Attempts per result-writer batch.
pub const RESULT_BATCH: &str = "herald_result_writer_batch_size";
/// Attempt finished → its record committed.
pub const RESULT_LAG: &str = "herald_result_writer_lag_seconds";
/// Attempt results waiting for the result writer.
pub const RESULT_QUEUE: &str = "herald_result_writer_queue";
/// Result-writer commits that failed (and are retried).
pub const RESULT_ERRORS: &str = "herald_result_writer_errors_total";

/// Every outcome class, in a fixed order (the index into [`EndpointCounters::attempts`]).
const CLASSES: [OutcomeClass; 9] = OutcomeClass::ALL;

/// Per-endpoint attempt-duration buckets (seconds): coarser than the node's, to keep scrapes small.
const ENDPOINT_DURATION_BUCKETS: [f64; 9] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
/// Per-endpoint lag buckets (seconds).
const ENDPOINT_LAG_BUCKETS: [f64; 8] = [1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0];

/// What one finished attempt reports to the metrics.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttemptReport {
    pub(crate) class: OutcomeClass,
    pub(crate) duration_ms: i64,
    /// Pending → delivered, when it was delivered.
    pub(crate) delivered_lag_ms: Option<i64>,
    /// The delivery died with this attempt.
    pub(crate) dead: bool,
}

impl AttemptReport {
    /// Count it in the node totals (called from the attempt's own task, off the engine loop).
    pub(crate) fn record(&self) {
        let node = NodeHandles::get();
        if let Some(index) = CLASSES.iter().position(|c| *c == self.class) {
            node.attempts[index].increment(1);
        }
        node.duration.record(seconds(self.duration_ms));
        if let Some(lag) = self.delivered_lag_ms {
            node.lag.record(seconds(lag));
        }
        if self.dead {
            node.dead.increment(1);
        }
    }
}

/// The node totals' registry handles, looked up once (every class starts at zero, so `rate()` and
/// `increase()` see the first attempts and deaths).
struct NodeHandles {
    attempts: [metrics::Counter; CLASSES.len()],
    duration: metrics::Histogram,
    lag: metrics::Histogram,
    dead: metrics::Counter,
}

impl NodeHandles {
    fn get() -> &'static Self {
        static HANDLES: std::sync::LazyLock<NodeHandles> = std::sync::LazyLock::new(|| NodeHandles {
            attempts: CLASSES.map(|class| metrics::counter!(ATTEMPTS, "outcome" => class.as_str())),
            duration: metrics::histogram!(ATTEMPT_DURATION),
            lag: metrics::histogram!(DELIVERY_LAG),
            dead: metrics::counter!(DEAD),
        });
        &HANDLES
    }
}

/// Register the node totals (at zero) once the registry is installed.
pub(crate) fn register() {
    let _ = NodeHandles::get();
}

/// A batch of `records` attempts was committed, the oldest finished at `oldest_finished_at`.
pub(crate) fn results_committed(records: usize, oldest_finished_at: Millis, now: Millis) {
    metrics::histogram!(RESULT_BATCH).record(records as f64);
    metrics::histogram!(RESULT_LAG).record(seconds(now.ms_since(oldest_finished_at)));
}

/// A result-writer commit failed.
pub(crate) fn results_failed() {
    metrics::counter!(RESULT_ERRORS).increment(1);
}

/// Results waiting in the writer's queue.
pub(crate) fn results_queued(waiting: usize) {
    metrics::gauge!(RESULT_QUEUE).set(waiting as f64);
}

fn seconds(ms: i64) -> f64 {
    ms.max(0) as f64 / 1000.0
}

/// How many of an endpoint's last outcomes are kept (the dashboard's "recent outcomes").
pub const RECENT_OUTCOMES: usize = 20;

/// One endpoint's attempt counters, kept by the engine (only for endpoints that had attempts).
#[derive(Debug, Clone, Default)]
pub(crate) struct EndpointCounters {
    /// The last outcomes, a ring: `recent[next]` is the oldest once it is full.
    recent: [Option<OutcomeClass>; RECENT_OUTCOMES],
    next: usize,
    attempts: [u64; CLASSES.len()],
    dead: u64,
    duration: Buckets<{ ENDPOINT_DURATION_BUCKETS.len() + 1 }>,
    lag: Buckets<{ ENDPOINT_LAG_BUCKETS.len() + 1 }>,
}

#[derive(Debug, Clone)]
struct Buckets<const N: usize> {
    counts: [u64; N],
    sum: f64,
}

impl<const N: usize> Default for Buckets<N> {
    fn default() -> Self {
        Self {
            counts: [0; N],
            sum: 0.0,
        }
    }
}

impl<const N: usize> Buckets<N> {
    fn observe(&mut self, bounds: &[f64], value: f64) {
        let index = bounds.iter().position(|bound| value <= *bound).unwrap_or(bounds.len());
        self.counts[index] += 1;
        self.sum += value;
    }
}

impl EndpointCounters {
    /// Count one attempt.
    pub(crate) fn record(&mut self, report: &AttemptReport) {
        self.recent[self.next] = Some(report.class);
        self.next = (self.next + 1) % RECENT_OUTCOMES;
        if let Some(index) = CLASSES.iter().position(|c| *c == report.class) {
            self.attempts[index] += 1;
        }
        self.duration
            .observe(&ENDPOINT_DURATION_BUCKETS, seconds(report.duration_ms));
        if let Some(lag) = report.delivered_lag_ms {
            self.lag.observe(&ENDPOINT_LAG_BUCKETS, seconds(lag));
        }
        if report.dead {
            self.dead += 1;
        }
    }

    /// The last outcomes' class names, oldest first.
    pub(crate) fn recent(&self) -> Vec<&'static str> {
        (0..RECENT_OUTCOMES)
            .filter_map(|i| self.recent[(self.next + i) % RECENT_OUTCOMES])
            .map(OutcomeClass::as_str)
            .collect()
    }

    /// Attempts by class name (only classes seen).
    pub(crate) fn by_outcome(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        CLASSES
            .iter()
            .zip(self.attempts)
            .filter(|(_, n)| *n > 0)
            .map(|(class, n)| (class.as_str(), n))
    }
}

/// One endpoint as a scrape shows it.
#[derive(Debug, Clone)]
pub struct EndpointRow {
    /// The application's uid, else its id.
    pub app: String,
    /// The endpoint's uid, else its id.
    pub endpoint: String,
    /// Queue figures from the scheduler.
    pub gauges: EndpointGauges,
    /// Attempt counters since this node took the endpoint on.
    pub(crate) counters: EndpointCounters,
}

/// Endpoints summed together because they need no attention of their own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unlisted {
    /// How many.
    pub endpoints: u64,
    /// Their pending deliveries.
    pub pending: u64,
    /// Their requests in flight.
    pub in_flight: u64,
    /// The oldest pending delivery among them became pending then.
    pub oldest_pending_since: Option<Millis>,
}

/// Everything the engine tells a scrape.
#[derive(Debug, Clone)]
pub struct EngineMetrics {
    /// When it was taken.
    pub now: Millis,
    /// The endpoints listed one by one.
    pub listed: Vec<EndpointRow>,
    /// The rest, summed.
    pub unlisted: Unlisted,
    /// Endpoints the scheduler holds.
    pub endpoints: u64,
    /// Endpoints with ready work and leave to send.
    pub ready_endpoints: u64,
    /// Requests in flight on this node.
    pub in_flight: u64,
    /// Pending deliveries on this node (all endpoints).
    pub pending: u64,
}

/// Which endpoints get series of their own: every one whose breaker is not closed, and the `top_n` whose
/// oldest pending delivery is oldest — endpoints with nothing pending rank last, so a node with fewer
/// than `top_n` endpoints lists them all (the healthy ones at zero). Returns the indices into `all`,
/// oldest backlog first, and the sum of the rest.
pub fn select(all: &[EndpointGauges], top_n: usize) -> (Vec<usize>, Unlisted) {
    let mut listed = vec![false; all.len()];
    // A max-heap of the `top_n` oldest (smallest `since`) seen so far: its top is the youngest kept.
    let mut oldest: BinaryHeap<(Millis, usize)> = BinaryHeap::with_capacity(top_n + 1);
    for (index, gauges) in all.iter().enumerate() {
        if gauges.breaker != BreakerState::Closed {
            listed[index] = true;
            continue;
        }
        if top_n == 0 {
            continue;
        }
        oldest.push((gauges.oldest_pending_since.unwrap_or(Millis::MAX), index));
        if oldest.len() > top_n {
            oldest.pop();
        }
    }
    for (_, index) in oldest {
        listed[index] = true;
    }
    let mut unlisted = Unlisted::default();
    let mut chosen = Vec::new();
    for (index, gauges) in all.iter().enumerate() {
        if listed[index] {
            chosen.push(index);
            continue;
        }
        unlisted.endpoints += 1;
        unlisted.pending += gauges.pending;
        unlisted.in_flight += u64::from(gauges.in_flight);
        unlisted.oldest_pending_since = match (unlisted.oldest_pending_since, gauges.oldest_pending_since) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    // Oldest first: the order an operator reads them in.
    chosen.sort_by_key(|index| all[*index].oldest_pending_since.unwrap_or(Millis::MAX));
    (chosen, unlisted)
}

/// How long ago `since` was; never negative (a delivery scheduled for later is pending from its due time).
fn age_seconds(now: Millis, since: Option<Millis>) -> f64 {
    since.map_or(0.0, |since| seconds(now.ms_since(since)))
}

/// A per-endpoint gauge family: its name, kind, help, and how to read it from a row at a time.
type Family = (&'static str, Kind, &'static str, fn(&EndpointRow, Millis) -> f64);

impl EngineMetrics {
    /// The Prometheus text of these figures.
    pub fn render(&self, text: &mut Text) {
        let now = self.now;
        let families: [Family; 7] = [
            (
                "herald_endpoint_pending",
                Kind::Gauge,
                "Pending deliveries of the endpoint (ready, on a retry timer, in flight, or waiting in the store).",
                |r, _| r.gauges.pending as f64,
            ),
            (
                "herald_endpoint_oldest_pending_age_seconds",
                Kind::Gauge,
                "Age of the endpoint's oldest pending delivery (since its message was created or re-queued); 0 when nothing is pending.",
                |r, now| age_seconds(now, r.gauges.oldest_pending_since),
            ),
            (
                "herald_endpoint_in_flight",
                Kind::Gauge,
                "Requests in flight to the endpoint.",
                |r, _| f64::from(r.gauges.in_flight),
            ),
            (
                "herald_endpoint_concurrency_limit",
                Kind::Gauge,
                "Requests the endpoint may have in flight now: its cap, lowered by the breaker; 0 while paused.",
                |r, _| f64::from(r.gauges.concurrency_limit),
            ),
            (
                "herald_endpoint_breaker_open",
                Kind::Gauge,
                "1 while the endpoint's circuit breaker is open or probing, else 0.",
                |r, _| f64::from(u8::from(r.gauges.breaker != BreakerState::Closed)),
            ),
            (
                "herald_endpoint_breaker_open_seconds",
                Kind::Gauge,
                "How long the endpoint has been failing while its breaker is open or probing; 0 when closed.",
                |r, now| {
                    if r.gauges.breaker == BreakerState::Closed {
                        0.0
                    } else {
                        age_seconds(now, r.gauges.failing_since)
                    }
                },
            ),
            (
                "herald_endpoint_paused",
                Kind::Gauge,
                "1 while the endpoint is disabled (paused), else 0.",
                |r, _| f64::from(u8::from(r.gauges.paused)),
            ),
        ];
        for (name, kind, help, value) in families {
            text.family(name, kind, help);
            for row in &self.listed {
                text.sample(name, &row.labels(), value(row, now));
            }
        }
        text.family(
            "herald_endpoint_attempts_total",
            Kind::Counter,
            "Attempts to the endpoint by outcome class, since this node took it on.",
        );
        for row in &self.listed {
            let [app, endpoint] = row.labels();
            for (outcome, count) in row.counters.by_outcome() {
                text.sample(
                    "herald_endpoint_attempts_total",
                    &[app, endpoint, ("outcome", outcome)],
                    count as f64,
                );
            }
        }
        text.family(
            "herald_endpoint_dead_total",
            Kind::Counter,
            "Deliveries to the endpoint that died, since this node took it on.",
        );
        for row in &self.listed {
            text.sample("herald_endpoint_dead_total", &row.labels(), row.counters.dead as f64);
        }
        text.family(
            "herald_endpoint_attempt_duration_seconds",
            Kind::Histogram,
            "Durations of the endpoint's attempts.",
        );
        for row in &self.listed {
            let d = &row.counters.duration;
            text.histogram(
                "herald_endpoint_attempt_duration_seconds",
                &row.labels(),
                &ENDPOINT_DURATION_BUCKETS,
                &d.counts,
                d.sum,
            );
        }
        text.family(
            "herald_endpoint_delivery_lag_seconds",
            Kind::Histogram,
            "Pending → delivered, for the endpoint's delivered deliveries.",
        );
        for row in &self.listed {
            let l = &row.counters.lag;
            text.histogram(
                "herald_endpoint_delivery_lag_seconds",
                &row.labels(),
                &ENDPOINT_LAG_BUCKETS,
                &l.counts,
                l.sum,
            );
        }
        let node: [(&str, &str, f64); 9] = [
            (
                "herald_endpoints_unlisted",
                "Endpoints without series of their own (breaker closed, not among the oldest backlogs).",
                self.unlisted.endpoints as f64,
            ),
            (
                "herald_endpoints_unlisted_pending",
                "Pending deliveries of the unlisted endpoints, together.",
                self.unlisted.pending as f64,
            ),
            (
                "herald_endpoints_unlisted_in_flight",
                "Requests in flight to the unlisted endpoints, together.",
                self.unlisted.in_flight as f64,
            ),
            (
                "herald_endpoints_unlisted_oldest_pending_age_seconds",
                "Age of the oldest pending delivery among the unlisted endpoints.",
                age_seconds(now, self.unlisted.oldest_pending_since),
            ),
            (
                "herald_endpoints_listed",
                "Endpoints with series of their own in this scrape.",
                self.listed.len() as f64,
            ),
            (
                "herald_scheduler_endpoints",
                "Endpoints the node's scheduler holds (its own, with deliveries seen since start).",
                self.endpoints as f64,
            ),
            (
                "herald_scheduler_ready_endpoints",
                "Endpoints with ready work and leave to send.",
                self.ready_endpoints as f64,
            ),
            (
                "herald_scheduler_in_flight",
                "Requests in flight from this node.",
                self.in_flight as f64,
            ),
            (
                "herald_scheduler_pending",
                "Pending deliveries of the endpoints this node delivers for.",
                self.pending as f64,
            ),
        ];
        for (name, help, value) in node {
            text.family(name, Kind::Gauge, help);
            text.sample(name, &[], value);
        }
    }
}

impl EndpointRow {
    fn labels(&self) -> [(&str, &str); 2] {
        [("app", &self.app), ("endpoint", &self.endpoint)]
    }
}

/// How long an engine answer to a scrape may take before the scrape goes without it.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    fn gauges(since: Option<Millis>, breaker: BreakerState) -> EndpointGauges {
        EndpointGauges {
            pending: u64::from(since.is_some()),
            oldest_pending_since: since,
            in_flight: 1,
            concurrency_limit: 10,
            breaker,
            failing_since: None,
            paused: false,
        }
    }

    #[test]
    fn lists_open_breakers_and_the_oldest_backlogs_and_sums_the_rest() {
        let all = [
            gauges(Some(Millis::from_unix_ms(50)), BreakerState::Closed),
            gauges(None, BreakerState::Open),
            gauges(Some(Millis::from_unix_ms(10)), BreakerState::Closed),
            gauges(None, BreakerState::Closed),
            gauges(Some(Millis::from_unix_ms(30)), BreakerState::Closed),
            gauges(Some(Millis::from_unix_ms(90)), BreakerState::HalfOpen),
        ];
        let (listed, rest) = select(&all, 2);
        // The two oldest backlogs (10, 30) oldest first, then the open breakers.
        assert_eq!(listed, vec![2, 4, 5, 1]);
        assert_eq!(rest.endpoints, 2);
        assert_eq!(rest.pending, 1);
        assert_eq!(rest.in_flight, 2);
        assert_eq!(rest.oldest_pending_since, Some(Millis::from_unix_ms(50)));
        let (none, rest) = select(&all, 0);
        assert_eq!(none, vec![5, 1]);
        assert_eq!(rest.endpoints, 4);
        // Room for everyone: the idle endpoints are listed too, last.
        let (every, rest) = select(&all, 10);
        assert_eq!(every, vec![2, 4, 0, 5, 1, 3]);
        assert_eq!(rest, Unlisted::default());
    }

    #[test]
    fn endpoint_counters_count_by_class_and_bucket() {
        let mut counters = EndpointCounters::default();
        let report = |class, duration_ms, lag| AttemptReport {
            class,
            duration_ms,
            delivered_lag_ms: lag,
            dead: false,
        };
        counters.record(&report(OutcomeClass::Success, 40, Some(500)));
        counters.record(&report(OutcomeClass::Timeout, 15_000, None));
        counters.record(&report(OutcomeClass::Timeout, 31_000, None));
        assert_eq!(
            counters.by_outcome().collect::<Vec<_>>(),
            vec![("success", 1), ("timeout", 2)]
        );
        assert_eq!(counters.duration.counts[0], 1);
        assert_eq!(counters.duration.counts[8], 1, "15 s lands under 30 s");
        assert_eq!(counters.duration.counts[9], 1, "31 s is above every bound");
        assert_eq!(counters.lag.counts[0], 1);
        assert_eq!(counters.recent(), vec!["success", "timeout", "timeout"]);
        for _ in 0..RECENT_OUTCOMES {
            counters.record(&report(OutcomeClass::ServerError, 10, None));
        }
        counters.record(&report(OutcomeClass::Success, 10, Some(1)));
        let recent = counters.recent();
        assert_eq!(recent.len(), RECENT_OUTCOMES);
        assert_eq!(recent.last(), Some(&"success"), "newest last");
    }
}
