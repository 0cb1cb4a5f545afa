//! What the SQLite and the PostgreSQL inbox share: the statements, the row decoding, what an outcome
//! writes, the multi-statement operations (deduplicating insert, fenced record, the version guard's mark)
//! and the [`InboxStore`] implementation itself.
//!
//! The statements are written once: both drivers accept numbered placeholders (`$1`, `$2`, …; sqlx's
//! SQLite driver binds `$N` to the N-th argument, even when it is used twice), and the schemas use the
//! same names and representations (times as integer milliseconds, headers as JSON text, bodies as bytes).
//! A backend supplies the connection glue ([`Db`], implemented below for both connection types) and its
//! pools and write paths ([`Backend`]); everything else lives here.

use std::ops::DerefMut;

use async_trait::async_trait;
use bytes::Bytes;
use herald_core::clock::Millis;
use herald_core::id::InboxEventId;
use sqlx::{AssertSqlSafe, Row, SqlSafeStr, SqlStr};

use super::{
    Forwarding, InboxStore, Inserted, ListQuery, NewEvent, Outcome, Status, StoreError, StoreResult, StoredEvent,
};

/// The table each backend's migrator records the inbox's migrations in. Not sqlx's default
/// (`_sqlx_migrations`): the inbox may share a database with the sender (`herald serve --inbox` on one
/// PostgreSQL URL), whose migrations are recorded there with their own version numbers; one table for
/// both would make each migrator see the other's versions as unknown or modified, and refuse to start.
pub(super) const MIGRATIONS_TABLE: &str = "_herald_inbox_migrations";

/// The migrator of one backend's folder, recording in [`MIGRATIONS_TABLE`].
pub(super) fn migrator(mut migrator: sqlx::migrate::Migrator) -> sqlx::migrate::Migrator {
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator
}

/// A bind parameter. Text is escaped by the PostgreSQL glue (its `text` cannot hold NUL, and event ids,
/// resource keys and versions come from the network) and left as is on SQLite.
#[derive(Debug)]
pub(super) enum Param {
    Text(String),
    OptText(Option<String>),
    Int(i64),
    OptInt(Option<i64>),
    Bytes(Bytes),
}

impl From<&str> for Param {
    fn from(value: &str) -> Self {
        Param::Text(value.to_owned())
    }
}

impl From<&String> for Param {
    fn from(value: &String) -> Self {
        Param::Text(value.clone())
    }
}

impl From<String> for Param {
    fn from(value: String) -> Self {
        Param::Text(value)
    }
}

impl From<Option<String>> for Param {
    fn from(value: Option<String>) -> Self {
        Param::OptText(value)
    }
}

impl From<&Option<String>> for Param {
    fn from(value: &Option<String>) -> Self {
        Param::OptText(value.clone())
    }
}

impl From<&InboxEventId> for Param {
    fn from(value: &InboxEventId) -> Self {
        Param::Text(value.as_str().to_owned())
    }
}

impl From<i64> for Param {
    fn from(value: i64) -> Self {
        Param::Int(value)
    }
}

// A moment is stored as integer Unix milliseconds on both dialects.
impl From<Millis> for Param {
    fn from(value: Millis) -> Self {
        Param::Int(value.as_unix_ms())
    }
}

impl From<Option<Millis>> for Param {
    fn from(value: Option<Millis>) -> Self {
        Param::OptInt(value.map(Millis::as_unix_ms))
    }
}

impl From<Option<i64>> for Param {
    fn from(value: Option<i64>) -> Self {
        Param::OptInt(value)
    }
}

impl From<Bytes> for Param {
    fn from(value: Bytes) -> Self {
        Param::Bytes(value)
    }
}

/// `params![a, b, …]`: a statement's parameters, `$1` first.
macro_rules! params {
    ($($value:expr),* $(,)?) => {
        vec![$(Param::from($value)),*]
    };
}

