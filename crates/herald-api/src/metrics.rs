//! The API's metrics and `GET /metrics`.
//!
//! Every request is counted by method, route template and status, and timed, by `track` (in the router's
//! outermost layer); `POST /api/v1/app/{app_id}/msg` is also counted as ingest. `GET /metrics` answers
//! the process registry's series followed by the delivery engine's per-endpoint series (see
//! `herald_delivery::metrics`), behind the admin token; [`scrape`] renders the same text for a
//! listener of its own (`HERALD_METRICS_LISTEN`).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, OnceLock, RwLock};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use herald_telemetry::text::Text;

use crate::error::ApiError;
use crate::state::AppState;

/// Requests by `method`, `route` (template) and `status`.
pub const HTTP_REQUESTS: &str = "herald_http_requests_total";
/// Request durations by `method` and `route`.
pub const HTTP_DURATION: &str = "herald_http_request_duration_seconds";
/// Ingest requests (`POST …/msg`) by `status`.
pub const INGEST_REQUESTS: &str = "herald_ingest_requests_total";
/// Messages accepted by ingest, label `result` (`created`, `duplicate`).
pub const INGEST_MESSAGES: &str = "herald_ingest_messages_total";
/// Background tasks by `kind` and `state` (`started`, `finished`, `failed`).
pub const TASKS: &str = "herald_background_tasks_total";

/// The route template of ingest.
const INGEST_ROUTE: &str = "/api/v1/app/{app_id}/msg";

/// The content type of the Prometheus text format.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Count and time every request by its route template (never its raw path: ids would make the series
/// unbounded). Requests no route matched are counted as `unmatched`.
pub(crate) async fn track<Run, Answer>(request: Request, run: Run) -> Response
where
    Run: FnOnce(Request) -> Answer,
    Answer: Future<Output = Response>,
{
    let started = Instant::now();
    let method = request.method().clone();
    let route = request.extensions().get::<MatchedPath>().cloned();
    let response = run(request).await;
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    let status = response.status().as_u16();
    http_request(&method, route, status, started);
    response
}

fn http_request(method: &Method, route: &str, status: u16, started: Instant) {
    let handles = RouteHandles::of(method_label(method), route);
    handles.duration.record(started.elapsed().as_secs_f64());
    handles.requests(status).increment(1);
    if let Some(ingest) = &handles.ingest {
        ingest[status_index(status)]
            .get_or_init(|| metrics::counter!(INGEST_REQUESTS, "status" => status_label(status)))
            .increment(1);
    }
}

/// Status labels a route's counters are kept for (one slot per known code or class).
const STATUS_SLOTS: usize = KNOWN_STATUSES.len() + 5;

/// The registry handles of one (method, route): looked up once, then reused by every request (a labelled
/// lookup in the registry builds and hashes its key each time, about a microsecond on the hot path).
struct RouteHandles {
    method: &'static str,
    route: String,
    duration: metrics::Histogram,
    by_status: [OnceLock<metrics::Counter>; STATUS_SLOTS],
    /// `POST /api/v1/app/{app_id}/msg`: also counted as ingest.
    ingest: Option<[OnceLock<metrics::Counter>; STATUS_SLOTS]>,
}

/// Route template → its handles per method.
type RouteCache = HashMap<String, Vec<Arc<RouteHandles>>>;

/// Route templates are a bounded set (the router's), so the cache is too.
static ROUTES: LazyLock<RwLock<RouteCache>> = LazyLock::new(Default::default);

impl RouteHandles {
    fn of(method: &'static str, route: &str) -> Arc<Self> {
        let cached = |routes: &RouteCache| {
            routes
                .get(route)
                .and_then(|methods| methods.iter().find(|h| h.method == method).cloned())
        };
        if let Some(found) = ROUTES.read().ok().and_then(|routes| cached(&routes)) {
            return found;
        }
        let handles = Arc::new(Self {
            method,
            route: route.to_owned(),
            duration: metrics::histogram!(HTTP_DURATION, "method" => method, "route" => route.to_owned()),
            by_status: std::array::from_fn(|_| OnceLock::new()),
            ingest: (method == "POST" && route == INGEST_ROUTE).then(|| std::array::from_fn(|_| OnceLock::new())),
        });
        if let Ok(mut routes) = ROUTES.write() {
            if let Some(raced) = cached(&routes) {
                return raced;
            }
            routes.entry(route.to_owned()).or_default().push(handles.clone());
        }
        handles
    }

