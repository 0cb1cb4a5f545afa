//! The transactional outbox relay (`herald relay` and `[[relay]]`, docs/outbox.md) end to end: a real
//! producer database (a SQLite file, PostgreSQL, MariaDB), a real `herald serve`, real `herald relay`
//! processes, a receiver on loopback.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use herald_relay::dialect::TableName;
use serde_json::{Value, json};
use sqlx::{AssertSqlSafe, Row};

use crate::common::producer::{Event, Producer, RelayProcess, messages};
use crate::common::{Herald, Receiver, Reply, TOKEN};

/// A Herald with an app (uid `shop`) and one endpoint (with `endpoint` settings) on a fresh receiver.
async fn herald_with_endpoint(endpoint: Value) -> (Herald, String, Receiver) {
    let herald = Herald::start(&[]).await;
    let app = herald.post("/app", json!({"name": "Shop", "uid": "shop"})).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let receiver = Receiver::start(Reply::status(200)).await;
    let mut body = json!({"url": receiver.url()});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), endpoint.as_object()) {
        body.extend(extra.clone());
    }
    herald.endpoint(&app, body).await;
    (herald, app, receiver)
}

fn base(herald: &Herald) -> String {
    format!("http://{}", herald.addr)
}

/// Wait until `receiver` got `n` distinct messages (by `webhook-id`: a slow answer may be retried, a
/// duplicate attempt that is allowed) and return every request so far.
async fn wait_messages(receiver: &Receiver, n: usize, timeout: Duration) -> Vec<crate::common::Received> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let got = receiver.received();
        let distinct: HashSet<&str> = got.iter().map(|r| r.header("webhook-id")).collect();
        if distinct.len() >= n {
            return got;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {n} messages arrived",
            distinct.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn distinct_messages(got: &[crate::common::Received]) -> usize {
    got.iter().map(|r| r.header("webhook-id")).collect::<HashSet<_>>().len()
}

fn payload_of(r: &crate::common::Received) -> Value {
    serde_json::from_slice(&r.body).expect("JSON body")
}

#[tokio::test]
async fn committed_rows_are_published_once_rolled_back_rows_never() {
    for producer in Producer::all("committed_rows_are_published_once_rolled_back_rows_never").await {
        let (herald, app, receiver) = herald_with_endpoint(json!({})).await;
        let batch = |from: usize, to: usize| -> Vec<Event> {
            (from..to)
                .map(|n| Event::new(format!("evt_{n}"), "shop", json!({"invoice": n, "status": "paid"})))
                .collect()
        };
        producer.write(&batch(0, 10), true).await;
        producer.write(&batch(100, 105), false).await;
        // A row for an app Herald does not know is refused for good, marked, and blocks nothing.
        producer
            .write(&[Event::new("evt_lost", "no-such-app", json!({"x": 1}))], true)
            .await;
        let relay = RelayProcess::start(&producer, &base(&herald), &[]);
        producer.write(&batch(10, 20), true).await;
        producer.write(&batch(200, 203), false).await;

        let got = wait_messages(&receiver, 20, Duration::from_secs(30)).await;
        producer.wait_rows(1, Duration::from_secs(10)).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            distinct_messages(&receiver.received()),
            20,
            "{}: exactly the committed rows arrive",
            producer.dialect
        );
        let invoices: HashSet<i64> = got
            .iter()
            .map(|r| payload_of(r)["invoice"].as_i64().expect("n"))
            .collect();
        assert_eq!(invoices, (0..20).collect(), "{}", producer.dialect);
        // The payload is the row's, and the message carries the row's event id.
        assert_eq!(payload_of(&got[0])["status"], "paid");
        let message = herald.get(&format!("/app/{app}/msg/evt_7")).await;
        assert_eq!(message["eventId"], "evt_7");
        assert_eq!(message["eventType"], "invoice.paid");
        assert_eq!(message["payload"], json!({"invoice": 7, "status": "paid"}));
        assert_eq!(messages(&herald, &app).await.len(), 20);
        let refused = producer.refused().await;
        assert_eq!(refused.len(), 1, "{}: {refused:?}", producer.dialect);
        assert_eq!(refused[0].0, "evt_lost");
        assert!(refused[0].1.starts_with("404"), "{}: {refused:?}", producer.dialect);
        relay.wait_log("relay progress", Duration::from_secs(5)).await;
    }
}

