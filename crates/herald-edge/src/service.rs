//! The application service as the edge serves it: each request marks its connection busy until its
//! response has been handed over, a request whose body timed out is answered 408, and a panic in the
//! application is answered 500 (the connection survives it) — both as JSON. A response given before
//! the request's body was read to its end (a 401, 404 or 413 decided on the head alone) says
//! `connection: close`: the unread rest of the body is still on its way, so the connection cannot
//! carry another request, and a keep-alive client must be told rather than find it closed.

use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures::FutureExt as _;
use http::header::CONNECTION;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::answer;
use crate::head::Refusal;
use crate::registry::{Connection, Registry};

/// Errors of the application's response bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The application wrapped for one connection.
pub(crate) struct EdgeService<S> {
    pub(crate) inner: S,
    pub(crate) connection: Arc<Connection>,
    pub(crate) registry: Arc<Registry>,
}

/// Marks the connection idle again when dropped: with the response body once hyper has sent it, or
/// with the request's future if the client left first.
pub(crate) struct InFlight(Arc<Connection>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.end_request();
    }
}

impl<S, B> hyper::service::Service<Request<Incoming>> for EdgeService<S>
where
    S: tower::Service<Request<axum::body::Body>, Response = Response<B>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<EdgeBody<B>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        self.connection.start_request();
        let in_flight = InFlight(self.connection.clone());
        let mut inner = self.inner.clone();
        let registry = self.registry.clone();
        let body_read = Arc::new(AtomicBool::new(request.body().is_end_stream()));
        let tracked = {
            let read = body_read.clone();
            request.map(move |body| axum::body::Body::new(Tracked { body, read }))
        };
        Box::pin(async move {
            let answered = AssertUnwindSafe(async move {
                let Ok(()) = std::future::poll_fn(|cx| inner.poll_ready(cx)).await;
                let Ok(response) = inner.call(tracked).await;
                response
            })
            .catch_unwind()
            .await;
            let response = match answered {
                Ok(response) => response,
                Err(panic) => {
                    let message = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    tracing::error!(panic = %message, "a request handler panicked; answered 500");
                    let refusal = Refusal::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "internal_error",
                        "the server failed while handling this request",
                    );
                    return Ok(fixed(&refusal, in_flight));
                }
            };
            if in_flight.0.body_timed_out.load(Ordering::Acquire) {
                // Whatever the application made of the truncated body, the client was too slow.
                let refusal = answer::too_slow("the request body did not arrive in time");
                return Ok(fixed(&refusal, in_flight));
            }
            let mut response = response.map(|body| EdgeBody::App {
                body,
                in_flight: Some(in_flight),
                registry,
            });
            if !body_read.load(Ordering::Acquire) {
                response
                    .headers_mut()
                    .insert(CONNECTION, HeaderValue::from_static("close"));
            }
            Ok(response)
        })
    }
}

/// A request body that records when it has been read to its end.
struct Tracked {
    body: Incoming,
    read: Arc<AtomicBool>,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let frame = ready!(Pin::new(&mut self.body).poll_frame(cx));
        if frame.is_none() || self.body.is_end_stream() {
            self.read.store(true, Ordering::Release);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

fn fixed<B>(refusal: &Refusal, in_flight: InFlight) -> Response<EdgeBody<B>> {
    answer::response(refusal).map(|data| EdgeBody::Fixed {
        data: Some(data),
        _in_flight: in_flight,
    })
}

/// A response body: the application's, or one of the edge's own answers.
pub(crate) enum EdgeBody<B> {
    App {
        body: B,
        /// Dropped as soon as the whole body has been handed to hyper: hyper may hold a large body
        /// unfinished until the client has read most of it, and the connection is idle meanwhile.
        in_flight: Option<InFlight>,
        registry: Arc<Registry>,
    },
    Fixed {
        data: Option<Bytes>,
        _in_flight: InFlight,
    },
}

impl<B> Body for EdgeBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Held;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Held>, BoxError>>> {
        match self.get_mut() {
            Self::App {
                body,
                in_flight,
                registry,
            } => {
                let frame = ready!(Pin::new(&mut *body).poll_frame(cx));
                let owner = in_flight.as_ref().map(|guard| &guard.0);
                let frame = frame.map(|f| {
                    f.map(|f| f.map_data(|bytes| Held::new(bytes, owner)))
                        .map_err(Into::into)
                });
                if frame.is_none() || body.is_end_stream() {
                    *in_flight = None;
                }
                // A client that does not read holds its response in memory: past the budget, the
                // connections that have held one longest are closed.
                if registry.over_budget() {
                    let closed = registry.shed_unread();
                    tracing::debug!(closed, "unread responses over their budget; closed the oldest");
                }
                Poll::Ready(frame)
            }
            Self::Fixed { data, .. } => Poll::Ready(data.take().map(|d| Ok(Frame::data(Held::new(d, None))))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::App { body, .. } => body.is_end_stream(),
            Self::Fixed { data, .. } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::App { body, .. } => body.size_hint(),
            Self::Fixed { data, .. } => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
        }
    }
}

/// A frame of a response body as hyper holds it. Its length counts against the unread-response budget
/// from the moment hyper takes it until hyper drops it, written out in full (or with the connection).
/// Counting what the socket has taken instead would undercount: a frame partly written keeps its whole
/// allocation alive, so a client that reads nothing would hold a whole response each while the count
/// saw only what did not fit in the kernel's send buffer.
pub(crate) struct Held {
    bytes: Bytes,
    /// The connection whose count holds `bytes`, and how many were counted.
    counted: Option<(Arc<Connection>, u64)>,
}

impl Held {
    /// Take `bytes` into hyper's hands, counted on `owner` if there is one.
    fn new(bytes: Bytes, owner: Option<&Arc<Connection>>) -> Self {
        let counted = owner.map(|connection| {
            let n = bytes.len() as u64;
            connection.buffered(n);
            (connection.clone(), n)
        });
        Self { bytes, counted }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some((connection, n)) = self.counted.take() {
            connection.released(n);
        }
    }
}

impl bytes::Buf for Held {
    fn remaining(&self) -> usize {
        self.bytes.remaining()
    }

    fn chunk(&self) -> &[u8] {
        self.bytes.chunk()
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [std::io::IoSlice<'a>]) -> usize {
        self.bytes.chunks_vectored(dst)
    }

    fn advance(&mut self, cnt: usize) {
        self.bytes.advance(cnt);
    }
}

#[cfg(test)]
mod tests {
    use bytes::Buf as _;

    use super::*;

    #[test]
    fn a_frame_counts_until_hyper_drops_it_not_until_the_socket_takes_it() {
        let registry = Registry::new(10, 1000);
        let admitted = registry.admit().expect("a slot");
        let mut frame = Held::new(Bytes::from(vec![b'x'; 1500]), Some(&admitted.connection));
        assert_eq!(registry.unwritten(), 1500);
        assert!(registry.over_budget());
        // Most of it written out: the allocation is still alive, so it still counts in full.
        frame.advance(1400);
        assert_eq!(frame.remaining(), 100);
        assert_eq!(registry.unwritten(), 1500);
        drop(frame);
        assert_eq!(registry.unwritten(), 0);
        // The edge's own answers count on no connection.
        drop(Held::new(Bytes::from_static(b"{}"), None));
        assert_eq!(registry.unwritten(), 0);
    }
}
