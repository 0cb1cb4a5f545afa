//! Other nodes' commits, for this node's long polls.
//!
//! A long poll waits on its node's [`StreamSignal`](crate::StreamSignal), which that node's group-commit
//! writer moves at each commit; a message ingested through another node sharing the database does not
//! pass it. Ingest could `NOTIFY` every node, but a notifying commit holds PostgreSQL's cluster-wide
//! notification lock until its WAL is flushed (docs/performance.md), and long polls wait nearly all the
//! time wherever a consumer or `herald listen` runs, so every ingest batch of the cluster would pay for it.
//! Instead, only while some long poll waits on this node, the node reads the stream's head (the newest
//! `message_stream.seq`, the end of its primary key) every [`EVERY`] and moves the signal when it changed:
//! ingest is untouched, an idle node reads nothing, and a busy one reads one index entry per tick however
//! many polls wait.
//!
//! Nothing is missed: `seq`s are drawn under the ingest lock in commit order, so a commit after a read
//! shows as a new head at the next one; the first read of a watch moves the signal whatever it finds (a
//! poll that started the watch may have read the stream before a commit that read already includes), and
//! so does the first read after a failed one.
//!
//! A failing read is logged once, at `warn` (until reads work again, this node's long polls hear of other
//! nodes' commits only at the poller's own re-read, every 5 s), and the first read that works again at
//! `info`: not every failed tick, which would be forty lines a second.

use std::time::Duration;

use sqlx::PgPool;

use crate::polling::StreamSignals;
use crate::{StoreError, StoreResult};
use herald_sql::custody::Bound;

/// How often the stream's head is read while a long poll waits on this node.
const EVERY: Duration = Duration::from_millis(25);

/// Move `signals` at other nodes' commits for as long as the node runs, reading only while one is held.
pub(crate) async fn run(pool: PgPool, signals: StreamSignals, bound: Bound) {
    let mut held = signals.held();
    // Kept across watches: a failure is reported once however many long polls come and go meanwhile.
    let mut reads = Reads::Working;
    loop {
        // The node holds a sender of its own: this wait ends only when a long poll begins.
        if held.wait_for(|held| *held > 0).await.is_err() {
            return;
        }
        let mut seen = None;
        while *held.borrow_and_update() > 0 {
            let read = bound.run(head(&pool)).await;
            let report = reads.changed_by(read.is_ok());
            match read {
                Ok(now) => {
                    if report {
                        tracing::info!("the message stream's head is read again: other nodes' commits wake long polls");
                    }
                    if seen != Some(now) {
                        signals.moved();
                        seen = Some(now);
                    }
                }
                Err(error) => {
                    if report {
                        tracing::warn!(
                            %error,
                            "could not read the message stream's head: until it can, long polls on this node hear of \
                             other nodes' commits only at their own re-read (every 5 s)"
                        );
                    }
                    seen = None;
                }
            }
            tokio::time::sleep(EVERY).await;
        }
    }
}

/// Whether the watcher's reads of the stream's head work, as last logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reads {
    Working,
    Failing,
}

impl Reads {
    /// Take a read that worked (`ok`) or failed; true when it changed the state, and so is logged: the
    /// first failure, and the first read that works after failures.
    fn changed_by(&mut self, ok: bool) -> bool {
        let now = if ok { Reads::Working } else { Reads::Failing };
        std::mem::replace(self, now) != now
    }
}

/// The newest position of the message stream, all applications together (`0` when it is empty).
async fn head(pool: &PgPool) -> StoreResult<i64> {
    sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) FROM message_stream")
        .fetch_one(pool)
        .await
        .map_err(StoreError::from)
}

#[cfg(test)]
mod tests {
    use super::Reads;

    #[test]
    fn only_the_first_failure_and_the_recovery_are_reported() {
        let mut reads = Reads::Working;
        let reported: Vec<bool> = [true, true, false, false, false, true, true, false, true]
            .into_iter()
            .map(|ok| reads.changed_by(ok))
            .collect();
        assert_eq!(reported, [false, false, true, false, false, true, false, true, true]);
        assert_eq!(reads, Reads::Working);
    }
}
