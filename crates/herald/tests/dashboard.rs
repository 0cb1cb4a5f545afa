//! The operators' dashboard (`/dashboard/`) against the real binary:
//! * the page and every file of `crates/herald-api/src/dashboard/assets` are served, byte for byte, with
//!   their content type, cache validators and the security headers (strict CSP, nosniff, no framing), and
//!   without a token;
//! * `/dashboard` redirects to `/dashboard/`; an unknown asset is a JSON `404` like any other;
//! * every API route the scripts call (the table in `api.js`) is in the served OpenAPI document with that
//!   method, and no script builds API paths or markup anywhere else — so the dashboard cannot silently rot
//!   when the API changes;
//! * what the login relies on to tell an admin token from an application token holds.

use crate::common;

use std::collections::BTreeSet;
use std::path::PathBuf;

use common::{Herald, TOKEN};
use serde_json::{Value, json};

/// The dashboard's source files, as compiled into the binary.
fn asset_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../herald-api/src/dashboard/assets")
}

/// (file name, contents) of every asset.
fn assets() -> Vec<(String, Vec<u8>)> {
    let mut found: Vec<(String, Vec<u8>)> = std::fs::read_dir(asset_dir())
        .expect("assets directory")
        .map(|entry| {
            let path = entry.expect("entry").path();
            let name = path.file_name().expect("name").to_string_lossy().into_owned();
            (name, std::fs::read(&path).expect("asset"))
        })
        .collect();
    found.sort();
    assert!(found.len() >= 5, "suspiciously few assets: {found:?}");
    found
}

/// A client that shows redirects instead of following them.
fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
    }

    fn text(&self) -> String {
        String::from_utf8(self.body.clone()).expect("UTF-8 body")
    }
}

async fn fetch(herald: &Herald, path: &str, headers: &[(&str, &str)]) -> Answer {
    let mut request = client().get(format!("http://{}{path}", herald.addr));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.bytes().await.expect("body").to_vec();
    Answer { status, headers, body }
}

fn content_type_of(name: &str) -> &'static str {
    match name.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        other => panic!("{name}: no content type expected for {other:?}"),
    }
}

/// The headers every dashboard answer carries.
fn assert_secure(path: &str, answer: &Answer) {
    let csp = answer.header("content-security-policy");
    for directive in [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "frame-ancestors 'none'",
        "object-src 'none'",
        "base-uri 'none'",
    ] {
        assert!(csp.contains(directive), "{path}: CSP {csp:?} lacks {directive}");
    }
    assert!(!csp.contains("unsafe"), "{path}: CSP {csp:?} allows unsafe code");
    assert_eq!(answer.header("x-content-type-options"), "nosniff", "{path}");
    assert_eq!(answer.header("x-frame-options"), "DENY", "{path}");
    assert_eq!(answer.header("referrer-policy"), "no-referrer", "{path}");
    assert_eq!(answer.header("cache-control"), "no-cache", "{path}");
}

#[tokio::test]
async fn the_page_and_every_asset_are_served_with_their_type_and_security_headers() {
    let herald = Herald::start(&[]).await;
    let assets = assets();
    assert!(assets.iter().any(|(name, _)| name == "index.html"), "{assets:?}");
    for (name, contents) in &assets {
        let mut paths = vec![format!("/dashboard/{name}")];
        if name == "index.html" {
            paths.extend(["/dashboard/".to_owned(), "/dashboard/?from=bookmark".to_owned()]);
        }
        for path in paths {
            // No token: the assets hold no data.
            let answer = fetch(&herald, &path, &[]).await;
            assert_eq!(answer.status, 200, "{path}");
            assert_eq!(answer.header("content-type"), content_type_of(name), "{path}");
            assert_eq!(&answer.body, contents, "{path}: not the file in the repository");
            assert_secure(&path, &answer);
            // The validator lets a browser revalidate without downloading again.
            let etag = answer.header("etag").to_owned();
            assert!(etag.starts_with('"') && etag.len() > 10, "{path}: etag {etag:?}");
            let again = fetch(&herald, &path, &[("if-none-match", &etag)]).await;
            assert_eq!(again.status, 304, "{path}");
            assert!(again.body.is_empty(), "{path}");
            let stale = fetch(&herald, &path, &[("if-none-match", "\"other\"")]).await;
            assert_eq!(stale.status, 200, "{path}");
        }
    }
}

