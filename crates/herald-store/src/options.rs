//! Settings of a store beyond its URL.

use std::time::Duration;

use crate::{custody, integrity};

/// Settings of the store beyond its URL.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// PostgreSQL: how long a partition lease lasts without renewal (the fail-over bound).
    pub lease_ttl: Duration,
    /// PostgreSQL: the longest a node keeps a partition it gives up after it stopped sending to it, so
    /// that its attempts in flight end and their results are written before another node starts (the
    /// longest attempt and a lease time). The engine's report ([`crate::Ownership::drained`]) ends it
    /// sooner.
    pub release_drain: Duration,
    /// PostgreSQL: attempts older than this are dropped, a day partition at a time.
    pub attempt_retention: Duration,
    /// PostgreSQL: how long the database may keep a request waiting before it is answered 503.
    pub database: custody::DatabaseTimeouts,
    /// SQLite: how much of the file is checked before it is served (see [`integrity`]).
    pub sqlite_check: integrity::SqliteCheck,
    /// PostgreSQL: the largest message payload in bytes, as the API enforces it (`max_payload_bytes`), for
    /// the outbox: written at start-up for `herald_publish` to check in the producer's transaction, and
    /// checked by this node's outbox reader. `None` (a store opened outside `herald serve`): the stored
    /// limit is left as it is and the reader checks none.
    pub max_payload_bytes: Option<usize>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            lease_ttl: Duration::from_secs(10),
            release_drain: Duration::from_secs(16),
            attempt_retention: Duration::from_secs(30 * 24 * 3600),
            database: custody::DatabaseTimeouts::default(),
            sqlite_check: integrity::SqliteCheck::default(),
            max_payload_bytes: None,
        }
    }
}
