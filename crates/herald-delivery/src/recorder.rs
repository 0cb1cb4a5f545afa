//! The result writer: appends attempts and updates deliveries in batched transactions.
//!
//! Workers hand their outcomes here and move on. Batching keeps the store's write load proportional to
//! the number of commits, not the number of attempts. A result that is lost because the process died
//! before its batch committed only means the delivery is sent again after restart (at-least-once, same
//! `webhook-id`); custody of the *message* never depends on this path.

use std::time::Duration;

use herald_store::{AttemptRecord, SharedDeliveryStore};
use tokio::sync::mpsc;

/// The most attempts written in one transaction.
const MAX_BATCH: usize = 1_024;
/// How long the writer gathers results before it commits a batch that is not yet full.
const LINGER: Duration = Duration::from_millis(5);

/// Write batches until every sender is gone.
pub(crate) async fn run(store: SharedDeliveryStore, mut results: mpsc::Receiver<AttemptRecord>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while results.recv_many(&mut batch, MAX_BATCH).await > 0 {
        // Results are off every latency path, ingest commits are not, and both take turns on the
        // database (on SQLite the group-commit writer writes both, results in its next ingest batch's
        // transaction). Gathering results for a moment turns many small writes into one.
        if batch.len() < MAX_BATCH {
            tokio::time::sleep(LINGER).await;
            while batch.len() < MAX_BATCH {
                match results.try_recv() {
                    Ok(record) => batch.push(record),
                    Err(_) => break,
                }
            }
        }
        crate::metrics::results_queued(results.len());
        let oldest = batch.iter().map(|r| r.attempt.finished_at()).min();
        let mut wait = Duration::from_millis(50);
        // Keep trying: dropping a batch would lose the attempt log and leave deliveries pending (which
        // would then be re-sent after a restart). A store outage stalls results, not ingest custody.
        while let Err(error) = store.record_attempts(&batch).await {
            tracing::error!(%error, records = batch.len(), "recording attempts failed; retrying");
            crate::metrics::results_failed();
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(5));
        }
        crate::metrics::results_committed(batch.len(), oldest.unwrap_or_default(), herald_core::clock::now());
        batch.clear();
    }
}
