//! The OpenAPI document (`openapi.json`) against the real service.
//!
//! * It is OpenAPI 3.1 and every `$ref` in it resolves.
//! * The (method, path) pairs it lists are exactly those the router serves: each documented pair is
//!   routed (neither `404 no route` nor `405`), every other method on a documented path is `405`, the
//!   routes declared in `src/routes/*.rs` are all documented, and the token is required exactly where the
//!   document says so.
//! * What the handlers answer has the documented keys (camelCase, required ones present, none undocumented).
//! * `GET /api/v1/openapi.json` answers the document without a token.
//!
//! The REST API is what lives under `/api/v1`, declared in `src/routes`. The operators' dashboard
//! (`/dashboard/`, static files in `src/dashboard`) is served by the same router but is not part of it: it
//! is neither scanned nor documented, and the last test checks that it stays outside the prefix.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use herald_api::{AppState, Limits};
use herald_core::address::AddressPolicy;
use serde_json::{Value, json};
use tower::ServiceExt;

/// The document as compiled into the server.
const DOCUMENT: &str = include_str!("../openapi.json");
/// The admin token of the test service.
const TOKEN: &str = "t";
/// The methods a route can be declared with in `src/routes` (HEAD comes with GET in axum).
const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

fn document() -> Value {
    serde_json::from_str(DOCUMENT).expect("openapi.json is valid JSON")
}

/// A service over a fresh SQLite store; the directory must outlive the state.
async fn state() -> (tempfile::TempDir, AppState) {
    state_with(Limits::default()).await
}

/// [`state`] with other request limits.
async fn state_with(limits: Limits) -> (tempfile::TempDir, AppState) {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("herald.db").display());
    let store = herald_store::open_with(
        &url,
        herald_store::SecretCipher::from_key(&[1; 32]),
        &herald_store::StoreOptions::default(),
    )
    .await
    .expect("store");
    let state = AppState::new(
        store,
        None,
        Arc::new(AddressPolicy::default()),
        herald_api::auth::token_digest(TOKEN),
        limits,
    );
    (dir, state)
}

/// One answer of the service.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    content_type: String,
    body: Value,
}

async fn send(state: &AppState, method: &str, path: &str, body: Option<Value>, token: bool) -> Answer {
    let mut request = Request::builder()
        .method(Method::from_bytes(method.to_uppercase().as_bytes()).expect("method"))
        .uri(path);
    if token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {TOKEN}"));
    }
    let body = match body {
        Some(value) => {
            request = request.header(header::CONTENT_TYPE, "application/json");
            Body::from(value.to_string())
        }
        None => Body::empty(),
    };
    let response = herald_api::service(state.clone())
        .oneshot(request.body(body).expect("request"))
        .await
        .expect("infallible");
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.expect("body");
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

/// The (method, path template) pairs the document lists, e.g. `("get", "/api/v1/app/{app_id}")`.
fn documented(doc: &Value) -> BTreeSet<(String, String)> {
    let paths = doc["paths"].as_object().expect("paths");
    let mut pairs = BTreeSet::new();
    for (path, item) in paths {
        for key in item.as_object().expect("path item").keys() {
            if key != "parameters" {
                assert!(METHODS.contains(&key.as_str()), "{path}: unexpected method key {key}");
                pairs.insert((key.clone(), path.clone()));
            }
        }
    }
    pairs
}

/// A concrete path for a template: every `{param}` becomes a value no object has.
fn concrete(template: &str) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        let end = rest[start..].find('}').expect("closing brace") + start;
        out.push_str(&rest[..start]);
        out.push_str("no-such-object");
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// True when the router has no route for this method and path.
fn unrouted(answer: &Answer) -> bool {
    answer.status == StatusCode::METHOD_NOT_ALLOWED
        || (answer.status == StatusCode::NOT_FOUND
            && answer.body["detail"]
                .as_str()
                .is_some_and(|d| d.starts_with("no route")))
}

/// Whether an operation needs the bearer token (the document-wide `security` unless it overrides it).
fn secured(doc: &Value, method: &str, path: &str) -> bool {
    let security = doc["paths"][path][method].get("security").unwrap_or(&doc["security"]);
    !security.as_array().expect("security is an array").is_empty()
}

