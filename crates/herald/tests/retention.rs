//! Retention: the background job deletes attempts older than `HERALD_RETENTION` and expunges payloads
//! whose `payloadRetentionPeriod` has passed, keeping the messages' metadata — and touches nothing else.
//!
//! Time is moved by editing the real database under the running server (backdating rows: the SQLite file,
//! or the PostgreSQL database with `HERALD_TEST_BACKEND=postgres`), so the test never waits for days and
//! asserts nothing about how fast the job is.

use crate::common;

use std::time::{Duration, Instant};

use common::{Herald, Receiver, Reply};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);
const DAY_MS: i64 = 24 * 3600 * 1000;

/// The running server's database, opened beside it.
enum Db {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl Db {
    async fn open(herald: &Herald) -> Self {
        match &herald.database {
            Some(database) => Self::Postgres(sqlx::PgPool::connect(&database.url).await.expect("connect")),
            None => {
                let options = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(herald.db_path())
                    .busy_timeout(Duration::from_secs(10));
                Self::Sqlite(
                    sqlx::SqlitePool::connect_with(options)
                        .await
                        .expect("open the database"),
                )
            }
        }
    }

    /// Run `sql`, whose `?` marks take `values` and then `id` (numbered `$n` for PostgreSQL).
    async fn execute(&self, sql: &str, values: &[i64], id: &str) {
        match self {
            Self::Sqlite(pool) => {
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()));
                for value in values {
                    query = query.bind(*value);
                }
                query.bind(id).execute(pool).await.expect("statement");
            }
            Self::Postgres(pool) => {
                let mut query = sqlx::query(sqlx::AssertSqlSafe(numbered(sql)));
                for value in values {
                    query = query.bind(*value);
                }
                query.bind(id).execute(pool).await.expect("statement");
            }
        }
    }

    /// One value of the message `id` (`sql` has one `?` mark, for the id).
    async fn scalar<T>(&self, sql: &'static str, id: &str) -> T
    where
        T: for<'r> sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>,
        T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
        T: Send + Unpin,
    {
        match self {
            Self::Sqlite(pool) => sqlx::query_scalar(sql).bind(id).fetch_one(pool).await,
            Self::Postgres(pool) => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(numbered(sql)))
                    .bind(id)
                    .fetch_one(pool)
                    .await
            }
        }
        .expect("message row")
    }

    /// How long after its creation a message's payload expires, if it does.
    async fn keep_ms(&self, id: &str) -> Option<i64> {
        self.scalar("SELECT payload_expires_at - created_at FROM message WHERE id = ?", id)
            .await
    }

    /// Whether a message is marked expunged.
    async fn expunged(&self, id: &str) -> bool {
        self.scalar("SELECT expunged FROM message WHERE id = ?", id).await
    }
}

