//! Pull delivery end to end, on SQLite and PostgreSQL: the official Svix Python SDK's poller calls
//! against a real `herald serve` (tests/compat/svix_poller.py), at-least-once consumption with commits
//! across `kill -9`, filters, tenancy, and the long poll's wake-up.
//!
//! `scripts/test` installs the SDK (tests/compat/python-v2) under target/.

use crate::common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Herald, TOKEN};
use herald_store::testdb;
use serde_json::{Value, json};

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/compat/svix_poller.py")
}

/// Publish a message and return its id.
async fn publish(herald: &Herald, app: &str, event_type: &str, payload: Value, channels: &[&str]) -> String {
    let mut body = json!({ "eventType": event_type, "payload": payload });
    if !channels.is_empty() {
        body["channels"] = json!(channels);
    }
    herald.post(&format!("/app/{app}/msg"), body).await["id"]
        .as_str()
        .expect("msg id")
        .to_owned()
}

/// Create a polling endpoint and return its id.
async fn sink(herald: &Herald, app: &str, body: Value) -> String {
    herald.post(&format!("/app/{app}/polling-endpoint"), body).await["id"]
        .as_str()
        .expect("sink id")
        .to_owned()
}

fn ids(page: &Value) -> Vec<String> {
    page["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|m| m["id"].as_str().expect("id").to_owned())
        .collect()
}

#[tokio::test]
async fn the_python_sdk_polls_and_commits_survive_kill_9_on_sqlite() {
    sdk_poller_and_kill_9(Herald::start(&[]).await).await;
}

#[tokio::test]
async fn the_python_sdk_polls_and_commits_survive_kill_9_on_postgres() {
    let test = "the_python_sdk_polls_and_commits_survive_kill_9_on_postgres";
    let Some(herald) = Herald::start_pg(test, &[]).await else {
        return;
    };
    sdk_poller_and_kill_9(herald).await;
}

async fn sdk_poller_and_kill_9(mut herald: Herald) {
    let python = common::python_with_svix();
    let app = herald.app("shop").await;
    let sink_id = sink(&herald, &app, json!({ "eventTypes": ["order.paid"], "uid": "laptop" })).await;
    let mut paid = Vec::new();
    for n in 0..6 {
        paid.push(publish(&herald, &app, "order.paid", json!({ "order": n }), &[]).await);
        // Messages the sink's filter leaves out, between every two it keeps.
        publish(&herald, &app, "order.refunded", json!({ "order": n }), &[]).await;
    }

    let base = format!("http://{}", herald.addr);
    let (app_env, sink_env, msgs) = (app.clone(), sink_id.clone(), paid.join(","));
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(script())
            .env("HERALD_URL", base)
            .env("HERALD_TOKEN", TOKEN)
            .env("APP_ID", app_env)
            .env("SINK_ID", sink_env)
            .env("MSG_IDS", msgs)
            .output()
            .expect("run the poller script")
    })
    .await
    .expect("join");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "svix poller script failed:\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let values: HashMap<&str, &str> = stdout.lines().filter_map(|l| l.split_once('=')).collect();
    let committed = values.get("CONSUMER_ITERATOR").expect("iterator printed").to_string();

    // A consumer that took a batch and did not come back for the next one before the crash.
    let consumer = format!("/app/{app}/poller/{sink_id}/consumer/crashy?limit=2");
    let batch = herald.get(&consumer).await;
    assert_eq!(ids(&batch), paid[..2].to_vec());

    herald.kill9();
    herald.restart().await;

    // c1 committed up to the 4th message, then took the last two without coming back: its offset
    // survived the crash, and the uncommitted batch is served again (at least once), ending where the
    // SDK's last answer ended.
    let c1 = herald.get(&format!("/app/{app}/poller/{sink_id}/consumer/c1")).await;
    assert_eq!(ids(&c1), paid[4..].to_vec(), "{c1}");
    assert_eq!(c1["iterator"], json!(committed));
    assert_eq!(c1["done"], json!(true));
    let acknowledged = herald
        .get(&format!("/app/{app}/poller/{sink_id}/consumer/c1?iterator={committed}"))
        .await;
    assert_eq!(ids(&acknowledged), Vec::<String>::new(), "{acknowledged}");
    // The uncommitted batch is served again after the crash: at least once.
    let again = herald.get(&consumer).await;
    assert_eq!(ids(&again), paid[..2].to_vec(), "{again}");
    // The v2 consumer's commit survived as well: once the lease of its last batch (300 ms) is over, only
    // what it had not committed comes back.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let v2 = herald
        .get(&format!("/app/{app}/polling-endpoint/laptop/consumer/v2?limit=100"))
        .await;
    assert_eq!(
        v2["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect::<Vec<_>>(),
        paid[3..].to_vec(),
        "{v2}"
    );
}

