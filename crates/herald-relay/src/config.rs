//! A relay's settings: the `[[relay]]` section of `herald serve`'s file and the flags of `herald relay`.

use std::fmt;
use std::time::Duration;

use herald_core::redact;
use herald_core::retry::parse_duration;
use serde::{Deserialize, Serialize};

use crate::dialect::{Dialect, TableName};
use crate::outbox::Relayed;

/// One relay as written in a configuration file (durations as text, e.g. `20ms`). `Debug` masks the
/// URLs' passwords and hides the token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RelaySection {
    /// A name for logs and metrics (default: the table's name).
    pub name: Option<String>,
    /// The producer's database: `postgres://…`, `mysql://…` / `mariadb://…` or `sqlite://PATH`.
    pub source: String,
    /// The outbox table (see docs/outbox.md for its DDL).
    pub table: String,
    /// Herald's (or any Svix-compatible server's) base URL; inside `herald serve`, empty means this node.
    pub herald: String,
    /// The bearer token to publish with; inside `herald serve`, empty means the admin token.
    pub token: String,
    /// Rows claimed per batch (one transaction).
    pub batch_size: usize,
    /// Publishes in flight at once (rows of one ordering key always go one after the other).
    pub concurrency: usize,
    /// How long an idle relay waits before looking at the outbox again.
    pub poll_interval: String,
    /// Keep relayed rows (setting `relayed_at`) instead of deleting them.
    pub keep: bool,
    /// How long one publish may take before it is abandoned and retried.
    pub publish_timeout: String,
    /// How often the relay logs its progress (relayed, rate, lag, backlog); `0s`: never.
    pub report_interval: String,
    /// Publish one message per request even when the server offers `POST …/msg-batch`.
    pub one_per_request: bool,
}

impl Default for RelaySection {
    fn default() -> Self {
        Self {
            name: None,
            source: String::new(),
            table: "herald_outbox".to_owned(),
            herald: String::new(),
            token: String::new(),
            batch_size: 500,
            concurrency: 64,
            poll_interval: "20ms".to_owned(),
            keep: false,
            publish_timeout: "10s".to_owned(),
            report_interval: "10s".to_owned(),
            one_per_request: false,
        }
    }
}

/// A relay's checked settings. `Debug` masks the URLs' passwords and hides the token.
#[derive(Clone)]
pub struct RelayConfig {
    /// The name in logs and metrics.
    pub name: String,
    /// The source database URL.
    pub source: String,
    /// The outbox table.
    pub table: String,
    /// Herald's base URL.
    pub herald: String,
    /// The bearer token.
    pub token: String,
    /// Rows per batch.
    pub batch_size: usize,
    /// Publishes in flight.
    pub concurrency: usize,
    /// Idle wait.
    pub poll_interval: Duration,
    /// What becomes of relayed rows.
    pub relayed: Relayed,
    /// One publish's time limit.
    pub publish_timeout: Duration,
    /// Progress log period; `None`: no progress lines.
    pub report_interval: Option<Duration>,
    /// Never use `POST …/msg-batch`.
    pub one_per_request: bool,
}

/// The start of a relay's `Debug` dump, the fields both forms share: the URLs with their passwords
/// masked, and of the token only whether it is set.
fn debug_head<'a, 'b>(
    f: &'a mut fmt::Formatter<'b>,
    type_name: &str,
    name: &dyn fmt::Debug,
    [source, table, herald, token]: [&str; 4],
) -> fmt::DebugStruct<'a, 'b> {
    let mut dump = f.debug_struct(type_name);
    dump.field("name", name)
        .field("source", &redact::url(source))
        .field("table", &table)
        .field("herald", &redact::url(herald))
        .field("token", &if token.is_empty() { "<unset>" } else { "<redacted>" });
    dump
}

impl fmt::Debug for RelaySection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Destructured without `..`: a new field does not compile until it is listed here.
        let Self {
            name,
            source,
            table,
            herald,
            token,
            batch_size,
            concurrency,
            poll_interval,
            keep,
            publish_timeout,
            report_interval,
            one_per_request,
        } = self;
        debug_head(f, "RelaySection", name, [source, table, herald, token])
            .field("batch_size", batch_size)
            .field("concurrency", concurrency)
            .field("poll_interval", poll_interval)
            .field("keep", keep)
            .field("publish_timeout", publish_timeout)
            .field("report_interval", report_interval)
            .field("one_per_request", one_per_request)
            .finish()
    }
}

impl fmt::Debug for RelayConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Destructured without `..`: a new field does not compile until it is listed here.
        let Self {
            name,
            source,
            table,
            herald,
            token,
            batch_size,
            concurrency,
            poll_interval,
            relayed,
            publish_timeout,
            report_interval,
            one_per_request,
        } = self;
        debug_head(f, "RelayConfig", name, [source, table, herald, token])
            .field("batch_size", batch_size)
            .field("concurrency", concurrency)
            .field("poll_interval", poll_interval)
            .field("relayed", relayed)
            .field("publish_timeout", publish_timeout)
            .field("report_interval", report_interval)
            .field("one_per_request", one_per_request)
            .finish()
    }
}

