//! `herald bench <scenario>`: run a benchmark scenario and print its figures.
//!
//! By default a Herald node is started in this process on a temporary SQLite store; `--target URL
//! --token T` measures a running server instead through its public API, and `--target A --target B …`
//! (or `--target A,B`) the nodes of one cluster, messages round-robin over them. See
//! `docs/performance.md`.

use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use anyhow::bail;
use clap::{Args, Subcommand};
use herald_bench::scenario::backlog::BacklogParams;
use herald_bench::scenario::e2e::E2eParams;
use herald_bench::scenario::fanout::FanoutParams;
use herald_bench::scenario::hol::HolParams;
use herald_bench::scenario::inbox::InboxParams;
use herald_bench::scenario::ingest::IngestParams;
use herald_bench::scenario::outbox::OutboxParams;
use herald_bench::scenario::polling::PollingParams;
use herald_bench::{Options, Scenario, Target};

/// Options of `herald bench`.
#[derive(Args)]
pub(crate) struct BenchArgs {
    #[command(subcommand)]
    scenario: ScenarioArgs,
    /// Shrink the scenario to a few seconds (for CI); explicit sizes still win.
    #[arg(long, global = true)]
    smoke: bool,
    /// Measure the running server at this URL (e.g. http://127.0.0.1:8040) instead of starting one.
    /// It must allow http endpoints on the receivers' address (e.g. 'herald serve --dev'). Given more
    /// than once (or as a comma list), the nodes of one cluster: setup goes through the first, messages
    /// round-robin to all, and the report gives each node's share.
    #[arg(long, global = true, env = "HERALD_BENCH_TARGET", value_delimiter = ',')]
    target: Vec<String>,
    /// Admin token of the --target server (the same on every node).
    #[arg(long, global = true, env = "HERALD_BENCH_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Store of the in-process node [default: a fresh SQLite file in a temporary directory].
    #[arg(long, global = true)]
    database_url: Option<String>,
    /// Per-endpoint concurrency cap of the in-process node [default: Herald's, 10].
    #[arg(long, global = true)]
    endpoint_concurrency: Option<u32>,
    /// Address the receivers listen on; endpoints point there.
    #[arg(long, global = true, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    receiver_host: IpAddr,
    /// Approximate payload size in bytes.
    #[arg(long, global = true, default_value_t = 256)]
    payload_bytes: usize,
    /// Show no progress on standard error.
    #[arg(long, global = true)]
    quiet: bool,
}

