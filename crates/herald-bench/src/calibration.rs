//! Two figures of the machine itself, taken before a scenario runs, so that reports from different
//! machines can be set side by side.
//!
//! Two VMs that name the same CPU model have given rates a factor of two apart on the same commit
//! (docs/performance.md): a CPU's name says little about a shared core's speed, or a virtual disk's
//! `fsync`. Herald's throughput rests on exactly those two — the CPU per request, and the commit that
//! every acknowledged message waits for — so every report carries one figure of each: how long one core
//! takes to sign 1 KiB (HMAC-SHA256, as every delivery is signed), and how long a 4 KiB write and its
//! `fdatasync` take in the harness's temporary directory (the in-process node's store is there; a
//! `--target` server's disk may be another).

use std::fs::File;
use std::io::Write;
use std::time::Instant;

use serde::Serialize;

/// Signatures timed, in rounds (the median round's time per signature is kept).
const SIGNATURES_PER_ROUND: u32 = 2_000;
const SIGNATURE_ROUNDS: usize = 5;
/// Synced writes timed.
const SYNCED_WRITES: usize = 100;
/// The size of each synced write: one page of SQLite's default size.
const WRITE_BYTES: usize = 4_096;

/// The machine's speed at the two things Herald's throughput rests on.
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    /// One core's time to sign 1 KiB with HMAC-SHA256, in ns (the median of five rounds).
    pub hmac_1kib_ns: u64,
    /// A 4 KiB write and its `fdatasync` in the temporary directory, in µs: median and 99th
    /// percentile of 100. `None` when the directory could not be written.
    pub fsync_p50_us: Option<u64>,
    /// See [`Calibration::fsync_p50_us`].
    pub fsync_p99_us: Option<u64>,
    /// Why the synced writes were not measured, if they were not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fsync_error: Option<String>,
}

impl Calibration {
    /// Measure this machine (about 0.1 s on a fast disk, longer on a slow one).
    pub fn measure() -> Self {
        let (fsync_p50_us, fsync_p99_us, fsync_error) = match synced_writes_us() {
            Ok(mut times) => {
                times.sort_unstable();
                (Some(percentile(&times, 50)), Some(percentile(&times, 99)), None)
            }
            Err(error) => (None, None, Some(format!("the temporary directory: {error}"))),
        };
        Self {
            hmac_1kib_ns: signature_ns(),
            fsync_p50_us,
            fsync_p99_us,
            fsync_error,
        }
    }

    /// One line for a report's table.
    pub fn describe(&self) -> String {
        let fsync = match (self.fsync_p50_us, self.fsync_p99_us) {
            (Some(p50), Some(p99)) => format!("4 KiB write + fdatasync p50 {p50} µs, p99 {p99} µs"),
            _ => format!(
                "synced writes not measured ({})",
                self.fsync_error.as_deref().unwrap_or("no figure")
            ),
        };
        format!(
            "HMAC-SHA256 of 1 KiB {:.2} µs; {fsync}",
            self.hmac_1kib_ns as f64 / 1_000.0
        )
    }
}

/// The nearest-rank percentile `p` of sorted `times`.
fn percentile(times: &[u64], p: usize) -> u64 {
    let rank = (times.len() * p).div_ceil(100).max(1);
    times.get(rank - 1).copied().unwrap_or(0)
}

/// The median round's time per signature, in ns.
fn signature_ns() -> u64 {
    let secret = [7u8; 32];
    let body = [b'x'; 1_024];
    let mut rounds: Vec<u64> = (0..SIGNATURE_ROUNDS)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..SIGNATURES_PER_ROUND {
                std::hint::black_box(herald_signature::body_hmac::sign(&secret, std::hint::black_box(&body)));
            }
            u64::try_from(started.elapsed().as_nanos() / u128::from(SIGNATURES_PER_ROUND)).unwrap_or(u64::MAX)
        })
        .collect();
    rounds.sort_unstable();
    rounds[SIGNATURE_ROUNDS / 2]
}

/// Each synced write's time, in µs, in a file of its own in the temporary directory.
fn synced_writes_us() -> std::io::Result<Vec<u64>> {
    let mut file: File = tempfile::tempfile()?;
    let page = [0u8; WRITE_BYTES];
    (0..SYNCED_WRITES)
        .map(|_| {
            let started = Instant::now();
            file.write_all(&page)?;
            file.sync_data()?;
            Ok(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let times: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&times, 50), 50);
        assert_eq!(percentile(&times, 99), 99);
        assert_eq!(percentile(&[5], 99), 5);
        assert_eq!(percentile(&[], 50), 0);
    }

    #[test]
    fn a_measurement_has_both_figures_on_a_writable_temporary_directory() {
        let calibration = Calibration::measure();
        assert!(calibration.hmac_1kib_ns > 0);
        let (Some(p50), Some(p99)) = (calibration.fsync_p50_us, calibration.fsync_p99_us) else {
            panic!("synced writes not measured: {calibration:?}");
        };
        assert!(p50 <= p99, "{calibration:?}");
        let line = calibration.describe();
        assert!(line.starts_with("HMAC-SHA256 of 1 KiB "), "{line}");
        assert!(line.contains(&format!("p50 {p50} µs, p99 {p99} µs")), "{line}");
    }
}
