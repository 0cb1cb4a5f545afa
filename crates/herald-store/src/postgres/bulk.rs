//! PostgreSQL's half of group commit, and the fenced result writer.
//!
//! A batch is written with array parameters (`UNNEST`) in one statement whatever its size: a data-modifying
//! `WITH` query per table ([`insert_all`]).
//! Before anything is written, the batch transaction takes the ingest lock
//! ([`BEGIN_IN_ORDER`](super::channels::BEGIN_IN_ORDER), held until it commits): nodes ingest concurrently, and
//! without it a transaction that drew lower `seq`s could commit after one that drew higher ones, and a
//! reader's cursor (`seq > n`) would skip it. The same lock serialises the
//! duplicate checks, so two nodes cannot both create a message for one `eventId`. The apps' rows are read
//! `FOR SHARE`: an endpoint write that changes the subscribers (whose trigger bumps its application's
//! `endpoints_version`) waits for the batch, so the cached endpoint lists are exact and a message is
//! never fanned out to an endpoint that is being deleted — without a foreign key checked per delivery row
//! (migration 0028).
//!
//! The batch never waits for an application's row, though: it holds the ingest lock, so every node's
//! ingest would wait with it, and the row may be held for seconds (`delete_app` deletes an application's
//! deliveries and messages under it). The rows are read `SKIP LOCKED`; the jobs of an application whose
//! row another transaction holds (an endpoint write, a delete) are deferred
//! ([`Outcome::Deferred`](crate::group_commit::Outcome)): not written in this batch, tried again by the
//! writer in a later one, when the row is free — then the application exists, or is gone and the job is
//! answered not found. The rest of the batch commits without waiting.
//!
//! On a node alone in its cluster (holding every partition), a batch whose apps the writer remembers
//! (see [`KnownApps`]) and that needs no other read takes one round trip instead of three (`BEGIN` with
//! the lock and the apps read; the inserts; `COMMIT`): its insert statement alone, a transaction of its
//! own, which tries the lock and checks the apps' rows itself (see [`super::remembered`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock};

use futures::future::BoxFuture;
use herald_core::clock::Millis;
use herald_core::id::EndpointId;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Executor, PgConnection, PgPool, Postgres, Row};

use super::channels::WORK_CHANNEL;
use super::lease::Leases;
use super::remembered::Remembered;
use crate::group_commit::{self, BatchWriter, IngestJob, Outcomes};
use crate::known_apps::{KnownApp, KnownApps};
use crate::plan::{self, Apps, Earlier, FanOut, NewRow};
use crate::split::{self, Expansion, Split};
use crate::subscribers::{self, Subscriber};
use crate::{AttemptRecord, CreatedDelivery, StoreResult, partition_of, rows};
use herald_sql::text::escape;

/// PostgreSQL's [`BatchWriter`], with each application's subscribers cached between batches.
pub(crate) struct PgBatches {
    /// This node's leases: its id, and whether other nodes must hear of a batch's deliveries.
    pub(crate) leases: Arc<Leases>,
    /// Each application's subscribers, cached between batches (see [`subscribers`]).
    pub(crate) subscribers: subscribers::Cache,
    /// The application rows the writer read last, with which a batch of apps it remembers is written in
    /// one round trip (see [`super::remembered`]).
    pub(crate) remembered: Remembered,
}

impl BatchWriter for PgBatches {
    type Db = Postgres;

    const BEGIN: &'static str = super::channels::BEGIN_IN_ORDER;

    const SPLITS: bool = true;

    fn write<'c>(&'c self, conn: &'c mut PgConnection, batch: &'c [IngestJob]) -> BoxFuture<'c, StoreResult<Outcomes>> {
        Box::pin(write(conn, batch, self, None))
    }

    fn write_committed<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        batch: &'c [IngestJob],
    ) -> BoxFuture<'c, StoreResult<Outcomes>> {
        Box::pin(async move {
            if let Some(answered) = self
                .remembered
                .write(conn, batch, &self.leases, &self.subscribers)
                .await
            {
                return answered;
            }
            let Some(opening) = begin_and_read_apps(&plan::app_ids(batch)) else {
                return group_commit::write_in_transaction(self, conn, batch).await;
            };
            let written = async {
                let found = opened_apps(sqlx::raw_sql(AssertSqlSafe(opening)).fetch_all(&mut *conn).await?)?;
                let outcomes = write(conn, batch, self, Some(found)).await?;
                conn.execute("COMMIT").await?;
                StoreResult::Ok(outcomes)
            }
            .await;
            // The transaction is not sqlx's (see `begin_and_read_apps`). Should the failure have been
            // the `COMMIT`'s, PostgreSQL has ended the transaction already and answers the `ROLLBACK`
            // with a warning, not an error.
            group_commit::close_own_transaction(written, || async {
                conn.execute("ROLLBACK").await?;
                Ok(())
            })
            .await
        })
    }

    fn expand<'c>(&'c self, conn: &'c mut PgConnection, carried: &'c [Split]) -> BoxFuture<'c, StoreResult<Expansion>> {
        Box::pin(expand(conn, carried, self))
    }

    fn orphans<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        carried: &'c [Split],
    ) -> BoxFuture<'c, StoreResult<Vec<Split>>> {
        Box::pin(orphans(conn, carried))
    }
}

