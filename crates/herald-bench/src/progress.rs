//! Progress shown on standard error while a scenario runs; silent when standard error is not a terminal
//! (CI logs, pipes) or when turned off.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Makes progress bars, or hidden ones when progress is off.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    visible: bool,
}

impl Progress {
    /// Show progress if `wanted` and standard error is a terminal.
    pub fn new(wanted: bool) -> Self {
        Self {
            visible: wanted && std::io::stderr().is_terminal(),
        }
    }

    /// Never show anything.
    pub fn hidden() -> Self {
        Self { visible: false }
    }

    /// A bar counting towards `total` items (e.g. messages sent, deliveries received).
    pub fn counter(&self, label: &str, total: u64) -> ProgressBar {
        self.make(
            ProgressBar::new(total),
            "{spinner} {prefix:<28} [{bar:30}] {pos}/{len} ({per_sec}, {elapsed})",
            label,
        )
    }

    /// A spinner for open-ended work (e.g. a timed load phase), showing a count and its rate.
    pub fn spinner(&self, label: &str) -> ProgressBar {
        self.make(
            ProgressBar::new_spinner(),
            "{spinner} {prefix:<28} {pos} ({per_sec}, {elapsed}) {msg}",
            label,
        )
    }

    fn make(&self, bar: ProgressBar, template: &str, label: &str) -> ProgressBar {
        if !self.visible {
            return ProgressBar::hidden();
        }
        bar.set_draw_target(ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(label.to_owned());
        bar.enable_steady_tick(Duration::from_millis(200));
        bar
    }
}
