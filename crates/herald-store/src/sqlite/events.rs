//! Operational events on SQLite: each is written in the transaction of the change it reports, so an event
//! is recorded if and only if its change committed; the table doubles as the outbox the operational
//! webhook's sender reads (`sent_at IS NULL` until delivered).

use std::collections::HashSet;

use herald_core::model::{DeliveryStatus, Endpoint, OperationalEvent};
use serde_json::{Value, json};
use sqlx::sqlite::SqliteRow;
use sqlx::{AssertSqlSafe, Row, SqliteConnection, SqlitePool};

use super::bulk::ROWS_PER_INSERT;
use crate::{AttemptRecord, StoreResult};

/// A delivery's attempt number whose failure is reported (Svix: "failed 4 times").
pub(crate) const FAILING_AFTER_ATTEMPTS: u32 = 4;

pub(crate) const ENDPOINT_CREATED: &str = "endpoint.created";
pub(crate) const ENDPOINT_UPDATED: &str = "endpoint.updated";
pub(crate) const ENDPOINT_DELETED: &str = "endpoint.deleted";
pub(crate) const ENDPOINT_DISABLED: &str = "endpoint.disabled";
const ATTEMPT_FAILING: &str = "message.attempt.failing";
const ATTEMPT_EXHAUSTED: &str = "message.attempt.exhausted";
const ATTEMPT_RECOVERED: &str = "message.attempt.recovered";

/// An event to record.
pub(crate) struct NewEvent {
    pub(crate) event_type: &'static str,
    pub(crate) app_id: String,
    /// Set for events about one delivery.
    pub(crate) message_id: Option<String>,
    pub(crate) endpoint_id: Option<String>,
    pub(crate) data: Value,
    pub(crate) created_at: i64,
}

impl NewEvent {
    /// An `endpoint.*` event; `extra` fields are added to the data.
    pub(crate) fn endpoint(event_type: &'static str, endpoint: &Endpoint, extra: Value, now: i64) -> Self {
        Self::about_endpoint(
            event_type,
            &endpoint.app_id,
            &endpoint.id,
            endpoint.uid.as_deref(),
            extra,
            now,
        )
    }

    pub(crate) fn about_endpoint(
        event_type: &'static str,
        app_id: &str,
        endpoint_id: &str,
        endpoint_uid: Option<&str>,
        extra: Value,
        now: i64,
    ) -> Self {
        let mut data = json!({ "appId": app_id, "endpointId": endpoint_id });
        if let Some(uid) = endpoint_uid {
            data["endpointUid"] = json!(uid);
        }
        merge(&mut data, extra);
        Self {
            event_type,
            app_id: app_id.to_owned(),
            message_id: None,
            endpoint_id: Some(endpoint_id.to_owned()),
            data,
            created_at: now,
        }
    }

    /// A `message.attempt.*` event about the delivery an attempt belongs to.
    fn attempt(event_type: &'static str, record: &AttemptRecord, extra: Value) -> Self {
        let a = &record.attempt;
        let finished = a.created_at.saturating_add(a.duration_ms);
        let mut data = json!({
            "appId": record.app_id,
            "endpointId": a.endpoint_id,
            "msgId": a.message_id,
            "attempts": a.attempt_number,
            "lastAttempt": {
                "id": a.id,
                "responseStatusCode": a.response_status.unwrap_or(0),
                "outcome": a.outcome,
                "timestamp": rfc3339(a.created_at),
            },
        });
        merge(&mut data, extra);
        Self {
            event_type,
            app_id: record.app_id.clone(),
            message_id: Some(a.message_id.clone()),
            endpoint_id: Some(a.endpoint_id.clone()),
            data,
            created_at: finished,
        }
    }
}

fn merge(data: &mut Value, extra: Value) {
    if let (Some(target), Value::Object(extra)) = (data.as_object_mut(), extra) {
        target.extend(extra);
    }
}

/// A time as RFC 3339 (what the API shows everywhere).
pub(crate) fn rfc3339(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_default()
}

