//! The durable inbox: what was received, what became of it, and the version guard's memory.
//!
//! [`InboxStore`] is what the ingress, the forwarder and the admin API need. It has two implementations
//! with the same behaviour: [`sqlite::SqliteInbox`] on one SQLite file (the default) and
//! [`postgres::PgInbox`] on PostgreSQL. Their statements, row decoding and multi-statement operations are
//! written once, in `sql`; each backend only brings its pools, its migrations folder and its write path.
//!
//! The inbox's migrations are recorded in their own table (`_herald_inbox_migrations`), not sqlx's
//! default, and its tables are all named `inbox_…`: so the inbox can share one database with the sender
//! (`herald serve --inbox` on one PostgreSQL URL) without either migrator tripping over the other's
//! history.

pub mod postgres;
mod sql;
pub mod sqlite;
mod writer;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use herald_core::clock::Millis;
use herald_core::id::InboxEventId;
use herald_sql::custody::Fault;

/// What became of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Waiting to be forwarded (first time or retry).
    Pending,
    /// The handler answered 2xx.
    Forwarded,
    /// Not forwarded: its version was not newer than one already forwarded for its resource.
    Stale,
    /// Verified, but unusable where parsing was needed (no event id, no resource key or version for the
    /// guard). Kept and listed, never retried on its own; replay forwards it anyway.
    BadInput,
    /// Every forwarding attempt of the retry schedule failed.
    Dead,
}

impl Status {
    /// Every status.
    pub const ALL: [Status; 5] = [
        Status::Pending,
        Status::Forwarded,
        Status::Stale,
        Status::BadInput,
        Status::Dead,
    ];

    /// The stored and displayed name.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Forwarded => "forwarded",
            Status::Stale => "stale",
            Status::BadInput => "bad_input",
            Status::Dead => "dead",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Status {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Status::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown status {s:?}")))
    }
}

/// A verified event to store.
#[derive(Debug, Clone)]
pub struct NewEvent {
    /// The source's name.
    pub source: String,
    /// The provider's event id (deduplication key within the source).
    pub event_id: String,
    /// The headers to forward, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The raw body.
    pub body: Bytes,
    /// [`Status::Pending`], or [`Status::BadInput`] when extraction failed.
    pub status: Status,
    /// Why it is bad input, if it is.
    pub last_error: Option<String>,
    /// The resource key, when the version guard is on and it was found.
    pub resource_key: Option<String>,
    /// The version, when the version guard is on and it was found.
    pub version: Option<String>,
}

/// The answer to an insert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inserted {
    /// The inbox id: the new row's, or for a duplicate the original's.
    pub id: InboxEventId,
    /// True when an event with the same source and event id was already stored (nothing was written).
    pub duplicate: bool,
}

/// A stored event.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    /// `evt_…`.
    pub id: InboxEventId,
    /// The source's name.
    pub source: String,
    /// The provider's event id.
    pub event_id: String,
    /// The headers to forward.
    pub headers: Vec<(String, String)>,
    /// The raw body.
    pub body: Bytes,
    /// When it was received.
    pub received_at: Millis,
    /// Its status.
    pub status: Status,
    /// Forwarding attempts made since it was received or last replayed.
    pub attempts: u32,
    /// When it is next due, while pending.
    pub next_attempt_at: Millis,
    /// The last forwarding failure, or why it is stale or bad input.
    pub last_error: Option<String>,
    /// Its resource key, for the version guard.
    pub resource_key: Option<String>,
    /// Its version, for the version guard.
    pub version: Option<String>,
    /// How many times it was replayed. A replayed event bypasses the version guard, and a forwarding
    /// result is recorded only if no replay happened while it was in flight.
    pub replays: i64,
    /// Last change.
    pub updated_at: Millis,
}

/// What a forwarding attempt (or the guard) decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The handler answered 2xx. With the guard on, remember the version for its resource.
    Forwarded {
        /// `(resource_key, version)` to record as forwarded.
        guard: Option<(String, String)>,
    },
    /// It failed; try again at `next_attempt_at`.
    Retry {
        /// When.
        next_attempt_at: Millis,
        /// What went wrong.
        error: String,
    },
    /// It failed for the last time.
    Dead {
        /// What went wrong.
        error: String,
    },
    /// The version guard skipped it.
    Stale {
        /// Which version made it stale.
        reason: String,
    },
}

