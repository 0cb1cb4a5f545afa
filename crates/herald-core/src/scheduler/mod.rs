//! The delivery scheduler: which delivery goes out next. Pure logic, no I/O, no clock of its own.
//!
//! The scheduler keeps one queue per endpoint and a round-robin *ring* of the endpoints that have ready
//! work and spare capacity. Workers take the next endpoint from the ring, so an endpoint that never answers
//! can hold at most its own concurrency cap of requests in flight and never stalls anybody else's queue.
//! Retries wait in a timer heap until they are due, then rejoin their endpoint's queue.
//!
//! Memory stays bounded however large a backlog grows: an endpoint keeps at most `window` deliveries
//! *resident* (ready, waiting on a timer, or in flight). Beyond that, new deliveries stay only in the store
//! (the endpoint is marked as *overflowing*) and are read back in batches through [`Scheduler::refills_wanted`]
//! and [`Scheduler::refilled`], in store order (`seq`), once the resident set has drained to half.
//!
//! Each endpoint's queue is *gated* (`queue`): a paused endpoint sends nothing; one at its concurrency cap
//! waits for a result; its circuit breaker ([`crate::breaker`]) may hold everything back or allow a single
//! probe, then ramp concurrency up slowly; a `Retry-After` on 429/503 holds the whole endpoint; a rate
//! limit paces requests evenly. An endpoint that is gated until a known time registers a *wake-up*, so the
//! shell can sleep exactly until the next thing can happen.
//!
//! Endpoints in `ordered` mode send deliveries that share an ordering key strictly one at a time, in store
//! order: the first resident delivery of a key is its *head*, later ones wait behind it until the head is
//! finished (delivered, failed or dead); a head that is being retried blocks only its own key.
//!
//! Time is whatever the caller says it is (a [`Millis`]), so tests drive it with a virtual clock and the
//! production shell with the wall clock.

mod queue;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::hash::Hash;

use crate::breaker::{Breaker, BreakerConfig, BreakerState};
use queue::{EndpointQueue, Gate};

use crate::clock::Millis;

/// What the scheduler needs to know about a job.
pub trait Queued {
    /// The key deliveries are ordered by on an endpoint in ordered mode; `None` means "no order".
    fn ordering_key(&self) -> Option<&str> {
        None
    }

    /// Attempts made so far: an open breaker's probe is the ready job tried most often.
    fn attempts(&self) -> u32 {
        0
    }

    /// When the delivery became pending (its message's creation, or when it was queued again): the
    /// oldest of these is the endpoint's backlog age.
    fn pending_since(&self) -> Millis {
        Millis::EPOCH
    }
}

/// Plain numbers as jobs (tests and simple callers): never ordered.
impl Queued for i64 {}

/// Tunables of the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// The most deliveries an endpoint keeps resident in memory; the rest wait in the store.
    pub window: usize,
    /// Every endpoint's circuit breaker.
    pub breaker: BreakerConfig,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            window: 1_000,
            breaker: BreakerConfig::default(),
        }
    }
}

/// Per-endpoint settings the scheduler enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointLimits {
    /// The most requests in flight to this endpoint at once (at least 1).
    pub max_concurrency: u32,
    /// A paused endpoint keeps its queue but sends nothing.
    pub paused: bool,
    /// Requests per second, paced evenly; `None` for no limit.
    pub rate_per_sec: Option<u32>,
    /// Deliveries that share an ordering key go one at a time, in order.
    pub ordered: bool,
}

impl Default for EndpointLimits {
    fn default() -> Self {
        Self {
            max_concurrency: 10,
            paused: false,
            rate_per_sec: None,
            ordered: false,
        }
    }
}

/// What became of a delivery offered by ingest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// It is resident and will be dispatched.
    Accepted,
    /// The endpoint's window is full: it stays in the store and comes back through a refill.
    Deferred,
    /// It was already resident (a refill read it from the store first); nothing changed.
    AlreadyResident,
}

/// How an in-flight delivery ended, as far as its queue cares.
#[derive(Debug)]
pub enum Finished<J> {
    /// Nothing more to do for this delivery (delivered, failed for good, dead or cancelled).
    Done(J),
    /// Try it again at the given time.
    RetryAt(Millis, J),
}