#[tokio::test]
async fn filters_narrowing_and_changes_apply_to_the_stream() {
    let herald = Herald::start(&[]).await;
    let app = herald.app("shop").await;
    let eu = publish(&herald, &app, "a.b", json!({"n": 1}), &["eu"]).await;
    let us = publish(&herald, &app, "a.b", json!({"n": 2}), &["us"]).await;
    let other = publish(&herald, &app, "c.d", json!({"n": 3}), &["eu"]).await;
    let sink_id = sink(&herald, &app, json!({ "channels": ["eu"] })).await;
    let poll = |query: &str| format!("/app/{app}/poller/{sink_id}{query}");

    assert_eq!(ids(&herald.get(&poll("")).await), vec![eu.clone(), other.clone()]);
    assert_eq!(ids(&herald.get(&poll("?event_type=c.d")).await), vec![other.clone()]);
    // The payload is the stored bytes; the message carries what a pushed delivery would.
    let first = herald.get(&poll("?limit=1")).await;
    assert_eq!(first["data"][0]["payload"], json!({"n": 1}));
    assert_eq!(first["data"][0]["eventType"], "a.b");
    assert_eq!(first["data"][0]["channels"], json!(["eu"]));
    assert_eq!(first["done"], json!(false));

    let (status, patched) = herald
        .call(
            "PATCH",
            &format!("/app/{app}/polling-endpoint/{sink_id}"),
            Some(json!({ "channels": null, "eventTypes": ["a.b"] })),
        )
        .await;
    assert_eq!(status, 200, "{patched}");
    assert_eq!(ids(&herald.get(&poll("")).await), vec![eu.clone(), us.clone()]);

    // Bad parameters are 422 naming them; an unknown sink 404.
    for (query, field) in [
        ("?limit=0", "limit"),
        ("?iterator=x", "iterator"),
        ("?wait_ms=30001", "wait_ms"),
        ("?after=yesterday", "after"),
    ] {
        let (status, error) = herald.call("GET", &poll(query), None).await;
        assert_eq!(status, 422, "{query}: {error}");
        assert!(common::names_field(&error, field), "{query}: {error}");
    }
    let (status, error) = herald.call("GET", &format!("/app/{app}/poller/sink_nope"), None).await;
    assert_eq!((status, error["code"].as_str()), (404, Some("not_found")), "{error}");

    // A sink's secret is there for `herald listen`; delete takes the sink away.
    let secret = herald
        .get(&format!("/app/{app}/polling-endpoint/{sink_id}/secret"))
        .await;
    assert!(secret["key"].as_str().unwrap().starts_with("whsec_"), "{secret}");
    let (status, _) = herald
        .call("DELETE", &format!("/app/{app}/polling-endpoint/{sink_id}"), None)
        .await;
    assert_eq!(status, 204);
    let (status, _) = herald.call("GET", &poll(""), None).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn an_application_token_polls_only_its_own_application() {
    let herald = Herald::start(&[]).await;
    let mine = herald.app("mine").await;
    let theirs = herald.app("theirs").await;
    let my_sink = sink(&herald, &mine, json!({})).await;
    let their_sink = sink(&herald, &theirs, json!({})).await;
    publish(&herald, &theirs, "a.b", json!({"secret": true}), &[]).await;
    let token = herald
        .post(&format!("/auth/app-portal-access/{mine}"), json!({ "readOnly": false }))
        .await["token"]
        .as_str()
        .expect("token")
        .to_owned();
    let auth = format!("Bearer {token}");
    let as_tenant = |path: String| {
        let auth = auth.clone();
        let herald = &herald;
        async move { herald.call_with("GET", &path, None, &[("authorization", &auth)]).await }
    };
    let (status, page) = as_tenant(format!("/app/{mine}/poller/{my_sink}")).await;
    assert_eq!(status, 200, "{page}");
    for path in [
        format!("/app/{theirs}/poller/{their_sink}"),
        format!("/app/{theirs}/poller/{their_sink}/consumer/c"),
        format!("/app/{theirs}/polling-endpoint/{their_sink}/consumer/c"),
        format!("/app/{theirs}/polling-endpoint/{their_sink}/secret"),
        // Another app's sink through one's own app: not found, never its stream.
        format!("/app/{mine}/poller/{their_sink}"),
    ] {
        let (status, error) = as_tenant(path.clone()).await;
        assert!(status == 403 || status == 404, "{path}: {status} {error}");
        assert!(!error.to_string().contains("secret\":true"), "{path}: {error}");
    }
}

#[tokio::test]
async fn a_long_poll_answers_when_a_message_commits() {
    let herald = Herald::start(&[]).await;
    let app = herald.app("shop").await;
    let sink_id = sink(&herald, &app, json!({ "eventTypes": ["a.b"] })).await;
    let head = herald.get(&format!("/app/{app}/poller/{sink_id}")).await;
    let iterator = head["iterator"].as_str().unwrap().to_owned();

    // Nothing arrives: the poll waits its time out, then answers empty.
    let started = Instant::now();
    let empty = herald
        .get(&format!("/app/{app}/poller/{sink_id}?iterator={iterator}&wait_ms=300"))
        .await;
    assert!(started.elapsed() >= Duration::from_millis(300), "it waited");
    assert_eq!((ids(&empty).len(), &empty["done"]), (0, &json!(true)));

    // A message the filter leaves out does not answer the wait; one it keeps does, at once.
    let url = herald.url(&format!(
        "/app/{app}/poller/{sink_id}?iterator={iterator}&wait_ms=20000"
    ));
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let page: Value = reqwest::Client::new()
            .get(url)
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("poll")
            .json()
            .await
            .expect("JSON");
        (page, Instant::now(), started)
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    publish(&herald, &app, "c.d", json!({}), &[]).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        !waiting.is_finished(),
        "a message outside the filter does not answer the poll"
    );
    let published_at = Instant::now();
    let id = publish(&herald, &app, "a.b", json!({}), &[]).await;
    let (page, answered_at, started) = waiting.await.expect("join");
    assert_eq!(ids(&page), vec![id]);
    // Functional, not a timing target: the wait ended because of the message, long before its limit.
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert!(
        answered_at.duration_since(published_at) < Duration::from_secs(5),
        "woken {:?} after the publish",
        answered_at.duration_since(published_at)
    );
}

