//! Back-off between tries while something cannot be reached (the relay: Herald or its source database;
//! the node's outbox reader: its PostgreSQL): pure logic, no I/O.

use std::time::Duration;

/// Doubling delays between a first and a longest one; reset by a success.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
    failures: u32,
}

impl Backoff {
    /// Start at `first`, doubling up to `max`.
    pub fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max,
            next: first,
            failures: 0,
        }
    }

    /// A failure: the delay to wait before trying again.
    pub fn failed(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        self.failures += 1;
        delay
    }

    /// Consecutive failures so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// A success: the next failure waits `first` again.
    pub fn succeeded(&mut self) {
        self.next = self.first;
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(500));
        let got: Vec<u128> = (0..5).map(|_| b.failed().as_millis()).collect();
        assert_eq!(got, vec![100, 200, 400, 500, 500]);
        assert_eq!(b.failures(), 5);
        b.succeeded();
        assert_eq!(b.failed(), Duration::from_millis(100));
        assert_eq!(b.failures(), 1);
    }
}
