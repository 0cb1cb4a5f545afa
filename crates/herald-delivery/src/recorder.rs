//! The result writer: appends attempts and updates deliveries in batched transactions.
//!
//! Workers hand their outcomes here and move on. Batching keeps the store's write load proportional to
//! the number of commits, not the number of attempts. A result that is lost because the process died
//! before its batch committed only means the delivery is sent again after restart (at-least-once, same
//! `webhook-id`); custody of the *message* never depends on this path.

use std::time::Duration;

use herald_store::{AttemptRecord, SharedDeliveryStore, StoreResult};
use tokio::sync::mpsc;

use crate::handover::Held;

/// How long the writer gathers results before it commits a batch that is not yet full.
const LINGER: Duration = Duration::from_millis(5);

/// Where the result writer's batches go: the store, seen as the two things the writer needs of it.
pub(crate) trait ResultSink {
    /// The most results one batch carries ([`herald_store::DeliveryStore::results_per_call`]).
    fn per_batch(&self) -> usize;
    /// Commit one batch.
    async fn record(&self, batch: &[AttemptRecord]) -> StoreResult<()>;
}

impl ResultSink for SharedDeliveryStore {
    fn per_batch(&self) -> usize {
        self.results_per_call()
    }

    async fn record(&self, batch: &[AttemptRecord]) -> StoreResult<()> {
        self.record_attempts(batch).await
    }
}

/// An attempt's result on its way to the store, with its count in what a handed-over partition still
/// has in flight (see [`crate::handover`]): dropped once the result is written.
pub(crate) struct Recorded {
    pub(crate) record: AttemptRecord,
    pub(crate) held: Held,
}

impl From<AttemptRecord> for Recorded {
    fn from(record: AttemptRecord) -> Self {
        Self {
            record,
            held: Held::NONE,
        }
    }
}

