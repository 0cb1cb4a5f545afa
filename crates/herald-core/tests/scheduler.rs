//! Scheduler behaviour under a virtual clock: caps, fairness, timers, pausing and bounded windows.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use herald_core::clock::Millis;
use herald_core::scheduler::{EndpointLimits, Finished, Loaded, Offer, Refill, Scheduler, SchedulerConfig, Verdict};
use proptest::prelude::*;

type Sched = Scheduler<&'static str, i64>;

fn sched(window: usize) -> Sched {
    Scheduler::new(SchedulerConfig {
        window,
        ..SchedulerConfig::default()
    })
}

/// A moment of the tests' virtual clock.
fn at(ms: i64) -> Millis {
    Millis::from_unix_ms(ms)
}

fn limits(cap: u32) -> EndpointLimits {
    EndpointLimits {
        max_concurrency: cap,
        ..EndpointLimits::default()
    }
}

#[test]
fn concurrency_cap_holds_and_frees_on_finish() {
    let mut s = sched(100);
    s.configure("a", limits(2), at(0));
    for seq in 1..=5 {
        assert_eq!(s.offer("a", seq, at(0), seq, at(0)), Offer::Accepted);
    }
    assert_eq!(s.next(at(0)), Some(("a", 1)));
    assert_eq!(s.next(at(0)), Some(("a", 2)));
    assert_eq!(s.next(at(0)), None, "cap of 2 reached");
    s.finish("a", Verdict::Success, Finished::Done(1), at(0));
    assert_eq!(s.next(at(0)), Some(("a", 3)));
    assert_eq!(s.endpoint_counts(&"a"), Some((4, 2, 2)));
}

#[test]
fn a_stuck_endpoint_does_not_block_others() {
    let mut s = sched(10_000);
    s.configure("blackhole", limits(3), at(0));
    s.configure("healthy", limits(3), at(0));
    for seq in 1..=1000 {
        s.offer("blackhole", seq, at(0), seq, at(0));
    }
    // The black hole takes its three slots and never finishes.
    for _ in 0..3 {
        assert_eq!(s.next(at(0)).map(|(k, _)| k), Some("blackhole"));
    }
    s.offer("healthy", 2000, at(0), 2000, at(0));
    assert_eq!(s.next(at(0)), Some(("healthy", 2000)));
    assert_eq!(s.next(at(0)), None);
}

#[test]
fn endpoints_are_served_round_robin() {
    let mut s = sched(100);
    for (i, key) in ["a", "b", "c"].into_iter().enumerate() {
        s.configure(key, limits(10), at(0));
        for n in 0..3 {
            let seq = (i * 10 + n) as i64 + 1;
            s.offer(key, seq, at(0), seq, at(0));
        }
    }
    let order: Vec<&str> = std::iter::from_fn(|| s.next(at(0)).map(|(k, _)| k)).collect();
    assert_eq!(order, ["a", "b", "c", "a", "b", "c", "a", "b", "c"]);
}

#[test]
fn retries_wait_for_their_timer() {
    let mut s = sched(100);
    s.offer("a", 1, at(0), 1, at(0));
    let (k, job) = s.next(at(0)).unwrap();
    s.finish(k, Verdict::NotSent, Finished::RetryAt(at(500), job), at(0));
    assert_eq!(s.next(at(499)), None);
    assert_eq!(s.next_timer(), Some(at(500)));
    assert_eq!(s.next(at(500)), Some(("a", 1)));
    // A delivery offered with a future due time waits too.
    s.offer("b", 2, at(1_000), 2, at(600));
    assert_eq!(s.next(at(999)), None);
    assert_eq!(s.next(at(1_000)), Some(("b", 2)));
}

#[test]
fn pause_holds_work_and_resume_releases_it() {
    let mut s = sched(100);
    s.configure(
        "a",
        EndpointLimits {
            max_concurrency: 5,
            paused: true,
            ..EndpointLimits::default()
        },
        at(0),
    );
    s.offer("a", 1, at(0), 1, at(0));
    assert_eq!(s.next(at(0)), None);
    s.configure("a", limits(5), at(0));
    assert_eq!(s.next(at(0)), Some(("a", 1)));
}

#[test]
fn removed_endpoints_drop_their_work() {
    let mut s = sched(100);
    s.offer("a", 1, at(0), 1, at(0));
    s.offer("a", 2, at(50), 2, at(0));
    s.remove_endpoint(&"a");
    assert_eq!(s.next(at(100)), None);
    s.finish("a", Verdict::Success, Finished::Done(1), at(100)); // a late result is ignored
}

