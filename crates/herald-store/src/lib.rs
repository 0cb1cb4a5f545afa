//! Herald's durable store.
//!
//! [`Store`] is everything the API and the delivery engine need from storage; [`DeliveryStore`] is the
//! part the engine uses, [`PollingStore`] pull delivery's. [`SqlStore`] implements them
//! once, each statement one SQL text for both dialects, on an embedded SQLite file
//! ([`sqlite::SqliteStore`]) or on PostgreSQL ([`postgres::PgStore`]), where any number of nodes can share
//! one database (see [`Ownership`]); only what the dialects truly do differently (bulk inserts, leases
//! and fencing, retention, notifications) is written per dialect. The store owns *custody*:
//! [`Store::ingest`] returns only after the message and its whole fan-out are on disk, and it commits many
//! concurrent requests per fsync (group commit) so durability does not cost throughput.

pub mod bounded;
mod change;
pub mod crypto;
mod dialect;
mod error;
mod events;
mod group_commit;
mod known_apps;
pub mod metrics;
mod options;
mod page;
mod partition;
mod plan;
pub mod polling;
mod portable;
pub mod postgres;
mod rows;
mod sealing;
mod split;
mod sql;
pub mod sqlite;
mod statement;
mod subscribers;
#[cfg(feature = "testdb")]
pub mod testdb;
mod types;

use std::sync::Arc;

use herald_core::clock::Millis;
use herald_core::id::{
    AppId, AppIdOrUid, AttemptId, EndpointId, EndpointIdOrUid, MessageId, MessageIdOrEventId, TaskId,
};
use herald_core::model::{
    Application, Attempt, AttemptTrigger, BackgroundTask, DeliveryStatus, DisabledReason, Endpoint, EventType, Message,
    OperationalEvent, PreviousSecret, TaskKind, TaskState,
};

/// The storage plumbing this store shares with the inbox's ([`herald_sql`]): its types are part of this
/// crate's own signatures (`StoreOptions`, `StoreError::fault`, `StoreError::Damaged`), so they are handed on here.
pub use herald_sql::{custody, integrity, is_postgres_url};

pub use change::{Change, ChangeStream};
pub use crypto::{CryptoError, SecretCipher};
pub use dialect::SqlStore;
pub use error::{StoreError, StoreResult};
pub use options::StoreOptions;
pub use page::{Page, PageRequest};
pub use partition::{Ownership, OwnershipEvent, PARTITIONS, partition_of};
pub use polling::{
    ConsumerOffset, PollingEndpoint, PollingStore, StreamEntry, StreamPage, StreamSignal, scan as scan_stream,
};
pub use types::*;

