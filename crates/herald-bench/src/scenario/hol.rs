//! `hol` (head-of-line blocking): ten endpoints in one application, routed by event type
//! (`filterTypes`). Half the messages go to endpoint 0, the other half round-robin to nine healthy
//! endpoints, at a fixed offered rate. Run twice, each on a fresh application: once with endpoint 0
//! healthy too (the baseline), once with endpoint 0 a black hole that accepts connections and never
//! answers. Reported: the nine healthy endpoints' lag in both runs.
//!
//! In-process nodes get a 5 s request timeout (Herald's default is 15 s), so black-holed attempts end
//! within the run.

use std::time::Duration;

use serde::Serialize;

use super::common::{DeliverySummary, app_with_endpoints, await_deliveries, warm_up};
use crate::api::EndpointSpec;
use crate::cpu::{self, CpuSplit, RssTrace};
use crate::env::{Env, NodeTweaks, Options, Setup};
use crate::load::{LoadSummary, Mix};
use crate::receiver::{BlackHole, Receiver};
use crate::table::{Table, count};

/// Healthy endpoints.
const HEALTHY: usize = 9;
/// The in-process node's request timeout for this scenario.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Event type of the messages for endpoint 0.
const SINK_TYPE: &str = "bench.hol.sink";

/// Parameters of `hol`.
#[derive(Debug, Clone, Serialize)]
pub struct HolParams {
    /// Offered messages per second (half to endpoint 0).
    pub rate: f64,
    /// Length of each run.
    pub duration: Duration,
}

impl Default for HolParams {
    fn default() -> Self {
        Self {
            rate: 1_000.0,
            duration: Duration::from_secs(10),
        }
    }
}

impl HolParams {
    /// A few seconds, for CI.
    pub fn smoke() -> Self {
        Self {
            rate: 100.0,
            duration: Duration::from_secs(2),
        }
    }
}

/// One run of `hol`.
#[derive(Debug, Clone, Serialize)]
pub struct HolRun {
    /// Whether endpoint 0 was a black hole.
    pub black_hole: bool,
    /// What the load generator saw.
    pub load: LoadSummary,
    /// The nine healthy endpoints' deliveries.
    pub healthy: DeliverySummary,
    /// Baseline: deliveries endpoint 0 received; black hole: connections it was holding.
    pub endpoint_0: u64,
    /// CPU split during the load.
    pub cpu: Option<CpuSplit>,
    /// Resident memory of the process (Herald and harness) during the load (in-process only).
    pub rss: Option<RssTrace>,
}

/// The result of `hol`.
#[derive(Debug, Clone, Serialize)]
pub struct HolReport {
    /// How the server was set up.
    pub setup: Setup,
    /// The parameters.
    pub params: HolParams,
    /// Endpoint 0 healthy.
    pub baseline: HolRun,
    /// Endpoint 0 a black hole.
    pub with_black_hole: HolRun,
}

/// Run `hol`.
pub async fn run(options: &Options, params: &HolParams) -> anyhow::Result<HolReport> {
    let tweaks = NodeTweaks {
        request_timeout: Some(REQUEST_TIMEOUT),
        ..NodeTweaks::default()
    };
    let env = Env::start(options, &tweaks).await?;
    let baseline = run_once(&env, params, false).await?;
    let with_black_hole = run_once(&env, params, true).await?;
    Ok(HolReport {
        setup: env.setup.clone(),
        params: params.clone(),
        baseline,
        with_black_hole,
    })
}

async fn run_once(env: &Env, params: &HolParams, black_hole: bool) -> anyhow::Result<HolRun> {
    let healthy = Receiver::any_port(env.receiver_host).await?;
    let sink = Receiver::any_port(env.receiver_host).await?;
    let hole = BlackHole::any_port(env.receiver_host).await?;
    let healthy_types: Vec<String> = (1..=HEALTHY).map(|i| format!("bench.hol.healthy-{i}")).collect();
    let mut specs = vec![
        EndpointSpec::to(if black_hole {
            hole.url("/hol/0")
        } else {
            sink.url("/hol/0")
        })
        .only(SINK_TYPE),
    ];
    specs.extend(
        healthy_types
            .iter()
            .enumerate()
            .map(|(i, event_type)| EndpointSpec::to(healthy.url(&format!("/hol/{}", i + 1))).only(event_type)),
    );
    let app = app_with_endpoints(env, if black_hole { "hol-black-hole" } else { "hol-baseline" }, &specs).await?;

    let healthy_mix: Vec<(&str, &str)> = healthy_types
        .iter()
        .map(|t| (app.app_id.as_str(), t.as_str()))
        .collect();
    warm_up(env, &Mix::new(&healthy_mix), 1, &healthy).await?;
    // Alternate: endpoint 0, healthy 1, endpoint 0, healthy 2, …
    let mixed: Vec<(&str, &str)> = healthy_mix
        .iter()
        .flat_map(|healthy| [(app.app_id.as_str(), SINK_TYPE), *healthy])
        .collect();
    let mix = Mix::new(&mixed);

    let label = if black_hole { "with black hole" } else { "baseline" };
    let bar = env.progress.spinner(&format!("hol {label} {}/s", params.rate));
    let mark = healthy.received();
    let ((outcome, cpu), rss) = cpu::sample_rss(cpu::measure(env.load.open_loop(
        &mix,
        params.rate,
        params.duration,
        &bar,
    )))
    .await;
    let rss = rss.filter(|_| env.in_process());
    bar.finish();
    // Odd positions of the mix are the healthy messages.
    let expected: u64 = outcome.accepted_by_target.iter().skip(1).step_by(2).sum();
    let deliveries = await_deliveries(
        env,
        &healthy,
        mark,
        expected,
        outcome.started_at_us,
        "healthy deliveries",
    )
    .await;
    Ok(HolRun {
        black_hole,
        load: outcome.summary(),
        healthy: deliveries,
        endpoint_0: if black_hole {
            hole.connections()
        } else {
            sink.received()
        },
        cpu,
        rss,
    })
}

impl HolReport {
    /// The report as a table.
    pub fn table(&self) -> Table {
        let mut table = Table::new(format!(
            "hol — {} msg/s offered for {} s, half to endpoint 0, half to 9 healthy endpoints",
            self.params.rate,
            self.params.duration.as_secs_f64()
        ));
        for run in [&self.baseline, &self.with_black_hole] {
            if run.black_hole {
                table.section("endpoint 0 is a black hole");
                table.row("connections the black hole holds or held", count(run.endpoint_0));
            } else {
                table.section("baseline: endpoint 0 healthy");
                table.row("deliveries endpoint 0 received", count(run.endpoint_0));
            }
            table.load(&run.load, "", "");
            let target = if run.black_hole { "healthy p99 ≤ 50 ms" } else { "" };
            table.deliveries(&run.healthy, "", target);
            table.cpu("the load", run.cpu.as_ref());
            if let Some(rss) = &run.rss {
                table.row(
                    "process RSS during the load (start → end, max)",
                    format!("{:.1} → {:.1} MiB, max {:.1} MiB", rss.start, rss.end, rss.max),
                );
            }
        }
        table.setup(&self.setup);
        table
    }
}
