//! Every endpoint URL in section A of `shared/vectors/ssrf-urls.txt` aims at a listener on loopback;
//! with no private range allowed, each is refused when the endpoint is created, and the listener never
//! sees a single connection.

mod common;

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
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/vectors/ssrf-urls.txt");
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
        assert!(
            body["detail"].as_str().unwrap_or("").starts_with("url:"),
            "{url}: {body}"
        );
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

/// The lines of one section of the shared vectors file.
fn section(letter: &str) -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/vectors/ssrf-urls.txt");
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
        let detail = body["detail"].as_str().unwrap_or("");
        assert!(detail.starts_with("url:"), "{method} {url}: {body}");
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
    let mut herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", "100ms")]).await;
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
    let attempts = herald
        .wait_attempts(&app, &msg, Duration::from_secs(10), |a| a.len() == 2)
        .await;
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
