//! Flow control end to end, through the real binary to real receivers on loopback: per-endpoint
//! concurrency caps against a black hole and a slow receiver, rate pacing, the circuit breaker (open,
//! probe, slow start) and a flapping receiver, `Retry-After` holding a whole endpoint, pause and resume,
//! expiry while paused, auto-disable (410 and a long failing streak) with its operational event, and
//! per-key ordering with a failing head.

use crate::common;

use std::future::Future;
use std::time::{Duration, Instant};

use common::{Herald, Receiver, Reply};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

/// A node, a receiver answering `reply`, and an app with one endpoint to that receiver (`settings` are
/// the endpoint's other fields).
struct Setup {
    herald: Herald,
    receiver: Receiver,
    app: String,
    ep: String,
}

async fn setup(env: &[(&str, &str)], reply: Reply, settings: Value) -> Setup {
    let herald = Herald::start(env).await;
    let receiver = Receiver::start(reply).await;
    let app = herald.app("shop").await;
    let mut body = settings;
    body["url"] = json!(receiver.url());
    let (ep, _) = herald.endpoint(&app, body).await;
    Setup {
        herald,
        receiver,
        app,
        ep,
    }
}

/// A retry schedule of `n` equal delays.
fn schedule(n: usize, delay: &str) -> String {
    vec![delay; n].join(",")
}

async fn send(herald: &Herald, app: &str, body: Value) -> String {
    herald.post(&format!("/app/{app}/msg"), body).await["id"]
        .as_str()
        .expect("id")
        .to_owned()
}

async fn send_many(herald: &Herald, app: &str, event_type: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        ids.push(send(herald, app, json!({"eventType": event_type, "payload": {"n": i}})).await);
    }
    ids
}

/// Poll `probe` until it returns `Some`, failing the test after `timeout`.
async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn endpoint(herald: &Herald, app: &str, id: &str) -> Value {
    herald.get(&format!("/app/{app}/endpoint/{id}")).await
}

async fn health(herald: &Herald, app: &str, id: &str) -> Value {
    endpoint(herald, app, id).await["health"].clone()
}

/// Wait until the endpoint's queue is empty in the store (results are committed a few milliseconds after
/// the receiver answered); returns the health block.
async fn drained(herald: &Herald, app: &str, id: &str) -> Value {
    wait_until("the queue to drain", WAIT, || async {
        let h = health(herald, app, id).await;
        (h["queueDepth"] == 0).then_some(h)
    })
    .await
}

/// Wait until every message got a 2xx from the receiver.
async fn all_delivered(receiver: &Receiver, ids: &[String]) {
    wait_until("every message to be delivered", WAIT, || async {
        let delivered = receiver.per_message().values().filter(|(_, ok)| *ok > 0).count();
        (delivered == ids.len()).then_some(())
    })
    .await;
}

/// Every message reached the receiver with a 2xx exactly once (at-least-once with no failure in between
/// means exactly once).
fn assert_each_delivered_once(receiver: &Receiver, ids: &[String]) {
    let counts = receiver.per_message();
    for id in ids {
        let (_, delivered) = counts.get(id).copied().unwrap_or((0, 0));
        assert_eq!(delivered, 1, "{id} delivered {delivered} times");
    }
}

async fn patch_endpoint(herald: &Herald, app: &str, id: &str, body: Value) -> Value {
    let (status, out) = herald
        .call("PATCH", &format!("/app/{app}/endpoint/{id}"), Some(body))
        .await;
    assert_eq!(status, 200, "{out}");
    out
}