    fn requests(&self, status: u16) -> &metrics::Counter {
        self.by_status[status_index(status)].get_or_init(|| {
            metrics::counter!(HTTP_REQUESTS, "method" => self.method, "route" => self.route.clone(), "status" => status_label(status))
        })
    }
}
/// Start the ingest series that alerts compute rates of (`202`, `503`) at zero, so the first refusals
/// show in `rate()`. Call once the registry is installed.
pub fn register() {
    let ingest = RouteHandles::of("POST", INGEST_ROUTE);
    for status in [202, 503] {
        ingest.requests(status).increment(0);
        if let Some(slots) = &ingest.ingest {
            slots[status_index(status)]
                .get_or_init(|| metrics::counter!(INGEST_REQUESTS, "status" => status_label(status)))
                .increment(0);
        }
    }
    ingested_counters().iter().for_each(|c| c.increment(0));
}

/// A message was stored (`duplicate`: it was already).
pub(crate) fn ingested(duplicate: bool) {
    ingested_counters()[usize::from(duplicate)].increment(1);
}

fn ingested_counters() -> &'static [metrics::Counter; 2] {
    static COUNTERS: LazyLock<[metrics::Counter; 2]> =
        LazyLock::new(|| ["created", "duplicate"].map(|result| metrics::counter!(INGEST_MESSAGES, "result" => result)));
    &COUNTERS
}

/// A background task of `kind` started (`None`) or ended in `state`.
pub(crate) fn task(kind: herald_core::model::TaskKind, state: Option<herald_core::model::TaskState>) {
    let state = state.map_or("started", herald_core::model::TaskState::as_str);
    metrics::counter!(TASKS, "kind" => kind.as_str(), "state" => state).increment(1);
}

fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// The status codes labelled one by one; others by class.
const KNOWN_STATUSES: [(u16, &str); 20] = [
    (200, "200"),
    (201, "201"),
    (202, "202"),
    (204, "204"),
    (301, "301"),
    (304, "304"),
    (308, "308"),
    (400, "400"),
    (401, "401"),
    (403, "403"),
    (404, "404"),
    (405, "405"),
    (409, "409"),
    (413, "413"),
    (415, "415"),
    (422, "422"),
    (429, "429"),
    (500, "500"),
    (503, "503"),
    (504, "504"),
];
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// The slot of a status: its place among the known codes, else its class after them.
fn status_index(status: u16) -> usize {
    KNOWN_STATUSES
        .iter()
        .position(|(code, _)| *code == status)
        .unwrap_or_else(|| KNOWN_STATUSES.len() + usize::from((status / 100).clamp(1, 5) - 1))
}

/// Status codes as static strings (a bounded label set).
fn status_label(status: u16) -> &'static str {
    let index = status_index(status);
    KNOWN_STATUSES
        .get(index)
        .map_or_else(|| CLASSES[index - KNOWN_STATUSES.len()], |(_, label)| label)
}

/// `GET /metrics`, outside `/api/v1` (Prometheus's default path) and outside the OpenAPI document, like
/// the dashboard: it is not part of the Svix-compatible API.
pub(crate) fn routes() -> axum::Router<AppState> {
    axum::Router::new().route("/metrics", axum::routing::get(serve))
}

/// `GET /metrics` on the API: the admin token only (Prometheus sends it with `authorization`).
pub(crate) async fn serve(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    crate::auth::require_admin(&state, &headers).await?;
    Ok(scrape(&state).await)
}

/// The whole scrape as an HTTP response: the registry's series, then the engine's.
pub async fn scrape(state: &AppState) -> Response {
    let registry = herald_telemetry::registry::render();
    let engine = match &state.engine {
        Some(engine) => engine.metrics(state.metrics_top_endpoints).await,
        None => None,
    };
    let mut text = Text::with_capacity(registry.len() + engine.as_ref().map_or(0, |e| 1_024 * (e.listed.len() + 4)));
    text.push_str(&registry);
    if let Some(engine) = engine {
        engine.render(&mut text);
    }
    ([(CONTENT_TYPE, HeaderValue::from_static(TEXT_FORMAT))], text.finish()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_have_a_slot_and_a_label_each() {
        assert_eq!(status_label(202), "202");
        assert_eq!(status_label(503), "503");
        assert_eq!(status_label(418), "4xx");
        assert_eq!(status_label(599), "5xx");
        assert_eq!(status_label(102), "1xx");
        assert!((0..1000).all(|s| status_index(s) < STATUS_SLOTS));
    }
}
