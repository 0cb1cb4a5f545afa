//! End-to-end delivery through the real binary to real receivers on loopback: signing, outcome rules,
//! retries, Retry-After, dead letters, fan-out and idempotency.

use crate::common;

use std::time::Duration;

use common::{Herald, Receiver, Reply};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(15);

/// An app with one endpoint at `url`; returns (app, endpoint, secret).
async fn app_with_endpoint(herald: &Herald, url: &str) -> (String, String, String) {
    let app = herald.app("shop").await;
    let (endpoint, secret) = herald.endpoint(&app, json!({ "url": url })).await;
    (app, endpoint, secret)
}

async fn send(herald: &Herald, app: &str, body: Value) -> String {
    herald.post(&format!("/app/{app}/msg"), body).await["id"]
        .as_str()
        .expect("id")
        .to_owned()
}

fn statuses(attempts: &[Value]) -> Vec<i64> {
    attempts
        .iter()
        .map(|a| a["responseStatusCode"].as_i64().unwrap_or(-1))
        .collect()
}

#[tokio::test]
async fn delivers_exact_bytes_signed_and_verifiable_by_an_independent_library() {
    let herald = Herald::start(&[]).await;
    let receiver = Receiver::start(Reply::status(204)).await;
    let (app, endpoint, secret) = app_with_endpoint(&herald, &receiver.url()).await;
    // Odd spacing, unicode and key order must survive byte for byte.
    let raw = r#"{"type":"invoice.paid",  "amount": 12.50, "note":"caf\u00e9 ☕", "z":1, "a":[ ]}"#;
    let body = format!(r#"{{"eventType":"invoice.paid","payload":{raw}}}"#);
    let (status, created) = herald
        .call_with(
            "POST",
            &format!("/app/{app}/msg"),
            Some(body.into_bytes()),
            &[("authorization", "Bearer test-admin-token")],
        )
        .await;
    assert_eq!(status, 202, "{created}");
    let msg_id = created["id"].as_str().unwrap();

    let got = receiver.wait_for(1, WAIT).await;
    let request = &got[0];
    assert_eq!(
        request.body.as_ref(),
        raw.as_bytes(),
        "payload bytes changed in transit"
    );
    assert_eq!(request.header("webhook-id"), msg_id);
    assert_eq!(request.header("content-type"), "application/json");
    assert!(
        request.header("user-agent").starts_with("Herald"),
        "{}",
        request.header("user-agent")
    );
    let timestamp: i64 = request.header("webhook-timestamp").parse().expect("integer timestamp");
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    assert!((now - timestamp).abs() < 30, "timestamp {timestamp} is not now");
    assert!(request.header("webhook-signature").starts_with("v1,"));

    // Verified by Herald's own library...
    let verifier = herald_signature::Verifier::new(vec![herald_signature::HmacSecret::parse(&secret).unwrap().into()]);
    verifier
        .verify_now(
            msg_id,
            request.header("webhook-timestamp"),
            request.header("webhook-signature"),
            &request.body,
        )
        .expect("herald-signature verifies");
    // ...and by the independent Standard Webhooks reference crate.
    let reference = standardwebhooks::Webhook::new(&secret).expect("secret accepted");
    reference
        .verify(&request.body, &request.headers)
        .expect("standardwebhooks verifies");
    // A tampered body fails the reference check: the check above is not vacuous.
    assert!(reference.verify(b"{\"tampered\":true}", &request.headers).is_err());

    let attempts = herald.wait_attempts(&app, msg_id, WAIT, |a| !a.is_empty()).await;
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0]["status"], 0);
    assert_eq!(attempts[0]["responseStatusCode"], 204);
    assert_eq!(attempts[0]["endpointId"], endpoint.as_str());
    assert_eq!(attempts[0]["msgId"], msg_id);
    assert_eq!(attempts[0]["triggerType"], 0);
    let by_endpoint = herald.get(&format!("/app/{app}/attempt/endpoint/{endpoint}")).await;
    assert_eq!(by_endpoint["data"][0]["id"], attempts[0]["id"]);
    let state = delivery_state(&herald, &app, msg_id).await;
    assert_eq!(state.len(), 1);
    assert_eq!(
        (state[0]["id"].as_str(), state[0]["deliveryStatus"].as_str()),
        (Some(endpoint.as_str()), Some("delivered"))
    );
}

