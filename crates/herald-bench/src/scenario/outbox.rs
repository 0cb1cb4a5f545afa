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
//! transaction at `rate` for `duration`, each carrying `sent_at_us` (taken just before its insert), and
//! the receiver measures commit → arrival.

use std::time::{Duration, Instant};

use anyhow::Context;
use herald_relay::dialect::{Dialect, TableName};
use serde::Serialize;
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, AssertSqlSafe};

use super::common::{DeliverySummary, app_with_endpoints, await_deliveries};
use crate::api::EndpointSpec;
use crate::env::{Env, NodeTweaks, Options, Setup};
use crate::receiver::Receiver;
use crate::stats::rate;
use crate::table::{Table, count, per_second};
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
    /// Their deliveries, with commit → arrival lag.
    pub lag_deliveries: DeliverySummary,
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
        let pool = AnyPoolOptions::new()
            .max_connections(u32::try_from(producers).unwrap_or(u32::MAX).saturating_add(1))
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

    /// One row per transaction at `rate` rows/s for `duration`, from `producers` connections; the
    /// number committed.
    async fn steady(&self, rate: f64, duration: Duration, run: &str) -> anyhow::Result<u64> {
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
                let mut committed = 0_u64;
                let mut n = p as u64;
                while Instant::now() < end {
                    ticks.tick().await;
                    producer.row(n, &run).execute(&producer.pool).await?;
                    committed += 1;
                    n += producers as u64;
                }
                anyhow::Ok(committed)
            }));
        }
        let mut committed = 0;
        for task in tasks {
            committed += task.await.context("producer task")??;
        }
        Ok(committed)
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
    let source = params
        .source
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}?mode=rwc", dir.path().join("producer.db").display()));
    let dialect = Dialect::of_url(&source)?;
    let table = TableName::parse(TABLE)?;
    let producer = Producer::connect(
        &dialect.driver_url(&source),
        dialect.insert(&table),
        true,
        &app.app_id,
        params.producers,
    )
    .await?;
    for statement in dialect.ddl_statements(&table) {
        sqlx::query(AssertSqlSafe(statement)).execute(&producer.pool).await?;
    }
    sqlx::query(AssertSqlSafe(format!("DELETE FROM {TABLE}")))
        .execute(&producer.pool)
        .await?;
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
    let committed = producer
        .steady(params.rate, params.duration, &format!("{run}-steady"))
        .await?;
    let lag_deliveries =
        await_deliveries(env, receiver, mark, committed, started_at_us, &format!("{label}: lag")).await;
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
        table.deliveries(&self.lag_deliveries, "", "p99 ≤ 50 ms (at 1,000/s)");
    }
}
