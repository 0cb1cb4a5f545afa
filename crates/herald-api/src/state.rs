//! The state every handler shares.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use herald_core::address::AddressPolicy;
use herald_core::id::{AppId, AppIdOrUid, EndpointId};
use herald_delivery::EngineHandle;
use herald_store::SharedStore;

/// Size limits on what clients send.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The largest message payload in bytes (default 1 MiB); larger ones get 413.
    pub max_payload_bytes: usize,
    /// The largest request body (the payload plus room for the envelope).
    pub max_body_bytes: usize,
    /// The longest attempt timeout an endpoint may ask for, in milliseconds.
    pub max_request_timeout_ms: u32,
}

impl Limits {
    /// Limits for a given payload cap; the body may carry 64 KiB of envelope on top.
    pub fn for_payload(max_payload_bytes: usize) -> Self {
        Self {
            max_payload_bytes,
            max_body_bytes: max_payload_bytes.saturating_add(64 * 1024),
            max_request_timeout_ms: 60_000,
        }
    }

    /// The same limits with another bound on endpoints' attempt timeouts.
    pub fn with_max_request_timeout(self, max: std::time::Duration) -> Self {
        Self {
            max_request_timeout_ms: u32::try_from(max.as_millis()).unwrap_or(u32::MAX),
            ..self
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self::for_payload(1024 * 1024)
    }
}

/// How the dashboard is reached from outside and who may embed it: the tenant portal's settings.
#[derive(Debug, Clone, Default)]
pub struct Portal {
    /// The base URL users reach this server at (e.g. `https://webhooks.example.com`), without a trailing
    /// slash; portal links (`POST /auth/app-portal-access/{app_id}`) are made absolute with it. When unset,
    /// links are built from the request's `Host` header, over plain http.
    pub public_url: Option<String>,
    /// Origins (`scheme://host[:port]`) whose pages may show the dashboard in an `<iframe>`; none when empty.
    pub frame_ancestors: Vec<String>,
}

/// How many endpoints with the oldest backlogs a scrape lists by default.
pub const DEFAULT_METRICS_TOP_ENDPOINTS: usize = 100;

/// Shared API state: a handle on [`Shared`], read through `Deref` (`state.store`, `state.limits`, …).
///
/// One `Arc`, because axum clones the state for every layer and handler a request passes through
/// (`from_fn_with_state`, `State`, and the boxed routes that carry them, several times per request):
/// cloning and dropping the fields one by one took about 4 % of a node's CPU under ingest, each `Arc`
/// and the engine's channel sender an atomic count shared by both runtime threads.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

/// What every handler shares (see [`AppState`]).
#[derive(Clone)]
pub struct Shared {
    /// The store.
    pub store: SharedStore,
    /// The delivery engine, told about endpoint changes (absent in API-only setups and some tests).
    pub engine: Option<EngineHandle>,
    /// The SSRF policy, applied to endpoint URLs at create and update time.
    pub policy: Arc<AddressPolicy>,
    /// SHA-256 of the admin token (the token itself is never kept in memory longer than start-up).
    pub admin_token_sha256: [u8; 32],
    /// Request limits.
    pub limits: Limits,
    /// The tenant portal's settings (public URL, embedding origins).
    pub portal: Arc<Portal>,
    /// Which application an id or uid names, for the message hot path.
    pub(crate) app_ids: Arc<AppIdCache>,
    /// How many endpoints with the oldest backlogs a scrape lists one by one (besides every open
    /// breaker); see `herald_delivery::metrics`.
    pub metrics_top_endpoints: usize,
    /// Spans are exported as traces (OpenTelemetry): each ingest request then has its `ingest` span.
    /// Without an exporter it is opened only when the filter lets `debug` through.
    pub trace_requests: bool,
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    /// Build the state.
    pub fn new(
        store: SharedStore,
        engine: Option<EngineHandle>,
        policy: Arc<AddressPolicy>,
        admin_token_sha256: [u8; 32],
        limits: Limits,
    ) -> Self {
        Self(Arc::new(Shared {
            store,
            engine,
            policy,
            admin_token_sha256,
            limits,
            portal: Arc::default(),
            app_ids: Arc::default(),
            metrics_top_endpoints: DEFAULT_METRICS_TOP_ENDPOINTS,
            trace_requests: false,
        }))
    }

    /// The same state listing this many oldest backlogs per scrape.
    pub fn with_metrics_top_endpoints(self, top: usize) -> Self {
        self.changed(|shared| shared.metrics_top_endpoints = top)
    }

    /// The same state with ingest requests traced or not (see [`Shared::trace_requests`]).
    pub fn with_trace_requests(self, traced: bool) -> Self {
        self.changed(|shared| shared.trace_requests = traced)
    }

    /// The same state with these portal settings.
    pub fn with_portal(self, portal: Portal) -> Self {
        self.changed(|shared| shared.portal = Arc::new(portal))
    }

    /// The state with `change` made to its fields (at start-up: the fields are copied only if the state
    /// was cloned already).
    fn changed(self, change: impl FnOnce(&mut Shared)) -> Self {
        let mut shared = Arc::unwrap_or_clone(self.0);
        change(&mut shared);
        Self(Arc::new(shared))
    }

    /// Answer only once the delivery engine uses an endpoint's changed record (keys, headers), so a client
    /// that saw its rotation or revocation succeed never sees a later attempt signed with the replaced key.
    /// Every change reaches the engine on the store's change stream; only this wait is asked of it.
    /// Bounded: a stuck engine delays the answer by 5 s at most.
    pub(crate) async fn endpoint_applied(&self, endpoint_id: &EndpointId) {
        if let Some(engine) = &self.engine {
            engine
                .endpoint_applied(endpoint_id, std::time::Duration::from_secs(5))
                .await;
        }
    }
}

/// Which application an id or uid names, remembered so that publishing a message costs no lookup.
///
/// Only the mapping is cached, never the application: the store checks that the application still exists
/// inside the ingest transaction, so a stale entry for a deleted app still ends in a 404. Any change to an
/// application on this node clears the cache, because a uid can move from one application to another.
/// (Nodes sharing one database need cross-node invalidation for uid moves; see the PostgreSQL backend.)
#[derive(Default)]
pub(crate) struct AppIdCache {
    ids: RwLock<HashMap<String, AppId>>,
}

impl AppIdCache {
    /// Most entries kept; past that the cache starts over (it refills itself from the store).
    const MAX_ENTRIES: usize = 100_000;

    pub(crate) fn get(&self, id_or_uid: &AppIdOrUid) -> Option<AppId> {
        self.ids.read().ok()?.get(id_or_uid.as_str()).cloned()
    }

    pub(crate) fn insert(&self, id_or_uid: &AppIdOrUid, app_id: &AppId) {
        if let Ok(mut ids) = self.ids.write() {
            if ids.len() >= Self::MAX_ENTRIES {
                ids.clear();
            }
            ids.insert(id_or_uid.as_str().to_owned(), app_id.clone());
        }
    }

    pub(crate) fn clear(&self) {
        if let Ok(mut ids) = self.ids.write() {
            ids.clear();
        }
    }
}
