//! The state every handler shares.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use herald_core::address::AddressPolicy;
use herald_core::model::Endpoint;
use herald_delivery::EngineHandle;
use herald_store::{SharedStore, StoreError};

/// Size limits on what clients send.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The largest message payload in bytes (default 1 MiB); larger ones get 413.
    pub max_payload_bytes: usize,
    /// The largest request body (the payload plus room for the envelope).
    pub max_body_bytes: usize,
}

impl Limits {
    /// Limits for a given payload cap; the body may carry 64 KiB of envelope on top.
    pub fn for_payload(max_payload_bytes: usize) -> Self {
        Self {
            max_payload_bytes,
            max_body_bytes: max_payload_bytes.saturating_add(64 * 1024),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self::for_payload(1024 * 1024)
    }
}

/// Shared API state. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
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
    /// Fan-out index: each app's endpoints, so ingest needs no query per message.
    pub(crate) endpoint_index: Arc<EndpointIndex>,
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
        Self {
            store,
            engine,
            policy,
            admin_token_sha256,
            limits,
            endpoint_index: Arc::default(),
        }
    }

    /// An endpoint of `app_id` changed: refresh the fan-out index and tell the engine.
    pub(crate) fn endpoint_changed(&self, app_id: &str, endpoint_id: &str) {
        self.endpoint_index.invalidate(app_id);
        if let Some(engine) = &self.engine {
            engine.endpoint_changed(endpoint_id);
        }
    }
}

/// Each application's endpoints, cached until one of them changes.
///
/// Only this node's API invalidates it, which is exact on a single node (the SQLite default). Several
/// nodes sharing one database need cross-node invalidation; that arrives with the PostgreSQL backend.
#[derive(Default)]
pub(crate) struct EndpointIndex {
    apps: RwLock<HashMap<String, Arc<Vec<Endpoint>>>>,
}

impl EndpointIndex {
    pub(crate) async fn endpoints(
        &self,
        store: &SharedStore,
        app_id: &str,
    ) -> Result<Arc<Vec<Endpoint>>, StoreError> {
        if let Some(found) = self
            .apps
            .read()
            .ok()
            .and_then(|apps| apps.get(app_id).cloned())
        {
            return Ok(found);
        }
        let loaded = Arc::new(store.app_endpoints(app_id).await?);
        if let Ok(mut apps) = self.apps.write() {
            apps.insert(app_id.to_owned(), loaded.clone());
        }
        Ok(loaded)
    }

    pub(crate) fn invalidate(&self, app_id: &str) {
        if let Ok(mut apps) = self.apps.write() {
            apps.remove(app_id);
        }
    }
}
