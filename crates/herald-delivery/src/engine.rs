//! The async shell around the scheduler: one task owns the [`Scheduler`] and feeds it events; each
//! attempt runs as its own task and reports back.
//!
//! Events the loop handles:
//! - deliveries committed by ingest (the store's commit feed, in commit order);
//! - outcomes of finished attempts (whose records go to the batched result writer);
//! - backlog refills read from the store;
//! - endpoint (re)loads, after the API changed an endpoint or when an endpoint is first seen;
//! - the clock, when the earliest retry timer is due.
//!
//! The loop itself never waits on the database or the network, so one slow endpoint or a slow query can
//! delay nobody else's dispatch.
//!
//! Endpoint records are loaded one at a time per endpoint: a change that arrives while a load is running
//! marks the endpoint dirty and the load is repeated, so the engine always ends on the latest committed
//! record (a URL, secret or disabled flag changed by the API is never overtaken by an older read).
//! A deleted endpoint is remembered, so nothing can bring its queue back.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use herald_core::clock::now_ms;
use herald_core::model::Endpoint;
use herald_core::retry::RetrySchedule;
use herald_core::scheduler::{EndpointLimits, Finished, Loaded, Scheduler, SchedulerConfig};
use herald_signature::HmacSecret;
use herald_store::{AttemptRecord, CommitFeed, PendingDelivery, SharedStore, StoreError};
use tokio::sync::mpsc;

use crate::attempt::{AttemptTask, Job, Outcome};
use crate::client::DeliveryClient;

/// Settings of the delivery engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// When failed deliveries are retried.
    pub schedule: RetrySchedule,
    /// The most requests in flight across all endpoints (the worker pool).
    pub max_in_flight: u64,
    /// The per-endpoint concurrency cap.
    pub endpoint_concurrency: u32,
    /// Deliveries kept in memory per endpoint; the rest wait in the store.
    pub window: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            schedule: RetrySchedule::default(),
            max_in_flight: 512,
            endpoint_concurrency: 10,
            window: 1_000,
        }
    }
}

/// An endpoint as the engine needs it: its record and its parsed signing key.
struct EndpointEntry {
    endpoint: Arc<Endpoint>,
    secret: Option<Arc<HmacSecret>>,
}

enum Event {
    Attempted {
        endpoint: Arc<str>,
        outcome: Outcome,
    },
    Refilled {
        endpoint: Arc<str>,
        loaded: Vec<PendingDelivery>,
        exhausted: bool,
    },
    RefillFailed {
        endpoint: Arc<str>,
    },
    /// Boxed: an endpoint record is large and this event is rare.
    EndpointLoaded(Arc<str>, Box<Endpoint>),
    EndpointGone(Arc<str>),
    EndpointChanged(String),
}

/// A handle for telling the engine about changes made elsewhere (the API).
#[derive(Clone)]
pub struct EngineHandle {
    events: mpsc::UnboundedSender<Event>,
}

impl EngineHandle {
    /// An endpoint was updated or deleted: reload it (limits, URL, secret, disabled state).
    pub fn endpoint_changed(&self, endpoint_id: &str) {
        let _ = self.events.send(Event::EndpointChanged(endpoint_id.to_owned()));
    }
}

/// The delivery engine.
pub struct Engine {
    store: SharedStore,
    client: DeliveryClient,
    config: EngineConfig,
    scheduler: Scheduler<Arc<str>, Job>,
    endpoints: HashMap<Arc<str>, EndpointEntry>,
    /// Endpoints with a load running; `true` when a change arrived meanwhile (load again).
    loading: HashMap<Arc<str>, bool>,
    /// Endpoints that were deleted.
    removed: HashSet<Arc<str>>,
    events_tx: mpsc::UnboundedSender<Event>,
    events: mpsc::UnboundedReceiver<Event>,
    results: mpsc::Sender<AttemptRecord>,
}

