//! `backlog`: how a large pending backlog for a down endpoint affects everybody else, and how fast it
//! drains once the endpoint is back.
//!
//! 1. Two applications: one with a healthy endpoint, one with an endpoint whose URL points at a closed
//!    loopback port (connections are refused: the endpoint is down).
//! 2. On the empty store: closed-loop ingest to the healthy application (its deliveries awaited), then
//!    a fixed offered rate to it for its lag; and the process's RSS.
//! 3. P messages to the down endpoint through the API at high concurrency (timed).
//! 4. The same measurements as in 2 with the backlog pending.
//! 5. A receiver is bound on the down endpoint's port, and the time until all P deliveries arrive is
//!    measured.
//!
//! In-process, the node's retry schedule is `retry_every` repeated 50 times, so deliveries stay pending
//! for as long as building and measuring take, and the circuit breaker's cool-down is capped at
//! `retry_every` too. The down endpoint's breaker is open by the time it comes back, so the drain starts
//! with the next probe (within `retry_every`), then ramps up (slow start) to the endpoint's cap: the wait
//! before the first delivery is reported apart from the drain rate.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::common::{DeliverySummary, app_with_endpoints, await_deliveries, delivery_timeout, warm_up};
use crate::api::EndpointSpec;
use crate::cpu::{self, CpuSplit};
use crate::env::{Env, NodeTweaks, Options, Setup};
use crate::load::{LoadSummary, Mix, Stop};
use crate::receiver::{Receiver, unused_address};
use crate::stats::rate;
use crate::table::{Table, count, mib, millis, per_second};

const HEALTHY_TYPE: &str = "bench.backlog.healthy";
const DOWN_TYPE: &str = "bench.backlog.down";
/// Delays in the in-process retry schedule (Herald's maximum).
const SCHEDULE_LEN: usize = 50;

/// Parameters of `backlog`.
#[derive(Debug, Clone, Serialize)]
pub struct BacklogParams {
    /// Deliveries to leave pending for the down endpoint.
    pub pending: u64,
    /// Requests in flight while ingesting (building the backlog and measuring ingest).
    pub concurrency: usize,
    /// Length of each measurement (ingest, then lag).
    pub duration: Duration,
    /// Offered messages per second for the healthy lag measurement.
    pub rate: f64,
    /// In-process only: the delay between retries (repeated 50 times).
    pub retry_every: Duration,
}

impl Default for BacklogParams {
    fn default() -> Self {
        Self {
            pending: 1_000_000,
            concurrency: 64,
            duration: Duration::from_secs(10),
            rate: 1_000.0,
            retry_every: Duration::from_secs(30),
        }
    }
}

impl BacklogParams {
    /// A few seconds, for CI.
    pub fn smoke() -> Self {
        Self {
            pending: 5_000,
            concurrency: 16,
            duration: Duration::from_secs(2),
            rate: 100.0,
            retry_every: Duration::from_secs(1),
        }
    }
}

/// The healthy application's figures at one point.
#[derive(Debug, Clone, Serialize)]
pub struct HealthySample {
    /// Process RSS in MiB before the measurement (in-process only).
    pub rss_mib: Option<f64>,
    /// Closed-loop ingest to the healthy application.
    pub ingest: LoadSummary,
    /// CPU split during that ingest.
    pub ingest_cpu: Option<CpuSplit>,
    /// Its deliveries.
    pub ingest_deliveries: DeliverySummary,
    /// Load at the fixed offered rate.
    pub steady: LoadSummary,
    /// Its deliveries and their lag.
    pub steady_deliveries: DeliverySummary,
}

/// Building the backlog.
#[derive(Debug, Clone, Serialize)]
pub struct BuildSummary {
    /// What the load generator saw (latencies not kept).
    pub load: LoadSummary,
    /// CPU split while building.
    pub cpu: Option<CpuSplit>,
}

/// The drain once the endpoint is up.
#[derive(Debug, Clone, Serialize)]
pub struct DrainSummary {
    /// Deliveries expected (messages accepted while building).
    pub expected: u64,
    /// Deliveries received.
    pub delivered: u64,
    /// Whether all arrived before the wait timed out.
    pub complete: bool,
    /// From binding the receiver to the first arrival, in ms.
    pub first_after_up_ms: f64,
    /// From binding the receiver to the last arrival, in seconds.
    pub total_seconds: f64,
    /// Deliveries per second from the first to the last arrival.
    pub deliveries_per_s: f64,
    /// Seconds after the endpoint came up by which 10 %, 50 %, 90 % and 100 % of the deliveries had
    /// arrived (the shape of the drain).
    pub progress_seconds: Vec<(u8, f64)>,
    /// CPU split during the drain.
    pub cpu: Option<CpuSplit>,
    /// Process RSS in MiB after the drain (in-process only).
    pub rss_mib_after: Option<f64>,
}

