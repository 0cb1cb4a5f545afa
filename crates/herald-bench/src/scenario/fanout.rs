//! `fanout`: one message to an application with many endpoints; the time from the 202 until every
//! endpoint has received it. Repeated for `messages` rounds, one message at a time: the first round
//! includes the server loading the freshly created endpoints, later ones are warm. In-process, the
//! process's memory is sampled around the setup and the rounds, so a wide fan-out's cost shows.

use serde::Serialize;

use super::common::{app_with_endpoints, delivery_timeout};
use crate::api::EndpointSpec;
use crate::cpu::{self, CpuSplit};
use crate::env::{Env, NodeTweaks, Options, Setup};
use crate::load::Mix;
use crate::receiver::Receiver;
use crate::stats::{Spread, rate};
use crate::table::{Table, count, millis, per_second};

const EVENT_TYPE: &str = "bench.fanout";

/// Parameters of `fanout`.
#[derive(Debug, Clone, Serialize)]
pub struct FanoutParams {
    /// Endpoints subscribed to the message.
    pub endpoints: usize,
    /// Rounds (one message each, sent after the previous one was fully received).
    pub messages: usize,
}

impl Default for FanoutParams {
    fn default() -> Self {
        Self {
            endpoints: 1_000,
            messages: 3,
        }
    }
}

impl FanoutParams {
    /// A few seconds, for CI.
    pub fn smoke() -> Self {
        Self {
            endpoints: 50,
            messages: 2,
        }
    }
}

/// One round: one message to every endpoint.
#[derive(Debug, Clone, Serialize)]
pub struct FanoutRound {
    /// The API's latency for the message, in ms.
    pub api_ms: f64,
    /// Deliveries received.
    pub delivered: u64,
    /// Whether every endpoint received it before the wait timed out.
    pub complete: bool,
    /// From the 202 to the first arrival, in ms (0 if it arrived before the 202 reached the client).
    pub first_after_202_ms: f64,
    /// From the 202 to the last arrival, in ms.
    pub all_after_202_ms: f64,
    /// Deliveries per second from sending the message to the last arrival. (Not from the 202: the
    /// deliveries leave at the commit, as the 202 does, so with few endpoints all of them may arrive
    /// before the client has read its 202.)
    pub deliveries_per_s: f64,
    /// CPU split during the round.
    pub cpu: Option<CpuSplit>,
}

/// The process's resident memory around a `fanout` run with the node in-process (MiB; the harness's
/// receiver and its arrival records included).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct FanoutMemory {
    /// Before the endpoints were created.
    pub before_setup_mib: f64,
    /// After they were created, before the first round.
    pub after_setup_mib: f64,
    /// The largest sample during the rounds (one a second, and at their end).
    pub rounds_max_mib: f64,
    /// After the last round.
    pub after_rounds_mib: f64,
}

/// The result of `fanout`.
#[derive(Debug, Clone, Serialize)]
pub struct FanoutReport {
    /// How the server was set up.
    pub setup: Setup,
    /// The parameters.
    pub params: FanoutParams,
    /// Seconds it took to create the endpoints.
    pub setup_seconds: f64,
    /// Memory around setup and rounds (in-process only).
    pub memory: Option<FanoutMemory>,
    /// The rounds, in order.
    pub rounds: Vec<FanoutRound>,
    /// The rounds after the first (whose endpoints' records the node loads first), summarised: what
    /// issue 17's fan-out targets are about. `None` with a single round.
    pub warm: Option<FanoutWarm>,
}

/// The median and range of the warm rounds (every round but the first), in ms.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct FanoutWarm {
    /// How many rounds.
    pub rounds: usize,
    /// The API's latency for the message.
    pub api_ms: Spread,
    /// From the 202 to the last arrival.
    pub all_after_202_ms: Spread,
}

impl FanoutWarm {
    /// The summary of `rounds` but the first; `None` when there is no other.
    fn of(rounds: &[FanoutRound]) -> Option<Self> {
        let warm = rounds.get(1..)?;
        Some(Self {
            rounds: warm.len(),
            api_ms: Spread::of(warm.iter().map(|r| r.api_ms))?,
            all_after_202_ms: Spread::of(warm.iter().map(|r| r.all_after_202_ms))?,
        })
    }
}

