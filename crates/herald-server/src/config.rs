//! Configuration: built-in defaults, then a TOML file (`--config`), then `HERALD_*` environment variables
//! and command-line flags (a flag wins over its variable).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use herald_core::breaker::BreakerConfig;
use herald_core::retry::{RetrySchedule, parse_duration};
use herald_edge::{EdgeConfig, Limits};
use herald_relay::RelaySection;
use herald_signature::HeaderNames;
use herald_store::SecretCipher;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// Every setting of `herald serve`, as read from the file and overrides (strings where humans write them).
/// `Debug` masks passwords and hides secrets (see `redacted_debug`).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to listen on.
    pub listen: String,
    /// `sqlite://PATH` or `postgres://USER@HOST/DB`.
    pub database_url: String,
    /// The admin bearer token; generated, stored and printed once at first start when unset.
    pub admin_token: Option<String>,
    /// Delays between attempts, e.g. `5s,1m,5m,30m,2h,6h,12h,24h`.
    pub retry_schedule: String,
    /// CIDRs that deliveries may reach although they are not public, comma-separated.
    pub allow_private_cidrs: String,
    /// Allow `http://` endpoint URLs (otherwise https only).
    pub allow_http: bool,
    /// Development mode: allows http and loopback destinations.
    pub dev: bool,
    /// Largest accepted message payload in bytes.
    pub max_payload_bytes: usize,
    /// Requests in flight per endpoint.
    pub endpoint_concurrency: u32,
    /// Requests in flight across all endpoints.
    pub max_in_flight: u64,
    /// Consecutive failed attempts that open an endpoint's circuit breaker.
    pub breaker_threshold: u32,
    /// The first cool-down of an open breaker before its probe, e.g. `5s`.
    pub breaker_cooldown: String,
    /// The longest cool-down, however long an endpoint keeps failing, e.g. `10m`.
    pub breaker_max_cooldown: String,
    /// An endpoint whose attempts have all failed for this long is disabled, e.g. `5d`.
    pub disable_after: String,
    /// Time to connect to an endpoint.
    pub connect_timeout: String,
    /// Time for a whole attempt.
    pub request_timeout: String,
    /// The longest attempt timeout an endpoint may set for itself (`requestTimeoutMs`).
    pub max_request_timeout: String,
    /// Ports endpoint URLs may use, comma-separated (e.g. `443,8443`); empty allows any port.
    pub allow_ports: String,
    /// HTTP CONNECT egress proxy for deliveries, `http://[user:password@]host:port`; empty connects directly.
    pub proxy_url: String,
    /// Names of the signature headers on deliveries: `webhook` (Standard Webhooks, the default), `svix`
    /// (`svix-id`, `svix-timestamp`, `svix-signature`, as Svix sends them) or `both`, with the same values.
    pub signature_headers: String,
    /// The key endpoint secrets are encrypted with at rest: base64 of 32 bytes. When unset, one is
    /// generated at first start and kept in a file next to the SQLite database (`<database>.key`); required
    /// with PostgreSQL (every node must use the same key).
    pub secret_key: Option<String>,
    /// PostgreSQL: how long a node's partition leases last without renewal (the fail-over bound).
    pub lease_ttl: String,
    /// PostgreSQL: the longest a request waits for a database connection before it is answered 503
    /// (a message waits for its group commit at most this plus `database_statement_timeout`), e.g. `1s`.
    pub database_timeout: String,
    /// PostgreSQL: every session's `statement_timeout` and `lock_timeout`, and the client-side bound of a
    /// write transaction (plus `database_timeout`), e.g. `5s`.
    pub database_statement_timeout: String,
    /// SQLite: how much of the database file is checked before it is served: `basic` (its header, length
    /// and schema: microseconds), `quick` (`PRAGMA quick_check`: reads the whole file) or `full`
    /// (`PRAGMA integrity_check`); see docs/reliability.md.
    pub sqlite_check: String,
    /// Attempts older than this are deleted by the retention job, e.g. `30d`.
    pub retention: String,
    /// How often the retention job runs, e.g. `1h`.
    pub retention_interval: String,
    /// Where operational events are pushed; empty sends none (they are still recorded).
    pub operational_webhook_url: String,
    /// The `whsec_…` key operational webhooks are signed with (required with the URL).
    pub operational_webhook_secret: Option<String>,
    /// The base URL users reach Herald at (e.g. `https://webhooks.example.com`): portal links are built on
    /// it. Empty: from each request's `Host`, over http.
    pub public_url: String,
    /// Origins allowed to embed the dashboard in an `<iframe>` (tenant portal), comma-separated
    /// `scheme://host[:port]`; empty: none.
    pub dashboard_frame_ancestors: String,
    /// Also run the inbox in this process with this inbox configuration file (`herald serve --inbox`).
    pub inbox: Option<String>,
    /// The store of that inbox (default: see `herald serve --help`).
    pub inbox_database_url: Option<String>,
    /// The inbox's forwarding retry schedule, overriding its file's `retry_schedule`.
    pub inbox_retry_schedule: Option<String>,
    /// A second address serving only `GET /metrics`, without a token (e.g. `127.0.0.1:9040`); empty:
    /// none (`/metrics` on the API port always answers, with the admin token).
    pub metrics_listen: String,
    /// How many endpoints with the oldest pending delivery a scrape lists one by one (besides every
    /// endpoint whose breaker is open); the others are summed.
    pub metrics_top_endpoints: usize,
    /// `text` or `json` (one JSON object per line, with the ids of the enclosing span).
    pub log_format: String,
    /// An OpenTelemetry collector's OTLP/HTTP base URL (e.g. `http://127.0.0.1:4318`) to send traces to;
    /// empty: no traces.
    pub otlp_endpoint: String,
    /// The HTTP edge (see [`EdgeConfig`] and docs/edge.md): time for a request's line and headers.
    pub header_read_timeout: String,
    /// Idle time allowed between requests on a connection.
    pub keep_alive_timeout: String,
    /// Time for a request body to arrive.
    pub request_body_timeout: String,
    /// Time for a client to read a response.
    pub response_write_timeout: String,
    /// Open client connections at most.
    pub max_connections: usize,
    /// Request bodies received at once at most.
    pub max_request_bodies: usize,
    /// Response bytes waiting for clients to read them at most.
    pub max_unread_response_bytes: u64,
    /// Transactional-outbox relays run inside this node (`[[relay]]` sections; see docs/outbox.md): each
    /// publishes a producer's outbox table, by default to this node with the admin token.
    pub relay: Vec<RelaySection>,
}

