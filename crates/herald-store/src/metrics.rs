//! The store's metrics: their names and the one-line helpers the store calls.
//!
//! Recorded through the `metrics` facade (a no-op until the process installs a registry; see
//! `herald-telemetry`).

use std::time::Duration;

/// Messages per ingest group commit.
pub const INGEST_BATCH: &str = "herald_store_ingest_batch_size";
/// Time to write and commit one ingest batch.
pub const INGEST_COMMIT: &str = "herald_store_ingest_commit_duration_seconds";
/// Ingest batches, label `result` (`committed`, `failed`).
pub const INGEST_BATCHES: &str = "herald_store_ingest_batches_total";
/// PostgreSQL ingest batches that tried to commit in one statement, trusting the app rows the writer
/// remembers, and were refused (nothing written; written again the usual way), label `reason`:
/// `lock_busy` (the ingest lock was taken: another node's batch, a re-queue), `row_moved` (an app's row
/// changed or was held), `message` (a message repeated a stored one, or the database refused it).
pub const INGEST_SHORTCUT_REFUSED: &str = "herald_store_ingest_shortcut_refused_total";
/// PostgreSQL ingest batches committed as one statement outside a transaction block, trusting the app
/// rows the writer remembers (only on a node alone in its cluster; see `postgres/remembered.rs`).
pub const INGEST_ONE_STATEMENT: &str = "herald_store_ingest_one_statement_batches_total";
/// Messages waiting for a later batch because another transaction holds their application's row
/// (PostgreSQL: an endpoint write, an application's delete), with those queued behind them in order.
pub const INGEST_DEFERRED: &str = "herald_store_ingest_deferred";
/// Chunks of wide fan-outs (PostgreSQL, split from their message's batch) this node's writer holds, their
/// delivery rows not written yet.
pub const FAN_OUT_PENDING: &str = "herald_store_fan_out_pending";
/// Chunks of split fan-outs, label `result`: `expanded` (their delivery rows written), `failed` (tried
/// again), `given_up` (refused by the database; left for the next sweep).
pub const FAN_OUT_EXPANSIONS: &str = "herald_store_fan_out_expansions_total";
/// Partitions whose lease this node holds (PostgreSQL), labels `state` (`active`, `draining`).
pub const PARTITIONS: &str = "herald_partitions_owned";
/// Lease rounds (renewal, heartbeat, rebalancing), label `result` (`ok`, `error`, `timeout`).
pub const LEASE_ROUNDS: &str = "herald_lease_renewals_total";

/// Rows of the same-database outbox (`herald_publish`) turned into messages, label `result` (`published`,
/// `refused`).
pub const OUTBOX_EVENTS: &str = "herald_outbox_events_total";
/// Rows of the same-database outbox still to turn into messages.
pub const OUTBOX_BACKLOG: &str = "herald_outbox_backlog";
/// Age of the oldest of those rows: the outbox's lag.
pub const OUTBOX_OLDEST_AGE: &str = "herald_outbox_oldest_age_seconds";

/// A round of outbox rows was ingested.
pub(crate) fn outbox_round(published: u64, refused: u64) {
    metrics::counter!(OUTBOX_EVENTS, "result" => "published").increment(published);
    if refused > 0 {
        metrics::counter!(OUTBOX_EVENTS, "result" => "refused").increment(refused);
    }
}

/// The outbox's backlog was measured: `waiting` rows, the oldest `age_seconds` old.
pub(crate) fn outbox_backlog(waiting: i64, age_seconds: f64) {
    metrics::gauge!(OUTBOX_BACKLOG).set(waiting as f64);
    metrics::gauge!(OUTBOX_OLDEST_AGE).set(age_seconds);
}

/// An ingest batch of `messages` was written (`committed`: its transaction committed) in `took`.
pub(crate) fn ingest_batch(messages: usize, took: Duration, committed: bool) {
    metrics::histogram!(INGEST_BATCH).record(messages as f64);
    metrics::histogram!(INGEST_COMMIT).record(took.as_secs_f64());
    let result = if committed { "committed" } else { "failed" };
    metrics::counter!(INGEST_BATCHES, "result" => result).increment(1);
}

/// A batch that tried to commit in one statement was refused (see [`INGEST_SHORTCUT_REFUSED`]).
pub(crate) fn ingest_shortcut_refused(reason: &'static str) {
    metrics::counter!(INGEST_SHORTCUT_REFUSED, "reason" => reason).increment(1);
}

/// A batch was committed in one statement (see [`INGEST_ONE_STATEMENT`]).
pub(crate) fn ingest_one_statement() {
    metrics::counter!(INGEST_ONE_STATEMENT).increment(1);
}

/// `jobs` messages wait for a later batch (see [`INGEST_DEFERRED`]).
pub(crate) fn ingest_deferred(jobs: usize) {
    metrics::gauge!(INGEST_DEFERRED).set(jobs as f64);
}

/// The results [`fan_out_expansions`] counts.
const FAN_OUT_RESULTS: [&str; 3] = ["expanded", "failed", "given_up"];

/// A writer that splits fan-outs started: every series of [`FAN_OUT_EXPANSIONS`] and [`FAN_OUT_PENDING`]
/// is published at 0, so that a first `given_up` is an increase Prometheus sees (a counter series that
/// first appears at 1 has no increase in `increase()`, and `HeraldFanOutStuck` would miss it).
pub(crate) fn fan_out_started() {
    for result in FAN_OUT_RESULTS {
        metrics::counter!(FAN_OUT_EXPANSIONS, "result" => result).increment(0);
    }
    fan_out_pending(0);
}

/// `chunks` chunks of split fan-outs ended as `result` (see [`FAN_OUT_EXPANSIONS`]).
pub(crate) fn fan_out_expansions(result: &'static str, chunks: usize) {
    metrics::counter!(FAN_OUT_EXPANSIONS, "result" => result).increment(chunks as u64);
}

/// The writer holds `chunks` chunks of split fan-outs.
pub(crate) fn fan_out_pending(chunks: usize) {
    metrics::gauge!(FAN_OUT_PENDING).set(chunks as f64);
}

/// A lease round ended (`result`: `ok`, `error` or `timeout`), holding `active` and `draining` partitions.
pub(crate) fn lease_round(result: &'static str, active: usize, draining: usize) {
    metrics::counter!(LEASE_ROUNDS, "result" => result).increment(1);
    metrics::gauge!(PARTITIONS, "state" => "active").set(active as f64);
    metrics::gauge!(PARTITIONS, "state" => "draining").set(draining as f64);
}