#[tokio::test]
async fn bare_dashboard_redirects_and_unknown_assets_are_json_404s() {
    let herald = Herald::start(&[]).await;
    for path in ["/dashboard", "/dashboard//"] {
        let answer = fetch(&herald, path, &[]).await;
        assert_eq!(answer.status, 308, "{path}");
        assert_eq!(answer.header("location"), "/dashboard/", "{path}");
    }
    for path in [
        "/dashboard/nope.js",
        "/dashboard/app.js.map",
        "/dashboard/assets/app.js",
        "/dashboard/..%2Fmod.rs",
    ] {
        let answer = fetch(&herald, path, &[]).await;
        assert_eq!(answer.status, 404, "{path}");
        assert!(answer.header("content-type").starts_with("application/json"), "{path}");
        let body: Value = serde_json::from_slice(&answer.body).expect("JSON error");
        assert_eq!(body["code"], "not_found", "{path}: {body}");
    }
    // Writing to the dashboard is not a thing.
    let (status, body) = herald
        .post_raw("/dashboard/app.js", b"x", &[("content-type", "text/plain")])
        .await;
    assert_eq!(status, 405, "{body}");
    assert_eq!(body["code"], "method_not_allowed");
    // The API around it is unchanged: still a token, still both spellings.
    let (status, _) = herald.call_with("GET", "/app", None, &[]).await;
    assert_eq!(status, 401);
    let (status, _) = herald.call("GET", "/app/", None).await;
    assert_eq!(status, 200);
}

/// The (method, path template) pairs of `api.js`'s table: every line of any script that mentions the API's
/// prefix must be a table entry `name: ['METHOD', '/api/v1/…'],`.
fn api_calls(scripts: &[(String, String)]) -> BTreeSet<(String, String)> {
    let mut calls = BTreeSet::new();
    for (name, text) in scripts {
        for line in text.lines().filter(|l| l.contains("/api/v1")) {
            let entry = line
                .trim()
                .split_once(": ['")
                .and_then(|(_, rest)| rest.strip_suffix("'],"))
                .and_then(|rest| rest.split_once("', '"));
            let Some((method, path)) = entry else {
                panic!("{name}: an API path outside the route table of api.js: {line:?}");
            };
            assert_eq!(name, "api.js", "{name}: API routes belong in api.js's table: {line:?}");
            calls.insert((method.to_lowercase(), path.to_owned()));
        }
    }
    calls
}

#[tokio::test]
async fn every_api_route_the_scripts_call_is_in_the_openapi_document() {
    let herald = Herald::start(&[]).await;
    let (status, doc) = herald.call_with("GET", "/openapi.json", None, &[]).await;
    assert_eq!(status, 200);
    let mut scripts = Vec::new();
    for (name, _) in assets().iter().filter(|(name, _)| name.ends_with(".js")) {
        // What the browser gets, not just what the repository holds.
        let answer = fetch(&herald, &format!("/dashboard/{name}"), &[]).await;
        assert_eq!(answer.status, 200, "{name}");
        scripts.push((name.clone(), answer.text()));
    }
    let calls = api_calls(&scripts);
    assert!(calls.len() >= 15, "the route table parsed to too little: {calls:?}");
    for (method, path) in &calls {
        let operation = &doc["paths"][path][method];
        assert!(
            operation.is_object(),
            "api.js calls {method} {path}, which the OpenAPI document does not have"
        );
    }
    // Data is rendered as text only (see dom.js): no markup parsing, no code from strings.
    for (name, text) in &scripts {
        for forbidden in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
        ] {
            assert!(!text.contains(forbidden), "{name} uses {forbidden}");
        }
    }
}

/// The relative references of the page and its scripts (`src="…"`, `href="…"`, `from './…'`) all resolve,
/// and the page has no inline script or style (the CSP would block it).
#[tokio::test]
async fn every_file_the_page_loads_is_served_and_nothing_is_inline() {
    let herald = Herald::start(&[]).await;
    let mut referenced = BTreeSet::new();
    for (name, contents) in assets() {
        let text = String::from_utf8(contents).expect("UTF-8 asset");
        for (open, close) in [("src=\"", '"'), ("href=\"", '"'), ("from './", '\'')] {
            for (at, _) in text.match_indices(open) {
                let rest = &text[at + open.len()..];
                let target = &rest[..rest.find(close).expect("closing quote")];
                if !target.starts_with('#') {
                    referenced.insert(target.trim_start_matches("./").to_owned());
                }
            }
        }
        if name == "index.html" {
            assert!(!text.contains("<style"), "inline style element");
            assert!(!text.contains(" style="), "inline style attribute");
            for (at, _) in text.match_indices(" on") {
                let rest = &text[at + 3..];
                let word = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_lowercase()).len();
                assert!(
                    !rest[word..].starts_with('='),
                    "inline event handler: {}",
                    &text[at..at + 20]
                );
            }
            for (at, _) in text.match_indices("<script") {
                let tag = &text[at..at + text[at..].find('>').expect("tag end")];
                assert!(tag.contains("src="), "inline script: {tag}");
            }
        }
    }
    assert!(
        referenced.contains("app.js") && referenced.contains("style.css"),
        "{referenced:?}"
    );
    for target in referenced {
        let answer = fetch(&herald, &format!("/dashboard/{target}"), &[]).await;
        assert_eq!(answer.status, 200, "{target} is referenced but not served");
    }
}

