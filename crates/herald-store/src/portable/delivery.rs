//! What the delivery engine needs from the store ([`DeliveryStore`]), written once for both dialects.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use herald_core::clock::Millis;
use herald_core::id::{AppId, AppIdOrUid, EndpointId};
use herald_core::model::{Application, AttemptTrigger, DisabledReason, Endpoint, OperationalEvent, PreviousSecret};

use super::{count, decode_all, secrets};
use crate::dialect::{Dialect, SqlStore};
use crate::events::{self, NewEvent};
use crate::rows::{self, Columns};
use crate::sql::limit;
use crate::statement::{Arg, Sql};
use crate::{
    AttemptRecord, Backlog, ChangeStream, DeliveryStore, Ownership, PendingDelivery, SendingRecord, StoreError,
    StoreResult,
};

#[async_trait::async_trait]
impl<D: Dialect> DeliveryStore for SqlStore<D> {
    async fn get_app(&self, id_or_uid: &AppIdOrUid) -> StoreResult<Application> {
        let row = Sql::new("SELECT * FROM application WHERE id = $1 OR uid = $1 LIMIT 1")
            .bind(id_or_uid)
            .fetch_optional(self.reads())
            .await?
            .ok_or(StoreError::NotFound)?;
        rows::application(&row)
    }

    async fn get_endpoint_by_id(&self, id: &EndpointId) -> StoreResult<Endpoint> {
        let row = Sql::new("SELECT * FROM endpoint WHERE id = $1")
            .bind(id)
            .fetch_optional(self.reads())
            .await?
            .ok_or(StoreError::NotFound)?;
        self.endpoint(&row)
    }

    async fn previous_secrets(&self, endpoint_id: &EndpointId, now: Millis) -> StoreResult<Vec<PreviousSecret>> {
        let mut previous = secrets::previous(self, std::slice::from_ref(endpoint_id), now).await?;
        Ok(previous.remove(endpoint_id).unwrap_or_default())
    }

    async fn sending_records(&self, endpoint_ids: &[EndpointId], now: Millis) -> StoreResult<Vec<SendingRecord>> {
        if endpoint_ids.is_empty() {
            return Ok(Vec::new());
        }
        // Three reads for the whole list, whatever its length: an engine meeting a thousand endpoints at
        // once (its start, a wide fan-out's first message) made three thousand round trips otherwise.
        let found = Sql::new(format!("SELECT * FROM endpoint WHERE {}", D::in_list("id", "$1")))
            .bind(Arg::Texts(endpoint_ids.iter().map(EndpointId::as_str).collect()))
            .fetch_all(self.reads())
            .await?;
        let endpoints = decode_all(&found, |row| self.endpoint(row))?;
        let mut previous = secrets::previous(self, endpoint_ids, now).await?;
        let app_ids: HashSet<&str> = endpoints.iter().map(|e| e.app_id.as_str()).collect();
        let found = Sql::new(format!("SELECT * FROM application WHERE {}", D::in_list("id", "$1")))
            .bind(Arg::Texts(app_ids.into_iter().collect()))
            .fetch_all(self.reads())
            .await?;
        let apps: HashMap<AppId, Application> = decode_all(&found, rows::application)?
            .into_iter()
            .map(|app| (app.id.clone(), app))
            .collect();
        // An endpoint whose application went between the reads is gone with it.
        Ok(endpoints
            .into_iter()
            .filter_map(|endpoint| {
                let app = apps.get(&endpoint.app_id)?.clone();
                let previous_secrets = previous.remove(&endpoint.id).unwrap_or_default();
                Some(SendingRecord {
                    endpoint,
                    previous_secrets,
                    app,
                })
            })
            .collect())
    }

    async fn endpoints_with_pending(&self) -> StoreResult<Vec<EndpointId>> {
        let found = Sql::new("SELECT DISTINCT endpoint_id FROM delivery WHERE status = 0")
            .fetch_all(self.reads())
            .await?;
        decode_all(&found, |row| row.id("endpoint_id"))
    }

