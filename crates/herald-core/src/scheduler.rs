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
//! Time is whatever the caller says it is (milliseconds), so tests drive it with a virtual clock and the
//! production shell with the wall clock.

use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::hash::Hash;

/// A point in time in milliseconds, on whichever clock the caller uses consistently.
pub type Millis = i64;

/// Tunables of the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// The most deliveries an endpoint keeps resident in memory; the rest wait in the store.
    pub window: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self { window: 1_000 }
    }
}

/// Per-endpoint settings the scheduler enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointLimits {
    /// The most requests in flight to this endpoint at once (at least 1).
    pub max_concurrency: u32,
    /// A paused endpoint keeps its queue but sends nothing.
    pub paused: bool,
}

impl Default for EndpointLimits {
    fn default() -> Self {
        Self {
            max_concurrency: 10,
            paused: false,
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

/// How an in-flight delivery ended, as far as the scheduler cares.
#[derive(Debug)]
pub enum Finished<J> {
    /// Nothing more to do for this delivery (delivered, failed for good, dead or cancelled).
    Done,
    /// Try it again at the given time.
    RetryAt(Millis, J),
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

#[derive(Debug)]
struct EndpointQueue<J> {
    ready: VecDeque<J>,
    limits: EndpointLimits,
    in_flight: u32,
    in_ring: bool,
    /// Deliveries held in memory: ready + waiting on a timer + in flight.
    resident: usize,
    /// Deliveries exist in the store beyond `cursor` that are not resident.
    overflow: bool,
    /// The highest store `seq` made resident; every pending delivery at or below it is resident.
    cursor: i64,
    refilling: bool,
    /// An offer was deferred while a refill was reading: the refill may have missed it.
    deferred_while_refilling: bool,
}

impl<J> EndpointQueue<J> {
    fn new(limits: EndpointLimits) -> Self {
        Self {
            ready: VecDeque::new(),
            limits,
            in_flight: 0,
            in_ring: false,
            resident: 0,
            overflow: false,
            cursor: 0,
            refilling: false,
            deferred_while_refilling: false,
        }
    }

    fn can_send(&self) -> bool {
        !self.limits.paused && !self.ready.is_empty() && self.in_flight < self.limits.max_concurrency.max(1)
    }
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
    timer_order: u64,
    /// Deliveries in flight across all endpoints (kept, not summed, so the hot loop stays O(1)).
    in_flight: u64,
    /// Endpoints with deliveries in the store beyond their window: the only ones a refill can concern.
    overflowing: HashSet<K>,
}

impl<K: Hash + Eq + Clone, J> Scheduler<K, J> {
    /// An empty scheduler.
    pub fn new(config: SchedulerConfig) -> Self {
        Self {
            config,
            endpoints: HashMap::new(),
            ring: VecDeque::new(),
            timers: BinaryHeap::new(),
            timer_order: 0,
            in_flight: 0,
            overflowing: HashSet::new(),
        }
    }

    /// Set (or first register) an endpoint's limits. A paused endpoint keeps everything queued.
    pub fn configure(&mut self, endpoint: K, limits: EndpointLimits) {
        let queue = self
            .endpoints
            .entry(endpoint.clone())
            .or_insert_with(|| EndpointQueue::new(limits));
        queue.limits = limits;
        self.ring_if_sendable(&endpoint);
    }

    /// Mark that the store may hold deliveries for this endpoint that are not resident (e.g. at start-up),
    /// so the next [`Scheduler::refills_wanted`] reads them.
    pub fn mark_backlog(&mut self, endpoint: K, limits: EndpointLimits) {
        let queue = self
            .endpoints
            .entry(endpoint.clone())
            .or_insert_with(|| EndpointQueue::new(limits));
        queue.overflow = true;
        self.overflowing.insert(endpoint);
    }

    /// Forget an endpoint and everything queued for it (it was deleted). In-flight results that arrive
    /// later are ignored.
    pub fn remove_endpoint(&mut self, endpoint: &K) {
        if let Some(queue) = self.endpoints.remove(endpoint) {
            self.in_flight -= u64::from(queue.in_flight);
        }
        self.overflowing.remove(endpoint);
        // Ring entries and timers of the removed endpoint are dropped lazily when reached.
    }

    /// Offer a new delivery straight from ingest (already committed to the store with `seq`).
    pub fn offer(&mut self, endpoint: K, seq: i64, due: Millis, job: J, now: Millis) -> Offer {
        let window = self.config.window;
        let queue = self
            .endpoints
            .entry(endpoint.clone())
            .or_insert_with(|| EndpointQueue::new(EndpointLimits::default()));
        if seq <= queue.cursor {
            return Offer::AlreadyResident;
        }
        if queue.overflow || queue.resident >= window {
            queue.overflow = true;
            if queue.refilling {
                queue.deferred_while_refilling = true;
            }
            self.overflowing.insert(endpoint);
            return Offer::Deferred;
        }
        queue.cursor = seq;
        queue.resident += 1;
        self.place(endpoint, due, job, now);
        Offer::Accepted
    }

    /// Endpoints whose backlog should be read from the store now. Each is returned once until
    /// [`Scheduler::refilled`] answers it.
    pub fn refills_wanted(&mut self) -> Vec<Refill<K>> {
        let window = self.config.window;
        let mut wanted = Vec::new();
        for key in &self.overflowing {
            let Some(queue) = self.endpoints.get_mut(key) else {
                continue;
            };
            if !queue.refilling && queue.resident <= window / 2 {
                queue.refilling = true;
                queue.deferred_while_refilling = false;
                wanted.push(Refill {
                    endpoint: key.clone(),
                    after_seq: queue.cursor,
                    limit: window - queue.resident,
                });
            }
        }
        wanted
    }

    /// The answer to a refill: the deliveries read (in `seq` order) and whether the store had no more.
    pub fn refilled(&mut self, endpoint: K, loaded: Vec<Loaded<J>>, store_exhausted: bool, now: Millis) {
        let Some(queue) = self.endpoints.get_mut(&endpoint) else {
            return;
        };
        queue.refilling = false;
        if store_exhausted && !queue.deferred_while_refilling {
            queue.overflow = false;
            self.overflowing.remove(&endpoint);
        }
        let mut fresh = Vec::with_capacity(loaded.len());
        for item in loaded {
            if item.seq > queue.cursor {
                queue.cursor = item.seq;
                queue.resident += 1;
                fresh.push(item);
            }
        }
        for item in fresh {
            self.place(endpoint.clone(), item.due, item.job, now);
        }
    }

    /// The next delivery to send, if any endpoint has ready work and spare capacity. Moves due timers
    /// into their queues first. The caller must report back through [`Scheduler::finish`].
    pub fn next(&mut self, now: Millis) -> Option<(K, J)> {
        self.release_due_timers(now);
        while let Some(key) = self.ring.pop_front() {
            let Some(queue) = self.endpoints.get_mut(&key) else {
                continue;
            };
            if !queue.can_send() {
                queue.in_ring = false;
                continue;
            }
            let Some(job) = queue.ready.pop_front() else {
                continue;
            };
            queue.in_flight += 1;
            self.in_flight += 1;
            if queue.can_send() {
                self.ring.push_back(key.clone());
            } else {
                queue.in_ring = false;
            }
            return Some((key, job));
        }
        None
    }

    /// Report how an in-flight delivery ended.
    pub fn finish(&mut self, endpoint: K, finished: Finished<J>, now: Millis) {
        let Some(queue) = self.endpoints.get_mut(&endpoint) else {
            return;
        };
        if queue.in_flight > 0 {
            queue.in_flight -= 1;
            self.in_flight -= 1;
        }
        match finished {
            Finished::Done => queue.resident = queue.resident.saturating_sub(1),
            Finished::RetryAt(due, job) => self.place(endpoint.clone(), due, job, now),
        }
        self.ring_if_sendable(&endpoint);
    }

    /// When the earliest timer is due, so the shell knows how long it may sleep.
    pub fn next_timer(&self) -> Option<Millis> {
        self.timers.peek().map(|Reverse(t)| t.due)
    }

    /// Counts for one endpoint: (resident, in flight, ready), or `None` if unknown.
    pub fn endpoint_counts(&self, endpoint: &K) -> Option<(usize, u32, usize)> {
        self.endpoints
            .get(endpoint)
            .map(|q| (q.resident, q.in_flight, q.ready.len()))
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
            self.ring_if_sendable(&endpoint);
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
            let Entry::Occupied(mut entry) = self.endpoints.entry(timer.endpoint) else {
                continue;
            };
            entry.get_mut().ready.push_back(timer.job);
            let key = entry.key().clone();
            self.ring_if_sendable(&key);
        }
    }

    fn ring_if_sendable(&mut self, endpoint: &K) {
        if let Some(queue) = self.endpoints.get_mut(endpoint)
            && !queue.in_ring
            && queue.can_send()
        {
            queue.in_ring = true;
            self.ring.push_back(endpoint.clone());
        }
    }
}
