//! The HTTP edge of the real binaries, from raw sockets: malformed heads answered as JSON with their
//! status, idle, slowloris, slow-body and non-reading connections closed within the configured times,
//! a client still answered while thousands of idle sockets are opened under a low file-descriptor
//! limit, and memory bounded with non-reading pipelining clients — for `herald serve` and `herald inbox`.
//!
//! Times are short here (1–2 s) and every bound is generous: the assertions say "closed, and not before
//! the timeout could have passed", never "closed at exactly".

use crate::common;

use std::time::{Duration, Instant};

use common::{Herald, LAUNCHER, TOKEN};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Short timeouts, so that the tests wait seconds.
const SHORT: [(&str, &str); 4] = [
    ("HERALD_HEADER_READ_TIMEOUT", "1s"),
    ("HERALD_KEEP_ALIVE_TIMEOUT", "1s"),
    ("HERALD_REQUEST_BODY_TIMEOUT", "1s"),
    ("HERALD_RESPONSE_WRITE_TIMEOUT", "2s"),
];
/// However loaded the machine, a timeout of 1–2 s has acted by then.
const CLOSED_WITHIN: Duration = Duration::from_secs(15);

const INBOX: &str = "[[source]]\nname = \"acme\"\nscheme = \"standard-webhooks\"\n\
                     secrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]\nforward_to = \"http://127.0.0.1:9/hook\"\n";

/// A response read off a raw socket.
#[derive(Debug)]
struct Answer {
    status: u16,
    content_type: String,
    body: Value,
}

/// Send `request` on a fresh connection and read the answer up to the end of the stream (the edge
/// closes the connection after each refusal; well-formed test requests say `Connection: close`).
async fn send_raw(addr: std::net::SocketAddr, request: &[u8]) -> Answer {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    // The server may answer (and close) before the whole request is written: that is the point.
    let _ = stream.write_all(request).await;
    let mut bytes = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut bytes)).await;
    parse(&bytes).unwrap_or_else(|| panic!("no HTTP answer: {:?}", String::from_utf8_lossy(&bytes)))
}

/// The first response in `bytes`.
fn parse(bytes: &[u8]) -> Option<Answer> {
    let text = String::from_utf8_lossy(bytes);
    let (head, rest) = text.split_once("\r\n\r\n")?;
    let status = head.get(9..12)?.parse().ok()?;
    let header = |name: &str| {
        head.lines()
            .find_map(|line| {
                let (key, value) = line.split_once(':')?;
                key.eq_ignore_ascii_case(name).then(|| value.trim().to_owned())
            })
            .unwrap_or_default()
    };
    let length: usize = header("content-length").parse().unwrap_or(rest.len());
    let body = rest.get(..length).unwrap_or(rest);
    Some(Answer {
        status,
        content_type: header("content-type"),
        body: serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned())),
    })
}

/// The malformed requests of issue 13 and their neighbours, with the status and code each must get.
fn malformed() -> Vec<(&'static str, Vec<u8>, u16, &'static str)> {
    let long_path = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(100_000));
    let many_headers = format!(
        "GET /api/v1/health HTTP/1.1\r\nHost: x\r\n{}\r\n",
        "X-Pad: 1\r\n".repeat(2000)
    );
    let big_header = format!(
        "GET /api/v1/health HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "b".repeat(40_000)
    );
    vec![
        ("a 100 KB path", long_path.into_bytes(), 414, "uri_too_long"),
        ("2,000 headers", many_headers.into_bytes(), 431, "too_many_headers"),
        ("a 40 KB header", big_header.into_bytes(), 431, "headers_too_large"),
        (
            "Content-Length: -5",
            b"POST /api/v1/app HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n".to_vec(),
            400,
            "invalid_content_length",
        ),
        (
            "two different Content-Lengths",
            b"POST /api/v1/app HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}".to_vec(),
            400,
            "invalid_content_length",
        ),
        (
            "Transfer-Encoding with Content-Length",
            b"POST /api/v1/app HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n{}"
                .to_vec(),
            400,
            "invalid_transfer_encoding",
        ),
        (
            "invalid UTF-8 in the path",
            b"GET /api/v1/\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            400,
            "invalid_request_target",
        ),
        (
            "a space in the path",
            b"GET /api/v1/a b HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            400,
            "malformed_request",
        ),
        (
            "a broken header line",
            b"GET /api/v1/health HTTP/1.1\r\nNo colon here\r\n\r\n".to_vec(),
            400,
            "malformed_request",
        ),
        (
            "HTTP/2 prior knowledge",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(),
            505,
            "http_version_not_supported",
        ),
    ]
}

