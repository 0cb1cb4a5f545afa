//! The per-endpoint circuit breaker, with slow start after recovery. Pure logic: time is passed in.
//!
//! ```text
//!            N consecutive failures                 cool-down elapsed
//!  Closed ───────────────────────────▶ Open ───────────────────────────▶ (probe sent) HalfOpen
//!    ▲  ▲                               ▲                                              │   │
//!    │  └─────── any success ───────────┤◀──── probe failed (cool-down doubles) ───────┘   │
//!    └──────────────── probe succeeded: closed, concurrency ramps 2, 3, 4 … ◀──────────────┘
//! ```
//!
//! While the breaker is open nothing is sent to the endpoint: its deliveries wait in their queue without
//! using up attempts (they still die when their time window ends). After a cool-down exactly one delivery
//! goes out as a probe. If it fails the cool-down doubles (up to a ceiling), so an endpoint that stays down
//! costs one request per cool-down, not one per queued delivery.
//!
//! **Slow start.** When a probe succeeds the endpoint is likely to have a backlog and to be fragile, so
//! instead of its full concurrency cap it gets a *ramp*: one more request in flight per success, which
//! doubles the allowed concurrency every round trip (1, 2, 4, 8 …) until the cap is reached — the same
//! idea as TCP slow start. A failure during the ramp counts toward opening the breaker again as usual.
//!
//! **What counts.** Only what says the endpoint is unwell counts as a failure: timeouts, refused or broken
//! connections, 5xx, 408/425/429, 1xx/3xx and refused addresses (the last two fail every delivery alike,
//! whatever its content). A content rejection — any other 4xx, 410 included — says the endpoint is up and
//! answering: for the breaker it is a sign of life like a success ([`Breaker::on_rejected`]), so a receiver
//! that refuses one malformed event type is not slowed down for every other delivery. (It still counts
//! as a failed *delivery* for [`Breaker::failing_since`], which disables an endpoint whose attempts have
//! all failed for days.)
//!
//! **How failures and successes mix.** A success ends a run of failures. A run opens the breaker once it
//! has reached the threshold *and* the endpoint has gone a whole initial cool-down without a sign of life:
//! an endpoint that keeps taking some requests — retries that succeed where first attempts fail, a
//! flapping receiver — is never shut off by the failures in between, while one that takes nothing is
//! shut off within a cool-down. (The scheduler also picks its probe among the deliveries tried most
//! often, so such an endpoint's probe is a retry, not another first attempt.)

use std::time::Duration;

use crate::clock::Millis;

/// Tunables of every endpoint's breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failed attempts that open the breaker (at least 1).
    pub failure_threshold: u32,
    /// The first cool-down after opening.
    pub initial_cooldown: Duration,
    /// The longest cool-down, however long the endpoint keeps failing.
    pub max_cooldown: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failure_threshold: 5,
            initial_cooldown: Duration::from_secs(5),
            max_cooldown: Duration::from_secs(10 * 60),
        }
    }
}

/// Which state a breaker is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Deliveries flow (possibly still ramping up after a recovery).
    Closed,
    /// Nothing is sent until the next probe is due.
    Open,
    /// One probe is in flight; nothing else is sent until it answers.
    HalfOpen,
}

impl BreakerState {
    /// The stable snake_case name shown by the API.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }
}

/// One endpoint's breaker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Breaker {
    state: BreakerState,
    consecutive_failures: u32,
    opened_at: Option<Millis>,
    next_probe_at: Option<Millis>,
    cooldown: Duration,
    /// Requests allowed in flight while ramping up after a recovery; `None` once the ramp is over.
    ramp: Option<u32>,
    /// When the current run of failures began (cleared by a success).
    failing_since: Option<Millis>,
    /// When the endpoint last showed it is alive (a success or a content rejection).
    alive_at: Option<Millis>,
}

impl Breaker {
    /// A closed breaker with no history.
    pub fn new(config: &BreakerConfig) -> Self {
        Self {
            state: BreakerState::Closed,
            consecutive_failures: 0,
            opened_at: None,
            next_probe_at: None,
            cooldown: config.initial_cooldown,
            ramp: None,
            failing_since: None,
            alive_at: None,
        }
    }

    /// The current state.
    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// Failed attempts since the last success.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// When the breaker last opened (while it is open or half-open).
    pub fn opened_at(&self) -> Option<Millis> {
        self.opened_at
    }

    /// When the next probe may go out (while open).
    pub fn next_probe_at(&self) -> Option<Millis> {
        match self.state {
            BreakerState::Open => self.next_probe_at,
            _ => None,
        }
    }

    /// When the current run of failures began, if the last attempt failed.
    pub fn failing_since(&self) -> Option<Millis> {
        self.failing_since
    }

