//! Test support: a fresh PostgreSQL database per test, so tests run in parallel on one server.
//!
//! The server is `HERALD_TEST_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`, a
//! database to connect to for `CREATE DATABASE`). When it cannot be reached, [`fresh`] returns `None`
//! after printing a visible "SKIPPED" line — unless `HERALD_REQUIRE_POSTGRES=1`, when it panics, so CI
//! cannot pass without having run the PostgreSQL half.

use std::io::Write as _;
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, PgConnection};

/// The server used when `HERALD_TEST_POSTGRES_URL` is unset.
pub const DEFAULT_SERVER: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A database created for one test; dropped (with its connections) when this is dropped.
#[derive(Debug)]
pub struct TestDatabase {
    name: String,
    server: String,
    /// `postgres://…/NAME`: what the code under test connects to.
    pub url: String,
}

fn server() -> String {
    std::env::var("HERALD_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_SERVER.to_owned())
}

fn required() -> bool {
    std::env::var("HERALD_REQUIRE_POSTGRES").is_ok_and(|v| v == "1")
}

async fn admin(server: &str) -> Result<PgConnection, sqlx::Error> {
    let options = PgConnectOptions::from_str(server)?;
    tokio::time::timeout(Duration::from_secs(5), options.connect())
        .await
        .map_err(|_| sqlx::Error::PoolTimedOut)?
}

/// Create a fresh, empty database, or `None` (with a visible message) when PostgreSQL is unreachable
/// and not required.
///
/// # Panics
/// When PostgreSQL is unreachable and `HERALD_REQUIRE_POSTGRES=1`, or it answers but cannot create the
/// database.
pub async fn fresh(test: &str) -> Option<TestDatabase> {
    fresh_with(test, "").await
}

/// Like [`fresh`], with the database's default collation a linguistic one (ICU `en-US`), as on a
/// server initialised with an `en_US.UTF-8` locale: text compares case-insensitively first there, so
/// anything that relies on byte order of ids must say so in its schema.
///
/// # Panics
/// As [`fresh`].
pub async fn fresh_linguistic(test: &str) -> Option<TestDatabase> {
    fresh_with(test, " TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US'").await
}

async fn fresh_with(test: &str, options: &str) -> Option<TestDatabase> {
    let server = server();
    let mut conn = match admin(&server).await {
        Ok(conn) => conn,
        Err(error) => {
            assert!(
                !required(),
                "HERALD_REQUIRE_POSTGRES=1 but PostgreSQL at {server} is unreachable: {error}"
            );
            // Straight to the process's stderr, not `eprintln!`: the test harness captures that, and a
            // skip must be visible in a passing run.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED PostgreSQL half of {test}: PostgreSQL at {server} is unreachable ({error}); \
                 set HERALD_TEST_POSTGRES_URL to run it, HERALD_REQUIRE_POSTGRES=1 to make this fatal"
            );
            return None;
        }
    };
    let name = format!("herald_test_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}{options}")))
        .execute(&mut conn)
        .await
        .unwrap_or_else(|error| panic!("creating test database {name}: {error}"));
    let _ = conn.close().await;
    let url = match server.rfind('/') {
        Some(slash) if server[..slash].ends_with(|c: char| c != '/') => format!("{}/{name}", &server[..slash]),
        _ => format!("{server}/{name}"),
    };
    Some(TestDatabase { name, server, url })
}

impl TestDatabase {
    /// The server's address (host and port of the URL), to put a proxy in front of it.
    pub fn server_addr(&self) -> Option<std::net::SocketAddr> {
        let options = PgConnectOptions::from_str(&self.url).ok()?;
        let host = match options.get_host() {
            "localhost" => "127.0.0.1",
            host => host,
        };
        format!("{host}:{}", options.get_port()).parse().ok()
    }

    /// The URL of this database reached through `addr` (e.g. a proxy) instead of the server itself.
    pub fn url_via(&self, addr: std::net::SocketAddr) -> Option<String> {
        let server = self.server_addr()?;
        Some(self.url.replacen(&server.to_string(), &addr.to_string(), 1))
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        let server = self.server.clone();
        // Drop may run inside or outside a runtime: use a thread with its own small runtime, and wait for
        // it so that the database is gone when the test ends. A failure only leaves a test database
        // behind.
        let dropper = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                return;
            };
            runtime.block_on(async move {
                if let Ok(mut conn) = admin(&server).await {
                    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                    let _ = sqlx::query(AssertSqlSafe(sql)).execute(&mut conn).await;
                    let _ = conn.close().await;
                }
            });
        });
        let _ = dropper.join();
    }
}