/// `?` marks as PostgreSQL's `$1`, `$2`, ….
fn numbered(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push_str(&format!("${n}"));
        } else {
            out.push(c);
        }
    }
    out
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
    let db = Db::open(&herald).await;
    assert_eq!(db.keep_ms(&expiring).await, Some(DAY_MS));
    assert_eq!(db.keep_ms(&kept).await, Some(30 * DAY_MS));
    assert_eq!(db.keep_ms(&plain).await, None);

    // A day passes for the two one-day messages; the expiring message's attempt is two hours old, the
    // kept one's half an hour (HERALD_RETENTION is one hour).
    let now = now_ms();
    for id in [&expiring, &queued] {
        db.execute(
            "UPDATE message SET payload_expires_at = ? WHERE id = ?",
            &[now - 1_000],
            id,
        )
        .await;
    }
    for (id, age_ms) in [(&expiring, 2 * 3600 * 1000), (&kept, 1800 * 1000)] {
        db.execute(
            "UPDATE attempt SET created_at = ? WHERE message_id = ?",
            &[now - age_ms],
            id,
        )
        .await;
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
    assert!(db.expunged(&expiring).await);

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

#[tokio::test]
async fn an_apps_payload_retention_applies_unless_the_message_sets_its_own() {
    let herald = Herald::start(&[("HERALD_RETENTION", "1h"), ("HERALD_RETENTION_INTERVAL", "200ms")]).await;
    // The default is validated as the message field, on create, PUT and PATCH.
    for days in [0, 3651] {
        let (status, body) = herald
            .call(
                "POST",
                "/app",
                Some(json!({ "name": "x", "payloadRetentionPeriod": days })),
            )
            .await;
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["code"], "validation", "{body}");
        assert!(common::names_field(&body, "payloadRetentionPeriod"), "{body}");
    }
    let created = herald
        .post(
            "/app",
            json!({ "name": "shop", "uid": "shop", "payloadRetentionPeriod": 1 }),
        )
        .await;
    assert_eq!(created["payloadRetentionPeriod"], 1, "{created}");
    let app = created["id"].as_str().expect("id").to_owned();
    let (status, body) = herald
        .call("PATCH", "/app/shop", Some(json!({ "payloadRetentionPeriod": 3651 })))
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(herald.get("/app/shop").await["payloadRetentionPeriod"], 1);

    let publish = |event_id: &'static str, extra: serde_json::Value| {
        let mut body = json!({ "eventType": "sent", "eventId": event_id, "payload": { "id": event_id } });
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            body.extend(extra.clone());
        }
        let herald = &herald;
        let app = app.clone();
        async move {
            let msg = herald.post(&format!("/app/{app}/msg"), body).await;
            msg["id"].as_str().expect("id").to_owned()
        }
    };
    let by_app = publish("by-app", json!({})).await;
    let own_days = publish("own-days", json!({ "payloadRetentionPeriod": 30 })).await;
    let own_hours = publish("own-hours", json!({ "payloadRetentionHours": 2 })).await;
    // Clearing the default (PATCH null) leaves later messages without an expiry.
    let cleared = herald
        .call("PATCH", "/app/shop", Some(json!({ "payloadRetentionPeriod": null })))
        .await;
    assert_eq!(cleared.0, 200, "{}", cleared.1);
    assert!(cleared.1.get("payloadRetentionPeriod").is_none(), "{}", cleared.1);
    let after_clear = publish("after-clear", json!({})).await;
    // PUT sets it again, and a PUT without it removes it.
    let put = herald
        .call(
            "PUT",
            "/app/shop",
            Some(json!({ "name": "shop", "uid": "shop", "payloadRetentionPeriod": 7 })),
        )
        .await;
    assert_eq!((put.0, &put.1["payloadRetentionPeriod"]), (200, &json!(7)), "{}", put.1);
    let put = herald
        .call("PUT", "/app/shop", Some(json!({ "name": "shop", "uid": "shop" })))
        .await;
    assert_eq!(put.0, 200, "{}", put.1);
    assert!(put.1.get("payloadRetentionPeriod").is_none(), "{}", put.1);

    let db = Db::open(&herald).await;
    assert_eq!(db.keep_ms(&by_app).await, Some(DAY_MS));
    assert_eq!(db.keep_ms(&own_days).await, Some(30 * DAY_MS));
    assert_eq!(db.keep_ms(&own_hours).await, Some(2 * 3600 * 1000));
    assert_eq!(db.keep_ms(&after_clear).await, None);

    // A day and a minute pass for the first two messages (both their creation and their expiry move back,
    // so what the job acts on is the retention each got at ingest).
    let shift = DAY_MS + 60_000;
    for id in [&by_app, &own_days] {
        db.execute(
            "UPDATE message SET created_at = created_at - ?, payload_expires_at = payload_expires_at - ? WHERE id = ?",
            &[shift, shift],
            id,
        )
        .await;
    }
    let deadline = Instant::now() + WAIT;
    loop {
        let msg = herald.get(&format!("/app/{app}/msg/{by_app}")).await;
        if msg["payload"] == json!({}) {
            break;
        }
        assert!(Instant::now() < deadline, "the app's default did not expire it: {msg}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(db.expunged(&by_app).await);
    for (id, event_id) in [
        (&own_days, "own-days"),
        (&own_hours, "own-hours"),
        (&after_clear, "after-clear"),
    ] {
        let msg = herald.get(&format!("/app/{app}/msg/{id}")).await;
        assert_eq!(msg["payload"], json!({ "id": event_id }), "{msg}");
        assert!(!db.expunged(id).await, "{id}");
    }
}
