//! Tenancy: application-scoped tokens see and change only their own application.
//!
//! The route list is not written here: it is read from the OpenAPI document the server serves, so a new
//! route is covered the moment it is documented (and `herald-api`'s own tests fail an undocumented one).

use crate::common;

use std::time::Duration;

use common::{Herald, TOKEN};
use serde_json::{Value, json};

/// The objects of one application that path parameters can name.
struct Tenant {
    id: String,
    uid: String,
    endpoint: String,
    message: String,
    task: String,
}

async fn tenant(h: &Herald, uid: &str) -> Tenant {
    let app = h.post("/app", json!({ "name": uid, "uid": uid })).await;
    let id = app["id"].as_str().expect("id").to_owned();
    // An unreachable endpoint: the test is about access, not delivery.
    let (endpoint, _) = h
        .endpoint(
            &id,
            json!({ "url": format!("http://127.0.0.1:{}/", common::free_port()) }),
        )
        .await;
    let msg = h
        .post(
            &format!("/app/{id}/msg"),
            json!({ "eventType": "invoice.paid", "payload": { "tenant": uid } }),
        )
        .await;
    let task = h
        .post(
            &format!("/app/{id}/endpoint/{endpoint}/recover"),
            json!({ "since": "2020-01-01T00:00:00Z" }),
        )
        .await;
    Tenant {
        id,
        uid: uid.to_owned(),
        endpoint,
        message: msg["id"].as_str().expect("msg id").to_owned(),
        task: task["id"].as_str().expect("task id").to_owned(),
    }
}

async fn issue(h: &Herald, app: &str, body: Value) -> String {
    let out = h.post(&format!("/auth/app-portal-access/{app}"), body).await;
    assert!(
        out["url"]
            .as_str()
            .is_some_and(|u| u.starts_with("http://") && u.contains("/dashboard/#key=herald_app_")),
        "{out}"
    );
    out["token"].as_str().expect("token").to_owned()
}

async fn call_as(h: &Herald, token: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let auth = format!("Bearer {token}");
    h.call_with(
        method,
        path,
        body.map(|b| b.to_string().into_bytes()),
        &[("authorization", &auth)],
    )
    .await
}

/// Every secured operation of the served document: (method, path without `/api/v1`, x-herald-access).
async fn operations(h: &Herald) -> Vec<(String, String, String)> {
    let (status, doc) = h.call_with("GET", "/openapi.json", None, &[]).await;
    assert_eq!(status, 200);
    let mut found = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("item") {
            if method == "parameters" {
                continue;
            }
            let security = op.get("security").unwrap_or(&doc["security"]);
            if security.as_array().is_some_and(Vec::is_empty) {
                continue;
            }
            let access = op["x-herald-access"].as_str().expect("x-herald-access").to_owned();
            let path = path.strip_prefix("/api/v1").expect("prefix").to_owned();
            found.push((method.to_uppercase(), path, access));
        }
    }
    assert!(found.len() > 25, "{found:?}");
    found
}

/// The template with every parameter naming `tenant`'s objects (the app by `app_ref`: id or uid).
fn concrete(template: &str, tenant: &Tenant, app_ref: &str) -> String {
    template
        .replace("{app_id}", app_ref)
        .replace("{endpoint_id}", &tenant.endpoint)
        .replace("{msg_id}", &tenant.message)
        .replace("{task_id}", &tenant.task)
        .replace("{name}", "invoice.paid")
}

fn body_for(method: &str) -> Option<Value> {
    matches!(method, "POST" | "PUT" | "PATCH").then(|| json!({}))
}

