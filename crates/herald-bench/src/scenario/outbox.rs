//! `outbox`: the transactional outbox (docs/outbox.md), measured from the producer's commit to the
//! receiver. Two paths, each in two phases:
//!
//! - **same database**: the producer calls `herald_publish` on the node's own PostgreSQL (only when the
//!   in-process node runs on PostgreSQL: `--database-url postgres://…`);
//! - **separate database**: the producer writes its own outbox table (`--source URL`, default a fresh
//!   SQLite file) and a `herald relay` (in this process, on the harness's runtime) publishes it.
//!
//! Throughput: `rows` rows are committed in one transaction (the relay is started afterwards), then the
//! time until the outbox is empty gives rows relayed per second. Lag: rows are committed one per
//! transaction at `rate` for `duration`, and each delivery's arrival at the receiver is measured two ways:
//!
//! - **insert → arrival**: from the row's `sent_at_us`, taken just before the producer's statement. It
//!   includes the producer's own insert and commit (with `herald_publish`, the wait for PostgreSQL's
//!   `NOTIFY` lock and the flush of the commits queued before it), which happen before the event exists
//!   for anyone else.
//! - **commit → arrival**: from the moment the producer's autocommit statement returned, i.e. its commit
//!   was acknowledged. The producer records that time per row (by the payload's `n`) and the bench
//!   matches it to the receiver's arrivals afterwards ([`CommitLag`]). This is the figure issue 19's
//!   target (p99 ≤ 50 ms at 1,000 events/s) applies to.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use herald_relay::dialect::{Dialect, TableName};
use serde::Serialize;
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, AssertSqlSafe};

use super::common::{DeliverySummary, app_with_endpoints, await_arrivals, await_deliveries};
use crate::api::EndpointSpec;
use crate::env::{Env, NodeTweaks, Options, Setup};
use crate::receiver::{Arrival, Receiver};
use crate::stats::{LatencyStats, rate};
use crate::table::{Table, count, latency, per_second};
use crate::unix_micros;

const EVENT_TYPE: &str = "bench.outbox";
const TABLE: &str = "herald_outbox";
/// Producer connections in the lag phase (one row per transaction each), by default.
const PRODUCERS: usize = 8;

/// Parameters of `outbox`.
#[derive(Debug, Clone, Serialize)]
pub struct OutboxParams {
    /// Rows committed at once for the throughput phase.
    pub rows: u64,
    /// Rows per second in the lag phase.
    pub rate: f64,
    /// Length of the lag phase.
    pub duration: Duration,
    /// The separate producer database (`None`: a fresh SQLite file).
    #[serde(skip)]
    pub source: Option<String>,
    /// Producer connections in the lag phase.
    pub producers: usize,
}

impl Default for OutboxParams {
    fn default() -> Self {
        Self {
            rows: 20_000,
            rate: 1_000.0,
            duration: Duration::from_secs(10),
            source: None,
            producers: PRODUCERS,
        }
    }
}

impl OutboxParams {
    /// A few seconds, for CI.
    pub fn smoke() -> Self {
        Self {
            rows: 300,
            rate: 100.0,
            duration: Duration::from_secs(2),
            source: None,
            producers: PRODUCERS,
        }
    }
}

/// One path's figures.
#[derive(Debug, Clone, Serialize)]
pub struct OutboxPath {
    /// The producer's database, redacted.
    pub source: String,
    /// Rows committed for the throughput phase.
    pub rows: u64,
    /// From the commit (same database) or the relay's start (separate) until the outbox was empty.
    pub drain_seconds: f64,
    /// Rows relayed per second.
    pub relayed_per_s: f64,
    /// Their deliveries (lag here is meaningless: the rows waited for the relay).
    pub throughput_deliveries: DeliverySummary,
    /// Rows committed in the lag phase.
    pub committed: u64,
    /// Their deliveries; the lag in it is **insert → arrival** (from `sent_at_us`, taken before the
    /// producer's statement, so it includes the producer's own insert and commit).
    pub lag_deliveries: DeliverySummary,
    /// The same deliveries' **commit → arrival** lag: from the producer's acknowledged commit.
    pub commit_lag: CommitLag,
}

