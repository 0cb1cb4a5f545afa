//! The harness's webhook receivers.
//!
//! - [`Receiver`]: a hyper 1 HTTP/1.1 server that answers every request `200` with an empty body as soon
//!   as it has read it, and records its arrival time together with the `sent_at_us` the load generator
//!   wrote into the payload (and the payload's `n`, when it has one, for scenarios that keep more times
//!   per event than the payload can carry).
//! - [`BlackHole`]: accepts TCP connections, reads and discards whatever arrives, and never answers.
//!
//! Both stop (and close their connections) when dropped.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use indicatif::ProgressBar;
use serde::Deserialize;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::unix_micros;

/// One request a [`Receiver`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// The send time the load generator wrote into the payload (Unix µs).
    pub sent_at_us: u64,
    /// When the receiver had read the whole request (Unix µs).
    pub arrived_at_us: u64,
    /// The payload's `n`, when it has one: the number by which a scenario that learns an event's times
    /// only after sending it (the outbox's producers, when their commit returns) finds them again.
    pub n: Option<u64>,
}

impl Arrival {
    /// Lag from send to arrival, in microseconds.
    pub fn lag_us(&self) -> u64 {
        self.arrived_at_us.saturating_sub(self.sent_at_us)
    }
}

#[derive(Default)]
struct Recorded {
    arrivals: Mutex<Vec<Arrival>>,
    requests: AtomicU64,
    unparsed: AtomicU64,
}

impl Recorded {
    fn record(&self, body: &[u8], arrived_at_us: u64) {
        #[derive(Deserialize)]
        struct Probe {
            sent_at_us: u64,
            #[serde(default)]
            n: Option<u64>,
        }
        match serde_json::from_slice::<Probe>(body) {
            Ok(probe) => self
                .arrivals
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Arrival {
                    sent_at_us: probe.sent_at_us,
                    arrived_at_us,
                    n: probe.n,
                }),
            Err(_) => {
                self.unparsed.fetch_add(1, Ordering::Relaxed);
            }
        }
        // Counted last, so that a waiter that sees the count also finds the arrival.
        self.requests.fetch_add(1, Ordering::Release);
    }
}

/// A fast HTTP receiver that records arrival times.
pub struct Receiver {
    addr: SocketAddr,
    recorded: Arc<Recorded>,
    task: JoinHandle<()>,
}

impl Receiver {
    /// Listen on `bind` (port 0 for any free port) and start answering.
    pub async fn start(bind: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(bind)
            .await
            .with_context(|| format!("binding a receiver on {bind}"))?;
        let addr = listener.local_addr().context("receiver address")?;
        let recorded = Arc::new(Recorded::default());
        let task = tokio::spawn(accept_loop(listener, {
            let recorded = recorded.clone();
            move |stream| serve_http(stream, recorded.clone())
        }));
        Ok(Self { addr, recorded, task })
    }

    /// Listen on any free port of `host`.
    pub async fn any_port(host: IpAddr) -> anyhow::Result<Self> {
        Self::start(SocketAddr::new(host, 0)).await
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL of `path` on this receiver (`path` starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Requests received so far (whether or not their payload carried `sent_at_us`).
    pub fn received(&self) -> u64 {
        self.recorded.requests.load(Ordering::Acquire)
    }

    /// Requests whose body had no readable `sent_at_us`.
    pub fn unparsed(&self) -> u64 {
        self.recorded.unparsed.load(Ordering::Relaxed)
    }

    /// Take the arrivals recorded so far (the next call returns only later ones).
    pub fn take_arrivals(&self) -> Vec<Arrival> {
        std::mem::take(&mut *self.recorded.arrivals.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Wait until [`Receiver::received`] reaches `total` or `timeout` passes; true if it was reached.
    /// `bar` shows the count.
    pub async fn wait_for(&self, total: u64, timeout: Duration, bar: &ProgressBar) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let now = self.received();
            bar.set_position(now);
            if now >= total {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A receiver that accepts connections and never answers.
pub struct BlackHole {
    addr: SocketAddr,
    connections: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl BlackHole {
    /// Listen on any free port of `host`.
    pub async fn any_port(host: IpAddr) -> anyhow::Result<Self> {
        let bind = SocketAddr::new(host, 0);
        let listener = TcpListener::bind(bind)
            .await
            .with_context(|| format!("binding a black hole on {bind}"))?;
        let addr = listener.local_addr().context("black hole address")?;
        let connections = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(accept_loop(listener, {
            let connections = connections.clone();
            move |stream| {
                connections.fetch_add(1, Ordering::Relaxed);
                swallow(stream)
            }
        }));
        Ok(Self {
            addr,
            connections,
            task,
        })
    }

    /// The URL of `path` on this black hole.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An address on `host` where nothing listens right now (a port the system just handed out and took
/// back), for a "down" endpoint that can be brought up later by binding a [`Receiver`] on it.
pub fn unused_address(host: IpAddr) -> anyhow::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(SocketAddr::new(host, 0))
        .with_context(|| format!("finding a free port on {host}"))?;
    listener.local_addr().context("free port")
}

/// Accept connections until aborted; each runs `handle` in a task that is aborted with this one.
async fn accept_loop<F, Fut>(listener: TcpListener, handle: F)
where
    F: Fn(TcpStream) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut connections = JoinSet::new();
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                connections.spawn(handle(stream));
            }
            // Out of file descriptors or similar: back off a little rather than spin.
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
        while connections.try_join_next().is_some() {}
    }
}

async fn serve_http(stream: TcpStream, recorded: Arc<Recorded>) {
    let service = service_fn(move |request: Request<Incoming>| {
        let recorded = recorded.clone();
        async move {
            if let Ok(body) = request.into_body().collect().await {
                recorded.record(&body.to_bytes(), unix_micros());
            }
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        }
    });
    // A connection error (the sender hung up) ends this connection only.
    let _ = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

async fn swallow(mut stream: TcpStream) {
    let mut buffer = [0u8; 4096];
    while let Ok(read) = stream.read(&mut buffer).await {
        if read == 0 {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_the_payloads_n_when_it_has_one() {
        let recorded = Recorded::default();
        recorded.record(br#"{"sent_at_us":10,"n":42}"#, 15);
        recorded.record(br#"{"sent_at_us":20,"seq":3,"pad":""}"#, 25);
        recorded.record(b"not json", 30);
        let arrivals = recorded.arrivals.lock().unwrap_or_else(PoisonError::into_inner).clone();
        assert_eq!(
            arrivals,
            [
                Arrival {
                    sent_at_us: 10,
                    arrived_at_us: 15,
                    n: Some(42)
                },
                Arrival {
                    sent_at_us: 20,
                    arrived_at_us: 25,
                    n: None
                },
            ]
        );
        assert_eq!(recorded.unparsed.load(Ordering::Relaxed), 1);
        assert_eq!(recorded.requests.load(Ordering::Relaxed), 3);
    }
}
