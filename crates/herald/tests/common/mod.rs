//! Test harness: the real `herald` binary on a temporary SQLite file or a fresh PostgreSQL database,
//! and real HTTP receivers on loopback.
//!
//! [`Herald::start`] uses SQLite, or PostgreSQL for every test when `HERALD_TEST_BACKEND=postgres`;
//! [`Herald::start_pg`] always uses PostgreSQL (`None`, with a visible "SKIPPED" line, when it is
//! unreachable and `HERALD_REQUIRE_POSTGRES` is not `1`); [`Herald::start_on`] starts another node on
//! the same database. Each test file uses only part of this module.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use herald_store::testdb::{self, TestDatabase};
use serde_json::Value;
use tokio::sync::Notify;

pub const TOKEN: &str = "test-admin-token";

/// A running `herald serve` process.
pub struct Herald {
    child: Option<Child>,
    pub addr: SocketAddr,
    pub dir: Arc<tempfile::TempDir>,
    pub env: Vec<(String, String)>,
    pub stdout_lines: Vec<String>,
    /// The subcommand and its arguments (`serve`, or `inbox --config …`).
    pub args: Vec<String>,
    /// The PostgreSQL database, when the node runs on one (shared by every node started on it).
    pub database: Option<Arc<TestDatabase>>,
    http: reqwest::Client,
}

/// Whether every test runs on PostgreSQL (`HERALD_TEST_BACKEND=postgres`).
pub fn postgres_backend() -> bool {
    std::env::var("HERALD_TEST_BACKEND").is_ok_and(|b| b == "postgres")
}

/// The harness's settings for every node, overridden by a test's own.
fn test_env(extra_env: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        ("HERALD_ADMIN_TOKEN".into(), TOKEN.into()),
        ("HERALD_ALLOW_PRIVATE_CIDRS".into(), "127.0.0.0/8".into()),
        ("HERALD_ALLOW_HTTP".into(), "true".into()),
        ("HERALD_RETRY_SCHEDULE".into(), "100ms,200ms".into()),
        ("HERALD_CONNECT_TIMEOUT".into(), "1s".into()),
        ("HERALD_REQUEST_TIMEOUT".into(), "2s".into()),
        // A node handing a partition over waits out the longest attempt an endpoint may take (this bound):
        // keep it at the request timeout so rebalancing in cluster tests takes seconds, not a minute.
        ("HERALD_MAX_REQUEST_TIMEOUT".into(), "2s".into()),
        // A restarted node takes its predecessor's partitions over after at most this long.
        ("HERALD_LEASE_TTL".into(), "4s".into()),
    ];
    for (k, v) in extra_env {
        env.retain(|(key, _)| key != k);
        env.push(((*k).into(), (*v).into()));
    }
    env
}

impl Herald {
    /// Start with a fresh database, loopback allowed, a fast retry schedule and the test token.
    pub async fn start(extra_env: &[(&str, &str)]) -> Self {
        if postgres_backend() {
            let database = testdb::fresh("an end-to-end test")
                .await
                .expect("HERALD_TEST_BACKEND=postgres needs a reachable PostgreSQL");
            return Self::start_on(Arc::new(database), extra_env).await;
        }
        let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
        Self::spawn(dir, test_env(extra_env), None, vec!["serve".into()], None).await
    }

    /// Start `herald inbox` with this configuration (written to `inbox.toml` in a fresh directory), the
    /// test token, and a fresh database, on `addr` if given: a SQLite file, or a PostgreSQL database when
    /// `HERALD_TEST_BACKEND=postgres`.
    pub async fn start_inbox(config: &str, extra_env: &[(&str, &str)], addr: Option<SocketAddr>) -> Self {
        if postgres_backend() {
            return Self::start_inbox_pg("an inbox end-to-end test", config, extra_env, addr)
                .await
                .expect("HERALD_TEST_BACKEND=postgres needs a reachable PostgreSQL");
        }
        Self::spawn_inbox(config, extra_env, addr, None).await
    }

    /// Start `herald inbox` on a fresh PostgreSQL database; `None` when PostgreSQL is unreachable (and not
    /// required).
    pub async fn start_inbox_pg(
        test: &str,
        config: &str,
        extra_env: &[(&str, &str)],
        addr: Option<SocketAddr>,
    ) -> Option<Self> {
        let database = testdb::fresh(test).await?;
        Some(Self::spawn_inbox(config, extra_env, addr, Some(Arc::new(database))).await)
    }

