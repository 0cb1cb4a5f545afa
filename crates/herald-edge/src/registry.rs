//! The table of open connections: the cap on them, and which to close when the cap is reached.
//!
//! At the cap, the connections idle longest — those with no request in progress: waiting for their
//! first or next request line, a slow client's half-sent headers, a response the client does not read
//! — are closed to make room, as a keep-alive timeout would close them; those that never completed a
//! request go first, so a flood of silent sockets cannot push out a client's kept-alive connection.
//! Only when every connection is busy with a request is the newcomer refused. So idle and slowloris sockets, however many, can never
//! keep a well-behaved client out, and the cap keeps file descriptors from running out.
//!
//! The table also counts the response bytes handed to hyper and not yet written to a socket. A client
//! that does not read holds its response in memory (one at most: the front reads no further request
//! meanwhile); past the budget, the idle connections that have held theirs longest are closed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use futures::task::AtomicWaker;
use tokio::sync::Notify;

/// How many idle connections one eviction closes at most: under a flood the table is scanned once for
/// several newcomers rather than once for each (a 256th of the cap, 1 to 16).
fn eviction_batch(limit: usize) -> usize {
    (limit / 256).clamp(1, 16)
}

/// How many evicted connections may still hold their sockets before the accept loop waits for them to
/// close; the connection cap leaves these descriptors free too.
pub(crate) const CLOSING_ALLOWANCE: usize = 32;

/// `idle_since` while a request is in progress.
const BUSY: u64 = 0;
/// `idle_since` once the connection was chosen to be closed.
const EVICTED: u64 = u64::MAX;

/// What a connection's parts (the front, the service wrapper, the driver) share.
pub(crate) struct Connection {
    /// [`BUSY`], [`EVICTED`], or 1 + the milliseconds since the registry's epoch when it became idle.
    idle_since: AtomicU64,
    epoch: Instant,
    /// The front's reader, woken when a request ends if it is parked waiting for that.
    pub(crate) reader: AtomicWaker,
    reader_parked: AtomicBool,
    /// Set by the front when the current request's body did not arrive in time.
    pub(crate) body_timed_out: AtomicBool,
    /// The driver, woken to close the connection (eviction) or to shut it down gracefully.
    pub(crate) driver: AtomicWaker,
    stop: AtomicBool,
    /// Whether a request ever started on it.
    served: AtomicBool,
    /// Response bytes hyper holds (taken from the response body, not yet written out in full and
    /// dropped), on this connection and on all of them.
    unwritten: AtomicU64,
    all_unwritten: Arc<AtomicU64>,
}

impl Connection {
    fn new(epoch: Instant, all_unwritten: Arc<AtomicU64>) -> Self {
        let connection = Self {
            idle_since: AtomicU64::new(BUSY),
            epoch,
            reader: AtomicWaker::new(),
            reader_parked: AtomicBool::new(false),
            body_timed_out: AtomicBool::new(false),
            driver: AtomicWaker::new(),
            stop: AtomicBool::new(false),
            served: AtomicBool::new(false),
            unwritten: AtomicU64::new(0),
            all_unwritten,
        };
        connection.mark_idle();
        connection
    }

    fn now(&self) -> u64 {
        1 + u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(EVICTED - 2)
    }

