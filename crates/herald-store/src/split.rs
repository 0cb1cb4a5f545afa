//! Wide fan-outs written in two steps (PostgreSQL): the message and the list of its endpoints before the
//! `202`, its delivery rows right after.
//!
//! A message to 1,000 endpoints needs 1,000 delivery rows, each with its own retry state, and writing them
//! into `delivery`'s four indexes takes about ten milliseconds of PostgreSQL's time — ten milliseconds the
//! producer would wait for its `202`. So a batch writes a message with more than [`SPLIT_ABOVE`]
//! deliveries as its row and `fan_out_pending` rows holding the ids of the endpoints it goes to, up to
//! [`CHUNK`] per row (each a [`Split`]), in the batch's transaction: once it commits, the message and who
//! it goes to are as durable as every delivery row would have made them, and its request is answered.
//! The writer then inserts the delivery rows, a chunk per transaction of their own, before its next
//! batches ([`Carried`]), deleting the chunk's pending row in the same statement, and hands each chunk's
//! deliveries to the engine as it commits — the engine sends the first chunk while the next is written.
//!
//! What this keeps:
//! - **Who gets it.** The endpoints are those subscribed when the message was accepted, as without the
//!   split; only an endpoint deleted in between gets no delivery (its deliveries are deleted with it).
//! - **Order.** A message with an `orderingKey` is never split, so no later message of its key can get
//!   its delivery rows (and `seq`s) first. The expansion takes the ingest lock as a batch does, so `seq`s
//!   still follow commit order.
//! - **Custody.** A node that stops between the two steps leaves the pending row; every node's writer
//!   looks for pending rows older than [`ORPHAN_AGE_MS`] at its start and every [`SWEEP_EVERY`] and
//!   expands them. Two writers expanding one row cannot both insert: the statement inserts a message's
//!   rows only if it deleted its pending row, and expansions hold the ingest lock. The sweep's read holds
//!   no lock and waits for none for long (a locked table makes it give up until the next sweep), so it
//!   never holds up ingest.
//!
//! SQLite writes every delivery in the batch: its whole fan-out to 1,000 endpoints commits within the
//! target, and a second transaction would cost it a second fsync.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use herald_core::id::EndpointId;
use herald_core::model::Message;
use tokio::time::Instant;

use crate::PendingDelivery;
use crate::plan::{FanOut, NewRow};
use crate::subscribers::ByApp;

/// A message is split when it has more deliveries than this. Below it, the rows cost the batch less than
/// the second transaction (and its commit) would.
pub(crate) const SPLIT_ABOVE: usize = 128;

/// The most endpoints of one pending row, and so of one expansion's transaction: small enough that the
/// engine gets the first deliveries of a wide fan-out a few milliseconds after the `202`, large enough
/// that a commit is shared by a few hundred rows.
pub(crate) const CHUNK: usize = 250;

/// The endpoints of a split message as its pending rows hold them: numbered chunks of [`CHUNK`].
pub(crate) fn chunks(endpoints: &[EndpointId]) -> impl Iterator<Item = (i32, &[EndpointId])> {
    (0..).zip(endpoints.chunks(CHUNK))
}

/// How often a writer looks for pending fan-outs nobody carries (besides at its start).
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// A pending fan-out older than this is taken up by any writer's sweep. Its own writer expands it within
/// milliseconds, unless its application's row is held (an endpoint write, an application's delete); a
/// sweep that takes it up meanwhile only retries it too.
pub(crate) const ORPHAN_AGE_MS: i64 = 10_000;

/// The most pending fan-outs one sweep takes up.
pub(crate) const SWEEP_LIMIT: i64 = 64;

/// A message written without its delivery rows, and the endpoints of one of its pending rows.
#[derive(Debug, Clone)]
pub(crate) struct Split {
    pub(crate) message: Arc<Message>,
    /// Which of its pending rows (see [`chunks`]).
    pub(crate) chunk: i32,
    pub(crate) endpoints: Vec<EndpointId>,
}

/// The splits of `message` to `endpoints`, one per pending row.
pub(crate) fn split(message: Message, endpoints: &[EndpointId]) -> Vec<Split> {
    let message = Arc::new(message);
    chunks(endpoints)
        .map(|(chunk, ids)| Split {
            message: message.clone(),
            chunk,
            endpoints: ids.to_vec(),
        })
        .collect()
}

