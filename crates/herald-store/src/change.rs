//! The change stream: what the store committed that the delivery engine must act on.

use herald_core::id::EndpointId;

use crate::PendingDelivery;

/// A change the store committed that the delivery engine must act on (see
/// [`DeliveryStore::take_changes`](crate::DeliveryStore::take_changes)). The
/// store announces each after its commit, from the one place that wrote it, so the API only writes and
/// the engine hears every change in one stream.
#[derive(Debug, Clone)]
pub enum Change {
    /// Deliveries [`Store::ingest`](crate::Store::ingest) committed on this node (the commit feed): straight into the queues.
    Committed(Vec<PendingDelivery>),
    /// An endpoint was created, changed (its fields, keys or state) or deleted: reload it. On PostgreSQL
    /// also every other node's, by notification.
    Endpoint(EndpointId),
    /// Deliveries of an endpoint became pending outside ingest (resend, recover, replay): read its
    /// backlog from the store.
    Backlog(EndpointId),
    /// Pending deliveries (endpoint, seq) were cancelled: never send them.
    Cancelled(Vec<(EndpointId, i64)>),
    /// An endpoint was written held for its ownership check (created so, changed while held, or asked to
    /// prove itself again): run the check. Announced only on the node that wrote it, never by
    /// notification, so one node sends the challenge however many share the database. Follows that
    /// write's [`Change::Endpoint`].
    VerificationDue(EndpointId),
}

/// The changes a store committed, in commit order (see
/// [`DeliveryStore::take_changes`](crate::DeliveryStore::take_changes)).
pub type ChangeStream = tokio::sync::mpsc::UnboundedReceiver<Change>;
