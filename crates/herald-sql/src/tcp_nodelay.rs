//! `TCP_NODELAY` on PostgreSQL connections made over TCP.
//!
//! sqlx 0.9.0 does not set `TCP_NODELAY` on the sockets it opens (launchbadge/sqlx#4335; the fix is not
//! in a release yet), and it writes some exchanges in two pieces: with Nagle's algorithm on, the second
//! piece then waits for the server's delayed ACK of the first, about 40 ms on Linux, once per
//! transaction — a floor under every request's latency that the Unix socket does not have.
//!
//! sqlx offers no hook on its socket, so this finds the socket among the process's own descriptors:
//! the server names the client's and its own port (`inet_client_port()`, `inet_server_port()`), the
//! kernel's table of TCP sockets (`/proc/self/net/tcp{,6}`) maps those ports to the socket's inode, the
//! descriptor table (`/proc/self/fd`) maps the inode to a descriptor number, and `pidfd_getfd` gives a
//! duplicate of that descriptor — an option set through it is set on the one socket both share. All of
//! it through safe system-call wrappers; nothing else about the connection is touched.
//!
//! It is best effort by design: over a Unix socket there is nothing to do; where the ports seen by the
//! server are not this process's (a proxy or NAT between them), or `/proc` or `pidfd_getfd` is not
//! available, the connection is used as it is, and a debug line says why.

use std::os::fd::OwnedFd;
use std::path::Path;

use sqlx::PgConnection;

use crate::proc_net;

/// Set `TCP_NODELAY` on `conn`'s socket when it is a TCP connection (see the module's documentation).
/// Fails only when the query for the ports fails (then the connection is not usable anyway).
pub(crate) async fn set_on(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    let (client, server): (Option<i32>, Option<i32>) = sqlx::query_as("SELECT inet_client_port(), inet_server_port()")
        .fetch_one(&mut *conn)
        .await?;
    set_on_reported_ports(client.map(i64::from), server.map(i64::from)).await;
    Ok(())
}

/// Set `TCP_NODELAY` on this process's socket of a database connection whose server reported
/// `client` (the connection's own port) and `server` (the server's port): the hook for connections
/// opened by other drivers than this crate's pools (`herald relay`'s sources, on PostgreSQL and
/// MariaDB/MySQL alike). `None`, 0 or out of range (a Unix socket): nothing to do. Best effort, as
/// `set_on`: a debug line says why when the option could not be set.
pub async fn set_on_reported_ports(client: Option<i64>, server: Option<i64>) {
    // NULL (or 0) over a Unix socket: no Nagle there.
    let (Some(client), Some(server)) = (client, server) else {
        return;
    };
    let (Ok(client), Ok(server)) = (u16::try_from(client), u16::try_from(server)) else {
        return;
    };
    if client == 0 || server == 0 {
        return;
    }
    // A few small reads of /proc: off the runtime's threads all the same.
    let outcome = tokio::task::spawn_blocking(move || set_on_ports(client, server)).await;
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(why)) => tracing::debug!(
            client,
            server,
            why,
            "database connection left with Nagle's algorithm on"
        ),
        Err(error) => tracing::debug!(%error, "database connection left with Nagle's algorithm on"),
    }
}

/// Whether this process's TCP socket from local port `local` to remote port `remote` has `TCP_NODELAY`
/// (for tests of other crates' connections).
pub fn is_set_on_ports(local: u16, remote: u16) -> Result<bool, String> {
    let own = socket_copy(local, remote)?;
    rustix::net::sockopt::tcp_nodelay(&own).map_err(|error| format!("getsockopt(TCP_NODELAY): {error}"))
}

/// Find this process's TCP socket from local port `local` to remote port `remote` and set `TCP_NODELAY`.
fn set_on_ports(local: u16, remote: u16) -> Result<(), String> {
    let own = socket_copy(local, remote)?;
    rustix::net::sockopt::set_tcp_nodelay(&own, true).map_err(|error| format!("setsockopt(TCP_NODELAY): {error}"))
}

