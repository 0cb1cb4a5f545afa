//! The names every node sharing a PostgreSQL database agrees on: its notification channels and the
//! advisory lock that orders ingest.

/// The advisory lock key that orders ingest transactions ("herald" in ASCII).
pub(crate) const INGEST_LOCK: i64 = 0x6865_7261_6c64;

/// The channel ingest notifies when it committed deliveries; the payload is the node id.
pub(crate) const WORK_CHANNEL: &str = "herald_work";

/// The channel notified with an endpoint's id when it changes, so that its owner — maybe another node —
/// reloads it.
pub(crate) const ENDPOINT_CHANNEL: &str = "herald_endpoint";
