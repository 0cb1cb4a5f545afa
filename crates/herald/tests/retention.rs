//! Retention: the background job deletes attempts older than `HERALD_RETENTION` and expunges payloads
//! whose `payloadRetentionPeriod` has passed, keeping the messages' metadata — and touches nothing else.
//!
//! Time is moved by editing the real SQLite file under the running server (backdating rows), so the test
//! never waits for days and asserts nothing about how fast the job is.

mod common;

use std::time::{Duration, Instant};

use common::{Herald, Receiver, Reply};
use serde_json::json;
use sqlx::Row;

const WAIT: Duration = Duration::from_secs(30);
const DAY_MS: i64 = 24 * 3600 * 1000;

async fn db(herald: &Herald) -> sqlx::SqlitePool {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(herald.db_path())
        .busy_timeout(Duration::from_secs(10));
    sqlx::SqlitePool::connect_with(options)
        .await
        .expect("open the database")
}

fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis(),
    )
    .expect("ms")
}

#[tokio::test]
async fn old_attempts_and_expired_payloads_go_and_nothing_else_does() {
    let herald = Herald::start(&[("HERALD_RETENTION", "1h"), ("HERALD_RETENTION_INTERVAL", "200ms")]).await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let app = herald.app("shop").await;
    herald
        .endpoint(&app, json!({ "url": receiver.url(), "filterTypes": ["sent"] }))
        .await;
    // A paused endpoint: its deliveries stay pending.
    herald
        .endpoint(
            &app,
            json!({ "url": receiver.url(), "filterTypes": ["queued"], "disabled": true }),
        )
        .await;
    let publish = |event_id: &'static str, event_type: &'static str, retention: Option<i64>| {
        let mut body = json!({ "eventType": event_type, "eventId": event_id, "payload": { "id": event_id } });
        if let Some(days) = retention {
            body["payloadRetentionPeriod"] = json!(days);
        }
        let herald = &herald;
        let app = app.clone();
        async move {
            let msg = herald.post(&format!("/app/{app}/msg"), body).await;
            msg["id"].as_str().expect("id").to_owned()
        }
    };
    let expiring = publish("expiring", "sent", Some(1)).await;
    let kept = publish("kept", "sent", Some(30)).await;
    let plain = publish("plain", "sent", None).await;
    let queued = publish("queued", "queued", Some(1)).await;
    for msg in [&expiring, &kept, &plain] {
        herald.wait_attempts(&app, msg, WAIT, |a| a.len() == 1).await;
    }
    let (status, body) = herald
        .call(
            "POST",
            &format!("/app/{app}/msg"),
            Some(json!({ "eventType": "sent", "payload": {}, "payloadRetentionPeriod": 0 })),
        )
        .await;
    assert_eq!(status, 422, "{body}");

    // payloadRetentionPeriod is stored as an expiry relative to the message's creation.
    let pool = db(&herald).await;
    let expiry_of = |id: String| {
        let pool = pool.clone();
        async move {
            let row = sqlx::query("SELECT payload_expires_at - created_at AS keep FROM message WHERE id = ?")
                .bind(id)
                .fetch_one(&pool)
                .await
                .expect("message row");
            row.try_get::<Option<i64>, _>("keep").expect("keep")
        }
    };
    assert_eq!(expiry_of(expiring.clone()).await, Some(DAY_MS));
    assert_eq!(expiry_of(kept.clone()).await, Some(30 * DAY_MS));
    assert_eq!(expiry_of(plain.clone()).await, None);

    // A day passes for the two one-day messages; the expiring message's attempt is two hours old, the
    // kept one's half an hour (HERALD_RETENTION is one hour).
    let now = now_ms();
    for id in [&expiring, &queued] {
        sqlx::query("UPDATE message SET payload_expires_at = ? WHERE id = ?")
            .bind(now - 1_000)
            .bind(id)
            .execute(&pool)
            .await
            .expect("backdate expiry");
    }
    for (id, age_ms) in [(&expiring, 2 * 3600 * 1000), (&kept, 1800 * 1000)] {
        sqlx::query("UPDATE attempt SET created_at = ? WHERE message_id = ?")
            .bind(now - age_ms)
            .bind(id)
            .execute(&pool)
            .await
            .expect("backdate attempt");
    }

    let deadline = Instant::now() + WAIT;
    loop {
        let attempts = herald.attempts(&app, &expiring).await;
        let msg = herald.get(&format!("/app/{app}/msg/{expiring}")).await;
        if attempts.is_empty() && msg["payload"] == json!({}) {
            break;
        }
        assert!(Instant::now() < deadline, "not expired yet: {msg} {attempts:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The expired message keeps its metadata and its delivery record.
    let msg = herald.get(&format!("/app/{app}/msg/expiring")).await;
    assert_eq!(
        (msg["id"].as_str(), msg["eventType"].as_str()),
        (Some(expiring.as_str()), Some("sent"))
    );
    let deliveries = herald.get(&format!("/app/{app}/msg/{expiring}/endpoint")).await;
    assert_eq!(deliveries["data"][0]["deliveryStatus"], "delivered", "{deliveries}");
    let expunged: bool = sqlx::query_scalar("SELECT expunged FROM message WHERE id = ?")
        .bind(&expiring)
        .fetch_one(&pool)
        .await
        .expect("row");
    assert!(expunged);

    // Nothing else changed: payloads not yet expired, or still needed by a pending delivery, and attempts
    // younger than the retention.
    for (id, event_id) in [(&kept, "kept"), (&plain, "plain"), (&queued, "queued")] {
        let msg = herald.get(&format!("/app/{app}/msg/{id}")).await;
        assert_eq!(msg["payload"], json!({ "id": event_id }), "{msg}");
    }
    for id in [&kept, &plain] {
        assert_eq!(herald.attempts(&app, id).await.len(), 1, "{id}");
    }
}
