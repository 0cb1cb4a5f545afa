//! How the CPU was split between the in-process Herald node and the harness (load generator and
//! receivers), read from `/proc/self/task/*/stat` (Linux only; elsewhere nothing is reported).
//!
//! Threads are told apart by name: the node's runtime threads are named `herald-node` and SQLite's
//! connection threads `sqlx-sqlite-worker-N`; every other thread of the process belongs to the harness.
//! Time of threads that exited during the phase is counted as `other`.

use std::collections::HashMap;
use std::time::Instant;

use serde::Serialize;

/// Kernel clock ticks per second of `/proc` CPU times (USER_HZ, 100 on every mainstream Linux).
const TICKS_PER_SECOND: f64 = 100.0;

/// Thread-name prefixes of the in-process node (names are truncated to 15 bytes by the kernel).
const HERALD_THREADS: [&str; 2] = ["herald-node", "sqlx-sqlite-wor"];

/// CPU times at one instant.
#[derive(Debug, Clone)]
pub struct CpuSnapshot {
    at: Instant,
    /// Ticks per thread id, with whether the thread is Herald's.
    threads: HashMap<u32, (bool, u64)>,
    process: u64,
}

/// CPU used over a phase, in cores (CPU-seconds per second of wall time).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CpuSplit {
    /// Wall time of the phase in seconds.
    pub seconds: f64,
    /// Cores used by the Herald node (API, engine, store); `None` when no node runs in this process
    /// (`--target`).
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
        Some(Self { at, threads, process })
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
        CpuSplit {
            seconds,
            herald_cores: node_here.then(|| cores(herald)),
            harness_cores: cores(harness),
            other_cores: cores(other),
            machine_cores: std::thread::available_parallelism().map_or(1, usize::from),
        }
    }
}

/// utime + stime from a `stat` line (fields 14 and 15, counted after the parenthesised name).
fn ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace();
    // After the name: state(3) ppid(4) … utime is field 14, i.e. the 12th after the name.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_lines() {
        let line = "1234 (tokio (worker) 1) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0";
        assert_eq!(ticks(line), Some(300));
    }

    #[test]
    fn reads_this_process() {
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
