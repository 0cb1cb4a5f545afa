//! Operational webhooks: what Herald decides on its own (and endpoint changes) is recorded as an
//! operational event and pushed, signed, to the operator's URL — retried until taken, at least once.

use crate::common;

use std::time::{Duration, Instant};

use common::{Herald, Receiver, Reply};
use serde_json::{Value, json};

const OPS_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const WAIT: Duration = Duration::from_secs(30);

/// Every operational webhook the receiver took (2xx), verified with an independent verifier, deduplicated
/// on `webhook-id` (at least once allows repeats), in arrival order.
fn taken(ops: &Receiver) -> Vec<Value> {
    let verifier = standardwebhooks::Webhook::new(OPS_SECRET).expect("secret");
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for request in ops.received() {
        verifier
            .verify(&request.body, &request.headers)
            .expect("operational webhook signature verifies");
        let id = request.header("webhook-id");
        assert!(is_operational_event_id(id), "an operational event's id: {id}");
        if (200..300).contains(&request.status) && seen.insert(request.header("webhook-id").to_owned()) {
            out.push(serde_json::from_slice(&request.body).expect("JSON body"));
        }
    }
    out
}

/// Whether `id` is an operational event's `webhook-id`: `opevt_{seq}_{digest}`, 16 hex digits of the
/// event's digest (docs/operations.md), so that a `seq` reused after a crash never repeats an id.
fn is_operational_event_id(id: &str) -> bool {
    let Some((seq, digest)) = id.strip_prefix("opevt_").and_then(|rest| rest.split_once('_')) else {
        return false;
    };
    !seq.is_empty()
        && seq.bytes().all(|b| b.is_ascii_digit())
        && digest.len() == 16
        && digest.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// Which event data an expected event must have.
type DataMatch<'a> = &'a dyn Fn(&Value) -> bool;

/// Wait until the taken events hold one of each `(type, matcher)`.
async fn wait_for_events(ops: &Receiver, wanted: &[(&str, DataMatch<'_>)]) -> Vec<Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let events = taken(ops);
        let missing: Vec<&str> = wanted
            .iter()
            .filter(|(kind, matches)| !events.iter().any(|e| e["type"] == *kind && matches(&e["data"])))
            .map(|(kind, _)| *kind)
            .collect();
        if missing.is_empty() {
            return events;
        }
        assert!(Instant::now() < deadline, "missing {missing:?} in {events:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn operational_events_are_recorded_and_pushed_signed_with_retries() {
    // The operator's receiver is down for the first request: the event must come again.
    let ops = Receiver::start(Reply::status(200)).await;
    ops.script([Reply::status(503)]);
    let ops_url = ops.url();
    let herald = Herald::start(&[
        // Five attempts: the 4th failure is `failing`, the 5th is the last.
        ("HERALD_RETRY_SCHEDULE", "50ms,50ms,50ms,50ms"),
        ("HERALD_OPERATIONAL_WEBHOOK_URL", &ops_url),
        ("HERALD_OPERATIONAL_WEBHOOK_SECRET", OPS_SECRET),
    ])
    .await;
    let app = herald.app("ops").await;

    let doomed = Receiver::start(Reply::status(500)).await;
    let flaky = Receiver::start(Reply::status(200)).await;
    flaky.script((0..4).map(|_| Reply::status(500)));
    let gone = Receiver::start(Reply::status(410)).await;
    let mut ids = Vec::new();
    for (receiver, kind) in [(&doomed, "doomed"), (&flaky, "flaky"), (&gone, "gone")] {
        let (id, _) = herald
            .endpoint(&app, json!({ "url": receiver.url(), "filterTypes": [kind] }))
            .await;
        ids.push(id);
    }
    let (doomed_ep, flaky_ep, gone_ep) = (ids[0].clone(), ids[1].clone(), ids[2].clone());
    let mut msgs = Vec::new();
    for kind in ["doomed", "flaky", "gone"] {
        let msg = herald
            .post(
                &format!("/app/{app}/msg"),
                json!({ "eventType": kind, "payload": { "k": kind } }),
            )
            .await;
        msgs.push(msg["id"].as_str().expect("id").to_owned());
    }
    let (doomed_msg, flaky_msg) = (msgs[0].clone(), msgs[1].clone());

    // Endpoint changes are events too.
    let (temp, _) = herald
        .endpoint(&app, json!({ "url": "https://example.com/hook", "uid": "temp" }))
        .await;
    let (status, _) = herald
        .call(
            "PATCH",
            &format!("/app/{app}/endpoint/{temp}"),
            Some(json!({ "description": "x" })),
        )
        .await;
    assert_eq!(status, 200);
    let (status, _) = herald
        .call("DELETE", &format!("/app/{app}/endpoint/{temp}"), None)
        .await;
    assert_eq!(status, 204);

    let about = |ep: &str, msg: Option<&str>| {
        let (app, ep, msg) = (app.clone(), ep.to_owned(), msg.map(str::to_owned));
        move |data: &Value| {
            data["appId"] == app.as_str()
                && data["endpointId"] == ep.as_str()
                && msg.as_deref().is_none_or(|m| data["msgId"] == m)
        }
    };
    let on_temp = about(&temp, None);
    let doomed_msg_ref = about(&doomed_ep, Some(&doomed_msg));
    let flaky_msg_ref = about(&flaky_ep, Some(&flaky_msg));
    let on_gone = about(&gone_ep, None);
    let events = wait_for_events(
        &ops,
        &[
            ("endpoint.created", &on_temp),
            ("endpoint.updated", &on_temp),
            ("endpoint.deleted", &on_temp),
            ("message.attempt.failing", &doomed_msg_ref),
            ("message.attempt.exhausted", &doomed_msg_ref),
            ("message.attempt.failing", &flaky_msg_ref),
            ("message.attempt.recovered", &flaky_msg_ref),
            ("endpoint.disabled", &on_gone),
        ],
    )
    .await;

    // The shape: {type, timestamp, data}, with what an operator needs to act.
    let exhausted = events
        .iter()
        .find(|e| e["type"] == "message.attempt.exhausted" && e["data"]["endpointId"] == doomed_ep.as_str())
        .expect("exhausted");
    assert!(
        time::OffsetDateTime::parse(
            exhausted["timestamp"].as_str().expect("timestamp"),
            &time::format_description::well_known::Rfc3339
        )
        .is_ok()
    );
    assert_eq!(exhausted["data"]["deliveryStatus"], "dead");
    assert_eq!(exhausted["data"]["attempts"], 5);
    assert_eq!(exhausted["data"]["lastAttempt"]["responseStatusCode"], 500);
    let disabled = events
        .iter()
        .find(|e| e["type"] == "endpoint.disabled")
        .expect("disabled");
    assert_eq!(disabled["data"]["reason"], "the endpoint answered 410 Gone");
    // A delivery that never failed four times is not reported as failing, nor one that succeeded at once
    // as recovered; the doomed delivery never recovered.
    assert!(
        !events
            .iter()
            .any(|e| e["type"] == "message.attempt.recovered" && e["data"]["endpointId"] == doomed_ep.as_str())
    );
    assert_eq!(
        events
            .iter()
            .filter(|e| e["type"] == "message.attempt.failing" && e["data"]["endpointId"] == doomed_ep.as_str())
            .count(),
        1
    );
    // The first request was refused (503) and the same event came again with the same id.
    let all = ops.received();
    assert_eq!(all[0].status, 503);
    assert!(
        all[1..]
            .iter()
            .any(|r| r.header("webhook-id") == all[0].header("webhook-id"))
    );

    // Everything pushed is recorded, in the same order, in the operational event log.
    let log = herald.get("/operational-event?limit=250").await;
    let recorded: Vec<&str> = log["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|e| e["eventType"].as_str())
        .collect();
    let pushed: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(&recorded[..pushed.len()], &pushed[..], "{recorded:?} vs {pushed:?}");
}

#[tokio::test]
async fn events_recorded_while_the_receiver_was_away_are_sent_after_a_restart() {
    let ops = Receiver::start(Reply::status(503)).await;
    let ops_url = ops.url();
    let mut herald = Herald::start(&[
        ("HERALD_OPERATIONAL_WEBHOOK_URL", &ops_url),
        ("HERALD_OPERATIONAL_WEBHOOK_SECRET", OPS_SECRET),
    ])
    .await;
    let app = herald.app("ops").await;
    let (ep, _) = herald
        .endpoint(&app, json!({ "url": "https://example.com/hook" }))
        .await;
    ops.wait_for(1, WAIT).await;
    herald.kill9();
    ops.set_fallback(Reply::status(200));
    herald.restart().await;
    let on_ep = |data: &Value| data["endpointId"] == ep.as_str();
    wait_for_events(&ops, &[("endpoint.created", &on_ep)]).await;
}

#[tokio::test]
async fn a_secret_is_required_with_the_url() {
    let ops = Receiver::start(Reply::status(200)).await;
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_herald"))
        .arg("serve")
        .env_clear()
        .env("HERALD_LISTEN", "127.0.0.1:0")
        .env("HERALD_DATABASE_URL", "sqlite::memory:")
        .env("HERALD_ADMIN_TOKEN", "t")
        .env("HERALD_OPERATIONAL_WEBHOOK_URL", ops.url())
        .output()
        .expect("run herald");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("operational_webhook_secret"), "{stderr}");
}

/// The operational event log (admin listing), oldest first.
async fn event_log(herald: &Herald) -> Vec<Value> {
    herald.get("/operational-event?limit=250").await["data"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[tokio::test]
async fn a_delivery_that_dies_waiting_is_exhausted_and_a_rotation_is_an_update() {
    // Window: 100 ms × 1.2 + two attempts × 100 ms ≈ 0.3 s.
    let herald = Herald::start(&[
        ("HERALD_RETRY_SCHEDULE", "100ms"),
        ("HERALD_REQUEST_TIMEOUT", "100ms"),
        ("HERALD_MAX_REQUEST_TIMEOUT", "100ms"),
    ])
    .await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let app = herald.app("ops").await;
    // Paused: its delivery waits, unattempted, until its window has passed.
    let (paused, _) = herald
        .endpoint(&app, json!({ "url": receiver.url(), "disabled": true }))
        .await;
    let msg = herald
        .post(&format!("/app/{app}/msg"), json!({ "eventType": "a.b", "payload": {} }))
        .await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let (status, body) = herald
        .call(
            "POST",
            &format!("/app/{app}/endpoint/{paused}/secret/rotate"),
            Some(json!({})),
        )
        .await;
    assert_eq!(status, 200, "{body}");

    let deadline = Instant::now() + WAIT;
    let exhausted = loop {
        let log = event_log(&herald).await;
        if let Some(found) = log
            .iter()
            .find(|e| e["eventType"] == "message.attempt.exhausted" && e["data"]["msgId"] == msg.as_str())
        {
            break found.clone();
        }
        assert!(Instant::now() < deadline, "no exhausted event: {log:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let data = &exhausted["data"];
    assert_eq!(
        (
            &data["appId"],
            &data["endpointId"],
            &data["deliveryStatus"],
            &data["reason"],
            &data["attempts"]
        ),
        (
            &json!(app),
            &json!(paused),
            &json!("dead"),
            &json!("expired"),
            &json!(0)
        ),
        "{exhausted}"
    );
    assert!(data.get("lastAttempt").is_none(), "no attempt was made: {exhausted}");
    let deliveries = herald.get(&format!("/app/{app}/msg/{msg}/endpoint")).await;
    assert_eq!(deliveries["data"][0]["deliveryStatus"], "dead", "{deliveries}");
    assert!(receiver.received().is_empty());

    // The rotation was recorded as a change of the endpoint, after its creation; only one exhausted event.
    let log = event_log(&herald).await;
    let kinds: Vec<&str> = log
        .iter()
        .filter(|e| e["data"]["endpointId"] == paused.as_str())
        .filter_map(|e| e["eventType"].as_str())
        .collect();
    assert_eq!(
        kinds,
        ["endpoint.created", "endpoint.updated", "message.attempt.exhausted"],
        "{log:#?}"
    );
}
