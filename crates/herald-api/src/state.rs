//! The state every handler shares.

use std::sync::Arc;

use herald_core::address::AddressPolicy;
use herald_delivery::EngineHandle;
use herald_store::SharedStore;

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
        }
    }

    /// An endpoint changed (or was deleted): tell the delivery engine to reload it. Fan-out needs no
    /// notice: the store reads the endpoints inside each ingest transaction.
    pub(crate) fn endpoint_changed(&self, endpoint_id: &str) {
        if let Some(engine) = &self.engine {
            engine.endpoint_changed(endpoint_id);
        }
    }
}