/// Write a batch inside a transaction that holds the ingest lock; `opened` is what the apps read
/// ([`existing_apps`]) found if the transaction's first call made it already ([`begin_and_read_apps`]).
async fn write(
    conn: &mut PgConnection,
    batch: &[IngestJob],
    writer: &PgBatches,
    opened: Option<Vec<subscribers::AppRow>>,
) -> StoreResult<Outcomes> {
    let app_ids = plan::app_ids(batch);
    let (existing, versions, locked) = existing_apps(conn, &app_ids, opened, writer.remembered.known()).await?;
    let held = group_commit::held_back(batch, |job| locked.contains(job.new.app_id.as_str()));
    let subscribers = writer
        .subscribers
        .resolve(&versions, |stale| read_subscribers(conn, stale))
        .await?;
    let earlier = earlier_messages(conn, batch).await?;
    let plan = plan::plan(batch, &existing, &held, earlier);
    let (fan_out, split) = split::split_wide(&plan.messages, plan.fan_out(&subscribers));
    let returned = insert_all(conn, &plan.messages, &fan_out, &split, &writer.leases, None).await?;
    let deliveries = created_by_job(&fan_out, &returned)?;
    drop(fan_out);
    let outcomes = plan.finish(deliveries, split);
    super::outbox::settle(conn, batch, &outcomes).await?;
    Ok(outcomes)
}

/// The apps of the batch that exist, with their default payload retention and `endpoints_version`, read
/// `FOR SHARE`: until this batch commits, no endpoint of theirs can be added, deleted or change what
/// fan-out reads of it (the trigger that bumps the version must update the row), so the lists the cache
/// gives (or [`read_subscribers`] reads) are exactly what fan-out sees at commit, and an endpoint deleted
/// meanwhile by any node is deleted before this batch reads or after it commits (see
/// `portable::delete_endpoints`). And the apps whose rows another transaction holds: skipped (`SKIP
/// LOCKED`) rather than waited for with the ingest lock held, their jobs deferred (see the module's
/// docs).
///
/// An app asked for and not returned is absent or locked; only then is a second read made (unlocked, of
/// the missing ids alone) to tell which, so a batch whose apps are all free stays one round trip. Should
/// the holder commit between the two reads, its app is taken for locked (its jobs are tried again) if it
/// still exists, and for absent (not found) if the holder deleted it — both right.
///
/// `opened`: the rows the read found if it was made already, in the transaction's first call. The rows
/// found are remembered in `known`.
async fn existing_apps(
    conn: &mut PgConnection,
    app_ids: &[&str],
    opened: Option<Vec<subscribers::AppRow>>,
    known: &KnownApps,
) -> StoreResult<(Apps, Vec<(String, i64)>, HashSet<String>)> {
    let found = match opened {
        Some(found) => found,
        None => {
            sqlx::query_as::<_, subscribers::AppRow>(AssertSqlSafe(apps_read("$1")))
                .bind(app_ids)
                .fetch_all(&mut *conn)
                .await?
        }
    };
    known.remember(&found);
    let mut locked = HashSet::new();
    if found.len() < app_ids.len() {
        let returned: HashSet<&str> = found.iter().map(|(id, _, _)| id.as_str()).collect();
        let missing: Vec<&str> = app_ids.iter().copied().filter(|id| !returned.contains(id)).collect();
        locked = sqlx::query_scalar::<_, String>("SELECT id FROM application WHERE id = ANY($1)")
            .bind(&missing)
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .collect();
    }
    let (apps, versions) = subscribers::existing_apps(found);
    Ok((apps, versions, locked))
}

/// The apps read of [`existing_apps`], for the ids of `array` (a parameter, or an array written out).
fn apps_read(array: &str) -> String {
    format!(
        "SELECT id, payload_retention_period, endpoints_version FROM application WHERE id = ANY({array}) \
         ORDER BY id FOR SHARE SKIP LOCKED"
    )
}

