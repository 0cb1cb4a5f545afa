//! The SQLite store: one file, WAL mode, `synchronous=FULL` (every commit is fsynced, so an acknowledged
//! message survives `kill -9` and a power cut), one writer connection and a pool of readers.

mod bulk;
mod events;
mod operations;
mod retention;
mod secrets;
mod tenancy;

use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

use herald_core::model::{
    Application, Attempt, AttemptTrigger, BackgroundTask, DeliveryStatus, Endpoint, EventType, Message,
    OperationalEvent, PreviousSecret,
};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous};
use sqlx::{Acquire, AssertSqlSafe, Row, SqlitePool};
use tokio::sync::{mpsc, oneshot};

use crate::crypto::SecretCipher;
use crate::group_commit::{self, IngestJob};
use crate::sql::{keyset as keyset_with, limit, limit_plus_one, map_constraint};
use crate::{
    AppToken, AttemptFilter, AttemptRecord, Backlog, CommitFeed, DeliveryRecord, DeliveryStats, DeliveryView, Ingested,
    MessageFilter, NewMessage, Page, PageRequest, PendingDelivery, Requeue, RetentionStep, Store, StoreError,
    StoreResult, rows,
};
use events::NewEvent;

/// How many ingest requests may wait for the writer before callers queue on the channel itself.
const INGEST_QUEUE: usize = 1_024;

/// The SQLite implementation of [`Store`].
pub struct SqliteStore {
    read: SqlitePool,
    write: SqlitePool,
    ingest: mpsc::Sender<IngestJob>,
    feed: Mutex<Option<CommitFeed>>,
    cipher: SecretCipher,
}

impl SqliteStore {
    /// Open (creating if needed) the database at `url` (`sqlite://PATH`), run migrations, check the secret
    /// key (and encrypt secrets stored before encryption) and start the group-commit writer.
    pub async fn open(url: &str, cipher: SecretCipher) -> StoreResult<Self> {
        let (base, write) = migrated(url).await?;
        secrets::prepare(&write, &cipher).await?;
        let read = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(base.read_only(true))
            .await?;
        let (ingest, jobs) = mpsc::channel(INGEST_QUEUE);
        let (feed_tx, feed_rx) = mpsc::unbounded_channel();
        tokio::spawn(group_commit::run(write.clone(), bulk::SqliteBatches, jobs, feed_tx));
        Ok(Self {
            read,
            write,
            ingest,
            feed: Mutex::new(Some(feed_rx)),
            cipher,
        })
    }
}

/// Open (creating if needed) the database at `url` and run its migrations: its connection options and
/// the writer pool.
async fn migrated(url: &str) -> StoreResult<(SqliteConnectOptions, SqlitePool)> {
    let base = SqliteConnectOptions::from_str(url)?
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true)
        .busy_timeout(Duration::from_secs(10));
    let write = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(base.clone().create_if_missing(true))
        .await?;
    sqlx::migrate!("./migrations/sqlite").run(&write).await?;
    Ok((base, write))
}

/// Run the migrations of the database at `url` (creating it if needed) and nothing else: no key is
/// needed (secrets stored in plain text are encrypted by the next [`SqliteStore::open`]).
pub async fn migrate(url: &str) -> StoreResult<()> {
    let (_, write) = migrated(url).await?;
    write.close().await;
    Ok(())
}

/// Bind an endpoint's changeable fields, in the column order both `create_endpoint` and
/// `update_endpoint` use: uid, url, description, filter_types, channels, disabled, disabled_reason,
/// rate_limit, max_concurrency, ordering, request_timeout_ms, version, metadata, headers (sealed),
/// updated_at.
fn bind_endpoint_fields<'q>(
    query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
    ep: &'q Endpoint,
    cipher: &SecretCipher,
) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments> {
    query
        .bind(&ep.uid)
        .bind(&ep.url)
        .bind(&ep.description)
        .bind(rows::encode_list(&ep.filter_types))
        .bind(rows::encode_list(&ep.channels))
        .bind(ep.disabled)
        .bind(&ep.disabled_reason)
        .bind(ep.rate_limit.map(i64::from))
        .bind(ep.max_concurrency.map(i64::from))
        .bind(ep.ordering.as_str())
        .bind(ep.request_timeout_ms.map(i64::from))
        .bind(ep.version)
        .bind(rows::encode_metadata(&ep.metadata))
        .bind(crate::sealing::seal_headers(cipher, &ep.id, &ep.headers))
        .bind(ep.updated_at)
}

