//! `e2e`: N messages to an application with E endpoints as fast as the server accepts them (closed loop),
//! then a fixed offered rate for a fixed time; deliveries/s and lag (send → arrival) for both phases.

use std::time::Duration;

use serde::Serialize;

use super::common::{DeliverySummary, app_with_endpoints, await_deliveries, warm_up};
use crate::api::EndpointSpec;
use crate::cpu::{self, CpuSplit};
use crate::env::{Env, NodeTweaks, Options, Setup};
use crate::load::{LoadOutcome, LoadSummary, Mix, Stop};
use crate::receiver::Receiver;
use crate::table::{Table, count};
use indicatif::ProgressBar;

const EVENT_TYPE: &str = "bench.e2e";

/// Parameters of `e2e`.
#[derive(Debug, Clone, Serialize)]
pub struct E2eParams {
    /// Messages in the burst phase.
    pub messages: u64,
    /// Endpoints subscribed to every message.
    pub endpoints: usize,
    /// Requests in flight during the burst.
    pub concurrency: usize,
    /// Offered messages per second in the steady phase.
    pub rate: f64,
    /// Length of the steady phase.
    pub duration: Duration,
}

impl Default for E2eParams {
    fn default() -> Self {
        Self {
            messages: 10_000,
            endpoints: 1,
            concurrency: 64,
            rate: 1_000.0,
            duration: Duration::from_secs(10),
        }
    }
}

impl E2eParams {
    /// A few seconds, for CI.
    pub fn smoke() -> Self {
        Self {
            messages: 200,
            endpoints: 2,
            concurrency: 16,
            rate: 100.0,
            duration: Duration::from_secs(2),
        }
    }
}

/// One phase of `e2e`.
#[derive(Debug, Clone, Serialize)]
pub struct E2ePhase {
    /// What the load generator saw.
    pub load: LoadSummary,
    /// What the receiver saw.
    pub deliveries: DeliverySummary,
    /// CPU split during the load.
    pub cpu: Option<CpuSplit>,
}

/// The result of `e2e`.
#[derive(Debug, Clone, Serialize)]
pub struct E2eReport {
    /// How the server was set up.
    pub setup: Setup,
    /// The parameters.
    pub params: E2eParams,
    /// As fast as accepted.
    pub burst: E2ePhase,
    /// At the offered rate.
    pub steady: E2ePhase,
}

/// Run one phase's load (showing progress on `bar`), then wait for every delivery it caused.
async fn phase(
    env: &Env,
    receiver: &Receiver,
    fanout: u64,
    bar: &ProgressBar,
    label: &str,
    load: impl std::future::Future<Output = LoadOutcome>,
) -> E2ePhase {
    let mark = receiver.received();
    let (outcome, cpu) = cpu::measure(load).await;
    bar.finish();
    let deliveries = await_deliveries(
        env,
        receiver,
        mark,
        outcome.accepted * fanout,
        outcome.started_at_us,
        label,
    )
    .await;
    E2ePhase {
        load: outcome.summary(),
        deliveries,
        cpu,
    }
}

/// Run `e2e`.
pub async fn run(options: &Options, params: &E2eParams) -> anyhow::Result<E2eReport> {
    let env = Env::start(options, &NodeTweaks::default()).await?;
    let receiver = Receiver::any_port(env.receiver_host).await?;
    let specs: Vec<EndpointSpec> = (0..params.endpoints.max(1))
        .map(|i| EndpointSpec::to(receiver.url(&format!("/e2e/{i}"))))
        .collect();
    let fanout = specs.len() as u64;
    let app = app_with_endpoints(&env, "e2e", &specs).await?;
    let mix = Mix::single(&app.app_id, EVENT_TYPE);
    warm_up(&env, &mix, fanout, &receiver).await?;

    let bar = env.progress.counter("burst", params.messages);
    let burst_load = env
        .load
        .closed_loop(&mix, params.concurrency, Stop::Count(params.messages), true, &bar);
    let burst = phase(&env, &receiver, fanout, &bar, "burst deliveries", burst_load).await;

    let bar = env.progress.spinner(&format!("steady {}/s", params.rate));
    let steady_load = env.load.open_loop(&mix, params.rate, params.duration, &bar);
    let steady = phase(&env, &receiver, fanout, &bar, "steady deliveries", steady_load).await;
    Ok(E2eReport {
        setup: env.setup.clone(),
        params: params.clone(),
        burst,
        steady,
    })
}

impl E2eReport {
    /// The report as a table.
    pub fn table(&self) -> Table {
        let p = &self.params;
        let mut table = Table::new(format!(
            "e2e — {} messages × {} endpoint(s), then {} msg/s for {} s",
            count(p.messages),
            p.endpoints,
            p.rate,
            p.duration.as_secs_f64()
        ));
        table.section(format!("burst: {} messages, c{}", count(p.messages), p.concurrency));
        table.load(&self.burst.load, "", "");
        table.deliveries(&self.burst.deliveries, "", "");
        table.cpu("the burst", self.burst.cpu.as_ref());
        table.section(format!("steady: {} msg/s offered", p.rate));
        table.load(&self.steady.load, "", "");
        table.deliveries(&self.steady.deliveries, "", "p99 ≤ 10 ms (at 1,000/s)");
        table.cpu("the steady phase", self.steady.cpu.as_ref());
        table.setup(&self.setup);
        table
    }
}