#[tokio::test]
async fn two_relays_on_one_table_keep_each_keys_order() {
    for producer in Producer::all("two_relays_on_one_table_keep_each_keys_order").await {
        let (herald, app, receiver) = herald_with_endpoint(json!({"ordering": "key"})).await;
        let relays: Vec<RelayProcess> = (0..2)
            .map(|_| RelayProcess::start(&producer, &base(&herald), &["--batch-size", "7", "--concurrency", "8"]))
            .collect();
        let keys = ["inv_a", "inv_b", "inv_c", "inv_d", "inv_e"];
        let mut n = 0;
        for round in 0..12 {
            let events: Vec<Event> = (0..10)
                .map(|i| {
                    n += 1;
                    let key = keys[(i + round) % keys.len()];
                    Event::new(format!("evt_{n}"), "shop", json!({"key": key, "n": n})).keyed(key)
                })
                .collect();
            producer.write(&events, true).await;
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
        let got = wait_messages(&receiver, n, Duration::from_secs(60)).await;
        producer.wait_rows(0, Duration::from_secs(10)).await;
        let mut last: HashMap<String, i64> = HashMap::new();
        for r in &got {
            let body = payload_of(r);
            let key = body["key"].as_str().expect("key").to_owned();
            let seen = body["n"].as_i64().expect("n");
            // A retried attempt repeats the same row; a later row never comes before an earlier one.
            let previous = last.insert(key.clone(), seen);
            assert!(
                previous.is_none_or(|p| p <= seen),
                "{}: key {key}: {seen} arrived after {previous:?}",
                producer.dialect
            );
        }
        let listed = messages(&herald, &app).await;
        let distinct: HashSet<&String> = listed.iter().map(|(e, _)| e).collect();
        assert_eq!(
            (listed.len(), distinct.len()),
            (n, n),
            "{}: one message per row",
            producer.dialect
        );
        drop(relays);
    }
}

#[tokio::test]
async fn msg_batch_answers_each_message_in_order_and_checks_them_all_first() {
    let (herald, app, receiver) = herald_with_endpoint(json!({})).await;
    let first = herald
        .post(
            "/app/shop/msg",
            json!({"eventType": "invoice.paid", "eventId": "evt_0", "payload": {"n": 0}}),
        )
        .await;
    let item = |n: usize| json!({"eventType": "invoice.paid", "eventId": format!("evt_{n}"), "payload": {"n": n}, "orderingKey": "inv_1"});
    // evt_0 exists already, and evt_2 is given twice: one message each, the original answered.
    let body = json!({"messages": [item(1), item(0), item(2), item(3), item(2)]});
    let (status, answer) = herald
        .call("POST", "/app/shop/msg-batch?with_content=false", Some(body))
        .await;
    assert_eq!(status, 200, "{answer}");
    let data = answer["data"].as_array().expect("data");
    assert_eq!(data.len(), 5, "{answer}");
    assert!(data.iter().all(|r| r["status"] == 202), "{answer}");
    assert_eq!(
        data[1]["message"]["id"], first["id"],
        "a known eventId answers its message"
    );
    assert_eq!(data[2]["message"]["id"], data[4]["message"]["id"]);
    assert_eq!(data[3]["message"]["payload"], json!({}), "with_content=false");
    // Created in the order given, each delivered once.
    let listed = messages(&herald, &app).await;
    let order: Vec<&str> = listed.iter().map(|(event, _)| event.as_str()).collect();
    assert_eq!(order, ["evt_0", "evt_1", "evt_2", "evt_3"]);
    let got = wait_messages(&receiver, 4, Duration::from_secs(20)).await;
    assert_eq!(distinct_messages(&got), 4);

    // One invalid message refuses the whole request, naming it by its index; nothing is stored.
    let bad = json!({"messages": [item(4), {"eventType": "bad type!", "eventId": "evt_5", "payload": {}}]});
    let (status, answer) = herald.call("POST", "/app/shop/msg-batch", Some(bad)).await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(
        answer["detail"][0]["loc"],
        json!(["body", "messages", "1", "eventType"])
    );
    let unnamed = json!({"messages": [{"eventType": "invoice.paid", "payload": {}}]});
    let (status, answer) = herald.call("POST", "/app/shop/msg-batch", Some(unnamed)).await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["detail"][0]["loc"], json!(["body", "messages", "0", "eventId"]));
    let (status, _) = herald
        .call("POST", "/app/shop/msg-batch", Some(json!({"messages": []})))
        .await;
    assert_eq!(status, 422);
    let creating =
        json!({"messages": [{"eventType": "t", "eventId": "e", "payload": {}, "application": {"name": "x"}}]});
    let (status, answer) = herald.call("POST", "/app/new-app/msg-batch", Some(creating)).await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(
        answer["detail"][0]["loc"],
        json!(["body", "messages", "0", "application"])
    );
    let too_many: Vec<Value> = (100..601).map(item).collect();
    let (status, _) = herald
        .call("POST", "/app/shop/msg-batch", Some(json!({"messages": too_many})))
        .await;
    assert_eq!(status, 422);
    let (status, answer) = herald
        .call(
            "POST",
            "/app/no-such-app/msg-batch",
            Some(json!({"messages": [item(6)]})),
        )
        .await;
    assert_eq!((status, answer["code"].as_str()), (404, Some("not_found")));
    assert_eq!(
        messages(&herald, &app).await.len(),
        4,
        "nothing stored by refused requests"
    );
}