#[test]
fn window_overflow_defers_then_refills_in_order() {
    let mut s = sched(4);
    for seq in 1..=4 {
        assert_eq!(s.offer("a", seq, at(0), seq, at(0)), Offer::Accepted);
    }
    assert_eq!(s.offer("a", 5, at(0), 5, at(0)), Offer::Deferred);
    assert!(s.refills_wanted().is_empty(), "still above half the window");
    for _ in 0..2 {
        let (k, job) = s.next(at(0)).unwrap();
        s.finish(k, Verdict::Success, Finished::Done(job), at(0));
    }
    let mut wanted = s.refills_wanted();
    assert_eq!(wanted.len(), 1);
    assert_eq!(wanted[0].after_seq, 4);
    assert!(s.refills_wanted().is_empty(), "one refill at a time");
    // While the refill reads, another offer arrives: it is deferred and must not be forgotten.
    assert_eq!(s.offer("a", 6, at(0), 6, at(0)), Offer::Deferred);
    s.refilled(
        wanted.remove(0),
        vec![Loaded {
            seq: 5,
            due: at(0),
            job: 5,
        }],
        true,
        at(0),
    );
    assert!(s.refills_wanted().is_empty(), "three resident: above half the window");
    let mut sent = Vec::new();
    for _ in 0..2 {
        let (k, job) = s.next(at(0)).unwrap();
        sent.push(job);
        s.finish(k, Verdict::Success, Finished::Done(job), at(0));
    }
    assert_eq!(sent, [3, 4]);
    let mut again = s.refills_wanted();
    assert_eq!(
        again.len(),
        1,
        "seq 6 may have been missed by the refill, so read again"
    );
    assert_eq!(again[0].after_seq, 5);
    s.refilled(
        again.remove(0),
        vec![Loaded {
            seq: 6,
            due: at(0),
            job: 6,
        }],
        true,
        at(0),
    );
    assert!(s.refills_wanted().is_empty());
    // Ingest's own copy of 6 arriving late changes nothing.
    assert_eq!(s.offer("a", 6, at(0), 6, at(0)), Offer::AlreadyResident);
    let jobs: Vec<i64> = std::iter::from_fn(|| s.next(at(0)).map(|(_, j)| j)).collect();
    assert_eq!(jobs, [5, 6]);
}

#[test]
fn a_read_that_outlived_its_queue_is_not_taken_by_the_next_one() {
    // The endpoint's partition goes to another node while a refill reads (seq 1 sent, 2 and 3 resident,
    // the read after 3 on its way), then comes back: the new queue reads everything from the start.
    let mut s = sched(4);
    s.mark_backlog("a", limits(1));
    let mut first = s.refills_wanted();
    s.refilled(
        first.remove(0),
        (1..=3)
            .map(|seq| Loaded {
                seq,
                due: at(0),
                job: seq,
            })
            .collect(),
        false,
        at(0),
    );
    let (k, job) = s.next(at(0)).expect("seq 1 is ready");
    s.finish(k, Verdict::Success, Finished::Done(job), at(0));
    let stale = s
        .refills_wanted()
        .pop()
        .expect("two resident: a second read, after seq 3");
    assert_eq!(stale.after_seq, 3);
    s.remove_endpoint(&"a");
    s.mark_backlog("a", limits(1));
    let fresh = s.refills_wanted().pop().expect("the new queue reads from the start");
    assert_eq!(fresh.after_seq, 0);
    // The old read answers first, with what lay past its cursor: it must not move the new cursor past 2 and 3.
    s.refilled(
        stale,
        vec![Loaded {
            seq: 9,
            due: at(0),
            job: 9,
        }],
        true,
        at(0),
    );
    s.refilled(
        fresh,
        [2, 3, 9]
            .into_iter()
            .map(|seq| Loaded {
                seq,
                due: at(0),
                job: seq,
            })
            .collect(),
        true,
        at(0),
    );
    let jobs: Vec<i64> = std::iter::from_fn(|| {
        let (k, job) = s.next(at(0))?;
        s.finish(k, Verdict::Success, Finished::Done(job), at(0));
        Some(job)
    })
    .collect();
    assert_eq!(jobs, [2, 3, 9], "every pending delivery is sent once");
}

#[test]
fn an_endpoint_is_asked_for_again_only_after_its_read_answers() {
    // Thousands of endpoints may be read at once after a wide fan-out: one whose read is on its way is
    // not considered again until the answer, and comes back if the store had more (or the read failed).
    let mut s = sched(4);
    for key in ["a", "b"] {
        s.mark_backlog(key, limits(4));
    }
    let mut wanted = s.refills_wanted();
    wanted.sort_by_key(|r| r.endpoint);
    assert_eq!(wanted.len(), 2);
    assert!(s.refills_wanted().is_empty(), "both reads are on their way");
    let b = wanted.pop().unwrap();
    let a = wanted.pop().unwrap();
    s.refilled(
        a,
        vec![Loaded {
            seq: 1,
            due: at(0),
            job: 1,
        }],
        false,
        at(0),
    );
    s.refilled(b, Vec::new(), false, at(0));
    let mut again = s.refills_wanted();
    again.sort_by_key(|r| r.endpoint);
    let after: Vec<(&str, i64)> = again.iter().map(|r| (r.endpoint, r.after_seq)).collect();
    assert_eq!(after, [("a", 1), ("b", 0)], "the store had more of a; b's read failed");
    for refill in again {
        s.refilled(refill, Vec::new(), true, at(0));
    }
    assert!(s.refills_wanted().is_empty(), "both exhausted");
}