/// What an expansion did: the deliveries it committed, and the splits to try again later (their
/// application's row was held).
#[derive(Debug, Default)]
pub(crate) struct Expansion {
    pub(crate) deliveries: Vec<PendingDelivery>,
    pub(crate) waiting: Vec<Split>,
}

/// Take the deliveries of wide messages out of a batch's fan-out: the rows to write now, and, by job
/// index, the endpoints of each message to split (see [`SPLIT_ABOVE`]; never a message with an ordering
/// key).
pub(crate) fn split_wide<'p>(
    messages: &[NewRow<'_>],
    fan_out: Vec<FanOut<'p>>,
) -> (Vec<FanOut<'p>>, HashMap<usize, Vec<EndpointId>>) {
    let mut counts: HashMap<usize, usize> = HashMap::new();
    for row in &fan_out {
        *counts.entry(row.job).or_default() += 1;
    }
    let wide: HashSet<usize> = messages
        .iter()
        .filter(|row| row.message.ordering_key.is_none())
        .filter(|row| counts.get(&row.job).is_some_and(|n| *n > SPLIT_ABOVE))
        .map(|row| row.job)
        .collect();
    if wide.is_empty() {
        return (fan_out, HashMap::new());
    }
    let mut split: HashMap<usize, Vec<EndpointId>> = HashMap::new();
    let mut now = Vec::with_capacity(fan_out.len());
    for row in fan_out {
        if wide.contains(&row.job) {
            split.entry(row.job).or_default().push(row.endpoint_id.clone());
        } else {
            now.push(row);
        }
    }
    (now, split)
}

/// The deliveries of `ready` splits to insert, `job` being the index of the split: each endpoint of the
/// split that is still one of its application's (`endpoints`, read under the application's share lock);
/// an endpoint deleted since the message was accepted gets none.
pub(crate) fn expansion_rows<'a>(ready: &[&'a Split], endpoints: &'a ByApp) -> Vec<FanOut<'a>> {
    let mut rows = Vec::new();
    for (job, split) in ready.iter().enumerate() {
        let Some(list) = endpoints.get(&split.message.app_id) else {
            continue;
        };
        let current: HashSet<&str> = list.iter().map(|ep| ep.id.as_str()).collect();
        rows.extend(
            split
                .endpoints
                .iter()
                .filter(|id| current.contains(id.as_str()))
                .map(|endpoint_id| FanOut {
                    job,
                    message: &split.message,
                    endpoint_id,
                }),
        );
    }
    rows
}

/// The first pause after a failed expansion, doubled after each failure in a row up to
/// [`MAX_RETRY_PAUSE`].
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(100);
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(5);

/// The splits a writer carries between its transactions, and when it expands them next.
#[derive(Debug, Default)]
pub(crate) struct Carried {
    splits: Vec<Split>,
    /// When the splits are expanded next; `None` while there are none.
    due: Option<Instant>,
    /// When the writer next looks for pending fan-outs nobody carries; `None` for a store that never
    /// splits.
    sweep_at: Option<Instant>,
    /// Failed expansions in a row.
    failures: u32,
    /// The database refused the last expansion for what it holds (not a storage fault): the splits are
    /// tried one at a time until the one it refuses is found.
    one_at_a_time: bool,
}

impl Carried {
    /// Nothing carried yet; a writer that splits sweeps at once (what an earlier run left).
    pub(crate) fn new(splits: bool) -> Self {
        Self {
            sweep_at: splits.then(Instant::now),
            ..Self::default()
        }
    }

    /// Carry the splits a batch just committed: expanded before the next batch.
    pub(crate) fn add(&mut self, splits: impl IntoIterator<Item = Split>) {
        let before = self.splits.len();
        self.splits.extend(splits);
        if self.splits.len() > before {
            self.due = Some(Instant::now());
        }
    }

    /// Whether no split waits for its deliveries.
    pub(crate) fn is_empty(&self) -> bool {
        self.splits.is_empty()
    }

    /// How many splits wait for their deliveries.
    pub(crate) fn len(&self) -> usize {
        self.splits.len()
    }

