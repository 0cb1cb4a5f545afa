//! The operators' commands (`herald events`, `dead`, `resend`, `recover`, `task`) against a real server.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Herald, Receiver, Reply, TOKEN};
use serde_json::{Value, json};

fn herald_cli(server: &Herald, args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(args)
        .env("HERALD_SERVER", format!("http://{}", server.addr))
        .env("HERALD_TOKEN", TOKEN)
        .output()
        .expect("run herald");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
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