/// Every malformed request gets JSON `{code, detail}` with its status; the server answers normally after
/// (a `GET` of `alive`, which it serves).
async fn assert_malformed_requests_get_json(addr: std::net::SocketAddr, alive: &str) {
    for (what, request, status, code) in malformed() {
        let answer = send_raw(addr, &request).await;
        assert_eq!(answer.status, status, "{what}: {answer:?}");
        assert!(
            answer.content_type.starts_with("application/json"),
            "{what}: {answer:?}"
        );
        assert_eq!(answer.body["code"], code, "{what}: {answer:?}");
        assert!(
            answer.body["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{what}: {answer:?}"
        );
    }
    let request = format!("GET {alive} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let health = send_raw(addr, request.as_bytes()).await;
    assert_eq!(health.status, 200, "{alive}: {health:?}");
}

#[tokio::test]
async fn malformed_http_is_answered_json_with_its_status_by_the_sender_and_the_inbox() {
    let sender = Herald::start(&[]).await;
    assert_malformed_requests_get_json(sender.addr, "/api/v1/health").await;
    let inbox = Herald::start_inbox(INBOX, &[], None).await;
    assert_malformed_requests_get_json(inbox.addr, "/api/v1/health").await;
}

/// A metrics listener served by the edge: JSON for malformed requests and unknown routes, a flood of idle
/// sockets held to its small cap while a scrape is still answered, and (`short`: with 1 s timeouts) a
/// silent connection closed.
async fn assert_metrics_listener_is_edged(metrics: std::net::SocketAddr, short: bool) {
    assert_malformed_requests_get_json(metrics, "/metrics").await;
    for (request, status, code) in [
        (
            &b"GET /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"[..],
            404,
            "not_found",
        ),
        (
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            405,
            "method_not_allowed",
        ),
    ] {
        let answer = send_raw(metrics, request).await;
        assert_eq!(
            (answer.status, answer.body["code"].as_str()),
            (status, Some(code)),
            "{answer:?}"
        );
    }
    if short {
        let mut silent = TcpStream::connect(metrics).await.expect("connect");
        assert!(read_all(&mut silent).await.is_empty());
    }
    let mut idle = Vec::new();
    for _ in 0..100 {
        idle.push(TcpStream::connect(metrics).await.expect("connect"));
    }
    let answer = send_raw(
        metrics,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let clients: Vec<std::net::SocketAddr> = idle.iter().map(|s| s.local_addr().expect("addr")).collect();
    let held = held_by_server(metrics, &clients);
    assert!(held <= 16, "the metrics listener holds {held} idle connections");
}

/// A loopback address nothing listens on right now.
fn free_addr() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], common::free_port()))
}

/// `herald serve`'s tokenless metrics listener (`HERALD_METRICS_LISTEN`) and `herald relay
/// --metrics-listen` are ports of Herald's too: before, they were served by plain `axum::serve`, so a silent
/// socket there stayed open for ever (any number of them, taking the process's descriptors from the API)
/// and malformed requests got hyper's empty bodies.
#[tokio::test]
async fn the_metrics_listeners_have_the_edges_timeouts_cap_and_json_errors() {
    let metrics = free_addr();
    let listen = metrics.to_string();
    let mut env = SHORT.to_vec();
    env.push(("HERALD_METRICS_LISTEN", listen.as_str()));
    let sender = Herald::start(&env).await;
    assert_metrics_listener_is_edged(metrics, true).await;
    assert_eq!(sender.call("GET", "/health", None).await.0, 200);

    let producer = common::producer::Producer::sqlite().await;
    let relay_metrics = free_addr().to_string();
    let relay = common::producer::RelayProcess::start(
        &producer,
        &format!("http://{}", sender.addr),
        &["--metrics-listen", relay_metrics.as_str()],
    );
    // Its listener is bound before the relay starts.
    relay.wait_log("relay started", Duration::from_secs(20)).await;
    assert_metrics_listener_is_edged(relay_metrics.parse().expect("address"), false).await;
}