#[test]
fn backlog_marked_at_start_is_refilled() {
    let mut s = sched(10);
    s.mark_backlog("a", limits(1));
    let mut wanted = s.refills_wanted();
    assert_eq!(wanted.len(), 1);
    assert_eq!((wanted[0].after_seq, wanted[0].limit), (0, 10));
    s.refilled(
        wanted.remove(0),
        vec![Loaded {
            seq: 7,
            due: at(0),
            job: 7,
        }],
        true,
        at(0),
    );
    assert_eq!(s.next(at(0)), Some(("a", 7)));
}

#[derive(Debug, Clone)]
enum Op {
    Offer(u8),
    Next,
    FinishDone(u8),
    FinishRetry(u8, u8),
    Tick(u8),
    Pause(u8, bool),
    /// Ask the scheduler which refills it wants; the store is read now or later (see `AnswerRefill`).
    RequestRefills,
    /// Answer one outstanding refill: `true` reads the store at answer time, `false` answers with what
    /// the store held when the refill was requested (offers made in between are missing from it).
    AnswerRefill(u8, bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..4).prop_map(Op::Offer),
        3 => Just(Op::Next),
        2 => any::<u8>().prop_map(Op::FinishDone),
        1 => (any::<u8>(), 0u8..50).prop_map(|(i, d)| Op::FinishRetry(i, d)),
        1 => (0u8..50).prop_map(Op::Tick),
        1 => (0u8..4, any::<bool>()).prop_map(|(e, p)| Op::Pause(e, p)),
        1 => Just(Op::RequestRefills),
        1 => (any::<u8>(), any::<bool>()).prop_map(|(i, late)| Op::AnswerRefill(i, late)),
    ]
}

const KEYS: [&str; 4] = ["e0", "e1", "e2", "e3"];

/// What a refill read from the "store": the rows, and whether there were no more.
type StoreRead = (Vec<i64>, bool);

proptest! {
    /// Whatever happens, no endpoint exceeds its cap, nothing is sent twice at once, and every delivery
    /// offered is eventually sent once the clock runs and every refill is answered from the "store".
    #[test]
    fn invariants_hold_under_random_operations(ops in proptest::collection::vec(op(), 1..300)) {
        let caps = [1u32, 2, 3, 5];
        let mut s = sched(6);
        let mut paused = [false; 4];
        for (i, key) in KEYS.iter().enumerate() {
            s.configure(key, limits(caps[i]), at(0));
        }
        let mut now = 0i64;
        let mut next_seq = 0i64;
        let mut store: HashMap<&str, Vec<i64>> = HashMap::new(); // pending seqs per endpoint
        let mut in_flight: Vec<(&str, i64)> = Vec::new();
        let mut done: HashSet<i64> = HashSet::new();
        // A store read for a refill: rows past the cursor, and whether the store had no more.
        let read = |store: &HashMap<&str, Vec<i64>>, r: &Refill<&'static str>| {
            let rows: Vec<i64> = store.get(r.endpoint).map(|v| v.iter().copied().filter(|&q| q > r.after_seq).take(r.limit).collect()).unwrap_or_default();
            let exhausted = rows.len() < r.limit;
            (rows, exhausted)
        };
        let answer = |s: &mut Sched, r: &Refill<&'static str>, (rows, exhausted): StoreRead, now| {
            s.refilled(r.clone(), rows.into_iter().map(|q| Loaded { seq: q, due: at(now), job: q }).collect(), exhausted, at(now));
        };
        let mut outstanding: Vec<(Refill<&'static str>, StoreRead)> = Vec::new();
        for op in ops {
            match op {
                Op::Offer(e) => {
                    next_seq += 1;
                    let key = KEYS[e as usize];
                    store.entry(key).or_default().push(next_seq);
                    s.offer(key, next_seq, at(now), next_seq, at(now));
                }
                Op::Next => {
                    if let Some((k, j)) = s.next(at(now)) {
                        prop_assert!(!in_flight.iter().any(|&(_, q)| q == j), "sent twice at once");
                        prop_assert!(!done.contains(&j), "sent after done");
                        in_flight.push((k, j));
                        let idx = KEYS.iter().position(|x| *x == k).unwrap();
                        prop_assert!(!paused[idx], "sent while paused");
                        let count = in_flight.iter().filter(|&&(kk, _)| kk == k).count() as u32;
                        prop_assert!(count <= caps[idx], "cap exceeded");
                    }
                }
                Op::FinishDone(i) if !in_flight.is_empty() => {
                    let (k, j) = in_flight.remove(i as usize % in_flight.len());
                    store.get_mut(k).unwrap().retain(|&q| q != j);
                    done.insert(j);
                    s.finish(k, Verdict::Success, Finished::Done(j), at(now));
                }
                Op::FinishRetry(i, d) if !in_flight.is_empty() => {
                    let (k, j) = in_flight.remove(i as usize % in_flight.len());
                    s.finish(k, Verdict::Failure { hold_until: None }, Finished::RetryAt(at(now + i64::from(d)), j), at(now));
                }
                Op::Tick(d) => now += i64::from(d),
                Op::Pause(e, p) => {
                    paused[e as usize] = p;
                    s.configure(KEYS[e as usize], EndpointLimits { max_concurrency: caps[e as usize], paused: p, ..EndpointLimits::default() }, at(now));
                }
                Op::RequestRefills => {
                    for r in s.refills_wanted() {
                        let snapshot = read(&store, &r);
                        outstanding.push((r, snapshot));
                    }
                }
                Op::AnswerRefill(i, late) if !outstanding.is_empty() => {
                    let (r, snapshot) = outstanding.remove(i as usize % outstanding.len());
                    let rows = if late { read(&store, &r) } else { snapshot };
                    answer(&mut s, &r, rows, now);
                }
                _ => {}
            }
        }
        // Drain: unpause, finish everything, run the clock and refills until all pending work is done.
        for (i, key) in KEYS.iter().enumerate() {
            s.configure(key, limits(caps[i]), at(now));
        }
        for _ in 0..10_000 {
            for (k, j) in in_flight.drain(..) {
                store.get_mut(k).unwrap().retain(|&q| q != j);
                done.insert(j);
                s.finish(k, Verdict::Success, Finished::Done(j), at(now));
            }
            for (r, snapshot) in outstanding.drain(..) {
                answer(&mut s, &r, snapshot, now);
            }
            for r in s.refills_wanted() {
                let rows = read(&store, &r);
                answer(&mut s, &r, rows, now);
            }
            now += 100;
            while let Some((k, j)) = s.next(at(now)) {
                prop_assert!(!done.contains(&j));
                in_flight.push((k, j));
            }
            if in_flight.is_empty() && store.values().all(Vec::is_empty) {
                break;
            }
        }
        prop_assert!(store.values().all(Vec::is_empty), "work left undelivered: {store:?}");
        prop_assert_eq!(done.len() as i64, next_seq);
    }
}

