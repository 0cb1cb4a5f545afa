//! Herald's receiving side: `herald inbox`.
//!
//! Providers `POST` webhooks to `/in/{source}`. For each request the inbox
//!
//! 1. reads the raw body, refusing more than the configured maximum (413);
//! 2. verifies its signature with `herald-signature` under the source's scheme and secrets — before
//!    anything of it is parsed — and answers 401, stores nothing and counts the failure when it does not
//!    verify;
//! 3. stores it with `INSERT … ON CONFLICT (source, event_id) DO NOTHING`, committed durably;
//! 4. only then answers `200 {"id": "evt_…", "duplicate": false}` (`true` for a copy of an event already
//!    stored, which is acknowledged and not stored again).
//!
//! A forwarder (`forwarder`) then posts each stored event to the source's handler (`forward_to`), with the
//! original body and headers plus `herald-inbox-id`, retrying on its own schedule until the handler
//! answers 2xx or the event is dead. A per-source version guard skips events older than what was already
//! forwarded for the same resource. The admin API lists, shows and replays events.
//!
//! [`Inbox::start`] opens the store, starts the forwarder and gives the HTTP service; the `herald`
//! binary serves it (`herald inbox`, or inside `herald serve --inbox`). The receiver's contract is
//! written down in `docs/inbox.md`.

mod admin;
pub mod client;
pub mod config;
mod error;
mod forwarder;
mod ingress;
pub mod locate;
pub mod metrics;
mod routes;
pub mod scheme;
mod state;
pub mod store;
pub mod version;

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tower::Layer;
use tower_http::normalize_path::{NormalizePath, NormalizePathLayer};

pub use config::{ConfigError, InboxConfig, Source};
pub use error::HttpError;
pub use metrics::Snapshot;
pub use store::{DatabaseOptions, Status, StoreError};

use crate::client::{ClientError, ForwardClient};
use crate::forwarder::Forwarder;
use crate::metrics::Metrics;
use crate::state::InboxState;

/// The default address of `herald inbox`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8041";
/// The default store of `herald inbox`.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://./herald-inbox.db";

/// The inbox could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The store could not be opened. (Its error is the source, not repeated in the message: callers
    /// print the whole chain.)
    #[error("opening the inbox store")]
    Store(#[from] StoreError),
    /// The forwarding client could not be built.
    #[error("building the forwarding client")]
    Client(#[from] ClientError),
}

/// SHA-256 of an admin token, the form [`Inbox::start`] takes it in (the same digest `herald serve` keeps).
pub fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A running inbox: its store, its forwarder, and the HTTP routes to serve.
pub struct Inbox {
    state: InboxState,
    stop: watch::Sender<bool>,
    forwarder: JoinHandle<()>,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("sources", &self.state.sources.len())
            .finish_non_exhaustive()
    }
}

impl Inbox {
    /// Open the store at `database_url` (`sqlite://PATH`), and start the forwarder, which at once picks
    /// up every event left pending by a previous run.
    ///
    /// # Errors
    ///
    /// [`StartError`] when the store cannot be opened or the HTTP client built.
    pub async fn start(config: InboxConfig, database_url: &str) -> Result<Self, StartError> {
        let store = store::open_with(database_url, &config.database).await?;
        let client = ForwardClient::new(config.forward_timeout)?;
        let sources: HashMap<String, Arc<Source>> =
            config.sources.iter().map(|s| (s.name.clone(), s.clone())).collect();
        let state = InboxState {
            sources: Arc::new(sources),
            store,
            wake: Arc::new(Notify::new()),
            metrics: Arc::new(Metrics::default()),
            max_body_bytes: config.max_body_bytes,
            admin_token_sha256: None,
        };
        let forwarder = Forwarder {
            store: state.store.clone(),
            sources: state.sources.clone(),
            client,
            schedule: config.retry_schedule.clone(),
            concurrency: config.forward_concurrency,
            wake: state.wake.clone(),
            metrics: state.metrics.clone(),
        };
        let (stop, stopped) = watch::channel(false);
        state.metrics.register(&config.sources);
        tokio::spawn(metrics::watch_backlog(
            state.store.clone(),
            state.sources.clone(),
            stopped.clone(),
        ));
        let forwarder = tokio::spawn(forwarder.run(stopped));
        Ok(Self { state, stop, forwarder })
    }

    /// The inbox's routes — `POST /in/{source}` and the admin API under `/api/v1/inbox` — without a
    /// health check or a fallback, for merging into another service (`herald serve --inbox`). Paths have
    /// no trailing slash; wrap the merged service in a [`NormalizePathLayer`] to accept both spellings.
    ///
    /// `admin_token_sha256` (see [`token_digest`]) guards the admin API; with `None` it is disabled.
    pub fn routes(&self, admin_token_sha256: Option<[u8; 32]>) -> Router {
        routes::routes(self.state_with(admin_token_sha256))
    }

    /// The complete standalone service: [`routes`](Self::routes), `GET /api/v1/health`, JSON errors for
    /// unknown paths, and a trailing slash trimmed from every request path.
    pub fn service(&self, admin_token_sha256: Option<[u8; 32]>) -> NormalizePath<Router> {
        NormalizePathLayer::trim_trailing_slash().layer(routes::standalone(self.state_with(admin_token_sha256)))
    }

    fn state_with(&self, admin_token_sha256: Option<[u8; 32]>) -> InboxState {
        InboxState {
            admin_token_sha256,
            ..self.state.clone()
        }
    }

    /// The counters since start.
    pub fn metrics(&self) -> Snapshot {
        self.state.metrics.snapshot()
    }

    /// Stop the forwarder (letting forwards in flight finish). Stored events stay stored; pending ones
    /// are picked up at the next start.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.forwarder.await;
    }
}