herald_sql::bounded_trait! {
/// What the delivery engine needs from the store: the endpoints it sends to, their pending deliveries,
/// the results of its attempts, expiry, the operational webhook's outbox, and the change stream. The
/// engine holds a store as this trait alone; every [`Store`] is one.
pub trait DeliveryStore: [Send + Sync + 'static], bounded in bounded::BoundedStore {
    /// Find an application by id or uid.
    async fn get_app(&self, id_or_uid: &AppIdOrUid) -> StoreResult<Application>;
    /// Find an endpoint by id alone (for the delivery engine).
    async fn get_endpoint_by_id(&self, id: &EndpointId) -> StoreResult<Endpoint>;
    /// The keys an endpoint rotated away from that still sign at `now` (`expires_at > now`), most
    /// recently rotated first. Empty for an unknown endpoint.
    async fn previous_secrets(&self, endpoint_id: &EndpointId, now: Millis) -> StoreResult<Vec<PreviousSecret>>;
    /// What the delivery engine sends each of these endpoints' deliveries with (the endpoint, its
    /// previous keys that still sign at `now`, its application), in a few reads whatever the number; an
    /// endpoint that is gone, or whose application is, is left out.
    async fn sending_records(&self, endpoint_ids: &[EndpointId], now: Millis) -> StoreResult<Vec<SendingRecord>>;
    /// Endpoints that have pending deliveries (read at start-up).
    async fn endpoints_with_pending(&self) -> StoreResult<Vec<EndpointId>>;
    /// Pending deliveries of an endpoint with `seq > after_seq`, in `seq` order.
    async fn load_pending(&self, endpoint_id: &EndpointId, after_seq: i64, limit: usize) -> StoreResult<Vec<PendingDelivery>>;
    /// [`DeliveryStore::load_pending`] for several endpoints at once, each `(endpoint, after_seq)` read
    /// up to `limit`: their deliveries endpoint by endpoint in the order asked, each's in `seq` order.
    async fn load_pending_of(&self, reads: &[(EndpointId, i64)], limit: usize) -> StoreResult<Vec<PendingDelivery>>;
    /// Append attempts and update their deliveries, all in one transaction, with the `message.attempt.*`
    /// operational events they cause (see [`DeliveryStore::unsent_operational_events`]).
    async fn record_attempts(&self, records: &[AttemptRecord]) -> StoreResult<()>;
    /// Mark these deliveries dead without an attempt (their time window ended while they waited), if
    /// they are still pending, each with a `message.attempt.exhausted` operational event
    /// (`reason: "expired"`) in the same transaction.
    async fn expire_deliveries(&self, seqs: &[i64], now: Millis) -> StoreResult<()>;
    /// Mark dead every pending delivery of an endpoint whose time window started before `created_before`
    /// (its message's creation, or when it was re-queued; the endpoint is paused or its breaker open, so
    /// they waited past their window), each with a `message.attempt.exhausted` event as
    /// [`DeliveryStore::expire_deliveries`]; returns how many.
    async fn expire_waiting(&self, endpoint_id: &EndpointId, created_before: Millis, now: Millis) -> StoreResult<u64>;
    /// Pending deliveries of each endpoint and the age of the oldest, in the order asked (an endpoint
    /// that is gone has none).
    async fn endpoint_backlogs(&self, endpoint_ids: &[EndpointId]) -> StoreResult<Vec<Backlog>>;
    /// Disable an endpoint with a reason (stored, and given in the event, as [`DisabledReason::as_str`]'s
    /// text) and record an `endpoint.disabled` operational event, in one transaction. Returns `false` if it
    /// was already disabled or is gone (nothing recorded then).
    async fn disable_endpoint(&self, endpoint_id: &EndpointId, reason: &DisabledReason, now: Millis) -> StoreResult<bool>;
    /// Set an endpoint's disabled flag and reason, but only if its reason is still `expected_reason` and it
    /// was not written since `read_at` (its `updated_at` when the caller read it): an ownership check never
    /// overrides what a client or Herald decided since, nor enables a URL or key it did not check. `true`
    /// if it changed.
    async fn set_endpoint_state(
        &self,
        endpoint_id: &EndpointId,
        expected_reason: &DisabledReason,
        read_at: Millis,
        disabled: bool,
        reason: Option<&DisabledReason>,
        now: Millis,
    ) -> StoreResult<bool>;
    /// Operational events not yet sent to the operational webhook, oldest first, with `seq > after`.
    ///
    /// Every backend records operational events in the same transaction as what they report:
    /// `endpoint.created`, `endpoint.updated` and `endpoint.deleted` in [`Store::create_endpoint`],
    /// [`Store::update_endpoint`] and [`Store::delete_endpoint`]; `endpoint.disabled` in
    /// [`DeliveryStore::disable_endpoint`]; and in [`DeliveryStore::record_attempts`] `message.attempt.failing` (a delivery's
    /// 4th attempt failed), `message.attempt.exhausted` (a delivery ended dead or failed for good) and
    /// `message.attempt.recovered` (a delivery succeeded after one of those two was recorded for the same
    /// message and endpoint); `message.attempt.exhausted` also in [`DeliveryStore::expire_deliveries`] and
    /// [`DeliveryStore::expire_waiting`], and `endpoint.updated` in [`Store::rotate_endpoint_secret`]. Events about a
    /// delivery carry its message and endpoint ids.
    async fn unsent_operational_events(&self, after: i64, limit: usize) -> StoreResult<Vec<OperationalEvent>>;
    /// Mark an operational event as handled by the operational webhook (sent, or given up on).
    async fn mark_operational_event_sent(&self, seq: i64, now: Millis) -> StoreResult<()>;
}
unbounded {
    /// The stream of committed changes the delivery engine acts on ([`Change`]), in commit order: the
    /// deliveries [`Store::ingest`] committed on this node, and every endpoint change, re-queue and
    /// cancellation the store committed (on PostgreSQL, endpoint changes of every node too). It can be
    /// taken once; later calls return `None`.
    fn take_changes(&self) -> Option<ChangeStream>;

    /// The most attempt results one [`DeliveryStore::record_attempts`] call should carry. A store whose
    /// results share the write path with ingest (SQLite's one writer) wants small calls, so that a
    /// message never waits long behind results; one that writes them beside ingest wants large ones,
    /// which spare commits. At least 1.
    fn results_per_call(&self) -> usize;

    /// Which delivery work this node may do, when several nodes share the store; `None` (the default)
    /// means this node does all of it.
    fn ownership(&self) -> Option<Arc<dyn Ownership>> {
        None
    }
}
forwarded {
    fn take_changes(&self) -> Option<ChangeStream> {
        self.inner.take_changes()
    }

    fn results_per_call(&self) -> usize {
        self.inner.results_per_call()
    }

    fn ownership(&self) -> Option<Arc<dyn Ownership>> {
        self.inner.ownership()
    }
}
}

