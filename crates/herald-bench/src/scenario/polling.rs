//! `polling`: one consumer pulling a polling endpoint's stream (docs/pull.md), as the SDKs'
//! `message.poller.consumer_poll` does. Two phases:
//!
//! - **throughput**: `messages` are published first (closed loop), then the consumer reads them from its
//!   committed offset, `limit` per request, committing each page by coming back with the answer's
//!   `iterator` — messages pulled per second by one consumer;
//! - **latency**: the consumer long-polls (`wait_ms`) from where it stopped while messages are posted at
//!   `rate` for `duration`; each payload's `sent_at_us` (taken just before its `POST`) gives publish →
//!   consumer arrival, the figure a pulling receiver sees in place of a push's delivery lag.
//!
//! Every message id is checked: a single consumer that commits as it goes must never read one twice.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use herald_core::id::{AppId, MessageId, SinkId};
use serde::Serialize;

use super::common::{app_with_endpoints, delivery_timeout};
use crate::api::{Api, PolledPage};
use crate::env::{Env, NodeTweaks, Options, Setup};
use crate::load::{LoadSummary, Mix, Stop};
use crate::stats::{LatencyStats, rate};
use crate::table::{Table, count, latency, per_second};
use crate::unix_micros;

const EVENT_TYPE: &str = "bench.polling";
const CONSUMER: &str = "bench-consumer";
/// Publishers in the throughput phase's closed loop.
const PUBLISHERS: usize = 32;

/// Parameters of `polling`.
#[derive(Debug, Clone, Serialize)]
pub struct PollingParams {
    /// Messages published before the consumer starts (throughput phase).
    pub messages: u64,
    /// Messages per read (1–250).
    pub limit: u32,
    /// Messages per second posted in the latency phase.
    pub rate: f64,
    /// Length of the latency phase.
    pub duration: Duration,
    /// How long one read waits for a message when there is none (`wait_ms`, ≤ 30 s).
    pub wait: Duration,
}

impl Default for PollingParams {
    fn default() -> Self {
        Self {
            messages: 20_000,
            limit: 250,
            rate: 200.0,
            duration: Duration::from_secs(10),
            wait: Duration::from_secs(20),
        }
    }
}

impl PollingParams {
    /// A few seconds, for CI.
    pub fn smoke() -> Self {
        Self {
            messages: 300,
            limit: 100,
            rate: 50.0,
            duration: Duration::from_secs(2),
            wait: Duration::from_secs(5),
        }
    }
}

/// The result of `polling`.
#[derive(Debug, Clone, Serialize)]
pub struct PollingReport {
    /// How the server was set up.
    pub setup: Setup,
    /// The parameters.
    pub params: PollingParams,
    /// Publishing the throughput phase's messages.
    pub publish: LoadSummary,
    /// Messages the consumer read in the throughput phase.
    pub pulled: u64,
    /// How long reading them took.
    pub pull_seconds: f64,
    /// Messages pulled per second by the one consumer.
    pub pulled_per_s: f64,
    /// Reads it made for them.
    pub reads: u64,
    /// Messages posted in the latency phase.
    pub posted: u64,
    /// Of those, the messages the consumer read before the wait timed out.
    pub received: u64,
    /// Publish → consumer arrival in the latency phase.
    pub lag: Option<LatencyStats>,
    /// Messages read more than once, in both phases (0 for a consumer that commits as it goes).
    pub duplicates: u64,
}

/// The consumer's state: where it is, what it has seen and when each message arrived.
struct Consumer {
    api: Api,
    app_id: AppId,
    sink_id: SinkId,
    limit: u32,
    iterator: Option<String>,
    seen: HashSet<MessageId>,
    duplicates: u64,
    reads: u64,
}

impl Consumer {
    /// One read; returns the page's lag samples (arrival − `sent_at_us`, µs) of messages not seen before.
    async fn read(&mut self, wait: Duration) -> anyhow::Result<(PolledPage, Vec<u64>)> {
        let page = self
            .api
            .consumer_poll(
                &self.app_id,
                &self.sink_id,
                CONSUMER,
                self.iterator.as_deref(),
                self.limit,
                wait,
            )
            .await?;
        let arrived = unix_micros();
        self.reads += 1;
        self.iterator = Some(page.iterator.clone());
        let mut lags = Vec::with_capacity(page.data.len());
        for message in &page.data {
            if !self.seen.insert(message.id.clone()) {
                self.duplicates += 1;
                continue;
            }
            if let Some(sent) = message.payload.get("sent_at_us").and_then(serde_json::Value::as_u64) {
                lags.push(arrived.saturating_sub(sent));
            }
        }
        Ok((page, lags))
    }
}

