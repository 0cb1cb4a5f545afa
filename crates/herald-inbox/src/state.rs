//! What the HTTP handlers share.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::Notify;

use crate::config::Source;
use crate::metrics::Metrics;
use crate::store::SharedInboxStore;

/// Shared by every handler. Cheap to clone.
#[derive(Clone)]
pub(crate) struct InboxState {
    /// Sources by name.
    pub(crate) sources: Arc<HashMap<String, Arc<Source>>>,
    pub(crate) store: SharedInboxStore,
    /// Wakes the forwarder when there is new work.
    pub(crate) wake: Arc<Notify>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) max_body_bytes: usize,
    /// SHA-256 of the admin token; `None` disables the admin API.
    pub(crate) admin_token_sha256: Option<[u8; 32]>,
}
