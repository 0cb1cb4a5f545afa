//! `herald`: the webhook delivery system's command.
//!
//! - `herald serve`: the sender-side service (API + delivery engine) on the embedded SQLite store.
//! - `herald inbox`: the receiver-side service (verify → persist → acknowledge → forward).
//! - `herald verify`: check a webhook's Standard Webhooks signature from the command line.
//! - `herald events`, `dead`, `resend`, `recover`, `replay-missing`, `task`: operators' repairs against a
//!   running server (see [`ops`]).
//! - `herald migrate`: create or upgrade the database schema alone.

mod bench;
mod inbox;
mod ops;
mod serve;
mod verify;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use serde::Serialize;

/// Herald: webhooks that are never lost, never forged, and never let one endpoint hurt another.
#[derive(Debug, Parser)]
#[command(name = "herald", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the webhook sender: the REST API and the delivery engine.
    // Boxed: the serve options are far larger than the other commands'.
    Serve(Box<ServeArgs>),
    /// Receive webhooks from providers: verify, store, acknowledge, then forward to your handler.
    Inbox(inbox::InboxArgs),
    /// Verify a Standard Webhooks signature over a payload file.
    Verify(verify::VerifyArgs),
    /// Run a benchmark scenario and print its figures (see docs/performance.md).
    Bench(bench::BenchArgs),
    #[command(flatten)]
    Ops(ops::OpsCommand),
    /// Create or upgrade the database schema and exit (`herald serve` also does it at start).
    Migrate(MigrateArgs),
}

/// Options of `herald migrate`.
#[derive(Debug, Args, Serialize)]
struct MigrateArgs {
    /// TOML configuration file (only `database_url` is used).
    #[arg(long, env = "HERALD_CONFIG")]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Database URL: `sqlite://PATH` or `postgres://USER@HOST/DATABASE` [default: sqlite://./herald.db].
    #[arg(long, env = "HERALD_DATABASE_URL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    database_url: Option<String>,
}