/// The login asks the server what a token is (`GET /auth/token`): the admin token, or an application token
/// with its application and whether it is read-only — and an application token reads its own application
/// and nothing else's.
#[tokio::test]
async fn the_login_can_tell_admin_and_application_tokens_apart() {
    let herald = Herald::start(&[]).await;
    let admin = herald.get("/auth/token").await;
    assert_eq!(admin, json!({"kind": "admin", "readOnly": false}));
    let own = herald.app("own").await;
    let other = herald.app("other").await;
    let access = herald.post(&format!("/auth/app-portal-access/{own}"), json!({})).await;
    let token = access["token"].as_str().expect("token");
    let bearer = format!("Bearer {token}");
    let auth = [("authorization", bearer.as_str())];
    let (status, info) = herald.call_with("GET", "/auth/token", None, &auth).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(
        (info["kind"].as_str(), info["appId"].as_str()),
        (Some("app"), Some(own.as_str()))
    );
    assert_eq!(info["readOnly"], false);
    assert!(info["expiresAt"].as_str().is_some_and(|t| t.ends_with('Z')), "{info}");
    let read_only = herald
        .post(&format!("/auth/app-portal-access/{own}"), json!({"readOnly": true}))
        .await;
    let read_only = format!("Bearer {}", read_only["token"].as_str().expect("token"));
    let (_, info) = herald
        .call_with("GET", "/auth/token", None, &[("authorization", read_only.as_str())])
        .await;
    assert_eq!(info["readOnly"], true, "{info}");
    assert_eq!(herald.call_with("GET", "/auth/token", None, &[]).await.0, 401);
    assert_eq!(herald.call_with("GET", "/app?limit=1", None, &auth).await.0, 403);
    assert_eq!(
        herald.call_with("GET", &format!("/app/{own}"), None, &auth).await.0,
        200
    );
    assert_eq!(
        herald.call_with("GET", &format!("/app/{other}"), None, &auth).await.0,
        403
    );
    assert_eq!(herald.call_with("GET", "/operational-event", None, &auth).await.0, 403);
    let bogus = format!("Bearer {TOKEN}-not");
    assert_eq!(
        herald
            .call_with("GET", "/app?limit=1", None, &[("authorization", bogus.as_str())])
            .await
            .0,
        401
    );
}

/// A portal link is absolute (the configured public URL, else this request's host), opens the dashboard and
/// carries the token in the fragment only; framing follows HERALD_DASHBOARD_FRAME_ANCESTORS.
#[tokio::test]
async fn portal_links_open_the_dashboard_and_framing_follows_the_setting() {
    let herald = Herald::start(&[]).await;
    let app = herald.app("portal").await;
    let access = herald.post(&format!("/auth/app-portal-access/{app}"), json!({})).await;
    let link = access["url"].as_str().expect("url");
    let token = access["token"].as_str().expect("token");
    assert_eq!(link, format!("http://{}/dashboard/#key={token}", herald.addr));

    let public = Herald::start(&[
        ("HERALD_PUBLIC_URL", "https://hooks.example.com/"),
        (
            "HERALD_DASHBOARD_FRAME_ANCESTORS",
            "https://portal.example.com, https://b.example.com:8443",
        ),
    ])
    .await;
    let app = public.app("portal").await;
    let access = public
        .post(&format!("/auth/app-portal-access/{app}"), json!({"readOnly": true}))
        .await;
    let link = access["url"].as_str().expect("url");
    assert!(
        link.starts_with("https://hooks.example.com/dashboard/#key=herald_app_"),
        "{link}"
    );
    assert!(!link.contains('?'), "no token in a query: {link}");
    let answer = fetch(&public, "/dashboard/", &[]).await;
    let csp = answer.header("content-security-policy");
    assert!(
        csp.contains("frame-ancestors https://portal.example.com https://b.example.com:8443"),
        "{csp}"
    );
    assert_eq!(
        answer.header("x-frame-options"),
        "",
        "X-Frame-Options would forbid every embedding"
    );
}