/// The result of `backlog`.
#[derive(Debug, Clone, Serialize)]
pub struct BacklogReport {
    /// How the server was set up.
    pub setup: Setup,
    /// The parameters.
    pub params: BacklogParams,
    /// On the empty store.
    pub empty: HealthySample,
    /// Building the backlog.
    pub build: BuildSummary,
    /// With the backlog pending.
    pub with_backlog: HealthySample,
    /// Draining it.
    pub drain: DrainSummary,
    /// Peak process RSS in MiB over the whole run (in-process only).
    pub peak_rss_mib: Option<f64>,
}

/// Run `backlog`.
pub async fn run(options: &Options, params: &BacklogParams) -> anyhow::Result<BacklogReport> {
    let every = crate::env::config_duration(params.retry_every);
    let tweaks = NodeTweaks {
        retry_schedule: Some(vec![every.as_str(); SCHEDULE_LEN].join(",")),
        breaker_max_cooldown: Some(params.retry_every),
        ..NodeTweaks::default()
    };
    let env = Env::start(options, &tweaks).await?;
    let rss = || if env.in_process() { cpu::rss_mib() } else { None };
    let healthy = Receiver::any_port(env.receiver_host).await?;
    let down_addr = unused_address(env.receiver_host)?;
    let healthy_app = app_with_endpoints(&env, "backlog-healthy", &[EndpointSpec::to(healthy.url("/healthy"))]).await?;
    let down_app = app_with_endpoints(
        &env,
        "backlog-down",
        &[EndpointSpec::to(format!("http://{down_addr}/down"))],
    )
    .await?;
    let healthy_mix = Mix::single(&healthy_app.app_id, HEALTHY_TYPE);
    let down_mix = Mix::single(&down_app.app_id, DOWN_TYPE);
    warm_up(&env, &healthy_mix, 1, &healthy).await?;

    let empty = measure_healthy(&env, params, &healthy_mix, &healthy, "empty store", rss()).await;

    let bar = env.progress.counter("building the backlog", params.pending);
    let (outcome, build_cpu) =
        cpu::measure(
            env.load
                .closed_loop(&down_mix, params.concurrency, Stop::Count(params.pending), false, &bar),
        )
        .await;
    bar.finish();
    let build = BuildSummary {
        load: outcome.summary(),
        cpu: build_cpu,
    };

    let with_backlog = measure_healthy(&env, params, &healthy_mix, &healthy, "with backlog", rss()).await;

    let expected = outcome.accepted;
    let bar = env.progress.counter("draining", expected);
    let (drained, drain_cpu) = cpu::measure(async {
        let up = Instant::now();
        let up_at = crate::unix_micros();
        let receiver = Receiver::start(down_addr).await?;
        let complete = receiver.wait_for(expected, delivery_timeout(expected), &bar).await;
        let total_seconds = up.elapsed().as_secs_f64();
        let mut arrived: Vec<u64> = receiver.take_arrivals().iter().map(|a| a.arrived_at_us).collect();
        arrived.sort_unstable();
        anyhow::Ok((receiver.received(), complete, up_at, arrived, total_seconds))
    })
    .await;
    bar.finish();
    let (delivered, complete, up_at, arrived, total_seconds) = drained?;
    let first = arrived.first().copied().unwrap_or(up_at);
    let last = arrived.last().copied().unwrap_or(up_at);
    let progress_seconds = [10u8, 50, 90, 100]
        .into_iter()
        .filter_map(|percent| {
            let n = (arrived.len() * usize::from(percent)).div_ceil(100);
            let at = arrived.get(n.checked_sub(1)?)?;
            Some((percent, at.saturating_sub(up_at) as f64 / 1e6))
        })
        .collect();
    let drain = DrainSummary {
        expected,
        delivered,
        complete,
        first_after_up_ms: first.saturating_sub(up_at) as f64 / 1000.0,
        total_seconds,
        deliveries_per_s: rate(delivered, last.saturating_sub(first) as f64 / 1e6),
        progress_seconds,
        cpu: drain_cpu,
        rss_mib_after: rss(),
    };
    Ok(BacklogReport {
        setup: env.setup.clone(),
        params: params.clone(),
        empty,
        build,
        with_backlog,
        drain,
        peak_rss_mib: if env.in_process() { cpu::peak_rss_mib() } else { None },
    })
}