/// Two nodes on one PostgreSQL database: a long poll on node B answers as soon as the message it waits for
/// is published through node A — not at its `wait_ms`, nor at the route's own re-read (every 5 s).
#[tokio::test]
async fn a_long_poll_on_one_node_answers_when_another_node_ingests() {
    let Some(database) = testdb::fresh("a_long_poll_on_one_node_answers_when_another_node_ingests").await else {
        return;
    };
    let database = Arc::new(database);
    let (a, b) = (
        Herald::start_on(database.clone(), &[]).await,
        Herald::start_on(database, &[]).await,
    );
    let app = a.app("shop").await;
    let sink_id = sink(&a, &app, json!({})).await;
    let path = format!("/app/{app}/poller/{sink_id}?wait_ms=20000");
    let poll = b.get(&path);
    let publish_on_a = async {
        // Well after node B's poll found the stream empty and began to wait.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let id = publish(&a, &app, "a.b", json!({}), &[]).await;
        (id, Instant::now())
    };
    let (page, (id, published_at)) = tokio::join!(poll, publish_on_a);
    let woken = published_at.elapsed();
    assert_eq!(ids(&page), vec![id]);
    // Functional, not a timing target: woken by node A's commit, long before any re-read or the limit.
    assert!(woken < Duration::from_secs(2), "woken {woken:?} after the publish");
}