#[tokio::test]
async fn a_black_hole_holds_at_most_its_cap_while_a_healthy_endpoint_flows() {
    let herald = Herald::start(&[("HERALD_REQUEST_TIMEOUT", "3s"), ("HERALD_RETRY_SCHEDULE", "1s")]).await;
    let hole = Receiver::start(Reply::status(200).delay(Duration::from_secs(3600))).await;
    let healthy = Receiver::start(Reply::status(200)).await;
    let app = herald.app("shop").await;
    let (hole_id, _) = herald
        .endpoint(
            &app,
            json!({"url": hole.url(), "filterTypes": ["to.hole"], "maxConcurrency": 3}),
        )
        .await;
    herald
        .endpoint(&app, json!({"url": healthy.url(), "filterTypes": ["to.healthy"]}))
        .await;
    send_many(&herald, &app, "to.hole", 20).await;
    wait_until("the black hole to hold three requests", WAIT, || async {
        (hole.in_flight() == 3).then_some(())
    })
    .await;
    let started = Instant::now();
    let ids = send_many(&herald, &app, "to.healthy", 30).await;
    healthy.wait_for(30, Duration::from_secs(5)).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "healthy deliveries waited on the black hole ({took:?})"
    );
    assert_each_delivered_once(&healthy, &ids);
    let h = health(&herald, &app, &hole_id).await;
    assert_eq!(h["inFlight"], 3, "{h}");
    assert_eq!(h["queueDepth"], 20, "every black-holed delivery still waits: {h}");
    assert_eq!(h["queueDepthCapped"], false, "{h}");
    assert_eq!(hole.peak_in_flight(), 3, "the cap held");
    assert_eq!(hole.received().len(), 3, "nothing beyond the cap was sent");
}

#[tokio::test]
async fn a_slow_endpoint_never_gets_more_than_its_cap_and_loses_nothing() {
    let slow = Reply::status(200).delay(Duration::from_millis(300));
    let Setup {
        herald, receiver, app, ..
    } = setup(&[], slow, json!({"maxConcurrency": 2})).await;
    let ids = send_many(&herald, &app, "a.b", 10).await;
    receiver.wait_for(10, WAIT).await;
    assert_eq!(receiver.peak_in_flight(), 2, "the cap is used and never exceeded");
    assert_each_delivered_once(&receiver, &ids);
}

#[tokio::test]
async fn throttle_rate_paces_deliveries_evenly() {
    let Setup {
        herald, receiver, app, ..
    } = setup(&[], Reply::status(200), json!({"throttleRate": 5})).await;
    let ids = send_many(&herald, &app, "a.b", 10).await;
    let got = receiver.wait_for(10, WAIT).await;
    let gaps: Vec<Duration> = got.windows(2).map(|w| w[1].at - w[0].at).collect();
    // 5/s is one every 200 ms; loopback jitter may bring two arrivals a little closer.
    assert!(
        gaps.iter().all(|g| *g >= Duration::from_millis(150)),
        "requests were not paced: {gaps:?}"
    );
    let span = got[9].at - got[0].at;
    assert!(
        span >= Duration::from_millis(1_700),
        "10 requests at 5/s took only {span:?}"
    );
    assert_each_delivered_once(&receiver, &ids);
    assert!(
        got.iter().all(|r| r.status == 200),
        "queued work waited, it did not fail"
    );
}

