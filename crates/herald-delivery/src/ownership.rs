//! The engine's hook into scale-out: which endpoints this node may deliver for, and the changes to that.
//!
//! A store shared by several nodes (PostgreSQL) hands out an [`Ownership`]; a store that serves one node
//! (SQLite) has none, and then this node owns everything and nothing ever changes. Everything about
//! leases lives in the store; the engine only filters what it schedules and reacts to [`OwnershipEvent`]s.

use std::sync::Arc;

use herald_store::{Ownership, OwnershipEvent, SharedDeliveryStore};
use tokio::sync::mpsc;

/// Whether this node may schedule an endpoint.
#[derive(Clone)]
pub(crate) struct Owner(Option<Arc<dyn Ownership>>);

impl Owner {
    pub(crate) fn of(store: &SharedDeliveryStore) -> Self {
        Self(store.ownership())
    }

    /// Whether several nodes share the store (so deliveries also arrive from other nodes' ingest).
    pub(crate) fn is_shared(&self) -> bool {
        self.0.is_some()
    }

    pub(crate) fn owns(&self, endpoint_id: &str) -> bool {
        self.0.as_ref().is_none_or(|ownership| ownership.owns(endpoint_id))
    }

    pub(crate) fn owns_partition(&self, partition: i32) -> bool {
        self.0
            .as_ref()
            .is_none_or(|ownership| ownership.owns_partition(partition))
    }

    /// Tell the store that nothing sent for these given-up partitions is in flight any more.
    pub(crate) fn drained(&self, partitions: &[i32]) {
        if let Some(ownership) = &self.0 {
            ownership.drained(partitions);
        }
    }
}

/// The stream of ownership changes (empty on a single-node store).
pub(crate) struct Changes(Option<mpsc::UnboundedReceiver<OwnershipEvent>>);

impl Changes {
    pub(crate) fn take(store: &SharedDeliveryStore) -> Self {
        Self(store.ownership().and_then(|ownership| ownership.take_events()))
    }

    /// The next change; never resolves when there are none to come.
    pub(crate) async fn next(&mut self) -> OwnershipEvent {
        if let Some(events) = &mut self.0
            && let Some(event) = events.recv().await
        {
            return event;
        }
        self.0 = None;
        std::future::pending().await
    }
}
