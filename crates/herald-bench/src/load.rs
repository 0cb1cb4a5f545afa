//! The load generator: posts messages closed-loop (N workers, each sending its next message as soon as
//! the previous one is answered) or open-loop (a fixed offered rate, whatever the answers take).
//!
//! Every payload carries `"sent_at_us"` (Unix µs, taken just before the request is sent) and a sequence
//! number, padded to the configured size.
//!
//! With several nodes (`--target` given more than once) sends go round-robin over them by that sequence
//! number, so each node gets an equal share of the requests whatever the scenario (closed or open loop),
//! and each outcome counts what every node accepted.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::api::Api;
use crate::stats::{LatencyStats, rate};
use crate::unix_micros;

/// Requests an open-loop phase may have outstanding before it skips sends (and says so).
const MAX_OUTSTANDING: usize = 4_096;

/// Where one kind of message goes: an application's message path and an event type.
#[derive(Debug, Clone)]
pub struct Target {
    path: Arc<str>,
    event_type: Arc<str>,
}

/// The messages of a phase: sends cycle through the targets in order, so each gets an equal share.
#[derive(Debug, Clone)]
pub struct Mix {
    targets: Arc<[Target]>,
}

impl Mix {
    /// Cycle through `(app_id, event_type)` pairs.
    pub fn new(targets: &[(&str, &str)]) -> Self {
        Self {
            targets: targets
                .iter()
                .map(|(app, event_type)| Target {
                    path: Arc::from(Api::message_path(app)),
                    event_type: Arc::from(*event_type),
                })
                .collect(),
        }
    }

    /// Every message to one application with one event type.
    pub fn single(app_id: &str, event_type: &str) -> Self {
        Self::new(&[(app_id, event_type)])
    }

    /// How many targets it cycles through.
    pub fn len(&self) -> usize {
        self.targets.len()
    }

    /// True if it has no targets (nothing can be sent).
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }

    fn pick(&self, n: u64) -> (usize, &Target) {
        let index = usize::try_from(n % self.targets.len() as u64).unwrap_or(0);
        (index, &self.targets[index])
    }
}

/// When a closed loop stops.
#[derive(Debug, Clone, Copy)]
pub enum Stop {
    /// After this long.
    After(Duration),
    /// After this many messages were sent (answered or not).
    Count(u64),
}

/// What one load phase produced.
#[derive(Debug, Default)]
pub struct LoadOutcome {
    /// Messages the server accepted (2xx).
    pub accepted: u64,
    /// Accepted messages per target of the [`Mix`], by position.
    pub accepted_by_target: Vec<u64>,
    /// Accepted and failed messages per node, in the order of the load generator's nodes.
    pub by_node: Vec<NodeCount>,
    /// Messages refused or failed (non-2xx, connection errors, timeouts).
    pub errors: u64,
    /// Open loop only: sends skipped because too many requests were outstanding.
    pub skipped: u64,
    /// The first error, for the report.
    pub first_error: Option<String>,
    /// API latencies of accepted messages, in µs (empty when not kept).
    pub latencies_us: Vec<u64>,
    /// From the first send to the last answer.
    pub elapsed: Duration,
    /// When the phase started (Unix µs).
    pub started_at_us: u64,
}

/// What one node did in a phase.
#[derive(Debug, Clone, Default)]
pub struct NodeCount {
    /// The node's base URL.
    pub node: Arc<str>,
    /// Messages it accepted.
    pub accepted: u64,
    /// Messages it refused or failed.
    pub errors: u64,
}

impl LoadOutcome {
    fn new(targets: usize, nodes: &[Api]) -> Self {
        Self {
            accepted_by_target: vec![0; targets],
            by_node: nodes
                .iter()
                .map(|api| NodeCount {
                    node: api.server(),
                    ..NodeCount::default()
                })
                .collect(),
            ..Self::default()
        }
    }

    fn add(&mut self, target: usize, node: usize, result: anyhow::Result<Duration>, keep_latency: bool) {
        if let Some(count) = self.by_node.get_mut(node) {
            match &result {
                Ok(_) => count.accepted += 1,
                Err(_) => count.errors += 1,
            }
        }
        match result {
            Ok(latency) => {
                self.accepted += 1;
                self.accepted_by_target[target] += 1;
                if keep_latency {
                    self.latencies_us
                        .push(u64::try_from(latency.as_micros()).unwrap_or(u64::MAX));
                }
            }
            Err(error) => {
                self.errors += 1;
                if self.first_error.is_none() {
                    self.first_error = Some(format!("{error:#}"));
                }
            }
        }
    }

