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
