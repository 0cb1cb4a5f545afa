//! Figures of the machine itself, taken before a scenario runs, so that reports from different machines
//! can be set side by side.
//!
//! Two VMs that name the same CPU model have given rates a factor of two apart on the same commit
//! (docs/performance.md): a CPU's name says little about a shared core's speed, or a virtual disk's
//! `fsync`. Two things bound most of Herald's rates — the CPU each request costs, and the commit that
//! every acknowledged message waits for — so every report carries a figure of each: how long one core
//! takes to read and write back a message body as JSON (as the API does with every message), beside
//! the signing primitive alone (HMAC-SHA256, far faster on a CPU with SHA extensions, which the report
//! says), and how long an appending 4 KiB write and its `fdatasync` take in the harness's temporary
//! directory, named with its file system (a `tmpfs` there has no disk behind it).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::stats::{LatencyStats, Spread};

/// Operations timed per round; each figure is the median round's time per operation.
const OPERATIONS_PER_ROUND: u32 = 2_000;
const ROUNDS: usize = 5;
/// Synced writes timed.
const SYNCED_WRITES: usize = 100;
/// The size of each synced write: one page of SQLite's default size.
const WRITE_BYTES: usize = 4_096;
/// A message body as the load generator sends one, about 256 bytes.
const MESSAGE_BODY: &str = r#"{"eventType":"bench.event","payload":{"sent_at_us":1764979200000000,"seq":123456,"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}}"#;

/// The machine's speed at what bounds Herald's rates.
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    /// One core's time to parse a ~256-byte message body as JSON and write it back, in ns.
    pub json_message_ns: u64,
    /// One core's time to sign 1 KiB with HMAC-SHA256, in ns.
    pub hmac_1kib_ns: u64,
    /// Whether the CPU has SHA-256 instructions (x86's SHA extensions, ARM's `sha2`), which make the
    /// signature several times faster while saying nothing of the rest of a request's work.
    pub sha_extensions: bool,
    /// The directory the synced writes were timed in (the temporary directory).
    pub synced_writes_in: PathBuf,
    /// Its file system's type (`/proc/self/mountinfo`), when known.
    pub file_system: Option<String>,
    /// An appending 4 KiB write and its `fdatasync`, in µs: median of 100. `None` when the directory could
    /// not be written.
    pub fsync_p50_us: Option<u64>,
    /// The same, 99th percentile.
    pub fsync_p99_us: Option<u64>,
    /// Why the synced writes were not measured, if they were not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fsync_error: Option<String>,
}

impl Calibration {
    /// Measure this machine (about 0.1 s with a fast disk, longer with a slow one).
    pub fn measure() -> Self {
        let directory = std::env::temp_dir();
        let (synced, fsync_error) = match synced_writes_us(&directory) {
            Ok(times) => (LatencyStats::from_samples(times), None),
            Err(error) => (None, Some(format!("{}: {error}", directory.display()))),
        };
        Self {
            json_message_ns: median_ns(json_round_trip),
            hmac_1kib_ns: median_ns(sign_1kib),
            sha_extensions: sha_extensions(),
            file_system: file_system_of(&directory),
            synced_writes_in: directory,
            fsync_p50_us: synced.as_ref().map(|stats| stats.p50_us),
            fsync_p99_us: synced.as_ref().map(|stats| stats.p99_us),
            fsync_error,
        }
    }

    /// One line for a report's table.
    pub fn describe(&self) -> String {
        let fsync = match (self.fsync_p50_us, self.fsync_p99_us) {
            (Some(p50), Some(p99)) => format!(
                "appending 4 KiB write + fdatasync in {} ({}) p50 {p50} µs, p99 {p99} µs",
                self.synced_writes_in.display(),
                match self.file_system.as_deref() {
                    Some("tmpfs") => "tmpfs: no disk behind it",
                    Some(kind) => kind,
                    None => "file system unknown",
                }
            ),
            _ => format!(
                "synced writes not measured ({})",
                self.fsync_error.as_deref().unwrap_or("no figure")
            ),
        };
        format!(
            "JSON of a message body read and written {:.2} µs, HMAC-SHA256 of 1 KiB {:.2} µs ({}); {fsync}",
            self.json_message_ns as f64 / 1_000.0,
            self.hmac_1kib_ns as f64 / 1_000.0,
            if self.sha_extensions {
                "SHA extensions"
            } else {
                "no SHA extensions"
            },
        )
    }
}

/// The median of five rounds' time per `operation`, in ns.
fn median_ns(operation: fn()) -> u64 {
    let rounds = (0..ROUNDS).map(|_| {
        let started = Instant::now();
        for _ in 0..OPERATIONS_PER_ROUND {
            operation();
        }
        started.elapsed().as_nanos() as f64 / f64::from(OPERATIONS_PER_ROUND)
    });
    Spread::of(rounds).map_or(0, |spread| spread.median.round() as u64)
}

