//! The operators' commands (`herald events`, `dead`, `resend`, `recover`, `task`) against a real server.

use crate::common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Herald, Receiver, Reply, TOKEN};
use serde_json::{Value, json};

fn herald_cli(server: &Herald, args: &[&str]) -> (bool, String, String) {
    herald_cli_at(server.addr, args)
}

/// Run the CLI against the server at `addr`; returns (success, stdout, stderr).
fn herald_cli_at(addr: SocketAddr, args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(args)
        .env("HERALD_SERVER", format!("http://{addr}"))
        .env("HERALD_TOKEN", TOKEN)
        .output()
        .expect("run herald");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A stand-in for Herald that answers every request `200` with `body`; its address.
async fn answering(body: Value) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = axum::Router::new().fallback(move || {
        let body = body.clone();
        async move { axum::Json(body) }
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// An answer whose `id` is no id of the kind the command reads stops the command with an error naming the
/// id and the kind expected, before it prints or uses anything.
#[tokio::test]
async fn an_answer_with_a_malformed_id_is_a_clear_error() {
    let addr = answering(json!({"id": "nonsense", "key": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})).await;
    let cases: [(&[&str], &str); 4] = [
        (&["task", "qtask_1"], "qtask_"),
        (&["resend", "--app", "shop", "--msg", "m", "--endpoint", "e"], "msg_"),
        (
            &["recover", "--app", "shop", "--endpoint", "e", "--since", "1h"],
            "qtask_",
        ),
        (&["listen", "--app", "shop", "--sink", "laptop", "--print"], "sink_"),
    ];
    for (args, prefix) in cases {
        let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
        let (ok, out, err) = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            herald_cli_at(addr, &args)
        })
        .await
        .expect("run herald");
        assert!(!ok, "{prefix}: accepted: {out}");
        assert!(
            err.contains(&format!("\"nonsense\" is not an id of the form {prefix}")),
            "{prefix}: {err}"
        );
    }
}

/// A task whose `data` the server could not read back comes with `data: null`; the task itself ran, so
/// the command shows it rather than fail (an operator told it failed would start a replay again).
#[tokio::test]
async fn a_task_whose_data_is_null_is_shown() {
    let addr = answering(json!({
        "id": "qtask_0358NQapf9btJr3ZruZO0K",
        "task": "endpoint.recover",
        "status": "finished",
        "processed": 3,
        "total": 3,
        "data": null,
        "createdAt": "2026-12-03T18:00:00Z",
        "updatedAt": "2026-12-03T18:00:01Z"
    }))
    .await;
    let (ok, out, err) =
        tokio::task::spawn_blocking(move || herald_cli_at(addr, &["task", "qtask_0358NQapf9btJr3ZruZO0K"]))
            .await
            .expect("run herald");
    assert!(ok, "refused: {err}");
    assert!(out.contains("qtask_0358NQapf9btJr3ZruZO0K"), "{out}");
}

#[tokio::test]
async fn an_operator_finds_dead_letters_recovers_them_and_reconciles_from_the_shell() {
    let herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", "50ms"), ("HERALD_BREAKER_THRESHOLD", "1000")]).await;
    let receiver = Receiver::start(Reply::status(503)).await;
    let app = herald.app("shop").await;
    let (ep, _) = herald.endpoint(&app, json!({"url": receiver.url()})).await;
    let since = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let msg = herald
        .post(
            &format!("/app/{app}/msg"),
            json!({"eventType": "a.b", "payload": {"n": 1}}),
        )
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let dead = herald.get(&format!("/app/{app}/delivery?deliveryStatus=dead")).await;
        if dead["data"].as_array().is_some_and(|d| d.len() == 1) {
            break;
        }
        assert!(Instant::now() < deadline, "the delivery never died");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let (ok, out, err) = herald_cli(&herald, &["dead", "--app", &app]);
    assert!(ok, "{err}");
    assert!(out.contains(&msg) && out.contains("server_error"), "{out}");

    receiver.set_fallback(Reply::status(200));
    let (ok, out, err) = herald_cli(
        &herald,
        &["recover", "--app", &app, "--endpoint", &ep, "--since", &since],
    );
    assert!(ok, "{err}");
    assert!(out.contains("finished: 1 processed, 1 queued"), "{out}");
    let got = receiver.wait_for(3, Duration::from_secs(15)).await;
    assert_eq!(got.last().unwrap().status, 200);
    assert_eq!(got.last().unwrap().header("webhook-id"), msg);

    let (ok, out, err) = herald_cli(&herald, &["events", "--app", &app, "--since", &since]);
    assert!(ok, "{err}");
    let lines: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 1, "{out}");
    assert_eq!(lines[0]["id"], msg.as_str());
    assert!(
        err.contains("iterator: msg_"),
        "the position is printed for a later --iterator: {err}"
    );

    let (ok, _, err) = herald_cli(&herald, &["resend", "--app", &app, "--msg", &msg, "--endpoint", &ep]);
    assert!(ok, "{err}");
    receiver.wait_for(4, Duration::from_secs(15)).await;

    let (ok, _, err) = herald_cli(&herald, &["task", "qtask_nope"]);
    assert!(!ok);
    assert!(err.contains("404"), "{err}");
}

