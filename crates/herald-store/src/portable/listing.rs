//! The listings whose statements are assembled from their filters: messages, attempts, deliveries,
//! attempt buckets. Each filter adds its condition and binds its value; absent filters add nothing.

use herald_core::clock::Millis;
use herald_core::id::{AppId, EndpointId};

use crate::dialect::Dialect;
use crate::rows::{self, Columns};
use crate::sql::Keyset;
use crate::statement::{Arg, Sql};
use crate::{
    AppFilter, AttemptBucket, AttemptFilter, DeliveryFilter, DeliveryRecord, MessageFilter, PageRequest,
    SVIX_PLAY_URL_PREFIX, StoreError, StoreResult,
};

/// Append ` AND column IN ($a, $b, …)`; an empty list matches nothing.
pub(super) fn push_in<'a>(sql: &mut Sql<'a>, column: &str, values: &'a [String]) {
    if values.is_empty() {
        sql.push(" AND 1 = 0");
        return;
    }
    let marks = sql.marks(values);
    sql.push(&format!(" AND {column} IN ({marks})"));
}

/// Append ` AND column IN (the messages of the app ($1) with this tag)`, read from the tag index.
fn push_tagged<'a>(sql: &mut Sql<'a>, column: &str, tag: &'a str) {
    let mark = sql.mark(tag);
    sql.push(&format!(
        " AND {column} IN (SELECT message_id FROM message_tag WHERE app_id = $1 AND tag = {mark})"
    ));
}

/// An app's messages (see [`crate::Store::list_messages`]). Filtered by a tag, the listing walks the tag
/// index (`message_tag`, keyed by app, tag and message id) in id order and joins each message, so a page
/// costs its own rows whether the tag is common or rare.
pub(super) fn messages<'a, D: Dialect>(app_id: &'a AppId, filter: &'a MessageFilter, page: &'a PageRequest) -> Sql<'a> {
    let (from, key) = match filter.tag {
        Some(_) => (
            "message_tag t JOIN message m ON m.id = t.message_id WHERE t.app_id = $1",
            "t.message_id",
        ),
        None => ("message m WHERE m.app_id = $1", "m.id"),
    };
    let keyset = Keyset::new(key, page, !filter.oldest_first);
    let mut sql = Sql::new(format!("SELECT {} FROM {from}", rows::MESSAGE_COLUMNS)).bind(app_id);
    if let Some(tag) = &filter.tag {
        sql.push(" AND t.tag = ").push_bind(tag);
    }
    keyset.condition(&mut sql, page.after.as_deref().map(Arg::free));
    if let Some(since) = filter.since {
        sql.push(" AND m.created_at >= ").push_bind(since);
    }
    if let Some(until) = filter.until {
        sql.push(" AND m.created_at < ").push_bind(until);
    }
    if let Some(types) = &filter.event_types {
        push_in(&mut sql, "m.event_type", types);
    }
    if let Some(channel) = &filter.channel {
        let mark = sql.mark(channel);
        sql.push(" AND ").push(&D::json_array_contains("m.channels", &mark));
    }
    keyset.order_and_limit(&mut sql, page);
    sql
}

/// Append ` AND {column} IN (the app's ($1) messages on `channel`)`.
fn push_on_channel<'a, D: Dialect>(sql: &mut Sql<'a>, column: &str, channel: &'a str) {
    let mark = sql.mark(channel);
    sql.push(&format!(
        " AND {column} IN (SELECT id FROM message WHERE app_id = $1 AND {})",
        D::json_array_contains("channels", &mark)
    ));
}

/// Applications (see [`crate::Store::list_apps`]), before their page's keyset condition and order.
pub(super) fn apps(filter: &AppFilter) -> Sql<'static> {
    let mut sql = Sql::new("SELECT * FROM application a WHERE 1 = 1");
    // Whether the app has an endpoint matching `condition`.
    let any = |condition: &str| format!("EXISTS (SELECT 1 FROM endpoint e WHERE e.app_id = a.id{condition})");
    if filter.exclude_without_endpoints {
        sql.push(&format!(" AND {}", any("")));
    }
    if filter.exclude_only_disabled {
        sql.push(&format!(
            " AND NOT ({} AND NOT {})",
            any(""),
            any(" AND NOT e.disabled")
        ));
    }
    if filter.exclude_only_svix_play {
        let elsewhere = format!(" AND e.url NOT LIKE '{SVIX_PLAY_URL_PREFIX}%'");
        sql.push(&format!(" AND NOT ({} AND NOT {})", any(""), any(&elsewhere)));
    }
    sql
}

