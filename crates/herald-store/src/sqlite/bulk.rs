//! SQLite's half of group commit: the reads that plan a batch and the multi-row writes.
//!
//! Per message, the careful path (see [`crate::group_commit`]) costs a savepoint, a duplicate lookup, an
//! insert and one insert per delivery — each a round trip to SQLite's connection thread. Here the batch
//! is *planned* first ([`crate::plan`]: which apps exist, which messages repeat an earlier `eventId` or
//! `idempotency-key`, which endpoints each new message fans out to) with one query each, and then
//! written with one multi-row `INSERT` per table. Anything the plan did not foresee fails the whole
//! statement; the writer then rolls back and replays the batch on the careful path, so a surprise costs
//! speed, never custody.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use sqlx::{AssertSqlSafe, Row, Sqlite, SqliteConnection};

use super::chunk::{ROWS_PER_INSERT, marks};
use crate::group_commit::{BatchWriter, IngestJob, Outcomes};
use crate::plan::{self, Apps, Earlier, FanOut, NewRow};
use crate::subscribers::{self, Subscriber};
use crate::{AttemptRecord, CreatedDelivery, StoreError, StoreResult, rows};

/// SQLite's [`BatchWriter`], with each application's subscribers cached between batches (see
/// [`subscribers`]).
#[derive(Default)]
pub(crate) struct SqliteBatches {
    subscribers: subscribers::Cache,
}

impl BatchWriter for SqliteBatches {
    type Db = Sqlite;

    // The one write connection serves every write (and serialises every writer already).
    const HOLDS_CONNECTION: bool = false;

    const BEGIN: &'static str = "BEGIN";

    fn write<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        batch: &'c [IngestJob],
    ) -> BoxFuture<'c, StoreResult<Outcomes>> {
        Box::pin(write(conn, batch, &self.subscribers))
    }
}

async fn write(conn: &mut SqliteConnection, batch: &[IngestJob], cache: &subscribers::Cache) -> StoreResult<Outcomes> {
    let app_ids = plan::app_ids(batch);
    let (apps, versions) = existing_apps(conn, &app_ids).await?;
    let subscribers = cache.resolve(&versions, |stale| read_subscribers(conn, stale)).await?;
    let earlier = earlier_messages(conn, batch).await?;
    // No row locks (one writer): nothing is ever held back.
    let plan = plan::plan(batch, &apps, &[], earlier);
    insert_messages(conn, &plan.messages).await?;
    insert_tags(conn, &plan.messages).await?;
    let fan_out = plan.fan_out(&subscribers);
    let deliveries = insert_deliveries(conn, &fan_out).await?;
    drop(fan_out);
    Ok(plan.finish(deliveries, HashMap::new()))
}

/// The apps that exist, with their default payload retention, and each one's `endpoints_version`.
async fn existing_apps(conn: &mut SqliteConnection, app_ids: &[&str]) -> StoreResult<(Apps, Vec<(String, i64)>)> {
    let sql = format!(
        "SELECT id, payload_retention_period, endpoints_version FROM application WHERE id IN ({})",
        marks(app_ids.len())
    );
    let mut query = sqlx::query_as::<_, subscribers::AppRow>(AssertSqlSafe(sql));
    for id in app_ids {
        query = query.bind(*id);
    }
    Ok(subscribers::existing_apps(query.fetch_all(&mut *conn).await?))
}

/// The subscribers of the apps `stale`, whose lists the cache does not hold at their current version.
async fn read_subscribers(conn: &mut SqliteConnection, stale: Vec<&str>) -> StoreResult<Vec<Subscriber>> {
    let sql = format!(
        "SELECT {} FROM endpoint WHERE app_id IN ({})",
        subscribers::COLUMNS,
        marks(stale.len())
    );
    let mut query = sqlx::query(AssertSqlSafe(sql));
    for id in &stale {
        query = query.bind(*id);
    }
    let found = query.fetch_all(&mut *conn).await?;
    found.iter().map(Subscriber::from_row).collect()
}

