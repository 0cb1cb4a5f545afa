//! A producer's own database with Herald's outbox table — a SQLite file, a fresh PostgreSQL database or
//! a fresh MariaDB database — and `herald relay` processes reading it.
//!
//! MariaDB is reached at `HERALD_TEST_MYSQL_URL` (default `mysql://root@127.0.0.1:3306`); when it is
//! unreachable its half is skipped with a visible line, unless `HERALD_REQUIRE_MARIADB=1` (set by
//! `.ci/run`) makes that a failure.

use std::io::Write as _;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herald_relay::dialect::{Dialect, TableName};
use herald_store::testdb::{self, TestDatabase};
use serde_json::Value;
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, AssertSqlSafe, Executor, Row};

use super::{Herald, TOKEN};

/// One outbox row to write.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub event_id: String,
    pub app: String,
    pub event_type: String,
    pub payload: Value,
    pub ordering_key: Option<String>,
}

impl Event {
    pub(crate) fn new(event_id: impl Into<String>, app: &str, payload: Value) -> Self {
        Self {
            event_id: event_id.into(),
            app: app.to_owned(),
            event_type: "invoice.paid".to_owned(),
            payload,
            ordering_key: None,
        }
    }

    pub(crate) fn keyed(mut self, key: &str) -> Self {
        self.ordering_key = Some(key.to_owned());
        self
    }
}

/// What keeps the database alive for the test.
enum Keep {
    Postgres(#[allow(dead_code)] TestDatabase),
    MariaDb { server: String, name: String },
    File(#[allow(dead_code)] tempfile::TempDir),
}

/// A producer database with the outbox table created from the shipped DDL.
pub(crate) struct Producer {
    pub dialect: Dialect,
    pub url: String,
    pub pool: AnyPool,
    keep: Keep,
}

fn mysql_server() -> String {
    std::env::var("HERALD_TEST_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".to_owned())
}

impl Producer {
    /// Every producer database this machine has: SQLite always, PostgreSQL and MariaDB when reachable.
    pub(crate) async fn all(test: &str) -> Vec<Self> {
        let mut all = vec![Self::sqlite().await];
        all.extend(Self::postgres(test).await);
        all.extend(Self::mariadb(test).await);
        all
    }

    pub(crate) async fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
        Self::prepare(Dialect::Sqlite, url, Keep::File(dir)).await
    }

    pub(crate) async fn postgres(test: &str) -> Option<Self> {
        let database = testdb::fresh(test).await?;
        let url = database.url.clone();
        Some(Self::prepare(Dialect::Postgres, url, Keep::Postgres(database)).await)
    }

    pub(crate) async fn mariadb(test: &str) -> Option<Self> {
        sqlx::any::install_default_drivers();
        let server = mysql_server();
        let admin = match AnyPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(5))
            .connect(&server)
            .await
        {
            Ok(pool) => pool,
            Err(error) => {
                assert!(
                    !std::env::var("HERALD_REQUIRE_MARIADB").is_ok_and(|v| v == "1"),
                    "HERALD_REQUIRE_MARIADB=1 but MariaDB at {server} is unreachable: {error}"
                );
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED MariaDB half of {test}: MariaDB at {server} is unreachable ({error}); set \
                     HERALD_TEST_MYSQL_URL to run it, HERALD_REQUIRE_MARIADB=1 to make this fatal"
                );
                return None;
            }
        };
        let name = format!("herald_test_{}", uuid_simple());
        admin
            .execute(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await
            .expect("create the MariaDB test database");
        admin.close().await;
        let url = format!("{server}/{name}");
        Some(Self::prepare(Dialect::MySql, url, Keep::MariaDb { server, name }).await)
    }

    async fn prepare(dialect: Dialect, url: String, keep: Keep) -> Self {
        sqlx::any::install_default_drivers();
        let pool = AnyPoolOptions::new()
            .max_connections(4)
            .connect(&url)
            .await
            .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
        for statement in dialect.ddl_statements(&TableName::parse("herald_outbox").expect("name")) {
            sqlx::query(AssertSqlSafe(statement.clone()))
                .execute(&pool)
                .await
                .unwrap_or_else(|e| panic!("{dialect} DDL {statement}: {e}"));
        }
        Self {
            dialect,
            url,
            pool,
            keep,
        }
    }

