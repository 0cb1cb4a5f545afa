//! Hostile input against the real binary: every API error is a JSON body `{"code", "detail"}` with the
//! right status and a stable code, validation errors name their field, and nothing a client sends can
//! crash the server or leave half-stored state behind.

use crate::common;

use std::time::Duration;

use common::{Herald, Receiver, TOKEN};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------------------

/// One response: status, content-type and the body (parsed as JSON, or the raw text as a JSON string
/// when it is not JSON, so assertions report it instead of panicking in the parser).
struct Answer {
    status: u16,
    content_type: String,
    body: Value,
}

/// Bodies are cut short in failure messages: some of these answers are hundreds of kilobytes.
impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let body = self.body.to_string();
        let cut = body.char_indices().nth(600).map_or(body.len(), |(i, _)| i);
        let more = if cut < body.len() { "…" } else { "" };
        write!(f, "{} [{}] {}{more}", self.status, self.content_type, &body[..cut])
    }
}

impl Answer {
    fn is_json(&self) -> bool {
        self.content_type.starts_with("application/json") && !self.body.is_string()
    }
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

/// The absolute path of an API path.
fn api(path: &str) -> String {
    format!("/api/v1{path}")
}

/// Send any request to `path` (from the server root, see [`api`]); `headers` are sent as given (no
/// token is added). A fresh client each time: a pooled connection must not outlive a test's runtime.
async fn send(herald: &Herald, method: &str, path: &str, body: Option<Vec<u8>>, headers: &[(&str, &str)]) -> Answer {
    let client = reqwest::Client::builder().no_proxy().build().expect("client");
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let mut request = client.request(method, format!("http://{}{path}", herald.addr));
    if let Some(body) = body {
        request = request.header("content-type", "application/json").body(body);
    }
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let bytes = response.bytes().await.expect("body");
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    };
    Answer {
        status,
        content_type,
        body,
    }
}

/// Owned header pairs as the borrowed slice [`send`] takes.
fn borrowed<'a>(pairs: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    pairs.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// An authenticated request with raw body bytes.
async fn admin_raw(herald: &Herald, method: &str, path: &str, body: &[u8]) -> Answer {
    send(
        herald,
        method,
        &api(path),
        Some(body.to_vec()),
        &[("authorization", &bearer())],
    )
    .await
}

/// An authenticated request with a JSON body (or none).
async fn admin(herald: &Herald, method: &str, path: &str, body: Option<Value>) -> Answer {
    send(
        herald,
        method,
        &api(path),
        body.map(|b| b.to_string().into_bytes()),
        &[("authorization", &bearer())],
    )
    .await
}

/// POST a message with an `idempotency-key` header.
async fn post_message_keyed(herald: &Herald, app: &str, body: &Value, key: &str) -> Answer {
    let headers = [("authorization", bearer()), ("idempotency-key", key.to_owned())];
    send(
        herald,
        "POST",
        &api(&msg_path(app)),
        Some(body.to_string().into_bytes()),
        &borrowed(&headers),
    )
    .await
}

/// The error contract: the expected status, `application/json`, a string `code` equal to `code` and a
/// non-empty `detail`: a string, or for 422 Svix's list of `{loc, msg, type}`. `what` says which request
/// this was.
fn assert_error(answer: &Answer, status: u16, code: &str, what: &str) {
    assert_eq!(
        answer.status, status,
        "{what}: expected {status} {code}, got {answer:?}"
    );
    assert!(
        answer.content_type.starts_with("application/json"),
        "{what}: error content-type must be application/json, got {answer:?}"
    );
    assert_eq!(
        answer.body["code"].as_str(),
        Some(code),
        "{what}: wrong code in {answer:?}"
    );
    if status == 422 {
        let fields = common::validation_summary(&answer.body);
        assert!(
            !fields.is_empty() && fields.len() == answer.body["detail"].as_array().map_or(0, Vec::len),
            "{what}: a 422 must list {{loc, msg, type}} in detail: {answer:?}"
        );
    } else {
        let detail = answer.body["detail"].as_str().unwrap_or_default();
        assert!(!detail.is_empty(), "{what}: missing string detail in {answer:?}");
    }
}

/// A 422 `validation` error whose detail names `field`.
fn assert_validation(answer: &Answer, field: &str, what: &str) {
    assert_error(answer, 422, "validation", what);
    assert!(
        common::names_field(&answer.body, field),
        "{what}: the detail should name `{field}` in a loc: {answer:?}"
    );
}

/// Never a server error, whatever was sent.
fn assert_not_5xx(answer: &Answer, what: &str) {
    assert!(answer.status < 500, "{what}: server error {answer:?}");
}

/// The whole listing at `path` (one page of up to 250), for before/after comparisons.
async fn listing(herald: &Herald, path: &str) -> Vec<Value> {
    let sep = if path.contains('?') { '&' } else { '?' };
    herald.get(&format!("{path}{sep}limit=250")).await["data"]
        .as_array()
        .cloned()
        .expect("data array")
}

async fn messages(herald: &Herald, app: &str) -> Vec<Value> {
    listing(herald, &format!("/app/{app}/msg")).await
}

fn msg_path(app: &str) -> String {
    format!("/app/{app}/msg")
}

fn valid_message() -> Value {
    json!({ "eventType": "user.created", "payload": { "ok": true } })
}

/// A message body with one field replaced or added.
fn message_with(field: &str, value: Value) -> Value {
    let mut body = valid_message();
    body[field] = value;
    body
}

/// Everything a client can observe of the stored state, for "nothing changed" assertions.
async fn snapshot(herald: &Herald, app: &str) -> Value {
    json!({
        "apps": listing(herald, "/app").await,
        "endpoints": listing(herald, &format!("/app/{app}/endpoint")).await,
        "messages": messages(herald, app).await,
        "eventTypes": listing(herald, "/event-type?include_archived=true").await,
    })
}

/// A populated server: an app (uid `shop`) with one endpoint (uid `ep`) on a live receiver, one
/// delivered message and one event type.
struct Fixture {
    herald: Herald,
    receiver: Receiver,
    app: String,
    endpoint: String,
    msg: String,
}

impl Fixture {
    async fn start(env: &[(&str, &str)]) -> Self {
        let herald = Herald::start(env).await;
        let receiver = Receiver::start(common::Reply::status(200)).await;
        let app = herald.post("/app", json!({ "name": "Shop", "uid": "shop" })).await["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let (endpoint, _) = herald
            .endpoint(&app, json!({ "url": receiver.url(), "uid": "ep" }))
            .await;
        let msg = herald.post(&msg_path(&app), valid_message()).await["id"]
            .as_str()
            .unwrap()
            .to_owned();
        herald
            .post(
                "/event-type",
                json!({ "name": "user.created", "description": "A user" }),
            )
            .await;
        receiver.wait_for(1, Duration::from_secs(10)).await;
        Self {
            herald,
            receiver,
            app,
            endpoint,
            msg,
        }
    }

    /// Every resource route, with a body that would succeed with the right token.
    fn resource_routes(&self) -> Vec<(&'static str, String, Option<Value>)> {
        let (app, ep, msg) = (&self.app, &self.endpoint, &self.msg);
        vec![
            ("GET", "/app".into(), None),
            ("POST", "/app".into(), Some(json!({ "name": "intruder" }))),
            ("GET", format!("/app/{app}"), None),
            ("PUT", format!("/app/{app}"), Some(json!({ "name": "pwned" }))),
            ("PATCH", format!("/app/{app}"), Some(json!({ "name": "pwned" }))),
            ("DELETE", format!("/app/{app}"), None),
            ("GET", format!("/app/{app}/endpoint"), None),
            (
                "POST",
                format!("/app/{app}/endpoint"),
                Some(json!({ "url": "https://example.com/x" })),
            ),
            ("GET", format!("/app/{app}/endpoint/{ep}"), None),
            (
                "PUT",
                format!("/app/{app}/endpoint/{ep}"),
                Some(json!({ "url": "https://example.com/x" })),
            ),
            (
                "PATCH",
                format!("/app/{app}/endpoint/{ep}"),
                Some(json!({ "url": "https://example.com/x" })),
            ),
            ("DELETE", format!("/app/{app}/endpoint/{ep}"), None),
            ("GET", format!("/app/{app}/endpoint/{ep}/secret"), None),
            ("POST", msg_path(app), Some(valid_message())),
            ("GET", msg_path(app), None),
            ("GET", format!("/app/{app}/msg/{msg}"), None),
            ("GET", format!("/app/{app}/msg/{msg}/endpoint"), None),
            ("GET", format!("/app/{app}/attempt/msg/{msg}"), None),
            ("GET", format!("/app/{app}/attempt/endpoint/{ep}"), None),
            ("GET", "/event-type".into(), None),
            (
                "POST",
                "/event-type".into(),
                Some(json!({ "name": "intruder.event", "description": "x" })),
            ),
            ("GET", "/event-type/user.created".into(), None),
            (
                "PUT",
                "/event-type/user.created".into(),
                Some(json!({ "description": "pwned" })),
            ),
            (
                "PATCH",
                "/event-type/user.created".into(),
                Some(json!({ "description": "pwned" })),
            ),
            ("DELETE", "/event-type/user.created".into(), None),
            ("DELETE", "/event-type/user.created?expunge=true".into(), None),
        ]
    }
}

// ---------------------------------------------------------------------------------------------------
// Authentication
// ---------------------------------------------------------------------------------------------------

#[tokio::test]
async fn every_resource_route_answers_401_json_without_a_valid_bearer_token() {
    let fx = Fixture::start(&[]).await;
    let before = snapshot(&fx.herald, &fx.app).await;
    let basic = format!(
        "Basic {}",
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, format!("admin:{TOKEN}"))
    );
    let wrong_token = "Bearer not-the-token".to_owned();
    let prefix_of_token = format!("Bearer {}", &TOKEN[..TOKEN.len() - 1]);
    let token_plus = format!("Bearer {TOKEN}x");
    let bare_token = TOKEN.to_owned();
    let token_scheme = format!("Token {TOKEN}");
    let basic_raw = format!("Basic {TOKEN}");
    let bad_auth: Vec<Option<&str>> = vec![
        None,
        Some(&wrong_token),
        Some("Bearer "),
        Some("Bearer"),
        Some(&prefix_of_token),
        Some(&token_plus),
        Some(&basic),
        Some(&basic_raw),
        Some(&token_scheme),
        Some(&bare_token),
    ];
    for (method, path, body) in fx.resource_routes() {
        for auth in &bad_auth {
            let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", *a)).collect();
            let answer = send(
                &fx.herald,
                method,
                &api(&path),
                body.as_ref().map(|b| b.to_string().into_bytes()),
                &headers,
            )
            .await;
            assert_error(
                &answer,
                401,
                "authentication_failed",
                &format!("{method} {path} with authorization {auth:?}"),
            );
        }
    }
    // Not one of those requests changed anything (no app deleted or renamed, no message, no endpoint).
    assert_eq!(snapshot(&fx.herald, &fx.app).await, before);
    assert_eq!(
        fx.receiver.received().len(),
        1,
        "an unauthenticated message was delivered"
    );
}

