//! What the scenarios share: setting up an application with endpoints, warming endpoints up, and
//! waiting for a phase's deliveries.

use std::time::Duration;

use crate::server_id::{AppId, EndpointId};

use crate::api::EndpointSpec;
use crate::env::Env;
use crate::load::Mix;
use crate::receiver::{Arrival, Receiver};
pub use crate::stats::DeliverySummary;

/// An application created for a scenario and its endpoints' ids (in the order of their specs).
#[derive(Debug, Clone)]
pub struct AppSetup {
    /// The application's id.
    pub app_id: AppId,
    /// Its endpoints' ids.
    pub endpoint_ids: Vec<EndpointId>,
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
    await_arrivals(env, receiver, mark, expected, started_at_us, label)
        .await
        .0
}

/// [`await_deliveries`], also handing back the phase's arrivals, for a scenario that measures more from
/// them than send → arrival.
pub async fn await_arrivals(
    env: &Env,
    receiver: &Receiver,
    mark: u64,
    expected: u64,
    started_at_us: u64,
    label: &str,
) -> (DeliverySummary, Vec<Arrival>) {
    let bar = env.progress.counter(label, mark + expected);
    bar.set_position(mark);
    receiver
        .wait_for(mark + expected, delivery_timeout(expected), &bar)
        .await;
    bar.finish();
    let delivered = receiver.received().saturating_sub(mark);
    let arrivals = receiver.take_arrivals();
    let summary = DeliverySummary::of(expected, delivered, &arrivals, started_at_us);
    (summary, arrivals)
}
