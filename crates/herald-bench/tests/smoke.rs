//! Every scenario at its smoke size against an in-process node: the harness runs end to end and its
//! figures are sane. No timing assertions: figures depend on the machine.

use herald_bench::scenario::backlog::BacklogParams;
use herald_bench::scenario::e2e::E2eParams;
use herald_bench::scenario::fanout::FanoutParams;
use herald_bench::scenario::hol::HolParams;
use herald_bench::scenario::inbox::InboxParams;
use herald_bench::scenario::ingest::IngestParams;
use herald_bench::scenario::outbox::OutboxParams;
use herald_bench::scenario::polling::PollingParams;
use herald_bench::{Options, Report, Scenario};

fn options() -> Options {
    Options {
        progress: false,
        ..Options::default()
    }
}

async fn run(scenario: Scenario) -> Report {
    let report = herald_bench::run(&options(), &scenario)
        .await
        .unwrap_or_else(|e| panic!("{} failed: {e:#}", scenario.name()));
    // Both renderings work and carry the figures.
    let table = report.table().render();
    assert!(table.starts_with(&format!("## {}", scenario.name())), "{table}");
    let json: serde_json::Value = serde_json::from_str(&report.to_json().unwrap()).unwrap();
    assert_eq!(json["scenario"], scenario.name());
    report
}

