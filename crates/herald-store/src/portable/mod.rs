//! The store, written once for both dialects: [`SqlStore`] implements [`Store`] with one SQL text per
//! statement. Where the dialects truly differ — bulk writes, leases and fencing, retention,
//! notifications — it hands over to its [`Dialect`].
//!
//! A new store method is one SQL text here and one test in `tests/store.rs`, which runs on both backends.

mod delivery;
pub(crate) mod expiry;
mod listing;
mod operations;
mod polling;
pub(crate) mod secrets;

use std::sync::Arc;

use herald_core::clock::Millis;
use herald_core::id::{AppId, AttemptId, EndpointId, EndpointIdOrUid, MessageId, MessageIdOrEventId, TaskId};
use herald_core::model::{
    Application, Attempt, AttemptTrigger, BackgroundTask, DeliveryStatus, DisabledReason, Endpoint, EventType,
    HeaderNames, Message, OperationalEvent, TaskKind, TaskState,
};
use std::time::Duration;
use tokio::time::Instant;

use crate::crypto::SecretCipher;
use crate::dialect::{Dialect, SqlStore, Tx};
use crate::events::{self, NewEvent};
use crate::group_commit::{Fence, Waiting};
use crate::rows::{self, Columns};
use crate::sql::{Keyset, limit, map_constraint};
use crate::statement::{Arg, Sql};
use crate::{
    AppFilter, AppToken, AttemptBucket, AttemptFilter, Change, DeliveryFilter, DeliveryRecord, DeliveryStats,
    DeliveryView, Ingested, MessageFilter, NewMessage, Page, PageRequest, Remembered, Requeue, RequeueChunk,
    RequeueSelection, RetentionStep, Store, StoreError, StoreResult,
};

/// The `meta` key the health probe writes while writes fail (see [`herald_sql::custody::WriteHealth::recheck`]).
const HEALTH_PROBE_KEY: &str = "health_probe";

#[allow(private_bounds)]
impl<D: Dialect> SqlStore<D> {
    /// Until when a request that starts now waits for the group-commit writer to take its messages, and
    /// the bound that stands for (see [`SqlStore::ingest_wait`]).
    fn ingest_deadline(&self) -> Option<(Instant, Duration)> {
        self.ingest_wait.map(|bound| (Instant::now() + bound, bound))
    }

    /// Queue one message at the group-commit writer (see [`Fence`] for `fence`), waiting for room in its
    /// queue until `until` at most (see [`Self::ingest_deadline`]); the request's side of the job.
    async fn queue_ingest(
        &self,
        new: NewMessage,
        fence: Option<Arc<Fence>>,
        until: Option<(Instant, Duration)>,
    ) -> StoreResult<Waiting> {
        let (job, waiting) = Waiting::queue(new, fence);
        let sent = self.ingest.send(job);
        match until {
            // Not queued by then: it is never written (a send given up does not deliver its job).
            Some((at, bound)) => tokio::time::timeout_at(at, sent)
                .await
                .map_err(|_| StoreError::TimedOut(bound))?,
            None => sent.await,
        }
        .map_err(|_| StoreError::Closed)?;
        Ok(waiting)
    }

    /// Announce a committed change on the change stream. Nobody listening is fine: no engine runs on
    /// this store (tests, `herald migrate`), or the node is stopping; the change is durable either way.
    fn announce(&self, change: Change) {
        let _ = self.change_tx.send(change);
    }

    /// An endpoint's change committed: announce it here, and (PostgreSQL) to every node.
    async fn endpoint_changed(&self, id: &EndpointId) {
        self.announce(Change::Endpoint(id.clone()));
        D::endpoint_changed(self, id).await;
    }

    /// An endpoint just written held for its ownership check: the engine on this node runs it (see
    /// [`Change::VerificationDue`]). Every write of a held endpoint asks for a check, so one that failed to
    /// run (the node stopped) runs again with the endpoint's next write.
    fn announce_if_verification_due(&self, ep: &Endpoint) {
        if ep.disabled_reason == Some(DisabledReason::AwaitingVerification) {
            self.announce(Change::VerificationDue(ep.id.clone()));
        }
    }

    /// Decode an endpoint row, opening its secret and headers.
    fn endpoint(&self, row: &D::Row) -> StoreResult<Endpoint> {
        rows::endpoint(row, Some(&self.cipher))
    }

