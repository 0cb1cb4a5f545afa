//! Scheduler behaviour under a virtual clock: caps, fairness, timers, pausing and bounded windows.

use std::collections::{HashMap, HashSet};

use herald_core::scheduler::{EndpointLimits, Finished, Loaded, Offer, Refill, Scheduler, SchedulerConfig};
use proptest::prelude::*;

type Sched = Scheduler<&'static str, i64>;

fn sched(window: usize) -> Sched {
    Scheduler::new(SchedulerConfig { window })
}

fn limits(cap: u32) -> EndpointLimits {
    EndpointLimits {
        max_concurrency: cap,
        paused: false,
    }
}

#[test]
fn concurrency_cap_holds_and_frees_on_finish() {
    let mut s = sched(100);
    s.configure("a", limits(2));
    for seq in 1..=5 {
        assert_eq!(s.offer("a", seq, 0, seq, 0), Offer::Accepted);
    }
    assert_eq!(s.next(0), Some(("a", 1)));
    assert_eq!(s.next(0), Some(("a", 2)));
    assert_eq!(s.next(0), None, "cap of 2 reached");
    s.finish("a", Finished::Done, 0);
    assert_eq!(s.next(0), Some(("a", 3)));
    assert_eq!(s.endpoint_counts(&"a"), Some((4, 2, 2)));
}

#[test]
fn a_stuck_endpoint_does_not_block_others() {
    let mut s = sched(10_000);
    s.configure("blackhole", limits(3));
    s.configure("healthy", limits(3));
    for seq in 1..=1000 {
        s.offer("blackhole", seq, 0, seq, 0);
    }
    // The black hole takes its three slots and never finishes.
    for _ in 0..3 {
        assert_eq!(s.next(0).map(|(k, _)| k), Some("blackhole"));
    }
    s.offer("healthy", 2000, 0, 2000, 0);
    assert_eq!(s.next(0), Some(("healthy", 2000)));
    assert_eq!(s.next(0), None);
}

#[test]
fn endpoints_are_served_round_robin() {
    let mut s = sched(100);
    for (i, key) in ["a", "b", "c"].into_iter().enumerate() {
        s.configure(key, limits(10));
        for n in 0..3 {
            let seq = (i * 10 + n) as i64 + 1;
            s.offer(key, seq, 0, seq, 0);
        }
    }
    let order: Vec<&str> = std::iter::from_fn(|| s.next(0).map(|(k, _)| k)).collect();
    assert_eq!(order, ["a", "b", "c", "a", "b", "c", "a", "b", "c"]);
}

#[test]
fn retries_wait_for_their_timer() {
    let mut s = sched(100);
    s.offer("a", 1, 0, 1, 0);
    let (k, job) = s.next(0).unwrap();
    s.finish(k, Finished::RetryAt(500, job), 0);
    assert_eq!(s.next(499), None);
    assert_eq!(s.next_timer(), Some(500));
    assert_eq!(s.next(500), Some(("a", 1)));
    // A delivery offered with a future due time waits too.
    s.offer("b", 2, 1_000, 2, 600);
    assert_eq!(s.next(999), None);
    assert_eq!(s.next(1_000), Some(("b", 2)));
}

#[test]
fn pause_holds_work_and_resume_releases_it() {
    let mut s = sched(100);
    s.configure(
        "a",
        EndpointLimits {
            max_concurrency: 5,
            paused: true,
        },
    );
    s.offer("a", 1, 0, 1, 0);
    assert_eq!(s.next(0), None);
    s.configure("a", limits(5));
    assert_eq!(s.next(0), Some(("a", 1)));
}

#[test]
fn removed_endpoints_drop_their_work() {
    let mut s = sched(100);
    s.offer("a", 1, 0, 1, 0);
    s.offer("a", 2, 50, 2, 0);
    s.remove_endpoint(&"a");
    assert_eq!(s.next(100), None);
    s.finish("a", Finished::Done, 100); // a late result is ignored
}

