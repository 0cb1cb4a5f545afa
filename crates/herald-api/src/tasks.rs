//! Bulk repairs run as tracked background tasks: `recover` (re-queue an endpoint's failed and dead
//! deliveries in a window), `replay-missing` (give an endpoint the messages of a window it never got) and
//! `bulk-replay` (send an endpoint again the messages of a window it was sent, narrowed by filters); and
//! `expunge-all-contents` (remove the payload of every message of an application).
//!
//! A task works in chunks, one short transaction each, and records its progress after every chunk, so
//! `GET /background-task/{id}` shows how far it is and the single write connection is never held for
//! long. It does not send anything itself: it makes deliveries pending, and the store announces them to
//! the delivery engine, which sends them through the endpoint's usual concurrency cap, pacing, circuit
//! breaker and slow start — that is what keeps a recovering endpoint from being flooded. Only deliveries that are not already
//! pending are touched, so running a repair twice never queues anything twice.
//!
//! Recover and bulk replay take deliveries in `seq` order up to the highest `seq` that existed when they
//! started, and a re-queued delivery gets a new `seq` above it: each delivery is taken at most once, even
//! if it is delivered again before the task ends. Their task rows carry the whole selection and the last
//! `seq` taken, so a task interrupted by a stop (even `kill -9`) is carried on where it was by the next
//! start ([`resume_interrupted`]), and so is an expunge of every payload (it takes only payloads not yet
//! expunged, so it simply starts over); replay-missing is marked failed instead (running it again is
//! safe).

use std::time::Duration;

use herald_core::clock::{self, Millis};
use herald_core::id::{AppId, EndpointId, MessageId, TaskId};
use herald_core::model::{AttemptTrigger, BackgroundTask, DeliveryStatus, Endpoint, TaskKind, TaskState};
use herald_store::{RequeueSelection, StoreError, StoreResult};
use serde_json::{Value, json};

use crate::state::AppState;

/// Deliveries or messages handled per transaction.
const CHUNK: usize = 500;
/// A pause between chunks, leaving the write connection to ingest and results.
const BREATHER: Duration = Duration::from_millis(5);
/// How often a running process looks for tasks that another, stopped node left behind (PostgreSQL).
const ORPHAN_SWEEP: Duration = Duration::from_secs(20);

/// The task kinds whose rows carry enough to be carried on after a stop.
const RESUMABLE: [TaskKind; 3] = [TaskKind::Recover, TaskKind::BulkReplay, TaskKind::PurgeContent];

/// What a bulk replay takes besides its window, as the caller gave it (Svix `BulkReplayIn`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ReplayFilter {
    /// Only messages of these event types.
    pub(crate) event_types: Option<Vec<String>>,
    /// Only messages on this channel.
    pub(crate) channel: Option<String>,
    /// Only messages with this tag.
    pub(crate) tag: Option<String>,
    /// Svix's `MessageStatus` of the delivery (0 success, 1 pending, 2 fail, 3 sending, 4 canceled).
    pub(crate) status: Option<i64>,
    /// The latest attempt's status class (0 none, 100 … 500).
    pub(crate) status_code_class: Option<i64>,
}

impl ReplayFilter {
    /// The delivery states a bulk replay with this filter takes: every finished one, or those of the
    /// Svix status asked for (pending and sending ones are on their way already, so none).
    fn statuses(&self) -> Vec<DeliveryStatus> {
        match self.status {
            None => vec![
                DeliveryStatus::Delivered,
                DeliveryStatus::Failed,
                DeliveryStatus::Dead,
                DeliveryStatus::Cancelled,
            ],
            Some(0) => vec![DeliveryStatus::Delivered],
            Some(2) => vec![DeliveryStatus::Failed, DeliveryStatus::Dead],
            Some(4) => vec![DeliveryStatus::Cancelled],
            Some(_) => Vec::new(),
        }
    }
}

/// Which repair to run.
#[derive(Debug, Clone)]
pub(crate) enum Repair {
    /// Re-queue failed and dead deliveries.
    Recover,
    /// Create the deliveries the endpoint never got.
    ReplayMissing,
    /// Re-queue the finished deliveries that match the filter.
    BulkReplay(ReplayFilter),
}

