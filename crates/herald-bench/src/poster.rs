//! The load generator's hot path: posting a message over a keep-alive HTTP/1.1 connection of its own.
//!
//! A general client costs the harness more per request than the node it measures spends on parts of
//! it: under `ingest --paused -c 64` a profile of the harness showed a tenth of its time parsing the
//! same URL again for every request and as much again in redirect and retry layers it never uses. On a
//! two-core machine with the load generator beside the node, every core-second the harness spends is
//! taken from the node. So a plain `http://` server gets this poster: a few idle connections kept in a
//! list, one request at a time on each, its fixed headers built once. Anything else (an `https://`
//! server) goes through the general client, as every request of the setup does.

use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// How long one post may take, as the general client's timeout.
const POST_TIMEOUT: Duration = Duration::from_secs(60);

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
        tokio::time::timeout(POST_TIMEOUT, self.post_on_a_connection(path, body))
            .await
            .context("posting a message: no answer in 60 s")?
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
            if sender.ready().await.is_err() && reused {
                continue;
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
        // The connection's driver ends when the server closes it or the sender is dropped; its error, if
        // any, is the next post's to see (the sender is then closed).
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// What a loopback server saw of each request: its head, as text.
    type Heads = Arc<Mutex<Vec<String>>>;

    /// A raw HTTP/1.1 server on loopback answering every request with `status` and a short JSON body;
    /// with `close_after_answer` it closes each connection right after its first answer (without saying
    /// so in a header), as a server whose idle timeout strikes between two posts does.
    async fn server(status: &'static str, close_after_answer: bool) -> (String, Heads) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a loopback port");
        let address = listener.local_addr().expect("the listener's address");
        let heads = Heads::default();
        let seen = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    let mut chunk = [0u8; 4096];
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
                        seen.lock().expect("heads").push(head);
                        let answer = format!("HTTP/1.1 {status}\r\ncontent-length: 10\r\n\r\n{{\"id\":\"m\"}}");
                        if stream.write_all(answer.as_bytes()).await.is_err() || close_after_answer {
                            return;
                        }
                    }
                });
            }
        });
        (format!("http://{address}"), heads)
    }

    fn auth() -> HeaderValue {
        HeaderValue::from_static("Bearer tok")
    }

    #[tokio::test]
    async fn posts_under_the_base_path_with_its_headers_on_one_kept_connection() {
        let (server, heads) = server("202 Accepted", false).await;
        let poster = Poster::for_base(&format!("{server}/prefix/api/v1/"), auth(), 8)
            .expect("a valid base")
            .expect("plain HTTP gets a poster");
        for _ in 0..3 {
            poster
                .post("/app/a/msg?with_content=false", r#"{"eventType":"t"}"#.to_owned())
                .await
                .expect("accepted");
        }
        let heads = heads.lock().expect("heads").clone();
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
        assert_eq!(poster.idle.lock().expect("idle").len(), 1);
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_costs_no_post() {
        let (server, heads) = server("202 Accepted", true).await;
        let poster = Poster::for_base(&server, auth(), 8)
            .expect("a valid base")
            .expect("plain HTTP");
        for n in 0..20 {
            poster
                .post("/msg", format!(r#"{{"n":{n}}}"#))
                .await
                .unwrap_or_else(|error| panic!("post {n} failed: {error:#}"));
        }
        assert_eq!(heads.lock().expect("heads").len(), 20);
    }

    #[tokio::test]
    async fn a_refusal_is_an_error_with_its_status_and_the_connection_stays_usable() {
        let (server, heads) = server("401 Unauthorized", false).await;
        let poster = Poster::for_base(&server, auth(), 8)
            .expect("a valid base")
            .expect("plain HTTP");
        let error = poster.post("/msg", "{}".to_owned()).await.expect_err("refused");
        assert_eq!(format!("{error:#}"), r#"message refused: 401 Unauthorized {"id":"m"}"#);
        poster.post("/msg", "{}".to_owned()).await.expect_err("refused again");
        assert_eq!(heads.lock().expect("heads").len(), 2);
        assert_eq!(poster.idle.lock().expect("idle").len(), 1);
    }

    #[test]
    fn only_plain_http_gets_a_poster() {
        assert!(
            Poster::for_base("https://example.com/api/v1", auth(), 8)
                .expect("valid")
                .is_none()
        );
        assert!(Poster::for_base("not a url", auth(), 8).is_err());
        let poster = Poster::for_base("http://localhost/api/v1", auth(), 8)
            .expect("valid")
            .expect("plain");
        assert_eq!(poster.address, "localhost:80");
        assert_eq!(poster.host, "localhost");
        assert_eq!(poster.base_path, "/api/v1");
    }

    #[tokio::test]
    async fn nothing_listening_is_an_error_naming_the_address() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        drop(listener);
        let poster = Poster::for_base(&format!("http://{address}"), auth(), 8)
            .expect("valid")
            .expect("plain");
        let error = poster.post("/msg", "{}".to_owned()).await.expect_err("nothing listens");
        assert!(
            format!("{error:#}").contains(&format!("connecting to {address}")),
            "{error:#}"
        );
    }
}
