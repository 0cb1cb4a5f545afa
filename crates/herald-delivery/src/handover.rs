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

    /// Whether nothing is in flight for `partition`. A poisoned count answers `false`: the store's own
    /// bound on the drain then applies.
    pub(crate) fn is_idle(&self, partition: i32) -> bool {
        self.counts
            .lock()
            .map(|counts| !counts.contains_key(&partition))
            .unwrap_or(false)
    }

    /// Wait until nothing is in flight for any of `partitions`.
    pub(crate) async fn until_idle(&self, partitions: &[i32]) {
        loop {
            // Registered before the check, so an attempt ending between the two still wakes this.
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if partitions.iter().all(|&p| self.is_idle(p)) {
                return;
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

        let waiting = tokio::spawn({
            let in_flight = in_flight.clone();
            async move { in_flight.until_idle(&[7, 9]).await }
        });
        drop(first);
        drop(other);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "one attempt for 7 is still in flight");
        assert!(in_flight.is_idle(8));

        drop(second);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken when the last attempt for 7 ended")
            .expect("the waiter ran to its end");
        assert!(in_flight.is_idle(7));
        drop(Held::NONE);
    }
}
