//! The front: the connection's socket as hyper sees it. Every byte a client sends passes through here
//! before hyper reads it, and every byte hyper writes goes out through here.
//!
//! Why a front of our own rather than hyper's options: hyper answers a head it cannot parse with an
//! empty body (and has no hook to change that), its header-read timeout is its only timer, and it reads
//! and answers pipelined requests as fast as they come, whether or not the client reads the answers.
//! The front follows the request framing (heads, `Content-Length` and chunked bodies — see
//! [`crate::head`]) so that it can:
//!
//! - hand hyper only heads that hyper will accept, answering every other one itself, as JSON;
//! - time the connection: the head (`header_read_timeout`), the wait between requests
//!   (`keep_alive_timeout`), the body (`request_body_timeout`) and the writing of a response
//!   (`response_write_timeout`);
//! - hold a request body back until one of the `max_request_bodies` permits is free;
//! - hand hyper the next request only once the previous response is answered and written out: a client
//!   that pipelines requests without reading the answers gets one answer buffered, never a pile of them.
//!
//! Requests the front refuses, and heads that arrive too slowly, end the connection: the front shows
//! hyper an end of stream (hyper then stops at once, since nothing of the request reached it), and the
//! [driver](crate::serve) writes the JSON answer after hyper is done.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use hyper::rt::ReadBufCursor;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;

use crate::answer;
use crate::config::Limits;
use crate::head::{self, BodyLength, ChunkedTracker, Chunks, Refusal};
use crate::registry::Connection;

/// How long a request may wait for a body permit before it is refused with 503.
pub(crate) const BODY_PERMIT_WAIT: Duration = Duration::from_secs(1);
/// After a refusal, how long the rest of the client's request is read and discarded (so that closing
/// does not reset the connection before the client has read the answer), and how much of it at most.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 1024 * 1024;
/// The front's buffer: its usual size, and the largest (a head must fit whole to be checked).
const BUFFER: usize = 8 * 1024;
const BUFFER_MAX: usize = head::MAX_HEAD_BYTES + BUFFER;

type PermitWait = Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

/// What the bytes after those already handed to hyper are.
enum Framing {
    /// The next request's head.
    Head,
    /// A complete head whose body waits for a permit.
    AwaitingPermit { head_len: usize, body: BodyLength },
    /// The rest of a `Content-Length` body.
    Body(u64),
    /// A chunked body.
    Chunked(ChunkedTracker),
    /// Unknown (a chunked body hyper will refuse too): everything goes to hyper, which closes soon.
    Passthrough,
    /// Nothing more for hyper: the connection ends.
    Closed,
}

/// What the current read deadline is for, and since when it runs.
#[derive(Clone, Copy)]
enum Wait {
    /// The first request's head, since the connection opened.
    FirstHead(Instant),
    /// Nothing between two requests.
    Idle(Instant),
    /// A later request's head, since its first byte.
    Head(Instant),
    /// A body, since the end of its head.
    Body(Instant),
    /// A body permit.
    Permit(Instant),
    /// No deadline (a request is being answered; the write deadline applies).
    Nothing,
}

/// What [`Front::next_release`] decided.
enum Step {
    /// Bytes are ready for hyper.
    Released,
    /// Show hyper the end of the stream.
    Eof,
    /// More bytes from the client are needed (the read deadline applies).
    Read,
    /// Nothing to read until woken (the next request waits for the previous one to finish, or for a
    /// body permit); the read deadline applies.
    Wait,
}

/// A connection's socket, with the edge's framing, timers and caps in front of hyper.
pub(crate) struct Front {
    stream: TcpStream,
    connection: Arc<Connection>,
    limits: Limits,
    bodies: Arc<Semaphore>,
    permit: Option<OwnedSemaphorePermit>,
    permit_wait: Option<PermitWait>,
    /// Bytes read from the client and not yet taken by hyper: `buf[start..end]`.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// How many bytes from `start` hyper may take.
    release: usize,
    /// How far the head at `start` has been scanned for its end.
    scanned: usize,
    framing: Framing,
    waiting: Wait,
    read_timer: Pin<Box<Sleep>>,
    write_timer: Pin<Box<Sleep>>,
    /// Since when hyper has written bytes it has not flushed yet.
    writing_since: Option<Instant>,
    /// The client has closed its side.
    eof: bool,
    /// The answer to write once hyper is done.
    refusal: Option<Refusal>,
    /// Read and discard what the client still sends before closing.
    linger: bool,
}

