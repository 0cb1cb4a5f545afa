//! The optional egress proxy (HTTP CONNECT), against a real CONNECT proxy on loopback written here.
//!
//! The proxy records every CONNECT target it is asked for. It tunnels only to loopback IP:port targets and
//! refuses anything else (a name, or a non-loopback address) without dialling, so even a broken client could
//! not make it send traffic off the machine.

use crate::common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{ScriptedResolver, client, host_header, loopback_policy, read_head};
use herald_core::address::AddressPolicy;
use herald_core::outcome::AttemptResult;
use herald_delivery::ClientConfig;
use http::HeaderMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// One CONNECT request the proxy received.
#[derive(Debug, Clone)]
struct Connect {
    target: String,
    authorization: Option<String>,
}

struct ConnectProxy {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Connect>>>,
}

impl ConnectProxy {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(tunnel(socket, record.clone()));
            }
        });
        Self { addr, seen }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> Vec<Connect> {
        self.seen.lock().expect("lock").clone()
    }
}

async fn tunnel(mut client: TcpStream, seen: Arc<Mutex<Vec<Connect>>>) {
    // The client sends nothing after its CONNECT head until it has our answer, so reading chunks is safe.
    let head = read_head(&mut client).await;
    let mut words = head.split_whitespace();
    let (Some("CONNECT"), Some(target)) = (words.next(), words.next()) else {
        let _ = client.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        return;
    };
    let authorization = head
        .lines()
        .find_map(|l| l.strip_prefix("Proxy-Authorization: "))
        .map(str::to_owned);
    seen.lock().expect("lock").push(Connect {
        target: target.to_owned(),
        authorization,
    });
    // Only loopback IP:port targets are ever dialled.
    let upstream = match target.parse::<SocketAddr>() {
        Ok(addr) if addr.ip().is_loopback() => TcpStream::connect(addr).await.ok(),
        _ => {
            let _ = client.write_all(b"HTTP/1.1 403 Forbidden\r\n\r\n").await;
            return;
        }
    };
    let Some(mut upstream) = upstream else {
        let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
        return;
    };
    if client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_ok()
    {
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    }
}

/// A receiver that records the request head of its first connection and answers 200.
async fn http_receiver(bind: &str) -> (SocketAddr, oneshot::Receiver<String>) {
    let listener = TcpListener::bind(bind).await.expect("bind receiver");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let Ok((mut socket, _)) = listener.accept().await else {
            return;
        };
        let head = read_head(&mut socket).await;
        let _ = socket
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
            .await;
        let _ = tx.send(head);
    });
    (addr, rx)
}

fn proxied(proxy_url: String) -> ClientConfig {
    ClientConfig {
        proxy_url: Some(proxy_url),
        ..ClientConfig::default()
    }
}

async fn post(client: &herald_delivery::DeliveryClient, url: &str) -> herald_delivery::client::Response {
    client.post(url, HeaderMap::new(), Bytes::from_static(b"{}")).await
}

#[tokio::test]
async fn the_proxy_is_asked_for_the_checked_ip_and_the_host_stays_the_name() {
    let proxy = ConnectProxy::start().await;
    let (receiver, head) = http_receiver("127.0.0.1:0").await;
    let resolver = ScriptedResolver::new(&[&["127.0.0.1"]]);
    let client = client(proxied(proxy.url()), loopback_policy(), resolver.clone());
    let url = format!("http://hook.test:{}/hook?x=1", receiver.port());
    let response = post(&client, &url).await;
    assert!(
        matches!(response.result, AttemptResult::Response { status: 200, .. }),
        "{response:?}"
    );
    let seen = proxy.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    // The checked IP, never the name: the proxy's DNS gets no say.
    assert_eq!(seen[0].target, receiver.to_string());
    assert_eq!(seen[0].authorization, None);
    assert_eq!(resolver.lookups(), 1, "Herald resolved the name itself");
    let head = common::report(head).await;
    assert!(
        head.starts_with("POST /hook?x=1 HTTP/1.1\r\n"),
        "origin form in the tunnel: {head}"
    );
    assert_eq!(
        host_header(&head).as_deref(),
        Some(format!("hook.test:{}", receiver.port()).as_str())
    );
}

#[tokio::test]
async fn an_ipv6_checked_address_is_bracketed_in_the_connect_request() {
    let proxy = ConnectProxy::start().await;
    let (receiver, head) = http_receiver("[::1]:0").await;
    let resolver = ScriptedResolver::new(&[&["::1"]]);
    let policy = AddressPolicy::new(vec!["::1/128".parse().expect("cidr")], true);
    let client = client(proxied(proxy.url()), policy, resolver);
    let response = post(&client, &format!("http://hook.test:{}/", receiver.port())).await;
    assert!(
        matches!(response.result, AttemptResult::Response { status: 200, .. }),
        "{response:?}"
    );
    assert_eq!(proxy.seen()[0].target, format!("[::1]:{}", receiver.port()));
    common::report(head).await;
}

