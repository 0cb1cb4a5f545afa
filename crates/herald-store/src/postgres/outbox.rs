//! The outbox of producers on Herald's own PostgreSQL: `herald_publish(…)` (migration `0008_outbox`)
//! writes a row in the producer's transaction; this reader turns committed rows into messages.
//!
//! Each row is ingested through the group-commit writer like an API request, carrying its `seq`
//! ([`IngestJob::outbox`]): the batch transaction that inserts the message (or finds the earlier one with
//! the same `eventId`) deletes the row, so a row becomes exactly one message, with its fan-out, filters,
//! signing and ordering, or — if its app is gone — is kept with the reason in `error`. A crash anywhere
//! leaves either the row (read again) or the message (and no row), never both, never neither.
//!
//! Herald's `max_payload_bytes` holds here as for the API (migration `0027_outbox_payload_limit`): each node
//! writes its limit at start-up ([`write_limit`]) and an insert trigger refuses a larger payload in the
//! producer's transaction; the reader refuses a row over its own node's limit (one that got in under a larger
//! one) with the reason in `error`, as it does a row naming no application id.
//!
//! One node reads at a time (a session advisory lock); the others stand by and take over when its
//! session ends. A reading session that gives up (a failed batch, a read out of its bound) hands the lock
//! back before the next one tries for it: the listener's connection goes back to the pool, and a lock
//! left on it would hold every node off while nobody reads. Should two ever read at once (the lock's connection was replaced), nothing breaks: the
//! ingest lock serialises their batches and the second finds the first's message by `eventId`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use herald_core::backoff::Backoff;
use herald_core::id::AppId;
use sqlx::postgres::PgListener;
use sqlx::{PgPool, Row};
use tokio::sync::{mpsc, oneshot};

use super::outbox_pace::{AWAKE_FOR, Pace};
use crate::group_commit::{Fence, IngestJob, Outcome, Outcomes};
use crate::{Ingested, NewMessage, StoreError, StoreResult};
use herald_sql::custody::Bound;

/// The channel `herald_outbox`'s insert trigger notifies (at commit).
const CHANNEL: &str = "herald_outbox";
/// The advisory lock held by the node that reads the outbox ("outbox" in ASCII).
const READER_LOCK: i64 = 0x6f75_7462_6f78;
/// Rows read per round (the group-commit writer's batch size).
const ROUND: i64 = crate::group_commit::MAX_BATCH as i64;
/// With no notification, look anyway this often while the outbox is quiet (a notification lost with a
/// connection, rows inserted while no node listened, a commit that found the reader awake and landed
/// after it went quiet: see [`Pace`]).
const POLL: Duration = Duration::from_secs(1);
/// How often a standing-by node tries for the reader lock.
const STANDBY: Duration = Duration::from_secs(2);
/// The first wait before a failed reading session is tried again (doubling from there).
const RETRY_FIRST: Duration = Duration::from_millis(200);
/// The longest wait before a failed reading session is tried again.
const RETRY_MAX: Duration = Duration::from_secs(30);
/// A session that read at least this long was healthy: its failure starts the back-off again.
const HEALTHY_SESSION: Duration = RETRY_MAX;
/// How often the backlog is measured for `/metrics`.
const MEASURE_EVERY: Duration = Duration::from_secs(1);

/// The largest payload this node's reader lets become a message: the node's `max_payload_bytes`, as the
/// outbox's SQL takes it (`None`: no limit known, none checked).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PayloadLimit(Option<i64>);

impl PayloadLimit {
    /// The limit of `max_payload_bytes` (see [`crate::StoreOptions::max_payload_bytes`]).
    pub(crate) fn of(max_payload_bytes: Option<usize>) -> Self {
        Self(max_payload_bytes.map(|bytes| i64::try_from(bytes).unwrap_or(i64::MAX)))
    }
}

