//! End-to-end on PostgreSQL: the real binary on a fresh PostgreSQL database delivers, retries and
//! deduplicates as it does on SQLite, and survives losing its database. Skipped with a visible message
//! when PostgreSQL is unreachable (fatal with `HERALD_REQUIRE_POSTGRES=1`).

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{Herald, ProxiedNode, Receiver, Reply};
use serde_json::{Value, json};
use sqlx::Connection;

const WAIT: Duration = Duration::from_secs(20);

async fn send(herald: &Herald, app: &str, body: Value) -> (u16, Value) {
    herald.call("POST", &format!("/app/{app}/msg"), Some(body)).await
}

/// The sample of `name` with `labels` in `herald`'s `/metrics`, if it has one.
async fn metric(herald: &Herald, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let (status, metrics) = crate::metrics::scrape(herald.addr, Some(common::TOKEN)).await;
    assert_eq!(status, 200);
    crate::metrics::sample(&metrics, name, labels)
}

/// A message to more endpoints than its own transaction writes deliveries for (PostgreSQL acknowledges
/// it with the endpoint list stored and inserts the deliveries right after: crates/herald-store/src/
/// split.rs) reaches every endpoint, once each.
#[tokio::test]
async fn a_wide_fan_out_reaches_every_endpoint_once_on_postgres() {
    const ENDPOINTS: usize = 200;
    let Some(herald) = Herald::start_pg("a_wide_fan_out_reaches_every_endpoint_once_on_postgres", &[]).await else {
        return;
    };
    let receiver = Receiver::start(Reply::status(204)).await;
    let app = herald.app("wide").await;
    for n in 0..ENDPOINTS {
        herald
            .endpoint(&app, json!({ "url": format!("{}/{n}", receiver.url()) }))
            .await;
    }
    let (status, created) = send(
        &herald,
        &app,
        json!({ "eventType": "invoice.paid", "payload": { "n": 1 } }),
    )
    .await;
    assert_eq!(status, 202, "{created}");
    let msg = created["id"].as_str().expect("id");
    let got = receiver.wait_for(ENDPOINTS, WAIT).await;
    assert!(got.iter().all(|r| r.header("webhook-id") == msg));
    // Each endpoint signs with its own key: as many signatures as endpoints means each one came.
    let signatures: BTreeSet<&str> = got.iter().map(|r| r.header("webhook-signature")).collect();
    assert_eq!(signatures.len(), ENDPOINTS, "every endpoint");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.received().len(), ENDPOINTS, "none twice");
    // The node says so: every chunk written, none waiting (what HeraldFanOutStuck watches).
    let (status, metrics) = crate::metrics::scrape(herald.addr, Some(common::TOKEN)).await;
    assert_eq!(status, 200);
    let expanded = crate::metrics::sample(
        &metrics,
        "herald_store_fan_out_expansions_total",
        &[("result", "expanded")],
    );
    assert!(expanded.is_some_and(|n| n >= 1.0), "its chunk: {expanded:?}");
    assert_eq!(
        crate::metrics::sample(&metrics, "herald_store_fan_out_pending", &[]),
        Some(0.0)
    );
    // Published at 0 before any: the first refused chunk is an increase the alert's `increase()` sees.
    for result in ["failed", "given_up"] {
        assert_eq!(
            crate::metrics::sample(&metrics, "herald_store_fan_out_expansions_total", &[("result", result)]),
            Some(0.0),
            "{result}"
        );
    }
}