    /// Run `sql` in a new transaction with the operational `event` it causes.
    async fn execute_with_event(&self, sql: &Sql<'_>, event: NewEvent) -> StoreResult<()> {
        let mut tx = self.begin().await?;
        one_changed(sql.execute(tx.on()).await.map_err(map_constraint)?)?;
        D::record_events(&mut tx, &[event]).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// `NotFound` unless the statement changed a row.
fn one_changed(rows_affected: u64) -> StoreResult<()> {
    if rows_affected == 0 {
        Err(StoreError::NotFound)
    } else {
        Ok(())
    }
}

/// The ids of the rows of `table_where` (a table and its condition on `$1`), and, if `lock`, the rows locked
/// until commit where rows can be locked.
async fn ids_of<D: Dialect>(tx: &mut Tx<D>, table_where: &str, value: &str, lock: bool) -> StoreResult<Vec<String>> {
    let lock = if lock { D::for_update(None) } else { String::new() };
    let found = Sql::new(format!("SELECT id FROM {table_where}{lock}"))
        .bind(value)
        .fetch_all(tx.on())
        .await?;
    decode_all(&found, |row| row.text("id"))
}

/// Delete the endpoints whose `column` (`id` or `app_id`) is `value`, and then their deliveries; the
/// endpoints' rows as they were.
///
/// On PostgreSQL no foreign key ties a delivery to its endpoint (migration 0028: its per-row check was
/// half the cost of a wide fan-out), so the deliveries are deleted here, and the order is what keeps
/// none behind: deleting the endpoint row first waits for every transaction that holds it — a re-queue
/// holds it `FOR KEY SHARE` ([`operations`]) — and its trigger's update of the application row waits for
/// every ingest batch fanning out to it; the deliveries those added are committed before the second
/// statement reads, and none can be added after (a re-queue finds the endpoint gone; a batch defers the
/// application's messages while the row is held, then re-reads its endpoints). On SQLite the foreign
/// key's cascade would delete them too.
async fn delete_endpoints<D: Dialect>(tx: &mut Tx<D>, column: &'static str, value: &str) -> StoreResult<Vec<D::Row>> {
    let deleted = Sql::new(format!("DELETE FROM endpoint WHERE {column} = $1 RETURNING *"))
        .bind(value)
        .fetch_all(tx.on())
        .await?;
    if !deleted.is_empty() {
        let ids = decode_all(&deleted, |row| row.text("id"))?;
        Sql::new(format!(
            "DELETE FROM delivery WHERE {}",
            D::in_list("endpoint_id", "$1")
        ))
        .bind(Arg::Texts(ids.iter().map(String::as_str).collect()))
        .execute(tx.on())
        .await?;
    }
    Ok(deleted)
}

/// A page of an application's attempts whose `column` (the message or the endpoint) is `value`.
async fn attempts_where<D: Dialect>(
    store: &SqlStore<D>,
    app_id: &AppId,
    column: &'static str,
    value: &str,
    filter: &AttemptFilter,
    page: &PageRequest,
) -> StoreResult<Page<Attempt>> {
    let found = listing::attempts::<D>(app_id, column, value, filter, page)
        .fetch_all(store.reads())
        .await?;
    Ok(Page::assemble(decode_all(&found, rows::attempt)?, page, |a| {
        a.id.to_string()
    }))
}

fn decode_all<R, T>(found: &[R], decode: impl Fn(&R) -> StoreResult<T>) -> StoreResult<Vec<T>> {
    found.iter().map(decode).collect()
}

fn status_of(code: i64) -> StoreResult<DeliveryStatus> {
    DeliveryStatus::from_code(code).ok_or_else(|| StoreError::Corrupt(format!("delivery status {code}")))
}

fn count(value: i64) -> u32 {
    u32::try_from(value).unwrap_or(0)
}

fn unsigned(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// An endpoint's changeable fields, in the column order both `create_endpoint` and `update_endpoint`
/// bind them.
const ENDPOINT_FIELDS: [&str; 16] = [
    "uid",
    "url",
    "description",
    "filter_types",
    "channels",
    "disabled",
    "disabled_reason",
    "rate_limit",
    "max_concurrency",
    "ordering",
    "request_timeout_ms",
    "signature_headers",
    "version",
    "metadata",
    "headers",
    "updated_at",
];

/// Bind an endpoint's changeable fields ([`ENDPOINT_FIELDS`]), the headers sealed.
fn bind_endpoint_fields<'a>(sql: Sql<'a>, ep: &'a Endpoint, cipher: &SecretCipher) -> Sql<'a> {
    sql.bind(&ep.uid)
        .bind(&ep.url)
        .free(&ep.description)
        .bind(rows::encode_list(&ep.filter_types))
        .bind(rows::encode_list(&ep.channels))
        .bind(ep.disabled)
        .opt_free(ep.disabled_reason.as_ref().map(DisabledReason::as_str))
        .bind(ep.rate_limit.map(i64::from))
        .bind(ep.max_concurrency.map(i64::from))
        .bind(ep.ordering.as_str())
        .bind(ep.request_timeout_ms.map(i64::from))
        .bind(ep.signature_headers.map(HeaderNames::as_str))
        .bind(i64::from(ep.version))
        .bind(rows::encode_metadata(&ep.metadata))
        .bind(crate::sealing::seal_headers(cipher, &ep.id, &ep.headers))
        .bind(ep.updated_at)
}

/// `SELECT {what}` over the deliveries `selection` takes (see [`RequeueSelection`]), to count them or (with
/// an order, a limit and a lock appended) to re-queue them.
fn selected<'a, D: Dialect>(what: &str, selection: &'a RequeueSelection) -> Sql<'a> {
    let mut sql = Sql::new(format!(
        "SELECT {what} FROM delivery d JOIN message m ON m.id = d.message_id \
         WHERE d.endpoint_id = $1 AND m.created_at >= $2 AND m.created_at < $3 AND d.seq > $4 AND d.seq <= $5 \
         AND NOT m.expunged"
    ))
    .bind(selection.endpoint_id.as_str())
    .bind(selection.since)
    .bind(selection.until)
    .bind(selection.after_seq)
    .bind(selection.through_seq);
    // A pending delivery is on its way already: it is never taken twice.
    let statuses: Vec<i64> = selection
        .statuses
        .iter()
        .filter(|s| **s != DeliveryStatus::Pending)
        .map(|s| s.code())
        .collect();
    if statuses.is_empty() {
        sql.push(" AND 1 = 0");
    } else {
        let marks = sql.marks(statuses);
        sql.push(&format!(" AND d.status IN ({marks})"));
    }
    if let Some(types) = &selection.event_types {
        listing::push_in(&mut sql, "m.event_type", types);
    }
    if let Some(channel) = &selection.channel {
        let mark = sql.mark(channel);
        sql.push(" AND ").push(&D::json_array_contains("m.channels", &mark));
    }
    if let Some(tag) = &selection.tag {
        // One primary-key lookup in the tag index per candidate delivery.
        let mark = sql.mark(tag);
        sql.push(&format!(
            " AND EXISTS (SELECT 1 FROM message_tag t WHERE t.app_id = m.app_id AND t.tag = {mark} \
             AND t.message_id = m.id)"
        ));
    }
    if let Some(class) = selection.status_class {
        // The latest attempt's status class; no attempt, or one without an HTTP response, is class 0.
        sql.push(
            " AND COALESCE((SELECT a.response_status FROM attempt a WHERE a.message_id = d.message_id \
             AND a.endpoint_id = d.endpoint_id ORDER BY a.id DESC LIMIT 1) / 100 * 100, 0) = ",
        )
        .push_bind(class);
    }
    sql
}

#[async_trait::async_trait]
impl<D: Dialect> Store for SqlStore<D> {
    async fn meta_get(&self, key: &str) -> StoreResult<Option<String>> {
        let row = Sql::new("SELECT value FROM meta WHERE key = $1")
            .bind(key)
            .fetch_optional(self.reads())
            .await?;
        row.map(|row| row.free_text("value")).transpose()
    }