#[tokio::test]
async fn health_answers_without_a_token() {
    let herald = Herald::start(&[]).await;
    let answer = send(&herald, "GET", &api("/health"), None, &[]).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(answer.is_json(), "{answer:?}");
    assert_eq!(answer.body["status"], "ok", "{answer:?}");
    // The same route needs no token but is not weakened by a wrong one, and resource routes still need one.
    let answer = send(
        &herald,
        "GET",
        &api("/health"),
        None,
        &[("authorization", "Bearer wrong")],
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_error(
        &send(&herald, "GET", &api("/app"), None, &[]).await,
        401,
        "authentication_failed",
        "GET /app",
    );
}

// ---------------------------------------------------------------------------------------------------
// Malformed bodies
// ---------------------------------------------------------------------------------------------------

/// A body every write route accepts: each route reads the fields it knows and ignores the rest.
const VALID_FOR_ALL: &str =
    r#"{"name":"a","url":"https://example.com/x","eventType":"x","description":"d","payload":{}}"#;

/// Bodies that are not one JSON document. A broken string sits in every field a route reads, or in a key,
/// because serde skips unknown fields without decoding them.
fn malformed_bodies() -> Vec<(&'static str, Vec<u8>)> {
    let every_field = |value: &[u8]| {
        let mut body = Vec::new();
        for field in ["name", "url", "eventType", "description"] {
            body.extend_from_slice(if body.is_empty() { b"{" } else { b"," });
            body.extend_from_slice(format!("\"{field}\":\"").as_bytes());
            body.extend_from_slice(value);
            body.extend_from_slice(b"\"");
        }
        body.extend_from_slice(b"}");
        body
    };
    vec![
        ("an empty body", b"".to_vec()),
        (
            "a truncated document",
            VALID_FOR_ALL.as_bytes()[..VALID_FOR_ALL.len() - 10].to_vec(),
        ),
        ("a document cut after a comma", br#"{"name": "a","#.to_vec()),
        ("a form body", b"name=a&url=b".to_vec()),
        ("plain text", b"hello".to_vec()),
        ("trailing garbage", format!("{VALID_FOR_ALL} trailing").into_bytes()),
        ("two documents", format!("{VALID_FOR_ALL}{VALID_FOR_ALL}").into_bytes()),
        ("a trailing comma", br#"{"name": "a",}"#.to_vec()),
        ("single quotes", br"{'name': 'a'}".to_vec()),
        ("NaN", br#"{"name": NaN}"#.to_vec()),
        ("invalid UTF-8 in every string", every_field(b"a\xff\xfeb")),
        ("invalid UTF-8 in a key", b"{\"\xff\xfe\": 1}".to_vec()),
        ("invalid UTF-8 outside strings", b"\xff\xfe{\"name\": \"a\"}".to_vec()),
        ("a lone surrogate in every string", every_field(br"\ud800")),
        ("a lone surrogate in a key", br#"{"\udc00": 1}"#.to_vec()),
        ("a bad escape in a key", br#"{"\q": 1}"#.to_vec()),
    ]
}

/// Every route that reads a JSON body, on the fixture's objects.
fn body_routes(fx: &Fixture) -> Vec<(&'static str, String)> {
    let (app, ep) = (&fx.app, &fx.endpoint);
    vec![
        ("POST", "/app".to_owned()),
        ("PUT", format!("/app/{app}")),
        ("PATCH", format!("/app/{app}")),
        ("POST", format!("/app/{app}/endpoint")),
        ("PUT", format!("/app/{app}/endpoint/{ep}")),
        ("PATCH", format!("/app/{app}/endpoint/{ep}")),
        ("POST", msg_path(app)),
        ("POST", "/event-type".to_owned()),
        ("PUT", "/event-type/user.created".to_owned()),
        ("PATCH", "/event-type/user.created".to_owned()),
    ]
}

#[tokio::test]
async fn malformed_json_is_400_bad_request_on_every_body_route() {
    let fx = Fixture::start(&[]).await;
    let before = snapshot(&fx.herald, &fx.app).await;
    for (method, path) in body_routes(&fx) {
        for (name, body) in malformed_bodies() {
            let answer = admin_raw(&fx.herald, method, &path, &body).await;
            assert_error(&answer, 400, "bad_request", &format!("{method} {path} with {name}"));
        }
    }
    assert_eq!(
        snapshot(&fx.herald, &fx.app).await,
        before,
        "a malformed body changed stored state"
    );
}

/// JSON arrays shaped like the fields of each body, in declaration order: serde's derived structs accept
/// that form unless the server refuses it.
fn array_bodies(fx: &Fixture) -> Vec<(&'static str, String, Value)> {
    let (app, ep) = (&fx.app, &fx.endpoint);
    vec![
        ("POST", "/app".to_owned(), json!([])),
        ("POST", "/app".to_owned(), json!(["positional-name"])),
        ("POST", "/app".to_owned(), json!([{ "name": "x" }])),
        ("PUT", format!("/app/{app}"), json!(["renamed-by-array"])),
        ("PATCH", format!("/app/{app}"), json!(["renamed-by-array"])),
        (
            "POST",
            format!("/app/{app}/endpoint"),
            json!(["https://example.com/by-array"]),
        ),
        (
            "PUT",
            format!("/app/{app}/endpoint/{ep}"),
            json!(["https://example.com/by-array"]),
        ),
        (
            "PATCH",
            format!("/app/{app}/endpoint/{ep}"),
            json!(["https://example.com/by-array"]),
        ),
        ("POST", msg_path(app), json!([null, "user.created", { "by": "array" }])),
        (
            "POST",
            "/event-type".to_owned(),
            json!(["positional.event", "by array"]),
        ),
        (
            "PUT",
            "/event-type/user.created".to_owned(),
            json!(["changed by array"]),
        ),
        (
            "PATCH",
            "/event-type/user.created".to_owned(),
            json!(["changed by array"]),
        ),
    ]
}

#[tokio::test]
async fn a_json_array_body_never_creates_or_changes_anything() {
    let fx = Fixture::start(&[]).await;
    let before = snapshot(&fx.herald, &fx.app).await;
    for (method, path, body) in array_bodies(&fx) {
        let answer = admin(&fx.herald, method, &path, Some(body.clone())).await;
        let what = format!("{method} {path} with {body}");
        assert!(
            answer.status == 400 || answer.status == 422,
            "{what}: an array body was accepted: {answer:?}"
        );
        let code = if answer.status == 400 {
            "bad_request"
        } else {
            "validation"
        };
        assert_error(&answer, answer.status, code, &what);
    }
    assert_eq!(
        snapshot(&fx.herald, &fx.app).await,
        before,
        "an array body changed stored state"
    );
}

#[tokio::test]
async fn a_json_array_body_is_400_bad_request() {
    let fx = Fixture::start(&[]).await;
    for (method, path, body) in array_bodies(&fx) {
        let answer = admin(&fx.herald, method, &path, Some(body.clone())).await;
        assert_error(&answer, 400, "bad_request", &format!("{method} {path} with {body}"));
    }
}

#[tokio::test]
async fn well_formed_json_of_the_wrong_shape_is_422_naming_the_field() {
    let fx = Fixture::start(&[]).await;
    let before = snapshot(&fx.herald, &fx.app).await;
    let (app, ep) = (&fx.app, &fx.endpoint);
    let endpoint_path = format!("/app/{app}/endpoint");
    let one_endpoint = format!("/app/{app}/endpoint/{ep}");
    let cases: Vec<(&str, String, Value, &str)> = vec![
        // Missing required fields.
        ("POST", "/app".into(), json!({}), "name"),
        ("POST", "/app".into(), json!({ "uid": "x" }), "name"),
        ("PUT", format!("/app/{app}"), json!({ "uid": "x" }), "name"),
        ("POST", endpoint_path.clone(), json!({ "description": "x" }), "url"),
        ("PUT", one_endpoint.clone(), json!({ "description": "x" }), "url"),
        ("POST", msg_path(app), json!({ "payload": {} }), "eventType"),
        ("POST", msg_path(app), json!({ "eventType": "user.created" }), "payload"),
        ("POST", "/event-type".into(), json!({ "description": "x" }), "name"),
        // Wrong types.
        ("POST", "/app".into(), json!({ "name": 5 }), "name"),
        ("POST", "/app".into(), json!({ "name": null }), "name"),
        ("POST", "/app".into(), json!({ "name": "a", "uid": 7 }), "uid"),
        (
            "POST",
            "/app".into(),
            json!({ "name": "a", "metadata": { "k": 1 } }),
            "metadata",
        ),
        (
            "POST",
            "/app".into(),
            json!({ "name": "a", "throttleRate": "fast" }),
            "throttleRate",
        ),
        ("PATCH", format!("/app/{app}"), json!({ "name": ["x"] }), "name"),
        ("POST", endpoint_path.clone(), json!({ "url": 42 }), "url"),
        (
            "POST",
            endpoint_path.clone(),
            json!({ "url": "https://example.com", "filterTypes": "a" }),
            "filterTypes",
        ),
        (
            "POST",
            endpoint_path.clone(),
            json!({ "url": "https://example.com", "channels": [1, 2] }),
            "channels",
        ),
        (
            "POST",
            endpoint_path.clone(),
            json!({ "url": "https://example.com", "disabled": "yes" }),
            "disabled",
        ),
        (
            "POST",
            endpoint_path.clone(),
            json!({ "url": "https://example.com", "throttleRate": 70000 }),
            "throttleRate",
        ),
        (
            "POST",
            endpoint_path.clone(),
            json!({ "url": "https://example.com", "throttleRate": -1 }),
            "throttleRate",
        ),
        (
            "PATCH",
            one_endpoint.clone(),
            json!({ "url": { "href": "https://example.com" } }),
            "url",
        ),
        ("PATCH", one_endpoint.clone(), json!({ "disabled": 1 }), "disabled"),
        (
            "POST",
            msg_path(app),
            json!({ "eventType": 12, "payload": {} }),
            "eventType",
        ),
        (
            "POST",
            msg_path(app),
            json!({ "eventType": ["a"], "payload": {} }),
            "eventType",
        ),
        (
            "POST",
            msg_path(app),
            message_with("channels", json!("one")),
            "channels",
        ),
        ("POST", msg_path(app), message_with("eventId", json!(12)), "eventId"),
        (
            "POST",
            "/event-type".into(),
            json!({ "name": 1, "description": "x" }),
            "name",
        ),
        (
            "PATCH",
            "/event-type/user.created".into(),
            json!({ "archived": "yes" }),
            "archived",
        ),
    ];
    for (method, path, body, field) in &cases {
        let answer = admin(&fx.herald, method, path, Some(body.clone())).await;
        assert_validation(&answer, field, &format!("{method} {path} with {body}"));
    }
    assert_eq!(
        snapshot(&fx.herald, &fx.app).await,
        before,
        "an invalid body changed stored state"
    );
}

// ---------------------------------------------------------------------------------------------------
// Unknown objects, routes and methods
// ---------------------------------------------------------------------------------------------------

#[tokio::test]
async fn unknown_objects_are_404_not_found() {
    let fx = Fixture::start(&[]).await;
    let other = fx.herald.app("other").await;
    let before = snapshot(&fx.herald, &fx.app).await;
    let (app, ep, msg) = (&fx.app, &fx.endpoint, &fx.msg);
    let cases: Vec<(&str, String, Option<Value>)> = vec![
        ("GET", "/app/app_doesnotexist".into(), None),
        ("GET", "/app/no-such-uid".into(), None),
        ("PATCH", "/app/no-such-uid".into(), Some(json!({ "name": "x" }))),
        ("DELETE", "/app/no-such-uid".into(), None),
        ("GET", "/app/no-such-uid/endpoint".into(), None),
        (
            "POST",
            "/app/no-such-uid/endpoint".into(),
            Some(json!({ "url": "https://example.com" })),
        ),
        (
            "PUT",
            "/app/no-such-uid/endpoint/x".into(),
            Some(json!({ "url": "https://example.com" })),
        ),
        ("GET", format!("/app/{app}/endpoint/ep_doesnotexist"), None),
        ("GET", format!("/app/{app}/endpoint/no-such-ep"), None),
        (
            "PATCH",
            format!("/app/{app}/endpoint/no-such-ep"),
            Some(json!({ "description": "x" })),
        ),
        ("DELETE", format!("/app/{app}/endpoint/no-such-ep"), None),
        ("GET", format!("/app/{app}/endpoint/no-such-ep/secret"), None),
        ("POST", "/app/no-such-uid/msg".into(), Some(valid_message())),
        ("GET", "/app/no-such-uid/msg".into(), None),
        ("GET", format!("/app/{app}/msg/msg_doesnotexist"), None),
        ("GET", format!("/app/{app}/attempt/msg/msg_doesnotexist"), None),
        ("GET", format!("/app/{app}/attempt/endpoint/no-such-ep"), None),
        ("GET", format!("/app/no-such-uid/attempt/msg/{msg}"), None),
        ("GET", "/event-type/no.such.type".into(), None),
        (
            "PATCH",
            "/event-type/no.such.type".into(),
            Some(json!({ "description": "x" })),
        ),
        ("DELETE", "/event-type/no.such.type".into(), None),
        ("DELETE", "/event-type/no.such.type?expunge=true".into(), None),
        ("GET", format!("/app/{app}/msg/msg_doesnotexist/endpoint"), None),
        // Another application's objects are invisible through this one.
        ("GET", format!("/app/{other}/endpoint/{ep}"), None),
        (
            "PATCH",
            format!("/app/{other}/endpoint/{ep}"),
            Some(json!({ "description": "x" })),
        ),
        ("DELETE", format!("/app/{other}/endpoint/{ep}"), None),
        ("GET", format!("/app/{other}/endpoint/{ep}/secret"), None),
        ("GET", format!("/app/{other}/msg/{msg}"), None),
        ("GET", format!("/app/{other}/msg/{msg}/endpoint"), None),
        ("GET", format!("/app/{other}/attempt/msg/{msg}"), None),
        ("GET", format!("/app/{other}/attempt/endpoint/{ep}"), None),
    ];
    for (method, path, body) in &cases {
        let answer = admin(&fx.herald, method, path, body.clone()).await;
        assert_error(&answer, 404, "not_found", &format!("{method} {path}"));
    }
    assert_eq!(
        snapshot(&fx.herald, &fx.app).await,
        before,
        "a 404 request changed stored state"
    );
}

#[tokio::test]
async fn unknown_routes_are_404_json_and_wrong_methods_405_json() {
    let fx = Fixture::start(&[]).await;
    let (app, msg) = (&fx.app, &fx.msg);
    for path in [
        "/api/v1/nope",
        "/api/v1/app/x/y/z/w",
        "/api/v1/app/x/endpoint/y/z",
        "/api/v2/app",
        "/api",
        "/",
        "/nope",
        "/api/v1",
    ] {
        for token in [true, false] {
            let headers = if token {
                vec![("authorization", bearer())]
            } else {
                vec![]
            };
            let answer = send(&fx.herald, "GET", path, None, &borrowed(&headers)).await;
            assert_error(&answer, 404, "not_found", &format!("GET {path} (token: {token})"));
        }
    }
    for (method, path) in [
        ("DELETE", "/app".to_owned()),
        ("PATCH", "/app".to_owned()),
        ("POST", format!("/app/{app}")),
        ("DELETE", msg_path(app)),
        ("PUT", format!("/app/{app}/msg/{msg}")),
        ("POST", format!("/app/{app}/msg/{msg}/endpoint")),
        ("DELETE", format!("/app/{app}/msg/{msg}")),
        ("POST", format!("/app/{app}/attempt/msg/{msg}")),
        ("POST", format!("/app/{app}/endpoint/{}/secret", fx.endpoint)),
        ("DELETE", "/event-type".to_owned()),
        ("POST", "/event-type/user.created".to_owned()),
        ("POST", "/health".to_owned()),
        ("DELETE", "/health".to_owned()),
    ] {
        let answer = admin(&fx.herald, method, &path, None).await;
        assert_error(&answer, 405, "method_not_allowed", &format!("{method} {path}"));
    }
}

// ---------------------------------------------------------------------------------------------------
// Conflicts
// ---------------------------------------------------------------------------------------------------

#[tokio::test]
async fn duplicate_uids_and_names_are_409_conflict() {
    let fx = Fixture::start(&[]).await;
    let herald = &fx.herald;
    let url = fx.receiver.url();
    let second = herald.post("/app", json!({ "name": "Second", "uid": "second" })).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (second_ep, _) = herald.endpoint(&second, json!({ "url": url, "uid": "ep2" })).await;
    herald
        .endpoint(&second, json!({ "url": url, "uid": "ep2-other" }))
        .await;
    let before = snapshot(herald, &fx.app).await;
    let before_second = listing(herald, &format!("/app/{second}/endpoint")).await;
    let cases: Vec<(&str, String, Value)> = vec![
        ("POST", "/app".into(), json!({ "name": "Again", "uid": "shop" })),
        (
            "PUT",
            format!("/app/{second}"),
            json!({ "name": "Second", "uid": "shop" }),
        ),
        ("PATCH", format!("/app/{second}"), json!({ "uid": "shop" })),
        (
            "POST",
            format!("/app/{}/endpoint", fx.app),
            json!({ "url": url, "uid": "ep" }),
        ),
        (
            "POST",
            format!("/app/{second}/endpoint"),
            json!({ "url": url, "uid": "ep2" }),
        ),
        (
            "PUT",
            format!("/app/{second}/endpoint/{second_ep}"),
            json!({ "url": url, "uid": "ep2-other" }),
        ),
        (
            "PATCH",
            format!("/app/{second}/endpoint/{second_ep}"),
            json!({ "uid": "ep2-other" }),
        ),
        (
            "POST",
            "/event-type".into(),
            json!({ "name": "user.created", "description": "again" }),
        ),
    ];
    for (method, path, body) in &cases {
        let answer = admin(herald, method, path, Some(body.clone())).await;
        assert_error(&answer, 409, "conflict", &format!("{method} {path} with {body}"));
    }
    assert_eq!(
        snapshot(herald, &fx.app).await,
        before,
        "a conflicting write changed stored state"
    );
    assert_eq!(listing(herald, &format!("/app/{second}/endpoint")).await, before_second);
    // The same endpoint uid in a different application is not a conflict.
    let third = herald.app("third").await;
    let answer = admin(
        herald,
        "POST",
        &format!("/app/{third}/endpoint"),
        Some(json!({ "url": url, "uid": "ep" })),
    )
    .await;
    assert_eq!(answer.status, 201, "{answer:?}");
}

// ---------------------------------------------------------------------------------------------------
// Endpoint URLs
// ---------------------------------------------------------------------------------------------------

fn hostile_urls() -> Vec<Value> {
    [
        "ftp://example.com/hook",
        "file:///etc/passwd",
        "javascript:alert(1)",
        "data:text/plain,hello",
        "gopher://example.com/",
        "http://",
        "https://",
        "http://:80/",
        "not a url",
        "example.com/hook",
        "/relative/path",
        "",
        "http://169.254.169.254/",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        "http://192.168.1.1:8080/x",
        "http://172.16.0.1/",
        "http://0.0.0.0/",
        "http://[::1]/",
        "http://[::ffff:10.0.0.1]/",
        "http://[::ffff:169.254.169.254]/",
        "http://[fd00:ec2::254]/",
        "http://100.100.100.200/",
        "http://224.0.0.1/",
        "http://255.255.255.255/",
        "http://exa mple.com/",
    ]
    .into_iter()
    .map(Value::from)
    .collect()
}

#[tokio::test]
async fn hostile_endpoint_urls_are_422_on_create_put_and_patch_and_change_nothing() {
    let fx = Fixture::start(&[]).await;
    let herald = &fx.herald;
    let (app, ep) = (&fx.app, &fx.endpoint);
    let before = listing(herald, &format!("/app/{app}/endpoint")).await;
    let mut hostile = hostile_urls();
    hostile.push(json!(format!("https://{}.com/", "a".repeat(5000))));
    for url in &hostile {
        let writes = [
            ("POST", format!("/app/{app}/endpoint"), json!({ "url": url })),
            (
                "POST",
                format!("/app/{app}/endpoint"),
                json!({ "url": url, "uid": "fresh" }),
            ),
            ("PUT", format!("/app/{app}/endpoint/{ep}"), json!({ "url": url })),
            ("PUT", format!("/app/{app}/endpoint/new-by-put"), json!({ "url": url })),
            ("PATCH", format!("/app/{app}/endpoint/{ep}"), json!({ "url": url })),
        ];
        for (method, path, body) in &writes {
            let answer = admin(herald, method, path, Some(body.clone())).await;
            assert_validation(&answer, "url", &format!("{method} {path} with url {url}"));
        }
    }
    assert_eq!(
        listing(herald, &format!("/app/{app}/endpoint")).await,
        before,
        "a refused URL changed the endpoints"
    );
    // Loopback is allowlisted by the harness, so the policy is not simply "refuse everything".
    let control = format!("http://127.0.0.1:{}/ok", fx.receiver.addr.port());
    let answer = admin(
        herald,
        "PATCH",
        &format!("/app/{app}/endpoint/{ep}"),
        Some(json!({ "url": control })),
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.body["url"], control.as_str());
}

// ---------------------------------------------------------------------------------------------------
// Payload limits
// ---------------------------------------------------------------------------------------------------

/// A message body whose payload is exactly `size` bytes of JSON.
fn payload_of(size: usize) -> Value {
    let filler = size - r#"{"pad":""}"#.len();
    json!({ "eventType": "big.payload", "payload": { "pad": "x".repeat(filler) } })
}

#[tokio::test]
async fn payload_over_the_limit_is_413_and_nothing_is_stored() {
    let fx = Fixture::start(&[("HERALD_MAX_PAYLOAD_BYTES", "1024")]).await;
    let herald = &fx.herald;
    let app = &fx.app;
    let before = messages(herald, app).await;
    assert_eq!(before.len(), 1);
    // Over the payload limit, inside the body limit.
    let answer = admin(herald, "POST", &msg_path(app), Some(payload_of(2048))).await;
    assert_error(&answer, 413, "payload_too_large", "2 KiB payload");
    let answer = admin(herald, "POST", &msg_path(app), Some(payload_of(1025))).await;
    assert_error(&answer, 413, "payload_too_large", "1025-byte payload");
    // Over the whole body limit: the reader stops early.
    let answer = admin(herald, "POST", &msg_path(app), Some(payload_of(200 * 1024))).await;
    assert_error(&answer, 413, "payload_too_large", "200 KiB body");
    // A large body on other routes is refused the same way.
    let answer = admin(herald, "POST", "/app", Some(json!({ "name": "x".repeat(200 * 1024) }))).await;
    assert_error(&answer, 413, "payload_too_large", "200 KiB app body");
    assert_eq!(messages(herald, app).await, before, "a refused payload was stored");
    // Exactly at the limit is accepted, and a normal message still works.
    let answer = admin(herald, "POST", &msg_path(app), Some(payload_of(1024))).await;
    assert_eq!(answer.status, 202, "1024-byte payload: {answer:?}");
    let answer = admin(herald, "POST", &msg_path(app), Some(valid_message())).await;
    assert_eq!(answer.status, 202, "{answer:?}");
    assert_eq!(messages(herald, app).await.len(), 3);
    // Only the accepted messages reached the receiver.
    fx.receiver.wait_for(3, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(fx.receiver.received().len(), 3);
}

// ---------------------------------------------------------------------------------------------------
// Message bodies
// ---------------------------------------------------------------------------------------------------

/// RFC 3339 text for `hours` from now.
fn in_hours(hours: i64) -> String {
    let at = time::OffsetDateTime::now_utc() + time::Duration::hours(hours);
    at.format(&time::format_description::well_known::Rfc3339)
        .expect("format a date-time")
}

#[tokio::test]
async fn invalid_message_fields_are_422_naming_the_field_and_store_nothing() {
    let fx = Fixture::start(&[]).await;
    let herald = &fx.herald;
    let app = &fx.app;
    let before = messages(herald, app).await;
    let channels = |n: usize| json!((0..n).map(|i| format!("ch{i}")).collect::<Vec<_>>());
    let cases: Vec<(Value, &str)> = vec![
        (message_with("payload", json!([1, 2])), "payload"),
        (message_with("payload", json!("text")), "payload"),
        (message_with("payload", json!(42)), "payload"),
        (message_with("payload", json!(null)), "payload"),
        (message_with("payload", json!(true)), "payload"),
        (message_with("eventType", json!("user created")), "eventType"),
        (message_with("eventType", json!("e".repeat(300))), "eventType"),
        (message_with("eventType", json!("")), "eventType"),
        (message_with("eventType", json!("user/created")), "eventType"),
        (message_with("eventType", json!("ütf8")), "eventType"),
        (message_with("channels", channels(11)), "channels"),
        (message_with("channels", channels(6)), "channels"),
        (message_with("channels", json!(["has space"])), "channels"),
        (message_with("channels", json!([""])), "channels"),
        (message_with("tags", channels(6)), "tags"),
        (message_with("tags", json!(["has space"])), "tags"),
        (message_with("tags", json!([""])), "tags"),
        (message_with("tags", json!(["t".repeat(129)])), "tags"),
        (message_with("tags", json!(["ütf8"])), "tags"),
        // Past the scheduling horizon (24 hours ahead), or not a date-time.
        (message_with("deliverAt", json!("2030-01-01T00:00:00Z")), "deliverAt"),
        (message_with("deliverAt", json!(in_hours(25))), "deliverAt"),
        (message_with("deliverAt", json!("tomorrow")), "deliverAt"),
        (message_with("deliverAt", json!(12)), "deliverAt"),
        (
            message_with("transformationsParams", json!({ "rawPayload": "x" })),
            "transformationsParams",
        ),
        (message_with("eventId", json!("")), "eventId"),
        (message_with("eventId", json!("e".repeat(300))), "eventId"),
    ];
    for (body, field) in &cases {
        let answer = admin(herald, "POST", &msg_path(app), Some(body.clone())).await;
        assert_validation(&answer, field, &format!("message {body}"));
    }
    let long_key = "k".repeat(300);
    let answer = post_message_keyed(herald, app, &valid_message(), &long_key).await;
    assert_validation(&answer, "idempotency-key", "300-char idempotency key");
    assert_eq!(messages(herald, app).await, before, "an invalid message was stored");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(fx.receiver.received().len(), 1, "an invalid message was delivered");
    // Five channels (Svix's maximum for a message) is not an error.
    let answer = admin(
        herald,
        "POST",
        &msg_path(app),
        Some(message_with("channels", channels(5))),
    )
    .await;
    assert_eq!(answer.status, 202, "{answer:?}");
}

// ---------------------------------------------------------------------------------------------------
// Query parameters
// ---------------------------------------------------------------------------------------------------

#[tokio::test]
async fn bad_query_parameters_are_422_naming_the_parameter() {
    let fx = Fixture::start(&[]).await;
    let (app, ep, msg) = (&fx.app, &fx.endpoint, &fx.msg);
    let lists = [
        "/app".to_owned(),
        format!("/app/{app}/endpoint"),
        msg_path(app),
        format!("/app/{app}/msg/{msg}/endpoint"),
        format!("/app/{app}/attempt/msg/{msg}"),
        format!("/app/{app}/attempt/endpoint/{ep}"),
        "/event-type".to_owned(),
    ];
    for list in &lists {
        for bad in ["abc", "-1", "1.5", "", "1e3", "99999999999999999999999"] {
            let path = format!("{list}?limit={bad}");
            let answer = admin(&fx.herald, "GET", &path, None).await;
            assert_validation(&answer, "limit", &format!("GET {path}"));
        }
        // The documented range is 1 to 250: outside it is refused, not clamped.
        for bad in ["0", "251", "100000", "9223372036854775807"] {
            let path = format!("{list}?limit={bad}");
            let answer = admin(&fx.herald, "GET", &path, None).await;
            assert_validation(&answer, "limit", &format!("GET {path}"));
        }
        for good in ["1", "250"] {
            let answer = admin(&fx.herald, "GET", &format!("{list}?limit={good}"), None).await;
            assert_eq!(answer.status, 200, "GET {list}?limit={good}: {answer:?}");
            assert!(!answer.body["data"].as_array().expect("data").is_empty(), "{answer:?}");
        }
    }
    let before = snapshot(&fx.herald, app).await;
    let maybe_app = json!({ "name": "x", "uid": "maybe-app" });
    let cases: Vec<(&str, String, Option<Value>, &str)> = vec![
        ("GET", msg_path(app) + "?with_content=maybe", None, "with_content"),
        ("GET", msg_path(app) + "?with_content=1", None, "with_content"),
        (
            "GET",
            format!("/app/{app}/msg/{msg}?with_content=maybe"),
            None,
            "with_content",
        ),
        (
            "POST",
            msg_path(app) + "?with_content=maybe",
            Some(valid_message()),
            "with_content",
        ),
        ("GET", msg_path(app) + "?since=yesterday", None, "since"),
        ("GET", msg_path(app) + "?since=2024-13-45T00:00:00Z", None, "since"),
        ("GET", msg_path(app) + "?until=soon", None, "until"),
        ("GET", msg_path(app) + "?before=1700000000", None, "before"),
        ("GET", msg_path(app) + "?after=1700000000", None, "after"),
        (
            "GET",
            "/event-type?include_archived=maybe".into(),
            None,
            "include_archived",
        ),
        (
            "POST",
            "/app?get_if_exists=maybe".into(),
            Some(maybe_app),
            "get_if_exists",
        ),
        (
            "DELETE",
            "/event-type/user.created?expunge=maybe".into(),
            None,
            "expunge",
        ),
    ];
    for (method, path, body, param) in cases {
        let answer = admin(&fx.herald, method, &path, body).await;
        assert_validation(&answer, param, &format!("{method} {path}"));
    }
    // None of those created, archived or deleted anything.
    assert_eq!(snapshot(&fx.herald, app).await, before);
    // A garbage iterator is a 422 naming it, on every listing (an event type's name is its listing's
    // iterator, so only the first is garbage there).
    for list in &lists {
        let garbage: &[&str] = if list == "/event-type" {
            &["%00%FF'--garbage"]
        } else {
            &["%00%FF'--garbage", "garbage", "app_", "-"]
        };
        for garbage in garbage {
            let path = format!("{list}?iterator={garbage}");
            let answer = admin(&fx.herald, "GET", &path, None).await;
            assert_validation(&answer, "iterator", &format!("GET {path}"));
        }
    }
}

/// Every documented listing (a `GET` that takes `limit`), read from the served OpenAPI document, with
/// its path filled in from the fixture, and the query parameters it documents (resolved).
async fn documented_listings(fx: &Fixture) -> Vec<(String, Vec<Value>)> {
    let doc = send(&fx.herald, "GET", "/api/v1/openapi.json", None, &[]).await.body;
    // The poller's listings read a polling endpoint's stream, by a consumer the client names.
    let sink = fx
        .herald
        .post(&format!("/app/{}/polling-endpoint", fx.app), json!({}))
        .await["id"]
        .as_str()
        .expect("polling endpoint id")
        .to_owned();
    let resolve = |p: &Value| match p["$ref"].as_str().and_then(|r| r.strip_prefix('#')) {
        Some(pointer) => doc.pointer(pointer).cloned().expect("$ref resolves"),
        None => p.clone(),
    };
    let mut out = Vec::new();
    for (template, operations) in doc["paths"].as_object().expect("paths") {
        let Some(params) = operations["get"]["parameters"].as_array() else {
            continue;
        };
        let params: Vec<Value> = params.iter().map(resolve).filter(|p| p["in"] == "query").collect();
        if !params.iter().any(|p| p["name"] == "limit") {
            continue;
        }
        let path = template
            .strip_prefix("/api/v1")
            .expect("under /api/v1")
            .replace("{app_id}", &fx.app)
            .replace("{endpoint_id}", &fx.endpoint)
            .replace("{msg_id}", &fx.msg)
            .replace("{sink_id}", &sink)
            .replace("{consumer_id}", "consumer-1");
        assert!(
            !path.contains('{'),
            "{template}: a path parameter this test cannot fill in"
        );
        out.push((path, params));
    }
    out
}

/// A value the schema of a documented query parameter refuses, if the test knows one for its type.
fn refused_value(schema: &Value) -> Option<&'static str> {
    match schema["type"].as_str()? {
        "boolean" => Some("maybe"),
        "integer" if schema["enum"].is_array() => Some("99"),
        "integer" => Some("1.5"),
        "string" if schema["format"] == "date-time" => Some("xyz"),
        "string" if schema["enum"].is_array() || schema["pattern"].is_string() => Some("garbage%00"),
        _ => None,
    }
}

#[tokio::test]
async fn every_documented_listing_validates_its_query_the_same_way() {
    let fx = Fixture::start(&[]).await;
    let listings = documented_listings(&fx).await;
    assert!(
        listings.len() >= 10,
        "too few listings found in the document: {listings:?}"
    );
    for (path, params) in &listings {
        let answer = admin(&fx.herald, "GET", path, None).await;
        assert_eq!(answer.status, 200, "GET {path}: {answer:?}");
        // A parameter the operation does not take, and a parameter given twice.
        let answer = admin(&fx.herald, "GET", &format!("{path}?sinec=2024-01-01T00:00:00Z"), None).await;
        assert_validation(&answer, "sinec", &format!("GET {path}?sinec"));
        assert_eq!(answer.body["detail"][0]["type"], "value_error.extra", "{answer:?}");
        let answer = admin(&fx.herald, "GET", &format!("{path}?limit=1&limit=2"), None).await;
        assert_validation(&answer, "limit", &format!("GET {path} with limit twice"));
        for limit in ["0", "251", "9223372036854775807", "x"] {
            let answer = admin(&fx.herald, "GET", &format!("{path}?limit={limit}"), None).await;
            assert_validation(&answer, "limit", &format!("GET {path}?limit={limit}"));
        }
        // Every documented parameter refuses a value outside its schema, naming itself.
        for param in params {
            let name = param["name"].as_str().expect("name");
            let Some(bad) = refused_value(&param["schema"]) else {
                continue;
            };
            let answer = admin(&fx.herald, "GET", &format!("{path}?{name}={bad}"), None).await;
            assert_validation(&answer, name, &format!("GET {path}?{name}={bad}"));
        }
    }
}

/// A source for the inbox tests.
const INBOX: &str = "[[source]]\nname = \"acme\"\nscheme = \"standard-webhooks\"\n\
                     secrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]\nforward_to = \"http://127.0.0.1:9/hook\"\n";

#[tokio::test]
async fn the_inbox_admin_api_validates_and_answers_422_in_the_senders_shape() {
    let inbox = Herald::start_inbox(INBOX, &[], None).await;
    let list = "/inbox/event";
    assert_eq!(admin(&inbox, "GET", list, None).await.status, 200);
    // The listing: an unknown parameter, one given twice, limits out of bounds, bad values.
    let cases: Vec<(String, &str)> = vec![
        (format!("{list}?since=xyz"), "since"),
        (format!("{list}?sinec=2024-01-01T00:00:00Z"), "sinec"),
        (format!("{list}?limit=1&limit=2"), "limit"),
        (format!("{list}?limit=0"), "limit"),
        (format!("{list}?limit=251"), "limit"),
        (format!("{list}?limit=9223372036854775807"), "limit"),
        (format!("{list}?limit=99999999999999999999"), "limit"),
        (format!("{list}?limit=x"), "limit"),
        (format!("{list}?status=99"), "status"),
        (format!("{list}?iterator=garbage"), "iterator"),
        (format!("{list}?iterator=evt_"), "iterator"),
        (format!("{list}?iterator=%00%FF'--garbage"), "iterator"),
        // The routes that take no query parameter.
        ("/inbox/stats?verbose=1".to_owned(), "verbose"),
        ("/inbox/event/evt_nothing?with_content=true".to_owned(), "with_content"),
    ];
    for (path, field) in cases {
        let answer = admin(&inbox, "GET", &path, None).await;
        assert_validation(&answer, field, &format!("GET {path}"));
    }
    let answer = admin(&inbox, "GET", &format!("{list}?sinec=1"), None).await;
    assert_eq!(answer.body["detail"][0]["type"], "value_error.extra", "{answer:?}");
    // The window replay's body: each mistake named, a body that is not a JSON object a 400.
    let replay = "/inbox/source/acme/replay";
    let bodies: Vec<(Value, &str)> = vec![
        (json!({}), "since"),
        (json!({"since": 1}), "since"),
        (json!({"since": "yesterday"}), "since"),
        (json!({"since": "2026-01-01T00:00:00Z", "until": false}), "until"),
        (
            json!({"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}),
            "until",
        ),
        (
            json!({"since": "2026-01-01T00:00:00Z", "untill": "2026-01-02T00:00:00Z"}),
            "untill",
        ),
    ];
    for (body, field) in bodies {
        let answer = admin(&inbox, "POST", replay, Some(body.clone())).await;
        assert_validation(&answer, field, &format!("POST {replay} {body}"));
    }
    let answer = admin(
        &inbox,
        "POST",
        &format!("{replay}?since=x"),
        Some(json!({"since": "2026-01-01T00:00:00Z"})),
    )
    .await;
    assert_validation(&answer, "since", "a window given in the query");
    for garbage in [&b"garbage"[..], b"[]", b""] {
        let answer = admin_raw(&inbox, "POST", replay, garbage).await;
        assert_error(&answer, 400, "bad_request", &String::from_utf8_lossy(garbage));
    }
    let answer = admin(
        &inbox,
        "POST",
        replay,
        Some(json!({"since": "2026-01-01T00:00:00Z", "until": null})),
    )
    .await;
    assert_eq!(
        (answer.status, &answer.body),
        (202, &json!({"replayed": 0})),
        "{answer:?}"
    );
}

// ---------------------------------------------------------------------------------------------------
// Robustness
// ---------------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_flood_of_odd_inputs_does_not_crash_the_server() {
    let fx = Fixture::start(&[]).await;
    let herald = &fx.herald;
    let app = fx.app.clone();
    let ep = fx.endpoint.clone();
    let deep_array = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let deep_object = format!("{}1{}", r#"{"a":"#.repeat(50_000), "}".repeat(50_000));
    let only_open = "{".repeat(500_000);
    let huge_number = format!(r#"{{"name": {}}}"#, "9".repeat(100_000));
    let bodies: Vec<(&str, String, Vec<u8>)> = vec![
        ("POST", "/app".into(), deep_array.clone().into_bytes()),
        ("POST", "/app".into(), deep_object.clone().into_bytes()),
        ("POST", msg_path(&app), deep_array.into_bytes()),
        ("POST", msg_path(&app), deep_object.into_bytes()),
        ("POST", msg_path(&app), only_open.into_bytes()),
        ("POST", "/app".into(), huge_number.into_bytes()),
        ("POST", "/app".into(), br#"{"name": 1e999999}"#.to_vec()),
        ("POST", "/app".into(), br#"{"name": "nul\u0000byte"}"#.to_vec()),
        (
            "POST",
            "/app".into(),
            br#"{"name": "emoji \ud83e\udd80 and \u202ertl"}"#.to_vec(),
        ),
        (
            "POST",
            "/app".into(),
            br#"{"name": "x", "name": "duplicate key"}"#.to_vec(),
        ),
        ("POST", "/app".into(), vec![0u8; 4096]),
        ("POST", "/app".into(), (0..=255u8).cycle().take(10_000).collect()),
        (
            "POST",
            format!("/app/{app}/endpoint"),
            br#"{"url": "http://127.0.0.1:1/\u0000"}"#.to_vec(),
        ),
        (
            "POST",
            format!("/app/{app}/endpoint"),
            br#"{"url": "https://example.com", "secret": "whsec_!!!"}"#.to_vec(),
        ),
        (
            "POST",
            format!("/app/{app}/endpoint"),
            br#"{"url": "https://example.com", "secret": "whsec_"}"#.to_vec(),
        ),
        (
            "POST",
            format!("/app/{app}/endpoint"),
            br#"{"url": "https://example.com", "headers": {"webhook-signature": "v1,forged"}}"#.to_vec(),
        ),
        (
            "PATCH",
            format!("/app/{app}/endpoint/{ep}"),
            br#"{"url": null}"#.to_vec(),
        ),
        (
            "PATCH",
            format!("/app/{app}/endpoint/{ep}"),
            br#"{"secret": "not-a-secret"}"#.to_vec(),
        ),
        ("PATCH", format!("/app/{app}"), br#"{"name": ""}"#.to_vec()),
        (
            "PATCH",
            format!("/app/{app}"),
            br#"{"uid": "app_looks_like_an_id"}"#.to_vec(),
        ),
        (
            "PUT",
            "/event-type/has space".into(),
            br#"{"description": "x"}"#.to_vec(),
        ),
        (
            "PUT",
            format!("/event-type/{}", "e".repeat(5000)),
            br#"{"description": "x"}"#.to_vec(),
        ),
        (
            "POST",
            "/event-type".into(),
            br#"{"name": "x", "description": "x", "schemas": [1]}"#.to_vec(),
        ),
    ];
    for (method, path, body) in &bodies {
        let answer = admin_raw(herald, method, path, body).await;
        assert_not_5xx(&answer, &format!("{method} {path}"));
        assert!(answer.is_json(), "{method} {path}: {answer:?}");
    }
    let long_segment = "a".repeat(20_000);
    let paths = [
        format!("/app/{long_segment}"),
        "/app/%00".to_owned(),
        "/app/..%2f..%2fetc%2fpasswd".to_owned(),
        "/app/../../../etc/passwd".to_owned(),
        "/app/%2e%2e".to_owned(),
        format!("/app/{app}/msg/%27%20OR%201=1--"),
        "/app/%F0%9F%A6%80".to_owned(),
        "/event-type/%0d%0aInjected:%20header".to_owned(),
        "/app//endpoint".to_owned(),
    ];
    for path in &paths {
        let answer = admin(herald, "GET", path, None).await;
        assert_not_5xx(&answer, path);
    }
    // Odd headers: non-ASCII authorization bytes, odd idempotency keys, unknown methods.
    let answer = send(herald, "GET", &api("/app"), None, &[("authorization", "Bearer tést")]).await;
    assert_error(&answer, 401, "authentication_failed", "non-ASCII token");
    for key in ["k".repeat(257), " ".to_owned()] {
        let answer = post_message_keyed(herald, &app, &valid_message(), &key).await;
        assert_not_5xx(&answer, "odd idempotency key");
    }
    let answer = admin(herald, "BREW", "/app", None).await;
    assert_not_5xx(&answer, "BREW /app");
    // Many bad requests at once.
    let client = reqwest::Client::builder().no_proxy().build().expect("client");
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let url = herald.url(&msg_path(&app));
        let client = client.clone();
        tasks.spawn(async move {
            let body = if i % 2 == 0 {
                b"{\"eventType\":".to_vec()
            } else {
                br#"{"eventType":"a b","payload":{}}"#.to_vec()
            };
            let response = client
                .post(url)
                .header("authorization", bearer())
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .expect("request");
            response.status().as_u16()
        });
    }
    while let Some(status) = tasks.join_next().await {
        let status = status.expect("task");
        assert!(status == 400 || status == 422, "concurrent bad request got {status}");
    }
    // Still alive and still working.
    let health = send(herald, "GET", &api("/health"), None, &[]).await;
    assert_eq!(health.status, 200, "{health:?}");
    let answer = admin(herald, "POST", &msg_path(&app), Some(valid_message())).await;
    assert_eq!(answer.status, 202, "{answer:?}");
    let id = answer.body["id"].as_str().unwrap();
    assert_eq!(
        herald.get(&format!("/app/{app}/msg/{id}")).await["payload"],
        json!({ "ok": true })
    );
    // Whatever the flood stored reads back as valid JSON listings.
    let listed = messages(herald, &app).await;
    assert!(listed.iter().any(|m| m["id"] == id));
    listing(herald, "/app").await;
    listing(herald, &format!("/app/{app}/endpoint")).await;
}

#[tokio::test]
async fn values_with_odd_characters_round_trip_exactly() {
    let herald = Herald::start(&[]).await;
    // (A NUL is refused: see lengths_are_capped_and_nul_is_refused_naming_the_field.)
    for name in [
        "emoji 🦀",
        "quote \" and backslash \\",
        "\u{202e}rtl override",
        "tab\tnewline\n",
    ] {
        let created = herald.post("/app", json!({ "name": name })).await;
        assert_eq!(created["name"], name);
        let id = created["id"].as_str().unwrap();
        assert_eq!(
            herald.get(&format!("/app/{id}")).await["name"],
            name,
            "stored name differs"
        );
    }
}

#[tokio::test]
async fn failed_requests_leave_nothing_half_stored() {
    let fx = Fixture::start(&[]).await;
    let herald = &fx.herald;
    let app = &fx.app;

    // A message with an invalid channel or event type stores nothing and reserves neither its eventId
    // nor its idempotency key.
    let bad =
        json!({ "eventType": "user.created", "eventId": "evt-1", "payload": { "v": 1 }, "channels": ["bad channel"] });
    let answer = post_message_keyed(herald, app, &bad, "key-1").await;
    assert_validation(&answer, "channels", "message with an invalid channel");
    let answer = admin(
        herald,
        "POST",
        &msg_path(app),
        Some(json!({ "eventType": "bad type", "eventId": "evt-2", "payload": {} })),
    )
    .await;
    assert_validation(&answer, "eventType", "message with an invalid event type");
    assert_eq!(messages(herald, app).await.len(), 1, "a refused message is listed");
    let good = json!({ "eventType": "user.updated", "eventId": "evt-1", "payload": { "v": 2 } });
    let answer = post_message_keyed(herald, app, &good, "key-1").await;
    assert_eq!(answer.status, 202, "{answer:?}");
    assert_eq!(
        answer.body["eventType"], "user.updated",
        "the refused message's eventId was reserved: {answer:?}"
    );
    assert_eq!(answer.body["payload"], json!({ "v": 2 }));
    assert_eq!(messages(herald, app).await.len(), 2);

    // An endpoint refused for its URL does not reserve its uid; an app refused for its name neither.
    let answer = admin(
        herald,
        "POST",
        &format!("/app/{app}/endpoint"),
        Some(json!({ "url": "ftp://x", "uid": "later" })),
    )
    .await;
    assert_validation(&answer, "url", "endpoint with an ftp URL");
    let answer = admin(
        herald,
        "POST",
        &format!("/app/{app}/endpoint"),
        Some(json!({ "url": fx.receiver.url(), "uid": "later" })),
    )
    .await;
    assert_eq!(answer.status, 201, "{answer:?}");
    let answer = admin(
        herald,
        "POST",
        "/app",
        Some(json!({ "name": "  ", "uid": "later-app" })),
    )
    .await;
    assert_validation(&answer, "name", "app with a blank name");
    assert!(listing(herald, "/app").await.iter().all(|a| a["uid"] != "later-app"));
    let answer = admin(
        herald,
        "POST",
        "/app",
        Some(json!({ "name": "Later", "uid": "later-app" })),
    )
    .await;
    assert_eq!(answer.status, 201, "{answer:?}");

    // A failed PATCH leaves the endpoint exactly as it was (not half-updated).
    let ep_path = format!("/app/{app}/endpoint/{}", fx.endpoint);
    let before = herald.get(&ep_path).await;
    let secret = herald.get(&format!("{ep_path}/secret")).await;
    for body in [
        json!({ "description": "changed", "url": "http://10.0.0.1/" }),
        json!({ "description": "changed", "channels": ["bad channel"] }),
        json!({ "description": "changed", "secret": "whsec_AAAA" }),
        json!({ "description": "changed", "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "throttleRate": 0 }),
    ] {
        let answer = admin(herald, "PATCH", &ep_path, Some(body.clone())).await;
        assert_error(&answer, 422, "validation", &format!("PATCH {body}"));
        assert_eq!(
            herald.get(&ep_path).await,
            before,
            "a refused PATCH changed the endpoint"
        );
        assert_eq!(
            herald.get(&format!("{ep_path}/secret")).await,
            secret,
            "a refused PATCH changed the secret"
        );
    }

    // A message for an application deleted a moment ago is refused and appears nowhere.
    let delivered = fx.receiver.received().len();
    let (status, _) = herald.call("DELETE", &format!("/app/{app}"), None).await;
    assert_eq!(status, 204);
    for target in [app.as_str(), "shop"] {
        let answer = admin(herald, "POST", &msg_path(target), Some(valid_message())).await;
        assert_error(&answer, 404, "not_found", &format!("message for deleted app {target}"));
        let answer = admin(herald, "GET", &msg_path(target), None).await;
        assert_error(&answer, 404, "not_found", "listing of a deleted app");
    }
    let reborn = herald
        .post("/app", json!({ "name": "Shop again", "uid": "shop" }))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        messages(herald, &reborn).await.is_empty(),
        "messages leaked into the re-created app"
    );
    assert!(
        listing(herald, &format!("/app/{reborn}/endpoint")).await.is_empty(),
        "endpoints leaked into the re-created app"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        fx.receiver.received().len(),
        delivered,
        "a message for a deleted app was delivered"
    );
}

#[tokio::test]
async fn errors_are_always_json() {
    let fx = Fixture::start(&[]).await;
    let herald = &fx.herald;
    let admin_auth = bearer();
    let token = Some(admin_auth.as_str());
    // Over the default 1 MiB payload limit and over the body limit (payload + 64 KiB).
    let big = json!({ "eventType": "a", "payload": { "pad": "x".repeat(1024 * 1024 + 70 * 1024) } }).to_string();
    let dup = br#"{"name":"x","uid":"shop"}"#;
    // (method, path, body, authorization, expected status)
    type Sample<'a> = (&'a str, String, Option<&'a [u8]>, Option<&'a str>, u16);
    let samples: Vec<Sample<'_>> = vec![
        ("GET", api("/app"), None, None, 401),
        ("GET", api("/app"), None, Some("Basic dXNlcjpwYXNz"), 401),
        ("POST", api("/app"), Some(b"{oops"), token, 400),
        ("POST", api("/app"), Some(b"{}"), token, 422),
        ("POST", api("/app"), Some(dup), token, 409),
        ("GET", api("/app/nope"), None, token, 404),
        ("GET", "/api/v1/nope".into(), None, None, 404),
        ("GET", "/favicon.ico".into(), None, None, 404),
        ("DELETE", api("/app"), None, token, 405),
        ("GET", api("/app?limit=abc"), None, token, 422),
        ("POST", api(&msg_path(&fx.app)), Some(big.as_bytes()), token, 413),
    ];
    for (method, path, body, auth, status) in samples {
        let headers: Vec<(&str, &str)> = auth.map(|a| ("authorization", a)).into_iter().collect();
        let answer = send(herald, method, &path, body.map(<[u8]>::to_vec), &headers).await;
        assert!(answer.is_json(), "{method} {path}: not a JSON error: {answer:?}");
        assert_eq!(answer.status, status, "{method} {path}: {answer:?}");
        let detail_ok = if status == 422 {
            !common::validation_summary(&answer.body).is_empty()
        } else {
            answer.body["detail"].is_string()
        };
        assert!(
            answer.body["code"].is_string() && detail_ok,
            "{method} {path}: {answer:?}"
        );
    }
}

#[tokio::test]
async fn a_path_segment_that_is_not_utf8_gets_a_json_error() {
    let fx = Fixture::start(&[]).await;
    let herald = &fx.herald;
    let (app, ep) = (&fx.app, &fx.endpoint);
    for path in [
        "/app/%FF".to_owned(),
        format!("/app/{app}/endpoint/%C0%AF"),
        format!("/app/{app}/msg/%FE%FF"),
        format!("/app/%FF/attempt/endpoint/{ep}"),
        "/event-type/%80".to_owned(),
    ] {
        let answer = admin(herald, "GET", &path, None).await;
        // Such an id cannot exist: 404 not_found, or 400 bad_request for an unreadable path.
        let code = if answer.status == 400 {
            "bad_request"
        } else {
            "not_found"
        };
        let status = if answer.status == 400 { 400 } else { 404 };
        assert_error(&answer, status, code, &format!("GET {path}"));
    }
}

/// Payloads that standard JSON parsers refuse to read (serde_json: nesting over 128 levels, lone UTF-16
/// surrogates, numbers out of range; Python's `json`: nesting near 1000 levels). Herald keeps payloads
/// byte for byte, so each must be refused with a JSON error, or else every answer that echoes it (the
/// 202, the message, the app's whole message listing) must still parse.
#[tokio::test]
async fn a_payload_no_client_could_read_back_is_refused_or_reads_back() {
    let fx = Fixture::start(&[]).await;
    let herald = &fx.herald;
    // By uid: a poisoned app is replaced by a fresh one with the same uid between cases.
    let app = "shop";
    let depth = 1000;
    let payloads = [
        (
            "nested 1000 deep",
            format!(r#"{{"a":{}1{}}}"#, "[".repeat(depth), "]".repeat(depth)),
        ),
        ("a lone surrogate", r#"{"s":"\ud800"}"#.to_owned()),
        ("a number out of range", r#"{"n":1e999999}"#.to_owned()),
    ];
    let mut unreadable = Vec::new();
    for (what, payload) in &payloads {
        let body = format!(r#"{{"eventType":"odd.payload","payload":{payload}}}"#);
        let stored = messages(herald, app).await.len();
        let answer = admin_raw(herald, "POST", &msg_path(app), body.as_bytes()).await;
        assert_not_5xx(&answer, what);
        if answer.status != 202 {
            let code = if answer.status == 400 {
                "bad_request"
            } else {
                "validation"
            };
            assert_error(&answer, answer.status, code, what);
            assert_eq!(messages(herald, app).await.len(), stored, "{what}: refused but stored");
            continue;
        }
        // Accepted: the id is readable even when the body is not.
        let id = match &answer.body {
            Value::String(raw) => raw.split(r#""id":""#).nth(1).and_then(|rest| rest.split('"').next()),
            parsed => parsed["id"].as_str(),
        }
        .expect("id")
        .to_owned();
        let read = admin(herald, "GET", &format!("/app/{app}/msg/{id}"), None).await;
        let list = admin(herald, "GET", &msg_path(app), None).await;
        for (reply, answer) in [
            ("202 answer", &answer),
            ("GET message", &read),
            ("message listing", &list),
        ] {
            if !answer.is_json() {
                unreadable.push(format!("{what}: the {reply} does not parse: {answer:?}"));
            }
        }
        if !list.is_json() {
            // Leave the listing readable for the next case.
            let (status, _) = herald.call("DELETE", &format!("/app/{app}"), None).await;
            assert_eq!(status, 204);
            herald.post("/app", json!({ "name": "Shop", "uid": app })).await;
        }
    }
    assert!(
        unreadable.is_empty(),
        "accepted payloads that clients cannot read back:\n{}",
        unreadable.join("\n")
    );
}

/// Nesting far deeper than any recursive parser's stack (400 000 levels, inside the 1 MiB limit), in the
/// payload and in the envelope, must not bring the server down.
#[tokio::test]
async fn extreme_nesting_does_not_crash_the_server() {
    let fx = Fixture::start(&[]).await;
    let herald = &fx.herald;
    let depth = 400_000;
    let nested = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
    let bodies = [
        format!(r#"{{"eventType":"deep","payload":{{"a":{nested}}}}}"#),
        format!(r#"{{"eventType":"deep","payload":{{}},"extra":{nested}}}"#),
        format!(r#"{{"eventType":{nested},"payload":{{}}}}"#),
    ];
    for body in &bodies {
        let answer = admin_raw(herald, "POST", &msg_path(&fx.app), body.as_bytes()).await;
        assert_not_5xx(&answer, "deep body");
        assert_eq!(
            send(herald, "GET", &api("/health"), None, &[]).await.status,
            200,
            "the server died"
        );
    }
    let answer = admin(herald, "POST", &msg_path(&fx.app), Some(valid_message())).await;
    assert_eq!(answer.status, 202, "{answer:?}");
}

#[tokio::test]
async fn the_svix_python_sdk_raises_its_own_validation_error_naming_the_field() {
    let herald = Herald::start(&[]).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/compat/validation_errors.py");
    let base = format!("http://{}", herald.addr);
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(common::test_python())
            .arg(script)
            .env("HERALD_URL", base)
            .env("HERALD_TOKEN", TOKEN)
            .output()
            .expect("run python (scripts/test installs the svix SDK)")
    })
    .await
    .expect("join");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the SDK did not raise HTTPValidationError as expected:\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.lines().filter(|l| l.starts_with("ok: ")).count() >= 6,
        "{stdout}"
    );
}

#[tokio::test]
async fn lengths_are_capped_and_nul_is_refused_naming_the_field() {
    let fx = Fixture::start(&[]).await;
    let (app, ep) = (&fx.app, &fx.endpoint);
    let before = snapshot(&fx.herald, app).await;
    let long_url = format!("https://example.com/{}", "a".repeat(100_000));
    let many: serde_json::Map<String, Value> = (0..65).map(|i| (format!("k{i}"), json!("v"))).collect();
    let cases: Vec<(&str, String, Value, &str)> = vec![
        ("POST", "/app".into(), json!({ "name": "nul\u{0}name" }), "name"),
        ("POST", "/app".into(), json!({ "name": "x".repeat(257) }), "name"),
        (
            "POST",
            "/app".into(),
            json!({ "name": "x", "metadata": { "k": "v".repeat(100_000) } }),
            "metadata.k",
        ),
        (
            "POST",
            "/app".into(),
            json!({ "name": "x", "metadata": many }),
            "metadata",
        ),
        (
            "POST",
            "/app".into(),
            json!({ "name": "x", "metadata": { "k".repeat(257): "v" } }),
            "metadata",
        ),
        (
            "PATCH",
            format!("/app/{app}"),
            json!({ "metadata": { "k": "nul\u{0}" } }),
            "metadata.k",
        ),
        (
            "POST",
            format!("/app/{app}/endpoint"),
            json!({ "url": long_url }),
            "url",
        ),
        (
            "POST",
            format!("/app/{app}/endpoint"),
            json!({ "url": "https://example.com/", "description": "d".repeat(4097) }),
            "description",
        ),
        (
            "PATCH",
            format!("/app/{app}/endpoint/{ep}"),
            json!({ "description": "nul\u{0}" }),
            "description",
        ),
        (
            "POST",
            "/event-type".into(),
            json!({ "name": "nul.desc", "description": "a\u{0}b" }),
            "description",
        ),
        (
            "POST",
            msg_path(app),
            json!({ "eventType": "a.b", "payload": {}, "eventId": "e\u{0}" }),
            "eventId",
        ),
    ];
    for (method, path, body, field) in cases {
        let answer = admin(&fx.herald, method, &path, Some(body)).await;
        assert_validation(&answer, field, &format!("{method} {path}"));
    }
    assert_eq!(
        snapshot(&fx.herald, app).await,
        before,
        "a refused write stored something"
    );
    // At the caps, accepted.
    let at_caps = json!({ "name": "x".repeat(256), "metadata": { "k".repeat(256): "v".repeat(4096) } });
    let answer = admin(&fx.herald, "POST", "/app", Some(at_caps)).await;
    assert_eq!(answer.status, 201, "{answer:?}");
}
