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
//!
//! A backend may also *defer* a job ([`Outcome::Deferred`]): PostgreSQL does so when another transaction
//! holds the row of the job's application (an endpoint write, an application being deleted), rather than
//! wait for it while holding the cluster-wide ingest lock (see `postgres::bulk`). The rest of the batch
//! commits; the deferred job goes back in the writer's hands, queued again — its request may give it
//! back at its deadline as before — and is tried again in a batch after [`DEFER_PAUSE`], until its
//! application is free (then written) or gone (then answered not found). The jobs behind a deferred job
//! in its [`Fence`] wait with it, so they still commit in order (see [`Deferred`]).
//!
//! On a store with one write connection (SQLite) the writer also writes the sender's attempt results,
//! in the transaction of its next batch when one is queued (see [`results`]).

mod results;

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::pool::PoolConnection;
use sqlx::{Connection, Database, Pool};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

use herald_core::model::{AttemptTrigger, Message};

use crate::split::{Carried, Expansion, Split};
use crate::{AttemptRecord, Change, CreatedDelivery, Ingested, NewMessage, PendingDelivery, StoreError, StoreResult};
use herald_sql::custody::WriteHealth;
pub(crate) use results::ResultsJob;
use results::ResultsLane;

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
/// has its message committed by a later batch. A job its batch deferred ([`Outcome::Deferred`]) is queued
/// again ([`Ticket::requeue`]): until a later batch takes it anew, its request may give it back as if it
/// had never been taken.
#[derive(Debug, Default)]
pub(crate) struct Ticket {
    state: AtomicU8,
    /// Told when the job is queued again, so that a request past its deadline, waiting for the batch
    /// that had taken the job, gives it back then.
    requeued: Notify,
}

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

    /// The writer queues a job it had taken again, unwritten (its batch deferred it): its request may now
    /// give it back, and a request past its deadline is told to.
    fn requeue(&self) {
        if self
            .state
            .compare_exchange(TAKEN, QUEUED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            // A stored permit when nobody waits yet: the request's next wait returns at once.
            self.requeued.notify_one();
        }
    }

    fn settle(&self, to: u8) -> bool {
        self.state
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
    /// batch is, which the writer bounds itself ([`run`]'s `deadline`); should that batch defer the job
    /// (it is queued again, see [`Ticket::requeue`]) after the deadline, it is given back then.
    pub(crate) async fn answer(mut self, deadline: Option<(Instant, Duration)>) -> StoreResult<Ingested> {
        if let Some((at, bound)) = deadline {
            if let Ok(answer) = tokio::time::timeout_at(at, &mut self.answer).await {
                return answer.unwrap_or(Err(StoreError::Closed));
            }
            loop {
                if self.ticket.give_back() {
                    return Err(StoreError::TimedOut(bound));
                }
                tokio::select! {
                    answer = &mut self.answer => return answer.unwrap_or(Err(StoreError::Closed)),
                    () = self.ticket.requeued.notified() => {}
                }
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

/// What became of one job of a batch.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Its answer: written (or found written before), or refused for itself (its application is gone).
    Settled(StoreResult<Ingested>),
    /// Not written, to be tried again in a later batch: another transaction holds its application's row,
    /// which this batch would have had to wait for (PostgreSQL, see `postgres::bulk`), or it is queued
    /// behind such a job in its [`Fence`] (see [`Holds`]). SQLite never defers.
    Deferred,
    /// Written, its fan-out split from the batch (PostgreSQL, see [`crate::split`]): answered once the
    /// batch commits, its delivery rows inserted by the writer's next transactions, a split (a pending
    /// row) each.
    Split {
        /// The message, as its request is answered.
        message: Message,
        /// Its pending rows.
        splits: Vec<Split>,
    },
}

/// The outcome of each job of a batch, in order.
pub(crate) type Outcomes = Vec<Outcome>;

/// The fences of the jobs of one batch held back so far, in batch order: a job queued behind a deferred
/// one in its fence must not commit before it, so it is held back too.
#[derive(Default)]
struct Holds(Vec<Arc<Fence>>);

impl Holds {
    /// Whether the batch holds `job` back (the jobs are asked in batch order): it is deferred itself
    /// (`deferred`), or queued behind a held job of its fence.
    fn hold(&mut self, job: &IngestJob, deferred: bool) -> bool {
        let Some(fence) = &job.fence else {
            return deferred;
        };
        if self.0.iter().any(|held| Arc::ptr_eq(held, fence)) {
            return true;
        }
        if deferred {
            self.0.push(fence.clone());
        }
        deferred
    }
}

/// Which jobs of `batch` the batch holds back ([`Outcome::Deferred`]), by index: those `deferred` says
/// so of, and those queued behind one of them in its fence (see [`Holds`]).
pub(crate) fn held_back(batch: &[IngestJob], deferred: impl Fn(&IngestJob) -> bool) -> Vec<bool> {
    let mut holds = Holds::default();
    batch.iter().map(|job| holds.hold(job, deferred(job))).collect()
}

/// How long deferred jobs wait before the writer tries them again ([`Deferred`]): a lone deferred job
/// must not spin the writer against the database while the row stays locked (an endpoint write holds it
/// for milliseconds, an application's delete for as long as it deletes), and the wait is short next to a
/// request's. Jobs queued meanwhile are written without waiting for it.
pub(crate) const DEFER_PAUSE: Duration = Duration::from_millis(10);

/// The jobs batches deferred ([`Outcome::Deferred`]), waiting to be tried again, in their queued order.
///
/// Jobs of a [`Fence`] must commit in their queued order, and the jobs behind a deferred one may already
/// be queued (the next outbox round, the rest of an `ingest_many`) or come while it waits. So while any
/// job of a fence waits here, every job of that fence the writer receives waits here too, behind it
/// ([`Deferred::park`]), and they are tried again together, in order. (Failing the deferred job instead,
/// as a failed batch does, would keep the order too, but would answer `503` to every `msg-batch` request
/// and stall the outbox reader whenever an endpoint of their application is written.) A job that waits
/// here is queued as far as its request is concerned: given back at its deadline (see [`Ticket`]), it is
/// never written, and breaks its fence, as in the writer's queue.
#[derive(Default)]
struct Deferred {
    jobs: VecDeque<IngestJob>,
    /// When they are tried again; `None` while there are none.
    due: Option<Instant>,
    /// The fences of the jobs waiting here.
    fences: Vec<Arc<Fence>>,
}

impl Deferred {
    /// Keep the jobs a batch deferred (in batch order), to try them again after [`DEFER_PAUSE`]. They go
    /// before the jobs still waiting here: a batch takes the deferred jobs from the front, so what it
    /// deferred was queued before what it left here.
    fn defer(&mut self, deferred: Vec<IngestJob>) {
        if deferred.is_empty() {
            return;
        }
        for job in deferred.into_iter().rev() {
            job.ticket.requeue();
            self.jobs.push_front(job);
        }
        self.due.get_or_insert_with(|| Instant::now() + DEFER_PAUSE);
        self.count_fences();
    }

    /// Move the jobs just received (`batch[from..]`) whose fence has jobs waiting here behind those jobs
    /// (see [`Deferred`]).
    fn park(&mut self, batch: &mut Vec<IngestJob>, from: usize) {
        if self.fences.is_empty() {
            return;
        }
        let received: Vec<IngestJob> = batch.drain(from..).collect();
        for job in received {
            if job.fence.as_ref().is_some_and(|f| self.holds(f)) {
                self.jobs.push_back(job);
            } else {
                batch.push(job);
            }
        }
    }

    /// Move the deferred jobs into `batch` (first, as they were queued before what the writer's queue
    /// holds now) if their pause is over, as many as fit.
    fn take_due(&mut self, batch: &mut Vec<IngestJob>) {
        if self.due.is_some_and(|due| due <= Instant::now()) {
            let room = MAX_BATCH.saturating_sub(batch.len()).min(self.jobs.len());
            batch.extend(self.jobs.drain(..room));
            if self.jobs.is_empty() {
                self.due = None;
            }
            self.count_fences();
        }
    }

    fn holds(&self, fence: &Arc<Fence>) -> bool {
        self.fences.iter().any(|held| Arc::ptr_eq(held, fence))
    }

    fn count_fences(&mut self) {
        let mut fences: Vec<Arc<Fence>> = Vec::new();
        for fence in self.jobs.iter().filter_map(|job| job.fence.as_ref()) {
            if !fences.iter().any(|held| Arc::ptr_eq(held, fence)) {
                fences.push(fence.clone());
            }
        }
        self.fences = fences;
    }
}

/// Gather the next batch into `batch`: the deferred jobs once their pause is over, then whatever is
/// queued, at most [`MAX_BATCH`] (a received job of a fence with deferred jobs waits behind them, see
/// [`Deferred`]), and the attempt results queued on `results`; with none of these, wait for a job, for
/// results or for the deferred jobs' pause — or until `wake` (the writer has work of its own then, see
/// [`Carried`]), and return with `batch` empty. `false` once every sender is gone and no deferred job is
/// left.
async fn next_batch(
    jobs: &mut mpsc::Receiver<IngestJob>,
    results: &mut ResultsLane,
    deferred: &mut Deferred,
    wake: Option<Instant>,
    batch: &mut Vec<IngestJob>,
) -> bool {
    loop {
        deferred.take_due(batch);
        results.take_queued();
        let from = batch.len();
        let woken = wake.is_some_and(|at| at <= Instant::now());
        if from == 0 && (woken || results.has_work()) && jobs.is_empty() {
            return true;
        }
        let due = match (deferred.due, wake) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if from > 0 || results.has_work() {
            let room = MAX_BATCH - from;
            if room > 0 && !jobs.is_empty() {
                // Returns at once: jobs are waiting.
                jobs.recv_many(batch, room).await;
            }
        } else {
            let pause = async {
                match due {
                    Some(due) => tokio::time::sleep_until(due).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                received = jobs.recv_many(batch, MAX_BATCH) => {
                    if received == 0 {
                        // Every sender is gone (the node is stopping): the deferred jobs are still
                        // tried; the writer's own work (`wake`) is left for the next start (see
                        // `crate::split`).
                        let Some(deferred_due) = deferred.due else {
                            return false;
                        };
                        tokio::time::sleep_until(deferred_due).await;
                    }
                }
                () = pause => {}
                () = results.arrival() => {}
            }
        }
        deferred.park(batch, from);
        if !batch.is_empty() || results.has_work() {
            return true;
        }
    }
}

/// The most batches in a row the writer writes on a connection that is the store's only write
/// connection (SQLite's) before it gives it back (see [`WriteDemand::hands_back`]): a bound for a write
/// that waits for it without saying so (every write of the store says so; this is the guard against
/// one that would not), so that it waits a few batches at most, not for as long as ingest stays busy.
const HELD_BATCHES_AT_MOST: u32 = 32;

/// How many writes besides the group-commit writer want the store's write connection right now, when
/// there is only one (SQLite's): the writer keeps it from one batch to the next while it has more work
/// and nobody else wants it, and gives it back to the pool before its next batch once somebody does.
///
/// Every write of the store says so for as long as it waits for the connection (and, for a statement
/// of its own, while it runs): [`SqlStore::writes`](crate::dialect::SqlStore::writes) and
/// [`SqlStore::begin`](crate::dialect::SqlStore::begin) do, and so do the few that take the pool
/// themselves (retention; attempt results need not: the writer writes them itself, see [`results`]).
#[derive(Debug, Default)]
pub(crate) struct WriteDemand(AtomicUsize);

impl WriteDemand {
    /// Say that a write wants the connection, until the guard is dropped.
    pub(crate) fn want(&self) -> Wanting<'_> {
        self.0.fetch_add(1, Ordering::AcqRel);
        Wanting(self)
    }

    /// Whether a writer that wrote the last `held` batches in a row on the connection gives it back
    /// before its next one: once another write wants it, or after [`HELD_BATCHES_AT_MOST`].
    pub(crate) fn hands_back(&self, held: u32) -> bool {
        self.0.load(Ordering::Acquire) > 0 || held >= HELD_BATCHES_AT_MOST
    }
}

/// A write's claim on the store's write connection ([`WriteDemand::want`]), given up when dropped.
pub(crate) struct Wanting<'a>(&'a WriteDemand);

impl Drop for Wanting<'_> {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How a backend writes a batch inside a transaction the writer opened.
pub(crate) trait BatchWriter: Send + Sync + 'static {
    /// The database.
    type Db: Database;

    /// Whether the writer, which has written the last `held` batches in a row on the connection it keeps
    /// (see [`run`]), gives it back to the pool before its next batch although more work is queued. By
    /// default never: the writer's connection is one of the pool's many. SQLite's writer holds the
    /// store's one write connection, so it gives it back as soon as another write waits for it (see
    /// [`WriteDemand`]).
    fn hands_back(&self, held: u32) -> bool {
        let _ = held;
        false
    }

    /// The statement that opens each batch transaction: `BEGIN`, or `BEGIN` and whatever must come first
    /// in the same round trip (PostgreSQL takes its ingest order lock there).
    const BEGIN: &'static str;

    /// Whether [`write`](Self::write) may split a message's fan-out ([`Outcome::Split`]); such a writer
    /// must also [`expand`](Self::expand).
    const SPLITS: bool = false;

    /// Write the jobs; the outer error means a statement failed and nothing of this batch may be kept.
    fn write<'c>(
        &'c self,
        conn: &'c mut <Self::Db as Database>::Connection,
        batch: &'c [IngestJob],
    ) -> BoxFuture<'c, StoreResult<Outcomes>>;

    /// Write the jobs in a transaction of their own and commit it: a batch's fast path (see [`write_on`]).
    /// An error that is no [fault](StoreError::fault) leaves nothing of the batch written and the
    /// connection outside any transaction, so the writer replays the batch message by message on it; a
    /// transaction that could not be rolled back is a fault ([`StoreError::Batch`]).
    ///
    /// By default [`BEGIN`](Self::BEGIN), [`write`](Self::write) and `COMMIT`, each a call of its own
    /// ([`write_in_transaction`]). SQLite's writer puts the `BEGIN` and the `COMMIT` into the batch's
    /// first and last calls instead (`sqlite::bulk`: two round trips to SQLite's thread fewer per
    /// batch), PostgreSQL's the `BEGIN` into the apps read (`postgres::bulk`: one round trip fewer);
    /// both close these transactions themselves ([`close_own_transaction`]).
    fn write_committed<'c>(
        &'c self,
        conn: &'c mut <Self::Db as Database>::Connection,
        batch: &'c [IngestJob],
    ) -> BoxFuture<'c, StoreResult<Outcomes>> {
        Box::pin(write_in_transaction(self, conn, batch))
    }

    /// Write attempt results in a transaction of their own and commit it (see [`results`]); an error
    /// leaves nothing of them written. Only called on a writer whose store queues its results to it.
    fn write_results<'c>(
        &'c self,
        conn: &'c mut <Self::Db as Database>::Connection,
        records: &'c [AttemptRecord],
    ) -> BoxFuture<'c, StoreResult<()>> {
        let _ = (conn, records);
        unsupported("this store writes its attempt results itself")
    }

    /// Write the jobs and attempt results in one transaction and commit it: the fast path of both at
    /// once (see [`results`]). On an error that is no [fault](StoreError::fault) nothing of either is
    /// written and the connection is outside any transaction, as after
    /// [`write_committed`](Self::write_committed). Only called on a writer whose store queues its
    /// results to it.
    fn write_committed_with_results<'c>(
        &'c self,
        conn: &'c mut <Self::Db as Database>::Connection,
        batch: &'c [IngestJob],
        records: &'c [AttemptRecord],
    ) -> BoxFuture<'c, StoreResult<Outcomes>> {
        let _ = (conn, batch, records);
        unsupported("this store writes its attempt results itself")
    }

    /// Insert the delivery rows of `carried` split messages, inside a transaction the writer opened with
    /// [`BEGIN`](Self::BEGIN) (see [`crate::split`]). Only called on a writer that [splits](Self::SPLITS).
    fn expand<'c>(
        &'c self,
        conn: &'c mut <Self::Db as Database>::Connection,
        carried: &'c [Split],
    ) -> BoxFuture<'c, StoreResult<Expansion>> {
        let _ = (conn, carried);
        unsupported("this store never splits a fan-out")
    }

    /// The pending fan-outs nobody carries (not among `carried`): left by a writer that stopped before
    /// it expanded them (see [`crate::split`]), read in a plain transaction. Only called on a writer that
    /// [splits](Self::SPLITS).
    fn orphans<'c>(
        &'c self,
        conn: &'c mut <Self::Db as Database>::Connection,
        carried: &'c [Split],
    ) -> BoxFuture<'c, StoreResult<Vec<Split>>> {
        let _ = (conn, carried);
        Box::pin(async { Ok(Vec::new()) })
    }
}

