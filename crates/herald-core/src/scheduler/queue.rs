//! One endpoint's queue: ready work, per-key ordering, and the gates that decide whether it may send now
//! (pause, concurrency cap, circuit breaker, `Retry-After` hold, rate pacing).

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::{EndpointLimits, Queued};
use crate::breaker::{Breaker, BreakerConfig};
use crate::clock::Millis;

/// Whether an endpoint may send now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gate {
    /// Yes.
    Open,
    /// Not now; something else (a result, new work, a change of limits) must happen first.
    Shut,
    /// Not before this time, when it should be looked at again.
    Until(Millis),
}

/// Deliveries of one ordering key that wait behind the key's head (the earliest resident one).
#[derive(Debug)]
struct KeyLine<J> {
    waiting: VecDeque<(Millis, J)>,
}

#[derive(Debug)]
pub(super) struct EndpointQueue<J> {
    pub(super) ready: VecDeque<J>,
    pub(super) limits: EndpointLimits,
    pub(super) in_flight: u32,
    pub(super) in_ring: bool,
    /// Deliveries held in memory: ready + parked behind a key + waiting on a timer + in flight.
    pub(super) resident: usize,
    /// Deliveries exist in the store beyond `cursor` that are not resident.
    pub(super) overflow: bool,
    /// The highest store `seq` made resident; every pending delivery at or below it is resident.
    pub(super) cursor: i64,
    pub(super) refilling: bool,
    /// The ticket of the refill in progress (see `Refill::ticket`).
    pub(super) refill_ticket: u64,
    /// An offer was deferred while a refill was reading: the refill may have missed it.
    pub(super) deferred_while_refilling: bool,
    pub(super) breaker: Breaker,
    /// The endpoint asked to be left alone until then (`Retry-After` on 429/503).
    pub(super) hold_until: Millis,
    /// Rate pacing: the earliest time (µs) the next request may leave.
    next_slot_us: i64,
    /// The pending wake-up registered for this endpoint, if any.
    pub(super) wake_at: Option<Millis>,
    /// Ordered endpoints: the keys with a resident head, and who waits behind each.
    keys: HashMap<String, KeyLine<J>>,
    /// When each resident delivery became pending (a multiset: time → count), so the oldest is the first
    /// key: the age operators alert on, kept up to date as deliveries come and go instead of searched.
    since: BTreeMap<Millis, u32>,
    /// Pending deliveries known to be in the store only (beyond `cursor`): counted as offers are
    /// deferred and refills read them, set by [`super::Scheduler::set_store_backlog`] when unknown.
    pub(super) stored_only: u64,
}

impl<J: Queued> EndpointQueue<J> {
    pub(super) fn new(limits: EndpointLimits, breaker: &BreakerConfig) -> Self {
        Self {
            ready: VecDeque::new(),
            limits,
            in_flight: 0,
            in_ring: false,
            resident: 0,
            overflow: false,
            cursor: 0,
            refilling: false,
            refill_ticket: 0,
            deferred_while_refilling: false,
            breaker: Breaker::new(breaker),
            hold_until: Millis::EPOCH,
            next_slot_us: 0,
            wake_at: None,
            keys: HashMap::new(),
            since: BTreeMap::new(),
            stored_only: 0,
        }
    }

    /// When the oldest resident delivery became pending.
    pub(super) fn oldest_pending_since(&self) -> Option<Millis> {
        self.since.keys().next().copied()
    }

    fn track(&mut self, job: &J) {
        self.resident += 1;
        *self.since.entry(job.pending_since()).or_insert(0) += 1;
    }

    fn untrack(&mut self, job: &J) {
        self.resident = self.resident.saturating_sub(1);
        let since = job.pending_since();
        if let Some(count) = self.since.get_mut(&since) {
            *count -= 1;
            if *count == 0 {
                self.since.remove(&since);
            }
        }
    }

    /// Whether the endpoint may send one more request at `now`.
    pub(super) fn gate(&self, now: Millis) -> Gate {
        if self.limits.paused || self.ready.is_empty() {
            return Gate::Shut;
        }
        if let Some(until) = self.breaker.blocked_until(now) {
            return Gate::Until(until);
        }
        if self.in_flight >= self.breaker.allowed_in_flight(self.limits.max_concurrency.max(1), now) {
            return Gate::Shut;
        }
        let mut until = self.hold_until;
        if self.limits.rate_per_sec.is_some() {
            // The slot rounded up to a whole millisecond: never a request before its slot.
            let slot_ms = self.next_slot_us.div_euclid(1_000) + i64::from(self.next_slot_us % 1_000 != 0);
            until = until.max(Millis::from_unix_ms(slot_ms));
        }
        if until > now { Gate::Until(until) } else { Gate::Open }
    }