/// A filter and page for listing events, newest first.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// Only this source.
    pub source: Option<String>,
    /// Only this status.
    pub status: Option<Status>,
    /// At most this many.
    pub limit: usize,
    /// Only events older than this id (the previous page's `iterator`).
    pub before: Option<InboxEventId>,
}

/// When this process may forward, as a store sees it.
///
/// Two forwarders on one store would forward every event twice and could forward two versions of one
/// resource at once, defeating the version guard. A SQLite file has one inbox process, so it always may.
/// On PostgreSQL several processes (the nodes of a cluster running `herald serve --inbox`, or several
/// `herald inbox`) may share the database: only the one holding the database's forwarder lock forwards,
/// and another takes over when it goes away.
#[derive(Debug, Clone)]
pub struct Forwarding {
    /// True while this process may start forwards.
    pub allowed: tokio::sync::watch::Receiver<bool>,
    /// How often to look for due events even when nothing woke the forwarder: events stored by another
    /// process cannot wake it. `None` when every event is stored by this process.
    pub poll: Option<Duration>,
}

/// The store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database answered with an error.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// The schema could not be brought up to date.
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored value makes no sense.
    #[error("corrupt data: {0}")]
    Corrupt(String),
    /// The URL names no supported database.
    #[error("unsupported database URL {0:?}: expected sqlite://PATH or postgres://USER@HOST/DATABASE")]
    UnsupportedUrl(String),
    /// The store is shutting down.
    #[error("the store is closed")]
    Closed,
    /// A group commit failed as a whole.
    #[error("commit failed: {0}")]
    Batch(String),
    /// A group commit failed because the storage is full: nothing of it was stored.
    #[error("storage full: {0}")]
    StorageFull(String),
    /// The database reports its file damaged (what it said): nothing was written.
    #[error("the database file is damaged: {0}")]
    FileCorrupt(String),
    /// The start-up check found the SQLite file damaged (see [`herald_sql::integrity`]).
    #[error(transparent)]
    Damaged(#[from] herald_sql::integrity::Damaged),
    /// The version guard's mark of this resource (`source/key`) kept changing under concurrent writers.
    #[error("the version mark of {0} kept changing; try again")]
    Contended(String),
    /// The database did not answer within the bound of [`herald_sql::custody::Bound`].
    #[error("the database did not answer within {0:?}")]
    TimedOut(Duration),
}

impl From<herald_sql::custody::TimedOut> for StoreError {
    fn from(timed_out: herald_sql::custody::TimedOut) -> Self {
        StoreError::TimedOut(timed_out.0)
    }
}

impl StoreError {
    /// The storage fault behind this error, if it is one (see [`herald_sql::custody`]).
    pub fn fault(&self) -> Option<Fault> {
        match self {
            StoreError::Database(error) => herald_sql::custody::fault_of(error),
            StoreError::StorageFull(_) => Some(Fault::Full),
            StoreError::FileCorrupt(_) | StoreError::Damaged(_) => Some(Fault::Corrupt),
            StoreError::Batch(_) | StoreError::Closed | StoreError::TimedOut(_) => Some(Fault::Unavailable),
            _ => None,
        }
    }

    /// The error every request of a failed group commit gets.
    pub(crate) fn shared_by_batch(&self) -> StoreError {
        match self.fault() {
            Some(Fault::Full) => StoreError::StorageFull(self.to_string()),
            Some(Fault::Corrupt) => StoreError::FileCorrupt(self.to_string()),
            _ => StoreError::Batch(self.to_string()),
        }
    }
}

/// A source's pending events, for its metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pending {
    /// How many, counted up to [`Pending::COUNT_CAP`].
    pub count: u64,
    /// More than the cap wait: `count` is a lower bound.
    pub capped: bool,
    /// When the oldest of them was received.
    pub oldest_received_at: Option<Millis>,
}

impl Pending {
    /// The most pending events counted exactly (the count walks the source's pending index).
    pub const COUNT_CAP: u64 = 100_000;
}

/// Shorthand.
pub type StoreResult<T> = Result<T, StoreError>;

/// A shared handle to a store.
pub type SharedInboxStore = Arc<dyn InboxStore>;