/// What a [`BatchWriter`] method answers on a writer it is never called on: a fault, so that nothing is
/// acknowledged should it be called after all.
fn unsupported<'c, T: Send + 'c>(why: &'static str) -> BoxFuture<'c, StoreResult<T>> {
    Box::pin(async move { Err(StoreError::Batch(why.to_owned())) })
}

/// [`BatchWriter::write_committed`]'s default: `writer`'s [`BEGIN`](BatchWriter::BEGIN),
/// [`write`](BatchWriter::write) and `COMMIT`, each a call of its own.
pub(crate) async fn write_in_transaction<W: BatchWriter + ?Sized>(
    writer: &W,
    conn: &mut <W::Db as Database>::Connection,
    batch: &[IngestJob],
) -> StoreResult<Outcomes> {
    let mut tx = conn.begin_with(sqlx::AssertSqlSafe(W::BEGIN)).await?;
    match writer.write(&mut tx, batch).await {
        Ok(outcomes) => {
            tx.commit().await?;
            Ok(outcomes)
        }
        Err(error) if error.fault().is_some() => Err(error),
        Err(error) => {
            tx.rollback().await.map_err(StoreError::unrolled)?;
            Err(error)
        }
    }
}

/// What a batch that opened its own transaction, out of sqlx's sight, answers: `written`, once the
/// transaction is rolled back (by `roll_back`) if the batch failed on an error that is no fault, so
/// that it can be replayed on the same connection. A rollback that fails makes the batch fail as a fault
/// ([`StoreError::unrolled`]; the original error is logged): its connection is then closed, never
/// replayed on. On a fault nothing is rolled back here: the connection is closed anyway.
pub(crate) async fn close_own_transaction<T, R>(
    written: StoreResult<T>,
    roll_back: impl FnOnce() -> R,
) -> StoreResult<T>
where
    R: Future<Output = Result<(), sqlx::Error>>,
{
    match written {
        Err(error) if error.fault().is_none() => match roll_back().await {
            Ok(()) => Err(error),
            Err(failed) => {
                tracing::warn!(%error, rollback = %failed, "a batch failed and its transaction could not be rolled back");
                Err(StoreError::unrolled(failed))
            }
        },
        other => other,
    }
}

/// What the writer is handed: ingest jobs and, on a store with one write connection, its attempt results
/// (see [`results`]).
pub(crate) struct Inbox {
    /// The ingest jobs.
    pub(crate) ingest: mpsc::Receiver<IngestJob>,
    /// The attempt results, on a store that queues them to its writer (SQLite); `None` on one whose
    /// results take a connection of their own (PostgreSQL).
    pub(crate) results: Option<mpsc::Receiver<ResultsJob>>,
}

/// Run the writer until every sender is gone, reporting each commit's outcome to `health`; `deadline`
/// bounds each batch's transaction (see [`write_batch`]).
pub(crate) async fn run<W: BatchWriter>(
    pool: Pool<W::Db>,
    writer: W,
    inbox: Inbox,
    feed: mpsc::UnboundedSender<Change>,
    health: Arc<WriteHealth>,
    deadline: Option<Duration>,
    stream: crate::polling::StreamSignals,
) {
    let Inbox {
        ingest: mut jobs,
        results,
    } = inbox;
    let mut results = ResultsLane::new(results);
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut deferred = Deferred::default();
    // The connection kept from the last batch, while batches follow each other: sqlx pings a pooled
    // connection when it takes it back (and PostgreSQL's pool before each acquire too), round trips a
    // busy writer then pays only once it runs out of work, or after a failure (the connection is closed).
    let mut held = None;
    let mut held_batches = 0_u32;
    let mut carried = Carried::new(W::SPLITS);
    if W::SPLITS {
        crate::metrics::fan_out_started();
    }
    loop {
        if W::SPLITS {
            expand_carried(&pool, &mut held, &writer, &mut carried, &feed, &health, deadline).await;
        }
        if jobs.is_empty() && deferred.jobs.is_empty() && carried.is_empty() && results.is_idle() {
            // Idle for now: the connection goes back to the pool before the wait, so that the pool's
            // checks see it (a ping at the next acquire: a server restarted meanwhile costs no request a
            // 503) and it counts among the pool's connections again.
            held = None;
        } else if held.is_some() && writer.hands_back(held_batches) {
            held = None;
        }
        if held.is_none() {
            held_batches = 0;
        }
        if !next_batch(&mut jobs, &mut results, &mut deferred, carried.wake(), &mut batch).await {
            break;
        }
        take(&mut batch);
        let taken = results.has_work().then(|| results.drain());
        if batch.is_empty() {
            if let Some(taken) = taken {
                write_results_alone(&pool, &mut held, &writer, taken, &health, deadline).await;
                held_batches = held_batches.saturating_add(1);
            }
            continue;
        }
        let started = std::time::Instant::now();
        let (written, apart) = match taken {
            None => (
                write_batch(&pool, &mut held, &writer, &Batch(&batch), deadline).await,
                None,
            ),
            Some(taken) => write_with_results(&pool, &mut held, &writer, &batch, taken, deadline).await,
        };
        held_batches = held_batches.saturating_add(1);
        crate::metrics::ingest_batch(batch.len(), started.elapsed(), written.is_ok());
        match written {
            Ok(outcomes) => {
                health.succeeded();
                let committed: Vec<PendingDelivery> = outcomes
                    .iter()
                    .filter_map(|o| match o {
                        Outcome::Settled(Ok(ingested)) => Some(ingested),
                        _ => None,
                    })
                    .flat_map(pending_of)
                    .collect();
                if outcomes.iter().any(|o| {
                    matches!(
                        o,
                        Outcome::Settled(Ok(Ingested::Created { .. })) | Outcome::Split { .. }
                    )
                }) {
                    // Wakes long polls (see `Store::stream_signal`); nobody listening is fine.
                    stream.moved();
                }
                if !committed.is_empty() {
                    // The receiver is gone only when the node is shutting down; the rows are durable and
                    // are picked up from the store at the next start.
                    let _ = feed.send(Change::Committed(committed));
                }
                let mut later = Vec::new();
                let mut splits = Vec::new();
                for (job, outcome) in batch.drain(..).zip(outcomes) {
                    match outcome {
                        Outcome::Settled(answer) => {
                            let _ = job.reply.send(answer);
                        }
                        Outcome::Deferred => later.push(job),
                        Outcome::Split {
                            message,
                            splits: pending,
                        } => {
                            let _ = job.reply.send(Ok(Ingested::Created {
                                message: Arc::new(message),
                                deliveries: Vec::new(),
                            }));
                            splits.extend(pending);
                        }
                    }
                }
                if !splits.is_empty() {
                    carried.add(splits);
                    crate::metrics::fan_out_pending(carried.len());
                }
                if !later.is_empty() {
                    tracing::debug!(
                        messages = later.len(),
                        "ingest deferred: their applications' rows are held"
                    );
                }
                deferred.defer(later);
            }
            Err(error) => {
                // Every request of the batch fails, none is acknowledged. Nothing of it committed, but
                // for one case: a SQLite batch whose check of its rows failed after its `COMMIT` (see
                // `sqlite::bulk::note_seqs`) — at-least-once, a retry may store a message twice.
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
        crate::metrics::ingest_deferred(deferred.jobs.len());
        // Results that failed together with the batch on an error of theirs or of one message: written
        // now, once the batch has been dealt with (its replies sent, its outcome recorded), so that what
        // health reports last is the latest write's (a fault of the results is not hidden by the batch's
        // success before it).
        if let Some(taken) = apart {
            write_results_alone(&pool, &mut held, &writer, taken, &health, deadline).await;
            held_batches = held_batches.saturating_add(1);
        }
    }
}

/// Attempt results alone, in a transaction of their own on the writer's connection (see [`results`]).
async fn write_results_alone<W: BatchWriter>(
    pool: &Pool<W::Db>,
    held: &mut Option<PoolConnection<W::Db>>,
    writer: &W,
    taken: results::Taken,
    health: &WriteHealth,
    deadline: Option<Duration>,
) {
    let written = write_batch(pool, held, writer, &ResultsAlone(&taken.records), deadline).await;
    match &written {
        Ok(()) => health.succeeded(),
        Err(error) => {
            tracing::warn!(%error, records = taken.records.len(), "writing attempt results failed");
            if let Some(fault) = error.fault() {
                health.failed(fault, error.to_string());
            }
        }
    }
    taken.answer(written);
}

/// A batch and attempt results in one transaction; should that fail on an error of one message or one
/// record, the batch alone (see [`results`]). Answers the results when they were written with the batch
/// or failed with it on a fault; returns the batch's outcome and, when they must be written apart, the
/// results — which the caller writes after it has dealt with the batch.
async fn write_with_results<W: BatchWriter>(
    pool: &Pool<W::Db>,
    held: &mut Option<PoolConnection<W::Db>>,
    writer: &W,
    batch: &[IngestJob],
    taken: results::Taken,
    deadline: Option<Duration>,
) -> (StoreResult<Outcomes>, Option<results::Taken>) {
    match write_batch(pool, held, writer, &Together(batch, &taken.records), deadline).await {
        Ok(Some(outcomes)) => {
            taken.answer(Ok(()));
            (Ok(outcomes), None)
        }
        Ok(None) => (
            write_batch(pool, held, writer, &Batch(batch), deadline).await,
            Some(taken),
        ),
        Err(error) => {
            taken.answer(Err(StoreError::shared_by_batch(&error)));
            (Err(error), None)
        }
    }
}

fn pending_of(ingested: &Ingested) -> Vec<PendingDelivery> {
    match ingested {
        Ingested::Created { message, deliveries } if !deliveries.is_empty() => new_deliveries(message, deliveries),
        Ingested::Created { .. } | Ingested::Duplicate(_) => Vec::new(),
    }
}

/// The engine's view of a message's deliveries just created.
pub(crate) fn new_deliveries(message: &Arc<Message>, created: &[CreatedDelivery]) -> Vec<PendingDelivery> {
    created
        .iter()
        .map(|d| PendingDelivery {
            seq: d.seq,
            endpoint_id: d.endpoint_id.clone(),
            message: message.clone(),
            attempts: 0,
            next_attempt_at: message.due_at(),
            window_start: message.due_at(),
            trigger: AttemptTrigger::Scheduled,
        })
        .collect()
}

/// Expand the split fan-outs `carried` holds, if they are due (or a sweep is), in a transaction of their
/// own, and hand their deliveries to the engine — before the writer's next batch, so the feed stays in
/// commit order (see [`crate::split`]). A failure leaves them carried, tried again after a pause.
async fn expand_carried<W: BatchWriter>(
    pool: &Pool<W::Db>,
    held: &mut Option<PoolConnection<W::Db>>,
    writer: &W,
    carried: &mut Carried,
    feed: &mpsc::UnboundedSender<Change>,
    health: &WriteHealth,
    deadline: Option<Duration>,
) {
    if let Some(known) = carried.sweep_due() {
        let found = match write_batch(pool, held, writer, &Sweep(known), deadline).await {
            Ok(found) => found,
            Err(error) => {
                tracing::warn!(%error, "looking for pending fan-outs nobody carries failed; looking again later");
                Vec::new()
            }
        };
        carried.swept(found);
        crate::metrics::fan_out_pending(carried.len());
    }
    let Some(splits) = carried.next() else {
        return;
    };
    let taken = splits.len();
    match write_batch(pool, held, writer, &Expand(splits), deadline).await {
        Ok(expansion) => {
            health.succeeded();
            if !expansion.deliveries.is_empty() {
                let _ = feed.send(Change::Committed(expansion.deliveries));
            }
            let expanded = taken.saturating_sub(expansion.waiting.len());
            carried.expanded(taken, expansion.waiting);
            crate::metrics::fan_out_expansions("expanded", expanded);
        }
        Err(error) => {
            tracing::warn!(%error, messages = taken, "expanding split fan-outs failed; trying again");
            if let Some(fault) = error.fault() {
                health.failed(fault, error.to_string());
            }
            if carried.failed(taken, error.fault().is_none()) {
                crate::metrics::fan_out_expansions("given_up", 1);
            } else {
                crate::metrics::fan_out_expansions("failed", taken);
            }
        }
    }
    crate::metrics::fan_out_pending(carried.len());
}

/// What the writer does in one transaction of its own: write a batch ([`Batch`]), a batch and attempt
/// results ([`Together`]) or results alone ([`ResultsAlone`]), expand split fan-outs ([`Expand`]) or look
/// for those nobody carries ([`Sweep`]).
trait Transaction<W: BatchWriter> {
    type Output;

    /// Do it on `conn`: open the transaction, and commit it if all went well.
    fn run<'c>(
        &'c self,
        conn: &'c mut <W::Db as Database>::Connection,
        writer: &'c W,
    ) -> BoxFuture<'c, StoreResult<Self::Output>>;
}

/// A batch of jobs to write (see [`write_on`]).
struct Batch<'a>(&'a [IngestJob]);

impl<W: BatchWriter> Transaction<W> for Batch<'_> {
    type Output = Outcomes;

    fn run<'c>(
        &'c self,
        conn: &'c mut <W::Db as Database>::Connection,
        writer: &'c W,
    ) -> BoxFuture<'c, StoreResult<Outcomes>> {
        Box::pin(write_on(conn, writer, self.0))
    }
}