impl Repair {
    fn kind(&self) -> TaskKind {
        match self {
            Repair::Recover => TaskKind::Recover,
            Repair::ReplayMissing => TaskKind::ReplayMissing,
            Repair::BulkReplay(_) => TaskKind::BulkReplay,
        }
    }
}

/// A task's parameters and progress, as its row's `data` carries them.
#[derive(Debug, Clone)]
struct Plan {
    endpoint_id: EndpointId,
    since: Millis,
    until: Millis,
    repair: Repair,
    /// Recover and bulk replay: the highest `seq` they take, and the last one taken so far.
    through_seq: i64,
    after_seq: i64,
    /// Deliveries made pending so far.
    queued: u64,
}

impl Plan {
    /// The selection of a recover or bulk replay, from where it is.
    fn selection(&self) -> Option<RequeueSelection> {
        let (statuses, trigger, filter) = match &self.repair {
            Repair::Recover => (
                vec![DeliveryStatus::Failed, DeliveryStatus::Dead],
                AttemptTrigger::Recover,
                ReplayFilter::default(),
            ),
            // A replay asked for by hand, like a resend.
            Repair::BulkReplay(filter) => (filter.statuses(), AttemptTrigger::Manual, filter.clone()),
            Repair::ReplayMissing => return None,
        };
        Some(RequeueSelection {
            endpoint_id: self.endpoint_id.clone(),
            statuses,
            since: self.since,
            until: self.until,
            event_types: filter.event_types,
            channel: filter.channel,
            tag: filter.tag,
            status_class: filter.status_code_class,
            after_seq: self.after_seq,
            through_seq: self.through_seq,
            trigger,
        })
    }

    /// The task's `data`: everything needed to carry it on, and its result so far.
    fn data(&self) -> Value {
        let mut data = json!({
            "endpointId": self.endpoint_id,
            "since": self.since,
            "until": self.until,
            "queued": self.queued,
        });
        if !matches!(self.repair, Repair::ReplayMissing) {
            data["throughSeq"] = json!(self.through_seq);
            data["afterSeq"] = json!(self.after_seq);
        }
        if let Repair::BulkReplay(filter) = &self.repair {
            // Svix's name for the result of a bulk replay.
            data["messagesSent"] = json!(self.queued);
            data["eventTypes"] = json!(filter.event_types);
            data["channel"] = json!(filter.channel);
            data["tag"] = json!(filter.tag);
            data["status"] = json!(filter.status);
            data["statusCodeClass"] = json!(filter.status_code_class);
        }
        data
    }

    /// Read back what [`Plan::data`] wrote, for a task of `kind`; `None` if it does not carry it.
    fn from_data(kind: TaskKind, data: &str) -> Option<Plan> {
        let data: Value = serde_json::from_str(data).ok()?;
        let int = |key: &str| data.get(key).and_then(Value::as_i64);
        let repair = match kind {
            TaskKind::Recover => Repair::Recover,
            TaskKind::BulkReplay => Repair::BulkReplay(ReplayFilter {
                event_types: serde_json::from_value(data.get("eventTypes")?.clone()).ok()?,
                channel: serde_json::from_value(data.get("channel")?.clone()).ok()?,
                // Absent from the rows of tasks started before tags were filtered on.
                tag: data.get("tag").and_then(Value::as_str).map(str::to_owned),
                status: int("status"),
                status_code_class: int("statusCodeClass"),
            }),
            _ => return None,
        };
        Some(Plan {
            endpoint_id: EndpointId::parse(data.get("endpointId")?.as_str()?).ok()?,
            since: Millis::from_unix_ms(int("since")?),
            until: Millis::from_unix_ms(int("until")?),
            repair,
            through_seq: int("throughSeq")?,
            after_seq: int("afterSeq")?,
            queued: data.get("queued")?.as_u64()?,
        })
    }
}