    /// The delivery to send next. Normally the oldest ready one; the probe of an open breaker is instead
    /// the ready delivery tried most often (the oldest of those): an endpoint that refuses first
    /// attempts but takes retries would otherwise be probed with first attempts, one per cool-down, while
    /// the retries that would close it wait behind them.
    pub(super) fn take_next(&mut self, now: Millis) -> Option<J> {
        if !self.breaker.probe_due(now) {
            return self.ready.pop_front();
        }
        let most_tried = self
            .ready
            .iter()
            .enumerate()
            .max_by_key(|(index, job)| (job.attempts(), std::cmp::Reverse(*index)))
            .map(|(index, _)| index)?;
        self.ready.remove(most_tried)
    }

    /// A request leaves now: count it, tell the breaker, advance the pacing slot.
    pub(super) fn on_send(&mut self, now: Millis) {
        self.in_flight += 1;
        self.breaker.on_send();
        if let Some(rate) = self.limits.rate_per_sec.filter(|r| *r > 0) {
            let interval_us = 1_000_000 / i64::from(rate);
            self.next_slot_us = self.next_slot_us.max(now.as_unix_ms().saturating_mul(1_000)) + interval_us.max(1);
        }
    }

    /// Record what an attempt told us about the endpoint's health.
    pub(super) fn on_verdict(&mut self, verdict: super::Verdict, config: &BreakerConfig, now: Millis) {
        match verdict {
            super::Verdict::Success => {
                self.breaker.on_success(config, now);
                self.breaker.ramp_reached(self.limits.max_concurrency.max(1));
            }
            super::Verdict::Rejected => {
                self.breaker.on_rejected(config, now);
                self.breaker.ramp_reached(self.limits.max_concurrency.max(1));
            }
            super::Verdict::Failure { hold_until } => {
                self.breaker.on_failure(config, now);
                if let Some(until) = hold_until {
                    self.hold_until = self.hold_until.max(until.min(now.saturating_add(config.max_cooldown)));
                }
            }
            super::Verdict::NotSent => {}
        }
    }

    /// A delivery becomes resident. On an ordered endpoint, one whose key already has a resident head
    /// waits behind it (returns `None`); otherwise it is handed back to be placed.
    pub(super) fn admit(&mut self, due: Millis, job: J) -> Option<(Millis, J)> {
        self.track(&job);
        let Some(key) = self.ordering_key_of(&job) else {
            return Some((due, job));
        };
        match self.keys.get_mut(key) {
            Some(line) => {
                line.waiting.push_back((due, job));
                None
            }
            None => {
                self.keys.insert(
                    key.to_owned(),
                    KeyLine {
                        waiting: VecDeque::new(),
                    },
                );
                Some((due, job))
            }
        }
    }

    /// A delivery left the queue for good (done, expired, cancelled). Returns the next delivery of its
    /// key, now the key's head, to be placed.
    pub(super) fn release(&mut self, job: &J) -> Option<(Millis, J)> {
        self.untrack(job);
        let key = job.ordering_key()?;
        let line = self.keys.get_mut(key)?;
        match line.waiting.pop_front() {
            Some(next) => Some(next),
            None => {
                self.keys.remove(key);
                None
            }
        }
    }

    /// Stop ordering (the endpoint switched to unordered): every waiting delivery is handed back.
    pub(super) fn release_all_keys(&mut self) -> Vec<(Millis, J)> {
        self.keys.drain().flat_map(|(_, line)| line.waiting).collect()
    }

    /// Remove waiting (ready or parked) deliveries that match `expired`; returns them, and the deliveries
    /// that became their key's head, to be placed.
    pub(super) fn take_matching(&mut self, expired: &impl Fn(&J) -> bool) -> (Vec<J>, Vec<(Millis, J)>) {
        let mut taken = Vec::new();
        for line in self.keys.values_mut() {
            let before = line.waiting.len();
            let mut kept = VecDeque::with_capacity(before);
            for (due, job) in line.waiting.drain(..) {
                if expired(&job) {
                    taken.push(job);
                } else {
                    kept.push_back((due, job));
                }
            }
            line.waiting = kept;
        }
        // Parked deliveries are not heads: removing them frees nobody.
        for job in &taken {
            self.untrack(job);
        }
        let mut promoted = Vec::new();
        let mut kept = VecDeque::with_capacity(self.ready.len());
        for job in std::mem::take(&mut self.ready) {
            if expired(&job) {
                promoted.extend(self.release(&job));
                taken.push(job);
            } else {
                kept.push_back(job);
            }
        }
        self.ready = kept;
        (taken, promoted)
    }

    /// Deliveries parked behind a key head.
    pub(super) fn parked(&self) -> usize {
        self.keys.values().map(|line| line.waiting.len()).sum()
    }

    fn ordering_key_of<'j>(&self, job: &'j J) -> Option<&'j str> {
        if self.limits.ordered { job.ordering_key() } else { None }
    }
}