#[tokio::test]
async fn the_breaker_opens_probes_once_per_cooldown_and_ramps_up_slowly_after_recovery() {
    let retries = schedule(12, "50ms");
    let env = [
        ("HERALD_BREAKER_THRESHOLD", "3"),
        ("HERALD_BREAKER_COOLDOWN", "500ms"),
        ("HERALD_BREAKER_MAX_COOLDOWN", "1s"),
        ("HERALD_RETRY_SCHEDULE", retries.as_str()),
    ];
    let Setup {
        herald,
        receiver,
        app,
        ep,
    } = setup(&env, Reply::status(500), json!({"maxConcurrency": 8})).await;
    let ids = send_many(&herald, &app, "a.b", 40).await;

    let open = wait_until("the breaker to open", WAIT, || async {
        let h = health(&herald, &app, &ep).await;
        (h["state"] == "open").then_some(h)
    })
    .await;
    assert!(open["consecutiveFailures"].as_u64().unwrap() >= 3, "{open}");
    assert!(
        open["openedAt"].is_string() && open["nextProbeAt"].is_string(),
        "{open}"
    );
    assert_eq!(open["concurrencyLimit"], 0, "{open}");
    assert_eq!(open["queueDepth"], 40, "nothing was lost or finished: {open}");

    // While open, one probe per cool-down and nothing else. (Requests sent before it opened have
    // arrived by the time the API shows it open; a short pause covers loopback delivery.)
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before_open = receiver.received().len();
    tokio::time::sleep(Duration::from_millis(1_800)).await;
    let while_open = receiver.received();
    let probes = &while_open[before_open..];
    assert!(
        (1..=3).contains(&probes.len()),
        "expected a probe per cool-down (0.5 s, then 1 s), got {} requests while open",
        probes.len()
    );
    assert!(probes.iter().all(|r| r.concurrent == 1), "probes go alone");
    assert!(
        before_open <= 8 + 2,
        "the cap plus the slots freed by the first two failures, got {before_open}"
    );

    // The endpoint recovers, slowly: each success lets one more request fly.
    receiver.set_fallback(Reply::status(200).delay(Duration::from_millis(150)));
    all_delivered(&receiver, &ids).await;
    let after: Vec<_> = receiver.received()[while_open.len()..].to_vec();
    let first_ok = after.iter().position(|r| r.status == 200).expect("a success");
    let ramp: Vec<usize> = after[first_ok..].iter().map(|r| r.concurrent).collect();
    assert_eq!(ramp[0], 1, "the probe goes alone: {ramp:?}");
    assert!(
        ramp[1..3].iter().all(|c| *c <= 2),
        "right after the probe at most two fly: {ramp:?}"
    );
    assert!(ramp.iter().all(|c| *c <= 8), "never beyond the cap: {ramp:?}");
    assert!(ramp.iter().any(|c| *c >= 4), "the allowance grew: {ramp:?}");
    assert_each_delivered_once(&receiver, &ids);
    let closed = health(&herald, &app, &ep).await;
    assert_eq!(closed["state"], "closed", "{closed}");
    assert_eq!(closed["consecutiveFailures"], 0, "{closed}");
}

#[tokio::test]
async fn an_endpoint_rejecting_content_is_attempted_at_full_speed() {
    // A 400 says the endpoint is up and answering: it must not open the breaker and slow every other
    // delivery to it (before, 6 of 40 deliveries were attempted within 5 s).
    let env = [("HERALD_BREAKER_THRESHOLD", "3"), ("HERALD_BREAKER_COOLDOWN", "5s")];
    let Setup {
        herald,
        receiver,
        app,
        ep,
    } = setup(&env, Reply::status(400), json!({"maxConcurrency": 4})).await;
    let ids = send_many(&herald, &app, "a.b", 40).await;
    // Well inside the 5 s cool-down an open breaker would impose after the third failure.
    receiver.wait_for(40, Duration::from_secs(4)).await;
    let per_message = receiver.per_message();
    assert!(
        ids.iter().all(|id| per_message.get(id) == Some(&(1, 0))),
        "each delivery attempted once (a 400 is terminal): {per_message:?}"
    );
    let h = drained(&herald, &app, &ep).await;
    assert_eq!(h["state"], "closed", "{h}");
    assert_eq!(h["consecutiveFailures"], 0, "{h}");
}

#[tokio::test]
async fn a_timing_out_endpoint_still_opens_the_breaker() {
    let env = [
        ("HERALD_BREAKER_THRESHOLD", "3"),
        ("HERALD_BREAKER_COOLDOWN", "2s"),
        ("HERALD_REQUEST_TIMEOUT", "200ms"),
        ("HERALD_RETRY_SCHEDULE", "50ms,50ms,50ms,50ms,50ms"),
    ];
    let Setup {
        herald,
        receiver: _receiver,
        app,
        ep,
    } = setup(
        &env,
        Reply::status(200).delay(Duration::from_secs(5)),
        json!({"maxConcurrency": 2}),
    )
    .await;
    send_many(&herald, &app, "a.b", 10).await;
    let open = wait_until("the breaker to open", WAIT, || async {
        let h = health(&herald, &app, &ep).await;
        (h["state"] == "open").then_some(h)
    })
    .await;
    assert!(open["consecutiveFailures"].as_u64().unwrap() >= 3, "{open}");
}

