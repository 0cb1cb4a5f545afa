//! Test harness: the real `herald` binary on a temporary SQLite file or a fresh PostgreSQL database,
//! and real HTTP receivers on loopback.
//!
//! [`Herald::start`] uses SQLite, or PostgreSQL for every test when `HERALD_TEST_BACKEND=postgres`;
//! [`Herald::start_pg`] always uses PostgreSQL (`None`, with a visible "SKIPPED" line, when it is
//! unreachable and `HERALD_REQUIRE_POSTGRES` is not `1`); [`Herald::start_on`] starts another node on
//! the same database. Each test file uses only part of this module.
#![allow(dead_code)]

pub(crate) mod faults;
pub(crate) mod producer;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use herald_store::testdb::{self, TestDatabase};
use serde_json::Value;
use tokio::sync::Notify;

pub(crate) const TOKEN: &str = "test-admin-token";

/// The Python interpreter of the virtual environment `scripts/test` installs the pinned `svix` 2.x SDK
/// into (tests/compat/python-v2; under `HERALD_TEST_SDK_DIR`, by default this workspace's target/); panics
/// with what to do when it is missing.
pub(crate) fn python_with_svix() -> PathBuf {
    let python = test_python();
    assert!(
        python.exists(),
        "{} is missing: run scripts/test (it installs the pinned SDKs under target/)",
        python.display()
    );
    python
}

/// A setting of the harness, not of Herald: a command (words separated by spaces) that `herald` is
/// started through and that `exec`s it, e.g. `prlimit --nofile=1024`; the process keeps Herald's pid.
pub(crate) const LAUNCHER: &str = "HERALD_TEST_LAUNCHER";

/// A running `herald serve` process.
pub(crate) struct Herald {
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
pub(crate) fn postgres_backend() -> bool {
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
        // A node handing a partition over waits for its attempts in flight, at most the longest attempt an
        // endpoint may take (this bound) and a lease time: kept at the request timeout, a hung attempt
        // holds a partition for seconds, not a minute.
        ("HERALD_MAX_REQUEST_TIMEOUT".into(), "2s".into()),
        // A restarted node takes its predecessor's partitions over after at most this long.
        ("HERALD_LEASE_TTL".into(), "4s".into()),
        // PostgreSQL on a loaded CI machine may take longer than the 1 s default to commit a batch; the
        // fault tests set the default back and assert its bound.
        ("HERALD_DATABASE_TIMEOUT".into(), "5s".into()),
    ];
    for (k, v) in extra_env {
        env.retain(|(key, _)| key != k);
        env.push(((*k).into(), (*v).into()));
    }
    env
}

impl Herald {
    /// Start with a fresh database, loopback allowed, a fast retry schedule and the test token.
    pub(crate) async fn start(extra_env: &[(&str, &str)]) -> Self {
        if postgres_backend() {
            let database = testdb::fresh("an end-to-end test")
                .await
                .expect("HERALD_TEST_BACKEND=postgres needs a reachable PostgreSQL");
            return Self::start_on(Arc::new(database), extra_env).await;
        }
        let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
        Self::spawn(dir, test_env(extra_env), None, vec!["serve".into()], None).await
    }

    /// Start with a fresh SQLite file (`herald.db` in its directory), whatever `HERALD_TEST_BACKEND` says.
    pub(crate) async fn start_sqlite(extra_env: &[(&str, &str)]) -> Self {
        let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
        Self::spawn(dir, test_env(extra_env), None, vec!["serve".into()], None).await
    }

    /// Start `herald inbox` with this configuration on a fresh SQLite file (`herald.db` in its
    /// directory), whatever `HERALD_TEST_BACKEND` says.
    pub(crate) async fn start_inbox_sqlite(config: &str) -> Self {
        Self::spawn_inbox(config, &[], None, None).await
    }

    /// Start `herald inbox` with this configuration (written to `inbox.toml` in a fresh directory), the
    /// test token, and a fresh database, on `addr` if given: a SQLite file, or a PostgreSQL database when
    /// `HERALD_TEST_BACKEND=postgres`.
    pub(crate) async fn start_inbox(config: &str, extra_env: &[(&str, &str)], addr: Option<SocketAddr>) -> Self {
        if postgres_backend() {
            return Self::start_inbox_pg("an inbox end-to-end test", config, extra_env, addr)
                .await
                .expect("HERALD_TEST_BACKEND=postgres needs a reachable PostgreSQL");
        }
        Self::spawn_inbox(config, extra_env, addr, None).await
    }

