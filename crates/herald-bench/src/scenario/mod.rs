//! The scenarios, one module each, and the one that runs a named scenario; what they share is in
//! [`common`].

pub mod backlog;
pub mod common;
pub mod e2e;
pub mod fanout;
pub mod hol;
pub mod inbox;
pub mod ingest;
pub mod outbox;
pub mod polling;

use crate::env::Options;
use crate::report::Report;

/// A named scenario with its parameters.
#[derive(Debug, Clone)]
pub enum Scenario {
    /// Closed-loop ingest.
    Ingest(ingest::IngestParams),
    /// A burst, then a fixed offered rate, measured end to end.
    E2e(e2e::E2eParams),
    /// One message to many endpoints.
    Fanout(fanout::FanoutParams),
    /// Healthy lag with and without a black-holed endpoint.
    Hol(hol::HolParams),
    /// A large pending backlog for a down endpoint, then its drain.
    Backlog(backlog::BacklogParams),
    /// Signed webhooks into an in-process `herald inbox`: acknowledgements per second and latency.
    Inbox(inbox::InboxParams),
    /// The transactional outbox: relay throughput and commit → receiver lag.
    Outbox(outbox::OutboxParams),
    /// One consumer pulling a polling endpoint: messages/s and publish → consumer latency.
    Polling(polling::PollingParams),
}

impl Scenario {
    /// The scenario's name as on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Scenario::Ingest(_) => "ingest",
            Scenario::E2e(_) => "e2e",
            Scenario::Fanout(_) => "fanout",
            Scenario::Hol(_) => "hol",
            Scenario::Backlog(_) => "backlog",
            Scenario::Inbox(_) => "inbox",
            Scenario::Outbox(_) => "outbox",
            Scenario::Polling(_) => "polling",
        }
    }

    /// Run it.
    pub async fn run(&self, options: &Options) -> anyhow::Result<Report> {
        Ok(match self {
            Scenario::Ingest(p) => Report::Ingest(ingest::run(options, p).await?),
            Scenario::E2e(p) => Report::E2e(e2e::run(options, p).await?),
            Scenario::Fanout(p) => Report::Fanout(fanout::run(options, p).await?),
            Scenario::Hol(p) => Report::Hol(hol::run(options, p).await?),
            Scenario::Backlog(p) => Report::Backlog(backlog::run(options, p).await?),
            Scenario::Inbox(p) => Report::Inbox(inbox::run(options, p).await?),
            Scenario::Outbox(p) => Report::Outbox(outbox::run(options, p).await?),
            Scenario::Polling(p) => Report::Polling(polling::run(options, p).await?),
        })
    }
}
