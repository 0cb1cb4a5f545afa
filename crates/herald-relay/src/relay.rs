//! The relay loop: claim a batch, publish it, remove what was published, commit; back off when Herald or
//! the source cannot be reached.
//!
//! Where the source has row locks (PostgreSQL, MariaDB/MySQL), a batch is one transaction on the source:
//! its rows stay locked (other relays skip them) while they are published, and are deleted (or marked) in
//! the same transaction. A relay killed at any instant leaves its rows unlocked and still there; the next
//! batch publishes them again with the same `eventId`, which Herald answers with the message it already
//! has — a duplicate attempt, never a duplicate message.
//!
//! Where a write lock is the whole database's ([`locks_database`](crate::dialect::Dialect::locks_database):
//! SQLite), a transaction held across the publishes would make every write of the producer wait for
//! Herald's answers. There a batch is a read of the rows (a snapshot, no write lock), the publishes with no
//! transaction open, and a short transaction that settles the published and refused rows. Nothing marks
//! a row as taken meanwhile, so two relays on one file may both publish it; the `eventId` makes that one
//! message, exactly as after a crash between publish and delete.
//!
//! Where the source has row locks (PostgreSQL, MariaDB/MySQL), a relay works on
//! [`lanes`](crate::dialect::Dialect::lanes) batches at once: one is claimed while another is still
//! publishing, so Herald is never idle while a batch commits or waits for its slowest publish. The lanes
//! share one table exactly as several relays do (`SKIP LOCKED`, and [`order`] holds back a key's rows
//! behind a row another lane holds), and share `concurrency` publishes in flight between them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use sqlx::AnyConnection;
use tokio::sync::{Semaphore, watch};

use crate::config::RelayConfig;
use crate::order::{self, Chunk, Group};
use crate::outbox::{Outbox, SourceError};
use crate::publish::{BatchPublished, ClientError, Published, Publisher, Transient};
use crate::row::OutboxRow;
use herald_core::backoff::Backoff;
use herald_core::clock::Millis;

/// Why a relay could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The source URL or table is unusable.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The HTTP client could not be built.
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// Why a batch failed as a whole (its rows stay, to be claimed again).
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// The source database failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// Herald could not take a row for a reason that is not the row's (rows published before it in the
    /// batch are committed as relayed).
    #[error(transparent)]
    Herald(#[from] Transient),
}

/// What one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// Rows claimed.
    pub claimed: usize,
    /// Rows published and removed (or marked).
    pub published: usize,
    /// Rows Herald refused for good (marked with `relay_error`).
    pub rejected: usize,
    /// Rows held back for a later batch: an earlier row of their ordering key is held elsewhere.
    pub held_back: usize,
}

impl BatchReport {
    /// Whether the next batch should follow at once: this one moved rows. A batch whose every row was
    /// held back waits `poll_interval` (claiming them again at once would only spin until the holder
    /// commits).
    fn moved_rows(&self) -> bool {
        self.claimed > self.held_back
    }
}

/// Running totals of a relay, for its progress lines and tests.
#[derive(Debug, Default)]
pub struct Totals {
    /// Rows published.
    pub published: AtomicU64,
    /// Rows refused.
    pub rejected: AtomicU64,
}

/// A relay from one outbox table to one Herald.
pub struct Relay {
    config: RelayConfig,
    outbox: Outbox,
    publisher: Publisher,
    totals: Arc<Totals>,
    /// `concurrency` permits, one per publish in flight, shared by the lanes.
    in_flight: Semaphore,
}

/// First and longest delay between failed batches.
const BACKOFF_FIRST: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// The most rows, and about the most payload bytes, in one `msg-batch` request: well within Herald's
/// limits (500 messages; the body limit, 1 MiB plus 64 KiB by default), and a body larger than the
/// server takes falls back to one row per request anyway.
const CHUNK_ROWS: usize = 250;
const CHUNK_BYTES: usize = 512 * 1024;
/// How often the backlog (oldest row's age, rows waiting) is measured.
const BACKLOG_EVERY: Duration = Duration::from_secs(1);

/// The outcome of one group's publishes.
#[derive(Default)]
struct GroupOutcome {
    /// (`seq`, `created_at` in Unix ms) of the rows Herald holds.
    published: Vec<(i64, i64)>,
    /// (`seq`, reason) of the rows Herald refused for good.
    rejected: Vec<(i64, String)>,
    /// Why the group stopped early, if it did.
    failed: Option<Transient>,
}