/// Run `polling`.
pub async fn run(options: &Options, params: &PollingParams) -> anyhow::Result<PollingReport> {
    anyhow::ensure!((1..=250).contains(&params.limit), "--limit must be 1 to 250");
    anyhow::ensure!(params.wait <= Duration::from_secs(30), "--wait must be at most 30 s");
    let env = Env::start(options, &NodeTweaks::default()).await?;
    // An application without push endpoints: its messages are only pulled.
    let app = app_with_endpoints(&env, "polling", &[]).await?;
    let sink_id = env.api.create_polling_endpoint(&app.app_id, EVENT_TYPE).await?;
    let mix = Mix::single(&app.app_id, EVENT_TYPE);
    let mut consumer = Consumer {
        api: env.api.clone(),
        app_id: app.app_id.clone(),
        sink_id,
        limit: params.limit,
        iterator: None,
        seen: HashSet::new(),
        duplicates: 0,
        reads: 0,
    };

    // Throughput: everything is published before the first read.
    let bar = env.progress.counter("publishing", params.messages);
    let published = env
        .load
        .closed_loop(&mix, PUBLISHERS, Stop::Count(params.messages), false, &bar)
        .await;
    bar.finish();
    let bar = env.progress.counter("pulling", published.accepted);
    let deadline = Instant::now() + delivery_timeout(published.accepted);
    let started = Instant::now();
    let mut pulled = 0_u64;
    while pulled < published.accepted && Instant::now() < deadline {
        let (page, lags) = consumer.read(Duration::ZERO).await?;
        pulled += lags.len() as u64;
        bar.set_position(pulled);
        // An empty, finished page with messages missing: they are not there to read; stop, report it.
        if page.data.is_empty() && page.done {
            break;
        }
    }
    let pull_seconds = started.elapsed().as_secs_f64();
    bar.finish();
    let reads = consumer.reads;

    // Latency: the consumer long-polls in its own task while the load posts at a fixed rate; the task
    // hands the consumer back when told to stop (an unanswered long poll is simply dropped).
    let received = Arc::new(AtomicU64::new(0));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let wait = params.wait;
    let reader = {
        let received = received.clone();
        tokio::spawn(async move {
            let mut lags = Vec::new();
            tokio::pin!(stopped);
            loop {
                tokio::select! {
                    _ = &mut stopped => return anyhow::Ok((consumer, lags)),
                    read = consumer.read(wait) => {
                        let (_, batch) = read?;
                        received.fetch_add(batch.len() as u64, Ordering::Relaxed);
                        lags.extend(batch);
                    }
                }
            }
        })
    };
    let bar = env.progress.spinner(&format!("posting {} msg/s", params.rate));
    let posted = env.load.open_loop(&mix, params.rate, params.duration, &bar).await;
    bar.finish();
    let deadline = Instant::now() + delivery_timeout(posted.accepted);
    while received.load(Ordering::Relaxed) < posted.accepted && Instant::now() < deadline && !reader.is_finished() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Already finished means it failed: then the send finds no receiver and the error comes out below.
    let _ = stop.send(());
    let (consumer, samples) = reader.await.context("the consumer task")??;
    Ok(PollingReport {
        setup: env.setup.clone(),
        params: params.clone(),
        publish: published.summary(),
        pulled,
        pull_seconds,
        pulled_per_s: rate(pulled, pull_seconds),
        reads,
        posted: posted.accepted,
        received: received.load(Ordering::Relaxed),
        lag: LatencyStats::from_samples(samples),
        duplicates: consumer.duplicates,
    })
}

impl PollingReport {
    /// The report as a table.
    pub fn table(&self) -> Table {
        let p = &self.params;
        let mut table = Table::new(format!(
            "polling — one consumer: {} messages, then {} msg/s for {} s (limit {}, wait_ms {})",
            count(p.messages),
            p.rate,
            p.duration.as_secs_f64(),
            p.limit,
            p.wait.as_millis()
        ));
        table.section("throughput: published first, then pulled");
        table.row("messages published", count(self.publish.accepted));
        table.row(
            "messages pulled",
            format!(
                "{} in {} reads, {:.2} s",
                count(self.pulled),
                count(self.reads),
                self.pull_seconds
            ),
        );
        table.target_row("pulled/s (one consumer)", per_second(self.pulled_per_s), "");
        table.section("latency: long poll while messages are posted");
        let mut received = format!("{} of {}", count(self.received), count(self.posted));
        if self.received < self.posted {
            received.push_str(" (timed out waiting for the rest)");
        }
        table.row("messages received", received);
        table.target_row("publish → consumer p50 / p99 / max", latency(self.lag.as_ref()), "");
        table.row("read twice", count(self.duplicates));
        table.setup(&self.setup);
        table
    }
}