    /// Start `herald inbox` on a fresh PostgreSQL database; `None` when PostgreSQL is unreachable (and not
    /// required).
    pub(crate) async fn start_inbox_pg(
        test: &str,
        config: &str,
        extra_env: &[(&str, &str)],
        addr: Option<SocketAddr>,
    ) -> Option<Self> {
        let database = testdb::fresh(test).await?;
        Some(Self::spawn_inbox(config, extra_env, addr, Some(Arc::new(database))).await)
    }

    /// Start `herald inbox` on an existing PostgreSQL database (e.g. a sender's).
    pub(crate) async fn start_inbox_on(
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
    pub(crate) async fn start_pg(test: &str, extra_env: &[(&str, &str)]) -> Option<Self> {
        let database = testdb::fresh(test).await?;
        Some(Self::start_on(Arc::new(database), extra_env).await)
    }

    /// Start a node on an existing PostgreSQL database (e.g. another node of a cluster).
    pub(crate) async fn start_on(database: Arc<TestDatabase>, extra_env: &[(&str, &str)]) -> Self {
        Self::start_at(database.clone(), &database.url, extra_env).await
    }

    /// Start a node on `database`, reaching it at `url` (e.g. through a proxy in front of it).
    pub(crate) async fn start_at(database: Arc<TestDatabase>, url: &str, extra_env: &[(&str, &str)]) -> Self {
        let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
        // A PostgreSQL database needs the secret key configured (every node the same).
        let mut env = vec![
            ("HERALD_DATABASE_URL", url),
            ("HERALD_SECRET_KEY", testdb::TEST_SECRET_KEY),
        ];
        env.extend_from_slice(extra_env);
        Self::spawn(dir, test_env(&env), None, vec!["serve".into()], Some(database)).await
    }

    /// Start on a fresh PostgreSQL database reached through a [`TcpProxy`] of the test's own, so that the
    /// test can cut, hold or slow this node's database, or cut a connection at its `COMMIT`; `None` when
    /// PostgreSQL is unreachable (and not required). Call it from a multi-threaded runtime: the proxy
    /// must serve while the node starts.
    pub(crate) async fn start_behind_proxy(test: &str, extra_env: &[(&str, &str)]) -> Option<(Self, TcpProxy)> {
        let (database, proxy, url) = proxied_database(test).await?;
        Some((Self::start_at(database, &url, extra_env).await, proxy))
    }

    /// Start `herald inbox` with this configuration on a fresh PostgreSQL database reached through a
    /// [`TcpProxy`], as [`Herald::start_behind_proxy`] does the sender.
    pub(crate) async fn start_inbox_behind_proxy(
        test: &str,
        config: &str,
        extra_env: &[(&str, &str)],
    ) -> Option<(Self, TcpProxy)> {
        let (database, proxy, url) = proxied_database(test).await?;
        let mut env = vec![("HERALD_DATABASE_URL", url.as_str())];
        env.extend_from_slice(extra_env);
        Some((Self::spawn_inbox(config, &env, None, Some(database)).await, proxy))
    }

    /// Start again on the same database (after [`Herald::kill9`] or [`Herald::stop`]).
    pub(crate) async fn restart(&mut self) {
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
    pub(crate) fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// The process id (of `herald` itself, also when started through a [`LAUNCHER`]).
    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).expect("the process is running")
    }

    pub(crate) fn db_path(&self) -> PathBuf {
        self.dir.path().join("herald.db")
    }

