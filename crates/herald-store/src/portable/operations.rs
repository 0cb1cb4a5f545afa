//! Operators' repairs, written once for both dialects: re-queueing deliveries (resend, recover, bulk
//! replay) and adding the deliveries a replay finds missing.
//!
//! A re-queued delivery gets a *new* sequence number (its row is re-inserted, then the old one deleted, in
//! one transaction): the scheduler reads each endpoint's backlog in `seq` order from a cursor, so a
//! delivery that becomes pending again must sort after everything already read. For the same reason the
//! new `seq`s follow commit order ([`Dialect::order_seqs`]: on PostgreSQL, where nodes write concurrently,
//! each transaction first takes the lock ingest takes). Each holds its endpoint until it commits, so the
//! endpoint cannot be deleted under it (`hold_endpoint`). The endpoint's owner — on PostgreSQL maybe on
//! another node — hears of its new work at commit ([`Dialect::work_queued`]). These writes come from the
//! API on any node, like ingest, so they are not fenced.

use std::borrow::Cow;

use herald_core::clock::Millis;
use herald_core::id::{EndpointId, MessageId};
use herald_core::model::{AttemptTrigger, DeliveryStatus, Endpoint};

use super::selected;
use crate::dialect::{Dialect, SqlStore, Tx};
use crate::rows::{self, Columns};
use crate::sql::limit;
use crate::statement::{Arg, Sql};
use crate::{Requeue, RequeueChunk, RequeueSelection, StoreError, StoreResult};

/// `, partition` where delivery rows carry one ([`Dialect::PARTITIONED`]), to follow `endpoint_id` in a
/// column list.
fn partition_column<D: Dialect>() -> &'static str {
    if D::PARTITIONED { ", partition" } else { "" }
}

/// Hold the endpoint whose deliveries this transaction re-inserts or adds, so that it cannot be deleted
/// before the transaction commits (what the foreign key from `delivery` did where there is one; see
/// `delete_endpoints`), then take the ingest order lock ([`Dialect::order_seqs`]); `NotFound` once the
/// endpoint is gone.
///
/// The endpoint first: a deletion holds the endpoint's row while it deletes its deliveries, which may take
/// a while, and a transaction waiting for that row must not hold the ingest lock every node's ingest
/// needs meanwhile. And before any delivery row is read or locked: the deletion locks the endpoint's row
/// first, then its deliveries, and the two must never wait for each other the other way round.
async fn hold_endpoint<D: Dialect>(tx: &mut Tx<D>, endpoint_id: &EndpointId) -> StoreResult<()> {
    Sql::new(format!("SELECT id FROM endpoint WHERE id = $1{}", D::KEY_SHARE))
        .bind(endpoint_id)
        .fetch_optional(tx.on())
        .await?
        .ok_or(StoreError::NotFound)?;
    D::order_seqs(tx).await
}

/// Re-insert the deliveries `seqs` as pending with a fresh schedule (the trigger of their next attempt,
/// their time window starting now), then delete the old rows; returns the new sequence numbers. The
/// caller ordered the transaction's `seq`s ([`Dialect::order_seqs`]).
async fn reinsert<D: Dialect>(
    tx: &mut Tx<D>,
    seqs: &[i64],
    trigger: AttemptTrigger,
    now: Millis,
) -> StoreResult<Vec<i64>> {
    if seqs.is_empty() {
        return Ok(Vec::new());
    }
    let partition = partition_column::<D>();
    let fresh = Sql::new(format!(
        "INSERT INTO delivery (message_id, endpoint_id{partition}, status, attempts, next_attempt_at, \
         updated_at, window_start, next_trigger) \
         SELECT message_id, endpoint_id{partition}, 0, 0, $1, $1, $1, $2 FROM delivery WHERE {} \
         ORDER BY seq RETURNING seq",
        D::in_list("seq", "$3")
    ))
    .bind(now)
    .bind(trigger.code())
    .bind(Arg::Ints(Cow::Borrowed(seqs)))
    .fetch_all(tx.on())
    .await?;
    let fresh = fresh
        .iter()
        .map(|row| row.int("seq"))
        .collect::<StoreResult<Vec<_>>>()?;
    Sql::new(format!("DELETE FROM delivery WHERE {}", D::in_list("seq", "$1")))
        .bind(Arg::Ints(Cow::Borrowed(seqs)))
        .execute(tx.on())
        .await?;
    D::work_queued(tx).await?;
    Ok(fresh)
}

