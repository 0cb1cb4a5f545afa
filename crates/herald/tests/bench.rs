//! `herald bench --target A --target B`: the harness spreads its load over two real `herald serve` nodes
//! on one PostgreSQL database. Each node takes its share of the messages, the report names both, and every
//! delivery arrives whichever node owns the endpoint; the nodes' processes are found on this machine and
//! their CPU reported. Smoke sizes and no timing assertions: figures depend
//! on the machine. Skipped with a visible message when PostgreSQL is unreachable (fatal with
//! `HERALD_REQUIRE_POSTGRES=1`).

use crate::common;

use std::sync::Arc;

use common::{Herald, TOKEN};
use herald_store::testdb;
use serde_json::Value;

/// Run `herald --json bench ARGS --smoke --quiet --token TOKEN` and parse its report.
async fn bench(args: &[&str]) -> Value {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["--json", "bench"])
        .args(args)
        .args(["--smoke", "--quiet", "--token", TOKEN])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .output()
        .await
        .expect("run herald bench");
    assert!(
        output.status.success(),
        "herald bench {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "herald bench {args:?} printed no JSON report ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// A load phase's per-node part: every node named once, each took part, and the parts add up.
fn assert_spread(load: &Value, nodes: &[String]) {
    let accepted = load["accepted"].as_u64().expect("accepted");
    assert!(accepted > 0, "{load}");
    assert_eq!(load["errors"], 0, "{load}");
    let shares = load["by_node"].as_array().expect("by_node with two nodes");
    let named: Vec<&str> = shares.iter().filter_map(|s| s["node"].as_str()).collect();
    assert_eq!(named, nodes, "{load}");
    let mut sum = 0;
    for share in shares {
        let part = share["accepted"].as_u64().expect("a node's accepted");
        // Round-robin: the two parts differ by at most one message.
        assert!(part * 2 + 1 >= accepted, "a node got less than half: {load}");
        assert_eq!(share["errors"], 0, "{load}");
        sum += part;
    }
    assert_eq!(sum, accepted, "{load}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_spreads_its_load_over_two_nodes_on_one_postgres() {
    let Some(database) = testdb::fresh("bench_spreads_its_load_over_two_nodes_on_one_postgres").await else {
        return;
    };
    let database = Arc::new(database);
    let first = Herald::start_on(database.clone(), &[]).await;
    let second = Herald::start_on(database.clone(), &[]).await;
    let nodes: Vec<String> = [&first, &second]
        .iter()
        .map(|node| format!("http://{}", node.addr))
        .collect();

    // `--target` twice.
    let report = bench(&["ingest", "--target", &nodes[0], "--target", &nodes[1]]).await;
    assert_eq!(report["scenario"], "ingest");
    let server = report["setup"]["server"].as_str().expect("setup.server");
    assert!(
        nodes.iter().all(|node| server.contains(node.as_str())),
        "the report names every node: {server}"
    );
    assert_spread(&report["load"], &nodes);
    // Both nodes run on this machine: their processes are found by their ports, and their CPU is the
    // node's in the report.
    let local: Vec<(u64, &str)> = report["setup"]["local_nodes"]
        .as_array()
        .expect("setup.local_nodes with both nodes found")
        .iter()
        .map(|node| {
            (
                node["pid"].as_u64().unwrap_or(0),
                node["command"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        local,
        [(u64::from(first.pid()), "herald"), (u64::from(second.pid()), "herald")],
        "{}",
        report["setup"]
    );
    assert!(
        report["cpu"]["herald_cores"].as_f64().is_some_and(|cores| cores > 0.0),
        "the nodes' CPU: {}",
        report["cpu"]
    );
    let deliveries = &report["deliveries"];
    assert_eq!(deliveries["complete"], true, "{deliveries}");
    assert_eq!(deliveries["delivered"], report["load"]["accepted"], "{deliveries}");

    // A comma list, closed loop then open loop.
    let report = bench(&["e2e", "--target", &nodes.join(",")]).await;
    for phase in ["burst", "steady"] {
        let phase = &report[phase];
        assert_spread(&phase["load"], &nodes);
        assert_eq!(phase["deliveries"]["complete"], true, "{phase}");
        let endpoints = report["params"]["endpoints"].as_u64().expect("endpoints");
        assert_eq!(
            phase["deliveries"]["delivered"].as_u64(),
            phase["load"]["accepted"].as_u64().map(|n| n * endpoints),
            "{phase}"
        );
    }
}