herald_sql::bounded_trait! {
/// What the inbox needs from its storage. On PostgreSQL every `async` call is bounded on the client's
/// side ([`BoundedInbox`]; see [`herald_sql::bounded_trait!`]).
pub trait InboxStore: [Send + Sync], bounded in BoundedInbox {
    /// Store a verified event unless its `(source, event_id)` is already stored; returns only after the
    /// row is durably committed.
    async fn insert(&self, event: NewEvent) -> StoreResult<Inserted>;

    /// Pending events due at `now`, earliest first.
    async fn due(&self, now: Millis, limit: usize) -> StoreResult<Vec<StoredEvent>>;

    /// The earliest `next_attempt_at` of a pending event that is later than `now`.
    async fn next_due_after(&self, now: Millis) -> StoreResult<Option<Millis>>;

    /// The newest version forwarded for a resource of a source.
    async fn newest_version(&self, source: &str, resource_key: &str) -> StoreResult<Option<String>>;

    /// Record what became of a pending event after `attempts` attempts, unless it was replayed meanwhile
    /// (its replay count is no longer `replays`) or is no longer pending. Returns whether it was recorded.
    async fn record(&self, id: &InboxEventId, replays: i64, attempts: u32, outcome: &Outcome, now: Millis) -> StoreResult<bool>;

    /// One event.
    async fn get(&self, id: &InboxEventId) -> StoreResult<Option<StoredEvent>>;

    /// Events, newest first; `limit + 1` are fetched to tell whether more follow.
    async fn list(&self, query: &ListQuery) -> StoreResult<Vec<StoredEvent>>;

    /// Make one event pending again, due now, whatever its status. Returns false if there is no such event.
    async fn replay(&self, id: &InboxEventId, now: Millis) -> StoreResult<bool>;

    /// Make every event of `source` received in `[since, until)` pending again, due now. Returns how many.
    async fn replay_window(&self, source: &str, since: Millis, until: Millis, now: Millis) -> StoreResult<u64>;

    /// A source's pending events: how many (capped) and when the oldest was received.
    async fn pending_of(&self, source: &str) -> StoreResult<Pending>;

    /// Whether the store answers.
    async fn ping(&self) -> StoreResult<()>;
}
unbounded {
    /// When this process may forward (see [`Forwarding`]).
    fn forwarding(&self) -> Forwarding;
}
forwarded {
    fn forwarding(&self) -> Forwarding {
        self.inner.forwarding()
    }
}
}

/// An inbox store with every call given up after a bound (see [`herald_sql::custody::Bound`]): a
/// silent PostgreSQL fails the call with [`StoreError::TimedOut`], a 503 to the provider and a retry for
/// the forwarder, instead of holding it until TCP gives up.
pub struct BoundedInbox {
    inner: SharedInboxStore,
    bound: herald_sql::custody::Bound,
}

/// How the inbox's store treats its database: PostgreSQL's timeouts (the sender's settings of the same
/// names), and how much of a SQLite file is checked before it is served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DatabaseOptions {
    /// PostgreSQL: how long a provider may wait before it is answered 503.
    pub timeouts: herald_sql::custody::DatabaseTimeouts,
    /// SQLite: the start-up check (see [`herald_sql::integrity`]).
    pub sqlite_check: herald_sql::integrity::SqliteCheck,
}

/// [`open_with`] the default options.
///
/// # Errors
///
/// See [`open_with`].
pub async fn open(database_url: &str) -> StoreResult<SharedInboxStore> {
    open_with(database_url, &DatabaseOptions::default()).await
}

/// Open the store named by `database_url` — `sqlite://PATH` (created if missing, checked first) or
/// `postgres://USER@HOST/DATABASE` (`postgresql://` too; the database must exist) — and bring its schema up
/// to date.
///
/// # Errors
///
/// [`StoreError::UnsupportedUrl`] for another kind of URL; [`StoreError::Damaged`] for a damaged SQLite
/// file; database and migration errors.
pub async fn open_with(database_url: &str, options: &DatabaseOptions) -> StoreResult<SharedInboxStore> {
    if database_url.starts_with("sqlite:") {
        herald_sql::integrity::check(database_url, options.sqlite_check).await?;
        Ok(Arc::new(sqlite::SqliteInbox::open(database_url).await?))
    } else if herald_sql::is_postgres_url(database_url) {
        let (inbox, bound) = postgres::PgInbox::open(database_url, options.timeouts).await?;
        Ok(Arc::new(BoundedInbox {
            inner: Arc::new(inbox),
            bound,
        }))
    } else {
        Err(StoreError::UnsupportedUrl(database_url.to_owned()))
    }
}