impl Front {
    pub(crate) fn new(stream: TcpStream, connection: Arc<Connection>, limits: Limits, bodies: Arc<Semaphore>) -> Self {
        let now = Instant::now();
        let far = tokio::time::Instant::from_std(now + Duration::from_secs(86_400));
        Self {
            stream,
            connection,
            limits,
            bodies,
            permit: None,
            permit_wait: None,
            buf: Vec::new(),
            start: 0,
            end: 0,
            release: 0,
            scanned: 0,
            framing: Framing::Head,
            waiting: Wait::FirstHead(now),
            read_timer: Box::pin(tokio::time::sleep_until(far)),
            write_timer: Box::pin(tokio::time::sleep_until(far)),
            writing_since: None,
            eof: false,
            refusal: None,
            linger: false,
        }
    }

    fn pending(&self) -> usize {
        self.end - self.start
    }

    /// Decide what hyper may take next.
    fn next_release(&mut self, cx: &mut Context<'_>) -> Step {
        let pending = self.pending();
        let end_or = |eof: bool, otherwise: Step| if eof { Step::Eof } else { otherwise };
        match &mut self.framing {
            Framing::Closed => Step::Eof,
            Framing::Passthrough if pending > 0 => {
                self.release = pending;
                Step::Released
            }
            Framing::Passthrough => end_or(self.eof, Step::Read),
            Framing::Body(remaining) if pending > 0 => {
                let n = usize::try_from(*remaining).unwrap_or(usize::MAX).min(pending);
                self.release = n;
                *remaining -= n as u64;
                if *remaining == 0 {
                    self.body_done();
                }
                Step::Released
            }
            Framing::Chunked(tracker) if pending > 0 => {
                match tracker.feed(&self.buf[self.start..self.end]) {
                    Chunks::More => self.release = pending,
                    Chunks::End(n) => {
                        self.release = n;
                        self.body_done();
                    }
                    Chunks::Malformed(_) => {
                        self.release = pending;
                        self.framing = Framing::Passthrough;
                    }
                }
                Step::Released
            }
            Framing::Body(_) | Framing::Chunked(_) => end_or(self.eof, Step::Read),
            Framing::AwaitingPermit { head_len, body } => {
                let (head_len, body) = (*head_len, *body);
                self.await_permit(cx, head_len, body)
            }
            Framing::Head => self.next_head(cx),
        }
    }

    /// The next request's head, once the previous request is answered and its answer written out.
    fn next_head(&mut self, cx: &mut Context<'_>) -> Step {
        // Parked and registered before looking, so that a request ending in between still wakes it.
        self.connection.park_reader();
        self.connection.reader.register(cx.waker());
        if self.connection.is_busy() || self.writing_since.is_some() {
            self.waiting = Wait::Nothing;
            // The client hung up with nothing pending: let hyper see it (it drops the request).
            if self.eof && self.pending() == 0 {
                return Step::Eof;
            }
            // Read ahead while there is room: that notices a hang-up and saves a wake-up later.
            return if self.eof || self.pending() >= BUFFER {
                Step::Wait
            } else {
                Step::Read
            };
        }
        self.connection.unpark_reader();
        let now = Instant::now();
        match self.waiting {
            Wait::Nothing if self.pending() == 0 => self.waiting = Wait::Idle(now),
            Wait::Nothing | Wait::Idle(_) if self.pending() > 0 => self.waiting = Wait::Head(now),
            _ => {}
        }
        loop {
            if self.pending() == 0 {
                return if self.eof { Step::Eof } else { Step::Read };
            }
            let bytes = &self.buf[self.start..self.end];
            let Some(len) = head::find_end(bytes, self.scanned) else {
                self.scanned = bytes.len();
                if let Err(refusal) = head::check_partial(bytes) {
                    self.refuse(refusal);
                    return Step::Eof;
                }
                // A head cut short by a hang-up: nobody is left to answer.
                return if self.eof { Step::Eof } else { Step::Read };
            };
            match head::check(&bytes[..len]) {
                // Blank lines before a request line are skipped (RFC 9112 §2.2).
                Ok(None) => {
                    self.start += len;
                    self.scanned = 0;
                }
                Ok(Some(BodyLength::Empty)) => {
                    self.release_head(len, BodyLength::Empty);
                    return Step::Released;
                }
                Ok(Some(body)) => {
                    self.framing = Framing::AwaitingPermit { head_len: len, body };
                    self.waiting = Wait::Permit(now);
                    return self.await_permit(cx, len, body);
                }
                Err(refusal) => {
                    self.refuse(refusal);
                    return Step::Eof;
                }
            }
        }
    }