async fn earlier_messages(conn: &mut SqliteConnection, batch: &[IngestJob]) -> StoreResult<Earlier> {
    let mut earlier = Earlier::default();
    for chunk in plan::keyed(batch).chunks(ROWS_PER_INSERT) {
        let pairs = vec!["(?, ?, ?)"; chunk.len()].join(", ");
        let sql = format!(
            "WITH wanted (app_id, event_id, idem) AS (VALUES {pairs}) \
             SELECT {}, m.idempotency_key AS m_idempotency_key FROM message m JOIN wanted w \
             ON m.app_id = w.app_id AND (m.event_id = w.event_id OR m.idempotency_key = w.idem)",
            rows::MESSAGE_COLUMNS
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for job in chunk {
            query = query
                .bind(job.new.app_id.as_str())
                .bind(&job.new.event_id)
                .bind(&job.new.idempotency_key);
        }
        for row in query.fetch_all(&mut *conn).await? {
            let message = rows::message(&row)?;
            let key: Option<String> = row.try_get("m_idempotency_key")?;
            earlier.remember(&message, key.as_deref());
        }
    }
    Ok(earlier)
}

async fn insert_messages(conn: &mut SqliteConnection, messages: &[NewRow<'_>]) -> StoreResult<()> {
    for chunk in messages.chunks(ROWS_PER_INSERT) {
        let values = vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ");
        let sql = format!(
            "INSERT INTO message (id, app_id, event_id, idempotency_key, event_type, channels, payload, \
             ordering_key, created_at, payload_expires_at, tags, deliver_at) VALUES {values}"
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for row in chunk {
            let m = &row.message;
            query = query
                .bind(m.id.as_str())
                .bind(m.app_id.as_str())
                .bind(&m.event_id)
                .bind(row.idempotency_key)
                .bind(&m.event_type)
                .bind(rows::encode_list(&m.channels))
                .bind(Arc::clone(&m.payload))
                .bind(&m.ordering_key)
                .bind(m.created_at)
                .bind(row.payload_expires_at)
                .bind(rows::encode_list(&m.tags))
                .bind(m.deliver_at);
        }
        query.execute(&mut *conn).await?;
    }
    Ok(())
}

/// Index the new messages' tags (one row per message and tag).
async fn insert_tags(conn: &mut SqliteConnection, messages: &[NewRow<'_>]) -> StoreResult<()> {
    let tagged = plan::tag_rows(messages);
    for chunk in tagged.chunks(ROWS_PER_INSERT) {
        let values = vec!["(?, ?, ?)"; chunk.len()].join(", ");
        let sql = format!("INSERT INTO message_tag (app_id, tag, message_id) VALUES {values}");
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for (app_id, tag, message_id) in chunk {
            query = query.bind(*app_id).bind(*tag).bind(*message_id);
        }
        query.execute(&mut *conn).await?;
    }
    Ok(())
}

/// Insert the deliveries; their seqs, grouped by the index of the job they belong to.
///
/// No `RETURNING`: each returned row would cross from SQLite's thread to this task on its own (sqlx
/// streams rows one by one), one per message. The seqs are known without them: the one writer draws a
/// statement's `seq`s one after the other in the order its rows are listed (`AUTOINCREMENT`: the largest
/// seq so far plus one, and no trigger writes to `delivery`), so a chunk of `n` rows got
/// `last - n + 1 ..= last`, `last` being the statement's last inserted rowid.
async fn insert_deliveries(
    conn: &mut SqliteConnection,
    fan_out: &[FanOut<'_>],
) -> StoreResult<HashMap<usize, Vec<CreatedDelivery>>> {
    let mut by_job: HashMap<usize, Vec<CreatedDelivery>> = HashMap::new();
    for chunk in fan_out.chunks(ROWS_PER_INSERT) {
        let values = vec!["(?, ?, 0, 0, ?, ?, ?)"; chunk.len()].join(", ");
        let sql = format!(
            "INSERT INTO delivery (message_id, endpoint_id, status, attempts, next_attempt_at, updated_at, \
             window_start) VALUES {values}"
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for f in chunk {
            query = query
                .bind(f.message.id.as_str())
                .bind(f.endpoint_id.as_str())
                .bind(f.message.due_at())
                .bind(f.message.created_at)
                .bind(plan::window_start(f.message));
        }
        let done = query.execute(&mut *conn).await?;
        let rows = i64::try_from(chunk.len()).map_err(|_| StoreError::Corrupt("a chunk beyond i64".into()))?;
        if i64::try_from(done.rows_affected()).ok() != Some(rows) {
            return Err(StoreError::Corrupt(format!(
                "{} deliveries inserted of {rows}",
                done.rows_affected()
            )));
        }
        let first = done.last_insert_rowid() - rows + 1;
        for (seq, f) in (first..).zip(chunk) {
            by_job.entry(f.job).or_default().push(CreatedDelivery {
                seq,
                endpoint_id: f.endpoint_id.clone(),
            });
        }
    }
    Ok(by_job)
}

/// Append a batch of attempts and move their deliveries on, in a few statements per chunk. Only
/// deliveries still pending are updated.
pub(crate) async fn write_attempts(conn: &mut SqliteConnection, records: &[AttemptRecord]) -> StoreResult<()> {
    for chunk in records.chunks(ROWS_PER_INSERT) {
        let values = vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ");
        let sql = format!(
            "INSERT INTO attempt (id, delivery_seq, app_id, message_id, endpoint_id, url, attempt_number, success, \
             outcome, response_status, response, duration_ms, trigger_type, created_at) VALUES {values}"
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for record in chunk {
            let a = &record.attempt;
            query = query
                .bind(a.id.as_str())
                .bind(record.delivery_seq)
                .bind(record.app_id.as_str())
                .bind(a.message_id.as_str())
                .bind(a.endpoint_id.as_str())
                .bind(&a.url)
                .bind(i64::from(a.attempt_number))
                .bind(a.success)
                .bind(a.outcome.as_str())
                .bind(a.response_status.map(i64::from))
                .bind(&a.response)
                .bind(a.duration_ms)
                .bind(a.trigger.code())
                .bind(a.created_at);
        }
        query.execute(&mut *conn).await?;
    }

    let latest = plan::latest_per_delivery(records);
    for chunk in latest.chunks(ROWS_PER_INSERT) {
        let values = vec!["(?, ?, ?, ?, ?)"; chunk.len()].join(", ");
        let sql = format!(
            "WITH v (seq, status, attempts, next_at, changed_at) AS (VALUES {values}) \
             UPDATE delivery SET status = v.status, attempts = v.attempts, next_attempt_at = v.next_at, \
             updated_at = v.changed_at, next_trigger = 0 FROM v WHERE delivery.seq = v.seq AND delivery.status = 0"
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for record in chunk {
            let a = &record.attempt;
            query = query
                .bind(record.delivery_seq)
                .bind(record.status.code())
                .bind(i64::from(a.attempt_number))
                .bind(record.next_attempt_at)
                .bind(a.finished_at());
        }
        query.execute(&mut *conn).await?;
    }

    super::events::record_attempt_events(conn, records).await
}
