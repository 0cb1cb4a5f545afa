//! The forwarder: takes pending events from the store and forwards them to their source's handler, with
//! retries, a dead state and the version guard.
//!
//! One loop owns the in-flight set. It scans the store for due events, starts up to `concurrency`
//! forwards, and then sleeps until one of three things happens: a forward finishes, the ingress stores a
//! new event (a [`Notify`], which keeps a wake-up that arrives while the loop is busy), or the earliest
//! scheduled retry is due. It never polls in a loop. At start it simply scans: everything pending and due
//! — including whatever was acknowledged just before a crash — is picked up.
//!
//! The store says when this process may forward ([`Forwarding`]): always on SQLite; on PostgreSQL only
//! while this process holds the database's forwarder lock, so that processes sharing a database do not
//! all forward every event. There, events stored by other processes cannot wake the loop, so it also looks
//! every [`Forwarding::poll`].
//!
//! Events of one resource (same source and resource key, with the guard on) are never in flight
//! together, so "check the newest version, forward, record the new newest" cannot interleave for a key.
//! Each forward records its own result in the store; a replay made while it was in flight wins (the
//! result is fenced by the event's replay count).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use herald_core::clock::{self, Millis};
use herald_core::id::InboxEventId;
use herald_core::retry::RetrySchedule;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;

use crate::client::{Delivered, ForwardClient};
use crate::config::Source;
use crate::metrics::Metrics;
use crate::store::{Forwarding, Outcome, SharedInboxStore, StoredEvent};
use crate::version;

/// How long to wait before scanning again after the store failed.
const STORE_RETRY: Duration = Duration::from_secs(1);
/// Due events read from the store per scan.
const SCAN_BATCH: usize = 256;
/// The most due events held in memory waiting for a slot or for their resource.
const MAX_BACKLOG: usize = 4_096;

/// The forwarder's parts.
pub(crate) struct Forwarder {
    pub(crate) store: SharedInboxStore,
    pub(crate) sources: Arc<HashMap<String, Arc<Source>>>,
    pub(crate) client: ForwardClient,
    pub(crate) schedule: RetrySchedule,
    pub(crate) concurrency: usize,
    pub(crate) wake: Arc<Notify>,
    pub(crate) metrics: Arc<Metrics>,
}

/// What a finished forward frees.
struct Done {
    id: InboxEventId,
    resource: Option<(String, String)>,
}

/// The loop's bookkeeping.
#[derive(Default)]
struct Work {
    tasks: JoinSet<Done>,
    /// Ids being forwarded.
    in_flight: HashSet<InboxEventId>,
    /// Resources (source, key) with a forward in flight.
    busy_resources: HashSet<(String, String)>,
    /// Due events read from the store and not started yet, earliest first. Reading a batch at a time
    /// keeps the store from being scanned once per forward.
    backlog: VecDeque<StoredEvent>,
}

impl Work {
    fn finished(&mut self, done: Done) {
        self.in_flight.remove(&done.id);
        if let Some(resource) = done.resource {
            self.busy_resources.remove(&resource);
        }
    }
}

impl Forwarder {
    /// Forward until `stop` turns true; then wait for the forwards in flight to finish.
    pub(crate) async fn run(self, mut stop: watch::Receiver<bool>) {
        let this = Arc::new(self);
        let mut work = Work::default();
        let Forwarding { mut allowed, poll } = this.store.forwarding();
        loop {
            if *stop.borrow() {
                break;
            }
            let may_forward = *allowed.borrow_and_update();
            let next_due = if may_forward {
                match this.fill(&mut work).await {
                    Ok(next_due) => next_due,
                    Err(error) => {
                        tracing::error!(%error, "inbox forwarder: store failure; retrying");
                        Some(clock::now() + STORE_RETRY)
                    }
                }
            } else {
                // Another process forwards now: what was read for later may be forwarded by it by the
                // time this one may again, so read afresh then. Forwards in flight finish.
                work.backlog.clear();
                None
            };
            let mut sleep = match next_due {
                Some(at) => at.duration_since(clock::now()),
                // Nothing scheduled: only a finished forward, a new event or a change of `allowed` can
                // create work.
                None => Duration::from_secs(3600),
            };
            if let (true, Some(poll)) = (may_forward, poll) {
                sleep = sleep.min(poll);
            }
            tokio::select! {
                Some(joined) = work.tasks.join_next(), if !work.tasks.is_empty() => {
                    this.reap(&mut work, joined);
                    // Collect every other forward that finished meanwhile before looking for work.
                    while let Some(joined) = work.tasks.try_join_next() {
                        this.reap(&mut work, joined);
                    }
                }
                () = this.wake.notified() => {}
                () = tokio::time::sleep(sleep) => {}
                changed = stop.changed() => {
                    // The sender is gone: nobody can stop us any more, so stop now.
                    if changed.is_err() {
                        break;
                    }
                }
                changed = allowed.changed() => {
                    // The store is gone: nothing more can be forwarded.
                    if changed.is_err() {
                        break;
                    }
                }
            }
        }
        while work.tasks.join_next().await.is_some() {}
    }

    fn reap(&self, work: &mut Work, joined: Result<Done, tokio::task::JoinError>) {
        match joined {
            Ok(done) => work.finished(done),
            Err(_) => {
                // A panicked forward: its event stays pending in the store. Rebuild the bookkeeping from
                // what is still running once nothing is.
                tracing::error!("an inbox forward task failed");
                if work.tasks.is_empty() {
                    work.in_flight.clear();
                    work.busy_resources.clear();
                }
            }
        }
    }