impl Default for Config {
    fn default() -> Self {
        let edge = EdgeConfig::default();
        Self {
            listen: "127.0.0.1:8040".to_owned(),
            database_url: "sqlite://./herald.db".to_owned(),
            admin_token: None,
            retry_schedule: RetrySchedule::default().to_string(),
            allow_private_cidrs: String::new(),
            allow_http: false,
            dev: false,
            max_payload_bytes: 1024 * 1024,
            endpoint_concurrency: 10,
            max_in_flight: 512,
            breaker_threshold: 5,
            breaker_cooldown: "5s".to_owned(),
            breaker_max_cooldown: "10m".to_owned(),
            disable_after: "5d".to_owned(),
            connect_timeout: "5s".to_owned(),
            request_timeout: "15s".to_owned(),
            max_request_timeout: "60s".to_owned(),
            allow_ports: String::new(),
            proxy_url: String::new(),
            signature_headers: HeaderNames::default().to_string(),
            secret_key: None,
            lease_ttl: "10s".to_owned(),
            database_timeout: "1s".to_owned(),
            database_statement_timeout: "5s".to_owned(),
            sqlite_check: "basic".to_owned(),
            retention: "30d".to_owned(),
            retention_interval: "1h".to_owned(),
            operational_webhook_url: String::new(),
            operational_webhook_secret: None,
            public_url: String::new(),
            dashboard_frame_ancestors: String::new(),
            inbox: None,
            inbox_database_url: None,
            inbox_retry_schedule: None,
            metrics_listen: String::new(),
            metrics_top_endpoints: herald_api::state::DEFAULT_METRICS_TOP_ENDPOINTS,
            log_format: "text".to_owned(),
            otlp_endpoint: String::new(),
            header_read_timeout: edge.header_read_timeout,
            keep_alive_timeout: edge.keep_alive_timeout,
            request_body_timeout: edge.request_body_timeout,
            response_write_timeout: edge.response_write_timeout,
            max_connections: edge.max_connections,
            max_request_bodies: edge.max_request_bodies,
            max_unread_response_bytes: edge.max_unread_response_bytes,
            relay: Vec::new(),
        }
    }
}

/// The loopback ranges `--dev` opens.
const DEV_CIDRS: [&str; 2] = ["127.0.0.0/8", "::1/128"];

