//! The async shell around the scheduler: one task owns the [`Scheduler`] and feeds it events; each send
//! runs as its own task and reports back.
//!
//! Events the loop handles:
//! - deliveries committed by ingest (the store's commit feed, in commit order);
//! - outcomes of finished sends (which also go to the batched result writer);
//! - backlog refills read from the store;
//! - endpoint (re)loads, after the API changed an endpoint or when an endpoint is first seen;
//! - the clock, when the earliest retry timer is due.
//!
//! The loop itself never waits on the database or the network, so one slow endpoint or a slow query can
//! delay nobody else's dispatch.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use herald_core::id::{IdKind, new_id};
use herald_core::model::{Attempt, AttemptTrigger, DeliveryStatus, Endpoint, Message};
use herald_core::outcome::{NextStep, OutcomeClass, next_step};
use herald_core::retry::RetrySchedule;
use herald_core::scheduler::{EndpointLimits, Finished, Loaded, Scheduler, SchedulerConfig};
use herald_signature::HmacSecret;
use herald_store::{AttemptRecord, CommitFeed, PendingDelivery, SharedStore, StoreError};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use tokio::sync::mpsc;

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

/// One delivery as the scheduler holds it.
#[derive(Debug, Clone)]
struct Job {
    seq: i64,
    message: Arc<Message>,
    /// Attempts already made.
    attempts: u32,
}

/// An endpoint as the engine needs it: its record and its parsed signing key.
struct EndpointEntry {
    endpoint: Arc<Endpoint>,
    secret: Option<Arc<HmacSecret>>,
}

enum Event {
    Sent {
        endpoint: Arc<str>,
        finished: Finished<Job>,
        disable: bool,
    },
    Refilled {
        endpoint: Arc<str>,
        loaded: Vec<PendingDelivery>,
        exhausted: bool,
    },
    /// Boxed: an endpoint record is large and this event is rare.
    RefillFailed {
        endpoint: Arc<str>,
    },
    EndpointLoaded(Box<Endpoint>),
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
        let _ = self
            .events
            .send(Event::EndpointChanged(endpoint_id.to_owned()));
    }
}