/// See [`crate::Store::requeue_delivery`].
pub(super) async fn requeue_delivery<D: Dialect>(
    store: &SqlStore<D>,
    message_id: &MessageId,
    endpoint_id: &EndpointId,
    trigger: AttemptTrigger,
    now: Millis,
) -> StoreResult<Requeue> {
    let mut tx = store.begin().await?;
    hold_endpoint(&mut tx, endpoint_id).await?;
    let row = Sql::new(format!(
        "SELECT d.seq, d.status, m.expunged FROM delivery d JOIN message m ON m.id = d.message_id \
         WHERE d.message_id = $1 AND d.endpoint_id = $2{}",
        D::for_update(Some("d"))
    ))
    .bind(message_id)
    .bind(endpoint_id)
    .fetch_optional(tx.on())
    .await?
    .ok_or(StoreError::NotFound)?;
    let seq = row.int("seq")?;
    if row.int("status")? == DeliveryStatus::Pending.code() {
        return Ok(Requeue::AlreadyPending);
    }
    if row.flag("expunged")? {
        return Ok(Requeue::Expunged);
    }
    let fresh = reinsert(&mut tx, &[seq], trigger, now).await?;
    tx.commit().await?;
    fresh.first().copied().map(Requeue::Queued).ok_or(StoreError::NotFound)
}

/// See [`crate::Store::requeue_selected`].
pub(super) async fn requeue_selected<D: Dialect>(
    store: &SqlStore<D>,
    selection: &RequeueSelection,
    limit_n: usize,
    now: Millis,
) -> StoreResult<RequeueChunk> {
    let mut sql = selected::<D>("d.seq", selection);
    // Page by page in seq order: on SQLite the index `delivery_endpoint (endpoint_id)` (whose entries
    // carry the rowid, `seq`) walks one endpoint's deliveries in that order and stops at the limit; without
    // it, every page would gather and sort the endpoint's whole remaining range (`USE TEMP B-TREE FOR
    // ORDER BY` with `delivery_endpoint_status`), and a replay of a million dead deliveries would sort a
    // million rows 3,000 times. So that index is not redundant there, though its columns are a prefix.
    sql.push(" ORDER BY d.seq LIMIT ")
        .push_bind(limit(limit_n))
        .push(&D::for_update(Some("d")));
    let mut tx = store.begin().await?;
    hold_endpoint(&mut tx, &selection.endpoint_id).await?;
    let found = sql.fetch_all(tx.on()).await?;
    let seqs = found
        .iter()
        .map(|row| row.int("seq"))
        .collect::<StoreResult<Vec<_>>>()?;
    let fresh = reinsert(&mut tx, &seqs, selection.trigger, now).await?;
    tx.commit().await?;
    Ok(RequeueChunk {
        queued: fresh.len() as u64,
        last_seq: seqs.last().copied(),
    })
}

/// See [`crate::Store::add_missing_deliveries`].
pub(super) async fn add_missing_deliveries<D: Dialect>(
    store: &SqlStore<D>,
    endpoint: &Endpoint,
    since: Millis,
    until: Millis,
    after: Option<&MessageId>,
    limit_n: usize,
    now: Millis,
) -> StoreResult<(Option<MessageId>, u64)> {
    let mut tx = store.begin().await?;
    hold_endpoint(&mut tx, &endpoint.id).await?;
    let found = Sql::new(
        "SELECT m.id, m.event_type, m.channels, m.expunged, \
         EXISTS (SELECT 1 FROM delivery d WHERE d.message_id = m.id AND d.endpoint_id = $1) AS has_delivery \
         FROM message m WHERE m.app_id = $2 AND m.created_at >= $3 AND m.created_at < $4 AND m.id > $5 \
         ORDER BY m.id LIMIT $6",
    )
    .bind(&endpoint.id)
    .bind(&endpoint.app_id)
    .bind(since)
    .bind(until)
    .bind(after.map_or("", MessageId::as_str))
    .bind(limit(limit_n))
    .fetch_all(tx.on())
    .await?;
    let missing = rows::missing_for(endpoint, &found)?;
    if !missing.is_empty() {
        let mut insert = Sql::default()
            .bind(Arg::Texts(missing.iter().map(MessageId::as_str).collect()))
            .bind(&endpoint.id)
            .bind(now)
            .bind(AttemptTrigger::Recover.code());
        let partition = partition_column::<D>();
        let partition_value = if D::PARTITIONED {
            format!(", {}", insert.mark(crate::partition_of(&endpoint.id)))
        } else {
            String::new()
        };
        // In list order, so the new `seq`s follow the messages' ids.
        insert.push(&format!(
            "INSERT INTO delivery (message_id, endpoint_id{partition}, status, attempts, next_attempt_at, \
             updated_at, window_start, next_trigger) \
             SELECT v.value, $2{partition_value}, 0, 0, $3, $3, $3, $4 FROM {} ORDER BY v.n",
            D::list_rows("$1", "v")
        ));
        insert.execute(tx.on()).await?;
        D::work_queued(&mut tx).await?;
    }
    tx.commit().await?;
    let last = if found.len() < limit_n {
        None
    } else {
        found.last().map(|row| row.id("id")).transpose()?
    };
    Ok((last, missing.len() as u64))
}
