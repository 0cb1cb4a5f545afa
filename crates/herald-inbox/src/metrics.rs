//! Counters of what the inbox did, for operators (`GET /api/v1/inbox/stats`) and the logs.
//!
//! Plain atomics: the hot path adds one relaxed increment, and nothing here needs an exporter.

use std::sync::atomic::{AtomicU64, Ordering};

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
    /// A verified request was stored (`duplicate`: it already was).
    pub fn stored(&self, duplicate: bool, bad_input: bool) {
        bump(if duplicate { &self.duplicates } else { &self.accepted });
        if bad_input && !duplicate {
            bump(&self.bad_input);
        }
    }

    /// A request was refused with 413.
    pub fn too_large(&self) {
        bump(&self.too_large);
    }

    /// A request failed verification.
    pub fn rejected(&self, reason: &VerifyError) {
        bump(match reason {
            VerifyError::MissingHeader(_) => &self.rejected_missing_header,
            VerifyError::BadTimestamp => &self.rejected_bad_timestamp,
            VerifyError::TooOld | VerifyError::TooNew => &self.rejected_outside_tolerance,
            VerifyError::MalformedSignatureHeader => &self.rejected_malformed,
            _ => &self.rejected_no_match,
        });
    }

    /// The handler accepted an event.
    pub fn forwarded(&self) {
        bump(&self.forwarded);
    }

    /// A forwarding attempt failed (`dead`: it was the last).
    pub fn forward_failed(&self, dead: bool) {
        bump(&self.forward_failures);
        if dead {
            bump(&self.dead);
        }
    }

    /// The version guard skipped an event.
    pub fn stale(&self) {
        bump(&self.stale);
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
