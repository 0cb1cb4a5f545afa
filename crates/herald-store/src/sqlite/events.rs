//! Operational events on SQLite: each is written in the transaction of the change it reports, so an event
//! is recorded if and only if its change committed; the table doubles as the outbox the operational
//! webhook's sender reads (`sent_at IS NULL` until delivered).

use std::collections::HashSet;

use herald_core::id::{EndpointId, MessageId};
use sqlx::{AssertSqlSafe, SqliteConnection};

use super::chunk::ROWS_PER_INSERT;
use crate::events::NewEvent;
use crate::events::{self, ATTEMPT_EXHAUSTED, ATTEMPT_FAILING, ATTEMPT_RECOVERED};
use crate::rows::Columns;
use crate::{AttemptRecord, StoreResult};

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
                .bind(event.app_id.as_str())
                .bind(event.message_id.as_deref())
                .bind(event.endpoint_id.as_deref())
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
    let troubled = troubled_deliveries(conn, &events::may_recover(records)).await?;
    record(conn, &events::attempt_events(records, troubled)).await
}

/// Of these successes' (message, endpoint) pairs, those with a `failing` or `exhausted` event newer than
/// their latest `recovered` one.
async fn troubled_deliveries(
    conn: &mut SqliteConnection,
    successes: &[&AttemptRecord],
) -> StoreResult<HashSet<(MessageId, EndpointId)>> {
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
            query = query
                .bind(record.attempt.message_id.as_str())
                .bind(record.attempt.endpoint_id.as_str());
        }
        for row in query.fetch_all(&mut *conn).await? {
            troubled.insert((row.id("message_id")?, row.id("endpoint_id")?));
        }
    }
    Ok(troubled)
}
