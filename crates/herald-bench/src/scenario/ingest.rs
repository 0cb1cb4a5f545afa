//! `ingest`: closed-loop `POST …/msg` at a fixed concurrency for a fixed time, one application, one
//! endpoint. With `paused` the endpoint is disabled, so deliveries are stored but none is sent (ingest
//! alone); otherwise the deliveries are awaited and their rate reported too.

use std::time::Duration;

use serde::Serialize;

use super::common::{DeliverySummary, app_with_endpoints, await_deliveries};
use crate::api::EndpointSpec;
use crate::cpu::{self, CpuSplit};
use crate::env::{Env, NodeTweaks, Options, Setup};
use crate::load::{LoadSummary, Mix, Stop};
use crate::receiver::Receiver;
use crate::table::Table;

const EVENT_TYPE: &str = "bench.ingest";

/// Parameters of `ingest`.
#[derive(Debug, Clone, Serialize)]
pub struct IngestParams {
    /// Requests in flight (closed loop).
    pub concurrency: usize,
    /// How long to send.
    pub duration: Duration,
    /// Create the endpoint disabled: its deliveries are written at fan-out, but none is sent.
    pub paused: bool,
}

impl Default for IngestParams {
    fn default() -> Self {
        Self {
            concurrency: 64,
            duration: Duration::from_secs(10),
            paused: false,
        }
    }
}

impl IngestParams {
    /// A few seconds, for CI.
    pub fn smoke() -> Self {
        Self {
            concurrency: 16,
            duration: Duration::from_secs(2),
            paused: false,
        }
    }
}

/// The result of `ingest`.
#[derive(Debug, Clone, Serialize)]
pub struct IngestReport {
    /// How the server was set up.
    pub setup: Setup,
    /// The parameters.
    pub params: IngestParams,
    /// What the load generator saw.
    pub load: LoadSummary,
    /// The deliveries (absent when paused).
    pub deliveries: Option<DeliverySummary>,
    /// Deliveries still outstanding when the load stopped (absent when paused).
    pub behind_at_end_of_load: Option<u64>,
    /// CPU split during the load.
    pub cpu: Option<CpuSplit>,
}

/// Run `ingest`.
pub async fn run(options: &Options, params: &IngestParams) -> anyhow::Result<IngestReport> {
    let env = Env::start(options, &NodeTweaks::default()).await?;
    let receiver = Receiver::any_port(env.receiver_host).await?;
    let app = app_with_endpoints(
        &env,
        "ingest",
        &[EndpointSpec::to(receiver.url("/ingest")).disabled(params.paused)],
    )
    .await?;
    let mix = Mix::single(&app.app_id, EVENT_TYPE);

    let bar = env.progress.spinner(&format!("ingest c{}", params.concurrency));
    let (outcome, cpu) =
        cpu::measure(
            env.load
                .closed_loop(&mix, params.concurrency, Stop::After(params.duration), true, &bar),
        )
        .await;
    bar.finish();

    let (deliveries, behind) = if params.paused {
        (None, None)
    } else {
        let behind = outcome.accepted.saturating_sub(receiver.received());
        let deliveries = await_deliveries(
            &env,
            &receiver,
            0,
            outcome.accepted,
            outcome.started_at_us,
            "deliveries",
        )
        .await;
        (Some(deliveries), Some(behind))
    };
    Ok(IngestReport {
        setup: env.setup.clone(),
        params: params.clone(),
        load: outcome.summary(),
        deliveries,
        behind_at_end_of_load: behind,
        cpu,
    })
}

impl IngestReport {
    /// The report as a table.
    pub fn table(&self) -> Table {
        let paused = self.params.paused;
        let mut table = Table::new(format!(
            "ingest{} — c{}, {} s",
            if paused { " --paused" } else { "" },
            self.params.concurrency,
            self.params.duration.as_secs_f64()
        ));
        table.section("ingest");
        if paused {
            table.load(&self.load, "≥ 20,000/s (paused)", "p99 ≤ 10 ms (paused)");
        } else {
            table.load(&self.load, "", "p99 ≤ 15 ms");
        }
        table.cpu("the load", self.cpu.as_ref());
        if let Some(deliveries) = &self.deliveries {
            table.section("delivery to the one endpoint");
            if let Some(behind) = self.behind_at_end_of_load {
                table.row(
                    "deliveries outstanding when the load stopped",
                    crate::table::count(behind),
                );
            }
            table.deliveries(deliveries, "≥ 9,000/s", "");
        }
        table.setup(&self.setup);
        table
    }
}