/// What an attempt said about the endpoint's health, for its breaker and pacing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The endpoint took the delivery.
    Success,
    /// The endpoint answered but refused the content (a 4xx other than 408, 425 and 429): alive, so the
    /// breaker treats it like a success (see [`crate::breaker`]).
    Rejected,
    /// The attempt failed; `hold_until` when the endpoint asked for a pause (`Retry-After` on 429/503),
    /// which then applies to the whole endpoint.
    Failure {
        /// Send nothing to the endpoint before this time.
        hold_until: Option<Millis>,
    },
    /// Nothing was sent (e.g. the delivery had expired): says nothing about the endpoint.
    NotSent,
}

/// A request to read more of an endpoint's backlog from the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refill<K> {
    /// The endpoint.
    pub endpoint: K,
    /// Read deliveries with a `seq` greater than this.
    pub after_seq: i64,
    /// Read at most this many.
    pub limit: usize,
    /// Which read this is. Its answer is taken only by the queue that asked for it: a read that outlived
    /// its queue (the endpoint was removed — its partition went to another node — and came back while the
    /// read was on its way) must not move the new queue's cursor past deliveries it never read, which
    /// would leave them in the store unsent until a restart.
    pub ticket: u64,
}

/// One delivery read back from the store by a refill.
#[derive(Debug)]
pub struct Loaded<J> {
    /// Its position in the store's order.
    pub seq: i64,
    /// When it is due.
    pub due: Millis,
    /// The caller's job.
    pub job: J,
}

/// What the scheduler knows about one endpoint, for operators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointSnapshot {
    /// Deliveries held in memory (ready, parked, on a timer, in flight).
    pub resident: usize,
    /// Requests in flight.
    pub in_flight: u32,
    /// Requests allowed in flight now: the cap, lowered by the breaker (0 while open, 1 for the probe, the
    /// ramp while recovering); 0 while paused.
    pub concurrency_limit: u32,
    /// Deliveries ready to go.
    pub ready: usize,
    /// Deliveries waiting behind their ordering key's head.
    pub parked: usize,
    /// The circuit breaker.
    pub breaker: Breaker,
    /// The endpoint asked (Retry-After) to be left alone until then, if that is still ahead.
    pub held_until: Option<Millis>,
    /// More deliveries wait in the store than are resident.
    pub overflowing: bool,
    /// The highest store `seq` made resident: pending deliveries above it are only in the store.
    pub cursor: i64,
    /// Pending deliveries: the resident ones and those known to wait in the store beyond them.
    pub pending: u64,
    /// When the oldest pending delivery became pending (see [`Queued::pending_since`]). Deliveries are
    /// made resident in store order, so the oldest pending one is resident — except for the moment
    /// between a resident set running dry and the refill that reads the store's next deliveries.
    pub oldest_pending_since: Option<Millis>,
}

/// The figures of one endpoint that operators watch, cheap to read for every endpoint at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointGauges {
    /// Pending deliveries (resident and known to be only in the store).
    pub pending: u64,
    /// When the oldest pending delivery became pending.
    pub oldest_pending_since: Option<Millis>,
    /// Requests in flight.
    pub in_flight: u32,
    /// Requests allowed in flight now (see [`EndpointSnapshot::concurrency_limit`]).
    pub concurrency_limit: u32,
    /// The breaker's state.
    pub breaker: BreakerState,
    /// When the endpoint's current run of failures began (see [`Breaker::failing_since`]).
    pub failing_since: Option<Millis>,
    /// Paused (disabled, or not yet loaded).
    pub paused: bool,
}

#[derive(Debug)]
struct Timer<K, J> {
    due: Millis,
    order: u64,
    endpoint: K,
    job: J,
}

impl<K, J> PartialEq for Timer<K, J> {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.order) == (other.due, other.order)
    }
}
impl<K, J> Eq for Timer<K, J> {}
impl<K, J> PartialOrd for Timer<K, J> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<K, J> Ord for Timer<K, J> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.due, self.order).cmp(&(other.due, other.order))
    }
}