#[tokio::test]
async fn an_endpoint_that_refuses_first_attempts_but_takes_retries_is_not_starved() {
    // Every first attempt gets a 503, every retry a 200. The burst's first attempts open the breaker (the
    // endpoint has shown no life yet); its probe must be a retry, and the successes that follow keep it
    // closed while the remaining first attempts fail in between. With first attempts as probes, one per
    // cool-down (1 s at most here), the 40 deliveries would take well over a minute.
    let retries = schedule(8, "100ms");
    let env = [
        ("HERALD_BREAKER_THRESHOLD", "3"),
        ("HERALD_BREAKER_COOLDOWN", "500ms"),
        ("HERALD_BREAKER_MAX_COOLDOWN", "1s"),
        ("HERALD_RETRY_SCHEDULE", retries.as_str()),
    ];
    let Setup {
        herald,
        receiver,
        app,
        ep,
    } = setup(&env, Reply::status(200), json!({"maxConcurrency": 4})).await;
    receiver.first_of_each(Reply::status(503));
    let ids = send_many(&herald, &app, "a.b", 40).await;
    all_delivered(&receiver, &ids).await;
    assert_each_delivered_once(&receiver, &ids);
    let h = drained(&herald, &app, &ep).await;
    assert_eq!(h["state"], "closed", "{h}");
}

#[tokio::test]
async fn a_recovered_endpoint_gets_its_outage_retries_at_once_not_at_their_timers() {
    // Retries an hour apart: without the release on recovery, the deliveries that failed before the
    // breaker opened would arrive an hour after the endpoint came back.
    let env = [
        ("HERALD_BREAKER_THRESHOLD", "3"),
        ("HERALD_BREAKER_COOLDOWN", "300ms"),
        ("HERALD_BREAKER_MAX_COOLDOWN", "300ms"),
        ("HERALD_RETRY_SCHEDULE", "1h,1h"),
    ];
    let Setup {
        herald,
        receiver,
        app,
        ep,
    } = setup(&env, Reply::status(503), json!({"maxConcurrency": 4})).await;
    let ids = send_many(&herald, &app, "a.b", 12).await;
    wait_until("the breaker to open", WAIT, || async {
        (health(&herald, &app, &ep).await["state"] == "open").then_some(())
    })
    .await;
    let failed_before_open = receiver.received().len();
    assert!(failed_before_open >= 3, "the failures that opened the breaker");

    receiver.set_fallback(Reply::status(200));
    all_delivered(&receiver, &ids).await;
    assert_each_delivered_once(&receiver, &ids);
    let attempts = herald.get(&format!("/app/{app}/attempt/endpoint/{ep}")).await;
    let failed = attempts["data"]
        .as_array()
        .expect("attempts")
        .iter()
        .filter(|a| a["status"] == 2)
        .count();
    assert!(
        failed >= failed_before_open,
        "the outage's failed attempts stay on record beside the later success: {attempts}"
    );
}

#[tokio::test]
async fn a_flapping_endpoint_gets_everything_and_its_breaker_stays_closed() {
    // Failures never come three in a row, so the breaker (threshold 3) never opens; retries fill the gaps.
    // The script holds 20 failures in all, and each delivery may fail 20 times before it dies: however
    // the attempts interleave (a loaded machine can line one delivery's retries up with the failing
    // slots), none can die.
    let retries = schedule(20, "50ms");
    let env = [
        ("HERALD_BREAKER_THRESHOLD", "3"),
        ("HERALD_RETRY_SCHEDULE", retries.as_str()),
    ];
    let Setup {
        herald,
        receiver,
        app,
        ep,
    } = setup(&env, Reply::status(200), json!({"maxConcurrency": 1})).await;
    receiver.script((0..40).map(|i| Reply::status(if i % 2 == 0 { 503 } else { 200 })));
    let ids = send_many(&herald, &app, "a.b", 20).await;
    all_delivered(&receiver, &ids).await;
    assert_each_delivered_once(&receiver, &ids);
    assert!(
        receiver.received().iter().any(|r| r.status == 503),
        "the endpoint did flap"
    );
    let h = drained(&herald, &app, &ep).await;
    assert_eq!(h["state"], "closed", "{h}");
}