// ---- Flow control: breaker, slow start, Retry-After hold, pacing, ordering, expiry ----

use herald_core::breaker::{BreakerConfig, BreakerState};
use herald_core::scheduler::Queued;

const FAIL: Verdict = Verdict::Failure { hold_until: None };

fn sched_with_breaker(threshold: u32, cooldown_ms: u64) -> Sched {
    Scheduler::new(SchedulerConfig {
        window: 1_000,
        breaker: BreakerConfig {
            failure_threshold: threshold,
            initial_cooldown: Duration::from_millis(cooldown_ms),
            max_cooldown: Duration::from_millis(cooldown_ms * 8),
        },
    })
}

/// Send everything that may go at `now`.
fn drain_ready(s: &mut Sched, now: i64) -> Vec<i64> {
    std::iter::from_fn(|| s.next(at(now)).map(|(_, j)| j)).collect()
}

#[test]
fn an_open_breaker_sends_nothing_then_exactly_one_probe() {
    let mut s = sched_with_breaker(3, 1_000);
    s.configure("a", limits(10), at(0));
    for seq in 1..=20 {
        s.offer("a", seq, at(0), seq, at(0));
    }
    let first = drain_ready(&mut s, 0);
    assert_eq!(first.len(), 10, "the cap");
    for job in &first[..3] {
        s.finish("a", FAIL, Finished::RetryAt(at(10), *job), at(0));
    }
    let snap = s.endpoint_snapshot(&"a", at(0)).unwrap();
    assert_eq!(snap.breaker.state(), BreakerState::Open);
    assert_eq!(snap.breaker.next_probe_at(), Some(at(1_000)));
    // The other seven in flight fail too; nothing else goes out, and their attempts are not consumed.
    for job in &first[3..] {
        s.finish("a", FAIL, Finished::RetryAt(at(10), *job), at(0));
    }
    assert!(drain_ready(&mut s, 999).is_empty(), "open: nothing is sent");
    assert_eq!(s.next_timer(), Some(at(1_000)), "the shell wakes up for the probe");
    let probe = drain_ready(&mut s, 1_000);
    assert_eq!(probe.len(), 1, "exactly one probe");
    assert_eq!(
        s.endpoint_snapshot(&"a", at(1_000)).unwrap().breaker.state(),
        BreakerState::HalfOpen
    );
    assert!(drain_ready(&mut s, 1_500).is_empty(), "nothing beside the probe");
    // The probe fails: open again with a doubled cool-down.
    s.finish("a", FAIL, Finished::RetryAt(at(1_600), probe[0]), at(1_600));
    assert_eq!(
        s.endpoint_snapshot(&"a", at(1_600)).unwrap().breaker.next_probe_at(),
        Some(at(3_600))
    );
    assert!(drain_ready(&mut s, 3_599).is_empty());
    let probe = drain_ready(&mut s, 3_600);
    assert_eq!(probe.len(), 1);
    // It succeeds: slow start, 2 then 3 then 4 … in flight, up to the cap of 10.
    s.finish("a", Verdict::Success, Finished::Done(probe[0]), at(3_600));
    let mut allowed = Vec::new();
    let mut now = 3_600;
    loop {
        let batch = drain_ready(&mut s, now);
        if batch.is_empty() {
            break;
        }
        let (_, in_flight, _) = s.endpoint_counts(&"a").unwrap();
        allowed.push(in_flight);
        for job in batch {
            s.finish("a", Verdict::Success, Finished::Done(job), at(now));
        }
        now += 1;
    }
    assert_eq!(allowed[..3], [2, 4, 8], "the allowance doubles per round trip");
    assert!(allowed.iter().all(|&n| n <= 10));
    assert_eq!(s.endpoint_snapshot(&"a", at(now)).unwrap().breaker.ramp(), None);
}