#[test]
fn window_overflow_defers_then_refills_in_order() {
    let mut s = sched(4);
    for seq in 1..=4 {
        assert_eq!(s.offer("a", seq, 0, seq, 0), Offer::Accepted);
    }
    assert_eq!(s.offer("a", 5, 0, 5, 0), Offer::Deferred);
    assert!(s.refills_wanted().is_empty(), "still above half the window");
    for _ in 0..2 {
        s.next(0).unwrap();
        s.finish("a", Finished::Done, 0);
    }
    let wanted = s.refills_wanted();
    assert_eq!(wanted.len(), 1);
    assert_eq!(wanted[0].after_seq, 4);
    assert!(s.refills_wanted().is_empty(), "one refill at a time");
    // While the refill reads, another offer arrives: it is deferred and must not be forgotten.
    assert_eq!(s.offer("a", 6, 0, 6, 0), Offer::Deferred);
    s.refilled("a", vec![Loaded { seq: 5, due: 0, job: 5 }], true, 0);
    assert!(s.refills_wanted().is_empty(), "three resident: above half the window");
    let mut sent = Vec::new();
    for _ in 0..2 {
        let (k, job) = s.next(0).unwrap();
        sent.push(job);
        s.finish(k, Finished::Done, 0);
    }
    assert_eq!(sent, [3, 4]);
    let again = s.refills_wanted();
    assert_eq!(
        again.len(),
        1,
        "seq 6 may have been missed by the refill, so read again"
    );
    assert_eq!(again[0].after_seq, 5);
    s.refilled("a", vec![Loaded { seq: 6, due: 0, job: 6 }], true, 0);
    assert!(s.refills_wanted().is_empty());
    // Ingest's own copy of 6 arriving late changes nothing.
    assert_eq!(s.offer("a", 6, 0, 6, 0), Offer::AlreadyResident);
    let jobs: Vec<i64> = std::iter::from_fn(|| s.next(0).map(|(_, j)| j)).collect();
    assert_eq!(jobs, [5, 6]);
}

#[test]
fn backlog_marked_at_start_is_refilled() {
    let mut s = sched(10);
    s.mark_backlog("a", limits(1));
    let wanted = s.refills_wanted();
    assert_eq!(wanted.len(), 1);
    assert_eq!((wanted[0].after_seq, wanted[0].limit), (0, 10));
    s.refilled("a", vec![Loaded { seq: 7, due: 0, job: 7 }], true, 0);
    assert_eq!(s.next(0), Some(("a", 7)));
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
            s.configure(key, limits(caps[i]));
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
            s.refilled(r.endpoint, rows.into_iter().map(|q| Loaded { seq: q, due: now, job: q }).collect(), exhausted, now);
        };
        let mut outstanding: Vec<(Refill<&'static str>, StoreRead)> = Vec::new();
        for op in ops {
            match op {
                Op::Offer(e) => {
                    next_seq += 1;
                    let key = KEYS[e as usize];
                    store.entry(key).or_default().push(next_seq);
                    s.offer(key, next_seq, now, next_seq, now);
                }
                Op::Next => {
                    if let Some((k, j)) = s.next(now) {
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
                    s.finish(k, Finished::Done, now);
                }
                Op::FinishRetry(i, d) if !in_flight.is_empty() => {
                    let (k, j) = in_flight.remove(i as usize % in_flight.len());
                    s.finish(k, Finished::RetryAt(now + i64::from(d), j), now);
                }
                Op::Tick(d) => now += i64::from(d),
                Op::Pause(e, p) => {
                    paused[e as usize] = p;
                    s.configure(KEYS[e as usize], EndpointLimits { max_concurrency: caps[e as usize], paused: p });
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
            s.configure(key, limits(caps[i]));
        }
        for _ in 0..10_000 {
            for (k, j) in in_flight.drain(..) {
                store.get_mut(k).unwrap().retain(|&q| q != j);
                done.insert(j);
                s.finish(k, Finished::Done, now);
            }
            for (r, snapshot) in outstanding.drain(..) {
                answer(&mut s, &r, snapshot, now);
            }
            for r in s.refills_wanted() {
                let rows = read(&store, &r);
                answer(&mut s, &r, rows, now);
            }
            now += 100;
            while let Some((k, j)) = s.next(now) {
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