herald_sql::bounded_trait! {
/// Everything Herald keeps. Implemented per backend; every method is safe to call concurrently. On
/// PostgreSQL every `async` call is bounded on the client's side ([`bounded::BoundedStore`]).
pub trait Store: [PollingStore + DeliveryStore + Send + Sync + 'static], bounded in bounded::BoundedStore {
    /// Read a value from the store's own key-value table (e.g. the admin token's hash).
    async fn meta_get(&self, key: &str) -> StoreResult<Option<String>>;
    /// Write a value to the key-value table.
    async fn meta_set(&self, key: &str, value: &str) -> StoreResult<()>;

    /// Create an application; `Conflict("uid")` if its uid is taken.
    async fn create_app(&self, app: &Application) -> StoreResult<()>;
    /// List applications, oldest first.
    async fn list_apps(&self, page: &PageRequest, filter: &AppFilter) -> StoreResult<Page<Application>>;
    /// Replace an application's fields (by id).
    async fn update_app(&self, app: &Application) -> StoreResult<()>;
    /// Delete an application and everything it owns.
    async fn delete_app(&self, id: &AppId) -> StoreResult<()>;

    /// Create an event type; `Conflict("name")` if it exists.
    async fn create_event_type(&self, event_type: &EventType) -> StoreResult<()>;
    /// Find an event type by name.
    async fn get_event_type(&self, name: &str) -> StoreResult<EventType>;
    /// List event types by name (from Z to A when `descending`).
    async fn list_event_types(
        &self,
        page: &PageRequest,
        include_archived: bool,
        descending: bool,
    ) -> StoreResult<Page<EventType>>;
    /// Replace an event type's fields.
    async fn update_event_type(&self, event_type: &EventType) -> StoreResult<()>;
    /// Delete an event type.
    async fn delete_event_type(&self, name: &str) -> StoreResult<()>;

    /// Create an endpoint; `Conflict("uid")` if its uid is taken within the app. Records an
    /// `endpoint.created` operational event in the same transaction.
    ///
    /// Every backend stores the endpoint's `secret` and `headers` encrypted with the store's
    /// [`SecretCipher`] (context: the endpoint id) and decrypts them on every read that returns an
    /// [`Endpoint`].
    async fn create_endpoint(&self, endpoint: &Endpoint) -> StoreResult<()>;
    /// Find an endpoint of an app by id or uid.
    async fn get_endpoint(&self, app_id: &AppId, id_or_uid: &EndpointIdOrUid) -> StoreResult<Endpoint>;
    /// List an app's endpoints, oldest first, or newest first when `newest_first` (Svix's default order).
    async fn list_endpoints(&self, app_id: &AppId, page: &PageRequest, newest_first: bool) -> StoreResult<Page<Endpoint>>;
    /// Every endpoint of an app (for fan-out).
    async fn app_endpoints(&self, app_id: &AppId) -> StoreResult<Vec<Endpoint>>;
    /// Replace an endpoint's fields (by id), except its `secret`: only
    /// [`Store::rotate_endpoint_secret`] changes that, so an update read before a rotation can never undo
    /// it. Records an `endpoint.updated` operational event in the same transaction.
    async fn update_endpoint(&self, endpoint: &Endpoint) -> StoreResult<()>;
    /// Make `new_secret` the endpoint's signing key, in one transaction. The key it replaces keeps signing
    /// until `old_expires_at` (it is not kept at all unless that is after `now`), and every older key
    /// still signing expires no later than that either: a rotation with no grace period (a compromised
    /// key) leaves only the new key. Expired keys are removed. `NotFound` if the endpoint does not exist.
    async fn rotate_endpoint_secret(
        &self,
        endpoint_id: &EndpointId,
        new_secret: &str,
        old_expires_at: Millis,
        now: Millis,
    ) -> StoreResult<()>;
    /// Delete an endpoint and its pending deliveries. Records an `endpoint.deleted` operational event in
    /// the same transaction.
    async fn delete_endpoint(&self, id: &EndpointId) -> StoreResult<()>;

    /// Find a message of an app by id (or event id).
    async fn get_message(&self, app_id: &AppId, id: &MessageIdOrEventId) -> StoreResult<Message>;
    /// List an app's messages, newest first.
    async fn list_messages(
        &self,
        app_id: &AppId,
        filter: &MessageFilter,
        page: &PageRequest,
    ) -> StoreResult<Page<Message>>;

    /// Operational events, oldest first, with `seq > after`.
    async fn list_operational_events(&self, after: i64, limit: usize) -> StoreResult<Vec<OperationalEvent>>;
    /// Operational events, newest first, with `seq < before` (from the newest when `None`).
    async fn list_operational_events_newest(
        &self,
        before: Option<i64>,
        limit: usize,
    ) -> StoreResult<Vec<OperationalEvent>>;
    /// An endpoint's attempts made in `[since, until)`, counted in buckets of `bucket_ms` from `since`,
    /// oldest bucket first; buckets without an attempt are left out.
    async fn attempt_buckets(
        &self,
        endpoint_id: &EndpointId,
        since: Millis,
        until: Millis,
        bucket_ms: i64,
    ) -> StoreResult<Vec<AttemptBucket>>;

    /// Record an application-scoped token (its digest only); `NotFound` if the application does not exist.
    async fn create_app_token(&self, token: &AppToken) -> StoreResult<()>;
    /// The token with this digest, if it exists and has not expired at `now`.
    async fn find_app_token(&self, token_sha256: &str, now: Millis) -> StoreResult<Option<AppToken>>;
    /// Make every token of an application — or, with `sessions`, only those issued for one of these
    /// sessions — expire at `at` at the latest (revocation, with an optional grace period); returns how
    /// many tokens were shortened.
    async fn expire_app_tokens(&self, app_id: &AppId, sessions: Option<&[String]>, at: Millis) -> StoreResult<u64>;
    /// Make the one token with this digest expire at `at` at the latest (a logout); `NotFound` if there is
    /// none.
    async fn expire_app_token(&self, token_sha256: &str, at: Millis) -> StoreResult<()>;

    /// One small retention batch, each part in its own short transaction: delete up to `limit` attempts
    /// created before `attempts_before`; expunge up to `limit` payloads whose expiry is at or before `now`
    /// and that no pending delivery still needs (as [`Store::expunge_payload`]: metadata and attempts stay);
    /// and delete up to `limit` operational events created before `attempts_before` that the operational
    /// webhook has handled (events not yet sent stay, however old). The caller repeats it while a part comes
    /// back full.
    async fn retention_step(&self, attempts_before: Millis, now: Millis, limit: usize) -> StoreResult<RetentionStep>;

    /// Attempts of a message, newest first.
    async fn list_attempts_by_message(
        &self,
        app_id: &AppId,
        message_id: &MessageId,
        filter: &AttemptFilter,
        page: &PageRequest,
    ) -> StoreResult<Page<Attempt>>;
    /// Attempts to an endpoint, newest first.
    async fn list_attempts_by_endpoint(
        &self,
        app_id: &AppId,
        endpoint_id: &EndpointId,
        filter: &AttemptFilter,
        page: &PageRequest,
    ) -> StoreResult<Page<Attempt>>;
    /// The deliveries of a message, one per endpoint it was fanned out to, by endpoint id.
    async fn list_deliveries_of_message(
        &self,
        app_id: &AppId,
        message_id: &MessageId,
        page: &PageRequest,
    ) -> StoreResult<Page<DeliveryView>>;
    /// A delivery's status and attempt count (for tests and operators).
    async fn delivery_state(&self, message_id: &MessageId, endpoint_id: &EndpointId) -> StoreResult<(DeliveryStatus, u32)>;

    /// The response remembered for an idempotency key in `scope`, if it was stored at or after `since`.
    async fn idempotent_response(&self, scope: &str, key: &str, since: Millis) -> StoreResult<Option<Remembered>>;
    /// Remember a response for an idempotency key (the first one stored wins), and forget responses
    /// stored before `expire_before`.
    async fn remember_response(
        &self,
        scope: &str,
        key: &str,
        remembered: &Remembered,
        now: Millis,
        expire_before: Millis,
    ) -> StoreResult<()>;

    /// Send a finished delivery (delivered, failed, dead or cancelled) again: it becomes pending with a new
    /// sequence number (so it sorts after everything the scheduler has read), a fresh retry schedule whose
    /// time window starts `now`, and `trigger` as the reason of its next attempt.
    async fn requeue_delivery(
        &self,
        message_id: &MessageId,
        endpoint_id: &EndpointId,
        trigger: AttemptTrigger,
        now: Millis,
    ) -> StoreResult<Requeue>;
    /// Deliveries of an endpoint that `selection` takes.
    async fn count_selected(&self, selection: &RequeueSelection) -> StoreResult<u64>;
    /// Re-queue up to `limit` of those, lowest `seq` first (as [`Store::requeue_delivery`] with the
    /// selection's trigger), in one transaction. Re-queued deliveries are pending under new `seq`s above
    /// every `through_seq` taken before, so calling again takes the next ones and never the same delivery
    /// twice.
    async fn requeue_selected(&self, selection: &RequeueSelection, limit: usize, now: Millis) -> StoreResult<RequeueChunk>;
    /// The highest delivery `seq` given out so far (0 when none): a bulk re-queue that goes no higher
    /// takes only deliveries that existed when it started.
    async fn last_delivery_seq(&self) -> StoreResult<i64>;
    /// Messages of an app created in `[since, until)`.
    async fn count_messages(&self, app_id: &AppId, since: Millis, until: Millis) -> StoreResult<u64>;
    /// Scan up to `limit` messages of the endpoint's app created in `[since, until)` with an id after
    /// `after` (in id order) and give the endpoint a delivery of every one it subscribes to and has none of
    /// (trigger: recover, window from `now`). Returns (the last id scanned, deliveries created); no id
    /// when the scan is over.
    async fn add_missing_deliveries(
        &self,
        endpoint: &Endpoint,
        since: Millis,
        until: Millis,
        after: Option<&MessageId>,
        limit: usize,
        now: Millis,
    ) -> StoreResult<(Option<MessageId>, u64)>;
    /// Cancel the pending deliveries of a message, of an endpoint, or of one message to one endpoint (at
    /// least one is given), within an app; returns the (endpoint id, seq) of each.
    async fn cancel_pending(
        &self,
        app_id: &AppId,
        message_id: Option<&MessageId>,
        endpoint_id: Option<&EndpointId>,
        now: Millis,
    ) -> StoreResult<Vec<(EndpointId, i64)>>;
    /// Remove a message's payload (it becomes `{}` and is marked expunged); metadata and attempts stay.
    async fn expunge_payload(&self, app_id: &AppId, message_id: &MessageId) -> StoreResult<()>;
    /// Expunge up to `limit` payloads of an app's messages created at or before `before` that still have
    /// theirs, in one transaction, cancelling their pending deliveries (nothing is left to send). Returns
    /// how many were expunged and the (endpoint id, seq) of each delivery cancelled; fewer than `limit`
    /// means none is left.
    async fn expunge_app_payloads(
        &self,
        app_id: &AppId,
        before: Millis,
        limit: usize,
        now: Millis,
    ) -> StoreResult<(u64, Vec<(EndpointId, i64)>)>;
    /// Remove the response body stored with one attempt of a message (it becomes empty).
    async fn expunge_attempt_response(&self, app_id: &AppId, message_id: &MessageId, attempt_id: &AttemptId) -> StoreResult<()>;
    /// Deliveries of an app, newest first, optionally of one endpoint, one status and messages with one tag.
    async fn list_deliveries(
        &self,
        app_id: &AppId,
        endpoint_id: Option<&EndpointId>,
        filter: &DeliveryFilter,
        page: &PageRequest,
    ) -> StoreResult<Page<DeliveryRecord>>;
    /// Deliveries of an endpoint by status, over messages created in `[since, until)`.
    async fn endpoint_stats(&self, endpoint_id: &EndpointId, since: Millis, until: Millis) -> StoreResult<DeliveryStats>;
    /// Record a new background task.
    async fn create_task(&self, task: &BackgroundTask) -> StoreResult<()>;
    /// Update a task's state, progress and data.
    async fn update_task(&self, task: &BackgroundTask) -> StoreResult<()>;
    /// Every task, newest first unless not `newest_first`, optionally in one state and of one kind.
    async fn list_tasks(
        &self,
        state: Option<TaskState>,
        kind: Option<TaskKind>,
        page: &PageRequest,
        newest_first: bool,
    ) -> StoreResult<Page<BackgroundTask>>;
    /// A task by id; `app_id` restricts it to one application.
    async fn get_task(&self, id: &TaskId, app_id: Option<&AppId>) -> StoreResult<BackgroundTask>;
    /// Close the background tasks a stopped process left running — on SQLite every task still running when
    /// a process starts (`starting`), on PostgreSQL, shared by nodes, those that made no progress for a
    /// minute: those whose kind is in `resume` are claimed for the caller to carry on (their `updated_at`
    /// becomes `now`; two callers never claim the same task) and returned, the others are marked failed.
    /// Returns the claimed tasks and how many were failed.
    async fn take_interrupted_tasks(
        &self,
        now: Millis,
        starting: bool,
        resume: &[TaskKind],
    ) -> StoreResult<(Vec<BackgroundTask>, u64)>;

    /// Whether the database answers.
    async fn ping(&self) -> StoreResult<()>;
}
unbounded {
    /// Commit a message and its deliveries durably, deduplicating on event id and idempotency key.
    /// `NotFound` when the application does not exist (e.g. it was deleted a moment ago).
    ///
    /// Bounded by the store itself, not by [`bounded::BoundedStore`]: a message answered with an error
    /// is never committed afterwards. On PostgreSQL its request waits for the group-commit writer to take
    /// it for at most the bound of every call, then (`TimedOut`) it is given back unwritten; once taken,
    /// it waits for its batch, which the writer gives up after the same bound. A batch that finds the
    /// message's application row held by another transaction (an endpoint write, the application being
    /// deleted) defers the message instead of waiting: it is queued again — and may be given back as
    /// before — until the row is free.
    async fn ingest(&self, new: NewMessage) -> StoreResult<Ingested>;
    /// [`Store::ingest`] for many messages at once, answered per message in the order given. They are
    /// queued at the group-commit writer in that order, so they share its commits and are created in
    /// that order (one ordering key's messages keep it); should a commit fail, or a message's wait run
    /// out before the writer took it, none of the messages queued after it is written either (each is
    /// answered with an error), so what was stored is always a prefix of each ordering key's messages.
    async fn ingest_many(&self, batch: Vec<NewMessage>) -> StoreResult<Vec<StoreResult<Ingested>>>;

    /// The node is stopping: hand over whatever this node holds for others (PostgreSQL: its partition
    /// leases, so that other nodes take its work over at once instead of after the lease time).
    async fn shutdown(&self) {}

}
forwarded {
    async fn ingest(&self, new: NewMessage) -> StoreResult<Ingested> {
        self.inner.ingest(new).await
    }

    async fn ingest_many(&self, batch: Vec<NewMessage>) -> StoreResult<Vec<StoreResult<Ingested>>> {
        self.inner.ingest_many(batch).await
    }

    async fn shutdown(&self) {
        self.shutdown_within().await;
    }

}
}