/// Settings after parsing and checking. `Debug` masks passwords and hides secrets.
#[derive(Clone)]
pub struct Settings {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Database URL.
    pub database_url: String,
    /// Admin token, if configured.
    pub admin_token: Option<String>,
    /// Retry schedule.
    pub retry_schedule: RetrySchedule,
    /// Allowed private ranges.
    pub allow_private_cidrs: Vec<IpNet>,
    /// Whether http endpoints are allowed.
    pub allow_http: bool,
    /// Development mode.
    pub dev: bool,
    /// Payload limit.
    pub max_payload_bytes: usize,
    /// Per-endpoint concurrency.
    pub endpoint_concurrency: u32,
    /// Global concurrency.
    pub max_in_flight: u64,
    /// Every endpoint's circuit breaker.
    pub breaker: BreakerConfig,
    /// Failing period after which an endpoint is disabled.
    pub disable_after: Duration,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Request timeout.
    pub request_timeout: Duration,
    /// Bound on endpoints' own attempt timeouts.
    pub max_request_timeout: Duration,
    /// Ports endpoint URLs may use; empty allows any.
    pub allow_ports: Vec<u16>,
    /// Egress proxy for deliveries, if any.
    pub proxy_url: Option<String>,
    /// The names of the signature headers on deliveries.
    pub signature_headers: HeaderNames,
    /// Partition lease time (PostgreSQL).
    pub lease_ttl: Duration,
    /// How long PostgreSQL may keep a request waiting (see [`herald_store::custody::DatabaseTimeouts`]).
    pub database_timeouts: herald_store::custody::DatabaseTimeouts,
    /// How much of a SQLite file is checked at start-up.
    pub sqlite_check: herald_store::integrity::SqliteCheck,
    /// Attempts older than this are deleted.
    pub retention: Duration,
    /// How often the retention job runs.
    pub retention_interval: Duration,
    /// The operational webhook (URL and signing secret), if configured.
    pub operational_webhook: Option<OperationalWebhook>,
    /// Where the key encrypting endpoint secrets comes from.
    pub secret_key: SecretKeySource,
    /// The tenant portal: the public URL of its links and who may embed the dashboard.
    pub portal: herald_api::Portal,
    /// The address serving `/metrics` without a token, if any.
    pub metrics_listen: Option<SocketAddr>,
    /// Endpoints with the oldest backlogs listed per scrape.
    pub metrics_top_endpoints: usize,
    /// How logs are written.
    pub log_format: herald_telemetry::LogFormat,
    /// Where traces go, if anywhere.
    pub trace_export: Option<herald_telemetry::TraceExport>,
    /// The inbox to run in this process, if any.
    pub inbox: Option<InboxFile>,
    /// The HTTP edge's timeouts and caps.
    pub edge: Limits,
    /// The `[[relay]]` sections, checked (an empty `herald` or `token` is filled in at start: this node,
    /// the admin token).
    pub relays: Vec<RelaySection>,
}

/// `herald serve --inbox`: the inbox configuration to run beside the sender, as configured.
#[derive(Clone, PartialEq, Eq)]
pub struct InboxFile {
    /// The inbox's TOML file.
    pub path: PathBuf,
    /// Its store, when configured.
    pub database_url: Option<String>,
    /// Its forwarding schedule, when configured.
    pub retry_schedule: Option<String>,
}

/// Where operational events are pushed.
#[derive(Clone)]
pub struct OperationalWebhook {
    /// The receiver's URL (checked against the address policy like any endpoint).
    pub url: String,
    /// The `whsec_…` signing secret.
    pub secret: String,
}

/// Where the key that encrypts endpoint secrets at rest comes from.
#[derive(Clone)]
pub enum SecretKeySource {
    /// Configured (`HERALD_SECRET_KEY`).
    Configured(SecretCipher),
    /// Kept in this file, generated at first start (readable by the owner only).
    File(PathBuf),
    /// A key for this process only: the database is in memory, so nothing outlives the process.
    Ephemeral,
}

impl std::fmt::Debug for SecretKeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Configured(_) => f.write_str("Configured(<redacted>)"),
            Self::File(path) => f.debug_tuple("File").field(path).finish(),
            Self::Ephemeral => f.write_str("Ephemeral"),
        }
    }
}