#[tokio::test]
async fn a_relay_sends_many_rows_per_request_where_offered_and_one_per_request_when_told() {
    let producer = Producer::sqlite().await;
    let (herald, app, receiver) = herald_with_endpoint(json!({"ordering": "key"})).await;
    let events = |from: usize, to: usize| -> Vec<Event> {
        (from..to)
            .map(|n| Event::new(format!("k{}:{n}", n % 3), "shop", json!({"n": n})).keyed(&format!("k{}", n % 3)))
            .collect()
    };
    producer.write(&events(0, 60), true).await;
    let relay = RelayProcess::start(&producer, &base(&herald), &[]);
    relay.wait_log("many rows per request", Duration::from_secs(10)).await;
    producer.wait_rows(0, Duration::from_secs(30)).await;
    drop(relay);
    producer.write(&events(60, 90), true).await;
    let relay = RelayProcess::start(&producer, &base(&herald), &["--one-per-request"]);
    relay.wait_log("one row per request", Duration::from_secs(10)).await;
    producer.wait_rows(0, Duration::from_secs(30)).await;
    let listed = messages(&herald, &app).await;
    let committed: Vec<String> = (0..90).map(|n| format!("k{}:{n}", n % 3)).collect();
    check_one_message_per_row_in_order(&listed, &committed, &[]);
    let got = wait_messages(&receiver, 90, Duration::from_secs(30)).await;
    assert_eq!(distinct_messages(&got), 90);
}

#[tokio::test]
async fn a_relay_backs_off_while_herald_is_down_and_catches_up() {
    let producer = Producer::sqlite().await;
    let (mut herald, app, receiver) = herald_with_endpoint(json!({})).await;
    herald.kill9();
    let events: Vec<Event> = (0..5)
        .map(|n| Event::new(format!("e{n}"), "shop", json!({"n": n})))
        .collect();
    producer.write(&events, true).await;
    let relay = RelayProcess::start(&producer, &base(&herald), &[]);
    let line = relay.wait_log("backing off", Duration::from_secs(10)).await;
    assert!(line.contains("unreachable"), "{line}");
    relay.wait_log("failures=2", Duration::from_secs(10)).await;
    assert_eq!(producer.rows().await, 5, "nothing is removed while Herald is down");
    herald.restart().await;
    wait_messages(&receiver, 5, Duration::from_secs(60)).await;
    producer.wait_rows(0, Duration::from_secs(10)).await;
    relay.wait_log("relay recovered", Duration::from_secs(5)).await;
    assert_eq!(messages(&herald, &app).await.len(), 5);
}

/// How long the stand-in for Herald holds each request in
/// [`a_sqlite_producer_writes_while_the_relay_publishes`].
const HELD_PUBLISH: Duration = Duration::from_secs(2);

