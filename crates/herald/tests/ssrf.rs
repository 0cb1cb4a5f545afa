//! Every endpoint URL in section A of `tests/vectors/ssrf-urls.txt` aims at a listener on loopback;
//! with no private range allowed, each is refused when the endpoint is created, and the listener never
//! sees a single connection.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::Herald;
use serde_json::json;

/// A loopback listener on both 127.0.0.1 and [::1] (same port where possible) that counts connections.
struct CountingListener {
    port: u16,
    connections: Arc<AtomicUsize>,
}

impl CountingListener {
    async fn start() -> Self {
        let v4 = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind v4");
        let port = v4.local_addr().expect("addr").port();
        let connections = Arc::new(AtomicUsize::new(0));
        let mut listeners = vec![v4];
        if let Ok(v6) = tokio::net::TcpListener::bind(("::1", port)).await {
            listeners.push(v6);
        }
        for listener in listeners {
            let count = connections.clone();
            tokio::spawn(async move {
                while let Ok((_socket, _)) = listener.accept().await {
                    count.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
        Self { port, connections }
    }
}

fn section_a_urls(port: u16) -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/vectors/ssrf-urls.txt");
    let text = std::fs::read_to_string(path).expect("read ssrf-urls.txt");
    let mut section = "";
    let mut urls = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with('[') {
            section = line;
            continue;
        }
        if section == "[A]" {
            urls.push(line.replace("{port}", &port.to_string()));
        }
    }
    assert!(urls.len() >= 15, "section A has its URLs");
    urls
}

/// How long a restarted node may take to deliver. On PostgreSQL (`HERALD_TEST_BACKEND=postgres`) it first
/// takes its killed predecessor's partitions over: the lease (4 s in tests) plus the longest attempt
/// (2 s) and a second, more when the whole suite loads the machine.
const RESTARTED: Duration = Duration::from_secs(30);

/// The tests below wait for a first attempt and its retry 100 ms later. The second, long delay only
/// widens the deliveries' time window (the schedule's total, stretched, plus a timeout per attempt):
/// with `100ms` alone it is about 4 s, which a PostgreSQL take-over after a restart can use up before the
/// retry is due, and the retry then dies of old age unsent.
const RETRIES: &str = "100ms,30s";

#[tokio::test]
async fn section_a_urls_are_refused_at_creation_and_never_contacted() {
    // http is allowed (so the refusal is about the address), no private range is.
    let herald = Herald::start(&[("HERALD_ALLOW_PRIVATE_CIDRS", "")]).await;
    let listener = CountingListener::start().await;
    let app = herald.app("ssrf").await;
    for url in section_a_urls(listener.port) {
        let (status, body) = herald
            .call("POST", &format!("/app/{app}/endpoint"), Some(json!({ "url": url })))
            .await;
        assert_eq!(status, 422, "{url} was accepted: {body}");
        assert_eq!(body["code"], "validation");
        assert!(common::names_field(&body, "url"), "{url}: {body}");
    }
    let listed = herald.get(&format!("/app/{app}/endpoint")).await;
    assert!(listed["data"].as_array().unwrap().is_empty(), "no endpoint was created");
    // Publishing still works and reaches nobody.
    herald
        .post(&format!("/app/{app}/msg"), json!({"eventType": "a.b", "payload": {}}))
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        listener.connections.load(Ordering::SeqCst),
        0,
        "a refused destination was contacted"
    );
}

#[tokio::test]
async fn section_a_urls_stored_earlier_are_blocked_at_delivery_and_never_contacted() {
    // Every section-A URL is accepted while loopback is allowed (so it is stored), then the operator removes
    // loopback from the allowlist: each delivery is refused before connecting and recorded as blocked.
    let listener = CountingListener::start().await;
    let mut herald = Herald::start(&[
        ("HERALD_ALLOW_PRIVATE_CIDRS", "127.0.0.0/8,::1/128"),
        ("HERALD_RETRY_SCHEDULE", RETRIES),
    ])
    .await;
    let app = herald.app("ssrf-later").await;
    let urls = section_a_urls(listener.port);
    for url in &urls {
        herald.endpoint(&app, json!({ "url": url })).await;
    }
    herald.kill9();
    for (key, value) in &mut herald.env {
        if key == "HERALD_ALLOW_PRIVATE_CIDRS" {
            *value = "127.0.0.2/32".to_owned();
        }
    }
    herald.restart().await;
    let msg = herald
        .post(&format!("/app/{app}/msg"), json!({"eventType": "a.b", "payload": {}}))
        .await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let attempts = herald
        .wait_attempts(&app, &msg, RESTARTED, |a| a.len() == 2 * urls.len())
        .await;
    for attempt in &attempts {
        assert_eq!(attempt["outcome"], "blocked", "{attempt}");
        let response = attempt["response"].as_str().unwrap_or("");
        assert!(
            response.starts_with("blocked: ") && (response.contains("loopback") || response.contains("localhost")),
            "{attempt}"
        );
    }
    assert_eq!(
        listener.connections.load(Ordering::SeqCst),
        0,
        "a blocked destination was contacted"
    );
}

/// The lines of one section of the shared vectors file.
fn section(letter: &str) -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/vectors/ssrf-urls.txt");
    let text = std::fs::read_to_string(path).expect("read ssrf-urls.txt");
    let header = format!("[{letter}]");
    let mut current = "";
    let mut urls = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with('[') {
            current = line;
        } else if current == header {
            urls.push(line.to_owned());
        }
    }
    assert!(!urls.is_empty(), "section {letter} has its URLs");
    urls
}

