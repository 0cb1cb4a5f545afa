//! Where a scenario runs: an in-process Herald node on a temporary store, or a running server.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use anyhow::Context;
use herald_server::{Config, Node};
use serde::Serialize;

use crate::api::Api;
use crate::calibration::Calibration;
use crate::load::LoadGen;
use crate::local_node::{self, LocalNode};
use crate::progress::Progress;

/// Keep-alive connections the harness keeps to the server.
const CONNECTIONS: usize = 256;

/// Which server a scenario measures. Its `Debug` hides the token and a database password.
#[derive(Clone)]
pub enum Target {
    /// Start a Herald node in this process.
    InProcess {
        /// Store URL; a fresh SQLite file in a temporary directory when `None`.
        database_url: Option<String>,
        /// Per-endpoint concurrency cap of the node; Herald's default when `None`.
        endpoint_concurrency: Option<u32>,
    },
    /// A running server with the Svix-compatible API: one node, or several nodes of one cluster (on one
    /// database) that the load is spread over.
    Remote {
        /// The nodes' base URLs, e.g. `http://127.0.0.1:8040`; never empty. Applications, endpoints and
        /// every read go through the first; messages go round-robin to all.
        urls: Vec<String>,
        /// An admin bearer token (the same on every node).
        token: String,
    },
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::InProcess {
                database_url,
                endpoint_concurrency,
            } => f
                .debug_struct("InProcess")
                .field("database_url", &database_url.as_deref().map(herald_core::redact::url))
                .field("endpoint_concurrency", endpoint_concurrency)
                .finish(),
            Self::Remote { urls, token: _ } => {
                let urls: Vec<String> = urls.iter().map(|url| herald_core::redact::url(url)).collect();
                f.debug_struct("Remote")
                    .field("urls", &urls)
                    .field("token", &"<redacted>")
                    .finish()
            }
        }
    }
}

/// Options shared by every scenario.
#[derive(Debug, Clone)]
pub struct Options {
    /// The server to measure.
    pub target: Target,
    /// The address the receivers listen on (and that endpoints point to).
    pub receiver_host: IpAddr,
    /// Show progress on standard error (only when it is a terminal).
    pub progress: bool,
    /// Approximate size of each message payload in bytes.
    pub payload_bytes: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            target: Target::InProcess {
                database_url: None,
                endpoint_concurrency: None,
            },
            receiver_host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            progress: true,
            payload_bytes: 256,
        }
    }
}

/// Node settings a scenario needs changed from Herald's defaults (applied to in-process nodes only; a
/// remote server keeps its own).
#[derive(Debug, Clone, Default)]
pub struct NodeTweaks {
    /// Time allowed for a whole delivery attempt.
    pub request_timeout: Option<Duration>,
    /// The retry schedule, e.g. `30s,30s`.
    pub retry_schedule: Option<String>,
    /// The longest circuit-breaker cool-down (the first is capped by it too).
    pub breaker_max_cooldown: Option<Duration>,
}

/// How the measured server was set up, for the report.
#[derive(Debug, Clone, Serialize)]
pub struct Setup {
    /// `in-process` or the remote URL.
    pub server: String,
    /// The store, when known.
    pub database: String,
    /// What is durable when the server answers 202.
    pub durability: String,
    /// Node settings that differ from Herald's defaults.
    pub settings: Vec<String>,
    /// The machine the harness ran on.
    pub machine: Machine,
    /// With `--target`, the nodes' processes on this machine whose CPU is reported as the node's (empty
    /// when not every node was found, or in-process).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub local_nodes: Vec<LocalNode>,
}

/// The machine the harness ran on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// CPU model from `/proc/cpuinfo`.
    pub cpu: String,
    /// Cores available to the process.
    pub cores: usize,
    /// Total memory in GiB.
    pub memory_gib: f64,
    /// Whether this is a release build of the harness (and of the in-process node).
    pub release_build: bool,
    /// Its speed at signing and at synced writes, measured before the scenario (see [`Calibration`]).
    pub calibration: Calibration,
}

impl Machine {
    pub(crate) fn detect() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|rest| rest.split_once(':'))
            .map_or_else(|| "unknown".to_owned(), |(_, name)| name.trim().to_owned());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_kib: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0.0);
        Self {
            cpu,
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            memory_gib: (memory_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            release_build: !cfg!(debug_assertions),
            calibration: Calibration::measure(),
        }
    }
}

/// A running scenario environment: the API client, the load generator, and the node if in-process.
pub struct Env {
    /// The server's API (the first node's, with several).
    pub api: Api,
    /// The load generator.
    pub load: LoadGen,
    /// Progress bars.
    pub progress: Progress,
    /// Where receivers listen.
    pub receiver_host: IpAddr,
    /// How the server was set up.
    pub setup: Setup,
    /// The server's base URL (the first node's; e.g. for a relay that publishes to it).
    pub url: String,
    /// Its admin token.
    pub token: String,
    /// The in-process node's store URL (`None` for a remote server).
    pub database_url: Option<String>,
    node: Option<InProcessNode>,
}

