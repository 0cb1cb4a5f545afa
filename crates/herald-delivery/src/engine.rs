//! The async shell around the scheduler: one task owns the [`Scheduler`] and feeds it events; each
//! attempt runs as its own task and reports back.
//!
//! Events the loop handles:
//! - the store's change stream, in commit order: deliveries committed by ingest (the commit feed),
//!   endpoint changes, backlogs re-queued outside ingest, cancellations;
//! - outcomes of finished attempts (whose records go to the batched result writer);
//! - backlog refills read from the store;
//! - endpoint (re)loads, after the store announced an endpoint's change or when an endpoint is first seen;
//! - the clock, when the earliest retry timer or endpoint wake-up (breaker probe, `Retry-After` hold, rate
//!   pacing) is due, and a periodic sweep that settles deliveries whose time window ended while their
//!   endpoint was paused or its circuit open;
//! - requests for an endpoint's health (breaker state, in-flight count) from the API.
//!
//! The loop itself never waits on the database or the network, so one slow endpoint or a slow query can
//! delay nobody else's dispatch.
//!
//! Endpoint records are loaded in batches by one loader (`crate::loader`), each endpoint at most once at
//! a time: a change that arrives while its load is under way marks the endpoint dirty and the load is
//! repeated, so the engine always ends on the latest committed record (a URL, secret or disabled flag
//! changed by the API is never overtaken by an older read).
//! A deleted endpoint is remembered, so nothing can bring its queue back.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use herald_core::breaker::{BreakerConfig, BreakerState};
use herald_core::clock::{self, Millis};
use herald_core::id::EndpointId;
use herald_core::model::{DisabledReason, Endpoint, Ordering, PreviousSecret};
use herald_core::retry::RetrySchedule;
use herald_core::scheduler::{
    EndpointLimits, EndpointSnapshot, Finished, Loaded, Refill, Scheduler, SchedulerConfig, Verdict,
};
use herald_store::{
    Change, ChangeStream, OwnershipEvent, PendingDelivery, SendingRecord, SharedDeliveryStore, StoreError, partition_of,
};
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::attempt::{AttemptTask, EndpointKeys, Job, Outcome};
use crate::client::{DeliveryClient, Destination};
use crate::feed_gate::FeedGate;
use crate::handover::{Held, InFlight};
use crate::metrics::{EndpointCounters, EndpointRow, EngineMetrics};
use crate::ownership::{Changes, Owner};
use crate::recorder::Recorded;

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
    /// Every endpoint's circuit breaker.
    pub breaker: BreakerConfig,
    /// An endpoint whose attempts have all failed for this long is disabled.
    pub disable_after: Duration,
    /// The longest one attempt may take (the client's total timeout): part of a delivery's time window.
    pub attempt_timeout: Duration,
    /// Spans are exported as traces (OpenTelemetry): each attempt's span then encloses its request, to
    /// time it. Without an exporter the span is opened only for an attempt's log line.
    pub trace_attempts: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            schedule: RetrySchedule::default(),
            max_in_flight: 512,
            endpoint_concurrency: 10,
            window: 1_000,
            breaker: BreakerConfig::default(),
            disable_after: Duration::from_secs(5 * 24 * 3600),
            attempt_timeout: Duration::from_secs(15),
            trace_attempts: false,
        }
    }
}

/// An endpoint as the engine needs it: its record and its parsed signing keys (`None` when the current
/// key is invalid: nothing is sent unsigned).
struct EndpointEntry {
    endpoint: Arc<Endpoint>,
    keys: Option<Arc<EndpointKeys>>,
    /// Its URL as vetted and prepared once, for every attempt until the record changes.
    destination: Arc<Destination>,
    /// The application's uid (else its id), for metric labels.
    app_label: Arc<str>,
}

/// An endpoint's record as loaded: with the keys it rotated away from that still sign, and its
/// application's label for metrics.
struct LoadedEndpoint {
    endpoint: Endpoint,
    previous: Vec<PreviousSecret>,
    app_label: String,
}

impl From<SendingRecord> for LoadedEndpoint {
    fn from(record: SendingRecord) -> Self {
        Self {
            endpoint: record.endpoint,
            previous: record.previous_secrets,
            app_label: record.app.uid.unwrap_or_else(|| record.app.id.into_string()),
        }
    }
}

enum Event {
    Attempted {
        endpoint: EndpointId,
        outcome: Outcome,
    },
    Refilled {
        refill: Refill<EndpointId>,
        loaded: Vec<PendingDelivery>,
        exhausted: bool,
    },
    RefillFailed {
        refill: Refill<EndpointId>,
    },
    /// Boxed: an endpoint record is large and this event is rare. With the keys it rotated away from that
    /// still sign.
    EndpointLoaded(EndpointId, Box<LoadedEndpoint>),
    EndpointGone(EndpointId),
    /// With a sender to answer once the engine uses the changed record (or holds nothing for it).
    EndpointChanged(EndpointId, Option<oneshot::Sender<()>>),
    Health(EndpointId, oneshot::Sender<Option<EndpointHealth>>),
    /// A scrape: the figures of the `top_n` oldest backlogs and every open breaker.
    Metrics(usize, oneshot::Sender<EngineMetrics>),
    /// Nothing sent for these given-up partitions is in flight any more (see [`crate::handover`]).
    Drained(Vec<i32>),
    /// The store counted an endpoint's pending deliveries (its backlog was not known).
    BacklogCounted(EndpointId, u64),
    /// Deliveries became pending in the store outside ingest (resend, recover, replay-missing).
    Backlog(EndpointId),
    /// Pending deliveries were cancelled in the store: (endpoint id, seq).
    Cancelled(Vec<(EndpointId, i64)>),
    /// An endpoint's ownership check ended (see [`Engine::verify`]).
    Verified(EndpointId),
}

