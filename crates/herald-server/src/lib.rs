//! A running Herald node, assembled from its parts: the store, the delivery engine and the API.
//!
//! [`Node::start`] is what `herald serve` runs; the benchmark harness and tests start nodes in-process
//! with it too. [`config`] reads the settings from defaults, a TOML file, the environment and flags.

pub mod config;
mod redacted_debug;
pub mod retention;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use base64::Engine as _;
use herald_api::auth::token_digest;
use herald_api::{AppState, Limits};
use herald_core::address::AddressPolicy;
use herald_delivery::{ClientConfig, DeliveryClient, Engine, EngineConfig, HostResolver, SystemResolver};
use herald_store::{SecretCipher, SharedStore};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use config::{Config, InboxFile, SecretKeySource, Settings};

/// The store key holding the generated admin token's digest.
const ADMIN_TOKEN_KEY: &str = "admin_token_sha256";

/// A node that is serving.
pub struct Node {
    /// The address the API listens on.
    pub addr: SocketAddr,
    /// The address serving `/metrics` without a token, when `metrics_listen` is set.
    pub metrics_addr: Option<SocketAddr>,
    /// The admin token, when this start generated it (it is shown once and never stored in clear).
    pub generated_admin_token: Option<String>,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
    store: SharedStore,
    /// The retention job and the operational webhook sender; stopped with the node.
    _background: Background,
}

/// Background tasks that end when the node is dropped (tests and the benchmark start several nodes in
/// one process).
struct Background(Vec<JoinHandle<()>>);

impl Drop for Background {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Start the retention job and, when configured, the operational webhook sender.
fn start_background(store: &SharedStore, client: &DeliveryClient, settings: &Settings) -> anyhow::Result<Background> {
    let mut tasks = vec![retention::spawn(
        store.clone(),
        settings.retention,
        settings.retention_interval,
    )];
    if let Some(webhook) = &settings.operational_webhook {
        // Refused now rather than at every send: the URL is as hostile as any endpoint's.
        client
            .policy()
            .check_url(&webhook.url)
            .map_err(|e| anyhow::anyhow!("operational_webhook_url: {e}"))?;
        let secret = herald_signature::HmacSecret::parse(&webhook.secret)
            .map_err(|e| anyhow::anyhow!("operational_webhook_secret: {e}"))?;
        tasks.push(herald_delivery::operational::spawn(
            store.clone(),
            client.clone(),
            herald_delivery::operational::OperationalWebhookConfig {
                url: webhook.url.clone(),
                secret,
                poll: std::time::Duration::from_millis(500),
            },
        ));
    }
    Ok(Background(tasks))
}

impl Node {
    /// Open the store, start the delivery engine and start serving the API.
    pub async fn start(settings: &Settings) -> anyhow::Result<Self> {
        Self::start_with(settings, |_| None).await
    }