/// A SQLite producer's writes never wait for the relay's publishes. The relay publishes to a stand-in for
/// Herald that holds every request 2 s; while the first publish is held, the producer commits transactions
/// (a business write and an outbox row each) on a connection with a 200 ms busy timeout. They all go
/// through at once. A relay that held the file's write lock across its publishes (`BEGIN IMMEDIATE` around
/// the whole batch, as before) fails each of them with `database is locked`. Once the stand-in answers, every
/// row is settled.
#[tokio::test]
async fn a_sqlite_producer_writes_while_the_relay_publishes() {
    use sqlx::Connection as _;

    let producer = Producer::sqlite().await;
    sqlx::query("CREATE TABLE invoice (id TEXT PRIMARY KEY, paid INTEGER NOT NULL)")
        .execute(&producer.pool)
        .await
        .expect("the producer's own table");
    sqlx::query("INSERT INTO invoice VALUES ('inv_1', 0)")
        .execute(&producer.pool)
        .await
        .expect("an invoice");
    // No OpenAPI document there (an empty answer): the relay publishes one row per request.
    let slow = Receiver::start(Reply::status(202).delay(HELD_PUBLISH)).await;
    producer
        .write(&[Event::new("evt_0", "shop", json!({"n": 0}))], true)
        .await;
    let relay = RelayProcess::start(&producer, &format!("http://{}", slow.addr), &[]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let held = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "no publish of evt_0 within 30 s: {:#?}",
            relay.stderr.lock().expect("lines")
        );
        let publish = slow
            .received()
            .into_iter()
            .find(|r| String::from_utf8_lossy(&r.body).contains("\"evt_0\""));
        if let Some(publish) = publish {
            break publish;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };

    let mut conn = sqlx::AnyConnection::connect(&producer.url)
        .await
        .expect("producer connects");
    sqlx::query("PRAGMA busy_timeout = 200")
        .execute(&mut conn)
        .await
        .expect("busy timeout");
    let insert = producer
        .dialect
        .insert(&TableName::parse("herald_outbox").expect("name"));
    for n in 1..=5 {
        let started = std::time::Instant::now();
        let written: Result<(), sqlx::Error> = async {
            let mut tx = conn.begin().await?;
            sqlx::query("UPDATE invoice SET paid = paid + 1 WHERE id = 'inv_1'")
                .execute(&mut *tx)
                .await?;
            sqlx::query(AssertSqlSafe(insert.clone()))
                .bind(format!("evt_{n}"))
                .bind("shop")
                .bind("invoice.paid")
                .bind(json!({"n": n}).to_string())
                .bind(None::<String>)
                .execute(&mut *tx)
                .await?;
            tx.commit().await
        }
        .await;
        written.unwrap_or_else(|e| {
            panic!(
                "write {n}, {:?} after it began, while the relay publishes: {e}",
                started.elapsed()
            )
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Every write was made while the first publish was still held, not after it was answered.
    assert!(
        held.at.elapsed() < HELD_PUBLISH - Duration::from_millis(100) && slow.in_flight() >= 1,
        "the writes ended {:?} after the publish arrived",
        held.at.elapsed()
    );
    assert_eq!(producer.rows().await, 6, "nothing settled while the publish is held");

    slow.set_fallback(Reply::status(202));
    producer.wait_rows(0, Duration::from_secs(30)).await;
    let published: HashSet<String> = slow
        .received()
        .iter()
        .filter_map(|r| serde_json::from_slice::<Value>(&r.body).ok())
        .filter_map(|body| body["eventId"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(published, (0..=5).map(|n| format!("evt_{n}")).collect());
    let paid: i64 = sqlx::query("SELECT paid FROM invoice WHERE id = 'inv_1'")
        .fetch_one(&producer.pool)
        .await
        .expect("invoice")
        .get(0);
    assert_eq!(paid, 5);
    let failures: Vec<String> = relay
        .stderr
        .lock()
        .expect("lines")
        .iter()
        .filter(|line| line.contains("backing off"))
        .cloned()
        .collect();
    assert!(failures.is_empty(), "{failures:#?}");
}

#[tokio::test]
async fn serve_runs_relay_sections_and_reports_them_in_metrics() {
    let producer = Producer::sqlite().await;
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("herald.toml");
    std::fs::write(
        &config,
        format!(
            "[[relay]]\nname = \"shop\"\nsource = \"{}\"\ntable = \"herald_outbox\"\npoll_interval = \"10ms\"\n",
            producer.url
        ),
    )
    .expect("config");
    let herald = Herald::start(&[("HERALD_CONFIG", config.to_str().expect("path"))]).await;
    let app = herald.post("/app", json!({"name": "Shop", "uid": "shop"})).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let receiver = Receiver::start(Reply::status(200)).await;
    herald.endpoint(&app, json!({"url": receiver.url()})).await;
    let events: Vec<Event> = (0..8)
        .map(|n| Event::new(format!("e{n}"), "shop", json!({"n": n})))
        .collect();
    producer.write(&events, true).await;
    wait_messages(&receiver, 8, Duration::from_secs(30)).await;
    producer.wait_rows(0, Duration::from_secs(10)).await;
    let scrape = reqwest::Client::new()
        .get(format!("http://{}/metrics", herald.addr))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text");
    assert!(
        scrape.contains("herald_relay_events_total{relay=\"shop\",outcome=\"published\"} 8"),
        "{scrape}"
    );
    assert!(
        scrape.contains("herald_relay_oldest_unrelayed_age_seconds{relay=\"shop\"}"),
        "{scrape}"
    );
}

/// A producer on Herald's own PostgreSQL: `herald_publish` inside its transaction.
#[tokio::test]
async fn herald_publish_in_the_producers_transaction_is_delivered_as_if_posted() {
    let Some(herald) = Herald::start_pg(
        "herald_publish_in_the_producers_transaction",
        &[("HERALD_MAX_PAYLOAD_BYTES", "4096")],
    )
    .await
    else {
        return;
    };
    let app = herald.post("/app", json!({"name": "Shop", "uid": "shop"})).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let receiver = Receiver::start(Reply::status(200)).await;
    let (_, secret) = herald
        .endpoint(
            &app,
            json!({"url": receiver.url(), "filterTypes": ["invoice.paid"], "ordering": "key"}),
        )
        .await;
    let url = herald.database.as_ref().expect("database").url.clone();
    let producer = sqlx::PgPool::connect(&url).await.expect("producer connects");
    sqlx::query("CREATE TABLE invoice (id TEXT PRIMARY KEY, status TEXT NOT NULL)")
        .execute(&producer)
        .await
        .expect("table");
    sqlx::query("INSERT INTO invoice VALUES ('inv_1', 'open'), ('inv_2', 'open')")
        .execute(&producer)
        .await
        .expect("rows");
    let pay = |invoice: &'static str, event_id: String, n: i64, commit: bool| {
        let producer = producer.clone();
        async move {
            let mut tx = producer.begin().await.expect("begin");
            sqlx::query("UPDATE invoice SET status = 'paid' WHERE id = $1")
                .bind(invoice)
                .execute(&mut *tx)
                .await
                .expect("update");
            sqlx::query("SELECT herald_publish('shop', 'invoice.paid', $1::jsonb, $2, NULL, $3)")
                .bind(json!({"invoice": invoice, "n": n}).to_string())
                .bind(event_id)
                .bind(invoice)
                .execute(&mut *tx)
                .await
                .expect("herald_publish");
            if commit {
                tx.commit().await.expect("commit");
            } else {
                tx.rollback().await.expect("rollback");
            }
        }
    };
    pay("inv_1", "pay_inv_1".into(), 0, true).await;
    pay("inv_2", "pay_inv_2".into(), 0, false).await;
    // The same event id again (a producer retrying): still one message.
    pay("inv_1", "pay_inv_1".into(), 0, true).await;
    // Filtered out by the endpoint's filterTypes, like a posted message.
    sqlx::query("SELECT herald_publish($1, 'invoice.voided', '{\"invoice\": \"inv_1\"}', 'void_inv_1')")
        .bind(&app)
        .execute(&producer)
        .await
        .expect("publish by app id");
    for n in 1..=20 {
        pay("inv_1", format!("inv_1_{n}"), n, true).await;
    }
    let got = wait_messages(&receiver, 21, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        distinct_messages(&receiver.received()),
        21,
        "one message per committed, subscribed event"
    );
    // Signed like any delivery, in commit order for the ordering key (a retried attempt repeats one).
    let verifier = standardwebhooks::Webhook::new(&secret).expect("secret");
    let mut last = -1;
    for r in &got {
        verifier.verify(&r.body, &r.headers).expect("signature verifies");
        let n = payload_of(r)["n"].as_i64().expect("n");
        assert!(n >= last, "ordering key: {n} after {last}");
        last = n;
    }
    let first = herald.get(&format!("/app/{app}/msg/pay_inv_1")).await;
    assert_eq!(first["eventId"], "pay_inv_1");
    assert_eq!(got[0].header("webhook-id"), first["id"].as_str().expect("id"));
    assert!(herald.call("GET", &format!("/app/{app}/msg/pay_inv_2"), None).await.0 == 404);
    let listed = messages(&herald, &app).await;
    assert_eq!(
        listed.len(),
        22,
        "21 delivered + 1 filtered out, nothing for the rollback or the repeat"
    );
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM herald_outbox")
        .fetch_one(&producer)
        .await
        .expect("count");
    assert_eq!(
        left, 0,
        "every row became a message and left the outbox in the same transaction"
    );
    // A call Herald would refuse fails the producer's own transaction instead of queueing a bad event.
    let refused = sqlx::query("SELECT herald_publish('no-such-app', 'invoice.paid', '{}', 'x')")
        .execute(&producer)
        .await
        .expect_err("unknown app");
    assert!(refused.to_string().contains("not found"), "{refused}");
    let refused = sqlx::query("SELECT herald_publish('shop', 'invoice.paid', '[1]', 'x')")
        .execute(&producer)
        .await
        .expect_err("not an object");
    assert!(refused.to_string().contains("JSON object"), "{refused}");
    // So is a payload over the node's max_payload_bytes, which the API answers with 413.
    let large = json!({ "text": "x".repeat(5000) });
    let (status, _) = herald
        .call(
            "POST",
            &format!("/app/{app}/msg"),
            Some(json!({"eventType": "invoice.paid", "payload": large})),
        )
        .await;
    assert_eq!(status, 413);
    let refused = sqlx::query("SELECT herald_publish('shop', 'invoice.paid', $1, 'large')")
        .bind(&large)
        .execute(&producer)
        .await
        .expect_err("over max_payload_bytes");
    assert!(refused.to_string().contains("max_payload_bytes (4096)"), "{refused}");
}

#[tokio::test]
async fn kill9_of_relays_and_herald_under_load_loses_and_duplicates_nothing() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let test = "kill9_of_relays_and_herald_under_load_loses_and_duplicates_nothing";
    let producer = Arc::new(match Producer::postgres(test).await {
        Some(producer) => producer,
        None => Producer::sqlite().await,
    });
    let (mut herald, app, receiver) = herald_with_endpoint(json!({})).await;
    let mut relays: Vec<RelayProcess> = (0..2)
        .map(|_| RelayProcess::start(&producer, &base(&herald), &["--batch-size", "20"]))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (producer, stop) = (producer.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut committed, mut rolled_back) = (Vec::new(), Vec::new());
            let mut n = 0;
            let mut tx_count = 0;
            // At least 150 committed rows, however slow the machine: the kills must land on real load.
            while !stop.load(Ordering::Relaxed) || committed.len() < 150 {
                tx_count += 1;
                let commit = tx_count % 7 != 0;
                let events: Vec<Event> = (0..1 + tx_count % 4)
                    .map(|_| {
                        n += 1;
                        Event::new(format!("load_{n}"), "shop", json!({"n": n}))
                    })
                    .collect();
                producer.write(&events, commit).await;
                let ids = events.into_iter().map(|e| e.event_id);
                if commit {
                    committed.extend(ids);
                } else {
                    rolled_back.extend(ids);
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            (committed, rolled_back)
        })
    };
    for round in 0..8 {
        tokio::time::sleep(Duration::from_millis(rand::random_range(100..600))).await;
        match rand::random_range(0..3) {
            2 => {
                herald.kill9();
                tokio::time::sleep(Duration::from_millis(rand::random_range(0..300))).await;
                herald.restart().await;
            }
            which => relays[which].restart(),
        }
        assert!(herald.is_running(), "round {round}: Herald runs");
    }
    stop.store(true, Ordering::Relaxed);
    let (committed, rolled_back) = writer.await.expect("writer");
    producer.wait_rows(0, Duration::from_secs(90)).await;
    for relay in &mut relays {
        assert!(relay.is_running(), "a relay exited by itself");
    }

    // The checker: every committed row is exactly one message, delivered; no rolled-back row is anything.
    let listed = messages(&herald, &app).await;
    check_one_message_per_row(&listed, &committed, &rolled_back);
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let delivered: HashSet<String> = receiver
            .received()
            .iter()
            .filter(|r| r.status == 200)
            .map(|r| r.header("webhook-id").to_owned())
            .collect();
        if delivered.len() == committed.len() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {} messages delivered",
            delivered.len(),
            committed.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let delivered_events: HashSet<i64> = receiver
        .received()
        .iter()
        .map(|r| payload_of(r)["n"].as_i64().expect("n"))
        .collect();
    assert_eq!(
        delivered_events.len(),
        committed.len(),
        "every committed row reached the receiver"
    );
    assert!(committed.len() >= 150, "the load was real: {} rows", committed.len());
}

/// Each key's rows in the order Herald created their messages (message ids are time-ordered), from event
/// ids `{key}:{n}`.
fn created_order_per_key(listed: &[(String, String)]) -> HashMap<String, Vec<i64>> {
    let mut per_key: HashMap<String, Vec<i64>> = HashMap::new();
    for (event_id, _) in listed {
        let (key, n) = event_id.split_once(':').expect("event id `key:n`");
        per_key.entry(key.to_owned()).or_default().push(n.parse().expect("n"));
    }
    per_key
}

/// Every committed row is exactly one message, and no rolled-back row is any.
fn check_one_message_per_row(listed: &[(String, String)], committed: &[String], rolled_back: &[String]) {
    let mut per_event: HashMap<&str, usize> = HashMap::new();
    for (event_id, _) in listed {
        *per_event.entry(event_id.as_str()).or_default() += 1;
    }
    for event_id in committed {
        assert_eq!(per_event.get(event_id.as_str()), Some(&1), "{event_id}: one message");
    }
    for event_id in rolled_back {
        assert!(!per_event.contains_key(event_id.as_str()), "{event_id} was rolled back");
    }
    assert_eq!(listed.len(), committed.len(), "no message that is not a committed row");
}

/// [`check_one_message_per_row`], and each key's messages were created in outbox order.
fn check_one_message_per_row_in_order(listed: &[(String, String)], committed: &[String], rolled_back: &[String]) {
    check_one_message_per_row(listed, committed, rolled_back);
    for (key, created) in created_order_per_key(listed) {
        assert!(
            created.windows(2).all(|w| w[0] < w[1]),
            "key {key}: messages created out of outbox order: {created:?}"
        );
    }
}

const KEYS: [&str; 5] = ["inv_a", "inv_b", "inv_c", "inv_d", "inv_e"];

/// One relay works on two batches at once on PostgreSQL and MariaDB (one on SQLite). Killed with `kill -9`
/// over and over while a producer commits bursts of keyed rows, it still loses nothing, makes one message
/// per row, and creates each key's messages in outbox order.
#[tokio::test]
async fn kill9_of_a_relay_mid_batch_keeps_each_keys_order_with_one_message_per_row() {
    for producer in Producer::all("kill9_of_a_relay_mid_batch_keeps_each_keys_order").await {
        let (herald, app, _receiver) = herald_with_endpoint(json!({"ordering": "key"})).await;
        let mut relay = RelayProcess::start(&producer, &base(&herald), &["--batch-size", "10", "--concurrency", "6"]);
        let (mut committed, mut rolled_back) = (Vec::new(), Vec::new());
        let mut n = 0;
        for round in 0..40 {
            let commit = round % 9 != 4;
            let events: Vec<Event> = (0..1 + round % 13)
                .map(|i| {
                    n += 1;
                    let key = KEYS[(i + round) % KEYS.len()];
                    Event::new(format!("{key}:{n}"), "shop", json!({"n": n})).keyed(key)
                })
                .collect();
            producer.write(&events, commit).await;
            let ids = events.into_iter().map(|e| e.event_id);
            if commit {
                committed.extend(ids);
            } else {
                rolled_back.extend(ids);
            }
            if round % 8 == 7 {
                tokio::time::sleep(Duration::from_millis(rand::random_range(0..80))).await;
                relay.restart();
            }
        }
        producer.wait_rows(0, Duration::from_secs(90)).await;
        assert!(relay.is_running(), "{}: the relay exited by itself", producer.dialect);
        let listed = messages(&herald, &app).await;
        check_one_message_per_row_in_order(&listed, &committed, &rolled_back);
    }
}

/// `herald_publish` rows committed in bursts while Herald, reading its own outbox with two rounds in
/// flight, is killed with `kill -9` at random moments and restarted: every committed row is one message,
/// created in outbox order per key, and reaches the receiver; no rolled-back row is anything.
#[tokio::test]
async fn kill9_of_herald_reading_its_own_outbox_loses_and_duplicates_nothing() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    // A restarted node first takes its killed predecessor's partitions over (the 4 s lease of the tests):
    // a long second delay widens the deliveries' window so that none dies of old age unsent meanwhile.
    let retries = [("HERALD_RETRY_SCHEDULE", "100ms,30s")];
    let Some(mut herald) = Herald::start_pg("kill9_of_herald_reading_its_own_outbox", &retries).await else {
        return;
    };
    let app = herald.post("/app", json!({"name": "Shop", "uid": "shop"})).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let receiver = Receiver::start(Reply::status(200)).await;
    herald.endpoint(&app, json!({"url": receiver.url()})).await;
    let url = herald.database.as_ref().expect("database").url.clone();
    let producer = sqlx::PgPool::connect(&url).await.expect("producer connects");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (producer, stop) = (producer.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut committed, mut rolled_back) = (Vec::new(), Vec::new());
            let (mut n, mut tx_count) = (0, 0);
            // Bursts (up to 30 rows a transaction), so that the kills land on rounds in flight.
            while !stop.load(Ordering::Relaxed) || committed.len() < 600 {
                tx_count += 1;
                let commit = tx_count % 7 != 0;
                let mut tx = producer.begin().await.expect("begin");
                let mut ids = Vec::new();
                for i in 0..1 + tx_count % 30 {
                    n += 1;
                    let key = KEYS[(i + tx_count) % KEYS.len()];
                    let event_id = format!("{key}:{n}");
                    sqlx::query("SELECT herald_publish('shop', 'invoice.paid', $1::jsonb, $2, NULL, $3)")
                        .bind(json!({"n": n}).to_string())
                        .bind(&event_id)
                        .bind(key)
                        .execute(&mut *tx)
                        .await
                        .expect("herald_publish");
                    ids.push(event_id);
                }
                if commit {
                    tx.commit().await.expect("commit");
                    committed.extend(ids);
                } else {
                    tx.rollback().await.expect("rollback");
                    rolled_back.extend(ids);
                }
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            (committed, rolled_back)
        })
    };
    for round in 0..5 {
        tokio::time::sleep(Duration::from_millis(rand::random_range(100..700))).await;
        herald.kill9();
        tokio::time::sleep(Duration::from_millis(rand::random_range(0..300))).await;
        herald.restart().await;
        assert!(herald.is_running(), "round {round}: Herald runs");
    }
    stop.store(true, Ordering::Relaxed);
    let (committed, rolled_back) = writer.await.expect("writer");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM herald_outbox")
            .fetch_one(&producer)
            .await
            .expect("count");
        if left == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{left} rows still in herald_outbox after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let listed = messages(&herald, &app).await;
    check_one_message_per_row_in_order(&listed, &committed, &rolled_back);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let got: HashSet<String> = receiver
            .received()
            .iter()
            .map(|r| r.header("webhook-id").to_owned())
            .collect();
        let missing: Vec<&str> = listed
            .iter()
            .map(|(_, id)| id.as_str())
            .filter(|id| !got.contains(*id))
            .collect();
        if missing.is_empty() {
            break;
        }
        if std::time::Instant::now() >= deadline {
            // What the store holds for them, to tell a lost delivery from a slow one.
            let rows: Vec<(String, i32, i64, i64, i64)> = sqlx::query_as(
                "SELECT message_id, partition, status, attempts, next_attempt_at FROM delivery \
                 WHERE message_id = ANY($1)",
            )
            .bind(&missing)
            .fetch_all(&producer)
            .await
            .expect("deliveries");
            panic!(
                "{} of {} messages never reached the receiver within 120 s: {missing:?}; their deliveries \
                 (message, partition, status, attempts, next_attempt_at): {rows:?}",
                missing.len(),
                listed.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// examples/outbox-invoice (Python, psycopg) against a real Herald: through `herald_publish` on Herald's
/// own PostgreSQL, and through its own outbox table and `herald relay`.
#[tokio::test]
async fn the_invoice_example_publishes_in_its_transaction() {
    let Some(herald) = Herald::start_pg("the_invoice_example_publishes_in_its_transaction", &[]).await else {
        return;
    };
    // scripts/test installs psycopg into target/outbox-example-venv (HERALD_TEST_EXAMPLE_PYTHON).
    let python = std::env::var("HERALD_TEST_EXAMPLE_PYTHON").unwrap_or_else(|_| {
        let venv = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../target/outbox-example-venv/bin/python"
        );
        if std::path::Path::new(venv).exists() {
            venv.to_owned()
        } else {
            "python3".to_owned()
        }
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/outbox-invoice/billing.py");
    let app = herald.post("/app", json!({"name": "Acme", "uid": "acme"})).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let receiver = Receiver::start(Reply::status(200)).await;
    herald.endpoint(&app, json!({"url": receiver.url()})).await;
    let herald_db = herald.database.as_ref().expect("database").url.clone();
    let shop = Producer::postgres("the invoice example's own database")
        .await
        .expect("PostgreSQL");
    let billing = |database: &str, args: &[&str]| {
        let output = std::process::Command::new(&python)
            .arg(script)
            .args(["--database", database, "--app", "acme"])
            .args(args)
            .output()
            .expect("run billing.py (its Python needs psycopg: examples/outbox-invoice/requirements.txt)");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr),
        )
    };
    for database in [herald_db.as_str(), shop.url.as_str()] {
        let (code, out) = billing(database, &["init"]);
        assert_eq!(code, Some(0), "{out}");
    }
    // On Herald's database: herald_publish.
    assert_eq!(billing(&herald_db, &["pay", "inv_1"]).0, Some(0));
    let (code, out) = billing(&herald_db, &["pay", "inv_2", "--decline"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("card declined"), "{out}");
    // Paying again is refused by the service (the invoice is no longer open): still one event.
    assert_eq!(billing(&herald_db, &["pay", "inv_1"]).0, Some(1));
    // On its own database: the outbox table and the relay.
    assert_eq!(billing(&shop.url, &["--outbox", "table", "pay", "inv_3"]).0, Some(0));
    assert_eq!(
        billing(&shop.url, &["--outbox", "table", "pay", "inv_4", "--decline"]).0,
        Some(1)
    );
    let _relay = RelayProcess::start(&shop, &base(&herald), &[]);

    wait_messages(&receiver, 2, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = receiver.received();
    assert_eq!(distinct_messages(&got), 2, "only the committed payments");
    let invoices: HashSet<String> = got
        .iter()
        .map(|r| payload_of(r)["invoice"].as_str().expect("invoice").to_owned())
        .collect();
    assert_eq!(invoices, HashSet::from(["inv_1".to_owned(), "inv_3".to_owned()]));
    let message = herald.get(&format!("/app/{app}/msg/invoice.paid:inv_1")).await;
    assert_eq!(message["payload"]["amount"], 100);
    // The declined payment's update was rolled back with its event.
    let status: String = sqlx::query_scalar("SELECT status FROM invoice WHERE id = 'inv_4'")
        .fetch_one(&shop.pool)
        .await
        .expect("inv_4");
    assert_eq!(status, "open");
}