/// Attempts filtered on one column (`message_id` or `endpoint_id`) and `filter`, newest first.
pub(super) fn attempts<'a, D: Dialect>(
    app_id: &'a AppId,
    column: &'static str,
    value: &'a str,
    filter: &'a AttemptFilter,
    page: &'a PageRequest,
) -> Sql<'a> {
    let keyset = Keyset::new("id", page, true);
    let mut sql = Sql::new(format!("SELECT * FROM attempt WHERE app_id = $1 AND {column} = $2"))
        .bind(app_id)
        .bind(value);
    keyset.condition(&mut sql, page.after.as_deref().map(Arg::free));
    if let Some(success) = filter.success {
        sql.push(" AND success = ").push_bind(success);
    }
    match filter.status_code_class.map(i64::from) {
        Some(0) => {
            sql.push(" AND COALESCE(response_status, 0) = 0");
        }
        Some(class) => {
            sql.push(" AND response_status >= ").push_bind(class);
            sql.push(" AND response_status < ").push_bind(class + 100);
        }
        None => {}
    }
    if let Some(types) = &filter.event_types {
        sql.push(" AND message_id IN (SELECT id FROM message WHERE app_id = $1");
        push_in(&mut sql, "event_type", types);
        sql.push(")");
    }
    if let Some(tag) = &filter.tag {
        push_tagged(&mut sql, "message_id", tag);
    }
    if let Some(channel) = &filter.channel {
        push_on_channel::<D>(&mut sql, "message_id", channel);
    }
    if let Some(before) = filter.before {
        sql.push(" AND created_at < ").push_bind(before);
    }
    if let Some(after) = filter.after {
        sql.push(" AND created_at >= ").push_bind(after);
    }
    keyset.order_and_limit(&mut sql, page);
    sql
}

/// An app's deliveries, newest first (see [`crate::Store::list_deliveries`]); the page's iterator is a
/// delivery `seq`.
pub(super) fn deliveries<'a, D: Dialect>(
    app_id: &'a AppId,
    endpoint_id: Option<&'a EndpointId>,
    filter: &'a DeliveryFilter,
    page: &'a PageRequest,
) -> StoreResult<Sql<'a>> {
    let after = page
        .after
        .as_deref()
        .map(|text| text.parse::<i64>().map_err(|_| StoreError::BadIterator))
        .transpose()?;
    let keyset = Keyset::new("d.seq", page, true);
    let mut sql = Sql::new(format!(
        "SELECT d.seq, d.endpoint_id, d.status, d.attempts, d.next_attempt_at, d.updated_at, {} \
         FROM delivery d JOIN message m ON m.id = d.message_id WHERE m.app_id = $1",
        rows::MESSAGE_COLUMNS
    ))
    .bind(app_id);
    keyset.condition(&mut sql, after.map(Arg::from));
    if let Some(id) = endpoint_id {
        sql.push(" AND d.endpoint_id = ").push_bind(id);
    }
    if let Some(status) = filter.status {
        sql.push(" AND d.status = ").push_bind(status.code());
    }
    if let Some(tag) = &filter.tag {
        push_tagged(&mut sql, "d.message_id", tag);
    }
    if let Some(channel) = &filter.channel {
        let mark = sql.mark(channel);
        sql.push(" AND ").push(&D::json_array_contains("m.channels", &mark));
    }
    if let Some(types) = &filter.event_types {
        push_in(&mut sql, "m.event_type", types);
    }
    if let Some(before) = filter.before {
        sql.push(" AND m.created_at < ").push_bind(before);
    }
    if let Some(after) = filter.after {
        sql.push(" AND m.created_at >= ").push_bind(after);
    }
    keyset.order_and_limit(&mut sql, page);
    Ok(sql)
}

/// The latest attempt of each (message, endpoint) among these deliveries' messages (at least one).
pub(super) fn last_attempts<'a>(records: &'a [DeliveryRecord]) -> Sql<'a> {
    let mut sql = Sql::default();
    let marks = sql.marks(records.iter().map(|r| r.message.id.as_str()));
    sql.push(&format!(
        "SELECT * FROM attempt WHERE id IN (SELECT MAX(id) FROM attempt WHERE message_id IN ({marks}) \
         GROUP BY message_id, endpoint_id)"
    ));
    sql
}

/// An endpoint's attempts per time bucket (see [`crate::Store::attempt_buckets`]). The smallest attempt id
/// of the window is bound too, so the `(endpoint_id, id)` index is read from the window's start only (ids
/// sort by creation time).
pub(super) fn attempt_buckets(endpoint_id: &EndpointId, since: Millis, until: Millis, bucket_ms: i64) -> Sql<'_> {
    let first_id = herald_core::id::lower_bound(herald_core::id::IdKind::Attempt, since);
    Sql::new(
        "SELECT (created_at - $1) / $2 AS bucket, \
         SUM(CASE WHEN success THEN 1 ELSE 0 END) AS succeeded, COUNT(*) AS total, \
         CAST(SUM(duration_ms) AS BIGINT) AS duration_sum, MAX(duration_ms) AS duration_max \
         FROM attempt WHERE endpoint_id = $3 AND id >= $4 \
         AND created_at >= $1 AND created_at < $5 GROUP BY 1 ORDER BY 1",
    )
    .bind(since)
    .bind(bucket_ms.max(1))
    .bind(endpoint_id)
    .bind(first_id)
    .bind(until)
}

/// Decode one row of [`attempt_buckets`].
pub(super) fn attempt_bucket(row: &impl Columns) -> StoreResult<AttemptBucket> {
    let succeeded = row.int("succeeded")?;
    let total = row.int("total")?;
    Ok(AttemptBucket {
        index: row.int("bucket")?,
        succeeded: u64::try_from(succeeded).unwrap_or(0),
        failed: u64::try_from(total - succeeded).unwrap_or(0),
        total_duration_ms: row.opt_int("duration_sum")?.unwrap_or(0),
        max_duration_ms: row.opt_int("duration_max")?.unwrap_or(0),
    })
}
