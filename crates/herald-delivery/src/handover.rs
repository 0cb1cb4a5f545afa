//! Partitions handed over to another node (scale-out): what this node still has in flight for each.
//!
//! A node that gives a partition up keeps its lease until nothing it sent for the partition still waits
//! for an answer or for its result to be written; only then may the next owner send, so an endpoint's
//! concurrency cap holds across the cluster and no result is fenced out (which would send the delivery
//! again). Counting what is in flight lets the engine tell the store the moment that is so
//! ([`herald_store::Ownership::drained`]), instead of the store waiting out the longest attempt a request
//! may take (a minute by default) while the partition's endpoints get nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Attempts sent and not yet recorded, by partition.
#[derive(Default)]
pub(crate) struct InFlight {
    counts: Mutex<HashMap<i32, usize>>,
    /// Woken when a partition's count drops to zero.
    idle: Notify,
}

impl InFlight {
    /// Count one attempt for `partition` until the returned [`Held`] is dropped.
    pub(crate) fn hold(self: &Arc<Self>, partition: i32) -> Held {
        if let Ok(mut counts) = self.counts.lock() {
            *counts.entry(partition).or_default() += 1;
        }
        Held(Some((self.clone(), partition)))
    }

    /// Whether nothing is in flight for `partition`.
    pub(crate) fn is_idle(&self, partition: i32) -> bool {
        !self.idle_among(&[partition]).is_empty()
    }

    /// Those of `partitions` with nothing in flight. A poisoned count answers none: the store's own bound
    /// on the drain then applies.
    pub(crate) fn idle_among(&self, partitions: &[i32]) -> Vec<i32> {
        self.counts
            .lock()
            .map(|counts| partitions.iter().copied().filter(|p| !counts.contains_key(p)).collect())
            .unwrap_or_default()
    }

    /// Wait until nothing is in flight for some of `partitions`; those.
    pub(crate) async fn until_some_idle(&self, partitions: &[i32]) -> Vec<i32> {
        loop {
            // Registered before the check, so an attempt ending between the two still wakes this.
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            let found = self.idle_among(partitions);
            if !found.is_empty() || partitions.is_empty() {
                return found;
            }
            idle.await;
        }
    }

    fn release(&self, partition: i32) {
        let Ok(mut counts) = self.counts.lock() else {
            return;
        };
        let Some(count) = counts.get_mut(&partition) else {
            return;
        };
        *count -= 1;
        if *count == 0 {
            counts.remove(&partition);
            drop(counts);
            self.idle.notify_waiters();
        }
    }
}

/// One attempt counted in [`InFlight`]: it travels with the attempt's result and is dropped once the
/// result is written. Empty when one node owns everything (nothing is ever handed over then).
pub(crate) struct Held(Option<(Arc<InFlight>, i32)>);

impl Held {
    /// Nothing counted.
    pub(crate) const NONE: Held = Held(None);
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some((in_flight, partition)) = self.0.take() {
            in_flight.release(partition);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_partition_is_idle_once_every_attempt_held_for_it_is_dropped() {
        let in_flight = Arc::new(InFlight::default());
        let (first, second, other) = (in_flight.hold(7), in_flight.hold(7), in_flight.hold(8));
        assert!(!in_flight.is_idle(7) && !in_flight.is_idle(8));
        assert!(in_flight.is_idle(9), "nothing was ever sent for 9");

        assert_eq!(in_flight.until_some_idle(&[7, 8, 9]).await, [9], "the idle one at once");

        let waiting = tokio::spawn({
            let in_flight = in_flight.clone();
            async move { in_flight.until_some_idle(&[7, 8]).await }
        });
        drop(first);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !waiting.is_finished(),
            "one attempt for 7 and one for 8 are still in flight"
        );

        drop(other);
        let idle = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken when the last attempt for 8 ended")
            .expect("the waiter ran to its end");
        assert_eq!(idle, [8], "only 8: 7 still has an attempt in flight");
        assert!(!in_flight.is_idle(7));
        drop(second);
        assert!(in_flight.is_idle(7));
        drop(Held::NONE);
    }
}