fn one_changed(result: sqlx::sqlite::SqliteQueryResult) -> StoreResult<()> {
    if result.rows_affected() == 0 {
        Err(StoreError::NotFound)
    } else {
        Ok(())
    }
}

/// The keyset condition and order for a page over `column`, with SQLite's placeholder.
fn keyset(column: &str, page: &PageRequest, newest_first: bool) -> (String, String) {
    keyset_with(column, page, newest_first, "?")
}

fn decode_all<T>(rows: &[SqliteRow], decode: fn(&SqliteRow) -> StoreResult<T>) -> StoreResult<Vec<T>> {
    rows.iter().map(decode).collect()
}

fn decode_all_with<T>(rows: &[SqliteRow], decode: impl Fn(&SqliteRow) -> StoreResult<T>) -> StoreResult<Vec<T>> {
    rows.iter().map(decode).collect()
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn meta_get(&self, key: &str) -> StoreResult<Option<String>> {
        Ok(sqlx::query_scalar("SELECT value FROM meta WHERE key = ?")
            .bind(key)
            .fetch_optional(&self.read)
            .await?)
    }

    async fn meta_set(&self, key: &str, value: &str) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        )
        .bind(key)
        .bind(value)
        .execute(&self.write)
        .await?;
        Ok(())
    }

    async fn create_app(&self, app: &Application) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO application (id, uid, name, rate_limit, metadata, created_at, updated_at, verify_endpoints, \
             payload_retention_period) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&app.id)
        .bind(&app.uid)
        .bind(&app.name)
        .bind(app.rate_limit.map(i64::from))
        .bind(rows::encode_metadata(&app.metadata))
        .bind(app.created_at)
        .bind(app.updated_at)
        .bind(app.verify_endpoints)
        .bind(app.payload_retention_days.map(i64::from))
        .execute(&self.write)
        .await
        .map_err(map_constraint)?;
        Ok(())
    }

    async fn get_app(&self, id_or_uid: &str) -> StoreResult<Application> {
        let row = sqlx::query("SELECT * FROM application WHERE id = ? OR uid = ? LIMIT 1")
            .bind(id_or_uid)
            .bind(id_or_uid)
            .fetch_optional(&self.read)
            .await?
            .ok_or(StoreError::NotFound)?;
        rows::application(&row)
    }

    async fn list_apps(&self, page: &PageRequest) -> StoreResult<Page<Application>> {
        let (condition, order) = keyset("id", page, false);
        let sql = format!("SELECT * FROM application WHERE {condition} {order} LIMIT ?");
        let mut query = sqlx::query(AssertSqlSafe(sql));
        if let Some(after) = &page.after {
            query = query.bind(after);
        }
        let found = query.bind(limit_plus_one(page)).fetch_all(&self.read).await?;
        Ok(Page::assemble(decode_all(&found, rows::application)?, page, |a| {
            a.id.clone()
        }))
    }

    async fn update_app(&self, app: &Application) -> StoreResult<()> {
        let result = sqlx::query(
            "UPDATE application SET uid = ?, name = ?, rate_limit = ?, metadata = ?, updated_at = ?, verify_endpoints = ?, \
             payload_retention_period = ? WHERE id = ?",
        )
        .bind(&app.uid)
        .bind(&app.name)
        .bind(app.rate_limit.map(i64::from))
        .bind(rows::encode_metadata(&app.metadata))
        .bind(app.updated_at)
        .bind(app.verify_endpoints)
        .bind(app.payload_retention_days.map(i64::from))
        .bind(&app.id)
        .execute(&self.write)
        .await
        .map_err(map_constraint)?;
        one_changed(result)
    }

    async fn delete_app(&self, id: &str) -> StoreResult<()> {
        let mut tx = self.write.begin().await?;
        sqlx::query("DELETE FROM attempt WHERE app_id = ?")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let result = sqlx::query("DELETE FROM application WHERE id = ?")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        one_changed(result)
    }

    async fn create_event_type(&self, et: &EventType) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO event_type (name, description, archived, deprecated, feature_flag, schemas, created_at, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&et.name)
        .bind(&et.description)
        .bind(et.archived)
        .bind(et.deprecated)
        .bind(&et.feature_flag)
        .bind(&et.schemas)
        .bind(et.created_at)
        .bind(et.updated_at)
        .execute(&self.write)
        .await
        .map_err(map_constraint)?;
        Ok(())
    }

    async fn get_event_type(&self, name: &str) -> StoreResult<EventType> {
        let row = sqlx::query("SELECT * FROM event_type WHERE name = ?")
            .bind(name)
            .fetch_optional(&self.read)
            .await?
            .ok_or(StoreError::NotFound)?;
        rows::event_type(&row)
    }

    async fn list_event_types(&self, page: &PageRequest, include_archived: bool) -> StoreResult<Page<EventType>> {
        let (condition, order) = keyset("name", page, false);
        let archived = if include_archived { "" } else { "AND archived = 0" };
        let sql = format!("SELECT * FROM event_type WHERE {condition} {archived} {order} LIMIT ?");
        let mut query = sqlx::query(AssertSqlSafe(sql));
        if let Some(after) = &page.after {
            query = query.bind(after);
        }
        let found = query.bind(limit_plus_one(page)).fetch_all(&self.read).await?;
        Ok(Page::assemble(decode_all(&found, rows::event_type)?, page, |e| {
            e.name.clone()
        }))
    }

    async fn update_event_type(&self, et: &EventType) -> StoreResult<()> {
        let result = sqlx::query(
            "UPDATE event_type SET description = ?, archived = ?, deprecated = ?, feature_flag = ?, schemas = ?, \
             updated_at = ? WHERE name = ?",
        )
        .bind(&et.description)
        .bind(et.archived)
        .bind(et.deprecated)
        .bind(&et.feature_flag)
        .bind(&et.schemas)
        .bind(et.updated_at)
        .bind(&et.name)
        .execute(&self.write)
        .await?;
        one_changed(result)
    }

    async fn delete_event_type(&self, name: &str) -> StoreResult<()> {
        one_changed(
            sqlx::query("DELETE FROM event_type WHERE name = ?")
                .bind(name)
                .execute(&self.write)
                .await?,
        )
    }

    async fn create_endpoint(&self, ep: &Endpoint) -> StoreResult<()> {
        let sql = "INSERT INTO endpoint (id, app_id, created_at, uid, url, description, filter_types, channels, \
                   disabled, disabled_reason, rate_limit, max_concurrency, ordering, request_timeout_ms, version, \
                   metadata, headers, updated_at, secret) \
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
        let mut tx = self.write.begin().await?;
        let query = sqlx::query(sql).bind(&ep.id).bind(&ep.app_id).bind(ep.created_at);
        bind_endpoint_fields(query, ep, &self.cipher)
            .bind(crate::sealing::seal_secret(&self.cipher, &ep.id, &ep.secret))
            .execute(&mut *tx)
            .await
            .map_err(map_constraint)?;
        let event = NewEvent::endpoint(events::ENDPOINT_CREATED, ep, serde_json::json!({}), ep.created_at);
        events::record(&mut tx, &[event]).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get_endpoint(&self, app_id: &str, id_or_uid: &str) -> StoreResult<Endpoint> {
        let row = sqlx::query("SELECT * FROM endpoint WHERE app_id = ? AND (id = ? OR uid = ?) LIMIT 1")
            .bind(app_id)
            .bind(id_or_uid)
            .bind(id_or_uid)
            .fetch_optional(&self.read)
            .await?
            .ok_or(StoreError::NotFound)?;
        rows::endpoint(&row, Some(&self.cipher))
    }

    async fn get_endpoint_by_id(&self, id: &str) -> StoreResult<Endpoint> {
        let row = sqlx::query("SELECT * FROM endpoint WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.read)
            .await?
            .ok_or(StoreError::NotFound)?;
        rows::endpoint(&row, Some(&self.cipher))
    }

    async fn list_endpoints(&self, app_id: &str, page: &PageRequest) -> StoreResult<Page<Endpoint>> {
        let (condition, order) = keyset("id", page, false);
        let sql = format!("SELECT * FROM endpoint WHERE app_id = ? AND {condition} {order} LIMIT ?");
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(app_id);
        if let Some(after) = &page.after {
            query = query.bind(after);
        }
        let found = query.bind(limit_plus_one(page)).fetch_all(&self.read).await?;
        Ok(Page::assemble(
            decode_all_with(&found, |row| rows::endpoint(row, Some(&self.cipher)))?,
            page,
            |e| e.id.clone(),
        ))
    }

    async fn app_endpoints(&self, app_id: &str) -> StoreResult<Vec<Endpoint>> {
        let found = sqlx::query("SELECT * FROM endpoint WHERE app_id = ? ORDER BY id")
            .bind(app_id)
            .fetch_all(&self.read)
            .await?;
        decode_all_with(&found, |row| rows::endpoint(row, Some(&self.cipher)))
    }

    async fn update_endpoint(&self, ep: &Endpoint) -> StoreResult<()> {
        let sql = "UPDATE endpoint SET uid = ?, url = ?, description = ?, filter_types = ?, channels = ?, \
                   disabled = ?, disabled_reason = ?, rate_limit = ?, max_concurrency = ?, ordering = ?, \
                   request_timeout_ms = ?, version = ?, metadata = ?, headers = ?, updated_at = ? WHERE id = ?";
        let mut tx = self.write.begin().await?;
        let query = bind_endpoint_fields(sqlx::query(sql), ep, &self.cipher).bind(&ep.id);
        one_changed(query.execute(&mut *tx).await.map_err(map_constraint)?)?;
        let event = NewEvent::endpoint(events::ENDPOINT_UPDATED, ep, serde_json::json!({}), ep.updated_at);
        events::record(&mut tx, &[event]).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn rotate_endpoint_secret(
        &self,
        endpoint_id: &str,
        new_secret: &str,
        old_expires_at: i64,
        now: i64,
    ) -> StoreResult<()> {
        secrets::rotate(&self.write, &self.cipher, endpoint_id, new_secret, old_expires_at, now).await
    }

    async fn previous_secrets(&self, endpoint_id: &str, now: i64) -> StoreResult<Vec<PreviousSecret>> {
        secrets::previous(&self.read, &self.cipher, endpoint_id, now).await
    }

    async fn delete_endpoint(&self, id: &str) -> StoreResult<()> {
        let mut tx = self.write.begin().await?;
        let deleted = sqlx::query("DELETE FROM endpoint WHERE id = ? RETURNING *")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let endpoint = rows::endpoint(&deleted, Some(&self.cipher))?;
        let now = herald_core::clock::now_ms();
        let event = NewEvent::endpoint(events::ENDPOINT_DELETED, &endpoint, serde_json::json!({}), now);
        events::record(&mut tx, &[event]).await?;
        tx.commit().await?;
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
            "SELECT {} FROM message m WHERE m.app_id = ? AND (m.id = ? OR m.event_id = ?) LIMIT 1",
            rows::MESSAGE_COLUMNS
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(app_id)
            .bind(id)
            .bind(id)
            .fetch_optional(&self.read)
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
        let (condition, order) = keyset("m.id", page, !filter.oldest_first);
        let mut sql = format!(
            "SELECT {} FROM message m WHERE m.app_id = ? AND {condition}",
            rows::MESSAGE_COLUMNS
        );
        if filter.since.is_some() {
            sql.push_str(" AND m.created_at >= ?");
        }
        if filter.until.is_some() {
            sql.push_str(" AND m.created_at < ?");
        }
        if let Some(types) = &filter.event_types {
            let marks = vec!["?"; types.len()].join(", ");
            sql.push_str(&format!(" AND m.event_type IN ({marks})"));
        }
        if filter.channel.is_some() {
            sql.push_str(" AND EXISTS (SELECT 1 FROM json_each(m.channels) WHERE json_each.value = ?)");
        }
        sql.push_str(&format!(" {order} LIMIT ?"));
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(app_id);
        if let Some(after) = &page.after {
            query = query.bind(after);
        }
        if let Some(since) = filter.since {
            query = query.bind(since);
        }
        if let Some(until) = filter.until {
            query = query.bind(until);
        }
        for event_type in filter.event_types.iter().flatten() {
            query = query.bind(event_type);
        }
        if let Some(channel) = &filter.channel {
            query = query.bind(channel);
        }
        let found = query.bind(limit_plus_one(page)).fetch_all(&self.read).await?;
        Ok(Page::assemble(decode_all(&found, rows::message)?, page, |m| {
            m.id.clone()
        }))
    }

    async fn endpoints_with_pending(&self) -> StoreResult<Vec<String>> {
        Ok(
            sqlx::query_scalar("SELECT DISTINCT endpoint_id FROM delivery WHERE status = 0")
                .fetch_all(&self.read)
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
             WHERE d.endpoint_id = ? AND d.status = 0 AND d.seq > ? ORDER BY d.seq LIMIT ?",
            rows::MESSAGE_COLUMNS
        );
        let found = sqlx::query(AssertSqlSafe(sql))
            .bind(endpoint_id)
            .bind(after_seq)
            .bind(limit(limit_n))
            .fetch_all(&self.read)
            .await?;
        found
            .iter()
            .map(|row| {
                Ok(PendingDelivery {
                    seq: row.try_get("seq")?,
                    endpoint_id: row.try_get("endpoint_id")?,
                    message: std::sync::Arc::new(rows::message(row)?),
                    attempts: u32::try_from(row.try_get::<i64, _>("attempts")?).unwrap_or(0),
                    next_attempt_at: row.try_get("next_attempt_at")?,
                    window_start: row.try_get("window_start")?,
                    trigger: AttemptTrigger::from_code(row.try_get("next_trigger")?),
                })
            })
            .collect()
    }

    async fn record_attempts(&self, records: &[AttemptRecord]) -> StoreResult<()> {
        let mut conn = self.write.acquire().await?;
        write_results(&mut conn, records).await
    }

    async fn expire_deliveries(&self, seqs: &[i64], now: i64) -> StoreResult<()> {
        let mut conn = self.write.acquire().await?;
        let mut tx = conn.begin().await?;
        let mut expiring = Vec::new();
        for chunk in seqs.chunks(bulk::ROWS_PER_INSERT) {
            let sql = format!(
                "{} AND d.seq IN ({})",
                crate::events::EXPIRING,
                bulk::marks(chunk.len())
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for seq in chunk {
                query = query.bind(seq);
            }
            expiring.extend(decode_all(&query.fetch_all(&mut *tx).await?, rows::expired)?);
        }
        settle_expired(&mut tx, &expiring, now).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn expire_waiting(&self, endpoint_id: &str, created_before: i64, now: i64) -> StoreResult<u64> {
        // The head of the pending index, one short transaction per pass (see `EXPIRY_SCAN`). A re-queued
        // delivery's window starts when it was re-queued, not when its message was created.
        let sql = crate::events::expiring_head("?", "?", "?", "?");
        let mut total = 0;
        loop {
            let mut conn = self.write.acquire().await?;
            let mut tx = conn.begin().await?;
            let found = sqlx::query(AssertSqlSafe(sql.as_str()))
                .bind(endpoint_id)
                .bind(endpoint_id)
                .bind(crate::events::EXPIRY_SCAN)
                .bind(created_before)
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
        let row = sqlx::query(AssertSqlSafe(crate::sql::backlog_query("?", "?")))
            .bind(endpoint_id)
            .bind(endpoint_id)
            .fetch_one(&self.read)
            .await?;
        Ok(Backlog::from_count(row.try_get("pending")?, row.try_get("oldest")?))
    }

    async fn set_endpoint_state(
        &self,
        endpoint_id: &str,
        expected_reason: &str,
        disabled: bool,
        reason: Option<&str>,
        now: i64,
    ) -> StoreResult<bool> {
        let result = sqlx::query(
            "UPDATE endpoint SET disabled = ?, disabled_reason = ?, updated_at = ? WHERE id = ? AND disabled_reason = ?",
        )
        .bind(disabled)
        .bind(reason)
        .bind(now)
        .bind(endpoint_id)
        .bind(expected_reason)
        .execute(&self.write)
        .await?;
        Ok(result.rows_affected() == 1)
    }

    async fn disable_endpoint(&self, endpoint_id: &str, reason: &str, now: i64) -> StoreResult<bool> {
        let mut conn = self.write.acquire().await?;
        let mut tx = conn.begin().await?;
        let app_id: Option<String> = sqlx::query_scalar(
            "UPDATE endpoint SET disabled = 1, disabled_reason = ?, updated_at = ? WHERE id = ? AND disabled = 0 \
             RETURNING app_id",
        )
        .bind(reason)
        .bind(now)
        .bind(endpoint_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(app_id) = app_id else {
            return Ok(false);
        };
        let event = NewEvent::about_endpoint(
            events::ENDPOINT_DISABLED,
            &app_id,
            endpoint_id,
            None,
            serde_json::json!({ "reason": reason, "trigger": "automatic" }),
            now,
        );
        events::record(&mut tx, &[event]).await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn list_operational_events(&self, after: i64, limit_n: usize) -> StoreResult<Vec<OperationalEvent>> {
        let found = sqlx::query("SELECT * FROM operational_event WHERE seq > ? ORDER BY seq LIMIT ?")
            .bind(after)
            .bind(limit(limit_n))
            .fetch_all(&self.read)
            .await?;
        decode_all(&found, rows::operational_event)
    }

    async fn unsent_operational_events(&self, after: i64, limit: usize) -> StoreResult<Vec<OperationalEvent>> {
        events::unsent(&self.read, after, limit).await
    }

    async fn mark_operational_event_sent(&self, seq: i64, now: i64) -> StoreResult<()> {
        events::mark_sent(&self.write, seq, now).await
    }

    async fn create_app_token(&self, token: &AppToken) -> StoreResult<()> {
        tenancy::create(&self.write, token).await
    }

    async fn find_app_token(&self, token_sha256: &str, now: i64) -> StoreResult<Option<AppToken>> {
        tenancy::find(&self.read, token_sha256, now).await
    }

    async fn expire_app_tokens(&self, app_id: &str, at: i64) -> StoreResult<u64> {
        tenancy::expire(&self.write, app_id, at).await
    }

    async fn retention_step(&self, attempts_before: i64, now: i64, limit: usize) -> StoreResult<RetentionStep> {
        retention::step(&self.write, attempts_before, now, limit).await
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

    async fn list_deliveries_of_message(
        &self,
        app_id: &str,
        message_id: &str,
        page: &PageRequest,
    ) -> StoreResult<Page<DeliveryView>> {
        let (condition, order) = keyset("e.id", page, false);
        let sql = format!(
            "SELECT e.*, d.status AS d_status, d.attempts AS d_attempts, d.next_attempt_at AS d_next, \
             d.updated_at AS d_updated FROM delivery d JOIN endpoint e ON e.id = d.endpoint_id \
             WHERE d.message_id = ? AND e.app_id = ? AND {condition} {order} LIMIT ?"
        );
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(message_id).bind(app_id);
        if let Some(after) = &page.after {
            query = query.bind(after);
        }
        let found = query.bind(limit_plus_one(page)).fetch_all(&self.read).await?;
        let views = found
            .iter()
            .map(|row| {
                let code: i64 = row.try_get("d_status")?;
                Ok(DeliveryView {
                    endpoint: rows::endpoint(row, Some(&self.cipher))?,
                    status: DeliveryStatus::from_code(code)
                        .ok_or_else(|| StoreError::Corrupt(format!("delivery status {code}")))?,
                    attempts: u32::try_from(row.try_get::<i64, _>("d_attempts")?).unwrap_or(0),
                    next_attempt_at: row.try_get("d_next")?,
                    updated_at: row.try_get("d_updated")?,
                })
            })
            .collect::<StoreResult<Vec<_>>>()?;
        Ok(Page::assemble(views, page, |v| v.endpoint.id.clone()))
    }

    async fn delivery_state(&self, message_id: &str, endpoint_id: &str) -> StoreResult<(DeliveryStatus, u32)> {
        let row = sqlx::query("SELECT status, attempts FROM delivery WHERE message_id = ? AND endpoint_id = ?")
            .bind(message_id)
            .bind(endpoint_id)
            .fetch_optional(&self.read)
            .await?
            .ok_or(StoreError::NotFound)?;
        let code: i64 = row.try_get("status")?;
        let status =
            DeliveryStatus::from_code(code).ok_or_else(|| StoreError::Corrupt(format!("delivery status {code}")))?;
        Ok((status, u32::try_from(row.try_get::<i64, _>("attempts")?).unwrap_or(0)))
    }

    async fn idempotent_response(&self, scope: &str, key: &str, since: i64) -> StoreResult<Option<(u16, Vec<u8>)>> {
        let row = sqlx::query("SELECT status, body FROM idempotency WHERE scope = ? AND key = ? AND created_at >= ?")
            .bind(scope)
            .bind(key)
            .bind(since)
            .fetch_optional(&self.read)
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
        let mut tx = self.write.begin().await?;
        sqlx::query("DELETE FROM idempotency WHERE created_at < ?")
            .bind(expire_before)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO idempotency (scope, key, status, body, created_at) VALUES (?, ?, ?, ?, ?) \
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

    fn take_commit_feed(&self) -> Option<CommitFeed> {
        self.feed.lock().ok()?.take()
    }

    async fn requeue_delivery(
        &self,
        message_id: &str,
        endpoint_id: &str,
        trigger: AttemptTrigger,
        now: i64,
    ) -> StoreResult<Requeue> {
        operations::requeue_delivery(&self.write, message_id, endpoint_id, trigger, now).await
    }

    async fn count_failed(&self, endpoint_id: &str, since: i64, until: i64) -> StoreResult<u64> {
        operations::count_failed(&self.read, endpoint_id, since, until).await
    }

    async fn requeue_failed(
        &self,
        endpoint_id: &str,
        since: i64,
        until: i64,
        limit: usize,
        now: i64,
    ) -> StoreResult<u64> {
        operations::requeue_failed(&self.write, endpoint_id, since, until, limit, now).await
    }

    async fn count_messages(&self, app_id: &str, since: i64, until: i64) -> StoreResult<u64> {
        operations::count_messages(&self.read, app_id, since, until).await
    }

    async fn add_missing_deliveries(
        &self,
        endpoint: &Endpoint,
        since: i64,
        until: i64,
        after: Option<&str>,
        limit: usize,
        now: i64,
    ) -> StoreResult<(Option<String>, u64)> {
        operations::add_missing_deliveries(&self.write, endpoint, since, until, after, limit, now).await
    }

    async fn cancel_pending(
        &self,
        app_id: &str,
        message_id: Option<&str>,
        endpoint_id: Option<&str>,
        now: i64,
    ) -> StoreResult<Vec<(String, i64)>> {
        operations::cancel_pending(&self.write, app_id, message_id, endpoint_id, now).await
    }

    async fn expunge_payload(&self, app_id: &str, message_id: &str) -> StoreResult<()> {
        operations::expunge_payload(&self.write, app_id, message_id).await
    }

    async fn list_deliveries(
        &self,
        app_id: &str,
        endpoint_id: Option<&str>,
        status: Option<DeliveryStatus>,
        page: &PageRequest,
    ) -> StoreResult<Page<DeliveryRecord>> {
        operations::list_deliveries(&self.read, app_id, endpoint_id, status, page).await
    }

    async fn endpoint_stats(&self, endpoint_id: &str, since: i64, until: i64) -> StoreResult<DeliveryStats> {
        operations::endpoint_stats(&self.read, endpoint_id, since, until).await
    }

    async fn create_task(&self, task: &BackgroundTask) -> StoreResult<()> {
        operations::create_task(&self.write, task).await
    }

    async fn update_task(&self, task: &BackgroundTask) -> StoreResult<()> {
        operations::update_task(&self.write, task).await
    }

    async fn get_task(&self, id: &str, app_id: Option<&str>) -> StoreResult<BackgroundTask> {
        operations::get_task(&self.read, id, app_id).await
    }

    async fn fail_interrupted_tasks(&self, now: i64) -> StoreResult<u64> {
        operations::fail_interrupted_tasks(&self.write, now).await
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.read).await?;
        Ok(())
    }
}

/// Append attempts and move their deliveries on: all in one go, or — if that fails — one savepoint per
/// record, so a record that cannot be written is logged and skipped instead of wedging every result
/// behind it.
async fn write_results(conn: &mut sqlx::SqliteConnection, records: &[AttemptRecord]) -> StoreResult<()> {
    let mut tx = conn.begin().await?;
    match bulk::write_attempts(&mut tx, records).await {
        Ok(()) => {
            tx.commit().await?;
            return Ok(());
        }
        Err(error) => {
            tracing::warn!(%error, records = records.len(), "bulk attempt write failed; writing one by one");
            tx.rollback().await?;
        }
    }
    let mut tx = conn.begin().await?;
    for record in records {
        // One savepoint per record: a record that cannot be written is logged and skipped, so it can
        // never wedge the results of every other delivery behind it.
        let mut savepoint = tx.begin().await?;
        match bulk::write_attempts(&mut savepoint, std::slice::from_ref(record)).await {
            Ok(()) => savepoint.commit().await?,
            Err(error) => {
                tracing::error!(%error, attempt = %record.attempt.id, "dropping an attempt record that cannot be stored");
                savepoint.rollback().await?;
            }
        }
    }
    tx.commit().await?;
    Ok(())
}

impl SqliteStore {
    /// Attempts filtered on one column (`message_id` or `endpoint_id`), newest first.
    async fn list_attempts(
        &self,
        column: &'static str,
        app_id: &str,
        value: &str,
        filter: &AttemptFilter,
        page: &PageRequest,
    ) -> StoreResult<Page<Attempt>> {
        let (condition, order) = keyset("id", page, true);
        let mut sql = format!("SELECT * FROM attempt WHERE app_id = ? AND {column} = ? AND {condition}");
        if filter.success.is_some() {
            sql.push_str(" AND success = ?");
        }
        let class = filter.status_code_class.map(i64::from);
        match class {
            Some(0) => sql.push_str(" AND COALESCE(response_status, 0) = 0"),
            Some(_) => sql.push_str(" AND response_status >= ? AND response_status < ?"),
            None => {}
        }
        if let Some(types) = &filter.event_types {
            sql.push_str(&format!(
                " AND message_id IN (SELECT id FROM message WHERE app_id = ? AND event_type IN ({}))",
                bulk::marks(types.len())
            ));
        }
        if filter.before.is_some() {
            sql.push_str(" AND created_at < ?");
        }
        if filter.after.is_some() {
            sql.push_str(" AND created_at >= ?");
        }
        sql.push_str(&format!(" {order} LIMIT ?"));
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(app_id).bind(value);
        if let Some(after) = &page.after {
            query = query.bind(after);
        }
        if let Some(success) = filter.success {
            query = query.bind(success);
        }
        if let Some(class) = class.filter(|c| *c != 0) {
            query = query.bind(class).bind(class + 100);
        }
        if let Some(types) = &filter.event_types {
            query = query.bind(app_id);
            for event_type in types {
                query = query.bind(event_type);
            }
        }
        if let Some(before) = filter.before {
            query = query.bind(before);
        }
        if let Some(after) = filter.after {
            query = query.bind(after);
        }
        let found = query.bind(limit_plus_one(page)).fetch_all(&self.read).await?;
        Ok(Page::assemble(decode_all(&found, rows::attempt)?, page, |a| {
            a.id.clone()
        }))
    }
}

/// Mark these pending deliveries dead, with the `message.attempt.exhausted` event of each, inside the
/// caller's transaction (the write connection: nothing else changes them meanwhile).
async fn settle_expired(
    tx: &mut sqlx::SqliteConnection,
    expiring: &[crate::events::Expired],
    now: i64,
) -> StoreResult<()> {
    for chunk in expiring.chunks(bulk::ROWS_PER_INSERT) {
        let sql = format!(
            "UPDATE delivery SET status = ?, updated_at = ? WHERE status = 0 AND seq IN ({})",
            bulk::marks(chunk.len())
        );
        let mut query = sqlx::query(AssertSqlSafe(sql))
            .bind(DeliveryStatus::Dead.code())
            .bind(now);
        for expired in chunk {
            query = query.bind(expired.seq);
        }
        query.execute(&mut *tx).await?;
    }
    events::record(&mut *tx, &crate::events::expired_events(expiring, now)).await
}