/// The scheduler. `K` identifies an endpoint, `J` is the caller's job (whatever a worker needs to send).
#[derive(Debug)]
pub struct Scheduler<K, J> {
    config: SchedulerConfig,
    endpoints: HashMap<K, EndpointQueue<J>>,
    ring: VecDeque<K>,
    timers: BinaryHeap<Reverse<Timer<K, J>>>,
    /// Endpoints gated until a known time (breaker cool-down, Retry-After hold, pacing).
    wakes: BinaryHeap<Reverse<Timer<K, ()>>>,
    timer_order: u64,
    /// Deliveries in flight across all endpoints (kept, not summed, so the hot loop stays O(1)).
    in_flight: u64,
    /// Endpoints with deliveries in the store beyond their window and no read of them on its way: the
    /// only ones a refill can concern. An endpoint leaves it while its read is on its way and comes back
    /// with the answer if it still overflows, so that [`Scheduler::refills_wanted`], which runs on every
    /// turn of the engine, costs nothing for the thousands of endpoints a wide fan-out may be reading.
    overflowing: HashSet<K>,
    /// The last [`Refill::ticket`] handed out.
    refill_tickets: u64,
}

impl<K: Hash + Eq + Clone, J: Queued> Scheduler<K, J> {
    /// An empty scheduler.
    pub fn new(config: SchedulerConfig) -> Self {
        Self {
            config,
            endpoints: HashMap::new(),
            ring: VecDeque::new(),
            timers: BinaryHeap::new(),
            wakes: BinaryHeap::new(),
            timer_order: 0,
            in_flight: 0,
            overflowing: HashSet::new(),
            refill_tickets: 0,
        }
    }

    /// Set (or first register) an endpoint's limits. A paused endpoint keeps everything queued.
    pub fn configure(&mut self, endpoint: K, limits: EndpointLimits, now: Millis) {
        let breaker = self.config.breaker;
        let queue = self
            .endpoints
            .entry(endpoint.clone())
            .or_insert_with(|| EndpointQueue::new(limits, &breaker));
        let stop_ordering = queue.limits.ordered && !limits.ordered;
        queue.limits = limits;
        if stop_ordering {
            for (due, job) in queue.release_all_keys() {
                self.place(endpoint.clone(), due, job, now);
            }
        }
        self.ring_if_sendable(&endpoint, now);
    }

    /// Mark that the store may hold deliveries for this endpoint that are not resident (e.g. at start-up),
    /// so the next [`Scheduler::refills_wanted`] reads them.
    pub fn mark_backlog(&mut self, endpoint: K, limits: EndpointLimits) {
        let breaker = self.config.breaker;
        let queue = self
            .endpoints
            .entry(endpoint.clone())
            .or_insert_with(|| EndpointQueue::new(limits, &breaker));
        queue.overflow = true;
        if queue.refilling {
            // The read in progress may have missed what was just added.
            queue.deferred_while_refilling = true;
        }
        self.overflowing.insert(endpoint);
    }

    /// Forget an endpoint and everything queued for it (it was deleted, or another node delivers for it
    /// now). In-flight results that arrive later are ignored.
    pub fn remove_endpoint(&mut self, endpoint: &K) {
        if let Some(queue) = self.endpoints.remove(endpoint) {
            self.in_flight -= u64::from(queue.in_flight);
        }
        self.overflowing.remove(endpoint);
        // Its retry timers go now: should the endpoint come back (its partition returns to this node),
        // they would otherwise land in the new queue beside the same deliveries read from the store.
        self.timers.retain(|Reverse(timer)| &timer.endpoint != endpoint);
        // Ring entries and wake-ups of the removed endpoint are dropped lazily when reached.
    }

    /// Offer a new delivery straight from ingest (already committed to the store with `seq`).
    pub fn offer(&mut self, endpoint: K, seq: i64, due: Millis, job: J, now: Millis) -> Offer {
        let window = self.config.window;
        let breaker = self.config.breaker;
        let queue = self
            .endpoints
            .entry(endpoint.clone())
            .or_insert_with(|| EndpointQueue::new(EndpointLimits::default(), &breaker));
        if seq <= queue.cursor {
            return Offer::AlreadyResident;
        }
        if queue.overflow || queue.resident >= window {
            queue.overflow = true;
            queue.stored_only += 1;
            if queue.refilling {
                queue.deferred_while_refilling = true;
            }
            self.overflowing.insert(endpoint);
            return Offer::Deferred;
        }
        queue.cursor = seq;
        if let Some((due, job)) = queue.admit(due, job) {
            self.place(endpoint, due, job, now);
        }
        Offer::Accepted
    }