#[test]
fn a_successful_probe_releases_the_retries_backing_off_from_the_outage() {
    const HOUR: i64 = 3_600_000;
    let mut s = sched_with_breaker(3, 1_000);
    s.configure("a", limits(10), at(0));
    s.configure("b", limits(10), at(0));
    for seq in 1..=4 {
        s.offer("a", seq, at(0), seq, at(0));
    }
    s.offer("b", 100, at(0), 100, at(0));
    let sent = drain_ready(&mut s, 0);
    assert_eq!(sent.len(), 5);
    // "a" fails three times (its breaker opens) with retries an hour away; "b" fails once, also an hour.
    for job in [1, 2, 3] {
        s.finish("a", FAIL, Finished::RetryAt(at(HOUR), job), at(0));
    }
    s.finish("b", FAIL, Finished::RetryAt(at(HOUR), 100), at(0));
    assert_eq!(
        s.endpoint_snapshot(&"a", at(0)).unwrap().breaker.state(),
        BreakerState::Open
    );
    // Delivery 4 was in flight when the breaker opened; it comes back as ready work (not a new failure).
    s.finish("a", Verdict::NotSent, Finished::RetryAt(at(0), 4), at(0));
    let probe = drain_ready(&mut s, 1_000);
    assert_eq!(probe, [4], "the probe is the ready delivery, not a retry on its timer");
    assert!(drain_ready(&mut s, 1_000).is_empty());
    // The probe succeeds: the three retries go now (slow start allows two at first), not in an hour.
    s.finish("a", Verdict::Success, Finished::Done(4), at(1_000));
    let mut released = drain_ready(&mut s, 1_001);
    assert_eq!(released.len(), 2, "slow start still applies");
    for job in released.clone() {
        s.finish("a", Verdict::Success, Finished::Done(job), at(1_002));
    }
    released.extend(drain_ready(&mut s, 1_002));
    released.sort_unstable();
    assert_eq!(released, [1, 2, 3], "every retry released, each once");
    assert_eq!(
        s.next_timer(),
        Some(at(HOUR)),
        "the other endpoint's retry keeps its timer"
    );
    assert!(drain_ready(&mut s, HOUR - 1).is_empty());
    assert_eq!(drain_ready(&mut s, HOUR), [100]);
}

#[test]
fn retry_after_holds_the_whole_endpoint() {
    let mut s = sched(100);
    s.configure("a", limits(5), at(0));
    s.configure("b", limits(5), at(0));
    for seq in 1..=4 {
        s.offer("a", seq, at(0), seq, at(0));
    }
    s.offer("b", 10, at(0), 10, at(0));
    let (k, job) = s.next(at(0)).unwrap();
    assert_eq!(k, "a");
    s.finish(
        "a",
        Verdict::Failure {
            hold_until: Some(at(5_000)),
        },
        Finished::RetryAt(at(5_000), job),
        at(0),
    );
    let sent: Vec<(&str, i64)> = std::iter::from_fn(|| s.next(at(10))).collect();
    assert_eq!(sent, [("b", 10)], "only the other endpoint flows");
    assert_eq!(s.next_timer(), Some(at(5_000)));
    assert_eq!(drain_ready(&mut s, 5_000).len(), 4);
}

#[test]
fn a_rate_limit_paces_requests_evenly() {
    let mut s = sched(100);
    s.configure(
        "a",
        EndpointLimits {
            rate_per_sec: Some(4),
            ..limits(10)
        },
        at(0),
    );
    for seq in 1..=8 {
        s.offer("a", seq, at(0), seq, at(0));
    }
    let mut sent_at = Vec::new();
    let mut now = 0;
    while sent_at.len() < 8 {
        if let Some((_, job)) = s.next(at(now)) {
            sent_at.push(now);
            s.finish("a", Verdict::Success, Finished::Done(job), at(now));
        } else {
            now = s.next_timer().expect("a paced endpoint asks to be woken").as_unix_ms();
        }
    }
    assert_eq!(sent_at, [0, 250, 500, 750, 1_000, 1_250, 1_500, 1_750]);
}