    /// The command that starts `herald ARGS` in `dir` with the harness's environment and `env`.
    fn command(
        dir: &tempfile::TempDir,
        env: &[(String, String)],
        addr: Option<SocketAddr>,
        args: &[String],
    ) -> Command {
        let listen = addr.map_or_else(|| "127.0.0.1:0".to_owned(), |a| a.to_string());
        // [`LAUNCHER`] in the settings: the binary is started through that command (e.g. `prlimit`).
        let launcher: Vec<&str> = env
            .iter()
            .find(|(k, _)| k == LAUNCHER)
            .map(|(_, v)| v.split_whitespace().collect())
            .unwrap_or_default();
        let mut command = match launcher.split_first() {
            Some((program, launcher_args)) => {
                let mut command = Command::new(program);
                command.args(launcher_args).arg(env!("CARGO_BIN_EXE_herald"));
                command
            }
            None => Command::new(env!("CARGO_BIN_EXE_herald")),
        };
        command
            .args(args)
            .current_dir(dir.path())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "warn")
            .env("HERALD_LISTEN", &listen)
            .env(
                "HERALD_DATABASE_URL",
                format!("sqlite://{}", dir.path().join("herald.db").display()),
            );
        for (k, v) in env.iter().filter(|(k, _)| k != LAUNCHER) {
            command.env(k, v);
        }
        command
    }

    /// Start again on the same database with `extra_env` on top of this node's settings, expecting the
    /// start to be refused: fails unless the process exits unsuccessfully within 30 s without serving;
    /// answers what it printed on standard error. The node must be stopped ([`Herald::kill9`]).
    pub(crate) fn start_refused(&self, extra_env: &[(&str, &str)]) -> String {
        let mut env = self.env.clone();
        for (k, v) in extra_env {
            env.retain(|(key, _)| key != k);
            env.push(((*k).into(), (*v).into()));
        }
        let mut child = Self::command(&self.dir, &env, None, &self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn herald");
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("herald started (or hung) where it should have refused to start");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut stderr = String::new();
        use std::io::Read;
        child
            .stderr
            .take()
            .expect("stderr")
            .read_to_string(&mut stderr)
            .expect("read stderr");
        assert!(!status.success(), "herald exited successfully: {stderr}");
        stderr
    }

    async fn spawn(
        dir: Arc<tempfile::TempDir>,
        env: Vec<(String, String)>,
        addr: Option<SocketAddr>,
        args: Vec<String>,
        database: Option<Arc<TestDatabase>>,
    ) -> Self {
        let mut command = Self::command(&dir, &env, addr, &args);
        command.stdout(Stdio::piped()).stderr(Stdio::inherit());
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

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}/api/v1{}", self.addr, path)
    }

    /// POST raw bytes to a path outside `/api/v1` (e.g. the inbox's `/in/{source}`); returns the status
    /// and the JSON body (Null when empty).
    pub(crate) async fn post_raw(&self, path: &str, body: &[u8], headers: &[(&str, &str)]) -> (u16, Value) {
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
    pub(crate) async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_with(
            method,
            path,
            body.map(|b| b.to_string().into_bytes()),
            &[("authorization", &format!("Bearer {TOKEN}"))],
        )
        .await
    }

    pub(crate) async fn call_with(
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

    /// POST `body` with the admin token and an `idempotency-key`; returns the status and the JSON body.
    pub(crate) async fn post_keyed(&self, path: &str, body: Value, key: &str) -> (u16, Value) {
        self.call_with(
            "POST",
            path,
            Some(body.to_string().into_bytes()),
            &[("authorization", &format!("Bearer {TOKEN}")), ("idempotency-key", key)],
        )
        .await
    }

    pub(crate) async fn post(&self, path: &str, body: Value) -> Value {
        let (status, json) = self.call("POST", path, Some(body)).await;
        assert!((200..300).contains(&status), "POST {path}: {status} {json}");
        json
    }

    pub(crate) async fn get(&self, path: &str) -> Value {
        let (status, json) = self.call("GET", path, None).await;
        assert_eq!(status, 200, "GET {path}: {json}");
        json
    }

    /// Create an app and return its id.
    pub(crate) async fn app(&self, name: &str) -> String {
        self.post("/app", serde_json::json!({ "name": name })).await["id"]
            .as_str()
            .expect("id")
            .to_owned()
    }

    /// Create an endpoint and return (id, secret).
    pub(crate) async fn endpoint(&self, app: &str, body: Value) -> (String, String) {
        let ep = self.post(&format!("/app/{app}/endpoint"), body).await;
        let id = ep["id"].as_str().expect("id").to_owned();
        let secret = self.get(&format!("/app/{app}/endpoint/{id}/secret")).await["key"]
            .as_str()
            .expect("key")
            .to_owned();
        (id, secret)
    }

    /// Every message of an app, through the API (all pages, newest first).
    pub(crate) async fn messages(&self, app: &str) -> Vec<Value> {
        let mut messages = Vec::new();
        let mut iterator: Option<String> = None;
        loop {
            let path = match &iterator {
                Some(it) => format!("/app/{app}/msg?limit=250&iterator={it}"),
                None => format!("/app/{app}/msg?limit=250"),
            };
            let mut page = self.get(&path).await;
            if let Some(data) = page["data"].as_array_mut() {
                messages.append(data);
            }
            if page["done"].as_bool().unwrap_or(true) {
                return messages;
            }
            iterator = page["iterator"].as_str().map(str::to_owned);
        }
    }

    /// Attempts of a message, oldest first.
    pub(crate) async fn attempts(&self, app: &str, msg: &str) -> Vec<Value> {
        let mut list = self.get(&format!("/app/{app}/attempt/msg/{msg}?limit=250")).await["data"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        list.reverse();
        list
    }

    /// Wait until `check` holds on the attempts of a message.
    pub(crate) async fn wait_attempts(
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
    pub(crate) fn kill9(&mut self) {
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
pub(crate) struct Received {
    pub headers: HeaderMap,
    pub body: Bytes,
    pub at: Instant,
    /// When it arrived by the wall clock: what a `deliverAt` promise is kept in (the monotonic clock
    /// may run apart from it while the system clock is slewed or stepped).
    pub wall: SystemTime,
    /// Requests in flight at this receiver when this one arrived, itself included.
    pub concurrent: usize,
    /// The status it was answered with.
    pub status: u16,
}

impl Received {
    pub(crate) fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
    }
}

/// What a receiver answers.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub delay: Duration,
    /// Answer with the request's own body (e.g. to echo a verification challenge).
    pub echo: bool,
}

impl Reply {
    pub(crate) fn status(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: String::new(),
            delay: Duration::ZERO,
            echo: false,
        }
    }

    pub(crate) fn echo(mut self) -> Self {
        self.echo = true;
        self
    }

    pub(crate) fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub(crate) fn body(mut self, body: &str) -> Self {
        self.body = body.into();
        self
    }

    pub(crate) fn delay(mut self, delay: Duration) -> Self {
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
    /// The reply to the first request of each `webhook-id` (after the rules, before the script).
    first_of_each: Mutex<Option<Reply>>,
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
pub(crate) struct Receiver {
    pub addr: SocketAddr,
    state: Arc<ReceiverState>,
    shutdown: Arc<Notify>,
}

impl Receiver {
    /// A receiver answering `fallback` to every request not covered by a scripted reply.
    pub(crate) async fn start(fallback: Reply) -> Self {
        Self::bind("127.0.0.1:0".parse().expect("addr"), fallback).await
    }

    pub(crate) async fn bind(addr: SocketAddr, fallback: Reply) -> Self {
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

    pub(crate) fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// Answer the next requests with these replies, in order.
    pub(crate) fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        self.state.script.lock().unwrap().extend(replies);
    }

    pub(crate) fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    /// Answer every request not covered by the script with `reply` from now on.
    pub(crate) fn set_fallback(&self, reply: Reply) {
        *self.state.fallback.lock().unwrap() = Some(reply);
    }

    /// Answer requests whose body contains `pattern` with `reply` (before the script and the fallback).
    pub(crate) fn rule(&self, pattern: &str, reply: Reply) {
        self.state.rules.lock().unwrap().push((pattern.to_owned(), reply));
    }

    /// Answer the first request carrying each `webhook-id` with `reply` (a receiver that refuses first
    /// attempts and takes retries).
    pub(crate) fn first_of_each(&self, reply: Reply) {
        *self.state.first_of_each.lock().unwrap() = Some(reply);
    }

    /// Requests being handled right now.
    pub(crate) fn in_flight(&self) -> usize {
        self.state.in_flight.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The most requests ever handled at once.
    pub(crate) fn peak_in_flight(&self) -> usize {
        self.state.peak.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How many requests carried each `webhook-id`, and how many of them were answered 2xx.
    pub(crate) fn per_message(&self) -> std::collections::HashMap<String, (usize, usize)> {
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
    pub(crate) async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Received> {
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

    pub(crate) fn stop(&self) {
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
    let id = headers.get("webhook-id").cloned();
    let first_sight = || {
        let reply = state.first_of_each.lock().unwrap().clone()?;
        let seen = state
            .received
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.headers.get("webhook-id") == id.as_ref());
        (!seen).then_some(reply)
    };
    let reply = by_rule
        .or_else(first_sight)
        .or_else(|| state.script.lock().unwrap().pop_front())
        .or_else(|| state.fallback.lock().unwrap().clone());
    let reply = reply.unwrap_or_else(|| Reply::status(200));
    state.received.lock().unwrap().push(Received {
        headers,
        body,
        at: Instant::now(),
        wall: SystemTime::now(),
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
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// The set-up of the database fault tests: a node behind a [`TcpProxy`] (see
/// [`Herald::start_behind_proxy`]) that retries every 500 ms, with one app and one endpoint on a
/// receiver that accepts everything.
pub(crate) struct ProxiedNode {
    pub herald: Herald,
    pub proxy: TcpProxy,
    pub receiver: Receiver,
    /// The app's id.
    pub app: String,
}

impl ProxiedNode {
    /// Start it, with the app named `app`; `None` when PostgreSQL is unreachable (and not required).
    pub(crate) async fn start(test: &str, app: &str, extra_env: &[(&str, &str)]) -> Option<Self> {
        let schedule = vec!["500ms"; 50].join(",");
        let mut env = vec![("HERALD_RETRY_SCHEDULE", schedule.as_str())];
        env.extend_from_slice(extra_env);
        let (herald, proxy) = Herald::start_behind_proxy(test, &env).await?;
        let receiver = Receiver::start(Reply::status(200)).await;
        let app = herald.app(app).await;
        herald
            .endpoint(&app, serde_json::json!({ "url": receiver.url() }))
            .await;
        Some(Self {
            herald,
            proxy,
            receiver,
            app,
        })
    }
}

/// A fresh PostgreSQL database, a [`TcpProxy`] in front of its server, and the database's URL through the
/// proxy; `None` when PostgreSQL is unreachable (and not required).
async fn proxied_database(test: &str) -> Option<(Arc<TestDatabase>, TcpProxy, String)> {
    let database = Arc::new(testdb::fresh(test).await?);
    let proxy = TcpProxy::start(database.server_addr().expect("server address")).await;
    let url = database
        .url_via(format!("127.0.0.1:{}", proxy.port).parse().expect("address"))
        .expect("proxied URL");
    // Without TLS, so that the proxy sees the protocol (a commit cut looks for the `COMMIT`).
    let separator = if url.contains('?') { '&' } else { '?' };
    Some((database, proxy, format!("{url}{separator}sslmode=disable")))
}

/// What a [`TcpProxy`] does with the bytes it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProxyMode {
    /// Pass them on at once.
    Forward,
    /// Keep every connection open (and accept new ones) but pass nothing on, either way: a black hole,
    /// as when a network path or the database host stops answering without closing anything.
    Hold,
    /// Pass each chunk on after this long: a slow database or link.
    Delay(Duration),
}

/// Where a [`TcpProxy`] armed with [`TcpProxy::cut_at_next_commit`] cuts the next connection that
/// sends PostgreSQL a `COMMIT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CommitCut {
    /// Before the `COMMIT` reaches the server: the transaction is rolled back.
    Before,
    /// After the server has received the `COMMIT` *and answered it*: the transaction is committed, but
    /// the client never hears so. The reply is read and dropped before the connection is closed, so the
    /// outcome is certain, not a race with the server.
    After,
    /// As [`CommitCut::Before`], but the connection goes silent instead of closing: nothing passes
    /// either way any more, and the client's side stays open (even once the server gives the session
    /// up) until the client closes it — a network path that died mid-transaction.
    SilentBefore,
    /// As [`CommitCut::After`] (committed), but the connection goes silent instead of closing.
    SilentAfter,
}

impl CommitCut {
    /// Whether the server gets the `COMMIT` (and so commits).
    pub(crate) fn commits(self) -> bool {
        matches!(self, CommitCut::After | CommitCut::SilentAfter)
    }

    /// Whether the connection goes silent rather than closing.
    pub(crate) fn silent(self) -> bool {
        matches!(self, CommitCut::SilentBefore | CommitCut::SilentAfter)
    }
}

/// The simple-protocol message sqlx sends to commit a transaction: `Q`, its length (4 + 7), `COMMIT\0`.
const COMMIT_MESSAGE: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";

/// The start of PostgreSQL's `ReadyForQuery`: `Z`, its length (4 + 1); then the session's transaction
/// status, `I` outside a transaction block, `T` in one, `E` in a failed one. The last message of every
/// answer: a statement outside a transaction block has committed when it is sent.
const READY_FOR_QUERY: &[u8] = b"Z\0\0\0\x05";

/// The transaction status of the last `ReadyForQuery` in `chunk`, if it holds one.
fn ready_status(chunk: &[u8]) -> Option<u8> {
    let at = chunk
        .windows(READY_FOR_QUERY.len())
        .rposition(|w| w == READY_FOR_QUERY)?;
    chunk.get(at + READY_FOR_QUERY.len()).copied()
}

/// The proxy's commit cut, shared by its connections: armed for one cut at a time, at the next chunk a
/// client sends that holds the bytes it waits for (a `COMMIT`, or a value only one request sends).
#[derive(Default)]
struct CommitCuts {
    /// The bytes waited for, the cut, and whether it falls on that connection's next `COMMIT` rather
    /// than on the chunk holding the bytes.
    armed: Mutex<Option<(Vec<u8>, CommitCut, bool)>>,
    fired: std::sync::atomic::AtomicUsize,
}

/// What a commit cut did to one proxied connection.
#[derive(Default)]
struct Fate {
    /// Its `COMMIT` was let through to be answered into the void: the reply ends the connection.
    drop_reply: std::sync::atomic::AtomicBool,
    /// Nothing passes any more, either way.
    silent: std::sync::atomic::AtomicBool,
    /// The cut its next `COMMIT` gets (see [`TcpProxy::cut_commit_after`]).
    at_commit: Mutex<Option<CommitCut>>,
    /// Whether the session is in a transaction block, by the server's last `ReadyForQuery`.
    in_block: std::sync::atomic::AtomicBool,
}

/// A TCP proxy on loopback in front of another address, that a test can cut and restore (refused
/// connections), hold (a black hole), slow down, or make cut one connection at its `COMMIT`: a database
/// outage for one node without touching the shared server.
pub(crate) struct TcpProxy {
    pub port: u16,
    target: SocketAddr,
    running: Mutex<Option<tokio::task::JoinHandle<()>>>,
    mode: tokio::sync::watch::Sender<ProxyMode>,
    cuts: Arc<CommitCuts>,
}

impl TcpProxy {
    pub(crate) async fn start(target: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let proxy = Self {
            port,
            target,
            running: Mutex::new(None),
            mode: tokio::sync::watch::Sender::new(ProxyMode::Forward),
            cuts: Arc::default(),
        };
        proxy.serve(listener);
        proxy
    }

    fn serve(&self, listener: tokio::net::TcpListener) {
        let target = self.target;
        let mode = self.mode.clone();
        let cuts = self.cuts.clone();
        let task = tokio::spawn(async move {
            // Connections live in this set: aborting the task drops it, which aborts (and closes) them.
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                let mode = mode.subscribe();
                let cuts = cuts.clone();
                connections.spawn(async move {
                    if let Ok(outbound) = tokio::net::TcpStream::connect(target).await {
                        let (in_read, in_write) = inbound.into_split();
                        let (out_read, out_write) = outbound.into_split();
                        let fate = Arc::new(Fate::default());
                        let up = Pump {
                            mode: mode.clone(),
                            side: Side::Client(cuts),
                            fate: fate.clone(),
                        };
                        let down = Pump {
                            mode,
                            side: Side::Server,
                            fate,
                        };
                        // Whichever direction ends first (a close, or a commit cut) ends the connection.
                        tokio::select! {
                            _ = up.run(in_read, out_write) => {}
                            _ = down.run(out_read, in_write) => {}
                        }
                    }
                });
                while connections.try_join_next().is_some() {}
            }
        });
        *self.running.lock().unwrap() = Some(task);
    }

    /// Close every proxied connection and refuse new ones.
    pub(crate) fn cut(&self) {
        if let Some(task) = self.running.lock().unwrap().take() {
            task.abort();
        }
    }

    /// Accept connections again, on the same port.
    pub(crate) async fn restore(&self) {
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

    /// Forward, hold or delay from now on (held bytes flow again once the mode is no longer `Hold`).
    pub(crate) fn set_mode(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }

    /// Cut the next connection, whichever it is, that sends a `COMMIT`, at `cut`; once.
    pub(crate) fn cut_at_next_commit(&self, cut: CommitCut) {
        self.cut_at_next(COMMIT_MESSAGE, cut);
    }

    /// Cut the next connection that sends a chunk holding `bytes` (say a value bound by one request
    /// only), at `cut` as if the chunk were its `COMMIT`; once. An autocommitted statement commits at
    /// the end of its chunk, so `After` lets it commit and `Before` keeps it from the server.
    pub(crate) fn cut_at_next(&self, bytes: &[u8], cut: CommitCut) {
        *self.cuts.armed.lock().unwrap() = Some((bytes.to_vec(), cut, false));
    }

    /// Cut, at `cut`, the `COMMIT` of the transaction in which the next chunk holding `bytes` is sent:
    /// a particular transaction's commit point, whatever else commits meanwhile; once. A chunk sent
    /// outside a transaction block (by the server's last `ReadyForQuery`) is a statement that is its own
    /// transaction, committed at the end of the chunk: the chunk is then the commit point, cut as
    /// [`TcpProxy::cut_at_next`] cuts.
    pub(crate) fn cut_commit_after(&self, bytes: &[u8], cut: CommitCut) {
        *self.cuts.armed.lock().unwrap() = Some((bytes.to_vec(), cut, true));
    }

    /// Whether an armed cut is still waiting for its `COMMIT`.
    pub(crate) fn commit_cut_armed(&self) -> bool {
        self.cuts.armed.lock().unwrap().is_some()
    }

    /// How many commit cuts have fired.
    pub(crate) fn commit_cuts_fired(&self) -> usize {
        self.cuts.fired.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Which direction a [`Pump`] carries.
enum Side {
    /// Client to server: looks for the `COMMIT` while a cut is armed.
    Client(Arc<CommitCuts>),
    /// Server to client.
    Server,
}

/// One direction of a proxied connection, obeying the proxy's mode for every chunk and its connection's
/// [`Fate`].
struct Pump {
    mode: tokio::sync::watch::Receiver<ProxyMode>,
    side: Side,
    fate: Arc<Fate>,
}

impl Pump {
    /// Copy until either side closes or a commit cut ends the connection.
    async fn run(mut self, mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf) {
        use std::sync::atomic::Ordering;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buffer = vec![0u8; 16 * 1024];
        // The server's last bytes of the chunk before: a `ReadyForQuery` split between two reads is
        // still seen.
        let mut carried: Vec<u8> = Vec::new();
        loop {
            let n = match from.read(&mut buffer).await {
                Ok(n) if n > 0 => n,
                // A silent connection stays open towards the client even after the server closed it.
                _ if matches!(self.side, Side::Server) && self.fate.silent.load(Ordering::SeqCst) => {
                    return std::future::pending().await;
                }
                _ => return,
            };
            if self.fate.silent.load(Ordering::SeqCst) {
                continue;
            }
            if !self.obey_mode().await {
                return;
            }
            match &self.side {
                Side::Client(cuts) => {
                    let chunk = &buffer[..n];
                    let holds = |bytes: &[u8]| chunk.windows(bytes.len()).any(|w| w == bytes);
                    let hit = {
                        let mut armed = cuts.armed.lock().unwrap();
                        if armed.as_ref().is_some_and(|(bytes, _, _)| holds(bytes)) {
                            armed.take().map(|(_, cut, at_commit)| (cut, at_commit))
                        } else {
                            None
                        }
                    };
                    let mut at_commit = self.fate.at_commit.lock().unwrap();
                    let armed = match hit {
                        Some((cut, true)) if self.fate.in_block.load(Ordering::SeqCst) => {
                            *at_commit = Some(cut);
                            None
                        }
                        Some((cut, true)) => Some(cut),
                        Some((cut, false)) => Some(cut),
                        None => None,
                    };
                    let armed = armed.or_else(|| if holds(COMMIT_MESSAGE) { at_commit.take() } else { None });
                    drop(at_commit);
                    if let Some(cut) = armed {
                        cuts.fired.fetch_add(1, Ordering::SeqCst);
                        // Set before the COMMIT goes on, so that its reply is already dropped.
                        let fate = if cut.silent() {
                            &self.fate.silent
                        } else {
                            &self.fate.drop_reply
                        };
                        fate.store(true, Ordering::SeqCst);
                        match (cut.commits(), cut.silent()) {
                            (false, false) => return,
                            (false, true) => continue,
                            (true, _) => {}
                        }
                    }
                }
                Side::Server => {
                    carried.extend_from_slice(&buffer[..n]);
                    let status = ready_status(&carried);
                    carried.drain(..carried.len().saturating_sub(READY_FOR_QUERY.len()));
                    if let Some(status) = status {
                        self.fate.in_block.store(status != b'I', Ordering::SeqCst);
                    }
                    // The whole answer is dropped, to its `ReadyForQuery`: by then the commit is done. (To
                    // the first one: a chunk that carried a statement behind another's `Sync`, as sqlx
                    // sends a `Close` of a statement it dropped from its cache, would end the drop early;
                    // the writer's few statements stay in its connection's cache.)
                    if self.fate.drop_reply.load(Ordering::SeqCst) {
                        if status.is_some() {
                            return;
                        }
                        continue;
                    }
                }
            }
            if to.write_all(&buffer[..n]).await.is_err() {
                return;
            }
        }
    }

    /// Wait as the mode says before passing a chunk on; `false` when the proxy is gone.
    async fn obey_mode(&mut self) -> bool {
        loop {
            let current = *self.mode.borrow_and_update();
            match current {
                ProxyMode::Forward => return true,
                ProxyMode::Delay(delay) => {
                    tokio::time::sleep(delay).await;
                    return true;
                }
                ProxyMode::Hold => {
                    if self.mode.changed().await.is_err() {
                        return false;
                    }
                }
            }
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.cut();
    }
}

/// A 422 body's invalid values (Svix's `HTTPValidationError`: `detail` a list of `{loc, msg, type}`), each
/// as `field: msg` with the field's path after its source dotted (`["body", "headers", "x-a"]` is
/// `headers.x-a`). Empty when `body` is not in that shape.
pub(crate) fn validation_summary(body: &serde_json::Value) -> Vec<String> {
    let items = body["detail"].as_array().map(Vec::as_slice).unwrap_or_default();
    items
        .iter()
        .filter_map(|item| {
            let loc: Vec<&str> = item["loc"]
                .as_array()?
                .iter()
                .map(|part| part.as_str())
                .collect::<Option<_>>()?;
            let (source, path) = loc.split_first()?;
            let known = ["body", "query", "header", "path"].contains(source);
            let msg = item["msg"].as_str()?;
            (known && item["type"].is_string() && !path.is_empty()).then(|| format!("{}: {msg}", path.join(".")))
        })
        .collect()
}

/// Whether a 422 body names `field` (or a field under it, `headers` for `headers.x-a`) in one of its
/// invalid values' `loc`.
pub(crate) fn names_field(body: &serde_json::Value, field: &str) -> bool {
    validation_summary(body).iter().any(|line| {
        let path = line.split(": ").next().unwrap_or_default();
        path == field || path.starts_with(&format!("{field}."))
    })
}

/// The Python interpreter of the newest pinned 2.x `svix` SDK, as `scripts/test` installs it (under
/// `HERALD_TEST_SDK_DIR`, by default this workspace's `target/`).
pub(crate) fn test_python() -> std::path::PathBuf {
    let sdks = std::env::var_os("HERALD_TEST_SDK_DIR").map_or_else(
        // The workspace root, then its target/ (which a fresh clone has only once built).
        || {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../..")
                .join("target")
        },
        std::path::PathBuf::from,
    );
    sdks.join("svix-python-v2/bin/python")
}