#[tokio::test]
async fn retry_after_on_429_holds_the_whole_endpoint() {
    let env = [("HERALD_RETRY_SCHEDULE", "100ms,100ms,100ms")];
    let Setup {
        herald,
        receiver,
        app,
        ep,
    } = setup(&env, Reply::status(200), json!({})).await;
    receiver.script([Reply::status(429).header("retry-after", "2")]);
    let first = send(&herald, &app, json!({"eventType": "a.b", "payload": {}})).await;
    let limited = receiver.wait_for(1, WAIT).await[0].at;
    let h = wait_until("the hold to show", WAIT, || async {
        let h = health(&herald, &app, &ep).await;
        h["heldUntil"].is_string().then_some(h)
    })
    .await;
    assert_eq!(h["state"], "closed", "one 429 does not open the breaker: {h}");
    let mut ids = send_many(&herald, &app, "a.b", 5).await;
    ids.push(first);
    let got = receiver.wait_for(7, WAIT).await;
    for r in &got[1..] {
        let waited = r.at - limited;
        assert!(
            waited >= Duration::from_millis(1_900),
            "a request went out {waited:?} after a Retry-After of 2 s"
        );
    }
    assert_each_delivered_once(&receiver, &ids);
}

#[tokio::test]
async fn a_paused_endpoint_queues_and_delivers_everything_after_resume() {
    let Setup {
        herald,
        receiver,
        app,
        ep,
    } = setup(&[], Reply::status(200), json!({"disabled": true})).await;
    let ids = send_many(&herald, &app, "a.b", 5).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(receiver.received().is_empty(), "a paused endpoint receives nothing");
    let h = health(&herald, &app, &ep).await;
    assert_eq!(h["queueDepth"], 5, "{h}");
    assert_eq!(h["concurrencyLimit"], 0, "{h}");
    assert!(h["oldestPendingAt"].is_string(), "{h}");
    patch_endpoint(&herald, &app, &ep, json!({"disabled": false})).await;
    receiver.wait_for(5, WAIT).await;
    assert_each_delivered_once(&receiver, &ids);
    let h = drained(&herald, &app, &ep).await;
    assert!(h["oldestPendingAt"].is_null(), "{h}");
}

#[tokio::test]
async fn deliveries_that_wait_past_their_window_while_paused_die_unsent() {
    // Window: 100 ms × 1.2 + two attempts × 100 ms ≈ 0.3 s.
    let env = [
        ("HERALD_RETRY_SCHEDULE", "100ms"),
        ("HERALD_REQUEST_TIMEOUT", "100ms"),
        ("HERALD_MAX_REQUEST_TIMEOUT", "100ms"),
    ];
    let Setup {
        herald,
        receiver,
        app,
        ep,
    } = setup(&env, Reply::status(200), json!({"disabled": true})).await;
    let msg = send(&herald, &app, json!({"eventType": "a.b", "payload": {}})).await;
    let status = wait_until("the delivery to die", WAIT, || async {
        let list = herald.get(&format!("/app/{app}/msg/{msg}/endpoint")).await;
        let d = list["data"][0].clone();
        (d["deliveryStatus"] != "pending").then_some(d)
    })
    .await;
    assert_eq!(status["deliveryStatus"], "dead", "{status}");
    assert_eq!(health(&herald, &app, &ep).await["queueDepth"], 0);
    patch_endpoint(&herald, &app, &ep, json!({"disabled": false})).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(receiver.received().is_empty(), "an expired delivery is never sent");
    assert!(
        herald.attempts(&app, &msg).await.is_empty(),
        "and it used up no attempt"
    );
}

