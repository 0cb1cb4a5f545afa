//! The edge in-process, with raw TCP clients: what it does at its caps, to a panicking handler, to
//! pipelined and unread responses, and at shutdown. (`crates/herald/tests/edge.rs` drives the real
//! binaries: timeouts, malformed heads, a low file-descriptor limit, memory.)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::{get, post};
use herald_edge::{Edge, EdgeConfig, Limits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, oneshot};

/// A served router and what stops it.
struct Served {
    addr: std::net::SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Served {
    async fn start(router: Router, limits: Limits) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let done = tokio::spawn(Edge::new(limits).serve(listener, router, async move {
            let _ = stopped.await;
        }));
        Self {
            addr,
            stop: Some(stop),
            done,
        }
    }

    async fn connect(&self) -> TcpStream {
        TcpStream::connect(self.addr).await.expect("connect")
    }

    async fn shutdown(mut self) -> Duration {
        let started = Instant::now();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(40), &mut self.done)
            .await
            .expect("the server stops")
            .expect("task")
            .expect("serve");
        started.elapsed()
    }
}

fn limits(edit: impl FnOnce(&mut EdgeConfig)) -> Limits {
    let mut config = EdgeConfig::default();
    edit(&mut config);
    config.limits().expect("limits")
}

/// Read one response (status line, headers, a `content-length` body); `None` at the end of the stream.
async fn read_response(stream: &mut TcpStream) -> Option<(u16, String)> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match tokio::time::timeout(Duration::from_secs(20), stream.read(&mut byte)).await {
            Ok(Ok(1)) => head.push(byte[0]),
            _ => return None,
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let status = head.get(9..12)?.parse().ok()?;
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(str::to_owned)
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.ok()?;
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Whether the server closed the stream (reading gives its end or a reset), waiting up to `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut scratch = [0u8; 65536];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut scratch)).await {
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// Read until the stream ends (or `within` passes): how many bytes came, and whether it ended.
async fn drain(stream: &mut TcpStream, within: Duration) -> (usize, bool) {
    let mut scratch = vec![0u8; 1 << 20];
    let mut received = 0;
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut scratch)).await {
            Ok(Ok(0) | Err(_)) => return (received, true),
            Ok(Ok(n)) => received += n,
            Err(_) => return (received, false),
        }
    }
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body}"))
}

#[tokio::test]
async fn a_panicking_handler_is_answered_500_json() {
    let router = Router::new().route(
        "/boom",
        get(|| async {
            if true {
                panic!("handler bug");
            }
            "unreachable"
        }),
    );
    let served = Served::start(router, Limits::default()).await;
    let mut stream = served.connect().await;
    stream
        .write_all(b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (status, body) = read_response(&mut stream).await.expect("a response");
    assert_eq!(status, 500);
    assert_eq!(json(&body)["code"], "internal_error");
    // The server goes on serving.
    let mut again = served.connect().await;
    again.write_all(b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    assert_eq!(read_response(&mut again).await.expect("a response").0, 500);
}

/// A router whose `/hold` requests wait until released, counting those in progress.
fn holding_router(release: Arc<Notify>, holding: Arc<AtomicUsize>) -> Router {
    Router::new()
        .route(
            "/hold",
            get(move || {
                let release = release.clone();
                let holding = holding.clone();
                async move {
                    holding.fetch_add(1, Ordering::SeqCst);
                    release.notified().await;
                    "done"
                }
            }),
        )
        .route("/ok", get(|| async { "ok" }))
        .route(
            "/upload",
            post(|body: axum::body::Bytes| async move { body.len().to_string() }),
        )
}

async fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn at_the_cap_idle_connections_make_room_and_busy_ones_do_not() {
    let release = Arc::new(Notify::new());
    let holding = Arc::new(AtomicUsize::new(0));
    let served = Served::start(
        holding_router(release.clone(), holding.clone()),
        limits(|c| c.max_connections = 4),
    )
    .await;
    // Four silent sockets fill the cap; a client still gets in, and the oldest silent one goes.
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(served.connect().await);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut client = served.connect().await;
    client.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    assert_eq!(read_response(&mut client).await.expect("answered").0, 200);
    assert!(
        closed_within(&mut silent[0], Duration::from_secs(10)).await,
        "the oldest idle connection was closed"
    );
    // Four requests in progress fill it with busy connections: a newcomer is refused with 503 JSON.
    drop(silent);
    drop(client);
    let mut busy = Vec::new();
    for _ in 0..4 {
        let mut stream = served.connect().await;
        stream
            .write_all(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        busy.push(stream);
    }
    wait_until("four requests are held", || holding.load(Ordering::SeqCst) == 4).await;
    let mut refused = served.connect().await;
    let (status, body) = read_response(&mut refused).await.expect("a 503");
    assert_eq!(status, 503);
    assert_eq!(json(&body)["code"], "server_busy");
    // Released, they all finish.
    release.notify_waiters();
    for stream in &mut busy {
        assert_eq!(read_response(stream).await.expect("answered").0, 200);
    }
}

#[tokio::test]
async fn a_body_over_the_cap_of_bodies_waits_then_gets_503() {
    let served = Served::start(
        holding_router(Arc::new(Notify::new()), Arc::new(AtomicUsize::new(0))),
        limits(|c| c.max_request_bodies = 1),
    )
    .await;
    // The one permit: a body that is still arriving.
    let mut slow = served.connect().await;
    slow.write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A second body waits for it about a second, then is refused.
    let mut second = served.connect().await;
    let started = Instant::now();
    second
        .write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nxyz")
        .await
        .unwrap();
    let (status, body) = read_response(&mut second).await.expect("a 503");
    assert_eq!(status, 503, "{body}");
    assert_eq!(json(&body)["code"], "server_busy");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    // The first body completes; its permit returns, and the next body goes through.
    slow.write_all(b"defghij").await.unwrap();
    assert_eq!(
        read_response(&mut slow).await.expect("answered"),
        (200, "10".to_owned())
    );
    let mut third = served.connect().await;
    third
        .write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nxyz")
        .await
        .unwrap();
    assert_eq!(
        read_response(&mut third).await.expect("answered"),
        (200, "3".to_owned())
    );
}

#[tokio::test]
async fn chunked_and_pipelined_requests_are_framed_like_hyper_frames_them() {
    let served = Served::start(
        holding_router(Arc::new(Notify::new()), Arc::new(AtomicUsize::new(0))),
        Limits::default(),
    )
    .await;
    let mut stream = served.connect().await;
    stream
        .write_all(
            b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
              5\r\nhello\r\n6;x=y\r\n world\r\n0\r\nTrailer-A: 1\r\n\r\n\
              \r\n\
              POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nabcd\
              GET /ok HTTP/1.1\r\nHost: x\r\n\r\n\
              GET /ok HTTP/1.1\r\nContent-Length: zz\r\n\r\n",
        )
        .await
        .unwrap();
    assert_eq!(read_response(&mut stream).await, Some((200, "11".to_owned())));
    assert_eq!(read_response(&mut stream).await, Some((200, "4".to_owned())));
    assert_eq!(read_response(&mut stream).await, Some((200, "ok".to_owned())));
    let (status, body) = read_response(&mut stream).await.expect("the bad head answered");
    assert_eq!(status, 400);
    assert_eq!(json(&body)["code"], "invalid_content_length");
    assert!(closed_within(&mut stream, Duration::from_secs(10)).await);
}

#[tokio::test]
async fn heads_over_the_limit_are_refused_431_whatever_their_size() {
    let served = Served::start(Router::new().route("/ok", get(|| async { "ok" })), Limits::default()).await;
    for size in [
        herald_edge::head::MAX_HEAD_BYTES,
        herald_edge::head::MAX_HEAD_BYTES + 1000,
        100_000,
    ] {
        let mut stream = served.connect().await;
        let request = format!("GET /ok HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "b".repeat(size));
        let _ = stream.write_all(request.as_bytes()).await;
        let (status, body) = read_response(&mut stream).await.expect("an answer");
        assert_eq!(
            (status, json(&body)["code"].clone()),
            (431, "headers_too_large".into()),
            "{size}"
        );
    }
    // Just under the limit, the same head is served.
    let mut stream = served.connect().await;
    let pad = herald_edge::head::MAX_HEAD_BYTES - 100;
    let request = format!("GET /ok HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "b".repeat(pad));
    stream.write_all(request.as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut stream).await, Some((200, "ok".to_owned())));
}

#[tokio::test]
async fn a_client_that_does_not_read_gets_no_further_request_handled() {
    let handled = Arc::new(AtomicUsize::new(0));
    let counter = handled.clone();
    let router = Router::new().route(
        "/big",
        get(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            async { vec![b'x'; 8 * 1024 * 1024] }
        }),
    );
    let served = Served::start(router, Limits::default()).await;
    let stream = served.connect().await;
    socket2::SockRef::from(&stream).set_recv_buffer_size(64 * 1024).unwrap();
    let mut stream = stream;
    let request = b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n".repeat(50);
    stream.write_all(&request).await.unwrap();
    wait_until("the first request is handled", || handled.load(Ordering::SeqCst) >= 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // One answer is being written, out of the socket buffers' reach: the next request waits for it.
    assert_eq!(handled.load(Ordering::SeqCst), 1);
    // Reading, the client gets every answer in turn.
    for _ in 0..3 {
        assert_eq!(read_response(&mut stream).await.expect("answered").0, 200);
    }
    assert!(handled.load(Ordering::SeqCst) >= 3);
}

#[tokio::test]
async fn unread_responses_past_their_budget_close_the_longest_held() {
    let router = Router::new().route("/big", get(|| async { vec![b'x'; 8 * 1024 * 1024] }));
    let served = Served::start(router, limits(|c| c.max_unread_response_bytes = 10 * 1024 * 1024)).await;
    let mut readers = Vec::new();
    for _ in 0..6 {
        let stream = served.connect().await;
        socket2::SockRef::from(&stream).set_recv_buffer_size(64 * 1024).unwrap();
        let mut stream = stream;
        stream.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        readers.push(stream);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // 48 MiB of answers against a 10 MiB budget: the first ones, unread longest, were closed (their
    // client gets what the kernel had already taken, then the end); the last one is whole.
    let mut first = readers.remove(0);
    let (received, ended) = drain(&mut first, Duration::from_secs(30)).await;
    assert!(ended, "the first connection was closed (got {received} bytes)");
    assert!(received < 8 * 1024 * 1024, "its answer was cut short: {received} bytes");
    let mut last = readers.pop().expect("last");
    let (status, body) = read_response(&mut last).await.expect("the newest answer is kept");
    assert_eq!((status, body.len()), (200, 8 * 1024 * 1024));
}

#[tokio::test]
async fn shutdown_finishes_requests_in_progress_and_closes_idle_connections() {
    let release = Arc::new(Notify::new());
    let holding = Arc::new(AtomicUsize::new(0));
    let served = Served::start(holding_router(release.clone(), holding.clone()), Limits::default()).await;
    let mut idle = served.connect().await;
    let mut busy = served.connect().await;
    busy.write_all(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    wait_until("the request is held", || holding.load(Ordering::SeqCst) == 1).await;
    let releaser = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        release.notify_waiters();
    });
    let took = served.shutdown().await;
    releaser.await.unwrap();
    assert!(took < Duration::from_secs(20), "{took:?}");
    assert_eq!(read_response(&mut busy).await.expect("finished").0, 200);
    assert!(closed_within(&mut idle, Duration::from_secs(1)).await);
}