/// The first call of a batch's transaction: [`BEGIN_IN_ORDER`](super::channels::BEGIN_IN_ORDER) and the
/// apps read, as one simple query — one round trip instead of two (a simple query is the only way to
/// send several statements at once, and it takes no parameters). So the ids are written into the text,
/// which is done only when each is letters, digits and `_` (as every id Herald makes is): `None`
/// otherwise, and the batch takes the two round trips. The transaction is not sqlx's: the batch commits
/// it, or rolls it back, with statements of its own.
fn begin_and_read_apps(app_ids: &[&str]) -> Option<String> {
    let plain = |id: &&str| !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if app_ids.is_empty() || !app_ids.iter().all(plain) {
        return None;
    }
    let listed: Vec<String> = app_ids.iter().map(|id| format!("'{id}'")).collect();
    Some(format!(
        "{}; {}",
        super::channels::BEGIN_IN_ORDER,
        apps_read(&format!("ARRAY[{}]::text[]", listed.join(", ")))
    ))
}

/// The apps read's rows among those of [`begin_and_read_apps`]'s statements (the lock's `SELECT` gives
/// one row of its own).
fn opened_apps(rows: Vec<PgRow>) -> StoreResult<Vec<subscribers::AppRow>> {
    rows.iter()
        .filter(|row| row.try_column("endpoints_version").is_ok())
        .map(|row| {
            Ok((
                row.try_get("id")?,
                row.try_get("payload_retention_period")?,
                row.try_get("endpoints_version")?,
            ))
        })
        .collect()
}

/// The subscribers of the apps `stale`, whose lists the cache does not hold at their current version. No
/// lock of their own: [`existing_apps`] holds the applications, and with them their endpoints.
async fn read_subscribers(conn: &mut PgConnection, stale: Vec<&str>) -> StoreResult<Vec<Subscriber>> {
    let sql = format!("SELECT {} FROM endpoint WHERE app_id = ANY($1)", subscribers::COLUMNS);
    let found = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(&stale)
        .fetch_all(&mut *conn)
        .await?;
    found.iter().map(Subscriber::from_row).collect()
}

async fn earlier_messages(conn: &mut PgConnection, batch: &[IngestJob]) -> StoreResult<Earlier> {
    let mut earlier = Earlier::default();
    let keyed = plan::keyed(batch);
    if keyed.is_empty() {
        return Ok(earlier);
    }
    let apps: Vec<&str> = keyed.iter().map(|j| j.new.app_id.as_str()).collect();
    let event_ids: Vec<Option<String>> = keyed
        .iter()
        .map(|j| j.new.event_id.as_deref().map(|e| escape(e).into_owned()))
        .collect();
    let keys: Vec<Option<&str>> = keyed.iter().map(|j| j.new.idempotency_key.as_deref()).collect();
    // One index lookup per wanted row and kind: joined on `event_id = … OR idempotency_key = …`, PostgreSQL
    // can use only the `app_id` prefix of either unique index and so reads every message of the
    // application for each row of the batch (a batch of 512 outbox rows on an application with 20,000
    // messages read ten million rows). A row found by both arms comes twice; `remember` keeps one.
    let columns = format!("{}, m.idempotency_key AS m_idempotency_key", rows::MESSAGE_COLUMNS);
    let sql = format!(
        "SELECT {columns} FROM UNNEST($1::text[], $2::text[]) AS w (app_id, event_id) \
         JOIN message m ON m.app_id = w.app_id AND m.event_id = w.event_id \
         UNION ALL \
         SELECT {columns} FROM UNNEST($1::text[], $3::text[]) AS w (app_id, idem) \
         JOIN message m ON m.app_id = w.app_id AND m.idempotency_key = w.idem"
    );
    let found = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(&apps)
        .bind(&event_ids)
        .bind(&keys)
        .fetch_all(&mut *conn)
        .await?;
    for row in &found {
        let message = rows::message(row)?;
        let key: Option<String> = row.try_get("m_idempotency_key")?;
        earlier.remember(&message, key.as_deref());
    }
    Ok(earlier)
}

