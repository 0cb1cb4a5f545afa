//! Group commit for ingest, for every backend: one task writes every waiting message in one transaction.
//!
//! Handlers send their message here and wait on a oneshot. The writer takes whatever is queued (up to
//! [`MAX_BATCH`]), writes it all in one transaction, commits once, publishes the new deliveries to the
//! commit feed *in commit order*, and only then answers the handlers. Idle, a lone request commits at
//! once; under load the batches grow by themselves, so throughput scales with concurrency while every
//! acknowledged message is durable.
//!
//! The writer also decides the fan-out: the backend reads each app's `endpoints_version` inside the
//! transaction and takes its endpoints from its cache at that version, or reads them there (see
//! [`crate::plan`] and [`crate::subscribers`]), so a message can never be fanned out to a stale list of
//! endpoints. How a batch is
//! written is the backend's [`BatchWriter`]; should a batch fail as a whole, it is replayed one message
//! per savepoint, so one failing message fails alone and never half-stores.
//!
//! A request waits for its answer within a bound (PostgreSQL), and a message answered `503` for its wait
//! must never be committed by a later batch: a producer retrying it without an `eventId` would store it
//! twice. So each job carries a [`Ticket`]: either the writer takes it (the job is in a batch, and the
//! request waits for that batch's answer, which the writer bounds) or the request gives it back while
//! the job is still queued (the writer then never writes it), whichever comes first.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::pool::PoolConnection;
use sqlx::{Connection, Database, Pool};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use herald_core::model::AttemptTrigger;

use crate::{Change, Ingested, NewMessage, PendingDelivery, StoreError, StoreResult};
use herald_sql::custody::WriteHealth;

/// The most messages committed in one transaction.
pub(crate) const MAX_BATCH: usize = 512;

/// One ingest request waiting for the writer.
pub(crate) struct IngestJob {
    pub(crate) new: NewMessage,
    pub(crate) reply: oneshot::Sender<StoreResult<Ingested>>,
    /// PostgreSQL: the `seq` of the `herald_outbox` row this message comes from, deleted (or marked) in
    /// the batch's own transaction (see `postgres::outbox`); `None` for API requests.
    pub(crate) outbox: Option<i64>,
    /// Shared by jobs queued together that must commit in their queued order (see [`Fence`]): every row
    /// one outbox reader queued since it (re)started, or the messages of one `ingest_many` call.
    pub(crate) fence: Option<Arc<Fence>>,
    /// Whether the writer took the job, or its request gave up waiting first (see [`Ticket`]).
    pub(crate) ticket: Arc<Ticket>,
}

/// Who settles a queued job first: the writer, taking it into a batch, or its request, giving up its
/// wait (see [`Waiting::answer`]). Once taken, the job is written and its request waits for the batch's
/// answer; once given back, the writer never writes it — so a request answered `503` for its wait never
/// has its message committed by a later batch.
#[derive(Debug, Default)]
pub(crate) struct Ticket(AtomicU8);

const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const GIVEN_BACK: u8 = 2;

impl Ticket {
    /// The writer takes the job: `false` if its request gave it back first.
    fn take(&self) -> bool {
        self.settle(TAKEN)
    }

    /// The request gives the job back: `false` if the writer took it first.
    fn give_back(&self) -> bool {
        self.settle(GIVEN_BACK)
    }

