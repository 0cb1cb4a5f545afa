//! `herald inbox` end to end: the real binary on a real SQLite file or PostgreSQL database, real HTTP on
//! loopback, real handlers, real `kill -9`.
//!
//! The tests that exercise the store (deduplication, custody across `kill -9`, retries, the version guard,
//! replays and listings, sharing a database with the sender) run on both backends: `NAME::default_backend`
//! (SQLite, or PostgreSQL under `HERALD_TEST_BACKEND=postgres`) and `NAME::postgres` (always PostgreSQL;
//! skipped with a visible message when it is unreachable, unless `HERALD_REQUIRE_POSTGRES=1`).

use crate::common;

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use common::{Herald, Receiver, Reply};
use herald_signature::{HmacSecret, Verifier, body_hmac, github, stripe};
use serde_json::{Value, json};

const SECRET_A: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SECRET_B: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const SECRET_C: &str = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYX";
const VECTORS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/vectors/signatures.json");
const WAIT: Duration = Duration::from_secs(20);

/// A request header, name and value.
type Header = (String, String);

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// A Standard Webhooks source forwarding to `handler`, with extra TOML lines.
fn sw_source(name: &str, secrets: &[&str], handler: &str, extra: &str) -> String {
    let secrets: Vec<String> = secrets.iter().map(|s| format!("{s:?}")).collect();
    format!(
        "[[source]]\nname = \"{name}\"\nscheme = \"standard-webhooks\"\nsecrets = [{}]\nforward_to = \"{handler}\"\n{extra}\n",
        secrets.join(", ")
    )
}

/// Standard Webhooks headers for `body`, signed with `secret` at `timestamp`.
fn sw_headers(secret: &str, msg_id: &str, timestamp: i64, body: &str) -> Vec<(String, String)> {
    let signature = HmacSecret::parse(secret)
        .expect("secret")
        .sign(msg_id, timestamp, body.as_bytes());
    vec![
        ("content-type".into(), "application/json".into()),
        ("webhook-id".into(), msg_id.into()),
        ("webhook-timestamp".into(), timestamp.to_string()),
        ("webhook-signature".into(), signature),
    ]
}

async fn send(inbox: &Herald, source: &str, headers: &[(String, String)], body: &str) -> (u16, Value) {
    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    inbox
        .post_raw(&format!("/in/{source}"), body.as_bytes(), &headers)
        .await
}

/// Send a correctly signed Standard Webhooks event and return its inbox id.
async fn send_ok(inbox: &Herald, source: &str, secret: &str, msg_id: &str, body: &str) -> String {
    let (status, json) = send(inbox, source, &sw_headers(secret, msg_id, now(), body), body).await;
    assert_eq!(status, 200, "{json}");
    json["id"].as_str().expect("id").to_owned()
}

async fn event(inbox: &Herald, id: &str) -> Value {
    inbox.get(&format!("/inbox/event/{id}/")).await
}

