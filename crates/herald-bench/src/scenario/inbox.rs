//! `inbox`: signed webhooks posted closed-loop into an in-process `herald inbox` (fresh SQLite file, or
//! the PostgreSQL database given with `--database-url`; durable commits) at a fixed concurrency for a fixed time: acknowledgements per second and
//! acknowledgement latency; then how fast the inbox forwarded them all to a handler.
//!
//! Every request is a Standard Webhooks `v1` signature over a unique `webhook-id`, so each one is
//! verified, inserted and committed before its `200` (no duplicates, nothing short-circuited).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use herald_inbox::{Inbox, InboxConfig};
use herald_signature::HmacSecret;
use serde::Serialize;
use tokio::task::JoinSet;

use super::common::DeliverySummary;
use crate::cpu::{self, CpuSplit};
use crate::env::{Machine, Options, Setup, Target};
use crate::load::LoadSummary;
use crate::progress::Progress;
use crate::receiver::Receiver;
use crate::stats::{LatencyStats, rate};
use crate::table::{Table, count, latency, per_second};
use crate::unix_micros;

/// Parameters of `inbox`.
#[derive(Debug, Clone, Serialize)]
pub struct InboxParams {
    /// Requests in flight (closed loop).
    pub concurrency: usize,
    /// How long to send.
    pub duration: Duration,
}

impl Default for InboxParams {
    fn default() -> Self {
        Self {
            concurrency: 64,
            duration: Duration::from_secs(10),
        }
    }
}

impl InboxParams {
    /// A few seconds, for CI.
    pub fn smoke() -> Self {
        Self {
            concurrency: 16,
            duration: Duration::from_secs(2),
        }
    }
}

/// The result of `inbox`.
#[derive(Debug, Clone, Serialize)]
pub struct InboxReport {
    /// How the inbox was set up.
    pub setup: Setup,
    /// The parameters.
    pub params: InboxParams,
    /// Acknowledgements as the load generator saw them.
    pub load: LoadSummary,
    /// The events forwarded to the handler.
    pub forwarded: DeliverySummary,
    /// CPU split during the load.
    pub cpu: Option<CpuSplit>,
}