/// What the engine knows about one endpoint, for its health block.
#[derive(Debug, Clone)]
pub struct EndpointHealth {
    /// The scheduler's view: breaker, in flight, limits, queue.
    pub snapshot: EndpointSnapshot,
    /// The outcome classes of its last attempts on this node, oldest first (at most
    /// [`crate::metrics::RECENT_OUTCOMES`]).
    pub recent_outcomes: Vec<&'static str>,
}

/// Tells the engine that an endpoint's ownership check ended, when dropped.
struct VerificationEnded(Option<(EndpointId, mpsc::UnboundedSender<Event>)>);

impl Drop for VerificationEnded {
    fn drop(&mut self) {
        if let Some((id, events)) = self.0.take() {
            let _ = events.send(Event::Verified(id));
        }
    }
}

/// A handle for telling the engine about changes made elsewhere (the API).
#[derive(Clone)]
pub struct EngineHandle {
    events: mpsc::UnboundedSender<Event>,
    default_concurrency: u32,
}

impl EngineHandle {
    /// Wait (up to `timeout`) until the engine signs and sends with an endpoint's changed record: after a
    /// key rotation or revocation returns, no attempt starts with the keys it replaced. (The change itself
    /// reaches the engine on the store's change stream; this reloads it once more and waits for that.)
    pub async fn endpoint_applied(&self, endpoint_id: &EndpointId, timeout: Duration) {
        let (applied, done) = oneshot::channel();
        if self
            .events
            .send(Event::EndpointChanged(endpoint_id.clone(), Some(applied)))
            .is_ok()
        {
            let _ = tokio::time::timeout(timeout, done).await;
        }
    }

    /// The concurrency cap of endpoints that set none.
    pub fn default_concurrency(&self) -> u32 {
        self.default_concurrency
    }

    /// The figures a scrape shows (see [`crate::metrics`]), or `None` if the engine has stopped or did
    /// not answer in time.
    pub async fn metrics(&self, top_n: usize) -> Option<EngineMetrics> {
        let (reply, answer) = oneshot::channel();
        self.events.send(Event::Metrics(top_n, reply)).ok()?;
        tokio::time::timeout(crate::metrics::SCRAPE_TIMEOUT, answer)
            .await
            .ok()?
            .ok()
    }

    /// What the engine knows about an endpoint right now (breaker, in-flight requests), or `None` if it
    /// holds nothing for it (no delivery seen since start) or has stopped.
    pub async fn endpoint_health(&self, endpoint_id: &EndpointId) -> Option<EndpointHealth> {
        let (reply, answer) = oneshot::channel();
        self.events.send(Event::Health(endpoint_id.clone(), reply)).ok()?;
        answer.await.ok().flatten()
    }
}

/// How many backlog reads (refills and counts) the engine runs at once. (Endpoint records are read by
/// one loader, a batch at a time: [`crate::loader`].)
///
/// A wide fan-out to endpoints a node has not loaded yet starts, with several nodes, a backlog read and a
/// count per endpoint. Unbounded, a message to 10,000 such endpoints on PostgreSQL took every connection
/// of the pool (each endpoint's record was then read on its own too): each read waited out the pool's
/// acquire timeout and retried, the lease keeper's own queries timed out with them, so the node gave up
/// its partitions and dropped its queues, and deliveries crawled (under 50/s). Bounded, they run a few at
/// a time and leave most of the pool to the API, the result writer and the keeper.
const BACKGROUND_READS: usize = 4;

/// How many endpoints one backlog count asks about ([`Engine::count_backlogs`]): a wide fan-out's thousand
/// endpoints are counted in ten statements, and one statement stays well under a second even when every
/// endpoint's backlog is long (each count stops at [`herald_store::Backlog::COUNT_CAP`]).
const BACKLOG_COUNT_CHUNK: usize = 100;

/// The most endpoints one refill statement reads ([`Engine::request_refills`]).
const REFILL_CHUNK: usize = 100;

/// The refills in groups of at most [`REFILL_CHUNK`], each read by one statement: one `limit` per group,
/// and no endpoint twice in a group (its deliveries come back keyed by endpoint).
fn refill_chunks(wanted: Vec<Refill<EndpointId>>) -> Vec<Vec<Refill<EndpointId>>> {
    type Open = (Vec<Refill<EndpointId>>, HashSet<EndpointId>);
    let mut chunks = Vec::new();
    // The group being filled for each limit, with its endpoints.
    let mut open: HashMap<usize, Open> = HashMap::new();
    for refill in wanted {
        let (chunk, endpoints) = open.entry(refill.limit).or_default();
        if chunk.len() == REFILL_CHUNK || endpoints.contains(&refill.endpoint) {
            chunks.push(std::mem::take(chunk));
            endpoints.clear();
        }
        endpoints.insert(refill.endpoint.clone());
        chunk.push(refill);
    }
    chunks.extend(open.into_values().map(|(chunk, _)| chunk));
    chunks
}

