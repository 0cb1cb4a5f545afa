//! PostgreSQL batches in one round trip: a batch whose applications the writer remembers skips the call
//! that reads them, and its insert statement, sent alone, is its transaction.
//!
//! A batch that reads its apps takes three round trips: `BEGIN` with the ingest lock and the apps read
//! (`bulk::begin_and_read_apps`), the insert statement, `COMMIT`. When the writer remembers the row of
//! every app of the batch ([`KnownApps`]), holds their subscribers at the remembered versions, and the
//! batch needs no other read (no message from the outbox, whose rows the batch settles in its
//! transaction), the insert statement is sent alone, outside any transaction block: PostgreSQL runs it as
//! a transaction of its own and commits it — flushed, with `synchronous_commit` on — before it answers
//! (sqlx reads the answer to its end, `ReadyForQuery`). The statement does the first call's work itself
//! (`bulk::insert_sql`): it tries the ingest lock, share-locks the app rows and checks each as
//! remembered; a message with an `eventId` or an `idempotency-key` that repeats a stored one fails it on
//! the unique index. Should it fail on anything but a storage fault, nothing of it was written, and the
//! batch is written again the three-round-trip way ([`Attempt::Refused`]); once it has committed, any
//! error is answered as it is, never written again.
//!
//! That the statement commits rests on the writer's connection being outside any transaction block when a
//! batch starts (inside one, PostgreSQL would answer the statement without committing it): every
//! transaction the writer opens it also ends, and a batch that fails has its connection closed, never
//! kept (`crate::group_commit`, `OnBatch`).
//!
//! Why the lock is only *tried*: the batch's message ids and creation times are drawn before the
//! statement, and ids follow commit order across nodes only as far as they are drawn under the lock — a
//! batch that waited in its statement behind another node's could commit after it with ids drawn a
//! whole batch earlier. So the statement takes the lock only if it is free at once, and otherwise fails;
//! the batch is then written the usual way, which waits for the lock before it draws its ids, and the
//! writer does not try the short way again for [`PAUSE_AFTER_BUSY_LOCK`], so that nodes contending for
//! the lock do not pay a refused statement per batch. What is left is the time between drawing the ids
//! and the statement taking the lock (encoding and sending the batch: well under a millisecond for
//! batches of small messages): another node's batch that takes and releases the lock within it commits
//! first, perhaps with later ids. Ids of different nodes are ordered by their clocks anyway (UUIDv7,
//! milliseconds), so across nodes they follow commit order up to the nodes' clock skew on either way,
//! and up to that skew plus this window here; on one node, whose writer draws a batch's ids only after
//! the batch before it committed, exactly. The order every reader relies on — delivery `seq`s and the
//! message stream's positions — is drawn under the lock on both ways.
//!
//! Only a node that holds every partition's lease — alone in its cluster — goes the short way. Nodes that
//! share the partitions contend for the ingest lock, and measured with two nodes the short way was
//! slower than the usual one (docs/performance.md, "PostgreSQL batches in one round trip"); it also
//! keeps message ids in commit order across nodes as the usual way does, but for a node that joins
//! while another still holds every lease.
//!
//! A batch refused for a message that repeats a stored one did its inserts before the unique index
//! refused it, under the lock; so after such a refusal, batches with an `eventId` or a key go the usual
//! way for [`PAUSE_AFTER_REPEAT`] (producers that retry tend to retry many at once).

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::PgConnection;
use sqlx::postgres::PgDatabaseError;

use super::bulk::{created_by_job, insert_all};
use super::lease::Leases;
use crate::group_commit::{IngestJob, Outcomes};
use crate::known_apps::{KnownApps, Recalled};
use crate::plan::{self, Earlier};
use crate::subscribers;
use crate::{StoreError, StoreResult, split};

/// How long the writer writes every batch the usual way after a statement found the ingest lock taken.
const PAUSE_AFTER_BUSY_LOCK: Duration = Duration::from_secs(1);

/// How long the writer writes batches with an `eventId` or an `idempotency-key` the usual way after a
/// statement was refused for a message (most often one repeating a stored one).
const PAUSE_AFTER_REPEAT: Duration = Duration::from_secs(1);

/// The writer's memory of app rows, and whether it may use it now.
#[derive(Debug, Default)]
pub(crate) struct Remembered {
    known: KnownApps,
    /// Until when batches go the usual way: a statement found the ingest lock taken.
    paused: Pause,
    /// Until when batches with an `eventId` or a key go the usual way: a statement was refused for a
    /// message.
    keyed_paused: Pause,
}

/// Until when a kind of batch goes the usual way.
#[derive(Debug, Default)]
struct Pause(Mutex<Option<Instant>>);

impl Pause {
    fn start(&self, length: Duration) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now() + length);
    }

    fn is_on(&self) -> bool {
        let mut until = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match *until {
            Some(end) if Instant::now() < end => true,
            Some(_) => {
                *until = None;
                false
            }
            None => false,
        }
    }
}

/// What became of a batch written the short way.
enum Attempt {
    /// Committed; or failed on a storage fault, or after its commit: answered as it is.
    Answered(StoreResult<Outcomes>),
    /// Refused before anything of it was written: the batch is written again the usual way.
    Refused(StoreError),
}