/// Record a task for `repair` on `endpoint` over `[since, until)` and start it in the background.
pub(crate) async fn start(
    state: &AppState,
    repair: Repair,
    endpoint: Endpoint,
    since: Millis,
    until: Millis,
) -> StoreResult<BackgroundTask> {
    let mut plan = Plan {
        endpoint_id: endpoint.id.clone(),
        since,
        until,
        repair,
        through_seq: 0,
        after_seq: 0,
        queued: 0,
    };
    let total = match plan.selection() {
        Some(mut selection) => {
            plan.through_seq = state.store.last_delivery_seq().await?;
            selection.through_seq = plan.through_seq;
            state.store.count_selected(&selection).await?
        }
        None => state.store.count_messages(&endpoint.app_id, since, until).await?,
    };
    let now = clock::now();
    let task = BackgroundTask {
        id: TaskId::new(),
        kind: plan.repair.kind(),
        app_id: endpoint.app_id.clone(),
        state: TaskState::Running,
        processed: 0,
        total,
        data: plan.data().to_string(),
        created_at: now,
        updated_at: now,
    };
    state.store.create_task(&task).await?;
    crate::metrics::task(plan.repair.kind(), None);
    spawn_plan(state, task.clone(), plan, endpoint);
    Ok(task)
}

/// Record a task expunging the payload of every message of `app_id` created until now, and start it.
pub(crate) async fn start_purge(state: &AppState, app_id: &AppId) -> StoreResult<BackgroundTask> {
    let now = clock::now();
    let task = BackgroundTask {
        id: TaskId::new(),
        kind: TaskKind::PurgeContent,
        app_id: app_id.clone(),
        state: TaskState::Running,
        processed: 0,
        total: state.store.count_messages(app_id, Millis::EPOCH, now.add_ms(1)).await?,
        data: json!({ "before": now, "messagesPurged": 0 }).to_string(),
        created_at: now,
        updated_at: now,
    };
    state.store.create_task(&task).await?;
    crate::metrics::task(TaskKind::PurgeContent, None);
    spawn_purge(state, task.clone(), now);
    Ok(task)
}

/// Carry on the recover and bulk-replay tasks a stopped process left running, and mark the others
/// failed; then, where several processes share the store (PostgreSQL), keep looking for tasks a node
/// that stopped left behind. Called once at start, before the API serves.
pub async fn resume_interrupted(state: &AppState) -> StoreResult<()> {
    sweep(state, true).await?;
    let state = state.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(ORPHAN_SWEEP).await;
            if let Err(error) = sweep(&state, false).await {
                tracing::warn!(%error, "looking for interrupted background tasks failed");
            }
        }
    });
    Ok(())
}

async fn sweep(state: &AppState, starting: bool) -> StoreResult<()> {
    let (claimed, failed) = state
        .store
        .take_interrupted_tasks(clock::now(), starting, &RESUMABLE)
        .await?;
    if failed > 0 {
        tracing::warn!(failed, "background tasks interrupted by a stop are marked failed");
    }
    for mut task in claimed {
        if task.kind == TaskKind::PurgeContent {
            let before = serde_json::from_str::<Value>(&task.data)
                .ok()
                .and_then(|data| data.get("before").and_then(Value::as_i64))
                .map(Millis::from_unix_ms);
            if let Some(before) = before {
                tracing::warn!(task = %task.id, kind = task.kind.as_str(), "carrying on a background task a stop interrupted");
                spawn_purge(state, task, before);
                continue;
            }
        }
        let endpoint = match Plan::from_data(task.kind, &task.data) {
            Some(plan) => state
                .store
                .get_endpoint(&task.app_id, &(&plan.endpoint_id).into())
                .await
                .map(|endpoint| (plan, endpoint)),
            None => Err(StoreError::NotFound),
        };
        match endpoint {
            Ok((plan, endpoint)) => {
                tracing::warn!(task = %task.id, kind = task.kind.as_str(), "carrying on a background task a stop interrupted");
                spawn_plan(state, task, plan, endpoint);
            }
            Err(error) => {
                // Its endpoint is gone (or its row unreadable): there is nothing left to do.
                task.state = TaskState::Failed;
                task.updated_at = clock::now();
                task.data = json!({ "error": error.to_string() }).to_string();
                state.store.update_task(&task).await?;
            }
        }
    }
    Ok(())
}