/// A setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("relay `{relay}`: {field}: {problem}")]
pub struct ConfigError {
    /// The relay's name (or table).
    pub relay: String,
    /// The setting.
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

/// The most rows in one batch (every dialect binds them as parameters of one statement).
pub const MAX_BATCH: usize = 5_000;

impl RelaySection {
    /// This section inside `herald serve`: an empty `herald` becomes `node_url`, an empty `token` the
    /// node's admin token (when it has one).
    pub fn for_node(&self, node_url: &str, admin_token: Option<&str>) -> Self {
        let mut section = self.clone();
        if section.herald.is_empty() {
            section.herald = node_url.to_owned();
        }
        if section.token.is_empty() {
            section.token = admin_token.unwrap_or_default().to_owned();
        }
        section
    }

    /// Check the section.
    pub fn check(&self) -> Result<RelayConfig, ConfigError> {
        let name = self.name.clone().unwrap_or_else(|| self.table.clone());
        let fail = |field: &'static str, problem: String| ConfigError {
            relay: name.clone(),
            field,
            problem,
        };
        Dialect::of_url(&self.source).map_err(|e| fail("source", e.to_string()))?;
        TableName::parse(&self.table).map_err(|e| fail("table", e.to_string()))?;
        let herald = url::Url::parse(&self.herald).map_err(|e| fail("herald", format!("{e}: {:?}", self.herald)))?;
        if !matches!(herald.scheme(), "http" | "https") {
            return Err(fail("herald", "must be an http:// or https:// URL".to_owned()));
        }
        if self.token.is_empty() {
            return Err(fail("token", "required".to_owned()));
        }
        if !(1..=MAX_BATCH).contains(&self.batch_size) {
            return Err(fail("batch_size", format!("must be 1 to {MAX_BATCH}")));
        }
        if !(1..=1_024).contains(&self.concurrency) {
            return Err(fail("concurrency", "must be 1 to 1024".to_owned()));
        }
        let duration = |field: &'static str, text: &str| parse_duration(text).map_err(|e| fail(field, e.to_string()));
        let report = duration("report_interval", &self.report_interval)?;
        Ok(RelayConfig {
            name: name.clone(),
            source: self.source.clone(),
            table: self.table.clone(),
            herald: self.herald.trim_end_matches('/').to_owned(),
            token: self.token.clone(),
            batch_size: self.batch_size,
            concurrency: self.concurrency,
            poll_interval: duration("poll_interval", &self.poll_interval)?,
            relayed: if self.keep { Relayed::Mark } else { Relayed::Delete },
            publish_timeout: duration("publish_timeout", &self.publish_timeout)?,
            report_interval: (!report.is_zero()).then_some(report),
            one_per_request: self.one_per_request,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section() -> RelaySection {
        RelaySection {
            source: "postgres://u@localhost/shop".into(),
            herald: "http://127.0.0.1:8040".into(),
            token: "t".into(),
            ..RelaySection::default()
        }
    }

    #[test]
    fn debug_shows_no_password_or_token() {
        let section = RelaySection {
            source: "postgres://shop:Hunter2@db/shop".into(),
            herald: "https://h:Hunter2@herald.example".into(),
            token: "Hunter2-token".into(),
            ..section()
        };
        let config = section.check().expect("valid");
        let text = format!("{section:?} {section:#?} {config:?}");
        assert!(!text.contains("Hunter2"), "{text}");
        assert!(text.contains("postgres://shop:***@db/shop"), "{text}");
        assert!(text.contains("<redacted>"), "{text}");
    }

    #[test]
    fn defaults_check() {
        let config = section().check().expect("valid");
        assert_eq!(config.name, "herald_outbox");
        assert_eq!(config.poll_interval, Duration::from_millis(20));
        assert_eq!(config.relayed, Relayed::Delete);
        assert_eq!(config.report_interval, Some(Duration::from_secs(10)));
    }

    #[test]
    fn bad_settings_name_their_field() {
        let cases: Vec<(RelaySection, &str)> = vec![
            (
                RelaySection {
                    source: "oracle://x".into(),
                    ..section()
                },
                "source",
            ),
            (
                RelaySection {
                    table: "a;b".into(),
                    ..section()
                },
                "table",
            ),
            (
                RelaySection {
                    herald: "ftp://x".into(),
                    ..section()
                },
                "herald",
            ),
            (
                RelaySection {
                    token: String::new(),
                    ..section()
                },
                "token",
            ),
            (
                RelaySection {
                    batch_size: 0,
                    ..section()
                },
                "batch_size",
            ),
            (
                RelaySection {
                    poll_interval: "soon".into(),
                    ..section()
                },
                "poll_interval",
            ),
        ];
        for (bad, field) in cases {
            assert_eq!(bad.check().expect_err(field).field, field);
        }
    }
}
