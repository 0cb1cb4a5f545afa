//! The operators' dashboard in a real browser: Debian's Chromium, driven by playwright-core
//! (`tests/browser/dashboard.mjs`, pinned in `tests/browser/package-lock.json`), against a real
//! `herald serve` seeded with a healthy, a failing (breaker open), a dead, a paused and a 410-disabled
//! endpoint. The script opens every view and asserts on its content, clicks the operators' flows through
//! (log in with admin, application and read-only tokens; find a message by eventId; read why it failed;
//! resend; pause and resume; recover a window and watch it finish), fails on any console error or
//! uncaught exception, and writes a screenshot of every view to `target/browser-screenshots/`.
//!
//! It needs `node`, `/usr/bin/chromium` (`apt-get install chromium`) and `npm ci --prefix tests/browser`:
//! `scripts/test` and `.ci/run` provide them; without them this test fails and says what is missing.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Herald, Receiver, Reply, TOKEN};
use serde_json::{Value, json};

/// The repository's root.
fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The browser the script drives: `HERALD_TEST_CHROMIUM`, else Debian's.
fn chromium() -> PathBuf {
    std::env::var_os("HERALD_TEST_CHROMIUM").map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from)
}

/// What the script needs, or a clear message saying how to get it.
fn check_tools(scripts: &Path) {
    let node = std::process::Command::new("node").arg("--version").output();
    assert!(
        node.is_ok_and(|o| o.status.success()),
        "the browser test needs Node.js: `apt-get install nodejs npm`"
    );
    assert!(
        chromium().exists(),
        "the browser test needs Chromium at {} (`apt-get install chromium`, or set HERALD_TEST_CHROMIUM)",
        chromium().display()
    );
    assert!(
        scripts.join("node_modules/playwright-core/package.json").exists(),
        "the browser test needs playwright-core: run `npm ci --prefix tests/browser` (scripts/test does)"
    );
}

