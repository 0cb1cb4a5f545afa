//! Linux's table of TCP sockets (`/proc/<pid>/net/tcp` and `tcp6`) and its descriptor tables
//! (`/proc/<pid>/fd`): which socket joins two ports, which one listens on a port, and which descriptor
//! holds a socket. Read by [`crate::tcp_nodelay`] to find a connection's own socket, and by the
//! benchmark harness to find the process of a node it measures.

use std::fs;
use std::path::Path;

/// A socket's state in the table (`st`, in hex): connected.
pub const ESTABLISHED: u8 = 0x01;
/// A socket's state in the table: listening for connections.
pub const LISTEN: u8 = 0x0A;

/// One row of a `/proc/net/tcp`-format table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSocket {
    /// The local port.
    pub local_port: u16,
    /// The remote port (0 for a listening socket).
    pub remote_port: u16,
    /// The state ([`ESTABLISHED`], [`LISTEN`], …).
    pub state: u8,
    /// The socket's inode, as `/proc/<pid>/fd` links name it (`socket:[inode]`).
    pub inode: u64,
}

/// The rows of a `/proc/net/tcp`-format `table` (its header and any line not in that format skipped).
pub fn tcp_sockets(table: &str) -> impl Iterator<Item = TcpSocket> + '_ {
    table.lines().skip(1).filter_map(|line| {
        // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode …
        let fields: Vec<&str> = line.split_whitespace().collect();
        let port = |address: &str| {
            address
                .rsplit_once(':')
                .and_then(|(_, hex)| u16::from_str_radix(hex, 16).ok())
        };
        Some(TcpSocket {
            local_port: port(fields.get(1)?)?,
            remote_port: port(fields.get(2)?)?,
            state: u8::from_str_radix(fields.get(3)?, 16).ok()?,
            inode: fields.get(9)?.parse().ok()?,
        })
    })
}

/// The TCP tables (IPv4, then IPv6) of the network namespace of `process` (a `/proc` entry such as
/// `/proc/self`), each read when the iterator gets to it (a search that ends in the first never reads
/// the second); a table that cannot be read is left out.
pub fn tcp_tables(process: &Path) -> impl Iterator<Item = String> + '_ {
    ["net/tcp", "net/tcp6"]
        .into_iter()
        .filter_map(|table| fs::read_to_string(process.join(table)).ok())
}

/// The number of the descriptor in `fd_dir` (a `/proc/<pid>/fd`) open on socket `inode`, if one is;
/// `Err` when the directory cannot be read (another user's process, say).
pub fn descriptor_holding(fd_dir: &Path, inode: u64) -> std::io::Result<Option<i32>> {
    let wanted = format!("socket:[{inode}]");
    Ok(fs::read_dir(fd_dir)?
        .filter_map(Result::ok)
        .find(|entry| fs::read_link(entry.path()).is_ok_and(|target| target.as_os_str() == wanted.as_str()))
        .and_then(|entry| entry.file_name().to_str().and_then(|name| name.parse().ok())))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1538 00000000:0000 0A 00000000:00000000 00:00000000 00000000   107        0 20001 1 0000000000000000 100 0 0 10 0
   1: 0100007F:D431 0100007F:1538 01 00000000:00000000 00:00000000 00000000     0        0 31337 1 0000000000000000 20 4 30 10 -1
   2: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 40004 1 0000000000000000 100 0 0 10 0
   3: garbage
";

    #[test]
    fn reads_each_rows_ports_state_and_inode_of_either_family() {
        let rows: Vec<TcpSocket> = tcp_sockets(TABLE).collect();
        assert_eq!(
            rows,
            [
                TcpSocket {
                    local_port: 5432,
                    remote_port: 0,
                    state: LISTEN,
                    inode: 20001
                },
                TcpSocket {
                    local_port: 54321,
                    remote_port: 5432,
                    state: ESTABLISHED,
                    inode: 31337
                },
                TcpSocket {
                    local_port: 8080,
                    remote_port: 0,
                    state: LISTEN,
                    inode: 40004
                },
            ]
        );
        assert_eq!(tcp_sockets("").count(), 0);
    }

    #[test]
    fn finds_the_descriptor_of_a_socket_of_this_process() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        let inode = tcp_tables(Path::new("/proc/self"))
            .flat_map(|table| tcp_sockets(&table).collect::<Vec<_>>())
            .find(|socket| socket.state == LISTEN && socket.local_port == port)
            .expect("the listener is in the table")
            .inode;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&listener);
        assert_eq!(
            descriptor_holding(Path::new("/proc/self/fd"), inode).expect("readable"),
            Some(fd)
        );
        assert_eq!(
            descriptor_holding(Path::new("/proc/self/fd"), u64::MAX).expect("readable"),
            None
        );
    }
}
