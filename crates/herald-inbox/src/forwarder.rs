//! The forwarder: takes pending events from the store and forwards them to their source's handler, with
//! retries, a dead state and the version guard.
//!
//! One loop owns the in-flight set. It scans the store for due events, starts up to `concurrency`
//! forwards, and then sleeps until one of three things happens: a forward finishes, the ingress stores a
//! new event (a [`Notify`], which keeps a wake-up that arrives while the loop is busy), or the earliest
//! scheduled retry is due. It never polls in a loop. At start it simply scans: everything pending and due
//! — including whatever was acknowledged just before a crash — is picked up.
//!
//! Events of one resource (same source and resource key, with the guard on) are never in flight
//! together, so "check the newest version, forward, record the new newest" cannot interleave for a key.
//! Each forward records its own result in the store; a replay made while it was in flight wins (the
//! result is fenced by the event's replay count).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use herald_core::clock::now_ms;
use herald_core::retry::RetrySchedule;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;

use crate::client::{Delivered, ForwardClient};
use crate::config::Source;
use crate::metrics::Metrics;
use crate::store::{Outcome, SharedInboxStore, StoredEvent};
use crate::version;

/// How long to wait before scanning again after the store failed.
const STORE_RETRY: Duration = Duration::from_secs(1);
/// Extra rows each scan reads past the free slots, so that events skipped because their resource is busy
/// do not hide the ones behind them.
const SCAN_SLACK: usize = 64;

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
    id: String,
    resource: Option<(String, String)>,
}

impl Forwarder {
    /// Forward until `stop` turns true; then wait for the forwards in flight to finish.
    pub(crate) async fn run(self, mut stop: watch::Receiver<bool>) {
        let this = Arc::new(self);
        let mut tasks: JoinSet<Done> = JoinSet::new();
        let mut in_flight: HashSet<String> = HashSet::new();
        let mut busy_resources: HashSet<(String, String)> = HashSet::new();
        loop {
            if *stop.borrow() {
                break;
            }
            let next_due = match this.fill(&mut tasks, &mut in_flight, &mut busy_resources).await {
                Ok(next_due) => next_due,
                Err(error) => {
                    tracing::error!(%error, "inbox forwarder: store failure; retrying");
                    Some(now_ms().saturating_add(STORE_RETRY.as_millis() as i64))
                }
            };
            let sleep = match next_due {
                Some(at) => Duration::from_millis(u64::try_from(at.saturating_sub(now_ms())).unwrap_or(0)),
                // Nothing scheduled: only a finished forward or a new event can create work.
                None => Duration::from_secs(3600),
            };
            tokio::select! {
                Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                    if let Ok(done) = joined {
                        in_flight.remove(&done.id);
                        if let Some(resource) = done.resource {
                            busy_resources.remove(&resource);
                        }
                    } else {
                        // A panicked forward: its event stays pending in the store. Rebuild the
                        // bookkeeping from what is still running.
                        tracing::error!("an inbox forward task failed");
                        if tasks.is_empty() {
                            in_flight.clear();
                            busy_resources.clear();
                        }
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
            }
        }
        while tasks.join_next().await.is_some() {}
    }

    /// Start forwards for due events while there are free slots. Returns when the loop should look
    /// again without being woken: the next scheduled retry, or now if a full scan left work behind.
    async fn fill(
        self: &Arc<Self>,
        tasks: &mut JoinSet<Done>,
        in_flight: &mut HashSet<String>,
        busy_resources: &mut HashSet<(String, String)>,
    ) -> Result<Option<i64>, crate::store::StoreError> {
        let now = now_ms();
        let free = self.concurrency.saturating_sub(in_flight.len());
        if free == 0 {
            return Ok(None);
        }
        let limit = in_flight.len() + free + SCAN_SLACK;
        let due = self.store.due(now, limit).await?;
        let full_scan = due.len() == limit;
        let mut started = 0;
        for event in due {
            if started == free {
                break;
            }
            if in_flight.contains(&event.id) {
                continue;
            }
            let resource = self.resource_of(&event);
            if let Some(resource) = &resource
                && !busy_resources.insert(resource.clone())
            {
                continue;
            }
            in_flight.insert(event.id.clone());
            let this = self.clone();
            tasks.spawn(async move {
                let id = event.id.clone();
                this.forward_one(event).await;
                Done { id, resource }
            });
            started += 1;
        }
        if full_scan && started == free {
            // The scan was cut short and the slots are full: the next finished forward wakes us.
            return Ok(None);
        }
        self.store.next_due_after(now).await
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
            .record(&event.id, event.replays, attempts, &outcome, now_ms())
            .await
        {
            Ok(true) => match &outcome {
                Outcome::Forwarded { .. } => self.metrics.forwarded(),
                Outcome::Stale { .. } => self.metrics.stale(),
                Outcome::Retry { error, .. } => {
                    self.metrics.forward_failed(false);
                    tracing::debug!(id = %event.id, %error, attempts, "forward failed; will retry");
                }
                Outcome::Dead { error } => {
                    self.metrics.forward_failed(true);
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
                next_attempt_at: now_ms().saturating_add(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)),
                error,
            },
            None => Outcome::Dead { error },
        }
    }
}