    fn merge(&mut self, other: LoadOutcome) {
        self.accepted += other.accepted;
        for (mine, theirs) in self.accepted_by_target.iter_mut().zip(other.accepted_by_target) {
            *mine += theirs;
        }
        for (mine, theirs) in self.by_node.iter_mut().zip(other.by_node) {
            mine.accepted += theirs.accepted;
            mine.errors += theirs.errors;
        }
        self.errors += other.errors;
        self.skipped += other.skipped;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.latencies_us.extend(other.latencies_us);
    }

    /// The phase in figures for a report.
    pub fn summary(&self) -> LoadSummary {
        let seconds = self.elapsed.as_secs_f64();
        LoadSummary {
            accepted: self.accepted,
            errors: self.errors,
            skipped: self.skipped,
            first_error: self.first_error.clone(),
            seconds,
            accepted_per_s: rate(self.accepted, seconds),
            api_latency: LatencyStats::from_samples(self.latencies_us.clone()),
            by_node: self.node_shares(),
        }
    }

    /// Each node's part of the phase; empty with one node (it did everything).
    fn node_shares(&self) -> Vec<NodeShare> {
        if self.by_node.len() < 2 {
            return Vec::new();
        }
        self.by_node
            .iter()
            .map(|count| NodeShare {
                node: count.node.to_string(),
                accepted: count.accepted,
                errors: count.errors,
                share: if self.accepted == 0 {
                    0.0
                } else {
                    count.accepted as f64 / self.accepted as f64
                },
            })
            .collect()
    }
}

/// One node's part of a load phase spread over several nodes.
#[derive(Debug, Clone, Serialize)]
pub struct NodeShare {
    /// The node's base URL.
    pub node: String,
    /// Messages it accepted.
    pub accepted: u64,
    /// Messages it refused or failed.
    pub errors: u64,
    /// Its fraction of all accepted messages (0 to 1).
    pub share: f64,
}

/// A load phase as reported.
#[derive(Debug, Clone, Serialize)]
pub struct LoadSummary {
    /// Messages accepted.
    pub accepted: u64,
    /// Messages refused or failed.
    pub errors: u64,
    /// Open loop: sends skipped because the server fell too far behind.
    pub skipped: u64,
    /// The first error, if any.
    pub first_error: Option<String>,
    /// Length of the phase in seconds.
    pub seconds: f64,
    /// Accepted messages per second.
    pub accepted_per_s: f64,
    /// API latency of accepted messages.
    pub api_latency: Option<LatencyStats>,
    /// With several nodes, each one's part (empty with one node).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub by_node: Vec<NodeShare>,
}

/// The load generator.
#[derive(Clone)]
pub struct LoadGen {
    /// The nodes messages are posted to, round-robin; never empty.
    nodes: Arc<[Api]>,
    pad: Arc<str>,
    sequence: Arc<AtomicU64>,
}

