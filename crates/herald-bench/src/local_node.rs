//! The process of a `--target` node that runs on this machine, found by the loopback port it listens
//! on, so that its CPU can be read beside the harness's (see [`crate::cpu`]): on a shared two-core
//! machine the split between node and load generator is half of what a figure means.
//!
//! A node is found when exactly one process this user can look into holds the sockets listening on its
//! URL's port (a node listening on IPv4 and IPv6 is one process), and its command is Herald's
//! (`herald…`): a second holder — a supervisor that passed the socket on, another node on another
//! loopback address — makes it not found, and so does a tunnel or proxy alone on the port (`ssh -L`,
//! `socat`, `docker-proxy`), whose CPU is not the node's; so does a non-loopback host. The harness's own
//! receivers are not yet listening when nodes are looked for, so the harness cannot find itself.

use std::collections::BTreeSet;
use std::path::Path;

use herald_sql::proc_net;
use serde::Serialize;

/// A node's process on this machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LocalNode {
    /// Its process id.
    pub pid: u32,
    /// Its command name (`/proc/<pid>/comm`), to tell a node from a proxy in front of one.
    pub command: String,
    /// When it started (`/proc/<pid>/stat` field 22, clock ticks after boot): a process that restarted,
    /// or another that took its id, has another.
    #[serde(skip)]
    pub started: u64,
}

impl LocalNode {
    /// `pid`'s process, if it is running.
    pub fn of(pid: u32) -> Option<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let command = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        Some(Self {
            pid,
            command: command.trim_end().to_owned(),
            started: stat_field(&stat, 22)?,
        })
    }
}

/// Field `n` (1-based, as `proc(5)` numbers them; from 3 on) of a `/proc/<pid>/stat` line, read after the
/// parenthesised command name, which may itself hold spaces.
pub(crate) fn stat_field(stat: &str, n: usize) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(n.checked_sub(3)?)?.parse().ok()
}

/// The node process of each of `urls`, in order; `None` for one not found (see the module's
/// documentation).
pub fn find(urls: &[String]) -> Vec<Option<LocalNode>> {
    let sockets: Vec<proc_net::TcpSocket> = proc_net::tcp_tables(Path::new("/proc/self"))
        .flat_map(|table| proc_net::tcp_sockets(&table).collect::<Vec<_>>())
        .filter(|socket| socket.state == proc_net::LISTEN)
        .collect();
    urls.iter()
        .map(|url| {
            let port = loopback_port(url)?;
            let inodes: Vec<u64> = sockets
                .iter()
                .filter(|socket| socket.local_port == port)
                .map(|socket| socket.inode)
                .collect();
            let holders = processes_holding(&inodes);
            let [pid] = holders.into_iter().collect::<Vec<_>>()[..] else {
                return None;
            };
            LocalNode::of(pid).filter(|node| node.command.starts_with("herald"))
        })
        .collect()
}

/// Whether `url`'s host is a loopback address (`127.x`, `::1`, `localhost`).
pub fn is_loopback(url: &str) -> bool {
    loopback_port(url).is_some()
}

/// The port of `url` when its host is a loopback address (`127.x`, `::1`, `localhost`).
fn loopback_port(url: &str) -> Option<u16> {
    let url = reqwest::Url::parse(url).ok()?;
    let host = url.host_str()?;
    let loopback = host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    loopback.then(|| url.port_or_known_default()).flatten()
}

/// Every process (that this user may look into) holding one of the sockets `inodes`.
fn processes_holding(inodes: &[u64]) -> BTreeSet<u32> {
    if inodes.is_empty() {
        return BTreeSet::new();
    }
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return BTreeSet::new();
    };
    processes
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let fd_dir = entry.path().join("fd");
            inodes
                .iter()
                .any(|inode| matches!(proc_net::descriptor_holding(&fd_dir, *inode), Ok(Some(_))))
                .then_some(pid)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_hosts_are_looked_for() {
        assert_eq!(loopback_port("http://127.0.0.1:8040"), Some(8040));
        assert_eq!(loopback_port("http://127.0.0.2:8040"), Some(8040));
        assert_eq!(loopback_port("http://localhost"), Some(80));
        assert_eq!(loopback_port("https://[::1]:9000/api"), Some(9000));
        assert_eq!(loopback_port("http://10.0.0.7:8040"), None);
        assert_eq!(loopback_port("http://herald.example:8040"), None);
        assert_eq!(loopback_port("not a url"), None);
    }

    #[test]
    fn stat_fields_are_counted_after_a_command_name_with_spaces() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 98765 0 0";
        assert_eq!(stat_field(stat, 3), None, "the state is not a number");
        assert_eq!(stat_field(stat, 4), Some(1));
        assert_eq!(stat_field(stat, 14), Some(7));
        assert_eq!(stat_field(stat, 15), Some(3));
        assert_eq!(stat_field(stat, 22), Some(98765));
        assert_eq!(stat_field(stat, 2), None);
        assert_eq!(stat_field("no name", 4), None);
    }

    #[test]
    fn a_listener_on_loopback_is_found_as_its_process_and_nothing_else_is() {
        // This test binary's command is `herald_bench-…`, a name a node's could have too.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().expect("address").port();
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let closed_port = closed.local_addr().expect("address").port();
        drop(closed);
        let found = find(&[
            format!("http://127.0.0.1:{port}"),
            format!("http://127.0.0.1:{closed_port}"),
            format!("http://10.0.0.7:{port}"),
        ]);
        // This test's process listens there.
        let this = LocalNode::of(std::process::id()).expect("this process");
        assert_eq!(found, [Some(this), None, None]);
        drop(listener);
    }
}