/// Closed-loop ingest to the healthy application (awaiting its deliveries), then the fixed rate.
async fn measure_healthy(
    env: &Env,
    params: &BacklogParams,
    mix: &Mix,
    healthy: &Receiver,
    label: &str,
    rss_mib: Option<f64>,
) -> HealthySample {
    let bar = env.progress.spinner(&format!("ingest, {label}"));
    let mark = healthy.received();
    let (ingest, ingest_cpu) =
        cpu::measure(
            env.load
                .closed_loop(mix, params.concurrency, Stop::After(params.duration), true, &bar),
        )
        .await;
    bar.finish();
    let ingest_deliveries = await_deliveries(
        env,
        healthy,
        mark,
        ingest.accepted,
        ingest.started_at_us,
        "its deliveries",
    )
    .await;

    let bar = env.progress.spinner(&format!("{}/s, {label}", params.rate));
    let mark = healthy.received();
    let steady = env.load.open_loop(mix, params.rate, params.duration, &bar).await;
    bar.finish();
    let steady_deliveries = await_deliveries(
        env,
        healthy,
        mark,
        steady.accepted,
        steady.started_at_us,
        "its deliveries",
    )
    .await;
    HealthySample {
        rss_mib,
        ingest: ingest.summary(),
        ingest_cpu,
        ingest_deliveries,
        steady: steady.summary(),
        steady_deliveries,
    }
}

/// `a / b` as a percentage, if both are known and `b` is not zero.
fn percent(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.0} %", a / b * 100.0)
    } else {
        "—".to_owned()
    }
}

impl BacklogReport {
    /// The report as a table.
    pub fn table(&self) -> Table {
        let p = &self.params;
        let mut table = Table::new(format!(
            "backlog — {} pending for a down endpoint, healthy traffic c{} / {} msg/s",
            count(p.pending),
            p.concurrency,
            p.rate
        ));
        let samples = [
            ("empty store", &self.empty, ""),
            ("with the backlog pending", &self.with_backlog, "≤ 150 MiB"),
        ];
        for (label, sample, rss_target) in samples {
            table.section(label);
            table.target_row("process RSS (Herald + harness)", mib(sample.rss_mib), rss_target);
            table.row("healthy ingest (closed loop)", per_second(sample.ingest.accepted_per_s));
            table.row(
                "healthy ingest API p50 / p99 / max",
                crate::table::latency(sample.ingest.api_latency.as_ref()),
            );
            table.row(
                "its deliveries/s",
                per_second(sample.ingest_deliveries.deliveries_per_s),
            );
            table.cpu("the ingest", sample.ingest_cpu.as_ref());
            table.row(
                format!("healthy lag at {} msg/s p50 / p99 / max", p.rate),
                crate::table::latency(sample.steady_deliveries.lag.as_ref()),
            );
            let errors = sample.ingest.errors + sample.steady.errors;
            if errors > 0 {
                table.row("errors", count(errors));
            }
        }
        table.section("with the backlog, compared with the empty store");
        table.target_row(
            "ingest rate",
            percent(
                self.with_backlog.ingest.accepted_per_s,
                self.empty.ingest.accepted_per_s,
            ),
            "≥ 80 %",
        );
        let p99 = |s: &HealthySample| s.steady_deliveries.lag.map_or(0.0, |l| l.p99_ms());
        table.target_row(
            "healthy lag p99",
            percent(p99(&self.with_backlog), p99(&self.empty)),
            "≤ 200 %",
        );
        table.section("building the backlog");
        table.row(
            "messages accepted / errors",
            format!(
                "{} / {}",
                count(self.build.load.accepted),
                count(self.build.load.errors)
            ),
        );
        table.row("took", format!("{:.1} s", self.build.load.seconds));
        table.row("accepted msgs/s", per_second(self.build.load.accepted_per_s));
        table.cpu("the build", self.build.cpu.as_ref());
        table.section("drain once the endpoint is up");
        let mut received = format!("{} of {}", count(self.drain.delivered), count(self.drain.expected));
        if !self.drain.complete {
            received.push_str(" (timed out waiting for the rest)");
        }
        table.row("deliveries received", received);
        table.row(
            "first delivery after the endpoint came up",
            millis(self.drain.first_after_up_ms),
        );
        table.row(
            "all delivered after the endpoint came up",
            format!("{:.1} s", self.drain.total_seconds),
        );
        let shape: Vec<String> = self
            .drain
            .progress_seconds
            .iter()
            .map(|(percent, seconds)| format!("{percent} % at {seconds:.1} s"))
            .collect();
        table.row("drain progress", shape.join(", "));
        table.target_row(
            "drain deliveries/s (first to last)",
            per_second(self.drain.deliveries_per_s),
            "≥ 20,000/s",
        );
        table.cpu("the drain", self.drain.cpu.as_ref());
        table.row("process RSS after the drain", mib(self.drain.rss_mib_after));
        table.row("peak process RSS", mib(self.peak_rss_mib));
        table.setup(&self.setup);
        table
    }
}