    /// Hold a head with a body until a body permit is free.
    fn await_permit(&mut self, cx: &mut Context<'_>, head_len: usize, body: BodyLength) -> Step {
        if self.permit.is_none() {
            match self.bodies.clone().try_acquire_owned() {
                Ok(permit) => self.permit = Some(permit),
                Err(_) => {
                    let wait = self
                        .permit_wait
                        .get_or_insert_with(|| Box::pin(self.bodies.clone().acquire_owned()));
                    match wait.as_mut().poll(cx) {
                        Poll::Ready(Ok(permit)) => self.permit = Some(permit),
                        // The semaphore is never closed; if it were, no body could be read.
                        Poll::Ready(Err(_)) => {
                            self.refuse(answer::busy("request bodies cannot be received now"));
                            return Step::Eof;
                        }
                        // Meanwhile the body may arrive into the buffer.
                        Poll::Pending => return if self.eof { Step::Wait } else { Step::Read },
                    }
                    self.permit_wait = None;
                }
            }
        }
        self.release_head(head_len, body);
        Step::Released
    }

    fn release_head(&mut self, len: usize, body: BodyLength) {
        self.release = len;
        self.scanned = 0;
        let now = Instant::now();
        (self.framing, self.waiting) = match body {
            BodyLength::Empty => (Framing::Head, Wait::Nothing),
            BodyLength::Fixed(n) => (Framing::Body(n), Wait::Body(now)),
            BodyLength::Chunked => (Framing::Chunked(ChunkedTracker::default()), Wait::Body(now)),
        };
    }

    fn body_done(&mut self) {
        self.framing = Framing::Head;
        self.waiting = Wait::Nothing;
        self.permit = None;
    }

    /// End the connection with this answer.
    fn refuse(&mut self, refusal: Refusal) {
        tracing::debug!(status = %refusal.status, code = refusal.code, "request refused by the edge");
        self.refusal = Some(refusal);
        self.close(true);
    }

    /// Nothing more goes to hyper. A body permit held or awaited is given up at once: a queued wait
    /// would otherwise take the next free permit and keep it while the connection lingers.
    fn close(&mut self, linger: bool) {
        self.framing = Framing::Closed;
        self.linger = linger;
        self.permit = None;
        self.permit_wait = None;
    }

