//! The endpoint ownership check, end to end: in an application that requires it, a new endpoint stays
//! disabled until it echoes a signed `webhook.verification` challenge; a receiver that does not echo is
//! never sent anything else; `…/verify` runs the check again.

use crate::common;

use std::time::{Duration, Instant};

use common::{Herald, Received, Receiver, Reply};
use herald_signature::{HmacSecret, Verifier};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(15);

async fn endpoint_when(herald: &Herald, app: &str, ep: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let e = herald.get(&format!("/app/{app}/endpoint/{ep}")).await;
        if check(&e) {
            return e;
        }
        assert!(
            Instant::now() < deadline,
            "endpoint never reached the expected state: {e}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The endpoint's ownership check failed (it is held until it passes).
fn check_failed(endpoint: &Value) -> bool {
    endpoint["disabledReason"]
        .as_str()
        .is_some_and(|reason| reason.starts_with("ownership verification failed"))
}

async fn verifying_app(herald: &Herald) -> String {
    let app = herald
        .post("/app", json!({"name": "careful", "verifyEndpoints": true}))
        .await;
    assert_eq!(app["verifyEndpoints"], true);
    app["id"].as_str().unwrap().to_owned()
}

/// `received` is signed with the endpoint's secret under the header `names` (id, timestamp, signature).
async fn assert_signed(herald: &Herald, app: &str, ep: &str, received: &Received, names: [&str; 3]) {
    let secret = herald.get(&format!("/app/{app}/endpoint/{ep}/secret")).await["key"]
        .as_str()
        .unwrap()
        .to_owned();
    let [id, timestamp, signature] = names.map(|name| received.header(name));
    Verifier::new(vec![HmacSecret::parse(&secret).unwrap().into()])
        .verify_now(id, timestamp, signature, &received.body)
        .unwrap_or_else(|e| panic!("not signed with the endpoint's secret under {names:?}: {e}"));
}

#[tokio::test]
async fn the_challenge_goes_out_under_the_header_names_the_endpoint_chose() {
    // The server sends `webhook-*`; this endpoint asked for `svix-*` alone.
    let herald = Herald::start(&[]).await;
    let receiver = Receiver::start(Reply::status(200).echo()).await;
    let app = verifying_app(&herald).await;
    let created = herald
        .post(
            &format!("/app/{app}/endpoint"),
            json!({"url": receiver.url(), "signatureHeaders": "svix"}),
        )
        .await;
    assert_eq!(created["signatureHeaders"], "svix", "{created}");
    let ep = created["id"].as_str().unwrap().to_owned();
    endpoint_when(&herald, &app, &ep, |e| e["disabled"] == false).await;
    let challenge = &receiver.received()[0];
    for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        assert!(
            challenge.headers.get(name).is_none(),
            "{name} sent to an endpoint that chose svix-*"
        );
    }
    assert_signed(
        &herald,
        &app,
        &ep,
        challenge,
        ["svix-id", "svix-timestamp", "svix-signature"],
    )
    .await;
}

#[tokio::test]
async fn an_endpoint_that_echoes_the_signed_challenge_is_enabled() {
    let herald = Herald::start(&[]).await;
    let receiver = Receiver::start(Reply::status(200).echo()).await;
    let app = verifying_app(&herald).await;
    let created = herald
        .post(&format!("/app/{app}/endpoint"), json!({"url": receiver.url()}))
        .await;
    assert_eq!(created["disabled"], true, "held until verified: {created}");
    assert_eq!(created["disabledReason"], "awaiting ownership verification");
    let ep = created["id"].as_str().unwrap().to_owned();
    let enabled = endpoint_when(&herald, &app, &ep, |e| e["disabled"] == false).await;
    assert!(enabled.get("disabledReason").is_none(), "{enabled}");

    let challenge = &receiver.received()[0];
    let body: Value = serde_json::from_slice(&challenge.body).unwrap();
    assert_eq!(body["type"], "webhook.verification");
    assert!(body["challenge"].as_str().unwrap().len() >= 32);
    let names = ["webhook-id", "webhook-timestamp", "webhook-signature"];
    assert_signed(&herald, &app, &ep, challenge, names).await;

    herald
        .post(
            &format!("/app/{app}/msg"),
            json!({"eventType": "a.b", "payload": {"x": 1}}),
        )
        .await;
    let got = receiver.wait_for(2, WAIT).await;
    let delivered: Value = serde_json::from_slice(&got[1].body).unwrap();
    assert_eq!(delivered, json!({"x": 1}), "after the check, ordinary deliveries flow");
}

#[tokio::test]
async fn an_endpoint_that_does_not_echo_stays_disabled_until_it_passes() {
    let herald = Herald::start(&[]).await;
    let receiver = Receiver::start(Reply::status(200).body("ok")).await;
    let app = verifying_app(&herald).await;
    let (ep, _) = herald.endpoint(&app, json!({"url": receiver.url()})).await;
    let failed = endpoint_when(&herald, &app, &ep, check_failed).await;
    assert_eq!(failed["disabled"], true);
    assert!(
        failed["disabledReason"].as_str().unwrap().contains("without echoing"),
        "{failed}"
    );
    herald
        .post(&format!("/app/{app}/msg"), json!({"eventType": "a.b", "payload": {}}))
        .await;
    // Asking to enable it does not skip the check.
    let (_, patched) = herald
        .call(
            "PATCH",
            &format!("/app/{app}/endpoint/{ep}"),
            Some(json!({"disabled": false})),
        )
        .await;
    assert_eq!(patched["disabled"], true, "{patched}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        receiver
            .received()
            .iter()
            .all(|r| String::from_utf8_lossy(&r.body).contains("webhook.verification")),
        "only challenges were sent"
    );

    // Fixed receiver: run the check again; the queued message then flows.
    receiver.set_fallback(Reply::status(200).echo());
    let (status, _) = herald
        .call("POST", &format!("/app/{app}/endpoint/{ep}/verify"), None)
        .await;
    assert_eq!(status, 202);
    endpoint_when(&herald, &app, &ep, |e| e["disabled"] == false).await;
    let deadline = Instant::now() + WAIT;
    while !receiver
        .received()
        .iter()
        .any(|r| !String::from_utf8_lossy(&r.body).contains("webhook.verification"))
    {
        assert!(Instant::now() < deadline, "the queued message was not delivered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn without_the_setting_endpoints_are_enabled_at_once_and_get_no_challenge() {
    let herald = Herald::start(&[]).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let app = herald.app("relaxed").await;
    let (ep, _) = herald.endpoint(&app, json!({"url": receiver.url()})).await;
    let e = herald.get(&format!("/app/{app}/endpoint/{ep}")).await;
    assert_eq!(e["disabled"], false);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(receiver.received().is_empty(), "no challenge without the setting");
}

/// The challenges `receiver` got so far.
fn challenges(receiver: &Receiver) -> usize {
    receiver
        .received()
        .iter()
        .filter(|r| String::from_utf8_lossy(&r.body).contains("webhook.verification"))
        .count()
}

/// Two nodes on one PostgreSQL database hear every endpoint change, but the check runs once, on the node
/// whose API wrote the endpoint: one challenge per creation and per `…/verify`, whichever node took it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_one_database_send_one_challenge_per_request() {
    let Some(database) = herald_store::testdb::fresh("two_nodes_send_one_challenge_per_request").await else {
        return;
    };
    let database = std::sync::Arc::new(database);
    let first = Herald::start_on(database.clone(), &[]).await;
    let second = Herald::start_on(database.clone(), &[]).await;
    let receiver = Receiver::start(Reply::status(200).body("no echo")).await;
    let app = verifying_app(&first).await;
    let (ep, _) = first.endpoint(&app, json!({"url": receiver.url()})).await;
    endpoint_when(&second, &app, &ep, check_failed).await;
    let (status, _) = second
        .call("POST", &format!("/app/{app}/endpoint/{ep}/verify"), None)
        .await;
    assert_eq!(status, 202);
    endpoint_when(&first, &app, &ep, check_failed).await;
    // Long enough for the other node's notification of each write to have come and gone.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        challenges(&receiver),
        2,
        "one challenge per creation and per `…/verify`"
    );
}

/// A check that passes for the URL it read does not enable the URL written while it ran: the new URL gets
/// its own challenge, and its answer is what counts.
#[tokio::test]
async fn a_url_changed_during_its_check_is_checked_itself() {
    let herald = Herald::start(&[]).await;
    let slow_echo = Receiver::start(Reply::status(200).echo().delay(Duration::from_millis(1500))).await;
    let silent = Receiver::start(Reply::status(200).body("no echo")).await;
    let app = verifying_app(&herald).await;
    let (ep, _) = herald.endpoint(&app, json!({"url": slow_echo.url()})).await;
    // The first check is held at the slow receiver while the URL moves.
    let deadline = Instant::now() + WAIT;
    while challenges(&slow_echo) == 0 {
        assert!(Instant::now() < deadline, "the first challenge never came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, _) = herald
        .call(
            "PATCH",
            &format!("/app/{app}/endpoint/{ep}"),
            Some(json!({"url": silent.url()})),
        )
        .await;
    assert_eq!(status, 200);
    let failed = endpoint_when(&herald, &app, &ep, check_failed).await;
    assert_eq!(failed["url"], silent.url(), "{failed}");
    assert!(challenges(&silent) >= 1, "the new URL was challenged");
    // Past the slow receiver's answer: its pass never enabled the new URL.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let after = herald.get(&format!("/app/{app}/endpoint/{ep}")).await;
    assert_eq!(after["disabled"], true, "{after}");
    assert!(check_failed(&after), "{after}");
}
