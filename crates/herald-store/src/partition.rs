//! Scale-out: the partitions endpoints hash into, and what a node owns of them.

use herald_core::id::EndpointId;

/// The number of delivery partitions endpoints hash into. Fixed: every node must agree on it.
pub const PARTITIONS: i32 = 256;

/// The delivery partition of an endpoint: FNV-1a of its id, so every node computes the same one.
pub fn partition_of(endpoint_id: &str) -> i32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in endpoint_id.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    // The remainder is below PARTITIONS, so it always fits.
    i32::try_from(hash % PARTITIONS.unsigned_abs() as u64).unwrap_or(0)
}

/// Scale-out: which endpoints this node delivers for. Nodes sharing a store own disjoint partitions of
/// the endpoints (see [`partition_of`]), so per-endpoint caps, rate limits and breakers hold across the
/// cluster with no per-delivery coordination.
pub trait Ownership: Send + Sync + 'static {
    /// Whether this node may send the deliveries of the partition's endpoints now.
    fn owns_partition(&self, partition: i32) -> bool;
    /// Whether this node may send the endpoint's deliveries now.
    fn owns(&self, endpoint_id: &str) -> bool {
        self.owns_partition(partition_of(endpoint_id))
    }
    /// Changes the delivery engine must act on. It can be taken once; later calls return `None`.
    fn take_events(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<OwnershipEvent>>;
    /// The engine's word that nothing it sent for these partitions (given up: see
    /// [`OwnershipEvent::Released`]) is still in flight or waiting for its result to be written. A
    /// partition being handed over is then cleared for its next owner at once, instead of after the
    /// longest attempt a request may take.
    fn drained(&self, partitions: &[i32]);
}

/// A change in what this node should deliver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnershipEvent {
    /// These endpoints, owned by this node, may have pending deliveries that it has not seen: their
    /// partition was just taken over, or another node ingested messages for them.
    Work(Vec<EndpointId>),
    /// These partitions were given up or lost: stop scheduling their endpoints (what is in flight
    /// finishes; its results are fenced). The engine forgets their queues even if a partition is owned
    /// again by the time it reads this: a queue kept across a lapse would hold a cursor past deliveries
    /// committed while this node did not own it, and skip them; the takeover announces the partition's
    /// backlog afresh ([`OwnershipEvent::Work`], always after this event).
    Released(Vec<i32>),
    /// Every delivery up to this `seq` is committed, and the endpoints this node owns among them have
    /// been announced (by [`OwnershipEvent::Work`] before this event, or by this node's own commit feed).
    ///
    /// Sent after each look for new work. The engine needs it because deliveries reach it by two roads —
    /// its own commit feed at once, other nodes' through the store a little later — and an endpoint's
    /// queue reads the store only past the highest `seq` it holds: a delivery committed by another node
    /// just before one of this node's must be announced before this node's is taken straight from the
    /// feed, or the queue would move past it (see the engine's `accept_committed`).
    Seen(i64),
}