/// The statements' text, which both backends run as is.
mod statement {
    pub(super) const INSERT: &str = "INSERT INTO inbox_event (id, source, event_id, headers, body, received_at, \
        status, attempts, next_attempt_at, last_error, resource_key, version, replays, updated_at) \
        VALUES ($1, $2, $3, $4, $5, $6, $7, 0, $6, $8, $9, $10, 0, $6) \
        ON CONFLICT (source, event_id) DO NOTHING RETURNING id";
    pub(super) const ORIGINAL: &str = "SELECT id FROM inbox_event WHERE source = $1 AND event_id = $2";
    pub(super) const DUE: &str = "SELECT * FROM inbox_event WHERE status = 'pending' AND next_attempt_at <= $1 \
        ORDER BY next_attempt_at, id LIMIT $2";
    pub(super) const NEXT_DUE: &str =
        "SELECT MIN(next_attempt_at) FROM inbox_event WHERE status = 'pending' AND next_attempt_at > $1";
    pub(super) const NEWEST: &str = "SELECT version FROM inbox_version WHERE source = $1 AND resource_key = $2";
    pub(super) const GET: &str = "SELECT * FROM inbox_event WHERE id = $1";
    /// Fenced: only a pending event whose replay count is still the one the forward started from.
    pub(super) const RECORD: &str = "UPDATE inbox_event SET status = $1, attempts = $2, \
        next_attempt_at = COALESCE($3, next_attempt_at), last_error = $4, updated_at = $5 \
        WHERE id = $6 AND replays = $7 AND status = 'pending' RETURNING source";
    pub(super) const FIRST_MARK: &str = "INSERT INTO inbox_version (source, resource_key, version, inbox_id, \
        updated_at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (source, resource_key) DO NOTHING";
    /// Compare and set: moves the mark only if it is still the version the caller compared against.
    pub(super) const MOVE_MARK: &str = "UPDATE inbox_version SET version = $3, inbox_id = $4, updated_at = $5 \
        WHERE source = $1 AND resource_key = $2 AND version = $6";
    pub(super) const REPLAY: &str = "UPDATE inbox_event SET status = 'pending', attempts = 0, next_attempt_at = $1, \
        last_error = NULL, replays = replays + 1, updated_at = $1 WHERE id = $2";
    /// Counted up to a cap (see `PENDING_COUNT_CAP`): the walk of a huge backlog stays bounded.
    pub(super) const PENDING_COUNT: &str = "SELECT COUNT(*) FROM (SELECT 1 FROM inbox_event \
        WHERE status = 'pending' AND source = $1 LIMIT $2) AS capped";
    pub(super) const OLDEST_PENDING: &str =
        "SELECT MIN(received_at) FROM inbox_event WHERE status = 'pending' AND source = $1";
    /// The health check's write while writes fail (see `write_health`).
    pub(super) const PROBE: &str = "INSERT INTO inbox_health_probe (id, probed_at) VALUES (1, $1) \
        ON CONFLICT (id) DO UPDATE SET probed_at = excluded.probed_at";
    pub(super) const REPLAY_WINDOW: &str = "UPDATE inbox_event SET status = 'pending', attempts = 0, \
        next_attempt_at = $1, last_error = NULL, replays = replays + 1, updated_at = $1 \
        WHERE source = $2 AND received_at >= $3 AND received_at < $4";
}

fn fixed(sql: &'static str) -> SqlStr {
    sql.into_sql_str()
}

/// The statements of one connection, whatever the backend: run a statement with its parameters and read
/// what it returns.
#[async_trait]
pub(super) trait Db: Send {
    /// Run a statement; how many rows it changed.
    async fn execute(&mut self, sql: SqlStr, params: Vec<Param>) -> StoreResult<u64>;
    /// The first column of the first row, as text; `None` without a row or for NULL.
    async fn text(&mut self, sql: SqlStr, params: Vec<Param>) -> StoreResult<Option<String>>;
    /// The first column of the first row, as an integer; `None` without a row or for NULL.
    async fn int(&mut self, sql: SqlStr, params: Vec<Param>) -> StoreResult<Option<i64>>;
    /// Every row, decoded as an event.
    async fn events(&mut self, sql: SqlStr, params: Vec<Param>) -> StoreResult<Vec<StoredEvent>>;
}

