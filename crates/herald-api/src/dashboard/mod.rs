//! The operators' web dashboard: static HTML, CSS and JavaScript compiled into the binary, served at
//! `/dashboard/` (and `/dashboard`, which redirects there).
//!
//! The assets hold no data, so they are served without a token; the page asks for one and calls the REST
//! API with it (`Authorization: Bearer`), like any other client — with an application token it sees only
//! that application. There is no build step: the files in `assets/` are what the browser runs.
//!
//! Every answer carries a strict `Content-Security-Policy` (scripts and styles only from this origin, no
//! inline code): the pages render data the API returns — endpoint URLs, response bodies, event types, all
//! chosen by tenants or their receivers — and the policy is the second line of defence behind the scripts'
//! rule of rendering data only as text. No page may frame the dashboard, unless the operator lists the
//! origins that embed it as a tenant portal ([`Portal::frame_ancestors`]).
//!
//! These routes are not part of the REST API: they live outside `/api/v1` and outside `src/routes`, and are
//! not in the OpenAPI document.

use std::sync::LazyLock;

use axum::Router;
use axum::extract::{Path, Request};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};
use tower_http::set_header::SetResponseHeaderLayer;

use crate::error::ApiError;
use crate::state::Portal;

/// Where the dashboard lives.
pub(crate) const ROOT: &str = "/dashboard/";

/// The page served at [`ROOT`]; the router sees it under this name (see [`keep_root`]).
const INDEX: &str = "index.html";

/// No script, style, image or connection from anywhere but this origin; no inline code; no plugins, no
/// `<base>` rewriting, no form posting elsewhere. `frame-ancestors` follows (see [`content_security_policy`]).
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'";

/// The policy with its `frame-ancestors`: `'none'` (no framing: clickjacking) unless origins are listed.
fn content_security_policy(portal: &Portal) -> String {
    let ancestors = if portal.frame_ancestors.is_empty() {
        "'none'".to_owned()
    } else {
        portal.frame_ancestors.join(" ")
    };
    format!("{CONTENT_SECURITY_POLICY}; frame-ancestors {ancestors}")
}

/// One embedded file.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const SVG: &str = "image/svg+xml";

/// Every file of `assets/`; `tests/dashboard.rs` in the `herald` crate checks that each one is served.
const ASSETS: &[Asset] = &[
    asset(INDEX, HTML, include_bytes!("assets/index.html")),
    asset("style.css", CSS, include_bytes!("assets/style.css")),
    asset("api.js", JS, include_bytes!("assets/api.js")),
    asset("dom.js", JS, include_bytes!("assets/dom.js")),
    asset("app.js", JS, include_bytes!("assets/app.js")),
    asset("view-apps.js", JS, include_bytes!("assets/view-apps.js")),
    asset("view-messages.js", JS, include_bytes!("assets/view-messages.js")),
    asset("view-deliveries.js", JS, include_bytes!("assets/view-deliveries.js")),
    asset("view-endpoint.js", JS, include_bytes!("assets/view-endpoint.js")),
    asset("view-ops.js", JS, include_bytes!("assets/view-ops.js")),
    asset("search.js", JS, include_bytes!("assets/search.js")),
    asset("chart.js", JS, include_bytes!("assets/chart.js")),
    asset("favicon.svg", SVG, include_bytes!("assets/favicon.svg")),
];

const fn asset(name: &'static str, content_type: &'static str, body: &'static [u8]) -> Asset {
    Asset {
        name,
        content_type,
        body,
    }
}

/// A strong validator per asset (in [`ASSETS`] order), so a browser revalidates cheaply instead of
/// downloading again: the files change only with the binary.
static ETAGS: LazyLock<Vec<HeaderValue>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|a| {
            let digest = hex::encode(&Sha256::digest(a.body)[..16]);
            HeaderValue::from_str(&format!("\"{digest}\"")).expect("hex is a valid header value")
        })
        .collect()
});

