//! Reports: every scenario's result as one serialisable value, printed as a Markdown table (readable in a
//! terminal, pasteable into docs) or as JSON.

use serde::Serialize;

use crate::scenario::backlog::BacklogReport;
use crate::scenario::e2e::E2eReport;
use crate::scenario::fanout::FanoutReport;
use crate::scenario::hol::HolReport;
use crate::scenario::inbox::InboxReport;
use crate::scenario::ingest::IngestReport;
use crate::scenario::outbox::OutboxReport;
use crate::scenario::polling::PollingReport;
use crate::table::Table;

/// The result of one scenario. As JSON, `"scenario"` names it and the other keys are its report's.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "scenario", rename_all = "lowercase")]
#[allow(clippy::large_enum_variant)] // one value per run; boxing would only add noise for callers
pub enum Report {
    /// `ingest`.
    Ingest(IngestReport),
    /// `e2e`.
    E2e(E2eReport),
    /// `fanout`.
    Fanout(FanoutReport),
    /// `hol`.
    Hol(HolReport),
    /// `backlog`.
    Backlog(BacklogReport),
    /// `inbox`.
    Inbox(InboxReport),
    /// `outbox`.
    Outbox(OutboxReport),
    /// `polling`.
    Polling(PollingReport),
}

impl Report {
    /// The report as a table.
    pub fn table(&self) -> Table {
        match self {
            Report::Ingest(r) => r.table(),
            Report::E2e(r) => r.table(),
            Report::Fanout(r) => r.table(),
            Report::Hol(r) => r.table(),
            Report::Backlog(r) => r.table(),
            Report::Inbox(r) => r.table(),
            Report::Outbox(r) => r.table(),
            Report::Polling(r) => r.table(),
        }
    }

    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> anyhow::Result<String> {
        Ok(serde_json::to_string_pretty(self)?)
    }
}