    async fn meta_set(&self, key: &str, value: &str) -> StoreResult<()> {
        Sql::new(
            "INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        )
        .bind(key)
        .free(value)
        .execute(self.writes())
        .await?;
        Ok(())
    }

    async fn create_app(&self, app: &Application) -> StoreResult<()> {
        let created = Sql::new(
            "INSERT INTO application (id, uid, name, rate_limit, metadata, created_at, updated_at, \
             verify_endpoints, payload_retention_period) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(&app.id)
        .bind(&app.uid)
        .free(&app.name)
        .bind(app.rate_limit.map(i64::from))
        .bind(rows::encode_metadata(&app.metadata))
        .bind(app.created_at)
        .bind(app.updated_at)
        .bind(app.verify_endpoints)
        .bind(app.payload_retention_days.map(i64::from))
        .execute(self.writes())
        .await
        .map_err(map_constraint);
        self.watched(created).map(drop)
    }

    async fn list_apps(&self, page: &PageRequest, filter: &AppFilter) -> StoreResult<Page<Application>> {
        let keyset = Keyset::new("id", page, filter.newest_first);
        let mut sql = listing::apps(filter);
        keyset.condition(&mut sql, page.after.as_deref().map(Arg::free));
        keyset.order_and_limit(&mut sql, page);
        let found = sql.fetch_all(self.reads()).await?;
        Ok(Page::assemble(decode_all(&found, rows::application)?, page, |a| {
            a.id.to_string()
        }))
    }

    async fn update_app(&self, app: &Application) -> StoreResult<()> {
        let changed = Sql::new(
            "UPDATE application SET uid = $1, name = $2, rate_limit = $3, metadata = $4, updated_at = $5, \
             verify_endpoints = $6, payload_retention_period = $7 WHERE id = $8",
        )
        .bind(&app.uid)
        .free(&app.name)
        .bind(app.rate_limit.map(i64::from))
        .bind(rows::encode_metadata(&app.metadata))
        .bind(app.updated_at)
        .bind(app.verify_endpoints)
        .bind(app.payload_retention_days.map(i64::from))
        .bind(&app.id)
        .execute(self.writes())
        .await
        .map_err(map_constraint)?;
        one_changed(changed)
    }

    async fn delete_app(&self, id: &AppId) -> StoreResult<()> {
        // The attempt log first, before the locks below, so that at least its rows are not deleted while
        // they are held (while the application's row is, its new messages wait: PostgreSQL's ingest batches
        // defer them, SQLite's one writer waits with every other write; the deliveries and messages are
        // still deleted under it: docs/architecture.md); in the same transaction, so that a delete that
        // fails leaves the application whole. What the result writer adds meanwhile goes with the second
        // pass, before the commit.
        let delete_attempts = Sql::new("DELETE FROM attempt WHERE app_id = $1").bind(id);
        let mut tries = 0;
        let mut tx = loop {
            tries += 1;
            let mut tx = self.begin().await?;
            delete_attempts.execute(tx.on()).await?;
            // Its endpoints locked before its row, in the order every endpoint write takes them (an
            // endpoint's row, then — through the trigger that bumps `endpoints_version` — its
            // application's): taken the other way round, this and such a write could wait for each other.
            // The application's row then keeps any endpoint or message from being added (an endpoint write
            // waits for this transaction, PostgreSQL's ingest batches defer the application's messages
            // until it ends; then they find it gone). An endpoint created between the two locks was not
            // locked first: start again, without the row (rare; after three tries, go on): waiting for it
            // with the row held — a re-queue may hold it while it waits for the ingest lock — would keep
            // the application's messages waiting all that time.
            let endpoints = "endpoint WHERE app_id = $1 ORDER BY id";
            let locked = ids_of(&mut tx, endpoints, id.as_str(), true).await?;
            ids_of(&mut tx, "application WHERE id = $1", id.as_str(), true).await?;
            // Read, not locked: a new endpoint may be held by a re-queue (see above).
            let now = ids_of(&mut tx, endpoints, id.as_str(), false).await?;
            if now == locked || tries == 3 {
                break tx;
            }
            // Rolled back as it is dropped, its locks with it.
            drop(tx);
        };
        // Its endpoints go with it, and with them every delivery of its messages: announced once the
        // deletion commits.
        let endpoints = delete_endpoints(&mut tx, "app_id", id.as_str()).await?;
        let endpoints: Vec<EndpointId> = decode_all(&endpoints, |row| row.id("id"))?;
        let deleted = Sql::new("DELETE FROM application WHERE id = $1")
            .bind(id)
            .execute(tx.on())
            .await?;
        delete_attempts.execute(tx.on()).await?;
        tx.commit().await?;
        for endpoint in &endpoints {
            self.endpoint_changed(endpoint).await;
        }
        one_changed(deleted)
    }

    async fn create_event_type(&self, et: &EventType) -> StoreResult<()> {
        Sql::new(
            "INSERT INTO event_type (name, description, archived, deprecated, feature_flag, schemas, feature_flags, \
             group_name, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(&et.name)
        .free(&et.description)
        .bind(et.archived)
        .bind(et.deprecated)
        .opt_free(et.feature_flag.as_deref())
        .opt_free(et.schemas.as_deref())
        .bind(rows::encode_list(&et.feature_flags))
        .opt_free(et.group_name.as_deref())
        .bind(et.created_at)
        .bind(et.updated_at)
        .execute(self.writes())
        .await
        .map_err(map_constraint)?;
        Ok(())
    }

    async fn get_event_type(&self, name: &str) -> StoreResult<EventType> {
        let row = Sql::new("SELECT * FROM event_type WHERE name = $1")
            .free(name)
            .fetch_optional(self.reads())
            .await?
            .ok_or(StoreError::NotFound)?;
        rows::event_type(&row)
    }

    async fn list_event_types(
        &self,
        page: &PageRequest,
        include_archived: bool,
        descending: bool,
    ) -> StoreResult<Page<EventType>> {
        let keyset = Keyset::new("name", page, descending);
        let mut sql = Sql::new(if include_archived {
            "SELECT * FROM event_type WHERE 1 = 1"
        } else {
            "SELECT * FROM event_type WHERE NOT archived"
        });
        keyset.condition(&mut sql, page.after.as_deref().map(Arg::free));
        keyset.order_and_limit(&mut sql, page);
        let found = sql.fetch_all(self.reads()).await?;
        Ok(Page::assemble(decode_all(&found, rows::event_type)?, page, |e| {
            e.name.clone()
        }))
    }

    async fn update_event_type(&self, et: &EventType) -> StoreResult<()> {
        let changed = Sql::new(
            "UPDATE event_type SET description = $1, archived = $2, deprecated = $3, feature_flag = $4, \
             schemas = $5, feature_flags = $6, group_name = $7, updated_at = $8 WHERE name = $9",
        )
        .free(&et.description)
        .bind(et.archived)
        .bind(et.deprecated)
        .opt_free(et.feature_flag.as_deref())
        .opt_free(et.schemas.as_deref())
        .bind(rows::encode_list(&et.feature_flags))
        .opt_free(et.group_name.as_deref())
        .bind(et.updated_at)
        .free(&et.name)
        .execute(self.writes())
        .await?;
        one_changed(changed)
    }

    async fn delete_event_type(&self, name: &str) -> StoreResult<()> {
        one_changed(
            Sql::new("DELETE FROM event_type WHERE name = $1")
                .free(name)
                .execute(self.writes())
                .await?,
        )
    }

    async fn create_endpoint(&self, ep: &Endpoint) -> StoreResult<()> {
        let marks = (1..=ENDPOINT_FIELDS.len() + 4)
            .map(|n| format!("${n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let text = format!(
            "INSERT INTO endpoint (id, app_id, created_at, {}, secret) VALUES ({marks})",
            ENDPOINT_FIELDS.join(", ")
        );
        let sql = Sql::new(text).bind(&ep.id).bind(&ep.app_id).bind(ep.created_at);
        let sql = bind_endpoint_fields(sql, ep, &self.cipher).bind(crate::sealing::seal_secret(
            &self.cipher,
            &ep.id,
            &ep.secret,
        ));
        let event = NewEvent::endpoint(events::ENDPOINT_CREATED, ep, serde_json::json!({}), ep.created_at);
        let created = self.execute_with_event(&sql, event).await;
        self.watched(created)?;
        // Announced here only: no other node holds anything for an endpoint that did not exist (a
        // notification per creation would cost a round trip each on a wide setup).
        self.announce(Change::Endpoint(ep.id.clone()));
        self.announce_if_verification_due(ep);
        Ok(())
    }

    async fn get_endpoint(&self, app_id: &AppId, id_or_uid: &EndpointIdOrUid) -> StoreResult<Endpoint> {
        let row = Sql::new("SELECT * FROM endpoint WHERE app_id = $1 AND (id = $2 OR uid = $2) LIMIT 1")
            .bind(app_id)
            .bind(id_or_uid)
            .fetch_optional(self.reads())
            .await?
            .ok_or(StoreError::NotFound)?;
        self.endpoint(&row)
    }

    async fn list_endpoints(
        &self,
        app_id: &AppId,
        page: &PageRequest,
        newest_first: bool,
    ) -> StoreResult<Page<Endpoint>> {
        let keyset = Keyset::new("id", page, newest_first);
        let mut sql = Sql::new("SELECT * FROM endpoint WHERE app_id = $1").bind(app_id);
        keyset.condition(&mut sql, page.after.as_deref().map(Arg::free));
        keyset.order_and_limit(&mut sql, page);
        let found = sql.fetch_all(self.reads()).await?;
        Ok(Page::assemble(
            decode_all(&found, |row| self.endpoint(row))?,
            page,
            |e| e.id.to_string(),
        ))
    }

    async fn app_endpoints(&self, app_id: &AppId) -> StoreResult<Vec<Endpoint>> {
        let found = Sql::new("SELECT * FROM endpoint WHERE app_id = $1 ORDER BY id")
            .bind(app_id)
            .fetch_all(self.reads())
            .await?;
        decode_all(&found, |row| self.endpoint(row))
    }

    async fn update_endpoint(&self, ep: &Endpoint) -> StoreResult<()> {
        let set = ENDPOINT_FIELDS
            .iter()
            .enumerate()
            .map(|(i, column)| format!("{column} = ${}", i + 1))
            .collect::<Vec<_>>()
            .join(", ");
        let text = format!("UPDATE endpoint SET {set} WHERE id = ${}", ENDPOINT_FIELDS.len() + 1);
        let sql = bind_endpoint_fields(Sql::new(text), ep, &self.cipher).bind(&ep.id);
        let event = NewEvent::endpoint(events::ENDPOINT_UPDATED, ep, serde_json::json!({}), ep.updated_at);
        self.execute_with_event(&sql, event).await?;
        self.endpoint_changed(&ep.id).await;
        self.announce_if_verification_due(ep);
        Ok(())
    }

    async fn rotate_endpoint_secret(
        &self,
        endpoint_id: &EndpointId,
        new_secret: &str,
        old_expires_at: Millis,
        now: Millis,
    ) -> StoreResult<()> {
        secrets::rotate(self, endpoint_id, new_secret, old_expires_at, now).await?;
        self.endpoint_changed(endpoint_id).await;
        Ok(())
    }

    async fn delete_endpoint(&self, id: &EndpointId) -> StoreResult<()> {
        let mut tx = self.begin().await?;
        let deleted = delete_endpoints(&mut tx, "id", id.as_str()).await?;
        let endpoint = self.endpoint(deleted.first().ok_or(StoreError::NotFound)?)?;
        let now = herald_core::clock::now();
        let event = NewEvent::endpoint(events::ENDPOINT_DELETED, &endpoint, serde_json::json!({}), now);
        D::record_events(&mut tx, &[event]).await?;
        tx.commit().await?;
        self.endpoint_changed(id).await;
        Ok(())
    }

    async fn ingest(&self, new: NewMessage) -> StoreResult<Ingested> {
        // Bounded here, not by the decorator of every PostgreSQL call (see `crate::bounded`): a message
        // answered 503 must never be committed afterwards, so the wait is cut only while the writer has
        // not taken the message yet; once it has, the batch's answer comes within the writer's own bound.
        let until = self.ingest_deadline();
        self.queue_ingest(new, None, until).await?.answer(until).await
    }

    async fn ingest_many(&self, batch: Vec<NewMessage>) -> StoreResult<Vec<StoreResult<Ingested>>> {
        let until = self.ingest_deadline();
        let fence = Arc::new(Fence::default());
        let total = batch.len();
        let mut waiting = Vec::with_capacity(total);
        let mut unqueued = None;
        // Queued one after the other (never concurrently), so the writer sees them in the given order.
        for new in batch {
            match self.queue_ingest(new, Some(fence.clone()), until).await {
                Ok(queued) => waiting.push(queued),
                Err(error) => {
                    // Neither this message nor any after it is queued, so none of them is written.
                    unqueued = Some(error);
                    break;
                }
            }
        }
        let mut outcomes = Vec::with_capacity(total);
        for queued in waiting {
            outcomes.push(queued.answer(until).await);
        }
        if let Some(error) = unqueued {
            while outcomes.len() < total {
                outcomes.push(Err(match error {
                    StoreError::TimedOut(bound) => StoreError::TimedOut(bound),
                    _ => StoreError::Closed,
                }));
            }
        }
        Ok(outcomes)
    }

    async fn get_message(&self, app_id: &AppId, id: &MessageIdOrEventId) -> StoreResult<Message> {
        let text = format!(
            "SELECT {} FROM message m WHERE m.app_id = $1 AND (m.id = $2 OR m.event_id = $2) LIMIT 1",
            rows::MESSAGE_COLUMNS
        );
        let row = Sql::new(text)
            .bind(app_id)
            .bind(id)
            .fetch_optional(self.reads())
            .await?
            .ok_or(StoreError::NotFound)?;
        rows::message(&row)
    }

    async fn list_messages(
        &self,
        app_id: &AppId,
        filter: &MessageFilter,
        page: &PageRequest,
    ) -> StoreResult<Page<Message>> {
        let sql = listing::messages::<D>(app_id, filter, page);
        let found = sql.fetch_all(self.reads()).await?;
        Ok(Page::assemble(decode_all(&found, rows::message)?, page, |m| {
            m.id.to_string()
        }))
    }

    async fn list_operational_events(&self, after: i64, limit_n: usize) -> StoreResult<Vec<OperationalEvent>> {
        let found = Sql::new("SELECT * FROM operational_event WHERE seq > $1 ORDER BY seq LIMIT $2")
            .bind(after)
            .bind(limit(limit_n))
            .fetch_all(self.reads())
            .await?;
        decode_all(&found, rows::operational_event)
    }

    async fn list_operational_events_newest(
        &self,
        before: Option<i64>,
        limit_n: usize,
    ) -> StoreResult<Vec<OperationalEvent>> {
        let found = Sql::new("SELECT * FROM operational_event WHERE seq < $1 ORDER BY seq DESC LIMIT $2")
            .bind(before.unwrap_or(i64::MAX))
            .bind(limit(limit_n))
            .fetch_all(self.reads())
            .await?;
        decode_all(&found, rows::operational_event)
    }

    async fn attempt_buckets(
        &self,
        endpoint_id: &EndpointId,
        since: Millis,
        until: Millis,
        bucket_ms: i64,
    ) -> StoreResult<Vec<AttemptBucket>> {
        let found = listing::attempt_buckets(endpoint_id, since, until, bucket_ms)
            .fetch_all(self.reads())
            .await?;
        decode_all(&found, listing::attempt_bucket)
    }

    async fn create_app_token(&self, token: &AppToken) -> StoreResult<()> {
        Sql::new(
            "INSERT INTO app_token (token_sha256, app_id, read_only, sink_id, session_id, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&token.token_sha256)
        .bind(&token.app_id)
        .bind(token.read_only)
        .bind(&token.sink_id)
        .opt_free(token.session_id.as_deref())
        .bind(token.created_at)
        .bind(token.expires_at)
        .execute(self.writes())
        .await
        .map_err(map_constraint)?;
        Ok(())
    }

    async fn find_app_token(&self, token_sha256: &str, now: Millis) -> StoreResult<Option<AppToken>> {
        let row = Sql::new("SELECT * FROM app_token WHERE token_sha256 = $1 AND expires_at > $2")
            .bind(token_sha256)
            .bind(now)
            .fetch_optional(self.reads())
            .await?;
        row.as_ref().map(rows::app_token).transpose()
    }

    async fn expire_app_tokens(&self, app_id: &AppId, sessions: Option<&[String]>, at: Millis) -> StoreResult<u64> {
        let mut sql = Sql::new("UPDATE app_token SET expires_at = $1 WHERE app_id = $2 AND expires_at > $1")
            .bind(at)
            .bind(app_id);
        if let Some(sessions) = sessions {
            if sessions.is_empty() {
                sql.push(" AND 1 = 0");
            } else {
                let marks = sql.marks(sessions.iter().map(|s| Arg::free(s)));
                sql.push(&format!(" AND session_id IN ({marks})"));
            }
        }
        Ok(sql.execute(self.writes()).await?)
    }

    async fn expire_app_token(&self, token_sha256: &str, at: Millis) -> StoreResult<()> {
        let changed = Sql::new(format!(
            "UPDATE app_token SET expires_at = {}(expires_at, $1) WHERE token_sha256 = $2",
            D::LEAST
        ))
        .bind(at)
        .bind(token_sha256)
        .execute(self.writes())
        .await?;
        one_changed(changed)
    }

    async fn retention_step(&self, attempts_before: Millis, now: Millis, limit_n: usize) -> StoreResult<RetentionStep> {
        self.watched(D::retention_step(self, attempts_before, now, limit_n).await)
    }

    async fn list_attempts_by_message(
        &self,
        app_id: &AppId,
        message_id: &MessageId,
        filter: &AttemptFilter,
        page: &PageRequest,
    ) -> StoreResult<Page<Attempt>> {
        attempts_where(self, app_id, "message_id", message_id.as_str(), filter, page).await
    }

    async fn list_attempts_by_endpoint(
        &self,
        app_id: &AppId,
        endpoint_id: &EndpointId,
        filter: &AttemptFilter,
        page: &PageRequest,
    ) -> StoreResult<Page<Attempt>> {
        attempts_where(self, app_id, "endpoint_id", endpoint_id.as_str(), filter, page).await
    }

    async fn list_deliveries_of_message(
        &self,
        app_id: &AppId,
        message_id: &MessageId,
        page: &PageRequest,
    ) -> StoreResult<Page<DeliveryView>> {
        let keyset = Keyset::new("e.id", page, false);
        let mut sql = Sql::new(
            "SELECT e.*, d.status AS d_status, d.attempts AS d_attempts, d.next_attempt_at AS d_next, \
             d.updated_at AS d_updated FROM delivery d JOIN endpoint e ON e.id = d.endpoint_id \
             WHERE d.message_id = $1 AND e.app_id = $2",
        )
        .bind(message_id)
        .bind(app_id);
        keyset.condition(&mut sql, page.after.as_deref().map(Arg::free));
        keyset.order_and_limit(&mut sql, page);
        let found = sql.fetch_all(self.reads()).await?;
        let views = decode_all(&found, |row| {
            Ok(DeliveryView {
                endpoint: self.endpoint(row)?,
                status: status_of(row.int("d_status")?)?,
                attempts: count(row.int("d_attempts")?),
                next_attempt_at: row.time("d_next")?,
                updated_at: row.time("d_updated")?,
            })
        })?;
        Ok(Page::assemble(views, page, |v| v.endpoint.id.to_string()))
    }

    async fn delivery_state(
        &self,
        message_id: &MessageId,
        endpoint_id: &EndpointId,
    ) -> StoreResult<(DeliveryStatus, u32)> {
        let row = Sql::new("SELECT status, attempts FROM delivery WHERE message_id = $1 AND endpoint_id = $2")
            .bind(message_id)
            .bind(endpoint_id)
            .fetch_optional(self.reads())
            .await?
            .ok_or(StoreError::NotFound)?;
        Ok((status_of(row.int("status")?)?, count(row.int("attempts")?)))
    }

    async fn idempotent_response(&self, scope: &str, key: &str, since: Millis) -> StoreResult<Option<Remembered>> {
        let row = Sql::new(
            "SELECT status, body, request_digest FROM idempotency WHERE scope = $1 AND key = $2 AND created_at >= $3",
        )
        .bind(scope)
        .bind(key)
        .bind(since)
        .fetch_optional(self.reads())
        .await?;
        row.map(|row| rows::remembered(&row)).transpose()
    }

    async fn remember_response(
        &self,
        scope: &str,
        key: &str,
        remembered: &Remembered,
        now: Millis,
        expire_before: Millis,
    ) -> StoreResult<()> {
        let mut tx = self.begin().await?;
        Sql::new("DELETE FROM idempotency WHERE created_at < $1")
            .bind(expire_before)
            .execute(tx.on())
            .await?;
        Sql::new(
            "INSERT INTO idempotency (scope, key, status, body, request_digest, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (scope, key) DO NOTHING",
        )
        .bind(scope)
        .bind(key)
        .bind(i64::from(remembered.status))
        .bind(remembered.body.as_slice())
        .bind(&remembered.request_digest)
        .bind(now)
        .execute(tx.on())
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn requeue_delivery(
        &self,
        message_id: &MessageId,
        endpoint_id: &EndpointId,
        trigger: AttemptTrigger,
        now: Millis,
    ) -> StoreResult<Requeue> {
        let requeued = operations::requeue_delivery(self, message_id, endpoint_id, trigger, now).await?;
        if let Requeue::Queued(_) = requeued {
            self.announce(Change::Backlog(endpoint_id.clone()));
        }
        Ok(requeued)
    }

    async fn count_selected(&self, selection: &RequeueSelection) -> StoreResult<u64> {
        let sql = selected::<D>("COUNT(*) AS n", selection);
        Ok(unsigned(sql.fetch_one(self.reads()).await?.int("n")?))
    }

    async fn requeue_selected(
        &self,
        selection: &RequeueSelection,
        limit_n: usize,
        now: Millis,
    ) -> StoreResult<RequeueChunk> {
        let chunk = operations::requeue_selected(self, selection, limit_n, now).await?;
        if chunk.queued > 0 {
            self.announce(Change::Backlog(selection.endpoint_id.clone()));
        }
        Ok(chunk)
    }

    async fn last_delivery_seq(&self) -> StoreResult<i64> {
        let row = Sql::new("SELECT COALESCE(MAX(seq), 0) AS n FROM delivery")
            .fetch_one(self.reads())
            .await?;
        Ok(row.int("n")?)
    }

    async fn count_messages(&self, app_id: &AppId, since: Millis, until: Millis) -> StoreResult<u64> {
        let row =
            Sql::new("SELECT COUNT(*) AS n FROM message WHERE app_id = $1 AND created_at >= $2 AND created_at < $3")
                .bind(app_id)
                .bind(since)
                .bind(until)
                .fetch_one(self.reads())
                .await?;
        Ok(unsigned(row.int("n")?))
    }

    async fn add_missing_deliveries(
        &self,
        endpoint: &Endpoint,
        since: Millis,
        until: Millis,
        after: Option<&MessageId>,
        limit_n: usize,
        now: Millis,
    ) -> StoreResult<(Option<MessageId>, u64)> {
        let (last, created) =
            operations::add_missing_deliveries(self, endpoint, since, until, after, limit_n, now).await?;
        if created > 0 {
            self.announce(Change::Backlog(endpoint.id.clone()));
        }
        Ok((last, created))
    }

    async fn cancel_pending(
        &self,
        app_id: &AppId,
        message_id: Option<&MessageId>,
        endpoint_id: Option<&EndpointId>,
        now: Millis,
    ) -> StoreResult<Vec<(EndpointId, i64)>> {
        let found = Sql::new(
            "UPDATE delivery SET status = $1, updated_at = $2 WHERE status = 0 \
             AND endpoint_id IN (SELECT id FROM endpoint WHERE app_id = $3) \
             AND ($4 IS NULL OR message_id = $4) AND ($5 IS NULL OR endpoint_id = $5) \
             RETURNING endpoint_id, seq",
        )
        .bind(DeliveryStatus::Cancelled.code())
        .bind(now)
        .bind(app_id)
        .bind(message_id)
        .bind(endpoint_id)
        .fetch_all(self.writes())
        .await?;
        let cancelled = decode_all(&found, |row| Ok((row.id("endpoint_id")?, row.int("seq")?)))?;
        if !cancelled.is_empty() {
            self.announce(Change::Cancelled(cancelled.clone()));
        }
        Ok(cancelled)
    }

    async fn expunge_payload(&self, app_id: &AppId, message_id: &MessageId) -> StoreResult<()> {
        let changed = Sql::new("UPDATE message SET payload = $1, expunged = TRUE WHERE app_id = $2 AND id = $3")
            .bind(&b"{}"[..])
            .bind(app_id)
            .bind(message_id)
            .execute(self.writes())
            .await?;
        one_changed(changed)
    }

    async fn expunge_app_payloads(
        &self,
        app_id: &AppId,
        before: Millis,
        limit_n: usize,
        now: Millis,
    ) -> StoreResult<(u64, Vec<(EndpointId, i64)>)> {
        let mut tx = self.begin().await?;
        let found = Sql::new(format!(
            "SELECT id FROM message WHERE app_id = $1 AND created_at <= $2 AND NOT expunged ORDER BY id LIMIT $3{}",
            D::for_update(None)
        ))
        .bind(app_id)
        .bind(before)
        .bind(limit(limit_n))
        .fetch_all(tx.on())
        .await?;
        let ids = decode_all(&found, |row| row.text("id"))?;
        if ids.is_empty() {
            return Ok((0, Vec::new()));
        }
        let mut cancel =
            Sql::new("UPDATE delivery SET status = $1, updated_at = $2 WHERE status = 0 AND message_id IN (")
                .bind(DeliveryStatus::Cancelled.code())
                .bind(now);
        let marks = cancel.marks(&ids);
        cancel.push(&marks).push(") RETURNING endpoint_id, seq");
        let cancelled = cancel.fetch_all(tx.on()).await?;
        let cancelled = decode_all(&cancelled, |row| Ok((row.id("endpoint_id")?, row.int("seq")?)))?;
        let mut expunge = Sql::new("UPDATE message SET payload = $1, expunged = TRUE WHERE id IN (").bind(&b"{}"[..]);
        let marks = expunge.marks(&ids);
        expunge.push(&marks).push(")");
        let expunged = expunge.execute(tx.on()).await?;
        tx.commit().await?;
        if !cancelled.is_empty() {
            self.announce(Change::Cancelled(cancelled.clone()));
        }
        Ok((expunged, cancelled))
    }

    async fn expunge_attempt_response(
        &self,
        app_id: &AppId,
        message_id: &MessageId,
        attempt_id: &AttemptId,
    ) -> StoreResult<()> {
        let changed = Sql::new("UPDATE attempt SET response = '' WHERE app_id = $1 AND message_id = $2 AND id = $3")
            .bind(app_id)
            .bind(message_id)
            .bind(attempt_id)
            .execute(self.writes())
            .await?;
        one_changed(changed)
    }

    async fn list_deliveries(
        &self,
        app_id: &AppId,
        endpoint_id: Option<&EndpointId>,
        filter: &DeliveryFilter,
        page: &PageRequest,
    ) -> StoreResult<Page<DeliveryRecord>> {
        let sql = listing::deliveries::<D>(app_id, endpoint_id, filter, page)?;
        let found = sql.fetch_all(self.reads()).await?;
        let mut records = decode_all(&found, |row| {
            Ok(DeliveryRecord {
                seq: row.int("seq")?,
                endpoint_id: row.id("endpoint_id")?,
                message: rows::message(row)?,
                status: status_of(row.int("status")?)?,
                attempts: count(row.int("attempts")?),
                next_attempt_at: row.time("next_attempt_at")?,
                updated_at: row.time("updated_at")?,
                last_attempt: None,
            })
        })?;
        if !records.is_empty() {
            let latest = listing::last_attempts(&records).fetch_all(self.reads()).await?;
            rows::attach_last_attempts(&mut records, decode_all(&latest, rows::attempt)?);
        }
        Ok(Page::assemble(records, page, |r| r.seq.to_string()))
    }

    async fn endpoint_stats(
        &self,
        endpoint_id: &EndpointId,
        since: Millis,
        until: Millis,
    ) -> StoreResult<DeliveryStats> {
        let found = Sql::new(
            "SELECT d.status, COUNT(*) AS n FROM delivery d JOIN message m ON m.id = d.message_id \
             WHERE d.endpoint_id = $1 AND m.created_at >= $2 AND m.created_at < $3 GROUP BY d.status",
        )
        .bind(endpoint_id)
        .bind(since)
        .bind(until)
        .fetch_all(self.reads())
        .await?;
        rows::delivery_stats(&found)
    }

    async fn create_task(&self, t: &BackgroundTask) -> StoreResult<()> {
        Sql::new(
            "INSERT INTO background_task (id, kind, app_id, state, processed, total, data, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(&t.id)
        .bind(t.kind.as_str())
        .bind(&t.app_id)
        .bind(t.state.as_str())
        .bind(rows::count_param(t.processed))
        .bind(rows::count_param(t.total))
        .bind(&t.data)
        .bind(t.created_at)
        .bind(t.updated_at)
        .execute(self.writes())
        .await?;
        Ok(())
    }

    async fn update_task(&self, t: &BackgroundTask) -> StoreResult<()> {
        let changed = Sql::new(
            "UPDATE background_task SET state = $1, processed = $2, total = $3, data = $4, updated_at = $5 \
             WHERE id = $6",
        )
        .bind(t.state.as_str())
        .bind(rows::count_param(t.processed))
        .bind(rows::count_param(t.total))
        .bind(&t.data)
        .bind(t.updated_at)
        .bind(&t.id)
        .execute(self.writes())
        .await?;
        one_changed(changed)
    }

    async fn list_tasks(
        &self,
        state: Option<TaskState>,
        kind: Option<TaskKind>,
        page: &PageRequest,
        newest_first: bool,
    ) -> StoreResult<Page<BackgroundTask>> {
        let keyset = Keyset::new("id", page, newest_first);
        let mut sql =
            Sql::new("SELECT * FROM background_task WHERE ($1 IS NULL OR state = $1) AND ($2 IS NULL OR kind = $2)")
                .bind(state.map(TaskState::as_str))
                .bind(kind.map(TaskKind::as_str));
        keyset.condition(&mut sql, page.after.as_deref().map(Arg::free));
        keyset.order_and_limit(&mut sql, page);
        let found = sql.fetch_all(self.reads()).await?;
        Ok(Page::assemble(decode_all(&found, rows::background_task)?, page, |t| {
            t.id.to_string()
        }))
    }

    async fn get_task(&self, id: &TaskId, app_id: Option<&AppId>) -> StoreResult<BackgroundTask> {
        let row = Sql::new("SELECT * FROM background_task WHERE id = $1 AND ($2 IS NULL OR app_id = $2)")
            .bind(id)
            .bind(app_id)
            .fetch_optional(self.reads())
            .await?
            .ok_or(StoreError::NotFound)?;
        rows::background_task(&row)
    }

    async fn take_interrupted_tasks(
        &self,
        now: Millis,
        starting: bool,
        resume: &[TaskKind],
    ) -> StoreResult<(Vec<BackgroundTask>, u64)> {
        let stale_before = match D::TASK_ORPHANED_AFTER {
            Some(after) => now - after,
            None if starting => Millis::MAX,
            None => return Ok((Vec::new(), 0)),
        };
        let found = Sql::new("SELECT * FROM background_task WHERE state = $1 AND updated_at < $2")
            .bind(TaskState::Running.as_str())
            .bind(stale_before)
            .fetch_all(self.reads())
            .await?;
        let (mut claimed, mut failed) = (Vec::new(), 0);
        for row in &found {
            let mut task = rows::background_task(row)?;
            let carry_on = resume.contains(&task.kind);
            let state = if carry_on {
                TaskState::Running
            } else {
                TaskState::Failed
            };
            // Only the caller that still sees the row as it was read takes it.
            let changed = Sql::new(
                "UPDATE background_task SET state = $1, updated_at = $2 \
                 WHERE id = $3 AND state = $4 AND updated_at = $5",
            )
            .bind(state.as_str())
            .bind(now)
            .bind(&task.id)
            .bind(TaskState::Running.as_str())
            .bind(task.updated_at)
            .execute(self.writes())
            .await?;
            if changed == 1 && carry_on {
                task.updated_at = now;
                claimed.push(task);
            } else if changed == 1 {
                failed += 1;
            }
        }
        Ok((claimed, failed))
    }

    async fn ping(&self) -> StoreResult<()> {
        Sql::new("SELECT 1").execute(self.reads()).await?;
        // While writes fail on a storage fault, a probe write tells when they succeed again.
        let now = herald_core::clock::now().as_unix_ms().to_string();
        let probe = self.meta_set(HEALTH_PROBE_KEY, &now);
        self.health
            .recheck(probe, StoreError::fault, StoreError::FileCorrupt)
            .await
    }

    async fn shutdown(&self) {
        D::shutdown(self).await;
    }
}