    async fn load_pending(
        &self,
        endpoint_id: &EndpointId,
        after_seq: i64,
        limit_n: usize,
    ) -> StoreResult<Vec<PendingDelivery>> {
        self.load_pending_of(&[(endpoint_id.clone(), after_seq)], limit_n).await
    }

    async fn load_pending_of(&self, reads: &[(EndpointId, i64)], limit_n: usize) -> StoreResult<Vec<PendingDelivery>> {
        // One endpoint's next deliveries, the endpoint and the cursor named by `endpoint` and `after`: an
        // index range read of its pending deliveries.
        let next = |endpoint: &str, after: &str| {
            format!(
                "SELECT d.seq, d.endpoint_id, d.attempts, d.next_attempt_at, d.next_trigger, \
                 COALESCE(d.window_start, m.created_at) AS window_start, {} FROM delivery d \
                 JOIN message m ON m.id = d.message_id \
                 WHERE d.endpoint_id = {endpoint} AND d.status = 0 AND d.seq > {after} ORDER BY d.seq LIMIT $3",
                rows::MESSAGE_COLUMNS
            )
        };
        let mut found = Vec::new();
        if D::LATERAL && reads.len() > 1 {
            // Every endpoint's read in one statement: a node meeting a thousand endpoints at once (a wide
            // fan-out's first message, with several nodes) made a thousand round trips otherwise.
            let text = format!(
                "SELECT p.* FROM {} JOIN {} ON a.n = r.n CROSS JOIN LATERAL ({}) AS p ORDER BY r.n, p.seq",
                D::list_rows("$1", "r"),
                D::list_rows("$2", "a"),
                next("r.value", "a.value")
            );
            found = Sql::new(text)
                .bind(Arg::Texts(reads.iter().map(|(id, _)| id.as_str()).collect()))
                .bind(Arg::Ints(reads.iter().map(|(_, after)| *after).collect()))
                .bind(limit(limit_n))
                .fetch_all(self.reads())
                .await?;
        } else {
            // SQLite reads in-process: a statement per endpoint costs no round trip.
            let text = next("$1", "$2");
            for (endpoint_id, after_seq) in reads {
                let rows = Sql::new(text.as_str())
                    .bind(endpoint_id)
                    .bind(*after_seq)
                    .bind(limit(limit_n))
                    .fetch_all(self.reads())
                    .await?;
                found.extend(rows);
            }
        }
        decode_all(&found, |row| {
            Ok(PendingDelivery {
                seq: row.int("seq")?,
                endpoint_id: row.id("endpoint_id")?,
                message: Arc::new(rows::message(row)?),
                attempts: count(row.int("attempts")?),
                next_attempt_at: row.time("next_attempt_at")?,
                window_start: row.time("window_start")?,
                trigger: AttemptTrigger::from_code(row.int("next_trigger")?),
            })
        })
    }

    async fn record_attempts(&self, records: &[AttemptRecord]) -> StoreResult<()> {
        self.watched(D::record_attempts(self, records).await)
    }

    async fn expire_deliveries(&self, seqs: &[i64], now: Millis) -> StoreResult<()> {
        D::expire_deliveries(self, seqs, now).await
    }

    async fn expire_waiting(&self, endpoint_id: &EndpointId, created_before: Millis, now: Millis) -> StoreResult<u64> {
        D::expire_waiting(self, endpoint_id, created_before, now).await
    }