    fn settle(&self, to: u8) -> bool {
        self.0
            .compare_exchange(QUEUED, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// A request's side of a queued job: its answer, and its ticket. Dropped before the writer took the job
/// (the request went away: its client disconnected), it gives the job back, so the writer skips it.
pub(crate) struct Waiting {
    answer: oneshot::Receiver<StoreResult<Ingested>>,
    ticket: Arc<Ticket>,
}

impl Waiting {
    /// A job for `new` and the request's side of it.
    pub(crate) fn queue(new: NewMessage, fence: Option<Arc<Fence>>) -> (IngestJob, Waiting) {
        let (reply, answer) = oneshot::channel();
        let ticket = Arc::new(Ticket::default());
        let job = IngestJob {
            new,
            reply,
            outbox: None,
            fence,
            ticket: ticket.clone(),
        };
        (job, Waiting { answer, ticket })
    }

    /// The writer's answer. With a `deadline` (its instant, and the bound it stands for): should the
    /// writer not have taken the job by then, the job is given back and the answer is
    /// [`StoreError::TimedOut`] — it is then never written. A job the writer took is answered when its
    /// batch is, which the writer bounds itself ([`run`]'s `deadline`).
    pub(crate) async fn answer(mut self, deadline: Option<(Instant, Duration)>) -> StoreResult<Ingested> {
        if let Some((at, bound)) = deadline {
            match tokio::time::timeout_at(at, &mut self.answer).await {
                Ok(answer) => return answer.unwrap_or(Err(StoreError::Closed)),
                Err(_) if self.ticket.give_back() => return Err(StoreError::TimedOut(bound)),
                Err(_) => {}
            }
        }
        (&mut self.answer).await.unwrap_or(Err(StoreError::Closed))
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        // A no-op once the writer took the job (or the answer came).
        self.ticket.give_back();
    }
}

/// Keeps jobs queued together in order across a failed batch. An outbox reader queues the next round
/// while the previous one commits, and `Store::ingest_many` queues many messages at once, which may span
/// two batches; should a batch fail as a whole, its jobs are not stored (the outbox rows stay and are
/// read again; the API's caller retries), so jobs queued behind them must not commit first (a later
/// message of an ordering key would overtake an earlier one). The writer breaks the fence of every job
/// of a failed batch and answers the jobs of a broken fence unwritten, as if their batch had failed too.
#[derive(Default)]
pub(crate) struct Fence {
    broken: AtomicBool,
}

impl Fence {
    fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
    }

    fn break_now(&self) {
        self.broken.store(true, Ordering::Release);
    }
}

/// Take the jobs of `batch` the writer is to write, in order: a job its request gave back (see
/// [`Ticket`]) is dropped unwritten, and breaks its fence, since the jobs queued behind it must not
/// commit without it; a job whose fence is broken (see [`Fence`]) is answered unwritten.
fn take(batch: &mut Vec<IngestJob>) {
    let mut kept = Vec::with_capacity(batch.len());
    for job in batch.drain(..) {
        if job.fence.as_ref().is_some_and(|f| f.is_broken()) {
            let _ = job.reply.send(Err(StoreError::Batch(
                "an earlier message's batch failed; this one was not written after it".to_owned(),
            )));
        } else if job.ticket.take() {
            kept.push(job);
        } else if let Some(fence) = &job.fence {
            // Its request was answered already; nobody listens for this job.
            fence.break_now();
        }
    }
    *batch = kept;
}

/// The outcome of each job of a batch, in order.
pub(crate) type Outcomes = Vec<StoreResult<Ingested>>;

/// How a backend writes a batch inside a transaction the writer opened.
pub(crate) trait BatchWriter: Send + Sync + 'static {
    /// The database.
    type Db: Database;

    /// Whether the writer keeps its connection from one batch to the next while more jobs are queued.
    /// sqlx pings a pooled connection on every acquire and every release, two round trips per batch
    /// beside the batch's own few; a busy writer that holds its connection pays them only once it runs
    /// out of work (or after a failure, when the connection is closed). SQLite's one write connection
    /// serves every write, so its writer gives it back after each batch.
    const HOLDS_CONNECTION: bool;

    /// The statement that opens each batch transaction: `BEGIN`, or `BEGIN` and whatever must come first
    /// in the same round trip (PostgreSQL takes its ingest order lock there).
    const BEGIN: &'static str;

    /// Write the jobs; the outer error means a statement failed and nothing of this batch may be kept.
    fn write<'c>(
        &'c self,
        conn: &'c mut <Self::Db as Database>::Connection,
        batch: &'c [IngestJob],
    ) -> BoxFuture<'c, StoreResult<Outcomes>>;
}

/// Run the writer until every sender is gone, reporting each commit's outcome to `health`; `deadline`
/// bounds each batch's transaction (see [`write_batch`]).
pub(crate) async fn run<W: BatchWriter>(
    pool: Pool<W::Db>,
    writer: W,
    mut jobs: mpsc::Receiver<IngestJob>,
    feed: mpsc::UnboundedSender<Change>,
    health: Arc<WriteHealth>,
    deadline: Option<Duration>,
    stream: crate::polling::StreamSignals,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut held = None;
    loop {
        if jobs.is_empty() {
            // Idle for now: the connection goes back to the pool before the wait, so that the pool's
            // checks see it (a ping at the next acquire: a server restarted meanwhile costs no request a
            // 503) and it counts among the pool's connections again.
            held = None;
        }
        if jobs.recv_many(&mut batch, MAX_BATCH).await == 0 {
            break;
        }
        take(&mut batch);
        if batch.is_empty() {
            continue;
        }
        let started = std::time::Instant::now();
        let written = write_batch(&pool, &mut held, &writer, &batch, deadline).await;
        crate::metrics::ingest_batch(batch.len(), started.elapsed(), written.is_ok());
        match written {
            Ok(outcomes) => {
                health.succeeded();
                let committed: Vec<PendingDelivery> = outcomes
                    .iter()
                    .filter_map(|o| o.as_ref().ok())
                    .flat_map(pending_of)
                    .collect();
                if outcomes.iter().any(|o| matches!(o, Ok(Ingested::Created { .. }))) {
                    // Wakes long polls (see `Store::stream_signal`); nobody listening is fine.
                    stream.moved();
                }
                if !committed.is_empty() {
                    // The receiver is gone only when the node is shutting down; the rows are durable and
                    // are picked up from the store at the next start.
                    let _ = feed.send(Change::Committed(committed));
                }
                for (job, outcome) in batch.drain(..).zip(outcomes) {
                    let _ = job.reply.send(outcome);
                }
            }
            Err(error) => {
                // Nothing of the batch committed: every request of it fails, none is acknowledged.
                tracing::error!(%error, messages = batch.len(), "ingest batch failed");
                if let Some(fault) = error.fault() {
                    health.failed(fault, error.to_string());
                }
                for job in batch.drain(..) {
                    if let Some(fence) = &job.fence {
                        fence.break_now();
                    }
                    let _ = job.reply.send(Err(StoreError::shared_by_batch(&error)));
                }
            }
        }
    }
}

