//! DNS rebinding and resolved addresses in denied ranges, through the pluggable resolver.
//!
//! # Why these tests never send traffic off the machine
//!
//! A rebinding test needs a "public" address that the client is *allowed* to connect to, and a "private" one it
//! must never reach. A real public address cannot be used: if the pinning were broken, the test would connect
//! to it, and the bug would show up as traffic leaving the machine instead of as a failed assertion. So the
//! policy here allowlists exactly `127.0.0.2/32`, and 127.0.0.2 plays the public address: it is the only
//! address the client may connect to, and a listener sits on it. 127.0.0.1 plays the private address: it is
//! denied (loopback, not allowlisted), and a counting listener sits on it on the same port. Every answer the
//! scripted resolver gives is a loopback address, so whatever the client does, it can only ever connect to this
//! machine, and every mistake is counted by a listener.
//!
//! The section-B addresses of `tests/vectors/ssrf-urls.txt` (10.0.0.5, 169.254.169.254, …) are not loopback,
//! so they go through [`checked_addresses`] only: the very function the connector calls before connecting, which
//! resolves and vets but opens no socket. A bug there fails an assertion and cannot reach the network.

use crate::common;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::{CountingListener, ScriptedResolver, client, read_head};
use herald_core::address::AddressPolicy;
use herald_core::outcome::AttemptResult;
use herald_delivery::{ClientConfig, ConnectError, DeliveryClient, checked_addresses};
use http::HeaderMap;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

/// The only address the policy allows: the stand-in for a public address.
const PUBLIC: &str = "127.0.0.2";
/// A denied address with a listener on it: the stand-in for an internal service.
const PRIVATE: &str = "127.0.0.1";

fn policy() -> AddressPolicy {
    AddressPolicy::new(vec![format!("{PUBLIC}/32").parse().expect("cidr")], true)
}

/// A receiver on the "public" address that answers 200 and closes each connection (so every attempt has to
/// connect, and so resolve, again), and a counting listener on the "private" address, on the same port.
struct Stage {
    port: u16,
    public_hits: Arc<AtomicUsize>,
    private: CountingListener,
}

impl Stage {
    async fn start() -> Self {
        for _ in 0..20 {
            let public = TcpListener::bind((PUBLIC, 0)).await.expect("bind 127.0.0.2");
            let port = public.local_addr().expect("addr").port();
            let Ok(private) = TcpListener::bind((PRIVATE, port)).await else {
                continue;
            };
            let public_hits = Arc::new(AtomicUsize::new(0));
            let hits = public_hits.clone();
            tokio::spawn(async move {
                while let Ok((mut socket, _)) = public.accept().await {
                    hits.fetch_add(1, Ordering::SeqCst);
                    read_head(&mut socket).await;
                    let _ = socket
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                        .await;
                }
            });
            return Self {
                port,
                public_hits,
                private: CountingListener::serve(private),
            };
        }
        panic!("no port free on both 127.0.0.1 and 127.0.0.2");
    }

    fn url(&self) -> String {
        format!("http://rebind.test:{}/hook", self.port)
    }

    fn public_hits(&self) -> usize {
        self.public_hits.load(Ordering::SeqCst)
    }

    /// The private listener must never have seen a connection; give a stray one time to land first.
    async fn assert_private_untouched(&self) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            self.private.connections(),
            0,
            "a connection reached the private address"
        );
    }
}

async fn post(client: &DeliveryClient, url: &str) -> herald_delivery::client::Response {
    client.post(url, HeaderMap::new(), Bytes::from_static(b"{}")).await
}

#[tokio::test]
async fn the_address_checked_is_the_address_connected_to() {
    // Classic rebinding: the first lookup (the one a naive client checks) answers public, every later one
    // answers private. A client that checks, then resolves again to connect, reaches the private listener.
    let stage = Stage::start().await;
    let resolver = ScriptedResolver::new(&[&[PUBLIC], &[PRIVATE]]);
    let client = client(ClientConfig::default(), policy(), resolver.clone());
    let response = post(&client, &stage.url()).await;
    assert!(
        matches!(response.result, AttemptResult::Response { status: 200, .. }),
        "{response:?}"
    );
    assert_eq!(
        resolver.lookups(),
        1,
        "one lookup per connection: no second answer is ever used"
    );
    assert_eq!(stage.public_hits(), 1);
    stage.assert_private_untouched().await;
}

#[tokio::test]
async fn a_name_rebound_to_a_private_address_is_blocked_on_the_next_attempt() {
    let stage = Stage::start().await;
    let resolver = ScriptedResolver::new(&[&[PUBLIC], &[PRIVATE]]);
    let client = client(ClientConfig::default(), policy(), resolver.clone());
    let first = post(&client, &stage.url()).await;
    assert!(
        matches!(first.result, AttemptResult::Response { status: 200, .. }),
        "{first:?}"
    );
    // The public receiver closed the connection, so the next attempt resolves again and gets the private answer.
    let second = post(&client, &stage.url()).await;
    assert_eq!(second.result, AttemptResult::Blocked, "{second:?}");
    assert_eq!(
        second.body,
        "blocked: rebind.test resolved to a denied address: 127.0.0.1 is loopback (127.0.0.0/8)"
    );
    assert_eq!(resolver.lookups(), 2);
    assert_eq!(stage.public_hits(), 1);
    stage.assert_private_untouched().await;
}