    /// Start `herald inbox` on an existing PostgreSQL database (e.g. a sender's).
    pub async fn start_inbox_on(
        database: Arc<TestDatabase>,
        config: &str,
        extra_env: &[(&str, &str)],
        addr: Option<SocketAddr>,
    ) -> Self {
        Self::spawn_inbox(config, extra_env, addr, Some(database)).await
    }

    async fn spawn_inbox(
        config: &str,
        extra_env: &[(&str, &str)],
        addr: Option<SocketAddr>,
        database: Option<Arc<TestDatabase>>,
    ) -> Self {
        let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
        let path = dir.path().join("inbox.toml");
        std::fs::write(&path, config).expect("write inbox.toml");
        let mut env: Vec<(String, String)> = vec![("HERALD_ADMIN_TOKEN".into(), TOKEN.into())];
        if let Some(database) = &database {
            env.push(("HERALD_DATABASE_URL".into(), database.url.clone()));
        }
        env.extend(extra_env.iter().map(|(k, v)| ((*k).into(), (*v).into())));
        let args = vec!["inbox".into(), "--config".into(), path.display().to_string()];
        Self::spawn(dir, env, addr, args, database).await
    }

    /// Start on a fresh PostgreSQL database; `None` when PostgreSQL is unreachable (and not required).
    pub async fn start_pg(test: &str, extra_env: &[(&str, &str)]) -> Option<Self> {
        let database = testdb::fresh(test).await?;
        Some(Self::start_on(Arc::new(database), extra_env).await)
    }

    /// Start a node on an existing PostgreSQL database (e.g. another node of a cluster).
    pub async fn start_on(database: Arc<TestDatabase>, extra_env: &[(&str, &str)]) -> Self {
        Self::start_at(database.clone(), &database.url, extra_env).await
    }

    /// Start a node on `database`, reaching it at `url` (e.g. through a proxy in front of it).
    pub async fn start_at(database: Arc<TestDatabase>, url: &str, extra_env: &[(&str, &str)]) -> Self {
        let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
        // A PostgreSQL database needs the secret key configured (every node the same).
        let mut env = vec![
            ("HERALD_DATABASE_URL", url),
            ("HERALD_SECRET_KEY", testdb::TEST_SECRET_KEY),
        ];
        env.extend_from_slice(extra_env);
        Self::spawn(dir, test_env(&env), None, vec!["serve".into()], Some(database)).await
    }

    /// Start again on the same database (after [`Herald::kill9`] or [`Herald::stop`]).
    pub async fn restart(&mut self) {
        let again = Self::spawn(
            self.dir.clone(),
            self.env.clone(),
            Some(self.addr),
            self.args.clone(),
            self.database.clone(),
        )
        .await;
        *self = again;
    }