    /// When the writer must run an expansion even with no job queued.
    pub(crate) fn wake(&self) -> Option<Instant> {
        match (self.due, self.sweep_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The splits carried now, to tell a sweep which pending fan-outs are not orphans; `None` unless a
    /// sweep is due.
    pub(crate) fn sweep_due(&self) -> Option<&[Split]> {
        self.sweep_at
            .is_some_and(|at| at <= Instant::now())
            .then_some(&self.splits[..])
    }

    /// A sweep found `orphans` (none, should it have failed): carried from now on; the next sweep comes
    /// after [`SWEEP_EVERY`].
    pub(crate) fn swept(&mut self, orphans: Vec<Split>) {
        self.sweep_at = Some(Instant::now() + SWEEP_EVERY);
        self.add(orphans);
    }

    /// The splits the next expansion takes; `None` when none is due: the first, and those after it while
    /// they fit in one [`CHUNK`] of rows together, no message twice (one statement claims a message's
    /// pending row by its id).
    pub(crate) fn next(&self) -> Option<&[Split]> {
        if self.due.is_none_or(|at| at > Instant::now()) {
            return None;
        }
        let mut rows = 0;
        let mut messages = HashSet::new();
        let take = self
            .splits
            .iter()
            .take_while(|s| {
                rows += s.endpoints.len();
                messages.insert(s.message.id.as_str()) && (messages.len() == 1 || rows <= CHUNK)
            })
            .count();
        let take = if self.one_at_a_time { take.min(1) } else { take };
        Some(&self.splits[..take])
    }

    /// The expansion that took `taken` splits committed; `waiting`, of those, wait for their
    /// application's row.
    pub(crate) fn expanded(&mut self, taken: usize, waiting: Vec<Split>) {
        let now = Instant::now();
        let rest = self.splits.split_off(taken.min(self.splits.len()));
        self.splits = waiting;
        let waits = !self.splits.is_empty();
        self.splits.extend(rest);
        self.failures = 0;
        // One at a time until the refused split is found (see `failed`), or none is left.
        self.one_at_a_time &= !self.splits.is_empty();
        self.due = if self.splits.is_empty() {
            None
        } else if waits {
            // An application's row is held: try again shortly, as deferred jobs are.
            Some(now + crate::group_commit::DEFER_PAUSE)
        } else {
            Some(now)
        };
    }

    /// The expansion that took `taken` splits failed: `refused` when the database refused it for what
    /// it holds rather than for a fault. A split refused alone is given up (logged; its pending row
    /// stays, and the next sweeps try it again); otherwise the same splits are tried again after a pause
    /// that grows with each failure in a row. `true` when a split was given up.
    pub(crate) fn failed(&mut self, taken: usize, refused: bool) -> bool {
        if refused && taken == 1 {
            let given_up = self.splits.remove(0);
            tracing::error!(
                message = %given_up.message.id,
                "the database refused a split fan-out's deliveries; its pending row stays for the next sweep"
            );
            self.failures = 0;
            self.one_at_a_time = false;
            self.due = (!self.splits.is_empty()).then(Instant::now);
            return true;
        }
        if refused {
            self.one_at_a_time = true;
        }
        self.failures = self.failures.saturating_add(1);
        let pause = FIRST_RETRY_PAUSE
            .saturating_mul(1 << self.failures.saturating_sub(1).min(6))
            .min(MAX_RETRY_PAUSE);
        self.due = Some(Instant::now() + pause);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::id::{AppId, MessageId};

    fn message(ordering_key: Option<&str>) -> Message {
        Message {
            id: MessageId::new(),
            app_id: AppId::new(),
            event_id: None,
            event_type: "t".to_owned(),
            channels: None,
            payload: Arc::from(b"{}".to_vec()),
            ordering_key: ordering_key.map(str::to_owned),
            tags: None,
            deliver_at: None,
            created_at: herald_core::clock::now(),
        }
    }

    fn row(job: usize, message: Message) -> NewRow<'static> {
        NewRow {
            job,
            message,
            idempotency_key: None,
            to_endpoint: None,
            payload_expires_at: None,
        }
    }

    #[test]
    fn only_wide_messages_without_an_ordering_key_are_split() {
        let endpoints: Vec<EndpointId> = (0..=SPLIT_ABOVE).map(|_| EndpointId::new()).collect();
        let rows = [row(0, message(None)), row(1, message(Some("k"))), row(2, message(None))];
        let mut fan_out = Vec::new();
        for r in &rows[..2] {
            fan_out.extend(endpoints.iter().map(|endpoint_id| FanOut {
                job: r.job,
                message: &r.message,
                endpoint_id,
            }));
        }
        // The third message goes to exactly SPLIT_ABOVE endpoints: not above it.
        fan_out.extend(endpoints[..SPLIT_ABOVE].iter().map(|endpoint_id| FanOut {
            job: 2,
            message: &rows[2].message,
            endpoint_id,
        }));
        let (now, split) = split_wide(&rows, fan_out);
        assert_eq!(split.keys().copied().collect::<Vec<_>>(), vec![0]);
        assert_eq!(split[&0], endpoints, "in fan-out order");
        assert_eq!(now.len(), SPLIT_ABOVE + 1 + SPLIT_ABOVE);
        assert!(now.iter().all(|r| r.job != 0));
    }

    #[test]
    fn carried_splits_are_due_at_once_and_a_refused_one_is_found_one_at_a_time() {
        let mut carried = Carried::new(false);
        assert!(carried.next().is_none(), "nothing carried, no sweep");
        let splits: Vec<Split> = (0..3)
            .flat_map(|_| split(message(None), &[EndpointId::new()]))
            .collect();
        carried.add(splits.clone());
        assert_eq!(carried.next().expect("due at once").len(), 3);
        // Refused as a whole: the next try takes the first split alone ...
        assert!(!carried.failed(3, true), "none given up yet");
        carried.due = Some(Instant::now());
        assert_eq!(carried.next().expect("due").len(), 1);
        // ... which goes through: the next one alone, and so on.
        carried.expanded(1, Vec::new());
        assert_eq!(carried.next().expect("due").len(), 1);
        // The second one is refused alone: given up, the third is due.
        assert!(carried.failed(1, true), "given up");
        let taken = carried.next().expect("due");
        assert_eq!(taken[0].message.id, splits[2].message.id);
        carried.expanded(1, Vec::new());
        assert!(carried.next().is_none() && carried.wake().is_none(), "all done");
    }

    #[test]
    fn an_expansion_takes_one_chunk_of_rows_and_never_two_of_one_message() {
        let endpoints: Vec<EndpointId> = (0..CHUNK * 2 + 1).map(|_| EndpointId::new()).collect();
        let wide = split(message(None), &endpoints);
        assert_eq!(
            wide.iter().map(|s| (s.chunk, s.endpoints.len())).collect::<Vec<_>>(),
            vec![(0, CHUNK), (1, CHUNK), (2, 1)]
        );
        let mut carried = Carried::new(false);
        carried.add(wide);
        let small: Vec<Split> = (0..3).flat_map(|_| split(message(None), &endpoints[..100])).collect();
        carried.add(small);
        let mut taken = Vec::new();
        while let Some(next) = carried.next() {
            taken.push(next.iter().map(|s| s.endpoints.len()).collect::<Vec<_>>());
            let n = next.len();
            carried.expanded(n, Vec::new());
        }
        // A chunk each for the wide message (never two of it at once); its last row of one goes with
        // two small messages (201 rows), the third small one alone.
        assert_eq!(taken, vec![vec![CHUNK], vec![CHUNK], vec![1, 100, 100], vec![100]]);
    }

    #[test]
    fn a_split_whose_application_is_held_waits_and_a_sweep_comes_back() {
        let mut carried = Carried::new(true);
        assert!(carried.next().is_none(), "nothing to expand");
        let known = carried.sweep_due().expect("a writer that splits sweeps at its start");
        assert!(known.is_empty());
        carried.swept(split(message(None), &[EndpointId::new()]));
        assert!(carried.sweep_due().is_none(), "swept just now");
        assert_eq!(carried.next().expect("an orphan is expanded at once").len(), 1);
        carried.expanded(1, carried.splits.clone());
        assert!(carried.next().is_none(), "the held one waits a pause");
        let wake = carried.wake().expect("it wakes the writer");
        assert!(wake > Instant::now() && wake <= Instant::now() + crate::group_commit::DEFER_PAUSE);
        assert!(carried.sweep_at.expect("sweeps again") > Instant::now() + SWEEP_EVERY / 2);
    }
}