#[tokio::test]
async fn retryable_failures_are_retried_with_the_same_webhook_id() {
    let herald_schedule = Herald::start(&[("HERALD_RETRY_SCHEDULE", "100ms,100ms,100ms")]).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    receiver.script([Reply::status(503).body("busy"), Reply::status(408), Reply::status(200)]);
    let (app, _, _) = app_with_endpoint(&herald_schedule, &receiver.url()).await;
    let msg = send(&herald_schedule, &app, json!({"eventType": "a.b", "payload": {"n": 1}})).await;
    let got = receiver.wait_for(3, WAIT).await;
    assert!(
        got.iter().all(|r| r.header("webhook-id") == msg),
        "webhook-id must be stable"
    );
    let attempts = herald_schedule.wait_attempts(&app, &msg, WAIT, |a| a.len() == 3).await;
    assert_eq!(statuses(&attempts), [503, 408, 200]);
    assert_eq!(attempts[0]["status"], 2);
    assert_eq!(attempts[0]["response"], "busy", "the response body is recorded");
    assert_eq!(attempts[0]["outcome"], "server_error");
    assert_eq!(attempts[1]["outcome"], "retryable_client_error");
    assert_eq!(attempts[2]["outcome"], "success");
    assert_eq!(attempts[2]["status"], 0);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.received().len(), 3, "no attempt after success");
}

#[tokio::test]
async fn a_delivery_is_dead_after_the_last_scheduled_attempt() {
    let herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", "100ms,200ms")]).await;
    let receiver = Receiver::start(Reply::status(500)).await;
    let (app, _, _) = app_with_endpoint(&herald, &receiver.url()).await;
    let msg = send(&herald, &app, json!({"eventType": "a.b", "payload": {}})).await;
    let got = receiver.wait_for(3, WAIT).await;
    // Gaps follow the schedule (100 ms, then 200 ms, each ±20 %), measured at the receiver.
    let first_gap = got[1].at - got[0].at;
    let second_gap = got[2].at - got[1].at;
    assert!(first_gap >= Duration::from_millis(80), "{first_gap:?}");
    assert!(second_gap >= Duration::from_millis(160), "{second_gap:?}");
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(receiver.received().len(), 3, "no attempt after the schedule ends");
    let attempts = herald.wait_attempts(&app, &msg, WAIT, |a| a.len() == 3).await;
    assert!(attempts.iter().all(|a| a["status"] == 2));
    // The dead delivery stays visible, with its attempt count.
    let state = delivery_state(&herald, &app, &msg).await;
    assert_eq!(state[0]["deliveryStatus"], "dead");
    assert_eq!(state[0]["status"], 2);
    assert_eq!(state[0]["attempts"], 3);
    assert!(state[0].get("nextAttempt").is_none());
}