/// The lag phase's deliveries measured from each row's acknowledged commit: the time (Unix µs) at which
/// the producer's autocommit statement for that row returned, to the receiver's arrival.
///
/// A delivery that arrives *before* the producer saw its acknowledgement (the commit became visible,
/// Herald relayed it and the receiver read it while the acknowledgement was still on its way back, or
/// the producer's task had not yet been run again to take the time) counts as a lag of **0**: the
/// difference saturates rather than going negative, and [`CommitLag::before_ack`] says how often it
/// happened. The time is taken when the producer's task resumes after the statement, so on a loaded
/// machine it can be a little later than the acknowledgement itself: this figure errs low by that
/// scheduling delay, where insert → arrival errs high by the whole insert and commit.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CommitLag {
    /// Commit acknowledged → arrival, over the arrivals matched to an acknowledged row.
    pub lag: Option<LatencyStats>,
    /// Matched arrivals that came before the producer's acknowledgement (counted as 0 in `lag`).
    pub before_ack: u64,
    /// Arrivals not matched to a row acknowledged in this phase (no `n` in the payload, or a row of an
    /// earlier phase that arrived late): left out of `lag`.
    pub unmatched: u64,
}

impl CommitLag {
    /// Match `arrivals` to `acks` (a row's `n` → when its commit was acknowledged, Unix µs).
    pub fn of(arrivals: &[Arrival], acks: &HashMap<u64, u64>) -> Self {
        let mut samples = Vec::with_capacity(arrivals.len());
        let (mut before_ack, mut unmatched) = (0, 0);
        for arrival in arrivals {
            match arrival.n.and_then(|n| acks.get(&n)) {
                Some(&acked_at_us) => {
                    if arrival.arrived_at_us < acked_at_us {
                        before_ack += 1;
                    }
                    samples.push(arrival.arrived_at_us.saturating_sub(acked_at_us));
                }
                None => unmatched += 1,
            }
        }
        Self {
            lag: LatencyStats::from_samples(samples),
            before_ack,
            unmatched,
        }
    }
}

/// The result of `outbox`.
#[derive(Debug, Clone, Serialize)]
pub struct OutboxReport {
    /// How the server was set up.
    pub setup: Setup,
    /// The parameters.
    pub params: OutboxParams,
    /// `herald_publish` on the node's PostgreSQL, when it runs on one.
    pub same_database: Option<OutboxPath>,
    /// The producer's own database and `herald relay`.
    pub separate_database: OutboxPath,
}

/// How the producer writes one row.
#[derive(Clone)]
struct Producer {
    pool: AnyPool,
    /// Binds (event id, app, event type, payload) and, for an outbox table, an ordering key.
    insert: String,
    ordering_key: bool,
    app: String,
    /// Connections committing in the lag phase.
    producers: usize,
}