/// A shared handle to any store.
pub type SharedStore = Arc<dyn Store>;

/// A shared handle to a store as the delivery engine sees it (any [`SharedStore`] converts into one).
pub type SharedDeliveryStore = Arc<dyn DeliveryStore>;

/// Open the store named by a database URL (`sqlite://PATH` or `postgres://…`) with these options, run
/// its migrations, and check that `cipher` holds the key its secrets were encrypted with (`SecretKey`
/// error otherwise); secrets stored before encryption existed are encrypted then.
pub async fn open_with(database_url: &str, cipher: SecretCipher, options: &StoreOptions) -> StoreResult<SharedStore> {
    if database_url.starts_with("sqlite:") {
        integrity::check(database_url, options.sqlite_check).await?;
        Ok(Arc::new(sqlite::SqliteStore::open(database_url, cipher).await?))
    } else if is_postgres_url(database_url) {
        let store = postgres::PgStore::open(database_url, cipher, options).await?;
        let bound = store.bound();
        Ok(Arc::new(bounded::BoundedStore::new(Arc::new(store), bound)))
    } else {
        Err(StoreError::Corrupt(format!(
            "unsupported database URL {database_url:?}: expected sqlite://PATH or postgres://…"
        )))
    }
}

/// Run the migrations of the database at `database_url` and nothing else (`herald migrate`).
pub async fn migrate(database_url: &str) -> StoreResult<()> {
    if database_url.starts_with("sqlite:") {
        integrity::check(database_url, integrity::SqliteCheck::Basic).await?;
        sqlite::migrate(database_url).await
    } else if is_postgres_url(database_url) {
        postgres::migrate(database_url).await
    } else {
        Err(StoreError::Corrupt(format!(
            "unsupported database URL {database_url:?}: expected sqlite://PATH or postgres://…"
        )))
    }
}
