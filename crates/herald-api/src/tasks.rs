//! Bulk repairs run as tracked background tasks: `recover` (re-queue an endpoint's failed and dead
//! deliveries in a window) and `replay-missing` (give an endpoint the messages of a window it never got).
//!
//! A task works in chunks, one short transaction each, and records its progress after every chunk, so
//! `GET /background-task/{id}` shows how far it is and the single write connection is never held for
//! long. It does not send anything itself: it makes deliveries pending and tells the delivery engine,
//! which sends them through the endpoint's usual concurrency cap, pacing, circuit breaker and slow start —
//! that is what keeps a recovering endpoint from being flooded. Only deliveries that are not already
//! pending are touched, so running a repair twice never queues anything twice.

use std::time::Duration;

use herald_core::clock::now_ms;
use herald_core::id::{IdKind, new_id};
use herald_core::model::{BackgroundTask, Endpoint};
use herald_store::StoreResult;
use serde_json::json;

use crate::state::AppState;

/// Deliveries or messages handled per transaction.
const CHUNK: usize = 500;
/// A pause between chunks, leaving the write connection to ingest and results.
const BREATHER: Duration = Duration::from_millis(5);

/// Which repair to run.
#[derive(Debug, Clone)]
pub(crate) enum Repair {
    /// Re-queue failed and dead deliveries.
    Recover,
    /// Create the deliveries the endpoint never got.
    ReplayMissing,
}

impl Repair {
    fn kind(&self) -> &'static str {
        match self {
            Repair::Recover => "endpoint.recover",
            Repair::ReplayMissing => "endpoint.replay",
        }
    }
}

/// Record a task for `repair` on `endpoint` over `[since, until)` and start it in the background.
pub(crate) async fn start(
    state: &AppState,
    repair: Repair,
    endpoint: Endpoint,
    since: i64,
    until: i64,
) -> StoreResult<BackgroundTask> {
    let total = match repair {
        Repair::Recover => state.store.count_failed(&endpoint.id, since, until).await?,
        Repair::ReplayMissing => state.store.count_messages(&endpoint.app_id, since, until).await?,
    };
    let now = now_ms();
    let task = BackgroundTask {
        id: new_id(IdKind::Task),
        kind: repair.kind().to_owned(),
        app_id: endpoint.app_id.clone(),
        state: "running".to_owned(),
        processed: 0,
        total,
        data: json!({ "endpointId": endpoint.id, "since": since, "until": until }).to_string(),
        created_at: now,
        updated_at: now,
    };
    state.store.create_task(&task).await?;
    crate::metrics::task(repair.kind(), "started");
    let state = state.clone();
    let running = task.clone();
    tokio::spawn(async move {
        let mut task = running;
        let outcome = run(&state, &repair, &endpoint, since, until, &mut task).await;
        task.updated_at = now_ms();
        match outcome {
            Ok(queued) => {
                crate::metrics::task(repair.kind(), "finished");
                task.state = "finished".to_owned();
                task.data =
                    json!({ "endpointId": endpoint.id, "since": since, "until": until, "queued": queued }).to_string();
            }
            Err(error) => {
                tracing::warn!(%error, task = %task.id, "background task failed");
                crate::metrics::task(repair.kind(), "failed");
                task.state = "failed".to_owned();
                task.data = json!({ "endpointId": endpoint.id, "error": error.to_string() }).to_string();
            }
        }
        if let Err(error) = state.store.update_task(&task).await {
            tracing::warn!(%error, task = %task.id, "recording the end of a background task failed");
        }
    });
    Ok(task)
}

/// Work through the repair chunk by chunk; returns how many deliveries it made pending.
async fn run(
    state: &AppState,
    repair: &Repair,
    endpoint: &Endpoint,
    since: i64,
    until: i64,
    task: &mut BackgroundTask,
) -> StoreResult<u64> {
    let mut queued = 0;
    let mut cursor: Option<String> = None;
    loop {
        let now = now_ms();
        let (done, made_pending, handled) = match repair {
            Repair::Recover => {
                let n = state
                    .store
                    .requeue_failed(&endpoint.id, since, until, CHUNK, now)
                    .await?;
                (n < CHUNK as u64, n, n)
            }
            Repair::ReplayMissing => {
                let (last, created) = state
                    .store
                    .add_missing_deliveries(endpoint, since, until, cursor.as_deref(), CHUNK, now)
                    .await?;
                let done = last.is_none();
                cursor = last;
                // Messages scanned in this chunk: a full chunk unless it was the last.
                let scanned = if done {
                    task.total.saturating_sub(task.processed)
                } else {
                    CHUNK as u64
                };
                (done, created, scanned)
            }
        };
        queued += made_pending;
        task.processed += handled;
        // Deliveries that failed after the count was taken make the job larger than announced.
        task.total = task.total.max(task.processed);
        task.updated_at = now_ms();
        if made_pending > 0 {
            state.engine_backlog(&endpoint.id);
        }
        if done {
            return Ok(queued);
        }
        state.store.update_task(task).await?;
        tokio::time::sleep(BREATHER).await;
    }
}