#[tokio::test]
async fn an_app_token_gets_403_on_every_route_of_another_app_and_works_on_its_own() {
    let h = Herald::start(&[]).await;
    h.post("/event-type", json!({ "name": "invoice.paid", "description": "paid" }))
        .await;
    let a = tenant(&h, "alpha").await;
    let b = tenant(&h, "bravo").await;
    let token_a = issue(&h, &a.uid, json!({})).await;
    // A logout ends the very token under test: it has its own test below.
    let ops: Vec<_> = operations(&h)
        .await
        .into_iter()
        .filter(|(method, path, _)| (method.as_str(), path.as_str()) != ("POST", "/auth/logout"))
        .collect();

    for (method, template, access) in &ops {
        for app_ref in [&b.id, &b.uid] {
            let path = concrete(template, &b, app_ref);
            let (status, body) = call_as(&h, &token_a, method, &path, body_for(method)).await;
            if access == "shared" {
                // Global definitions, readable by every tenant: nothing of app B's.
                assert_eq!(status, 200, "{method} {path}: {body}");
            } else {
                assert_eq!(status, 403, "{method} {path} ({access}): {body}");
                assert_eq!(body["code"], "forbidden", "{method} {path}");
            }
        }
    }

    // Nothing of B's was touched.
    let app_b = h.get(&format!("/app/{}", b.id)).await;
    assert_eq!(app_b["uid"], "bravo");
    h.get(&format!("/app/{}/endpoint/{}", b.id, b.endpoint)).await;
    let msg_b = h.get(&format!("/app/{}/msg/{}", b.id, b.message)).await;
    assert_eq!(msg_b["payload"], json!({ "tenant": "bravo" }));
    let (status, _) = call_as(&h, TOKEN, "GET", &format!("/app/{}/endpoint", b.id), None).await;
    assert_eq!(status, 200);

    // The same token on its own application: everything but the admin-only operations gets past auth.
    for (method, template, access) in &ops {
        let path = concrete(template, &a, &a.uid);
        let (status, body) = call_as(&h, &token_a, method, &path, body_for(method)).await;
        if access == "admin" {
            assert_eq!(status, 403, "{method} {path}: {body}");
        } else {
            assert!(
                status != 401 && status != 403,
                "{method} {path} ({access}): {status} {body}"
            );
        }
    }
}

#[tokio::test]
async fn an_app_token_manages_its_own_application() {
    let h = Herald::start(&[]).await;
    let a = tenant(&h, "alpha").await;
    let token = issue(&h, &a.id, json!({ "expiry": 3600 })).await;
    let (status, app) = call_as(&h, &token, "GET", "/app/alpha", None).await;
    assert_eq!((status, app["id"].as_str()), (200, Some(a.id.as_str())));
    let (status, ep) = call_as(
        &h,
        &token,
        "POST",
        "/app/alpha/endpoint",
        Some(json!({ "url": "https://example.com/hook", "uid": "mine" })),
    )
    .await;
    assert_eq!(status, 201, "{ep}");
    let (status, msg) = call_as(
        &h,
        &token,
        "POST",
        &format!("/app/{}/msg", a.id),
        Some(json!({ "eventType": "x.y", "payload": { "n": 1 } })),
    )
    .await;
    assert_eq!(status, 202, "{msg}");
    let (status, list) = call_as(&h, &token, "GET", "/app/alpha/endpoint", None).await;
    assert_eq!(status, 200);
    assert_eq!(list["data"].as_array().map(Vec::len), Some(2), "{list}");
    let (status, task) = call_as(&h, &token, "GET", &format!("/background-task/{}", a.task), None).await;
    assert_eq!(status, 200, "{task}");
    // Admin-only operations stay closed to it, including minting more tokens for itself.
    for (method, path) in [
        ("GET", "/app".to_owned()),
        ("GET", "/operational-event".to_owned()),
        ("POST", format!("/auth/app-portal-access/{}", a.id)),
        ("DELETE", format!("/app/{}", a.id)),
    ] {
        let (status, body) = call_as(&h, &token, method, &path, body_for(method)).await;
        assert_eq!(status, 403, "{method} {path}: {body}");
    }
}

#[tokio::test]
async fn unknown_expired_revoked_and_read_only_tokens() {
    let h = Herald::start(&[]).await;
    let a = tenant(&h, "alpha").await;
    let path = format!("/app/{}/msg", a.id);

    let (status, body) = call_as(&h, "herald_app_not-a-token", "GET", &path, None).await;
    assert_eq!((status, body["code"].as_str()), (401, Some("authentication_failed")));

    let short = issue(&h, &a.id, json!({ "expiry": 1 })).await;
    assert_eq!(call_as(&h, &short, "GET", &path, None).await.0, 200);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(call_as(&h, &short, "GET", &path, None).await.0, 401);

    let read_only = issue(&h, &a.id, json!({ "readOnly": true })).await;
    assert_eq!(call_as(&h, &read_only, "GET", &path, None).await.0, 200);
    let (status, body) = call_as(
        &h,
        &read_only,
        "POST",
        &path,
        Some(json!({ "eventType": "x.y", "payload": {} })),
    )
    .await;
    assert_eq!((status, body["code"].as_str()), (403, Some("forbidden")), "{body}");

    let revoked = issue(&h, &a.id, json!({})).await;
    assert_eq!(call_as(&h, &revoked, "GET", &path, None).await.0, 200);
    let (status, _) = h
        .call("POST", &format!("/auth/app/{}/expire-all", a.uid), Some(json!({})))
        .await;
    assert_eq!(status, 204);
    assert_eq!(call_as(&h, &revoked, "GET", &path, None).await.0, 401);
    assert_eq!(call_as(&h, &read_only, "GET", &path, None).await.0, 401);
    // A token issued after the revocation works.
    let fresh = issue(&h, &a.id, json!({})).await;
    assert_eq!(call_as(&h, &fresh, "GET", &path, None).await.0, 200);

    // Tokens die with their application.
    h.call("DELETE", &format!("/app/{}", a.id), None).await;
    assert_eq!(call_as(&h, &fresh, "GET", "/event-type", None).await.0, 401);

    let (status, body) = h
        .call("POST", "/auth/app-portal-access/alpha", Some(json!({ "expiry": 0 })))
        .await;
    assert_eq!(status, 422, "{body}");
}