    /// Endpoints whose backlog should be read from the store now. Each is returned once until
    /// [`Scheduler::refilled`] answers it.
    pub fn refills_wanted(&mut self) -> Vec<Refill<K>> {
        let window = self.config.window;
        let mut wanted = Vec::new();
        let (endpoints, tickets) = (&mut self.endpoints, &mut self.refill_tickets);
        self.overflowing.retain(|key| {
            let Some(queue) = endpoints.get_mut(key) else {
                return false;
            };
            if queue.refilling {
                // Its answer puts it back if it still overflows.
                return false;
            }
            if queue.resident > window / 2 {
                return true;
            }
            *tickets += 1;
            queue.refilling = true;
            queue.refill_ticket = *tickets;
            queue.deferred_while_refilling = false;
            wanted.push(Refill {
                endpoint: key.clone(),
                after_seq: queue.cursor,
                limit: window - queue.resident,
                ticket: *tickets,
            });
            false
        });
        wanted
    }

    /// The answer to `refill`: the deliveries read (in `seq` order) and whether the store had no more
    /// (a failed read answers nothing, not exhausted). An answer to a read the endpoint's current queue
    /// did not ask for is dropped (see [`Refill::ticket`]).
    pub fn refilled(&mut self, refill: Refill<K>, loaded: Vec<Loaded<J>>, store_exhausted: bool, now: Millis) {
        let endpoint = refill.endpoint;
        let Some(queue) = self.endpoints.get_mut(&endpoint) else {
            return;
        };
        if !queue.refilling || queue.refill_ticket != refill.ticket {
            return;
        }
        queue.refilling = false;
        if store_exhausted && !queue.deferred_while_refilling {
            queue.overflow = false;
        }
        if queue.overflow {
            self.overflowing.insert(endpoint.clone());
        }
        let mut placed = Vec::with_capacity(loaded.len());
        let mut admitted = 0;
        for item in loaded {
            if item.seq > queue.cursor {
                queue.cursor = item.seq;
                admitted += 1;
                placed.extend(queue.admit(item.due, item.job));
            }
        }
        queue.stored_only = if queue.overflow {
            queue.stored_only.saturating_sub(admitted)
        } else {
            0
        };
        for (due, job) in placed {
            self.place(endpoint.clone(), due, job, now);
        }
    }

    /// The next delivery to send, if any endpoint has ready work and may send. Moves due timers into their
    /// queues first. The caller must report back through [`Scheduler::finish`].
    pub fn next(&mut self, now: Millis) -> Option<(K, J)> {
        self.release_due_timers(now);
        while let Some(key) = self.ring.pop_front() {
            let Some(queue) = self.endpoints.get_mut(&key) else {
                continue;
            };
            match queue.gate(now) {
                Gate::Open => {}
                Gate::Shut => {
                    queue.in_ring = false;
                    continue;
                }
                Gate::Until(at) => {
                    queue.in_ring = false;
                    self.wake_at(key, at);
                    continue;
                }
            }
            let Some(job) = queue.take_next(now) else {
                queue.in_ring = false;
                continue;
            };
            queue.on_send(now);
            self.in_flight += 1;
            match queue.gate(now) {
                Gate::Open => self.ring.push_back(key.clone()),
                Gate::Shut => queue.in_ring = false,
                Gate::Until(at) => {
                    queue.in_ring = false;
                    self.wake_at(key.clone(), at);
                }
            }
            return Some((key, job));
        }
        None
    }