async fn wait_status(inbox: &Herald, id: &str, status: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let event = event(inbox, id).await;
        if event["status"] == status {
            return event;
        }
        assert!(Instant::now() < deadline, "event never became {status}: {event:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn list(inbox: &Herald, query: &str) -> Vec<Value> {
    inbox.get(&format!("/inbox/event/?limit=250{query}")).await["data"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// How many requests with each `herald-inbox-id` the handler got.
fn per_inbox_id(requests: &[common::Received]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for request in requests {
        *counts.entry(request.header("herald-inbox-id").to_owned()).or_insert(0) += 1;
    }
    counts
}

/// Which store a test's inbox runs on.
#[derive(Debug, Clone, Copy)]
enum Backend {
    /// SQLite, or PostgreSQL under `HERALD_TEST_BACKEND=postgres`.
    Default,
    /// A fresh PostgreSQL database.
    Postgres,
}

/// `NAME::default_backend` and `NAME::postgres` for each `async fn NAME(backend: Backend)`.
macro_rules! on_both_backends {
    ($($test:ident),* $(,)?) => {$(
        mod $test {
            #[tokio::test]
            async fn default_backend() {
                super::$test(super::Backend::Default).await;
            }

            #[tokio::test]
            async fn postgres() {
                super::$test(super::Backend::Postgres).await;
            }
        }
    )*};
}

on_both_backends!(
    a_duplicate_is_acknowledged_stored_once_and_forwarded_once,
    kill_9_right_after_the_2xx_while_the_handler_is_down_loses_nothing,
    a_handler_down_for_a_while_receives_everything_once_each,
    the_version_guard_drops_a_stale_event_and_poison_is_bad_input,
    replay_of_one_event_and_of_a_window_forwards_again,
    herald_serve_delivers_into_herald_inbox,
);

/// Start `herald inbox` on `backend`; `None` when that is PostgreSQL and it is unreachable (the test
/// database module has said so visibly, and fails instead when PostgreSQL is required).
async fn start_inbox(
    backend: Backend,
    test: &str,
    config: &str,
    extra_env: &[(&str, &str)],
    addr: Option<std::net::SocketAddr>,
) -> Option<Herald> {
    match backend {
        Backend::Default => Some(Herald::start_inbox(config, extra_env, addr).await),
        Backend::Postgres => Herald::start_inbox_pg(test, config, extra_env, addr).await,
    }
}

/// Give a forwarder that should stay idle the chance to misbehave.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(600)).await;
}

async fn a_duplicate_is_acknowledged_stored_once_and_forwarded_once(backend: Backend) {
    let handler = Receiver::start(Reply::status(200)).await;
    let Some(inbox) = start_inbox(
        backend,
        "a_duplicate_is_acknowledged_stored_once_and_forwarded_once",
        &sw_source("billing", &[SECRET_A], &handler.url(), ""),
        &[],
        None,
    )
    .await
    else {
        return;
    };
    let body = r#"{"type":"invoice.paid","data":{"id":"inv_1","amount":1200}}"#;
    let headers = sw_headers(SECRET_A, "msg_dup", now(), body);

    let (first, second) = tokio::join!(
        send(&inbox, "billing", &headers, body),
        send(&inbox, "billing", &headers, body)
    );
    let third = send(&inbox, "billing", &headers, body).await;
    let answers = [first, second, third];
    for (status, json) in &answers {
        assert_eq!(*status, 200, "{json}");
        assert!(json["id"].as_str().unwrap().starts_with("evt_"), "{json}");
    }
    let id = answers[0].1["id"].as_str().unwrap().to_owned();
    assert!(
        answers.iter().all(|(_, json)| json["id"] == id.as_str()),
        "one id for all copies"
    );
    let originals = answers.iter().filter(|(_, json)| json["duplicate"] == false).count();
    assert_eq!(originals, 1, "exactly one copy is the original: {answers:?}");

    wait_status(&inbox, &id, "forwarded").await;
    handler.wait_for(1, WAIT).await;
    settle().await;
    let got = handler.received();
    assert_eq!(got.len(), 1, "forwarded once");
    assert_eq!(list(&inbox, "&source=billing").await.len(), 1, "stored once");

    // The handler gets the original bytes and headers, plus the inbox id, and can verify them itself.
    let request = &got[0];
    assert_eq!(request.body.as_ref(), body.as_bytes());
    assert_eq!(request.header("herald-inbox-id"), id);
    assert_eq!(request.header("webhook-id"), "msg_dup");
    assert_eq!(request.header("content-type"), "application/json");
    let verifier = Verifier::new(vec![HmacSecret::parse(SECRET_A).unwrap().into()]);
    verifier
        .verify_ignoring_timestamp(
            request.header("webhook-id"),
            request.header("webhook-timestamp"),
            request.header("webhook-signature"),
            &request.body,
        )
        .expect("forwarded signature still verifies");
    let stats = inbox.get("/inbox/stats/").await;
    assert_eq!(
        (stats["accepted"].as_u64(), stats["duplicates"].as_u64()),
        (Some(1), Some(2))
    );
}

#[tokio::test]
async fn forged_requests_get_401_and_are_neither_stored_nor_forwarded() {
    let handler = Receiver::start(Reply::status(200)).await;
    let config = format!(
        "max_body_bytes = 4096\n{}",
        sw_source("billing", &[SECRET_A, SECRET_B], &handler.url(), "")
    );
    let inbox = Herald::start_inbox(&config, &[], None).await;
    let body = r#"{"data":{"id":"inv_2"}}"#;
    let good = sw_headers(SECRET_A, "msg_forged", now(), body);

    let mut flipped = good.clone();
    let signature = &mut flipped[3].1;
    let last = signature.pop().unwrap();
    signature.push(if last == 'A' { 'B' } else { 'A' });
    let wrong_secret = sw_headers(SECRET_C, "msg_forged", now(), body);
    let stale = sw_headers(SECRET_A, "msg_forged", now() - 600, body);
    let future = sw_headers(SECRET_A, "msg_forged", now() + 600, body);
    let no_signature: Vec<_> = good.iter().filter(|(k, _)| k != "webhook-signature").cloned().collect();
    let no_id: Vec<_> = good.iter().filter(|(k, _)| k != "webhook-id").cloned().collect();
    let forged: [(&str, &[Header], &str); 8] = [
        ("flipped signature byte", &flipped, body),
        ("wrong secret", &wrong_secret, body),
        ("timestamp 10 minutes old", &stale, body),
        ("timestamp 10 minutes ahead", &future, body),
        ("no signature header", &no_signature, body),
        ("no id header", &no_id, body),
        ("no headers at all", &[], body),
        ("body changed after signing", &good, r#"{"data":{"id":"inv_3"}}"#),
    ];
    for (what, headers, body) in forged {
        let (status, json) = send(&inbox, "billing", headers, body).await;
        assert_eq!(status, 401, "{what}: {json}");
        assert_eq!(
            json,
            json!({"code": "unauthorized", "detail": "signature verification failed"}),
            "{what}: nothing that helps an attacker"
        );
    }
    let stats = inbox.get("/inbox/stats/").await;
    assert_eq!(stats["rejected"], 8, "{stats}");
    assert_eq!(stats["rejectedOutsideTolerance"], 2, "{stats}");
    assert!(list(&inbox, "").await.is_empty(), "nothing forged was stored");

    // Either of the two secrets is accepted (rotation).
    let with_a = send_ok(&inbox, "billing", SECRET_A, "msg_a", body).await;
    let with_b = send_ok(&inbox, "billing", SECRET_B, "msg_b", body).await;
    wait_status(&inbox, &with_a, "forwarded").await;
    wait_status(&inbox, &with_b, "forwarded").await;
    settle().await;
    let forwarded: BTreeSet<String> = per_inbox_id(&handler.received()).into_keys().collect();
    assert_eq!(
        forwarded,
        BTreeSet::from([with_a, with_b]),
        "only the verified events reached the handler"
    );
    assert_eq!(handler.received().len(), 2);

    // Unknown source, oversized body: JSON errors, nothing stored.
    let (status, json) = send(&inbox, "nobody", &good, body).await;
    assert_eq!((status, json["code"].as_str()), (404, Some("not_found")), "{json}");
    let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(5000));
    let (status, json) = send(&inbox, "billing", &sw_headers(SECRET_A, "msg_big", now(), &big), &big).await;
    assert_eq!(
        (status, json["code"].as_str()),
        (413, Some("payload_too_large")),
        "{json}"
    );
    assert_eq!(list(&inbox, "").await.len(), 2);
}

#[tokio::test]
async fn stripe_github_hmac_sources_and_the_shared_vectors() {
    let vectors: Value = serde_json::from_str(&std::fs::read_to_string(VECTORS).expect("vectors")).unwrap();
    let handler = Receiver::start(Reply::status(200)).await;
    let url = handler.url();
    let sw_vector = &vectors["standard_webhooks_v1"][0];
    let bare_secret = sw_vector["secret"].as_str().unwrap().trim_start_matches("whsec_");
    // The vectors are years old: their sources get a tolerance that reaches back to them.
    let config = format!(
        r#"
[[source]]
name = "stripe"
scheme = "stripe"
secrets = ["whsec_test_secret"]
forward_to = "{url}"

[[source]]
name = "stripe-vector"
scheme = "stripe"
secrets = ["whsec_test_secret"]
tolerance = "36500d"
forward_to = "{url}"

[[source]]
name = "github"
scheme = "github"
secrets = ["It's a Secret to Everybody"]
forward_to = "{url}"

[[source]]
name = "acme"
scheme = "hmac"
header = "X-Acme-Signature"
encoding = "base64"
prefix = "sha256="
event_id = "/id"
secrets = ["acme secret"]
forward_to = "{url}"

{}"#,
        sw_source("sw-vector", &[bare_secret], &url, "tolerance = \"36500d\"")
    );
    let inbox = Herald::start_inbox(&config, &[], None).await;
    let mut accepted = Vec::new();
    let mut expect = |what: &str, (status, json): (u16, Value), want: u16| {
        assert_eq!(status, want, "{what}: {json}");
        if status == 200 && json["duplicate"] == false {
            accepted.push(json["id"].as_str().unwrap().to_owned());
        }
    };
    let h = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    };

    // Stripe: signed now, with the right and a wrong secret; the vector on a source whose tolerance
    // reaches it, and on one whose does not.
    let body = r#"{"id":"evt_s1","object":"event"}"#;
    let good = stripe::sign("whsec_test_secret", now(), body.as_bytes());
    let bad = stripe::sign("whsec_other", now(), body.as_bytes());
    expect(
        "stripe",
        send(&inbox, "stripe", &h(&[("Stripe-Signature", &good)]), body).await,
        200,
    );
    expect(
        "stripe wrong secret",
        send(&inbox, "stripe", &h(&[("Stripe-Signature", &bad)]), body).await,
        401,
    );
    let sv = &vectors["stripe"][0];
    let (payload, header) = (sv["payload"].as_str().unwrap(), sv["header"].as_str().unwrap());
    expect(
        "stripe vector",
        send(&inbox, "stripe-vector", &h(&[("Stripe-Signature", header)]), payload).await,
        200,
    );
    expect(
        "stripe vector, default tolerance",
        send(&inbox, "stripe", &h(&[("Stripe-Signature", header)]), payload).await,
        401,
    );

    // GitHub: the vector as is (no timestamp), deduplicated on X-GitHub-Delivery.
    let gv = &vectors["github"][0];
    let (payload, header) = (gv["payload"].as_str().unwrap(), gv["header"].as_str().unwrap());
    let delivery = [
        ("X-Hub-Signature-256", header),
        ("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
    ];
    expect(
        "github vector",
        send(&inbox, "github", &h(&delivery), payload).await,
        200,
    );
    let wrong = github::sign(b"not the secret", payload.as_bytes());
    let forged = [("X-Hub-Signature-256", wrong.as_str()), ("X-GitHub-Delivery", "d-2")];
    expect(
        "github wrong secret",
        send(&inbox, "github", &h(&forged), payload).await,
        401,
    );

    // Generic HMAC: base64 after a prefix.
    let body = r#"{"id":"acme_1"}"#;
    let tag = base64::engine::general_purpose::STANDARD.encode(body_hmac::sign(b"acme secret", body.as_bytes()));
    let good = format!("sha256={tag}");
    expect(
        "hmac",
        send(&inbox, "acme", &h(&[("X-Acme-Signature", &good)]), body).await,
        200,
    );
    let wrong = base64::engine::general_purpose::STANDARD.encode(body_hmac::sign(b"acme secreT", body.as_bytes()));
    let wrong = format!("sha256={wrong}");
    expect(
        "hmac wrong secret",
        send(&inbox, "acme", &h(&[("X-Acme-Signature", &wrong)]), body).await,
        401,
    );
    expect(
        "hmac without prefix",
        send(&inbox, "acme", &h(&[("X-Acme-Signature", &tag)]), body).await,
        401,
    );

    // Standard Webhooks vector, configured without the whsec_ prefix: every must_reject is refused, the
    // signature and the rotation header are accepted (the second as a duplicate of the first).
    let (id, ts, payload) = (
        sw_vector["msg_id"].as_str().unwrap(),
        sw_vector["timestamp"].as_i64().unwrap().to_string(),
        sw_vector["payload"].as_str().unwrap(),
    );
    let sw = |signature: &str| {
        h(&[
            ("webhook-id", id),
            ("webhook-timestamp", ts.as_str()),
            ("webhook-signature", signature),
        ])
    };
    for reject in sw_vector["must_reject"].as_array().unwrap() {
        let signature = reject.as_str().unwrap();
        expect(
            &format!("vector must_reject {signature:?}"),
            send(&inbox, "sw-vector", &sw(signature), payload).await,
            401,
        );
    }
    let signature = sw_vector["signature"].as_str().unwrap();
    expect(
        "vector signature",
        send(&inbox, "sw-vector", &sw(signature), payload).await,
        200,
    );
    let rotation = sw_vector["must_accept_header"].as_str().unwrap();
    let (status, json) = send(&inbox, "sw-vector", &sw(rotation), payload).await;
    assert_eq!((status, json["duplicate"].as_bool()), (200, Some(true)), "{json}");

    assert_eq!(accepted.len(), 5, "{accepted:?}");
    for id in &accepted {
        wait_status(&inbox, id, "forwarded").await;
    }
    settle().await;
    let forwarded: BTreeSet<String> = per_inbox_id(&handler.received()).into_keys().collect();
    assert_eq!(forwarded, accepted.iter().cloned().collect::<BTreeSet<_>>());
    assert_eq!(handler.received().len(), 5);
    // Each scheme's event id came from the right place.
    let ids: BTreeSet<String> = list(&inbox, "")
        .await
        .iter()
        .map(|e| format!("{}:{}", e["source"].as_str().unwrap(), e["eventId"].as_str().unwrap()))
        .collect();
    let want: BTreeSet<String> = [
        "stripe:evt_s1",
        "stripe-vector:evt_test",
        "github:72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "acme:acme_1",
        "sw-vector:msg_p5jXN8AQM9LWM0D4loKWxJek",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(ids, want);
}

async fn kill_9_right_after_the_2xx_while_the_handler_is_down_loses_nothing(backend: Backend) {
    let port = common::free_port();
    let handler_url = format!("http://127.0.0.1:{port}/hook");
    let schedule = vec!["300ms"; 40].join(",");
    // What this test is about is the kill -9 after the 2xx; twenty posts at once on a loaded machine can
    // wait longer than the default 1 s for a PostgreSQL connection and be answered 503 (correct, but not
    // what is tested here), so the wait is longer.
    let config = format!(
        "database_timeout = \"10s\"\n{}",
        sw_source("billing", &[SECRET_A], &handler_url, "")
    );
    let Some(mut inbox) = start_inbox(
        backend,
        "kill_9_right_after_the_2xx_while_the_handler_is_down_loses_nothing",
        &config,
        &[("HERALD_INBOX_RETRY_SCHEDULE", schedule.as_str())],
        None,
    )
    .await
    else {
        return;
    };

    let sends = (0..20).map(|n| {
        let inbox = &inbox;
        async move {
            let body = format!(r#"{{"n":{n}}}"#);
            send_ok(inbox, "billing", SECRET_A, &format!("msg_custody_{n}"), &body).await
        }
    });
    // Concurrent requests share group commits; each 200 still means "on disk".
    let acknowledged: BTreeSet<String> = futures::future::join_all(sends).await.into_iter().collect();
    assert_eq!(acknowledged.len(), 20);

    inbox.kill9();
    inbox.restart().await;
    let handler = Receiver::bind(format!("127.0.0.1:{port}").parse().unwrap(), Reply::status(200)).await;
    handler.wait_for(20, WAIT).await;
    for id in &acknowledged {
        wait_status(&inbox, id, "forwarded").await;
    }
    let forwarded: BTreeSet<String> = per_inbox_id(&handler.received()).into_keys().collect();
    assert_eq!(forwarded, acknowledged, "every acknowledged event reached the handler");
}

async fn a_handler_down_for_a_while_receives_everything_once_each(backend: Backend) {
    let port = common::free_port();
    let handler_url = format!("http://127.0.0.1:{port}/hook");
    let Some(inbox) = start_inbox(
        backend,
        "a_handler_down_for_a_while_receives_everything_once_each",
        &sw_source("billing", &[SECRET_A], &handler_url, ""),
        &[(
            "HERALD_INBOX_RETRY_SCHEDULE",
            "100ms,200ms,300ms,400ms,500ms,500ms,500ms,500ms,500ms,500ms,500ms,500ms",
        )],
        None,
    )
    .await
    else {
        return;
    };
    let mut ids = BTreeSet::new();
    for n in 0..5 {
        ids.insert(
            send_ok(
                &inbox,
                "billing",
                SECRET_A,
                &format!("msg_down_{n}"),
                &format!(r#"{{"n":{n}}}"#),
            )
            .await,
        );
    }
    // First the connection is refused...
    tokio::time::sleep(Duration::from_millis(700)).await;
    for id in &ids {
        let event = event(&inbox, id).await;
        assert_eq!(event["status"], "pending", "{event}");
        assert!(event["attempts"].as_u64().unwrap() >= 1, "{event}");
        assert!(event["lastError"].as_str().is_some(), "{event}");
    }
    // ...then the handler is up but answers 503 for a while...
    let handler = Receiver::bind(format!("127.0.0.1:{port}").parse().unwrap(), Reply::status(200)).await;
    handler.script(std::iter::repeat_n(Reply::status(503), 8));
    // ...then it recovers.
    for id in &ids {
        wait_status(&inbox, id, "forwarded").await;
    }
    settle().await;
    let requests = handler.received();
    assert!(requests.len() >= 8 + 5, "{} requests", requests.len());
    // The 503s were answered first; after them each event was accepted exactly once.
    let accepted = per_inbox_id(&requests[8..]);
    assert_eq!(accepted.keys().cloned().collect::<BTreeSet<_>>(), ids);
    assert!(accepted.values().all(|&n| n == 1), "{accepted:?}");
}

async fn the_version_guard_drops_a_stale_event_and_poison_is_bad_input(backend: Backend) {
    let handler = Receiver::start(Reply::status(200)).await;
    let guard = "resource_key = \"/data/id\"\nversion = \"/data/version\"";
    let Some(inbox) = start_inbox(
        backend,
        "the_version_guard_drops_a_stale_event_and_poison_is_bad_input",
        &sw_source("billing", &[SECRET_A], &handler.url(), guard),
        &[],
        None,
    )
    .await
    else {
        return;
    };
    let v = |n: u32| format!(r#"{{"type":"invoice.updated","data":{{"id":"inv_9","version":{n}}}}}"#);

    let v2 = send_ok(&inbox, "billing", SECRET_A, "msg_v2", &v(2)).await;
    wait_status(&inbox, &v2, "forwarded").await;
    // v1 was sent before v2 but arrives late.
    let v1 = send_ok(&inbox, "billing", SECRET_A, "msg_v1", &v(1)).await;
    let stale = wait_status(&inbox, &v1, "stale").await;
    assert!(stale["lastError"].as_str().unwrap().contains("not newer"), "{stale}");
    // An equal version is not newer either; a newer one goes through; other resources are independent.
    let again = send_ok(&inbox, "billing", SECRET_A, "msg_v2_copy", &v(2)).await;
    wait_status(&inbox, &again, "stale").await;
    let v10 = send_ok(&inbox, "billing", SECRET_A, "msg_v10", &v(10)).await;
    wait_status(&inbox, &v10, "forwarded").await;
    let other = r#"{"data":{"id":"inv_other","version":1}}"#;
    let other = send_ok(&inbox, "billing", SECRET_A, "msg_other", other).await;
    wait_status(&inbox, &other, "forwarded").await;

    // Poison: verified but unusable where the guard needs to parse it.
    let not_json = send_ok(&inbox, "billing", SECRET_A, "msg_poison", "this is not JSON").await;
    let no_version = send_ok(
        &inbox,
        "billing",
        SECRET_A,
        "msg_noversion",
        r#"{"data":{"id":"inv_9"}}"#,
    )
    .await;
    for id in [&not_json, &no_version] {
        let event = wait_status(&inbox, id, "bad_input").await;
        assert!(event["lastError"].as_str().is_some(), "{event}");
    }
    settle().await;
    let bodies: Vec<Value> = handler
        .received()
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    let versions: Vec<(String, u64)> = bodies
        .iter()
        .map(|b| {
            (
                b["data"]["id"].as_str().unwrap().to_owned(),
                b["data"]["version"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        versions,
        vec![("inv_9".into(), 2), ("inv_9".into(), 10), ("inv_other".into(), 1)],
        "the handler never sees v1, the copy of v2, or the poison"
    );
    let listed: BTreeSet<String> = list(&inbox, "&status=bad_input")
        .await
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed, BTreeSet::from([not_json.clone(), no_version]));
    let listed_stale = list(&inbox, "&status=stale&source=billing").await;
    assert_eq!(listed_stale.len(), 2);

    // A replay is an explicit request: it bypasses the guard (and does not lower the mark).
    let (status, json) = inbox.call("POST", &format!("/inbox/event/{v1}/replay/"), None).await;
    assert_eq!(status, 202, "{json}");
    wait_status(&inbox, &v1, "forwarded").await;
    let late = send_ok(&inbox, "billing", SECRET_A, "msg_v3", &v(3)).await;
    wait_status(&inbox, &late, "stale").await;
}

async fn replay_of_one_event_and_of_a_window_forwards_again(backend: Backend) {
    let handler = Receiver::start(Reply::status(200)).await;
    let config = format!(
        "{}{}",
        sw_source("billing", &[SECRET_A], &handler.url(), ""),
        sw_source("other", &[SECRET_A], &handler.url(), "")
    );
    let Some(inbox) = start_inbox(
        backend,
        "replay_of_one_event_and_of_a_window_forwards_again",
        &config,
        &[],
        None,
    )
    .await
    else {
        return;
    };
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(
            send_ok(
                &inbox,
                "billing",
                SECRET_A,
                &format!("msg_r{n}"),
                &format!(r#"{{"n":{n}}}"#),
            )
            .await,
        );
    }
    let elsewhere = send_ok(&inbox, "other", SECRET_A, "msg_o", "{}").await;
    for id in ids.iter().chain([&elsewhere]) {
        wait_status(&inbox, id, "forwarded").await;
    }
    handler.wait_for(4, WAIT).await;

    // One event.
    let (status, json) = inbox
        .call("POST", &format!("/inbox/event/{}/replay/", ids[1]), None)
        .await;
    assert_eq!(status, 202, "{json}");
    assert_eq!(json["replays"], 1);
    let got = handler.wait_for(5, WAIT).await;
    assert_eq!(got[4].header("herald-inbox-id"), ids[1]);
    assert_eq!(got[4].body.as_ref(), br#"{"n":1}"#);
    wait_status(&inbox, &ids[1], "forwarded").await;

    // A window: every event of the source received since the first one, and only those.
    let since = event(&inbox, &ids[0]).await["receivedAt"].as_str().unwrap().to_owned();
    let (status, json) = inbox
        .call("POST", "/inbox/source/billing/replay/", Some(json!({ "since": since })))
        .await;
    assert_eq!((status, &json), (202, &json!({"replayed": 3})));
    let got = handler.wait_for(8, WAIT).await;
    let replayed: BTreeSet<&str> = got[5..].iter().map(|r| r.header("herald-inbox-id")).collect();
    assert_eq!(replayed, ids.iter().map(String::as_str).collect::<BTreeSet<_>>());
    settle().await;
    assert_eq!(handler.received().len(), 8);

    // Listing pages newest first with the iterator.
    let first = inbox.get("/inbox/event/?limit=3").await;
    assert_eq!(
        (first["data"].as_array().unwrap().len(), &first["done"]),
        (3, &json!(false))
    );
    assert_eq!(first["data"][0]["id"], elsewhere.as_str(), "newest first");
    let iterator = first["iterator"].as_str().unwrap();
    let second = inbox.get(&format!("/inbox/event/?limit=3&iterator={iterator}")).await;
    assert_eq!(
        (second["data"].as_array().unwrap().len(), &second["done"]),
        (1, &json!(true))
    );
    assert_eq!(second["data"][0]["id"], ids[0].as_str());
    let (status, json) = inbox.call("GET", "/inbox/event/?status=lost", None).await;
    assert_eq!((status, json["code"].as_str()), (422, Some("validation")), "{json}");

    // An empty window, mistakes, and no token.
    let (status, json) = inbox
        .call(
            "POST",
            "/inbox/source/billing/replay/",
            Some(json!({"since": "2000-01-01T00:00:00Z", "until": "2000-01-02T00:00:00Z"})),
        )
        .await;
    assert_eq!((status, &json), (202, &json!({"replayed": 0})));
    let (status, json) = inbox
        .call(
            "POST",
            "/inbox/source/billing/replay/",
            Some(json!({"since": "yesterday"})),
        )
        .await;
    assert_eq!((status, json["code"].as_str()), (422, Some("validation")), "{json}");
    let (status, _) = inbox
        .call("POST", "/inbox/source/nobody/replay/", Some(json!({"since": since})))
        .await;
    assert_eq!(status, 404);
    let (status, _) = inbox.call("POST", "/inbox/event/evt_nothing/replay/", None).await;
    assert_eq!(status, 404);
    let (status, json) = inbox.call_with("GET", "/inbox/event/", None, &[]).await;
    assert_eq!((status, json["code"].as_str()), (401, Some("authentication_failed")));
    let health = inbox.call_with("GET", "/health/", None, &[]).await;
    assert_eq!(health, (200, json!({"status": "ok", "database": "ok"})));
}

/// Herald's sender delivering into Herald's inbox, which verifies with the endpoint's secret and forwards
/// to a handler: first as two processes, then as one (`herald serve --inbox`).
async fn herald_serve_delivers_into_herald_inbox(backend: Backend) {
    let handler = Receiver::start(Reply::status(200)).await;
    let mut sender = match backend {
        Backend::Default => Herald::start(&[]).await,
        Backend::Postgres => match Herald::start_pg("herald_serve_delivers_into_herald_inbox", &[]).await {
            Some(sender) => sender,
            None => return,
        },
    };
    let inbox_port = common::free_port();
    let app = sender.app("e2e").await;
    let (_, secret) = sender
        .endpoint(&app, json!({"url": format!("http://127.0.0.1:{inbox_port}/in/herald")}))
        .await;
    let config = sw_source("herald", &[&secret], &handler.url(), "");
    let addr = Some(format!("127.0.0.1:{inbox_port}").parse().unwrap());
    // On PostgreSQL the inbox shares the sender's database: two processes, two schemas' worth of
    // migrations, one database.
    let inbox = match &sender.database {
        Some(database) => Herald::start_inbox_on(database.clone(), &config, &[], addr).await,
        None => Herald::start_inbox(&config, &[], addr).await,
    };
    let payload = json!({"type": "invoice.paid", "data": {"id": "inv_e2e", "version": 1}});
    let message = sender
        .post(
            &format!("/app/{app}/msg"),
            json!({"eventType": "invoice.paid", "payload": payload}),
        )
        .await;
    let msg_id = message["id"].as_str().unwrap();
    let got = handler.wait_for(1, WAIT).await;
    assert_eq!(serde_json::from_slice::<Value>(&got[0].body).unwrap(), payload);
    assert_eq!(got[0].header("webhook-id"), msg_id);
    let stored = list(&inbox, "&source=herald").await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0]["eventId"], msg_id);
    assert_eq!(got[0].header("herald-inbox-id"), stored[0]["id"].as_str().unwrap());
    drop(inbox);

    // One process: the sender delivers to its own /in/herald.
    let (_, own_secret) = sender
        .endpoint(&app, json!({"url": format!("http://{}/in/herald", sender.addr)}))
        .await;
    let config = sender.dir.path().join("inbox.toml");
    std::fs::write(&config, sw_source("herald", &[&own_secret], &handler.url(), "")).unwrap();
    sender
        .env
        .push(("HERALD_SERVE_INBOX".into(), config.display().to_string()));
    sender.kill9();
    sender.restart().await;
    let payload = json!({"type": "invoice.paid", "data": {"id": "inv_one_process"}});
    let message = sender
        .post(
            &format!("/app/{app}/msg"),
            json!({"eventType": "invoice.paid", "payload": payload}),
        )
        .await;
    let msg_id = message["id"].as_str().unwrap();
    let deadline = Instant::now() + WAIT;
    let request = loop {
        // The first endpoint (the stopped inbox) fails; only the new one reaches the handler.
        if let Some(r) = handler
            .received()
            .into_iter()
            .find(|r| r.header("webhook-id") == msg_id)
        {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "the one-process inbox never forwarded {msg_id}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(serde_json::from_slice::<Value>(&request.body).unwrap(), payload);
    // The inbox's admin API shares serve's token and listener; serve's own API is untouched.
    let stored = list(&sender, "&source=herald").await;
    assert_eq!(stored[0]["eventId"], msg_id, "{stored:?}");
    // With a PostgreSQL sender, serve's inbox defaults to the sender's database, where the standalone
    // inbox stored its event before: one database for all of them. With SQLite it keeps its own file.
    let expected = if sender.database.is_some() { 2 } else { 1 };
    assert_eq!(stored.len(), expected, "{stored:?}");
    assert_eq!(sender.get(&format!("/app/{app}")).await["id"], app.as_str());
    let (status, _) = sender
        .call_with("GET", "/inbox/event/", None, &[("authorization", "Bearer wrong")])
        .await;
    assert_eq!(status, 401);
    assert_eq!(sender.call_with("GET", "/health", None, &[]).await.0, 200);
}

/// Two `herald inbox` processes on one PostgreSQL database, as every node of a cluster running
/// `herald serve --inbox` is: both receive and deduplicate, only one forwards, so each event reaches the
/// handler once — even with a slow handler, which keeps events pending long enough for a second
/// forwarder to pick them up too. When one process is killed, the survivor forwards.
#[tokio::test]
async fn two_inboxes_on_one_postgres_database_forward_each_event_once() {
    let test = "two_inboxes_on_one_postgres_database_forward_each_event_once";
    let handler = Receiver::start(Reply::status(200).delay(Duration::from_millis(1_500))).await;
    let config = sw_source("billing", &[SECRET_A], &handler.url(), "");
    let Some(mut first) = Herald::start_inbox_pg(test, &config, &[], None).await else {
        return;
    };
    let database = first.database.clone().expect("a PostgreSQL inbox has a database");
    let second = Herald::start_inbox_on(database, &config, &[], None).await;
    let mut ids = BTreeSet::new();
    for n in 0..10 {
        let inbox = if n % 2 == 0 { &first } else { &second };
        let body = format!(r#"{{"n":{n}}}"#);
        ids.insert(send_ok(inbox, "billing", SECRET_A, &format!("msg_two_{n}"), &body).await);
    }
    // A copy sent to the other process is a duplicate there too.
    let body = r#"{"n":0}"#;
    let (status, json) = send(
        &second,
        "billing",
        &sw_headers(SECRET_A, "msg_two_0", now(), body),
        body,
    )
    .await;
    assert_eq!((status, json["duplicate"].as_bool()), (200, Some(true)), "{json}");
    for id in &ids {
        wait_status(&second, id, "forwarded").await;
    }
    // Time for a second forwarder's poll to find anything left pending.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let counts = per_inbox_id(&handler.received());
    assert_eq!(counts.keys().cloned().collect::<BTreeSet<_>>(), ids);
    assert!(
        counts.values().all(|&n| n == 1),
        "each event forwarded once: {counts:?}"
    );

    // Whichever of the two held the forwarder lock, the survivor forwards what it receives.
    first.kill9();
    let mut later = BTreeSet::new();
    for n in 0..3 {
        let body = format!(r#"{{"after":{n}}}"#);
        later.insert(send_ok(&second, "billing", SECRET_A, &format!("msg_after_{n}"), &body).await);
    }
    for id in &later {
        wait_status(&second, id, "forwarded").await;
    }
    settle().await;
    let counts = per_inbox_id(&handler.received());
    assert_eq!(counts.len(), ids.len() + later.len());
    assert!(counts.values().all(|&n| n == 1), "{counts:?}");
}