    /// Whether the process is still running (it has not exited, e.g. by a panic).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    pub fn db_path(&self) -> PathBuf {
        self.dir.path().join("herald.db")
    }

    async fn spawn(
        dir: Arc<tempfile::TempDir>,
        env: Vec<(String, String)>,
        addr: Option<SocketAddr>,
        args: Vec<String>,
        database: Option<Arc<TestDatabase>>,
    ) -> Self {
        let listen = addr.map_or_else(|| "127.0.0.1:0".to_owned(), |a| a.to_string());
        let mut command = Command::new(env!("CARGO_BIN_EXE_herald"));
        command
            .args(&args)
            .current_dir(dir.path())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "warn")
            .env("HERALD_LISTEN", &listen)
            .env(
                "HERALD_DATABASE_URL",
                format!("sqlite://{}", dir.path().join("herald.db").display()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in &env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("spawn herald");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stdout_lines = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        let addr = loop {
            let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) else {
                // Never leave an orphan server behind a failed start.
                let _ = child.kill();
                let _ = child.wait();
                panic!("herald did not start");
            };
            stdout_lines.push(line.clone());
            // `herald listening on …` or `herald inbox listening on …`.
            if let Some((_, rest)) = line.split_once("listening on http://") {
                break rest.parse().expect("address");
            }
        };
        // reqwest is built without a default TLS provider (Herald picks ring); the tests must pick too.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder().no_proxy().build().expect("client");
        Self {
            child: Some(child),
            addr,
            dir,
            env,
            stdout_lines,
            args,
            database,
            http,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}/api/v1{}", self.addr, path)
    }

    /// POST raw bytes to a path outside `/api/v1` (e.g. the inbox's `/in/{source}`); returns the status
    /// and the JSON body (Null when empty).
    pub async fn post_raw(&self, path: &str, body: &[u8], headers: &[(&str, &str)]) -> (u16, Value) {
        let mut request = self
            .http
            .post(format!("http://{}{path}", self.addr))
            .body(body.to_vec());
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let response = request.send().await.expect("request");
        let status = response.status().as_u16();
        let bytes = response.bytes().await.expect("body");
        let json = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("JSON body")
        };
        (status, json)
    }

    /// Send a request with the admin token; returns the status and the JSON body (Null when empty).
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_with(
            method,
            path,
            body.map(|b| b.to_string().into_bytes()),
            &[("authorization", &format!("Bearer {TOKEN}"))],
        )
        .await
    }

    pub async fn call_with(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = self.http.request(method, self.url(path));
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        if let Some(body) = body {
            request = request.header("content-type", "application/json").body(body);
        }
        let response = request.send().await.expect("request");
        let status = response.status().as_u16();
        let bytes = response.bytes().await.expect("body");
        let json = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("JSON body")
        };
        (status, json)
    }

    pub async fn post(&self, path: &str, body: Value) -> Value {
        let (status, json) = self.call("POST", path, Some(body)).await;
        assert!((200..300).contains(&status), "POST {path}: {status} {json}");
        json
    }

    pub async fn get(&self, path: &str) -> Value {
        let (status, json) = self.call("GET", path, None).await;
        assert_eq!(status, 200, "GET {path}: {json}");
        json
    }

    /// Create an app and return its id.
    pub async fn app(&self, name: &str) -> String {
        self.post("/app", serde_json::json!({ "name": name })).await["id"]
            .as_str()
            .expect("id")
            .to_owned()
    }

    /// Create an endpoint and return (id, secret).
    pub async fn endpoint(&self, app: &str, body: Value) -> (String, String) {
        let ep = self.post(&format!("/app/{app}/endpoint"), body).await;
        let id = ep["id"].as_str().expect("id").to_owned();
        let secret = self.get(&format!("/app/{app}/endpoint/{id}/secret")).await["key"]
            .as_str()
            .expect("key")
            .to_owned();
        (id, secret)
    }

    /// Attempts of a message, oldest first.
    pub async fn attempts(&self, app: &str, msg: &str) -> Vec<Value> {
        let mut list = self.get(&format!("/app/{app}/attempt/msg/{msg}?limit=250")).await["data"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        list.reverse();
        list
    }

    /// Wait until `check` holds on the attempts of a message.
    pub async fn wait_attempts(
        &self,
        app: &str,
        msg: &str,
        timeout: Duration,
        check: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let attempts = self.attempts(app, msg).await;
            if check(&attempts) {
                return attempts;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting on attempts: {attempts:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL: no shutdown path runs.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("kill");
            let _ = child.wait();
        }
    }
}

impl Drop for Herald {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// One request a receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub headers: HeaderMap,
    pub body: Bytes,
    pub at: Instant,
    /// Requests in flight at this receiver when this one arrived, itself included.
    pub concurrent: usize,
    /// The status it was answered with.
    pub status: u16,
}

impl Received {
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
    }
}

/// What a receiver answers.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub delay: Duration,
    /// Answer with the request's own body (e.g. to echo a verification challenge).
    pub echo: bool,
}