/// Write batches until every sender is gone.
pub(crate) async fn run(store: impl ResultSink, mut results: mpsc::Receiver<Recorded>) {
    // At least one, or `recv_many` would take nothing and the loop would end at once.
    let most = store.per_batch().max(1);
    let mut queued = Vec::with_capacity(most);
    let mut batch = Vec::with_capacity(most);
    let mut held = Vec::with_capacity(most);
    while results.recv_many(&mut queued, most).await > 0 {
        // Results are off every latency path, ingest commits are not, and both take turns on the
        // database (on SQLite the group-commit writer writes both, results in its next ingest batch's
        // transaction). Gathering results for a moment turns many small writes into one.
        if queued.len() < most {
            tokio::time::sleep(LINGER).await;
            while queued.len() < most {
                match results.try_recv() {
                    Ok(record) => queued.push(record),
                    Err(_) => break,
                }
            }
        }
        for Recorded { record, held: count } in queued.drain(..) {
            batch.push(record);
            held.push(count);
        }
        crate::metrics::results_queued(results.len());
        let oldest = batch.iter().map(|r| r.attempt.finished_at()).min();
        let mut wait = Duration::from_millis(50);
        // Keep trying: dropping a batch would lose the attempt log and leave deliveries pending (which
        // would then be re-sent after a restart). A store outage stalls results, not ingest custody.
        while let Err(error) = store.record(&batch).await {
            tracing::error!(%error, records = batch.len(), "recording attempts failed; retrying");
            crate::metrics::results_failed();
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(5));
        }
        crate::metrics::results_committed(batch.len(), oldest.unwrap_or_default(), herald_core::clock::now());
        batch.clear();
        // Written: what a handed-over partition has in flight drops only now.
        held.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use herald_core::clock;
    use herald_core::id::{AppId, AttemptId, EndpointId, MessageId};
    use herald_core::model::{Attempt, AttemptTrigger, DeliveryStatus};
    use herald_core::outcome::OutcomeClass;
    use herald_store::testdb::test_cipher;
    use herald_store::{AttemptFilter, PageRequest, SharedStore};

    use super::*;

    /// A real store, with the size of every batch the writer hands it noted.
    struct Noted {
        store: SharedStore,
        batches: Arc<Mutex<Vec<usize>>>,
    }

    impl ResultSink for Noted {
        fn per_batch(&self) -> usize {
            self.store.results_per_call()
        }

        async fn record(&self, batch: &[AttemptRecord]) -> StoreResult<()> {
            self.batches.lock().expect("not poisoned").push(batch.len());
            self.store.record_attempts(batch).await
        }
    }

    /// A first attempt's success, for delivery `seq` of `message_id` to `endpoint_id`.
    fn result(app_id: &AppId, message_id: &MessageId, endpoint_id: &EndpointId, seq: i64) -> AttemptRecord {
        AttemptRecord {
            delivery_seq: seq,
            app_id: app_id.clone(),
            attempt: Attempt {
                id: AttemptId::new(),
                message_id: message_id.clone(),
                endpoint_id: endpoint_id.clone(),
                url: "http://127.0.0.1:9/".into(),
                attempt_number: 1,
                success: true,
                outcome: OutcomeClass::Success,
                response_status: Some(200),
                response: String::new(),
                duration_ms: 1,
                trigger: AttemptTrigger::Scheduled,
                created_at: clock::now(),
            },
            status: DeliveryStatus::Delivered,
            next_attempt_at: clock::now(),
        }
    }

    /// Run the writer over a backlog of results queued at once (a wide fan-out's) on `store`, and check
    /// that it goes in full batches of the store's size, then the rest, and that every result is
    /// stored. The backlog is two batches and a bit, so that each engine's size shows.
    async fn a_backlog_goes_in_batches_of_the_stores_size(store: SharedStore) {
        let most = store.results_per_call();
        let backlog = 2 * most + 3;
        let (app_id, message_id, endpoint_id) = (AppId::new(), MessageId::new(), EndpointId::new());
        let (sender, queue) = mpsc::channel(backlog);
        for seq in 1..=backlog {
            let seq = i64::try_from(seq).expect("a small backlog");
            sender
                .send(result(&app_id, &message_id, &endpoint_id, seq).into())
                .await
                .expect("queued");
        }
        drop(sender);
        let batches = Arc::new(Mutex::new(Vec::new()));
        let noted = Noted {
            store: store.clone(),
            batches: batches.clone(),
        };
        // The writer tries a failing store again forever: a fault here must fail the test, not hang it.
        tokio::time::timeout(Duration::from_secs(60), run(noted, queue))
            .await
            .expect("the writer wrote the backlog and stopped");

        // Everything was queued before the writer started: full batches of the store's size, then the rest.
        let batches = batches.lock().expect("not poisoned").clone();
        assert_eq!(batches, [most, most, 3], "batches of {most}, every result once");
        let mut stored = 0;
        let mut page = PageRequest {
            limit: 250,
            after: None,
            reverse: false,
        };
        // A page more than the backlog needs at most, so that a listing that never ends fails the count.
        for _ in 0..=backlog.div_ceil(250) {
            let found = store
                .list_attempts_by_message(&app_id, &message_id, &AttemptFilter::default(), &page)
                .await
                .expect("list the attempts");
            stored += found.items.len();
            if found.done {
                break;
            }
            page.after = found.iterator;
        }
        assert_eq!(stored, backlog, "the store holds every result");
    }

    /// A store whose writes wait until the test lets one through.
    struct Gated(Arc<tokio::sync::Semaphore>);

    impl ResultSink for Gated {
        fn per_batch(&self) -> usize {
            16
        }

        async fn record(&self, _batch: &[AttemptRecord]) -> StoreResult<()> {
            self.0.acquire().await.expect("the gate stays open").forget();
            Ok(())
        }
    }

    /// A handed-over partition's attempt counts as in flight until its result is written, not merely
    /// handed to the writer: releasing the lease earlier would fence the result out and send the delivery
    /// again.
    #[tokio::test]
    async fn an_attempt_counts_as_in_flight_until_its_result_is_written() {
        let in_flight = Arc::new(crate::handover::InFlight::default());
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let (sender, queue) = mpsc::channel(4);
        let writer = tokio::spawn(run(Gated(gate.clone()), queue));
        let (app_id, message_id, endpoint_id) = (AppId::new(), MessageId::new(), EndpointId::new());
        sender
            .send(Recorded {
                record: result(&app_id, &message_id, &endpoint_id, 1),
                held: in_flight.hold(5),
            })
            .await
            .expect("queued");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!in_flight.is_idle(5), "taken by the writer, not yet written");

        gate.add_permits(1);
        tokio::time::timeout(Duration::from_secs(5), in_flight.until_some_idle(&[5]))
            .await
            .expect("idle once written");
        drop(sender);
        writer.await.expect("the writer stopped");
    }

    /// On SQLite, whose one writer makes ingest wait behind results, the batches are small.
    #[tokio::test]
    async fn sqlite_takes_a_backlog_of_results_in_small_batches() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let url = format!("sqlite://{}", dir.path().join("herald.db").display());
        let store = herald_store::open_with(&url, test_cipher(), &herald_store::StoreOptions::default())
            .await
            .expect("open the store");
        let most = store.results_per_call();
        assert!(most <= 128, "SQLite takes results in small batches ({most})");
        a_backlog_goes_in_batches_of_the_stores_size(store).await;
    }

    /// On PostgreSQL, whose results take a connection beside ingest's, the batches are large; its store
    /// is the bounded decorator, so this also shows the size passes through it.
    #[tokio::test]
    async fn postgres_takes_a_backlog_of_results_in_large_batches() {
        let Some(database) = herald_store::testdb::fresh("recorder_backlog_in_large_batches").await else {
            return;
        };
        let store = herald_store::open_with(&database.url, test_cipher(), &herald_store::StoreOptions::default())
            .await
            .expect("open the store");
        let most = store.results_per_call();
        assert!(most >= 1_000, "PostgreSQL takes results in large batches ({most})");
        a_backlog_goes_in_batches_of_the_stores_size(store).await;
    }
}
