//! The PostgreSQL store: the same contract as SQLite, for production and for many nodes on one database.
//!
//! - Custody: ingest goes through the shared group-commit writer ([`crate::group_commit`]); a batch is one
//!   transaction, committed (and so durable, with PostgreSQL's default `synchronous_commit`) before any
//!   of its requests is answered.
//! - Order: ingest transactions hold one advisory lock from their first insert to their commit, so
//!   delivery `seq`s and message ids follow commit order across nodes (see [`bulk`]).
//! - Scale-out: delivery work is split into [`crate::PARTITIONS`] partitions owned through leases
//!   ([`lease`]); every write an owner makes is fenced on its lease's epoch.
//! - History: attempts are partitioned by day and old days are dropped whole ([`retention`]).

mod bulk;
mod events;
mod lease;
mod operations;
mod retention;
mod secrets;
mod tenancy;
pub mod text;

use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_core::model::{
    Application, Attempt, AttemptTrigger, BackgroundTask, DeliveryStatus, Endpoint, EventType, Message,
    OperationalEvent, PreviousSecret,
};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, PgPool, Row};
use tokio::sync::{mpsc, oneshot};

use self::text::{escape, escape_opt};
use crate::crypto::SecretCipher;
use crate::events::NewEvent;
use crate::group_commit::{self, IngestJob};
use crate::sql::{keyset, limit, limit_plus_one, map_constraint};
use crate::{
    AppToken, AttemptFilter, AttemptRecord, Backlog, CommitFeed, DeliveryRecord, DeliveryStats, DeliveryView, Ingested,
    MessageFilter, NewMessage, Ownership, Page, PageRequest, PendingDelivery, Requeue, RetentionStep, Store,
    StoreError, StoreOptions, StoreResult, rows,
};

/// The channel notified with an endpoint's id when it changes, so that its owner — maybe another node —
/// reloads it.
const ENDPOINT_CHANNEL: &str = "herald_endpoint";

/// How many ingest requests may wait for the writer before callers queue on the channel itself.
const INGEST_QUEUE: usize = 1_024;
/// Connections per node: the ingest writer, the result writer, the lease keeper, API reads.
const POOL_SIZE: u32 = 16;
/// How long a request waits for a connection before it fails (503) — short, so that while the database
/// is unreachable clients hear so quickly instead of piling up.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// The PostgreSQL implementation of [`Store`].
pub struct PgStore {
    pool: PgPool,
    ingest: mpsc::Sender<IngestJob>,
    feed: Mutex<Option<CommitFeed>>,
    leases: Arc<lease::Leases>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    cipher: SecretCipher,
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // The lease keeper and the watcher hold the pool; without this they would outlive the store.
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn connect(url: &str) -> StoreResult<PgPool> {
    let options = PgConnectOptions::from_str(url)?.application_name("herald");
    Ok(PgPoolOptions::new()
        .max_connections(POOL_SIZE)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options)
        .await?)
}

/// Run the migrations and return (`herald migrate`).
pub async fn migrate(url: &str) -> StoreResult<()> {
    let pool = connect(url).await?;
    sqlx::migrate!("./migrations/postgres").run(&pool).await?;
    pool.close().await;
    Ok(())
}

impl PgStore {
    /// Connect, run migrations, check the secret key (and encrypt secrets stored before encryption),
    /// create the attempt partitions ahead, join the cluster (take this node's share of the delivery
    /// partitions) and start the group-commit writer.
    pub async fn open(url: &str, cipher: SecretCipher, options: &StoreOptions) -> StoreResult<Self> {
        let pool = connect(url).await?;
        // sqlx's migrator takes an advisory lock, so nodes starting together migrate once.
        sqlx::migrate!("./migrations/postgres").run(&pool).await?;
        secrets::prepare(&pool, &cipher).await?;
        retention::maintain(&pool, options.attempt_retention).await?;
        let (leases, lease_tasks) = lease::start(pool.clone(), options).await?;
        let (ingest, jobs) = mpsc::channel(INGEST_QUEUE);
        let (feed_tx, feed_rx) = mpsc::unbounded_channel();
        let writer = bulk::PgBatches {
            node_id: leases.node_id().to_owned(),
        };
        tokio::spawn(group_commit::run(pool.clone(), writer, jobs, feed_tx));
        let mut tasks = lease_tasks;
        tasks.push(tokio::spawn(retention::run(pool.clone(), options.attempt_retention)));
        Ok(Self {
            pool,
            ingest,
            feed: Mutex::new(Some(feed_rx)),
            leases,
            tasks,
            cipher,
        })
    }

    /// This node's id in the `node` table.
    pub fn node_id(&self) -> &str {
        self.leases.node_id()
    }
}

