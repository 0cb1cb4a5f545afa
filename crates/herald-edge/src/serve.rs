//! The accept loop and each connection's driver.

use std::convert::Infallible;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use hyper::server::conn::http1;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::config::Limits;
use crate::front::Front;
use crate::registry::{Admission, CLOSING_ALLOWANCE, Registry};
use crate::service::{BoxError, EdgeService};
use crate::{answer, fd, head};

/// After a shutdown signal, how long open requests may take to finish before their connections are
/// dropped.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// Back-off after `accept` failed for want of resources (file descriptors, memory): from the first to
/// the longest pause, doubling while it keeps failing.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(5), Duration::from_millis(500));
/// How often a repeated warning (accept failures, refused connections) is logged at most.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Herald's HTTP/1 server: the sender's API and the inbox are both served by it.
#[derive(Debug, Clone)]
pub struct Edge {
    limits: Limits,
    reserved_fds: usize,
}

impl Edge {
    /// A server with these limits.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            reserved_fds: 0,
        }
    }

    /// Keep `n` file descriptors for the rest of the process (outbound connections, say) out of the
    /// connection cap's reach.
    #[must_use]
    pub fn reserve_fds(mut self, n: usize) -> Self {
        self.reserved_fds = n;
        self
    }

    /// Serve `service` on `listener` until `shutdown` completes; then stop accepting, let open requests
    /// finish (for at most [`SHUTDOWN_GRACE`]) and close every connection.
    ///
    /// # Errors
    ///
    /// None so far: failures of `accept` and of connections are logged and outlived.
    pub async fn serve<S, B>(
        self,
        listener: TcpListener,
        service: S,
        shutdown: impl Future<Output = ()> + Send,
    ) -> std::io::Result<()>
    where
        S: tower::Service<Request<axum::body::Body>, Response = Response<B>, Error = Infallible>
            + Clone
            + Send
            + Unpin
            + 'static,
        S::Future: Send,
        B: Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Into<BoxError>,
    {
        let cap = fd::connection_cap(self.limits.max_connections, self.reserved_fds);
        tracing::debug!(max_connections = cap, limits = ?self.limits, "HTTP edge serving");
        let shared = Arc::new(Shared {
            limits: self.limits,
            registry: Registry::new(cap, self.limits.max_unread_response_bytes),
            bodies: Arc::new(Semaphore::new(self.limits.max_request_bodies)),
            http1: http1_builder(),
        });
        let mut connections = JoinSet::new();
        let mut shutdown = pin!(shutdown);
        let mut backoff = ACCEPT_BACKOFF.0;
        let mut accept_failures = Throttled::default();
        let mut refusals = Throttled::default();
        loop {
            // Newcomers wait in the listen backlog while too many evicted sockets are still open.
            tokio::select! {
                () = &mut shutdown => break,
                () = shared.registry.wait_for_closing_below(CLOSING_ALLOWANCE) => {}
            }
            let accepted = tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => accepted,
            };
            while connections.try_join_next().is_some() {}
            match accepted {
                Ok((stream, _peer)) => {
                    backoff = ACCEPT_BACKOFF.0;
                    match shared.registry.admit() {
                        Some(admission) => {
                            connections.spawn(drive(stream, admission, service.clone(), shared.clone()));
                            // Let the new connection read its request before the next accept: under a
                            // flood of sockets a client's fresh connection would otherwise sit unread
                            // while the loop accepts (and evicts for) a hundred more.
                            tokio::task::yield_now().await;
                        }
                        None => {
                            refusals.warn(|n| {
                                tracing::warn!(
                                    refused = n,
                                    max_connections = cap,
                                    "every connection is busy; refusing new ones with 503"
                                )
                            });
                            refuse(&stream);
                        }
                    }
                }
                Err(error) if is_out_of_resources(&error) => {
                    // Without a descriptor to take it, the connection waits in the backlog: close idle
                    // connections to make room, then pause instead of spinning on the same error.
                    let closed = shared.registry.shed_idle(16);
                    accept_failures.warn(|n| tracing::warn!(%error, failures = n, closed_idle = closed, "accept failed for want of resources"));
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(ACCEPT_BACKOFF.1);
                }
                // The client gave up before it was accepted (ECONNABORTED and the like): nothing to do.
                Err(error) => tracing::debug!(%error, "accept failed"),
            }
        }
        drop(listener);
        shared.registry.stop_all();
        let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                open = shared.registry.open(),
                "requests still open after the shutdown grace; dropping them"
            );
        }
        Ok(())
    }
}