    async fn endpoint_backlogs(&self, endpoint_ids: &[EndpointId]) -> StoreResult<Vec<Backlog>> {
        if endpoint_ids.is_empty() {
            return Ok(Vec::new());
        }
        // Per endpoint, its pending-index head: a count bounded at COUNT_CAP + 1 and the oldest pending
        // delivery's creation time (seq follows creation order). One statement for the whole list: an
        // engine meeting a thousand endpoints at once (a node's start, a wide fan-out's first message on
        // PostgreSQL) asks for a thousand counts, one round trip each otherwise.
        let text = format!(
            "SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM delivery WHERE endpoint_id = e.value AND status = 0 \
             LIMIT {cap}) AS counted) AS pending, (SELECT m.created_at FROM delivery d \
             JOIN message m ON m.id = d.message_id WHERE d.endpoint_id = e.value AND d.status = 0 \
             ORDER BY d.seq LIMIT 1) AS oldest FROM {list} ORDER BY e.n",
            cap = Backlog::COUNT_CAP + 1,
            list = D::list_rows("$1", "e"),
        );
        let found = Sql::new(text)
            .bind(Arg::Texts(endpoint_ids.iter().map(EndpointId::as_str).collect()))
            .fetch_all(self.reads())
            .await?;
        decode_all(&found, |row| {
            Ok(Backlog::from_count(row.int("pending")?, row.opt_time("oldest")?))
        })
    }

    async fn disable_endpoint(
        &self,
        endpoint_id: &EndpointId,
        reason: &DisabledReason,
        now: Millis,
    ) -> StoreResult<bool> {
        let mut tx = self.begin().await?;
        let updated = Sql::new(
            "UPDATE endpoint SET disabled = TRUE, disabled_reason = $1, updated_at = $2 \
             WHERE id = $3 AND NOT disabled RETURNING app_id",
        )
        .free(reason.as_str())
        .bind(now)
        .bind(endpoint_id)
        .fetch_optional(tx.on())
        .await?;
        let Some(row) = updated else {
            return Ok(false);
        };
        let event = NewEvent::about_endpoint(
            events::ENDPOINT_DISABLED,
            &row.id("app_id")?,
            endpoint_id,
            None,
            serde_json::json!({ "reason": reason.as_str(), "trigger": "automatic" }),
            now,
        );
        D::record_events(&mut tx, &[event]).await?;
        tx.commit().await?;
        self.endpoint_changed(endpoint_id).await;
        Ok(true)
    }

    async fn set_endpoint_state(
        &self,
        endpoint_id: &EndpointId,
        expected_reason: &DisabledReason,
        read_at: Millis,
        disabled: bool,
        reason: Option<&DisabledReason>,
        now: Millis,
    ) -> StoreResult<bool> {
        let changed = Sql::new(
            "UPDATE endpoint SET disabled = $1, disabled_reason = $2, updated_at = $3 \
             WHERE id = $4 AND disabled_reason = $5 AND updated_at = $6",
        )
        .bind(disabled)
        .opt_free(reason.map(DisabledReason::as_str))
        .bind(now)
        .bind(endpoint_id)
        .free(expected_reason.as_str())
        .bind(read_at)
        .execute(self.writes())
        .await?
            == 1;
        if changed {
            self.endpoint_changed(endpoint_id).await;
        }
        Ok(changed)
    }

    async fn unsent_operational_events(&self, after: i64, limit_n: usize) -> StoreResult<Vec<OperationalEvent>> {
        let found = Sql::new(
            "SELECT seq, event_type, app_id, data, created_at FROM operational_event \
             WHERE sent_at IS NULL AND seq > $1 ORDER BY seq LIMIT $2",
        )
        .bind(after)
        .bind(limit(limit_n))
        .fetch_all(self.reads())
        .await?;
        decode_all(&found, rows::operational_event)
    }

    async fn mark_operational_event_sent(&self, seq: i64, now: Millis) -> StoreResult<()> {
        Sql::new("UPDATE operational_event SET sent_at = $1 WHERE seq = $2 AND sent_at IS NULL")
            .bind(now)
            .bind(seq)
            .execute(self.writes())
            .await?;
        Ok(())
    }

    fn take_changes(&self) -> Option<ChangeStream> {
        self.changes.lock().ok()?.take()
    }

    fn results_per_call(&self) -> usize {
        D::RESULTS_PER_CALL
    }

    fn ownership(&self) -> Option<Arc<dyn Ownership>> {
        D::ownership(self)
    }
}