impl Engine {
    /// Start the engine on `store`: take its commit feed, load the pending backlog and start delivering.
    ///
    /// Fails if the commit feed was already taken (one engine per store).
    pub async fn start(
        store: SharedStore,
        client: DeliveryClient,
        config: EngineConfig,
    ) -> Result<EngineHandle, StoreError> {
        let feed = store.take_commit_feed().ok_or(StoreError::Closed)?;
        let (events_tx, events) = mpsc::unbounded_channel();
        let (results, results_rx) = mpsc::channel(16_384);
        tokio::spawn(crate::recorder::run(store.clone(), results_rx));
        let mut engine = Engine {
            store: store.clone(),
            client,
            scheduler: Scheduler::new(SchedulerConfig { window: config.window }),
            config,
            endpoints: HashMap::new(),
            loading: HashMap::new(),
            removed: HashSet::new(),
            events_tx: events_tx.clone(),
            events,
            results,
        };
        for endpoint_id in store.endpoints_with_pending().await? {
            let key: Arc<str> = Arc::from(endpoint_id.as_str());
            engine.scheduler.mark_backlog(key.clone(), engine.unloaded_limits());
            engine.request_load(key);
        }
        tokio::spawn(engine.run(feed));
        Ok(EngineHandle { events: events_tx })
    }

    /// Until an endpoint's record is loaded it is paused: nothing can be sent without its URL and secret.
    fn unloaded_limits(&self) -> EndpointLimits {
        EndpointLimits {
            max_concurrency: self.config.endpoint_concurrency,
            paused: true,
        }
    }

    async fn run(mut self, mut feed: CommitFeed) {
        let mut feed_open = true;
        loop {
            let now = now_ms();
            self.dispatch(now);
            self.request_refills();
            let wake = self
                .scheduler
                .next_timer()
                .map(|due| Duration::from_millis(u64::try_from(due - now).unwrap_or(0)));
            tokio::select! {
                batch = feed.recv(), if feed_open => match batch {
                    Some(batch) => self.accept_committed(batch),
                    None => feed_open = false,
                },
                Some(event) = self.events.recv() => self.handle(event),
                () = sleep_for(wake) => {}
            }
        }
    }

    fn dispatch(&mut self, now: i64) {
        while self.scheduler.total_in_flight() < self.config.max_in_flight {
            let Some((key, job)) = self.scheduler.next(now) else {
                break;
            };
            let Some(entry) = self.endpoints.get(&key) else {
                // Endpoints stay paused until loaded, so this means the record was dropped while work
                // was ready. Keep the delivery (it is still pending in the store) and look again later.
                tracing::error!(endpoint = %key, "delivery ready for an endpoint with no record; retrying later");
                self.scheduler.finish(key, Finished::RetryAt(now + 1_000, job), now);
                continue;
            };
            let task = AttemptTask {
                endpoint: entry.endpoint.clone(),
                secret: entry.secret.clone(),
                job,
                client: self.client.clone(),
                schedule: self.config.schedule.clone(),
            };
            let events = self.events_tx.clone();
            let results = self.results.clone();
            tokio::spawn(async move {
                let (record, outcome) = task.run().await;
                let _ = results.send(record).await;
                let _ = events.send(Event::Attempted { endpoint: key, outcome });
            });
        }
    }

    fn request_refills(&mut self) {
        for refill in self.scheduler.refills_wanted() {
            let store = self.store.clone();
            let events = self.events_tx.clone();
            tokio::spawn(async move {
                let event = match store
                    .load_pending(&refill.endpoint, refill.after_seq, refill.limit)
                    .await
                {
                    Ok(loaded) => {
                        let exhausted = loaded.len() < refill.limit;
                        Event::Refilled {
                            endpoint: refill.endpoint,
                            loaded,
                            exhausted,
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, endpoint = %refill.endpoint, "loading backlog failed");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        Event::RefillFailed {
                            endpoint: refill.endpoint,
                        }
                    }
                };
                let _ = events.send(event);
            });
        }
    }

    fn accept_committed(&mut self, batch: Vec<PendingDelivery>) {
        let now = now_ms();
        for delivery in batch {
            let Some(key) = self.key_for(&delivery.endpoint_id) else {
                continue;
            };
            let job = Job {
                seq: delivery.seq,
                message: delivery.message,
                attempts: delivery.attempts,
            };
            self.scheduler
                .offer(key, delivery.seq, delivery.next_attempt_at, job, now);
        }
    }

    /// The scheduler key of an endpoint, registering (and loading) it on first sight; `None` for a
    /// deleted endpoint.
    fn key_for(&mut self, endpoint_id: &str) -> Option<Arc<str>> {
        if self.removed.contains(endpoint_id) {
            return None;
        }
        if let Some((key, _)) = self.endpoints.get_key_value(endpoint_id) {
            return Some(key.clone());
        }
        let key: Arc<str> = Arc::from(endpoint_id);
        if self.scheduler.endpoint_counts(&key).is_none() {
            self.scheduler.configure(key.clone(), self.unloaded_limits());
            self.request_load(key.clone());
        }
        Some(key)
    }

