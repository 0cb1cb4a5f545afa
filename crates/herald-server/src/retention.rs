//! The retention job: every `retention_interval`, delete attempts and operational events (sent or not)
//! older than `retention` and expunge the payloads whose `payloadRetentionPeriod` has passed (metadata
//! and attempts of those messages stay).
//!
//! It works in small batches, each its own short transaction, with a pause between them, so the single
//! write connection is never held long: ingest and delivery results slip in between batches.

use std::time::Duration;

use herald_core::clock;
use herald_store::{RetentionStep, SharedStore, StoreResult};
use tokio::task::JoinHandle;

/// Rows per batch.
const BATCH: usize = 500;
/// A pause between batches, leaving the write connection to ingest and results.
const BREATHER: Duration = Duration::from_millis(10);

/// Start the job: a first run right away, then one every `interval`.
pub fn spawn(store: SharedStore, retention: Duration, interval: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let run = run_once(&store, retention).await;
            record(&run);
            match run {
                Ok(done) if done != RetentionStep::default() => tracing::info!(
                    attempts_deleted = done.attempts_deleted,
                    payloads_expunged = done.payloads_expunged,
                    events_deleted = done.events_deleted,
                    "retention run done"
                ),
                Ok(_) => {}
                // The next run picks up where this one stopped.
                Err(error) => tracing::warn!(%error, "retention run failed"),
            }
        }
    })
}

/// Retention runs by `result` (`ok`, `error`).
pub const RUNS: &str = "herald_retention_runs_total";
/// Rows the retention job removed, by `what` (`attempts`, `payloads`, `operational_events`).
pub const REMOVED: &str = "herald_retention_removed_total";
/// When the last retention run ended well (Unix seconds).
pub const LAST_SUCCESS: &str = "herald_retention_last_success_timestamp_seconds";

fn record(run: &StoreResult<RetentionStep>) {
    match run {
        Ok(done) => {
            metrics::counter!(RUNS, "result" => "ok").increment(1);
            for (what, count) in [
                ("attempts", done.attempts_deleted),
                ("payloads", done.payloads_expunged),
                ("operational_events", done.events_deleted),
            ] {
                metrics::counter!(REMOVED, "what" => what).increment(count);
            }
            metrics::gauge!(LAST_SUCCESS).set(clock::now().as_unix_ms() as f64 / 1000.0);
        }
        Err(_) => metrics::counter!(RUNS, "result" => "error").increment(1),
    }
}

/// One run: batches until nothing old is left; returns the totals.
pub async fn run_once(store: &SharedStore, retention: Duration) -> StoreResult<RetentionStep> {
    let now = clock::now();
    let cutoff = now - retention;
    let mut total = RetentionStep::default();
    loop {
        let step = store.retention_step(cutoff, now, BATCH).await?;
        total.attempts_deleted += step.attempts_deleted;
        total.payloads_expunged += step.payloads_expunged;
        total.events_deleted += step.events_deleted;
        if !step.was_full(BATCH) {
            return Ok(total);
        }
        tokio::time::sleep(BREATHER).await;
    }
}