/// Read the next deliveries of the chunk's endpoints (one statement, one `limit`: see [`refill_chunks`]),
/// with one of the engine's turns for backlog reads.
async fn read_refills(
    store: &SharedDeliveryStore,
    turns: &Semaphore,
    chunk: &[Refill<EndpointId>],
) -> Result<Vec<PendingDelivery>, StoreError> {
    let reads: Vec<(EndpointId, i64)> = chunk.iter().map(|r| (r.endpoint.clone(), r.after_seq)).collect();
    let limit = chunk.first().map_or(0, |r| r.limit);
    let _turn = turns.acquire().await;
    store.load_pending_of(&reads, limit).await
}

/// Tell the engine what the read of `chunk` gave: each endpoint's deliveries, or, after a pause, that
/// the read failed (the scheduler asks again).
async fn refills_read(
    read: Result<Vec<PendingDelivery>, StoreError>,
    chunk: Vec<Refill<EndpointId>>,
    events: &mpsc::UnboundedSender<Event>,
) {
    match read {
        Ok(loaded) => {
            let mut by_endpoint: HashMap<EndpointId, Vec<PendingDelivery>> = HashMap::new();
            for delivery in loaded {
                by_endpoint
                    .entry(delivery.endpoint_id.clone())
                    .or_default()
                    .push(delivery);
            }
            for refill in chunk {
                let loaded = by_endpoint.remove(&refill.endpoint).unwrap_or_default();
                let exhausted = loaded.len() < refill.limit;
                let _ = events.send(Event::Refilled {
                    refill,
                    loaded,
                    exhausted,
                });
            }
        }
        Err(error) => {
            tracing::warn!(%error, endpoints = chunk.len(), "loading backlog failed");
            tokio::time::sleep(Duration::from_secs(1)).await;
            for refill in chunk {
                let _ = events.send(Event::RefillFailed { refill });
            }
        }
    }
}

/// The delivery engine.
pub struct Engine {
    store: SharedDeliveryStore,
    client: DeliveryClient,
    config: EngineConfig,
    scheduler: Scheduler<EndpointId, Job>,
    endpoints: HashMap<EndpointId, EndpointEntry>,
    /// Endpoints with a load running; `true` when a change arrived meanwhile (load again).
    loading: HashMap<EndpointId, bool>,
    /// Endpoints that were deleted.
    removed: HashSet<EndpointId>,
    /// Callers waiting for an endpoint's reload to take effect (see [`EngineHandle::endpoint_applied`]).
    applied_waiters: HashMap<EndpointId, Vec<oneshot::Sender<()>>>,
    /// Endpoints whose ownership check runs, each with whether another was asked for meanwhile.
    verifying: HashMap<EndpointId, bool>,
    /// Deliveries cancelled while on a retry timer or in flight: dropped when they next come up.
    cancelled: HashSet<i64>,
    events_tx: mpsc::UnboundedSender<Event>,
    events: mpsc::UnboundedReceiver<Event>,
    results: mpsc::Sender<Recorded>,
    /// What each partition has in flight, counted only on a store nodes may share: a partition
    /// given up is cleared for its next owner once nothing of it is (see [`crate::handover`]).
    in_flight: Arc<InFlight>,
    /// The endpoints this node delivers for (all of them unless several nodes share the store).
    owner: Owner,
    /// Which commit-feed batches may go straight to the queues.
    feed_gate: FeedGate,
    /// Attempt counters of the endpoints that had attempts, for their metrics.
    counters: HashMap<EndpointId, EndpointCounters>,
    /// Reads the records of the endpoints it is sent, a batch at a time (see [`crate::loader`]).
    loader: mpsc::UnboundedSender<EndpointId>,
    /// Turns for backlog reads and counts (see [`BACKGROUND_READS`]).
    backlog_reads: Arc<Semaphore>,
}

impl Engine {
    /// Start the engine on `store`: take its change stream, load the pending backlog and start delivering.
    ///
    /// Fails if the change stream was already taken (one engine per store).
    pub async fn start(
        store: SharedDeliveryStore,
        client: DeliveryClient,
        config: EngineConfig,
    ) -> Result<EngineHandle, StoreError> {
        let changes = store.take_changes().ok_or(StoreError::Closed)?;
        crate::metrics::register();
        let default_concurrency = config.endpoint_concurrency;
        let (events_tx, events) = mpsc::unbounded_channel();
        let (results, results_rx) = mpsc::channel(16_384);
        tokio::spawn(crate::recorder::run(store.clone(), results_rx));
        let mut engine = Engine {
            store: store.clone(),
            client,
            scheduler: Scheduler::new(SchedulerConfig {
                window: config.window,
                breaker: config.breaker,
            }),
            config,
            endpoints: HashMap::new(),
            loading: HashMap::new(),
            removed: HashSet::new(),
            applied_waiters: HashMap::new(),
            verifying: HashMap::new(),
            cancelled: HashSet::new(),
            events_tx: events_tx.clone(),
            events,
            results,
            in_flight: Arc::default(),
            feed_gate: FeedGate::new(Owner::of(&store).is_shared()),
            owner: Owner::of(&store),
            counters: HashMap::new(),
            loader: crate::loader::spawn(store.clone(), {
                let events = events_tx.clone();
                move |key, record| {
                    let _ = events.send(match record {
                        Some(record) => Event::EndpointLoaded(key, Box::new(LoadedEndpoint::from(record))),
                        None => Event::EndpointGone(key),
                    });
                }
            }),
            backlog_reads: Arc::new(Semaphore::new(BACKGROUND_READS)),
        };
        let mut backlogs = Vec::new();
        for endpoint_id in store.endpoints_with_pending().await? {
            if !engine.owner.owns(&endpoint_id) {
                continue;
            }
            engine
                .scheduler
                .mark_backlog(endpoint_id.clone(), engine.unloaded_limits());
            engine.request_load(endpoint_id.clone());
            backlogs.push(endpoint_id);
        }
        engine.count_backlogs(backlogs);
        tokio::spawn(engine.run(changes));
        Ok(EngineHandle {
            events: events_tx,
            default_concurrency,
        })
    }

