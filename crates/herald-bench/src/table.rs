//! The tables reports print: metric, measured value and target, as Markdown (readable in a terminal,
//! pasteable into docs), and the number formats they use.

use crate::cpu::CpuSplit;
use crate::env::Setup;
use crate::load::LoadSummary;
use crate::stats::{DeliverySummary, LatencyStats};
use std::fmt::Write as _;

enum Line {
    Section(String),
    Row {
        metric: String,
        value: String,
        target: String,
    },
}

/// A three-column table: metric, measured value, and the target it is held to (if any).
pub struct Table {
    title: String,
    lines: Vec<Line>,
}

impl Table {
    /// An empty table under `title`.
    pub fn new(title: impl Into<String>) -> Self {
        Self {
            title: title.into(),
            lines: Vec::new(),
        }
    }

    /// Start a section.
    pub fn section(&mut self, name: impl Into<String>) -> &mut Self {
        self.lines.push(Line::Section(name.into()));
        self
    }

    /// A row without a target.
    pub fn row(&mut self, metric: impl Into<String>, value: impl Into<String>) -> &mut Self {
        self.target_row(metric, value, "")
    }

    /// A row with the target it is held to.
    pub fn target_row(
        &mut self,
        metric: impl Into<String>,
        value: impl Into<String>,
        target: impl Into<String>,
    ) -> &mut Self {
        self.lines.push(Line::Row {
            metric: metric.into(),
            value: value.into(),
            target: target.into(),
        });
        self
    }

    /// Rows describing how the server was set up.
    pub fn setup(&mut self, setup: &Setup) -> &mut Self {
        self.section("setup");
        self.row("server", &setup.server);
        self.row("store", &setup.database);
        self.row(
            "machine",
            format!(
                "{} cores, {} GiB, {}{}",
                setup.machine.cores,
                setup.machine.memory_gib,
                setup.machine.cpu,
                if setup.machine.release_build {
                    ""
                } else {
                    " (debug build)"
                }
            ),
        );
        self.row("calibration", setup.machine.calibration.describe());
        for setting in &setup.settings {
            self.row("setting", setting);
        }
        self
    }

    /// Rows for a load phase: accepted, rate, errors, API latency.
    pub fn load(&mut self, load: &LoadSummary, rate_target: &str, p99_target: &str) -> &mut Self {
        self.row("messages accepted", count(load.accepted));
        self.target_row("accepted msgs/s", per_second(load.accepted_per_s), rate_target);
        let mut errors = count(load.errors);
        if let Some(first) = &load.first_error {
            let _ = write!(errors, " (first: {first})");
        }
        self.row("errors", errors);
        if load.skipped > 0 {
            self.row("sends skipped (server too far behind)", count(load.skipped));
        }
        self.target_row(
            "API latency p50 / p99 / max",
            latency(load.api_latency.as_ref()),
            p99_target,
        );
        for share in &load.by_node {
            let mut value = format!("{} ({:.1} %)", count(share.accepted), share.share * 100.0);
            if share.errors > 0 {
                let _ = write!(value, ", {} errors", count(share.errors));
            }
            self.row(format!("accepted by {}", share.node), value);
        }
        self
    }

    /// Rows for the deliveries of a phase: how many arrived, their rate and lag.
    pub fn deliveries(&mut self, deliveries: &DeliverySummary, rate_target: &str, lag_target: &str) -> &mut Self {
        let mut arrived = format!("{} of {}", count(deliveries.delivered), count(deliveries.expected));
        if !deliveries.complete {
            arrived.push_str(" (timed out waiting for the rest)");
        }
        self.row("deliveries received", arrived);
        self.target_row("deliveries/s", per_second(deliveries.deliveries_per_s), rate_target);
        self.target_row("lag p50 / p99 / max", latency(deliveries.lag.as_ref()), lag_target);
        self
    }

    /// A row for the CPU split of a phase.
    pub fn cpu(&mut self, label: &str, split: Option<&CpuSplit>) -> &mut Self {
        if let Some(split) = split {
            let mut value = match split.herald_cores {
                Some(herald) => format!("Herald {herald:.2}, harness {:.2}", split.harness_cores),
                None => format!(
                    "harness {:.2} (the node's CPU not measured: see setup)",
                    split.harness_cores
                ),
            };
            if split.other_cores >= 0.01 {
                let _ = write!(value, ", other {:.2}", split.other_cores);
            }
            self.row(format!("CPU during {label} (cores of {})", split.machine_cores), value);
        }
        self
    }

    /// The table as Markdown.
    pub fn render(&self) -> String {
        let mut out = format!("## {}\n\n| metric | value | target |\n|---|---|---|\n", self.title);
        for line in &self.lines {
            match line {
                Line::Section(name) => {
                    let _ = writeln!(out, "| **{name}** | | |");
                }
                Line::Row { metric, value, target } => {
                    let _ = writeln!(out, "| {metric} | {} | {target} |", value.replace('|', "\\|"));
                }
            }
        }
        out
    }
}

/// `12345` → `12,345`.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `12345.6` → `12,346/s`.
pub fn per_second(rate: f64) -> String {
    if rate > 0.0 && rate < 10.0 {
        format!("{rate:.2}/s")
    } else {
        format!("{}/s", count(rate.round() as u64))
    }
}

/// Milliseconds with a precision that suits the size.
pub fn millis(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else if ms >= 100.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{ms:.2} ms")
    }
}

/// `p50 / p99 / max`, or a dash without samples.
pub fn latency(stats: Option<&LatencyStats>) -> String {
    match stats {
        Some(s) => format!(
            "{} / {} / {}",
            millis(s.p50_ms()),
            millis(s.p99_ms()),
            millis(s.max_ms())
        ),
        None => "—".to_owned(),
    }
}

/// An optional MiB figure.
pub fn mib(value: Option<f64>) -> String {
    value.map_or_else(|| "—".to_owned(), |v| format!("{v:.1} MiB"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1_000), "1,000");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(per_second(9_123.4), "9,123/s");
        assert_eq!(millis(1.234), "1.23 ms");
        assert_eq!(millis(2_500.0), "2.50 s");
        let mut table = Table::new("t");
        table.section("s").target_row("a", "1|2", "≥ 3");
        assert!(table.render().contains("| a | 1\\|2 | ≥ 3 |"));
    }
}