/// A batch of jobs and attempt results, in one transaction (see [`results`]): `None` when it failed on
/// an error of one message or one record, nothing of it written and the connection outside any
/// transaction, so that both are written again apart.
struct Together<'a>(&'a [IngestJob], &'a [AttemptRecord]);

impl<W: BatchWriter> Transaction<W> for Together<'_> {
    type Output = Option<Outcomes>;

    fn run<'c>(
        &'c self,
        conn: &'c mut <W::Db as Database>::Connection,
        writer: &'c W,
    ) -> BoxFuture<'c, StoreResult<Option<Outcomes>>> {
        Box::pin(async move {
            match writer.write_committed_with_results(conn, self.0, self.1).await {
                Ok(outcomes) => Ok(Some(outcomes)),
                Err(error) if error.fault().is_some() => Err(error),
                Err(error) => {
                    tracing::warn!(%error, messages = self.0.len(), records = self.1.len(), "writing a batch and attempt results together failed; writing them apart");
                    Ok(None)
                }
            }
        })
    }
}

/// Attempt results alone (see [`BatchWriter::write_results`]).
struct ResultsAlone<'a>(&'a [AttemptRecord]);

impl<W: BatchWriter> Transaction<W> for ResultsAlone<'_> {
    type Output = ();

    fn run<'c>(
        &'c self,
        conn: &'c mut <W::Db as Database>::Connection,
        writer: &'c W,
    ) -> BoxFuture<'c, StoreResult<()>> {
        writer.write_results(conn, self.0)
    }
}