    /// Report how an in-flight delivery ended and what it said about the endpoint.
    pub fn finish(&mut self, endpoint: K, verdict: Verdict, finished: Finished<J>, now: Millis) {
        let breaker = self.config.breaker;
        let Some(queue) = self.endpoints.get_mut(&endpoint) else {
            return;
        };
        if queue.in_flight > 0 {
            queue.in_flight -= 1;
            self.in_flight -= 1;
        }
        let was_tripped = queue.breaker.state() != BreakerState::Closed;
        queue.on_verdict(verdict, &breaker, now);
        let recovered = was_tripped && queue.breaker.state() == BreakerState::Closed;
        match finished {
            Finished::Done(job) => {
                if let Some((due, next)) = queue.release(&job) {
                    self.place(endpoint.clone(), due, next, now);
                }
            }
            Finished::RetryAt(due, job) => self.place(endpoint.clone(), due, job, now),
        }
        if recovered {
            self.release_retries(&endpoint);
        }
        self.ring_if_sendable(&endpoint, now);
    }

    /// The endpoint's probe succeeded: the retries it owes were backing off from the outage that just
    /// ended, so they rejoin its queue now instead of at their timers (which may be hours away with the
    /// default schedule). They still go out under slow start, and each keeps its attempt count.
    fn release_retries(&mut self, endpoint: &K) {
        let Some(queue) = self.endpoints.get_mut(endpoint) else {
            return;
        };
        // Rare (once per recovery), so one pass over the heap is cheaper than per-endpoint timer heaps
        // on the hot path.
        let (mut released, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.timers)
            .into_iter()
            .partition(|Reverse(timer)| timer.endpoint == *endpoint);
        self.timers = kept.into_iter().collect();
        // Oldest first, as they would have fired.
        released.sort_unstable_by(|Reverse(a), Reverse(b)| a.cmp(b));
        queue.ready.extend(released.into_iter().map(|Reverse(timer)| timer.job));
    }

    /// Take out the waiting deliveries of an endpoint (ready or parked behind their key, not in flight and
    /// not on a retry timer) that match `expired`: the caller settles them in the store.
    pub fn take_waiting(&mut self, endpoint: &K, expired: impl Fn(&J) -> bool, now: Millis) -> Vec<J> {
        let Some(queue) = self.endpoints.get_mut(endpoint) else {
            return Vec::new();
        };
        let (taken, promoted) = queue.take_matching(&expired);
        for (due, job) in promoted {
            self.place(endpoint.clone(), due, job, now);
        }
        taken
    }

    /// When the earliest timer or wake-up is due, so the shell knows how long it may sleep.
    pub fn next_timer(&self) -> Option<Millis> {
        let timer = self.timers.peek().map(|Reverse(t)| t.due);
        let wake = self.wakes.peek().map(|Reverse(t)| t.due);
        match (timer, wake) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether the scheduler holds a queue for this endpoint.
    pub fn has_queue<Q>(&self, endpoint: &Q) -> bool
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.endpoints.contains_key(endpoint)
    }

    /// Counts for one endpoint: (resident, in flight, ready), or `None` if unknown.
    pub fn endpoint_counts(&self, endpoint: &K) -> Option<(usize, u32, usize)> {
        self.endpoints
            .get(endpoint)
            .map(|q| (q.resident, q.in_flight, q.ready.len()))
    }

    /// What the scheduler knows about one endpoint, or `None` if it has not seen it.
    pub fn endpoint_snapshot(&self, endpoint: &K, now: Millis) -> Option<EndpointSnapshot> {
        self.endpoints.get(endpoint).map(|q| EndpointSnapshot {
            resident: q.resident,
            in_flight: q.in_flight,
            concurrency_limit: if q.limits.paused {
                0
            } else {
                q.breaker.allowed_in_flight(q.limits.max_concurrency.max(1), now)
            },
            ready: q.ready.len(),
            parked: q.parked(),
            breaker: q.breaker.clone(),
            held_until: (q.hold_until > now).then_some(q.hold_until),
            overflowing: q.overflow,
            cursor: q.cursor,
            pending: q.resident as u64 + q.stored_only,
            oldest_pending_since: q.oldest_pending_since(),
        })
    }

    /// How many deliveries of an endpoint wait in the store beyond its resident ones, as counted there
    /// (`pending_in_store`: every pending delivery of the endpoint). Used when that is unknown: at start,
    /// after deliveries became pending outside ingest, when an endpoint's partition arrives.
    pub fn set_store_backlog(&mut self, endpoint: &K, pending_in_store: u64) {
        if let Some(queue) = self.endpoints.get_mut(endpoint) {
            queue.stored_only = if queue.overflow {
                pending_in_store.saturating_sub(queue.resident as u64)
            } else {
                0
            };
        }
    }