/// Read a message body into a JSON value and write it back.
fn json_round_trip() {
    let value: serde_json::Value = serde_json::from_str(std::hint::black_box(MESSAGE_BODY)).unwrap_or_default();
    std::hint::black_box(serde_json::to_vec(&value).unwrap_or_default());
}

/// What [`sign_1kib`] signs.
static KIB: [u8; 1_024] = [b'x'; 1_024];

/// Sign 1 KiB.
fn sign_1kib() {
    std::hint::black_box(herald_signature::body_hmac::sign(
        b"calibration",
        std::hint::black_box(&KIB),
    ));
}

/// Whether this CPU has instructions for SHA-256 (which the signing code uses when it has them).
fn sha_extensions() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("sha");
    #[cfg(target_arch = "aarch64")]
    return std::arch::is_aarch64_feature_detected!("sha2");
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    return false;
}

/// Each synced write's time, in µs, appended to a file of its own in `directory`.
fn synced_writes_us(directory: &Path) -> std::io::Result<Vec<u64>> {
    let mut file: File = tempfile::tempfile_in(directory)?;
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

/// The type of the file system `directory` is on: that of the longest mount point holding it, from
/// `/proc/self/mountinfo`.
fn file_system_of(directory: &Path) -> Option<String> {
    let directory = directory.canonicalize().ok()?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mount_type(&mountinfo, &directory)
}

/// The file system type of the longest mount point of `mountinfo` (its format) that holds `path`.
fn mount_type(mountinfo: &str, path: &Path) -> Option<String> {
    mountinfo
        .lines()
        .filter_map(|line| {
            // id parent major:minor root mount-point options [optional…] - type source super-options
            let (before, after) = line.split_once(" - ")?;
            let mount_point = unescape(before.split_whitespace().nth(4)?);
            let kind = after.split_whitespace().next()?;
            path.starts_with(&mount_point)
                .then(|| (mount_point.len(), kind.to_owned()))
        })
        // The longest holds the path most closely; of mounts stacked on one point, the last listed is on
        // top, and `max_by_key` keeps the last of equals.
        .max_by_key(|(length, _)| *length)
        .map(|(_, kind)| kind)
}

/// A mountinfo field with its octal escapes (`\040` for a space, and tab, newline, backslash) decoded.
fn unescape(field: &str) -> String {
    let mut decoded = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(at) = rest.find('\\') {
        decoded.push_str(&rest[..at]);
        let code = rest
            .get(at + 1..at + 4)
            .and_then(|digits| u8::from_str_radix(digits, 8).ok());
        match code {
            Some(byte) => {
                decoded.push(char::from(byte));
                rest = &rest[at + 4..];
            }
            None => {
                decoded.push('\\');
                rest = &rest[at + 1..];
            }
        }
    }
    decoded.push_str(rest);
    decoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_mount_point_holding_the_path_gives_its_type() {
        let mountinfo = "\
22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
23 22 0:21 / /tmp rw,nosuid shared:2 - tmpfs tmpfs rw
24 22 0:22 / /tmpx rw shared:3 - xfs /dev/vdb rw
";
        assert_eq!(mount_type(mountinfo, Path::new("/tmp/x")), Some("tmpfs".to_owned()));
        assert_eq!(mount_type(mountinfo, Path::new("/tmpx/y")), Some("xfs".to_owned()));
        assert_eq!(mount_type(mountinfo, Path::new("/var/tmp")), Some("ext4".to_owned()));
        assert_eq!(mount_type("garbage", Path::new("/tmp")), None);
        let escaped = "22 1 254:1 / / rw - ext4 /dev/vda1 rw\n25 22 0:23 / /mnt/my\\040disk rw - tmpfs tmpfs rw\n";
        assert_eq!(
            mount_type(escaped, Path::new("/mnt/my disk/t")),
            Some("tmpfs".to_owned())
        );
        assert_eq!(unescape("a\\134b\\011c\\x"), "a\\b\tc\\x");
    }

    #[test]
    fn a_measurement_has_every_figure_on_a_writable_temporary_directory() {
        let calibration = Calibration::measure();
        assert!(calibration.json_message_ns > 0, "{calibration:?}");
        assert!(calibration.hmac_1kib_ns > 0, "{calibration:?}");
        assert!(calibration.file_system.is_some(), "{calibration:?}");
        let (Some(p50), Some(p99)) = (calibration.fsync_p50_us, calibration.fsync_p99_us) else {
            panic!("synced writes not measured: {calibration:?}");
        };
        assert!(p50 <= p99, "{calibration:?}");
        let line = calibration.describe();
        assert!(line.starts_with("JSON of a message body read and written "), "{line}");
        assert!(line.contains(&format!("p50 {p50} µs, p99 {p99} µs")), "{line}");
    }

    #[test]
    fn the_message_body_is_the_load_generators_size_and_valid_json() {
        assert!((240..=280).contains(&MESSAGE_BODY.len()), "{}", MESSAGE_BODY.len());
        assert!(serde_json::from_str::<serde_json::Value>(MESSAGE_BODY).is_ok());
    }
}