/// Split fan-outs to expand (see [`BatchWriter::expand`]), in a transaction begun as a batch's is.
struct Expand<'a>(&'a [Split]);

impl<W: BatchWriter> Transaction<W> for Expand<'_> {
    type Output = Expansion;

    fn run<'c>(
        &'c self,
        conn: &'c mut <W::Db as Database>::Connection,
        writer: &'c W,
    ) -> BoxFuture<'c, StoreResult<Expansion>> {
        Box::pin(async move {
            let mut tx = conn.begin_with(sqlx::AssertSqlSafe(W::BEGIN)).await?;
            let expansion = writer.expand(&mut tx, self.0).await?;
            tx.commit().await?;
            Ok(expansion)
        })
    }
}

/// A look for the pending fan-outs nobody carries, the carried ones aside (see
/// [`BatchWriter::orphans`]), in a plain transaction: it takes no ingest lock.
struct Sweep<'a>(&'a [Split]);

impl<W: BatchWriter> Transaction<W> for Sweep<'_> {
    type Output = Vec<Split>;

    fn run<'c>(
        &'c self,
        conn: &'c mut <W::Db as Database>::Connection,
        writer: &'c W,
    ) -> BoxFuture<'c, StoreResult<Vec<Split>>> {
        Box::pin(async move {
            let mut tx = conn.begin().await?;
            let found = writer.orphans(&mut tx, self.0).await?;
            tx.commit().await?;
            Ok(found)
        })
    }
}