#[test]
fn the_document_is_openapi_3_1() {
    let doc = document();
    let version = doc["openapi"].as_str().expect("openapi version");
    assert!(version.starts_with("3.1."), "{version}");
    assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());
    assert_eq!(doc["components"]["securitySchemes"]["bearerAuth"]["type"], "http");
    assert_eq!(doc["components"]["securitySchemes"]["bearerAuth"]["scheme"], "bearer");
    assert_eq!(doc["security"], json!([{"bearerAuth": []}]));
    // Operation ids are unique, and every operation documents at least one success.
    let mut ids = BTreeSet::new();
    for (method, path) in documented(&doc) {
        let operation = &doc["paths"][&path][&method];
        let id = operation["operationId"].as_str().expect("operationId");
        assert!(ids.insert(id.to_owned()), "duplicate operationId {id}");
        let statuses: Vec<&String> = operation["responses"].as_object().expect("responses").keys().collect();
        assert!(
            statuses.iter().any(|s| s.starts_with('2')),
            "{method} {path}: no success status in {statuses:?}"
        );
        if secured(&doc, &method, &path) {
            assert!(statuses.iter().any(|s| *s == "401"), "{method} {path}: no 401");
            // Every secured operation decides who may call it (see `herald_api::auth`), and documents the
            // 403 an application token outside its scope gets.
            let access = operation["x-herald-access"].as_str();
            assert!(
                matches!(access, Some("admin" | "app" | "sink" | "shared")),
                "{method} {path}: x-herald-access is {access:?}"
            );
            assert!(statuses.iter().any(|s| *s == "403"), "{method} {path}: no 403");
        }
    }
}

/// Every `$ref` in `value`, with where it was found.
fn refs<'a>(value: &'a Value, at: &str, out: &mut Vec<(String, &'a str)>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                if key == "$ref" {
                    out.push((at.to_owned(), child.as_str().expect("$ref is a string")));
                } else {
                    refs(child, &format!("{at}/{key}"), out);
                }
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                refs(child, &format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// Follow local `$ref`s until a non-reference value.
fn resolve<'a>(doc: &'a Value, mut value: &'a Value) -> &'a Value {
    while let Some(target) = value.get("$ref").and_then(Value::as_str) {
        let pointer = target.strip_prefix('#').expect("a local $ref");
        value = doc
            .pointer(pointer)
            .unwrap_or_else(|| panic!("unresolved $ref {target}"));
    }
    value
}

#[test]
fn every_ref_resolves() {
    let doc = document();
    let mut found = Vec::new();
    refs(&doc, "", &mut found);
    assert!(found.len() > 50, "suspiciously few $refs: {}", found.len());
    for (at, target) in found {
        let pointer = target
            .strip_prefix('#')
            .unwrap_or_else(|| panic!("{at}: $ref {target} is not local"));
        assert!(doc.pointer(pointer).is_some(), "{at}: $ref {target} does not resolve");
    }
}

#[test]
fn path_parameters_match_the_templates() {
    let doc = document();
    for (method, path) in documented(&doc) {
        let mut declared = BTreeSet::new();
        let item = &doc["paths"][&path];
        for list in [&item["parameters"], &item[&method]["parameters"]] {
            for parameter in list.as_array().into_iter().flatten() {
                let parameter = resolve(&doc, parameter);
                if parameter["in"] == "path" {
                    assert_eq!(
                        parameter["required"], true,
                        "{method} {path}: path parameters are required"
                    );
                    declared.insert(parameter["name"].as_str().expect("name").to_owned());
                }
            }
        }
        let in_template: BTreeSet<String> = path
            .split('/')
            .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(str::to_owned)
            .collect();
        assert_eq!(declared, in_template, "{method} {path}");
    }
}

/// The `.route("…", get(…).post(…))` declarations in `src/routes/*.rs`, as (method, full path) pairs.
/// Only `src/routes` holds the REST API; the dashboard's routes (`src/dashboard`) are deliberately not read.
fn declared_in_source() -> BTreeSet<(String, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/routes");
    let mut pairs = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).expect("src/routes") {
        let file = entry.expect("entry").path();
        if file.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("source");
        let mut rest = text.as_str();
        while let Some(at) = rest.find(".route(") {
            rest = &rest[at + ".route(".len()..];
            // The arguments run to the matching parenthesis.
            let mut depth = 1;
            let end = rest
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    depth == 0
                })
                .map(|(i, _)| i)
                .expect("balanced parentheses");
            let arguments = &rest[..end];
            let open = arguments.find('"').expect("a path literal");
            let close = arguments[open + 1..].find('"').expect("closing quote") + open + 1;
            let path = format!("/api/v1{}", &arguments[open + 1..close]);
            let handlers = &arguments[close + 1..];
            for method in METHODS {
                let call = format!("{method}(");
                let routed = handlers
                    .match_indices(&call)
                    .any(|(i, _)| i == 0 || !handlers[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_'));
                if routed {
                    pairs.insert((method.to_owned(), path.clone()));
                }
            }
        }
    }
    pairs
}