/// The delivery engine.
pub struct Engine {
    store: SharedStore,
    client: DeliveryClient,
    config: EngineConfig,
    scheduler: Scheduler<Arc<str>, Job>,
    endpoints: HashMap<Arc<str>, EndpointEntry>,
    events_tx: mpsc::UnboundedSender<Event>,
    events: mpsc::UnboundedReceiver<Event>,
    results: mpsc::Sender<AttemptRecord>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
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
            scheduler: Scheduler::new(SchedulerConfig {
                window: config.window,
            }),
            config,
            endpoints: HashMap::new(),
            events_tx: events_tx.clone(),
            events,
            results,
        };
        for endpoint_id in store.endpoints_with_pending().await? {
            let key: Arc<str> = Arc::from(endpoint_id.as_str());
            engine
                .scheduler
                .mark_backlog(key.clone(), engine.unloaded_limits());
            engine.load_endpoint(key);
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
                // Unreachable in practice: endpoints without a record stay paused.
                self.scheduler.finish(key, Finished::Done, now);
                continue;
            };
            let send = Send {
                key,
                endpoint: entry.endpoint.clone(),
                secret: entry.secret.clone(),
                job,
                client: self.client.clone(),
                schedule: self.config.schedule.clone(),
                events: self.events_tx.clone(),
                results: self.results.clone(),
            };
            tokio::spawn(send.run());
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
            let key = self.key_for(&delivery.endpoint_id);
            let job = Job {
                seq: delivery.seq,
                message: delivery.message,
                attempts: delivery.attempts,
            };
            self.scheduler
                .offer(key, delivery.seq, delivery.next_attempt_at, job, now);
        }
    }

    /// The scheduler key of an endpoint, registering (and loading) it on first sight.
    fn key_for(&mut self, endpoint_id: &str) -> Arc<str> {
        if let Some((key, _)) = self.endpoints.get_key_value(endpoint_id) {
            return key.clone();
        }
        let key: Arc<str> = Arc::from(endpoint_id);
        if self.scheduler.endpoint_counts(&key).is_none() {
            self.scheduler
                .configure(key.clone(), self.unloaded_limits());
            self.load_endpoint(key.clone());
        }
        key
    }

    fn load_endpoint(&self, key: Arc<str>) {
        let store = self.store.clone();
        let events = self.events_tx.clone();
        tokio::spawn(async move {
            let mut wait = Duration::from_millis(100);
            loop {
                match store.get_endpoint_by_id(&key).await {
                    Ok(endpoint) => break events.send(Event::EndpointLoaded(Box::new(endpoint))),
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

    fn handle(&mut self, event: Event) {
        let now = now_ms();
        match event {
            Event::Sent {
                endpoint,
                finished,
                disable,
            } => {
                if disable {
                    if let Some(entry) = self.endpoints.get_mut(&endpoint) {
                        let mut record = (*entry.endpoint).clone();
                        record.disabled = true;
                        entry.endpoint = Arc::new(record);
                    }
                    self.scheduler.configure(
                        endpoint.clone(),
                        EndpointLimits {
                            max_concurrency: self.config.endpoint_concurrency,
                            paused: true,
                        },
                    );
                }
                self.scheduler.finish(endpoint, finished, now);
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
            Event::RefillFailed { endpoint } => {
                self.scheduler.refilled(endpoint, Vec::new(), false, now)
            }
            Event::EndpointLoaded(endpoint) => {
                let key: Arc<str> = match self.endpoints.get_key_value(endpoint.id.as_str()) {
                    Some((key, _)) => key.clone(),
                    None => Arc::from(endpoint.id.as_str()),
                };
                let secret = match HmacSecret::parse(&endpoint.secret) {
                    Ok(secret) => Some(Arc::new(secret)),
                    Err(error) => {
                        tracing::error!(%error, endpoint = %endpoint.id, "stored endpoint secret is invalid");
                        None
                    }
                };
                let limits = EndpointLimits {
                    max_concurrency: self.config.endpoint_concurrency,
                    paused: endpoint.disabled,
                };
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
                self.endpoints.remove(&key);
                self.scheduler.remove_endpoint(&key);
            }
            Event::EndpointChanged(id) => {
                let key = match self.endpoints.get_key_value(id.as_str()) {
                    Some((key, _)) => key.clone(),
                    // Not seen yet: it will be loaded when a delivery for it first arrives.
                    None => return,
                };
                self.load_endpoint(key);
            }
        }
    }
}

async fn sleep_for(wake: Option<Duration>) {
    match wake {
        Some(duration) => tokio::time::sleep(duration).await,
        None => std::future::pending().await,
    }
}

/// One attempt in flight.
struct Send {
    key: Arc<str>,
    endpoint: Arc<Endpoint>,
    secret: Option<Arc<HmacSecret>>,
    job: Job,
    client: DeliveryClient,
    schedule: RetrySchedule,
    events: mpsc::UnboundedSender<Event>,
    results: mpsc::Sender<AttemptRecord>,
}

impl Send {
    async fn run(self) {
        let message = &self.job.message;
        let started_at = now_ms();
        let response = match &self.secret {
            Some(secret) => {
                let headers = signed_headers(secret, message, started_at / 1000);
                self.client
                    .post(
                        &self.endpoint.url,
                        headers,
                        Bytes::copy_from_slice(&message.payload),
                    )
                    .await
            }
            None => crate::client::Response {
                result: herald_core::outcome::AttemptResult::ConnectError,
                body: "the endpoint's signing secret is invalid".to_owned(),
                duration: Duration::ZERO,
            },
        };
        let attempt_number = self.job.attempts + 1;
        let jitter = rand::random_range(-1.0..=1.0);
        let step = next_step(&response.result, attempt_number, &self.schedule, jitter);
        let class = OutcomeClass::of(&response.result);
        let finished_at =
            started_at + i64::try_from(response.duration.as_millis()).unwrap_or(i64::MAX);
        let (status, next_at, finished, disable) = match step {
            NextStep::Delivered => (
                DeliveryStatus::Delivered,
                finished_at,
                Finished::Done,
                false,
            ),
            NextStep::Failed { disable_endpoint } => (
                DeliveryStatus::Failed,
                finished_at,
                Finished::Done,
                disable_endpoint,
            ),
            NextStep::Dead => (DeliveryStatus::Dead, finished_at, Finished::Done, false),
            NextStep::RetryIn(delay) => {
                let due = finished_at + i64::try_from(delay.as_millis()).unwrap_or(i64::MAX / 2);
                let job = Job {
                    attempts: attempt_number,
                    ..self.job.clone()
                };
                (
                    DeliveryStatus::Pending,
                    due,
                    Finished::RetryAt(due, job),
                    false,
                )
            }
        };
        let response_status = match response.result {
            herald_core::outcome::AttemptResult::Response { status, .. } => Some(status),
            _ => None,
        };
        let record = AttemptRecord {
            delivery_seq: self.job.seq,
            app_id: message.app_id.clone(),
            attempt: Attempt {
                id: new_id(IdKind::Attempt),
                message_id: message.id.clone(),
                endpoint_id: self.endpoint.id.clone(),
                url: self.endpoint.url.clone(),
                attempt_number,
                success: status == DeliveryStatus::Delivered,
                outcome: class.as_str().to_owned(),
                response_status,
                response: response.body,
                duration_ms: finished_at - started_at,
                trigger: AttemptTrigger::Scheduled,
                created_at: started_at,
            },
            status,
            next_attempt_at: next_at,
            disable_endpoint: disable.then(|| "the endpoint answered 410 Gone".to_owned()),
        };
        let _ = self.results.send(record).await;
        let _ = self.events.send(Event::Sent {
            endpoint: self.key,
            finished,
            disable,
        });
    }
}

/// The Standard Webhooks headers for one attempt (the timestamp, hence the signature, is per attempt).
fn signed_headers(secret: &HmacSecret, message: &Message, timestamp: i64) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(4);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let signature = secret.sign(&message.id, timestamp, &message.payload);
    // Ids are ASCII by construction, signatures are base64, timestamps digits: these never fail.
    for (name, value) in [
        (herald_signature::HEADER_ID, message.id.clone()),
        (herald_signature::HEADER_TIMESTAMP, timestamp.to_string()),
        (herald_signature::HEADER_SIGNATURE, signature),
    ] {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
    headers
}
