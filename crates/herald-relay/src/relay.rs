//! The relay loop: claim a batch, publish it, remove what was published, commit; back off when Herald or
//! the source cannot be reached.
//!
//! A batch is one transaction on the source: its rows stay locked (other relays skip them) while they are
//! published, and are deleted (or marked) in the same transaction. A relay killed at any instant leaves
//! its rows unlocked and still there; the next batch publishes them again with the same `eventId`, which
//! Herald answers with the message it already has — a duplicate attempt, never a duplicate message.
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
use tokio::sync::{Semaphore, watch};

use crate::config::RelayConfig;
use crate::order::{self, Chunk, Group};
use crate::outbox::{Outbox, SourceError};
use crate::publish::{BatchPublished, ClientError, Published, Publisher, Transient};
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
    published: Vec<(i64, i64)>,
    rejected: Vec<(i64, String)>,
    failed: Option<Transient>,
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
        let mut tx = self.outbox.begin().await?;
        let claimed = self.outbox.claim(&mut tx, self.config.batch_size).await?;
        let mut report = BatchReport {
            claimed: claimed.len(),
            ..BatchReport::default()
        };
        if claimed.is_empty() {
            tx.rollback().await.map_err(SourceError::from)?;
            return Ok(report);
        }
        let (keys, max_seq) = order::keys_to_check(&claimed);
        let unrelayed = if keys.is_empty() {
            Vec::new()
        } else {
            self.outbox.keyed_before(&mut tx, &keys, max_seq).await?
        };
        let groups = order::publishable(claimed, &unrelayed);
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
        let mut published = Vec::new();
        let mut lags = Vec::new();
        let mut failed = None;
        for outcome in outcomes {
            for (seq, created_at_ms) in outcome.published {
                published.push(seq);
                lags.push(age_of(created_at_ms));
            }
            for (seq, reason) in &outcome.rejected {
                tracing::error!(relay = %self.config.name, seq, %reason, "Herald refused an outbox row; it is marked (relay_error) and skipped");
                self.outbox.reject(&mut tx, *seq, reason).await?;
            }
            report.rejected += outcome.rejected.len();
            failed = failed.or(outcome.failed);
        }
        self.outbox.finish(&mut tx, &published).await?;
        tx.commit().await.map_err(SourceError::from)?;
        report.published = published.len();
        self.totals
            .published
            .fetch_add(published.len() as u64, Ordering::Relaxed);
        self.totals
            .rejected
            .fetch_add(report.rejected as u64, Ordering::Relaxed);
        crate::metrics::batch(&self.config.name, &lags, report.rejected);
        match failed {
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