    /// Like [`start`](Self::start), also serving the routes `extra_routes` returns (given the admin
    /// token's digest, so they can share it) on the same listener. Their paths win over the API's; every
    /// other request goes to the API. `herald serve --inbox` mounts the inbox this way.
    pub async fn start_with(
        settings: &Settings,
        extra_routes: impl FnOnce(&[u8; 32]) -> Option<axum::Router>,
    ) -> anyhow::Result<Self> {
        // Before anything records: until then every metric is a no-op.
        herald_telemetry::registry::install();
        herald_api::metrics::register();
        let store_options = herald_store::StoreOptions {
            lease_ttl: settings.lease_ttl,
            // A node giving a partition up clears its lease once the engine reports nothing of it in flight
            // and every result written; should that report not come (an attempt running to its bound),
            // at most the longest attempt and then a lease time for its result to be written — a result
            // fenced out would send its delivery again.
            release_drain: settings.request_timeout.max(settings.max_request_timeout) + settings.lease_ttl,
            attempt_retention: settings.retention,
            database: settings.database_timeouts,
            sqlite_check: settings.sqlite_check,
            // The outbox refuses what the API would (PostgreSQL's `herald_publish`).
            max_payload_bytes: Some(settings.max_payload_bytes),
        };
        let (cipher, generated_key) = secret_cipher(&settings.secret_key)?;
        let store = match herald_store::open_with(&settings.database_url, cipher, &store_options).await {
            Ok(store) => store,
            Err(error) => {
                if let Some(path) = generated_key {
                    // A key generated for a database whose secrets are sealed with another one is useless;
                    // leave nothing behind that the next start would pick up.
                    let _ = std::fs::remove_file(path);
                }
                return Err(error).with_context(|| format!("opening {}", redact(&settings.database_url)));
            }
        };
        let (admin_token_sha256, generated_admin_token) = admin_token(&store, settings.admin_token.as_deref()).await?;
        let extra_routes = extra_routes(&admin_token_sha256);
        let policy = Arc::new(
            AddressPolicy::new(settings.allow_private_cidrs.clone(), settings.allow_http)
                .with_allowed_ports(settings.allow_ports.iter().copied()),
        );
        let resolver: Arc<dyn HostResolver> = Arc::new(
            SystemResolver::new()
                .map_err(anyhow::Error::msg)
                .context("DNS resolver")?,
        );
        let client_config = ClientConfig {
            connect_timeout: settings.connect_timeout,
            total_timeout: settings.request_timeout,
            proxy_url: settings.proxy_url.clone(),
            signature_headers: settings.signature_headers,
            ..ClientConfig::default()
        };
        let client = DeliveryClient::new(client_config, policy.clone(), resolver).context("delivery client")?;
        let mut background = start_background(&store, &client, settings)?;
        let engine_config = EngineConfig {
            schedule: settings.retry_schedule.clone(),
            max_in_flight: settings.max_in_flight,
            endpoint_concurrency: settings.endpoint_concurrency,
            breaker: settings.breaker,
            disable_after: settings.disable_after,
            // An endpoint may take up to the operator's bound per attempt: a delivery's window allows for it.
            attempt_timeout: settings.request_timeout.max(settings.max_request_timeout),
            trace_attempts: settings.trace_export.is_some(),
            ..EngineConfig::default()
        };
        let engine = Engine::start(store.clone(), client, engine_config)
            .await
            .context("starting the delivery engine")?;
        let state = AppState::new(
            store.clone(),
            Some(engine),
            policy,
            admin_token_sha256,
            Limits::for_payload(settings.max_payload_bytes).with_max_request_timeout(settings.max_request_timeout),
        )
        .with_portal(settings.portal.clone())
        .with_metrics_top_endpoints(settings.metrics_top_endpoints)
        .with_trace_requests(settings.trace_export.is_some());
        // Carry on (or close) the background tasks the previous process left running, before serving.
        herald_api::resume_interrupted(&state)
            .await
            .context("taking up interrupted background tasks")?;
        let metrics_addr = match settings.metrics_listen {
            Some(listen) => {
                let (addr, task) = serve_metrics(listen, state.clone(), settings.edge).await?;
                background.0.push(task);
                Some(addr)
            }
            None => None,
        };
        let listener = tokio::net::TcpListener::bind(settings.listen)
            .await
            .with_context(|| format!("listening on {}", settings.listen))?;
        let addr = listener.local_addr()?;
        let service = match extra_routes {
            None => herald_api::service(state),
            Some(routes) => herald_api::normalize(routes.fallback_service(herald_api::service(state))),
        };
        start_relays(settings, addr, generated_admin_token.as_deref(), &mut background)?;
        let (shutdown, stop) = oneshot::channel::<()>();
        // The delivery engine's outbound connections need descriptors too: keep them out of the
        // connection cap's reach (plus room for the database pool).
        let metrics_connections = if metrics_addr.is_some() {
            herald_edge::METRICS_CONNECTIONS
        } else {
            0
        };
        let edge = herald_edge::Edge::new(settings.edge).reserve_fds(
            usize::try_from(settings.max_in_flight)
                .unwrap_or(usize::MAX)
                .saturating_add(64)
                .saturating_add(metrics_connections),
        );
        let task = tokio::spawn(async move {
            edge.serve(listener, service, async move {
                let _ = stop.await;
            })
            .await
            .context("serving")
        });
        Ok(Self {
            addr,
            metrics_addr,
            generated_admin_token,
            shutdown: Some(shutdown),
            task,
            store,
            _background: background,
        })
    }