    /// Read from the client into the buffer.
    fn fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.eof {
            // Reading again would give the end of the stream again, at once, for ever.
            return Poll::Pending;
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            self.scanned = 0;
            if self.buf.len() > BUFFER && matches!(self.framing, Framing::Head) {
                // A large head has gone: give its memory back.
                self.buf = Vec::new();
            }
        }
        if self.end == self.buf.len() && self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            if self.buf.len() >= BUFFER_MAX {
                // Full (only while a finished request's successor waits): woken when it may go on.
                return Poll::Pending;
            }
            let grown = if self.buf.is_empty() {
                BUFFER
            } else {
                self.buf.len() * 2
            };
            self.buf.resize(grown.min(BUFFER_MAX), 0);
        }
        let mut read = ReadBuf::new(&mut self.buf[self.end..]);
        ready!(Pin::new(&mut self.stream).poll_read(cx, &mut read))?;
        let n = read.filled().len();
        if n == 0 {
            self.eof = true;
        }
        self.end += n;
        Poll::Ready(Ok(()))
    }

    /// Wait for the read deadline; once it passes, act on it.
    fn poll_read_deadline(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let limits = &self.limits;
        let (since, limit) = match self.waiting {
            Wait::FirstHead(since) | Wait::Head(since) => (since, limits.header_read_timeout),
            Wait::Idle(since) => (since, limits.keep_alive_timeout),
            Wait::Body(since) => (since, limits.request_body_timeout),
            Wait::Permit(since) => (since, BODY_PERMIT_WAIT),
            Wait::Nothing => return Poll::Pending,
        };
        ready!(poll_deadline(&mut self.read_timer, cx, since + limit));
        match self.waiting {
            Wait::FirstHead(_) | Wait::Head(_) if self.pending() > 0 => self.refuse(answer::too_slow(&format!(
                "the request line and headers did not arrive within {}",
                seconds(limit)
            ))),
            Wait::Permit(_) => self.refuse(answer::busy("too many request bodies are being received; retry later")),
            Wait::Body(_) => {
                self.connection.body_timed_out.store(true, Ordering::Release);
                self.close(true);
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the request body did not arrive in time",
                )));
            }
            // Nothing was said, or the connection sat idle: close without a word.
            _ => self.close(false),
        }
        self.waiting = Wait::Nothing;
        Poll::Ready(Ok(()))
    }

    /// When nothing could be written, fail the write once the response has waited too long for the
    /// client to read it.
    fn after_write(&mut self, cx: &mut Context<'_>, written: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        match written {
            Poll::Ready(result) => Poll::Ready(result),
            Poll::Pending => {
                let since = *self.writing_since.get_or_insert_with(Instant::now);
                ready!(poll_deadline(
                    &mut self.write_timer,
                    cx,
                    since + self.limits.response_write_timeout
                ));
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client did not read the response in time",
                )))
            }
        }
    }

    /// After hyper is done with the connection: write the refusal if there is one, close, and (after a
    /// refusal) read out what the client still sends for a moment, so that it gets to read the answer.
    pub(crate) async fn finish(mut self) {
        if let Some(refusal) = self.refusal.take() {
            let bytes = answer::wire(&refusal);
            let _ = tokio::time::timeout(self.limits.response_write_timeout, self.stream.write_all(&bytes)).await;
        }
        let _ = self.stream.shutdown().await;
        if self.linger && !self.eof {
            let mut scratch = [0u8; 8192];
            let mut discarded = 0;
            let _ = tokio::time::timeout(LINGER, async {
                while discarded < LINGER_BYTES {
                    match self.stream.read(&mut scratch).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => discarded += n,
                    }
                }
            })
            .await;
        }
    }
}

/// Poll `timer` for `deadline`, resetting it only when the deadline changed.
fn poll_deadline(timer: &mut Pin<Box<Sleep>>, cx: &mut Context<'_>, deadline: Instant) -> Poll<()> {
    let deadline = tokio::time::Instant::from_std(deadline);
    if timer.deadline() != deadline {
        timer.as_mut().reset(deadline);
    }
    timer.as_mut().poll(cx)
}

fn seconds(limit: Duration) -> String {
    format!("{} s", limit.as_secs_f64())
}

impl hyper::rt::Read for Front {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, mut out: ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.release > 0 {
                let n = this.release.min(out.remaining());
                out.put_slice(&this.buf[this.start..this.start + n]);
                this.start += n;
                this.release -= n;
                return Poll::Ready(Ok(()));
            }
            match this.next_release(cx) {
                Step::Released => continue,
                Step::Eof => return Poll::Ready(Ok(())),
                // Nothing to read (the buffer is full, or the client has closed its side): the deadline
                // still runs.
                Step::Wait => {}
                Step::Read => match this.fill(cx) {
                    Poll::Ready(Ok(())) => continue,
                    Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                    Poll::Pending => {}
                },
            }
            ready!(this.poll_read_deadline(cx))?;
        }
    }
}

impl hyper::rt::Write for Front {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.writing_since.get_or_insert_with(Instant::now);
        let written = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.after_write(cx, written)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.writing_since.get_or_insert_with(Instant::now);
        let written = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.after_write(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    /// hyper flushes once its buffer is empty: the response is out, the next request may go on.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(Pin::new(&mut this.stream).poll_flush(cx))?;
        if this.writing_since.take().is_some() {
            this.connection.wake_reader();
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
