//! The fast path of group commit: a whole batch in a handful of multi-row statements.
//!
//! Per message, the careful path ([`super::writer`]) costs a savepoint, a duplicate lookup, an insert
//! and one insert per delivery — each a round trip to SQLite's connection thread. Here the batch is
//! *planned* first (which apps exist, which messages repeat an earlier `eventId` or `idempotency-key`,
//! which endpoints each new message fans out to) with one query each, and then written with one
//! multi-row `INSERT` per table. Anything the plan did not foresee fails the whole statement; the writer
//! then rolls back and replays the batch on the careful path, so a surprise costs speed, never custody.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use herald_core::id::{IdKind, new_id};
use herald_core::model::{Endpoint, Message};
use sqlx::{AssertSqlSafe, Row, SqliteConnection};

use super::rows;
use super::writer::IngestJob;
use crate::{AttemptRecord, CreatedDelivery, Ingested, StoreError, StoreResult};

/// Rows per multi-row `INSERT` (SQLite allows 32,766 bound values per statement).
pub(crate) const ROWS_PER_INSERT: usize = 256;

/// `?, ?, …` with `n` marks.
pub(crate) fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// The outcome of each job, in order. The outer error means a statement failed and nothing of this
/// batch may be kept.
pub(crate) async fn write(conn: &mut SqliteConnection, batch: &[IngestJob]) -> StoreResult<Vec<StoreResult<Ingested>>> {
    let app_ids: Vec<&str> = batch
        .iter()
        .map(|j| j.new.app_id.as_str())
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let existing_apps = existing_apps(conn, &app_ids).await?;
    let subscribers = subscribers(conn, &app_ids).await?;
    let mut previous = earlier_messages(conn, batch).await?;

    let now = herald_core::clock::now_ms();
    let mut outcomes: Vec<StoreResult<Ingested>> = Vec::with_capacity(batch.len());
    // (job index, message, idempotency key, payload expiry)
    let mut new_messages: Vec<(usize, Message, Option<&str>, Option<i64>)> = Vec::new();
    for (index, job) in batch.iter().enumerate() {
        let new = &job.new;
        if !existing_apps.contains(new.app_id.as_str()) {
            outcomes.push(Err(StoreError::NotFound));
            continue;
        }
        if let Some(original) = previous.find(&new.app_id, new.event_id.as_deref(), new.idempotency_key.as_deref()) {
            outcomes.push(Ok(Ingested::Duplicate(original)));
            continue;
        }
        let message = Message {
            id: new_id(IdKind::Message),
            app_id: new.app_id.clone(),
            event_id: new.event_id.clone(),
            event_type: new.event_type.clone(),
            channels: new.channels.clone(),
            payload: new.payload.clone(),
            ordering_key: new.ordering_key.clone(),
            created_at: now,
        };
        previous.remember(&message, new.idempotency_key.as_deref());
        // Placeholder until the deliveries are written; replaced below.
        outcomes.push(Ok(Ingested::Duplicate(message.clone())));
        let expires = new.payload_retention_ms.map(|keep| now.saturating_add(keep));
        new_messages.push((index, message, new.idempotency_key.as_deref(), expires));
    }

    insert_messages(conn, &new_messages).await?;
    let fan_out: Vec<(usize, &Message, &str)> = new_messages
        .iter()
        .flat_map(|(index, message, _, _)| {
            subscribers
                .get(message.app_id.as_str())
                .into_iter()
                .flatten()
                .filter(|ep| ep.subscribes_to(&message.event_type, message.channels.as_deref()))
                .map(move |ep| (*index, message, ep.id.as_str()))
        })
        .collect();
    let mut deliveries = insert_deliveries(conn, &fan_out).await?;
    for (index, message, _, _) in new_messages {
        let mut created = deliveries.remove(&index).unwrap_or_default();
        created.sort_by_key(|d| d.seq);
        outcomes[index] = Ok(Ingested::Created {
            message,
            deliveries: created,
        });
    }
    Ok(outcomes)
}

async fn existing_apps(conn: &mut SqliteConnection, app_ids: &[&str]) -> StoreResult<HashSet<String>> {
    let sql = format!("SELECT id FROM application WHERE id IN ({})", marks(app_ids.len()));
    let mut query = sqlx::query_scalar::<_, String>(AssertSqlSafe(sql));
    for id in app_ids {
        query = query.bind(*id);
    }
    Ok(query.fetch_all(&mut *conn).await?.into_iter().collect())
}

/// Each app's endpoints. Disabled ones are included: their deliveries queue until the endpoint is
/// enabled again (or their time window ends).
async fn subscribers(conn: &mut SqliteConnection, app_ids: &[&str]) -> StoreResult<HashMap<String, Vec<Endpoint>>> {
    let sql = format!("SELECT * FROM endpoint WHERE app_id IN ({})", marks(app_ids.len()));
    let mut query = sqlx::query(AssertSqlSafe(sql));
    for id in app_ids {
        query = query.bind(*id);
    }
    let mut by_app: HashMap<String, Vec<Endpoint>> = HashMap::new();
    for row in query.fetch_all(&mut *conn).await? {
        let endpoint = rows::endpoint(&row)?;
        by_app.entry(endpoint.app_id.clone()).or_default().push(endpoint);
    }
    Ok(by_app)
}

/// Messages already stored, or earlier in this batch, by (app, event id) and (app, idempotency key).
#[derive(Default)]
struct Earlier {
    by_event_id: HashMap<(String, String), Message>,
    by_key: HashMap<(String, String), Message>,
}