/// Write a batch (or, on the same terms, expand split fan-outs: [`Transaction`]); the outer error means
/// the transaction itself failed (nothing was committed, but for the case `run` names).
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
/// `held` is the connection the writer kept from its last batch ([`run`]); it is used instead of the
/// pool's, and kept again only if this batch succeeded.
async fn write_batch<W: BatchWriter, T: Transaction<W>>(
    pool: &Pool<W::Db>,
    held: &mut Option<PoolConnection<W::Db>>,
    writer: &W,
    work: &T,
    deadline: Option<Duration>,
) -> StoreResult<T::Output> {
    let until = deadline.map(|limit| (Instant::now() + limit, limit));
    let conn = match held.take() {
        Some(conn) => conn,
        None => within(until, async { Ok(pool.acquire().await?) }).await?,
    };
    let mut on_batch = OnBatch(Some(conn));
    let written = match on_batch.0.as_mut() {
        Some(conn) => within(until, work.run(&mut **conn, writer)).await,
        None => Err(StoreError::Closed),
    };
    if written.is_ok()
        && let Some(conn) = on_batch.0.take()
    {
        *held = Some(conn);
    }
    written
}

/// The connection a batch is on: closed, never reused, unless taken back after the batch succeeded —
/// so after a failure, and also when the writer unwinds mid-batch (a panic), when the connection may
/// hold a transaction sqlx does not know of ([`close_own_transaction`]), which the pool would otherwise
/// hand to the next caller (PostgreSQL's pool has no check for one).
struct OnBatch<DB: Database>(Option<PoolConnection<DB>>);

impl<DB: Database> Drop for OnBatch<DB> {
    fn drop(&mut self) {
        if let Some(conn) = self.0.as_mut() {
            conn.close_on_drop();
        }
    }
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
    match writer.write_committed(conn, batch).await {
        Ok(outcomes) => return Ok(outcomes),
        Err(error) if error.fault().is_some() => return Err(error),
        Err(error) => {
            tracing::warn!(%error, messages = batch.len(), "bulk ingest failed; writing the batch message by message");
        }
    }
    let mut tx = conn.begin_with(sqlx::AssertSqlSafe(W::BEGIN)).await?;
    let mut outcomes = Vec::with_capacity(batch.len());
    // Each message is written alone here, so the writer cannot see the jobs before it: a job behind a
    // deferred one in its fence is held back here instead.
    let mut holds = Holds::default();
    for job in batch {
        if holds.hold(job, false) {
            outcomes.push(Outcome::Deferred);
            continue;
        }
        let mut savepoint = (*tx).begin().await?;
        match writer.write(&mut savepoint, std::slice::from_ref(job)).await {
            Ok(mut single) => {
                savepoint.commit().await?;
                let outcome = single.pop().unwrap_or(Outcome::Settled(Err(StoreError::Closed)));
                if matches!(outcome, Outcome::Deferred) {
                    holds.hold(job, true);
                }
                outcomes.push(outcome);
            }
            Err(error) if error.fault().is_some() => return Err(error),
            Err(error) => {
                savepoint.rollback().await?;
                outcomes.push(Outcome::Settled(Err(error)));
            }
        }
    }
    tx.commit().await?;
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As when the writer unwinds mid-batch: the connection holds a transaction sqlx does not know of,
    /// and must not be handed to the next caller. Without the guard, the pool takes it back as it is
    /// and the next `BEGIN` fails inside the stale transaction.
    #[tokio::test]
    async fn a_connection_left_mid_batch_is_closed_not_pooled_again() {
        use sqlx::Executor;
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        {
            let mut conn = pool.acquire().await.unwrap();
            conn.execute("BEGIN").await.unwrap();
            let _on_batch = OnBatch(Some(conn));
        }
        let mut conn = pool.acquire().await.unwrap();
        conn.execute("BEGIN")
            .await
            .expect("a fresh connection, not the one left in a transaction");
    }

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