impl SecretKeySource {
    /// The configured key, else the file next to a SQLite database file, else (in-memory database) a key
    /// for this process. A PostgreSQL database needs the key configured: every node sharing it must
    /// encrypt with the same key, and no node's local file can be where that key lives.
    fn of(configured: Option<&str>, database_url: &str) -> anyhow::Result<Self> {
        if let Some(text) = configured {
            return SecretCipher::from_base64(text)
                .map(Self::Configured)
                .context("secret_key");
        }
        if herald_store::is_postgres_url(database_url) {
            bail!(
                "secret_key (HERALD_SECRET_KEY) is required with a PostgreSQL database: every node must encrypt \
                 endpoint secrets with the same key (generate one with `openssl rand -base64 32`)"
            );
        }
        let path = database_url
            .strip_prefix("sqlite://")
            .or_else(|| database_url.strip_prefix("sqlite:"))
            .unwrap_or(database_url);
        let path = path.split('?').next().unwrap_or(path);
        if path.is_empty() || path == ":memory:" || database_url.contains("mode=memory") {
            return Ok(Self::Ephemeral);
        }
        Ok(Self::File(PathBuf::from(format!("{path}.key"))))
    }
}

impl Config {
    /// Layer the file (if any) and the overrides over the defaults.
    pub fn load(file: Option<&Path>, overrides: &impl Serialize) -> anyhow::Result<Self> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.exists() {
                bail!("configuration file {} does not exist", path.display());
            }
            figment = figment.merge(Toml::file(path));
        }
        figment
            .merge(Serialized::defaults(overrides))
            .extract()
            .map_err(explain)
    }

    /// Parse and check every value.
    pub fn settings(self) -> anyhow::Result<Settings> {
        let listen = self
            .listen
            .parse()
            .with_context(|| format!("listen: {:?} is not an address:port", self.listen))?;
        let retry_schedule = self.retry_schedule.parse().context("retry_schedule")?;
        let mut allow_private_cidrs = parse_cidrs(&self.allow_private_cidrs)?;
        if self.dev {
            allow_private_cidrs.extend(DEV_CIDRS.iter().filter_map(|c| c.parse::<IpNet>().ok()));
        }
        if !self.database_url.starts_with("sqlite:") && !herald_store::is_postgres_url(&self.database_url) {
            bail!(
                "database_url: {:?} is not supported; use sqlite://PATH or postgres://USER@HOST/DATABASE",
                crate::redact(&self.database_url)
            );
        }
        let lease_ttl = parse_duration(&self.lease_ttl).context("lease_ttl")?;
        let database_timeouts = herald_store::custody::DatabaseTimeouts::default()
            .with_settings(Some(&self.database_timeout), Some(&self.database_statement_timeout))
            .map_err(anyhow::Error::msg)?;
        if lease_ttl < Duration::from_secs(1) {
            bail!("lease_ttl must be at least 1s");
        }
        if self.max_payload_bytes == 0
            || self.endpoint_concurrency == 0
            || self.max_in_flight == 0
            || self.breaker_threshold == 0
        {
            bail!("max_payload_bytes, endpoint_concurrency, max_in_flight and breaker_threshold must be at least 1");
        }
        let breaker_cooldown = parse_duration(&self.breaker_cooldown).context("breaker_cooldown")?;
        let breaker_max_cooldown = parse_duration(&self.breaker_max_cooldown).context("breaker_max_cooldown")?;
        if breaker_max_cooldown < breaker_cooldown {
            bail!("breaker_max_cooldown must not be shorter than breaker_cooldown");
        }
        let breaker = BreakerConfig {
            failure_threshold: self.breaker_threshold,
            initial_cooldown: breaker_cooldown,
            max_cooldown: breaker_max_cooldown,
        };
        let secret_key = SecretKeySource::of(
            self.secret_key.as_deref().filter(|k| !k.trim().is_empty()),
            &self.database_url,
        )?;
        let retention = parse_duration(&self.retention).context("retention")?;
        let retention_interval = parse_duration(&self.retention_interval).context("retention_interval")?;
        if retention.is_zero() || retention_interval.is_zero() {
            bail!("retention and retention_interval must be longer than zero");
        }
        let operational_webhook = match (
            self.operational_webhook_url.trim(),
            self.operational_webhook_secret.filter(|s| !s.is_empty()),
        ) {
            ("", None) => None,
            ("", Some(_)) => bail!("operational_webhook_secret is set but operational_webhook_url is not"),
            (_, None) => bail!("operational_webhook_url needs operational_webhook_secret (a whsec_… key) to sign with"),
            (url, Some(secret)) => {
                let key = herald_signature::HmacSecret::parse(&secret)
                    .map_err(|e| anyhow::anyhow!("operational_webhook_secret: {e}"))?;
                // The size endpoints' secrets must have (Standard Webhooks: 24 to 64 random bytes).
                if !(24..=64).contains(&key.len()) {
                    bail!(
                        "operational_webhook_secret: the key must be 24 to 64 bytes, got {}",
                        key.len()
                    );
                }
                Some(OperationalWebhook {
                    url: url.to_owned(),
                    secret,
                })
            }
        };
        let portal = herald_api::Portal {
            public_url: parse_public_url(&self.public_url)?,
            frame_ancestors: parse_origins(&self.dashboard_frame_ancestors)?,
        };
        let inbox = self.inbox.filter(|p| !p.trim().is_empty()).map(|path| InboxFile {
            path: PathBuf::from(path),
            database_url: self.inbox_database_url.filter(|u| !u.is_empty()),
            retry_schedule: self.inbox_retry_schedule.filter(|s| !s.is_empty()),
        });
        let metrics_listen = match self.metrics_listen.trim() {
            "" => None,
            text => Some(
                text.parse()
                    .with_context(|| format!("metrics_listen: {text:?} is not an address:port"))?,
            ),
        };
        let log_format = self.log_format.parse().context("log_format")?;
        let trace_export = match self.otlp_endpoint.trim() {
            "" => None,
            text => {
                let url = url::Url::parse(text)
                    .ok()
                    .filter(|u| matches!(u.scheme(), "http" | "https") && u.has_host())
                    .with_context(|| {
                        format!(
                            "otlp_endpoint: {:?} is not an http(s) URL, e.g. http://127.0.0.1:4318",
                            crate::redact(text)
                        )
                    })?;
                Some(herald_telemetry::TraceExport::new(
                    url.as_str().trim_end_matches('/'),
                    "herald",
                ))
            }
        };
        let edge = EdgeConfig {
            header_read_timeout: self.header_read_timeout,
            keep_alive_timeout: self.keep_alive_timeout,
            request_body_timeout: self.request_body_timeout,
            response_write_timeout: self.response_write_timeout,
            max_connections: self.max_connections,
            max_request_bodies: self.max_request_bodies,
            max_unread_response_bytes: self.max_unread_response_bytes,
        }
        .limits()?;
        for section in &self.relay {
            // Checked now with this node standing in for an empty `herald`/`token`, so that a typo fails
            // the start rather than a relay later.
            section
                .for_node("http://127.0.0.1:8040", Some("-"))
                .check()
                .context("[[relay]]")?;
        }
        Ok(Settings {
            relays: self.relay,
            metrics_listen,
            metrics_top_endpoints: self.metrics_top_endpoints,
            log_format,
            trace_export,
            listen,
            database_url: self.database_url,
            admin_token: self.admin_token.filter(|t| !t.is_empty()),
            retry_schedule,
            allow_private_cidrs,
            allow_http: self.allow_http || self.dev,
            dev: self.dev,
            max_payload_bytes: self.max_payload_bytes,
            endpoint_concurrency: self.endpoint_concurrency,
            max_in_flight: self.max_in_flight,
            breaker,
            disable_after: parse_duration(&self.disable_after).context("disable_after")?,
            connect_timeout: parse_duration(&self.connect_timeout).context("connect_timeout")?,
            request_timeout: parse_duration(&self.request_timeout).context("request_timeout")?,
            max_request_timeout: parse_duration(&self.max_request_timeout).context("max_request_timeout")?,
            allow_ports: parse_ports(&self.allow_ports)?,
            proxy_url: Some(self.proxy_url.trim().to_owned()).filter(|u| !u.is_empty()),
            signature_headers: self.signature_headers.parse().context("signature_headers")?,
            secret_key,
            lease_ttl,
            database_timeouts,
            sqlite_check: self
                .sqlite_check
                .parse()
                .map_err(anyhow::Error::msg)
                .context("sqlite_check")?,
            retention,
            retention_interval,
            operational_webhook,
            portal,
            inbox,
            edge,
        })
    }
}

