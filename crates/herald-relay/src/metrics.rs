//! The relay's metrics: names and the helpers the relay calls (through the `metrics` facade: a no-op until
//! the process installs a registry, as `herald serve` and `herald relay --metrics-listen` do).

use std::time::Duration;

/// Outbox rows handled, labels `relay` and `outcome` (`published`, `rejected`).
pub const EVENTS: &str = "herald_relay_events_total";
/// Age of the oldest row still to relay, label `relay`: the relay's lag (0 when the outbox is empty).
pub const OLDEST_AGE: &str = "herald_relay_oldest_unrelayed_age_seconds";
/// Rows still to relay, label `relay`.
pub const BACKLOG: &str = "herald_relay_backlog";
/// From a row's creation in the outbox to Herald's acceptance of it, label `relay`.
pub const PUBLISH_LAG: &str = "herald_relay_publish_lag_seconds";
/// Batches that failed for a reason that is no row's (Herald or the source unreachable or refusing),
/// labels `relay` and `cause` (`herald`, `source`).
pub const FAILURES: &str = "herald_relay_failures_total";

/// Describe the series (their `# HELP` lines).
pub fn register() {
    metrics::describe_counter!(
        EVENTS,
        "Outbox rows handled by the relay, by outcome (published, rejected)."
    );
    metrics::describe_gauge!(
        OLDEST_AGE,
        metrics::Unit::Seconds,
        "Age of the oldest outbox row not yet relayed (0: the outbox is empty)."
    );
    metrics::describe_gauge!(BACKLOG, "Outbox rows not yet relayed.");
    metrics::describe_histogram!(
        PUBLISH_LAG,
        metrics::Unit::Seconds,
        "Time from an outbox row's creation to Herald's acceptance of its message."
    );
    metrics::describe_counter!(
        FAILURES,
        "Relay batches that failed because Herald or the source database failed."
    );
}

/// Rows of one batch were published (`lags`: each one's creation-to-acceptance time) or rejected.
pub(crate) fn batch(relay: &str, lags: &[Duration], rejected: usize) {
    let relay = relay.to_owned();
    metrics::counter!(EVENTS, "relay" => relay.clone(), "outcome" => "published").increment(lags.len() as u64);
    if rejected > 0 {
        metrics::counter!(EVENTS, "relay" => relay.clone(), "outcome" => "rejected").increment(rejected as u64);
    }
    let histogram = metrics::histogram!(PUBLISH_LAG, "relay" => relay);
    for lag in lags {
        histogram.record(lag.as_secs_f64());
    }
}

/// The outbox's backlog was measured.
pub(crate) fn backlog(relay: &str, oldest_age: Duration, waiting: u64) {
    metrics::gauge!(OLDEST_AGE, "relay" => relay.to_owned()).set(oldest_age.as_secs_f64());
    metrics::gauge!(BACKLOG, "relay" => relay.to_owned()).set(waiting as f64);
}

/// A batch failed because of Herald (`herald`) or the source database (`source`).
pub(crate) fn failure(relay: &str, cause: &'static str) {
    metrics::counter!(FAILURES, "relay" => relay.to_owned(), "cause" => cause).increment(1);
}