// Every string a client can put in a path, a query or a body is bound escaped (see [`text`]): values
// that could never contain NUL are unchanged by it, and a NUL in a lookup then finds nothing, as on
// SQLite, instead of failing the statement.

/// Numbered placeholders (`$1`, `$2`, …) for queries assembled piece by piece.
#[derive(Default)]
struct Marks(usize);

impl Marks {
    fn next(&mut self) -> String {
        self.0 += 1;
        format!("${}", self.0)
    }
}

fn one_changed(result: sqlx::postgres::PgQueryResult) -> StoreResult<()> {
    if result.rows_affected() == 0 {
        Err(StoreError::NotFound)
    } else {
        Ok(())
    }
}

fn decode_all<T>(rows: &[PgRow], decode: fn(&PgRow) -> StoreResult<T>) -> StoreResult<Vec<T>> {
    rows.iter().map(decode).collect()
}

fn status_of(code: i64) -> StoreResult<DeliveryStatus> {
    DeliveryStatus::from_code(code).ok_or_else(|| StoreError::Corrupt(format!("delivery status {code}")))
}

fn count(value: i64) -> u32 {
    u32::try_from(value).unwrap_or(0)
}

fn decode_all_with<T>(rows: &[PgRow], decode: impl Fn(&PgRow) -> StoreResult<T>) -> StoreResult<Vec<T>> {
    rows.iter().map(decode).collect()
}

/// Bind an endpoint's changeable fields, in the order both `create_endpoint` and `update_endpoint` use:
/// uid, url, description, filter_types, channels, disabled, disabled_reason, rate_limit,
/// max_concurrency, ordering, request_timeout_ms, version, metadata, headers (sealed), updated_at.
fn bind_endpoint_fields<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ep: &'q Endpoint,
    cipher: &SecretCipher,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    query
        .bind(&ep.uid)
        .bind(&ep.url)
        .bind(escape(&ep.description))
        .bind(rows::encode_list(&ep.filter_types))
        .bind(rows::encode_list(&ep.channels))
        .bind(ep.disabled)
        .bind(escape_opt(ep.disabled_reason.as_deref()))
        .bind(ep.rate_limit.map(i64::from))
        .bind(ep.max_concurrency.map(i64::from))
        .bind(ep.ordering.as_str())
        .bind(ep.request_timeout_ms.map(i64::from))
        .bind(i64::from(ep.version))
        .bind(rows::encode_metadata(&ep.metadata))
        .bind(crate::sealing::seal_headers(cipher, &ep.id, &ep.headers))
        .bind(ep.updated_at)
}

#[async_trait::async_trait]
impl Store for PgStore {
    async fn meta_get(&self, key: &str) -> StoreResult<Option<String>> {
        Ok(sqlx::query_scalar("SELECT value FROM meta WHERE key = $1")
            .bind(key)
            .fetch_optional(&self.pool)
            .await?)
    }