    /// Serve until `signal` completes, then stop accepting requests, finish the open ones and hand this
    /// node's delivery work over to the other nodes (if any share the store).
    pub async fn run_until(mut self, signal: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
        let result = tokio::select! {
            () = signal => {
                if let Some(shutdown) = self.shutdown.take() {
                    let _ = shutdown.send(());
                }
                self.task.await.context("server task")
            }
            result = &mut self.task => result.context("server task"),
        };
        self.store.shutdown().await;
        result?
    }
}

/// Start the `[[relay]]` sections, publishing to this node (at `addr`) unless they name another server.
fn start_relays(
    settings: &Settings,
    addr: SocketAddr,
    generated_admin_token: Option<&str>,
    background: &mut Background,
) -> anyhow::Result<()> {
    if settings.relays.is_empty() {
        return Ok(());
    }
    herald_relay::metrics::register();
    let token = settings.admin_token.as_deref().or(generated_admin_token);
    for section in &settings.relays {
        let config = section
            .for_node(&format!("http://{addr}"), token)
            .check()
            .context("[[relay]]")?;
        let relay = herald_relay::Relay::new(config).context("[[relay]]")?;
        // Ends with the node: the task is aborted with the other background tasks (a batch cut short
        // leaves its rows in the outbox, published again by the next start with the same eventIds).
        background.0.push(tokio::spawn(relay.run(std::future::pending())));
    }
    Ok(())
}

/// Serve `GET /metrics` without a token on an address of its own (`metrics_listen`): for a Prometheus
/// that reaches the node on a private network and should hold no admin token. Through the edge like the
/// API (its timeouts, a cap of [`herald_edge::METRICS_CONNECTIONS`], JSON for every error), so that idle
/// or hostile sockets there cannot hold descriptors the API needs.
async fn serve_metrics(
    listen: SocketAddr,
    state: AppState,
    limits: herald_edge::Limits,
) -> anyhow::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("metrics_listen: listening on {listen}"))?;
    let addr = listener.local_addr()?;
    let router = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let state = state.clone();
                async move { herald_api::metrics::scrape(&state).await }
            }),
        )
        .fallback(herald_edge::problem::no_route)
        .method_not_allowed_fallback(herald_edge::problem::wrong_method);
    let edge = herald_edge::Edge::new(limits.for_metrics());
    // Ends with the node: the task is aborted with the other background tasks.
    let task = tokio::spawn(async move {
        if let Err(error) = edge.serve(listener, router, std::future::pending()).await {
            tracing::error!(%error, "the metrics listener stopped");
        }
    });
    Ok((addr, task))
}

/// The cipher for endpoint secrets at rest, and the key file if this start generated it.
fn secret_cipher(source: &SecretKeySource) -> anyhow::Result<(SecretCipher, Option<&std::path::Path>)> {
    let path = match source {
        SecretKeySource::Configured(cipher) => return Ok((cipher.clone(), None)),
        SecretKeySource::Ephemeral => {
            return Ok((SecretCipher::from_base64(&SecretCipher::generate_key())?, None));
        }
        SecretKeySource::File(path) => path,
    };
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let cipher = SecretCipher::from_base64(&text)
                .with_context(|| format!("the secret key file {} is not a valid key", path.display()))?;
            return Ok((cipher, None));
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error).with_context(|| format!("reading the secret key file {}", path.display())),
    }
    let key = SecretCipher::generate_key();
    let mut options = std::fs::OpenOptions::new();
    // `create_new`: two nodes starting at once never overwrite each other's key.
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .open(path)
        .with_context(|| format!("creating the secret key file {}", path.display()))?;
    std::io::Write::write_all(&mut file, format!("{}\n", key.as_str()).as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing the secret key file {}", path.display()))?;
    tracing::warn!(
        file = %path.display(),
        "generated the key that encrypts endpoint secrets; keep this file (without it the secrets cannot be read) \
         and keep it out of copies of the database, or set HERALD_SECRET_KEY instead"
    );
    Ok((SecretCipher::from_base64(&key)?, Some(path)))
}

/// The admin token's digest: from the configuration, or the stored one, or a new one (returned so the
/// caller can show it once).
async fn admin_token(store: &SharedStore, configured: Option<&str>) -> anyhow::Result<([u8; 32], Option<String>)> {
    if let Some(token) = configured {
        return Ok((token_digest(token), None));
    }
    if let Some(hex_digest) = store.meta_get(ADMIN_TOKEN_KEY).await? {
        let mut digest = [0u8; 32];
        hex::decode_to_slice(hex_digest.trim(), &mut digest).context("the stored admin token digest is corrupt")?;
        return Ok((digest, None));
    }
    let random: [u8; 32] = rand::random();
    let token = format!(
        "herald_admin_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random)
    );
    let digest = token_digest(&token);
    store.meta_set(ADMIN_TOKEN_KEY, &hex::encode(digest)).await?;
    Ok((digest, Some(token)))
}

/// A database URL without its password, for messages and logs (see [`herald_core::redact::url`]).
pub fn redact(database_url: &str) -> String {
    herald_core::redact::url(database_url)
}