fn pending_of(ingested: &Ingested) -> Vec<PendingDelivery> {
    match ingested {
        Ingested::Created { message, deliveries } => {
            let shared = Arc::new(message.clone());
            deliveries
                .iter()
                .map(|d| PendingDelivery {
                    seq: d.seq,
                    endpoint_id: d.endpoint_id.clone(),
                    message: shared.clone(),
                    attempts: 0,
                    next_attempt_at: message.due_at(),
                    window_start: message.due_at(),
                    trigger: AttemptTrigger::Scheduled,
                })
                .collect()
        }
        Ingested::Duplicate(_) => Vec::new(),
    }
}

/// Write a batch; the outer error means the transaction itself failed (nothing was committed).
///
/// The fast path writes the whole batch with a few multi-row statements; if one of them fails on an
/// error of a message (a constraint, a value), the batch is rolled back and written again message by
/// message, each in its own savepoint, so that one bad message fails alone. A storage fault (disk full,
/// I/O error, database gone; see [`crate::custody`]) fails the whole batch instead: SQLite may already
/// have rolled the transaction back, so there is nothing left to replay into. After any failure of the
/// transaction the connection is closed, never reused in a state nobody can vouch for.
///
/// `deadline` bounds the whole batch on the client's side (PostgreSQL), the wait for a connection
/// included: a server that went silent mid-statement fails the batch then, instead of when TCP gives up.
/// Whether it committed is then unknown, so nobody is acknowledged (a retry may store a message twice;
/// one with an `eventId` or an `idempotency-key` is deduplicated). The requests of the batch wait for this
/// answer (see [`Waiting::answer`]), so it is what bounds their wait once their job was taken.
///
/// `held` is the connection a writer that [holds one](BatchWriter::HOLDS_CONNECTION) kept from its last
/// batch; it is used instead of the pool's, and kept again only if this batch succeeded.
async fn write_batch<W: BatchWriter>(
    pool: &Pool<W::Db>,
    held: &mut Option<PoolConnection<W::Db>>,
    writer: &W,
    batch: &[IngestJob],
    deadline: Option<Duration>,
) -> StoreResult<Outcomes> {
    let until = deadline.map(|limit| (Instant::now() + limit, limit));
    let mut conn = match held.take() {
        Some(conn) => conn,
        None => within(until, async { Ok(pool.acquire().await?) }).await?,
    };
    let written = within(until, write_on(&mut *conn, writer, batch)).await;
    if written.is_err() {
        conn.close_on_drop();
    } else if W::HOLDS_CONNECTION {
        *held = Some(conn);
    }
    written
}

/// Run `work`, giving it up at `until` (when there is one: the instant, and the bound it stands for) with
/// [`StoreError::TimedOut`]: whatever it was doing is then of unknown outcome, so the caller must not
/// acknowledge it.
async fn within<T>(until: Option<(Instant, Duration)>, work: impl Future<Output = StoreResult<T>>) -> StoreResult<T> {
    match until {
        Some((at, limit)) => tokio::time::timeout_at(at, work)
            .await
            .unwrap_or(Err(StoreError::TimedOut(limit))),
        None => work.await,
    }
}

