//! Expiry's write, the same on both dialects: deliveries that waited past their time window are marked
//! dead, each with its `message.attempt.exhausted` event, in the caller's transaction. Which deliveries
//! expire is the dialect's to find ([`Dialect::expire_deliveries`], [`Dialect::expire_waiting`]): on
//! PostgreSQL only those of the partitions this node holds, fenced on its leases.

use std::borrow::Cow;

use herald_core::clock::Millis;
use herald_core::model::DeliveryStatus;

use crate::StoreResult;
use crate::dialect::{Dialect, Tx};
use crate::events::{self, Expired};
use crate::statement::{Arg, Sql};

/// Mark these pending deliveries dead (those still pending: a result may have settled one meanwhile), with
/// the `message.attempt.exhausted` event of each, inside the caller's transaction, which read them with
/// their rows locked where rows can be locked.
pub(crate) async fn settle_expired<D: Dialect>(tx: &mut Tx<D>, expiring: &[Expired], now: Millis) -> StoreResult<()> {
    if expiring.is_empty() {
        return Ok(());
    }
    let seqs: Vec<i64> = expiring.iter().map(|e| e.seq).collect();
    Sql::new(format!(
        "UPDATE delivery SET status = $1, updated_at = $2 WHERE status = 0 AND {}",
        D::in_list("seq", "$3")
    ))
    .bind(DeliveryStatus::Dead.code())
    .bind(now)
    .bind(Arg::Ints(Cow::Owned(seqs)))
    .execute(tx.on())
    .await?;
    D::record_events(tx, &events::expired_events(expiring, now)).await
}