#[test]
fn the_routes_declared_in_source_are_the_documented_ones() {
    let doc = document();
    let source = declared_in_source();
    assert!(source.len() > 20, "the route scan found too little: {source:?}");
    let documented = documented(&doc);
    let undocumented: Vec<_> = source.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&source).collect();
    assert!(
        undocumented.is_empty(),
        "routes missing from openapi.json: {undocumented:?}"
    );
    assert!(
        unknown.is_empty(),
        "documented routes not declared in src/routes: {unknown:?}"
    );
}

#[tokio::test]
async fn the_documented_routes_are_the_served_ones() {
    let doc = document();
    let (_dir, state) = state().await;
    let pairs = documented(&doc);
    assert!(pairs.len() > 20, "{pairs:?}");
    for (method, template) in &pairs {
        let path = concrete(template);
        let body = matches!(method.as_str(), "post" | "put" | "patch").then(|| json!({}));
        let answer = send(&state, method, &path, body.clone(), true).await;
        assert!(
            !unrouted(&answer),
            "{method} {path} is documented but not served: {answer:?}"
        );
        assert!(
            answer.content_type.starts_with("application/json") || answer.status == StatusCode::NO_CONTENT,
            "{method} {path}: {answer:?}"
        );
        // The token is required exactly where the document says so.
        let anonymous = send(&state, method, &path, body, false).await;
        if secured(&doc, method, template) {
            assert_eq!(
                anonymous.status,
                StatusCode::UNAUTHORIZED,
                "{method} {path}: {anonymous:?}"
            );
            assert_eq!(anonymous.body["code"], "authentication_failed");
        } else {
            assert_ne!(
                anonymous.status,
                StatusCode::UNAUTHORIZED,
                "{method} {path}: {anonymous:?}"
            );
        }
    }
    // Any other method on a documented path is not served.
    let paths: BTreeSet<&String> = pairs.iter().map(|(_, path)| path).collect();
    for template in paths {
        for method in METHODS {
            if pairs.contains(&(method.to_owned(), template.clone())) {
                continue;
            }
            let path = concrete(template);
            let answer = send(&state, method, &path, Some(json!({})), true).await;
            assert_eq!(
                answer.status,
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {path} is served but not documented: {answer:?}"
            );
            assert_eq!(answer.body["code"], "method_not_allowed");
        }
    }
}

#[tokio::test]
async fn the_document_is_served_without_a_token() {
    let (_dir, state) = state().await;
    for path in ["/api/v1/openapi.json", "/api/v1/openapi.json/"] {
        let answer = send(&state, "get", path, None, false).await;
        assert_eq!(answer.status, StatusCode::OK, "{path}: {answer:?}");
        assert!(answer.content_type.starts_with("application/json"), "{answer:?}");
        assert_eq!(answer.body, document());
    }
}

#[tokio::test]
async fn the_served_document_states_the_attempt_timeout_bound_the_server_was_given() {
    let limits = Limits::default().with_max_request_timeout(std::time::Duration::from_secs(90));
    let (_dir, state) = state_with(limits).await;
    let served = send(&state, "get", "/api/v1/openapi.json", None, false).await.body;
    for schema in ["EndpointIn", "EndpointUpdate", "EndpointPatch"] {
        let property = &served["components"]["schemas"][schema]["properties"]["requestTimeoutMs"];
        assert_eq!(property["maximum"], 90_000, "{schema}: {property}");
    }
    // What the served document allows, the server accepts, and one past it is refused.
    let app = send(&state, "post", "/api/v1/app", Some(json!({"name": "bound"})), true).await;
    assert_eq!(app.status, StatusCode::CREATED, "{app:?}");
    let endpoints = format!("/api/v1/app/{}/endpoint", app.body["id"].as_str().expect("app id"));
    let at_bound = json!({"url": "https://example.com/hook", "requestTimeoutMs": 90_000});
    let created = send(&state, "post", &endpoints, Some(at_bound), true).await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    assert_eq!(created.body["requestTimeoutMs"], 90_000);
    let past = json!({"url": "https://example.com/hook", "requestTimeoutMs": 90_001});
    let refused = send(&state, "post", &endpoints, Some(past), true).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{refused:?}");
    assert_eq!(refused.body["detail"][0]["loc"], json!(["body", "requestTimeoutMs"]));
}