/// Typed column reads, implemented by each backend's row type (text unescaped on PostgreSQL).
trait Columns {
    fn text(&self, column: &str) -> StoreResult<String>;
    fn opt_text(&self, column: &str) -> StoreResult<Option<String>>;
    fn int(&self, column: &str) -> StoreResult<i64>;
    fn bytes(&self, column: &str) -> StoreResult<Vec<u8>>;
}

/// [`Db`] for a connection type and [`Columns`] for its row type; `$store` is how text is bound,
/// `$load` how it is read back.
macro_rules! impl_db {
    ($conn:ty, $database:ty, $row:ty, $store:expr, $load:expr) => {
        impl Columns for $row {
            fn text(&self, column: &str) -> StoreResult<String> {
                Ok($load(self.try_get::<String, _>(column)?))
            }
            fn opt_text(&self, column: &str) -> StoreResult<Option<String>> {
                Ok(self.try_get::<Option<String>, _>(column)?.map($load))
            }
            fn int(&self, column: &str) -> StoreResult<i64> {
                Ok(self.try_get(column)?)
            }
            fn bytes(&self, column: &str) -> StoreResult<Vec<u8>> {
                Ok(self.try_get(column)?)
            }
        }

        impl BindAll for sqlx::query::Query<'static, $database, <$database as sqlx::Database>::Arguments> {
            fn bind_all(self, params: Vec<Param>) -> Self {
                params.into_iter().fold(self, |query, param| match param {
                    Param::Text(text) => query.bind($store(&text).into_owned()),
                    Param::OptText(text) => query.bind(text.map(|text| $store(&text).into_owned())),
                    Param::Int(n) => query.bind(n),
                    Param::OptInt(n) => query.bind(n),
                    Param::Bytes(bytes) => query.bind(bytes.to_vec()),
                })
            }
        }

        #[async_trait]
        impl Db for $conn {
            async fn execute(&mut self, sql: SqlStr, params: Vec<Param>) -> StoreResult<u64> {
                let query = sqlx::query::<$database>(sql).bind_all(params);
                Ok(query.execute(&mut *self).await?.rows_affected())
            }

            async fn text(&mut self, sql: SqlStr, params: Vec<Param>) -> StoreResult<Option<String>> {
                let query = sqlx::query::<$database>(sql).bind_all(params);
                let row = query.fetch_optional(&mut *self).await?;
                Ok(match row {
                    Some(row) => row.try_get::<Option<String>, _>(0)?.map($load),
                    None => None,
                })
            }

            async fn int(&mut self, sql: SqlStr, params: Vec<Param>) -> StoreResult<Option<i64>> {
                let query = sqlx::query::<$database>(sql).bind_all(params);
                let row = query.fetch_optional(&mut *self).await?;
                Ok(match row {
                    Some(row) => row.try_get::<Option<i64>, _>(0)?,
                    None => None,
                })
            }

            async fn events(&mut self, sql: SqlStr, params: Vec<Param>) -> StoreResult<Vec<StoredEvent>> {
                let query = sqlx::query::<$database>(sql).bind_all(params);
                query.fetch_all(&mut *self).await?.iter().map(decode).collect()
            }
        }
    };
}

/// Binding a list of [`Param`]s, per backend.
trait BindAll {
    fn bind_all(self, params: Vec<Param>) -> Self;
}

fn as_is(text: &str) -> std::borrow::Cow<'_, str> {
    std::borrow::Cow::Borrowed(text)
}

impl_db!(
    sqlx::SqliteConnection,
    sqlx::Sqlite,
    sqlx::sqlite::SqliteRow,
    as_is,
    std::convert::identity
);
impl_db!(
    sqlx::PgConnection,
    sqlx::Postgres,
    sqlx::postgres::PgRow,
    herald_sql::text::escape,
    herald_sql::text::unescape
);