/// Poll `check` on a GET until it holds.
async fn wait_until(herald: &Herald, path: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let found = herald.get(path).await;
        if check(&found) {
            return found;
        }
        assert!(Instant::now() < deadline, "{what}: {found}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn message(herald: &Herald, app: &str, event_type: &str, event_id: &str) -> String {
    let body = json!({"eventType": event_type, "eventId": event_id, "payload": {"id": event_id, "amount": 1200}});
    herald.post(&format!("/app/{app}/msg"), body).await["id"]
        .as_str()
        .expect("message id")
        .to_owned()
}

#[tokio::test]
async fn the_dashboard_works_in_chromium() {
    let scripts = repository().join("tests/browser");
    check_tools(&scripts);
    let herald = Herald::start(&[
        ("HERALD_RETRY_SCHEDULE", "50ms,50ms"),
        ("HERALD_BREAKER_THRESHOLD", "3"),
        ("HERALD_BREAKER_COOLDOWN", "1s"),
        ("HERALD_BREAKER_MAX_COOLDOWN", "2s"),
    ])
    .await;
    let healthy = Receiver::start(Reply::status(200)).await;
    let failing = Receiver::start(Reply::status(503).body("upstream unavailable")).await;
    let dead = Receiver::start(Reply::status(500).body("database is down")).await;
    let gone = Receiver::start(Reply::status(410).body("this hook was removed")).await;
    let since = time::OffsetDateTime::now_utc() - time::Duration::minutes(1);

    let app = herald.post("/app", json!({"name": "Acme Corp", "uid": "acme"})).await["id"]
        .as_str()
        .expect("app id")
        .to_owned();
    herald.post("/app", json!({"name": "Globex", "uid": "globex"})).await;
    let mut endpoints = serde_json::Map::new();
    for (uid, url, disabled, types) in [
        (
            "billing-healthy",
            healthy.url(),
            false,
            json!(["invoice.paid", "order.created"]),
        ),
        ("crm-failing", failing.url(), false, json!(["order.created"])),
        ("warehouse-dead", dead.url(), false, json!(["invoice.paid"])),
        ("analytics-paused", healthy.url(), true, json!(["order.created"])),
        ("legacy-gone", gone.url(), false, json!(["invoice.paid"])),
    ] {
        let body = json!({"url": url, "uid": uid, "disabled": disabled, "filterTypes": types, "description": uid});
        let (id, _) = herald.endpoint(&app, body).await;
        endpoints.insert(uid.to_owned(), json!(id));
    }
    let invoice = message(&herald, &app, "invoice.paid", "evt-invoice-1001").await;
    let order = message(&herald, &app, "order.created", "evt-order-2001").await;
    for n in 2..=4 {
        message(&herald, &app, "order.created", &format!("evt-order-200{n}")).await;
    }
    // The states the dashboard must show: dead letters, an open breaker, a 410-disabled endpoint.
    let dead_id = endpoints["warehouse-dead"].as_str().expect("id").to_owned();
    wait_until(
        &herald,
        &format!("/app/{app}/delivery?deliveryStatus=dead&endpointId={dead_id}"),
        "dead letter",
        |v| v["data"].as_array().is_some_and(|d| d.len() == 1),
    )
    .await;
    let gone_id = endpoints["legacy-gone"].as_str().expect("id").to_owned();
    wait_until(
        &herald,
        &format!("/app/{app}/endpoint/{gone_id}"),
        "410 disables",
        |v| v["disabled"] == true,
    )
    .await;
    // The paused endpoint's delivery waits out its (short) window and dies without an attempt.
    let paused_id = endpoints["analytics-paused"].as_str().expect("id").to_owned();
    wait_until(
        &herald,
        &format!("/app/{app}/delivery?deliveryStatus=dead&endpointId={paused_id}"),
        "expiry",
        |v| v["data"].as_array().is_some_and(|d| d.len() == 4),
    )
    .await;
    let failing_id = endpoints["crm-failing"].as_str().expect("id").to_owned();
    wait_until(
        &herald,
        &format!("/app/{app}/endpoint/{failing_id}"),
        "breaker opens",
        |v| v["health"]["consecutiveFailures"].as_u64().is_some_and(|n| n >= 3),
    )
    .await;
    let app_token = herald.post(&format!("/auth/app-portal-access/{app}"), json!({})).await;
    let read_only = herald
        .post(&format!("/auth/app-portal-access/{app}"), json!({"readOnly": true}))
        .await;

    let shots = repository().join("target/browser-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    std::fs::create_dir_all(&shots).expect("screenshot directory");
    let seed = json!({
        "base": format!("http://{}", herald.addr),
        "adminToken": TOKEN,
        "app": {"id": app, "uid": "acme", "name": "Acme Corp"},
        "endpoints": endpoints,
        "healthyUrl": healthy.url(),
        "messages": {
            "invoice": {"id": invoice, "eventId": "evt-invoice-1001"},
            "order": {"id": order, "eventId": "evt-order-2001"},
        },
        "appToken": app_token["token"],
        "readOnlyUrl": read_only["url"],
        "since": since.format(&time::format_description::well_known::Rfc3339).expect("time"),
        "chromium": chromium(),
        "screenshots": shots,
    });
    let output = tokio::time::timeout(
        Duration::from_secs(240),
        tokio::process::Command::new("node")
            .arg(scripts.join("dashboard.mjs"))
            .current_dir(&scripts)
            .env("HERALD_BROWSER_SEED", seed.to_string())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the browser script finishes within 4 minutes")
    .expect("run node");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    if !output.status.success() {
        // What the server holds for the dead-letter endpoint, beside what the page showed.
        // `call`, not `get`: an error answer is reported beside the rest instead of replacing it (the
        // browser's own report is printed above either way).
        let attempts = herald
            .call("GET", &format!("/app/{app}/attempt/endpoint/{dead_id}?limit=50"), None)
            .await;
        let health = herald
            .call("GET", &format!("/app/{app}/endpoint/{dead_id}"), None)
            .await;
        panic!(
            "the dashboard failed in Chromium:\n{stdout}\n{stderr}\nthe server's attempts to warehouse-dead: \
             {attempts:?}\nthe endpoint: {health:?}"
        );
    }
    assert!(stdout.contains("all dashboard checks passed"), "{stdout}");
    // Every view left its picture.
    let pictures = std::fs::read_dir(&shots).expect("screenshots").count();
    assert!(pictures >= 10, "only {pictures} screenshots in {}", shots.display());
    // What the clicks did reached the server: the endpoint was resumed and got the resent message, the
    // recovered dead letter was delivered to the endpoint's new address.
    wait_until(&herald, &format!("/app/{app}/endpoint/{paused_id}"), "resumed", |v| {
        v["disabled"] == false
    })
    .await;
    wait_until(&herald, &format!("/app/{app}/msg/{order}/endpoint"), "resent", |v| {
        v["data"].as_array().is_some_and(|d| {
            d.iter()
                .any(|e| e["id"] == paused_id.as_str() && e["deliveryStatus"] == "delivered")
        })
    })
    .await;
    wait_until(
        &herald,
        &format!("/app/{app}/delivery?deliveryStatus=dead&endpointId={dead_id}"),
        "recovered",
        |v| v["data"].as_array().is_some_and(Vec::is_empty),
    )
    .await;
}
