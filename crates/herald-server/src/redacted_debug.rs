//! `Debug` for the settings: every field shown, except that passwords in URLs are masked and secrets
//! (tokens, keys) are hidden, so a settings dump in a log or a panic message leaks nothing.

use std::fmt;

use herald_core::redact;

use crate::config::{Config, InboxFile, OperationalWebhook, Settings};

/// Shows a value that may hold a URL with its passwords masked (see [`redact::in_text`]).
struct Masked<'a, T: fmt::Debug>(&'a T);

impl<T: fmt::Debug> fmt::Debug for Masked<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact::in_text(&format!("{:?}", self.0)))
    }
}

/// Shows only whether a secret is set.
struct Hidden<'a, T: IsSet>(&'a T);

/// Whether a secret setting holds a value.
trait IsSet {
    fn is_set(&self) -> bool;
}

impl IsSet for String {
    fn is_set(&self) -> bool {
        !self.is_empty()
    }
}

impl IsSet for Option<String> {
    fn is_set(&self) -> bool {
        self.as_deref().is_some_and(|s| !s.is_empty())
    }
}

impl<T: IsSet> fmt::Debug for Hidden<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_set() { "<redacted>" } else { "<unset>" })
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Destructured without `..`: a new field does not compile until it is listed here.
        let Self {
            listen,
            database_url,
            admin_token,
            retry_schedule,
            allow_private_cidrs,
            allow_http,
            dev,
            max_payload_bytes,
            endpoint_concurrency,
            max_in_flight,
            breaker_threshold,
            breaker_cooldown,
            breaker_max_cooldown,
            disable_after,
            connect_timeout,
            request_timeout,
            max_request_timeout,
            allow_ports,
            proxy_url,
            secret_key,
            lease_ttl,
            database_timeout,
            database_statement_timeout,
            sqlite_check,
            retention,
            retention_interval,
            operational_webhook_url,
            operational_webhook_secret,
            public_url,
            dashboard_frame_ancestors,
            inbox,
            inbox_database_url,
            inbox_retry_schedule,
            metrics_listen,
            metrics_top_endpoints,
            log_format,
            otlp_endpoint,
            header_read_timeout,
            keep_alive_timeout,
            request_body_timeout,
            response_write_timeout,
            max_connections,
            max_request_bodies,
            max_unread_response_bytes,
            signature_headers,
            relay,
        } = self;
        f.debug_struct("Config")
            .field("listen", listen)
            .field("database_url", &Masked(database_url))
            .field("admin_token", &Hidden(admin_token))
            .field("retry_schedule", retry_schedule)
            .field("allow_private_cidrs", allow_private_cidrs)
            .field("allow_http", allow_http)
            .field("dev", dev)
            .field("max_payload_bytes", max_payload_bytes)
            .field("endpoint_concurrency", endpoint_concurrency)
            .field("max_in_flight", max_in_flight)
            .field("breaker_threshold", breaker_threshold)
            .field("breaker_cooldown", breaker_cooldown)
            .field("breaker_max_cooldown", breaker_max_cooldown)
            .field("disable_after", disable_after)
            .field("connect_timeout", connect_timeout)
            .field("request_timeout", request_timeout)
            .field("max_request_timeout", max_request_timeout)
            .field("allow_ports", allow_ports)
            .field("proxy_url", &Masked(proxy_url))
            .field("secret_key", &Hidden(secret_key))
            .field("lease_ttl", lease_ttl)
            .field("database_timeout", database_timeout)
            .field("database_statement_timeout", database_statement_timeout)
            .field("sqlite_check", sqlite_check)
            .field("retention", retention)
            .field("retention_interval", retention_interval)
            .field("operational_webhook_url", &Masked(operational_webhook_url))
            .field("operational_webhook_secret", &Hidden(operational_webhook_secret))
            .field("public_url", &Masked(public_url))
            .field("dashboard_frame_ancestors", dashboard_frame_ancestors)
            .field("inbox", inbox)
            .field("inbox_database_url", &Masked(inbox_database_url))
            .field("inbox_retry_schedule", inbox_retry_schedule)
            .field("metrics_listen", metrics_listen)
            .field("metrics_top_endpoints", metrics_top_endpoints)
            .field("log_format", log_format)
            .field("otlp_endpoint", &Masked(otlp_endpoint))
            .field("header_read_timeout", header_read_timeout)
            .field("keep_alive_timeout", keep_alive_timeout)
            .field("request_body_timeout", request_body_timeout)
            .field("response_write_timeout", response_write_timeout)
            .field("max_connections", max_connections)
            .field("max_request_bodies", max_request_bodies)
            .field("max_unread_response_bytes", max_unread_response_bytes)
            .field("signature_headers", signature_headers)
            .field("relay", relay)
            .finish()
    }
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Destructured without `..`: a new field does not compile until it is listed here.
        let Self {
            listen,
            database_url,
            admin_token,
            retry_schedule,
            allow_private_cidrs,
            allow_http,
            dev,
            max_payload_bytes,
            endpoint_concurrency,
            max_in_flight,
            breaker,
            disable_after,
            connect_timeout,
            request_timeout,
            max_request_timeout,
            allow_ports,
            proxy_url,
            lease_ttl,
            database_timeouts,
            sqlite_check,
            retention,
            retention_interval,
            operational_webhook,
            secret_key,
            portal,
            metrics_listen,
            metrics_top_endpoints,
            log_format,
            trace_export,
            inbox,
            edge,
            signature_headers,
            relays,
        } = self;
        f.debug_struct("Settings")
            .field("listen", listen)
            .field("database_url", &Masked(database_url))
            .field("admin_token", &Hidden(admin_token))
            .field("retry_schedule", retry_schedule)
            .field("allow_private_cidrs", allow_private_cidrs)
            .field("allow_http", allow_http)
            .field("dev", dev)
            .field("max_payload_bytes", max_payload_bytes)
            .field("endpoint_concurrency", endpoint_concurrency)
            .field("max_in_flight", max_in_flight)
            .field("breaker", breaker)
            .field("disable_after", disable_after)
            .field("connect_timeout", connect_timeout)
            .field("request_timeout", request_timeout)
            .field("max_request_timeout", max_request_timeout)
            .field("allow_ports", allow_ports)
            .field("proxy_url", &Masked(proxy_url))
            .field("lease_ttl", lease_ttl)
            .field("database_timeouts", database_timeouts)
            .field("sqlite_check", sqlite_check)
            .field("retention", retention)
            .field("retention_interval", retention_interval)
            .field("operational_webhook", operational_webhook)
            .field("secret_key", secret_key)
            .field("portal", &Masked(portal))
            .field("metrics_listen", metrics_listen)
            .field("metrics_top_endpoints", metrics_top_endpoints)
            .field("log_format", log_format)
            .field("trace_export", &Masked(trace_export))
            .field("inbox", inbox)
            .field("edge", edge)
            .field("signature_headers", signature_headers)
            // `RelaySection`'s own `Debug` masks its source's password and hides its token.
            .field("relays", relays)
            .finish()
    }
}