    async fn meta_set(&self, key: &str, value: &str) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        )
        .bind(key)
        .bind(escape(value))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn create_app(&self, app: &Application) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO application (id, uid, name, rate_limit, metadata, created_at, updated_at, \
             verify_endpoints, payload_retention_period) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(&app.id)
        .bind(&app.uid)
        .bind(escape(&app.name))
        .bind(app.rate_limit.map(i64::from))
        .bind(rows::encode_metadata(&app.metadata))
        .bind(app.created_at)
        .bind(app.updated_at)
        .bind(app.verify_endpoints)
        .bind(app.payload_retention_days.map(i64::from))
        .execute(&self.pool)
        .await
        .map_err(map_constraint)?;
        Ok(())
    }

    async fn get_app(&self, id_or_uid: &str) -> StoreResult<Application> {
        let row = sqlx::query("SELECT * FROM application WHERE id = $1 OR uid = $1 LIMIT 1")
            .bind(escape(id_or_uid))
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::NotFound)?;
        rows::application(&row)
    }

    async fn list_apps(&self, page: &PageRequest) -> StoreResult<Page<Application>> {
        let (condition, order) = keyset("id", page, false, "$1");
        let limit_mark = if page.after.is_some() { "$2" } else { "$1" };
        let sql = format!("SELECT * FROM application WHERE {condition} {order} LIMIT {limit_mark}");
        let mut query = sqlx::query(AssertSqlSafe(sql));
        if let Some(after) = &page.after {
            query = query.bind(escape(after));
        }
        let found = query.bind(limit_plus_one(page)).fetch_all(&self.pool).await?;
        Ok(Page::assemble(decode_all(&found, rows::application)?, page, |a| {
            a.id.clone()
        }))
    }

    async fn update_app(&self, app: &Application) -> StoreResult<()> {
        let result = sqlx::query(
            "UPDATE application SET uid = $1, name = $2, rate_limit = $3, metadata = $4, updated_at = $5, \
             verify_endpoints = $7, payload_retention_period = $8 WHERE id = $6",
        )
        .bind(&app.uid)
        .bind(escape(&app.name))
        .bind(app.rate_limit.map(i64::from))
        .bind(rows::encode_metadata(&app.metadata))
        .bind(app.updated_at)
        .bind(&app.id)
        .bind(app.verify_endpoints)
        .bind(app.payload_retention_days.map(i64::from))
        .execute(&self.pool)
        .await
        .map_err(map_constraint)?;
        one_changed(result)
    }

    async fn delete_app(&self, id: &str) -> StoreResult<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM attempt WHERE app_id = $1")
            .bind(escape(id))
            .execute(&mut *tx)
            .await?;
        let result = sqlx::query("DELETE FROM application WHERE id = $1")
            .bind(escape(id))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        one_changed(result)
    }

    async fn create_event_type(&self, et: &EventType) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO event_type (name, description, archived, deprecated, feature_flag, schemas, created_at, \
             updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&et.name)
        .bind(escape(&et.description))
        .bind(et.archived)
        .bind(et.deprecated)
        .bind(escape_opt(et.feature_flag.as_deref()))
        .bind(escape_opt(et.schemas.as_deref()))
        .bind(et.created_at)
        .bind(et.updated_at)
        .execute(&self.pool)
        .await
        .map_err(map_constraint)?;
        Ok(())
    }

    async fn get_event_type(&self, name: &str) -> StoreResult<EventType> {
        let row = sqlx::query("SELECT * FROM event_type WHERE name = $1")
            .bind(escape(name))
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::NotFound)?;
        rows::event_type(&row)
    }

    async fn list_event_types(&self, page: &PageRequest, include_archived: bool) -> StoreResult<Page<EventType>> {
        let (condition, order) = keyset("name", page, false, "$1");
        let limit_mark = if page.after.is_some() { "$2" } else { "$1" };
        let archived = if include_archived { "" } else { "AND NOT archived" };
        let sql = format!("SELECT * FROM event_type WHERE {condition} {archived} {order} LIMIT {limit_mark}");
        let mut query = sqlx::query(AssertSqlSafe(sql));
        if let Some(after) = &page.after {
            query = query.bind(escape(after));
        }
        let found = query.bind(limit_plus_one(page)).fetch_all(&self.pool).await?;
        Ok(Page::assemble(decode_all(&found, rows::event_type)?, page, |e| {
            e.name.clone()
        }))
    }

    async fn update_event_type(&self, et: &EventType) -> StoreResult<()> {
        let result = sqlx::query(
            "UPDATE event_type SET description = $1, archived = $2, deprecated = $3, feature_flag = $4, \
             schemas = $5, updated_at = $6 WHERE name = $7",
        )
        .bind(escape(&et.description))
        .bind(et.archived)
        .bind(et.deprecated)
        .bind(escape_opt(et.feature_flag.as_deref()))
        .bind(escape_opt(et.schemas.as_deref()))
        .bind(et.updated_at)
        .bind(&et.name)
        .execute(&self.pool)
        .await?;
        one_changed(result)
    }

    async fn delete_event_type(&self, name: &str) -> StoreResult<()> {
        one_changed(
            sqlx::query("DELETE FROM event_type WHERE name = $1")
                .bind(escape(name))
                .execute(&self.pool)
                .await?,
        )
    }

    async fn create_endpoint(&self, ep: &Endpoint) -> StoreResult<()> {
        let sql = "INSERT INTO endpoint (id, app_id, created_at, uid, url, description, filter_types, channels, \
                   disabled, disabled_reason, rate_limit, max_concurrency, ordering, request_timeout_ms, version, \
                   metadata, headers, updated_at, secret) \
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)";
        let query = sqlx::query(sql).bind(&ep.id).bind(&ep.app_id).bind(ep.created_at);
        let mut tx = self.pool.begin().await?;
        bind_endpoint_fields(query, ep, &self.cipher)
            .bind(crate::sealing::seal_secret(&self.cipher, &ep.id, &ep.secret))
            .execute(&mut *tx)
            .await
            .map_err(map_constraint)?;
        let event = NewEvent::endpoint(
            crate::events::ENDPOINT_CREATED,
            ep,
            serde_json::json!({}),
            ep.created_at,
        );
        events::record(&mut tx, &[event]).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get_endpoint(&self, app_id: &str, id_or_uid: &str) -> StoreResult<Endpoint> {
        let row = sqlx::query("SELECT * FROM endpoint WHERE app_id = $1 AND (id = $2 OR uid = $2) LIMIT 1")
            .bind(escape(app_id))
            .bind(escape(id_or_uid))
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::NotFound)?;
        rows::endpoint(&row, Some(&self.cipher))
    }

    async fn get_endpoint_by_id(&self, id: &str) -> StoreResult<Endpoint> {
        let row = sqlx::query("SELECT * FROM endpoint WHERE id = $1")
            .bind(escape(id))
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::NotFound)?;
        rows::endpoint(&row, Some(&self.cipher))
    }

    async fn list_endpoints(&self, app_id: &str, page: &PageRequest) -> StoreResult<Page<Endpoint>> {
        let (condition, order) = keyset("id", page, false, "$2");
        let limit_mark = if page.after.is_some() { "$3" } else { "$2" };
        let sql = format!("SELECT * FROM endpoint WHERE app_id = $1 AND {condition} {order} LIMIT {limit_mark}");
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(escape(app_id));
        if let Some(after) = &page.after {
            query = query.bind(escape(after));
        }
        let found = query.bind(limit_plus_one(page)).fetch_all(&self.pool).await?;
        Ok(Page::assemble(
            decode_all_with(&found, |row| rows::endpoint(row, Some(&self.cipher)))?,
            page,
            |e| e.id.clone(),
        ))
    }

    async fn app_endpoints(&self, app_id: &str) -> StoreResult<Vec<Endpoint>> {
        let found = sqlx::query("SELECT * FROM endpoint WHERE app_id = $1 ORDER BY id")
            .bind(escape(app_id))
            .fetch_all(&self.pool)
            .await?;
        decode_all_with(&found, |row| rows::endpoint(row, Some(&self.cipher)))
    }

    async fn update_endpoint(&self, ep: &Endpoint) -> StoreResult<()> {
        let sql = "UPDATE endpoint SET uid = $1, url = $2, description = $3, filter_types = $4, channels = $5, \
                   disabled = $6, disabled_reason = $7, rate_limit = $8, max_concurrency = $9, ordering = $10, \
                   request_timeout_ms = $11, version = $12, metadata = $13, headers = $14, updated_at = $15 \
                   WHERE id = $16";
        let query = bind_endpoint_fields(sqlx::query(sql), ep, &self.cipher).bind(&ep.id);
        let mut tx = self.pool.begin().await?;
        one_changed(query.execute(&mut *tx).await.map_err(map_constraint)?)?;
        let event = NewEvent::endpoint(
            crate::events::ENDPOINT_UPDATED,
            ep,
            serde_json::json!({}),
            ep.updated_at,
        );
        events::record(&mut tx, &[event]).await?;
        tx.commit().await?;
        self.announce_endpoint_change(&ep.id).await;
        Ok(())
    }

    async fn rotate_endpoint_secret(
        &self,
        endpoint_id: &str,
        new_secret: &str,
        old_expires_at: i64,
        now: i64,
    ) -> StoreResult<()> {
        secrets::rotate(&self.pool, &self.cipher, endpoint_id, new_secret, old_expires_at, now).await?;
        self.announce_endpoint_change(endpoint_id).await;
        Ok(())
    }

    async fn previous_secrets(&self, endpoint_id: &str, now: i64) -> StoreResult<Vec<PreviousSecret>> {
        secrets::previous(&self.pool, &self.cipher, endpoint_id, now).await
    }

    async fn delete_endpoint(&self, id: &str) -> StoreResult<()> {
        let mut tx = self.pool.begin().await?;
        let deleted = sqlx::query("DELETE FROM endpoint WHERE id = $1 RETURNING *")
            .bind(escape(id))
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let endpoint = rows::endpoint(&deleted, Some(&self.cipher))?;
        let now = herald_core::clock::now_ms();
        let event = NewEvent::endpoint(crate::events::ENDPOINT_DELETED, &endpoint, serde_json::json!({}), now);
        events::record(&mut tx, &[event]).await?;
        tx.commit().await?;
        self.announce_endpoint_change(id).await;
        Ok(())
    }

    async fn ingest(&self, new: NewMessage) -> StoreResult<Ingested> {
        let (reply, answer) = oneshot::channel();
        self.ingest
            .send(IngestJob { new, reply })
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    async fn get_message(&self, app_id: &str, id: &str) -> StoreResult<Message> {
        let sql = format!(
            "SELECT {} FROM message m WHERE m.app_id = $1 AND (m.id = $2 OR m.event_id = $2) LIMIT 1",
            rows::MESSAGE_COLUMNS
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(escape(app_id))
            .bind(escape(id))
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::NotFound)?;
        rows::message(&row)
    }

    async fn list_messages(
        &self,
        app_id: &str,
        filter: &MessageFilter,
        page: &PageRequest,
    ) -> StoreResult<Page<Message>> {
        let mut marks = Marks::default();
        let app_mark = marks.next();
        let anchor = if page.after.is_some() {
            marks.next()
        } else {
            String::new()
        };
        let (condition, order) = keyset("m.id", page, !filter.oldest_first, &anchor);
        let mut sql = format!(
            "SELECT {} FROM message m WHERE m.app_id = {app_mark} AND {condition}",
            rows::MESSAGE_COLUMNS
        );
        if filter.since.is_some() {
            sql.push_str(&format!(" AND m.created_at >= {}", marks.next()));
        }
        if filter.until.is_some() {
            sql.push_str(&format!(" AND m.created_at < {}", marks.next()));
        }
        if filter.event_types.is_some() {
            sql.push_str(&format!(" AND m.event_type = ANY({})", marks.next()));
        }
        if filter.channel.is_some() {
            sql.push_str(&format!(
                " AND EXISTS (SELECT 1 FROM jsonb_array_elements_text(m.channels::jsonb) c WHERE c = {})",
                marks.next()
            ));
        }
        sql.push_str(&format!(" {order} LIMIT {}", marks.next()));
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(escape(app_id));
        if let Some(after) = &page.after {
            query = query.bind(escape(after));
        }
        if let Some(since) = filter.since {
            query = query.bind(since);
        }
        if let Some(until) = filter.until {
            query = query.bind(until);
        }
        if let Some(types) = &filter.event_types {
            query = query.bind(types);
        }
        if let Some(channel) = &filter.channel {
            query = query.bind(channel);
        }
        let found = query.bind(limit_plus_one(page)).fetch_all(&self.pool).await?;
        Ok(Page::assemble(decode_all(&found, rows::message)?, page, |m| {
            m.id.clone()
        }))
    }

    async fn endpoints_with_pending(&self) -> StoreResult<Vec<String>> {
        Ok(
            sqlx::query_scalar("SELECT DISTINCT endpoint_id FROM delivery WHERE status = 0")
                .fetch_all(&self.pool)
                .await?,
        )
    }

    async fn load_pending(
        &self,
        endpoint_id: &str,
        after_seq: i64,
        limit_n: usize,
    ) -> StoreResult<Vec<PendingDelivery>> {
        let sql = format!(
            "SELECT d.seq, d.endpoint_id, d.attempts, d.next_attempt_at, d.next_trigger, \
             COALESCE(d.window_start, m.created_at) AS window_start, {} FROM delivery d \
             JOIN message m ON m.id = d.message_id \
             WHERE d.endpoint_id = $1 AND d.status = 0 AND d.seq > $2 ORDER BY d.seq LIMIT $3",
            rows::MESSAGE_COLUMNS
        );
        let found = sqlx::query(AssertSqlSafe(sql))
            .bind(escape(endpoint_id))
            .bind(after_seq)
            .bind(limit(limit_n))
            .fetch_all(&self.pool)
            .await?;
        found
            .iter()
            .map(|row| {
                Ok(PendingDelivery {
                    seq: row.try_get("seq")?,
                    endpoint_id: row.try_get("endpoint_id")?,
                    message: Arc::new(rows::message(row)?),
                    attempts: count(row.try_get("attempts")?),
                    next_attempt_at: row.try_get("next_attempt_at")?,
                    window_start: row.try_get("window_start")?,
                    trigger: AttemptTrigger::from_code(row.try_get("next_trigger")?),
                })
            })
            .collect()
    }

    async fn record_attempts(&self, records: &[AttemptRecord]) -> StoreResult<()> {
        bulk::write_results(&self.pool, &self.leases, records).await
    }

    async fn expire_deliveries(&self, seqs: &[i64], now: i64) -> StoreResult<()> {
        let mut tx = self.pool.begin().await?;
        let held = self.leases.fence(&mut tx).await?;
        let sql = format!(
            "{} AND d.seq = ANY($1) AND d.partition = ANY($2) FOR UPDATE OF d",
            crate::events::EXPIRING
        );
        let found = sqlx::query(AssertSqlSafe(sql))
            .bind(seqs)
            .bind(&held)
            .fetch_all(&mut *tx)
            .await?;
        settle_expired(&mut tx, &decode_all(&found, rows::expired)?, now).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn expire_waiting(&self, endpoint_id: &str, created_before: i64, now: i64) -> StoreResult<u64> {
        // The head of the pending index, one short transaction per pass (see `EXPIRY_SCAN`). A re-queued
        // delivery's window starts when it was re-queued, not when its message was created.
        let sql = format!(
            "{} FOR UPDATE OF d",
            crate::events::expiring_head("$1", "$1", "$3", "$2")
        );
        let mut total = 0;
        loop {
            let mut tx = self.pool.begin().await?;
            let held = self.leases.fence(&mut tx).await?;
            if !held.contains(&crate::partition_of(endpoint_id)) {
                // Another node owns the endpoint now; it settles its deliveries.
                return Ok(total);
            }
            let found = sqlx::query(AssertSqlSafe(sql.as_str()))
                .bind(escape(endpoint_id))
                .bind(created_before)
                .bind(crate::events::EXPIRY_SCAN)
                .fetch_all(&mut *tx)
                .await?;
            let expiring = decode_all(&found, rows::expired)?;
            settle_expired(&mut tx, &expiring, now).await?;
            tx.commit().await?;
            if expiring.is_empty() {
                return Ok(total);
            }
            total += expiring.len() as u64;
        }
    }

    async fn endpoint_backlog(&self, endpoint_id: &str) -> StoreResult<Backlog> {
        let row = sqlx::query(AssertSqlSafe(crate::sql::backlog_query("$1", "$1")))
            .bind(escape(endpoint_id))
            .fetch_one(&self.pool)
            .await?;
        Ok(Backlog::from_count(row.try_get("pending")?, row.try_get("oldest")?))
    }

    async fn disable_endpoint(&self, endpoint_id: &str, reason: &str, now: i64) -> StoreResult<bool> {
        let mut tx = self.pool.begin().await?;
        let app_id: Option<String> = sqlx::query_scalar(
            "UPDATE endpoint SET disabled = true, disabled_reason = $1, updated_at = $2 \
             WHERE id = $3 AND NOT disabled RETURNING app_id",
        )
        .bind(escape(reason))
        .bind(now)
        .bind(escape(endpoint_id))
        .fetch_optional(&mut *tx)
        .await?;
        let Some(app_id) = app_id else {
            return Ok(false);
        };
        let event = NewEvent::about_endpoint(
            crate::events::ENDPOINT_DISABLED,
            &app_id,
            endpoint_id,
            None,
            serde_json::json!({ "reason": reason, "trigger": "automatic" }),
            now,
        );
        events::record(&mut tx, &[event]).await?;
        tx.commit().await?;
        self.announce_endpoint_change(endpoint_id).await;
        Ok(true)
    }

    async fn list_operational_events(&self, after: i64, limit_n: usize) -> StoreResult<Vec<OperationalEvent>> {
        let found = sqlx::query("SELECT * FROM operational_event WHERE seq > $1 ORDER BY seq LIMIT $2")
            .bind(after)
            .bind(limit(limit_n))
            .fetch_all(&self.pool)
            .await?;
        decode_all(&found, rows::operational_event)
    }

    async fn list_attempts_by_message(
        &self,
        app_id: &str,
        message_id: &str,
        filter: &AttemptFilter,
        page: &PageRequest,
    ) -> StoreResult<Page<Attempt>> {
        self.list_attempts("message_id", app_id, message_id, filter, page).await
    }

    async fn list_attempts_by_endpoint(
        &self,
        app_id: &str,
        endpoint_id: &str,
        filter: &AttemptFilter,
        page: &PageRequest,
    ) -> StoreResult<Page<Attempt>> {
        self.list_attempts("endpoint_id", app_id, endpoint_id, filter, page)
            .await
    }

    async fn requeue_delivery(
        &self,
        message_id: &str,
        endpoint_id: &str,
        trigger: AttemptTrigger,
        now: i64,
    ) -> StoreResult<Requeue> {
        operations::requeue_delivery(&self.pool, message_id, endpoint_id, trigger, now).await
    }

    async fn count_failed(&self, endpoint_id: &str, since: i64, until: i64) -> StoreResult<u64> {
        operations::count_failed(&self.pool, endpoint_id, since, until).await
    }

    async fn requeue_failed(
        &self,
        endpoint_id: &str,
        since: i64,
        until: i64,
        limit_n: usize,
        now: i64,
    ) -> StoreResult<u64> {
        operations::requeue_failed(&self.pool, endpoint_id, since, until, limit_n, now).await
    }

    async fn count_messages(&self, app_id: &str, since: i64, until: i64) -> StoreResult<u64> {
        operations::count_messages(&self.pool, app_id, since, until).await
    }

    async fn add_missing_deliveries(
        &self,
        endpoint: &Endpoint,
        since: i64,
        until: i64,
        after: Option<&str>,
        limit_n: usize,
        now: i64,
    ) -> StoreResult<(Option<String>, u64)> {
        operations::add_missing_deliveries(&self.pool, endpoint, since, until, after, limit_n, now).await
    }

    async fn cancel_pending(
        &self,
        app_id: &str,
        message_id: Option<&str>,
        endpoint_id: Option<&str>,
        now: i64,
    ) -> StoreResult<Vec<(String, i64)>> {
        operations::cancel_pending(&self.pool, app_id, message_id, endpoint_id, now).await
    }

    async fn expunge_payload(&self, app_id: &str, message_id: &str) -> StoreResult<()> {
        operations::expunge_payload(&self.pool, app_id, message_id).await
    }

    async fn list_deliveries(
        &self,
        app_id: &str,
        endpoint_id: Option<&str>,
        status: Option<DeliveryStatus>,
        page: &PageRequest,
    ) -> StoreResult<Page<DeliveryRecord>> {
        operations::list_deliveries(&self.pool, app_id, endpoint_id, status, page).await
    }

    async fn endpoint_stats(&self, endpoint_id: &str, since: i64, until: i64) -> StoreResult<DeliveryStats> {
        operations::endpoint_stats(&self.pool, endpoint_id, since, until).await
    }

    async fn create_task(&self, task: &BackgroundTask) -> StoreResult<()> {
        operations::create_task(&self.pool, task).await
    }

    async fn update_task(&self, task: &BackgroundTask) -> StoreResult<()> {
        operations::update_task(&self.pool, task).await
    }

    async fn get_task(&self, id: &str, app_id: Option<&str>) -> StoreResult<BackgroundTask> {
        operations::get_task(&self.pool, id, app_id).await
    }

    async fn fail_interrupted_tasks(&self, now: i64) -> StoreResult<u64> {
        operations::fail_interrupted_tasks(&self.pool, now).await
    }

    async fn unsent_operational_events(&self, after: i64, limit_n: usize) -> StoreResult<Vec<OperationalEvent>> {
        events::unsent(&self.pool, after, limit_n).await
    }

    async fn mark_operational_event_sent(&self, seq: i64, now: i64) -> StoreResult<()> {
        events::mark_sent(&self.pool, seq, now).await
    }

    async fn create_app_token(&self, token: &AppToken) -> StoreResult<()> {
        tenancy::create(&self.pool, token).await
    }

    async fn find_app_token(&self, token_sha256: &str, now: i64) -> StoreResult<Option<AppToken>> {
        tenancy::find(&self.pool, token_sha256, now).await
    }

    async fn expire_app_tokens(&self, app_id: &str, at: i64) -> StoreResult<u64> {
        tenancy::expire(&self.pool, app_id, at).await
    }

    async fn retention_step(&self, attempts_before: i64, now: i64, limit_n: usize) -> StoreResult<RetentionStep> {
        tenancy::retention_step(&self.pool, attempts_before, now, limit_n).await
    }

    async fn set_endpoint_state(
        &self,
        endpoint_id: &str,
        expected_reason: &str,
        disabled: bool,
        reason: Option<&str>,
        now: i64,
    ) -> StoreResult<bool> {
        let changed =
            operations::set_endpoint_state(&self.pool, endpoint_id, expected_reason, disabled, reason, now).await?;
        if changed {
            self.announce_endpoint_change(endpoint_id).await;
        }
        Ok(changed)
    }

    async fn list_deliveries_of_message(
        &self,
        app_id: &str,
        message_id: &str,
        page: &PageRequest,
    ) -> StoreResult<Page<DeliveryView>> {
        let (condition, order) = keyset("e.id", page, false, "$3");
        let limit_mark = if page.after.is_some() { "$4" } else { "$3" };
        let sql = format!(
            "SELECT e.*, d.status AS d_status, d.attempts AS d_attempts, d.next_attempt_at AS d_next, \
             d.updated_at AS d_updated FROM delivery d JOIN endpoint e ON e.id = d.endpoint_id \
             WHERE d.message_id = $1 AND e.app_id = $2 AND {condition} {order} LIMIT {limit_mark}"
        );
        let mut query = sqlx::query(AssertSqlSafe(sql))
            .bind(escape(message_id))
            .bind(escape(app_id));
        if let Some(after) = &page.after {
            query = query.bind(escape(after));
        }
        let found = query.bind(limit_plus_one(page)).fetch_all(&self.pool).await?;
        let views = found
            .iter()
            .map(|row| {
                Ok(DeliveryView {
                    endpoint: rows::endpoint(row, Some(&self.cipher))?,
                    status: status_of(row.try_get("d_status")?)?,
                    attempts: count(row.try_get("d_attempts")?),
                    next_attempt_at: row.try_get("d_next")?,
                    updated_at: row.try_get("d_updated")?,
                })
            })
            .collect::<StoreResult<Vec<_>>>()?;
        Ok(Page::assemble(views, page, |v| v.endpoint.id.clone()))
    }

    async fn delivery_state(&self, message_id: &str, endpoint_id: &str) -> StoreResult<(DeliveryStatus, u32)> {
        let row = sqlx::query("SELECT status, attempts FROM delivery WHERE message_id = $1 AND endpoint_id = $2")
            .bind(escape(message_id))
            .bind(escape(endpoint_id))
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::NotFound)?;
        Ok((status_of(row.try_get("status")?)?, count(row.try_get("attempts")?)))
    }

    fn take_commit_feed(&self) -> Option<CommitFeed> {
        self.feed.lock().ok()?.take()
    }

    async fn idempotent_response(&self, scope: &str, key: &str, since: i64) -> StoreResult<Option<(u16, Vec<u8>)>> {
        let row =
            sqlx::query("SELECT status, body FROM idempotency WHERE scope = $1 AND key = $2 AND created_at >= $3")
                .bind(scope)
                .bind(key)
                .bind(since)
                .fetch_optional(&self.pool)
                .await?;
        row.map(|row| {
            let status: i64 = row.try_get("status")?;
            let status = u16::try_from(status).map_err(|_| StoreError::Corrupt(format!("stored status {status}")))?;
            Ok((status, row.try_get("body")?))
        })
        .transpose()
    }

    async fn remember_response(
        &self,
        scope: &str,
        key: &str,
        status: u16,
        body: &[u8],
        now: i64,
        expire_before: i64,
    ) -> StoreResult<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM idempotency WHERE created_at < $1")
            .bind(expire_before)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO idempotency (scope, key, status, body, created_at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (scope, key) DO NOTHING",
        )
        .bind(scope)
        .bind(key)
        .bind(i64::from(status))
        .bind(body)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    fn ownership(&self) -> Option<Arc<dyn Ownership>> {
        Some(self.leases.clone())
    }

    async fn shutdown(&self) {
        for task in &self.tasks {
            task.abort();
        }
        if let Err(error) = self.leases.leave(&self.pool).await {
            tracing::warn!(%error, "releasing partition leases at shutdown failed; they expire instead");
        }
    }
}