/// The dashboard's routes, for merging next to the API router. Generic over the state: they use none.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>(portal: &Portal) -> Router<S> {
    // The origins were checked when the configuration was read (scheme://host[:port] only); one that
    // still is no header value leaves framing closed.
    let policy = HeaderValue::from_str(&content_security_policy(portal))
        .unwrap_or_else(|_| HeaderValue::from_static("default-src 'none'; frame-ancestors 'none'"));
    let mut headers = vec![
        (header::CONTENT_SECURITY_POLICY, policy),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
        // Revalidate every time (with the ETag): an upgraded server must never run yesterday's scripts.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    // For browsers that predate `frame-ancestors`; it cannot list origins, so it goes when some are allowed.
    if portal.frame_ancestors.is_empty() {
        headers.push((header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")));
    }
    let mut router = Router::new()
        .route("/dashboard", get(|| async { Redirect::permanent(ROOT) }))
        .route("/dashboard/{name}", get(serve));
    for (name, value) in headers {
        router = router.layer(SetResponseHeaderLayer::overriding(name, value));
    }
    router
}

/// Answer one asset, or `304` when the browser already holds this version.
async fn serve(Path(name): Path<String>, request_headers: HeaderMap) -> Response {
    let Some(index) = ASSETS.iter().position(|a| a.name == name) else {
        return ApiError::not_found("dashboard asset").into_response();
    };
    let (asset, etag) = (&ASSETS[index], ETAGS[index].clone());
    let fresh = request_headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|tag| tag.trim() == etag || tag.trim() == "*");
    if fresh {
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response();
    }
    let content_type = HeaderValue::from_static(asset.content_type);
    let headers: [(HeaderName, HeaderValue); 2] = [(header::CONTENT_TYPE, content_type), (header::ETAG, etag)];
    (headers, asset.body).into_response()
}

/// Give the dashboard's root its own name before trailing slashes are trimmed from request paths.
///
/// The API accepts every path with or without a trailing slash, so its router sees `/dashboard/` as
/// `/dashboard` — which must redirect to `/dashboard/` for the page's relative links to resolve. Renaming
/// the root to `/dashboard/index.html` first (the browser keeps showing `/dashboard/`) keeps both apart.
pub(crate) fn keep_root(mut request: Request) -> Request {
    if request.uri().path() == ROOT {
        let path_and_query = match request.uri().query() {
            Some(query) => format!("{ROOT}{INDEX}?{query}"),
            None => format!("{ROOT}{INDEX}"),
        };
        let mut parts = request.uri().clone().into_parts();
        // The query came from a valid URI, so the rebuilt one parses; if it somehow did not, the request
        // goes on unchanged and meets the redirect, which is harmless.
        if let Ok(parsed) = path_and_query.parse() {
            parts.path_and_query = Some(parsed);
            if let Ok(uri) = axum::http::Uri::from_parts(parts) {
                *request.uri_mut() = uri;
            }
        }
    }
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_has_a_unique_name_and_a_body() {
        let mut names: Vec<&str> = ASSETS.iter().map(|a| a.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ASSETS.len());
        assert!(ASSETS.iter().all(|a| !a.body.is_empty()));
        assert_eq!(ETAGS.len(), ASSETS.len());
    }

    #[test]
    fn framing_is_closed_unless_origins_are_listed() {
        let closed = content_security_policy(&Portal::default());
        assert!(closed.ends_with("frame-ancestors 'none'"), "{closed}");
        let open = content_security_policy(&Portal {
            frame_ancestors: vec!["https://portal.example".into(), "https://b.example:8443".into()],
            ..Portal::default()
        });
        assert!(
            open.ends_with("frame-ancestors https://portal.example https://b.example:8443"),
            "{open}"
        );
        assert!(open.contains("script-src 'self'"), "{open}");
    }

    #[test]
    fn only_the_root_is_renamed() {
        let rewrite = |uri: &str| {
            let request = Request::builder()
                .uri(uri)
                .body(axum::body::Body::empty())
                .expect("request");
            keep_root(request).uri().to_string()
        };
        assert_eq!(rewrite("/dashboard/"), "/dashboard/index.html");
        assert_eq!(rewrite("/dashboard/?a=1"), "/dashboard/index.html?a=1");
        assert_eq!(rewrite("/dashboard"), "/dashboard");
        assert_eq!(rewrite("/dashboard/app.js"), "/dashboard/app.js");
        assert_eq!(rewrite("/api/v1/app/"), "/api/v1/app/");
    }
}
