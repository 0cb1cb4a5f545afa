//! `herald`: the webhook delivery system's command.
//!
//! - `herald serve`: the sender-side service (API + delivery engine) on the embedded SQLite store.
//! - `herald inbox`: the receiver-side service (verify → persist → acknowledge → forward).
//! - `herald relay`: publish a producer's transactional outbox table through the API (docs/outbox.md).
//! - `herald listen`: pull an application's new messages and post them, signed, to a local handler.
//! - `herald verify`: check a webhook's Standard Webhooks signature from the command line.
//! - `herald events`, `dead`, `resend`, `recover`, `replay-missing`, `task`: operators' repairs against a
//!   running server (see [`ops`]).
//! - `herald migrate`: create or upgrade the database schema alone.
//!
//! `--json` (any command) makes the output machine-readable: JSON answers and reports, JSON log lines
//! for the services, and errors as `{"error": …}` on standard error.

mod bench;
mod edge;
mod inbox;
mod listen;
mod ops;
mod process;
mod relay;
mod serve;
mod verify;
mod when;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use serde::Serialize;

/// Herald: webhooks that are never lost, never forged, and never let one endpoint hurt another.
// (Not a doc comment: clap would print it in `herald --help`.) The command-line structs of every command
// derive no `Debug` on purpose: they hold tokens, keys and URLs with passwords as given, so nothing can
// print them by accident; the checked settings have a `Debug` that masks them (`herald_server::config`),
// which is what a log may show.
#[derive(Parser)]
#[command(
    name = "herald",
    version,
    about = "Herald, a webhook delivery system: the sender (serve), the receiver (inbox), signature checks \
             (verify), a local listener (listen), benchmarks (bench) and the operators' repairs (events, dead, resend, recover, \
             replay-missing, task).",
    after_help = "Run 'herald <COMMAND> --help' for a command's options. Times are RFC 3339 \
                  (2026-12-01T14:00:00Z), a date (2026-12-01) or a time ago (30m, 1h, 2d)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Machine-readable output: JSON answers and reports, JSON log lines, errors as {"error": …}.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Run the webhook sender: the REST API and the delivery engine.
    // Boxed: the serve options are far larger than the other commands'.
    Serve(Box<ServeArgs>),
    /// Receive webhooks from providers: verify, store, acknowledge, then forward to your handler.
    Inbox(inbox::InboxArgs),
    /// Verify a Standard Webhooks signature over a payload file.
    Verify(verify::VerifyArgs),
    /// Pull an application's new messages and post each, signed as a delivery, to a local URL.
    Listen(listen::ListenArgs),
    /// Publish a producer's transactional outbox (a table in its own database) through Herald's API.
    Relay(Box<relay::RelayArgs>),
    /// Run a benchmark scenario and print its figures (see docs/performance.md).
    Bench(bench::BenchArgs),
    #[command(flatten)]
    Ops(ops::OpsCommand),
    /// Create or upgrade the database schema and exit (herald serve also does it at start).
    Migrate(MigrateArgs),
}

/// Options of `herald migrate`.
#[derive(Args, Serialize)]
struct MigrateArgs {
    /// TOML configuration file (only database_url is used).
    #[arg(long, env = "HERALD_CONFIG")]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Database URL: sqlite://PATH or postgres://USER@HOST/DATABASE [default: sqlite://./herald.db].
    #[arg(long, env = "HERALD_DATABASE_URL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    database_url: Option<String>,
}