    /// The watched figures of every endpoint the scheduler holds (one pass, no allocation per endpoint).
    pub fn endpoint_gauges(&self, now: Millis) -> impl Iterator<Item = (&K, EndpointGauges)> {
        self.endpoints.iter().map(move |(key, q)| {
            (
                key,
                EndpointGauges {
                    pending: q.resident as u64 + q.stored_only,
                    oldest_pending_since: q.oldest_pending_since(),
                    in_flight: q.in_flight,
                    concurrency_limit: if q.limits.paused {
                        0
                    } else {
                        q.breaker.allowed_in_flight(q.limits.max_concurrency.max(1), now)
                    },
                    breaker: q.breaker.state(),
                    failing_since: q.breaker.failing_since(),
                    paused: q.limits.paused,
                },
            )
        })
    }

    /// Endpoints in the ring: with ready work and leave to send (some entries may be stale).
    pub fn ready_endpoints(&self) -> usize {
        self.ring.len()
    }

    /// An endpoint's circuit breaker, without building a whole snapshot (read after every attempt).
    pub fn breaker(&self, endpoint: &K) -> Option<&Breaker> {
        self.endpoints.get(endpoint).map(|q| &q.breaker)
    }

    /// The endpoints the scheduler knows (for periodic sweeps).
    pub fn endpoint_keys(&self) -> impl Iterator<Item = &K> {
        self.endpoints.keys()
    }

    /// Deliveries in flight across all endpoints.
    pub fn total_in_flight(&self) -> u64 {
        self.in_flight
    }

    fn place(&mut self, endpoint: K, due: Millis, job: J, now: Millis) {
        if due <= now {
            if let Some(queue) = self.endpoints.get_mut(&endpoint) {
                queue.ready.push_back(job);
            }
            self.ring_if_sendable(&endpoint, now);
        } else {
            self.timer_order += 1;
            self.timers.push(Reverse(Timer {
                due,
                order: self.timer_order,
                endpoint,
                job,
            }));
        }
    }

    fn release_due_timers(&mut self, now: Millis) {
        while self.timers.peek().is_some_and(|Reverse(t)| t.due <= now) {
            let Some(Reverse(timer)) = self.timers.pop() else {
                break;
            };
            let Some(queue) = self.endpoints.get_mut(&timer.endpoint) else {
                continue;
            };
            queue.ready.push_back(timer.job);
            self.ring_if_sendable(&timer.endpoint, now);
        }
        while self.wakes.peek().is_some_and(|Reverse(t)| t.due <= now) {
            let Some(Reverse(wake)) = self.wakes.pop() else {
                break;
            };
            let Some(queue) = self.endpoints.get_mut(&wake.endpoint) else {
                continue;
            };
            if queue.wake_at == Some(wake.due) {
                queue.wake_at = None;
                self.ring_if_sendable(&wake.endpoint, now);
            }
        }
    }

    /// Register a wake-up for an endpoint gated until `at` (only the earliest one is kept live).
    fn wake_at(&mut self, endpoint: K, at: Millis) {
        let Some(queue) = self.endpoints.get_mut(&endpoint) else {
            return;
        };
        if queue.wake_at.is_some_and(|existing| existing <= at) {
            return;
        }
        queue.wake_at = Some(at);
        self.timer_order += 1;
        self.wakes.push(Reverse(Timer {
            due: at,
            order: self.timer_order,
            endpoint,
            job: (),
        }));
    }

    fn ring_if_sendable(&mut self, endpoint: &K, now: Millis) {
        let Some(queue) = self.endpoints.get_mut(endpoint) else {
            return;
        };
        if queue.in_ring {
            return;
        }
        match queue.gate(now) {
            Gate::Open => {
                queue.in_ring = true;
                self.ring.push_back(endpoint.clone());
            }
            Gate::Shut => {}
            Gate::Until(at) => self.wake_at(endpoint.clone(), at),
        }
    }
}