    /// The slow-start limit on requests in flight, while ramping up after a recovery.
    pub fn ramp(&self) -> Option<u32> {
        self.ramp
    }

    /// Whether the next request sent at `now` would be the probe of an open breaker.
    pub fn probe_due(&self, now: Millis) -> bool {
        self.state == BreakerState::Open && self.next_probe_at.is_some_and(|at| now >= at)
    }

    /// How many requests may be in flight at `now`, given the endpoint's own cap.
    pub fn allowed_in_flight(&self, cap: u32, now: Millis) -> u32 {
        match self.state {
            BreakerState::Closed => self.ramp.map_or(cap, |ramp| ramp.min(cap)),
            BreakerState::Open if self.probe_due(now) => 1,
            BreakerState::Open | BreakerState::HalfOpen => 0,
        }
    }

    /// When sending may become possible again, if it is blocked only by the cool-down.
    pub fn blocked_until(&self, now: Millis) -> Option<Millis> {
        match (self.state, self.next_probe_at) {
            (BreakerState::Open, Some(at)) if at > now => Some(at),
            _ => None,
        }
    }

    /// A request is about to be sent. When the breaker is open (its cool-down over) this is the probe.
    pub fn on_send(&mut self) {
        if self.state == BreakerState::Open {
            self.state = BreakerState::HalfOpen;
        }
    }

    /// An attempt succeeded at `now`.
    pub fn on_success(&mut self, config: &BreakerConfig, now: Millis) {
        self.failing_since = None;
        self.on_alive(config, now);
    }

    /// The endpoint answered at `now` but refused the delivery's content (a 4xx other than 408, 425 and
    /// 429): alive for the breaker, yet a failed delivery for [`failing_since`](Self::failing_since).
    pub fn on_rejected(&mut self, config: &BreakerConfig, now: Millis) {
        self.failing_since.get_or_insert(now);
        self.on_alive(config, now);
    }

    /// The endpoint showed it is up: the run of failures ends, an open breaker closes and ramps up.
    fn on_alive(&mut self, config: &BreakerConfig, now: Millis) {
        self.consecutive_failures = 0;
        self.alive_at = Some(now);
        match self.state {
            BreakerState::Closed => {
                // Each success while ramping lets one more request fly: the allowance doubles per round trip.
                if let Some(ramp) = self.ramp.as_mut() {
                    *ramp = ramp.saturating_add(1);
                }
            }
            BreakerState::Open | BreakerState::HalfOpen => {
                self.state = BreakerState::Closed;
                self.opened_at = None;
                self.next_probe_at = None;
                self.cooldown = config.initial_cooldown;
                self.ramp = Some(2);
            }
        }
    }

    /// The ramp has reached the endpoint's cap: stop tracking it.
    pub fn ramp_reached(&mut self, cap: u32) {
        if self.ramp.is_some_and(|ramp| ramp >= cap) {
            self.ramp = None;
        }
    }

    /// An attempt failed at `now`.
    pub fn on_failure(&mut self, config: &BreakerConfig, now: Millis) {
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        self.failing_since.get_or_insert(now);
        match self.state {
            BreakerState::Closed => {
                let recently_alive = self
                    .alive_at
                    .is_some_and(|at| now < at.saturating_add(config.initial_cooldown));
                if self.consecutive_failures >= config.failure_threshold.max(1) && !recently_alive {
                    self.open(config.initial_cooldown, now);
                }
            }
            BreakerState::HalfOpen => {
                let cooldown = self.cooldown.saturating_mul(2).min(config.max_cooldown);
                self.open(cooldown, now);
            }
            // Results of requests sent before the breaker opened: already accounted for.
            BreakerState::Open => {}
        }
    }

    fn open(&mut self, cooldown: Duration, now: Millis) {
        self.state = BreakerState::Open;
        self.opened_at = Some(now);
        self.cooldown = cooldown;
        self.next_probe_at = Some(now.saturating_add(cooldown));
        self.ramp = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BreakerConfig {
        BreakerConfig {
            failure_threshold: 3,
            initial_cooldown: Duration::from_secs(1),
            max_cooldown: Duration::from_secs(5),
        }
    }

    /// A moment of the tests' virtual clock.
    fn at(ms: i64) -> Millis {
        Millis::from_unix_ms(ms)
    }

    #[test]
    fn opens_after_the_threshold_and_allows_nothing_until_the_probe() {
        let c = config();
        let mut b = Breaker::new(&c);
        for now in [10, 20] {
            b.on_failure(&c, at(now));
            assert_eq!(b.state(), BreakerState::Closed);
            assert_eq!(b.allowed_in_flight(10, at(now)), 10);
        }
        b.on_failure(&c, at(30));
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.opened_at(), Some(at(30)));
        assert_eq!(b.next_probe_at(), Some(at(1_030)));
        assert_eq!(b.allowed_in_flight(10, at(1_029)), 0);
        assert_eq!(b.blocked_until(at(1_029)), Some(at(1_030)));
        assert_eq!(b.allowed_in_flight(10, at(1_030)), 1, "exactly one probe");
        assert_eq!(b.failing_since(), Some(at(10)));
    }