impl PgStore {
    /// Tell every node (the endpoint's owner among them) that an endpoint changed. Best effort: the
    /// change is committed already, and an owner that misses it reloads the endpoint when it takes it over.
    async fn announce_endpoint_change(&self, endpoint_id: &str) {
        let result = sqlx::query("SELECT pg_notify($1, $2)")
            .bind(ENDPOINT_CHANNEL)
            .bind(escape(endpoint_id))
            .execute(&self.pool)
            .await;
        if let Err(error) = result {
            tracing::warn!(%error, endpoint = endpoint_id, "announcing an endpoint change failed");
        }
    }

    /// Attempts filtered on one column (`message_id` or `endpoint_id`) and `filter`, newest first.
    async fn list_attempts(
        &self,
        column: &'static str,
        app_id: &str,
        value: &str,
        filter: &AttemptFilter,
        page: &PageRequest,
    ) -> StoreResult<Page<Attempt>> {
        let (condition, order) = keyset("id", page, true, "$3");
        let class = filter.status_code_class.map(i64::from);
        // Every filter is bound (NULL when absent), so the placeholders never move.
        let sql = format!(
            "SELECT * FROM attempt WHERE app_id = $1 AND {column} = $2 AND ($3::text IS NULL OR {condition}) \
             AND ($4::boolean IS NULL OR success = $4) \
             AND ($5::bigint IS NULL OR ($5 = 0 AND COALESCE(response_status, 0) = 0) \
                  OR ($5 <> 0 AND response_status >= $5 AND response_status < $5 + 100)) \
             AND ($6::text[] IS NULL OR message_id IN (SELECT id FROM message WHERE app_id = $1 AND event_type = ANY($6))) \
             AND ($7::bigint IS NULL OR created_at < $7) AND ($8::bigint IS NULL OR created_at >= $8) \
             {order} LIMIT $9"
        );
        let found = sqlx::query(AssertSqlSafe(sql))
            .bind(escape(app_id))
            .bind(escape(value))
            .bind(page.after.as_deref().map(escape))
            .bind(filter.success)
            .bind(class)
            .bind(filter.event_types.as_deref())
            .bind(filter.before)
            .bind(filter.after)
            .bind(limit_plus_one(page))
            .fetch_all(&self.pool)
            .await?;
        Ok(Page::assemble(decode_all(&found, rows::attempt)?, page, |a| {
            a.id.clone()
        }))
    }
}

/// Mark these pending deliveries (locked by the caller) dead, with the `message.attempt.exhausted` event of
/// each, inside the caller's transaction.
async fn settle_expired(tx: &mut sqlx::PgConnection, expiring: &[crate::events::Expired], now: i64) -> StoreResult<()> {
    let seqs: Vec<i64> = expiring.iter().map(|e| e.seq).collect();
    sqlx::query("UPDATE delivery SET status = $1, updated_at = $2 WHERE status = 0 AND seq = ANY($3)")
        .bind(DeliveryStatus::Dead.code())
        .bind(now)
        .bind(&seqs)
        .execute(&mut *tx)
        .await?;
    events::record(&mut *tx, &crate::events::expired_events(expiring, now)).await
}