/// Write this node's limit for `herald_publish`'s trigger to check in producers' transactions (the last
/// node to start wins); no limit known leaves the stored one as it is.
pub(crate) async fn write_limit(pool: &PgPool, limit: PayloadLimit) -> StoreResult<()> {
    if let PayloadLimit(Some(bytes)) = limit {
        sqlx::query("UPDATE herald_outbox_limit SET max_payload_bytes = $1")
            .bind(bytes)
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// Read the outbox for as long as the node runs, refusing rows over `limit`.
pub(crate) async fn run(pool: PgPool, ingest: mpsc::Sender<IngestJob>, bound: Bound, limit: PayloadLimit) {
    let mut backoff = Backoff::new(RETRY_FIRST, RETRY_MAX);
    loop {
        let started = Instant::now();
        match read(&pool, &ingest, &bound, limit).await {
            Ok(()) => return,
            Err(error) => {
                // A session ends only by an error, so the back-off cannot wait for a success to reset:
                // one that read for longer than the longest wait was a healthy session, and its failure
                // is the first of a new outage, not the ninth of one long gone.
                if started.elapsed() > HEALTHY_SESSION {
                    backoff.succeeded();
                }
                let delay = backoff.failed();
                tracing::warn!(%error, retry_in_ms = delay.as_millis() as u64, "outbox reader failed; retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// Take the reader lock, then ingest committed rows as they come. `Ok` only when the node shuts down.
///
/// Rounds are pipelined: while the writer commits one round, the next is read and queued behind it (at
/// most [`QUEUED_ROWS`] rows in flight), so the writer never waits for a read. A read skips the rows of
/// the rounds in flight; the writer takes the queue in order, so rows still become messages in `seq`
/// order, and a [`Fence`] keeps that order should a batch fail (the rows queued behind it are not
/// written either).
///
/// Its reads are bounded like every store call (`bound`); its ingest is bounded by the group-commit
/// writer.
async fn read(pool: &PgPool, ingest: &mpsc::Sender<IngestJob>, bound: &Bound, limit: PayloadLimit) -> StoreResult<()> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    loop {
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(READER_LOCK)
            .fetch_one(&mut listener)
            .await?;
        if locked {
            break;
        }
        tokio::time::sleep(STANDBY).await;
    }
    tracing::debug!("this node reads the outbox");
    let read = read_locked(pool, &mut listener, ingest, bound, limit).await;
    // A session advisory lock outlives the listener: dropped, it goes back to the pool with its
    // connection, which would keep the lock (for as long as the pool keeps the connection) while no
    // reader reads under it — this node's next session and every other node would stand by. Handed back
    // within the bound; should the server not answer, the pool's release check closes the connection,
    // and the lock with it.
    let unlocked = bound
        .run(async {
            sqlx::query("SELECT pg_advisory_unlock($1)")
                .bind(READER_LOCK)
                .execute(&mut listener)
                .await
                .map_err(StoreError::from)
        })
        .await;
    if let Err(error) = unlocked {
        tracing::debug!(%error, "could not hand the outbox reader lock back (its session ends with its connection)");
    }
    read
}

/// [`read`], holding the reader lock on `listener`'s session.
///
/// The reader looks for rows when a commit notifies it, whether or not rounds are still at the writer,
/// as long as fewer than [`QUEUED_ROWS`] rows are queued there: a row committed while the writer commits
/// the rows before it is queued right behind them, so the writer's next batch takes it the moment the
/// batch before commits, instead of after that commit is answered here and the row read only then.
/// Every notification already arrived is taken with the first (they say the same thing: "look"), so one
/// read answers a burst of commits.
async fn read_locked(
    pool: &PgPool,
    listener: &mut PgListener,
    ingest: &mpsc::Sender<IngestJob>,
    bound: &Bound,
    limit: PayloadLimit,
) -> StoreResult<()> {
    let fence = Arc::new(Fence::default());
    let mut in_flight: VecDeque<InFlight<'_>> = VecDeque::new();
    let mut measured = Instant::now() - MEASURE_EVERY;
    let mut pace = Pace::default();
    // Rows may be waiting that no read has looked for: at the start (rows committed while no node
    // listened), after a notification, after the poll, and after a read that found as many rows as it
    // could take.
    let mut look = true;
    loop {
        if measured.elapsed() >= MEASURE_EVERY {
            measured = Instant::now();
            if let Err(error) = bound.run(measure(pool)).await {
                return abandon(in_flight, error).await;
            }
        }
        let queued: Vec<i64> = in_flight.iter().flat_map(|round| round.seqs.iter().copied()).collect();
        let room = room(queued.len());
        if look && room > 0 {
            let (rows, full) = match bound.run(pending(pool, &queued, room, limit)).await {
                Ok(read) => read,
                Err(error) => return abandon(in_flight, error).await,
            };
            look = full;
            let mark = pace.read(rows.len(), Instant::now());
            if !rows.is_empty() {
                let seqs: Vec<i64> = rows.iter().map(|row| row.seq).collect();
                match submit(ingest, rows, &fence).await {
                    Some(round) => in_flight.push_back(InFlight {
                        seqs,
                        settled: Box::pin(settle_round(pool, bound, round)),
                    }),
                    None => return Ok(()),
                }
            }
            // After the rows are at the writer: the mark is a commit of its own and must not delay them.
            if mark {
                match bound.run(mark_awake(pool)).await {
                    Ok(()) => pace.marked(Instant::now()),
                    // Harmless: the producers' commits keep notifying.
                    Err(error) => {
                        tracing::debug!(%error, "could not mark the outbox reader awake");
                        pace.mark_failed(Instant::now());
                    }
                }
            }
            continue;
        }
        // Awake, the reader polls on its own (producers do not notify it then), with rounds in flight too.
        let poll = pace.poll_in(Instant::now());
        let woke = tokio::select! {
            // The oldest round first: its answer frees room, and an error ends the session.
            settled = oldest(&mut in_flight), if !in_flight.is_empty() => Woke::Settled(settled),
            notified = listener.recv(), if room > 0 => Woke::Notified(notified),
            () = tokio::time::sleep(poll.unwrap_or(POLL)), if in_flight.is_empty() || (poll.is_some() && room > 0) => {
                Woke::Polled
            }
        };
        match woke {
            Woke::Settled(settled) => {
                in_flight.pop_front();
                match settled {
                    Ok(true) => {}
                    Ok(false) => return Ok(()),
                    Err(error) => return abandon(in_flight, error).await,
                }
            }
            Woke::Notified(Err(error)) => return abandon(in_flight, error.into()).await,
            Woke::Notified(Ok(_)) => {
                // The notifications that arrived with it are answered by the same read.
                loop {
                    match listener.recv().now_or_never() {
                        Some(Ok(_)) => {}
                        Some(Err(error)) => return abandon(in_flight, error.into()).await,
                        None => break,
                    }
                }
                look = true;
            }
            Woke::Polled => look = true,
        }
    }
}

/// How many rows may be queued at the writer at once: two rounds, one committing and the next waiting
/// behind it.
const QUEUED_ROWS: usize = 2 * ROUND as usize;

/// How many rows the next read may take with `queued` rows at the writer (at most a round).
fn room(queued: usize) -> usize {
    QUEUED_ROWS.saturating_sub(queued).min(ROUND as usize)
}

/// What woke the reader.
enum Woke {
    /// The oldest round in flight was answered.
    Settled(StoreResult<bool>),
    /// A commit notified the channel (or the listener failed).
    Notified(Result<sqlx::postgres::PgNotification, sqlx::Error>),
    /// Nothing for [`POLL`] (or, awake, for the pace's short wait): look.
    Polled,
}

/// A round at the writer: its rows (`seq`), left out of the reads until it is answered, and the wait for
/// its answers ([`settle_round`]), kept across the reader's other wake-ups.
struct InFlight<'a> {
    seqs: Vec<i64>,
    settled: futures::future::BoxFuture<'a, StoreResult<bool>>,
}

/// The answer of the oldest round in flight; never resolves when there is none.
async fn oldest(in_flight: &mut VecDeque<InFlight<'_>>) -> StoreResult<bool> {
    match in_flight.front_mut() {
        Some(round) => (&mut round.settled).await,
        None => std::future::pending().await,
    }
}

/// A round's rows (`seq`) and the writer's answer for each, in `seq` order.
type Round = Vec<(i64, oneshot::Receiver<StoreResult<Ingested>>)>;

/// Give up this reading session because of `error`, after the rounds still in flight are answered (so
/// that the next session reads again only rows nobody is writing).
async fn abandon(in_flight: VecDeque<InFlight<'_>>, error: StoreError) -> StoreResult<()> {
    for round in in_flight {
        if let Ok(false) = round.settled.await {
            return Ok(());
        }
    }
    Err(error)
}

/// One outbox row, as a message to ingest.
struct Pending {
    seq: i64,
    new: NewMessage,
}

/// The oldest rows to ingest, at most `limit`, leaving out the rows `queued` at the writer already; and
/// whether the read found `limit` rows (refused ones included), so that more may be waiting. Rows whose
/// payload is over `payload_limit` are refused here.
async fn pending(
    pool: &PgPool,
    queued: &[i64],
    limit: usize,
    payload_limit: PayloadLimit,
) -> StoreResult<(Vec<Pending>, bool)> {
    // The payload's text is made once, in the inner read (a subquery with a LIMIT is not flattened).
    let rows = sqlx::query(
        "SELECT seq, app_id, event_type, payload, event_id, channels, ordering_key, \
         herald_outbox_payload_refusal(octet_length(payload)::bigint, $3::bigint) AS refusal \
         FROM (SELECT seq, app_id, event_type, payload::text AS payload, event_id, channels, ordering_key \
               FROM herald_outbox WHERE error IS NULL AND seq <> ALL($2) ORDER BY seq LIMIT $1) AS o \
         ORDER BY seq",
    )
    .bind(i64::try_from(limit).unwrap_or(ROUND))
    .bind(queued)
    .bind(payload_limit.0)
    .fetch_all(pool)
    .await?;
    let (mut pending, mut refused, mut reasons) = (Vec::with_capacity(rows.len()), Vec::new(), Vec::new());
    for row in &rows {
        let seq: i64 = row.try_get("seq")?;
        let refusal = match row.try_get::<Option<String>, _>("refusal")? {
            Some(too_large) => too_large,
            None => match AppId::try_from(row.try_get::<String, _>("app_id")?) {
                Ok(app_id) => {
                    pending.push(Pending {
                        seq,
                        new: message(row, app_id)?,
                    });
                    continue;
                }
                Err(not_an_id) => not_an_id.to_string(),
            },
        };
        refused_row(seq, &refusal);
        refused.push(seq);
        reasons.push(refusal);
    }
    // A payload the API would refuse, or no application with such an id (as the writer would find): refused
    // here, since a message cannot carry either there. They become no message, so the rows after them keep
    // their order.
    refuse(pool, &refused, &reasons).await?;
    crate::metrics::outbox_round(0, refused.len() as u64);
    Ok((pending, rows.len() >= limit))
}

/// Log that the row `seq` is refused for `reason`.
fn refused_row(seq: i64, reason: &dyn std::fmt::Display) {
    tracing::error!(seq, error = %reason, "an outbox row cannot become a message; it is kept with the reason in herald_outbox.error");
}

/// Mark outbox rows (`seqs`) refused, each with its reason: they stay, for the producer to look at.
async fn refuse<'c>(on: impl sqlx::PgExecutor<'c>, seqs: &[i64], reasons: &[String]) -> StoreResult<()> {
    if !seqs.is_empty() {
        sqlx::query(
            "UPDATE herald_outbox o SET error = v.error FROM UNNEST($1::bigint[], $2::text[]) AS v (seq, error) \
             WHERE o.seq = v.seq",
        )
        .bind(seqs)
        .bind(reasons)
        .execute(on)
        .await?;
    }
    Ok(())
}

/// The message an outbox row asks for, for the application `app_id`.
fn message(row: &sqlx::postgres::PgRow, app_id: AppId) -> StoreResult<NewMessage> {
    let payload: String = row.try_get("payload")?;
    Ok(NewMessage {
        app_id,
        event_id: Some(row.try_get("event_id")?),
        event_type: row.try_get("event_type")?,
        channels: row.try_get("channels")?,
        payload: Arc::from(payload.into_bytes()),
        idempotency_key: None,
        ordering_key: row.try_get("ordering_key")?,
        tags: None,
        deliver_at: None,
        to_endpoint: None,
        payload_retention_ms: None,
    })
}

/// Queue a round of rows at the writer, in `seq` order (so one ordering key's messages are created in
/// outbox order). `None`: the writer is gone (the node is shutting down).
async fn submit(ingest: &mpsc::Sender<IngestJob>, rows: Vec<Pending>, fence: &Arc<Fence>) -> Option<Round> {
    let mut round = Vec::with_capacity(rows.len());
    for row in rows {
        let (reply, answer) = oneshot::channel();
        let job = IngestJob {
            new: row.new,
            reply,
            outbox: Some(row.seq),
            fence: Some(fence.clone()),
            // The reader waits for every answer (the writer bounds its batches) and never gives a row
            // back: a row committed after its session was abandoned is deleted by that commit.
            ticket: Arc::default(),
        };
        ingest.send(job).await.ok()?;
        round.push((row.seq, answer));
    }
    Some(round)
}

/// Wait for every answer of a round. `Ok(false)`: the writer is gone (the node is shutting down: it
/// dropped the answer); an error: a batch failed as a whole (its rows stay, read again after the
/// back-off). A row's own [`StoreError::Closed`] is such a failure, not a shutdown: the writer is still
/// there, and taking it for one would stop this node's reader for the node's life. The marking of a
/// refused row is a store call like any other, held to `bound`.
async fn settle_round(pool: &PgPool, bound: &Bound, round: Round) -> StoreResult<bool> {
    let mut failed_batch = None;
    let (mut published, mut refused) = (0_u64, 0_u64);
    for (seq, answer) in round {
        match answer.await {
            Err(_) => return Ok(false),
            Ok(Ok(_)) => published += 1,
            // Not this row's fault (the batch's transaction failed, the database is unavailable or
            // full): the row stays, read again after the back-off.
            Ok(Err(error)) if error.fault().is_some() => failed_batch = Some(error),
            // This row alone cannot become a message: keep it, with why, out of the way of the others
            // (the batch marked it already when the failure came from its plan, e.g. an unknown app).
            Ok(Err(error)) => {
                refused += 1;
                refused_row(seq, &error);
                bound
                    .run(async {
                        sqlx::query("UPDATE herald_outbox SET error = $2 WHERE seq = $1 AND error IS NULL")
                            .bind(seq)
                            .bind(error.to_string())
                            .execute(pool)
                            .await
                            .map_err(StoreError::from)
                    })
                    .await?;
            }
        }
    }
    crate::metrics::outbox_round(published, refused);
    match failed_batch {
        Some(error) => Err(error),
        None => Ok(true),
    }
}

/// Inside an ingest batch's transaction, after its messages are planned and written: delete the outbox
/// rows that became (or already were) messages, and mark the ones that cannot, with the reason. A row
/// the batch deferred (its application's row was locked) is left as it is: the writer fails its job
/// with an error the reader retries, and the reader reads it again, in order.
pub(crate) async fn settle(conn: &mut sqlx::PgConnection, batch: &[IngestJob], outcomes: &Outcomes) -> StoreResult<()> {
    let mut done = Vec::new();
    let (mut failed, mut reasons) = (Vec::new(), Vec::new());
    for (job, outcome) in batch.iter().zip(outcomes) {
        let Some(seq) = job.outbox else {
            continue;
        };
        match outcome {
            Outcome::Settled(Ok(_)) | Outcome::Split { .. } => done.push(seq),
            Outcome::Settled(Err(error)) => {
                failed.push(seq);
                reasons.push(error.to_string());
            }
            Outcome::Deferred => {}
        }
    }
    if !done.is_empty() {
        sqlx::query("DELETE FROM herald_outbox WHERE seq = ANY($1)")
            .bind(&done)
            .execute(&mut *conn)
            .await?;
    }
    refuse(&mut *conn, &failed, &reasons).await
}

/// Mark the reader awake [`AWAKE_FOR`] ahead, by the database's clock (the one the producers' trigger
/// reads): their commits do not notify until then.
async fn mark_awake(pool: &PgPool) -> StoreResult<()> {
    sqlx::query("UPDATE herald_outbox_reader SET awake_until = clock_timestamp() + make_interval(secs => $1)")
        .bind(AWAKE_FOR.as_secs_f64())
        .execute(pool)
        .await?;
    Ok(())
}

/// Rows waiting and the oldest one's age, for `/metrics`.
async fn measure(pool: &PgPool) -> StoreResult<()> {
    let row = sqlx::query(
        "SELECT COUNT(*) AS waiting, COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - MIN(created_at)), 0)::float8 AS age \
         FROM herald_outbox WHERE error IS NULL",
    )
    .fetch_one(pool)
    .await?;
    crate::metrics::outbox_backlog(row.try_get("waiting")?, row.try_get("age")?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A round whose answers are `outcomes`, sent before it is settled.
    fn answered(outcomes: Vec<StoreResult<Ingested>>) -> Round {
        outcomes
            .into_iter()
            .enumerate()
            .map(|(seq, outcome)| {
                let (reply, answer) = oneshot::channel();
                let _ = reply.send(outcome);
                (seq as i64, answer)
            })
            .collect()
    }

    #[test]
    fn a_read_takes_at_most_a_round_and_never_more_than_the_room_left_at_the_writer() {
        let round = ROUND as usize;
        assert_eq!(room(0), round);
        assert_eq!(room(round), round);
        assert_eq!(room(round + 10), round - 10);
        assert_eq!(room(QUEUED_ROWS), 0);
        assert_eq!(room(QUEUED_ROWS + 1), 0, "never negative");
    }

    #[tokio::test]
    async fn a_rows_closed_answer_fails_the_round_and_only_a_dropped_answer_means_shutdown() {
        // Never connected: the outcomes below settle without a statement.
        let pool = PgPool::connect_lazy("postgres://nobody@127.0.0.1:1/none").expect("lazy pool");
        let bound = Bound::new(Duration::from_secs(1));
        let settled = settle_round(&pool, &bound, answered(vec![Err(StoreError::Closed)])).await;
        assert!(
            matches!(settled, Err(StoreError::Closed)),
            "a row's Closed is a failed batch (read again), not a shutdown: {settled:?}"
        );
        let (reply, answer) = oneshot::channel::<StoreResult<Ingested>>();
        drop(reply);
        let settled = settle_round(&pool, &bound, vec![(1, answer)]).await;
        assert!(matches!(settled, Ok(false)), "{settled:?}");
    }
}