/// Every way of writing an endpoint's URL: create (POST), replace (PUT) and patch (PATCH). Each must refuse
/// `url` with a 422 whose detail names the field and the rule, and leave the stored endpoint unchanged.
async fn assert_refused_everywhere(herald: &Herald, app: &str, endpoint: &str, url: &str, rule: &str) {
    let attempts = [
        ("POST", format!("/app/{app}/endpoint")),
        ("PUT", format!("/app/{app}/endpoint/{endpoint}")),
        ("PATCH", format!("/app/{app}/endpoint/{endpoint}")),
    ];
    for (method, path) in attempts {
        let (status, body) = herald.call(method, &path, Some(json!({ "url": url }))).await;
        assert_eq!(status, 422, "{method} {url} was accepted: {body}");
        assert_eq!(body["code"], "validation", "{method} {url}: {body}");
        let detail = common::validation_summary(&body).join("; ");
        assert!(common::names_field(&body, "url"), "{method} {url}: {body}");
        assert!(detail.contains(rule), "{method} {url}: {detail} does not name {rule:?}");
    }
}

#[tokio::test]
async fn section_c_and_other_schemes_are_refused_at_create_and_update() {
    // Even with every range allowed and http on, only http(s) may be used.
    let herald = Herald::start(&[("HERALD_ALLOW_PRIVATE_CIDRS", "0.0.0.0/0,::/0")]).await;
    let app = herald.app("schemes").await;
    let (endpoint, _) = herald
        .endpoint(&app, json!({ "url": "https://example.com/hook" }))
        .await;
    let mut urls = section("C");
    urls.extend(
        [
            "data:text/plain,hello",
            "javascript:alert(1)",
            "ws://example.com/",
            "sftp://example.com/",
        ]
        .map(String::from),
    );
    for url in urls {
        assert_refused_everywhere(&herald, &app, &endpoint, &url, "scheme").await;
    }
    let stored = herald.get(&format!("/app/{app}/endpoint/{endpoint}")).await;
    assert_eq!(
        stored["url"], "https://example.com/hook",
        "a refused update changed nothing"
    );
}

#[tokio::test]
async fn http_is_refused_unless_allowed() {
    let herald = Herald::start(&[("HERALD_ALLOW_HTTP", "false")]).await;
    let app = herald.app("https-only").await;
    let (endpoint, _) = herald
        .endpoint(&app, json!({ "url": "https://example.com/hook" }))
        .await;
    assert_refused_everywhere(&herald, &app, &endpoint, "http://example.com/hook", "scheme `http`").await;
}

