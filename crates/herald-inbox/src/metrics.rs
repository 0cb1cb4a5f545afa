//! Counters of what the inbox did, for operators: the process totals of `GET /api/v1/inbox/stats`
//! (plain atomics), and the same per source as Prometheus series through the `metrics` facade (label
//! `source`: only configured sources, so the set is bounded), with the backlog gauges and the clock skew.
//!
//! The backlog gauges (`herald_inbox_pending`, `herald_inbox_oldest_pending_age_seconds`) are refreshed
//! every [`BACKLOG_REFRESH`] by `watch_backlog` from the store — one capped count and one index probe per
//! source, whatever the scrape rate — so every process sharing a PostgreSQL database reports the same
//! backlog, whichever of them forwards.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use crate::config::Source;
use crate::store::SharedInboxStore;

/// Requests to a source by `result` (`accepted`, `duplicate`, `rejected`, `too_large`).
pub const REQUESTS: &str = "herald_inbox_requests_total";
/// Requests refused by `reason` (`bad_signature`, `stale_timestamp`, `malformed_header`, `too_large`).
pub const REJECTED: &str = "herald_inbox_rejected_total";
/// Verified events stored as `bad_input`.
pub const BAD_INPUT: &str = "herald_inbox_bad_input_total";
/// Forward attempts by `outcome` (`forwarded`, `failed`).
pub const FORWARDS: &str = "herald_inbox_forward_attempts_total";
/// Events that exhausted the forwarding schedule.
pub const DEAD: &str = "herald_inbox_dead_total";
/// Events the version guard skipped as stale.
pub const STALE: &str = "herald_inbox_stale_total";
/// Pending events of a source (counted up to `Pending::COUNT_CAP`).
pub const PENDING: &str = "herald_inbox_pending";
/// Age of a source's oldest pending (unforwarded) event.
pub const OLDEST_PENDING_AGE: &str = "herald_inbox_oldest_pending_age_seconds";
/// `|receipt − webhook-timestamp|` by `direction` (`behind`: the timestamp is in the past, `ahead`).
pub const CLOCK_SKEW: &str = "herald_inbox_clock_skew_seconds";

/// How often the backlog gauges are refreshed from the store.
pub const BACKLOG_REFRESH: Duration = Duration::from_secs(5);

use herald_signature::VerifyError;
use serde::Serialize;

/// The counters.
#[derive(Debug, Default)]
pub struct Metrics {
    accepted: AtomicU64,
    duplicates: AtomicU64,
    bad_input: AtomicU64,
    too_large: AtomicU64,
    rejected_missing_header: AtomicU64,
    rejected_bad_timestamp: AtomicU64,
    rejected_outside_tolerance: AtomicU64,
    rejected_malformed: AtomicU64,
    rejected_no_match: AtomicU64,
    forwarded: AtomicU64,
    forward_failures: AtomicU64,
    stale: AtomicU64,
    dead: AtomicU64,
}

