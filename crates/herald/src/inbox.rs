//! `herald inbox`: receive webhooks from providers (verify → persist → acknowledge), forward them to the
//! operator's handlers. Also the `--inbox` option of `herald serve`, which runs the same inbox inside the
//! serve process.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use herald_inbox::{Inbox, InboxConfig};

use crate::edge::EdgeArgs;

/// Options of `herald inbox`.
#[derive(Args)]
pub(crate) struct InboxArgs {
    /// The inbox configuration: a TOML file with a source table for each webhook source (see docs/inbox.md).
    #[arg(long, env = "HERALD_INBOX_CONFIG")]
    config: PathBuf,
    /// Address to listen on.
    #[arg(long, env = "HERALD_LISTEN", default_value = herald_inbox::DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// Database URL: sqlite://PATH or postgres://USER@HOST/DATABASE (it may be the sender's database:
    /// the inbox's tables and migration history are its own).
    #[arg(long, env = "HERALD_DATABASE_URL", default_value = herald_inbox::DEFAULT_DATABASE_URL)]
    database_url: String,
    /// Admin bearer token for /api/v1/inbox/…; without one the admin API is disabled.
    #[arg(long, env = "HERALD_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Delays between forwarding attempts (ms, s, m, h, d); overrides the file's retry_schedule
    /// [default: 5s,1m,5m,30m,2h,6h,12h,1d].
    #[arg(long, env = "HERALD_INBOX_RETRY_SCHEDULE")]
    retry_schedule: Option<String>,
    /// Log lines as text or json (like --json).
    #[arg(long, env = "HERALD_LOG_FORMAT", default_value = "text")]
    log_format: herald_telemetry::LogFormat,
    /// The HTTP listener's timeouts and caps.
    #[command(flatten)]
    edge: EdgeArgs,
    /// The store's database settings; override the file's keys of the same names.
    #[command(flatten)]
    database: DatabaseArgs,
}

/// `herald inbox`'s database settings, named as `herald serve`'s.
#[derive(Args)]
struct DatabaseArgs {
    /// PostgreSQL: the longest a provider's request waits for a database connection before it is
    /// answered 503 (store_unavailable); overrides the file's database_timeout [default: 1s].
    #[arg(long, env = "HERALD_DATABASE_TIMEOUT")]
    database_timeout: Option<String>,
    /// PostgreSQL: every session's statement_timeout and lock_timeout; every store call is given up
    /// after this plus the database timeout; overrides the file's database_statement_timeout
    /// [default: 5s].
    #[arg(long, env = "HERALD_DATABASE_STATEMENT_TIMEOUT")]
    database_statement_timeout: Option<String>,
    /// SQLite: how much of the database file is checked before it is served: basic, quick or full (see
    /// 'herald serve --help'); overrides the file's sqlite_check [default: basic].
    #[arg(long, env = "HERALD_SQLITE_CHECK")]
    sqlite_check: Option<String>,
}

impl DatabaseArgs {
    /// The file's settings with these overrides.
    fn apply(&self, file: herald_inbox::DatabaseOptions) -> anyhow::Result<herald_inbox::DatabaseOptions> {
        Ok(herald_inbox::DatabaseOptions {
            timeouts: file
                .timeouts
                .with_settings(
                    self.database_timeout.as_deref(),
                    self.database_statement_timeout.as_deref(),
                )
                .map_err(anyhow::Error::msg)?,
            sqlite_check: match &self.sqlite_check {
                Some(text) => text.parse().map_err(anyhow::Error::msg).context("sqlite_check")?,
                None => file.sqlite_check,
            },
        })
    }
}

/// `herald inbox`'s settings, checked.
pub(crate) struct InboxSettings {
    log_format: herald_telemetry::LogFormat,
    config: InboxConfig,
    listen: SocketAddr,
    database_url: String,
    admin_token: Option<String>,
    edge: herald_edge::Limits,
}

impl InboxArgs {
    /// Load the configuration file and apply the overrides.
    pub(crate) fn settings(self) -> anyhow::Result<InboxSettings> {
        let mut config = load(&self.config, self.retry_schedule.as_deref())?;
        config.database = self.database.apply(config.database)?;
        Ok(InboxSettings {
            log_format: self.log_format,
            config,
            listen: self.listen,
            database_url: self.database_url,
            admin_token: self.admin_token.filter(|t| !t.is_empty()),
            edge: self.edge.limits()?,
        })
    }
}

fn load(path: &std::path::Path, retry_schedule: Option<&str>) -> anyhow::Result<InboxConfig> {
    let mut config = InboxConfig::load(path).with_context(|| format!("inbox configuration {}", path.display()))?;
    if let Some(schedule) = retry_schedule {
        config.retry_schedule = schedule.parse().context("HERALD_INBOX_RETRY_SCHEDULE")?;
    }
    Ok(config)
}