#[tokio::test]
async fn the_port_allowlist_is_enforced_at_create_and_update() {
    let herald = Herald::start(&[("HERALD_ALLOW_PORTS", "443,8443")]).await;
    let app = herald.app("ports").await;
    let (endpoint, _) = herald
        .endpoint(&app, json!({ "url": "https://example.com:8443/hook" }))
        .await;
    for url in [
        "https://example.com:6379/",
        "https://example.com:22/",
        "http://example.com/",
        "https://user@example.com:25/",
    ] {
        assert_refused_everywhere(&herald, &app, &endpoint, url, "port allowlist is 443, 8443").await;
    }
    // The scheme's default port counts: https without a port is 443, and allowed.
    let (status, body) = herald
        .call(
            "PATCH",
            &format!("/app/{app}/endpoint/{endpoint}"),
            Some(json!({ "url": "https://example.com/hook" })),
        )
        .await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn a_port_outside_the_allowlist_is_blocked_at_delivery_and_not_contacted() {
    // The endpoint is created while every port is allowed; the operator then narrows the port allowlist. The
    // delivery is refused before connecting, recorded as blocked with the rule, and the receiver sees nothing.
    let listener = CountingListener::start().await;
    let mut herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", RETRIES)]).await;
    let app = herald.app("ports").await;
    let url = format!("http://127.0.0.1:{}/hook", listener.port);
    herald.endpoint(&app, json!({ "url": url })).await;
    herald.kill9();
    herald.env.push(("HERALD_ALLOW_PORTS".into(), "443".into()));
    herald.restart().await;
    let msg = herald
        .post(&format!("/app/{app}/msg"), json!({"eventType": "a.b", "payload": {}}))
        .await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let attempts = herald.wait_attempts(&app, &msg, RESTARTED, |a| a.len() == 2).await;
    for attempt in &attempts {
        assert_eq!(attempt["outcome"], "blocked", "{attempt}");
        assert_eq!(attempt["responseStatusCode"], 0, "{attempt}");
        assert_eq!(
            attempt["response"],
            format!(
                "blocked: endpoint URL port {} is not allowed; the port allowlist is 443",
                listener.port
            ),
            "{attempt}"
        );
    }
    assert_eq!(
        listener.connections.load(Ordering::SeqCst),
        0,
        "a refused port was contacted"
    );
}

#[test]
fn dev_mode_warns_loudly_even_when_logs_are_filtered() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let dir = tempfile::tempdir().expect("temp dir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["serve", "--dev"])
        .current_dir(dir.path())
        .env_clear()
        .env("RUST_LOG", "error")
        .env("HERALD_LISTEN", "127.0.0.1:0")
        .env("HERALD_ADMIN_TOKEN", common::TOKEN)
        .env(
            "HERALD_DATABASE_URL",
            format!("sqlite://{}", dir.path().join("herald.db").display()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn herald");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut found = None;
    while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
        if line.contains("DEVELOPMENT MODE") && line.contains("Never run this in production") {
            found = Some(line);
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(found.is_some(), "no development-mode warning on standard error");
}

// ---------------------------------------------------------------------------------------------------------------
// Hostile receivers, end to end: what the attempt log records.
// ---------------------------------------------------------------------------------------------------------------

/// How far a hostile receiver got with one connection.
#[derive(Debug, Clone, Copy)]
struct Sent {
    bytes: u64,
    cut_off: bool,
}

/// A raw TCP receiver on loopback: for each connection it reads the request head and then writes `first`,
/// followed by `chunk` every `every` (or as fast as possible when zero) until `limit` bytes are out or Herald
/// hangs up. Records how far it got per connection.
struct HostileReceiver {
    addr: std::net::SocketAddr,
    sent: Arc<std::sync::Mutex<Vec<Sent>>>,
}

impl HostileReceiver {
    async fn start(first: Vec<u8>, chunk: Vec<u8>, every: Duration, limit: u64) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let sent = Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = sent.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let (first, chunk, record) = (first.clone(), chunk.clone(), record.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let mut bytes = 0u64;
                    let mut cut_off = socket.write_all(&first).await.is_err();
                    bytes += first.len() as u64;
                    while !cut_off && bytes < limit {
                        if !every.is_zero() {
                            tokio::time::sleep(every).await;
                        }
                        cut_off = socket.write_all(&chunk).await.is_err();
                        bytes += chunk.len() as u64;
                    }
                    record.lock().expect("lock").push(Sent { bytes, cut_off });
                });
            }
        });
        Self { addr, sent }
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// Wait until `n` connections have ended, and return how far each got.
    async fn wait_sent(&self, n: usize) -> Vec<Sent> {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let sent = self.sent.lock().expect("lock").clone();
            if sent.len() >= n {
                return sent;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "receiver saw {} of {n} connections end",
                sent.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Create an app with one endpoint at `url`, publish one message, and return (app, message id).
async fn deliver_once(herald: &Herald, url: &str) -> (String, String) {
    let app = herald.app("hostile").await;
    herald.endpoint(&app, json!({ "url": url })).await;
    let msg = herald
        .post(
            &format!("/app/{app}/msg"),
            json!({"eventType": "a.b", "payload": {"n": 1}}),
        )
        .await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    (app, msg)
}

const MIB: u64 = 1024 * 1024;

#[tokio::test]
async fn a_huge_response_body_is_stored_capped_and_not_read_to_the_end() {
    // A long deadline, so only the body cap can end the read early.
    let herald = Herald::start(&[("HERALD_REQUEST_TIMEOUT", "60s")]).await;
    let receiver = HostileReceiver::start(
        format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", 100 * MIB).into_bytes(),
        vec![b'x'; 64 * 1024],
        Duration::ZERO,
        100 * MIB,
    )
    .await;
    let (app, msg) = deliver_once(&herald, &receiver.url()).await;
    let attempts = herald
        .wait_attempts(&app, &msg, Duration::from_secs(60), |a| !a.is_empty())
        .await;
    assert_eq!(attempts[0]["outcome"], "success", "{:?}", attempts[0]["outcome"]);
    let stored = attempts[0]["response"].as_str().expect("response");
    assert_eq!(stored.len(), 4096);
    assert!(stored.bytes().all(|b| b == b'x'));
    let sent = receiver.wait_sent(1).await;
    assert!(
        sent[0].cut_off && sent[0].bytes < 100 * MIB,
        "the whole 100 MB body went out, so it was read: {sent:?}"
    );
}

#[tokio::test]
async fn a_slow_drip_body_ends_the_attempt_at_the_request_timeout() {
    let herald = Herald::start(&[("HERALD_REQUEST_TIMEOUT", "1s")]).await;
    // One byte every 200 ms of a 100,000-byte body: five and a half hours if nobody hangs up.
    let receiver = HostileReceiver::start(
        b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n".to_vec(),
        b"x".to_vec(),
        Duration::from_millis(200),
        100_000,
    )
    .await;
    let (app, msg) = deliver_once(&herald, &receiver.url()).await;
    let attempts = herald
        .wait_attempts(&app, &msg, Duration::from_secs(30), |a| !a.is_empty())
        .await;
    // The status line came in time, so the answer counts; the body is what dripped before the deadline.
    assert_eq!(attempts[0]["responseStatusCode"], 200);
    let stored = attempts[0]["response"].as_str().expect("response");
    assert!(stored.len() < 100 && stored.bytes().all(|b| b == b'x'), "{stored:?}");
    // A bound, not a performance figure: the drip would take hours.
    assert!(attempts[0]["responseDurationMs"].as_i64().expect("duration") < 10_000);
    let sent = receiver.wait_sent(1).await;
    assert!(sent[0].cut_off, "Herald never hung up on the drip: {sent:?}");
}

#[tokio::test]
async fn never_ending_headers_are_recorded_as_a_failed_attempt() {
    let herald = Herald::start(&[("HERALD_REQUEST_TIMEOUT", "60s"), ("HERALD_RETRY_SCHEDULE", "100ms")]).await;
    let mut lines = Vec::new();
    for n in 0..100 {
        lines.extend_from_slice(format!("x-filler-{n}: {}\r\n", "a".repeat(60)).as_bytes());
    }
    let receiver = HostileReceiver::start(b"HTTP/1.1 200 OK\r\n".to_vec(), lines, Duration::ZERO, 64 * MIB).await;
    let (app, msg) = deliver_once(&herald, &receiver.url()).await;
    let attempts = herald
        .wait_attempts(&app, &msg, Duration::from_secs(60), |a| a.len() == 2)
        .await;
    for attempt in &attempts {
        assert_eq!(attempt["outcome"], "connect_error", "{attempt}");
        assert_eq!(attempt["responseStatusCode"], 0, "{attempt}");
        assert_eq!(
            attempt["response"], "response headers exceed the cap (64 fields, 16384 bytes)",
            "{attempt}"
        );
    }
    let sent = receiver.wait_sent(2).await;
    assert!(sent.iter().all(|s| s.cut_off), "{sent:?}");
}

#[tokio::test]
async fn a_redirect_is_a_failed_attempt_and_its_target_is_never_contacted() {
    let herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", "100ms")]).await;
    let target = CountingListener::start().await;
    let location = format!("http://127.0.0.1:{}/hook", target.port);
    let receiver = common::Receiver::start(common::Reply::status(302).header("location", &location)).await;
    let (app, msg) = deliver_once(&herald, &receiver.url()).await;
    let attempts = herald.wait_attempts(&app, &msg, RESTARTED, |a| a.len() == 2).await;
    for attempt in &attempts {
        assert_eq!(attempt["outcome"], "unexpected_status", "{attempt}");
        assert_eq!(attempt["responseStatusCode"], 302, "{attempt}");
    }
    assert_eq!(receiver.received().len(), 2);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        target.connections.load(Ordering::SeqCst),
        0,
        "the redirect was followed"
    );
}

#[tokio::test]
async fn a_blocked_attempt_records_the_rule_and_nothing_the_target_said() {
    // Created while loopback is allowed; the operator then narrows the allowlist. The receiver would answer
    // with a marker, but is never contacted, and the recorded text is Herald's reason, exactly.
    let mut herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", RETRIES)]).await;
    let receiver = common::Receiver::start(common::Reply::status(500).body("TARGET-MARKER")).await;
    let (app, _) = deliver_once(&herald, &receiver.url()).await;
    receiver.wait_for(1, Duration::from_secs(10)).await;
    herald.kill9();
    for (key, value) in &mut herald.env {
        if key == "HERALD_ALLOW_PRIVATE_CIDRS" {
            *value = "127.0.0.2/32".to_owned();
        }
    }
    herald.restart().await;
    let before = receiver.received().len();
    let msg = herald
        .post(&format!("/app/{app}/msg"), json!({"eventType": "a.b", "payload": {}}))
        .await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let attempts = herald.wait_attempts(&app, &msg, RESTARTED, |a| a.len() == 2).await;
    for attempt in &attempts {
        assert_eq!(attempt["outcome"], "blocked", "{attempt}");
        assert_eq!(
            attempt["response"],
            "blocked: endpoint URL host is not allowed: 127.0.0.1 is loopback (127.0.0.0/8)"
        );
    }
    assert_eq!(receiver.received().len(), before, "a blocked destination was contacted");
}

#[tokio::test]
async fn deliveries_go_through_the_configured_egress_proxy_to_the_checked_ip() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A CONNECT proxy that records targets and tunnels only to loopback IP:port (anything else: 403, no dial).
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
    let proxy_addr = proxy.local_addr().expect("addr");
    let targets = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let record = targets.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = proxy.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match client.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let target = head.split_whitespace().nth(1).unwrap_or("").to_owned();
                record.lock().expect("lock").push(target.clone());
                let upstream = match target.parse::<std::net::SocketAddr>() {
                    Ok(addr) if head.starts_with("CONNECT ") && addr.ip().is_loopback() => {
                        tokio::net::TcpStream::connect(addr).await.ok()
                    }
                    _ => None,
                };
                let Some(mut upstream) = upstream else {
                    let _ = client.write_all(b"HTTP/1.1 403 Forbidden\r\n\r\n").await;
                    return;
                };
                if client.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.is_ok() {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
            });
        }
    });
    let proxy_url = format!("http://{proxy_addr}");
    let herald = Herald::start(&[("HERALD_PROXY_URL", proxy_url.as_str())]).await;
    let receiver = common::Receiver::start(common::Reply::status(204)).await;
    let (app, msg) = deliver_once(&herald, &receiver.url()).await;
    let attempts = herald
        .wait_attempts(&app, &msg, Duration::from_secs(10), |a| !a.is_empty())
        .await;
    assert_eq!(attempts[0]["outcome"], "success", "{}", attempts[0]);
    assert_eq!(receiver.received().len(), 1);
    assert_eq!(
        targets.lock().expect("lock").clone(),
        vec![receiver.addr.to_string()],
        "the proxy was asked for the checked IP:port"
    );
}

#[test]
fn an_unusable_proxy_url_stops_the_server_with_a_clear_message() {
    let dir = tempfile::tempdir().expect("temp dir");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_herald"))
        .arg("serve")
        .current_dir(dir.path())
        .env_clear()
        .env("HERALD_LISTEN", "127.0.0.1:0")
        .env("HERALD_ADMIN_TOKEN", common::TOKEN)
        .env(
            "HERALD_DATABASE_URL",
            format!("sqlite://{}", dir.path().join("herald.db").display()),
        )
        .env("HERALD_PROXY_URL", "https://proxy.example:3128")
        .output()
        .expect("run herald");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("proxy_url: scheme `https` is not supported"),
        "{stderr}"
    );
}