/// The scenarios and their sizes. Durations take a unit (500ms, 10s, 2m) or plain seconds.
#[derive(Subcommand)]
enum ScenarioArgs {
    /// Closed-loop POST …/msg to one endpoint: accepted msgs/s, API latency, delivered msgs/s.
    Ingest {
        /// Requests in flight [default: 64; smoke: 16].
        #[arg(short, long)]
        concurrency: Option<usize>,
        /// How long to send [default: 10s; smoke: 2s].
        #[arg(short, long, value_parser = duration)]
        duration: Option<Duration>,
        /// Create the endpoint disabled, to measure ingest alone: each message still gets its delivery
        /// row (a disabled endpoint's deliveries wait until it is enabled again), but nothing is sent.
        #[arg(long)]
        paused: bool,
    },
    /// A burst of messages as fast as accepted, then a fixed offered rate: deliveries/s and lag.
    E2e {
        /// Messages in the burst [default: 10000; smoke: 200].
        #[arg(short = 'n', long)]
        messages: Option<u64>,
        /// Endpoints every message goes to [default: 1; smoke: 2].
        #[arg(short, long)]
        endpoints: Option<usize>,
        /// Requests in flight during the burst [default: 64; smoke: 16].
        #[arg(short, long)]
        concurrency: Option<usize>,
        /// Offered messages per second in the steady phase [default: 1000; smoke: 100].
        #[arg(short, long)]
        rate: Option<f64>,
        /// Length of the steady phase [default: 10s; smoke: 2s].
        #[arg(short, long, value_parser = duration)]
        duration: Option<Duration>,
    },
    /// One message to many endpoints: time from the 202 until all received.
    Fanout {
        /// Endpoints [default: 1000; smoke: 50].
        #[arg(short, long)]
        endpoints: Option<usize>,
        /// Rounds, one message each [default: 3; smoke: 2].
        #[arg(short = 'n', long)]
        messages: Option<usize>,
    },
    /// Healthy endpoints' lag with and without a black-holed endpoint taking half the messages.
    Hol {
        /// Offered messages per second [default: 1000; smoke: 100].
        #[arg(short, long)]
        rate: Option<f64>,
        /// Length of each run [default: 10s; smoke: 2s].
        #[arg(short, long, value_parser = duration)]
        duration: Option<Duration>,
    },
    /// A large backlog for a down endpoint: RSS, healthy ingest and lag, then the drain.
    Backlog {
        /// Deliveries left pending [default: 1000000; smoke: 5000].
        #[arg(short, long)]
        pending: Option<u64>,
        /// Requests in flight while ingesting [default: 64; smoke: 16].
        #[arg(short, long)]
        concurrency: Option<usize>,
        /// Length of each healthy measurement [default: 10s; smoke: 2s].
        #[arg(short, long, value_parser = duration)]
        duration: Option<Duration>,
        /// Offered healthy messages per second for the lag [default: 1000; smoke: 100].
        #[arg(short, long)]
        rate: Option<f64>,
        /// In-process: delay between retries of the down endpoint's deliveries [default: 30s; smoke: 1s].
        #[arg(long, value_parser = duration)]
        retry_every: Option<Duration>,
    },
    /// Signed webhooks into an in-process herald inbox (a fresh durable SQLite file, or the PostgreSQL
    /// database of --database-url): acknowledgements/s and latency.
    Inbox {
        /// Requests in flight [default: 64; smoke: 16].
        #[arg(short, long)]
        concurrency: Option<usize>,
        /// How long to send [default: 10s; smoke: 2s].
        #[arg(short, long, value_parser = duration)]
        duration: Option<Duration>,
    },
    /// The transactional outbox (docs/outbox.md): rows relayed/s and lag to the receiver (from the
    /// producer's acknowledged commit, and from just before its insert), through
    /// herald_publish (when --database-url is PostgreSQL) and through herald relay from --source.
    Outbox {
        /// Rows committed at once for the throughput phase [default: 20000; smoke: 300].
        #[arg(short = 'n', long)]
        rows: Option<u64>,
        /// Rows per second (one per transaction) in the lag phase [default: 1000; smoke: 100].
        #[arg(short, long)]
        rate: Option<f64>,
        /// Length of the lag phase [default: 10s; smoke: 2s].
        #[arg(short, long, value_parser = duration)]
        duration: Option<Duration>,
        /// The producer's own database for herald relay (postgres://, mysql://, sqlite://) [default: a
        /// fresh SQLite file]; its herald_outbox table is created if missing and emptied.
        #[arg(long)]
        source: Option<String>,
        /// Producer connections in the lag phase, each committing one row per transaction [default: 8].
        #[arg(long)]
        producers: Option<usize>,
    },
    /// One consumer pulling a polling endpoint (docs/pull.md): messages pulled/s from a published
    /// backlog, then publish → consumer latency with long polls while messages are posted.
    Polling {
        /// Messages published before the consumer reads them [default: 20000; smoke: 300].
        #[arg(short = 'n', long)]
        messages: Option<u64>,
        /// Messages per read, 1 to 250 [default: 250; smoke: 100].
        #[arg(short, long)]
        limit: Option<u32>,
        /// Messages per second posted in the latency phase [default: 200; smoke: 50].
        #[arg(short, long)]
        rate: Option<f64>,
        /// Length of the latency phase [default: 10s; smoke: 2s].
        #[arg(short, long, value_parser = duration)]
        duration: Option<Duration>,
        /// How long a read waits for a message (wait_ms), at most 30s [default: 20s; smoke: 5s].
        #[arg(short, long, value_parser = duration)]
        wait: Option<Duration>,
    },
}

/// A duration with a unit (`ms`, `s`, `m`, `h`) or plain seconds.
fn duration(text: &str) -> Result<Duration, String> {
    if let Ok(seconds) = text.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).map_err(|e| e.to_string());
    }
    herald_core::retry::parse_duration(text).map_err(|e| e.to_string())
}

