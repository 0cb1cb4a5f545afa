//! Which batches of the commit feed may go straight into the endpoints' queues.
//!
//! An endpoint's queue reads the store only past the highest `seq` it holds (its cursor), so it must never
//! take a `seq` while a lower one of the same endpoint is still on its way to it: the lower one would be
//! skipped by every later read, and its delivery would wait in the store until the next restart.
//!
//! Lower `seq`s can be on their way in two ways. Writes outside the commit feed — an operator's resend,
//! recover or replay — commit their re-queued deliveries themselves and announce them as a backlog, and
//! that announcement can reach the engine after a feed batch committed later. And when several nodes
//! share the store, another node's deliveries reach this one only through the store watcher. Both
//! stores keep `seq`s in commit order (one writer on SQLite; the ingest advisory lock, which the repairs
//! take too, on PostgreSQL), so a batch whose `seq`s follow, without a hole, everything this node knows
//! to be committed cannot overtake anything. Any other batch is read from the store instead, together
//! with whatever came before it.
//!
//! Pure bookkeeping, no I/O: the engine feeds it what it learns and asks it about each batch.

/// The highest `seq` up to which this node knows every delivery has reached the engine.
#[derive(Debug)]
pub(crate) struct FeedGate {
    /// Everything up to here (inclusive) is known: fed, or announced by the store watcher.
    known_up_to: i64,
    /// Several nodes share the store: only the watcher may move `known_up_to` past a hole.
    shared: bool,
}

impl FeedGate {
    /// A gate that has seen nothing yet: unless the first batch starts at `seq` 1, it is read from the store.
    pub(crate) fn new(shared: bool) -> Self {
        FeedGate { known_up_to: 0, shared }
    }

    /// The store watcher has looked at every delivery up to `seq` (and announced those this node owns).
    pub(crate) fn watched_up_to(&mut self, seq: i64) {
        self.known_up_to = self.known_up_to.max(seq);
    }

    /// Whether a feed batch with these `seq`s may go straight to the queues; if not, the caller has the
    /// batch's endpoints read their backlog from the store.
    ///
    /// On a single-node store every `seq` below the batch is committed already (commit order), so a
    /// batch that skipped some is read from the store once and counts as known from then on. With
    /// several nodes the missing ones may be another node's and reach this one later: only the watcher
    /// can say they were seen.
    pub(crate) fn admits(&mut self, seqs: impl IntoIterator<Item = i64>) -> bool {
        let mut bounds: Option<(i64, i64)> = None;
        let mut count: i64 = 0;
        for seq in seqs {
            count += 1;
            bounds = Some(bounds.map_or((seq, seq), |(low, high)| (low.min(seq), high.max(seq))));
        }
        let Some((low, high)) = bounds else {
            return true;
        };
        let follows = low == self.known_up_to + 1 && high - low + 1 == count;
        if follows || !self.shared {
            self.known_up_to = self.known_up_to.max(high);
        }
        follows
    }
}

#[cfg(test)]
mod tests {
    use super::FeedGate;

    #[test]
    fn a_batch_that_follows_what_is_known_goes_straight_in() {
        let mut gate = FeedGate::new(false);
        gate.watched_up_to(10);
        assert!(gate.admits([11, 12, 13]));
        assert!(gate.admits([15, 14]), "order within a batch does not matter");
        assert!(gate.admits([]), "an empty batch overtakes nothing");
    }

    #[test]
    fn the_first_batch_after_start_is_read_from_the_store() {
        let mut gate = FeedGate::new(false);
        assert!(!gate.admits([41, 42]), "seqs 1..=40 were never seen by this engine");
        assert!(
            gate.admits([43]),
            "on one node, what the batch skipped is committed and now read"
        );
    }

    #[test]
    fn a_resend_committed_between_two_batches_sends_the_next_batch_through_the_store() {
        // Batch 1..=3 fed; an operator's resend commits seq 4 outside the feed; the next batch is 5..=6.
        let mut gate = FeedGate::new(false);
        assert!(gate.admits([1, 2, 3]));
        assert!(
            !gate.admits([5, 6]),
            "seq 4 may still be on its way as a backlog announcement"
        );
        assert!(gate.admits([7]), "after that read the feed is trusted again");
    }

    #[test]
    fn a_hole_inside_a_batch_is_a_hole() {
        let mut gate = FeedGate::new(false);
        assert!(gate.admits([1]));
        assert!(!gate.admits([2, 4]), "seq 3 is missing from the batch");
    }

    #[test]
    fn with_several_nodes_only_the_watcher_closes_a_hole() {
        let mut gate = FeedGate::new(true);
        gate.watched_up_to(5);
        assert!(gate.admits([6, 7]));
        assert!(!gate.admits([9]), "seq 8 is another node's");
        assert!(!gate.admits([10]), "still not seen");
        gate.watched_up_to(9);
        assert!(gate.admits([10]));
        gate.watched_up_to(3);
        assert!(gate.admits([11]), "an older announcement does not move the gate back");
    }
}