    /// Load an endpoint's record, one load at a time per endpoint.
    fn request_load(&mut self, key: Arc<str>) {
        if let Some(dirty) = self.loading.get_mut(&key) {
            *dirty = true;
            return;
        }
        self.loading.insert(key.clone(), false);
        let store = self.store.clone();
        let events = self.events_tx.clone();
        tokio::spawn(async move {
            let mut wait = Duration::from_millis(100);
            loop {
                match store.get_endpoint_by_id(&key).await {
                    Ok(endpoint) => break events.send(Event::EndpointLoaded(key, Box::new(endpoint))),
                    Err(StoreError::NotFound) => break events.send(Event::EndpointGone(key)),
                    Err(error) => {
                        tracing::warn!(%error, endpoint = %key, "loading endpoint failed; retrying");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(Duration::from_secs(5));
                    }
                }
            }
        });
    }

    /// A load finished; `true` if its result is current (no change arrived while it ran).
    fn load_finished(&mut self, key: &Arc<str>) -> bool {
        let dirty = self.loading.remove(key).unwrap_or(false);
        if dirty {
            self.request_load(key.clone());
        }
        !dirty
    }

    fn limits_of(&self, endpoint: &Endpoint) -> EndpointLimits {
        EndpointLimits {
            max_concurrency: self.config.endpoint_concurrency,
            paused: endpoint.disabled,
        }
    }

    fn handle(&mut self, event: Event) {
        let now = now_ms();
        match event {
            Event::Attempted { endpoint, outcome } => {
                if outcome.disable_endpoint {
                    self.disable(&endpoint);
                }
                self.scheduler.finish(endpoint, outcome.finished, now);
            }
            Event::Refilled {
                endpoint,
                loaded,
                exhausted,
            } => {
                let loaded = loaded
                    .into_iter()
                    .map(|d| Loaded {
                        seq: d.seq,
                        due: d.next_attempt_at,
                        job: Job {
                            seq: d.seq,
                            message: d.message,
                            attempts: d.attempts,
                        },
                    })
                    .collect();
                self.scheduler.refilled(endpoint, loaded, exhausted, now);
            }
            Event::RefillFailed { endpoint } => self.scheduler.refilled(endpoint, Vec::new(), false, now),
            Event::EndpointLoaded(key, endpoint) => {
                if !self.load_finished(&key) || self.removed.contains(&key) {
                    return;
                }
                let secret = match HmacSecret::parse(&endpoint.secret) {
                    Ok(secret) => Some(Arc::new(secret)),
                    Err(error) => {
                        tracing::error!(%error, endpoint = %endpoint.id, "stored endpoint secret is invalid");
                        None
                    }
                };
                let limits = self.limits_of(&endpoint);
                self.endpoints.insert(
                    key.clone(),
                    EndpointEntry {
                        endpoint: Arc::from(endpoint),
                        secret,
                    },
                );
                self.scheduler.configure(key, limits);
            }
            Event::EndpointGone(key) => {
                self.loading.remove(&key);
                self.endpoints.remove(&key);
                self.scheduler.remove_endpoint(&key);
                self.removed.insert(key);
            }
            Event::EndpointChanged(id) => {
                if self.removed.contains(id.as_str()) {
                    return;
                }
                let known = self.endpoints.get_key_value(id.as_str()).map(|(k, _)| k.clone());
                let key = known.unwrap_or_else(|| Arc::from(id.as_str()));
                // Reload whatever the engine holds or is loading; an endpoint it has never seen is
                // loaded when its first delivery arrives.
                if self.endpoints.contains_key(&key)
                    || self.loading.contains_key(&key)
                    || self.scheduler.endpoint_counts(&key).is_some()
                {
                    self.request_load(key);
                }
            }
        }
    }

    /// The endpoint answered 410 Gone: pause it now (the result writer records the disable).
    fn disable(&mut self, key: &Arc<str>) {
        let Some(entry) = self.endpoints.get_mut(key) else {
            return;
        };
        let mut record = (*entry.endpoint).clone();
        record.disabled = true;
        entry.endpoint = Arc::new(record);
        let limits = EndpointLimits {
            max_concurrency: self.config.endpoint_concurrency,
            paused: true,
        };
        self.scheduler.configure(key.clone(), limits);
    }
}

async fn sleep_for(wake: Option<Duration>) {
    match wake {
        Some(duration) => tokio::time::sleep(duration).await,
        None => std::future::pending().await,
    }
}
