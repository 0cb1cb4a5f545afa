//! Custody: every message that got a 202 is delivered, with its original `webhook-id`, even when the
//! server is killed with SIGKILL while the receiver is down — on SQLite and on PostgreSQL.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{Herald, Receiver, Reply};
use serde_json::json;

/// Retries every 500 ms for long enough to outlive the restart (and, on PostgreSQL, the lease of the
/// killed node, which its successor must wait out).
fn schedule() -> String {
    vec!["500ms"; 50].join(",")
}

#[tokio::test]
async fn acknowledged_messages_survive_kill_9_and_are_delivered_after_restart() {
    let schedule = schedule();
    let herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", schedule.as_str())]).await;
    survives_kill_9(herald).await;
}

#[tokio::test]
async fn acknowledged_messages_survive_kill_9_on_postgres() {
    let schedule = schedule();
    let test = "acknowledged_messages_survive_kill_9_on_postgres";
    let Some(herald) = Herald::start_pg(test, &[("HERALD_RETRY_SCHEDULE", schedule.as_str())]).await else {
        return;
    };
    survives_kill_9(herald).await;
}

async fn survives_kill_9(mut herald: Herald) {
    let port = common::free_port();
    let url = format!("http://127.0.0.1:{port}/hook");
    let app = herald.app("custody").await;
    herald.endpoint(&app, json!({ "url": url })).await;

    // The receiver is down: every attempt so far fails to connect.
    let mut acknowledged = BTreeSet::new();
    let sends = (0..40).map(|n| {
        let herald = &herald;
        let app = &app;
        async move {
            let (status, body) = herald
                .call(
                    "POST",
                    &format!("/app/{app}/msg"),
                    Some(json!({"eventType": "custody.test", "payload": {"n": n}})),
                )
                .await;
            (status, body)
        }
    });
    // Concurrent requests share group commits; each 202 still means "on disk".
    for (status, body) in futures::future::join_all(sends).await {
        assert_eq!(status, 202, "{body}");
        acknowledged.insert(body["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(acknowledged.len(), 40);

    herald.kill9();
    herald.restart().await;
    let receiver = Receiver::bind(format!("127.0.0.1:{port}").parse().unwrap(), Reply::status(200)).await;

    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let delivered = loop {
        let ids: BTreeSet<String> = receiver
            .received()
            .iter()
            .map(|r| r.header("webhook-id").to_owned())
            .collect();
        if ids.len() >= acknowledged.len() || std::time::Instant::now() > deadline {
            break ids;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        delivered, acknowledged,
        "every acknowledged message arrives with its original webhook-id"
    );
    // The messages are still listed after the crash.
    let listed = herald.get(&format!("/app/{app}/msg?limit=250")).await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 40);
}