    /// A request has been handed to the application.
    pub(crate) fn start_request(&self) {
        self.body_timed_out.store(false, Ordering::Relaxed);
        self.served.store(true, Ordering::Relaxed);
        let _ = self
            .idle_since
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| (v != EVICTED).then_some(BUSY));
    }

    /// The request's response has been handed to hyper (or the request was dropped).
    pub(crate) fn end_request(&self) {
        self.mark_idle();
        self.wake_reader();
    }

    /// The front waits for the current request to end (its waker is registered in `reader`).
    pub(crate) fn park_reader(&self) {
        self.reader_parked.store(true, Ordering::Release);
    }

    /// The front no longer waits (it found the way open itself).
    pub(crate) fn unpark_reader(&self) {
        self.reader_parked.store(false, Ordering::Release);
    }

    /// Wake the front if it waits (hyper usually reads again by itself once a response is out).
    pub(crate) fn wake_reader(&self) {
        if self.reader_parked.swap(false, Ordering::AcqRel) {
            self.reader.wake();
        }
    }

    /// Whether it was chosen to be closed.
    pub(crate) fn is_evicted(&self) -> bool {
        self.idle_since.load(Ordering::Acquire) == EVICTED
    }

    /// Ask the driver to shut the connection down gracefully.
    pub(crate) fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.driver.wake();
    }

    /// Whether a graceful shutdown was asked for.
    pub(crate) fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn mark_idle(&self) {
        let now = self.now();
        let _ = self
            .idle_since
            .compare_exchange(BUSY, now, Ordering::AcqRel, Ordering::Acquire);
    }

    /// hyper took `n` response bytes.
    pub(crate) fn buffered(&self, n: u64) {
        // The total first: a shed between the two forgets at most what the total already holds, so
        // the total never drops below zero.
        self.all_unwritten.fetch_add(n, Ordering::AcqRel);
        self.unwritten.fetch_add(n, Ordering::AcqRel);
    }

    /// hyper dropped `n` response bytes it held: written out, or gone with the connection. Bytes
    /// already forgotten (the connection was shed) are not taken off the total twice.
    pub(crate) fn released(&self, n: u64) {
        let before = self
            .unwritten
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(v.saturating_sub(n)))
            .unwrap_or(0);
        self.all_unwritten.fetch_sub(before.min(n), Ordering::AcqRel);
    }

    /// Its buffers are about to be dropped: they no longer count.
    fn forget_unwritten(&self) -> u64 {
        let unwritten = self.unwritten.swap(0, Ordering::AcqRel);
        self.all_unwritten.fetch_sub(unwritten, Ordering::AcqRel);
        unwritten
    }

    /// Whether a request is in progress.
    pub(crate) fn is_busy(&self) -> bool {
        self.idle_since.load(Ordering::Acquire) == BUSY
    }

    /// Since when it is idle, if it is.
    fn idle(&self) -> Option<u64> {
        match self.idle_since.load(Ordering::Acquire) {
            BUSY | EVICTED => None,
            since => Some(since),
        }
    }

    /// Choose it to be closed, unless a request started in the meantime.
    fn evict(&self, since: u64) -> bool {
        let chosen = self
            .idle_since
            .compare_exchange(since, EVICTED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if chosen {
            self.driver.wake();
        }
        chosen
    }
}

/// The open connections.
pub(crate) struct Registry {
    slots: Mutex<Slots>,
    limit: usize,
    epoch: Instant,
    /// Response bytes not yet written, over all connections, and the budget for them.
    unwritten: Arc<AtomicU64>,
    unwritten_budget: u64,
    /// Woken whenever a connection's place is freed (its socket is closed).
    released: Notify,
}

#[derive(Default)]
struct Slots {
    live: Vec<Option<Arc<Connection>>>,
    free: Vec<usize>,
    /// Connections counted against the cap (evicted ones no longer are, even before they close).
    open: usize,
}

/// A connection's place in the registry; dropping it frees the place.
pub(crate) struct Admission {
    registry: Arc<Registry>,
    index: usize,
    pub(crate) connection: Arc<Connection>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.registry.release(self.index, &self.connection);
    }
}

impl Registry {
    pub(crate) fn new(limit: usize, unwritten_budget: u64) -> Arc<Self> {
        Arc::new(Self {
            slots: Mutex::new(Slots::default()),
            limit,
            epoch: Instant::now(),
            unwritten: Arc::new(AtomicU64::new(0)),
            unwritten_budget,
            released: Notify::new(),
        })
    }

    /// Whether the unwritten response bytes are over their budget.
    pub(crate) fn over_budget(&self) -> bool {
        self.unwritten.load(Ordering::Acquire) > self.unwritten_budget
    }