/// Options of `herald serve`. Each can also be set in the TOML file given with `--config` (same name,
/// snake_case) or through its environment variable; a flag wins over its variable, which wins over the file.
#[derive(Debug, Args, Serialize)]
struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, env = "HERALD_CONFIG")]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8040].
    #[arg(long, env = "HERALD_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<String>,
    /// Database URL: `sqlite://PATH` or `postgres://USER@HOST/DATABASE` (several nodes may share one
    /// PostgreSQL database) [default: sqlite://./herald.db].
    #[arg(long, env = "HERALD_DATABASE_URL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    database_url: Option<String>,
    /// Admin bearer token. When unset, one is generated at first start, stored (hashed) and printed once.
    #[arg(long, env = "HERALD_ADMIN_TOKEN", hide_env_values = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    admin_token: Option<String>,
    /// Delays between attempts, comma-separated (ms, s, m, h, d) [default: 5s,1m,5m,30m,2h,6h,12h,1d].
    #[arg(long, env = "HERALD_RETRY_SCHEDULE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_schedule: Option<String>,
    /// CIDRs that deliveries may reach although they are not public (e.g. 127.0.0.0/8), comma-separated.
    #[arg(long, env = "HERALD_ALLOW_PRIVATE_CIDRS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    allow_private_cidrs: Option<String>,
    /// Allow plain http endpoint URLs (otherwise https only).
    #[arg(long, env = "HERALD_ALLOW_HTTP")]
    #[serde(skip_serializing_if = "Option::is_none")]
    allow_http: Option<bool>,
    /// Development mode: allow http and loopback destinations. Never in production.
    #[arg(long, env = "HERALD_DEV", num_args = 0..=1, default_missing_value = "true")]
    #[serde(skip_serializing_if = "Option::is_none")]
    dev: Option<bool>,
    /// Largest message payload in bytes; larger ones get 413 [default: 1048576].
    #[arg(long, env = "HERALD_MAX_PAYLOAD_BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_payload_bytes: Option<usize>,
    /// Requests in flight per endpoint [default: 10].
    #[arg(long, env = "HERALD_ENDPOINT_CONCURRENCY")]
    #[serde(skip_serializing_if = "Option::is_none")]
    endpoint_concurrency: Option<u32>,
    /// Requests in flight across all endpoints [default: 512].
    #[arg(long, env = "HERALD_MAX_IN_FLIGHT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_in_flight: Option<u64>,
    /// Consecutive failed attempts that open an endpoint's circuit breaker [default: 5].
    #[arg(long, env = "HERALD_BREAKER_THRESHOLD")]
    #[serde(skip_serializing_if = "Option::is_none")]
    breaker_threshold: Option<u32>,
    /// First cool-down of an open breaker before it probes [default: 5s].
    #[arg(long, env = "HERALD_BREAKER_COOLDOWN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    breaker_cooldown: Option<String>,
    /// Longest breaker cool-down (it doubles while the endpoint keeps failing) [default: 10m].
    #[arg(long, env = "HERALD_BREAKER_MAX_COOLDOWN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    breaker_max_cooldown: Option<String>,
    /// Disable an endpoint whose attempts have all failed for this long [default: 5d].
    #[arg(long, env = "HERALD_DISABLE_AFTER")]
    #[serde(skip_serializing_if = "Option::is_none")]
    disable_after: Option<String>,
    /// Time allowed to connect to an endpoint [default: 5s].
    #[arg(long, env = "HERALD_CONNECT_TIMEOUT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    connect_timeout: Option<String>,
    /// Time allowed for a whole attempt [default: 15s].
    #[arg(long, env = "HERALD_REQUEST_TIMEOUT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    request_timeout: Option<String>,
    /// The longest attempt timeout an endpoint may set for itself (requestTimeoutMs) [default: 60s].
    #[arg(long, env = "HERALD_MAX_REQUEST_TIMEOUT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_request_timeout: Option<String>,
    /// Ports endpoint URLs may use, comma-separated (e.g. 443,8443) [default: any].
    #[arg(long, env = "HERALD_ALLOW_PORTS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    allow_ports: Option<String>,
    /// HTTP CONNECT egress proxy for deliveries, http://[user:password@]host:port [default: none, direct].
    #[arg(long, env = "HERALD_PROXY_URL", hide_env_values = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    proxy_url: Option<String>,
    /// Key that encrypts endpoint secrets at rest: base64 of 32 bytes [default: generated at first start and
    /// kept next to the SQLite database, in <database file>.key; required with PostgreSQL].
    #[arg(long, env = "HERALD_SECRET_KEY", hide_env_values = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    secret_key: Option<String>,
    /// Delete delivery attempts older than this; on PostgreSQL whole days are dropped [default: 30d].
    #[arg(long, env = "HERALD_RETENTION")]
    #[serde(skip_serializing_if = "Option::is_none")]
    retention: Option<String>,
    /// How often the retention job runs [default: 1h].
    #[arg(long, env = "HERALD_RETENTION_INTERVAL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    retention_interval: Option<String>,
    /// URL that operational events (endpoint.disabled, message.attempt.exhausted, …) are pushed to.
    #[arg(long, env = "HERALD_OPERATIONAL_WEBHOOK_URL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    operational_webhook_url: Option<String>,
    /// The whsec_… key operational webhooks are signed with (required with the URL).
    #[arg(long, env = "HERALD_OPERATIONAL_WEBHOOK_SECRET", hide_env_values = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    operational_webhook_secret: Option<String>,
    /// Also run `herald inbox` in this process, on the same listener, with this inbox configuration.
    #[command(flatten)]
    #[serde(skip)]
    inbox: inbox::EmbeddedInboxArgs,
    /// PostgreSQL: how long a node's partition leases last without renewal; a dead node's deliveries
    /// are taken over within about this long [default: 10s].
    #[arg(long, env = "HERALD_LEASE_TTL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_ttl: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("herald: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => {
                let config = herald_server::Config::load(args.config.as_deref(), &*args)?;
                let settings = config.settings()?;
                let inbox = args.inbox.load(&settings.database_url)?;
                serve::run(settings, inbox).await
            }
            Command::Inbox(args) => {
                let settings = args.settings()?;
                inbox::run(settings).await
            }
            Command::Verify(args) => verify::run(args),
            Command::Bench(args) => bench::run(args).await,
            Command::Ops(command) => ops::run(command).await,
            Command::Migrate(args) => {
                let config = herald_server::Config::load(args.config.as_deref(), &args)?;
                herald_store::migrate(&config.database_url)
                    .await
                    .with_context(|| format!("migrating {}", herald_server::redact(&config.database_url)))?;
                println!("migrated {}", herald_server::redact(&config.database_url));
                Ok(())
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("herald: {error:#}");
            ExitCode::FAILURE
        }
    }
}