/// Insert the batch's messages, their tags, the endpoint lists of the messages whose fan-out is `split`
/// (by job index, see [`crate::split`]) and the other deliveries in one statement (one round trip
/// whatever the batch holds), and, when some of the deliveries are for partitions this node does not
/// own, notify the other nodes (see [`deliveries_sql`]); the rows of the deliveries created (see
/// [`created_by_job`]).
///
/// Each insert is a data-modifying `WITH` query, all run once by the one statement; the foreign keys of
/// the tags and of the pending fan-outs to their messages are checked at its end, when the messages are
/// in (deliveries have none, see migration 0028). So are the `message_stream` trigger's numbers taken,
/// once per statement, in message id order.
///
/// `checked`: the apps' rows as the writer remembers them, for a batch that did not read them, whose
/// statement is its own transaction (see [`insert_sql`]).
pub(super) async fn insert_all(
    conn: &mut PgConnection,
    messages: &[NewRow<'_>],
    fan_out: &[FanOut<'_>],
    split: &HashMap<usize, Vec<EndpointId>>,
    leases: &Leases,
    checked: Option<&HashMap<String, KnownApp>>,
) -> StoreResult<Vec<PgRow>> {
    static IN_TRANSACTION: LazyLock<String> = LazyLock::new(|| insert_sql(false));
    static ALONE: LazyLock<String> = LazyLock::new(|| insert_sql(true));
    if messages.is_empty() {
        return Ok(Vec::new());
    }
    let m = |f: fn(&NewRow<'_>) -> Option<String>| messages.iter().map(f).collect::<Vec<_>>();
    let payloads: Vec<&[u8]> = messages.iter().map(|r| &*r.message.payload).collect();
    let created: Vec<Millis> = messages.iter().map(|r| r.message.created_at).collect();
    let expires: Vec<Option<Millis>> = messages.iter().map(|r| r.payload_expires_at).collect();
    let deliver_at: Vec<Option<Millis>> = messages.iter().map(|r| r.message.deliver_at).collect();
    let tagged = plan::tag_rows(messages);
    let tag = |f: fn(&(&str, &str, &str)) -> String| tagged.iter().map(f).collect::<Vec<_>>();
    let (mut split_ids, mut split_chunks, mut split_lists) = (Vec::new(), Vec::new(), Vec::new());
    for row in messages {
        for (chunk, endpoints) in split.get(&row.job).map(|e| split::chunks(e)).into_iter().flatten() {
            let list = endpoints.iter().map(|id| id.as_str().to_owned()).collect();
            split_ids.push(row.message.id.as_str());
            split_chunks.push(chunk);
            split_lists.push(rows::encode_list(&Some(list)));
        }
    }
    let sql = if checked.is_some() { &ALONE } else { &IN_TRANSACTION };
    let query = sqlx::query(AssertSqlSafe(sql.as_str()))
        .bind(m(|r| Some(r.message.id.to_string())))
        .bind(m(|r| Some(r.message.app_id.to_string())))
        .bind(m(|r| r.message.event_id.as_deref().map(|e| escape(e).into_owned())))
        .bind(m(|r| r.idempotency_key.map(str::to_owned)))
        .bind(m(|r| Some(r.message.event_type.clone())))
        .bind(m(|r| rows::encode_list(&r.message.channels)))
        .bind(payloads)
        .bind(m(|r| r.message.ordering_key.as_deref().map(|k| escape(k).into_owned())))
        .bind(created)
        .bind(expires)
        .bind(m(|r| rows::encode_list(&r.message.tags)))
        .bind(deliver_at)
        .bind(tag(|t| t.0.to_owned()))
        .bind(tag(|t| t.1.to_owned()))
        .bind(tag(|t| t.2.to_owned()))
        .bind(split_ids)
        .bind(split_chunks)
        .bind(split_lists);
    let mut query = bind_deliveries(query, fan_out, leases);
    if let Some(checked) = checked {
        let rows: Vec<(&String, &KnownApp)> = checked.iter().collect();
        query = query
            .bind(rows.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>())
            .bind(rows.iter().map(|(_, row)| row.endpoints_version).collect::<Vec<_>>())
            .bind(rows.iter().map(|(_, row)| row.retention_days).collect::<Vec<_>>());
    }
    Ok(query.fetch_all(&mut *conn).await?)
}

/// The deliveries [`insert_all`] `returned`, grouped by the index of the job they belong to.
pub(super) fn created_by_job(
    fan_out: &[FanOut<'_>],
    returned: &[PgRow],
) -> StoreResult<HashMap<usize, Vec<CreatedDelivery>>> {
    let mut by_job = HashMap::new();
    plan::group_deliveries(fan_out, returned, &mut by_job)?;
    Ok(by_job)
}

/// The text of [`insert_all`]'s statement: parameters `$1`–`$18` its messages, tags and pending
/// fan-outs, `$19`–`$27` its deliveries ([`deliveries_sql`]).
///
/// `checked`, the statement of a batch that runs it as a transaction of its own, with its apps as the
/// writer remembers them (`$28`–`$30`: their ids, `endpoints_version`s and payload retentions, see
/// [`KnownApps`]) instead of read by an earlier call (see [`super::remembered`]). It then does that
/// call's work itself, in an order its own rows force, since a statement's `WITH` queries run in no
/// order of their own:
///
/// - `ingest_lock` takes the ingest lock if it is free at once (`pg_try_advisory_xact_lock`, never a
///   wait: the batch's ids were drawn before the statement, so a batch that waited behind another
///   node's could commit after it with lower ids). Otherwise every message's `id` is `NULL`, and the
///   statement fails on that column's `NOT NULL`.
/// - `checked` share-locks the app rows (`SKIP LOCKED`, as [`existing_apps`] does) and keeps each only as
///   remembered; each message row's `app_id` is looked up there, so a row that moved, or that another
///   transaction holds, leaves it `NULL`, and the statement fails on that column's `NOT NULL`.
/// - The deliveries are those of the messages `new_message` returns, so every `seq` is drawn after the
///   lock is held. The `message_stream` trigger runs at the statement's end.
fn insert_sql(checked: bool) -> String {
    let (first, id, app_id, from, returning, deliveries_of) = if checked {
        (
            concat!(
                "ingest_lock AS (SELECT pg_try_advisory_xact_lock(",
                super::channels::ingest_lock_key!(),
                ") AS taken), \
                 checked AS (SELECT a.id FROM application a \
                 JOIN UNNEST($28::text[], $29::bigint[], $30::bigint[]) AS w (id, version, retention) ON a.id = w.id \
                 WHERE a.endpoints_version = w.version AND a.payload_retention_period IS NOT DISTINCT FROM w.retention \
                 FOR SHARE OF a SKIP LOCKED), "
            ),
            "CASE WHEN l.taken THEN u.id END",
            "(SELECT c.id FROM checked c WHERE c.id = u.app_id)",
            "ingest_lock l, ",
            " RETURNING id",
            "WHERE v.message_id IN (SELECT id FROM new_message)",
        )
    } else {
        ("", "u.id", "u.app_id", "", "", "")
    };
    format!(
        "WITH {first}new_message AS (INSERT INTO message (id, app_id, event_id, idempotency_key, event_type, \
         channels, payload, ordering_key, created_at, payload_expires_at, tags, deliver_at) \
         SELECT {id}, {app_id}, u.event_id, u.idempotency_key, u.event_type, u.channels, u.payload, \
         u.ordering_key, u.created_at, u.payload_expires_at, u.tags, u.deliver_at FROM {from}\
         UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bytea[], \
         $8::text[], $9::bigint[], $10::bigint[], $11::text[], $12::bigint[]) AS u (id, app_id, event_id, \
         idempotency_key, event_type, channels, payload, ordering_key, created_at, payload_expires_at, tags, \
         deliver_at){returning}), \
         new_tag AS (INSERT INTO message_tag (app_id, tag, message_id) \
         SELECT * FROM UNNEST($13::text[], $14::text[], $15::text[])), \
         new_split AS (INSERT INTO fan_out_pending (message_id, chunk, endpoint_ids) \
         SELECT * FROM UNNEST($16::text[], $17::int[], $18::text[])), {}",
        deliveries_sql(19, deliveries_of)
    )
}

/// The end of a statement that inserts deliveries (after its other `WITH` queries): `inserted`, the
/// deliveries bound by [`bind_deliveries`] from parameter `$first` on (`WHERE`ed by `filter`, which may
/// refer to them as `v`), in fan-out order, returning `seq, message_id, endpoint_id`; and `notified`.
///
/// `WITH ORDINALITY` + `ORDER BY`: seqs are drawn in fan-out order (message by message, as committed).
/// The notification rides in the same statement; `notified` is one row whether or not it is sent.
/// Deliveries this node owns reach its engine through the commit feed, so a notification would tell
/// nobody anything; and a transaction that notifies holds PostgreSQL's cluster-wide notification lock from
/// before its commit until its WAL is flushed, so every notifying commit of the cluster — each producer's
/// `herald_publish` among them — waits for the one before it to reach the disk, instead of sharing a
/// flush with it (docs/performance.md, "Commit to delivery on the same PostgreSQL"). Should this node lose
/// a partition between this check and the commit, its new owner finds the delivery at its watcher's next
/// poll (a heartbeat at most) rather than at once.
fn deliveries_sql(first: usize, filter: &str) -> String {
    let p = |n: usize| format!("${}", first + n);
    format!(
        "inserted AS (INSERT INTO delivery (message_id, endpoint_id, partition, status, attempts, \
         next_attempt_at, updated_at, window_start) \
         SELECT message_id, endpoint_id, partition, 0, 0, due, at, window_start \
         FROM UNNEST({}::text[], {}::text[], {}::int[], {}::bigint[], {}::bigint[], {}::bigint[]) \
         WITH ORDINALITY AS v (message_id, endpoint_id, partition, at, due, window_start, n) {filter} ORDER BY n \
         RETURNING seq, message_id, endpoint_id), \
         notified AS (SELECT CASE WHEN {} THEN pg_notify({}, {}) END) \
         SELECT inserted.* FROM inserted, notified",
        p(0),
        p(1),
        p(2),
        p(3),
        p(4),
        p(5),
        p(6),
        p(7),
        p(8)
    )
}

/// Bind the nine parameters of [`deliveries_sql`]: the deliveries of `fan_out`, and the notification of
/// the other nodes when some of them are for partitions this node does not own.
fn bind_deliveries<'q>(
    query: Query<'q, Postgres, PgArguments>,
    fan_out: &'q [FanOut<'_>],
    leases: &'q Leases,
) -> Query<'q, Postgres, PgArguments> {
    let partitions: Vec<i32> = fan_out.iter().map(|f| partition_of(f.endpoint_id)).collect();
    let notify_others = !fan_out.is_empty() && !leases.owns_all(&partitions);
    query
        .bind(fan_out.iter().map(|f| f.message.id.as_str()).collect::<Vec<_>>())
        .bind(fan_out.iter().map(|f| f.endpoint_id.as_str()).collect::<Vec<_>>())
        .bind(partitions)
        .bind(fan_out.iter().map(|f| f.message.created_at).collect::<Vec<Millis>>())
        .bind(fan_out.iter().map(|f| f.message.due_at()).collect::<Vec<Millis>>())
        .bind(
            fan_out
                .iter()
                .map(|f| plan::window_start(f.message))
                .collect::<Vec<Option<Millis>>>(),
        )
        .bind(notify_others)
        .bind(WORK_CHANNEL)
        .bind(leases.node_id())
}

/// Insert the delivery rows of the `carried` split fan-outs (see [`crate::split`]), inside the writer's
/// transaction, which holds the ingest lock. The applications are read `FOR SHARE SKIP LOCKED` as a batch reads them: the splits of a held
/// one wait (returned in [`Expansion::waiting`]); those of a deleted one are gone with it. Each message's
/// rows go in only if this statement deleted its pending row — another writer may have expanded it
/// first (a sweep) — and only for its endpoints that still exist.
async fn expand(conn: &mut PgConnection, splits: &[Split], writer: &PgBatches) -> StoreResult<Expansion> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "WITH claimed AS (DELETE FROM fan_out_pending p USING UNNEST($1::text[], $2::int[]) AS c (id, chunk) \
             WHERE p.message_id = c.id AND p.chunk = c.chunk RETURNING p.message_id), {}",
            deliveries_sql(3, "WHERE v.message_id IN (SELECT message_id FROM claimed)")
        )
    });
    let app_ids: Vec<&str> = splits
        .iter()
        .map(|s| s.message.app_id.as_str())
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let (_, versions, locked) = existing_apps(conn, &app_ids, None, writer.remembered.known()).await?;
    let (ready, waiting): (Vec<&Split>, Vec<&Split>) =
        splits.iter().partition(|s| !locked.contains(s.message.app_id.as_str()));
    let endpoints = writer
        .subscribers
        .resolve(&versions, |stale| read_subscribers(conn, stale))
        .await?;
    // The splits of an application that is gone are in neither: its messages went with it.
    let rows = split::expansion_rows(&ready, &endpoints);
    // One split of a message at most (see `Carried::next`), so its id names the rows it claims.
    let claimed: Vec<&str> = ready.iter().map(|s| s.message.id.as_str()).collect();
    let chunks: Vec<i32> = ready.iter().map(|s| s.chunk).collect();
    let query = sqlx::query(AssertSqlSafe(SQL.as_str())).bind(claimed).bind(chunks);
    let found = bind_deliveries(query, &rows, &writer.leases)
        .fetch_all(&mut *conn)
        .await?;
    let mut by_split = HashMap::new();
    plan::group_deliveries(&rows, &found, &mut by_split)?;
    let mut deliveries = Vec::with_capacity(found.len());
    for (index, split) in ready.iter().enumerate() {
        if let Some(mut created) = by_split.remove(&index) {
            created.sort_by_key(|d| d.seq);
            deliveries.extend(group_commit::new_deliveries(&split.message, &created));
        }
    }
    Ok(Expansion {
        deliveries,
        waiting: waiting.into_iter().cloned().collect(),
    })
}