    /// Take `jobs` into a batch as the writer does, and defer them all, as a batch whose applications'
    /// rows were locked does.
    fn taken_then_deferred(jobs: Vec<IngestJob>) -> Deferred {
        let mut batch = jobs;
        take(&mut batch);
        let mut deferred = Deferred::default();
        deferred.defer(batch);
        deferred
    }

    /// The jobs of `deferred` that are due after the pause, taken as the writer takes a batch.
    async fn retried(deferred: &mut Deferred) -> Vec<IngestJob> {
        tokio::time::sleep(DEFER_PAUSE * 2).await;
        let mut batch = Vec::new();
        deferred.take_due(&mut batch);
        take(&mut batch);
        batch
    }

    #[tokio::test]
    async fn a_deferred_job_whose_request_is_past_its_deadline_is_given_back_and_never_written() {
        let (taken, waiting) = job(None);
        let bound = Duration::from_millis(50);
        let answered = tokio::spawn(waiting.answer(Some((Instant::now() + bound, bound))));
        let mut batch = vec![taken];
        take(&mut batch);
        // The batch runs past the request's deadline, which waits for it ...
        tokio::time::sleep(bound * 2).await;
        assert!(
            !answered.is_finished(),
            "the request waits for the batch that took its job"
        );
        // ... and defers the job: queued again, it is given back at once.
        let mut deferred = Deferred::default();
        deferred.defer(batch);
        let answer = tokio::time::timeout(Duration::from_secs(5), answered)
            .await
            .expect("answered once its job was deferred")
            .expect("joined");
        assert!(
            matches!(answer, Err(StoreError::TimedOut(b)) if b == bound),
            "{answer:?}"
        );
        assert!(retried(&mut deferred).await.is_empty(), "never written");
    }

