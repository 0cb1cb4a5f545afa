//! Operational events on PostgreSQL: recorded in the transaction of the change they report (see
//! [`crate::events`]), read back by the operational webhook's sender.

use std::collections::HashSet;

use sqlx::PgConnection;

use crate::events::{self, ATTEMPT_EXHAUSTED, ATTEMPT_FAILING, ATTEMPT_RECOVERED, NewEvent};
use crate::rows::Columns;
use crate::{AttemptRecord, StoreResult};

/// Append events (in order) on a connection inside the caller's transaction.
pub(crate) async fn record(conn: &mut PgConnection, events: &[NewEvent]) -> StoreResult<()> {
    if events.is_empty() {
        return Ok(());
    }
    let texts = |f: fn(&NewEvent) -> Option<String>| events.iter().map(f).collect::<Vec<_>>();
    sqlx::query(
        "INSERT INTO operational_event (event_type, app_id, message_id, endpoint_id, data, created_at) \
         SELECT t, a, m, e, d, c FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], \
         $6::bigint[]) WITH ORDINALITY AS v (t, a, m, e, d, c, n) ORDER BY n",
    )
    .bind(texts(|e| Some(e.event_type.to_owned())))
    .bind(texts(|e| Some(e.app_id.to_string())))
    .bind(texts(|e| e.message_id.as_ref().map(ToString::to_string)))
    .bind(texts(|e| e.endpoint_id.as_ref().map(ToString::to_string)))
    .bind(texts(|e| Some(e.data.to_string())))
    .bind(events.iter().map(|e| e.created_at).collect::<Vec<_>>())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Record the `message.attempt.*` events of a batch of results (inside the results' transaction).
pub(crate) async fn record_attempt_events(conn: &mut PgConnection, records: &[AttemptRecord]) -> StoreResult<()> {
    let candidates = events::may_recover(records);
    let mut troubled = HashSet::new();
    if !candidates.is_empty() {
        let messages: Vec<&str> = candidates.iter().map(|r| r.attempt.message_id.as_str()).collect();
        let endpoints: Vec<&str> = candidates.iter().map(|r| r.attempt.endpoint_id.as_str()).collect();
        let found = sqlx::query(
            "SELECT p.message_id, p.endpoint_id FROM UNNEST($1::text[], $2::text[]) AS p (message_id, endpoint_id) \
             WHERE (SELECT MAX(seq) FROM operational_event e WHERE e.message_id = p.message_id \
              AND e.endpoint_id = p.endpoint_id AND e.event_type IN ($3, $4)) \
             > COALESCE((SELECT MAX(seq) FROM operational_event e WHERE e.message_id = p.message_id \
              AND e.endpoint_id = p.endpoint_id AND e.event_type = $5), 0)",
        )
        .bind(&messages)
        .bind(&endpoints)
        .bind(ATTEMPT_FAILING)
        .bind(ATTEMPT_EXHAUSTED)
        .bind(ATTEMPT_RECOVERED)
        .fetch_all(&mut *conn)
        .await?;
        for row in &found {
            troubled.insert((row.id("message_id")?, row.id("endpoint_id")?));
        }
    }
    record(conn, &events::attempt_events(records, troubled)).await
}
