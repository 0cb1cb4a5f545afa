//! The delivery client against hostile receivers: raw TCP servers on loopback that drip, flood, never finish
//! their headers, or redirect. Each server reports how much it managed to send before the client hung up, so
//! "the client stopped reading" is observed at the other end of a real socket, not inferred from what the
//! client kept.

use crate::common;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::{CountingListener, loopback_client, read_head, report};
use herald_core::outcome::AttemptResult;
use herald_delivery::ClientConfig;
use http::HeaderMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// How far a hostile server got.
#[derive(Debug)]
struct Sent {
    /// Bytes written after the request was read.
    bytes: u64,
    /// The client hung up before the server was done.
    cut_off: bool,
}

/// Accept one connection on a fresh loopback port, read the request head, then run `behaviour` on the socket
/// and report its result.
async fn serve_one<F, Fut, T>(behaviour: F) -> (SocketAddr, oneshot::Receiver<T>)
where
    F: FnOnce(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = T> + Send,
    T: Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let Ok((mut socket, _)) = listener.accept().await else {
            return;
        };
        read_head(&mut socket).await;
        let _ = tx.send(behaviour(socket).await);
    });
    (addr, rx)
}

/// Write `first`, then `chunk` again and again until `limit` bytes are out or the client hangs up.
async fn flood(mut socket: TcpStream, first: &[u8], chunk: &[u8], limit: u64) -> Sent {
    let mut bytes = 0u64;
    if socket.write_all(first).await.is_err() {
        return Sent { bytes, cut_off: true };
    }
    bytes += first.len() as u64;
    while bytes < limit {
        if socket.write_all(chunk).await.is_err() {
            return Sent { bytes, cut_off: true };
        }
        bytes += chunk.len() as u64;
    }
    Sent { bytes, cut_off: false }
}

/// Write `first`, then one byte of `drip` every 200 ms, until `drip` is exhausted or the client hangs up
/// (noticed as end-of-stream or an error on the read side, or a failed write).
async fn drip(mut socket: TcpStream, first: &[u8], drip: u8, count: u64) -> Sent {
    if socket.write_all(first).await.is_err() {
        return Sent {
            bytes: 0,
            cut_off: true,
        };
    }
    let mut bytes = first.len() as u64;
    let mut buf = [0u8; 1024];
    for _ in 0..count {
        tokio::select! {
            read = socket.read(&mut buf) => {
                if matches!(read, Ok(0) | Err(_)) {
                    return Sent { bytes, cut_off: true };
                }
            }
            () = tokio::time::sleep(Duration::from_millis(200)) => {
                if socket.write_all(&[drip]).await.is_err() {
                    return Sent { bytes, cut_off: true };
                }
                bytes += 1;
            }
        }
    }
    Sent { bytes, cut_off: false }
}

async fn post(client: &herald_delivery::DeliveryClient, addr: SocketAddr) -> herald_delivery::client::Response {
    client
        .post(
            &format!("http://{addr}/hook"),
            HeaderMap::new(),
            Bytes::from_static(b"{}"),
        )
        .await
}

fn status(result: &AttemptResult) -> Option<u16> {
    match result {
        AttemptResult::Response { status, .. } => Some(*status),
        _ => None,
    }
}

const MIB: u64 = 1024 * 1024;

#[tokio::test]
async fn a_slow_drip_body_cannot_hold_the_attempt_past_the_total_timeout() {
    // 100,000 bytes at one byte per 200 ms would take five and a half hours.
    let (addr, done) = serve_one(|socket| {
        drip(
            socket,
            b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n",
            b'x',
            100_000,
        )
    })
    .await;
    let client = loopback_client(ClientConfig {
        total_timeout: Duration::from_secs(1),
        ..ClientConfig::default()
    });
    let response = post(&client, addr).await;
    // The status line arrived before the deadline, so it counts; the body is what dripped in time.
    assert_eq!(status(&response.result), Some(200), "{response:?}");
    assert!(response.body.bytes().all(|b| b == b'x'), "{response:?}");
    assert!(response.body.len() < 100, "{response:?}");
    // A bound, not a performance figure: the drip would take hours, the deadline is one second.
    assert!(response.duration < Duration::from_secs(10), "{response:?}");
    let sent = report(done).await;
    assert!(sent.cut_off, "the client never hung up on the drip: {sent:?}");
}

#[tokio::test]
async fn a_slow_drip_head_is_a_timeout() {
    let (addr, done) = serve_one(|socket| drip(socket, b"HTTP/1.1 200 OK\r\nx-drip: ", b'a', 100_000)).await;
    let client = loopback_client(ClientConfig {
        total_timeout: Duration::from_secs(1),
        ..ClientConfig::default()
    });
    let response = post(&client, addr).await;
    assert_eq!(response.result, AttemptResult::Timeout, "{response:?}");
    assert!(response.body.starts_with("timeout"), "{response:?}");
    assert!(response.duration < Duration::from_secs(10), "{response:?}");
    assert!(report(done).await.cut_off);
}