#[tokio::test]
async fn a_polling_endpoint_token_reads_only_its_own_stream() {
    let herald = Herald::start(&[]).await;
    let app = herald.post("/app", json!({ "name": "Shop", "uid": "shop" })).await["id"]
        .as_str()
        .expect("app id")
        .to_owned();
    let other_app = herald.app("other").await;
    let mine = sink(&herald, &app, json!({ "uid": "laptop", "eventTypes": ["a.b"] })).await;
    let sibling = sink(&herald, &app, json!({})).await;
    let elsewhere = sink(&herald, &other_app, json!({})).await;
    let kept = publish(&herald, &app, "a.b", json!({"n": 1}), &[]).await;
    let (status, issued) = herald
        .call(
            "POST",
            &format!("/app/{app}/polling-endpoint/laptop/token"),
            Some(json!({ "expiry": 600 })),
        )
        .await;
    assert_eq!(status, 200, "{issued}");
    let token = issued["token"].as_str().expect("token").to_owned();
    assert!(token.starts_with("herald_sink_"), "{token}");
    let auth = format!("Bearer {token}");
    let headers = [("authorization", auth.as_str())];
    let call = |method: &'static str, path: String, body: Option<Value>| {
        let herald = &herald;
        async move {
            herald
                .call_with(method, &path, body.map(|b| b.to_string().into_bytes()), &headers)
                .await
        }
    };

    // Its own stream, by the sink's id or uid and the app's id or uid: every poll, a seek and a commit.
    for path in [
        format!("/app/{app}/poller/{mine}"),
        "/app/shop/poller/laptop".to_owned(),
        format!("/app/{app}/poller/laptop/consumer/c1"),
    ] {
        let (status, page) = call("GET", path.clone(), None).await;
        assert_eq!(status, 200, "{path}: {page}");
        assert_eq!(ids(&page), vec![kept.clone()], "{path}");
    }
    let (status, v2) = call("GET", format!("/app/{app}/polling-endpoint/laptop/consumer/c2"), None).await;
    assert_eq!(status, 200, "{v2}");
    let offset = v2["data"][0]["offset"].clone();
    let (status, body) = call(
        "POST",
        format!("/app/{app}/polling-endpoint/laptop/consumer/c2/commit"),
        Some(json!({ "offset": offset })),
    )
    .await;
    assert_eq!(status, 204, "{body}");
    // Past what the stream handed out: a conflict with the stream as it is, not a malformed body.
    let (status, body) = call(
        "POST",
        format!("/app/{app}/polling-endpoint/laptop/consumer/c2/commit"),
        Some(json!({ "offset": 1_000_000_000_i64 })),
    )
    .await;
    assert_eq!((status, body["code"].as_str()), (409, Some("conflict")), "{body}");
    let (status, body) = call(
        "POST",
        format!("/app/{app}/poller/laptop/consumer/c1/seek"),
        Some(json!({ "after": "1970-01-01T00:00:00Z" })),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // Nothing else: not the sink's settings or key, not another sink of its app or of another app, not
    // the app's messages, not writing, not minting tokens, not even the shared reads.
    for (method, path, body) in [
        ("GET", format!("/app/{app}/polling-endpoint/laptop"), None),
        ("GET", format!("/app/{app}/polling-endpoint/laptop/secret"), None),
        (
            "PATCH",
            format!("/app/{app}/polling-endpoint/laptop"),
            Some(json!({"description": "x"})),
        ),
        ("DELETE", format!("/app/{app}/polling-endpoint/laptop"), None),
        (
            "POST",
            format!("/app/{app}/polling-endpoint/laptop/token"),
            Some(json!({})),
        ),
        ("GET", format!("/app/{app}/polling-endpoint"), None),
        ("GET", format!("/app/{app}/poller/{sibling}"), None),
        ("GET", format!("/app/{app}/poller/sink_nope"), None),
        ("GET", format!("/app/{other_app}/poller/{elsewhere}"), None),
        ("GET", format!("/app/{other_app}/poller/{mine}"), None),
        ("GET", format!("/app/{app}/msg"), None),
        (
            "POST",
            format!("/app/{app}/msg"),
            Some(json!({"eventType": "a.b", "payload": {}})),
        ),
        ("GET", format!("/app/{app}"), None),
        ("GET", "/event-type".to_owned(), None),
        ("GET", "/auth/token".to_owned(), None),
    ] {
        let (status, error) = call(method, path.clone(), body).await;
        assert_eq!(
            (status, error["code"].as_str()),
            (403, Some("forbidden")),
            "{method} {path}: {error}"
        );
    }

    // It ends with its polling endpoint.
    let (status, _) = herald
        .call("DELETE", &format!("/app/{app}/polling-endpoint/{mine}"), None)
        .await;
    assert_eq!(status, 204);
    let (status, error) = call("GET", format!("/app/{app}/poller/{mine}"), None).await;
    assert_eq!(status, 401, "{error}");
}