/// A descriptor of this process's TCP socket from local port `local` to remote port `remote`.
fn socket_copy(local: u16, remote: u16) -> Result<OwnedFd, String> {
    let inode = proc_net::tcp_tables(Path::new("/proc/self"))
        .find_map(|table| socket_inode(&table, local, remote))
        .ok_or_else(|| format!("no socket from port {local} to port {remote} in /proc/self/net/tcp"))?;
    let descriptor = descriptor_of(inode)?;
    own_copy(descriptor).map_err(|error| format!("pidfd_getfd({descriptor}): {error}"))
}

/// The inode of the established socket from `local` to `remote` in a `/proc/net/tcp`-format `table`.
fn socket_inode(table: &str, local: u16, remote: u16) -> Option<u64> {
    proc_net::tcp_sockets(table)
        .find(|socket| {
            socket.state == proc_net::ESTABLISHED && socket.local_port == local && socket.remote_port == remote
        })
        .map(|socket| socket.inode)
}

/// The number of this process's descriptor open on socket `inode`.
fn descriptor_of(inode: u64) -> Result<i32, String> {
    proc_net::descriptor_holding(Path::new("/proc/self/fd"), inode)
        .map_err(|error| format!("/proc/self/fd: {error}"))?
        .ok_or_else(|| format!("no descriptor open on socket:[{inode}]"))
}

/// A duplicate of this process's descriptor `number`, owned (closed when dropped).
fn own_copy(number: i32) -> rustix::io::Result<OwnedFd> {
    use rustix::process::{PidfdFlags, PidfdGetfdFlags, getpid, pidfd_getfd, pidfd_open};
    let this_process = pidfd_open(getpid(), PidfdFlags::empty())?;
    pidfd_getfd(&this_process, number, PidfdGetfdFlags::empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1538 00000000:0000 0A 00000000:00000000 00:00000000 00000000   107        0 20001 1 0000000000000000 100 0 0 10 0
   1: 0100007F:D431 0100007F:1538 01 00000000:00000000 00:00000000 00000000     0        0 31337 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:D432 0100007F:1538 06 00000000:00000000 03:00000000 00000000     0        0 0 3 0000000000000000
";

    #[test]
    fn finds_the_established_socket_between_the_two_ports() {
        // 0x1538 = 5432, 0xD431 = 54321.
        assert_eq!(socket_inode(TABLE, 54321, 5432), Some(31337));
        // The listening socket (state 0A) and a TIME_WAIT one (06) are not it.
        assert_eq!(socket_inode(TABLE, 5432, 0), None);
        assert_eq!(socket_inode(TABLE, 54322, 5432), None);
        assert_eq!(socket_inode(TABLE, 54321, 5433), None);
        assert_eq!(socket_inode("", 54321, 5432), None);
    }

    #[test]
    fn sets_the_option_on_a_socket_of_this_process() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_server, _) = listener.accept().unwrap();
        assert!(!client.nodelay().unwrap(), "off by default");
        let (local, remote) = (client.local_addr().unwrap().port(), client.peer_addr().unwrap().port());
        set_on_ports(local, remote).unwrap();
        assert!(client.nodelay().unwrap(), "set through the duplicate");
    }

    #[tokio::test]
    async fn the_pools_connections_to_postgresql_over_tcp_have_it() {
        use std::str::FromStr;
        let Some(db) = crate::testdb::fresh("tcp_nodelay").await else {
            return;
        };
        let options = sqlx::postgres::PgConnectOptions::from_str(&db.url).unwrap();
        let timeouts = crate::custody::DatabaseTimeouts::default();
        let pool = timeouts
            .pool(&timeouts.bound())
            .max_connections(2)
            .connect_with(options)
            .await
            .unwrap();
        let mut conn = pool.acquire().await.unwrap();
        let (client, server): (Option<i32>, Option<i32>) =
            sqlx::query_as("SELECT inet_client_port(), inet_server_port()")
                .fetch_one(&mut *conn)
                .await
                .unwrap();
        let (Some(client), Some(server)) = (client, server) else {
            panic!("the test database {} is not reached over TCP", db.url);
        };
        let socket = socket_copy(u16::try_from(client).unwrap(), u16::try_from(server).unwrap()).unwrap();
        assert!(
            rustix::net::sockopt::tcp_nodelay(&socket).unwrap(),
            "TCP_NODELAY on sqlx's socket"
        );
        drop(conn);
        pool.close().await;
    }
}