async fn write_on<W: BatchWriter>(
    conn: &mut <W::Db as Database>::Connection,
    writer: &W,
    batch: &[IngestJob],
) -> StoreResult<Outcomes> {
    let mut tx = conn.begin_with(sqlx::AssertSqlSafe(W::BEGIN)).await?;
    match writer.write(&mut tx, batch).await {
        Ok(outcomes) => {
            tx.commit().await?;
            return Ok(outcomes);
        }
        Err(error) if error.fault().is_some() => return Err(error),
        Err(error) => {
            tracing::warn!(%error, messages = batch.len(), "bulk ingest failed; writing the batch message by message");
            tx.rollback().await?;
        }
    }
    let mut tx = conn.begin_with(sqlx::AssertSqlSafe(W::BEGIN)).await?;
    let mut outcomes = Vec::with_capacity(batch.len());
    for job in batch {
        let mut savepoint = (*tx).begin().await?;
        match writer.write(&mut savepoint, std::slice::from_ref(job)).await {
            Ok(mut single) => {
                savepoint.commit().await?;
                outcomes.push(single.pop().unwrap_or(Err(StoreError::Closed)));
            }
            Err(error) if error.fault().is_some() => return Err(error),
            Err(error) => {
                savepoint.rollback().await?;
                outcomes.push(Err(error));
            }
        }
    }
    tx.commit().await?;
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_message() -> NewMessage {
        NewMessage {
            app_id: herald_core::id::AppId::new(),
            event_id: None,
            event_type: "t".to_owned(),
            channels: None,
            payload: Arc::from(b"{}".to_vec()),
            idempotency_key: None,
            ordering_key: None,
            tags: None,
            deliver_at: None,
            to_endpoint: None,
            payload_retention_ms: None,
        }
    }

    fn job(outbox: Option<(i64, &Arc<Fence>)>) -> (IngestJob, Waiting) {
        let (mut job, waiting) = Waiting::queue(new_message(), outbox.map(|(_, fence)| fence.clone()));
        job.outbox = outbox.map(|(seq, _)| seq);
        (job, waiting)
    }

    fn outboxes(batch: &[IngestJob]) -> Vec<Option<i64>> {
        batch.iter().map(|j| j.outbox).collect()
    }

    #[tokio::test]
    async fn rows_behind_a_broken_fence_are_answered_unwritten_and_the_rest_keep_their_order() {
        let (broken, intact) = (Arc::new(Fence::default()), Arc::new(Fence::default()));
        broken.break_now();
        let (api, _a) = job(None);
        let (fenced, fenced_waiting) = job(Some((1, &broken)));
        let (other, _o) = job(Some((2, &intact)));
        let (api_2, _b) = job(None);
        let mut batch = vec![api, fenced, other, api_2];
        take(&mut batch);
        assert_eq!(outboxes(&batch), vec![None, Some(2), None]);
        match fenced_waiting.answer(None).await {
            Err(error) => assert!(error.fault().is_some(), "a batch failure, retried: {error}"),
            other => panic!("the fenced row is answered with an error: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_job_given_back_at_its_deadline_is_never_written_and_breaks_its_fence() {
        let fence = Arc::new(Fence::default());
        let (given_back, waiting) = job(Some((1, &fence)));
        let (behind, behind_waiting) = job(Some((2, &fence)));
        let (other, _other_waiting) = job(None);
        let bound = Duration::from_millis(50);
        // Nobody took the job by its deadline: the request hears TimedOut ...
        let answer = waiting.answer(Some((Instant::now() + bound, bound))).await;
        assert!(
            matches!(answer, Err(StoreError::TimedOut(b)) if b == bound),
            "{answer:?}"
        );
        // ... and the writer, reaching it later, writes neither it nor what was queued behind it in its
        // fence; an unrelated job is written.
        let mut batch = vec![given_back, behind, other];
        take(&mut batch);
        assert_eq!(outboxes(&batch), vec![None]);
        assert!(behind_waiting.answer(None).await.is_err());
    }

    #[tokio::test]
    async fn a_job_taken_before_its_deadline_is_waited_for_past_it() {
        let (taken, waiting) = job(None);
        let mut batch = vec![taken];
        take(&mut batch);
        assert_eq!(batch.len(), 1, "taken");
        let bound = Duration::from_millis(50);
        let answered = tokio::spawn(waiting.answer(Some((Instant::now() + bound, bound))));
        // Its batch takes longer than the request's bound, then fails: the request waits for it and
        // hears the batch's answer, not its own deadline's.
        tokio::time::sleep(bound * 3).await;
        assert!(
            !answered.is_finished(),
            "the request gave up a job its batch was writing"
        );
        for job in batch.drain(..) {
            let _ = job
                .reply
                .send(Err(StoreError::Batch("the batch's own failure".to_owned())));
        }
        let answer = answered.await.expect("joined");
        assert!(
            matches!(&answer, Err(StoreError::Batch(text)) if text == "the batch's own failure"),
            "{answer:?}"
        );
    }

    #[test]
    fn a_request_that_went_away_before_its_job_was_taken_has_it_skipped() {
        let (gone, waiting) = job(None);
        let (kept, _kept_waiting) = job(Some((7, &Arc::new(Fence::default()))));
        drop(waiting);
        let mut batch = vec![gone, kept];
        take(&mut batch);
        assert_eq!(outboxes(&batch), vec![Some(7)]);
    }
}