/// A snapshot of the counters since start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    /// Verified events stored (first copies).
    pub accepted: u64,
    /// Verified copies of events already stored (acknowledged, not stored again).
    pub duplicates: u64,
    /// Verified events stored as `bad_input`.
    pub bad_input: u64,
    /// Requests refused with 413.
    pub too_large: u64,
    /// Requests refused with 401, all reasons.
    pub rejected: u64,
    /// 401: a signature header was missing or empty.
    pub rejected_missing_header: u64,
    /// 401: the timestamp was not a canonical integer.
    pub rejected_bad_timestamp: u64,
    /// 401: the timestamp was outside the tolerance.
    pub rejected_outside_tolerance: u64,
    /// 401: the signature header could not be parsed.
    pub rejected_malformed: u64,
    /// 401: no signature matched any secret.
    pub rejected_no_match: u64,
    /// Events the handler accepted.
    pub forwarded: u64,
    /// Forwarding attempts that failed.
    pub forward_failures: u64,
    /// Events the version guard skipped.
    pub stale: u64,
    /// Events that exhausted the retry schedule.
    pub dead: u64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Metrics {
    /// Start every source's series at zero, so that rates and increases see their first events.
    pub fn register(&self, sources: &[Arc<Source>]) {
        for source in sources {
            let name = source.name.clone();
            for result in ["accepted", "duplicate", "rejected", "too_large"] {
                metrics::counter!(REQUESTS, "source" => name.clone(), "result" => result).absolute(0);
            }
            for reason in ["bad_signature", "stale_timestamp", "malformed_header", "too_large"] {
                metrics::counter!(REJECTED, "source" => name.clone(), "reason" => reason).absolute(0);
            }
            for outcome in ["forwarded", "failed"] {
                metrics::counter!(FORWARDS, "source" => name.clone(), "outcome" => outcome).absolute(0);
            }
            for name_of in [BAD_INPUT, DEAD, STALE] {
                metrics::counter!(name_of, "source" => name.clone()).absolute(0);
            }
        }
    }

    /// A verified request was stored (`duplicate`: it already was).
    pub fn stored(&self, source: &str, duplicate: bool, bad_input: bool) {
        bump(if duplicate { &self.duplicates } else { &self.accepted });
        let result = if duplicate { "duplicate" } else { "accepted" };
        metrics::counter!(REQUESTS, "source" => source.to_owned(), "result" => result).increment(1);
        if bad_input && !duplicate {
            bump(&self.bad_input);
            metrics::counter!(BAD_INPUT, "source" => source.to_owned()).increment(1);
        }
    }

    /// A request was refused with 413.
    pub fn too_large(&self, source: &str) {
        bump(&self.too_large);
        metrics::counter!(REQUESTS, "source" => source.to_owned(), "result" => "too_large").increment(1);
        metrics::counter!(REJECTED, "source" => source.to_owned(), "reason" => "too_large").increment(1);
    }

    /// How far a request's `webhook-timestamp` (Unix seconds) is from its receipt at `now` (Unix seconds).
    pub fn clock_skew(&self, source: &str, timestamp: i64, now: i64) {
        let direction = if timestamp <= now { "behind" } else { "ahead" };
        metrics::histogram!(CLOCK_SKEW, "source" => source.to_owned(), "direction" => direction)
            .record(now.abs_diff(timestamp) as f64);
    }

    /// A request failed verification.
    pub fn rejected(&self, source: &str, reason: &VerifyError) {
        let label = match reason {
            VerifyError::TooOld | VerifyError::TooNew => "stale_timestamp",
            VerifyError::MissingHeader(_) | VerifyError::BadTimestamp | VerifyError::MalformedSignatureHeader => {
                "malformed_header"
            }
            _ => "bad_signature",
        };
        metrics::counter!(REQUESTS, "source" => source.to_owned(), "result" => "rejected").increment(1);
        metrics::counter!(REJECTED, "source" => source.to_owned(), "reason" => label).increment(1);
        bump(match reason {
            VerifyError::MissingHeader(_) => &self.rejected_missing_header,
            VerifyError::BadTimestamp => &self.rejected_bad_timestamp,
            VerifyError::TooOld | VerifyError::TooNew => &self.rejected_outside_tolerance,
            VerifyError::MalformedSignatureHeader => &self.rejected_malformed,
            _ => &self.rejected_no_match,
        });
    }

    /// The handler accepted an event.
    pub fn forwarded(&self, source: &str) {
        bump(&self.forwarded);
        metrics::counter!(FORWARDS, "source" => source.to_owned(), "outcome" => "forwarded").increment(1);
    }

    /// A forwarding attempt failed (`dead`: it was the last).
    pub fn forward_failed(&self, source: &str, dead: bool) {
        bump(&self.forward_failures);
        metrics::counter!(FORWARDS, "source" => source.to_owned(), "outcome" => "failed").increment(1);
        if dead {
            bump(&self.dead);
            metrics::counter!(DEAD, "source" => source.to_owned()).increment(1);
        }
    }

    /// The version guard skipped an event.
    pub fn stale(&self, source: &str) {
        bump(&self.stale);
        metrics::counter!(STALE, "source" => source.to_owned()).increment(1);
    }

    /// The counters now.
    pub fn snapshot(&self) -> Snapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let rejected = [
            &self.rejected_missing_header,
            &self.rejected_bad_timestamp,
            &self.rejected_outside_tolerance,
            &self.rejected_malformed,
            &self.rejected_no_match,
        ]
        .into_iter()
        .map(get)
        .sum();
        Snapshot {
            accepted: get(&self.accepted),
            duplicates: get(&self.duplicates),
            bad_input: get(&self.bad_input),
            too_large: get(&self.too_large),
            rejected,
            rejected_missing_header: get(&self.rejected_missing_header),
            rejected_bad_timestamp: get(&self.rejected_bad_timestamp),
            rejected_outside_tolerance: get(&self.rejected_outside_tolerance),
            rejected_malformed: get(&self.rejected_malformed),
            rejected_no_match: get(&self.rejected_no_match),
            forwarded: get(&self.forwarded),
            forward_failures: get(&self.forward_failures),
            stale: get(&self.stale),
            dead: get(&self.dead),
        }
    }
}

/// Refresh every source's backlog gauges every [`BACKLOG_REFRESH`] until `stopped` turns true.
pub(crate) async fn watch_backlog(
    store: SharedInboxStore,
    sources: Arc<HashMap<String, Arc<Source>>>,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        let now = herald_core::clock::now();
        for name in sources.keys() {
            match store.pending_of(name).await {
                Ok(pending) => {
                    metrics::gauge!(PENDING, "source" => name.clone()).set(pending.count as f64);
                    let age = pending
                        .oldest_received_at
                        .map_or(0.0, |at| now.ms_since(at).max(0) as f64 / 1000.0);
                    metrics::gauge!(OLDEST_PENDING_AGE, "source" => name.clone()).set(age);
                }
                Err(error) => tracing::debug!(%error, source = %name, "reading the inbox backlog failed"),
            }
        }
        tokio::select! {
            () = tokio::time::sleep(BACKLOG_REFRESH) => {}
            _ = stopped.wait_for(|stop| *stop) => return,
        }
    }
}