    #[tokio::test]
    async fn a_deferred_job_given_back_at_its_deadline_while_it_waits_is_never_written() {
        let (deferred_job, waiting) = job(None);
        let mut deferred = taken_then_deferred(vec![deferred_job]);
        let bound = Duration::from_millis(5);
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            waiting.answer(Some((Instant::now() + bound, bound))),
        )
        .await
        .expect("given back at its deadline, not waiting for a batch");
        assert!(matches!(answer, Err(StoreError::TimedOut(_))), "{answer:?}");
        assert!(retried(&mut deferred).await.is_empty(), "never written");
    }

    #[tokio::test]
    async fn a_deferred_job_is_tried_again_after_the_pause_and_answered_by_that_batch() {
        let (deferred_job, waiting) = job(None);
        let mut deferred = taken_then_deferred(vec![deferred_job]);
        let mut early = Vec::new();
        deferred.take_due(&mut early);
        assert!(early.is_empty(), "not before the pause");
        let mut batch = retried(&mut deferred).await;
        assert_eq!(batch.len(), 1, "taken again");
        for job in batch.drain(..) {
            let _ = job.reply.send(Err(StoreError::NotFound));
        }
        let answer = waiting.answer(None).await;
        assert!(matches!(answer, Err(StoreError::NotFound)), "{answer:?}");
    }

    #[tokio::test]
    async fn jobs_behind_a_deferred_one_in_its_fence_wait_behind_it_and_keep_their_order() {
        let (fence, other) = (Arc::new(Fence::default()), Arc::new(Fence::default()));
        let (first, _w1) = job(Some((1, &fence)));
        let (second, _w2) = job(Some((2, &fence)));
        let (unfenced, _w3) = job(None);
        let (elsewhere, _w4) = job(Some((9, &other)));
        let (before, _w0) = job(Some((0, &fence)));
        // In one batch: the job before the deferred one is written; the one behind it is held back too.
        let batch = vec![before, first, second, unfenced, elsewhere];
        let held = held_back(&batch, |job| job.outbox == Some(1));
        assert_eq!(held, vec![false, true, true, false, false]);
        let deferred_jobs: Vec<IngestJob> = batch
            .into_iter()
            .zip(&held)
            .filter(|(_, held)| **held)
            .map(|(job, _)| job)
            .collect();
        let mut deferred = taken_then_deferred(deferred_jobs);
        // Received later: the fence's next job waits behind them; the others are written now.
        let (third, _w5) = job(Some((3, &fence)));
        let (free, _w6) = job(None);
        let (more_elsewhere, _w7) = job(Some((10, &other)));
        let mut received = vec![third, free, more_elsewhere];
        deferred.park(&mut received, 0);
        assert_eq!(outboxes(&received), vec![None, Some(10)]);
        // After the pause, the fence's jobs are tried again together, in order.
        assert_eq!(outboxes(&retried(&mut deferred).await), vec![Some(1), Some(2), Some(3)]);
        let (fourth, _w8) = job(Some((4, &fence)));
        let mut received = vec![fourth];
        deferred.park(&mut received, 0);
        assert_eq!(
            outboxes(&received),
            vec![Some(4)],
            "nothing of the fence waits any more"
        );
    }

    #[tokio::test]
    async fn queued_jobs_are_written_during_the_pause_and_the_deferred_ones_after_it() {
        let (sender, mut jobs) = mpsc::channel(8);
        let (deferred_job, _w1) = job(None);
        let mut deferred = taken_then_deferred(vec![deferred_job]);
        let (queued, _w2) = job(Some((5, &Arc::new(Fence::default()))));
        sender.send(queued).await.expect("queued");
        let mut batch = Vec::new();
        assert!(next_batch(&mut jobs, &mut ResultsLane::new(None), &mut deferred, None, &mut batch).await);
        assert_eq!(
            outboxes(&batch),
            vec![Some(5)],
            "the queued job, without waiting for the pause"
        );
        batch.clear();
        let started = Instant::now();
        assert!(next_batch(&mut jobs, &mut ResultsLane::new(None), &mut deferred, None, &mut batch).await);
        assert_eq!(outboxes(&batch), vec![None], "the deferred job, after the pause");
        assert!(started.elapsed() < Duration::from_secs(1));
        batch.clear();
        drop(sender);
        assert!(
            !next_batch(&mut jobs, &mut ResultsLane::new(None), &mut deferred, None, &mut batch).await,
            "done"
        );
    }

    /// A writer whose whole batches fail on a message's error (so the writer goes message by message),
    /// deferring the job of outbox row 1; it records the jobs it was asked to write alone.
    #[derive(Default)]
    struct DefersRowOne {
        written: std::sync::Mutex<Vec<Option<i64>>>,
    }

    impl BatchWriter for DefersRowOne {
        type Db = sqlx::Sqlite;
        const BEGIN: &'static str = "BEGIN";

        fn write<'c>(
            &'c self,
            _conn: &'c mut sqlx::SqliteConnection,
            batch: &'c [IngestJob],
        ) -> BoxFuture<'c, StoreResult<Outcomes>> {
            Box::pin(async move {
                let [job] = batch else {
                    return Err(StoreError::Conflict("a message of the batch"));
                };
                if job.outbox == Some(1) {
                    return Ok(vec![Outcome::Deferred]);
                }
                self.written.lock().expect("not poisoned").push(job.outbox);
                Ok(vec![Outcome::Settled(Err(StoreError::NotFound))])
            })
        }
    }

    #[tokio::test]
    async fn message_by_message_a_job_behind_a_deferred_one_in_its_fence_is_held_back_too() {
        let (fence, other) = (Arc::new(Fence::default()), Arc::new(Fence::default()));
        let waiting: Vec<(IngestJob, Waiting)> = vec![
            job(Some((0, &fence))),
            job(Some((1, &fence))),
            job(Some((2, &fence))),
            job(None),
            job(Some((7, &other))),
        ];
        let (batch, _waiting): (Vec<IngestJob>, Vec<Waiting>) = waiting.into_iter().unzip();
        let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:")
            .await
            .expect("an in-memory database");
        let writer = DefersRowOne::default();
        let outcomes = write_on(&mut conn, &writer, &batch).await.expect("written");
        let deferred: Vec<bool> = outcomes.iter().map(|o| matches!(o, Outcome::Deferred)).collect();
        assert_eq!(deferred, vec![false, true, true, false, false]);
        assert_eq!(
            *writer.written.lock().expect("not poisoned"),
            vec![Some(0), None, Some(7)],
            "row 2 was never written"
        );
    }

    /// A writer whose batches all succeed (every job answered `NotFound`), counting them, that keeps
    /// its connection as SQLite's does (see [`WriteDemand`]).
    struct Counts {
        batches: Arc<AtomicUsize>,
        demand: Arc<WriteDemand>,
    }

    impl BatchWriter for Counts {
        type Db = sqlx::Sqlite;
        const BEGIN: &'static str = "BEGIN";

        fn write<'c>(
            &'c self,
            _conn: &'c mut sqlx::SqliteConnection,
            batch: &'c [IngestJob],
        ) -> BoxFuture<'c, StoreResult<Outcomes>> {
            self.batches.fetch_add(1, Ordering::AcqRel);
            let outcomes = batch
                .iter()
                .map(|_| Outcome::Settled(Err(StoreError::NotFound)))
                .collect();
            // Slower than the requests are queued, so that the queue is never empty between batches.
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(1)).await;
                Ok(outcomes)
            })
        }

        fn hands_back(&self, held: u32) -> bool {
            self.demand.hands_back(held)
        }
    }

    /// A writer on a one-connection pool, never out of work; its batches' count, and how many times the
    /// pool took its connection back.
    async fn busy_writer(demand: &Arc<WriteDemand>) -> (sqlx::SqlitePool, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        use futures::FutureExt;
        let releases = Arc::new(AtomicUsize::new(0));
        let counted = releases.clone();
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .after_release(move |_, _| {
                counted.fetch_add(1, Ordering::AcqRel);
                async { Ok(true) }.boxed()
            })
            .connect("sqlite::memory:")
            .await
            .expect("an in-memory database");
        let batches = Arc::new(AtomicUsize::new(0));
        let writer = Counts {
            batches: batches.clone(),
            demand: demand.clone(),
        };
        let (sender, jobs) = mpsc::channel(64);
        let (feed, _) = mpsc::unbounded_channel();
        let health = Arc::new(WriteHealth::default());
        let stream = crate::polling::StreamSignals::new();
        let inbox = Inbox {
            ingest: jobs,
            results: None,
        };
        tokio::spawn(run(pool.clone(), writer, inbox, feed, health, None, stream));
        // The queue stays full: the writer never runs out of work.
        tokio::spawn(async move {
            loop {
                let (job, waiting) = Waiting::queue(new_message(), None);
                if sender.send(job).await.is_err() {
                    return;
                }
                tokio::spawn(waiting.answer(None));
            }
        });
        while batches.load(Ordering::Acquire) < 10 {
            tokio::task::yield_now().await;
        }
        (pool, batches, releases)
    }

    /// How many batches the busy writer writes while another write waits for the connection.
    async fn batches_while_waiting(pool: &sqlx::SqlitePool, batches: &AtomicUsize) -> usize {
        let before = batches.load(Ordering::Acquire);
        let conn = pool.acquire().await.expect("the connection, handed back");
        let during = batches.load(Ordering::Acquire) - before;
        drop(conn);
        // Let the writer take it again and hold it for a few batches.
        while batches.load(Ordering::Acquire) < before + during + 5 {
            tokio::task::yield_now().await;
        }
        during
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_busy_writer_gives_the_one_write_connection_back_as_soon_as_another_write_wants_it() {
        let demand = Arc::new(WriteDemand::default());
        let (pool, batches, _) = busy_writer(&demand).await;
        // Three times over: without the demand, the writer would keep it for up to
        // HELD_BATCHES_AT_MOST batches each time.
        for _ in 0..3 {
            let wanting = demand.want();
            let during = batches_while_waiting(&pool, &batches).await;
            drop(wanting);
            assert!(during <= 2, "{during} batches written while another write waited");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_busy_writer_gives_the_one_write_connection_back_after_a_bounded_run_even_unasked() {
        let demand = Arc::new(WriteDemand::default());
        let (pool, batches, _) = busy_writer(&demand).await;
        let during = batches_while_waiting(&pool, &batches).await;
        let bound = HELD_BATCHES_AT_MOST as usize + 1;
        assert!(during <= bound, "{during} batches written while another write waited");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_busy_writer_nobody_else_waits_for_keeps_the_connection_from_batch_to_batch() {
        let demand = Arc::new(WriteDemand::default());
        let (_pool, batches, releases) = busy_writer(&demand).await;
        let (batches_before, releases_before) = (batches.load(Ordering::Acquire), releases.load(Ordering::Acquire));
        while batches.load(Ordering::Acquire) < batches_before + 3 * HELD_BATCHES_AT_MOST as usize {
            tokio::task::yield_now().await;
        }
        let written = batches.load(Ordering::Acquire) - batches_before;
        let released = releases.load(Ordering::Acquire) - releases_before;
        // Given back once per HELD_BATCHES_AT_MOST batches, not once per batch.
        assert!(
            released <= written / HELD_BATCHES_AT_MOST as usize + 1,
            "released {released} times in {written} batches"
        );
    }

    #[test]
    fn the_writer_hands_back_while_a_write_wants_the_connection_or_after_its_bound() {
        let demand = WriteDemand::default();
        assert!(!demand.hands_back(1), "nobody else wants it");
        {
            let _wanting = demand.want();
            let _another = demand.want();
            assert!(demand.hands_back(1));
        }
        assert!(!demand.hands_back(1), "the claims were dropped");
        assert!(demand.hands_back(HELD_BATCHES_AT_MOST));
    }

    /// A writer whose store queues its results to it, noting each transaction it is asked for; its
    /// first batch waits for `gate`, and its batches written together with results fail on a record's
    /// error while `together_fails` is set.
    struct Lanes {
        /// Starts with no permit.
        gate: tokio::sync::Semaphore,
        first_taken: AtomicBool,
        together_fails: AtomicBool,
        /// Whether batches written together with results fail on a storage fault instead.
        together_faults: AtomicBool,
        /// Whether results written alone fail on a storage fault.
        alone_faults: AtomicBool,
        done: std::sync::Mutex<Vec<String>>,
    }

    impl Lanes {
        fn new(together_fails: bool) -> Arc<Self> {
            Arc::new(Self {
                gate: tokio::sync::Semaphore::new(0),
                first_taken: AtomicBool::new(false),
                together_fails: AtomicBool::new(together_fails),
                together_faults: AtomicBool::new(false),
                alone_faults: AtomicBool::new(false),
                done: std::sync::Mutex::default(),
            })
        }

        fn note(&self, what: String) {
            self.done.lock().expect("not poisoned").push(what);
        }

        fn done(&self) -> Vec<String> {
            self.done.lock().expect("not poisoned").clone()
        }
    }

    impl BatchWriter for Arc<Lanes> {
        type Db = sqlx::Sqlite;
        const BEGIN: &'static str = "BEGIN";

        fn write<'c>(
            &'c self,
            _conn: &'c mut sqlx::SqliteConnection,
            batch: &'c [IngestJob],
        ) -> BoxFuture<'c, StoreResult<Outcomes>> {
            Box::pin(async move {
                if !self.first_taken.swap(true, Ordering::AcqRel) {
                    let _open = self.gate.acquire().await;
                }
                self.note(format!("batch of {}", batch.len()));
                Ok(batch
                    .iter()
                    .map(|_| Outcome::Settled(Err(StoreError::NotFound)))
                    .collect())
            })
        }

        fn write_results<'c>(
            &'c self,
            _conn: &'c mut sqlx::SqliteConnection,
            records: &'c [AttemptRecord],
        ) -> BoxFuture<'c, StoreResult<()>> {
            self.note(format!("{} results alone", records.len()));
            let faults = self.alone_faults.load(Ordering::Acquire);
            Box::pin(async move {
                match faults {
                    true => Err(StoreError::StorageFull("the disk is full".to_owned())),
                    false => Ok(()),
                }
            })
        }

        fn write_committed_with_results<'c>(
            &'c self,
            _conn: &'c mut sqlx::SqliteConnection,
            batch: &'c [IngestJob],
            records: &'c [AttemptRecord],
        ) -> BoxFuture<'c, StoreResult<Outcomes>> {
            Box::pin(async move {
                if self.together_fails.load(Ordering::Acquire) {
                    return Err(StoreError::Conflict("a record of the results"));
                }
                if self.together_faults.load(Ordering::Acquire) {
                    return Err(StoreError::StorageFull("the disk is full".to_owned()));
                }
                self.note(format!("batch of {} with {} results", batch.len(), records.len()));
                Ok(batch
                    .iter()
                    .map(|_| Outcome::Settled(Err(StoreError::NotFound)))
                    .collect())
            })
        }
    }

    /// A running writer with a results lane; its ingest queue, its results lane and the health it reports
    /// to.
    async fn writer_with_lanes(
        lanes: &Arc<Lanes>,
    ) -> (mpsc::Sender<IngestJob>, mpsc::Sender<ResultsJob>, Arc<WriteHealth>) {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .expect("an in-memory database");
        let (ingest, jobs) = mpsc::channel(64);
        let (results, queue) = mpsc::channel(64);
        let (feed, _) = mpsc::unbounded_channel();
        let inbox = Inbox {
            ingest: jobs,
            results: Some(queue),
        };
        let health = Arc::new(WriteHealth::default());
        let stream = crate::polling::StreamSignals::new();
        tokio::spawn(run(pool, lanes.clone(), inbox, feed, health.clone(), None, stream));
        (ingest, results, health)
    }

    /// Queue a message and a batch of `n` results while the writer is busy with its first batch; answer
    /// once both are answered.
    async fn message_and_results_queued_together(
        lanes: &Arc<Lanes>,
        ingest: &mpsc::Sender<IngestJob>,
        results: &mpsc::Sender<ResultsJob>,
        n: usize,
    ) -> (StoreResult<Ingested>, StoreResult<()>) {
        let (first, first_waiting) = Waiting::queue(new_message(), None);
        ingest.send(first).await.expect("the writer runs");
        while !lanes.first_taken.load(Ordering::Acquire) {
            tokio::task::yield_now().await;
        }
        let records: Vec<AttemptRecord> = (0..n)
            .map(|_| crate::events::tests::record(1, true, AttemptTrigger::Scheduled))
            .collect();
        let (reply, answer) = oneshot::channel();
        results
            .send(ResultsJob { records, reply })
            .await
            .expect("the writer runs");
        let (second, second_waiting) = Waiting::queue(new_message(), None);
        ingest.send(second).await.expect("the writer runs");
        lanes.gate.add_permits(1);
        let _ = first_waiting.answer(None).await;
        let ingested = second_waiting.answer(None).await;
        let recorded = answer.await.expect("the writer answers");
        (ingested, recorded)
    }

    #[tokio::test]
    async fn results_queued_with_a_batch_are_written_in_its_transaction_and_alone_otherwise() {
        let lanes = Lanes::new(false);
        let (ingest, results, _) = writer_with_lanes(&lanes).await;
        let (ingested, recorded) = message_and_results_queued_together(&lanes, &ingest, &results, 3).await;
        assert!(matches!(ingested, Err(StoreError::NotFound)), "{ingested:?}");
        recorded.expect("the results are committed");
        // Nothing else queued: results go alone.
        let alone = crate::events::tests::record(1, true, AttemptTrigger::Scheduled);
        ResultsJob::send(&results, &[alone]).await.expect("committed");
        assert_eq!(
            lanes.done(),
            ["batch of 1", "batch of 1 with 3 results", "1 results alone"]
        );
    }

    #[tokio::test]
    async fn a_batch_and_results_that_fail_together_on_a_records_error_are_written_apart() {
        let lanes = Lanes::new(true);
        let (ingest, results, _) = writer_with_lanes(&lanes).await;
        let (ingested, recorded) = message_and_results_queued_together(&lanes, &ingest, &results, 2).await;
        assert!(matches!(ingested, Err(StoreError::NotFound)), "{ingested:?}");
        recorded.expect("the results are committed");
        assert_eq!(lanes.done(), ["batch of 1", "batch of 1", "2 results alone"]);
    }

    /// Written apart, the results come once their batch has been dealt with (its replies sent, its
    /// outcome recorded): a fault of theirs is what health reports last (it was hidden by the batch's
    /// success before).
    #[tokio::test]
    async fn results_written_apart_after_their_batch_leave_their_fault_reported() {
        let lanes = Lanes::new(true);
        lanes.alone_faults.store(true, Ordering::Release);
        let (ingest, results, health) = writer_with_lanes(&lanes).await;
        let (ingested, recorded) = message_and_results_queued_together(&lanes, &ingest, &results, 2).await;
        assert!(matches!(ingested, Err(StoreError::NotFound)), "{ingested:?}");
        assert!(matches!(recorded, Err(StoreError::StorageFull(_))), "{recorded:?}");
        assert_eq!(lanes.done(), ["batch of 1", "batch of 1", "2 results alone"]);
        let failure = health.failure();
        assert!(
            matches!(failure, Some((herald_sql::custody::Fault::Full, _))),
            "{failure:?}"
        );
    }

    #[tokio::test]
    async fn a_batch_and_results_failing_together_on_a_storage_fault_both_fail_and_nothing_is_written_apart() {
        let lanes = Lanes::new(false);
        lanes.together_faults.store(true, Ordering::Release);
        let (ingest, results, _) = writer_with_lanes(&lanes).await;
        let (ingested, recorded) = message_and_results_queued_together(&lanes, &ingest, &results, 2).await;
        assert!(matches!(ingested, Err(StoreError::StorageFull(_))), "{ingested:?}");
        assert!(matches!(recorded, Err(StoreError::StorageFull(_))), "{recorded:?}");
        assert_eq!(lanes.done(), ["batch of 1"], "nothing written apart");
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