fn decode(row: &impl Columns) -> StoreResult<StoredEvent> {
    let headers =
        serde_json::from_str(&row.text("headers")?).map_err(|e| StoreError::Corrupt(format!("headers: {e}")))?;
    let attempts = row.int("attempts")?;
    Ok(StoredEvent {
        id: event_id(row.text("id")?)?,
        source: row.text("source")?,
        event_id: row.text("event_id")?,
        headers,
        body: Bytes::from(row.bytes("body")?),
        received_at: Millis::from_unix_ms(row.int("received_at")?),
        status: row.text("status")?.parse()?,
        attempts: u32::try_from(attempts).map_err(|_| StoreError::Corrupt(format!("attempts {attempts}")))?,
        next_attempt_at: Millis::from_unix_ms(row.int("next_attempt_at")?),
        last_error: row.opt_text("last_error")?,
        resource_key: row.opt_text("resource_key")?,
        version: row.opt_text("version")?,
        replays: row.int("replays")?,
        updated_at: Millis::from_unix_ms(row.int("updated_at")?),
    })
}

/// An event's id as read back from the store: one this inbox made, or the row is corrupt (never passed on
/// to a forward or an admin answer as if it were an id).
fn event_id(text: String) -> StoreResult<InboxEventId> {
    InboxEventId::try_from(text).map_err(|e| StoreError::Corrupt(format!("event id: {e}")))
}

fn clamp(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// Store one event unless its `(source, event_id)` is stored already; for a duplicate, answer with the
/// original's id. Runs in the caller's transaction (SQLite's group commit) or as two autocommitted
/// statements (PostgreSQL).
///
/// On PostgreSQL a concurrent insert of the same key makes `ON CONFLICT DO NOTHING` wait for the other
/// transaction; when that commits, nothing is inserted and the lookup — a new statement, so a new
/// snapshot — sees the original.
pub(super) async fn insert_one(db: &mut impl Db, event: &NewEvent, received_at: Millis) -> StoreResult<Inserted> {
    let id = InboxEventId::new();
    let headers = serde_json::to_string(&event.headers).map_err(|e| StoreError::Corrupt(format!("headers: {e}")))?;
    let params = params![
        &id,
        &event.source,
        &event.event_id,
        headers,
        event.body.clone(),
        received_at,
        event.status.as_str(),
        &event.last_error,
        &event.resource_key,
        &event.version,
    ];
    if let Some(id) = db.text(fixed(statement::INSERT), params).await? {
        return Ok(Inserted {
            id: event_id(id)?,
            duplicate: false,
        });
    }
    // Already stored (earlier, or earlier in this very batch): answer with the original's id.
    let original = db
        .text(fixed(statement::ORIGINAL), params![&event.source, &event.event_id])
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("event {:?} conflicts but cannot be found", event.event_id)))?;
    Ok(Inserted {
        id: event_id(original)?,
        duplicate: true,
    })
}

/// A forwarding outcome to record (see [`InboxStore::record`]).
#[derive(Debug, Clone)]
pub(super) struct Record {
    pub(super) id: InboxEventId,
    pub(super) replays: i64,
    pub(super) attempts: u32,
    pub(super) outcome: Outcome,
    pub(super) now: Millis,
}

/// What an outcome writes: the new status, the next attempt time (kept when `None`) and the error.
fn columns(outcome: &Outcome) -> (Status, Option<Millis>, Option<String>) {
    match outcome {
        Outcome::Forwarded { .. } => (Status::Forwarded, None, None),
        Outcome::Retry { next_attempt_at, error } => (Status::Pending, Some(*next_attempt_at), Some(error.clone())),
        Outcome::Dead { error } => (Status::Dead, None, Some(error.clone())),
        Outcome::Stale { reason } => (Status::Stale, None, Some(reason.clone())),
    }
}