/// What a batch's publishes leave to write back to the source, and to count.
#[derive(Default)]
struct Settlement {
    /// The `seq` of each row Herald holds: removed (or marked).
    published: Vec<i64>,
    /// Each published row's lag, from its `created_at` to Herald's acceptance.
    lags: Vec<Duration>,
    /// (`seq`, reason) of each row Herald refused for good: marked with `relay_error`.
    rejected: Vec<(i64, String)>,
    /// A publish that failed for a reason that is not its row's (its rows stay).
    failed: Option<Transient>,
}

impl Settlement {
    /// The settlement of a batch's group outcomes.
    fn of(outcomes: Vec<GroupOutcome>) -> Self {
        let mut settlement = Self::default();
        for outcome in outcomes {
            for (seq, created_at_ms) in outcome.published {
                settlement.published.push(seq);
                settlement.lags.push(age_of(created_at_ms));
            }
            settlement.rejected.extend(outcome.rejected);
            settlement.failed = settlement.failed.or(outcome.failed);
        }
        settlement
    }

    /// Whether there is nothing to write back.
    fn is_empty(&self) -> bool {
        self.published.is_empty() && self.rejected.is_empty()
    }
}

impl Relay {
    /// Prepare a relay (nothing is contacted yet).
    pub fn new(config: RelayConfig) -> Result<Self, StartError> {
        let outbox = Outbox::open(&config.source, &config.table, config.relayed)?;
        let in_flight = Semaphore::new(config.concurrency);
        let mut publisher = Publisher::new(
            &config.herald,
            &config.token,
            config.concurrency,
            config.publish_timeout,
        )?;
        if config.one_per_request {
            publisher = publisher.one_per_request();
        }
        Ok(Self {
            config,
            outbox,
            publisher,
            totals: Arc::default(),
            in_flight,
        })
    }

    /// The relay's running totals.
    pub fn totals(&self) -> Arc<Totals> {
        self.totals.clone()
    }

