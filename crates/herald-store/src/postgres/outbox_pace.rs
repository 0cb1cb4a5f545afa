//! When the outbox reader looks for rows: on a producer's notification while the outbox is quiet, and on
//! its own, every few milliseconds, while rows keep coming.
//!
//! Every notifying commit holds PostgreSQL's cluster-wide notification lock until its WAL is flushed, so
//! a thousand producers' commits a second went through one flush at a time, and the node's own commits
//! waited behind them. Once rows come fast (a read finds several, or finds some within [`BUSY_GAP`] of
//! the last find) the reader therefore polls (1 ms after a read that found some, doubling while reads
//! find none, up to [`BUSY_POLL_MAX`]) and marks itself awake in `herald_outbox_reader` a moment ahead
//! ([`AWAKE_FOR`]); the producers' trigger notifies only when the reader is not awake. It keeps polling
//! [`GRACE`] past its mark, for commits that saw the mark but landed after it. A trickle of commits
//! stays on notifications: polling would cost more than they do. Pure: the caller reads the clock and
//! runs the statements.

use std::time::{Duration, Instant};

/// How far ahead the reader marks itself awake.
pub(crate) const AWAKE_FOR: Duration = Duration::from_secs(2);
/// How often the mark is moved ahead while rows keep coming.
const MARK_EVERY: Duration = Duration::from_millis(500);
/// Finds closer together than this mean rows come fast enough to poll for.
const BUSY_GAP: Duration = Duration::from_millis(20);
/// How long the reader keeps polling past its mark: a producer's commit that found it awake may land a
/// little later (its transaction's other statements, its commit's flush).
const GRACE: Duration = Duration::from_millis(500);
/// The first wait after a read while awake.
const BUSY_POLL_FIRST: Duration = Duration::from_millis(1);
/// The longest wait between reads while awake.
pub(crate) const BUSY_POLL_MAX: Duration = Duration::from_millis(4);

/// The reader's pace: awake (polling) or quiet (waiting for a notification).
#[derive(Debug, Default)]
pub(crate) struct Pace {
    /// Until when the reader polls on its own (its mark plus [`GRACE`]); `None` while quiet.
    polling_until: Option<Instant>,
    /// When the mark was last moved ahead (or tried to be).
    marked_at: Option<Instant>,
    /// When a read last found rows.
    found_at: Option<Instant>,
    /// The wait before the next read while awake.
    wait: Duration,
}

impl Pace {
    /// A read at `now` found `found` rows: whether the mark must be moved ahead now.
    pub(crate) fn read(&mut self, found: usize, now: Instant) -> bool {
        if found == 0 {
            self.wait = (self.wait * 2).clamp(BUSY_POLL_FIRST, BUSY_POLL_MAX);
            return false;
        }
        self.wait = BUSY_POLL_FIRST;
        let busy = self.polling_until.is_some()
            || found > 1
            || self.found_at.is_some_and(|at| now.duration_since(at) < BUSY_GAP);
        self.found_at = Some(now);
        busy && self.marked_at.is_none_or(|at| now.duration_since(at) >= MARK_EVERY)
    }

    /// The mark was moved [`AWAKE_FOR`] ahead; `now` is taken after the database answered, so the
    /// reader's own deadline is never before the one producers see.
    pub(crate) fn marked(&mut self, now: Instant) {
        self.marked_at = Some(now);
        self.polling_until = Some(now + AWAKE_FOR + GRACE);
    }

    /// Moving the mark failed at `now`: producers keep notifying; try again only after [`MARK_EVERY`].
    pub(crate) fn mark_failed(&mut self, now: Instant) {
        self.marked_at = Some(now);
    }

    /// How long to wait before reading again on its own at `now`: `None` while quiet (then only a
    /// notification or the slow poll wakes the reader). Quiet again once the polling time is over.
    pub(crate) fn poll_in(&mut self, now: Instant) -> Option<Duration> {
        match self.polling_until {
            Some(until) if now < until => Some(self.wait.max(BUSY_POLL_FIRST)),
            Some(_) => {
                *self = Self::default();
                None
            }
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiet_until_a_read_finds_rows_then_polling_until_the_mark_and_grace_are_over() {
        let start = Instant::now();
        let mut pace = Pace::default();
        assert_eq!(pace.poll_in(start), None, "quiet: notifications wake the reader");
        assert!(!pace.read(0, start), "nothing found: no mark");
        assert_eq!(pace.poll_in(start), None);
        assert!(!pace.read(1, start), "one row after a lull: notifications still do");
        let soon = start + BUSY_GAP / 2;
        assert!(pace.read(1, soon), "rows coming fast: mark the reader awake");
        let start = soon;
        pace.marked(start);
        assert_eq!(pace.poll_in(start), Some(BUSY_POLL_FIRST));
        let late = start + AWAKE_FOR + GRACE - Duration::from_millis(1);
        assert_eq!(
            pace.poll_in(late),
            Some(BUSY_POLL_FIRST),
            "still polling within the grace"
        );
        assert_eq!(pace.poll_in(start + AWAKE_FOR + GRACE), None, "quiet again");
        assert!(
            pace.read(5, start + AWAKE_FOR + GRACE),
            "a new mark when many rows come again"
        );
    }

    #[test]
    fn the_mark_moves_ahead_at_most_every_half_second_while_rows_keep_coming() {
        let start = Instant::now();
        let mut pace = Pace::default();
        assert!(pace.read(2, start));
        pace.marked(start);
        assert!(!pace.read(1, start + MARK_EVERY - Duration::from_millis(1)));
        assert!(pace.read(1, start + MARK_EVERY), "awake, one row is enough to stay so");
    }

    #[test]
    fn a_failed_mark_is_tried_again_only_after_the_interval_and_leaves_the_reader_quiet() {
        let start = Instant::now();
        let mut pace = Pace::default();
        assert!(pace.read(2, start));
        pace.mark_failed(start);
        assert_eq!(pace.poll_in(start), None, "not marked: producers notify, no polling");
        assert!(!pace.read(2, start + MARK_EVERY / 2));
        assert!(pace.read(2, start + MARK_EVERY));
    }

    #[test]
    fn empty_reads_while_awake_double_the_wait_up_to_the_cap_and_a_find_resets_it() {
        let start = Instant::now();
        let mut pace = Pace::default();
        assert!(pace.read(3, start));
        pace.marked(start);
        let waits: Vec<Duration> = (0..5)
            .map(|_| {
                pace.read(0, start);
                pace.poll_in(start).expect("awake")
            })
            .collect();
        let ms = Duration::from_millis;
        assert_eq!(waits, [ms(2), ms(4), ms(4), ms(4), ms(4)]);
        pace.read(1, start);
        assert_eq!(pace.poll_in(start), Some(BUSY_POLL_FIRST));
    }
}