/// Apply one outcome unless the event was replayed meanwhile or is no longer pending; a successful
/// forward with the guard on moves its resource's mark forward. Must run in a transaction.
pub(super) async fn record_one(db: &mut impl Db, record: &Record) -> StoreResult<bool> {
    let (status, next_attempt_at, error) = columns(&record.outcome);
    let params = params![
        status.as_str(),
        i64::from(record.attempts),
        next_attempt_at,
        error,
        record.now,
        &record.id,
        record.replays,
    ];
    let Some(source) = db.text(fixed(statement::RECORD), params).await? else {
        return Ok(false);
    };
    if let Outcome::Forwarded {
        guard: Some((resource_key, version)),
    } = &record.outcome
    {
        advance_mark(db, &source, resource_key, version, record).await?;
    }
    Ok(true)
}

/// How often [`advance_mark`] re-reads a mark that changed under it before giving up.
const MARK_ROUNDS: usize = 16;

/// Make `version` the newest forwarded for the resource, unless a newer (or equal) one is already there:
/// a replayed older version is forwarded but must not lower the mark.
///
/// The comparison is [`crate::version::is_newer`], which SQL cannot express, so the mark is read, compared
/// here, and written back with a compare-and-set. One forwarder never records two outcomes of a resource
/// at once, but on PostgreSQL another process may share the database: the compare-and-set keeps an older
/// version from overwriting a newer one that was committed in between.
async fn advance_mark(
    db: &mut impl Db,
    source: &str,
    resource_key: &str,
    version: &str,
    record: &Record,
) -> StoreResult<()> {
    for _ in 0..MARK_ROUNDS {
        let first = params![source, resource_key, version, &record.id, record.now];
        if db.execute(fixed(statement::FIRST_MARK), first).await? == 1 {
            return Ok(());
        }
        let Some(newest) = db.text(fixed(statement::NEWEST), params![source, resource_key]).await? else {
            continue;
        };
        if !crate::version::is_newer(version, &newest) {
            return Ok(());
        }
        let moved = params![source, resource_key, version, &record.id, record.now, newest];
        if db.execute(fixed(statement::MOVE_MARK), moved).await? == 1 {
            return Ok(());
        }
    }
    Err(StoreError::Contended(format!("{source}/{resource_key}")))
}

/// A backend: its pools and its two write paths. [`InboxStore`] is implemented once, below, for every
/// backend.
#[async_trait]
pub(super) trait Backend: Send + Sync + 'static {
    /// Its connection type.
    type Connection: Db;
    /// A connection taken from one of its pools.
    type Pooled: DerefMut<Target = Self::Connection> + Send;

    /// A connection for reads.
    async fn read(&self) -> StoreResult<Self::Pooled>;
    /// A connection for replays.
    async fn write(&self) -> StoreResult<Self::Pooled>;
    /// [`InboxStore::insert`]: durably committed before it returns.
    async fn insert_event(&self, event: NewEvent) -> StoreResult<Inserted>;
    /// [`InboxStore::record`].
    async fn record_outcome(&self, record: Record) -> StoreResult<bool>;
    /// [`InboxStore::forwarding`].
    fn forwarding(&self) -> Forwarding;
    /// The outcome of the last group commit, for backends that commit in groups (SQLite); its health
    /// check probes with a write while it failed.
    fn write_health(&self) -> Option<&herald_sql::custody::WriteHealth> {
        None
    }
}

#[async_trait]
impl<B: Backend> InboxStore for B {
    async fn insert(&self, event: NewEvent) -> StoreResult<Inserted> {
        self.insert_event(event).await
    }

    async fn due(&self, now: Millis, limit: usize) -> StoreResult<Vec<StoredEvent>> {
        let mut conn = self.read().await?;
        conn.events(fixed(statement::DUE), params![now, clamp(limit)]).await
    }