/// The form each key takes, in words with an example, for errors about a value of the wrong type.
fn expected_form(key: &str) -> String {
    let example = match key {
        "max_payload_bytes"
        | "endpoint_concurrency"
        | "max_in_flight"
        | "breaker_threshold"
        | "metrics_top_endpoints"
        | "max_connections"
        | "max_request_bodies"
        | "max_unread_response_bytes" => {
            return format!("a whole number, e.g. {key} = 10");
        }
        "allow_http" | "dev" => return format!("true or false, e.g. {key} = true"),
        "retry_schedule" | "inbox_retry_schedule" => "\"5s,1m,5m\" (durations in ms, s, m, h or d, comma-separated)",
        "breaker_cooldown"
        | "breaker_max_cooldown"
        | "disable_after"
        | "connect_timeout"
        | "request_timeout"
        | "max_request_timeout"
        | "lease_ttl"
        | "database_timeout"
        | "database_statement_timeout"
        | "retention"
        | "retention_interval"
        | "header_read_timeout"
        | "keep_alive_timeout"
        | "request_body_timeout"
        | "response_write_timeout" => "\"30s\" (a number and a unit: ms, s, m, h or d)",
        "listen" => "\"127.0.0.1:8040\"",
        "sqlite_check" => "\"basic\", \"quick\" or \"full\"",
        "database_url" => "\"sqlite://./herald.db\" or \"postgres://user@host/db\"",
        "allow_private_cidrs" => "\"10.0.0.0/8, 127.0.0.1\"",
        "allow_ports" => "\"443,8443\"",
        "public_url" => "\"https://webhooks.example.com\"",
        "dashboard_frame_ancestors" => "\"https://portal.example.com\"",
        "inbox" => "\"inbox.toml\"",
        "metrics_listen" => "\"127.0.0.1:9040\"",
        "log_format" => "\"json\" (or \"text\")",
        "otlp_endpoint" => "\"http://127.0.0.1:4318\"",
        _ => "\"…\"",
    };
    format!("a string in quotes, e.g. {key} = {example}")
}