/// The charts' source: an endpoint's attempts per bucket by outcome with their latency (Svix's
/// `v1.stats.endpoint-attempts` shape), and the operational events newest first a page at a time.
#[tokio::test]
async fn attempt_statistics_and_newest_first_operational_events() {
    let herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", "50ms")]).await;
    let receiver = common::Receiver::start(common::Reply::status(200)).await;
    let app = herald.app("stats").await;
    herald
        .endpoint(&app, json!({"url": receiver.url(), "uid": "charted"}))
        .await;
    receiver.script([common::Reply::status(500)]);
    for n in 0..3 {
        herald
            .post(
                &format!("/app/{app}/msg"),
                json!({"eventType": "a.b", "payload": {"n": n}}),
            )
            .await;
    }
    receiver.wait_for(4, std::time::Duration::from_secs(15)).await;
    let path = format!("/stats/app/{app}/ep/charted/attempt");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let stats = loop {
        let stats = herald.get(&path).await;
        let sum = |key: &str| {
            stats["data"][key]
                .as_array()
                .map_or(0, |v| v.iter().filter_map(Value::as_u64).sum::<u64>())
        };
        if sum("successCount") == 3 && sum("failureCount") == 1 {
            break stats;
        }
        assert!(std::time::Instant::now() < deadline, "{stats}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(stats["period"], "FiveMinutes", "{stats}");
    let buckets = stats["data"]["successCount"].as_array().expect("series").len();
    assert!((72..=73).contains(&buckets), "six hours of 5-minute buckets: {buckets}");
    let last = buckets - 1;
    assert!(stats["data"]["maxDurationMs"][last].as_i64().is_some(), "{stats}");
    assert!(
        stats["data"]["averageDurationMs"][0].is_null(),
        "no attempt, no latency: {stats}"
    );
    let week = herald
        .get(&format!(
            "{path}?startDate=2026-01-01T00:00:00Z&endDate=2026-01-08T00:00:00Z"
        ))
        .await;
    assert_eq!(
        (
            week["period"].as_str(),
            week["data"]["successCount"].as_array().map(Vec::len)
        ),
        (Some("OneDay"), Some(7))
    );
    // Every pair of times is answered, with the window counted: a window longer than 31 days is its
    // last 31 days, a start after the end an empty window.
    let long = herald
        .get(&format!(
            "{path}?startDate=2026-01-01T00:00:00Z&endDate=2026-03-01T00:00:00Z"
        ))
        .await;
    assert_eq!(
        (
            long["startDate"].as_str(),
            long["endDate"].as_str(),
            long["period"].as_str()
        ),
        (
            Some("2026-01-29T00:00:00Z"),
            Some("2026-03-01T00:00:00Z"),
            Some("OneDay")
        ),
        "{long}"
    );
    let reversed = herald
        .get(&format!(
            "{path}?startDate=2026-03-01T00:00:00Z&endDate=2026-01-01T00:00:00Z"
        ))
        .await;
    assert_eq!(reversed["endDate"], "2026-01-01T00:00:00Z", "{reversed}");
    assert!(
        reversed["data"]["successCount"].as_array().is_none_or(Vec::is_empty),
        "{reversed}"
    );
    let (status, body) = herald
        .call(
            "GET",
            &format!("{path}?startDate=soon&endDate=2026-03-01T00:00:00Z"),
            None,
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(body.to_string().contains("startDate"), "{body}");
    assert_eq!(
        herald
            .call("GET", &format!("/stats/app/{app}/ep/nope/attempt"), None)
            .await
            .0,
        404
    );

    let all = herald.get("/operational-event?limit=250").await["data"]
        .as_array()
        .cloned()
        .expect("events");
    let newest = herald.get("/operational-event?order=descending&limit=1").await;
    assert_eq!(newest["data"][0]["id"], all.last().expect("an event")["id"], "{newest}");
    let iterator = newest["iterator"].as_str().expect("iterator");
    let older = herald
        .get(&format!(
            "/operational-event?order=descending&limit=250&iterator={iterator}"
        ))
        .await;
    let ids: Vec<&Value> = older["data"]
        .as_array()
        .expect("page")
        .iter()
        .map(|e| &e["id"])
        .collect();
    let expected: Vec<&Value> = all.iter().rev().skip(1).map(|e| &e["id"]).collect();
    assert_eq!(ids, expected);
    assert_eq!(
        herald.call("GET", "/operational-event?order=sideways", None).await.0,
        422
    );
}