/// Run the CLI against a server with extra arguments; returns (success, stdout, stderr).
fn herald_at(server: &Herald, args: &[&str]) -> (bool, String, String) {
    herald_cli(server, args)
}

#[tokio::test]
async fn times_take_three_forms_and_a_bad_one_is_explained_with_examples() {
    let herald = Herald::start(&[]).await;
    let app = herald.app("times").await;
    let id = herald
        .post(&format!("/app/{app}/msg"), json!({"eventType": "a.b", "payload": {}}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let today = time::OffsetDateTime::now_utc().date().to_string();
    for since in ["1h", "30m ago", today.as_str(), "2020-01-01T00:00:00Z"] {
        let (ok, out, err) = herald_at(&herald, &["events", "--app", &app, "--since", since]);
        assert!(ok, "--since {since}: {err}");
        assert!(out.contains(&id), "--since {since} finds the message: {out}");
    }
    let (ok, out, _) = herald_at(&herald, &["events", "--app", &app, "--since", "2099-01-01"]);
    assert!(ok && out.is_empty(), "a window in the future is empty: {out}");
    for bad in ["yesterday", "2026-13-01", "5x"] {
        let (ok, _, err) = herald_at(&herald, &["events", "--app", &app, "--since", bad]);
        assert!(!ok, "{bad} accepted");
        for example in ["--since", "2026-12-01T14:00:00Z", "2026-12-01", "1h"] {
            assert!(err.contains(example), "{bad}: the error lacks {example}: {err}");
        }
    }
}

#[tokio::test]
async fn empty_results_say_so_and_json_is_the_servers_bytes() {
    let herald = Herald::start(&[]).await;
    let app = herald.app("quiet").await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let (ep, _) = herald
        .endpoint(&app, json!({"url": receiver.url(), "uid": "billing"}))
        .await;
    let (ok, out, err) = herald_at(&herald, &["dead", "--app", &app]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), format!("no dead deliveries in application {app}"));
    let (ok, out, _) = herald_at(&herald, &["dead", "--app", &app, "--endpoint", "billing"]);
    assert!(
        ok && out.contains("no dead deliveries") && out.contains("billing"),
        "{out}"
    );
    let (ok, out, _) = herald_at(&herald, &["--json", "dead", "--app", &app]);
    assert!(ok && out.is_empty(), "--json prints no rows, not a sentence: {out:?}");

    // The producer's payload bytes, key order and spacing included, come out unchanged.
    let payload = r#"{"zeta": 1,  "alpha": [3, 2, 1], "nested": {"b": true, "a": null}}"#;
    let body = format!(r#"{{"eventType": "a.b", "eventId": "evt-raw", "payload": {payload}}}"#);
    let (status, _) = herald
        .call_with(
            "POST",
            &format!("/app/{app}/msg"),
            Some(body.into_bytes()),
            &[("authorization", &format!("Bearer {TOKEN}"))],
        )
        .await;
    assert_eq!(status, 202);
    let (ok, out, err) = herald_at(&herald, &["events", "--app", &app]);
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!(r#""payload":{payload}"#)),
        "payload bytes changed: {out}"
    );
    receiver.wait_for(1, Duration::from_secs(10)).await;

    // --json everywhere: the task as the server's JSON, an empty repair, verify, migrate, errors.
    let since = "2020-01-01";
    let (ok, out, err) = herald_at(
        &herald,
        &["--json", "recover", "--app", &app, "--endpoint", &ep, "--since", since],
    );
    assert!(ok, "{err}");
    let task: Value = serde_json::from_str(out.trim()).expect("a JSON task");
    assert_eq!(task["status"], "finished", "{task}");
    let task_id = task["id"].as_str().unwrap().to_owned();
    let (ok, out, _) = herald_at(
        &herald,
        &["recover", "--app", &app, "--endpoint", &ep, "--since", since],
    );
    assert!(ok && out.contains("nothing to do in this window"), "{out}");
    let (ok, out, _) = herald_at(&herald, &["--json", "task", &task_id]);
    let shown: Value = serde_json::from_str(out.trim()).expect("task JSON");
    assert!(ok && shown["id"] == task_id.as_str(), "{out}");
    let (ok, out, _) = herald_at(&herald, &["task", &task_id]);
    assert!(ok, "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("since") && l.ends_with("2020-01-01T00:00:00Z")),
        "task times as RFC 3339: {out}"
    );
    let (ok, out, err) = herald_at(
        &herald,
        &["resend", "--app", &app, "--msg", "evt-raw", "--endpoint", "billing"],
    );
    assert!(
        ok && out.contains("eventId evt-raw") && out.contains("endpoint billing"),
        "{out}{err}"
    );
    receiver.wait_for(2, Duration::from_secs(10)).await;
    let (ok, out, err) = herald_at(
        &herald,
        &[
            "--json",
            "resend",
            "--app",
            &app,
            "--msg",
            "evt-raw",
            "--endpoint",
            "billing",
        ],
    );
    let resent: Value = serde_json::from_str(out.trim()).unwrap_or_else(|_| panic!("resend JSON: {out}{err}"));
    assert!(
        ok && resent["eventId"] == "evt-raw" && resent["endpointUid"] == "billing",
        "{out}"
    );
    let (ok, _, err) = herald_at(&herald, &["--json", "task", "qtask_nope"]);
    let error: Value = serde_json::from_str(err.trim()).expect("a JSON error");
    assert!(
        !ok && error["error"].as_str().is_some_and(|e| e.contains("404")),
        "{err}"
    );
}

#[tokio::test]
async fn dead_letters_read_as_a_table_with_uids_and_event_ids() {
    let herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", "50ms"), ("HERALD_BREAKER_THRESHOLD", "1000")]).await;
    let receiver = Receiver::start(Reply::status(503)).await;
    let app = herald.app("table").await;
    herald
        .endpoint(&app, json!({"url": receiver.url(), "uid": "warehouse"}))
        .await;
    let msg = herald
        .post(
            &format!("/app/{app}/msg"),
            json!({"eventType": "order.created", "eventId": "evt-42", "payload": {}}),
        )
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let dead = herald.get(&format!("/app/{app}/delivery?deliveryStatus=dead")).await;
        if dead["data"].as_array().is_some_and(|d| !d.is_empty()) {
            break;
        }
        assert!(Instant::now() < deadline, "the delivery never died");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (ok, out, err) = herald_at(&herald, &["dead", "--app", &app]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("MESSAGE") && lines[0].contains("EVENT ID"),
        "{out}"
    );
    assert!(
        lines[1].contains(&msg)
            && lines[1].contains("evt-42")
            && lines[1].contains("warehouse")
            && lines[1].contains("503 server_error"),
        "{out}"
    );
    // Columns line up: every field of the row starts where its header does.
    let at = lines[0].find("ENDPOINT").unwrap();
    assert_eq!(lines[1].find("warehouse"), Some(at), "{out}");
    let (ok, out, _) = herald_at(&herald, &["--json", "dead", "--app", &app]);
    let row: Value = serde_json::from_str(out.lines().next().unwrap()).expect("JSON line");
    assert!(
        ok && row["id"] == msg.as_str() && row["lastAttempt"]["responseStatusCode"] == 503,
        "{out}"
    );
}