/// A message whose application's row another transaction holds (an endpoint write, an application's
/// delete) waits for a later batch rather than hold the cluster's ingest lock behind that row; the node
/// shows it waiting (`herald_store_ingest_deferred`, docs/observability.md), and answers `202` and
/// delivers it once the row is free.
#[tokio::test]
async fn a_message_to_a_held_application_waits_visibly_and_goes_once_the_row_is_free() {
    let Some(herald) = Herald::start_pg("a_message_to_a_held_application_waits_visibly", &[]).await else {
        return;
    };
    let receiver = Receiver::start(Reply::status(204)).await;
    let app = herald.app("held").await;
    herald.endpoint(&app, json!({ "url": receiver.url() })).await;
    let url = &herald.database.as_ref().expect("database").url;
    let mut holder = sqlx::PgConnection::connect(url).await.expect("connect");
    sqlx::query("BEGIN").execute(&mut holder).await.expect("begin");
    // As `delete_app` holds it.
    sqlx::query("SELECT id FROM application WHERE id = $1 FOR UPDATE")
        .bind(&app)
        .fetch_one(&mut holder)
        .await
        .expect("lock the application's row");

    let deferred = async || {
        let (status, metrics) = crate::metrics::scrape(herald.addr, Some(common::TOKEN)).await;
        assert_eq!(status, 200);
        crate::metrics::sample(&metrics, "herald_store_ingest_deferred", &[])
    };
    let body = json!({ "eventType": "invoice.paid", "payload": { "n": 1 } });
    let ((status, created), ()) = tokio::join!(send(&herald, &app, body), async {
        let deadline = Instant::now() + WAIT;
        while deferred().await != Some(1.0) {
            assert!(Instant::now() < deadline, "the held message is not shown waiting");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            receiver.received().is_empty(),
            "nothing is sent before the message is stored"
        );
        assert_eq!(deferred().await, Some(1.0), "still waiting while the row is held");
        sqlx::query("COMMIT")
            .execute(&mut holder)
            .await
            .expect("let the row go");
    });
    assert_eq!(status, 202, "{created}");
    let got = receiver.wait_for(1, WAIT).await;
    assert_eq!(got[0].header("webhook-id"), created["id"].as_str().expect("id"));
    assert_eq!(deferred().await, Some(0.0), "nothing waits once the row is free");
}

/// Once the node remembers an application's row, its messages commit in one statement; those that
/// statement refuses — one repeating a stored `eventId`, one after an endpoint was added (the row moved) —
/// are written again the usual way and answered as ever (the duplicate with the stored message, the
/// next message fanned out to both endpoints), and the node counts why
/// (`herald_store_ingest_shortcut_refused_total`, docs/observability.md).
#[tokio::test]
async fn refused_one_statement_batches_are_written_the_usual_way_and_counted() {
    let Some(herald) = Herald::start_pg("refused_one_statement_batches_are_written_the_usual_way", &[]).await else {
        return;
    };
    let first = Receiver::start(Reply::status(204)).await;
    let second = Receiver::start(Reply::status(204)).await;
    let app = herald.app("shop").await;
    herald.endpoint(&app, json!({ "url": first.url() })).await;
    let refused = async |reason: &str| {
        metric(
            &herald,
            "herald_store_ingest_shortcut_refused_total",
            &[("reason", reason)],
        )
        .await
    };
    let body = |event_id: &str| json!({ "eventType": "invoice.paid", "eventId": event_id, "payload": {} });

    // The first message reads the application's row; the second trusts it.
    assert_eq!(send(&herald, &app, body("evt-1")).await.0, 202);
    let (status, original) = send(&herald, &app, body("evt-2")).await;
    assert_eq!(status, 202, "{original}");
    let (status, again) = send(&herald, &app, body("evt-2")).await;
    assert_eq!(status, 202, "{again}");
    assert_eq!(again["id"], original["id"], "the stored message answers the repeat");
    assert_eq!(refused("message").await, Some(1.0), "the repeat refused the statement");

    herald.endpoint(&app, json!({ "url": second.url() })).await;
    // No `eventId`: after a repeat, batches with one go the usual way for a second.
    let (status, after) = send(&herald, &app, json!({ "eventType": "invoice.paid", "payload": {} })).await;
    assert_eq!(status, 202, "{after}");
    assert_eq!(
        refused("row_moved").await,
        Some(1.0),
        "the endpoint write moved the row"
    );
    let id_of = |received: Vec<common::Received>| -> Vec<String> {
        received.iter().map(|r| r.header("webhook-id").to_owned()).collect()
    };
    let after_id = after["id"].as_str().expect("id").to_owned();
    assert_eq!(id_of(second.wait_for(1, WAIT).await), std::slice::from_ref(&after_id));
    let got = id_of(first.wait_for(3, WAIT).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(first.received().len(), 3, "three messages, the repeat not sent twice");
    assert!(
        got.contains(&after_id),
        "the message after the endpoint write reaches both endpoints"
    );
}

/// The one-statement batch is for a node alone in its cluster (two nodes going that way were slower,
/// docs/performance.md): a node alone commits its batches so, and once a second node has taken a share
/// of the partitions, neither does — every batch of either goes the usual way, in a transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_node_alone_in_its_cluster_commits_batches_in_one_statement() {
    let Some(database) = herald_store::testdb::fresh("only_a_node_alone_commits_batches_in_one_statement").await else {
        return;
    };
    let database = std::sync::Arc::new(database);
    // The test harness's short leases (4 s) hand the second node its share within seconds.
    let first = Herald::start_on(database.clone(), &[]).await;
    let receiver = Receiver::start(Reply::status(204)).await;
    let app = first.app("shop").await;
    first.endpoint(&app, json!({ "url": receiver.url() })).await;
    let one_statement = async |node: &Herald| {
        metric(node, "herald_store_ingest_one_statement_batches_total", &[])
            .await
            .unwrap_or(0.0)
    };
    let body = json!({ "eventType": "invoice.paid", "payload": {} });

    // Alone: the first batch reads the application's row, the next ones trust it.
    for _ in 0..3 {
        assert_eq!(send(&first, &app, body.clone()).await.0, 202);
    }
    assert!(one_statement(&first).await >= 1.0, "a node alone goes the short way");

    let second = Herald::start_on(database.clone(), &[]).await;
    let mut conn = sqlx::PgConnection::connect(&database.url).await.expect("connect");
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let owners: i64 = sqlx::query_scalar(
            "SELECT COUNT(DISTINCT owner) FROM partition_lease WHERE owner IS NOT NULL AND expires_at > now()",
        )
        .fetch_one(&mut conn)
        .await
        .expect("leases");
        if owners == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the second node never got a share of the partitions"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The first node stopped counting its surplus as its own (draining) before the database let the
    // second take any; the wait only covers a takeover by expiry, which the first sees at its next round.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let tried = async |node: &Herald| {
        let mut refused = 0.0;
        for reason in ["lock_busy", "row_moved", "message"] {
            refused += metric(
                node,
                "herald_store_ingest_shortcut_refused_total",
                &[("reason", reason)],
            )
            .await
            .unwrap_or(0.0);
        }
        refused + one_statement(node).await
    };
    let (before_first, before_second) = (tried(&first).await, tried(&second).await);
    for node in [&first, &second, &first, &second, &first, &second] {
        assert_eq!(send(node, &app, body.clone()).await.0, 202);
    }
    // Not even tried (a refused try would cost a round trip): neither committed nor refused.
    assert_eq!(tried(&first).await, before_first, "the first node beside another");
    assert_eq!(tried(&second).await, before_second, "the second node beside another");
    assert_eq!(receiver.wait_for(9, WAIT).await.len(), 9, "every message delivered");
}