/// Append events (in order) on a connection that is inside the caller's transaction.
pub(crate) async fn record(conn: &mut SqliteConnection, events: &[NewEvent]) -> StoreResult<()> {
    for chunk in events.chunks(ROWS_PER_INSERT) {
        let values = vec!["(?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ");
        let sql = format!(
            "INSERT INTO operational_event (event_type, app_id, message_id, endpoint_id, data, created_at) \
             VALUES {values}"
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for event in chunk {
            query = query
                .bind(event.event_type)
                .bind(&event.app_id)
                .bind(&event.message_id)
                .bind(&event.endpoint_id)
                .bind(event.data.to_string())
                .bind(event.created_at);
        }
        query.execute(&mut *conn).await?;
    }
    Ok(())
}

/// The `message.attempt.*` events a batch of attempt results causes, recorded on `conn` (inside the
/// transaction that writes the results).
///
/// A success is `recovered` only if a `failing` or `exhausted` event was recorded for its message and
/// endpoint since the last `recovered` one: operators hear of a recovery exactly when they heard of the
/// trouble. That needs the table only for successes that can follow a failure — a later attempt, or the
/// first attempt of a re-queued delivery (resend, recover) — so the common first-try success costs nothing.
pub(crate) async fn record_attempt_events(conn: &mut SqliteConnection, records: &[AttemptRecord]) -> StoreResult<()> {
    let may_recover: Vec<&AttemptRecord> = records
        .iter()
        .filter(|r| r.attempt.success && (r.attempt.attempt_number > 1 || r.attempt.trigger.code() != 0))
        .collect();
    let mut troubled = troubled_deliveries(conn, &may_recover).await?;
    let mut events = Vec::new();
    for record in records {
        let a = &record.attempt;
        let pair = (a.message_id.clone(), a.endpoint_id.clone());
        if a.success {
            if troubled.remove(&pair) {
                events.push(NewEvent::attempt(ATTEMPT_RECOVERED, record, json!({})));
            }
            continue;
        }
        if a.attempt_number == FAILING_AFTER_ATTEMPTS {
            events.push(NewEvent::attempt(ATTEMPT_FAILING, record, json!({})));
            troubled.insert(pair.clone());
        }
        let ended = match record.status {
            DeliveryStatus::Dead => Some("dead"),
            DeliveryStatus::Failed => Some("failed"),
            _ => None,
        };
        if let Some(status) = ended {
            events.push(NewEvent::attempt(
                ATTEMPT_EXHAUSTED,
                record,
                json!({ "deliveryStatus": status }),
            ));
            troubled.insert(pair);
        }
    }
    record(conn, &events).await
}

/// Of these successes' (message, endpoint) pairs, those with a `failing` or `exhausted` event newer than
/// their latest `recovered` one.
async fn troubled_deliveries(
    conn: &mut SqliteConnection,
    successes: &[&AttemptRecord],
) -> StoreResult<HashSet<(String, String)>> {
    let mut troubled = HashSet::new();
    for chunk in successes.chunks(ROWS_PER_INSERT) {
        let pairs = vec!["(?, ?)"; chunk.len()].join(", ");
        let sql = format!(
            "WITH p (message_id, endpoint_id) AS (VALUES {pairs}) \
             SELECT p.message_id, p.endpoint_id FROM p WHERE \
             (SELECT MAX(seq) FROM operational_event e WHERE e.message_id = p.message_id \
              AND e.endpoint_id = p.endpoint_id AND e.event_type IN ('{ATTEMPT_FAILING}', '{ATTEMPT_EXHAUSTED}')) \
             > COALESCE((SELECT MAX(seq) FROM operational_event e WHERE e.message_id = p.message_id \
              AND e.endpoint_id = p.endpoint_id AND e.event_type = '{ATTEMPT_RECOVERED}'), 0)"
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for record in chunk {
            query = query.bind(&record.attempt.message_id).bind(&record.attempt.endpoint_id);
        }
        for row in query.fetch_all(&mut *conn).await? {
            troubled.insert((row.try_get("message_id")?, row.try_get("endpoint_id")?));
        }
    }
    Ok(troubled)
}

/// Decode an `operational_event` row.
pub(crate) fn decode(row: &SqliteRow) -> StoreResult<OperationalEvent> {
    Ok(OperationalEvent {
        seq: row.try_get("seq")?,
        event_type: row.try_get("event_type")?,
        app_id: row.try_get("app_id")?,
        data: row.try_get("data")?,
        created_at: row.try_get("created_at")?,
    })
}

pub(super) async fn unsent(read: &SqlitePool, after: i64, limit: usize) -> StoreResult<Vec<OperationalEvent>> {
    let found = sqlx::query("SELECT * FROM operational_event WHERE sent_at IS NULL AND seq > ? ORDER BY seq LIMIT ?")
        .bind(after)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(read)
        .await?;
    found.iter().map(decode).collect()
}

pub(super) async fn mark_sent(write: &SqlitePool, seq: i64, now: i64) -> StoreResult<()> {
    sqlx::query("UPDATE operational_event SET sent_at = ? WHERE seq = ? AND sent_at IS NULL")
        .bind(now)
        .bind(seq)
        .execute(write)
        .await?;
    Ok(())
}