#[tokio::test(flavor = "multi_thread")]
async fn ingest_with_and_without_delivery() {
    let Report::Ingest(report) = run(Scenario::Ingest(IngestParams::smoke())).await else {
        panic!("wrong report");
    };
    assert!(report.load.accepted > 0);
    assert_eq!(report.load.errors, 0, "{:?}", report.load.first_error);
    let api = report.load.api_latency.expect("API latency measured");
    assert_eq!(api.count as u64, report.load.accepted);
    let deliveries = report.deliveries.expect("deliveries awaited");
    assert!(deliveries.complete);
    assert_eq!(deliveries.delivered, report.load.accepted);
    assert!(deliveries.deliveries_per_s > 0.0);
    assert!(deliveries.lag.is_some());

    let paused = IngestParams {
        paused: true,
        ..IngestParams::smoke()
    };
    let Report::Ingest(report) = run(Scenario::Ingest(paused)).await else {
        panic!("wrong report");
    };
    assert!(report.load.accepted > 0);
    assert_eq!(report.load.errors, 0, "{:?}", report.load.first_error);
    assert!(report.deliveries.is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn e2e_burst_then_steady() {
    let params = E2eParams::smoke();
    let Report::E2e(report) = run(Scenario::E2e(params.clone())).await else {
        panic!("wrong report");
    };
    assert_eq!(report.burst.load.accepted, params.messages);
    assert_eq!(report.burst.load.errors, 0, "{:?}", report.burst.load.first_error);
    assert!(report.burst.deliveries.complete);
    assert_eq!(
        report.burst.deliveries.delivered,
        params.messages * params.endpoints as u64
    );
    assert!(report.steady.load.accepted > 0);
    assert_eq!(report.steady.load.errors, 0, "{:?}", report.steady.load.first_error);
    assert!(report.steady.deliveries.complete);
    assert_eq!(
        report.steady.deliveries.delivered,
        report.steady.load.accepted * params.endpoints as u64
    );
    assert!(report.steady.deliveries.lag.is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn fanout_reaches_every_endpoint() {
    let params = FanoutParams::smoke();
    let Report::Fanout(report) = run(Scenario::Fanout(params.clone())).await else {
        panic!("wrong report");
    };
    assert_eq!(report.rounds.len(), params.messages);
    for round in &report.rounds {
        assert!(round.complete);
        assert_eq!(round.delivered, params.endpoints as u64);
        assert!(round.deliveries_per_s > 0.0);
    }
    // The warm rounds' summary covers every round but the first.
    let warm = report.warm.expect("more than one round");
    assert_eq!(warm.rounds, params.messages - 1);
    let slowest = report.rounds[1..]
        .iter()
        .map(|r| r.all_after_202_ms)
        .fold(0.0, f64::max);
    assert_eq!(warm.all_after_202_ms.max, slowest);
    assert!(warm.api_ms.min <= warm.api_ms.median && warm.api_ms.median <= warm.api_ms.max);
    if cfg!(target_os = "linux") {
        let memory = report.memory.expect("an in-process node's memory is sampled");
        assert!(memory.before_setup_mib > 0.0 && memory.rounds_max_mib >= memory.after_setup_mib);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn hol_measures_healthy_lag_with_and_without_a_black_hole() {
    let Report::Hol(report) = run(Scenario::Hol(HolParams::smoke())).await else {
        panic!("wrong report");
    };
    for run in [&report.baseline, &report.with_black_hole] {
        assert!(run.load.accepted > 0);
        assert_eq!(run.load.errors, 0, "{:?}", run.load.first_error);
        assert!(run.healthy.expected > 0);
        assert!(run.healthy.complete, "healthy deliveries missing: {:?}", run.healthy);
        assert!(run.healthy.lag.is_some(), "healthy lag measured");
    }
    assert!(!report.baseline.black_hole && report.with_black_hole.black_hole);
    assert!(report.baseline.endpoint_0 > 0, "endpoint 0 received in the baseline");
    assert!(report.with_black_hole.endpoint_0 > 0, "the black hole was contacted");
}

#[tokio::test(flavor = "multi_thread")]
async fn backlog_builds_and_drains_everything() {
    let params = BacklogParams::smoke();
    let Report::Backlog(report) = run(Scenario::Backlog(params.clone())).await else {
        panic!("wrong report");
    };
    assert_eq!(report.build.load.accepted, params.pending);
    assert_eq!(report.build.load.errors, 0, "{:?}", report.build.load.first_error);
    for sample in [&report.empty, &report.with_backlog] {
        assert!(sample.ingest.accepted > 0);
        assert_eq!(sample.ingest.errors + sample.steady.errors, 0);
        assert!(sample.ingest_deliveries.complete && sample.steady_deliveries.complete);
        assert!(sample.steady_deliveries.lag.is_some());
        if cfg!(target_os = "linux") {
            assert!(sample.rss_mib.is_some_and(|rss| rss > 0.0));
        }
    }
    assert!(
        report.drain.complete,
        "drained {} of {}",
        report.drain.delivered, report.drain.expected
    );
    assert_eq!(report.drain.delivered, params.pending);
}

#[tokio::test(flavor = "multi_thread")]
async fn inbox_acknowledges_and_forwards_every_signed_event() {
    let Report::Inbox(report) = run(Scenario::Inbox(InboxParams::smoke())).await else {
        panic!("wrong report");
    };
    assert!(report.load.accepted > 0);
    assert_eq!(report.load.errors, 0, "{:?}", report.load.first_error);
    let latency = report.load.api_latency.expect("acknowledgement latency measured");
    assert_eq!(latency.count as u64, report.load.accepted);
    assert!(report.forwarded.complete, "forwarded {:?}", report.forwarded);
    assert_eq!(report.forwarded.delivered, report.load.accepted);
    assert!(report.forwarded.lag.is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn outbox_through_the_relay() {
    let Report::Outbox(report) = run(Scenario::Outbox(OutboxParams::smoke())).await else {
        panic!("wrong report");
    };
    // A SQLite node: no herald_publish path; the relay path from a SQLite producer.
    assert!(report.same_database.is_none());
    let path = &report.separate_database;
    assert!(path.relayed_per_s > 0.0);
    assert!(path.throughput_deliveries.complete);
    assert_eq!(path.throughput_deliveries.delivered, path.rows);
    assert!(path.committed > 0);
    assert!(path.lag_deliveries.complete);
    assert_eq!(path.lag_deliveries.delivered, path.committed);
    assert!(path.lag_deliveries.lag.is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn one_consumer_pulls_every_message_once() {
    let params = PollingParams::smoke();
    let Report::Polling(report) = run(Scenario::Polling(params.clone())).await else {
        panic!("wrong report");
    };
    assert_eq!(report.publish.accepted, params.messages);
    assert_eq!(report.pulled, params.messages, "every published message pulled");
    assert!(report.pulled_per_s > 0.0);
    // At most `limit` per read, and one more read that finds the end.
    assert!(report.reads >= params.messages.div_ceil(u64::from(params.limit)));
    assert!(report.posted > 0);
    assert_eq!(
        report.received, report.posted,
        "every posted message reached the long-polling consumer"
    );
    assert_eq!(report.lag.map(|l| l.count as u64), Some(report.posted));
    assert_eq!(
        report.duplicates, 0,
        "a consumer that commits as it goes reads nothing twice"
    );
}