    /// Relay until `shutdown` resolves: batches back to back while rows wait, a poll every
    /// `poll_interval` while the outbox is empty, back-off (logged) while Herald or the source fails.
    /// Each lane finishes the batch it is on first.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        let name = self.config.name.clone();
        let lanes = self.outbox.dialect().lanes();
        tracing::info!(
            relay = %name,
            source = %self.outbox.dialect(),
            table = %self.config.table,
            herald = %self.publisher.base(),
            lanes,
            "relay started"
        );
        if self.config.one_per_request {
            tracing::info!(relay = %name, "publishing one row per request (told to)");
        }
        let (stop, stopped) = watch::channel(false);
        let work = futures::future::join(
            futures::future::join_all((0..lanes).map(|_| self.lane(stopped.clone()))),
            self.monitor(stopped),
        );
        tokio::pin!(work);
        tokio::select! {
            () = shutdown => {
                let _ = stop.send(true);
                work.await;
            }
            _ = &mut work => {}
        }
        self.outbox.close().await;
        tracing::info!(relay = %name, "relay stopped");
    }

    /// One lane: batch after batch until `stop`, with its own back-off.
    async fn lane(&self, mut stop: watch::Receiver<bool>) {
        let name = &self.config.name;
        let mut backoff = Backoff::new(BACKOFF_FIRST, BACKOFF_MAX);
        // Empty claims in a row: how long the outbox has been idle.
        let mut idle: u32 = 0;
        while !*stop.borrow() {
            let wait = match self.batch().await {
                Ok(report) => {
                    if backoff.failures() > 0 {
                        tracing::info!(relay = %name, "relay recovered: publishing again");
                    }
                    backoff.succeeded();
                    idle = if report.claimed == 0 { idle.saturating_add(1) } else { 0 };
                    if report.moved_rows() {
                        Duration::ZERO
                    } else if report.claimed == 0 {
                        idle_wait(idle, self.config.poll_interval)
                    } else {
                        self.config.poll_interval
                    }
                }
                Err(error) => {
                    let delay = backoff.failed();
                    let cause = match &error {
                        BatchError::Herald(_) => "herald",
                        BatchError::Source(_) => "source",
                    };
                    crate::metrics::failure(name, cause);
                    tracing::warn!(
                        relay = %name,
                        %error,
                        failures = backoff.failures(),
                        retry_in_ms = delay.as_millis() as u64,
                        "relay batch failed; backing off (rows stay in the outbox and are published later)"
                    );
                    delay
                }
            };
            if !wait.is_zero() {
                tokio::select! {
                    _ = stop.changed() => {}
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    }

    /// The backlog (for `/metrics`) every second and the progress line, until `stop`.
    async fn monitor(&self, mut stop: watch::Receiver<bool>) {
        let mut progress = Progress::new(self.config.report_interval);
        while !*stop.borrow() {
            self.measure_backlog(&mut progress).await;
            progress.maybe_report(&self.config.name, &self.totals);
            tokio::select! {
                _ = stop.changed() => {}
                () = tokio::time::sleep(BACKLOG_EVERY) => {}
            }
        }
    }

    async fn measure_backlog(&self, progress: &mut Progress) {
        match self.outbox.backlog().await {
            Ok((oldest, waiting)) => {
                let age = oldest.map_or(Duration::ZERO, age_of);
                crate::metrics::backlog(&self.config.name, age, waiting);
                progress.lag = Some((age, waiting));
            }
            Err(error) => tracing::debug!(relay = %self.config.name, %error, "measuring the outbox backlog failed"),
        }
    }

    /// Claim, publish and settle one batch.
    pub async fn batch(&self) -> Result<BatchReport, BatchError> {
        if self.outbox.dialect().locks_database() {
            self.batch_without_row_locks().await
        } else {
            self.batch_with_row_locks().await
        }
    }

    /// One batch as one transaction whose claim locks its rows (PostgreSQL, MariaDB/MySQL): the rows stay
    /// locked while they are published, so other relays and lanes skip them, and the producer's inserts
    /// never wait (they take no lock a claimed row holds).
    async fn batch_with_row_locks(&self) -> Result<BatchReport, BatchError> {
        let mut tx = self.outbox.begin().await?;
        let (claimed, unrelayed) = self.read(&mut tx).await?;
        if claimed.is_empty() {
            tx.rollback().await.map_err(SourceError::from)?;
            return Ok(BatchReport::default());
        }
        let (report, settlement) = self.publish(claimed, &unrelayed).await;
        self.settle(&mut tx, &settlement).await?;
        tx.commit().await.map_err(SourceError::from)?;
        self.record(report, settlement)
    }

    /// One batch where a write lock is the whole database's (SQLite): read, publish with no transaction
    /// open, then settle in a short transaction of its own. Holding one transaction across the publishes,
    /// as [`batch_with_row_locks`](Self::batch_with_row_locks) does, would hold the file's write lock for
    /// Herald's round trips: every write of the producer, its business writes too, would wait for them
    /// and fail with `database is locked` past its busy timeout. A relay must never make a producer's own
    /// writes wait on the network.
    ///
    /// It stays correct without the lock because publishing is idempotent on `eventId`:
    /// - A row is removed (or marked) only after Herald acknowledged it, so a relay killed at any instant
    ///   leaves every unacknowledged row in place, to be read and published again.
    /// - A row published twice — by two relays reading the same rows, or again after a crash between
    ///   publish and settle — is one message: Herald answers the second publish with the message it has.
    /// - Each relay still publishes a key's rows in outbox order: its read is the oldest unrelayed rows, so
    ///   every unrelayed row of a key before a row it read is in its read too, and goes first (a group stops
    ///   at its first row that fails). A row missing from the read was removed after Herald acknowledged it,
    ///   or is not committed yet — and SQLite's single writer makes `seq` order commit order, so such a row
    ///   comes after every row read. Another relay's copies of a key's rows are created in that same order,
    ///   or answered with the messages already there.
    /// - Settling a row another relay settled first matches nothing (by `seq`; a marked row keeps its
    ///   mark), so it is no error.
    async fn batch_without_row_locks(&self) -> Result<BatchReport, BatchError> {
        // (1) Read the claimable rows in a deferred transaction: one snapshot for the claim and its
        // `keyed_before` (the same ordering rules as with row locks), and no write lock. It ends before
        // the first publish, so it holds nothing while Herald is asked.
        let (claimed, unrelayed) = {
            let mut read = self.outbox.begin_read().await?;
            let rows = self.read(&mut read).await?;
            read.rollback().await.map_err(SourceError::from)?;
            rows
        };
        if claimed.is_empty() {
            return Ok(BatchReport::default());
        }
        // (2) Publish with no transaction open: the producer writes freely meanwhile.
        let (report, settlement) = self.publish(claimed, &unrelayed).await;
        // (3) Settle in one short `BEGIN IMMEDIATE` transaction: a few statements by `seq`, the only time
        // the relay holds the write lock. A failure here leaves the rows to be published again: a duplicate
        // publish, never a lost row.
        if !settlement.is_empty() {
            let mut tx = self.outbox.begin().await?;
            self.settle(&mut tx, &settlement).await?;
            tx.commit().await.map_err(SourceError::from)?;
        }
        self.record(report, settlement)
    }

    /// Read a batch on `conn`: the claimed rows (oldest first) and every unrelayed row (`seq`, key) of their
    /// ordering keys up to the highest claimed keyed row, claimed or not (see [`order::publishable`]).
    async fn read(&self, conn: &mut AnyConnection) -> Result<(Vec<OutboxRow>, Vec<(i64, String)>), SourceError> {
        let claimed = self.outbox.claim(conn, self.config.batch_size).await?;
        let (keys, max_seq) = order::keys_to_check(&claimed);
        let unrelayed = if keys.is_empty() {
            Vec::new()
        } else {
            self.outbox.keyed_before(conn, &keys, max_seq).await?
        };
        Ok((claimed, unrelayed))
    }

    /// Publish what of `claimed` may go now: in requests of many rows where the server offers them, else
    /// one row per request. The batch's report so far (claimed, held back) and what to settle.
    async fn publish(&self, claimed: Vec<OutboxRow>, unrelayed: &[(i64, String)]) -> (BatchReport, Settlement) {
        let mut report = BatchReport {
            claimed: claimed.len(),
            ..BatchReport::default()
        };
        let groups = order::publishable(claimed, unrelayed);
        report.held_back = report.claimed - groups.iter().map(Vec::len).sum::<usize>();
        let outcomes: Vec<GroupOutcome> = if self.publisher.offers_batch().await {
            let packed = order::pack(groups, CHUNK_ROWS, CHUNK_BYTES);
            report.held_back += packed.held_back;
            let chunks = stream::iter(packed.chunks)
                .map(|chunk| self.publish_chunk(chunk))
                .buffer_unordered(self.config.concurrency)
                .collect::<Vec<_>>();
            let (chunks, singles) = futures::future::join(chunks, self.publish_groups(packed.one_by_one)).await;
            chunks.into_iter().flatten().chain(singles).collect()
        } else {
            self.publish_groups(groups).await
        };
        (report, Settlement::of(outcomes))
    }

    /// Mark the refused rows and remove (or mark) the published ones, in `tx`.
    async fn settle(&self, tx: &mut AnyConnection, settlement: &Settlement) -> Result<(), SourceError> {
        for (seq, reason) in &settlement.rejected {
            tracing::error!(relay = %self.config.name, seq, %reason, "Herald refused an outbox row; it is marked (relay_error) and skipped");
            self.outbox.reject(tx, *seq, reason).await?;
        }
        self.outbox.finish(tx, &settlement.published).await
    }

    /// Count a settled batch (totals, metrics) and finish its report; a publish that failed for a reason
    /// that is not the row's fails the batch (after its other rows were settled).
    fn record(&self, mut report: BatchReport, settlement: Settlement) -> Result<BatchReport, BatchError> {
        report.published = settlement.published.len();
        report.rejected = settlement.rejected.len();
        self.totals
            .published
            .fetch_add(report.published as u64, Ordering::Relaxed);
        self.totals
            .rejected
            .fetch_add(report.rejected as u64, Ordering::Relaxed);
        crate::metrics::batch(&self.config.name, &settlement.lags, report.rejected);
        match settlement.failed {
            Some(error) => Err(error.into()),
            None => Ok(report),
        }
    }

    /// Publish groups, each one row per request, up to `concurrency` at once.
    async fn publish_groups(&self, groups: Vec<Group>) -> Vec<GroupOutcome> {
        stream::iter(groups)
            .map(|group| self.publish_group(group))
            .buffer_unordered(self.config.concurrency)
            .collect()
            .await
    }

    /// Publish a chunk's rows in one request. If the server refuses the request for its content (a row
    /// it would refuse), each group goes one row per request instead, so every row gets its own answer.
    async fn publish_chunk(&self, chunk: Chunk) -> Vec<GroupOutcome> {
        let answer = {
            // Never closed, so a permit always comes: one per request in flight.
            let Ok(_permit) = self.in_flight.acquire().await else {
                return Vec::new();
            };
            self.publisher.publish_batch(&chunk.app, &chunk.rows()).await
        };
        match answer {
            Ok(BatchPublished::Each(results)) => {
                let mut outcome = GroupOutcome::default();
                // The server answers a storage failure for the whole request, so a row that failed has no
                // accepted row of its key after it (see `Store::ingest_many`).
                for (row, result) in chunk.rows().into_iter().zip(results) {
                    match result {
                        Ok(Published::Accepted) => outcome.published.push((row.seq, row.created_at_ms)),
                        Ok(Published::Rejected(reason)) => outcome.rejected.push((row.seq, reason)),
                        Err(error) => outcome.failed = Some(error),
                    }
                }
                vec![outcome]
            }
            Ok(BatchPublished::OneByOne) => self.publish_groups(chunk.groups).await,
            Err(error) => vec![GroupOutcome {
                failed: Some(error),
                ..GroupOutcome::default()
            }],
        }
    }

    /// Publish a group's rows one after the other, stopping at the first that cannot be published now
    /// (the rows after it keep their order: they wait for the next batch).
    async fn publish_group(&self, group: Group) -> GroupOutcome {
        let mut outcome = GroupOutcome::default();
        for row in group {
            // Never closed, so a permit always comes.
            let Ok(_permit) = self.in_flight.acquire().await else {
                break;
            };
            match self.publisher.publish(&row).await {
                Ok(Published::Accepted) => outcome.published.push((row.seq, row.created_at_ms)),
                Ok(Published::Rejected(reason)) => outcome.rejected.push((row.seq, reason)),
                Err(error) => {
                    outcome.failed = Some(error);
                    break;
                }
            }
        }
        outcome
    }
}

/// The first wait after an empty claim; each further empty claim doubles it, up to `poll_interval`.
const FIRST_IDLE_WAIT: Duration = Duration::from_millis(1);

/// How long a lane waits after its `idle`-th empty claim in a row: 1 ms, 2 ms, 4 ms… up to
/// `poll_interval`. A row committed just after the outbox emptied is claimed within a few milliseconds
/// (rows tend to come in bursts), while an outbox that stays empty is looked at only every
/// `poll_interval`.
fn idle_wait(idle: u32, poll_interval: Duration) -> Duration {
    let doubled = FIRST_IDLE_WAIT.saturating_mul(1_u32 << idle.saturating_sub(1).min(20));
    doubled.min(poll_interval)
}

/// How long ago a Unix-millisecond instant was (zero if in the future: clocks differ a little).
fn age_of(at_ms: i64) -> Duration {
    herald_core::clock::now().duration_since(Millis::from_unix_ms(at_ms))
}

/// The periodic progress line: rows relayed, rate since the last line, lag and backlog.
struct Progress {
    every: Option<Duration>,
    last: Instant,
    last_published: u64,
    lag: Option<(Duration, u64)>,
}

impl Progress {
    fn new(every: Option<Duration>) -> Self {
        Self {
            every,
            last: Instant::now(),
            last_published: 0,
            lag: None,
        }
    }

    fn maybe_report(&mut self, name: &str, totals: &Totals) {
        let Some(every) = self.every else { return };
        let elapsed = self.last.elapsed();
        if elapsed < every {
            return;
        }
        let published = totals.published.load(Ordering::Relaxed);
        let rate = (published - self.last_published) as f64 / elapsed.as_secs_f64();
        let (lag, backlog) = self.lag.unwrap_or_default();
        tracing::info!(
            relay = %name,
            relayed = published,
            rejected = totals.rejected.load(Ordering::Relaxed),
            per_second = format!("{rate:.1}"),
            lag_ms = lag.as_millis() as u64,
            backlog,
            "relay progress"
        );
        self.last = Instant::now();
        self.last_published = published;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_lane_looks_again_soon_then_every_poll_interval() {
        let poll = Duration::from_millis(20);
        let waits: Vec<u128> = (1..=7).map(|n| idle_wait(n, poll).as_millis()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 20, 20]);
        assert_eq!(idle_wait(u32::MAX, poll), poll);
        assert_eq!(idle_wait(1, Duration::ZERO), Duration::ZERO);
    }
}
