//! Operators' tools end to end, through the real binary to real receivers on loopback: recover after an
//! outage, replay-missing for a late endpoint, resend, cancel, expunge, dead-letter and delivery listings,
//! attempt filters, stats, and the reconciliation listing while messages keep arriving.

use crate::common;

use std::collections::HashSet;
use std::future::Future;
use std::time::{Duration, Instant};

use common::{Herald, Receiver, Reply};
use futures::StreamExt;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

/// Retry quickly and never open the breaker, so a down receiver turns deliveries dead within a second.
const FAST_DEATH: [(&str, &str); 2] = [("HERALD_RETRY_SCHEDULE", "50ms"), ("HERALD_BREAKER_THRESHOLD", "1000")];

async fn send(herald: &Herald, app: &str, event_type: &str, n: usize) -> String {
    herald
        .post(
            &format!("/app/{app}/msg"),
            json!({"eventType": event_type, "payload": {"n": n}}),
        )
        .await["id"]
        .as_str()
        .expect("id")
        .to_owned()
}

async fn wait_until<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The deliveries of an endpoint in one state.
async fn deliveries(herald: &Herald, app: &str, ep: &str, state: &str) -> Vec<Value> {
    herald
        .get(&format!(
            "/app/{app}/endpoint/{ep}/msg?deliveryStatus={state}&limit=250"
        ))
        .await["data"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

async fn wait_for_state(herald: &Herald, app: &str, ep: &str, state: &str, n: usize) -> Vec<Value> {
    wait_until(&format!("{n} {state} deliveries"), || async {
        let found = deliveries(herald, app, ep, state).await;
        (found.len() == n).then_some(found)
    })
    .await
}

/// Wait for a background task to finish; returns it.
async fn finished(herald: &Herald, task: &Value) -> Value {
    let id = task["id"].as_str().expect("task id").to_owned();
    wait_until("the task to finish", || async {
        let t = herald.get(&format!("/background-task/{id}")).await;
        (t["status"] != "running").then_some(t)
    })
    .await
}

fn ids_of(receiver: &Receiver) -> Vec<String> {
    receiver
        .received()
        .iter()
        .filter(|r| r.status == 200)
        .map(|r| r.header("webhook-id").to_owned())
        .collect()
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .expect("format")
}

#[tokio::test]
async fn recover_after_an_outage_delivers_exactly_the_missing_ones_once() {
    let herald = Herald::start(&FAST_DEATH).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let app = herald.app("shop").await;
    let (ep, _) = herald.endpoint(&app, json!({"url": receiver.url()})).await;
    let since = now_rfc3339();
    let before: Vec<String> = {
        let mut ids = Vec::new();
        for n in 0..3 {
            ids.push(send(&herald, &app, "a.b", n).await);
        }
        ids
    };
    receiver.wait_for(3, WAIT).await;
    // The outage: every attempt fails until the deliveries are dead.
    receiver.set_fallback(Reply::status(503));
    let mut lost = Vec::new();
    for n in 3..8 {
        lost.push(send(&herald, &app, "a.b", n).await);
    }
    let dead = wait_for_state(&herald, &app, &ep, "dead", 5).await;
    assert!(
        dead.iter().all(|d| d["lastAttempt"]["outcome"] == "server_error"),
        "dead letters show their last outcome: {dead:?}"
    );
    let app_dead = herald.get(&format!("/app/{app}/delivery?deliveryStatus=dead")).await;
    assert_eq!(app_dead["data"].as_array().unwrap().len(), 5);

    receiver.set_fallback(Reply::status(200));
    let seen_before = receiver.received().len();
    let task = herald
        .post(&format!("/app/{app}/endpoint/{ep}/recover"), json!({ "since": since }))
        .await;
    assert_eq!(task["task"], "endpoint.recover");
    let task = finished(&herald, &task).await;
    assert_eq!(task["status"], "finished", "{task}");
    assert_eq!(
        (task["processed"].as_u64(), task["total"].as_u64()),
        (Some(5), Some(5)),
        "{task}"
    );
    assert_eq!(task["data"]["queued"], 5, "{task}");
    wait_for_state(&herald, &app, &ep, "delivered", 8).await;
    let recovered: Vec<String> = ids_of(&receiver)[3..].to_vec();
    let mut expected = lost.clone();
    expected.sort();
    let mut got = recovered.clone();
    got.sort();
    assert_eq!(got, expected, "exactly the lost messages, once each");
    assert!(
        before.iter().all(|id| !recovered.contains(id)),
        "delivered ones are not resent"
    );
    let attempts = herald.attempts(&app, &lost[0]).await;
    let last = attempts.last().unwrap();
    assert_eq!(last["trigger"], "recover", "{last}");
    assert_eq!(last["triggerType"], 1, "a recover reads as manual to Svix clients");

    // Running it again finds nothing to do.
    let again = herald
        .post(&format!("/app/{app}/endpoint/{ep}/recover"), json!({ "since": since }))
        .await;
    let again = finished(&herald, &again).await;
    assert_eq!(again["data"]["queued"], 0, "{again}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(receiver.received().len(), seen_before + 5, "nothing delivered twice");
}

#[tokio::test]
async fn replay_missing_sends_a_late_endpoint_what_it_subscribes_to() {
    let herald = Herald::start(&[]).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let app = herald.app("shop").await;
    let since = now_rfc3339();
    let mut wanted = Vec::new();
    for n in 0..4 {
        wanted.push(send(&herald, &app, "order.paid", n).await);
    }
    send(&herald, &app, "other.thing", 99).await;
    let (ep, _) = herald
        .endpoint(&app, json!({"url": receiver.url(), "filterTypes": ["order.paid"]}))
        .await;
    let task = herald
        .post(
            &format!("/app/{app}/endpoint/{ep}/replay-missing"),
            json!({ "since": since }),
        )
        .await;
    assert_eq!(task["task"], "endpoint.replay");
    let task = finished(&herald, &task).await;
    assert_eq!(task["data"]["queued"], 4, "{task}");
    assert_eq!(
        task["processed"], 5,
        "every message of the window was looked at: {task}"
    );
    receiver.wait_for(4, WAIT).await;
    let mut got = ids_of(&receiver);
    got.sort();
    wanted.sort();
    assert_eq!(got, wanted);
    // A second run adds nothing.
    let again = herald
        .post(
            &format!("/app/{app}/endpoint/{ep}/replay-missing"),
            json!({ "since": since }),
        )
        .await;
    assert_eq!(finished(&herald, &again).await["data"]["queued"], 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(receiver.received().len(), 4);
}

#[tokio::test]
async fn resend_sends_again_with_the_same_id_as_a_manual_attempt() {
    let herald = Herald::start(&[]).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let app = herald.app("shop").await;
    let (ep, _) = herald.endpoint(&app, json!({"url": receiver.url()})).await;
    let msg = send(&herald, &app, "a.b", 1).await;
    receiver.wait_for(1, WAIT).await;
    wait_for_state(&herald, &app, &ep, "delivered", 1).await;
    let (status, body) = herald
        .call("POST", &format!("/app/{app}/msg/{msg}/endpoint/{ep}/resend"), None)
        .await;
    assert_eq!(status, 202, "{body}");
    let got = receiver.wait_for(2, WAIT).await;
    assert_eq!(got[1].header("webhook-id"), msg);
    let attempts = herald.wait_attempts(&app, &msg, WAIT, |a| a.len() == 2).await;
    assert_eq!(attempts[1]["triggerType"], 1, "{attempts:?}");
    assert_eq!(attempts[1]["trigger"], "manual");

    // A pending delivery cannot be resent (it is on its way); an unknown pair is 404.
    herald
        .call(
            "PATCH",
            &format!("/app/{app}/endpoint/{ep}"),
            Some(json!({"disabled": true})),
        )
        .await;
    let pending = send(&herald, &app, "a.b", 2).await;
    let (status, error) = herald
        .call("POST", &format!("/app/{app}/msg/{pending}/endpoint/{ep}/resend"), None)
        .await;
    assert_eq!(status, 409, "{error}");
    assert_eq!(error["code"], "conflict");
    let (status, _) = herald
        .call("POST", &format!("/app/{app}/msg/msg_nope/endpoint/{ep}/resend"), None)
        .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn cancelled_deliveries_are_never_sent() {
    let herald = Herald::start(&[]).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let app = herald.app("shop").await;
    let (ep, _) = herald
        .endpoint(&app, json!({"url": receiver.url(), "disabled": true}))
        .await;
    let first = send(&herald, &app, "a.b", 1).await;
    for n in 2..=3 {
        send(&herald, &app, "a.b", n).await;
    }
    let one = herald.post(&format!("/app/{app}/msg/{first}/cancel"), json!({})).await;
    assert_eq!(one["cancelled"], 1);
    let rest = herald
        .post(&format!("/app/{app}/endpoint/{ep}/cancel"), json!({}))
        .await;
    assert_eq!(rest["cancelled"], 2);
    herald
        .call(
            "PATCH",
            &format!("/app/{app}/endpoint/{ep}"),
            Some(json!({"disabled": false})),
        )
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(receiver.received().is_empty(), "a cancelled delivery went out");
    assert_eq!(deliveries(&herald, &app, &ep, "cancelled").await.len(), 3);
    let stats = herald.get(&format!("/app/{app}/endpoint/{ep}/stats")).await;
    assert_eq!(stats["canceled"], 3, "{stats}");
    assert_eq!(stats["cancelled"], 3, "{stats}");
    assert_eq!(stats["pending"], 0, "{stats}");
}

/// A resend commits its delivery outside the ingest path and announces it to the engine afterwards; a
/// message posted to the same endpoint meanwhile may reach the engine first. The resend must still be
/// sent (it was once left in the store until the next restart: the endpoint's queue had moved past it).
#[tokio::test]
async fn resends_racing_new_messages_to_the_same_endpoint_are_all_sent() {
    const RESENT: usize = 40;
    const NEW: usize = 200;
    let herald = Herald::start(&[]).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let app = herald.app("shop").await;
    let (ep, _) = herald.endpoint(&app, json!({"url": receiver.url()})).await;
    let mut first = Vec::new();
    for n in 0..RESENT {
        first.push(send(&herald, &app, "a.b", n).await);
    }
    receiver.wait_for(RESENT, WAIT).await;
    wait_for_state(&herald, &app, &ep, "delivered", RESENT).await;

    let resends = async {
        for msg in &first {
            let (status, body) = herald
                .call("POST", &format!("/app/{app}/msg/{msg}/endpoint/{ep}/resend"), None)
                .await;
            assert_eq!(status, 202, "{body}");
        }
    };
    let news = futures::stream::iter(0..NEW).for_each_concurrent(8, |n| {
        let (herald, app) = (&herald, &app);
        async move {
            send(herald, app, "a.b", RESENT + n).await;
        }
    });
    futures::join!(resends, news);

    receiver.wait_for(2 * RESENT + NEW, Duration::from_secs(60)).await;
    let got = ids_of(&receiver);
    for msg in &first {
        let times = got.iter().filter(|id| *id == msg).count();
        assert_eq!(times, 2, "{msg} was sent {times} times, not once and once resent");
    }
}

#[tokio::test]
async fn expunged_content_is_gone_but_metadata_and_attempts_stay() {
    let herald = Herald::start(&[]).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let app = herald.app("shop").await;
    let (ep, _) = herald.endpoint(&app, json!({"url": receiver.url()})).await;
    let msg = herald
        .post(
            &format!("/app/{app}/msg"),
            json!({"eventType": "a.b", "eventId": "evt-9", "payload": {"card": "4242"}}),
        )
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    receiver.wait_for(1, WAIT).await;
    herald.wait_attempts(&app, &msg, WAIT, |a| a.len() == 1).await;
    let (status, _) = herald
        .call("DELETE", &format!("/app/{app}/msg/{msg}/content"), None)
        .await;
    assert_eq!(status, 204);
    let read = herald.get(&format!("/app/{app}/msg/{msg}")).await;
    assert_eq!(read["payload"], json!({}));
    assert_eq!(read["eventId"], "evt-9", "metadata stays");
    assert_eq!(herald.attempts(&app, &msg).await.len(), 1, "attempts stay");
    let (status, error) = herald
        .call("POST", &format!("/app/{app}/msg/{msg}/endpoint/{ep}/resend"), None)
        .await;
    assert_eq!(status, 409, "nothing to resend: {error}");
}

#[tokio::test]
async fn attempt_listings_filter_by_status_class_type_and_time() {
    let herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", "50ms")]).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    receiver.rule("\"fail\":true", Reply::status(500));
    let app = herald.app("shop").await;
    let (ep, _) = herald.endpoint(&app, json!({"url": receiver.url()})).await;
    herald
        .post(
            &format!("/app/{app}/msg"),
            json!({"eventType": "good.one", "payload": {"fail": false}}),
        )
        .await;
    herald
        .post(
            &format!("/app/{app}/msg"),
            json!({"eventType": "bad.one", "payload": {"fail": true}}),
        )
        .await;
    // One success, two failures (the bad one is tried twice).
    receiver.wait_for(3, WAIT).await;
    let list = |query: &'static str| {
        let herald = &herald;
        let path = format!("/app/{app}/attempt/endpoint/{ep}?{query}");
        async move { herald.get(&path).await["data"].as_array().cloned().unwrap_or_default() }
    };
    wait_until("three attempts recorded", || async {
        (list("").await.len() == 3).then_some(())
    })
    .await;
    assert_eq!(list("status=0").await.len(), 1);
    assert_eq!(list("status=2").await.len(), 2);
    assert_eq!(list("status_code_class=500").await.len(), 2);
    assert_eq!(list("status_code_class=200").await.len(), 1);
    assert_eq!(list("status_code_class=0").await.len(), 0);
    assert_eq!(list("event_types=bad.one").await.len(), 2);
    assert_eq!(list("before=2000-01-01T00:00:00Z").await.len(), 0);
    assert_eq!(list("after=2000-01-01T00:00:00Z").await.len(), 3);
    let (status, error) = herald
        .call(
            "GET",
            &format!("/app/{app}/attempt/endpoint/{ep}?status_code_class=250"),
            None,
        )
        .await;
    assert_eq!(status, 422, "{error}");
    let stats = herald.get(&format!("/app/{app}/endpoint/{ep}/stats")).await;
    assert_eq!(
        (stats["success"].as_u64(), stats["fail"].as_u64()),
        (Some(1), Some(1)),
        "{stats}"
    );
}

#[tokio::test]
async fn the_event_listing_returns_every_message_once_in_order_while_new_ones_arrive() {
    let herald = Herald::start(&[]).await;
    let app = herald.app("shop").await;
    let since = now_rfc3339();
    let mut created = Vec::new();
    for n in 0..25 {
        created.push(send(&herald, &app, "a.b", n).await);
    }
    let mut seen: Vec<String> = Vec::new();
    let mut iterator: Option<String> = None;
    let mut writer_n = 100;
    loop {
        // New messages keep arriving between pages.
        if writer_n < 110 {
            created.push(send(&herald, &app, "a.b", writer_n).await);
            writer_n += 1;
        }
        let mut path = format!("/app/{app}/events?since={since}&limit=7");
        if let Some(it) = &iterator {
            path.push_str(&format!("&iterator={it}"));
        }
        let page = herald.get(&path).await;
        let data = page["data"].as_array().cloned().unwrap_or_default();
        seen.extend(data.iter().map(|m| m["id"].as_str().unwrap().to_owned()));
        iterator = page["iterator"].as_str().map(str::to_owned);
        if page["done"] == true && writer_n >= 110 {
            break;
        }
    }
    assert_eq!(seen, created, "every message exactly once, oldest first");
    // Polling from the end returns nothing and keeps the position; a new message then shows up.
    let it = iterator.expect("an iterator");
    let empty = herald.get(&format!("/app/{app}/events?iterator={it}")).await;
    assert_eq!(empty["data"].as_array().unwrap().len(), 0);
    assert_eq!(empty["iterator"], it.as_str());
    let newest = send(&herald, &app, "a.b", 999).await;
    let next = herald.get(&format!("/app/{app}/events?iterator={it}")).await;
    assert_eq!(next["data"][0]["id"], newest.as_str());
    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len());
}

#[tokio::test]
async fn a_delivery_cancelled_while_waiting_for_its_retry_is_not_retried() {
    let herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", "1s,1s")]).await;
    let receiver = Receiver::start(Reply::status(500)).await;
    let app = herald.app("shop").await;
    herald.endpoint(&app, json!({"url": receiver.url()})).await;
    let msg = send(&herald, &app, "a.b", 1).await;
    receiver.wait_for(1, WAIT).await;
    // The first attempt failed: the delivery now sits on its retry timer in the engine.
    herald.wait_attempts(&app, &msg, WAIT, |a| a.len() == 1).await;
    let cancelled = herald.post(&format!("/app/{app}/msg/{msg}/cancel"), json!({})).await;
    assert_eq!(cancelled["cancelled"], 1);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        receiver.received().len(),
        1,
        "the retry of a cancelled delivery went out"
    );
    let state = herald.get(&format!("/app/{app}/msg/{msg}/endpoint")).await;
    assert_eq!(state["data"][0]["deliveryStatus"], "cancelled");
}

/// Per message id, how many requests the receiver got.
fn sends(receiver: &Receiver) -> std::collections::HashMap<String, usize> {
    receiver.per_message().into_iter().map(|(id, (n, _))| (id, n)).collect()
}

async fn bulk_replay(herald: &Herald, app: &str, ep: &str, body: Value) -> Value {
    let task = herald
        .post(&format!("/app/{app}/endpoint/{ep}/bulk-replay"), body)
        .await;
    assert_eq!(task["task"], "endpoint.bulk-replay", "{task}");
    let task = finished(herald, &task).await;
    assert_eq!(task["status"], "finished", "{task}");
    task
}

#[tokio::test]
async fn bulk_replay_sends_again_exactly_the_messages_its_filters_match() {
    let herald = Herald::start(&FAST_DEATH).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    // A content rejection: the delivery fails for good on its first attempt.
    receiver.rule("\"refuse\"", Reply::status(400));
    let app = herald.app("shop").await;
    let (ep, _) = herald.endpoint(&app, json!({"url": receiver.url()})).await;
    let since = now_rfc3339();
    let post = |body: Value| {
        let (herald, app) = (&herald, app.clone());
        async move {
            herald.post(&format!("/app/{app}/msg"), body).await["id"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    let delivered = post(json!({"eventType": "a.b", "payload": {"n": 1}})).await;
    let failed = post(json!({"eventType": "a.b", "payload": {"refuse": true}})).await;
    let other_type = post(json!({"eventType": "c.d", "payload": {"n": 3}})).await;
    let on_channel = post(json!({"eventType": "a.b", "channels": ["eu"], "payload": {"n": 4}})).await;
    wait_for_state(&herald, &app, &ep, "delivered", 3).await;
    wait_for_state(&herald, &app, &ep, "failed", 1).await;
    let once: std::collections::HashMap<String, usize> = [&delivered, &failed, &other_type, &on_channel]
        .iter()
        .map(|id| ((*id).clone(), 1))
        .collect();
    assert_eq!(sends(&receiver), once);

    // The successes of one event type: two messages, each sent once more, nothing else.
    let task = bulk_replay(
        &herald,
        &app,
        &ep,
        json!({"since": since, "eventTypes": ["a.b"], "status": 0}),
    )
    .await;
    assert_eq!(task["data"]["messagesSent"], 2, "{task}");
    assert_eq!(task["processed"], 2, "{task}");
    wait_for_state(&herald, &app, &ep, "delivered", 3).await;
    receiver.wait_for(6, WAIT).await;
    let mut expected = once.clone();
    expected.insert(delivered.clone(), 2);
    expected.insert(on_channel.clone(), 2);
    assert_eq!(sends(&receiver), expected);
    let attempts = herald.attempts(&app, &delivered).await;
    assert!(
        attempts.iter().any(|a| a["triggerType"] == 1),
        "a replay is a manual attempt: {attempts:?}"
    );

    // What got a 4xx, and what is on a channel.
    let task = bulk_replay(&herald, &app, &ep, json!({"since": since, "statusCodeClass": 400})).await;
    assert_eq!(task["data"]["messagesSent"], 1, "{task}");
    wait_for_state(&herald, &app, &ep, "failed", 1).await;
    let task = bulk_replay(&herald, &app, &ep, json!({"since": since, "channel": "eu"})).await;
    assert_eq!(task["data"]["messagesSent"], 1, "{task}");
    receiver.wait_for(8, WAIT).await;
    expected.insert(failed.clone(), 2);
    expected.insert(on_channel.clone(), 3);
    wait_until("the channel's replay to be attempted", || async {
        (sends(&receiver) == expected).then_some(())
    })
    .await;

    // Pending is never replayed, and a window after every message takes nothing.
    let task = bulk_replay(&herald, &app, &ep, json!({"since": since, "status": 1})).await;
    assert_eq!(task["data"]["messagesSent"], 0, "{task}");
    let task = bulk_replay(&herald, &app, &ep, json!({"since": now_rfc3339()})).await;
    assert_eq!(task["data"]["messagesSent"], 0, "{task}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sends(&receiver), expected, "nothing more was sent");

    for (body, field) in [
        (json!({"since": since, "status": 7}), "status"),
        (json!({"since": since, "statusCodeClass": 250}), "statusCodeClass"),
        (json!({"since": since, "eventTypes": ["not a name"]}), "eventTypes"),
    ] {
        let (status, error) = herald
            .call("POST", &format!("/app/{app}/endpoint/{ep}/bulk-replay"), Some(body))
            .await;
        assert_eq!(status, 422, "{error}");
        assert_eq!(error["detail"][0]["loc"][1], field, "{error}");
    }
}

#[tokio::test]
async fn a_bulk_replay_interrupted_by_kill_9_is_carried_on_at_the_next_start() {
    const MESSAGES: usize = 1_200;
    let mut herald = Herald::start(&[]).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let app = herald.app("shop").await;
    let (ep, _) = herald.endpoint(&app, json!({"url": receiver.url()})).await;
    let since = now_rfc3339();
    let matching: Vec<String> = futures::stream::iter(0..MESSAGES)
        .map(|n| send(&herald, &app, "a.b", n))
        .buffer_unordered(16)
        .collect()
        .await;
    let other = send(&herald, &app, "c.d", 0).await;
    wait_for_state(&herald, &app, &ep, "pending", 0).await;
    receiver.wait_for(MESSAGES + 1, Duration::from_secs(120)).await;
    wait_until("every delivery to be recorded", || async {
        let page = herald.get(&format!("/app/{app}/endpoint/{ep}/stats")).await;
        (page["success"] == MESSAGES + 1).then_some(())
    })
    .await;

    let task = herald
        .post(
            &format!("/app/{app}/endpoint/{ep}/bulk-replay"),
            json!({"since": since, "eventTypes": ["a.b"]}),
        )
        .await;
    assert_eq!(task["status"], "running", "{task}");
    // No shutdown path: the task stops wherever its chunks were.
    herald.kill9();
    herald.restart().await;
    let id = task["id"].as_str().unwrap().to_owned();
    // On PostgreSQL, shared by nodes, a task is taken up once it has been idle a minute.
    let deadline = Instant::now() + Duration::from_secs(150);
    let task = loop {
        let t = herald.get(&format!("/background-task/{id}")).await;
        if t["status"] != "running" {
            break t;
        }
        assert!(Instant::now() < deadline, "the task was not carried on: {t}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(task["status"], "finished", "{task}");
    wait_until("every replay to arrive", || async {
        let counts = sends(&receiver);
        matching
            .iter()
            .all(|m| counts.get(m).copied().unwrap_or(0) >= 2)
            .then_some(())
    })
    .await;
    let counts = sends(&receiver);
    assert_eq!(
        counts.get(&other),
        Some(&1),
        "a message outside the filter is not replayed"
    );
    assert_eq!(counts.len(), MESSAGES + 1);
}

#[tokio::test]
async fn expunging_every_payload_of_an_app_cancels_what_is_pending_and_an_attempts_response_can_go() {
    let herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", "1h")]).await;
    let receiver = Receiver::start(Reply::status(200).body("session=s3cret")).await;
    let down = Receiver::start(Reply::status(503)).await;
    let app = herald.app("shop").await;
    let other_app = herald.app("other").await;
    herald.endpoint(&app, json!({"url": receiver.url()})).await;
    let (ep_down, _) = herald.endpoint(&app, json!({"url": down.url()})).await;
    herald.endpoint(&other_app, json!({"url": receiver.url()})).await;
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(send(&herald, &app, "a.b", n).await);
    }
    let kept = send(&herald, &other_app, "a.b", 9).await;
    receiver.wait_for(4, WAIT).await;
    down.wait_for(3, WAIT).await;
    // The down endpoint's deliveries wait an hour for their retry.
    wait_for_state(&herald, &app, &ep_down, "pending", 3).await;

    let task = herald
        .post(&format!("/app/{app}/msg/expunge-all-contents"), json!({}))
        .await;
    assert_eq!(task["task"], "application.purge_content", "{task}");
    let task = finished(&herald, &task).await;
    assert_eq!(task["status"], "finished", "{task}");
    assert_eq!(task["data"]["messagesPurged"], 3, "{task}");
    for id in &ids {
        let read = herald.get(&format!("/app/{app}/msg/{id}")).await;
        assert_eq!(read["payload"], json!({}), "{read}");
    }
    let read = herald.get(&format!("/app/{other_app}/msg/{kept}")).await;
    assert_eq!(read["payload"], json!({"n": 9}), "another application's payloads stay");
    wait_for_state(&herald, &app, &ep_down, "cancelled", 3).await;

    // An attempt's stored response: gone, the attempt stays.
    let attempts = herald
        .wait_attempts(&app, &ids[0], WAIT, |a| {
            a.iter().any(|a| a["responseStatusCode"] == 200)
        })
        .await;
    let ok = attempts.iter().find(|a| a["responseStatusCode"] == 200).unwrap();
    assert_eq!(ok["response"], "session=s3cret");
    let attempt = ok["id"].as_str().unwrap();
    let (status, _) = herald
        .call(
            "DELETE",
            &format!("/app/{app}/msg/{}/attempt/{attempt}/content", ids[0]),
            None,
        )
        .await;
    assert_eq!(status, 204);
    let read = herald
        .get(&format!("/app/{app}/msg/{}/attempt/{attempt}", ids[0]))
        .await;
    assert_eq!(
        (read["response"].as_str(), read["responseStatusCode"].as_i64()),
        (Some(""), Some(200))
    );
    let (status, error) = herald
        .call(
            "DELETE",
            &format!("/app/{other_app}/msg/{kept}/attempt/{attempt}/content"),
            None,
        )
        .await;
    assert_eq!(status, 404, "another message's attempt: {error}");
}