/// Run `herald inbox` until SIGINT or SIGTERM.
pub(crate) async fn run(settings: InboxSettings, json: bool) -> anyhow::Result<()> {
    let format = if json {
        herald_telemetry::LogFormat::Json
    } else {
        settings.log_format
    };
    let _logs = crate::process::init_logs(format)?;
    herald_telemetry::registry::install();
    let admin = settings.admin_token.as_deref().map(herald_inbox::token_digest);
    if admin.is_none() {
        tracing::warn!("HERALD_ADMIN_TOKEN is not set: the inbox admin API (/api/v1/inbox/…) is disabled");
    }
    // The forwarder's outbound connections need descriptors too: keep them out of the connection cap's reach.
    let edge =
        herald_edge::Edge::new(settings.edge).reserve_fds(settings.config.forward_concurrency.saturating_add(64));
    let inbox = Inbox::start(settings.config, &settings.database_url)
        .await
        .with_context(|| {
            format!(
                "starting the inbox on {}",
                herald_server::redact(&settings.database_url)
            )
        })?;
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("listening on {}", settings.listen))?;
    let addr = listener.local_addr()?;
    // Redacted: a PostgreSQL URL may carry a password.
    let database = herald_server::redact(&settings.database_url);
    tracing::info!(address = %addr, %database, "herald inbox is serving");
    println!("herald inbox listening on http://{addr}");
    let served = edge
        .serve(listener, inbox.service(admin), crate::process::shutdown_signal())
        .await
        .context("serving");
    inbox.shutdown().await;
    served
}

/// `herald serve`'s options for running the inbox in the same process; they are keys of the serve
/// configuration file too (`inbox`, `inbox_database_url`, `inbox_retry_schedule`).
#[derive(Args, Default, serde::Serialize)]
pub(crate) struct EmbeddedInboxArgs {
    /// Also run the inbox (see herald inbox) with this configuration, on the same listener and admin
    /// token as the API.
    #[arg(long, env = "HERALD_SERVE_INBOX")]
    #[serde(skip_serializing_if = "Option::is_none")]
    inbox: Option<PathBuf>,
    /// The inbox's store when run with --inbox [default: the sender's database when it is PostgreSQL;
    /// with SQLite its own file, sqlite://./herald-inbox.db, because SQLite allows one writer per file and
    /// the inbox's commits should not queue behind the sender's].
    #[arg(long, env = "HERALD_INBOX_DATABASE_URL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    inbox_database_url: Option<String>,
    /// Delays between the inbox's forwarding attempts; overrides the file's retry_schedule.
    #[arg(long, env = "HERALD_INBOX_RETRY_SCHEDULE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    inbox_retry_schedule: Option<String>,
}

/// The inbox to run inside `herald serve`.
pub(crate) struct EmbeddedInbox {
    config: InboxConfig,
    database_url: String,
}

impl EmbeddedInbox {
    /// The inbox to run, if one is configured (`--inbox`, `HERALD_SERVE_INBOX` or the file's `inbox`),
    /// next to a sender on `sender_database_url`.
    pub(crate) fn load(
        file: Option<&herald_server::InboxFile>,
        sender: &herald_server::Settings,
    ) -> anyhow::Result<Option<EmbeddedInbox>> {
        let sender_database_url = sender.database_url.as_str();
        let Some(file) = file else {
            return Ok(None);
        };
        let database_url = match &file.database_url {
            Some(url) => url.clone(),
            // PostgreSQL takes many writers, and every node of a cluster reaches the database: the inbox
            // lives beside the sender's tables (see docs/inbox.md, "Configuration").
            None if herald_store::is_postgres_url(sender_database_url) => sender_database_url.to_owned(),
            None => herald_inbox::DEFAULT_DATABASE_URL.to_owned(),
        };
        let mut config = load(&file.path, file.retry_schedule.as_deref())?;
        // One process, one set of database settings: the sender's (`herald serve`'s options and file).
        config.database = herald_inbox::DatabaseOptions {
            timeouts: sender.database_timeouts,
            sqlite_check: sender.sqlite_check,
        };
        Ok(Some(EmbeddedInbox { config, database_url }))
    }

    /// Open its store and start its forwarder.
    pub(crate) async fn start(self) -> anyhow::Result<Inbox> {
        Inbox::start(self.config, &self.database_url)
            .await
            .with_context(|| format!("starting the inbox on {}", herald_server::redact(&self.database_url)))
    }
}