#[tokio::test]
async fn a_410_disables_the_endpoint_at_once_records_why_and_queues_the_rest() {
    let Setup {
        herald,
        receiver,
        app,
        ep,
    } = setup(&[], Reply::status(410), json!({"maxConcurrency": 1})).await;
    send(&herald, &app, json!({"eventType": "a.b", "payload": {}})).await;
    let disabled = wait_until("the endpoint to be disabled", WAIT, || async {
        let e = endpoint(&herald, &app, &ep).await;
        (e["disabled"] == true).then_some(e)
    })
    .await;
    assert!(
        disabled["disabledReason"].as_str().unwrap().contains("410"),
        "{disabled}"
    );
    let events = wait_until("the operational event", WAIT, || async {
        let list = herald.get("/operational-event").await;
        let data = disabled_events(&list);
        (!data.is_empty()).then_some(data)
    })
    .await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["eventType"], "endpoint.disabled");
    assert_eq!(events[0]["data"]["endpointId"], ep.as_str());
    assert_eq!(events[0]["appId"], app.as_str());
    // Later messages wait for the endpoint to be enabled again.
    send_many(&herald, &app, "a.b", 3).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.received().len(), 1, "nothing sent to a disabled endpoint");
    assert_eq!(health(&herald, &app, &ep).await["queueDepth"], 3);
    // Re-enabling clears the reason.
    let again = patch_endpoint(&herald, &app, &ep, json!({"disabled": false})).await;
    assert!(again.get("disabledReason").is_none(), "{again}");
}

