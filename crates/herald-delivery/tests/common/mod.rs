//! Shared pieces of the delivery client's tests: a scripted resolver, clients allowed to reach loopback only,
//! and raw loopback listeners.
//!
//! Every address any of these tests can connect to is a loopback address: the policies built here allowlist
//! (parts of) 127.0.0.0/8 and nothing else, so a non-loopback address is refused by the same check the tests
//! exercise, and a bug shows up as a failed assertion rather than as traffic leaving the machine.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_core::address::AddressPolicy;
use herald_delivery::{ClientConfig, DeliveryClient, HostResolver};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

/// A resolver that answers from a script: each lookup takes the next answer; the last one repeats.
pub(crate) struct ScriptedResolver {
    answers: Mutex<VecDeque<Vec<IpAddr>>>,
    last: Mutex<Vec<IpAddr>>,
    pub lookups: AtomicUsize,
}

impl ScriptedResolver {
    pub(crate) fn new(answers: &[&[&str]]) -> Arc<Self> {
        let parsed: VecDeque<Vec<IpAddr>> = answers
            .iter()
            .map(|set| set.iter().map(|a| a.parse().expect("address")).collect())
            .collect();
        Arc::new(Self {
            answers: Mutex::new(parsed),
            last: Mutex::new(Vec::new()),
            lookups: AtomicUsize::new(0),
        })
    }

    /// A resolver giving `answer` to every lookup.
    pub(crate) fn answering(answer: Vec<IpAddr>) -> Arc<Self> {
        Arc::new(Self {
            answers: Mutex::new(VecDeque::new()),
            last: Mutex::new(answer),
            lookups: AtomicUsize::new(0),
        })
    }

    pub(crate) fn lookups(&self) -> usize {
        self.lookups.load(Ordering::SeqCst)
    }
}

impl HostResolver for ScriptedResolver {
    fn lookup(&self, _host: &str) -> futures::future::BoxFuture<'static, Result<Vec<IpAddr>, String>> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        let next = self.answers.lock().expect("lock").pop_front();
        let answer = match next {
            Some(answer) => {
                *self.last.lock().expect("lock") = answer.clone();
                answer
            }
            None => self.last.lock().expect("lock").clone(),
        };
        Box::pin(async move { Ok(answer) })
    }
}

/// The loopback allowlist: the only addresses the policy lets through.
pub(crate) fn loopback_policy() -> AddressPolicy {
    AddressPolicy::new(vec!["127.0.0.0/8".parse().expect("cidr")], true)
}

/// A client allowed to reach 127.0.0.0/8 only, with `config`.
pub(crate) fn client(config: ClientConfig, policy: AddressPolicy, resolver: Arc<dyn HostResolver>) -> DeliveryClient {
    DeliveryClient::new(config, Arc::new(policy), resolver).expect("client")
}

/// A client allowed to reach 127.0.0.0/8 only, with default limits and no names to resolve.
pub(crate) fn loopback_client(config: ClientConfig) -> DeliveryClient {
    client(config, loopback_policy(), ScriptedResolver::new(&[]))
}

/// A listener that accepts and counts connections, and never answers.
pub(crate) struct CountingListener {
    pub addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

impl CountingListener {
    pub(crate) async fn bind(addr: &str) -> Self {
        let listener = TcpListener::bind(addr).await.expect("bind");
        Self::serve(listener)
    }

    pub(crate) fn serve(listener: TcpListener) -> Self {
        let addr = listener.local_addr().expect("addr");
        let connections = Arc::new(AtomicUsize::new(0));
        let count = connections.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                drop(socket);
            }
        });
        Self { addr, connections }
    }

    pub(crate) fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Read a request head (up to its blank line) and return it; the small bodies the tests send follow it and
/// are read with it or left in the socket.
pub(crate) async fn read_head(socket: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match socket.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// The request's `Host` header, from a raw head.
pub(crate) fn host_header(head: &str) -> Option<String> {
    head.lines()
        .find_map(|line| line.strip_prefix("host: ").or_else(|| line.strip_prefix("Host: ")))
        .map(str::to_owned)
}

/// Wait for a oneshot report from a server task, failing the test rather than hanging.
pub(crate) async fn report<T>(rx: tokio::sync::oneshot::Receiver<T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), rx)
        .await
        .expect("the server task reports within a minute")
        .expect("the server task reports")
}
