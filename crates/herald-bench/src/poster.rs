//! The load generator's hot path: posting a message over a keep-alive HTTP/1.1 connection of its own.
//!
//! A general client costs the harness more per request than it needs to: under `ingest --paused -c 64`
//! a profile of the harness put 13 % of its samples in parsing the same URL again for every request and
//! about 15 % in redirect and retry layers and a pool it never needs. On a two-core machine with the
//! load generator beside the node, every core-second the harness spends is one the node cannot. So a
//! plain `http://` server gets this poster: its idle connections kept in a list (up to a bound), one
//! request at a time on each, the fixed headers built once. Anything else (an `https://` server) goes
//! through the general client, as every request of the setup does.

use std::sync::Mutex;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::api::REQUEST_TIMEOUT;

/// Posts to one plain-HTTP server over keep-alive connections of its own.
pub struct Poster {
    /// `host:port` to connect to.
    address: String,
    /// The server's base path (e.g. `/api/v1`), which every posted path follows.
    base_path: String,
    host: HeaderValue,
    auth: HeaderValue,
    /// Connections waiting for their next post, at most `max_idle` (one beyond it is closed when its
    /// post is answered).
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
    max_idle: usize,
}

impl Poster {
    /// A poster for `base` (`http://host:port/…`) with the `Authorization` value `auth`, keeping up to
    /// `max_idle` idle connections; `None` when the base is not plain HTTP.
    pub fn for_base(base: &str, auth: HeaderValue, max_idle: usize) -> anyhow::Result<Option<Self>> {
        let url = reqwest::Url::parse(base).with_context(|| format!("the server URL {base}"))?;
        if url.scheme() != "http" {
            return Ok(None);
        }
        let host = url.host_str().context("the server URL has no host")?;
        let port = url.port_or_known_default().unwrap_or(80);
        let authority = match url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_owned(),
        };
        Ok(Some(Self {
            address: format!("{host}:{port}"),
            base_path: url.path().trim_end_matches('/').to_owned(),
            host: HeaderValue::from_str(&authority).context("the server's host is not a valid header value")?,
            auth,
            idle: Mutex::new(Vec::new()),
            max_idle,
        }))
    }

    /// Post `body` (JSON) to `path` under the base; `Ok` when the server accepted it (2xx), its answer
    /// read to the end.
    pub async fn post(&self, path: &str, body: String) -> anyhow::Result<()> {
        tokio::time::timeout(REQUEST_TIMEOUT, self.post_on_a_connection(path, body))
            .await
            .with_context(|| format!("posting a message: not done in {} s", REQUEST_TIMEOUT.as_secs()))?
    }

    async fn post_on_a_connection(&self, path: &str, body: String) -> anyhow::Result<()> {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(format!("{}{path}", self.base_path))
            .header(HOST, &self.host)
            .header(AUTHORIZATION, &self.auth)
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .body(Full::new(Bytes::from(body)))
            .context("building the message's request")?;
        let mut kept = self.take_idle();
        loop {
            // A kept connection the server has closed meanwhile (an idle timeout, say) hands the request
            // back unsent: it goes once more, on a new connection. A request that may have been sent is
            // never sent again — the answer is the error.
            let reused = kept.is_some();
            let mut sender = match kept.take() {
                Some(sender) => sender,
                None => self.connect().await?,
            };
            if let Err(error) = sender.ready().await {
                if reused {
                    continue;
                }
                return Err(error).context("posting a message: the new connection closed");
            }
            let response = match sender.try_send_request(request).await {
                Ok(response) => response,
                Err(mut error) => match error.take_message() {
                    Some(unsent) if reused => {
                        request = unsent;
                        continue;
                    }
                    _ => return Err(error.into_error()).context("posting a message"),
                },
            };
            let status = response.status();
            // Read the answer to the end before the connection takes another request.
            let answer = response
                .into_body()
                .collect()
                .await
                .context("reading the answer to a message")?
                .to_bytes();
            self.give_back(sender);
            if !status.is_success() {
                bail!("message refused: {status} {}", crate::api::snippet(&answer));
            }
            return Ok(());
        }
    }

    fn take_idle(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        while let Some(sender) = idle.pop() {
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    fn give_back(&self, sender: SendRequest<Full<Bytes>>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if idle.len() < self.max_idle {
            idle.push(sender);
        }
    }

    async fn connect(&self) -> anyhow::Result<SendRequest<Full<Bytes>>> {
        let stream = TcpStream::connect(&self.address)
            .await
            .with_context(|| format!("connecting to {}", self.address))?;
        // Each request is one write; nothing is gained by holding it back for an ACK.
        stream.set_nodelay(true).context("setting TCP_NODELAY")?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .context("starting HTTP/1.1 on the connection")?;
        // The connection's driver ends when the server closes it or the sender is dropped. Its error is
        // not kept: the sender is then closed, so the connection is not taken again, and a post already
        // on it fails with hyper's own error.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// What a loopback test server does with each request it reads.
    #[derive(Clone, Copy)]
    enum Behaviour {
        /// Answer with this status line and a short JSON body, keeping the connection.
        Answer(&'static str),
        /// Answer `202` and close the connection right after (without saying so in a header), as a
        /// server whose idle timeout strikes between two posts does.
        AnswerAndClose,
        /// Answer a connection's first request with `202`, and close it at the second without answering:
        /// that request may or may not have been acted on.
        HangUpAtTheSecond,
    }

    /// What a loopback test server saw: each request's head, as text, and the connections it accepted.
    #[derive(Default)]
    struct Seen {
        heads: Mutex<Vec<String>>,
        connections: AtomicUsize,
    }

    impl Seen {
        fn heads(&self) -> Vec<String> {
            self.heads.lock().expect("heads").clone()
        }

        fn connections(&self) -> usize {
            self.connections.load(Ordering::SeqCst)
        }
    }

    /// A raw HTTP/1.1 server on loopback treating every request as `behaviour` says.
    async fn server(behaviour: Behaviour) -> (String, Arc<Seen>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a loopback port");
        let address = listener.local_addr().expect("the listener's address");
        let seen = Arc::new(Seen::default());
        let recorder = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                recorder.connections.fetch_add(1, Ordering::SeqCst);
                let recorder = recorder.clone();
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    let mut chunk = [0u8; 4096];
                    let mut requests = 0;
                    loop {
                        let Ok(read) = stream.read(&mut chunk).await else {
                            return;
                        };
                        if read == 0 {
                            return;
                        }
                        buffer.extend_from_slice(&chunk[..read]);
                        // Every request here has a small body: wait for the head and that many bytes.
                        let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
                            continue;
                        };
                        let head = String::from_utf8_lossy(&buffer[..end]).to_string();
                        let length = head
                            .lines()
                            .find_map(|line| {
                                line.to_ascii_lowercase()
                                    .strip_prefix("content-length: ")
                                    .map(str::to_owned)
                            })
                            .and_then(|value| value.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if buffer.len() < end + 4 + length {
                            continue;
                        }
                        buffer.drain(..end + 4 + length);
                        recorder.heads.lock().expect("heads").push(head);
                        requests += 1;
                        let status = match behaviour {
                            Behaviour::Answer(status) => status,
                            Behaviour::AnswerAndClose => "202 Accepted",
                            Behaviour::HangUpAtTheSecond if requests > 1 => return,
                            Behaviour::HangUpAtTheSecond => "202 Accepted",
                        };
                        let answer = format!("HTTP/1.1 {status}\r\ncontent-length: 10\r\n\r\n{{\"id\":\"m\"}}");
                        if stream.write_all(answer.as_bytes()).await.is_err()
                            || matches!(behaviour, Behaviour::AnswerAndClose)
                        {
                            return;
                        }
                    }
                });
            }
        });
        (format!("http://{address}"), seen)
    }

    fn auth() -> HeaderValue {
        HeaderValue::from_static("Bearer tok")
    }

    fn poster(base: &str) -> Poster {
        Poster::for_base(base, auth(), 8)
            .expect("a valid base")
            .expect("plain HTTP gets a poster")
    }

    #[tokio::test]
    async fn posts_under_the_base_path_with_its_headers_on_one_kept_connection() {
        let (server, seen) = server(Behaviour::Answer("202 Accepted")).await;
        let poster = poster(&format!("{server}/prefix/api/v1/"));
        for _ in 0..3 {
            poster
                .post("/app/a/msg?with_content=false", r#"{"eventType":"t"}"#.to_owned())
                .await
                .expect("accepted");
        }
        let heads = seen.heads();
        assert_eq!(heads.len(), 3);
        let authority = server.trim_start_matches("http://");
        for head in &heads {
            let lines: Vec<String> = head.lines().map(str::to_ascii_lowercase).collect();
            assert_eq!(
                lines[0], "post /prefix/api/v1/app/a/msg?with_content=false http/1.1",
                "{head}"
            );
            assert!(lines.contains(&format!("host: {authority}")), "{head}");
            assert!(lines.contains(&"authorization: bearer tok".to_owned()), "{head}");
            assert!(lines.contains(&"content-type: application/json".to_owned()), "{head}");
            assert!(lines.contains(&"content-length: 17".to_owned()), "{head}");
        }
        // Sequential posts kept one connection.
        assert_eq!(seen.connections(), 1);
        assert_eq!(poster.idle.lock().expect("idle").len(), 1);
    }

    /// A connection the server closed after answering is not taken for the next post, which goes on a
    /// new one. (On loopback the close is seen before the next post; the resend of a request hyper
    /// hands back unsent, for a close seen only as the next request goes out, is a race this test
    /// cannot force.)
    #[tokio::test]
    async fn a_connection_the_server_closed_costs_no_post() {
        let (server, seen) = server(Behaviour::AnswerAndClose).await;
        let poster = poster(&server);
        for n in 0..20 {
            poster
                .post("/msg", format!(r#"{{"n":{n}}}"#))
                .await
                .unwrap_or_else(|error| panic!("post {n} failed: {error:#}"));
        }
        assert_eq!(seen.heads().len(), 20);
        assert_eq!(seen.connections(), 20);
    }

    /// A post that reached the server is never sent again, whatever became of it: an answer that never
    /// comes is the post's error.
    #[tokio::test]
    async fn a_post_the_server_read_and_never_answered_fails_and_is_not_sent_again() {
        let (server, seen) = server(Behaviour::HangUpAtTheSecond).await;
        let poster = poster(&server);
        poster
            .post("/msg", "{}".to_owned())
            .await
            .expect("the first is answered");
        // The second goes on the kept connection, which the server closes having read it.
        poster.post("/msg", "{}".to_owned()).await.expect_err("hung up");
        // Give a resend, were there one, the time to arrive.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert_eq!(seen.heads().len(), 2);
        assert_eq!(seen.connections(), 1);
    }

    #[tokio::test]
    async fn a_refusal_is_an_error_with_its_status_and_the_connection_stays_usable() {
        let (server, seen) = server(Behaviour::Answer("401 Unauthorized")).await;
        let poster = poster(&server);
        let error = poster.post("/msg", "{}".to_owned()).await.expect_err("refused");
        assert_eq!(format!("{error:#}"), r#"message refused: 401 Unauthorized {"id":"m"}"#);
        poster.post("/msg", "{}".to_owned()).await.expect_err("refused again");
        assert_eq!(seen.heads().len(), 2);
        assert_eq!(seen.connections(), 1);
    }

    #[test]
    fn only_plain_http_gets_a_poster() {
        assert!(
            Poster::for_base("https://example.com/api/v1", auth(), 8)
                .expect("valid")
                .is_none()
        );
        assert!(Poster::for_base("not a url", auth(), 8).is_err());
        let poster = poster("http://localhost/api/v1");
        assert_eq!(poster.address, "localhost:80");
        assert_eq!(poster.host, "localhost");
        assert_eq!(poster.base_path, "/api/v1");
    }

    #[tokio::test]
    async fn nothing_listening_is_an_error_naming_the_address() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        drop(listener);
        let poster = poster(&format!("http://{address}"));
        let error = poster.post("/msg", "{}".to_owned()).await.expect_err("nothing listens");
        assert!(
            format!("{error:#}").contains(&format!("connecting to {address}")),
            "{error:#}"
        );
    }
}