/// A job that knows how often it was tried, for the probe choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tried(i64, u32);

impl Queued for Tried {
    fn attempts(&self) -> u32 {
        self.1
    }
}

#[test]
fn an_open_breakers_probe_is_the_ready_delivery_tried_most_often() {
    // First attempts fail, retries succeed. The burst's first attempts open the breaker; with the
    // oldest ready delivery as probe, every probe would be another first attempt (one per cool-down)
    // while the retries that would close it wait behind them.
    let mut s: Scheduler<&str, Tried> = Scheduler::new(SchedulerConfig {
        window: 1_000,
        breaker: BreakerConfig {
            failure_threshold: 3,
            initial_cooldown: Duration::from_secs(1),
            max_cooldown: Duration::from_secs(8),
        },
    });
    s.configure("a", limits(3), at(0));
    for seq in 1..=20 {
        s.offer("a", seq, at(0), Tried(seq, 0), at(0));
    }
    let first: Vec<Tried> = std::iter::from_fn(|| s.next(at(0)).map(|(_, j)| j)).collect();
    assert_eq!(first.len(), 3);
    for job in first {
        s.finish("a", FAIL, Finished::RetryAt(at(500), Tried(job.0, 1)), at(10));
    }
    assert_eq!(
        s.endpoint_snapshot(&"a", at(10)).unwrap().breaker.state(),
        BreakerState::Open
    );
    // At the probe the retries are due, queued behind 17 first attempts.
    let probe = s.next(at(1_010)).map(|(_, j)| j).expect("a probe");
    assert_eq!(probe.1, 1, "a retry goes as the probe, not a first attempt: {probe:?}");
    assert_eq!(probe.0, 1, "the oldest of the most-tried");
    s.finish("a", Verdict::Success, Finished::Done(probe), at(1_020));
    assert_eq!(
        s.endpoint_snapshot(&"a", at(1_020)).unwrap().breaker.state(),
        BreakerState::Closed
    );
    // Closed, the queue's order is back: the oldest first attempt goes next.
    assert_eq!(s.next(at(1_020)).map(|(_, j)| j), Some(Tried(4, 0)));
}

#[test]
fn content_rejections_never_open_the_breaker() {
    let mut s = sched_with_breaker(3, 1_000);
    s.configure("a", limits(10), at(0));
    for seq in 1..=40 {
        s.offer("a", seq, at(0), seq, at(0));
    }
    let mut sent = 0;
    let mut now = 0;
    while let Some((_, job)) = s.next(at(now)) {
        sent += 1;
        s.finish("a", Verdict::Rejected, Finished::Done(job), at(now));
        now += 1;
    }
    assert_eq!(sent, 40, "every delivery went out at once");
    let snap = s.endpoint_snapshot(&"a", at(now)).unwrap();
    assert_eq!(snap.breaker.state(), BreakerState::Closed);
    assert_eq!(snap.breaker.consecutive_failures(), 0);
}

/// A job with an ordering key, for ordered endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Keyed(i64, Option<&'static str>);

impl Queued for Keyed {
    fn ordering_key(&self) -> Option<&str> {
        self.1
    }
}

fn ordered(cap: u32) -> EndpointLimits {
    EndpointLimits {
        ordered: true,
        ..limits(cap)
    }
}

#[test]
fn ordered_keys_go_one_at_a_time_and_a_failing_head_blocks_only_its_key() {
    let mut s: Scheduler<&str, Keyed> = Scheduler::new(SchedulerConfig::default());
    s.configure("a", ordered(10), at(0));
    let jobs = [
        Keyed(1, Some("x")),
        Keyed(2, Some("y")),
        Keyed(3, Some("x")),
        Keyed(4, None),
        Keyed(5, Some("y")),
        Keyed(6, Some("x")),
    ];
    for job in jobs {
        s.offer("a", job.0, at(0), job, at(0));
    }
    let first: Vec<i64> = std::iter::from_fn(|| s.next(at(0)).map(|(_, j)| j.0)).collect();
    assert_eq!(first, [1, 2, 4], "one per key, unkeyed ones freely");
    // x's head fails and is retried later; y's head succeeds, so y moves on while x waits.
    s.finish("a", FAIL, Finished::RetryAt(at(100), Keyed(1, Some("x"))), at(0));
    s.finish("a", Verdict::Success, Finished::Done(Keyed(2, Some("y"))), at(0));
    s.finish("a", Verdict::Success, Finished::Done(Keyed(4, None)), at(0));
    let next: Vec<i64> = std::iter::from_fn(|| s.next(at(50)).map(|(_, j)| j.0)).collect();
    assert_eq!(next, [5], "x is blocked by its failing head");
    let next: Vec<i64> = std::iter::from_fn(|| s.next(at(100)).map(|(_, j)| j.0)).collect();
    assert_eq!(next, [1], "the head is retried before anything behind it");
    // The head dies: the key unblocks and the next one proceeds.
    s.finish("a", FAIL, Finished::Done(Keyed(1, Some("x"))), at(100));
    assert_eq!(s.next(at(100)).map(|(_, j)| j.0), Some(3));
    assert_eq!(s.next(at(100)), None, "6 waits behind 3");
    s.finish("a", Verdict::Success, Finished::Done(Keyed(3, Some("x"))), at(100));
    assert_eq!(s.next(at(100)).map(|(_, j)| j.0), Some(6));
}