/// The pending fan-outs older than [`split::ORPHAN_AGE_MS`] that are not among `carried`: left by a
/// writer that stopped before it expanded them (or still waiting for their application's row). A row
/// that does not decode is logged and skipped, never allowed to hold up the others. The read waits
/// 100 ms at most for a lock (a table locked by a migration, a maintenance statement): it is tried again
/// at the next sweep rather than hold the writer.
async fn orphans(conn: &mut PgConnection, carried: &[Split]) -> StoreResult<Vec<Split>> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {}, p.chunk, p.endpoint_ids FROM fan_out_pending p JOIN message m ON m.id = p.message_id \
             WHERE m.created_at < $1 AND (p.message_id, p.chunk) NOT IN (SELECT * FROM UNNEST($2::text[], $3::int[])) \
             ORDER BY p.message_id, p.chunk LIMIT $4",
            rows::MESSAGE_COLUMNS
        )
    });
    let known: Vec<&str> = carried.iter().map(|s| s.message.id.as_str()).collect();
    let known_chunks: Vec<i32> = carried.iter().map(|s| s.chunk).collect();
    sqlx::query("SET LOCAL lock_timeout = '100ms'")
        .execute(&mut *conn)
        .await?;
    let found = sqlx::query(AssertSqlSafe(SQL.as_str()))
        .bind(herald_core::clock::now().add_ms(-split::ORPHAN_AGE_MS))
        .bind(known)
        .bind(known_chunks)
        .bind(split::SWEEP_LIMIT)
        .fetch_all(&mut *conn)
        .await?;
    let mut splits = Vec::with_capacity(found.len());
    for row in &found {
        match orphan(row) {
            Ok(split) => splits.push(split),
            Err(error) => tracing::error!(%error, "skipping a pending fan-out that does not decode"),
        }
    }
    if !splits.is_empty() {
        tracing::info!(messages = splits.len(), "taking up pending fan-outs nobody carries");
    }
    Ok(splits)
}