/// Check a response body against the schema documented for (method, path, status): every required key is
/// present and every key is documented, recursively through objects, arrays and `$ref`s.
fn conforms(doc: &Value, method: &str, path: &str, status: u16, body: &Value) {
    let response = resolve(doc, &doc["paths"][path][method]["responses"][status.to_string()]);
    assert!(
        response.is_object(),
        "{method} {path}: status {status} is not documented"
    );
    let schema = &response["content"]["application/json"]["schema"];
    check(doc, schema, body, &format!("{method} {path} {status}"));
}

fn check(doc: &Value, schema: &Value, value: &Value, at: &str) {
    let schema = resolve(doc, schema);
    match value {
        Value::Object(map) => {
            let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
                return; // A free-form object (payload, schemas, metadata values).
            };
            for required in schema["required"].as_array().into_iter().flatten() {
                let key = required.as_str().expect("required key");
                assert!(map.contains_key(key), "{at}: required key {key} missing in {value}");
            }
            for (key, child) in map {
                let property = properties
                    .get(key)
                    .unwrap_or_else(|| panic!("{at}: key {key} is not documented"));
                check(doc, property, child, &format!("{at}.{key}"));
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check(doc, item_schema, item, &format!("{at}[{i}]"));
                }
            }
        }
        _ => {}
    }
}