impl Earlier {
    fn find(&self, app_id: &str, event_id: Option<&str>, key: Option<&str>) -> Option<Message> {
        let lookup = |map: &HashMap<(String, String), Message>, value: Option<&str>| {
            value.and_then(|v| map.get(&(app_id.to_owned(), v.to_owned())).cloned())
        };
        lookup(&self.by_event_id, event_id).or_else(|| lookup(&self.by_key, key))
    }

    fn remember(&mut self, message: &Message, key: Option<&str>) {
        if let Some(event_id) = &message.event_id {
            self.by_event_id
                .insert((message.app_id.clone(), event_id.clone()), message.clone());
        }
        if let Some(key) = key {
            self.by_key
                .insert((message.app_id.clone(), key.to_owned()), message.clone());
        }
    }
}

async fn earlier_messages(conn: &mut SqliteConnection, batch: &[IngestJob]) -> StoreResult<Earlier> {
    let mut earlier = Earlier::default();
    let keyed: Vec<&IngestJob> = batch
        .iter()
        .filter(|j| j.new.event_id.is_some() || j.new.idempotency_key.is_some())
        .collect();
    for chunk in keyed.chunks(ROWS_PER_INSERT) {
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
                .bind(&job.new.app_id)
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

async fn insert_messages(
    conn: &mut SqliteConnection,
    messages: &[(usize, Message, Option<&str>, Option<i64>)],
) -> StoreResult<()> {
    for chunk in messages.chunks(ROWS_PER_INSERT) {
        let values = vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ");
        let sql = format!(
            "INSERT INTO message (id, app_id, event_id, idempotency_key, event_type, channels, payload, \
             ordering_key, created_at, payload_expires_at) VALUES {values}"
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for (_, m, key, expires) in chunk {
            query = query
                .bind(&m.id)
                .bind(&m.app_id)
                .bind(&m.event_id)
                .bind(*key)
                .bind(&m.event_type)
                .bind(rows::encode_list(&m.channels))
                .bind(Arc::clone(&m.payload))
                .bind(&m.ordering_key)
                .bind(m.created_at)
                .bind(*expires);
        }
        query.execute(&mut *conn).await?;
    }
    Ok(())
}

/// Insert the deliveries; their seqs, grouped by the index of the job they belong to.
async fn insert_deliveries(
    conn: &mut SqliteConnection,
    fan_out: &[(usize, &Message, &str)],
) -> StoreResult<HashMap<usize, Vec<CreatedDelivery>>> {
    let mut by_job: HashMap<usize, Vec<CreatedDelivery>> = HashMap::new();
    for chunk in fan_out.chunks(ROWS_PER_INSERT) {
        let values = vec!["(?, ?, 0, 0, ?, ?)"; chunk.len()].join(", ");
        let sql = format!(
            "INSERT INTO delivery (message_id, endpoint_id, status, attempts, next_attempt_at, updated_at) \
             VALUES {values} RETURNING seq, message_id, endpoint_id"
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for (_, m, endpoint_id) in chunk {
            query = query
                .bind(&m.id)
                .bind(*endpoint_id)
                .bind(m.created_at)
                .bind(m.created_at);
        }
        // RETURNING order is unspecified: match rows back by (message, endpoint), which is unique here.
        let index_of: HashMap<(&str, &str), usize> = chunk
            .iter()
            .map(|(index, m, ep)| ((m.id.as_str(), *ep), *index))
            .collect();
        for row in query.fetch_all(&mut *conn).await? {
            let message_id: String = row.try_get("message_id")?;
            let endpoint_id: String = row.try_get("endpoint_id")?;
            let index = index_of
                .get(&(message_id.as_str(), endpoint_id.as_str()))
                .copied()
                .ok_or_else(|| StoreError::Corrupt("a delivery came back that was not inserted".into()))?;
            by_job.entry(index).or_default().push(CreatedDelivery {
                seq: row.try_get("seq")?,
                endpoint_id,
            });
        }
    }
    Ok(by_job)
}

/// Append a batch of attempts and move their deliveries on, in three statements per chunk.
///
/// A delivery may appear more than once in a batch (a fast retry finished before the previous result
/// was written); its row takes the state of its latest attempt. As in the careful path, only deliveries
/// still pending are updated.
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
                .bind(&a.id)
                .bind(record.delivery_seq)
                .bind(&record.app_id)
                .bind(&a.message_id)
                .bind(&a.endpoint_id)
                .bind(&a.url)
                .bind(i64::from(a.attempt_number))
                .bind(a.success)
                .bind(&a.outcome)
                .bind(a.response_status.map(i64::from))
                .bind(&a.response)
                .bind(a.duration_ms)
                .bind(a.trigger.code())
                .bind(a.created_at);
        }
        query.execute(&mut *conn).await?;
    }

    let mut latest: HashMap<i64, &AttemptRecord> = HashMap::new();
    for record in records {
        let slot = latest.entry(record.delivery_seq).or_insert(record);
        if record.attempt.attempt_number > slot.attempt.attempt_number {
            *slot = record;
        }
    }
    let latest: Vec<&AttemptRecord> = latest.into_values().collect();
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
                .bind(a.created_at + a.duration_ms);
        }
        query.execute(&mut *conn).await?;
    }

    super::events::record_attempt_events(conn, records).await
}
