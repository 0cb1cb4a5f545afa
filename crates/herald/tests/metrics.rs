//! Metrics, alerts and traces as an operator meets them: Debian's real Prometheus scrapes a running
//! `herald serve` (its own process, config and data directory on a free loopback port, never the system
//! service) and evaluates the shipped alert rules; `promtool` checks and unit-tests those rules; a scrape
//! of 20,000 endpoints stays small; the inbox's series move under forged, stale, duplicate and valid
//! posts; and spans arrive at an OTLP/HTTP receiver, decoded with the protocol's published protobuf
//! definitions, with the same message id as the JSON log lines.

use crate::common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Herald, Receiver, Reply, TOKEN};
use serde_json::{Value, json};

/// The shipped rules and their unit tests.
const ALERTS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/alerts");

fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder().no_proxy().build().expect("client")
}

/// A loopback port nothing listens on (bound, then released).
fn free_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr")
}

/// `GET /metrics` with an optional bearer token: (status, body).
pub(crate) async fn scrape(addr: SocketAddr, token: Option<&str>) -> (u16, String) {
    let mut request = http().get(format!("http://{addr}/metrics"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("scrape");
    let status = response.status().as_u16();
    (status, response.text().await.expect("text"))
}

/// The value of the sample `name{labels…}` whose labels include every `(key, value)` given.
pub(crate) fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find(|line| {
            let (series, _) = line.rsplit_once(' ').unwrap_or((line, ""));
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            metric == name && labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|line| line.rsplit_once(' '))
        .and_then(|(_, value)| value.parse().ok())
}

/// A Prometheus server of the test's own.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Start Debian's `prometheus` scraping `target` every second (with the admin token, as
    /// `authorization: Bearer`) and evaluating `rules` every second.
    async fn start(target: SocketAddr, rules: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("herald.rules.yml"), rules).expect("rules");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - herald.rules.yml\n\
             scrape_configs:\n  - job_name: herald\n    authorization:\n      credentials: {TOKEN}\n    \
             static_configs:\n      - targets: ['{target}']\n"
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).expect("config");
        let addr = free_addr();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("prometheus (Debian's package; .ci/run installs it)");
        let prometheus = Self { child, addr, _dir: dir };
        let ready = format!("http://{addr}/-/ready");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(response) = http().get(&ready).send().await
                && response.status().is_success()
            {
                break;
            }
            assert!(Instant::now() < deadline, "prometheus did not become ready");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        prometheus
    }

    /// An instant query through the HTTP API: the result vector.
    async fn query(&self, query: &str) -> Vec<Value> {
        let url = url::Url::parse_with_params(&format!("http://{}/api/v1/query", self.addr), [("query", query)])
            .expect("query URL");
        let response: Value = http().get(url).send().await.expect("query").json().await.expect("JSON");
        assert_eq!(response["status"], "success", "{query}: {response}");
        response["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// Query until `done` says yes about the result, or fail after `within`.
    async fn wait_for(&self, query: &str, within: Duration, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + within;
        loop {
            let result = self.query(query).await;
            if done(&result) {
                return result;
            }
            assert!(Instant::now() < deadline, "{query}: still {result:?}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of one result of an instant query.
fn value(result: &Value) -> f64 {
    result["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// The shipped rules with test-sized thresholds and holds: the same expressions, a backlog threshold of
/// 3 s instead of 15 min and every `for:` 2 s.
fn test_rules() -> String {
    let shipped = std::fs::read_to_string(Path::new(ALERTS_DIR).join("herald.rules.yml")).expect("shipped rules");
    let threshold = "herald_endpoint_oldest_pending_age_seconds > 900";
    assert_eq!(
        shipped.matches(threshold).count(),
        1,
        "the backlog rule's expression changed"
    );
    let mut rules = shipped.replace(threshold, "herald_endpoint_oldest_pending_age_seconds > 3");
    for hold in ["for: 1m", "for: 2m", "for: 5m", "for: 15m"] {
        rules = rules.replace(hold, "for: 2s");
    }
    assert!(!rules.contains("for: ") || rules.matches("for: 2s").count() == rules.matches("for: ").count());
    rules
}

#[test]
fn promtool_checks_the_shipped_rules_and_runs_their_unit_tests() {
    let check = Command::new("promtool")
        .args(["check", "rules", "herald.rules.yml"])
        .current_dir(ALERTS_DIR)
        .output()
        .expect("promtool (Debian's prometheus package)");
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stdout));
    let test = Command::new("promtool")
        .args(["test", "rules", "herald.rules.test.yml"])
        .current_dir(ALERTS_DIR)
        .output()
        .expect("promtool");
    assert!(
        test.status.success(),
        "{}{}",
        String::from_utf8_lossy(&test.stdout),
        String::from_utf8_lossy(&test.stderr)
    );
    // Every rule has a unit test.
    let rules = std::fs::read_to_string(Path::new(ALERTS_DIR).join("herald.rules.yml")).expect("rules");
    let tests = std::fs::read_to_string(Path::new(ALERTS_DIR).join("herald.rules.test.yml")).expect("tests");
    for line in rules.lines().filter_map(|l| l.trim().strip_prefix("- alert: ")) {
        assert!(tests.contains(&format!("alertname: {line}")), "no unit test for {line}");
    }
}

#[tokio::test]
async fn metrics_need_the_admin_token_on_the_api_port_and_none_on_their_own_listener() {
    let metrics_addr = free_addr();
    let listen = metrics_addr.to_string();
    let herald = Herald::start(&[("HERALD_METRICS_LISTEN", &listen)]).await;
    assert_eq!(scrape(herald.addr, None).await.0, 401);
    assert_eq!(scrape(herald.addr, Some("wrong")).await.0, 401);
    let app = herald.app("tenant").await;
    let portal = herald.post(&format!("/auth/app-portal-access/{app}"), json!({})).await;
    let tenant = portal["token"].as_str().expect("token");
    assert_eq!(
        scrape(herald.addr, Some(tenant)).await.0,
        403,
        "an application token reads no metrics"
    );
    let (status, text) = scrape(herald.addr, Some(TOKEN)).await;
    assert_eq!(status, 200);
    assert!(text.contains("# TYPE herald_scheduler_endpoints gauge"), "{text}");
    assert!(text.contains("herald_http_requests_total{"), "{text}");
    let (status, own) = scrape(metrics_addr, None).await;
    assert_eq!(status, 200);
    assert!(own.contains("herald_scheduler_endpoints"), "{own}");
}

#[tokio::test]
async fn prometheus_sees_a_black_holed_endpoint_fall_behind_alerts_and_resolves_when_it_returns() {
    let herald = Herald::start(&[
        // Retries every second for 50 s: the black-holed deliveries stay pending throughout.
        ("HERALD_RETRY_SCHEDULE", &["1s"; 50].join(",")),
        ("HERALD_BREAKER_COOLDOWN", "500ms"),
        ("HERALD_BREAKER_MAX_COOLDOWN", "1s"),
    ])
    .await;
    let healthy = Receiver::start(Reply::status(200)).await;
    let hole = free_addr();
    let app = herald.post("/app", json!({"name": "Shop", "uid": "shop"})).await;
    let app = app["id"].as_str().expect("id").to_owned();
    herald
        .endpoint(&app, json!({"url": healthy.url(), "uid": "healthy"}))
        .await;
    herald
        .endpoint(&app, json!({"url": format!("http://{hole}/hook"), "uid": "dead"}))
        .await;
    for i in 0..3 {
        herald
            .post(
                &format!("/app/{app}/msg"),
                json!({"eventType": "order.paid", "payload": {"n": i}}),
            )
            .await;
    }
    let prometheus = Prometheus::start(herald.addr, &test_rules()).await;
    let dead_age = r#"herald_endpoint_oldest_pending_age_seconds{app="shop",endpoint="dead"}"#;
    prometheus
        .wait_for(dead_age, Duration::from_secs(60), |r| {
            r.first().is_some_and(|s| value(s) > 3.0)
        })
        .await;
    let firing = r#"ALERTS{alertname="HeraldEndpointBacklogOld",alertstate="firing"}"#;
    let alerts = prometheus
        .wait_for(firing, Duration::from_secs(60), |r| !r.is_empty())
        .await;
    assert_eq!(alerts.len(), 1, "only the black-holed endpoint alerts: {alerts:?}");
    assert_eq!(alerts[0]["metric"]["endpoint"], "dead");
    assert_eq!(alerts[0]["metric"]["app"], "shop");
    assert_eq!(alerts[0]["metric"]["severity"], "page");
    // The healthy endpoint's backlog series stay at zero.
    for query in [
        r#"herald_endpoint_oldest_pending_age_seconds{endpoint="healthy"}"#,
        r#"herald_endpoint_pending{endpoint="healthy"}"#,
        r#"max_over_time(herald_endpoint_pending{endpoint="healthy"}[1m])"#,
    ] {
        let result = prometheus.query(query).await;
        assert!(result.iter().all(|s| value(s) == 0.0), "{query}: {result:?}");
    }
    let pending = prometheus.query(r#"herald_endpoint_pending{endpoint="dead"}"#).await;
    assert_eq!(pending.first().map(value), Some(3.0), "{pending:?}");
    let failed = prometheus
        .query(r#"herald_endpoint_attempts_total{endpoint="dead",outcome="connect_error"}"#)
        .await;
    assert!(failed.first().is_some_and(|s| value(s) >= 1.0), "{failed:?}");

    // The endpoint comes back: its backlog drains and the alert resolves.
    let _back = Receiver::bind(hole, Reply::status(200)).await;
    prometheus
        .wait_for(dead_age, Duration::from_secs(60), |r| {
            r.first().is_some_and(|s| value(s) == 0.0)
        })
        .await;
    prometheus
        .wait_for(
            r#"ALERTS{alertname="HeraldEndpointBacklogOld"}"#,
            Duration::from_secs(30),
            |r| r.is_empty(),
        )
        .await;
    let delivered = prometheus
        .query(r#"herald_endpoint_delivery_lag_seconds_count{endpoint="dead"}"#)
        .await;
    assert_eq!(delivered.first().map(value), Some(3.0), "{delivered:?}");
}

#[tokio::test]
async fn a_scrape_of_20000_endpoints_stays_small_and_quick() {
    const ENDPOINTS: usize = 20_000;
    // The documented bound (docs/observability.md): with the default top 100, under 1 MiB, and well
    // under a second (measured in a release build: see the docs; a debug build is given 3 s here).
    const MAX_BYTES: usize = 1 << 20;
    let herald = Herald::start(&[("HERALD_RETRY_SCHEDULE", "1h")]).await;
    let app = herald.app("many").await;
    let hole = free_addr();
    let url = format!("http://{hole}/hook");
    let created = Arc::new(Mutex::new(0usize));
    let client = http();
    let base = herald.url(&format!("/app/{app}/endpoint"));
    futures::future::join_all((0..16).map(|worker| {
        let (client, base, url, created) = (client.clone(), base.clone(), url.clone(), created.clone());
        async move {
            for _ in (worker..ENDPOINTS).step_by(16) {
                let response = client
                    .post(&base)
                    .bearer_auth(TOKEN)
                    .json(&json!({"url": url}))
                    .send()
                    .await
                    .expect("create endpoint");
                assert_eq!(response.status().as_u16(), 201);
                *created.lock().unwrap() += 1;
            }
        }
    }))
    .await;
    assert_eq!(*created.lock().unwrap(), ENDPOINTS);
    // One message fans out to every endpoint; each delivery fails once and waits an hour.
    herald
        .post(&format!("/app/{app}/msg"), json!({"eventType": "e", "payload": {}}))
        .await;
    let deadline = Instant::now() + Duration::from_secs(180);
    let text = loop {
        let (_, text) = scrape(herald.addr, Some(TOKEN)).await;
        if sample(&text, "herald_scheduler_endpoints", &[]) == Some(ENDPOINTS as f64) {
            break text;
        }
        assert!(Instant::now() < deadline, "the engine never held every endpoint");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(sample(&text, "herald_scheduler_pending", &[]), Some(ENDPOINTS as f64));
    let started = Instant::now();
    let (status, text) = scrape(herald.addr, Some(TOKEN)).await;
    let took = started.elapsed();
    assert_eq!(status, 200);
    assert!(
        text.len() < MAX_BYTES,
        "a scrape of {ENDPOINTS} endpoints is {} bytes",
        text.len()
    );
    assert!(
        took < Duration::from_secs(3),
        "a scrape of {ENDPOINTS} endpoints took {took:?}"
    );
    let listed = sample(&text, "herald_endpoints_listed", &[]).expect("listed");
    assert_eq!(listed, 100.0, "the top 100 by backlog age (no breaker is open)");
    assert_eq!(
        sample(&text, "herald_endpoints_unlisted", &[]),
        Some((ENDPOINTS - 100) as f64)
    );
    assert_eq!(
        sample(&text, "herald_endpoints_unlisted_pending", &[]),
        Some((ENDPOINTS - 100) as f64)
    );
    let series = text
        .lines()
        .filter(|l| l.starts_with("herald_endpoint_pending{"))
        .count();
    assert_eq!(series, 100);
    eprintln!(
        "scrape of {ENDPOINTS} endpoints: {} bytes, {} lines, {took:?}",
        text.len(),
        text.lines().count()
    );
}

/// A Standard Webhooks source for the inbox test.
fn sw_source(name: &str, secret: &str, handler: &str) -> String {
    format!(
        "[[source]]\nname = \"{name}\"\nscheme = \"standard-webhooks\"\nsecrets = [\"{secret}\"]\nforward_to = \"{handler}\"\n"
    )
}

fn signed(secret: &str, id: &str, timestamp: i64, body: &str) -> Vec<(String, String)> {
    let signature = herald_signature::HmacSecret::parse(secret)
        .expect("secret")
        .sign(id, timestamp, body.as_bytes());
    vec![
        ("content-type".into(), "application/json".into()),
        ("webhook-id".into(), id.into()),
        ("webhook-timestamp".into(), timestamp.to_string()),
        ("webhook-signature".into(), signature),
    ]
}

#[tokio::test]
async fn inbox_series_move_with_forged_stale_duplicate_and_valid_posts() {
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let handler = Receiver::start(Reply::status(200)).await;
    let down = free_addr();
    let config = format!(
        "{}{}",
        sw_source("billing", SECRET, &handler.url()),
        sw_source("crm", SECRET, &format!("http://{down}/hook"))
    );
    let inbox = Herald::start_inbox(&config, &[("HERALD_INBOX_RETRY_SCHEDULE", "1h")], None).await;
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs(),
    )
    .expect("time");
    let post = |source: &str, headers: Vec<(String, String)>, body: &'static str| {
        let path = format!("/in/{source}");
        let inbox = &inbox;
        async move {
            let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            inbox.post_raw(&path, body.as_bytes(), &headers).await.0
        }
    };
    let body = r#"{"type":"invoice.paid"}"#;
    assert_eq!(post("billing", signed(SECRET, "msg_1", now, body), body).await, 200);
    assert_eq!(
        post("billing", signed(SECRET, "msg_1", now, body), body).await,
        200,
        "duplicate"
    );
    let forged = signed("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD", "msg_2", now, body);
    assert_eq!(post("billing", forged, body).await, 401);
    assert_eq!(
        post("billing", signed(SECRET, "msg_3", now - 3_600, body), body).await,
        401,
        "stale"
    );
    let mut malformed = signed(SECRET, "msg_4", now, body);
    malformed[3].1 = "not a signature".into();
    assert_eq!(post("billing", malformed, body).await, 401);
    assert_eq!(post("crm", signed(SECRET, "msg_5", now - 2, body), body).await, 200);

    let token = TOKEN;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, text) = scrape(inbox.addr, Some(token)).await;
        assert_eq!(status, 200);
        let get = |name: &str, labels: &[(&str, &str)]| sample(&text, name, labels).unwrap_or(-1.0);
        let settled = get(
            "herald_inbox_forward_attempts_total",
            &[("source", "billing"), ("outcome", "forwarded")],
        ) == 1.0
            && get(
                "herald_inbox_forward_attempts_total",
                &[("source", "crm"), ("outcome", "failed")],
            ) == 1.0
            && get("herald_inbox_pending", &[("source", "crm")]) == 1.0;
        if settled {
            let requests = |result| {
                get(
                    "herald_inbox_requests_total",
                    &[("source", "billing"), ("result", result)],
                )
            };
            assert_eq!(requests("accepted"), 1.0);
            assert_eq!(requests("duplicate"), 1.0);
            assert_eq!(requests("rejected"), 3.0);
            let rejected = |reason| {
                get(
                    "herald_inbox_rejected_total",
                    &[("source", "billing"), ("reason", reason)],
                )
            };
            assert_eq!(rejected("bad_signature"), 1.0);
            assert_eq!(rejected("stale_timestamp"), 1.0);
            assert_eq!(rejected("malformed_header"), 1.0);
            assert_eq!(rejected("too_large"), 0.0);
            assert_eq!(get("herald_inbox_pending", &[("source", "billing")]), 0.0);
            assert_eq!(
                get("herald_inbox_oldest_pending_age_seconds", &[("source", "billing")]),
                0.0
            );
            assert!(get("herald_inbox_oldest_pending_age_seconds", &[("source", "crm")]) >= 1.0);
            // The stale post was an hour behind; the others within a second or two.
            let behind = |le| {
                get(
                    "herald_inbox_clock_skew_seconds_bucket",
                    &[("source", "billing"), ("direction", "behind"), ("le", le)],
                )
            };
            assert_eq!(behind("+Inf") - behind("600"), 1.0, "{text}");
            assert_eq!(get("herald_inbox_dead_total", &[("source", "billing")]), 0.0);
            break;
        }
        assert!(Instant::now() < deadline, "inbox series never settled:\n{text}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        handler.received().len(),
        1,
        "the duplicate and the refused posts were not forwarded"
    );
}

/// A span as received: its name and attributes (values as text).
type Span = (String, Vec<(String, String)>);

/// The pseudo-attribute under which the collector keeps a span's length in milliseconds.
const SPAN_MILLIS: &str = "span.millis";

/// Spans received by the test's OTLP/HTTP collector, decoded from protobuf.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Span>>>,
    content_types: Arc<Mutex<Vec<String>>>,
}

impl Collector {
    async fn start(self) -> SocketAddr {
        use axum::extract::State;
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use prost::Message as _;
        async fn traces(
            State(collector): State<Collector>,
            headers: axum::http::HeaderMap,
            body: axum::body::Bytes,
        ) -> axum::http::StatusCode {
            let Ok(request) = ExportTraceServiceRequest::decode(body) else {
                return axum::http::StatusCode::BAD_REQUEST;
            };
            if let Some(kind) = headers.get("content-type").and_then(|v| v.to_str().ok()) {
                collector.content_types.lock().unwrap().push(kind.to_owned());
            }
            let mut spans = collector.spans.lock().unwrap();
            for resource in request.resource_spans {
                for scope in resource.scope_spans {
                    for span in scope.spans {
                        let mut attributes: Vec<(String, String)> = span
                            .attributes
                            .iter()
                            .map(|kv| (kv.key.clone(), any_value(kv.value.as_ref())))
                            .collect();
                        // The span's length, beside its attributes, under a name no span field has.
                        let nanos = span.end_time_unix_nano.saturating_sub(span.start_time_unix_nano);
                        attributes.push((SPAN_MILLIS.to_owned(), (nanos / 1_000_000).to_string()));
                        spans.push((span.name, attributes));
                    }
                }
            }
            axum::http::StatusCode::OK
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(traces))
            .with_state(self);
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        addr
    }

    fn span(&self, name: &str, msg: &str) -> Option<Vec<(String, String)>> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .find(|(n, attributes)| n == name && attributes.iter().any(|(k, v)| k == "msg" && v == msg))
            .map(|(_, attributes)| attributes.clone())
    }
}

fn any_value(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
    match value.and_then(|v| v.value.as_ref()) {
        Some(V::StringValue(s)) => s.clone(),
        Some(V::IntValue(i)) => i.to_string(),
        Some(V::BoolValue(b)) => b.to_string(),
        Some(V::DoubleValue(d)) => d.to_string(),
        _ => String::new(),
    }
}

#[tokio::test]
async fn traces_reach_an_otlp_collector_and_json_logs_carry_the_same_message_id() {
    let collector = Collector::default();
    let otlp = collector.clone().start().await;
    let receiver = Receiver::start(Reply::status(200)).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let log_path = dir.path().join("herald.log");
    let mut child = herald_command(
        dir.path(),
        &log_path,
        &[
            ("HERALD_OTLP_ENDPOINT", &format!("http://{otlp}")),
            ("HERALD_LOG_FORMAT", "json"),
            ("RUST_LOG", "warn,herald_delivery=debug,herald_api=debug"),
        ],
    );
    let addr = wait_listening(&log_path, &mut child).await;
    let (app, msg) = send_one_message(addr, &receiver.url()).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let (ingest, attempt) = loop {
        if let (Some(ingest), Some(attempt)) = (collector.span("ingest", &msg), collector.span("attempt", &msg)) {
            break (ingest, attempt);
        }
        assert!(
            Instant::now() < deadline,
            "spans never arrived: {:?}",
            collector.spans.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let attribute = |attributes: &[(String, String)], key: &str| {
        attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert_eq!(attribute(&ingest, "app"), app);
    assert_eq!(attribute(&ingest, "duplicate"), "false");
    assert_eq!(attribute(&attempt, "outcome"), "success");
    assert_eq!(attribute(&attempt, "status"), "200");
    assert_eq!(attribute(&attempt, "attempt"), "1");
    assert!(attribute(&attempt, "endpoint").starts_with("ep_"));
    assert!(
        collector
            .content_types
            .lock()
            .unwrap()
            .iter()
            .all(|c| c == "application/x-protobuf"),
        "OTLP/HTTP with protobuf"
    );
    // The JSON log lines of the same request and attempt carry the same id.
    let lines = json_lines(&log_path);
    let with_msg = |message: &str| {
        lines
            .iter()
            .any(|l| l["fields"]["message"] == message && l["span"]["msg"] == msg.as_str())
    };
    assert!(with_msg("message accepted"), "no ingest log line for {msg}: {lines:?}");
    assert!(with_msg("delivered"), "no attempt log line for {msg}: {lines:?}");
    let _ = child.kill();
    let _ = child.wait();
}

/// With a trace exporter, at the default `info` filter (where a success writes no log line), every
/// attempt still has its span, and the span encloses the request: it lasts at least as long as the
/// receiver took to answer. The ingest request has its span too.
#[tokio::test]
async fn an_exported_attempt_span_encloses_its_request_at_the_default_filter() {
    let collector = Collector::default();
    let otlp = collector.clone().start().await;
    let receiver = Receiver::start(Reply::status(200).delay(Duration::from_millis(300))).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let log_path = dir.path().join("herald.log");
    let mut child = herald_command(
        dir.path(),
        &log_path,
        &[("HERALD_OTLP_ENDPOINT", &format!("http://{otlp}"))],
    );
    let addr = wait_listening(&log_path, &mut child).await;
    let (_, msg) = send_one_message(addr, &receiver.url()).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let attempt = loop {
        if let Some(attempt) = collector.span("attempt", &msg) {
            break attempt;
        }
        assert!(Instant::now() < deadline, "no attempt span for {msg}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let attribute = |key: &str| {
        attempt
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert_eq!(attribute("outcome"), "success");
    let millis: u64 = attribute(SPAN_MILLIS).parse().expect("span length");
    assert!(
        millis >= 300,
        "the span lasted {millis} ms: it did not enclose the request"
    );
    // The ingest request's span too: at the default filter it is opened only because traces are exported.
    assert!(
        collector.span("ingest", &msg).is_some(),
        "no ingest span for {msg} with traces exported"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// Without a trace exporter and at the default `info` filter, the attempt span is opened only for the
/// outcome line (not around the request: docs/performance.md); the line must carry it all the same.
#[tokio::test]
async fn a_failed_attempts_json_log_line_carries_its_span_without_a_trace_exporter() {
    let receiver = Receiver::start(Reply::status(500)).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let log_path = dir.path().join("herald.log");
    let mut child = herald_command(dir.path(), &log_path, &[("HERALD_LOG_FORMAT", "json")]);
    let addr = wait_listening(&log_path, &mut child).await;
    let (app, msg) = send_one_message(addr, &receiver.url()).await;
    let line = json_line(&log_path, Duration::from_secs(30), "the failed-attempt line", |l| {
        l["fields"]["message"] == "attempt failed; retrying" && l["span"]["msg"] == msg.as_str()
    })
    .await;
    let span = &line["span"];
    assert_eq!(span["name"], "attempt");
    assert_eq!(span["app"], app.as_str());
    assert_eq!(span["attempt"], 1);
    assert_eq!(span["outcome"], "server_error");
    assert_eq!(span["status"], 500);
    assert!(
        span["endpoint"].as_str().is_some_and(|e| e.starts_with("ep_")),
        "{line}"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// Without a trace exporter, a filter that lets `debug` through opens the ingest request's span: the
/// "message accepted" line carries the message id in it (the span is not opened at all at the default
/// filter, where that line is not written).
#[tokio::test]
async fn an_accepted_messages_debug_line_carries_its_ingest_span_without_a_trace_exporter() {
    let receiver = Receiver::start(Reply::status(200)).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let log_path = dir.path().join("herald.log");
    let mut child = herald_command(
        dir.path(),
        &log_path,
        &[("HERALD_LOG_FORMAT", "json"), ("RUST_LOG", "warn,herald_api=debug")],
    );
    let addr = wait_listening(&log_path, &mut child).await;
    let (_, msg) = send_one_message(addr, &receiver.url()).await;
    let line = json_line(
        &log_path,
        Duration::from_secs(10),
        "the \"message accepted\" line",
        |l| l["fields"]["message"] == "message accepted",
    )
    .await;
    assert_eq!(line["span"]["name"], "ingest", "{line}");
    assert_eq!(line["span"]["msg"], msg.as_str(), "{line}");
    assert_eq!(line["span"]["duplicate"], false, "{line}");
    let _ = child.kill();
    let _ = child.wait();
}

/// An application with one endpoint at `url`, and one message to it: their ids.
async fn send_one_message(addr: SocketAddr, url: &str) -> (String, String) {
    let call = |path: &str, body: Value| {
        let url = format!("http://{addr}/api/v1{path}");
        async move {
            let response = http()
                .post(url)
                .bearer_auth(TOKEN)
                .json(&body)
                .send()
                .await
                .expect("call");
            response.json::<Value>().await.expect("JSON")
        }
    };
    let app = call("/app", json!({"name": "Traced"})).await;
    let app = app["id"].as_str().expect("app").to_owned();
    call(&format!("/app/{app}/endpoint"), json!({"url": url})).await;
    let message = call(
        &format!("/app/{app}/msg"),
        json!({"eventType": "order.paid", "payload": {"n": 1}}),
    )
    .await;
    let msg = message["id"].as_str().expect("msg").to_owned();
    (app, msg)
}

/// The first JSON log line `wanted` picks, waiting up to `within` for it to be written.
async fn json_line(log: &Path, within: Duration, what: &str, wanted: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + within;
    loop {
        if let Some(line) = json_lines(log).into_iter().find(|l| wanted(l)) {
            return line;
        }
        assert!(Instant::now() < deadline, "{what} was never written");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The JSON lines of a log file (other lines skipped).
fn json_lines(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// `herald serve` on a SQLite file in `dir`, logging to `log`.
fn herald_command(dir: &Path, log: &PathBuf, env: &[(&str, &str)]) -> Child {
    let log = std::fs::File::create(log).expect("log file");
    let mut command = Command::new(env!("CARGO_BIN_EXE_herald"));
    command
        .arg("serve")
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HERALD_ADMIN_TOKEN", TOKEN)
        .env("HERALD_LISTEN", "127.0.0.1:0")
        .env("HERALD_ALLOW_PRIVATE_CIDRS", "127.0.0.0/8")
        .env("HERALD_ALLOW_HTTP", "true")
        .env(
            "HERALD_DATABASE_URL",
            format!("sqlite://{}", dir.join("herald.db").display()),
        )
        .stdout(log.try_clone().expect("log"))
        .stderr(log);
    for (k, v) in env {
        command.env(k, v);
    }
    command.spawn().expect("spawn herald")
}

/// The address `herald serve` prints once it listens.
async fn wait_listening(log: &Path, child: &mut Child) -> SocketAddr {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(addr) = text
            .lines()
            .find_map(|l| l.split_once("herald listening on http://"))
            .and_then(|(_, rest)| rest.trim().parse().ok())
        {
            return addr;
        }
        if Instant::now() > deadline || matches!(child.try_wait(), Ok(Some(_))) {
            let _ = child.kill();
            panic!("herald did not start:\n{text}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