#[tokio::test]
async fn delivers_signed_retries_and_deduplicates_on_postgres() {
    let Some(herald) = Herald::start_pg("delivers_signed_retries_and_deduplicates_on_postgres", &[]).await else {
        return;
    };
    let healthy = Receiver::start(Reply::status(204)).await;
    let flaky = Receiver::start(Reply::status(200)).await;
    flaky.script([Reply::status(503)]);
    let app = herald.app("shop").await;
    let (_, secret) = herald.endpoint(&app, json!({ "url": healthy.url() })).await;
    herald.endpoint(&app, json!({ "url": flaky.url() })).await;

    let raw = r#"{"invoice": "in_1",  "amount": 12.50}"#;
    let body = format!(r#"{{"eventType":"invoice.paid","eventId":"evt-1","payload":{raw}}}"#);
    let (status, created) = herald
        .call_with(
            "POST",
            &format!("/app/{app}/msg"),
            Some(body.clone().into_bytes()),
            &[("authorization", &format!("Bearer {}", common::TOKEN))],
        )
        .await;
    assert_eq!(status, 202, "{created}");
    let msg = created["id"].as_str().unwrap().to_owned();
    let (status, again) = herald
        .call_with(
            "POST",
            &format!("/app/{app}/msg"),
            Some(body.into_bytes()),
            &[("authorization", &format!("Bearer {}", common::TOKEN))],
        )
        .await;
    assert!((200..300).contains(&status), "{again}");
    assert_eq!(again["id"], msg.as_str(), "a repeated eventId is the same message");

    let got = healthy.wait_for(1, WAIT).await;
    assert_eq!(got[0].body.as_ref(), raw.as_bytes(), "payload bytes changed");
    assert_eq!(got[0].header("webhook-id"), msg);
    let verifier = herald_signature::Verifier::new(vec![herald_signature::HmacSecret::parse(&secret).unwrap().into()]);
    verifier
        .verify_now(
            &msg,
            got[0].header("webhook-timestamp"),
            got[0].header("webhook-signature"),
            &got[0].body,
        )
        .expect("signature verifies");

    // The flaky endpoint answered 503 first: retried, with the same webhook-id.
    let retried = flaky.wait_for(2, WAIT).await;
    assert!(retried.iter().all(|r| r.header("webhook-id") == msg));
    let attempts = herald.wait_attempts(&app, &msg, WAIT, |a| a.len() >= 3).await;
    let mut codes: Vec<i64> = attempts
        .iter()
        .map(|a| a["responseStatusCode"].as_i64().unwrap_or(-1))
        .collect();
    codes.sort_unstable();
    assert_eq!(codes, [200, 204, 503]);
    let deadline = Instant::now() + WAIT;
    loop {
        let views = herald.get(&format!("/app/{app}/msg/{msg}/endpoint")).await;
        let statuses: Vec<&str> = views["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["deliveryStatus"].as_str().unwrap_or(""))
            .collect();
        if statuses == ["delivered", "delivered"] {
            break;
        }
        assert!(Instant::now() < deadline, "deliveries not settled: {statuses:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(healthy.received().len(), 1, "delivered once");
}

/// PostgreSQL goes away under a running node (a proxy in front of the shared server is cut): requests
/// fail with 503 `store_unavailable`, the node does not crash, and once the database is back it
/// recovers by itself and delivers every message it acknowledged. (Multi-threaded: the proxy must keep
/// serving while the harness blocks waiting for the node to start.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_database_answers_503_and_recovers_without_losing_acknowledged_messages() {
    let test = "losing_the_database_answers_503_and_recovers_without_losing_acknowledged_messages";
    let Some(ProxiedNode {
        mut herald,
        proxy,
        receiver,
        app,
    }) = ProxiedNode::start(test, "outage", &[]).await
    else {
        return;
    };

    let mut acknowledged = BTreeSet::new();
    let publish = async |herald: &Herald, n: usize| {
        let (status, body) = send(herald, &app, json!({"eventType": "outage.test", "payload": {"n": n}})).await;
        (status, body)
    };
    for n in 0..10 {
        let (status, body) = publish(&herald, n).await;
        assert_eq!(status, 202, "{body}");
        acknowledged.insert(body["id"].as_str().unwrap().to_owned());
    }

    proxy.cut();
    // Connections already open fail at once, new ones are refused: the node answers 503 from now on (a
    // request that was already being committed may still get its 202, and then counts as acknowledged).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut n = 100;
    loop {
        let (status, body) = publish(&herald, n).await;
        n += 1;
        if status == 503 {
            assert_eq!(body["code"], "store_unavailable", "{body}");
            break;
        }
        assert_eq!(status, 202, "{body}");
        acknowledged.insert(body["id"].as_str().unwrap().to_owned());
        assert!(Instant::now() < deadline, "still answering 202 with the database gone");
    }
    for _ in 0..3 {
        let (status, body) = publish(&herald, n).await;
        n += 1;
        assert_eq!(
            (status, body["code"].as_str()),
            (503, Some("store_unavailable")),
            "{body}"
        );
        let (status, body) = herald.call("GET", &format!("/app/{app}/msg"), None).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (503, Some("store_unavailable")),
            "{body}"
        );
    }
    assert!(herald.is_running(), "the node must survive losing its database");

    proxy.restore().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = publish(&herald, n).await;
        n += 1;
        if status == 202 {
            acknowledged.insert(body["id"].as_str().unwrap().to_owned());
            break;
        }
        assert_eq!(status, 503, "{body}");
        assert!(
            Instant::now() < deadline,
            "the node did not recover after the database came back"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for m in 0..10 {
        let (status, body) = publish(&herald, 1_000 + m).await;
        assert_eq!(status, 202, "{body}");
        acknowledged.insert(body["id"].as_str().unwrap().to_owned());
    }

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let delivered: BTreeSet<String> = receiver
            .received()
            .iter()
            .map(|r| r.header("webhook-id").to_owned())
            .collect();
        let missing: Vec<&String> = acknowledged.difference(&delivered).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "acknowledged messages never delivered after the outage: {missing:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(herald.is_running());
}