    /// Until an endpoint's record is loaded it is paused: nothing can be sent without its URL and secret.
    /// It is also treated as ordered, so deliveries admitted before the record arrives are already lined
    /// up by key; if the endpoint turns out to be unordered, loading it releases them.
    fn unloaded_limits(&self) -> EndpointLimits {
        EndpointLimits {
            max_concurrency: self.config.endpoint_concurrency,
            paused: true,
            ordered: true,
            ..EndpointLimits::default()
        }
    }

    /// A delivery's time window: the schedule's (see [`RetrySchedule::lifetime`]) plus the time its
    /// attempts may take, so a delivery retried on schedule is never cut short by it.
    fn lifetime(&self) -> Duration {
        let attempts = self.config.attempt_timeout * self.config.schedule.max_attempts();
        self.config.schedule.lifetime() + attempts
    }

    async fn run(mut self, mut changes: ChangeStream) {
        let mut changes_open = true;
        let mut ownership = Changes::take(&self.store);
        // Sweeping often enough that a delivery outlives its window by at most a quarter of it.
        let sweep_every = (self.lifetime() / 4).clamp(Duration::from_millis(50), Duration::from_secs(30));
        let mut sweep = tokio::time::interval(sweep_every);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let now = clock::now();
            self.dispatch(now);
            self.request_refills();
            let wake = self.scheduler.next_timer().map(|due| due.duration_since(now));
            tokio::select! {
                change = changes.recv(), if changes_open => match change {
                    Some(change) => self.committed(change),
                    None => changes_open = false,
                },
                Some(event) = self.events.recv() => self.handle(event),
                change = ownership.next() => self.ownership_changed(change),
                _ = sweep.tick() => self.sweep_expired(clock::now()),
                () = sleep_for(wake) => {}
            }
        }
    }

    fn dispatch(&mut self, now: Millis) {
        let lifetime = self.lifetime();
        let mut expired = Vec::new();
        while self.scheduler.total_in_flight() < self.config.max_in_flight {
            let Some((key, job)) = self.scheduler.next(now) else {
                break;
            };
            if self.owner.is_shared() && !self.owner.owns(&key) {
                // Its partition went to another node a moment ago and the engine has not heard yet
                // (`Released` comes next and drops the queue): the delivery stays pending in the store
                // for the next owner, and nothing starts that the hand-over would have to wait for.
                self.scheduler.finish(key, Verdict::NotSent, Finished::Done(job), now);
                continue;
            }
            if self.cancelled.remove(&job.seq) {
                // Cancelled by an operator while it waited on a timer: the store already says so.
                self.scheduler.finish(key, Verdict::NotSent, Finished::Done(job), now);
                continue;
            }
            if job.window_start + lifetime <= now {
                // Its window ended while it waited: it dies unsent (it would die after this attempt anyway).
                expired.push(job.seq);
                self.scheduler.finish(key, Verdict::NotSent, Finished::Done(job), now);
                continue;
            }
            let Some(entry) = self.endpoints.get(&key) else {
                // Endpoints stay paused until loaded, so this means the record was dropped while work
                // was ready. Keep the delivery (it is still pending in the store) and look again later.
                tracing::error!(endpoint = %key, "delivery ready for an endpoint with no record; retrying later");
                self.scheduler.finish(
                    key,
                    Verdict::NotSent,
                    Finished::RetryAt(now + Duration::from_secs(1), job),
                    now,
                );
                continue;
            };
            let task = AttemptTask {
                endpoint: entry.endpoint.clone(),
                keys: entry.keys.clone(),
                destination: entry.destination.clone(),
                job,
                client: self.client.clone(),
                schedule: self.config.schedule.clone(),
                traced: self.config.trace_attempts,
            };
            let held = if self.owner.is_shared() {
                self.in_flight.hold(partition_of(&key))
            } else {
                Held::NONE
            };
            let events = self.events_tx.clone();
            let results = self.results.clone();
            tokio::spawn(async move {
                let (record, outcome) = task.run().await;
                let _ = results.send(Recorded { record, held }).await;
                let _ = events.send(Event::Attempted { endpoint: key, outcome });
            });
        }
        self.settle_expired(expired, now);
    }

    /// Mark deliveries dead in the store without an attempt (their window ended while they waited).
    fn settle_expired(&self, seqs: Vec<i64>, now: Millis) {
        if seqs.is_empty() {
            return;
        }
        let store = self.store.clone();
        tokio::spawn(async move {
            if let Err(error) = store.expire_deliveries(&seqs, now).await {
                // They stay pending in the store and are found expired again after a restart.
                tracing::warn!(%error, count = seqs.len(), "marking expired deliveries dead failed");
            }
        });
    }

    /// Deliveries that wait on a paused endpoint or an open circuit use up no attempts, so nothing else
    /// ends them: settle the ones whose window has ended, resident or still in the store.
    fn sweep_expired(&mut self, now: Millis) {
        let cutoff = now - self.lifetime();
        let waiting: Vec<(EndpointId, bool)> = self
            .scheduler
            .endpoint_keys()
            .filter_map(|key| {
                let snapshot = self.scheduler.endpoint_snapshot(key, now)?;
                let paused = self.endpoints.get(key).is_some_and(|e| e.endpoint.disabled);
                let stuck = paused || snapshot.breaker.state() != BreakerState::Closed || snapshot.held_until.is_some();
                stuck.then(|| (key.clone(), snapshot.overflowing))
            })
            .collect();
        for (key, overflowing) in waiting {
            let taken: Vec<i64> = self
                .scheduler
                .take_waiting(&key, |job| job.window_start < cutoff, now)
                .into_iter()
                .map(|job| job.seq)
                .collect();
            if taken.is_empty() && !overflowing {
                continue;
            }
            let store = self.store.clone();
            tokio::spawn(async move {
                match store.expire_waiting(&key, cutoff, now).await {
                    Ok(count) if count > 0 => {
                        tracing::info!(endpoint = %key, count, "deliveries expired while the endpoint could not be sent to");
                    }
                    Ok(_) => {}
                    Err(error) => tracing::warn!(%error, endpoint = %key, "expiring waiting deliveries failed"),
                }
            });
        }
    }

    /// Read the backlogs the scheduler wants, [`REFILL_CHUNK`] endpoints per statement (see
    /// [`refill_chunks`]). A chunk the store cannot read for what one endpoint's rows hold (not for a
    /// storage fault) is read again endpoint by endpoint, so that one endpoint's bad row holds up no other.
    fn request_refills(&mut self) {
        for chunk in refill_chunks(self.scheduler.refills_wanted()) {
            let store = self.store.clone();
            let events = self.events_tx.clone();
            let turns = self.backlog_reads.clone();
            tokio::spawn(async move {
                match read_refills(&store, &turns, &chunk).await {
                    Err(error) if chunk.len() > 1 && error.fault().is_none() => {
                        tracing::warn!(%error, endpoints = chunk.len(), "loading backlogs failed; reading them one by one");
                        for refill in chunk {
                            let alone = vec![refill];
                            let read = read_refills(&store, &turns, &alone).await;
                            refills_read(read, alone, &events).await;
                        }
                    }
                    read => refills_read(read, chunk, &events).await,
                }
            });
        }
    }

    /// A change the store committed (see [`Change`]).
    fn committed(&mut self, change: Change) {
        match change {
            Change::Committed(batch) => self.accept_committed(batch),
            Change::Endpoint(id) => self.handle(Event::EndpointChanged(id, None)),
            Change::Backlog(id) => self.handle(Event::Backlog(id)),
            Change::Cancelled(deliveries) => self.handle(Event::Cancelled(deliveries)),
            Change::VerificationDue(id) => self.verify(id),
        }
    }

    /// Run an endpoint's ownership check (see [`crate::verification`]), one at a time per endpoint: a
    /// request that comes while one runs (the endpoint was written again, say with a new URL) runs once
    /// it ends, and reads the endpoint afresh, so it checks the latest URL and key or finds nothing left
    /// to check. The result, if it changes the endpoint, comes back on the change stream.
    fn verify(&mut self, id: EndpointId) {
        if let Some(again) = self.verifying.get_mut(&id) {
            *again = true;
            return;
        }
        self.verifying.insert(id.clone(), false);
        let (store, client) = (self.store.clone(), self.client.clone());
        // Reported when the task ends however it ends (a panic too), or the endpoint's later checks
        // would wait for it forever.
        let ended = VerificationEnded(Some((id.clone(), self.events_tx.clone())));
        tokio::spawn(async move {
            let _ended = ended;
            crate::verification::verify(&store, &client, &id).await;
        });
    }

    /// Deliveries this node just committed, straight from its commit feed: into the queues, unless a
    /// lower `seq` of the same endpoints may still be on its way ([`FeedGate`]); then the endpoints read
    /// the batch, and whatever came before it, from the store.
    fn accept_committed(&mut self, batch: Vec<PendingDelivery>) {
        if !self.feed_gate.admits(batch.iter().map(|delivery| delivery.seq)) {
            let endpoints: Vec<EndpointId> = batch.into_iter().map(|delivery| delivery.endpoint_id).collect();
            self.work_arrived(endpoints);
            return;
        }
        let now = clock::now();
        let mut unqueued = Vec::new();
        for delivery in batch {
            if !self.owner.owns(&delivery.endpoint_id) {
                // Its owner (another node) is told by the store.
                continue;
            }
            if self.owner.is_shared() && !self.scheduler.has_queue(delivery.endpoint_id.as_str()) {
                // With several nodes, an endpoint without a queue may have deliveries in the store that
                // never reached this node's feed: committed while its partition was another node's or
                // nobody's (a takeover owns a partition before it announces the partition's backlog).
                // A queue starting at this `seq` would skip them for good, so it starts with a read of
                // the store instead, which finds this delivery too.
                unqueued.push(delivery.endpoint_id);
                continue;
            }
            let Some(key) = self.key_for(&delivery.endpoint_id) else {
                continue;
            };
            let (seq, due) = (delivery.seq, delivery.next_attempt_at);
            self.scheduler.offer(key, seq, due, Job::of(delivery), now);
        }
        self.work_arrived(unqueued);
    }

    /// The scheduler key of an endpoint, registering (and loading) it on first sight; `None` for a
    /// deleted endpoint.
    fn key_for(&mut self, endpoint_id: &EndpointId) -> Option<EndpointId> {
        if self.removed.contains(endpoint_id) {
            return None;
        }
        let key = endpoint_id.clone();
        if self.endpoints.contains_key(&key) {
            return Some(key);
        }
        if self.scheduler.endpoint_counts(&key).is_none() {
            self.scheduler
                .configure(key.clone(), self.unloaded_limits(), clock::now());
            self.request_load(key.clone());
        }
        Some(key)
    }

    /// Load an endpoint's record, one load at a time per endpoint.
    fn request_load(&mut self, key: EndpointId) {
        if let Some(dirty) = self.loading.get_mut(&key) {
            *dirty = true;
            return;
        }
        self.loading.insert(key.clone(), false);
        // The loader goes only with the engine.
        let _ = self.loader.send(key);
    }

    /// A load finished; `true` if its result is current (no change arrived while it ran).
    fn load_finished(&mut self, key: &EndpointId) -> bool {
        let dirty = self.loading.remove(key).unwrap_or(false);
        if dirty {
            self.request_load(key.clone());
        }
        !dirty
    }

    fn limits_of(&self, endpoint: &Endpoint) -> EndpointLimits {
        EndpointLimits {
            max_concurrency: endpoint.max_concurrency.unwrap_or(self.config.endpoint_concurrency),
            paused: endpoint.disabled,
            rate_per_sec: endpoint.rate_limit,
            ordered: endpoint.ordering == Ordering::Key,
        }
    }

    fn handle(&mut self, event: Event) {
        let now = clock::now();
        match event {
            Event::Attempted { endpoint, outcome } => {
                self.counters
                    .entry(endpoint.clone())
                    .or_default()
                    .record(&outcome.report);
                if let Finished::Done(job) = &outcome.finished {
                    self.cancelled.remove(&job.seq);
                }
                self.scheduler
                    .finish(endpoint.clone(), outcome.verdict, outcome.finished, now);
                if outcome.disable_endpoint {
                    let reason = DisabledReason::Automatic("the endpoint answered 410 Gone".to_owned());
                    self.disable(&endpoint, reason, now);
                } else if let Some(since) = self.failing_too_long(&endpoint, now) {
                    let since = since.to_rfc3339().unwrap_or_default();
                    let reason = DisabledReason::Automatic(format!(
                        "every attempt failed for {} (since {since})",
                        herald_core::retry::format_duration(self.config.disable_after)
                    ));
                    self.disable(&endpoint, reason, now);
                }
            }
            Event::Refilled {
                refill,
                loaded,
                exhausted,
            } => {
                let loaded = loaded
                    .into_iter()
                    .map(|d| Loaded {
                        seq: d.seq,
                        due: d.next_attempt_at,
                        job: Job::of(d),
                    })
                    .collect();
                self.scheduler.refilled(refill, loaded, exhausted, now);
            }
            Event::RefillFailed { refill } => self.scheduler.refilled(refill, Vec::new(), false, now),
            // Only the owner reads an endpoint's backlog; with several nodes the others must not queue it
            // (the owner finds the requeued deliveries through the store).
            Event::Backlog(id) if !self.owner.owns(&id) => {}
            Event::Backlog(id) => {
                if let Some(key) = self.key_for(&id) {
                    let limits = self.unloaded_limits();
                    self.scheduler.mark_backlog(key.clone(), limits);
                    self.count_backlogs(vec![key]);
                }
            }
            Event::BacklogCounted(key, pending) => self.scheduler.set_store_backlog(&key, pending),
            Event::Metrics(top_n, reply) => {
                let _ = reply.send(self.metrics(top_n, now));
            }
            Event::Drained(partitions) => self.report_drained(partitions),
            Event::Cancelled(deliveries) => {
                let mut by_endpoint: HashMap<EndpointId, HashSet<i64>> = HashMap::new();
                for (endpoint, seq) in deliveries {
                    by_endpoint.entry(endpoint).or_default().insert(seq);
                }
                for (key, seqs) in by_endpoint {
                    let taken = self.scheduler.take_waiting(&key, |job| seqs.contains(&job.seq), now);
                    let taken: HashSet<i64> = taken.into_iter().map(|job| job.seq).collect();
                    // Of the rest, those above the cursor are only in the store and will never be read
                    // (they are no longer pending); the others are on a timer or in flight.
                    let cursor = self.scheduler.endpoint_snapshot(&key, now).map_or(0, |s| s.cursor);
                    self.cancelled
                        .extend(seqs.difference(&taken).filter(|seq| **seq <= cursor));
                }
            }
            Event::Verified(id) => {
                if self.verifying.remove(&id) == Some(true) {
                    self.verify(id);
                }
            }
            Event::Health(key, reply) => {
                let health = self
                    .scheduler
                    .endpoint_snapshot(&key, now)
                    .map(|snapshot| EndpointHealth {
                        snapshot,
                        recent_outcomes: self
                            .counters
                            .get(&key)
                            .map(EndpointCounters::recent)
                            .unwrap_or_default(),
                    });
                let _ = reply.send(health);
            }
            Event::EndpointLoaded(key, loaded) => {
                if !self.load_finished(&key) {
                    return;
                }
                // Gone, or (scale-out) no longer this node's to deliver: nothing to apply, and its owner
                // applies changes on its own.
                if self.removed.contains(&key) || !self.owner.owns(&key) {
                    self.notify_applied(&key);
                    return;
                }
                let LoadedEndpoint {
                    endpoint,
                    previous,
                    app_label,
                } = *loaded;
                let keys = match EndpointKeys::parse(&endpoint, &previous) {
                    Ok(keys) => Some(Arc::new(keys)),
                    Err(error) => {
                        tracing::error!(%error, endpoint = %endpoint.id, "stored endpoint secret is invalid");
                        None
                    }
                };
                let limits = self.limits_of(&endpoint);
                self.endpoints.insert(
                    key.clone(),
                    EndpointEntry {
                        destination: Arc::new(self.client.destination(&endpoint.url)),
                        endpoint: Arc::new(endpoint),
                        keys,
                        app_label: Arc::from(app_label),
                    },
                );
                self.scheduler.configure(key.clone(), limits, now);
                self.notify_applied(&key);
            }
            Event::EndpointGone(key) => {
                self.notify_applied(&key);
                self.loading.remove(&key);
                self.endpoints.remove(&key);
                self.scheduler.remove_endpoint(&key);
                self.counters.remove(&key);
                self.removed.insert(key);
            }
            Event::EndpointChanged(key, applied) => {
                if self.removed.contains(&key) {
                    return;
                }
                // Reload whatever the engine holds or is loading; an endpoint it has never seen is
                // loaded when its first delivery arrives.
                if self.endpoints.contains_key(&key)
                    || self.loading.contains_key(&key)
                    || self.scheduler.endpoint_counts(&key).is_some()
                {
                    if let Some(applied) = applied {
                        self.applied_waiters.entry(key.clone()).or_default().push(applied);
                    }
                    self.request_load(key);
                }
                // Otherwise nothing is held for it: its first load will read the changed record, and
                // dropping `applied` answers the waiter.
            }
        }
    }

    /// Answer everyone waiting for this endpoint's reload (dropping the senders is the answer).
    fn notify_applied(&mut self, key: &EndpointId) {
        self.applied_waiters.remove(key);
    }

    /// Scale-out: work appeared for endpoints this node owns (new partitions, or another node's
    /// ingest), or partitions went elsewhere.
    fn ownership_changed(&mut self, change: OwnershipEvent) {
        match change {
            OwnershipEvent::Work(endpoints) => self.work_arrived(endpoints),
            OwnershipEvent::Seen(seq) => self.feed_gate.watched_up_to(seq),
            OwnershipEvent::Released(partitions) => {
                // Stop scheduling them; attempts in flight finish and their results are fenced by the
                // store. A later owner reads their deliveries back from the store — this node too, should
                // it own a partition again already: its queues go all the same (see the event's docs).
                let partitions: HashSet<i32> = partitions.into_iter().collect();
                let gone: Vec<EndpointId> = self
                    .scheduler
                    .endpoint_keys()
                    .chain(self.endpoints.keys())
                    .filter(|key| partitions.contains(&partition_of(key)) || !self.owner.owns(key))
                    .cloned()
                    .collect();
                for key in gone {
                    self.scheduler.remove_endpoint(&key);
                    self.endpoints.remove(&key);
                    self.counters.remove(&key);
                }
                // Tell the store, partition by partition, once what was sent for it has ended and its
                // results are written: one slow attempt holds back only its own partition. A partition
                // owned again meanwhile is no longer waited for (it is not being handed over any more).
                let (in_flight, events, owner) = (self.in_flight.clone(), self.events_tx.clone(), self.owner.clone());
                let mut waiting: Vec<i32> = partitions.into_iter().collect();
                tokio::spawn(async move {
                    loop {
                        waiting.retain(|&p| !owner.owns_partition(p));
                        if waiting.is_empty() {
                            break;
                        }
                        let idle = in_flight.until_some_idle(&waiting).await;
                        waiting.retain(|p| !idle.contains(p));
                        if events.send(Event::Drained(idle)).is_err() {
                            break;
                        }
                    }
                });
            }
        }
    }

    /// Report given-up partitions drained to the store. Checked again here, in the engine's own turn:
    /// only a partition this node does not own, with nothing in flight. Dispatch sends nothing for a
    /// partition it does not own, so nothing can be sent for it any more (a waiter from an earlier
    /// hand-over of a partition owned again since must not clear the lease of the partition's next
    /// hand-over while it is still sending).
    fn report_drained(&self, partitions: Vec<i32>) {
        let drained: Vec<i32> = partitions
            .into_iter()
            .filter(|&p| self.in_flight.is_idle(p) && !self.owner.owns_partition(p))
            .collect();
        if !drained.is_empty() {
            self.owner.drained(&drained);
        }
    }

    /// These endpoints may have pending deliveries in the store that their queues do not hold: the ones
    /// this node owns read their backlog from the store.
    fn work_arrived(&mut self, endpoints: Vec<EndpointId>) {
        let mut arrived = Vec::new();
        let mut seen = HashSet::new();
        for id in endpoints {
            if !self.owner.owns(&id) || !seen.insert(id.clone()) {
                continue;
            }
            if let Some(key) = self.key_for(&id) {
                self.scheduler.mark_backlog(key.clone(), self.unloaded_limits());
                arrived.push(key);
            }
        }
        self.count_backlogs(arrived);
    }

    /// Count the pending deliveries of endpoints whose backlog in the store is unknown, once (the gauges
    /// are kept up to date incrementally from there): [`BACKLOG_COUNT_CHUNK`] endpoints per query, one
    /// query after the other, so a thousand endpoints met at once cost ten queries rather than a
    /// thousand round trips competing with ingest for the database.
    fn count_backlogs(&self, keys: Vec<EndpointId>) {
        if keys.is_empty() {
            return;
        }
        let (store, events, turns) = (self.store.clone(), self.events_tx.clone(), self.backlog_reads.clone());
        tokio::spawn(async move {
            for chunk in keys.chunks(BACKLOG_COUNT_CHUNK) {
                let counted = {
                    let _turn = turns.acquire().await;
                    store.endpoint_backlogs(chunk).await
                };
                match counted {
                    Ok(backlogs) => {
                        for (key, backlog) in chunk.iter().zip(backlogs) {
                            let _ = events.send(Event::BacklogCounted(key.clone(), backlog.pending));
                        }
                    }
                    Err(error) => {
                        tracing::debug!(%error, endpoints = chunk.len(), "counting the backlogs failed");
                    }
                }
            }
        });
    }

    /// The figures of a scrape: one pass over the scheduler's endpoints.
    fn metrics(&self, top_n: usize, now: Millis) -> EngineMetrics {
        let (keys, gauges): (Vec<&EndpointId>, Vec<_>) = self.scheduler.endpoint_gauges(now).unzip();
        let (listed, unlisted) = crate::metrics::select(&gauges, top_n);
        let listed = listed
            .into_iter()
            .map(|index| {
                let key = keys[index];
                let (app, endpoint) = match self.endpoints.get(key) {
                    Some(entry) => (
                        entry.app_label.to_string(),
                        entry.endpoint.uid.clone().unwrap_or_else(|| key.to_string()),
                    ),
                    // Not loaded yet: the id is all there is.
                    None => (String::new(), key.to_string()),
                };
                EndpointRow {
                    app,
                    endpoint,
                    gauges: gauges[index],
                    counters: self.counters.get(key).cloned().unwrap_or_default(),
                }
            })
            .collect();
        EngineMetrics {
            now,
            listed,
            unlisted,
            endpoints: gauges.len() as u64,
            ready_endpoints: self.scheduler.ready_endpoints() as u64,
            in_flight: self.scheduler.total_in_flight(),
            pending: gauges.iter().map(|g| g.pending).sum(),
        }
    }

    /// When the endpoint's current run of failures began, if it has lasted past `disable_after`.
    fn failing_too_long(&self, key: &EndpointId, now: Millis) -> Option<Millis> {
        let since = self.scheduler.breaker(key)?.failing_since()?;
        (now >= since + self.config.disable_after).then_some(since)
    }

    /// Disable an endpoint on Herald's own decision: pause it now, then record the change, its reason and
    /// an `endpoint.disabled` operational event in the store.
    fn disable(&mut self, key: &EndpointId, reason: DisabledReason, now: Millis) {
        let Some(entry) = self.endpoints.get_mut(key) else {
            return;
        };
        if entry.endpoint.disabled {
            return;
        }
        let mut record = (*entry.endpoint).clone();
        record.disabled = true;
        record.disabled_reason = Some(reason.clone());
        let limits = self.limits_of(&record);
        if let Some(entry) = self.endpoints.get_mut(key) {
            entry.endpoint = Arc::new(record);
        }
        self.scheduler.configure(key.clone(), limits, now);
        tracing::warn!(endpoint = %key, reason = reason.as_str(), "endpoint disabled");
        let store = self.store.clone();
        let id = key.clone();
        tokio::spawn(async move {
            let mut wait = Duration::from_millis(100);
            // Retried: an endpoint that must stay paused must not come back as enabled after a restart.
            while let Err(error) = store.disable_endpoint(&id, &reason, now).await {
                tracing::warn!(%error, endpoint = %id, "recording the disable failed; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        });
    }
}

async fn sleep_for(wake: Option<Duration>) {
    match wake {
        Some(duration) => tokio::time::sleep(duration).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refill(endpoint: &EndpointId, limit: usize, ticket: u64) -> Refill<EndpointId> {
        Refill {
            endpoint: endpoint.clone(),
            after_seq: 0,
            limit,
            ticket,
        }
    }

    #[test]
    fn refills_are_read_in_chunks_of_one_limit_without_an_endpoint_twice() {
        let endpoints: Vec<EndpointId> = (0..250).map(|_| EndpointId::new()).collect();
        let mut wanted: Vec<Refill<EndpointId>> = endpoints.iter().map(|e| refill(e, 64, 1)).collect();
        wanted.push(refill(&endpoints[0], 64, 2));
        wanted.push(refill(&endpoints[1], 8, 3));
        let chunks = refill_chunks(wanted);

        let mut sizes: Vec<(usize, usize)> = chunks.iter().map(|c| (c[0].limit, c.len())).collect();
        sizes.sort_unstable();
        // 251 reads of limit 64: two full chunks and one of 51 (the second read of endpoint 0 fits
        // there, beside no other read of it); the one read of limit 8 alone.
        assert_eq!(sizes, [(8, 1), (64, 51), (64, 100), (64, 100)]);
        for chunk in &chunks {
            assert!(chunk.iter().all(|r| r.limit == chunk[0].limit));
            let distinct: HashSet<&EndpointId> = chunk.iter().map(|r| &r.endpoint).collect();
            assert_eq!(distinct.len(), chunk.len(), "an endpoint twice in one chunk");
        }
        let tickets: usize = chunks.iter().map(Vec::len).sum();
        assert_eq!(tickets, 252, "every read kept");
    }

    #[test]
    fn a_second_read_of_an_endpoint_starts_a_new_chunk() {
        let endpoint = EndpointId::new();
        let chunks = refill_chunks(vec![refill(&endpoint, 10, 1), refill(&endpoint, 10, 2)]);
        let tickets: Vec<Vec<u64>> = chunks.iter().map(|c| c.iter().map(|r| r.ticket).collect()).collect();
        assert_eq!(tickets, [vec![1], vec![2]]);
    }
}
