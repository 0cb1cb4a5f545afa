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
use tokio::time::Instant;

/// The most endpoints one batch reads: their ids travel as one list parameter.
const LOAD_BATCH: usize = 256;

/// The first pause after a failed read; it doubles up to [`RETRY_MAX`] while reads keep failing.
const RETRY_FIRST: Duration = Duration::from_millis(100);

/// The longest pause between two tries of a failing read.
const RETRY_MAX: Duration = Duration::from_secs(5);

/// Start the loader; endpoints sent to the returned channel are read, and each is reported once to
/// `report`: with its record, or `None` when it is gone (it, or its application, no longer exists). A read
/// that fails is tried again until it succeeds, so no endpoint waits forever on a database that comes
/// back; and one endpoint whose record cannot be read (a value the store refuses to decode) is tried again
/// alone, so it holds up no other. The loader stops when the channel's last sender goes.
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
    // Endpoints whose own read failed, to be read again at `retry_at`; `wait` doubles while they fail.
    let mut failing: Vec<EndpointId> = Vec::new();
    let mut retry_at = Instant::now();
    let mut wait = RETRY_FIRST;
    loop {
        if batch.is_empty() {
            if !failing.is_empty() && Instant::now() >= retry_at {
                batch.append(&mut failing);
            } else if failing.is_empty() {
                if keys.recv_many(&mut batch, LOAD_BATCH).await == 0 {
                    return;
                }
            } else {
                tokio::select! {
                    received = keys.recv_many(&mut batch, LOAD_BATCH) => if received == 0 {
                        return;
                    },
                    () = tokio::time::sleep_until(retry_at) => continue,
                }
            }
        }
        match store.sending_records(&batch, clock::now()).await {
            Ok(records) => {
                report_all(&report, batch.drain(..), records);
                if failing.is_empty() {
                    wait = RETRY_FIRST;
                }
            }
            Err(error) if error.fault().is_some() => {
                // The database is not answering: the same batch again once it may be back.
                tracing::warn!(%error, endpoints = batch.len(), "loading endpoints failed; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(RETRY_MAX);
            }
            Err(error) => {
                if batch.len() > 1 {
                    tracing::warn!(%error, endpoints = batch.len(), "loading endpoints failed; reading them one by one");
                }
                for key in std::mem::take(&mut batch) {
                    let alone = std::slice::from_ref(&key);
                    match store.sending_records(alone, clock::now()).await {
                        Ok(records) => report_all(&report, [key], records),
                        Err(error) => {
                            tracing::warn!(%error, endpoint = %key, "loading endpoint failed; retrying");
                            failing.push(key);
                        }
                    }
                }
                if !failing.is_empty() {
                    retry_at = Instant::now() + wait;
                    wait = (wait * 2).min(RETRY_MAX);
                }
            }
        }
    }
}

/// Report the records read for `asked`, and every endpoint asked for that is not among them as gone.
fn report_all(
    report: &impl Fn(EndpointId, Option<SendingRecord>),
    asked: impl IntoIterator<Item = EndpointId>,
    records: Vec<SendingRecord>,
) {
    let mut gone: HashSet<EndpointId> = asked.into_iter().collect();
    for record in records {
        gone.remove(&record.endpoint.id);
        report(record.endpoint.id.clone(), Some(record));
    }
    for key in gone {
        report(key, None);
    }
}