#[tokio::test]
async fn answers_have_the_documented_shapes() {
    let doc = document();
    let (_dir, state) = state().await;
    let api = |p: &str| format!("/api/v1{p}");

    let app = send(
        &state,
        "post",
        &api("/app"),
        Some(json!({"name": "Acme", "uid": "acme", "throttleRate": 5, "metadata": {"k": "v"}})),
        true,
    )
    .await;
    assert_eq!(app.status, StatusCode::CREATED, "{app:?}");
    conforms(&doc, "post", "/api/v1/app", 201, &app.body);
    assert_eq!(app.body["rateLimit"], 5);
    let again = send(
        &state,
        "post",
        &api("/app?get_if_exists=true"),
        Some(json!({"name": "A", "uid": "acme"})),
        true,
    )
    .await;
    conforms(&doc, "post", "/api/v1/app", 200, &again.body);
    let list = send(&state, "get", &api("/app"), None, true).await;
    conforms(&doc, "get", "/api/v1/app", 200, &list.body);

    let et = send(
        &state,
        "post",
        &api("/event-type"),
        Some(json!({"name": "invoice.paid", "description": "d", "schemas": {"1": {}}, "featureFlag": "f"})),
        true,
    )
    .await;
    assert_eq!(et.status, StatusCode::CREATED, "{et:?}");
    conforms(&doc, "post", "/api/v1/event-type", 201, &et.body);
    let list = send(&state, "get", &api("/event-type"), None, true).await;
    conforms(&doc, "get", "/api/v1/event-type", 200, &list.body);

    let ep = send(
        &state,
        "post",
        &api("/app/acme/endpoint"),
        Some(
            json!({"url": "https://example.com/hook", "uid": "hook", "eventTypes": ["invoice.paid"],
                    "channels": ["c"], "rateLimit": 3}),
        ),
        true,
    )
    .await;
    assert_eq!(ep.status, StatusCode::CREATED, "{ep:?}");
    conforms(&doc, "post", "/api/v1/app/{app_id}/endpoint", 201, &ep.body);
    assert_eq!(ep.body["filterTypes"], ep.body["eventTypes"]);
    assert_eq!(ep.body["throttleRate"], ep.body["rateLimit"]);
    let secret = send(&state, "get", &api("/app/acme/endpoint/hook/secret"), None, true).await;
    conforms(
        &doc,
        "get",
        "/api/v1/app/{app_id}/endpoint/{endpoint_id}/secret",
        200,
        &secret.body,
    );
    let list = send(&state, "get", &api("/app/acme/endpoint"), None, true).await;
    conforms(&doc, "get", "/api/v1/app/{app_id}/endpoint", 200, &list.body);
    let ed = send(
        &state,
        "post",
        &api("/app/acme/endpoint"),
        Some(
            json!({"url": "https://example.com/ed", "uid": "ed", "signatureType": "ed25519", "filterTypes": ["other"],
                    "headers": {"X-Tenant": "acme", "Authorization": "Bearer x"}}),
        ),
        true,
    )
    .await;
    assert_eq!(ed.status, StatusCode::CREATED, "{ed:?}");
    conforms(&doc, "post", "/api/v1/app/{app_id}/endpoint", 201, &ed.body);
    let ed_secret = send(&state, "get", &api("/app/acme/endpoint/ed/secret"), None, true).await;
    assert!(ed_secret.body["publicKey"].is_string(), "{ed_secret:?}");
    conforms(
        &doc,
        "get",
        "/api/v1/app/{app_id}/endpoint/{endpoint_id}/secret",
        200,
        &ed_secret.body,
    );
    let headers = send(&state, "get", &api("/app/acme/endpoint/ed/headers"), None, true).await;
    assert_eq!(headers.body["sensitive"], json!(["Authorization"]), "{headers:?}");
    conforms(
        &doc,
        "get",
        "/api/v1/app/{app_id}/endpoint/{endpoint_id}/headers",
        200,
        &headers.body,
    );
    let rotated = send(
        &state,
        "post",
        &api("/app/acme/endpoint/ed/secret/rotate"),
        Some(json!({"gracePeriodSeconds": 0})),
        true,
    )
    .await;
    assert_eq!(rotated.status, StatusCode::OK, "{rotated:?}");
    let refused = send(
        &state,
        "put",
        &api("/app/acme/endpoint/ed/headers"),
        Some(json!({"headers": {"webhook-id": "x"}})),
        true,
    )
    .await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    conforms(
        &doc,
        "put",
        "/api/v1/app/{app_id}/endpoint/{endpoint_id}/headers",
        422,
        &refused.body,
    );

    let msg = send(
        &state,
        "post",
        &api("/app/acme/msg"),
        Some(json!({"eventType": "invoice.paid", "eventId": "evt_1", "channels": ["c"], "payload": {"a": 1}})),
        true,
    )
    .await;
    assert_eq!(msg.status, StatusCode::ACCEPTED, "{msg:?}");
    conforms(&doc, "post", "/api/v1/app/{app_id}/msg", 202, &msg.body);
    let list = send(&state, "get", &api("/app/acme/msg"), None, true).await;
    assert_eq!(list.body["data"].as_array().map(Vec::len), Some(1), "{list:?}");
    conforms(&doc, "get", "/api/v1/app/{app_id}/msg", 200, &list.body);
    let read = send(&state, "get", &api("/app/acme/msg/evt_1"), None, true).await;
    conforms(&doc, "get", "/api/v1/app/{app_id}/msg/{msg_id}", 200, &read.body);
    let deliveries = send(&state, "get", &api("/app/acme/msg/evt_1/endpoint"), None, true).await;
    assert_eq!(
        deliveries.body["data"].as_array().map(Vec::len),
        Some(1),
        "{deliveries:?}"
    );
    conforms(
        &doc,
        "get",
        "/api/v1/app/{app_id}/msg/{msg_id}/endpoint",
        200,
        &deliveries.body,
    );
    let attempts = send(&state, "get", &api("/app/acme/attempt/endpoint/hook"), None, true).await;
    conforms(
        &doc,
        "get",
        "/api/v1/app/{app_id}/attempt/endpoint/{endpoint_id}",
        200,
        &attempts.body,
    );

    let missing = send(&state, "get", &api("/app/nobody"), None, true).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    conforms(&doc, "get", "/api/v1/app/{app_id}", 404, &missing.body);
    let invalid = send(&state, "post", &api("/app"), Some(json!({"name": ""})), true).await;
    assert_eq!(invalid.status, StatusCode::UNPROCESSABLE_ENTITY);
    conforms(&doc, "post", "/api/v1/app", 422, &invalid.body);

    let health = send(&state, "get", &api("/health"), None, false).await;
    conforms(&doc, "get", "/api/v1/health", 200, &health.body);
}