#[test]
fn unordered_endpoints_ignore_keys() {
    let mut s: Scheduler<&str, Keyed> = Scheduler::new(SchedulerConfig::default());
    s.configure("a", limits(10), at(0));
    for seq in 1..=3 {
        s.offer("a", seq, at(0), Keyed(seq, Some("x")), at(0));
    }
    assert_eq!(std::iter::from_fn(|| s.next(at(0))).count(), 3);
}

#[test]
fn expired_waiting_deliveries_are_taken_out_and_free_their_key() {
    let mut s: Scheduler<&str, Keyed> = Scheduler::new(SchedulerConfig::default());
    s.configure(
        "a",
        EndpointLimits {
            paused: true,
            ..ordered(10)
        },
        at(0),
    );
    for seq in 1..=4 {
        let key = if seq % 2 == 0 { "even" } else { "odd" };
        s.offer("a", seq, at(0), Keyed(seq, Some(key)), at(0));
    }
    let taken = s.take_waiting(&"a", |j| j.0 <= 2, at(0));
    let mut taken: Vec<i64> = taken.into_iter().map(|j| j.0).collect();
    taken.sort_unstable();
    assert_eq!(taken, [1, 2]);
    assert_eq!(s.endpoint_counts(&"a").unwrap().0, 2, "two stay resident");
    s.configure("a", ordered(10), at(0));
    let mut rest: Vec<i64> = std::iter::from_fn(|| s.next(at(0)).map(|(_, j)| j.0)).collect();
    rest.sort_unstable();
    assert_eq!(rest, [3, 4], "the next of each key became its head");
}

#[derive(Debug, Clone)]
enum KeyOp {
    Offer(u8),
    Next,
    Succeed(u8),
    Fail(u8, u8),
    Die(u8),
    Tick(u8),
}

fn key_op() -> impl Strategy<Value = KeyOp> {
    prop_oneof![
        3 => (0u8..4).prop_map(KeyOp::Offer),
        3 => Just(KeyOp::Next),
        2 => any::<u8>().prop_map(KeyOp::Succeed),
        1 => (any::<u8>(), 0u8..50).prop_map(|(i, d)| KeyOp::Fail(i, d)),
        1 => any::<u8>().prop_map(KeyOp::Die),
        1 => (0u8..50).prop_map(KeyOp::Tick),
    ]
}

const ORDER_KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];

proptest! {
    /// On an ordered endpoint, a key never has two deliveries in flight, and each key's deliveries are
    /// finished in the order they were offered, whatever fails, dies or is retried.
    #[test]
    fn ordering_per_key_holds_under_random_operations(ops in proptest::collection::vec(key_op(), 1..300)) {
        let mut s: Scheduler<&str, Keyed> = Scheduler::new(SchedulerConfig {
            window: 8,
            breaker: BreakerConfig { failure_threshold: 1_000, ..BreakerConfig::default() },
        });
        s.configure("a", ordered(3), at(0));
        let mut now = 0i64;
        let mut seq = 0i64;
        let mut offered: HashMap<&str, Vec<i64>> = HashMap::new();
        let mut finished: HashMap<&str, Vec<i64>> = HashMap::new();
        let mut in_flight: Vec<Keyed> = Vec::new();
        let mut store: Vec<Keyed> = Vec::new();
        let refill = |s: &mut Scheduler<&str, Keyed>, store: &Vec<Keyed>, now| {
            for r in s.refills_wanted() {
                let rows: Vec<Keyed> = store.iter().filter(|j| j.0 > r.after_seq).take(r.limit).cloned().collect();
                let exhausted = rows.len() < r.limit;
                s.refilled(r, rows.into_iter().map(|j| Loaded { seq: j.0, due: at(now), job: j }).collect(), exhausted, at(now));
            }
        };
        for op in ops {
            match op {
                KeyOp::Offer(k) => {
                    seq += 1;
                    let key = ORDER_KEYS[k as usize];
                    offered.entry(key).or_default().push(seq);
                    store.push(Keyed(seq, Some(key)));
                    s.offer("a", seq, at(now), Keyed(seq, Some(key)), at(now));
                }
                KeyOp::Next => {
                    refill(&mut s, &store, now);
                    if let Some((_, job)) = s.next(at(now)) {
                        prop_assert!(!in_flight.iter().any(|j| j.1 == job.1), "two in flight for {:?}", job.1);
                        in_flight.push(job);
                    }
                }
                KeyOp::Succeed(i) | KeyOp::Die(i) if !in_flight.is_empty() => {
                    let job = in_flight.remove(i as usize % in_flight.len());
                    let key = job.1.unwrap();
                    finished.entry(key).or_default().push(job.0);
                    store.retain(|j| j.0 != job.0);
                    let verdict = if matches!(op, KeyOp::Succeed(_)) { Verdict::Success } else { FAIL };
                    s.finish("a", verdict, Finished::Done(job), at(now));
                }
                KeyOp::Fail(i, d) if !in_flight.is_empty() => {
                    let job = in_flight.remove(i as usize % in_flight.len());
                    s.finish("a", FAIL, Finished::RetryAt(at(now + i64::from(d)), job), at(now));
                }
                KeyOp::Tick(d) => now += i64::from(d),
                _ => {}
            }
        }
        // Drain everything.
        for _ in 0..10_000 {
            for job in in_flight.drain(..) {
                let key = job.1.unwrap();
                finished.entry(key).or_default().push(job.0);
                store.retain(|j| j.0 != job.0);
                s.finish("a", Verdict::Success, Finished::Done(job), at(now));
            }
            refill(&mut s, &store, now);
            now += 100;
            while let Some((_, job)) = s.next(at(now)) {
                prop_assert!(!in_flight.iter().any(|j| j.1 == job.1));
                in_flight.push(job);
            }
            if in_flight.is_empty() && store.is_empty() {
                break;
            }
        }
        prop_assert!(store.is_empty(), "left undelivered: {:?}", store);
        prop_assert_eq!(offered, finished, "per-key finish order differs from offer order");
    }
}

