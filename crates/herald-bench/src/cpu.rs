//! How the CPU was split between the in-process Herald node and the harness (load generator and
//! receivers), read from `/proc/self/task/*/stat` (Linux only; elsewhere nothing is reported).
//!
//! Threads are told apart by name: the node's runtime threads are named `herald-node` and SQLite's
//! connection threads `sqlx-sqlite-worker-N`; every other thread of the process belongs to the harness.
//! Time of threads that exited during the phase is counted as `other`.
//!
//! With `--target`, the CPU of the nodes' processes found on this machine (see [`crate::local_node`]) is
//! the node's, once [`watch`]ed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

use crate::local_node::{LocalNode, stat_field};

/// Kernel clock ticks per second of `/proc` CPU times (USER_HZ, 100 on every mainstream Linux).
const TICKS_PER_SECOND: f64 = 100.0;

/// Thread-name prefixes of the in-process node (names are truncated to 15 bytes by the kernel).
const HERALD_THREADS: [&str; 2] = ["herald-node", "sqlx-sqlite-wor"];

/// The `--target` nodes whose processes' CPU counts as the node's (see [`watch`]).
static WATCHED: Mutex<Vec<LocalNode>> = Mutex::new(Vec::new());

/// From now on, count the CPU of `nodes` — every node of the cluster measured, each found on this
/// machine (see [`crate::local_node`]) — as the node's; an empty list stops it.
pub fn watch(nodes: Vec<LocalNode>) {
    *WATCHED.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = nodes;
}

/// CPU times at one instant.
#[derive(Debug, Clone)]
pub struct CpuSnapshot {
    at: Instant,
    /// Ticks per thread id, with whether the thread is Herald's.
    threads: HashMap<u32, (bool, u64)>,
    process: u64,
    /// The watched `--target` nodes (see [`watch`]) at this instant.
    watched: Vec<LocalNode>,
    /// Ticks of each watched node's process that is still running, by process id, with when it started.
    nodes: HashMap<u32, (u64, u64)>,
}

/// CPU used over a phase, in cores (CPU-seconds per second of wall time).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CpuSplit {
    /// Wall time of the phase in seconds.
    pub seconds: f64,
    /// Cores used by the Herald node (API, engine, store): the in-process node's threads, or the
    /// processes of the `--target` nodes found on this machine (see [`watch`]); `None` when not
    /// measured (the server runs elsewhere, or not every node was found or ran through the phase).
    pub herald_cores: Option<f64>,
    /// Cores used by the harness (load generator, receivers).
    pub harness_cores: f64,
    /// Cores used by threads that exited during the phase.
    pub other_cores: f64,
    /// Cores of the machine.
    pub machine_cores: usize,
}

impl CpuSnapshot {
    /// Read the current CPU times; `None` where `/proc` is unavailable.
    pub fn take() -> Option<Self> {
        let at = Instant::now();
        let process = ticks(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
        let mut threads = HashMap::new();
        for entry in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
            let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue; // exited meanwhile
            };
            let name = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            let herald = HERALD_THREADS.iter().any(|p| name.trim_end().starts_with(p));
            if let Some(t) = ticks(&stat) {
                threads.insert(tid, (herald, t));
            }
        }
        let watched = WATCHED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let nodes = watched
            .iter()
            .filter_map(|node| {
                let stat = std::fs::read_to_string(format!("/proc/{}/stat", node.pid)).ok()?;
                Some((node.pid, (stat_field(&stat, 22)?, ticks(&stat)?)))
            })
            .collect();
        Some(Self {
            at,
            threads,
            process,
            watched,
            nodes,
        })
    }

    /// CPU used from `earlier` to this snapshot.
    pub fn since(&self, earlier: &CpuSnapshot) -> CpuSplit {
        let seconds = self.at.duration_since(earlier.at).as_secs_f64().max(1e-9);
        let (mut herald, mut harness) = (0u64, 0u64);
        let node_here = self.threads.values().any(|(is_herald, _)| *is_herald);
        for (tid, (is_herald, now)) in &self.threads {
            let before = earlier.threads.get(tid).map_or(0, |(_, t)| *t);
            let used = now.saturating_sub(before);
            if *is_herald {
                herald += used;
            } else {
                harness += used;
            }
        }
        let process = self.process.saturating_sub(earlier.process);
        let other = process.saturating_sub(herald + harness);
        let cores = |ticks: u64| ticks as f64 / TICKS_PER_SECOND / seconds;
        // Watched nodes first: a harness that opened a SQLite file of its own would otherwise have its
        // threads taken for an in-process node's.
        let herald_cores = if earlier.watched.is_empty() {
            node_here.then(|| cores(herald))
        } else {
            watched_ticks(&earlier.watched, &earlier.nodes, &self.nodes).map(cores)
        };
        CpuSplit {
            seconds,
            herald_cores,
            harness_cores: cores(harness),
            other_cores: cores(other),
            machine_cores: std::thread::available_parallelism().map_or(1, usize::from),
        }
    }
}

/// utime + stime from a `stat` line (fields 14 and 15).
fn ticks(stat: &str) -> Option<u64> {
    Some(stat_field(stat, 14)? + stat_field(stat, 15)?)
}

/// The ticks the `watched` nodes used between two snapshots' readings of them; `None` unless every one
/// ran from the first reading to the second as the same process (one that stopped, restarted or whose
/// id went to another process would leave a part of the cluster's CPU reading as all of it).
fn watched_ticks(
    watched: &[LocalNode],
    earlier: &HashMap<u32, (u64, u64)>,
    later: &HashMap<u32, (u64, u64)>,
) -> Option<u64> {
    watched.iter().try_fold(0u64, |sum, node| {
        let (started_before, before) = earlier.get(&node.pid)?;
        let (started_after, after) = later.get(&node.pid)?;
        (*started_before == node.started && *started_after == node.started).then(|| sum + after.saturating_sub(*before))
    })
}