#[tokio::test]
async fn the_dashboard_is_served_beside_the_api_but_not_part_of_it() {
    let doc = document();
    for (_, path) in documented(&doc) {
        assert!(path.starts_with("/api/v1/"), "{path} is outside the API prefix");
    }
    let (_dir, state) = state().await;
    // Served without a token, outside `/api/v1`…
    for path in ["/dashboard/", "/dashboard/app.js"] {
        let answer = send(&state, "get", path, None, false).await;
        assert_eq!(answer.status, StatusCode::OK, "{path}: {answer:?}");
    }
    let redirect = send(&state, "get", "/dashboard", None, false).await;
    assert_eq!(redirect.status, StatusCode::PERMANENT_REDIRECT, "{redirect:?}");
    // …and not reachable under it.
    let answer = send(&state, "get", "/api/v1/dashboard/app.js", None, true).await;
    assert!(unrouted(&answer), "{answer:?}");
}

#[tokio::test]
async fn polling_answers_have_the_documented_shapes() {
    let doc = document();
    let (_dir, state) = state().await;
    let api = |p: &str| format!("/api/v1{p}");
    let app = send(
        &state,
        "post",
        &api("/app"),
        Some(json!({"name": "Shop", "uid": "shop"})),
        true,
    )
    .await;
    assert_eq!(app.status, StatusCode::CREATED, "{app:?}");
    let msg = send(
        &state,
        "post",
        &api("/app/shop/msg"),
        Some(json!({"eventType": "a.b", "payload": {"k": 1}, "channels": ["eu"], "eventId": "e1"})),
        true,
    )
    .await;
    assert_eq!(msg.status, StatusCode::ACCEPTED, "{msg:?}");

    let sink = send(
        &state,
        "post",
        &api("/app/shop/polling-endpoint"),
        Some(json!({"uid": "laptop", "eventTypes": ["a.b"], "channels": ["eu"], "metadata": {"k": "v"}})),
        true,
    )
    .await;
    assert_eq!(sink.status, StatusCode::CREATED, "{sink:?}");
    conforms(&doc, "post", "/api/v1/app/{app_id}/polling-endpoint", 201, &sink.body);
    let sink_path = "/api/v1/app/{app_id}/polling-endpoint/{sink_id}";
    for (method, body, path) in [
        ("get", None, sink_path),
        ("patch", Some(json!({"description": "d"})), sink_path),
        ("get", None, "/api/v1/app/{app_id}/polling-endpoint/{sink_id}/secret"),
    ] {
        let concrete = path.replace("{app_id}", "shop").replace("{sink_id}", "laptop");
        let answer = send(&state, method, &concrete, body, true).await;
        assert_eq!(answer.status, StatusCode::OK, "{method} {path}: {answer:?}");
        conforms(&doc, method, path, 200, &answer.body);
    }
    let list = send(&state, "get", &api("/app/shop/polling-endpoint"), None, true).await;
    conforms(&doc, "get", "/api/v1/app/{app_id}/polling-endpoint", 200, &list.body);

    let poll = send(&state, "get", &api("/app/shop/poller/laptop"), None, true).await;
    assert_eq!(poll.body["data"].as_array().map(Vec::len), Some(1), "{poll:?}");
    conforms(&doc, "get", "/api/v1/app/{app_id}/poller/{sink_id}", 200, &poll.body);
    let consumer = send(&state, "get", &api("/app/shop/poller/laptop/consumer/c"), None, true).await;
    conforms(
        &doc,
        "get",
        "/api/v1/app/{app_id}/poller/{sink_id}/consumer/{consumer_id}",
        200,
        &consumer.body,
    );
    let seek = send(
        &state,
        "post",
        &api("/app/shop/poller/laptop/consumer/c/seek"),
        Some(json!({"after": "1970-01-01T00:00:00Z"})),
        true,
    )
    .await;
    conforms(
        &doc,
        "post",
        "/api/v1/app/{app_id}/poller/{sink_id}/consumer/{consumer_id}/seek",
        200,
        &seek.body,
    );
    let v2 = send(
        &state,
        "get",
        &api("/app/shop/polling-endpoint/laptop/consumer/c"),
        None,
        true,
    )
    .await;
    assert!(v2.body["data"][0]["offset"].as_i64().is_some(), "{v2:?}");
    conforms(
        &doc,
        "get",
        "/api/v1/app/{app_id}/polling-endpoint/{sink_id}/consumer/{consumer_id}",
        200,
        &v2.body,
    );
    let commit = send(
        &state,
        "post",
        &api("/app/shop/polling-endpoint/laptop/consumer/c/commit"),
        Some(json!({"offset": v2.body["data"][0]["offset"]})),
        true,
    )
    .await;
    assert_eq!(commit.status, StatusCode::NO_CONTENT, "{commit:?}");
}