    /// Start forwards for due events while there are free slots. Returns when the loop should look
    /// again without being woken: the next scheduled retry, or `None` when only a finished forward or a
    /// new event can make a difference.
    async fn fill(self: &Arc<Self>, work: &mut Work) -> Result<Option<Millis>, crate::store::StoreError> {
        let now = clock::now();
        let mut scanned = false;
        loop {
            self.start_from_backlog(work);
            if work.in_flight.len() >= self.concurrency || scanned || work.backlog.len() >= MAX_BACKLOG {
                // Slots full (a finished forward wakes us), or the backlog holds only events whose
                // resource is busy (its forward finishing wakes us).
                return Ok(None);
            }
            let limit = work.in_flight.len() + work.backlog.len() + SCAN_BATCH;
            let due = self.store.due(now, limit).await?;
            let exhausted = due.len() < limit;
            let queued: HashSet<&str> = work.backlog.iter().map(|e| e.id.as_str()).collect();
            let fresh: Vec<StoredEvent> = due
                .into_iter()
                .filter(|e| !work.in_flight.contains(&e.id) && !queued.contains(e.id.as_str()))
                .collect();
            work.backlog.extend(fresh);
            scanned = true;
            if !exhausted {
                continue;
            }
            self.start_from_backlog(work);
            if !work.backlog.is_empty() {
                return Ok(None);
            }
            return self.store.next_due_after(now).await;
        }
    }

    /// Start backlog events, in order, while slots are free, skipping those whose resource is busy.
    fn start_from_backlog(self: &Arc<Self>, work: &mut Work) {
        let mut index = 0;
        while index < work.backlog.len() && work.in_flight.len() < self.concurrency {
            let resource = self.resource_of(&work.backlog[index]);
            if let Some(resource) = &resource
                && work.busy_resources.contains(resource)
            {
                index += 1;
                continue;
            }
            let Some(event) = work.backlog.remove(index) else {
                break;
            };
            if let Some(resource) = &resource {
                work.busy_resources.insert(resource.clone());
            }
            work.in_flight.insert(event.id.clone());
            let this = self.clone();
            work.tasks.spawn(async move {
                let id = event.id.clone();
                this.forward_one(event).await;
                Done { id, resource }
            });
        }
    }

    /// The `(source, resource key)` an event holds while in flight, when its source guards versions.
    fn resource_of(&self, event: &StoredEvent) -> Option<(String, String)> {
        let source = self.sources.get(&event.source)?;
        source.guard.as_ref()?;
        Some((event.source.clone(), event.resource_key.clone()?))
    }

    /// Forward one event (or skip it as stale) and record the outcome.
    async fn forward_one(&self, event: StoredEvent) {
        let outcome = self.decide(&event).await;
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(error) => {
                // Leave it pending; the next scan tries again.
                tracing::error!(%error, id = %event.id, "inbox forwarder: store failure");
                return;
            }
        };
        let attempts = match outcome {
            Outcome::Stale { .. } => event.attempts,
            _ => event.attempts.saturating_add(1),
        };
        match self
            .store
            .record(&event.id, event.replays, attempts, &outcome, clock::now())
            .await
        {
            Ok(true) => match &outcome {
                Outcome::Forwarded { .. } => self.metrics.forwarded(&event.source),
                Outcome::Stale { .. } => self.metrics.stale(&event.source),
                Outcome::Retry { error, .. } => {
                    self.metrics.forward_failed(&event.source, false);
                    tracing::debug!(id = %event.id, %error, attempts, "forward failed; will retry");
                }
                Outcome::Dead { error } => {
                    self.metrics.forward_failed(&event.source, true);
                    tracing::warn!(id = %event.id, source = %event.source, %error, attempts, "event is dead: every attempt failed");
                }
            },
            // Replayed while in flight: the replay stands and the event is pending again.
            Ok(false) => {}
            Err(error) => tracing::error!(%error, id = %event.id, "inbox forwarder: could not record an outcome"),
        }
    }

    async fn decide(&self, event: &StoredEvent) -> Result<Outcome, crate::store::StoreError> {
        let Some(source) = self.sources.get(&event.source) else {
            return Ok(self.failure(event, format!("source {:?} is not configured", event.source)));
        };
        let guarded = match (&source.guard, &event.resource_key, &event.version) {
            (Some(_), Some(key), Some(version)) => Some((key.clone(), version.clone())),
            _ => None,
        };
        // A replay is an explicit operator request: it bypasses the guard (see docs/inbox.md).
        if let (Some((key, version)), 0) = (&guarded, event.replays)
            && let Some(newest) = self.store.newest_version(&event.source, key).await?
            && !version::is_newer(version, &newest)
        {
            return Ok(Outcome::Stale {
                reason: format!("version {version} is not newer than {newest}, already forwarded"),
            });
        }
        let delivered = self
            .client
            .forward(&source.forward_to, &event.headers, &event.id, event.body.clone())
            .await;
        Ok(match delivered {
            Delivered::Accepted => Outcome::Forwarded { guard: guarded },
            Delivered::Failed(error) => self.failure(event, error),
        })
    }

    /// A failed attempt: retry per the schedule, or dead after the last.
    fn failure(&self, event: &StoredEvent, error: String) -> Outcome {
        let attempts = event.attempts.saturating_add(1);
        match self.schedule.delay_after(attempts, rand::random_range(-1.0..=1.0)) {
            Some(delay) => Outcome::Retry {
                next_attempt_at: clock::now() + delay,
                error,
            },
            None => Outcome::Dead { error },
        }
    }
}