/// Shortest phase whose CPU split means anything, given 10 ms clock ticks.
const MIN_SECONDS: f64 = 0.5;

/// Measure the CPU split around `work`; `None` for the split where `/proc` is unavailable or the work
/// took less than half a second (too short for 10 ms ticks).
pub async fn measure<T>(work: impl std::future::Future<Output = T>) -> (T, Option<CpuSplit>) {
    let before = CpuSnapshot::take();
    let value = work.await;
    let split = before
        .and_then(|b| CpuSnapshot::take().map(|a| a.since(&b)))
        .filter(|split| split.seconds >= MIN_SECONDS);
    (value, split)
}

/// How the process's resident memory moved during a piece of work (MiB).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct RssTrace {
    /// At the start.
    pub start: f64,
    /// At the end.
    pub end: f64,
    /// The largest sample (one per second).
    pub max: f64,
}

/// Run `work`, sampling the resident set size once a second; `None` for the trace where `/proc` is
/// unavailable. Shows whether memory stays flat over a long run.
pub async fn sample_rss<T>(work: impl std::future::Future<Output = T>) -> (T, Option<RssTrace>) {
    let mut samples: Vec<f64> = rss_mib().into_iter().collect();
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    tokio::pin!(work);
    let value = loop {
        tokio::select! {
            value = &mut work => break value,
            _ = tick.tick() => samples.extend(rss_mib()),
        }
    };
    samples.extend(rss_mib());
    let trace = match (samples.first(), samples.last()) {
        (Some(&start), Some(&end)) => Some(RssTrace {
            start,
            end,
            max: samples.iter().copied().fold(f64::MIN, f64::max),
        }),
        _ => None,
    };
    (value, trace)
}

/// The process's resident set size in MiB (VmRSS), where `/proc` is available.
pub fn rss_mib() -> Option<f64> {
    status_kib("VmRSS:").map(|kib| kib as f64 / 1024.0)
}

/// The process's peak resident set size in MiB (VmHWM), where `/proc` is available.
pub fn peak_rss_mib() -> Option<f64> {
    status_kib("VmHWM:").map(|kib| kib as f64 / 1024.0)
}

fn status_kib(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// Held by this crate's tests that take CPU snapshots, and by those that start threads a snapshot would
/// take for an in-process node's (SQLite's connection threads), so that neither sees the other's.
#[cfg(test)]
pub(crate) static TEST_SNAPSHOTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[cfg(test)]
mod tests {
    use super::*;

    /// Stops watching when dropped, so that a failed test leaves no watched node behind.
    struct Watching;

    impl Drop for Watching {
        fn drop(&mut self) {
            watch(Vec::new());
        }
    }

    fn node(pid: u32, started: u64) -> LocalNode {
        LocalNode {
            pid,
            command: "herald".to_owned(),
            started,
        }
    }

    #[test]
    fn watched_nodes_count_only_when_each_ran_through_the_phase_as_itself() {
        let watched = [node(10, 500), node(11, 600)];
        let before = HashMap::from([(10, (500, 100)), (11, (600, 40))]);
        let after = HashMap::from([(10, (500, 130)), (11, (600, 45))]);
        assert_eq!(watched_ticks(&watched, &before, &after), Some(35));
        // One stopped meanwhile.
        let stopped = HashMap::from([(10, (500, 130))]);
        assert_eq!(watched_ticks(&watched, &before, &stopped), None);
        // One restarted (or its id went to another process).
        let restarted = HashMap::from([(10, (500, 130)), (11, (900, 2))]);
        assert_eq!(watched_ticks(&watched, &before, &restarted), None);
        assert_eq!(watched_ticks(&[], &before, &after), Some(0));
    }

    #[test]
    fn a_watched_process_cpu_is_the_nodes() {
        let _exclusive = TEST_SNAPSHOTS.blocking_lock();
        let _stop = Watching;
        // This test's process stands for the node.
        watch(vec![LocalNode::of(std::process::id()).expect("this process")]);
        let before = CpuSnapshot::take().expect("/proc is readable");
        let started = Instant::now();
        let mut x = 0u64;
        while started.elapsed().as_millis() < 300 {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let split = CpuSnapshot::take().expect("/proc is readable").since(&before);
        assert!(split.herald_cores.is_some_and(|cores| cores > 0.1), "{split:?}");
        // A watched process that is not running: not measured.
        watch(vec![node(std::process::id(), 1)]);
        let before = CpuSnapshot::take().expect("/proc is readable");
        let split = CpuSnapshot::take().expect("/proc is readable").since(&before);
        assert_eq!(split.herald_cores, None);
    }

    #[test]
    fn parses_stat_lines() {
        let line = "1234 (tokio (worker) 1) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0";
        assert_eq!(ticks(line), Some(300));
    }

    #[test]
    fn reads_this_process() {
        let _exclusive = TEST_SNAPSHOTS.blocking_lock();
        if std::path::Path::new("/proc/self/stat").exists() {
            let before = CpuSnapshot::take().unwrap();
            let mut x = 0u64;
            for i in 0..5_000_000u64 {
                x = x.wrapping_add(i * i);
            }
            std::hint::black_box(x);
            let split = CpuSnapshot::take().unwrap().since(&before);
            assert!(split.harness_cores >= 0.0 && split.herald_cores.is_none());
            assert!(rss_mib().unwrap() > 0.0);
        }
    }
}