#[tokio::test]
async fn a_denied_address_is_blocked_before_the_proxy_is_asked() {
    let proxy = ConnectProxy::start().await;
    let (receiver, _head) = http_receiver("127.0.0.1:0").await;
    // Only 127.0.0.2 is allowed: the name's answer (127.0.0.1) and the literal are both denied.
    let policy = AddressPolicy::new(vec!["127.0.0.2/32".parse().expect("cidr")], true);
    let resolver = ScriptedResolver::new(&[&["127.0.0.1"]]);
    let client = client(proxied(proxy.url()), policy, resolver);
    for (url, reason) in [
        (
            format!("http://hook.test:{}/", receiver.port()),
            "blocked: hook.test resolved to a denied address: 127.0.0.1 is loopback (127.0.0.0/8)",
        ),
        (
            format!("http://127.0.0.1:{}/", receiver.port()),
            "blocked: endpoint URL host is not allowed: 127.0.0.1 is loopback (127.0.0.0/8)",
        ),
    ] {
        let response = post(&client, &url).await;
        assert_eq!(response.result, AttemptResult::Blocked, "{url}");
        assert_eq!(response.body, reason);
    }
    assert!(proxy.seen().is_empty(), "the proxy was asked: {:?}", proxy.seen());
}

#[tokio::test]
async fn a_proxy_refusal_is_a_connection_error_naming_only_the_status() {
    let proxy = ConnectProxy::start().await;
    // A port nothing listens on (bound, then released): the proxy cannot reach it and answers 502.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let client = client(proxied(proxy.url()), loopback_policy(), ScriptedResolver::new(&[]));
    let response = post(&client, &format!("http://127.0.0.1:{port}/")).await;
    assert_eq!(response.result, AttemptResult::ConnectError, "{response:?}");
    assert_eq!(
        response.body,
        format!("egress proxy: CONNECT 127.0.0.1:{port} answered 502")
    );
}

#[tokio::test]
async fn proxy_credentials_come_from_the_proxy_url_and_stay_with_the_proxy() {
    let proxy = ConnectProxy::start().await;
    let (receiver, head) = http_receiver("127.0.0.1:0").await;
    let url = format!("http://herald:p%40ss@{}", proxy.addr);
    let client = client(proxied(url), loopback_policy(), ScriptedResolver::new(&[]));
    let response = post(&client, &format!("http://{receiver}/")).await;
    assert!(matches!(response.result, AttemptResult::Response { status: 200, .. }));
    // base64("herald:p@ss")
    assert_eq!(proxy.seen()[0].authorization.as_deref(), Some("Basic aGVyYWxkOnBAc3M="));
    let head = common::report(head).await.to_ascii_lowercase();
    assert!(!head.contains("proxy-authorization"), "{head}");
}

#[tokio::test]
async fn tls_through_the_proxy_keeps_the_hostname_as_sni() {
    // The receiver reads the TLS ClientHello and reports its server name; it has no certificate, so the
    // handshake then fails, which is fine: the name is what this test is about.
    let proxy = ConnectProxy::start().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let receiver = listener.local_addr().expect("addr");
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let Ok((mut socket, _)) = listener.accept().await else {
            return;
        };
        let mut hello = Vec::new();
        let mut buf = [0u8; 4096];
        // One TLS record: 5-byte header, then its length.
        while hello.len() < 5 || hello.len() < 5 + usize::from(u16::from_be_bytes([hello[3], hello[4]])) {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => hello.extend_from_slice(&buf[..n]),
            }
        }
        let _ = tx.send(server_name(&hello));
    });
    let resolver = ScriptedResolver::new(&[&["127.0.0.1"]]);
    let client = client(proxied(proxy.url()), loopback_policy(), resolver);
    let response = post(&client, &format!("https://hook.test:{}/", receiver.port())).await;
    assert_eq!(response.result, AttemptResult::ConnectError, "{response:?}");
    assert_eq!(proxy.seen()[0].target, receiver.to_string());
    let sni = tokio::time::timeout(Duration::from_secs(30), rx)
        .await
        .expect("the receiver reports")
        .expect("the receiver reports");
    assert_eq!(sni.as_deref(), Some("hook.test"));
}

/// The server_name extension of a TLS ClientHello record, if any.
fn server_name(record: &[u8]) -> Option<String> {
    let u16_at =
        |p: usize| -> Option<usize> { Some(usize::from(u16::from_be_bytes([*record.get(p)?, *record.get(p + 1)?]))) };
    // Record header (5), handshake header (4), client version (2), random (32).
    let mut p = 5 + 4 + 2 + 32;
    p += 1 + usize::from(*record.get(p)?); // session id
    p += 2 + u16_at(p)?; // cipher suites
    p += 1 + usize::from(*record.get(p)?); // compression methods
    let end = p + 2 + u16_at(p)?;
    p += 2;
    while p + 4 <= end {
        let (kind, len) = (u16_at(p)?, u16_at(p + 2)?);
        p += 4;
        if kind == 0 {
            // server_name_list length (2), name type (1), name length (2), name.
            let name_len = u16_at(p + 3)?;
            return String::from_utf8(record.get(p + 5..p + 5 + name_len)?.to_vec()).ok();
        }
        p += len;
    }
    None
}