/// A node on its own runtime (so its CPU time can be told apart) and its temporary directory. On drop
/// the node's API stops, then its runtime (engine, store), then the directory is removed.
struct InProcessNode {
    node: Option<Node>,
    runtime: Option<tokio::runtime::Runtime>,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for InProcessNode {
    fn drop(&mut self) {
        // Dropping the node stops its API; shutting the runtime down stops the engine and the store.
        self.node.take();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Env {
    /// Start the environment for one scenario.
    pub async fn start(options: &Options, tweaks: &NodeTweaks) -> anyhow::Result<Self> {
        let progress = Progress::new(options.progress);
        let mut others = Vec::new();
        let (url, token, node, setup, database_url) = match &options.target {
            Target::InProcess {
                database_url,
                endpoint_concurrency,
            } => start_node(database_url.as_deref(), *endpoint_concurrency, tweaks).await?,
            Target::Remote { urls, token } => {
                let Some((url, rest)) = urls.split_first() else {
                    anyhow::bail!("no server URL to measure");
                };
                others = rest.to_vec();
                let server = if rest.is_empty() {
                    url.clone()
                } else {
                    format!(
                        "{} nodes, messages round-robin: {} (setup through the first)",
                        urls.len(),
                        urls.join(", ")
                    )
                };
                let local_nodes = watch_local_nodes(urls);
                let cpu = match local_nodes.as_slice() {
                    [] if urls.iter().all(|url| !local_node::is_loopback(url)) => {
                        "the node's CPU: not measured (the server runs elsewhere)".to_owned()
                    }
                    [] => "the node's CPU: not measured (not every node was found as a herald process alone on its \
                           loopback port)"
                        .to_owned(),
                    nodes => {
                        let named: Vec<String> = nodes
                            .iter()
                            .map(|node| format!("{} ({})", node.pid, node.command))
                            .collect();
                        format!("the node's CPU: process {} on this machine", named.join(", "))
                    }
                };
                let setup = Setup {
                    server,
                    database: "as configured on the server".to_owned(),
                    durability: "as configured on the server".to_owned(),
                    settings: vec!["the server's own settings".to_owned(), cpu],
                    machine: Machine::detect(),
                    local_nodes,
                };
                (url.clone(), token.clone(), None, setup, None)
            }
        };
        let api = Api::new(&url, &token, CONNECTIONS)?;
        api.check().await.context("the server is not usable")?;
        let mut other_apis = Vec::with_capacity(others.len());
        for other in &others {
            let other_api = Api::new(other, &token, CONNECTIONS)?;
            other_api
                .check()
                .await
                .with_context(|| format!("the node at {other} is not usable"))?;
            other_apis.push(other_api);
        }
        Ok(Self {
            load: LoadGen::new(api.clone(), other_apis, options.payload_bytes),
            api,
            progress,
            receiver_host: options.receiver_host,
            setup,
            url,
            token,
            database_url,
            node,
        })
    }

    /// True when the node runs in this process (so its memory is this process's).
    pub fn in_process(&self) -> bool {
        self.node.is_some()
    }
}

async fn start_node(
    database_url: Option<&str>,
    endpoint_concurrency: Option<u32>,
    tweaks: &NodeTweaks,
) -> anyhow::Result<(String, String, Option<InProcessNode>, Setup, Option<String>)> {
    // Before the node starts, so that its work does not move the machine's figures.
    let machine = Machine::detect();
    // In-process: no `--target` node's CPU is the node's (a library caller may have run one before).
    crate::cpu::watch(Vec::new());
    let (dir, database_url) = match database_url {
        Some(url) => (None, url.to_owned()),
        None => {
            let dir = tempfile::tempdir().context("creating a temporary directory")?;
            let url = format!("sqlite://{}", dir.path().join("herald-bench.db").display());
            (Some(dir), url)
        }
    };
    let token = format!("herald_bench_{}", hex::encode(rand::random::<[u8; 16]>()));
    let defaults = Config::default();
    let mut settings_note = vec![
        "allow_private_cidrs = 127.0.0.0/8 (the harness's receivers)".to_owned(),
        "allow_http = true".to_owned(),
    ];
    let mut config = Config {
        listen: "127.0.0.1:0".to_owned(),
        database_url: database_url.clone(),
        admin_token: Some(token.clone()),
        allow_private_cidrs: "127.0.0.0/8".to_owned(),
        allow_http: true,
        ..defaults.clone()
    };
    // The key that encrypts endpoint secrets: `HERALD_SECRET_KEY` if set; SQLite keeps a generated one next
    // to the database; PostgreSQL needs one configured, so a run on it without the variable uses a key of
    // its own (a database reused by a later run then needs that run to set HERALD_SECRET_KEY).
    config.secret_key = std::env::var("HERALD_SECRET_KEY").ok().filter(|k| !k.trim().is_empty());
    if config.secret_key.is_none() && herald_store::is_postgres_url(&database_url) {
        config.secret_key = Some(herald_store::SecretCipher::generate_key().to_string());
        settings_note.push("secret_key = a key generated for this run (HERALD_SECRET_KEY unset)".to_owned());
    }
    if let Some(timeout) = tweaks.request_timeout {
        config.request_timeout = config_duration(timeout);
        settings_note.push(format!("request_timeout = {}", config.request_timeout));
    }
    if let Some(schedule) = &tweaks.retry_schedule {
        config.retry_schedule = schedule.clone();
        settings_note.push(format!("retry_schedule = {}", summarize_schedule(schedule)));
    }
    if let Some(max) = tweaks.breaker_max_cooldown {
        config.breaker_max_cooldown = config_duration(max);
        // Herald's default first cool-down is 5 s; it may not exceed the maximum.
        let first = Duration::from_secs(5).min(max);
        config.breaker_cooldown = config_duration(first);
        settings_note.push(format!("breaker_max_cooldown = {}", config.breaker_max_cooldown));
    }
    if let Some(cap) = endpoint_concurrency {
        config.endpoint_concurrency = cap;
        settings_note.push(format!("endpoint_concurrency = {cap}"));
    }
    let settings = config.settings().context("in-process node settings")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .thread_name("herald-node")
        .enable_all()
        .build()
        .context("starting the node's runtime")?;
    let node = runtime
        .spawn(async move { Node::start(&settings).await })
        .await
        .context("the node's start-up task failed")?
        .context("starting the in-process node")?;
    let url = format!("http://{}", node.addr);
    let setup = Setup {
        server: "in-process".to_owned(),
        database: if dir.is_some() {
            "SQLite, fresh file in a temporary directory".to_owned()
        } else {
            herald_server::redact(&database_url)
        },
        durability: if herald_store::is_postgres_url(&database_url) {
            "PostgreSQL, as configured on the server (synchronous_commit as set there): a 202 is sent \
             only after the message and its deliveries are committed (group commit: one transaction \
             per batch of up to 512 messages)"
                .to_owned()
        } else {
            "SQLite WAL, synchronous=FULL: a 202 is sent only after the message and its deliveries \
             are committed and fsynced (group commit: one transaction and one fsync per batch of up \
             to 512 messages)"
                .to_owned()
        },
        settings: settings_note,
        machine,
        local_nodes: Vec::new(),
    };
    let node = InProcessNode {
        node: Some(node),
        runtime: Some(runtime),
        _dir: dir,
    };
    Ok((url, token, Some(node), setup, Some(database_url)))
}

/// A duration as Herald's configuration writes it: `5s`, or `1500ms` when not whole seconds.
pub(crate) fn config_duration(duration: Duration) -> String {
    let ms = duration.as_millis().max(1);
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// `30s,30s,…` (50 times) → `30s × 50`.
fn summarize_schedule(schedule: &str) -> String {
    let items: Vec<&str> = schedule.split(',').map(str::trim).collect();
    match items.first() {
        Some(first) if items.len() > 1 && items.iter().all(|i| i == first) => {
            format!("{first} × {}", items.len())
        }
        _ => schedule.to_owned(),
    }
}

/// The processes of `urls`' nodes on this machine, watched for their CPU (see [`crate::cpu::watch`]),
/// when every node is found alone on its port and no two are one process; otherwise none.
fn watch_local_nodes(urls: &[String]) -> Vec<LocalNode> {
    let found: Option<Vec<LocalNode>> = local_node::find(urls).into_iter().collect();
    let nodes = found
        .filter(|nodes| {
            let pids: std::collections::BTreeSet<u32> = nodes.iter().map(|node| node.pid).collect();
            pids.len() == nodes.len()
        })
        .unwrap_or_default();
    crate::cpu::watch(nodes.clone());
    nodes
}

#[cfg(test)]
mod debug_tests {
    use super::*;

    #[test]
    fn a_targets_debug_shows_no_token_and_no_password() {
        let targets = [
            Target::InProcess {
                database_url: Some("postgres://bench:Hunter2pw@db/bench".to_owned()),
                endpoint_concurrency: None,
            },
            Target::Remote {
                urls: vec!["http://admin:Hunter2pw@127.0.0.1:8040".to_owned()],
                token: "TokenValue9".to_owned(),
            },
        ];
        for target in targets {
            let shown = format!("{target:?} {target:#?}");
            assert!(
                !shown.contains("Hunter2pw") && !shown.contains("TokenValue9"),
                "{shown}"
            );
        }
    }
}
