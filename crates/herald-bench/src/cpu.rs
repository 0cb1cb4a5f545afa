//! How the CPU was split between the in-process Herald node and the harness (load generator and
//! receivers), read from `/proc/self/task/*/stat` (Linux only; elsewhere nothing is reported).
//!
//! Threads are told apart by name: the node's runtime threads are named `herald-node` and SQLite's
//! connection threads `sqlx-sqlite-worker-N`; every other thread of the process belongs to the harness.
//! Time of threads that exited during the phase is counted as `other`.
//!
//! A `--target` server on this machine's loopback is found by the port it listens on (see
//! [`watch_local_nodes`]), and its process's CPU is reported as the node's: on a shared two-core machine
//! the split between node and load generator is half of what a figure means.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

/// Kernel clock ticks per second of `/proc` CPU times (USER_HZ, 100 on every mainstream Linux).
const TICKS_PER_SECOND: f64 = 100.0;

/// Thread-name prefixes of the in-process node (names are truncated to 15 bytes by the kernel).
const HERALD_THREADS: [&str; 2] = ["herald-node", "sqlx-sqlite-wor"];

/// Processes of `--target` nodes running on this machine, whose CPU counts as the node's.
static LOCAL_NODES: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Count the CPU of the processes listening on the loopback ports of `urls` (the `--target` nodes) as
/// the node's from now on, if every one of them is found on this machine; returns the process ids found.
/// A URL whose host is not a loopback address, or whose listener is not found (another user's process,
/// or no `/proc`), is not found; then none is counted, since a part of a cluster's CPU would read as all
/// of it.
pub fn watch_local_nodes(urls: &[String]) -> Vec<u32> {
    let listening = listening_sockets();
    let pids: Vec<u32> = urls
        .iter()
        .filter_map(|url| loopback_port(url))
        .filter_map(|port| listening.get(&port).and_then(|inode| process_holding(*inode)))
        .collect();
    let mut watched = LOCAL_NODES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    watched.clear();
    if pids.len() == urls.len() {
        watched.extend(&pids);
    }
    pids
}

/// The port of `url` when its host is a loopback address (`127.x`, `::1`, `localhost`).
fn loopback_port(url: &str) -> Option<u16> {
    let url = reqwest::Url::parse(url).ok()?;
    let loopback = match url.host()? {
        url::Host::Domain(name) => name == "localhost",
        url::Host::Ipv4(ip) => ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
    };
    loopback.then(|| url.port_or_known_default()).flatten()
}

/// The socket inode of each TCP port something listens on, from `/proc/net/tcp` and `tcp6`.
fn listening_sockets() -> HashMap<u16, u64> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .flat_map(|table| table.lines().skip(1).filter_map(listener).collect::<Vec<_>>())
        .collect()
}

/// A `/proc/net/tcp` line's port and inode when the socket listens (state `0A`).
fn listener(line: &str) -> Option<(u16, u64)> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (_, port) = fields.get(1)?.rsplit_once(':')?;
    if *fields.get(3)? != "0A" {
        return None;
    }
    let port = u16::from_str_radix(port, 16).ok()?;
    let inode = fields.get(9)?.parse().ok()?;
    Some((port, inode))
}

/// The process holding socket `inode` open, found among `/proc/*/fd`.
fn process_holding(inode: u64) -> Option<u32> {
    let wanted = format!("socket:[{inode}]");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let holds = std::fs::read_dir(entry.path().join("fd"))
            .ok()?
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target.as_os_str() == wanted.as_str()));
        holds.then_some(pid)
    })
}

/// CPU times at one instant.
#[derive(Debug, Clone)]
pub struct CpuSnapshot {
    at: Instant,
    /// Ticks per thread id, with whether the thread is Herald's.
    threads: HashMap<u32, (bool, u64)>,
    process: u64,
    /// Ticks of each watched local `--target` node's process (see [`watch_local_nodes`]).
    local_nodes: HashMap<u32, u64>,
}

/// CPU used over a phase, in cores (CPU-seconds per second of wall time).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CpuSplit {
    /// Wall time of the phase in seconds.
    pub seconds: f64,
    /// Cores used by the Herald node (API, engine, store): the in-process node's threads, or the
    /// processes of the `--target` nodes found on this machine's loopback (see [`watch_local_nodes`]);
    /// `None` when the server runs elsewhere.
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
        let local_nodes = LOCAL_NODES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter_map(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                Some((*pid, ticks(&stat)?))
            })
            .collect();
        Some(Self {
            at,
            threads,
            process,
            local_nodes,
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
        // Local `--target` nodes seen at both ends of the phase (one that stopped meanwhile is left out).
        let local: Vec<u64> = self
            .local_nodes
            .iter()
            .filter_map(|(pid, now)| Some(now.saturating_sub(*earlier.local_nodes.get(pid)?)))
            .collect();
        let cores = |ticks: u64| ticks as f64 / TICKS_PER_SECOND / seconds;
        let herald_cores = if node_here {
            Some(cores(herald))
        } else if local.is_empty() {
            None
        } else {
            Some(cores(local.iter().sum()))
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

    /// Held by the tests whose snapshots depend on the watched local nodes, which one of them sets.
    static WATCHING: Mutex<()> = Mutex::new(());

    #[test]
    fn a_listening_socket_is_read_off_its_proc_net_tcp_line() {
        let listening = "   1: 0100007F:1F95 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 123456 1 0000000000000000 100 0 0 10 0";
        assert_eq!(listener(listening), Some((8085, 123456)));
        let established = "   2: 0100007F:1F95 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 654321 1 0000000000000000 20 4 30 10 -1";
        assert_eq!(listener(established), None);
        assert_eq!(listener("garbage"), None);
    }

    #[test]
    fn only_loopback_hosts_are_looked_for() {
        assert_eq!(loopback_port("http://127.0.0.1:8040"), Some(8040));
        assert_eq!(loopback_port("http://localhost"), Some(80));
        assert_eq!(loopback_port("https://[::1]:9000/api"), Some(9000));
        assert_eq!(loopback_port("http://10.0.0.7:8040"), None);
        assert_eq!(loopback_port("http://herald.example:8040"), None);
        assert_eq!(loopback_port("not a url"), None);
    }

    #[test]
    fn a_node_listening_on_loopback_is_found_and_its_cpu_counted() {
        let _watching = WATCHING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().expect("address").port();
        let url = format!("http://127.0.0.1:{port}");
        // This process listens there: it is the node.
        assert_eq!(watch_local_nodes(std::slice::from_ref(&url)), vec![std::process::id()]);
        let before = CpuSnapshot::take().expect("/proc is readable");
        let started = Instant::now();
        let mut x = 0u64;
        while started.elapsed().as_millis() < 300 {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let split = CpuSnapshot::take().expect("/proc is readable").since(&before);
        assert!(split.herald_cores.is_some_and(|cores| cores > 0.0), "{split:?}");
        // One of two nodes found is not counted: a part would read as the whole cluster's CPU.
        let elsewhere = "http://10.0.0.7:8040".to_owned();
        assert_eq!(watch_local_nodes(&[url, elsewhere]), vec![std::process::id()]);
        let before = CpuSnapshot::take().expect("/proc is readable");
        let split = CpuSnapshot::take().expect("/proc is readable").since(&before);
        assert_eq!(split.herald_cores, None);
        drop(listener);
    }

    #[test]
    fn parses_stat_lines() {
        let line = "1234 (tokio (worker) 1) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0";
        assert_eq!(ticks(line), Some(300));
    }

    #[test]
    fn reads_this_process() {
        let _watching = WATCHING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
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