#[tokio::test]
async fn portal_access_can_create_the_application_and_tokens_are_stored_hashed() {
    let h = Herald::start(&[]).await;
    let (status, _) = h.call("POST", "/auth/app-portal-access/newco", Some(json!({}))).await;
    assert_eq!(status, 404);
    // The Svix SDKs send an idempotency key with every POST: the answer must not be remembered (it
    // would keep the token in clear).
    let auth = format!("Bearer {TOKEN}");
    let body = json!({ "application": { "name": "New Co" } }).to_string().into_bytes();
    let (status, out) = h
        .call_with(
            "POST",
            "/auth/app-portal-access/newco",
            Some(body),
            &[("authorization", &auth), ("idempotency-key", "issue-1")],
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let token = out["token"].as_str().expect("token").to_owned();
    let (status, app) = call_as(&h, &token, "GET", "/app/newco", None).await;
    assert_eq!((status, app["name"].as_str()), (200, Some("New Co")));

    // Nothing the store keeps holds the token; its digest is what is kept.
    let stored = stored_bytes(&h).await;
    let contains = |needle: &[u8]| stored.windows(needle.len()).any(|w| w == needle);
    assert!(!contains(token.as_bytes()), "the token is stored in clear");
    let digest = hex::encode(herald_api::auth::token_digest(&token));
    assert!(contains(digest.as_bytes()), "the token's digest is not stored");
}

/// Everything the store keeps, as bytes: on SQLite the database file and its write-ahead log; on
/// PostgreSQL (`HERALD_TEST_BACKEND=postgres`) every row of every table as text, with the stored
/// idempotent responses (bytes) as the UTF-8 text they are.
async fn stored_bytes(h: &Herald) -> Vec<u8> {
    let Some(database) = &h.database else {
        let mut stored = Vec::new();
        for suffix in ["", "-wal"] {
            let path = format!("{}{suffix}", h.db_path().display());
            stored.extend(std::fs::read(&path).unwrap_or_default());
        }
        assert!(stored.len() > 4096, "read the database");
        return stored;
    };
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(&database.url).await.expect("connect");
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables \
         WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'",
    )
    .fetch_all(&mut conn)
    .await
    .expect("tables");
    assert!(tables.iter().any(|t| t == "app_token"), "{tables:?}");
    let mut stored = Vec::new();
    for table in &tables {
        let rows: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT t::text FROM \"{table}\" t")))
            .fetch_all(&mut conn)
            .await
            .expect("rows");
        stored.extend(rows.concat().into_bytes());
    }
    let responses: Vec<String> = sqlx::query_scalar("SELECT convert_from(body, 'UTF8') FROM idempotency")
        .fetch_all(&mut conn)
        .await
        .expect("idempotent responses");
    stored.extend(responses.concat().into_bytes());
    stored
}

#[tokio::test]
async fn a_logout_ends_the_calling_app_token_only_and_the_admin_token_cannot_log_out() {
    let h = Herald::start(&[]).await;
    let a = tenant(&h, "alpha").await;
    let token = issue(&h, &a.id, json!({})).await;
    let other = issue(&h, &a.id, json!({})).await;
    let read_only = issue(&h, &a.id, json!({ "readOnly": true })).await;
    let (status, _) = call_as(&h, &token, "GET", "/app/alpha", None).await;
    assert_eq!(status, 200);
    let (status, body) = call_as(&h, &token, "POST", "/auth/logout", None).await;
    assert_eq!(status, 204, "{body}");
    let (status, _) = call_as(&h, &token, "GET", "/app/alpha", None).await;
    assert_eq!(status, 401, "a logged-out token no longer works");
    let (status, _) = call_as(&h, &other, "GET", "/app/alpha", None).await;
    assert_eq!(status, 200, "another token of the same application still works");
    // Logging out only takes rights away: a read-only token may.
    let (status, body) = call_as(&h, &read_only, "POST", "/auth/logout", None).await;
    assert_eq!(status, 204, "{body}");
    let (status, _) = call_as(&h, &read_only, "GET", "/app/alpha", None).await;
    assert_eq!(status, 401);
    let (status, body) = call_as(&h, TOKEN, "POST", "/auth/logout", None).await;
    assert_eq!((status, body["code"].as_str()), (403, Some("forbidden")), "{body}");
    let (status, _) = call_as(&h, TOKEN, "GET", "/app/alpha", None).await;
    assert_eq!(status, 200, "the admin token cannot lock itself out");
}

