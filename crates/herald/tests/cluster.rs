//! Three `herald serve` processes on one PostgreSQL database: the load is spread across them, one is
//! killed with SIGKILL mid-run and restarted later. Every acknowledged message is delivered at least once
//! to every endpoint, no endpoint ever sees more requests at once than its concurrency cap (the cap
//! holds cluster-wide because one node owns an endpoint at a time), and the dead node's partitions are
//! owned again within the lease bound. Skipped with a visible message when PostgreSQL is unreachable
//! (fatal with `HERALD_REQUIRE_POSTGRES=1`).

use crate::common;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Herald, Receiver, Reply, TOKEN};
use futures::StreamExt as _;
use herald_store::testdb;
use serde_json::json;
use sqlx::{Connection, PgConnection};

const LEASE_TTL: Duration = Duration::from_secs(4);
const CAP: usize = 2;
const ENDPOINTS: usize = 4;

/// Unexpired leases per owner.
async fn owners(url: &str) -> HashMap<String, i64> {
    let mut conn = PgConnection::connect(url).await.expect("connect");
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT owner, COUNT(*) FROM partition_lease WHERE owner IS NOT NULL AND expires_at > now() GROUP BY owner",
    )
    .fetch_all(&mut conn)
    .await
    .expect("leases");
    rows.into_iter().collect()
}

/// The id of the node that started last.
async fn newest_node(url: &str) -> String {
    let mut conn = PgConnection::connect(url).await.expect("connect");
    sqlx::query_scalar("SELECT id FROM node ORDER BY started_at DESC LIMIT 1")
        .fetch_one(&mut conn)
        .await
        .expect("node")
}

/// Publish `count` messages, spread round-robin over `nodes`, a few at a time; the ids answered 202.
async fn publish(nodes: Vec<String>, app: String, first: usize, count: usize) -> Vec<String> {
    let http = reqwest::Client::builder().no_proxy().build().expect("client");
    futures::stream::iter(first..first + count)
        .map(|n| {
            let url = format!("http://{}/api/v1/app/{app}/msg", nodes[n % nodes.len()]);
            let http = http.clone();
            async move {
                let response = http
                    .post(url)
                    .bearer_auth(TOKEN)
                    .json(&json!({"eventType": "cluster.test", "payload": {"n": n}}))
                    .send()
                    .await
                    .ok()?;
                if response.status().as_u16() != 202 {
                    return None;
                }
                let body: serde_json::Value = response.json().await.ok()?;
                body["id"].as_str().map(str::to_owned)
            }
        })
        .buffer_unordered(6)
        .filter_map(|id| async move { id })
        .collect()
        .await
}

