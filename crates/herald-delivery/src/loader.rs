//! The engine's endpoint-record loader: one task that reads the records of the endpoints the engine asks
//! for, a batch at a time.
//!
//! A wide fan-out's first message (or a node's start) makes the engine meet hundreds or thousands of
//! endpoints at once. Read one by one, each record took three queries (the endpoint, its previous keys,
//! its application); read together, a batch of up to [`LOAD_BATCH`] endpoints takes three queries in all
//! ([`herald_store::DeliveryStore::sending_records`]). Whatever arrives while a batch is read makes the next
//! one, as in group commit, so a lone endpoint is read at once and a crowd in a few round trips.

use std::collections::HashSet;
use std::time::Duration;

use herald_core::clock;
use herald_core::id::EndpointId;
use herald_store::{SendingRecord, SharedDeliveryStore};
use tokio::sync::mpsc;

/// The most endpoints one batch reads: their ids travel as one list parameter.
const LOAD_BATCH: usize = 256;

/// The first pause after a failed read; it doubles up to [`RETRY_MAX`] while reads keep failing.
const RETRY_FIRST: Duration = Duration::from_millis(100);

/// The longest pause between two tries of a failing read.
const RETRY_MAX: Duration = Duration::from_secs(5);

/// Start the loader; endpoints sent to the returned channel are read, and each is reported once to
/// `report`: with its record, or `None` when it is gone (it, or its application, no longer exists). A
/// read that fails is tried again, the same batch, until it succeeds, so no endpoint waits forever on a
/// database that comes back. The loader stops when the channel's last sender goes.
pub(crate) fn spawn(
    store: SharedDeliveryStore,
    report: impl Fn(EndpointId, Option<SendingRecord>) + Send + 'static,
) -> mpsc::UnboundedSender<EndpointId> {
    let (wanted, keys) = mpsc::unbounded_channel();
    tokio::spawn(run(store, keys, report));
    wanted
}

async fn run(
    store: SharedDeliveryStore,
    mut keys: mpsc::UnboundedReceiver<EndpointId>,
    report: impl Fn(EndpointId, Option<SendingRecord>),
) {
    let mut batch = Vec::with_capacity(LOAD_BATCH);
    let mut wait = RETRY_FIRST;
    loop {
        if batch.is_empty() && keys.recv_many(&mut batch, LOAD_BATCH).await == 0 {
            return;
        }
        match store.sending_records(&batch, clock::now()).await {
            Ok(records) => {
                wait = RETRY_FIRST;
                let mut gone: HashSet<EndpointId> = batch.drain(..).collect();
                for record in records {
                    gone.remove(&record.endpoint.id);
                    report(record.endpoint.id.clone(), Some(record));
                }
                for key in gone {
                    report(key, None);
                }
            }
            Err(error) => {
                tracing::warn!(%error, endpoints = batch.len(), "loading endpoints failed; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(RETRY_MAX);
            }
        }
    }
}