#[tokio::test]
async fn background_tasks_are_listed_to_the_admin_by_state_and_kind_newest_first() {
    let h = Herald::start(&[]).await;
    let a = tenant(&h, "alpha").await;
    let b = tenant(&h, "bravo").await;
    let page = h.get("/background-task?limit=1").await;
    assert_eq!(page["data"][0]["id"].as_str(), Some(b.task.as_str()), "{page}");
    assert_eq!(page["done"], false, "{page}");
    let iterator = page["iterator"].as_str().expect("iterator");
    let next = h.get(&format!("/background-task?limit=1&iterator={iterator}")).await;
    assert_eq!(next["data"][0]["id"].as_str(), Some(a.task.as_str()), "{next}");
    let oldest = h.get("/background-task?order=ascending&task=endpoint.recover").await;
    let ids: Vec<&str> = oldest["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["id"].as_str())
        .collect();
    assert_eq!(ids, [a.task.as_str(), b.task.as_str()]);
    let none = h.get("/background-task?task=endpoint.bulk-replay").await;
    assert_eq!(none["data"], json!([]), "{none}");
    let (status, body) = call_as(&h, TOKEN, "GET", "/background-task?status=sleeping", None).await;
    assert_eq!(status, 422, "{body}");
    let token = issue(&h, &a.id, json!({})).await;
    let (status, body) = call_as(&h, &token, "GET", "/background-task", None).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("forbidden")),
        "tasks span applications: {body}"
    );
}

#[tokio::test]
async fn expire_all_with_session_ids_ends_only_those_sessions_tokens() {
    let h = Herald::start(&[]).await;
    let a = tenant(&h, "alpha").await;
    let alice = issue(&h, &a.id, json!({ "sessionId": "alice" })).await;
    let bob = issue(&h, &a.id, json!({ "sessionId": "bob" })).await;
    let plain = issue(&h, &a.id, json!({})).await;
    let (status, body) = h
        .call(
            "POST",
            &format!("/auth/app/{}/expire-all", a.id),
            Some(json!({ "sessionIds": ["alice"] })),
        )
        .await;
    assert_eq!(status, 204, "{body}");
    for (token, expected) in [(&alice, 401), (&bob, 200), (&plain, 200)] {
        let (status, _) = call_as(&h, token, "GET", "/app/alpha", None).await;
        assert_eq!(status, expected);
    }
    // Up to 1,000 sessions at once (one with a token among them), not one more.
    let many: Vec<String> = (0..999)
        .map(|n| format!("session-{n}"))
        .chain(["bob".to_string()])
        .collect();
    let (status, body) = h
        .call(
            "POST",
            &format!("/auth/app/{}/expire-all", a.id),
            Some(json!({ "sessionIds": many })),
        )
        .await;
    assert_eq!(status, 204, "{body}");
    let (status, _) = call_as(&h, &bob, "GET", "/app/alpha", None).await;
    assert_eq!(status, 401, "bob's session was among the thousand");
    let bob = issue(&h, &a.id, json!({ "sessionId": "bob" })).await;
    let too_many: Vec<String> = (0..1001).map(|n| format!("session-{n}")).collect();
    let (status, body) = h
        .call(
            "POST",
            &format!("/auth/app/{}/expire-all", a.id),
            Some(json!({ "sessionIds": too_many })),
        )
        .await;
    assert_eq!(
        (status, body["detail"][0]["loc"][1].as_str()),
        (422, Some("sessionIds")),
        "{body}"
    );
    let (status, body) = h
        .call(
            "POST",
            &format!("/auth/app/{}/expire-all", a.id),
            Some(json!({ "sessionIds": [""] })),
        )
        .await;
    assert_eq!(
        (status, body["detail"][0]["loc"][1].as_str()),
        (422, Some("sessionIds")),
        "{body}"
    );
    // An empty list, as no list: every token.
    let (status, _) = h
        .call(
            "POST",
            &format!("/auth/app/{}/expire-all", a.id),
            Some(json!({ "sessionIds": [] })),
        )
        .await;
    assert_eq!(status, 204);
    for token in [&bob, &plain] {
        let (status, _) = call_as(&h, token, "GET", "/app/alpha", None).await;
        assert_eq!(status, 401);
    }
}