    #[test]
    fn a_failed_probe_doubles_the_cooldown_up_to_the_ceiling() {
        let c = config();
        let mut b = Breaker::new(&c);
        for _ in 0..3 {
            b.on_failure(&c, at(0));
        }
        let mut now = 0;
        for expected in [2_000, 4_000, 5_000, 5_000] {
            now = b.next_probe_at().map_or(now, Millis::as_unix_ms);
            b.on_send();
            assert_eq!(b.state(), BreakerState::HalfOpen);
            assert_eq!(b.allowed_in_flight(10, at(now)), 0, "only the probe while half-open");
            b.on_failure(&c, at(now));
            assert_eq!(b.state(), BreakerState::Open);
            assert_eq!(b.next_probe_at(), Some(at(now + expected)));
        }
    }

    #[test]
    fn a_successful_probe_closes_and_ramps_up_slowly() {
        let c = config();
        let mut b = Breaker::new(&c);
        for _ in 0..3 {
            b.on_failure(&c, at(0));
        }
        b.on_send();
        b.on_success(&c, at(0));
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.consecutive_failures(), 0);
        assert_eq!(b.failing_since(), None);
        let mut seen = vec![b.allowed_in_flight(10, at(0))];
        while b.ramp().is_some() {
            b.on_success(&c, at(0));
            b.ramp_reached(10);
            seen.push(b.allowed_in_flight(10, at(0)));
        }
        assert_eq!(seen, vec![2, 3, 4, 5, 6, 7, 8, 9, 10]);
        // The cool-down starts over after a recovery.
        for _ in 0..3 {
            b.on_failure(&c, at(50_000));
        }
        assert_eq!(b.next_probe_at(), Some(at(51_000)));
    }

    #[test]
    fn a_straggling_success_while_open_closes_it() {
        let c = config();
        let mut b = Breaker::new(&c);
        for _ in 0..3 {
            b.on_failure(&c, at(0));
        }
        b.on_success(&c, at(0));
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.allowed_in_flight(10, at(0)), 2);
    }

    #[test]
    fn late_failures_while_open_do_not_move_the_probe() {
        let c = config();
        let mut b = Breaker::new(&c);
        for _ in 0..3 {
            b.on_failure(&c, at(0));
        }
        b.on_failure(&c, at(500));
        assert_eq!(b.next_probe_at(), Some(at(1_000)));
        assert_eq!(b.consecutive_failures(), 4);
    }

    #[test]
    fn content_rejections_are_signs_of_life_not_failures() {
        let c = config();
        let mut b = Breaker::new(&c);
        for now in 0..20 {
            b.on_rejected(&c, at(now * 10));
        }
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.consecutive_failures(), 0);
        assert_eq!(b.allowed_in_flight(10, at(200)), 10);
        assert_eq!(
            b.failing_since(),
            Some(at(0)),
            "still failed deliveries, for the disable-after rule"
        );
        // A rejected probe closes an open breaker: the endpoint answered.
        for _ in 0..3 {
            b.on_failure(&c, at(5_000));
        }
        assert_eq!(b.state(), BreakerState::Open);
        b.on_send();
        b.on_rejected(&c, at(6_000));
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.ramp(), Some(2));
        // A success clears the failing run; a rejection alone never does.
        b.on_success(&c, at(6_100));
        assert_eq!(b.failing_since(), None);
    }

    #[test]
    fn failures_between_recent_successes_never_open_it() {
        // First attempts fail, retries succeed: a success every few failures keeps the breaker closed,
        // however long each run of failures is, as long as the endpoint shows life within a cool-down.
        let c = config();
        let mut b = Breaker::new(&c);
        let mut now = 0;
        for _ in 0..50 {
            b.on_success(&c, at(now));
            for _ in 0..10 {
                now += 50;
                b.on_failure(&c, at(now));
            }
            assert_eq!(b.state(), BreakerState::Closed, "at {now}");
        }
        // Silence for a whole cool-down: the next failure opens it.
        now += 1_000;
        b.on_failure(&c, at(now));
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.opened_at(), Some(at(now)));
    }

    #[test]
    fn the_threshold_still_opens_it_once_the_last_sign_of_life_is_a_cool_down_old() {
        let c = config();
        let mut b = Breaker::new(&c);
        b.on_success(&c, at(0));
        for now in [100, 200, 300, 999] {
            b.on_failure(&c, at(now));
            assert_eq!(b.state(), BreakerState::Closed);
        }
        b.on_failure(&c, at(1_000));
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.consecutive_failures(), 5);
    }
}