/// Options of `herald serve`. Each can also be set in the TOML file given with `--config` (same name,
/// snake_case) or through its environment variable; a flag wins over its variable, which wins over the file.
// The fields' doc comments are their help texts, which clap prints as written: a URL in one stays plain.
#[allow(rustdoc::bare_urls)]
#[derive(Args, Serialize)]
struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, env = "HERALD_CONFIG")]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8040].
    #[arg(long, env = "HERALD_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<String>,
    /// Database URL: sqlite://PATH or postgres://USER@HOST/DATABASE (several nodes may share one
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
    /// HTTP CONNECT egress proxy for deliveries, http://host:port or http://user:password@host:port
    /// [default: none, direct].
    #[arg(long, env = "HERALD_PROXY_URL", hide_env_values = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    proxy_url: Option<String>,
    /// Names of the signature headers on deliveries: webhook (webhook-id/-timestamp/-signature), svix
    /// (svix-id/-timestamp/-signature, as Svix sends them) or both, with the same values [default: webhook].
    #[arg(long, env = "HERALD_SIGNATURE_HEADERS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    signature_headers: Option<String>,
    /// Key that encrypts endpoint secrets at rest: base64 of 32 bytes [default: generated at first start and
    /// kept next to the SQLite database, in its file name plus .key; required with PostgreSQL].
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
    /// The base URL users reach Herald at, e.g. https://webhooks.example.com; portal links
    /// (POST /api/v1/auth/app-portal-access/{app_id}) are built on it [default: each request's Host, over http].
    #[arg(long, env = "HERALD_PUBLIC_URL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    public_url: Option<String>,
    /// Origins whose pages may embed the dashboard in an iframe (tenant portal), comma-separated, e.g.
    /// https://portal.example.com [default: none].
    #[arg(long, env = "HERALD_DASHBOARD_FRAME_ANCESTORS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    dashboard_frame_ancestors: Option<String>,
    /// Also run `herald inbox` in this process, on the same listener, with this inbox configuration.
    #[command(flatten)]
    #[serde(flatten)]
    inbox: inbox::EmbeddedInboxArgs,
    /// The HTTP listener's timeouts and caps.
    #[command(flatten)]
    #[serde(flatten)]
    edge: edge::EdgeArgs,
    /// PostgreSQL: how long a node's partition leases last without renewal; a dead node's deliveries
    /// are taken over within about this long [default: 10s].
    #[arg(long, env = "HERALD_LEASE_TTL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_ttl: Option<String>,
    /// PostgreSQL: the longest a request waits for a database connection before it is answered 503
    /// (store_unavailable); a message waits for its group commit at most this plus the statement
    /// timeout [default: 1s].
    #[arg(long, env = "HERALD_DATABASE_TIMEOUT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    database_timeout: Option<String>,
    /// PostgreSQL: every session's statement_timeout and lock_timeout, and the client-side bound of a
    /// write transaction [default: 5s].
    #[arg(long, env = "HERALD_DATABASE_STATEMENT_TIMEOUT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    database_statement_timeout: Option<String>,
    /// SQLite: how much of the database file is checked before it is served: basic (header, length and
    /// schema: microseconds), quick (PRAGMA quick_check: reads the whole file) or full (PRAGMA
    /// integrity_check) [default: basic].
    #[arg(long, env = "HERALD_SQLITE_CHECK")]
    #[serde(skip_serializing_if = "Option::is_none")]
    sqlite_check: Option<String>,
    /// Also serve GET /metrics, without a token, on this address (e.g. 127.0.0.1:9040) [default: none;
    /// /metrics on the API port always answers, with the admin token].
    #[arg(long, env = "HERALD_METRICS_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics_listen: Option<String>,
    /// Endpoints with the oldest pending delivery that a scrape lists one by one, besides every endpoint
    /// whose breaker is open; the rest are summed [default: 100].
    #[arg(long, env = "HERALD_METRICS_TOP_ENDPOINTS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics_top_endpoints: Option<usize>,
    /// Log lines as text or json (like --json) [default: text].
    #[arg(long, env = "HERALD_LOG_FORMAT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    log_format: Option<String>,
    /// Send traces to this OpenTelemetry collector over OTLP/HTTP, e.g. http://127.0.0.1:4318 (spans go
    /// to /v1/traces) [default: none, no traces].
    #[arg(long, env = "HERALD_OTLP_ENDPOINT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    otlp_endpoint: Option<String>,
}

/// The command line, parsed. No help text ever shows a value taken from the environment: settings such
/// as `HERALD_DATABASE_URL` may hold passwords, and `--help` is often pasted into tickets and chats.
fn parse_command_line() -> Cli {
    fn hide_env_values(command: clap::Command) -> clap::Command {
        command
            .mut_args(|arg| arg.hide_env_values(true))
            .mut_subcommands(hide_env_values)
    }
    let matches = hide_env_values(Cli::command()).get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit())
}

fn main() -> ExitCode {
    let cli = parse_command_line();
    let json = cli.json;
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
                let inbox = inbox::EmbeddedInbox::load(settings.inbox.as_ref(), &settings)?;
                serve::run(settings, inbox, json).await
            }
            Command::Inbox(args) => {
                let settings = args.settings()?;
                inbox::run(settings, json).await
            }
            Command::Verify(args) => verify::run(args, json),
            Command::Listen(args) => listen::run(args, json).await,
            Command::Relay(args) => relay::run(*args, json).await,
            Command::Bench(args) => bench::run(args, json).await,
            Command::Ops(command) => ops::run(command, json).await,
            Command::Migrate(args) => {
                let config = herald_server::Config::load(args.config.as_deref(), &args)?;
                let database = herald_server::redact(&config.database_url);
                herald_store::migrate(&config.database_url)
                    .await
                    .with_context(|| format!("migrating {database}"))?;
                if json {
                    println!("{}", serde_json::json!({ "migrated": database }));
                } else {
                    println!("migrated {database}");
                }
                Ok(())
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if json => {
            eprintln!("{}", serde_json::json!({ "error": format!("{error:#}") }));
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("herald: {error:#}");
            ExitCode::FAILURE
        }
    }
}