/// What every connection's driver shares.
struct Shared {
    limits: Limits,
    registry: Arc<Registry>,
    bodies: Arc<Semaphore>,
    http1: http1::Builder,
}

fn http1_builder() -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        // The front times heads itself (hyper's timer would close without an answer).
        .header_read_timeout(None)
        // The front never hands hyper more than one head, and no head over these limits.
        .max_headers(head::MAX_HEADERS)
        .max_buf_size(head::MAX_HEAD_BYTES * 2)
        // hyper then reads nothing while a request is in progress, and reads the next head as soon as
        // the response is out (the front holds it until then anyway). A client that closes its side
        // after sending still gets its answer, and a handler runs to the end whether or not the client
        // waits for it (an ingest commits either way; at-least-once makes the client retry).
        .half_close(true)
        // Queue response frames rather than copy them into one buffer: the unread-response budget
        // counts a frame until hyper drops it (`service::Held`), and a copied frame would be dropped
        // at once while its copy stayed in memory uncounted.
        .writev(true)
        .keep_alive(true);
    builder
}

/// Serve one connection until it ends, is evicted, or the server shuts down.
async fn drive<S, B>(stream: TcpStream, admission: Admission, service: S, shared: Arc<Shared>)
where
    S: tower::Service<Request<axum::body::Body>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + Unpin
        + 'static,
    S::Future: Send,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    // Responses are written whole by hyper; Nagle would only delay their last segment.
    let _ = stream.set_nodelay(true);
    let connection = admission.connection.clone();
    let front = Front::new(stream, connection.clone(), shared.limits, shared.bodies.clone());
    let service = EdgeService {
        inner: service,
        connection: connection.clone(),
        registry: shared.registry.clone(),
    };
    let mut http = shared.http1.serve_connection(front, service);
    let mut stopping = false;
    // Polled on every wake-up of the connection: an atomic load for each signal, not a select.
    let ended = std::future::poll_fn(|cx| {
        connection.driver.register(cx.waker());
        if connection.is_evicted() {
            // Chosen to make room while it had no request in progress: dropped, hence closed.
            return Poll::Ready(None);
        }
        if !stopping && connection.stop_requested() {
            stopping = true;
            Pin::new(&mut http).graceful_shutdown();
        }
        http.poll_without_shutdown(cx).map(Some)
    })
    .await;
    let Some(ended) = ended else {
        return;
    };
    if let Err(error) = ended {
        tracing::debug!(%error, "connection ended with an error");
    }
    // hyper is done with the socket: answer a refused request, if any, and close.
    http.into_parts().io.finish().await;
    drop(admission);
}

/// Turn a connection away (every open one is busy): a 503 if it can be written at once, then close.
/// Nothing here waits, and no descriptor is kept.
fn refuse(stream: &TcpStream) {
    // Read what already arrived, so that closing sends a FIN rather than a reset that could destroy
    // the answer before the client reads it.
    let mut scratch = [0u8; 4096];
    for _ in 0..4 {
        match stream.try_read(&mut scratch) {
            Ok(n) if n == scratch.len() => {}
            _ => break,
        }
    }
    let _ = stream.try_write(&answer::wire(&answer::busy(
        "the server has too many open connections; retry later",
    )));
}

/// `accept` errors that mean the process or the system is out of something, not that one client failed.
fn is_out_of_resources(error: &std::io::Error) -> bool {
    use rustix::io::Errno;
    matches!(
        Errno::from_io_error(error),
        Some(Errno::MFILE | Errno::NFILE | Errno::NOBUFS | Errno::NOMEM)
    ) || error.kind() == std::io::ErrorKind::OutOfMemory
}

/// A warning that may repeat thousands of times a second, logged once per [`WARN_EVERY`] with a count.
#[derive(Default)]
struct Throttled {
    last: Option<Instant>,
    count: u64,
}

impl Throttled {
    fn warn(&mut self, log: impl FnOnce(u64)) {
        self.count += 1;
        if self.last.is_none_or(|last| last.elapsed() >= WARN_EVERY) {
            log(self.count);
            self.last = Some(Instant::now());
            self.count = 0;
        }
    }
}