#[tokio::test]
async fn herald_listen_forwards_each_new_message_signed_as_a_delivery_and_cleans_up() {
    use std::io::BufRead as _;

    let herald = Herald::start(&[]).await;
    let app = herald.app("shop").await;
    let handler = common::Receiver::start(common::Reply::status(204)).await;
    let mut listener = std::process::Command::new(env!("CARGO_BIN_EXE_herald"))
        .args([
            "listen",
            "--server",
            &format!("http://{}", herald.addr),
            "--token",
            TOKEN,
        ])
        .args(["--app", &app, "--event-types", "a.b", "--forward", &handler.url()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start herald listen");
    let (lines, from_stderr) = std::sync::mpsc::channel();
    let stderr = listener.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let stdout = listener.stdout.take().expect("stdout");
    let printed = std::thread::spawn(move || {
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    let ready = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        while let Ok(line) = from_stderr.recv_timeout(Duration::from_secs(60)) {
            let done = line.starts_with("ready:");
            seen.push(line);
            if done {
                return Ok(seen);
            }
        }
        Err(seen)
    })
    .await
    .expect("join");
    assert!(ready.is_ok(), "herald listen never got ready: {ready:?}");

    // Payload bytes with their own spacing: forwarded exactly as stored. A type outside the filter is not.
    let payload = r#"{ "order" :  7,"note":"caf\u00e9" }"#;
    let body = format!(r#"{{"eventType": "a.b", "payload": {payload}}}"#);
    let auth = format!("Bearer {TOKEN}");
    let (status, kept) = herald
        .post_raw(
            &format!("/api/v1/app/{app}/msg"),
            body.as_bytes(),
            &[("authorization", &auth), ("content-type", "application/json")],
        )
        .await;
    assert_eq!(status, 202, "{kept}");
    let kept_id = kept["id"].as_str().expect("id").to_owned();
    publish(&herald, &app, "c.d", json!({}), &[]).await;
    let marker = publish(&herald, &app, "a.b", json!({"last": true}), &[]).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while handler.received().len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let received = handler.received();
    assert_eq!(received.len(), 2, "{received:?}");
    let first = &received[0];
    assert_eq!(first.header("webhook-id"), kept_id);
    assert_eq!(&first.body[..], payload.as_bytes(), "the stored bytes, unchanged");
    assert_eq!(first.header("content-type"), "application/json");
    assert!(first.header("user-agent").starts_with("Herald"), "{first:?}");
    assert_eq!(received[1].header("webhook-id"), marker);

    // Verified by the Standard Webhooks reference crate with the polling endpoint's key.
    let sinks = herald.get(&format!("/app/{app}/polling-endpoint")).await;
    let sink_id = sinks["data"][0]["id"]
        .as_str()
        .expect("the listener's polling endpoint")
        .to_owned();
    let secret = herald
        .get(&format!("/app/{app}/polling-endpoint/{sink_id}/secret"))
        .await["key"]
        .as_str()
        .expect("key")
        .to_owned();
    let reference = standardwebhooks::Webhook::new(&secret).expect("secret accepted");
    for request in &received {
        reference
            .verify(&request.body, &request.headers)
            .expect("standardwebhooks verifies");
    }
    assert!(reference.verify(b"{\"tampered\":true}", &first.headers).is_err());

    // Ctrl-C: it stops, and deletes the polling endpoint it made.
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&listener),
        rustix::process::Signal::INT,
    )
    .expect("SIGINT");
    let exit = tokio::task::spawn_blocking(move || listener.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(exit.success(), "{exit:?}");
    let lines = printed.join().expect("stdout");
    assert_eq!(lines.len(), 2, "one line per event: {lines:?}");
    assert!(
        lines[0].contains(&kept_id) && lines[0].contains("a.b") && lines[0].contains("204"),
        "{lines:?}"
    );
    let sinks = herald.get(&format!("/app/{app}/polling-endpoint")).await;
    assert_eq!(sinks["data"], json!([]), "{sinks}");
}