/// Run `fanout`.
pub async fn run(options: &Options, params: &FanoutParams) -> anyhow::Result<FanoutReport> {
    let env = Env::start(options, &NodeTweaks::default()).await?;
    let receiver = Receiver::any_port(env.receiver_host).await?;
    let specs: Vec<EndpointSpec> = (0..params.endpoints.max(1))
        .map(|i| EndpointSpec::to(receiver.url(&format!("/fanout/{i}"))))
        .collect();
    let fanout = specs.len() as u64;
    let before_setup = cpu::rss_mib();
    let started = std::time::Instant::now();
    let app = app_with_endpoints(&env, "fanout", &specs).await?;
    let setup_seconds = started.elapsed().as_secs_f64();
    let mix = Mix::single(&app.app_id, EVENT_TYPE);

    let (rounds, rss) = cpu::sample_rss(rounds(&env, &receiver, &mix, fanout, params.messages)).await;
    let memory = match (env.in_process(), before_setup, rss) {
        (true, Some(before), Some(rss)) => Some(FanoutMemory {
            before_setup_mib: before,
            after_setup_mib: rss.start,
            rounds_max_mib: rss.max,
            after_rounds_mib: rss.end,
        }),
        _ => None,
    };
    let rounds = rounds?;
    Ok(FanoutReport {
        setup: env.setup.clone(),
        params: params.clone(),
        setup_seconds,
        memory,
        warm: FanoutWarm::of(&rounds),
        rounds,
    })
}

/// Send `messages` messages one after the other, each once the previous one reached all `fanout`
/// endpoints (or the wait timed out).
async fn rounds(
    env: &Env,
    receiver: &Receiver,
    mix: &Mix,
    fanout: u64,
    messages: usize,
) -> anyhow::Result<Vec<FanoutRound>> {
    let mut rounds = Vec::new();
    for round in 0..messages.max(1) {
        let mark = receiver.received();
        let bar = env.progress.counter(&format!("fan-out round {}", round + 1), fanout);
        let (result, cpu) = cpu::measure(async {
            let sent_at = crate::unix_micros();
            let accepted_at = env.load.send_nth(mix, 0).await?;
            let complete = receiver.wait_for(mark + fanout, delivery_timeout(fanout), &bar).await;
            anyhow::Ok((sent_at, accepted_at, complete))
        })
        .await;
        bar.finish();
        let (sent_at, accepted_at, complete) = result?;
        let arrivals = receiver.take_arrivals();
        let first = arrivals.iter().map(|a| a.arrived_at_us).min().unwrap_or(accepted_at);
        let last = arrivals.iter().map(|a| a.arrived_at_us).max().unwrap_or(accepted_at);
        let all_after = last.saturating_sub(accepted_at) as f64 / 1000.0;
        let delivered = receiver.received().saturating_sub(mark);
        rounds.push(FanoutRound {
            api_ms: accepted_at.saturating_sub(sent_at) as f64 / 1000.0,
            delivered,
            complete,
            first_after_202_ms: first.saturating_sub(accepted_at) as f64 / 1000.0,
            all_after_202_ms: all_after,
            deliveries_per_s: rate(delivered, last.saturating_sub(sent_at) as f64 / 1e6),
            cpu,
        });
    }
    Ok(rounds)
}

impl FanoutReport {
    /// The report as a table.
    pub fn table(&self) -> Table {
        let mut table = Table::new(format!(
            "fanout — 1 message → {} endpoints, {} round(s)",
            count(self.params.endpoints as u64),
            self.rounds.len()
        ));
        table.row(
            "endpoints created in",
            format!(
                "{:.2} s ({})",
                self.setup_seconds,
                per_second(rate(self.params.endpoints as u64, self.setup_seconds))
            ),
        );
        if let Some(memory) = &self.memory {
            table.row(
                "RSS before setup → after → rounds max → end",
                format!(
                    "{:.1} → {:.1} → {:.1} → {:.1} MiB (process incl. harness)",
                    memory.before_setup_mib, memory.after_setup_mib, memory.rounds_max_mib, memory.after_rounds_mib
                ),
            );
        }
        for (i, round) in self.rounds.iter().enumerate() {
            table.section(format!(
                "round {}{}",
                i + 1,
                if i == 0 { " (endpoints cold)" } else { "" }
            ));
            table.row("API latency", millis(round.api_ms));
            let mut received = format!("{} of {}", count(round.delivered), count(self.params.endpoints as u64));
            if !round.complete {
                received.push_str(" (timed out waiting for the rest)");
            }
            table.row("deliveries received", received);
            table.row("first received after the 202", millis(round.first_after_202_ms));
            table.target_row("all received after the 202", millis(round.all_after_202_ms), "≤ 500 ms");
            table.row("deliveries/s", per_second(round.deliveries_per_s));
            table.cpu("the round", round.cpu.as_ref());
        }
        if let Some(warm) = &self.warm {
            let spread = |s: &Spread| format!("{} ({}–{})", millis(s.median), millis(s.min), millis(s.max));
            table.section(format!("rounds 2–{}: median (range)", warm.rounds + 1));
            table.target_row("API latency", spread(&warm.api_ms), "p50 ≤ 10 ms (1,000 endpoints)");
            table.target_row(
                "all received after the 202",
                spread(&warm.all_after_202_ms),
                "≤ 30 ms SQLite, ≤ 50 ms PostgreSQL (1,000 endpoints)",
            );
        }
        table.setup(&self.setup);
        table
    }
}