    /// Write `events` in one transaction, then commit it or roll it back.
    pub(crate) async fn write(&self, events: &[Event], commit: bool) {
        let mut tx = self.pool.begin().await.expect("begin");
        let insert = self.dialect.insert(&TableName::parse("herald_outbox").expect("name"));
        for event in events {
            sqlx::query(AssertSqlSafe(insert.clone()))
                .bind(event.event_id.clone())
                .bind(event.app.clone())
                .bind(event.event_type.clone())
                .bind(event.payload.to_string())
                .bind(event.ordering_key.clone())
                .execute(&mut *tx)
                .await
                .expect("insert an outbox row");
        }
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("rollback");
        }
    }

    /// Rows still in the outbox (relayed or not, refused or not).
    pub(crate) async fn rows(&self) -> i64 {
        sqlx::query("SELECT COUNT(*) FROM herald_outbox")
            .fetch_one(&self.pool)
            .await
            .expect("count")
            .get(0)
    }

    /// The refused rows: (event id, relay_error).
    pub(crate) async fn refused(&self) -> Vec<(String, String)> {
        sqlx::query("SELECT event_id, relay_error FROM herald_outbox WHERE relay_error IS NOT NULL ORDER BY seq")
            .fetch_all(&self.pool)
            .await
            .expect("refused rows")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }

    /// Wait until the outbox holds `n` rows.
    pub(crate) async fn wait_rows(&self, n: i64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let rows = self.rows().await;
            if rows == n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{}: {rows} outbox rows, expected {n}",
                self.dialect
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        if let Keep::MariaDb { server, name } = &self.keep {
            let (server, name) = (server.clone(), name.clone());
            // Dropped outside any runtime: a thread with its own.
            let _ = std::thread::spawn(move || {
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                    return;
                };
                runtime.block_on(async {
                    if let Ok(pool) = AnyPoolOptions::new().max_connections(1).connect(&server).await {
                        let _ = pool
                            .execute(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}")))
                            .await;
                        pool.close().await;
                    }
                });
            })
            .join();
        }
    }
}

fn uuid_simple() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// A running `herald relay`, its standard error kept.
pub(crate) struct RelayProcess {
    child: Option<Child>,
    pub stderr: Arc<Mutex<Vec<String>>>,
    args: Vec<String>,
}

impl RelayProcess {
    /// `herald relay --source … --herald <herald> --token <admin token> [extra…]`.
    pub(crate) fn start(producer: &Producer, herald: &str, extra: &[&str]) -> Self {
        let mut args: Vec<String> = vec![
            "relay".into(),
            "--source".into(),
            producer.url.clone(),
            "--table".into(),
            "herald_outbox".into(),
            "--herald".into(),
            herald.to_owned(),
            "--token".into(),
            TOKEN.into(),
            "--poll-interval".into(),
            "10ms".into(),
            "--report-interval".into(),
            "1s".into(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        Self::spawn(args)
    }

    fn spawn(args: Vec<String>) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_herald"))
            .args(&args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn herald relay");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let lines = stderr.clone();
        let pipe = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                lines.lock().expect("lines").push(line);
            }
        });
        Self {
            child: Some(child),
            stderr,
            args,
        }
    }

    /// Wait until a line of standard error contains `text`.
    pub(crate) async fn wait_log(&self, text: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.stderr.lock().expect("lines").iter().find(|l| l.contains(text)) {
                return line.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no log line with {text:?}: {:#?}",
                self.stderr.lock().expect("lines")
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL: no shutdown path runs.
    pub(crate) fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start again with the same arguments.
    pub(crate) fn restart(&mut self) {
        self.kill9();
        *self = Self::spawn(self.args.clone());
    }

    pub(crate) fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Every message of an app in Herald: (event id, message id), oldest first.
pub(crate) async fn messages(herald: &Herald, app: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut iterator: Option<String> = None;
    loop {
        let path = match &iterator {
            Some(it) => format!("/app/{app}/msg?limit=250&with_content=false&iterator={it}"),
            None => format!("/app/{app}/msg?limit=250&with_content=false"),
        };
        let page = herald.get(&path).await;
        for m in page["data"].as_array().expect("data") {
            out.push((
                m["eventId"].as_str().unwrap_or_default().to_owned(),
                m["id"].as_str().expect("id").to_owned(),
            ));
        }
        if page["done"].as_bool().unwrap_or(true) {
            break;
        }
        iterator = page["iterator"].as_str().map(str::to_owned);
    }
    out.reverse();
    out
}