fn orphan(row: &PgRow) -> StoreResult<Split> {
    let message = rows::message(row)?;
    let list = rows::decode_list(row.try_get("endpoint_ids")?)?.unwrap_or_default();
    let endpoints = list
        .into_iter()
        .map(|id| rows::id_of("endpoint_ids", id))
        .collect::<StoreResult<_>>()?;
    Ok(Split {
        message: Arc::new(message),
        chunk: row.try_get("chunk")?,
        endpoints,
    })
}

/// Append attempts and move their deliveries on, in one transaction, fenced: only records of partitions
/// this node still holds (same owner, same epoch) are written; the others are dropped — another node owns
/// those deliveries now and sends them again itself (at-least-once). The lease rows stay share-locked
/// until commit, so a takeover cannot slip in between the check and the writes. A batch retried after a
/// commit whose answer was lost finds its attempts already there (`ON CONFLICT DO NOTHING`), and records
/// none of their operational events again.
///
/// Should the database refuse the batch (rather than be unreachable or fail on a storage fault), it is
/// written again one record per transaction and a record that cannot be stored is logged and dropped, so that it can never wedge the
/// results of every other delivery behind it (the writer retries whatever fails).
pub(crate) async fn write_results(pool: &PgPool, leases: &Leases, records: &[AttemptRecord]) -> StoreResult<()> {
    match write_fenced(pool, leases, records).await {
        Err(error) if records.len() > 1 && refused(&error) => {
            tracing::warn!(%error, records = records.len(), "bulk attempt write refused; writing one by one");
        }
        other => return other,
    }
    for record in records {
        match write_fenced(pool, leases, std::slice::from_ref(record)).await {
            Err(error) if refused(&error) => {
                tracing::error!(%error, attempt = %record.attempt.id, "dropping an attempt record that cannot be stored");
            }
            other => other?,
        }
    }
    Ok(())
}

