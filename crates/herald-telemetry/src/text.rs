//! A writer of the Prometheus text exposition format (version 0.0.4), for series rendered from memory
//! at scrape time.
//!
//! Each metric family is declared once with [`Text::family`] (its `# HELP` and `# TYPE` lines), then its
//! samples follow with [`Text::sample`]. Label values are escaped as the format requires.

use std::fmt::Write as _;

/// The kind of a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Goes up and down.
    Gauge,
    /// Only goes up (resets when the process restarts).
    Counter,
    /// Cumulative buckets with `_bucket`, `_sum` and `_count` samples.
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
            Kind::Histogram => "histogram",
        }
    }
}

/// Prometheus text being written.
#[derive(Debug, Default)]
pub struct Text {
    out: String,
}

impl Text {
    /// An empty text with room for `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            out: String::with_capacity(capacity),
        }
    }

    /// Start a metric family.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.as_str());
    }

    /// One sample of the family last started (or of its `_bucket`, `_sum`, `_count` series).
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (key, value)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                self.out.push_str(key);
                self.out.push_str("=\"");
                escape_into(&mut self.out, value);
                self.out.push('"');
            }
            self.out.push('}');
        }
        self.out.push(' ');
        if value.is_finite() && value.fract() == 0.0 && value.abs() < 1e15 {
            let _ = write!(self.out, "{}", value as i64);
        } else if value.is_nan() {
            self.out.push_str("NaN");
        } else if value.is_infinite() {
            self.out.push_str(if value > 0.0 { "+Inf" } else { "-Inf" });
        } else {
            let _ = write!(self.out, "{value}");
        }
        self.out.push('\n');
    }

    /// A histogram's samples from per-bucket counts (`counts[i]` observations fell at or under
    /// `bounds[i]`, not cumulative; `counts` has one more entry, for the values above the last bound).
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], bounds: &[f64], counts: &[u64], sum: f64) {
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0u64;
        for (bound, count) in bounds.iter().zip(counts) {
            cumulative += count;
            let le = bound.to_string();
            self.sample(&bucket, &with(labels, ("le", &le)), cumulative as f64);
        }
        cumulative += counts.get(bounds.len()).copied().unwrap_or(0);
        self.sample(&bucket, &with(labels, ("le", "+Inf")), cumulative as f64);
        self.sample(&format!("{name}_sum"), labels, sum);
        self.sample(&format!("{name}_count"), labels, cumulative as f64);
    }

    /// Append text rendered elsewhere (e.g. the registry's).
    pub fn push_str(&mut self, text: &str) {
        self.out.push_str(text);
        if !text.is_empty() && !text.ends_with('\n') {
            self.out.push('\n');
        }
    }

    /// The text.
    pub fn finish(self) -> String {
        self.out
    }
}

fn with<'a>(labels: &[(&'a str, &'a str)], extra: (&'a str, &'a str)) -> Vec<(&'a str, &'a str)> {
    let mut all = labels.to_vec();
    all.push(extra);
    all
}

/// Backslash, double quote and line feed are escaped in label values.
fn escape_into(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_labels_and_writes_cumulative_histograms() {
        let mut text = Text::default();
        text.family("x_seconds", Kind::Histogram, "A histogram.");
        text.histogram("x_seconds", &[("app", "a\"b\\c\nd")], &[0.5, 1.0], &[1, 2, 3], 7.25);
        let out = text.finish();
        assert!(out.contains("# TYPE x_seconds histogram\n"));
        assert!(out.contains("x_seconds_bucket{app=\"a\\\"b\\\\c\\nd\",le=\"0.5\"} 1\n"));
        assert!(out.contains("le=\"1\"} 3\n"));
        assert!(out.contains("le=\"+Inf\"} 6\n"));
        assert!(out.contains("x_seconds_sum{app=\"a\\\"b\\\\c\\nd\"} 7.25\n"));
        assert!(out.contains("x_seconds_count{app=\"a\\\"b\\\\c\\nd\"} 6\n"));
    }
}