#[tokio::test]
async fn an_answer_mixing_allowed_and_denied_addresses_is_refused_as_a_whole() {
    // Multiple-answer rebinding: a client that tries the addresses in turn falls back to the internal one when
    // the public one fails. Herald refuses the name outright, so neither address is contacted.
    let stage = Stage::start().await;
    let cases: [(&[&str], &str); 4] = [
        (&[PUBLIC, PRIVATE], "127.0.0.1 is loopback (127.0.0.0/8)"),
        (&[PRIVATE, PUBLIC], "127.0.0.1 is loopback (127.0.0.0/8)"),
        // Mapped answers are unmapped before the check: a dual-stack socket would reach 127.0.0.1.
        (&[PUBLIC, "::ffff:127.0.0.1"], "127.0.0.1 is loopback (127.0.0.0/8)"),
        (&[PUBLIC, "::1"], "::1 is loopback (::1/128)"),
    ];
    for (answer, reason) in cases {
        let resolver = ScriptedResolver::new(&[answer]);
        let client = client(ClientConfig::default(), policy(), resolver);
        let response = post(&client, &stage.url()).await;
        assert_eq!(response.result, AttemptResult::Blocked, "{answer:?}: {response:?}");
        assert_eq!(
            response.body,
            format!("blocked: rebind.test resolved to a denied address: {reason}"),
            "{answer:?}"
        );
    }
    assert_eq!(stage.public_hits(), 0, "a name with a denied answer was used");
    stage.assert_private_untouched().await;
}

#[tokio::test]
async fn a_blocked_reason_never_contains_what_the_target_said() {
    // The private listener here would answer with a marker; the attempt is blocked before any connection, so
    // the recorded text is Herald's own.
    let listener = TcpListener::bind((PRIVATE, 0)).await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let _ = socket
                .write_all(b"HTTP/1.1 500 Oops\r\ncontent-length: 13\r\n\r\nTARGET-MARKER")
                .await;
        }
    });
    let resolver = ScriptedResolver::new(&[&[PRIVATE]]);
    let client = client(ClientConfig::default(), policy(), resolver);
    let response = post(&client, &format!("http://marker.test:{port}/")).await;
    assert_eq!(response.result, AttemptResult::Blocked);
    assert!(!response.body.contains("TARGET-MARKER") && !response.body.contains("Oops"));
    assert_eq!(
        response.body,
        "blocked: marker.test resolved to a denied address: 127.0.0.1 is loopback (127.0.0.0/8)"
    );
}

/// Section B of the shared vectors: each URL's host, as a resolver answer.
fn section_b_addresses() -> Vec<(String, IpAddr)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/vectors/ssrf-urls.txt");
    let text = std::fs::read_to_string(path).expect("read ssrf-urls.txt");
    let mut section = "";
    let mut found = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with('[') {
            section = line;
            continue;
        }
        if section == "[B]" {
            let url = url::Url::parse(line).expect("section B URLs parse");
            let ip = match url.host() {
                Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip),
                Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip),
                other => panic!("{line}: not an IP literal: {other:?}"),
            };
            found.push((line.to_owned(), ip));
        }
    }
    assert!(found.len() >= 26, "section B looks truncated");
    found
}

#[tokio::test]
async fn section_b_addresses_are_refused_as_resolver_answers_and_as_literals() {
    let policy = policy();
    for (line, ip) in section_b_addresses() {
        // What the connector reports must name the rule and the exact range, for the address it would have
        // connected to (mapped answers unmapped).
        let unmapped = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        let denied = policy.check_ip(unmapped).expect_err(&line);
        let cidr = denied.cidr().expect("a named range").to_string();
        for answer in [vec![ip], vec![PUBLIC.parse().expect("ip"), ip]] {
            let resolver = ScriptedResolver::answering(answer.clone());
            let result = checked_addresses(&policy, resolver.as_ref(), "b.test", 443).await;
            match result {
                Err(ConnectError::Blocked(reason)) => {
                    assert_eq!(
                        reason,
                        format!("b.test resolved to a denied address: {denied}"),
                        "{line} {answer:?}"
                    );
                    assert!(reason.contains(&cidr), "{line}: {reason}");
                }
                other => panic!("{line} answered {answer:?} was not blocked: {other:?}"),
            }
        }
        // As a literal host, the resolver is not consulted and the address is checked as written.
        let resolver = ScriptedResolver::new(&[]);
        let host = match ip {
            IpAddr::V6(v6) => format!("[{v6}]"),
            v4 => v4.to_string(),
        };
        match checked_addresses(&policy, resolver.as_ref(), &host, 443).await {
            Err(ConnectError::Blocked(reason)) => {
                assert_eq!(reason, policy.check_ip(ip).expect_err(&line).to_string(), "{line}");
            }
            other => panic!("{line} as a literal was not blocked: {other:?}"),
        }
        assert_eq!(resolver.lookups(), 0, "{line}: a literal was looked up");
    }
}

#[tokio::test]
async fn allowed_answers_are_returned_in_order_and_pinned_to_the_port() {
    let resolver = ScriptedResolver::new(&[&[PUBLIC, PUBLIC]]);
    let addrs = checked_addresses(&policy(), resolver.as_ref(), "ok.test", 8443)
        .await
        .expect("allowed");
    let want: SocketAddr = format!("{PUBLIC}:8443").parse().expect("addr");
    assert_eq!(addrs, vec![want, want]);
    // No answers at all is a resolution failure, not a policy decision.
    let empty = ScriptedResolver::new(&[&[]]);
    assert!(matches!(
        checked_addresses(&policy(), empty.as_ref(), "none.test", 443).await,
        Err(ConnectError::Resolve { .. })
    ));
    // The port allowlist applies here too: the connector refuses a port even if the URL check was skipped.
    let ports = policy().with_allowed_ports([443]);
    assert!(matches!(
        checked_addresses(&ports, resolver.as_ref(), "ok.test", 8443).await,
        Err(ConnectError::Blocked(reason)) if reason.contains("port 8443")
    ));
}