/// The server's open sockets (the listener included), from /proc.
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("socket:")))
                .count()
        })
        .unwrap_or(0)
}

/// How /proc/net/tcp writes an IPv4 address (on a little-endian host).
fn proc_net_form(addr: std::net::SocketAddr) -> String {
    let std::net::IpAddr::V4(ip) = addr.ip() else {
        panic!("IPv4 only: {addr}");
    };
    format!("{:08X}:{:04X}", u32::from_le_bytes(ip.octets()), addr.port())
}

/// Which of these client connections the server still holds open (its end ESTABLISHED, or CLOSE_WAIT:
/// the client left and the server has not closed yet), from the kernel's table.
fn held_by_server(server: std::net::SocketAddr, clients: &[std::net::SocketAddr]) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let local = proc_net_form(server);
    let remotes: std::collections::HashSet<String> = clients.iter().map(|c| proc_net_form(*c)).collect();
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() > 3 && fields[1] == local && remotes.contains(fields[2]) && matches!(fields[3], "01" | "08")
        })
        .count()
}

/// Wait until the server holds none of these client connections; how long that took.
async fn server_closed(server: std::net::SocketAddr, clients: &[std::net::SocketAddr], what: &str) -> Duration {
    let started = Instant::now();
    loop {
        let held = held_by_server(server, clients);
        if held == 0 {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < CLOSED_WITHIN,
            "{what}: the server still holds {held} of them"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether the response head at the start of `bytes` says `connection: close`.
fn says_close(bytes: &[u8]) -> bool {
    let text = String::from_utf8_lossy(bytes);
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    head.lines().any(|line| {
        line.split_once(':').is_some_and(|(key, value)| {
            key.eq_ignore_ascii_case("connection") && value.trim().eq_ignore_ascii_case("close")
        })
    })
}

#[tokio::test]
async fn an_answer_given_before_the_body_was_read_closes_the_connection_and_says_so() {
    let herald = Herald::start(&[]).await;
    // Refused on its head (no token) while most of its body is still to come: the answer says
    // `connection: close`, and the connection ends after it — the rest of the body is never taken for
    // a next request.
    let mut stream = TcpStream::connect(herald.addr).await.expect("connect");
    let head =
        b"POST /api/v1/app HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n";
    stream.write_all(head).await.expect("write head");
    stream.write_all(&[b' '; 1000]).await.expect("write some body");
    let bytes = read_all(&mut stream).await;
    assert_eq!(
        parse(&bytes).expect("an answer").status,
        401,
        "{:?}",
        String::from_utf8_lossy(&bytes)
    );
    assert!(says_close(&bytes), "{:?}", String::from_utf8_lossy(&bytes));

    // A request whose body was read keeps its connection: a second request on it is answered.
    let mut stream = TcpStream::connect(herald.addr).await.expect("connect");
    let body = json!({"name": "Kept"}).to_string();
    let create = format!(
        "POST /api/v1/app HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(create.as_bytes()).await.expect("write create");
    let mut first = vec![0u8; 4096];
    let n = tokio::time::timeout(CLOSED_WITHIN, stream.read(&mut first))
        .await
        .expect("an answer in time")
        .expect("read");
    let first = &first[..n];
    assert_eq!(
        parse(first).expect("an answer").status,
        201,
        "{:?}",
        String::from_utf8_lossy(first)
    );
    assert!(!says_close(first), "{:?}", String::from_utf8_lossy(first));
    stream
        .write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("write the second request");
    let second = read_all(&mut stream).await;
    assert_eq!(
        parse(&second).expect("a second answer").status,
        200,
        "{:?}",
        String::from_utf8_lossy(&second)
    );
}

/// An authorised request to `path` whose `Content-Length` (100 MB) is over the body limit, most of it
/// never sent: the answer is a 413 JSON on the head alone (before the body timeout could act), says
/// `connection: close`, and the connection ends after it.
async fn assert_a_body_declared_over_the_limit_is_refused_at_once(herald: &Herald, path: &str) {
    let mut stream = TcpStream::connect(herald.addr).await.expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: 100000000\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("write head");
    stream
        .write_all(b"{\"name\": ")
        .await
        .expect("write the start of the body");
    let bytes = read_all(&mut stream).await;
    let answer = parse(&bytes).expect("an answer");
    assert_eq!(answer.status, 413, "{path}: {:?}", String::from_utf8_lossy(&bytes));
    assert!(answer.content_type.starts_with("application/json"), "{answer:?}");
    assert_eq!(answer.body["code"], "payload_too_large", "{answer:?}");
    assert!(says_close(&bytes), "{:?}", String::from_utf8_lossy(&bytes));
}

#[tokio::test]
async fn a_body_declared_over_the_limit_is_refused_413_at_once_without_being_read() {
    let sender = Herald::start(&[]).await;
    assert_a_body_declared_over_the_limit_is_refused_at_once(&sender, "/api/v1/app").await;
    let inbox = Herald::start_inbox(INBOX, &[], None).await;
    assert_a_body_declared_over_the_limit_is_refused_at_once(&inbox, "/in/acme").await;
}

/// A connection with a request in progress on it: the head of a POST to `path` sent, with one byte of
/// its 100-byte body.
async fn busy_connection(herald: &Herald, path: &str) -> TcpStream {
    let mut stream = TcpStream::connect(herald.addr).await.expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
    );
    stream.write_all(head.as_bytes()).await.expect("write head");
    stream
}

/// With every one of its connections (2 here) busy with a request, a newcomer is answered
/// `503 server_busy` in JSON with `Retry-After`, and the server answers again once they are gone.
async fn assert_overload_is_answered_json(herald: &Herald, path: &str) {
    let health = b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    // A connection whose head the server has not read yet is idle to it, and is closed to admit a
    // newcomer: so until a newcomer is refused, both are opened again, and given a moment.
    let deadline = Instant::now() + CLOSED_WITHIN;
    let mut held;
    let refused = loop {
        held = [busy_connection(herald, path).await, busy_connection(herald, path).await];
        tokio::time::sleep(Duration::from_millis(100)).await;
        let answer = send_raw(herald.addr, health).await;
        if answer.status != 200 || Instant::now() > deadline {
            break answer;
        }
    };
    assert_eq!(
        (refused.status, refused.body["code"].as_str()),
        (503, Some("server_busy")),
        "{path}: {refused:?}"
    );
    assert!(refused.content_type.starts_with("application/json"), "{refused:?}");
    assert!(
        refused.body["detail"].as_str().is_some_and(|d| !d.is_empty()),
        "{refused:?}"
    );
    drop(held);
    let deadline = Instant::now() + CLOSED_WITHIN;
    loop {
        let answer = send_raw(herald.addr, health).await;
        if answer.status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{path}: still refused after the busy connections left: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn overload_is_answered_503_server_busy_json_by_the_sender_and_the_inbox() {
    let cap = [("HERALD_MAX_CONNECTIONS", "2")];
    let sender = Herald::start(&cap).await;
    assert_overload_is_answered_json(&sender, "/api/v1/app").await;
    let inbox = Herald::start_inbox(INBOX, &cap, None).await;
    assert_overload_is_answered_json(&inbox, "/in/acme").await;
}

/// Read until the stream ends; what was read (the connection is known to close).
async fn read_all(stream: &mut TcpStream) -> Vec<u8> {
    let mut bytes = Vec::new();
    let read = tokio::time::timeout(CLOSED_WITHIN, stream.read_to_end(&mut bytes)).await;
    assert!(
        read.is_ok(),
        "the server did not close the connection: {:?}",
        String::from_utf8_lossy(&bytes)
    );
    bytes
}

/// Write `bytes` one by one, `every` apart, until the server stops taking them.
fn trickle(mut writer: tokio::net::tcp::OwnedWriteHalf, bytes: Vec<u8>, every: Duration) {
    tokio::spawn(async move {
        for byte in bytes {
            if writer.write_all(&[byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(every).await;
        }
    });
}

/// Idle, kept-alive, slowloris and slow-body connections, each closed within its timeout (1 s here).
async fn assert_slow_clients_are_closed(herald: &Herald, request_path: &str) {
    // Silent: closed without a word.
    let started = Instant::now();
    let mut silent = TcpStream::connect(herald.addr).await.expect("connect");
    assert!(read_all(&mut silent).await.is_empty());
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "closed too soon: {:?}",
        started.elapsed()
    );

    // Kept alive after a request, then idle: closed. (Timed from the request: the server's idle time
    // starts once its answer is out, however late this client reads it.)
    let mut kept = TcpStream::connect(herald.addr).await.expect("connect");
    let asked = Instant::now();
    kept.write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut first = vec![0u8; 4096];
    let n = kept.read(&mut first).await.unwrap();
    assert_eq!(parse(&first[..n]).expect("answer").status, 200);
    assert!(read_all(&mut kept).await.is_empty());
    assert!(asked.elapsed() >= Duration::from_millis(900), "{:?}", asked.elapsed());

    // Slowloris: one header byte every 300 ms — 408 JSON, then closed.
    let started = Instant::now();
    let stream = TcpStream::connect(herald.addr).await.expect("connect");
    let (mut reader, writer) = stream.into_split();
    let head = format!(
        "GET {request_path} HTTP/1.1\r\nHost: x\r\nX-Slow: {}\r\n\r\n",
        "s".repeat(100)
    );
    trickle(writer, head.into_bytes(), Duration::from_millis(300));
    let mut bytes = Vec::new();
    let read = tokio::time::timeout(CLOSED_WITHIN, reader.read_to_end(&mut bytes)).await;
    assert!(read.is_ok(), "slowloris connection still open");
    let answer = parse(&bytes).expect("a 408");
    assert_eq!(
        (answer.status, answer.body["code"].as_str()),
        (408, Some("request_timeout")),
        "{answer:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );

    // A body of 1,000 bytes sent one byte every 300 ms: 408 JSON, then closed.
    let started = Instant::now();
    let stream = TcpStream::connect(herald.addr).await.expect("connect");
    let (mut reader, mut writer) = stream.into_split();
    writer
        .write_all(
            format!(
                "POST {request_path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
                 Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    trickle(writer, vec![b' '; 999], Duration::from_millis(300));
    let mut bytes = Vec::new();
    let read = tokio::time::timeout(CLOSED_WITHIN, reader.read_to_end(&mut bytes)).await;
    assert!(read.is_ok(), "slow-body connection still open");
    let answer = parse(&bytes).expect("a 408");
    assert_eq!(
        (answer.status, answer.body["code"].as_str()),
        (408, Some("request_timeout")),
        "{answer:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn idle_slowloris_and_slow_body_connections_are_closed_in_time_by_the_sender_and_the_inbox() {
    let sender = Herald::start(&SHORT).await;
    assert_slow_clients_are_closed(&sender, "/api/v1/app").await;
    let inbox = Herald::start_inbox(INBOX, &SHORT, None).await;
    assert_slow_clients_are_closed(&inbox, "/in/acme").await;
}

/// An application with `messages` messages of about `payload_bytes` each: its message listing is a large
/// answer. Returns the request that lists them.
async fn large_listing(herald: &Herald, messages: usize, payload_bytes: usize) -> Vec<u8> {
    let app = herald.app("listing").await;
    for i in 0..messages {
        herald
            .post(
                &format!("/app/{app}/msg"),
                json!({"eventType": "big", "payload": {"i": i, "blob": "z".repeat(payload_bytes)}}),
            )
            .await;
    }
    format!("GET /api/v1/app/{app}/msg?limit={messages} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n")
        .into_bytes()
}

/// A connection that sends `request` `times` over at once and never reads (with a small receive
/// buffer, so that the kernel takes little of the answers off the server's hands).
async fn non_reader(addr: std::net::SocketAddr, request: &[u8], times: usize) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(16 * 1024).expect("rcvbuf");
    let mut stream = socket.connect(addr).await.expect("connect");
    let _ = stream.write_all(&request.repeat(times)).await;
    stream
}

#[tokio::test]
async fn a_client_that_does_not_read_is_closed_after_the_write_timeout() {
    let herald = Herald::start(&SHORT).await;
    let listing = large_listing(&herald, 20, 100_000).await;
    let started = Instant::now();
    let unread = non_reader(herald.addr, &listing, 20).await;
    let client = unread.local_addr().expect("addr");
    assert_eq!(held_by_server(herald.addr, &[client]), 1);
    server_closed(herald.addr, &[client], "a client that does not read").await;
    // The answers the kernel could take were written at once; the connection went when the one after
    // had waited 2 s to be read.
    assert!(
        started.elapsed() >= Duration::from_millis(1800),
        "closed after {:?}",
        started.elapsed()
    );
}

/// The process's resident memory, in MiB.
fn rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib / 1024)
}

#[tokio::test]
async fn memory_stays_bounded_with_non_reading_pipelining_clients() {
    // 200 clients each pipelining 20 listings of ~2 MB and reading none: held in memory, their answers
    // would take 400 MB (the issue saw 22 → 450 MB). The unread-answer budget here is 16 MiB; what it
    // bounds is counted until hyper drops each answer, so the growth is the budget (its allocations up
    // to twice their length) plus the listings being built: 55-65 MiB measured. Counting only what the
    // socket had not taken let it grow by 140-200 MiB (a partly written answer stays whole in memory).
    let mut herald = Herald::start(&[("HERALD_MAX_UNREAD_RESPONSE_BYTES", "16777216")]).await;
    let listing = large_listing(&herald, 20, 100_000).await;
    let pid = herald.pid();
    let before = rss_mib(pid);
    let mut clients = Vec::new();
    let mut peak = before;
    for _ in 0..200 {
        clients.push(non_reader(herald.addr, &listing, 20).await);
        peak = peak.max(rss_mib(pid));
    }
    let watch_until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < watch_until {
        peak = peak.max(rss_mib(pid));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        peak.saturating_sub(before) < 120,
        "resident memory grew from {before} MiB to {peak} MiB"
    );
    // Meanwhile others are served.
    let (status, _) = herald.call("GET", "/app?limit=1", None).await;
    assert_eq!(status, 200);
    let addrs: Vec<std::net::SocketAddr> = clients.iter().filter_map(|c| c.local_addr().ok()).collect();
    drop(clients);
    server_closed(herald.addr, &addrs, "the non-reading clients, gone").await;
    assert!(herald.is_running(), "the server survived");
}

/// Raise this process's own open-file limit (the test opens thousands of sockets); the limit got.
fn raise_own_file_limit() -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    const WANTED: u64 = 65_536;
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_some_and(|current| current < WANTED) {
        // Root may raise the hard limit too; anyone may raise the soft one up to the hard one.
        let raised = Rlimit {
            current: Some(WANTED),
            maximum: Some(limit.maximum.map_or(WANTED, |max| max.max(WANTED))),
        };
        if setrlimit(Resource::Nofile, raised).is_err() {
            let soft_to_hard = Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            };
            let _ = setrlimit(Resource::Nofile, soft_to_hard);
        }
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// Under `prlimit --nofile=1024`, thousands of silent sockets opened as fast as the machine allows while a
/// well-behaved client (kept-alive and fresh connections) asks `GET {path}`: every request is answered,
/// and the server never holds `max_sockets` sockets or more.
async fn assert_answered_under_a_descriptor_flood(mut herald: Herald, path: &str, max_sockets: usize) {
    let own_limit = raise_own_file_limit();
    let flood = usize::try_from(own_limit.saturating_sub(200).min(3000)).unwrap_or(3000);
    assert!(
        flood >= 1500,
        "this test needs an open-file limit of 1,700 or more (it has {own_limit})"
    );
    let pid = herald.pid();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap_or_default();
    assert!(
        limits
            .lines()
            .any(|l| l.starts_with("Max open files") && l.contains(" 1024 ")),
        "{limits}"
    );
    let addr = herald.addr;
    // Thousands of sockets that never send a byte, opened as fast as the machine allows.
    let opener = tokio::spawn(async move {
        let mut idle = Vec::with_capacity(flood);
        for _ in 0..flood {
            if let Ok(stream) = TcpStream::connect(addr).await {
                idle.push(stream);
            }
        }
        idle
    });
    // A well-behaved client meanwhile: a kept-alive connection and fresh ones, each request answered.
    let kept_alive = reqwest::Client::builder().no_proxy().build().expect("client");
    let fresh = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    let mut answered = 0;
    let mut peak_sockets = 0;
    while !opener.is_finished() || answered < 20 {
        for client in [&kept_alive, &fresh] {
            let response = client
                .get(format!("http://{addr}{path}"))
                .bearer_auth(TOKEN)
                .send()
                .await
                .expect("the well-behaved client is answered");
            assert_eq!(response.status(), 200, "{path}");
            answered += 1;
        }
        peak_sockets = peak_sockets.max(sockets(pid));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let idle = opener.await.expect("opener");
    assert!(idle.len() > 1000, "only {} sockets opened", idle.len());
    assert!(peak_sockets < max_sockets, "the server held {peak_sockets} sockets");
    assert!(herald.is_running(), "the server survived");
    drop(idle);
}

#[tokio::test]
async fn under_a_1024_descriptor_limit_clients_are_answered_while_thousands_of_idle_sockets_arrive() {
    let prlimit = [(LAUNCHER, "prlimit --nofile=1024:1024")];
    // The cap keeps the sender's sockets well below its limit (1,024 descriptors, 512 + 64 kept for
    // deliveries and the database, 64 + 32 for the process and closing sockets: 352 connections).
    let sender = Herald::start(&prlimit).await;
    assert_answered_under_a_descriptor_flood(sender, "/api/v1/app?limit=1", 600).await;
    // The inbox keeps its forwards' share (16 + 64): 848 connections (CI once saw 1,008 sockets held,
    // when evicted sockets could pile up unclosed), below the limit all the same.
    let inbox = Herald::start_inbox(INBOX, &prlimit, None).await;
    assert_answered_under_a_descriptor_flood(inbox, "/api/v1/inbox/event?limit=1", 1024 - 64).await;
}

/// CPU time the process has used (user and system), from /proc.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command name (in parentheses) come the state, then 10 fields, then utime and stime.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    let ticks = field(11) + field(12);
    // USER_HZ is 100 on every Linux configuration a test runs on.
    Duration::from_millis(ticks * 10)
}

/// How much CPU the server burns over 3 s while nothing is asked of it.
async fn cpu_while_waiting(pid: u32) -> Duration {
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = cpu_time(pid);
    tokio::time::sleep(Duration::from_secs(3)).await;
    cpu_time(pid).saturating_sub(before)
}

#[tokio::test]
async fn idle_connections_and_exhausted_descriptors_cost_no_spinning() {
    // Idle and kept-alive connections: the server sleeps.
    let herald = Herald::start(&[]).await;
    let mut idle = Vec::new();
    for i in 0..400 {
        let mut stream = TcpStream::connect(herald.addr).await.expect("connect");
        if i % 2 == 0 {
            stream
                .write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let mut answer = vec![0u8; 4096];
            let n = stream.read(&mut answer).await.unwrap();
            assert_eq!(parse(&answer[..n]).expect("answer").status, 200);
        }
        idle.push(stream);
    }
    let burnt = cpu_while_waiting(herald.pid()).await;
    assert!(
        burnt < Duration::from_millis(200),
        "400 idle connections burnt {burnt:?} of CPU in 3 s"
    );
    let descriptors = std::fs::read_dir(format!("/proc/{}/fd", herald.pid())).map_or(0, Iterator::count);
    drop(idle);
    drop(herald);

    // Descriptors run out (a limit 8 above what the server holds idle, below its cap's floor of 16
    // connections): accept fails with EMFILE, the server closes idle connections and backs off rather
    // than spinning, and a client still gets its answers.
    let baseline = descriptors.saturating_sub(400);
    let limit = format!("prlimit --nofile={}", baseline + 8);
    let mut herald = Herald::start(&[(LAUNCHER, limit.as_str())]).await;
    let mut flood = Vec::new();
    for _ in 0..200 {
        flood.push(TcpStream::connect(herald.addr).await.expect("connect"));
    }
    let burnt = cpu_while_waiting(herald.pid()).await;
    assert!(
        burnt < Duration::from_millis(300),
        "out of descriptors, the server burnt {burnt:?} of CPU in 3 s"
    );
    for _ in 0..10 {
        let answer = send_raw(
            herald.addr,
            b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    assert!(herald.is_running());
    drop(flood);
}