impl ScenarioArgs {
    fn scenario(self, smoke: bool) -> Scenario {
        match self {
            ScenarioArgs::Ingest {
                concurrency,
                duration,
                paused,
            } => {
                let base = if smoke {
                    IngestParams::smoke()
                } else {
                    IngestParams::default()
                };
                Scenario::Ingest(IngestParams {
                    concurrency: concurrency.unwrap_or(base.concurrency),
                    duration: duration.unwrap_or(base.duration),
                    paused,
                })
            }
            ScenarioArgs::E2e {
                messages,
                endpoints,
                concurrency,
                rate,
                duration,
            } => {
                let base = if smoke {
                    E2eParams::smoke()
                } else {
                    E2eParams::default()
                };
                Scenario::E2e(E2eParams {
                    messages: messages.unwrap_or(base.messages),
                    endpoints: endpoints.unwrap_or(base.endpoints),
                    concurrency: concurrency.unwrap_or(base.concurrency),
                    rate: rate.unwrap_or(base.rate),
                    duration: duration.unwrap_or(base.duration),
                })
            }
            ScenarioArgs::Fanout { endpoints, messages } => {
                let base = if smoke {
                    FanoutParams::smoke()
                } else {
                    FanoutParams::default()
                };
                Scenario::Fanout(FanoutParams {
                    endpoints: endpoints.unwrap_or(base.endpoints),
                    messages: messages.unwrap_or(base.messages),
                })
            }
            ScenarioArgs::Hol { rate, duration } => {
                let base = if smoke {
                    HolParams::smoke()
                } else {
                    HolParams::default()
                };
                Scenario::Hol(HolParams {
                    rate: rate.unwrap_or(base.rate),
                    duration: duration.unwrap_or(base.duration),
                })
            }
            ScenarioArgs::Backlog {
                pending,
                concurrency,
                duration,
                rate,
                retry_every,
            } => {
                let base = if smoke {
                    BacklogParams::smoke()
                } else {
                    BacklogParams::default()
                };
                Scenario::Backlog(BacklogParams {
                    pending: pending.unwrap_or(base.pending),
                    concurrency: concurrency.unwrap_or(base.concurrency),
                    duration: duration.unwrap_or(base.duration),
                    rate: rate.unwrap_or(base.rate),
                    retry_every: retry_every.unwrap_or(base.retry_every),
                })
            }
            ScenarioArgs::Inbox { concurrency, duration } => {
                let base = if smoke {
                    InboxParams::smoke()
                } else {
                    InboxParams::default()
                };
                Scenario::Inbox(InboxParams {
                    concurrency: concurrency.unwrap_or(base.concurrency),
                    duration: duration.unwrap_or(base.duration),
                })
            }
            ScenarioArgs::Outbox {
                rows,
                rate,
                duration,
                source,
                producers,
            } => {
                let base = if smoke {
                    OutboxParams::smoke()
                } else {
                    OutboxParams::default()
                };
                Scenario::Outbox(OutboxParams {
                    rows: rows.unwrap_or(base.rows),
                    rate: rate.unwrap_or(base.rate),
                    duration: duration.unwrap_or(base.duration),
                    source,
                    producers: producers.unwrap_or(base.producers).max(1),
                })
            }
            ScenarioArgs::Polling {
                messages,
                limit,
                rate,
                duration,
                wait,
            } => {
                let base = if smoke {
                    PollingParams::smoke()
                } else {
                    PollingParams::default()
                };
                Scenario::Polling(PollingParams {
                    messages: messages.unwrap_or(base.messages),
                    limit: limit.unwrap_or(base.limit),
                    rate: rate.unwrap_or(base.rate),
                    duration: duration.unwrap_or(base.duration),
                    wait: wait.unwrap_or(base.wait),
                })
            }
        }
    }
}

/// Run `herald bench`.
/// Run a scenario; `json` prints the report as JSON instead of a table (`herald --json bench …`).
pub(crate) async fn run(args: BenchArgs, json: bool) -> anyhow::Result<()> {
    if std::env::var_os("RUST_LOG").is_some() {
        let filter = tracing_subscriber::EnvFilter::from_default_env();
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    }
    let urls: Vec<String> = args
        .target
        .into_iter()
        .map(|url| url.trim().to_owned())
        .filter(|url| !url.is_empty())
        .collect();
    let target = match (urls.is_empty(), args.token) {
        (false, Some(token)) => {
            if args.database_url.is_some() || args.endpoint_concurrency.is_some() {
                bail!("--database-url and --endpoint-concurrency apply to the in-process node, not to --target");
            }
            Target::Remote { urls, token }
        }
        (false, None) => bail!("--target needs --token (or HERALD_BENCH_TOKEN)"),
        (true, _) => Target::InProcess {
            database_url: args.database_url,
            endpoint_concurrency: args.endpoint_concurrency,
        },
    };
    let options = Options {
        target,
        receiver_host: args.receiver_host,
        progress: !args.quiet,
        payload_bytes: args.payload_bytes,
    };
    let scenario = args.scenario.scenario(args.smoke);
    let report = herald_bench::run(&options, &scenario).await?;
    let text = if json {
        report.to_json()?
    } else {
        report.table().render()
    };
    // A closed pipe (`| head`) is not an error worth a panic.
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => Err(error.into()),
        _ => Ok(()),
    }
}