/// A configuration error in plain words: which key (and where it was set), what form it takes, and what
/// was found instead.
fn explain(error: figment::Error) -> anyhow::Error {
    use figment::error::Kind;
    let lines: Vec<String> = error
        .into_iter()
        .map(|e| {
            let key = e.path.join(".");
            let from = e
                .metadata
                .as_ref()
                .map(|m| match &m.source {
                    Some(source) => format!(" (in {source})"),
                    None => format!(" (from {})", m.name),
                })
                .unwrap_or_default();
            match &e.kind {
                Kind::UnknownField(field, _) => format!(
                    "{field}{from}: not a setting of herald serve; the keys are the flags of `herald serve --help` in \
                     snake_case, e.g. retry_schedule"
                ),
                Kind::InvalidType(found, _) => {
                    format!("{key}{from}: expected {}, found {found}", expected_form(&key))
                }
                Kind::InvalidValue(found, _) => {
                    format!("{key}{from}: expected {}, found {found}", expected_form(&key))
                }
                other => format!("{key}{from}: {other}"),
            }
        })
        .collect();
    anyhow::anyhow!("invalid configuration: {}", lines.join("; "))
}

/// The public base URL: absolute http(s), nothing after the host but an optional path prefix.
fn parse_public_url(text: &str) -> anyhow::Result<Option<String>> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let form = "an absolute http(s) URL such as https://webhooks.example.com";
    let url = url::Url::parse(text).with_context(|| format!("public_url: {:?} is not {form}", crate::redact(text)))?;
    if !matches!(url.scheme(), "http" | "https")
        || url.host().is_none()
        || url.query().is_some()
        || url.fragment().is_some()
    {
        bail!(
            "public_url: {:?} is not {form} (no query or fragment)",
            crate::redact(text)
        );
    }
    Ok(Some(url.as_str().trim_end_matches('/').to_owned()))
}

/// Origins for `frame-ancestors`: each `scheme://host[:port]`, rewritten in canonical form so nothing else
/// can reach the header.
fn parse_origins(list: &str) -> anyhow::Result<Vec<String>> {
    list.split([',', ' '])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| {
            let form = "an origin such as https://portal.example.com (scheme, host and optional port, no path)";
            let url = url::Url::parse(item)
                .ok()
                .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some() && u.path() == "/")
                .filter(|u| u.query().is_none() && u.fragment().is_none() && u.username().is_empty())
                .with_context(|| format!("dashboard_frame_ancestors: {item:?} is not {form}"))?;
            Ok(url.origin().ascii_serialization())
        })
        .collect()
}

fn parse_cidrs(list: &str) -> anyhow::Result<Vec<IpNet>> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| {
            // A bare address means just that address.
            item.parse::<IpNet>()
                .or_else(|_| item.parse::<std::net::IpAddr>().map(IpNet::from))
                .with_context(|| format!("allow_private_cidrs: {item:?} is not a CIDR"))
        })
        .collect()
}