impl Producer {
    async fn connect(
        url: &str,
        insert: String,
        ordering_key: bool,
        app: &str,
        producers: usize,
    ) -> anyhow::Result<Self> {
        sqlx::any::install_default_drivers();
        // The producers' commits are part of what is measured: like Herald's own pools and the relay's
        // sources, their sockets get TCP_NODELAY (sqlx 0.9.0 leaves Nagle on, which can hold the second
        // half of an exchange for the server's delayed ACK, ~40 ms). Nothing to do on SQLite, or over a
        // Unix socket (the server reports no ports there).
        let dialect = Dialect::of_url(url).ok();
        let pool = AnyPoolOptions::new()
            .max_connections(u32::try_from(producers).unwrap_or(u32::MAX).saturating_add(1))
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    match dialect {
                        Some(dialect) => dialect.set_tcp_nodelay(conn).await,
                        None => Ok(()),
                    }
                })
            })
            .connect(url)
            .await
            .with_context(|| format!("connecting to {}", herald_server::redact(url)))?;
        Ok(Self {
            pool,
            insert,
            ordering_key,
            app: app.to_owned(),
            producers,
        })
    }

    /// A producer writing its own outbox table in the database at `source`, the table created (and emptied)
    /// as `herald relay --print-ddl` would have it. A SQLite file is put in WAL mode, as a real producer's
    /// would be (docs/outbox.md, SQLite sources): reads and writes then never wait for each other, and the
    /// mode stays with the file, so the relay's connections have it too.
    async fn own_outbox(source: &str, app: &str, producers: usize) -> anyhow::Result<Self> {
        let dialect = Dialect::of_url(source)?;
        let table = TableName::parse(TABLE)?;
        let producer = Self::connect(
            &dialect.driver_url(source),
            dialect.insert(&table),
            true,
            app,
            producers,
        )
        .await?;
        if dialect == Dialect::Sqlite {
            let mode: String = sqlx::query_scalar("PRAGMA journal_mode = WAL")
                .fetch_one(&producer.pool)
                .await?;
            anyhow::ensure!(
                mode.eq_ignore_ascii_case("wal"),
                "the producer's SQLite database {} cannot be put in WAL mode (journal_mode is {mode})",
                herald_server::redact(source)
            );
        }
        for statement in dialect.ddl_statements(&table) {
            sqlx::query(AssertSqlSafe(statement)).execute(&producer.pool).await?;
        }
        sqlx::query(AssertSqlSafe(format!("DELETE FROM {TABLE}")))
            .execute(&producer.pool)
            .await?;
        Ok(producer)
    }

    /// Row `n` of `run`, its payload stamped with the time now.
    fn row<'q>(&'q self, n: u64, run: &str) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
        let payload = format!(r#"{{"sent_at_us":{},"n":{n}}}"#, unix_micros());
        let query = sqlx::query(AssertSqlSafe(self.insert.clone()))
            .bind(format!("{run}-{n}"))
            .bind(self.app.clone())
            .bind(EVENT_TYPE)
            .bind(payload);
        if self.ordering_key {
            query.bind(None::<String>)
        } else {
            query
        }
    }

    /// Commit `rows` rows in one transaction (so that Herald, on the same database, sees them all at once).
    async fn fill(&self, rows: u64, run: &str) -> anyhow::Result<()> {
        let mut tx = self.pool.begin().await?;
        for n in 0..rows {
            self.row(n, run).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// One row per transaction at `rate` rows/s for `duration`, from `producers` connections, numbered
    /// from `first`; for each row committed, its number → when its statement returned (Unix µs).
    async fn steady(&self, rate: f64, duration: Duration, run: &str, first: u64) -> anyhow::Result<HashMap<u64, u64>> {
        let producers = self.producers;
        let per_producer = Duration::from_secs_f64(producers as f64 / rate.max(1.0));
        let mut tasks = Vec::new();
        for p in 0..producers {
            let (producer, run) = (self.clone(), run.to_owned());
            tasks.push(tokio::spawn(async move {
                let mut ticks = tokio::time::interval(per_producer);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                // Stagger the producers so that rows arrive evenly.
                tokio::time::sleep(per_producer.mul_f64(p as f64 / producers as f64)).await;
                let end = Instant::now() + duration;
                let mut acks = Vec::new();
                let mut n = first + p as u64;
                while Instant::now() < end {
                    ticks.tick().await;
                    producer
                        .row(n, &run)
                        .execute(&producer.pool)
                        .await
                        .with_context(|| format!("committing outbox row {n}"))?;
                    // Autocommit: the statement's answer is the commit's acknowledgement.
                    acks.push((n, unix_micros()));
                    n += producers as u64;
                }
                anyhow::Ok(acks)
            }));
        }
        let mut acks = HashMap::new();
        for task in tasks {
            acks.extend(task.await.context("producer task")??);
        }
        Ok(acks)
    }

    async fn remaining(&self) -> anyhow::Result<i64> {
        Ok(
            sqlx::query_scalar(AssertSqlSafe(format!("SELECT COUNT(*) FROM {TABLE}")))
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// Wait until the outbox is empty; the time it took from `since`.
    async fn drained(&self, since: Instant, timeout: Duration) -> anyhow::Result<f64> {
        while self.remaining().await? > 0 {
            anyhow::ensure!(since.elapsed() < timeout, "the outbox did not drain within {timeout:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(since.elapsed().as_secs_f64())
    }
}

/// The separate database when none is given: a fresh SQLite file in `dir`.
fn default_source(dir: &std::path::Path) -> String {
    format!("sqlite://{}?mode=rwc", dir.join("producer.db").display())
}

/// Run `outbox`.
pub async fn run(options: &Options, params: &OutboxParams) -> anyhow::Result<OutboxReport> {
    let env = Env::start(options, &NodeTweaks::default()).await?;
    let receiver = Receiver::any_port(env.receiver_host).await?;
    let app = app_with_endpoints(&env, "outbox", &[EndpointSpec::to(receiver.url("/outbox"))]).await?;
    let same_database = match env.database_url.as_deref() {
        Some(url) if herald_store::is_postgres_url(url) => {
            // Herald's own outbox table has the same name as the producer's (`herald_outbox`).
            let insert = "SELECT herald_publish($2, $3, $4::jsonb, $1)".to_owned();
            let producer = Producer::connect(url, insert, false, &app.app_id, params.producers).await?;
            Some(measure(&env, &receiver, &producer, params, None, "same").await?)
        }
        _ => None,
    };
    let dir = tempfile::tempdir().context("temporary directory")?;
    let source = params.source.clone().unwrap_or_else(|| default_source(dir.path()));
    let producer = Producer::own_outbox(&source, &app.app_id, params.producers).await?;
    let relay = herald_relay::RelaySection {
        name: Some("bench".to_owned()),
        source: source.clone(),
        herald: env.url.clone(),
        token: env.token.clone(),
        report_interval: "0s".to_owned(),
        ..herald_relay::RelaySection::default()
    }
    .check()?;
    let separate_database = measure(&env, &receiver, &producer, params, Some(relay), "separate").await?;
    Ok(OutboxReport {
        setup: env.setup.clone(),
        params: params.clone(),
        same_database,
        separate_database,
    })
}

/// Both phases of one path; `relay`: the relay to start once the outbox is filled (separate database).
async fn measure(
    env: &Env,
    receiver: &Receiver,
    producer: &Producer,
    params: &OutboxParams,
    relay: Option<herald_relay::RelayConfig>,
    label: &str,
) -> anyhow::Result<OutboxPath> {
    let run = format!("{label}-{}", hex::encode(rand::random::<[u8; 4]>()));
    let source = relay
        .as_ref()
        .map_or_else(|| env.database_url.clone().unwrap_or_default(), |r| r.source.clone());
    let timeout = super::common::delivery_timeout(params.rows);
    let mark = receiver.received();
    producer.fill(params.rows, &format!("{run}-bulk")).await?;
    // From the commit (same database) or the relay's start: the producer's own speed is not measured.
    let (started, started_at_us) = (Instant::now(), unix_micros());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let relay_task = match relay {
        Some(config) => {
            let relay = herald_relay::Relay::new(config)?;
            Some(tokio::spawn(relay.run(async move {
                let _ = stopped.await;
            })))
        }
        None => None,
    };
    let drain_seconds = producer.drained(started, timeout).await?;
    let throughput_deliveries = await_deliveries(
        env,
        receiver,
        mark,
        params.rows,
        started_at_us,
        &format!("{label}: deliveries"),
    )
    .await;

    let mark = receiver.received();
    let started_at_us = unix_micros();
    // Numbered after the throughput phase's rows, so that a late delivery of one of those is not taken
    // for a lag-phase row's.
    let acks = producer
        .steady(params.rate, params.duration, &format!("{run}-steady"), params.rows)
        .await?;
    let committed = acks.len() as u64;
    let (lag_deliveries, arrivals) =
        await_arrivals(env, receiver, mark, committed, started_at_us, &format!("{label}: lag")).await;
    let commit_lag = CommitLag::of(&arrivals, &acks);
    let _ = stop.send(());
    if let Some(task) = relay_task {
        let _ = task.await;
    }
    Ok(OutboxPath {
        source: herald_server::redact(&source),
        rows: params.rows,
        drain_seconds,
        relayed_per_s: rate(params.rows, drain_seconds),
        throughput_deliveries,
        committed,
        lag_deliveries,
        commit_lag,
    })
}

impl OutboxReport {
    /// The report as a table.
    pub fn table(&self) -> Table {
        let p = &self.params;
        let mut table = Table::new(format!(
            "outbox — {} rows at once, then {} rows/s for {} s (one per transaction, {} producers)",
            count(p.rows),
            p.rate,
            p.duration.as_secs_f64(),
            p.producers
        ));
        match &self.same_database {
            Some(path) => path.rows_into(&mut table, "same database: herald_publish"),
            None => {
                table.section("same database: herald_publish");
                table.row("skipped", "the node is not on PostgreSQL (--database-url postgres://…)");
            }
        }
        self.separate_database
            .rows_into(&mut table, "separate database: herald relay");
        table.setup(&self.setup);
        table
    }
}

impl OutboxPath {
    fn rows_into(&self, table: &mut Table, title: &str) {
        table.section(format!("{title} ({})", self.source));
        table.target_row("rows relayed/s", per_second(self.relayed_per_s), "≥ 5,000/s");
        table.row(
            "drain time",
            format!("{:.2} s for {} rows", self.drain_seconds, count(self.rows)),
        );
        table.row(
            "their deliveries/s",
            per_second(self.throughput_deliveries.deliveries_per_s),
        );
        table.row("rows committed (lag phase)", count(self.committed));
        let deliveries = &self.lag_deliveries;
        let mut arrived = format!("{} of {}", count(deliveries.delivered), count(deliveries.expected));
        if !deliveries.complete {
            arrived.push_str(" (timed out waiting for the rest)");
        }
        table.row("deliveries received", arrived);
        table.row("deliveries/s", per_second(deliveries.deliveries_per_s));
        table.row(
            "lag insert → arrival p50 / p99 / max (incl. the producer's commit)",
            latency(deliveries.lag.as_ref()),
        );
        table.target_row(
            "lag commit → arrival p50 / p99 / max",
            latency(self.commit_lag.lag.as_ref()),
            "p99 ≤ 50 ms (at 1,000/s)",
        );
        table.row(
            "arrived before the producer's commit returned (lag 0)",
            count(self.commit_lag.before_ack),
        );
        if self.commit_lag.unmatched > 0 {
            table.row(
                "arrivals matched to no lag-phase row (left out)",
                count(self.commit_lag.unmatched),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival(n: Option<u64>, sent_at_us: u64, arrived_at_us: u64) -> Arrival {
        Arrival {
            sent_at_us,
            arrived_at_us,
            n,
        }
    }

    #[test]
    fn commit_lag_runs_from_the_acknowledgement_not_the_insert() {
        let acks = HashMap::from([(100, 1_020_000), (101, 1_030_000)]);
        let arrivals = [
            arrival(Some(100), 1_000_000, 1_025_000),
            arrival(Some(101), 1_010_000, 1_070_000),
        ];
        let lag = CommitLag::of(&arrivals, &acks);
        let stats = lag.lag.expect("two samples");
        assert_eq!((stats.count, stats.p50_us, stats.max_us), (2, 5_000, 40_000));
        assert_eq!((lag.before_ack, lag.unmatched), (0, 0));
        // The old figure, from `sent_at_us`, includes the insert and commit.
        let insert = DeliverySummary::of(2, 2, &arrivals, 1_000_000)
            .lag
            .expect("two samples");
        assert_eq!((insert.p50_us, insert.max_us), (25_000, 60_000));
    }

    #[test]
    fn an_arrival_before_the_acknowledgement_counts_as_zero() {
        let acks = HashMap::from([(7, 2_000_000)]);
        let lag = CommitLag::of(&[arrival(Some(7), 1_990_000, 1_999_000)], &acks);
        assert_eq!(lag.lag.map(|s| (s.p50_us, s.max_us)), Some((0, 0)));
        assert_eq!(lag.before_ack, 1);
        // Arriving in the very microsecond of the acknowledgement is not "before" it.
        let lag = CommitLag::of(&[arrival(Some(7), 1_990_000, 2_000_000)], &acks);
        assert_eq!(lag.before_ack, 0);
    }

    #[test]
    fn arrivals_without_an_acknowledged_row_are_left_out() {
        let acks = HashMap::from([(5, 1_000)]);
        let arrivals = [
            arrival(None, 0, 9_000),
            arrival(Some(6), 0, 9_000),
            arrival(Some(5), 0, 4_000),
        ];
        let lag = CommitLag::of(&arrivals, &acks);
        assert_eq!(lag.unmatched, 2);
        assert_eq!(lag.lag.map(|s| (s.count, s.max_us)), Some((1, 3_000)));
        let none = CommitLag::of(&arrivals[..2], &acks);
        assert_eq!((none.lag, none.unmatched), (None, 2));
        // A duplicate delivery of one row (at-least-once) is a sample each time, as in the old figure.
        let twice = CommitLag::of(&[arrivals[2], arrival(Some(5), 0, 6_000)], &acks);
        assert_eq!(twice.lag.map(|s| (s.count, s.max_us)), Some((2, 5_000)));
    }

    #[tokio::test]
    async fn the_default_sqlite_producer_database_is_in_wal_mode() {
        // Its SQLite connection threads would read as an in-process node's in a CPU snapshot.
        let _exclusive = crate::cpu::TEST_SNAPSHOTS.lock().await;
        let dir = tempfile::tempdir().expect("temporary directory");
        let producer = Producer::own_outbox(&default_source(dir.path()), "app", 1)
            .await
            .expect("the producer's database");
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&producer.pool)
            .await
            .expect("journal mode");
        assert_eq!(mode, "wal", "as a real producer's database would be");
        producer.pool.close().await;
    }

    #[tokio::test]
    async fn producer_connections_to_postgresql_over_tcp_have_tcp_nodelay() {
        let Some(db) = herald_sql::testdb::fresh("bench_producer_tcp_nodelay").await else {
            return;
        };
        let producer = Producer::connect(&db.url, "SELECT 1".to_owned(), false, "app", 1)
            .await
            .expect("producer pool");
        let mut conn = producer.pool.acquire().await.expect("connection");
        let (client, server): (Option<i64>, Option<i64>) =
            sqlx::query_as("SELECT inet_client_port()::bigint, inet_server_port()::bigint")
                .fetch_one(&mut *conn)
                .await
                .expect("ports");
        let port = |p: Option<i64>| u16::try_from(p.expect("a TCP connection")).expect("a port");
        let set = herald_sql::tcp_nodelay::is_set_on_ports(port(client), port(server)).expect("the socket");
        assert!(set, "TCP_NODELAY on the producer's socket to {}", db.url);
        drop(conn);
        producer.pool.close().await;
    }
}