impl LoadGen {
    /// Send through `api` and the `others` nodes (round-robin), padding payloads to about
    /// `payload_bytes`.
    pub fn new(api: Api, others: Vec<Api>, payload_bytes: usize) -> Self {
        // The fixed part of the payload is about 60 bytes.
        let pad = "x".repeat(payload_bytes.saturating_sub(60));
        Self {
            nodes: std::iter::once(api).chain(others).collect(),
            pad: Arc::from(pad),
            sequence: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Post one message to `target`; returns the node it went to (by index) and the API latency.
    async fn send(&self, target: &Target) -> (usize, anyhow::Result<Duration>) {
        let seq = self.sequence.fetch_add(1, Ordering::Relaxed);
        let node = usize::try_from(seq % self.nodes.len() as u64).unwrap_or(0);
        (node, self.send_to(node, seq, target).await)
    }

    async fn send_to(&self, node: usize, seq: u64, target: &Target) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let body = format!(
            r#"{{"eventType":"{}","payload":{{"sent_at_us":{},"seq":{seq},"pad":"{}"}}}}"#,
            target.event_type,
            unix_micros(),
            self.pad
        );
        self.nodes[node].post_message(&target.path, body).await?;
        Ok(started.elapsed())
    }

    /// Post one message to the `index`-th target of `mix`; returns when it was accepted (Unix µs).
    pub async fn send_nth(&self, mix: &Mix, index: usize) -> anyhow::Result<u64> {
        let (_, target) = mix.pick(index as u64);
        self.send(target).await.1?;
        Ok(unix_micros())
    }

    /// Closed loop: `concurrency` workers send until `stop`; `bar` counts accepted messages. API
    /// latencies are kept only if `keep_latencies`.
    pub async fn closed_loop(
        &self,
        mix: &Mix,
        concurrency: usize,
        stop: Stop,
        keep_latencies: bool,
        bar: &ProgressBar,
    ) -> LoadOutcome {
        let started = Instant::now();
        let started_at_us = unix_micros();
        let issued = Arc::new(AtomicU64::new(0));
        let mut workers = JoinSet::new();
        for _ in 0..concurrency.max(1) {
            let load = self.clone();
            let mix = mix.clone();
            let issued = issued.clone();
            let bar = bar.clone();
            workers.spawn(async move {
                let mut outcome = LoadOutcome::new(mix.len(), &load.nodes);
                loop {
                    let n = issued.fetch_add(1, Ordering::Relaxed);
                    let done = match stop {
                        Stop::After(duration) => started.elapsed() >= duration,
                        Stop::Count(count) => n >= count,
                    };
                    if done {
                        break;
                    }
                    let (index, target) = mix.pick(n);
                    let (node, result) = load.send(target).await;
                    if result.is_ok() {
                        bar.inc(1);
                    }
                    outcome.add(index, node, result, keep_latencies);
                }
                outcome
            });
        }
        let mut total = LoadOutcome::new(mix.len(), &self.nodes);
        while let Some(joined) = workers.join_next().await {
            match joined {
                Ok(outcome) => total.merge(outcome),
                Err(error) => total.add(
                    0,
                    usize::MAX,
                    Err(anyhow::anyhow!("load worker failed: {error}")),
                    false,
                ),
            }
        }
        total.elapsed = started.elapsed();
        total.started_at_us = started_at_us;
        total
    }

    /// Open loop: offer `per_second` messages per second for `duration`, each send in its own task so
    /// a slow answer never delays the next send; `bar` counts accepted messages.
    pub async fn open_loop(&self, mix: &Mix, per_second: f64, duration: Duration, bar: &ProgressBar) -> LoadOutcome {
        let started = tokio::time::Instant::now();
        let started_at_us = unix_micros();
        let interval = Duration::from_secs_f64(1.0 / per_second.max(0.001));
        let slots = Arc::new(Semaphore::new(MAX_OUTSTANDING));
        let mut total = LoadOutcome::new(mix.len(), &self.nodes);
        let mut sends = JoinSet::new();
        for n in 0u64.. {
            let due = started + interval.mul_f64(n as f64);
            if due >= started + duration {
                break;
            }
            tokio::time::sleep_until(due).await;
            while let Some(joined) = sends.try_join_next() {
                collect(&mut total, joined, bar);
            }
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                total.skipped += 1;
                continue;
            };
            let load = self.clone();
            let mix = mix.clone();
            sends.spawn(async move {
                let (index, target) = mix.pick(n);
                let (node, result) = load.send(target).await;
                drop(slot);
                (index, node, result)
            });
        }
        while let Some(joined) = sends.join_next().await {
            collect(&mut total, joined, bar);
        }
        total.elapsed = started.elapsed();
        total.started_at_us = started_at_us;
        total
    }
}

fn collect(
    total: &mut LoadOutcome,
    joined: Result<(usize, usize, anyhow::Result<Duration>), tokio::task::JoinError>,
    bar: &ProgressBar,
) {
    match joined {
        Ok((index, node, result)) => {
            if result.is_ok() {
                bar.inc(1);
            }
            total.add(index, node, result, true);
        }
        // A task that failed to run reached no node: counted in the totals only.
        Err(error) => total.add(0, usize::MAX, Err(anyhow::anyhow!("send task failed: {error}")), false),
    }
}
