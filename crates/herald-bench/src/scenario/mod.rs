//! The scenarios, one module each, and what they share: setting up an application with endpoints,
//! warming endpoints up, and waiting for a phase's deliveries.

pub mod backlog;
pub mod e2e;
pub mod fanout;
pub mod hol;
pub mod inbox;
pub mod ingest;

use std::time::Duration;

use serde::Serialize;

use crate::api::EndpointSpec;
use crate::env::{Env, Options};
use crate::load::Mix;
use crate::receiver::{Arrival, Receiver};
use crate::report::Report;
use crate::stats::{LatencyStats, rate};

/// A named scenario with its parameters.
#[derive(Debug, Clone)]
pub enum Scenario {
    /// Closed-loop ingest.
    Ingest(ingest::IngestParams),
    /// A burst, then a fixed offered rate, measured end to end.
    E2e(e2e::E2eParams),
    /// One message to many endpoints.
    Fanout(fanout::FanoutParams),
    /// Healthy lag with and without a black-holed endpoint.
    Hol(hol::HolParams),
    /// A large pending backlog for a down endpoint, then its drain.
    Backlog(backlog::BacklogParams),
    /// Signed webhooks into an in-process `herald inbox`: acknowledgements per second and latency.
    Inbox(inbox::InboxParams),
}

impl Scenario {
    /// The scenario's name as on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Scenario::Ingest(_) => "ingest",
            Scenario::E2e(_) => "e2e",
            Scenario::Fanout(_) => "fanout",
            Scenario::Hol(_) => "hol",
            Scenario::Backlog(_) => "backlog",
            Scenario::Inbox(_) => "inbox",
        }
    }

    /// Run it.
    pub async fn run(&self, options: &Options) -> anyhow::Result<Report> {
        Ok(match self {
            Scenario::Ingest(p) => Report::Ingest(ingest::run(options, p).await?),
            Scenario::E2e(p) => Report::E2e(e2e::run(options, p).await?),
            Scenario::Fanout(p) => Report::Fanout(fanout::run(options, p).await?),
            Scenario::Hol(p) => Report::Hol(hol::run(options, p).await?),
            Scenario::Backlog(p) => Report::Backlog(backlog::run(options, p).await?),
            Scenario::Inbox(p) => Report::Inbox(inbox::run(options, p).await?),
        })
    }
}

/// An application created for a scenario and its endpoints' ids (in the order of their specs).
#[derive(Debug, Clone)]
pub struct AppSetup {
    /// The application's id.
    pub app_id: String,
    /// Its endpoints' ids.
    pub endpoint_ids: Vec<String>,
}

/// Create an application named `name` (made unique) with one endpoint per spec.
pub async fn app_with_endpoints(env: &Env, name: &str, specs: &[EndpointSpec]) -> anyhow::Result<AppSetup> {
    let name = format!("bench-{name}-{}", hex::encode(rand::random::<[u8; 4]>()));
    let app_id = env.api.create_app(&name).await?;
    let bar = if specs.len() > 20 {
        env.progress.counter("creating endpoints", specs.len() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    let endpoint_ids = env.api.create_endpoints(&app_id, specs, &bar).await?;
    bar.finish();
    Ok(AppSetup { app_id, endpoint_ids })
}

/// Send one message to every target of `mix` and wait until `receiver` has all their deliveries
/// (`fanout` per message), so endpoints are loaded and connections open before measuring; then forget
/// those arrivals.
pub async fn warm_up(env: &Env, mix: &Mix, fanout: u64, receiver: &Receiver) -> anyhow::Result<()> {
    let before = receiver.received();
    let expected = mix.len() as u64 * fanout;
    for index in 0..mix.len() {
        env.load.send_nth(mix, index).await?;
    }
    if !receiver
        .wait_for(
            before + expected,
            Duration::from_secs(30),
            &indicatif::ProgressBar::hidden(),
        )
        .await
    {
        anyhow::bail!(
            "warm-up: the receiver got {} of {expected} messages within 30 s",
            receiver.received() - before
        );
    }
    receiver.take_arrivals();
    Ok(())
}

/// The deliveries of one phase as reported.
#[derive(Debug, Clone, Serialize)]
pub struct DeliverySummary {
    /// Deliveries the phase should produce (accepted messages × subscribed endpoints).
    pub expected: u64,
    /// Deliveries received.
    pub delivered: u64,
    /// Whether all expected deliveries arrived before the wait timed out.
    pub complete: bool,
    /// From the start of the phase's load to the last arrival, in seconds.
    pub seconds: f64,
    /// Deliveries per second over that time.
    pub deliveries_per_s: f64,
    /// Lag from send (`sent_at_us`) to arrival.
    pub lag: Option<LatencyStats>,
}

impl DeliverySummary {
    /// Summarise `arrivals` of a phase whose load started at `started_at_us`.
    pub fn of(expected: u64, delivered: u64, arrivals: &[Arrival], started_at_us: u64) -> Self {
        let last = arrivals.iter().map(|a| a.arrived_at_us).max().unwrap_or(started_at_us);
        let seconds = last.saturating_sub(started_at_us) as f64 / 1e6;
        Self {
            expected,
            delivered,
            complete: delivered >= expected,
            seconds,
            deliveries_per_s: rate(delivered, seconds),
            lag: LatencyStats::from_samples(arrivals.iter().map(Arrival::lag_us).collect()),
        }
    }
}

/// How long to wait for `expected` deliveries before giving up: generous, since a slow server is a
/// result to report, not a reason to hang.
pub fn delivery_timeout(expected: u64) -> Duration {
    Duration::from_secs(30) + Duration::from_millis(expected.saturating_mul(2))
}

/// Wait for the `expected` deliveries of a phase at `receiver` (which had received `mark` requests
/// before the phase, whose load started at `started_at_us`), then summarise them.
pub async fn await_deliveries(
    env: &Env,
    receiver: &Receiver,
    mark: u64,
    expected: u64,
    started_at_us: u64,
    label: &str,
) -> DeliverySummary {
    let bar = env.progress.counter(label, mark + expected);
    bar.set_position(mark);
    receiver
        .wait_for(mark + expected, delivery_timeout(expected), &bar)
        .await;
    bar.finish();
    let delivered = receiver.received().saturating_sub(mark);
    DeliverySummary::of(expected, delivered, &receiver.take_arrivals(), started_at_us)
}