/// Wait until two nodes own 128 partitions each, failing after `within`; how long that took.
async fn split_in_two(url: &str, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let owned = owners(url).await;
        if owned.len() == 2 && owned.values().all(|&n| n == 128) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "the partitions were not split in two within {within:?}: {owned:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Wait until every receiver got every acknowledged message (failing after `within`), and check that no
/// endpoint ever saw more requests at once than its cap.
async fn all_delivered_within_the_caps(receivers: &[Receiver], acknowledged: &BTreeSet<String>, within: Duration) {
    let deadline = Instant::now() + within;
    for (n, receiver) in receivers.iter().enumerate() {
        loop {
            let delivered: BTreeSet<String> = receiver.per_message().into_keys().collect();
            let missing = acknowledged.difference(&delivered).count();
            if missing == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "endpoint {n}: {missing} of {} acknowledged messages never delivered",
                acknowledged.len()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(
            receiver.peak_in_flight() <= CAP,
            "endpoint {n} saw {} requests at once, above its cap of {CAP}",
            receiver.peak_in_flight()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_share_the_work_and_survive_kill_9_of_one() {
    let Some(database) = testdb::fresh("three_nodes_share_the_work_and_survive_kill_9_of_one").await else {
        return;
    };
    let database = Arc::new(database);
    let schedule = vec!["300ms"; 50].join(",");
    let ttl = format!("{}s", LEASE_TTL.as_secs());
    let env = [
        ("HERALD_RETRY_SCHEDULE", schedule.as_str()),
        ("HERALD_LEASE_TTL", ttl.as_str()),
    ];
    let first = Herald::start_on(database.clone(), &env).await;
    let second = Herald::start_on(database.clone(), &env).await;
    let mut third = Herald::start_on(database.clone(), &env).await;
    let third_id = newest_node(&database.url).await;

    let receivers: Vec<Receiver> = futures::future::join_all(
        (0..ENDPOINTS).map(|_| Receiver::start(Reply::status(200).delay(Duration::from_millis(20)))),
    )
    .await;
    let app = first.app("cluster").await;
    for receiver in &receivers {
        first
            .endpoint(&app, json!({ "url": receiver.url(), "maxConcurrency": CAP }))
            .await;
    }
    let addresses: Vec<String> = [&first, &second, &third].iter().map(|h| h.addr.to_string()).collect();

    // The three nodes settle on a third of the partitions each.
    let deadline = Instant::now() + Duration::from_secs(40);
    while owners(&database.url).await.len() < 3 {
        assert!(
            Instant::now() < deadline,
            "the partitions were never spread over three nodes"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let acknowledged = Arc::new(Mutex::new(BTreeSet::new()));
    let ids = publish(addresses.clone(), app.clone(), 0, 150).await;
    acknowledged.lock().unwrap().extend(ids);
    // More load while one node dies: requests to the dead node fail (not acknowledged, not counted).
    let load = tokio::spawn({
        let (addresses, app, acknowledged) = (addresses.clone(), app.clone(), acknowledged.clone());
        async move {
            let ids = publish(addresses, app, 1_000, 300).await;
            acknowledged.lock().unwrap().extend(ids);
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    third.kill9();
    let killed = Instant::now();

    // Its partitions are owned again (by the two survivors) within the lease time and a couple of
    // heartbeats.
    let bound = LEASE_TTL + LEASE_TTL / 2 + Duration::from_secs(3);
    loop {
        let owned = owners(&database.url).await;
        if !owned.contains_key(&third_id) && owned.values().sum::<i64>() == 256 {
            break;
        }
        assert!(
            killed.elapsed() < bound,
            "partitions not taken over within {bound:?}: {owned:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let failover = killed.elapsed();

    tokio::time::sleep(Duration::from_secs(1)).await;
    third.restart().await;
    load.await.expect("load");
    let ids = publish(addresses.clone(), app.clone(), 5_000, 60).await;
    acknowledged.lock().unwrap().extend(ids);
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(
        acknowledged.len() >= 150 + 60,
        "too few acknowledged: {}",
        acknowledged.len()
    );

    all_delivered_within_the_caps(&receivers, &acknowledged, Duration::from_secs(120)).await;

    // The restarted node gets its share back.
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let owned = owners(&database.url).await;
        if owned.len() == 3 && owned.values().sum::<i64>() == 256 {
            break;
        }
        assert!(Instant::now() < deadline, "no rebalance after the restart: {owned:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "cluster: {} acknowledged, failover in {failover:?}, peaks {:?}",
        acknowledged.len(),
        receivers.iter().map(Receiver::peak_in_flight).collect::<Vec<_>>()
    );
    drop((first, second));
}

/// A node that joins gets its share of the partitions within seconds, though an attempt may take half a
/// minute here: the node giving them up clears each partition's lease as soon as nothing it sent for it
/// is in flight or unrecorded, not after the longest attempt. Deliveries go on through the hand-over,
/// with attempts in flight to endpoints on both sides of it: every acknowledged message arrives exactly
/// once (a result fenced out would send its message again), and no endpoint sees more requests at once
/// than its cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_joins_gets_its_share_in_seconds_and_the_caps_hold() {
    let Some(database) = testdb::fresh("a_node_that_joins_gets_its_share_in_seconds_and_the_caps_hold").await else {
        return;
    };
    let database = Arc::new(database);
    // Waiting out the longest attempt and a lease time would take 32 s; a heartbeat is half a second,
    // shorter than an attempt, so a next owner that took a partition over too early would send what is
    // still in flight.
    let env = [("HERALD_MAX_REQUEST_TIMEOUT", "30s"), ("HERALD_LEASE_TTL", "2s")];
    let first = Herald::start_on(database.clone(), &env).await;
    let app = first.app("joining").await;
    // The first node gives up its highest 128 partitions: endpoints in both halves, each answering slowly
    // enough that its attempts are in flight when the hand-over starts.
    let mut receivers = Vec::new();
    let (mut given_up, mut kept) = (0, 0);
    while given_up < 2 || kept < 2 {
        assert!(receivers.len() < 40, "no endpoint ids in both halves of the partitions");
        let receiver = Receiver::start(Reply::status(200).delay(Duration::from_secs(1))).await;
        let (id, _) = first
            .endpoint(&app, json!({ "url": receiver.url(), "maxConcurrency": CAP }))
            .await;
        if herald_store::partition_of(&id) >= herald_store::PARTITIONS / 2 {
            given_up += 1;
        } else {
            kept += 1;
        }
        receivers.push(receiver);
    }
    let mut acknowledged: BTreeSet<String> = publish(vec![first.addr.to_string()], app.clone(), 0, 5)
        .await
        .into_iter()
        .collect();

    let load = tokio::spawn(publish(vec![first.addr.to_string()], app.clone(), 1_000, 15));
    let second = Herald::start_on(database.clone(), &env).await;
    let split_after = split_in_two(&database.url, Duration::from_secs(15)).await;
    acknowledged.extend(load.await.expect("load"));
    let addresses = vec![first.addr.to_string(), second.addr.to_string()];
    acknowledged.extend(publish(addresses, app.clone(), 5_000, 5).await);
    assert!(acknowledged.len() >= 25, "too few acknowledged: {}", acknowledged.len());

    all_delivered_within_the_caps(&receivers, &acknowledged, Duration::from_secs(60)).await;
    for (n, receiver) in receivers.iter().enumerate() {
        let twice: Vec<(String, (usize, usize))> = receiver
            .per_message()
            .into_iter()
            .filter(|(_, (sent, _))| *sent > 1)
            .collect();
        assert!(twice.is_empty(), "endpoint {n} got messages more than once: {twice:?}");
    }
    eprintln!(
        "joining: split after {split_after:?}, {} acknowledged, {} endpoints ({given_up} handed over)",
        acknowledged.len(),
        receivers.len()
    );
    drop((first, second));
}

/// A resend asked of a node that does not own the endpoint is sent once: the owner finds it through the
/// store, and the node that took the request sends nothing for a partition it does not own (an endpoint
/// sent to by two nodes at once would see its cap broken and the message twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_through_a_node_that_does_not_own_the_endpoint_is_sent_once() {
    let Some(database) = testdb::fresh("a_resend_through_a_node_that_does_not_own_the_endpoint_is_sent_once").await
    else {
        return;
    };
    let database = Arc::new(database);
    let first = Herald::start_on(database.clone(), &[]).await;
    let second = Herald::start_on(database.clone(), &[]).await;
    split_in_two(&database.url, Duration::from_secs(30)).await;
    // The first node keeps the lower half of the partitions: an endpoint in the upper half is the second's.
    // It answers slowly, so that a second sender would find the resend still pending.
    let receiver = Receiver::start(Reply::status(200).delay(Duration::from_millis(500))).await;
    let app = first.app("resending").await;
    let endpoint = loop {
        let (id, _) = first.endpoint(&app, json!({ "url": receiver.url() })).await;
        if herald_store::partition_of(&id) >= herald_store::PARTITIONS / 2 {
            break id;
        }
        first.call("DELETE", &format!("/app/{app}/endpoint/{id}"), None).await;
    };
    let message = publish(vec![first.addr.to_string()], app.clone(), 0, 1)
        .await
        .pop()
        .expect("acknowledged");
    receiver.wait_for(1, Duration::from_secs(15)).await;

    let resend = format!("/app/{app}/msg/{message}/endpoint/{endpoint}/resend");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        // Refused until the first attempt's result is written.
        let (status, body) = first.call("POST", &resend, None).await;
        if status == 202 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the resend was never accepted: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    receiver.wait_for(2, Duration::from_secs(15)).await;
    // A few heartbeats, in which the owner's watcher polls the store too.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        receiver.per_message().get(&message).map(|(sent, _)| *sent),
        Some(2),
        "the message and its resend, each once"
    );
    drop((first, second));
}