/// The deliveries of a message (`GET …/msg/{id}/endpoint`), waiting until none is pending.
async fn delivery_state(herald: &Herald, app: &str, msg: &str) -> Vec<Value> {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let list = herald.get(&format!("/app/{app}/msg/{msg}/endpoint")).await["data"]
            .as_array()
            .cloned()
            .unwrap();
        if list.iter().all(|d| d["deliveryStatus"] != "pending") || std::time::Instant::now() > deadline {
            return list;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn client_errors_are_terminal_and_410_disables_the_endpoint() {
    let herald = Herald::start(&[]).await;
    let terminal = Receiver::start(Reply::status(400).body("bad signature?")).await;
    let gone = Receiver::start(Reply::status(410)).await;
    let app = herald.app("shop").await;
    let (_, _) = herald.endpoint(&app, json!({"url": terminal.url()})).await;
    let (gone_id, _) = herald.endpoint(&app, json!({"url": gone.url()})).await;
    let msg = send(&herald, &app, json!({"eventType": "a.b", "payload": {}})).await;
    herald.wait_attempts(&app, &msg, WAIT, |a| a.len() == 2).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(terminal.received().len(), 1, "a 400 is not retried");
    assert_eq!(gone.received().len(), 1, "a 410 is not retried");
    let endpoint = herald.get(&format!("/app/{app}/endpoint/{gone_id}")).await;
    assert_eq!(endpoint["disabled"], true, "410 Gone disables the endpoint");
    let states = delivery_state(&herald, &app, &msg).await;
    assert_eq!(states.len(), 2);
    assert!(
        states
            .iter()
            .all(|d| d["deliveryStatus"] == "failed" && d["attempts"] == 1),
        "{states:?}"
    );
    // A disabled endpoint receives nothing more.
    send(&herald, &app, json!({"eventType": "a.b", "payload": {}})).await;
    terminal.wait_for(2, WAIT).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(gone.received().len(), 1);
}

#[tokio::test]
async fn retry_after_is_honoured() {
    // Retry-After may stretch a delay up to the schedule's whole window (here 5.1 s), not beyond.
    let herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", "100ms,5s")]).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    receiver.script([Reply::status(429).header("retry-after", "2")]);
    let (app, _, _) = app_with_endpoint(&herald, &receiver.url()).await;
    send(&herald, &app, json!({"eventType": "a.b", "payload": {}})).await;
    let got = receiver.wait_for(2, WAIT).await;
    let gap = got[1].at - got[0].at;
    assert!(
        gap >= Duration::from_millis(1_900),
        "Retry-After: 2 ignored, retried after {gap:?}"
    );
}

#[tokio::test]
async fn redirects_are_failures_and_never_followed() {
    let herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", "100ms")]).await;
    let target = Receiver::start(Reply::status(200)).await;
    let redirector = Receiver::start(Reply::status(307).header("location", &target.url())).await;
    let (app, _, _) = app_with_endpoint(&herald, &redirector.url()).await;
    let msg = send(&herald, &app, json!({"eventType": "a.b", "payload": {}})).await;
    let attempts = herald.wait_attempts(&app, &msg, WAIT, |a| a.len() == 2).await;
    assert_eq!(statuses(&attempts), [307, 307]);
    assert!(attempts.iter().all(|a| a["status"] == 2));
    assert!(target.received().is_empty(), "the redirect was followed");
}

#[tokio::test]
async fn timeouts_and_refused_connections_are_retried() {
    let herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", "100ms"), ("HERALD_REQUEST_TIMEOUT", "300ms")]).await;
    let slow = Receiver::start(Reply::status(200).delay(Duration::from_secs(3))).await;
    let refused_url = format!("http://127.0.0.1:{}/hook", common::free_port());
    let app = herald.app("shop").await;
    let (slow_id, _) = herald.endpoint(&app, json!({"url": slow.url()})).await;
    let (refused_id, _) = herald.endpoint(&app, json!({"url": refused_url})).await;
    let msg = send(&herald, &app, json!({"eventType": "a.b", "payload": {}})).await;
    let attempts = herald.wait_attempts(&app, &msg, WAIT, |a| a.len() == 4).await;
    for endpoint in [&slow_id, &refused_id] {
        let mine: Vec<&Value> = attempts
            .iter()
            .filter(|a| a["endpointId"] == endpoint.as_str())
            .collect();
        assert_eq!(mine.len(), 2, "two attempts each");
        assert!(mine.iter().all(|a| a["status"] == 2 && a["responseStatusCode"] == 0));
        let expected = if endpoint == &slow_id {
            "timeout"
        } else {
            "connect_error"
        };
        assert!(mine.iter().all(|a| a["outcome"] == expected), "{mine:?}");
    }
    assert_eq!(slow.received().len(), 2);
}

#[tokio::test]
async fn a_destination_outside_the_allowed_ranges_is_blocked_not_contacted() {
    // No private ranges allowed: the loopback receiver must never see a request.
    let herald = Herald::start(&[("HERALD_ALLOW_PRIVATE_CIDRS", "127.0.0.2/32")]).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let app = herald.app("shop").await;
    let (status, error) = herald
        .call(
            "POST",
            &format!("/app/{app}/endpoint"),
            Some(json!({"url": receiver.url()})),
        )
        .await;
    assert_eq!(status, 422, "{error}");
    assert!(common::names_field(&error, "url"), "{error}");
    assert!(receiver.received().is_empty());
}

#[tokio::test]
async fn fan_out_follows_filter_types_and_channels() {
    let herald = Herald::start(&[]).await;
    let app = herald.app("shop").await;
    let all = Receiver::start(Reply::status(200)).await;
    let typed = Receiver::start(Reply::status(200)).await;
    let channeled = Receiver::start(Reply::status(200)).await;
    let other_type = Receiver::start(Reply::status(200)).await;
    let disabled = Receiver::start(Reply::status(200)).await;
    herald.endpoint(&app, json!({"url": all.url()})).await;
    herald
        .endpoint(&app, json!({"url": typed.url(), "filterTypes": ["order.created"]}))
        .await;
    herald
        .endpoint(&app, json!({"url": channeled.url(), "channels": ["eu"]}))
        .await;
    herald
        .endpoint(&app, json!({"url": other_type.url(), "eventTypes": ["order.deleted"]}))
        .await;
    herald
        .endpoint(&app, json!({"url": disabled.url(), "disabled": true}))
        .await;
    let other_app = herald.app("other").await;
    let foreign = Receiver::start(Reply::status(200)).await;
    herald.endpoint(&other_app, json!({"url": foreign.url()})).await;

    send(
        &herald,
        &app,
        json!({"eventType": "order.created", "payload": {"n": 1}, "channels": ["eu"]}),
    )
    .await;
    send(
        &herald,
        &app,
        json!({"eventType": "order.created", "payload": {"n": 2}}),
    )
    .await;
    send(
        &herald,
        &app,
        json!({"eventType": "order.deleted", "payload": {"n": 3}, "channels": ["us"]}),
    )
    .await;

    all.wait_for(3, WAIT).await;
    typed.wait_for(2, WAIT).await;
    channeled.wait_for(1, WAIT).await;
    other_type.wait_for(1, WAIT).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let bodies = |r: &Receiver| {
        let mut n: Vec<i64> = r
            .received()
            .iter()
            .map(|x| serde_json::from_slice::<Value>(&x.body).unwrap()["n"].as_i64().unwrap())
            .collect();
        n.sort_unstable();
        n
    };
    assert_eq!(bodies(&all), [1, 2, 3]);
    assert_eq!(bodies(&typed), [1, 2]);
    assert_eq!(bodies(&channeled), [1]);
    assert_eq!(bodies(&other_type), [3]);
    assert!(disabled.received().is_empty(), "a disabled endpoint receives nothing");
    assert!(foreign.received().is_empty(), "another app's endpoint receives nothing");
}

#[tokio::test]
async fn duplicate_event_ids_and_idempotency_keys_return_the_original() {
    let herald = Herald::start(&[]).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let (app, _, _) = app_with_endpoint(&herald, &receiver.url()).await;
    let first = herald
        .post(
            &format!("/app/{app}/msg"),
            json!({"eventType": "a.b", "eventId": "evt-1", "payload": {"v": 1}}),
        )
        .await;
    let again = herald
        .post(
            &format!("/app/{app}/msg"),
            json!({"eventType": "a.b", "eventId": "evt-1", "payload": {"v": 2}}),
        )
        .await;
    assert_eq!(first["id"], again["id"]);
    assert_eq!(again["payload"]["v"], 1, "the original message is returned");
    assert_eq!(again["eventId"], "evt-1");

    let path = format!("/app/{app}/msg");
    let keyed = |v: i64| herald.post_keyed(&path, json!({"eventType": "a.b", "payload": {"v": v}}), "key-1");
    let (s1, k1) = keyed(10).await;
    let (s2, k2) = keyed(10).await;
    assert_eq!((s1, s2), (202, 202));
    assert_eq!(k1["id"], k2["id"], "a retry is answered with the first message");
    assert_ne!(k1["id"], first["id"]);
    let (s3, refused) = keyed(11).await;
    assert_eq!(s3, 422, "the key reused for another message: {refused}");

    receiver.wait_for(2, WAIT).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(receiver.received().len(), 2, "duplicates created no second delivery");
    let listed = herald.get(&format!("/app/{app}/msg")).await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 2);
    // The same event id in another app is a different message.
    let other = herald.app("other").await;
    let elsewhere = herald
        .post(
            &format!("/app/{other}/msg"),
            json!({"eventType": "a.b", "eventId": "evt-1", "payload": {}}),
        )
        .await;
    assert_ne!(elsewhere["id"], first["id"]);
}

#[tokio::test]
async fn messages_are_listed_newest_first_with_filters_and_pages() {
    let herald = Herald::start(&[]).await;
    let app = herald.app("shop").await;
    let mut ids = Vec::new();
    for n in 0..5 {
        let kind = if n % 2 == 0 { "even.number" } else { "odd.number" };
        ids.push(send(&herald, &app, json!({"eventType": kind, "payload": {"n": n}})).await);
    }
    let page = herald.get(&format!("/app/{app}/msg?limit=2")).await;
    assert_eq!(page["data"][0]["id"], ids[4].as_str());
    assert_eq!(page["data"][1]["id"], ids[3].as_str());
    assert_eq!(page["done"], false);
    let next = herald
        .get(&format!(
            "/app/{app}/msg?limit=2&iterator={}",
            page["iterator"].as_str().unwrap()
        ))
        .await;
    assert_eq!(next["data"][0]["id"], ids[2].as_str());
    let evens = herald.get(&format!("/app/{app}/msg?eventTypes=even.number")).await;
    assert_eq!(evens["data"].as_array().unwrap().len(), 3);
    let one = herald.get(&format!("/app/{app}/msg/{}", ids[1])).await;
    assert_eq!(one["payload"]["n"], 1);
    let future = herald.get(&format!("/app/{app}/msg?since=2999-01-01T00:00:00Z")).await;
    assert!(future["data"].as_array().unwrap().is_empty());
    let past = herald.get(&format!("/app/{app}/msg?until=2000-01-01T00:00:00Z")).await;
    assert!(past["data"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn a_destination_refused_at_delivery_time_is_recorded_as_blocked() {
    // The endpoint is created while loopback is allowed; the operator then narrows the allowlist.
    let mut herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", "100ms")]).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let (app, _, _) = app_with_endpoint(&herald, &receiver.url()).await;
    herald.kill9();
    for (key, value) in &mut herald.env {
        if key == "HERALD_ALLOW_PRIVATE_CIDRS" {
            *value = "127.0.0.2/32".to_owned();
        }
    }
    herald.restart().await;
    let msg = send(&herald, &app, json!({"eventType": "a.b", "payload": {}})).await;
    let attempts = herald.wait_attempts(&app, &msg, WAIT, |a| a.len() == 2).await;
    for attempt in &attempts {
        assert_eq!(attempt["status"], 2);
        assert_eq!(attempt["responseStatusCode"], 0);
        let response = attempt["response"].as_str().unwrap();
        assert!(
            response.starts_with("blocked:") && response.contains("loopback"),
            "{response}"
        );
    }
    assert!(receiver.received().is_empty(), "a blocked destination was contacted");
}

#[tokio::test]
async fn endpoint_changes_apply_to_pending_retries() {
    let herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", &vec!["300ms"; 20].join(","))]).await;
    let old = Receiver::start(Reply::status(500)).await;
    let new = Receiver::start(Reply::status(200)).await;
    let (app, endpoint, _) = app_with_endpoint(&herald, &old.url()).await;
    let msg = send(&herald, &app, json!({"eventType": "a.b", "payload": {}})).await;
    old.wait_for(1, WAIT).await;
    // Re-point the endpoint while the delivery is retrying: the next attempt goes to the new URL.
    let (status, body) = herald
        .call(
            "PATCH",
            &format!("/app/{app}/endpoint/{endpoint}"),
            Some(json!({"url": new.url()})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let got = new.wait_for(1, WAIT).await;
    assert_eq!(got[0].header("webhook-id"), msg);
    let settled = old.received().len();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        old.received().len(),
        settled,
        "no attempt to the old URL after the change"
    );
}

#[tokio::test]
async fn deleting_an_endpoint_stops_its_retries() {
    let herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", &vec!["200ms"; 20].join(","))]).await;
    let receiver = Receiver::start(Reply::status(503)).await;
    let (app, endpoint, _) = app_with_endpoint(&herald, &receiver.url()).await;
    send(&herald, &app, json!({"eventType": "a.b", "payload": {}})).await;
    receiver.wait_for(2, WAIT).await;
    let (status, _) = herald
        .call("DELETE", &format!("/app/{app}/endpoint/{endpoint}"), None)
        .await;
    assert_eq!(status, 204);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let settled = receiver.received().len();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(
        receiver.received().len(),
        settled,
        "a deleted endpoint is not attempted again"
    );
    let (status, _) = herald
        .call("GET", &format!("/app/{app}/endpoint/{endpoint}"), None)
        .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn pausing_an_endpoint_holds_pending_retries_until_it_is_enabled() {
    // Retries are 1 s apart, so the PATCH below lands well before the first retry is due.
    let herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", &vec!["1s"; 30].join(","))]).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    receiver.script([Reply::status(500)]);
    let (app, endpoint, _) = app_with_endpoint(&herald, &receiver.url()).await;
    let msg = send(&herald, &app, json!({"eventType": "a.b", "payload": {}})).await;
    receiver.wait_for(1, WAIT).await;
    let path = format!("/app/{app}/endpoint/{endpoint}");
    assert_eq!(
        herald.call("PATCH", &path, Some(json!({"disabled": true}))).await.0,
        200
    );
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert_eq!(
        receiver.received().len(),
        1,
        "nothing is sent while the endpoint is disabled"
    );
    assert_eq!(
        herald.call("PATCH", &path, Some(json!({"disabled": false}))).await.0,
        200
    );
    let got = receiver.wait_for(2, WAIT).await;
    assert_eq!(
        got[1].header("webhook-id"),
        msg,
        "the pending retry resumes after re-enabling"
    );
}