/// A job that knows when it became pending (its value), as the engine's jobs do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Since(i64);

impl herald_core::scheduler::Queued for Since {
    fn pending_since(&self) -> Millis {
        at(self.0)
    }
}

#[test]
fn pending_and_oldest_age_follow_offers_retries_refills_and_results() {
    let mut s: Scheduler<&'static str, Since> = Scheduler::new(SchedulerConfig {
        window: 2,
        ..SchedulerConfig::default()
    });
    s.configure("a", limits(1), at(0));
    let gauges = |s: &Scheduler<&'static str, Since>| {
        let snapshot = s.endpoint_snapshot(&"a", at(0)).unwrap();
        (snapshot.pending, snapshot.oldest_pending_since.map(Millis::as_unix_ms))
    };
    assert_eq!(gauges(&s), (0, None));
    s.offer("a", 1, at(0), Since(100), at(0));
    s.offer("a", 2, at(0), Since(200), at(0));
    // The window is full: the third waits in the store, and is counted.
    assert_eq!(s.offer("a", 3, at(0), Since(300), at(0)), Offer::Deferred);
    assert_eq!(gauges(&s), (3, Some(100)));
    // The oldest goes out and is retried: still pending, still the oldest.
    let (_, job) = s.next(at(0)).unwrap();
    s.finish(
        "a",
        Verdict::Failure { hold_until: None },
        Finished::RetryAt(at(10), job),
        at(0),
    );
    assert_eq!(gauges(&s), (3, Some(100)));
    // A younger one is delivered: the retried one is still the oldest.
    let (_, job) = s.next(at(10)).unwrap();
    assert_eq!(job, Since(200));
    s.finish("a", Verdict::Success, Finished::Done(job), at(10));
    assert_eq!(gauges(&s), (2, Some(100)));
    // Delivered at last: the next oldest is the age now.
    let (_, job) = s.next(at(10)).unwrap();
    assert_eq!(job, Since(100));
    s.finish("a", Verdict::Success, Finished::Done(job), at(10));
    // Only the deferred one is left, in the store: counted, its age known once a refill reads it (the
    // engine asks at once; with the default window a refill starts long before the resident set is empty).
    assert_eq!(gauges(&s), (1, None));
    // The refill reads the deferred one; the store has no more.
    let refill = s.refills_wanted().pop().unwrap();
    let limit = refill.limit;
    s.refilled(
        refill,
        vec![Loaded {
            seq: 3,
            due: at(0),
            job: Since(300),
        }],
        limit > 1,
        at(10),
    );
    assert_eq!(gauges(&s), (1, Some(300)));
    for _ in 0..1 {
        let (_, job) = s.next(at(10)).unwrap();
        s.finish("a", Verdict::Success, Finished::Done(job), at(10));
    }
    assert_eq!(gauges(&s), (0, None));
    // A backlog found at start counts what the store says until refills read it.
    s.mark_backlog("a", limits(1));
    s.set_store_backlog(&"a", 7);
    let all: Vec<_> = s.endpoint_gauges(at(10)).map(|(_, g)| g.pending).collect();
    assert_eq!(all, vec![7]);
}