/// Run a repair in the background.
fn spawn_plan(state: &AppState, task: BackgroundTask, mut plan: Plan, endpoint: Endpoint) {
    let kind = plan.repair.kind();
    spawn(state, task, kind, move |state, task| {
        Box::pin(async move {
            run(&state, &mut plan, &endpoint, task).await?;
            Ok(plan.data())
        })
    });
}

/// Expunge the app's payloads in the background, chunk by chunk, cancelling their pending deliveries.
fn spawn_purge(state: &AppState, task: BackgroundTask, before: Millis) {
    spawn(state, task, TaskKind::PurgeContent, move |state, task| {
        Box::pin(async move {
            let mut purged = serde_json::from_str::<Value>(&task.data)
                .ok()
                .and_then(|data| data.get("messagesPurged").and_then(Value::as_u64))
                .unwrap_or(0);
            loop {
                // The store announces the deliveries it cancelled to the engine.
                let (expunged, _cancelled) = state
                    .store
                    .expunge_app_payloads(&task.app_id, before, CHUNK, clock::now())
                    .await?;
                purged += expunged;
                task.processed += expunged;
                task.total = task.total.max(task.processed);
                task.updated_at = clock::now();
                task.data = json!({ "before": before, "messagesPurged": purged }).to_string();
                if expunged < CHUNK as u64 {
                    return Ok(json!({ "before": before, "messagesPurged": purged }));
                }
                state.store.update_task(task).await?;
                tokio::time::sleep(BREATHER).await;
            }
        })
    });
}

/// The work of a task: it updates the task's progress and returns the task's final `data`.
type Work = Box<
    dyn for<'a> FnOnce(
            AppState,
            &'a mut BackgroundTask,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = StoreResult<Value>> + Send + 'a>>
        + Send,
>;

/// Run `work` for `task` in the background and record how it ended.
fn spawn<W>(state: &AppState, running: BackgroundTask, kind: TaskKind, work: W)
where
    W: for<'a> FnOnce(
            AppState,
            &'a mut BackgroundTask,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = StoreResult<Value>> + Send + 'a>>
        + Send
        + 'static,
{
    let work: Work = Box::new(work);
    let state = state.clone();
    tokio::spawn(async move {
        let mut task = running;
        let outcome = work(state.clone(), &mut task).await;
        task.updated_at = clock::now();
        match outcome {
            Ok(data) => {
                task.state = TaskState::Finished;
                crate::metrics::task(kind, Some(task.state));
                task.data = data.to_string();
            }
            Err(error) => {
                tracing::warn!(%error, task = %task.id, "background task failed");
                task.state = TaskState::Failed;
                crate::metrics::task(kind, Some(task.state));
                task.data = json!({ "error": error.to_string() }).to_string();
            }
        }
        if let Err(error) = state.store.update_task(&task).await {
            tracing::warn!(%error, task = %task.id, "recording the end of a background task failed");
        }
    });
}

/// Work through the repair chunk by chunk, recording progress in `task` after each.
async fn run(state: &AppState, plan: &mut Plan, endpoint: &Endpoint, task: &mut BackgroundTask) -> StoreResult<()> {
    let mut cursor: Option<MessageId> = None;
    loop {
        let now = clock::now();
        let (done, made_pending, handled) = match plan.selection() {
            Some(selection) => {
                let chunk = state.store.requeue_selected(&selection, CHUNK, now).await?;
                if let Some(last) = chunk.last_seq {
                    plan.after_seq = last;
                }
                (chunk.last_seq.is_none(), chunk.queued, chunk.queued)
            }
            None => {
                let (last, created) = state
                    .store
                    .add_missing_deliveries(endpoint, plan.since, plan.until, cursor.as_ref(), CHUNK, now)
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
        plan.queued += made_pending;
        task.processed += handled;
        // A count taken at the start can be overtaken (deliveries finished meanwhile).
        task.total = task.total.max(task.processed);
        task.updated_at = clock::now();
        if done {
            return Ok(());
        }
        task.data = plan.data().to_string();
        state.store.update_task(task).await?;
        tokio::time::sleep(BREATHER).await;
    }
}