impl fmt::Debug for InboxFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Destructured without `..`: a new field does not compile until it is listed here.
        let Self {
            path,
            database_url,
            retry_schedule,
        } = self;
        f.debug_struct("InboxFile")
            .field("path", path)
            .field("database_url", &Masked(database_url))
            .field("retry_schedule", retry_schedule)
            .finish()
    }
}

impl fmt::Debug for OperationalWebhook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Destructured without `..`: a new field does not compile until it is listed here.
        let Self { url, secret } = self;
        f.debug_struct("OperationalWebhook")
            .field("url", &Masked(url))
            .field("secret", &Hidden(secret))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_password_or_secret_in_debug_output() {
        let config = Config {
            database_url: "postgres://herald:Hunter2@db/herald".into(),
            admin_token: Some("Hunter2-token".into()),
            proxy_url: "http://p:Hunter2@10.0.0.1:3128".into(),
            operational_webhook_url: "https://o:Hunter2@ops.example/".into(),
            operational_webhook_secret: Some("whsec_Hunter2".into()),
            inbox_database_url: Some("postgres://i:Hunter2@db/inbox".into()),
            otlp_endpoint: "https://t:Hunter2@otel.example".into(),
            secret_key: Some("Hunter2-key".into()),
            relay: vec![herald_relay::RelaySection {
                source: "postgres://shop:Hunter2@db/shop".into(),
                token: "Hunter2-relay".into(),
                ..herald_relay::RelaySection::default()
            }],
            ..Config::default()
        };
        let text = format!("{config:?} {config:#?}");
        assert!(!text.contains("Hunter2"), "{text}");
        assert!(text.contains("postgres://herald:***@db/herald"), "{text}");
        let webhook = OperationalWebhook {
            url: "https://o:Hunter2@ops.example/".into(),
            secret: "whsec_Hunter2".into(),
        };
        assert!(!format!("{webhook:?}").contains("Hunter2"));
        let inbox = InboxFile {
            path: "inbox.toml".into(),
            database_url: Some("postgres://i:Hunter2@db/inbox".into()),
            retry_schedule: None,
        };
        assert!(!format!("{inbox:?}").contains("Hunter2"));
    }
}