fn parse_ports(list: &str) -> anyhow::Result<Vec<u16>> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| match item.parse::<u16>() {
            Ok(port) if port > 0 => Ok(port),
            _ => bail!("allow_ports: {item:?} is not a port (1-65535)"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Default)]
    struct Overrides {
        #[serde(skip_serializing_if = "Option::is_none")]
        listen: Option<String>,
    }

    #[test]
    fn defaults_are_the_embedded_setup() {
        let settings = Config::load(None, &Overrides::default()).unwrap().settings().unwrap();
        assert_eq!(settings.listen.to_string(), "127.0.0.1:8040");
        assert_eq!(settings.database_url, "sqlite://./herald.db");
        assert_eq!(settings.retry_schedule.max_attempts(), 9);
        assert!(!settings.allow_http);
        assert!(settings.allow_private_cidrs.is_empty());
        assert!(settings.allow_ports.is_empty());
    }

    #[test]
    fn port_allowlist_is_parsed() {
        let config = Config {
            allow_ports: " 443, 8443 ,".into(),
            ..Config::default()
        };
        assert_eq!(config.settings().unwrap().allow_ports, vec![443, 8443]);
    }

    #[test]
    fn file_then_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("herald.toml");
        std::fs::write(&path, "listen = \"127.0.0.1:9000\"\nretry_schedule = \"1s,2s\"\nallow_private_cidrs = \"10.0.0.0/8, 127.0.0.1\"\n").unwrap();
        let from_file = Config::load(Some(&path), &Overrides::default())
            .unwrap()
            .settings()
            .unwrap();
        assert_eq!(from_file.listen.port(), 9000);
        assert_eq!(from_file.retry_schedule.max_attempts(), 3);
        assert_eq!(from_file.allow_private_cidrs.len(), 2);
        let over = Overrides {
            listen: Some("127.0.0.1:9001".into()),
        };
        assert_eq!(
            Config::load(Some(&path), &over)
                .unwrap()
                .settings()
                .unwrap()
                .listen
                .port(),
            9001
        );
    }

    #[test]
    fn the_edge_settings_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("herald.toml");
        std::fs::write(
            &path,
            "header_read_timeout = \"3s\"\nmax_connections = 77\nmax_request_bodies = 5\n",
        )
        .unwrap();
        let settings = Config::load(Some(&path), &Overrides::default())
            .unwrap()
            .settings()
            .unwrap();
        assert_eq!(settings.edge.header_read_timeout, Duration::from_secs(3));
        assert_eq!(settings.edge.max_connections, 77);
        assert_eq!(settings.edge.max_request_bodies, 5);
        assert_eq!(
            settings.edge,
            Limits {
                header_read_timeout: Duration::from_secs(3),
                max_connections: 77,
                max_request_bodies: 5,
                ..Limits::default()
            }
        );
    }

    #[test]
    fn rejects_bad_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.toml");
        for bad in [
            "listen = \"nowhere\"",
            "retry_schedule = \"5x\"",
            "allow_private_cidrs = \"10.0.0.0/99\"",
            "breaker_threshold = 0",
            "breaker_cooldown = \"1m\"\nbreaker_max_cooldown = \"1s\"",
            "disable_after = \"soon\"",
            "allow_ports = \"443,https\"",
            "allow_ports = \"0\"",
            "allow_ports = \"70000\"",
            "secret_key = \"AAAA\"",
            "secret_key = \"not base64\"",
            "retention = \"0s\"",
            "retention_interval = \"often\"",
            "operational_webhook_url = \"https://ops.example.com/\"",
            "operational_webhook_secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"",
            "operational_webhook_url = \"https://ops.example.com/\"\noperational_webhook_secret = \"nope\"",
            "unknown_key = 1",
            "database_url = \"mysql://db\"",
            "lease_ttl = \"100ms\"",
            "database_timeout = \"0s\"",
            "database_statement_timeout = \"0ms\"",
            "database_timeout = \"fast\"",
            "sqlite_check = \"thorough\"",
            "public_url = \"webhooks.example.com\"",
            "public_url = \"ftp://webhooks.example.com\"",
            "dashboard_frame_ancestors = \"https://a.example/path\"",
            "dashboard_frame_ancestors = \"'unsafe-inline'\"",
            "dashboard_frame_ancestors = \"https://a.example; script-src *\"",
        ] {
            std::fs::write(&path, bad).unwrap();
            let result = Config::load(Some(&path), &Overrides::default()).and_then(Config::settings);
            assert!(result.is_err(), "{bad} accepted");
        }
        assert!(Config::load(Some(Path::new("/nonexistent/herald.toml")), &Overrides::default()).is_err());
    }

    #[test]
    fn the_database_timeouts_are_read_and_default_to_one_and_five_seconds() {
        let defaults = Config::default().settings().unwrap().database_timeouts;
        assert_eq!(defaults, herald_store::custody::DatabaseTimeouts::default());
        assert_eq!(
            (defaults.acquire, defaults.statement),
            (Duration::from_secs(1), Duration::from_secs(5))
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("herald.toml");
        std::fs::write(
            &path,
            "database_timeout = \"250ms\"\ndatabase_statement_timeout = \"2s\"\n",
        )
        .unwrap();
        let settings = Config::load(Some(&path), &Overrides::default())
            .unwrap()
            .settings()
            .unwrap();
        assert_eq!(
            settings.database_timeouts,
            herald_store::custody::DatabaseTimeouts {
                acquire: Duration::from_millis(250),
                statement: Duration::from_secs(2),
            }
        );
    }

    #[test]
    fn every_documented_key_is_read_from_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("herald.toml");
        std::fs::write(
            &path,
            "inbox = \"inbox.toml\"\ninbox_database_url = \"sqlite://./in.db\"\ninbox_retry_schedule = \"1s\"\n\
             public_url = \"https://hooks.example.com/\"\ndashboard_frame_ancestors = \"https://a.example, https://b.example:8443\"\n",
        )
        .unwrap();
        let settings = Config::load(Some(&path), &Overrides::default())
            .unwrap()
            .settings()
            .unwrap();
        let inbox = settings.inbox.expect("inbox");
        assert_eq!(inbox.path, Path::new("inbox.toml"));
        assert_eq!(inbox.database_url.as_deref(), Some("sqlite://./in.db"));
        assert_eq!(inbox.retry_schedule.as_deref(), Some("1s"));
        assert_eq!(settings.portal.public_url.as_deref(), Some("https://hooks.example.com"));
        assert_eq!(
            settings.portal.frame_ancestors,
            ["https://a.example", "https://b.example:8443"]
        );
    }

    #[test]
    fn a_type_error_names_the_key_the_form_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("herald.toml");
        for (text, words) in [
            (
                "max_payload_bytes = \"big\"",
                ["max_payload_bytes", "a whole number", "herald.toml"],
            ),
            ("dev = \"yes\"", ["dev", "true or false", "herald.toml"]),
            ("retention = 30", ["retention", "\"30s\"", "herald.toml"]),
            (
                "retry_shedule = \"1s\"",
                ["retry_shedule", "not a setting", "retry_schedule"],
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            let error = format!("{:#}", Config::load(Some(&path), &Overrides::default()).unwrap_err());
            for word in words {
                assert!(error.contains(word), "{text}: {error:?} lacks {word:?}");
            }
        }
    }

    #[test]
    fn the_secret_key_is_configured_or_kept_next_to_the_database() {
        let settings = Config::default().settings().unwrap();
        assert!(matches!(&settings.secret_key, SecretKeySource::File(p) if p == Path::new("./herald.db.key")));
        let memory = Config {
            database_url: "sqlite::memory:".into(),
            ..Config::default()
        };
        assert!(matches!(
            memory.settings().unwrap().secret_key,
            SecretKeySource::Ephemeral
        ));
        let configured = Config {
            secret_key: Some(SecretCipher::generate_key().to_string()),
            ..Config::default()
        };
        let key = configured.secret_key.clone().unwrap();
        let settings = configured.settings().unwrap();
        assert!(matches!(settings.secret_key, SecretKeySource::Configured(_)));
        assert!(!format!("{settings:?}").contains(&key));
        let postgres = Config {
            database_url: "postgres://postgres@127.0.0.1:5432/herald".into(),
            ..Config::default()
        };
        let error = postgres.settings().unwrap_err();
        assert!(format!("{error:#}").contains("HERALD_SECRET_KEY"), "{error:#}");
    }

    #[test]
    fn postgres_urls_are_accepted() {
        for url in [
            "postgres://postgres@127.0.0.1:5432/herald",
            "postgresql://db.internal/herald",
        ] {
            let config = Config {
                database_url: url.to_owned(),
                secret_key: Some(SecretCipher::generate_key().to_string()),
                ..Config::default()
            };
            let settings = config.settings().unwrap();
            assert_eq!(settings.database_url, url);
            assert_eq!(settings.lease_ttl, Duration::from_secs(10));
        }
    }

    #[test]
    fn dev_mode_opens_loopback_and_http() {
        let config = Config {
            dev: true,
            ..Config::default()
        };
        let settings = config.settings().unwrap();
        assert!(settings.allow_http);
        assert!(
            settings
                .allow_private_cidrs
                .iter()
                .any(|c| c.contains(&"127.0.0.1".parse::<std::net::IpAddr>().unwrap()))
        );
    }
}