#[tokio::test]
async fn a_huge_body_is_read_only_up_to_the_cap() {
    // Content-Length and chunked: either way the client must stop reading at 4 KiB, not read 100 MB and keep
    // the first 4 KiB. The server sees the hang-up long before it has written everything.
    let chunk = vec![b'x'; 64 * 1024];
    let mut chunked_chunk = format!("{:x}\r\n", chunk.len()).into_bytes();
    chunked_chunk.extend_from_slice(&chunk);
    chunked_chunk.extend_from_slice(b"\r\n");
    let cases: [(&str, Vec<u8>, Vec<u8>); 2] = [
        (
            "content-length",
            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", 100 * MIB).into_bytes(),
            chunk.clone(),
        ),
        (
            "chunked",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec(),
            chunked_chunk,
        ),
    ];
    for (framing, head, body_chunk) in cases {
        let (addr, done) =
            serve_one(move |socket| async move { flood(socket, &head, &body_chunk, 100 * MIB).await }).await;
        // A generous deadline, so that only the cap can end the read early.
        let client = loopback_client(ClientConfig {
            total_timeout: Duration::from_secs(120),
            ..ClientConfig::default()
        });
        let response = post(&client, addr).await;
        assert_eq!(status(&response.result), Some(200), "{framing}: {response:?}");
        assert_eq!(response.body.len(), 4 * 1024, "{framing}");
        assert!(response.body.bytes().all(|b| b == b'x'), "{framing}");
        let sent = report(done).await;
        assert!(
            sent.cut_off && sent.bytes < 100 * MIB,
            "{framing}: the whole body was sent, so it was read: {sent:?}"
        );
    }
}

#[tokio::test]
async fn the_stored_body_never_exceeds_the_cap_even_when_it_is_not_utf8() {
    let mut answer = b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 8192\r\n\r\n".to_vec();
    answer.extend(std::iter::repeat_n(0xff_u8, 8192));
    let (addr, _done) = serve_one(move |socket| async move { flood(socket, &answer, b"", 0).await }).await;
    let client = loopback_client(ClientConfig::default());
    let response = post(&client, addr).await;
    assert_eq!(status(&response.result), Some(500));
    // Each invalid byte becomes a three-byte replacement character; the text is cut back to the cap.
    assert!(response.body.len() <= 4 * 1024, "{} bytes kept", response.body.len());
    assert!(!response.body.is_empty());
}

#[tokio::test]
async fn never_ending_headers_are_cut_off_at_the_cap() {
    // Many header lines, and one header line that never ends. Neither reaches the blank line that ends a head.
    let mut line = Vec::new();
    for n in 0..100 {
        line.extend_from_slice(format!("x-filler-{n}: {}\r\n", "a".repeat(60)).as_bytes());
    }
    let cases: [(&str, &[u8], Vec<u8>); 2] = [
        ("endless lines", b"HTTP/1.1 200 OK\r\n", line),
        ("endless line", b"HTTP/1.1 200 OK\r\nx-big: ", vec![b'a'; 64 * 1024]),
    ];
    for (shape, first, chunk) in cases {
        let (addr, done) = serve_one(move |socket| async move { flood(socket, first, &chunk, 64 * MIB).await }).await;
        let client = loopback_client(ClientConfig {
            total_timeout: Duration::from_secs(120),
            ..ClientConfig::default()
        });
        let response = post(&client, addr).await;
        assert_eq!(response.result, AttemptResult::ConnectError, "{shape}: {response:?}");
        assert_eq!(
            response.body, "response headers exceed the cap (64 fields, 16384 bytes)",
            "{shape}"
        );
        let sent = report(done).await;
        assert!(sent.cut_off, "{shape}: the client read 64 MiB of headers: {sent:?}");
    }
}

/// A complete response whose head has `fields` headers of `value_len` bytes each.
fn head_with(fields: usize, value_len: usize) -> Vec<u8> {
    let mut head = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n".to_vec();
    for n in 0..fields {
        head.extend_from_slice(format!("x-h-{n}: {}\r\n", "v".repeat(value_len)).as_bytes());
    }
    head.extend_from_slice(b"\r\nok");
    head
}

#[tokio::test]
async fn the_header_caps_are_herald_s_own_not_the_library_defaults() {
    // hyper alone accepts 100 fields and ~400 KB of head; Herald's caps are lower (64 fields, 16 KiB), so each
    // of these complete, modest-looking heads fails only if Herald's caps are in force.
    for (shape, fields, value_len) in [("80 fields", 80, 8), ("40 KiB of head", 40, 1024)] {
        let head = head_with(fields, value_len);
        let (addr, _done) = serve_one(move |socket| async move { flood(socket, &head, b"", 0).await }).await;
        let response = post(&loopback_client(ClientConfig::default()), addr).await;
        assert_eq!(response.result, AttemptResult::ConnectError, "{shape}: {response:?}");
        assert!(
            response.body.starts_with("response headers exceed the cap"),
            "{shape}: {response:?}"
        );
    }
    // And a head within both caps is fine.
    let head = head_with(30, 200);
    let (addr, _done) = serve_one(move |socket| async move { flood(socket, &head, b"", 0).await }).await;
    let response = post(&loopback_client(ClientConfig::default()), addr).await;
    assert_eq!(status(&response.result), Some(200), "{response:?}");
    assert_eq!(response.body, "ok");
}

#[tokio::test]
async fn redirects_are_never_followed() {
    for code in [301, 302, 303, 307, 308] {
        // The redirect's target is another loopback listener, allowed by the policy: only the client's
        // refusal to follow keeps it untouched.
        let target = CountingListener::bind("127.0.0.1:0").await;
        let location = format!("http://{}/hook", target.addr);
        let (addr, _done) = serve_one(move |socket| async move {
            let answer = format!("HTTP/1.1 {code} Moved\r\nlocation: {location}\r\ncontent-length: 0\r\n\r\n");
            flood(socket, answer.as_bytes(), b"", 0).await
        })
        .await;
        let response = post(&loopback_client(ClientConfig::default()), addr).await;
        assert_eq!(status(&response.result), Some(code), "{response:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(target.connections(), 0, "{code} was followed");
    }
}