/// Why a statement of the short way was refused, by the column its `NOT NULL` failed on (see
/// `bulk::insert_sql`).
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// `message.id`: the ingest lock was taken. (Checked first: `message.id` is the table's first
    /// column, and PostgreSQL checks `NOT NULL` in column order.)
    LockBusy,
    /// `message.app_id`: a remembered row moved, or another transaction holds it.
    RowMoved,
    /// Anything else: an error of a message (a repeated `eventId`, a value the database refuses).
    Message,
}

impl Refusal {
    fn of(error: &StoreError) -> Refusal {
        let StoreError::Database(sqlx::Error::Database(database)) = error else {
            return Refusal::Message;
        };
        let Some(postgres) = database.try_downcast_ref::<PgDatabaseError>() else {
            return Refusal::Message;
        };
        match (postgres.code(), postgres.table(), postgres.column()) {
            ("23502", Some("message"), Some("id")) => Refusal::LockBusy,
            ("23502", Some("message"), Some("app_id")) => Refusal::RowMoved,
            _ => Refusal::Message,
        }
    }
}

impl Remembered {
    /// The rows, for the usual way's apps read to remember what it finds.
    pub(super) fn known(&self) -> &KnownApps {
        &self.known
    }

    /// Write `batch` the short way if it can be: `None` when it cannot, or when its statement was
    /// refused (nothing of it written); the caller then writes it the usual way.
    pub(super) async fn write(
        &self,
        conn: &mut PgConnection,
        batch: &[IngestJob],
        leases: &Leases,
        cache: &subscribers::Cache,
    ) -> Option<StoreResult<Outcomes>> {
        // A node that shares the partitions has others beside it, which contend for the ingest lock.
        if !leases.owns_every_partition() {
            return None;
        }
        let recalled = self.recall(batch, cache)?;
        match write(conn, batch, leases, recalled).await {
            Attempt::Answered(answered) => {
                if answered.is_ok() {
                    crate::metrics::ingest_one_statement();
                }
                Some(answered)
            }
            Attempt::Refused(error) => {
                let refusal = Refusal::of(&error);
                tracing::debug!(%error, ?refusal, "a batch trusting remembered app rows was refused; writing it the usual way");
                match refusal {
                    Refusal::LockBusy => self.paused.start(PAUSE_AFTER_BUSY_LOCK),
                    Refusal::RowMoved => self.known.forget(),
                    Refusal::Message => self.keyed_paused.start(PAUSE_AFTER_REPEAT),
                }
                crate::metrics::ingest_shortcut_refused(refusal.label());
                None
            }
        }
    }

    /// What the writer remembers of the batch's apps, if the batch can go the short way now.
    fn recall(&self, batch: &[IngestJob], cache: &subscribers::Cache) -> Option<Recalled> {
        if batch.iter().any(|job| job.outbox.is_some()) || self.paused.is_on() {
            return None;
        }
        if !plan::keyed(batch).is_empty() && self.keyed_paused.is_on() {
            return None;
        }
        self.known.recall(batch, cache)
    }
}

impl Refusal {
    /// Its label in `crate::metrics::INGEST_SHORTCUT_REFUSED`.
    fn label(&self) -> &'static str {
        match self {
            Refusal::LockBusy => "lock_busy",
            Refusal::RowMoved => "row_moved",
            Refusal::Message => "message",
        }
    }
}

/// The batch in one statement, with its apps as `recalled` (see the module's docs).
async fn write(conn: &mut PgConnection, batch: &[IngestJob], leases: &Leases, recalled: Recalled) -> Attempt {
    let Recalled {
        apps,
        subscribers,
        rows,
    } = recalled;
    // Nothing is held back (an app whose row is held refuses the statement instead), and no stored
    // message is looked for (one that a message repeats refuses it on the unique index).
    let plan = plan::plan(batch, &apps, &[], Earlier::default());
    let (fan_out, split) = split::split_wide(&plan.messages, plan.fan_out(&subscribers));
    let returned = match insert_all(conn, &plan.messages, &fan_out, &split, leases, Some(&rows)).await {
        Ok(returned) => returned,
        Err(error) if error.fault().is_none() => return Attempt::Refused(error),
        Err(error) => return Attempt::Answered(Err(error)),
    };
    // Committed: from here on an error must not send the batch the usual way, which would store it
    // again. It is answered as a fault: nobody is acknowledged (a retry may store a message twice).
    let answered = created_by_job(&fan_out, &returned)
        .map(|deliveries| plan.finish(deliveries, split))
        .map_err(|error| {
            StoreError::Batch(format!(
                "a committed batch's deliveries could not be read back: {error}"
            ))
        });
    Attempt::Answered(answered)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_that_is_no_database_refusal_is_the_messages() {
        assert_eq!(Refusal::of(&StoreError::NotFound), Refusal::Message);
        assert_eq!(
            Refusal::of(&StoreError::Database(sqlx::Error::RowNotFound)),
            Refusal::Message
        );
    }

    #[test]
    fn a_pause_lasts_its_length_then_ends_by_itself() {
        let pause = Pause::default();
        assert!(!pause.is_on(), "none yet");
        pause.start(Duration::from_secs(3600));
        assert!(pause.is_on());
        pause.start(Duration::ZERO);
        assert!(!pause.is_on(), "over");
        assert!(!pause.is_on(), "and stays over");
    }
}
