//! Svix Cloud products that Herald does not offer, recognised by path.
//!
//! The official SDKs expose operations for products that exist only in Svix's hosted service (streams,
//! connectors, ingest sources, environments, …). A request for one of them reaches no Herald route; rather
//! than the generic 404 "no route" (which an SDK user would read as a wrong base URL), the router's fallback
//! asks [`feature`] and answers `501 not_implemented` naming the product. Routes Herald serves always win:
//! the fallback only sees paths that matched nothing, so a product implemented later simply stops reaching
//! here.
//!
//! Pure logic: a path in, a product name out.

/// The Svix Cloud product a request path belongs to, when it is one Herald does not offer.
///
/// `path` is the request path (`/api/v1/stream/…`, `/ingest/api/v1/…`), with or without a trailing slash.
pub(crate) fn feature(path: &str) -> Option<&'static str> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segments.as_slice() {
        ["ingest", "api", "v1", ..] => Some("Ingest (inbound webhook sources)"),
        ["api", "v1", rest @ ..] => api_v1_feature(rest),
        _ => None,
    }
}

/// [`feature`] for the segments after `/api/v1`.
fn api_v1_feature(rest: &[&str]) -> Option<&'static str> {
    const STREAMING: &str = "Streaming (streams, sinks and stream event types)";
    match rest {
        ["stream", ..] => Some(STREAMING),
        ["auth", "stream", ..] | ["auth", "stream-portal-access", ..] | ["auth", "stream-logout"] => Some(STREAMING),
        ["connector", ..] => Some("Connectors"),
        ["environment", ..] => Some("Environment export and import"),
        ["operational-webhook", ..] => Some(
            "Operational webhook endpoints (Herald publishes its operational events at GET /api/v1/operational-event)",
        ),
        ["stats", "usage", ..] => Some("Usage statistics"),
        ["app", _, "integration", ..] => Some("Integrations"),
        ["app", _, "destination", ..] => Some("Destinations"),
        ["app", _, "autoconfig", ..] => Some("Autoconfig subscriptions"),
        ["app", _, "endpoint", _, "transformation"] => Some("Transformations"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::feature;

    #[test]
    fn names_the_cloud_products_herald_does_not_offer() {
        assert_eq!(
            feature("/api/v1/stream/strm_1/sink/"),
            Some("Streaming (streams, sinks and stream event types)")
        );
        assert_eq!(
            feature("/api/v1/auth/stream-logout"),
            Some("Streaming (streams, sinks and stream event types)")
        );
        assert_eq!(
            feature("/ingest/api/v1/source"),
            Some("Ingest (inbound webhook sources)")
        );
        assert_eq!(feature("/api/v1/connector/c_1"), Some("Connectors"));
        assert_eq!(
            feature("/api/v1/app/app_1/endpoint/ep_1/transformation"),
            Some("Transformations")
        );
        assert_eq!(
            feature("/api/v1/app/app_1/integration/i_1/key/rotate"),
            Some("Integrations")
        );
    }

    #[test]
    fn leaves_other_paths_to_the_404() {
        assert_eq!(feature("/api/v1/app/app_1/endpoint/ep_1/nonsense"), None);
        assert_eq!(feature("/api/v1/nonsense"), None);
        assert_eq!(feature("/dashboard/stream"), None);
        assert_eq!(feature("/"), None);
    }
}