    async fn next_due_after(&self, now: Millis) -> StoreResult<Option<Millis>> {
        let mut conn = self.read().await?;
        Ok(conn
            .int(fixed(statement::NEXT_DUE), params![now])
            .await?
            .map(Millis::from_unix_ms))
    }

    async fn newest_version(&self, source: &str, resource_key: &str) -> StoreResult<Option<String>> {
        let mut conn = self.read().await?;
        conn.text(fixed(statement::NEWEST), params![source, resource_key]).await
    }

    async fn record(
        &self,
        id: &InboxEventId,
        replays: i64,
        attempts: u32,
        outcome: &Outcome,
        now: Millis,
    ) -> StoreResult<bool> {
        let record = Record {
            id: id.clone(),
            replays,
            attempts,
            outcome: outcome.clone(),
            now,
        };
        self.record_outcome(record).await
    }

    async fn get(&self, id: &InboxEventId) -> StoreResult<Option<StoredEvent>> {
        let mut conn = self.read().await?;
        Ok(conn.events(fixed(statement::GET), params![id]).await?.pop())
    }

    async fn list(&self, query: &ListQuery) -> StoreResult<Vec<StoredEvent>> {
        let mut conditions = vec!["1 = 1".to_owned()];
        let mut params = Vec::new();
        let mut filter = |condition: &str, param: Param| {
            params.push(param);
            conditions.push(format!("{condition} ${}", params.len()));
        };
        if let Some(source) = &query.source {
            filter("source =", Param::from(source));
        }
        if let Some(status) = query.status {
            filter("status =", Param::from(status.as_str()));
        }
        if let Some(before) = &query.before {
            filter("id <", Param::from(before));
        }
        params.push(Param::from(clamp(query.limit).saturating_add(1)));
        let sql = format!(
            "SELECT * FROM inbox_event WHERE {} ORDER BY id DESC LIMIT ${}",
            conditions.join(" AND "),
            params.len()
        );
        let mut conn = self.read().await?;
        // Only fixed fragments are concatenated; every value is bound.
        conn.events(AssertSqlSafe(sql).into_sql_str(), params).await
    }

    async fn replay(&self, id: &InboxEventId, now: Millis) -> StoreResult<bool> {
        let mut conn = self.write().await?;
        Ok(conn.execute(fixed(statement::REPLAY), params![now, id]).await? == 1)
    }

    async fn replay_window(&self, source: &str, since: Millis, until: Millis, now: Millis) -> StoreResult<u64> {
        let mut conn = self.write().await?;
        conn.execute(fixed(statement::REPLAY_WINDOW), params![now, source, since, until])
            .await
    }

    async fn pending_of(&self, source: &str) -> StoreResult<super::Pending> {
        let mut conn = self.read().await?;
        let cap = i64::try_from(super::Pending::COUNT_CAP).unwrap_or(i64::MAX);
        let count = conn
            .int(fixed(statement::PENDING_COUNT), params![source, cap.saturating_add(1)])
            .await?
            .unwrap_or(0);
        let oldest_received_at = conn
            .int(fixed(statement::OLDEST_PENDING), params![source])
            .await?
            .map(Millis::from_unix_ms);
        let count = u64::try_from(count).unwrap_or(0);
        Ok(super::Pending {
            count: count.min(super::Pending::COUNT_CAP),
            capped: count > super::Pending::COUNT_CAP,
            oldest_received_at,
        })
    }

    async fn ping(&self) -> StoreResult<()> {
        let mut conn = self.read().await?;
        conn.execute(fixed("SELECT 1"), Vec::new()).await?;
        drop(conn);
        let Some(health) = self.write_health() else {
            return Ok(());
        };
        let probe = async {
            let mut conn = self.write().await?;
            let now = herald_core::clock::now();
            conn.execute(fixed(statement::PROBE), params![now]).await.map(drop)
        };
        health.recheck(probe, StoreError::fault, StoreError::FileCorrupt).await
    }

    fn forwarding(&self) -> Forwarding {
        Backend::forwarding(self)
    }
}