    /// Close idle connections holding unwritten responses, longest-held first, until the unwritten
    /// bytes are within their budget again; how many were chosen.
    pub(crate) fn shed_unread(&self) -> usize {
        let mut slots = self.lock();
        let mut holding: Vec<(u64, Arc<Connection>)> = slots
            .live
            .iter()
            .flatten()
            .filter(|c| c.unwritten.load(Ordering::Acquire) > 0)
            .filter_map(|c| c.idle().map(|since| (since, c.clone())))
            .collect();
        holding.sort_unstable_by_key(|(since, _)| *since);
        let mut chosen = 0;
        for (since, connection) in holding {
            if !self.over_budget() {
                break;
            }
            if connection.evict(since) {
                connection.forget_unwritten();
                chosen += 1;
            }
        }
        slots.open -= chosen;
        chosen
    }

    /// Ask every connection to shut down gracefully.
    pub(crate) fn stop_all(&self) {
        for connection in self.lock().live.iter().flatten() {
            connection.request_stop();
        }
    }

    /// Response bytes not yet written, over all connections.
    #[cfg(test)]
    pub(crate) fn unwritten(&self) -> u64 {
        self.unwritten.load(Ordering::Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        // The table stays consistent whatever panicked while holding it: each change is one push or pop.
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admit a new connection, closing idle ones if the cap is reached; `None` when every open
    /// connection is busy (the newcomer is to be refused).
    pub(crate) fn admit(self: &Arc<Self>) -> Option<Admission> {
        let mut slots = self.lock();
        if slots.open >= self.limit && evict_idle(&mut slots, eviction_batch(self.limit)) == 0 {
            return None;
        }
        let connection = Arc::new(Connection::new(self.epoch, self.unwritten.clone()));
        let index = match slots.free.pop() {
            Some(index) => {
                slots.live[index] = Some(connection.clone());
                index
            }
            None => {
                slots.live.push(Some(connection.clone()));
                slots.live.len() - 1
            }
        };
        slots.open += 1;
        Some(Admission {
            registry: self.clone(),
            index,
            connection,
        })
    }

    /// Close up to `n` of the longest-idle connections (file descriptors ran out); how many were chosen.
    pub(crate) fn shed_idle(&self, n: usize) -> usize {
        evict_idle(&mut self.lock(), n)
    }

    /// Connections open (evicted ones that have not closed yet excluded).
    pub(crate) fn open(&self) -> usize {
        self.lock().open
    }

    /// Connections chosen to be closed whose sockets are still open: their drivers have not run yet.
    pub(crate) fn closing(&self) -> usize {
        let slots = self.lock();
        (slots.live.len() - slots.free.len()).saturating_sub(slots.open)
    }

    /// Wait until at most `max` chosen connections are still closing. Evicted connections no longer
    /// count against the cap, but each holds its descriptor until its driver runs; on a busy machine a
    /// flood of newcomers would otherwise be admitted faster than the evicted close, and the
    /// descriptors held would climb past the cap to the process's limit.
    pub(crate) async fn wait_for_closing_below(&self, max: usize) {
        loop {
            // A release between the check and the wait leaves a permit (`notify_one`): not missed.
            let released = self.released.notified();
            if self.closing() <= max {
                return;
            }
            released.await;
        }
    }

    fn release(&self, index: usize, connection: &Connection) {
        connection.forget_unwritten();
        let mut slots = self.lock();
        if connection.idle_since.load(Ordering::Acquire) != EVICTED {
            slots.open -= 1;
        }
        slots.live[index] = None;
        slots.free.push(index);
        drop(slots);
        self.released.notify_one();
    }
}

/// Choose `n` idle connections to be closed — never-served ones first, each kind longest-idle first;
/// they stop counting against the cap at once.
fn evict_idle(slots: &mut Slots, n: usize) -> usize {
    let mut idle: Vec<(bool, u64, &Arc<Connection>)> = slots
        .live
        .iter()
        .flatten()
        .filter_map(|c| c.idle().map(|since| (c.served.load(Ordering::Relaxed), since, c)))
        .collect();
    let n = n.min(idle.len());
    if n == 0 {
        return 0;
    }
    if n < idle.len() {
        idle.select_nth_unstable_by_key(n - 1, |(served, since, _)| (*served, *since));
    }
    let chosen = idle[..n].iter().filter(|(_, since, c)| c.evict(*since)).count();
    slots.open -= chosen;
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_the_longest_idle_connection_makes_room() {
        let registry = Registry::new(3, u64::MAX);
        let first = registry.admit().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let busy = registry.admit().unwrap();
        busy.connection.start_request();
        let third = registry.admit().unwrap();
        assert_eq!(registry.open(), 3);
        // Full: the idle ones go, oldest first; the busy one stays.
        let fourth = registry.admit().expect("room made");
        assert_eq!(first.connection.idle_since.load(Ordering::Acquire), EVICTED);
        assert!(busy.connection.is_busy());
        assert!(third.connection.idle().is_some(), "only as many as needed are closed");
        assert_eq!(registry.open(), 3);
        drop(first);
        assert_eq!(
            registry.open(),
            3,
            "an evicted connection stopped counting when it was chosen"
        );
        drop(third);
        drop(fourth);
        drop(busy);
        assert_eq!(registry.open(), 0);
    }

    #[test]
    fn silent_connections_go_before_served_ones() {
        let registry = Registry::new(2, u64::MAX);
        let served = registry.admit().unwrap();
        served.connection.start_request();
        served.connection.end_request();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let silent = registry.admit().unwrap();
        let _newcomer = registry.admit().expect("room made");
        assert_eq!(silent.connection.idle_since.load(Ordering::Acquire), EVICTED);
        assert!(served.connection.idle().is_some());
    }

    #[test]
    fn when_every_connection_is_busy_the_newcomer_is_refused() {
        let registry = Registry::new(2, u64::MAX);
        let a = registry.admit().unwrap();
        let b = registry.admit().unwrap();
        a.connection.start_request();
        b.connection.start_request();
        assert!(registry.admit().is_none());
        b.connection.end_request();
        assert!(registry.admit().is_some());
    }

    #[test]
    fn a_request_that_started_in_time_saves_its_connection() {
        let registry = Registry::new(1, u64::MAX);
        let a = registry.admit().unwrap();
        let since = a.connection.idle().unwrap();
        a.connection.start_request();
        assert!(!a.connection.evict(since));
        assert!(a.connection.is_busy());
    }

    #[test]
    fn past_the_budget_the_longest_unread_responses_go() {
        let registry = Registry::new(10, 1000);
        let old = registry.admit().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let newer = registry.admit().unwrap();
        let reading = registry.admit().unwrap();
        old.connection.buffered(600);
        newer.connection.buffered(600);
        reading.connection.buffered(600);
        reading.connection.released(600);
        assert_eq!(registry.unwritten(), 1200);
        assert!(registry.over_budget());
        assert_eq!(registry.shed_unread(), 1);
        assert_eq!(old.connection.idle_since.load(Ordering::Acquire), EVICTED);
        assert_eq!(registry.unwritten(), 600);
        assert!(!registry.over_budget());
        // The shed connection's frames are dropped after it was forgotten: not taken off twice.
        old.connection.released(600);
        assert_eq!(registry.unwritten(), 600);
        drop(old);
        drop(newer);
        assert_eq!(registry.unwritten(), 0);
        reading.connection.buffered(10);
        reading.connection.released(50);
        assert_eq!(registry.unwritten(), 0);
    }

    #[tokio::test]
    async fn evicted_connections_are_closing_until_their_sockets_are_dropped() {
        let registry = Registry::new(2, u64::MAX);
        let first = registry.admit().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let second = registry.admit().unwrap();
        let third = registry.admit().expect("room made");
        assert_eq!(registry.open(), 2);
        assert_eq!(registry.closing(), 1, "the evicted one still holds its socket");
        // At most one closing: the wait is over at once; at most none: it waits for the drop.
        registry.wait_for_closing_below(1).await;
        let waiter = {
            let registry = registry.clone();
            tokio::spawn(async move { registry.wait_for_closing_below(0).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "returned while a socket was still closing");
        drop(first);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("the wait ends when the socket is dropped")
            .expect("waiter");
        assert_eq!(registry.closing(), 0);
        drop((second, third));
    }
}