#[tokio::test]
async fn an_endpoint_failing_for_the_whole_disable_period_is_disabled() {
    let retries = schedule(10, "100ms");
    let env = [
        ("HERALD_DISABLE_AFTER", "1s"),
        ("HERALD_BREAKER_COOLDOWN", "200ms"),
        ("HERALD_BREAKER_MAX_COOLDOWN", "200ms"),
        ("HERALD_RETRY_SCHEDULE", retries.as_str()),
    ];
    let Setup { herald, app, ep, .. } = setup(&env, Reply::status(503), json!({})).await;
    let started = Instant::now();
    send_many(&herald, &app, "a.b", 3).await;
    let disabled = wait_until("the endpoint to be disabled", WAIT, || async {
        let e = endpoint(&herald, &app, &ep).await;
        (e["disabled"] == true).then_some(e)
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "disabled before the period ended"
    );
    let reason = disabled["disabledReason"].as_str().unwrap();
    assert!(reason.contains("every attempt failed for 1s"), "{reason}");
    let events = disabled_events(&herald.get("/operational-event").await);
    assert_eq!(events[0]["data"]["reason"], reason);
}

/// The `endpoint.disabled` events of an operational event listing (the log holds other kinds too).
fn disabled_events(list: &Value) -> Vec<Value> {
    list["data"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["eventType"] == "endpoint.disabled")
        .cloned()
        .collect()
}

#[tokio::test]
async fn ordered_keys_go_one_at_a_time_in_order_and_a_dead_head_unblocks_its_key() {
    let env = [("HERALD_RETRY_SCHEDULE", "200ms,200ms")];
    let ok = Reply::status(200).delay(Duration::from_millis(50));
    let Setup {
        herald, receiver, app, ..
    } = setup(&env, ok, json!({"ordering": "key"})).await;
    receiver.rule("\"poison\":true", Reply::status(500));
    let msg = |key: &str, n: u32, poison: bool| json!({"eventType": "a.b", "orderingKey": key, "payload": {"key": key, "n": n, "poison": poison}});
    send(&herald, &app, msg("x", 1, true)).await;
    for n in 2..=3 {
        send(&herald, &app, msg("x", n, false)).await;
    }
    for n in 1..=3 {
        send(&herald, &app, msg("y", n, false)).await;
    }
    // x1 is tried three times (and dies), then x2 and x3; y's three go meanwhile.
    let got = receiver.wait_for(3 + 2 + 3, WAIT).await;
    let of = |key: &str| -> Vec<(u64, Instant, u16)> {
        got.iter()
            .filter_map(|r| {
                let body: Value = serde_json::from_slice(&r.body).ok()?;
                (body["key"] == key).then(|| (body["n"].as_u64().unwrap_or(0), r.at, r.status))
            })
            .collect()
    };
    let x = of("x");
    let y = of("y");
    assert_eq!(
        x.iter().map(|(n, ..)| *n).collect::<Vec<_>>(),
        [1, 1, 1, 2, 3],
        "the head is retried until it dies, then the rest in order"
    );
    assert_eq!(y.iter().map(|(n, ..)| *n).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(
        y[2].1 < x[3].1,
        "a failing head blocks only its own key: y finished before x moved on"
    );
    // A successful delivery takes 50 ms at the receiver: the next one of its key must not start sooner.
    for pair in x.windows(2).chain(y.windows(2)).filter(|p| p[0].2 == 200) {
        assert!(
            pair[1].1 - pair[0].1 >= Duration::from_millis(45),
            "two deliveries of one key overlapped"
        );
    }
}

#[tokio::test]
async fn flow_control_settings_are_validated_and_echoed() {
    let herald = Herald::start(&[]).await;
    let app = herald.app("shop").await;
    let url = "http://127.0.0.1:9/x";
    for (body, field) in [
        (json!({"url": url, "maxConcurrency": 0}), "maxConcurrency"),
        (json!({"url": url, "maxConcurrency": 1001}), "maxConcurrency"),
        (json!({"url": url, "ordering": "fifo"}), "ordering"),
    ] {
        let (status, error) = herald.call("POST", &format!("/app/{app}/endpoint"), Some(body)).await;
        assert_eq!(status, 422, "{error}");
        assert!(common::names_field(&error, field), "{error}");
    }
    let created = herald
        .post(
            &format!("/app/{app}/endpoint"),
            json!({"url": url, "maxConcurrency": 4, "ordering": "key"}),
        )
        .await;
    assert_eq!(created["maxConcurrency"], 4);
    assert_eq!(created["ordering"], "key");
    let id = created["id"].as_str().unwrap();
    let patched = patch_endpoint(&herald, &app, id, json!({"maxConcurrency": null, "ordering": "none"})).await;
    assert!(patched.get("maxConcurrency").is_none(), "{patched}");
    assert_eq!(patched["ordering"], "none");
    let (status, error) = herald
        .call(
            "POST",
            &format!("/app/{app}/msg"),
            Some(json!({"eventType": "a.b", "payload": {}, "orderingKey": ""})),
        )
        .await;
    assert_eq!(status, 422, "{error}");
    assert!(common::names_field(&error, "orderingKey"), "{error}");
}

#[tokio::test]
async fn an_endpoint_can_shorten_its_attempt_timeout_within_the_operators_bound() {
    let env = [
        ("HERALD_REQUEST_TIMEOUT", "5s"),
        ("HERALD_MAX_REQUEST_TIMEOUT", "10s"),
        ("HERALD_RETRY_SCHEDULE", "10s"),
    ];
    let slow = Reply::status(200).delay(Duration::from_secs(3));
    let Setup {
        herald,
        receiver,
        app,
        ep,
    } = setup(&env, slow, json!({"requestTimeoutMs": 300})).await;
    assert_eq!(endpoint(&herald, &app, &ep).await["requestTimeoutMs"], 300);
    let started = Instant::now();
    let msg = send(&herald, &app, json!({"eventType": "a.b", "payload": {}})).await;
    let attempts = herald.wait_attempts(&app, &msg, WAIT, |a| !a.is_empty()).await;
    assert_eq!(attempts[0]["outcome"], "timeout", "{attempts:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the endpoint's 300 ms applied, not the 5 s default"
    );
    assert_eq!(receiver.received().len(), 1);
    let (status, error) = herald
        .call(
            "PATCH",
            &format!("/app/{app}/endpoint/{ep}"),
            Some(json!({"requestTimeoutMs": 20_000})),
        )
        .await;
    assert_eq!(status, 422, "beyond the operator's bound: {error}");
    assert!(common::names_field(&error, "requestTimeoutMs"), "{error}");
}
