//! The writer's second lane: attempt results, when the store has one write connection (SQLite's).
//!
//! On such a store every write takes turns on the one connection, and the sender's attempt results are
//! the largest share of writes besides ingest. Written by a writer of their own, each batch of them took
//! the connection from the group-commit writer and gave it back (a release, a ping and an acquire each
//! way, wake-ups between tasks and SQLite's thread) and committed on its own. So the store queues its
//! results here instead ([`ResultsJob`]), and the group-commit writer writes them in the transaction of
//! its next ingest batch ([`super::BatchWriter::write_committed_with_results`]): one commit, one fsync,
//! no hand-over. Results that find no ingest batch waiting are written in a transaction of their own on
//! the writer's connection ([`super::BatchWriter::write_results`]). (What it gained, and what the
//! results still cost: docs/performance.md, "results-ride-along".)
//!
//! Either kind of work fails alone: should the shared transaction fail on an error of one message or
//! one record (no storage fault), it is rolled back and both are written again apart — the batch on
//! its own careful path, then the results on theirs, once the batch has been dealt with (its replies
//! sent, its outcome recorded), so that a fault of the results is what health reports last — so a bad
//! result never fails a producer's request, nor a bad message a result. A storage fault fails both
//! (nothing of either committed); the result writer tries its results again, as it does after any
//! failure.

use tokio::sync::{mpsc, oneshot};

use crate::{AttemptRecord, StoreError, StoreResult};

/// Attempt results queued to the group-commit writer, and where their outcome goes.
pub(crate) struct ResultsJob {
    /// The results, in the order the sender finished them.
    pub(crate) records: Vec<AttemptRecord>,
    /// Told once they are committed, or why not.
    pub(crate) reply: oneshot::Sender<StoreResult<()>>,
}

impl ResultsJob {
    /// Queue `records` on `lane` and wait until the writer has committed them (or failed to).
    pub(crate) async fn send(lane: &mpsc::Sender<ResultsJob>, records: &[AttemptRecord]) -> StoreResult<()> {
        let (reply, answer) = oneshot::channel();
        let job = ResultsJob {
            records: records.to_vec(),
            reply,
        };
        lane.send(job).await.map_err(|_| StoreError::Closed)?;
        answer.await.unwrap_or(Err(StoreError::Closed))
    }
}

/// The results the writer has been handed: its queue (none on a store whose results take the pool
/// themselves), and those taken for its next transaction.
pub(super) struct ResultsLane {
    queue: Option<mpsc::Receiver<ResultsJob>>,
    taken: Vec<ResultsJob>,
}

impl ResultsLane {
    /// A lane reading `queue`; `None` for a store whose results are not written by its writer.
    pub(super) fn new(queue: Option<mpsc::Receiver<ResultsJob>>) -> Self {
        Self {
            queue,
            taken: Vec::new(),
        }
    }

    /// Whether no results are taken nor queued.
    pub(super) fn is_idle(&self) -> bool {
        self.taken.is_empty() && self.queue.as_ref().is_none_or(|queue| queue.is_empty())
    }

    /// Whether results are taken and wait for the writer's next transaction.
    pub(super) fn has_work(&self) -> bool {
        !self.taken.is_empty()
    }

    /// Take whatever is queued, without waiting.
    pub(super) fn take_queued(&mut self) {
        if let Some(queue) = &mut self.queue {
            while let Ok(job) = queue.try_recv() {
                self.taken.push(job);
            }
        }
    }

    /// Wait until results are queued, and take them; never returns on a lane without a queue, nor once
    /// every sender is gone (the store is closing: its ingest queue closes with it).
    pub(super) async fn arrival(&mut self) {
        match &mut self.queue {
            Some(queue) => match queue.recv().await {
                Some(job) => self.taken.push(job),
                None => {
                    self.queue = None;
                    std::future::pending::<()>().await;
                }
            },
            None => std::future::pending::<()>().await,
        }
    }

    /// The taken results, all in one list, and their replies: what the writer's next transaction writes.
    pub(super) fn drain(&mut self) -> Taken {
        let mut records = Vec::new();
        let mut replies = Vec::with_capacity(self.taken.len());
        for job in self.taken.drain(..) {
            // Most often one job: its list is taken as it is, not copied.
            if records.is_empty() {
                records = job.records;
            } else {
                records.extend(job.records);
            }
            replies.push(job.reply);
        }
        Taken { records, replies }
    }
}

/// Results taken for one transaction.
pub(super) struct Taken {
    /// Every job's records, in the order they were queued.
    pub(super) records: Vec<AttemptRecord>,
    replies: Vec<oneshot::Sender<StoreResult<()>>>,
}

impl Taken {
    /// Tell every job how its results fared: the last one (most often the only one) gets `outcome`
    /// itself, the others a copy ([`StoreError::shared_by_batch`]).
    pub(super) fn answer(self, outcome: StoreResult<()>) {
        let mut replies = self.replies.into_iter();
        let last = replies.next_back();
        // A sender that went away (the node is stopping) needs no answer.
        for reply in replies {
            let _ = reply.send(outcome.as_ref().map(|_| ()).map_err(StoreError::shared_by_batch));
        }
        if let Some(reply) = last {
            let _ = reply.send(outcome);
        }
    }
}