/// Whether the database refused a write for what it holds (a constraint, a value), as opposed to not
/// taking any write right now — a timeout, a lock wait given up, a full disk, a server shutting down (a
/// storage fault, see [`crate::custody`]): those are the writer's to retry, not records to drop.
fn refused(error: &crate::StoreError) -> bool {
    matches!(error, crate::StoreError::Database(sqlx::Error::Database(_))) && error.fault().is_none()
}

async fn write_fenced(pool: &PgPool, leases: &Leases, records: &[AttemptRecord]) -> StoreResult<()> {
    let mut tx = pool.begin().await?;
    let wanted: Vec<i32> = records
        .iter()
        .map(|r| partition_of(&r.attempt.endpoint_id))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let held: HashSet<i32> = leases.fence_some(&mut tx, &wanted).await?.into_iter().collect();
    let (kept, dropped): (Vec<&AttemptRecord>, Vec<&AttemptRecord>) = records
        .iter()
        .partition(|r| held.contains(&partition_of(&r.attempt.endpoint_id)));
    if !dropped.is_empty() {
        tracing::warn!(
            records = dropped.len(),
            "dropping attempt results of partitions this node no longer owns (their new owner retries them)"
        );
    }
    if kept.is_empty() {
        return Ok(());
    }
    let a = |f: fn(&AttemptRecord) -> String| kept.iter().map(|r| f(r)).collect::<Vec<_>>();
    let n = |f: fn(&AttemptRecord) -> i64| kept.iter().map(|r| f(r)).collect::<Vec<_>>();
    let inserted = sqlx::query(
        "INSERT INTO attempt (id, delivery_seq, app_id, message_id, endpoint_id, url, attempt_number, success, \
         outcome, response_status, response, duration_ms, trigger_type, created_at) \
         SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[], \
         $7::bigint[], $8::bool[], $9::text[], $10::bigint[], $11::text[], $12::bigint[], $13::bigint[], \
         $14::bigint[]) ON CONFLICT DO NOTHING RETURNING id",
    )
    .bind(a(|r| r.attempt.id.to_string()))
    .bind(n(|r| r.delivery_seq))
    .bind(a(|r| r.app_id.to_string()))
    .bind(a(|r| r.attempt.message_id.to_string()))
    .bind(a(|r| r.attempt.endpoint_id.to_string()))
    .bind(a(|r| escape(&r.attempt.url).into_owned()))
    .bind(n(|r| i64::from(r.attempt.attempt_number)))
    .bind(kept.iter().map(|r| r.attempt.success).collect::<Vec<_>>())
    .bind(a(|r| r.attempt.outcome.as_str().to_owned()))
    .bind(
        kept.iter()
            .map(|r| r.attempt.response_status.map(i64::from))
            .collect::<Vec<_>>(),
    )
    .bind(a(|r| escape(&r.attempt.response).into_owned()))
    .bind(n(|r| r.attempt.duration_ms))
    .bind(n(|r| r.attempt.trigger.code()))
    .bind(kept.iter().map(|r| r.attempt.created_at).collect::<Vec<_>>())
    .fetch_all(&mut *tx)
    .await?;
    let inserted: HashSet<String> = inserted
        .iter()
        .map(|row| row.try_get::<String, _>("id"))
        .collect::<Result<_, _>>()?;

    let kept: Vec<AttemptRecord> = kept.into_iter().cloned().collect();
    let latest = plan::latest_per_delivery(&kept);
    let l = |f: fn(&AttemptRecord) -> i64| latest.iter().map(|r| f(r)).collect::<Vec<_>>();
    sqlx::query(
        "UPDATE delivery d SET status = v.status, attempts = v.attempts, next_attempt_at = v.next_at, \
         updated_at = v.changed_at, next_trigger = 0 \
         FROM UNNEST($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[]) \
         AS v (seq, status, attempts, next_at, changed_at) \
         WHERE d.seq = v.seq AND d.status = 0",
    )
    .bind(l(|r| r.delivery_seq))
    .bind(l(|r| r.status.code()))
    .bind(l(|r| i64::from(r.attempt.attempt_number)))
    .bind(latest.iter().map(|r| r.next_attempt_at).collect::<Vec<_>>())
    .bind(latest.iter().map(|r| r.attempt.finished_at()).collect::<Vec<_>>())
    .execute(&mut *tx)
    .await?;
    // Only attempts this transaction added cause events: a batch written again after a commit whose
    // answer was lost finds its attempts there, and its events with them.
    let new: Vec<AttemptRecord> = kept
        .into_iter()
        .filter(|r| inserted.contains(r.attempt.id.as_str()))
        .collect();
    super::events::record_attempt_events(&mut tx, &new).await?;
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_ids_are_written_into_the_first_call() {
        let text = begin_and_read_apps(&["app_2ab", "app_9Z"]).expect("plain ids");
        assert!(text.starts_with(super::super::channels::BEGIN_IN_ORDER));
        assert!(text.contains("id = ANY(ARRAY['app_2ab', 'app_9Z']::text[])"), "{text}");
        for unsafe_id in ["app_'; DROP TABLE message; --", "app\\", "", "app-1", "app é"] {
            assert_eq!(begin_and_read_apps(&["app_ok", unsafe_id]), None, "{unsafe_id:?}");
        }
        assert_eq!(begin_and_read_apps(&[]), None);
    }
}