impl Reply {
    pub fn status(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: String::new(),
            delay: Duration::ZERO,
            echo: false,
        }
    }

    pub fn echo(mut self) -> Self {
        self.echo = true;
        self
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn body(mut self, body: &str) -> Self {
        self.body = body.into();
        self
    }

    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

#[derive(Default)]
struct ReceiverState {
    received: Mutex<Vec<Received>>,
    script: Mutex<VecDeque<Reply>>,
    fallback: Mutex<Option<Reply>>,
    /// Replies chosen by the request body: the first rule whose pattern the body contains wins.
    rules: Mutex<Vec<(String, Reply)>>,
    notify: Notify,
    in_flight: std::sync::atomic::AtomicUsize,
    peak: std::sync::atomic::AtomicUsize,
}

/// Counts a request out of the receiver's in-flight total however the handler ends (the client may
/// hang up on a slow reply, which drops the handler mid-sleep).
struct InFlight(Arc<ReceiverState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A real HTTP receiver on loopback that records every request and answers from a script.
#[derive(Clone)]
pub struct Receiver {
    pub addr: SocketAddr,
    state: Arc<ReceiverState>,
    shutdown: Arc<Notify>,
}

impl Receiver {
    /// A receiver answering `fallback` to every request not covered by a scripted reply.
    pub async fn start(fallback: Reply) -> Self {
        Self::bind("127.0.0.1:0".parse().expect("addr"), fallback).await
    }

    pub async fn bind(addr: SocketAddr, fallback: Reply) -> Self {
        let state = Arc::new(ReceiverState::default());
        *state.fallback.lock().unwrap() = Some(fallback);
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind receiver");
        let addr = listener.local_addr().expect("addr");
        let app = axum::Router::new().fallback(handle).with_state(state.clone());
        let shutdown = Arc::new(Notify::new());
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.notified().await })
                .await;
        });
        Self { addr, state, shutdown }
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// Answer the next requests with these replies, in order.
    pub fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        self.state.script.lock().unwrap().extend(replies);
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    /// Answer every request not covered by the script with `reply` from now on.
    pub fn set_fallback(&self, reply: Reply) {
        *self.state.fallback.lock().unwrap() = Some(reply);
    }

    /// Answer requests whose body contains `pattern` with `reply` (before the script and the fallback).
    pub fn rule(&self, pattern: &str, reply: Reply) {
        self.state.rules.lock().unwrap().push((pattern.to_owned(), reply));
    }

    /// Requests being handled right now.
    pub fn in_flight(&self) -> usize {
        self.state.in_flight.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The most requests ever handled at once.
    pub fn peak_in_flight(&self) -> usize {
        self.state.peak.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How many requests carried each `webhook-id`, and how many of them were answered 2xx.
    pub fn per_message(&self) -> std::collections::HashMap<String, (usize, usize)> {
        let mut counts = std::collections::HashMap::new();
        for r in self.received() {
            let entry = counts.entry(r.header("webhook-id").to_owned()).or_insert((0, 0));
            entry.0 += 1;
            if (200..300).contains(&r.status) {
                entry.1 += 1;
            }
        }
        counts
    }

    /// Wait until at least `n` requests arrived.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.state.notify.notified();
            let got = self.received();
            if got.len() >= n {
                return got;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "receiver got {} of {n} requests", got.len());
            let _ = tokio::time::timeout(left, notified).await;
        }
    }

    pub fn stop(&self) {
        self.shutdown.notify_waiters();
    }
}

async fn handle(State(state): State<Arc<ReceiverState>>, headers: HeaderMap, body: Bytes) -> Response {
    use std::sync::atomic::Ordering::SeqCst;
    let concurrent = state.in_flight.fetch_add(1, SeqCst) + 1;
    state.peak.fetch_max(concurrent, SeqCst);
    let _guard = InFlight(state.clone());
    let text = String::from_utf8_lossy(&body).into_owned();
    let by_rule = state
        .rules
        .lock()
        .unwrap()
        .iter()
        .find(|(pattern, _)| text.contains(pattern.as_str()))
        .map(|(_, reply)| reply.clone());
    let reply = by_rule
        .or_else(|| state.script.lock().unwrap().pop_front())
        .or_else(|| state.fallback.lock().unwrap().clone());
    let reply = reply.unwrap_or_else(|| Reply::status(200));
    state.received.lock().unwrap().push(Received {
        headers,
        body,
        at: Instant::now(),
        concurrent,
        status: reply.status,
    });
    state.notify.notify_waiters();
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let body = if reply.echo { text } else { reply.body };
    let mut response = (StatusCode::from_u16(reply.status).expect("status"), body).into_response();
    for (k, v) in reply.headers {
        response.headers_mut().insert(
            axum::http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
            axum::http::HeaderValue::from_str(&v).expect("value"),
        );
    }
    response
}

/// A port that nothing listens on right now (bound then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// A TCP proxy on loopback in front of another address, that a test can cut and restore: a database
/// outage for one node without touching the shared server.
pub struct TcpProxy {
    pub port: u16,
    target: SocketAddr,
    running: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl TcpProxy {
    pub async fn start(target: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let proxy = Self {
            port,
            target,
            running: Mutex::new(None),
        };
        proxy.serve(listener);
        proxy
    }

    fn serve(&self, listener: tokio::net::TcpListener) {
        let target = self.target;
        let task = tokio::spawn(async move {
            // Connections live in this set: aborting the task drops it, which aborts (and closes) them.
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                connections.spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                while connections.try_join_next().is_some() {}
            }
        });
        *self.running.lock().unwrap() = Some(task);
    }

    /// Close every proxied connection and refuse new ones.
    pub fn cut(&self) {
        if let Some(task) = self.running.lock().unwrap().take() {
            task.abort();
        }
    }

    /// Accept connections again, on the same port.
    pub async fn restore(&self) {
        let addr: SocketAddr = format!("127.0.0.1:{}", self.port).parse().expect("addr");
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match tokio::net::TcpListener::bind(addr).await {
                Ok(listener) => break listener,
                Err(error) => {
                    assert!(Instant::now() < deadline, "cannot re-bind the proxy: {error}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        self.serve(listener);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.cut();
    }
}