/// The inbox on its own runtime (threads named `herald-node`, so [`cpu`] counts it as Herald).
struct InProcessInbox {
    runtime: Option<tokio::runtime::Runtime>,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for InProcessInbox {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Run `inbox`.
pub async fn run(options: &Options, params: &InboxParams) -> anyhow::Result<InboxReport> {
    let Target::InProcess { database_url, .. } = &options.target else {
        bail!("the inbox scenario starts its own inbox; --target is not supported");
    };
    // Before the inbox starts, so that its work does not move the machine's figures.
    let machine = Machine::detect();
    crate::cpu::watch(Vec::new());
    let progress = Progress::new(options.progress);
    let handler = Receiver::any_port(options.receiver_host).await?;
    let secret = HmacSecret::from_bytes(&rand::random::<[u8; 32]>()).context("secret")?;
    let config = InboxConfig::from_toml(&format!(
        "[[source]]\nname = \"bench\"\nscheme = \"standard-webhooks\"\nsecrets = [\"{}\"]\nforward_to = \"{}\"\n",
        secret.to_whsec(),
        handler.url("/inbox")
    ))?;
    let (dir, database_url) = match database_url {
        Some(url) => (None, url.clone()),
        None => {
            let dir = tempfile::tempdir().context("creating a temporary directory")?;
            let url = format!("sqlite://{}", dir.path().join("herald-bench-inbox.db").display());
            (Some(dir), url)
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .thread_name("herald-node")
        .enable_all()
        .build()
        .context("starting the inbox's runtime")?;
    let url = database_url.clone();
    let addr = runtime
        .spawn(async move {
            let inbox = Inbox::start(config, &url).await?;
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let addr = listener.local_addr()?;
            let service = inbox.service(None);
            tokio::spawn(async move {
                // The same serving loop as `herald inbox`.
                let edge = herald_edge::Edge::new(herald_edge::Limits::default());
                let _ = edge.serve(listener, service, std::future::pending()).await;
                drop(inbox);
            });
            anyhow::Ok(addr)
        })
        .await
        .context("the inbox's start-up task failed")??;
    let _inbox = InProcessInbox {
        runtime: Some(runtime),
        _dir: dir,
    };

    let load = SignedLoad::new(format!("http://{addr}/in/bench"), secret, options.payload_bytes)?;
    let bar = progress.spinner(&format!("inbox c{}", params.concurrency));
    let (outcome, cpu) = cpu::measure(load.closed_loop(params.concurrency, params.duration, &bar)).await;
    bar.finish();

    let expected = outcome.summary.accepted;
    let wait = progress.counter("forwarded", expected);
    handler
        .wait_for(expected, super::common::delivery_timeout(expected), &wait)
        .await;
    wait.finish();
    let forwarded = DeliverySummary::of(
        expected,
        handler.received(),
        &handler.take_arrivals(),
        outcome.started_at_us,
    );
    Ok(InboxReport {
        setup: Setup {
            server: "in-process herald inbox".to_owned(),
            database: if database_url.starts_with("sqlite://") && options_default_db(options) {
                "SQLite, fresh file in a temporary directory".to_owned()
            } else {
                herald_server::redact(&database_url)
            },
            durability: if database_url.starts_with("sqlite:") {
                "SQLite WAL, synchronous=FULL: a 200 is sent only after the verified event is committed and \
                 fsynced (group commit: one transaction and one fsync per batch of up to 256 events)"
            } else {
                "PostgreSQL, synchronous_commit=on: a 200 is sent only after the verified event's own \
                 statement is committed and flushed to the WAL (no batching; concurrent commits share \
                 PostgreSQL's WAL flushes)"
            }
            .to_owned(),
            settings: vec!["one standard-webhooks source, one loopback handler".to_owned()],
            machine,
            local_nodes: Vec::new(),
        },
        params: params.clone(),
        load: outcome.summary,
        forwarded,
        cpu,
    })
}

fn options_default_db(options: &Options) -> bool {
    matches!(&options.target, Target::InProcess { database_url: None, .. })
}

/// Closed-loop signed requests to one inbox source.
struct SignedLoad {
    client: reqwest::Client,
    url: Arc<str>,
    secret: Arc<HmacSecret>,
    pad: Arc<str>,
    sequence: Arc<AtomicU64>,
}

struct Outcome {
    summary: LoadSummary,
    started_at_us: u64,
}

impl SignedLoad {
    fn new(url: String, secret: HmacSecret, payload_bytes: usize) -> anyhow::Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .no_proxy()
            .http1_only()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(256)
            .timeout(Duration::from_secs(60))
            .build()
            .context("HTTP client")?;
        Ok(Self {
            client,
            url: Arc::from(url),
            secret: Arc::new(secret),
            // The fixed part of the payload is about 60 bytes.
            pad: Arc::from("x".repeat(payload_bytes.saturating_sub(60))),
            sequence: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Sign and post one event; its acknowledgement latency.
    async fn send(&self) -> anyhow::Result<Duration> {
        let seq = self.sequence.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let body = format!(r#"{{"sent_at_us":{},"seq":{seq},"pad":"{}"}}"#, unix_micros(), self.pad);
        let msg_id = format!("msg_bench_{seq}");
        let timestamp = i64::try_from(unix_micros() / 1_000_000).unwrap_or(i64::MAX);
        let signature = self.secret.sign(&msg_id, timestamp, body.as_bytes());
        let response = self
            .client
            .post(&*self.url)
            .header("content-type", "application/json")
            .header("webhook-id", &msg_id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        if status.as_u16() != 200 {
            bail!("{status}: {text}");
        }
        Ok(started.elapsed())
    }

    async fn closed_loop(&self, concurrency: usize, duration: Duration, bar: &indicatif::ProgressBar) -> Outcome {
        let started = Instant::now();
        let started_at_us = unix_micros();
        let mut workers = JoinSet::new();
        for _ in 0..concurrency.max(1) {
            let load = Self {
                client: self.client.clone(),
                url: self.url.clone(),
                secret: self.secret.clone(),
                pad: self.pad.clone(),
                sequence: self.sequence.clone(),
            };
            let bar = bar.clone();
            workers.spawn(async move {
                let mut latencies = Vec::new();
                let mut errors = 0u64;
                let mut first_error = None;
                while started.elapsed() < duration {
                    match load.send().await {
                        Ok(latency) => {
                            bar.inc(1);
                            latencies.push(u64::try_from(latency.as_micros()).unwrap_or(u64::MAX));
                        }
                        Err(error) => {
                            errors += 1;
                            first_error.get_or_insert_with(|| format!("{error:#}"));
                        }
                    }
                }
                (latencies, errors, first_error)
            });
        }
        let mut latencies = Vec::new();
        let mut errors = 0;
        let mut first_error = None;
        while let Some(joined) = workers.join_next().await {
            match joined {
                Ok((l, e, f)) => {
                    latencies.extend(l);
                    errors += e;
                    if first_error.is_none() {
                        first_error = f;
                    }
                }
                Err(error) => {
                    errors += 1;
                    first_error.get_or_insert_with(|| format!("load worker failed: {error}"));
                }
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        let accepted = latencies.len() as u64;
        Outcome {
            summary: LoadSummary {
                accepted,
                errors,
                skipped: 0,
                first_error,
                seconds,
                accepted_per_s: rate(accepted, seconds),
                api_latency: LatencyStats::from_samples(latencies),
                // One in-process inbox.
                by_node: Vec::new(),
            },
            started_at_us,
        }
    }
}

impl InboxReport {
    /// The report as a table.
    pub fn table(&self) -> Table {
        let mut table = Table::new(format!(
            "inbox — c{}, {} s",
            self.params.concurrency,
            self.params.duration.as_secs_f64()
        ));
        table.section("acknowledgements (verify → commit → 200)");
        table.row("events acknowledged", count(self.load.accepted));
        table.row("acknowledgements/s", per_second(self.load.accepted_per_s));
        let mut errors = count(self.load.errors);
        if let Some(first) = &self.load.first_error {
            errors.push_str(&format!(" (first: {first})"));
        }
        table.row("errors", errors);
        table.row(
            "acknowledgement latency p50 / p99 / max",
            latency(self.load.api_latency.as_ref()),
        );
        table.cpu("the load", self.cpu.as_ref());
        table.section("forwarding to the handler");
        table.deliveries(&self.forwarded, "", "");
        table.setup(&self.setup);
        table
    }
}
