//! The inbox configuration: sources from a TOML file, checked at load.
//!
//! ```toml
//! retry_schedule = "5s,1m,5m,30m,2h,6h,12h,1d"   # optional; delays between forwarding attempts
//! max_body_bytes = 1048576                       # optional; larger requests get 413
//! forward_timeout = "30s"                        # optional; time allowed for one forwarding attempt
//! forward_concurrency = 16                       # optional; forwarding requests in flight at most
//! database_timeout = "1s"                        # optional; PostgreSQL: longest wait for a connection
//! database_statement_timeout = "5s"              # optional; PostgreSQL: statement and lock timeout
//! sqlite_check = "basic"                         # optional; SQLite: start-up check, basic, quick or full
//!
//! [[source]]
//! name = "billing"                      # POST /in/billing
//! scheme = "standard-webhooks"          # or "stripe", "github", "hmac"
//! secrets = ["whsec_…", "whsec_…"]      # any may match
//! tolerance = "5m"                      # optional, timestamped schemes only
//! forward_to = "http://127.0.0.1:9000/handler"
//! event_id = "webhook-id"               # optional: a header name, or a JSON pointer such as "/id"
//! resource_key = "/data/id"             # optional: with `version`, turns the version guard on
//! version = "/data/version"
//!
//! [[source]]
//! name = "acme"
//! scheme = "hmac"                       # HMAC-SHA256 of the raw body...
//! header = "X-Acme-Signature"           # ...in this header,
//! encoding = "hex"                      # hex or base64,
//! prefix = "sha256="                    # after this optional prefix
//! secrets = ["a shared secret"]
//! event_id = "X-Acme-Delivery"          # required for hmac: there is no default
//! forward_to = "http://127.0.0.1:9000/acme"
//! ```
//!
//! Every mistake is reported at load with the source it concerns: an unknown scheme, a secret that does
//! not parse, two sources with one name, a missing `forward_to`, an unknown key.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use herald_core::retry::{RetrySchedule, parse_duration};
use serde::Deserialize;

use crate::locate::Location;
use crate::scheme::{Encoding, SchemeVerifier};

/// The default largest body: 1 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;
/// The default timestamp tolerance: five minutes.
pub const DEFAULT_TOLERANCE: Duration = herald_signature::DEFAULT_TOLERANCE;
/// The default time allowed for one forwarding attempt.
pub const DEFAULT_FORWARD_TIMEOUT: Duration = Duration::from_secs(30);
/// The default number of forwarding requests in flight.
pub const DEFAULT_FORWARD_CONCURRENCY: usize = 16;

/// What is wrong with a configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML, or has an unknown key or a value of the wrong type.
    #[error("invalid inbox configuration: {0}")]
    Syntax(String),
    /// No `[[source]]` at all.
    #[error("no [[source]] is configured")]
    NoSources,
    /// A top-level setting is invalid.
    #[error("{key}: {reason}")]
    Setting {
        /// The key.
        key: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A source's setting is invalid.
    #[error("source {name:?}: {reason}")]
    Source {
        /// The source's name (or its position when it has none).
        name: String,
        /// What is wrong.
        reason: String,
    },
}

/// The checked configuration.
#[derive(Debug, Clone)]
pub struct InboxConfig {
    /// The sources, in file order.
    pub sources: Vec<Arc<Source>>,
    /// Delays between forwarding attempts.
    pub retry_schedule: RetrySchedule,
    /// The largest accepted request body.
    pub max_body_bytes: usize,
    /// Time allowed for one forwarding attempt (connection included).
    pub forward_timeout: Duration,
    /// Forwarding requests in flight at most.
    pub forward_concurrency: usize,
    /// The store's database settings: PostgreSQL's timeouts, SQLite's start-up check.
    pub database: crate::store::DatabaseOptions,
}

/// The signature schemes a source can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// `standard-webhooks`.
    StandardWebhooks,
    /// `stripe`.
    Stripe,
    /// `github`.
    GitHub,
    /// `hmac`.
    Hmac,
}

impl Scheme {
    const ALL: [(&'static str, Scheme); 4] = [
        ("standard-webhooks", Scheme::StandardWebhooks),
        ("stripe", Scheme::Stripe),
        ("github", Scheme::GitHub),
        ("hmac", Scheme::Hmac),
    ];

    /// The configuration name.
    pub fn name(self) -> &'static str {
        Self::ALL.iter().find(|(_, s)| *s == self).map_or("", |(n, _)| n)
    }

    fn parse(text: &str) -> Option<Self> {
        Self::ALL.iter().find(|(n, _)| *n == text).map(|(_, s)| *s)
    }
}

/// A configured source of webhooks. Its `Debug` hides the verifier's secrets and the password of
/// `forward_to`.
#[derive(Clone)]
pub struct Source {
    /// Its name, the last segment of `POST /in/{name}`.
    pub name: String,
    /// Its scheme.
    pub scheme: Scheme,
    /// Its verifier, holding the secrets.
    pub verifier: SchemeVerifier,
    /// The operator's handler that receives its events.
    pub forward_to: url::Url,
    /// Where the provider's event id is (the deduplication key).
    pub event_id: Location,
    /// The version guard, when turned on.
    pub guard: Option<Guard>,
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Destructured without `..`: a new field does not compile until it is listed here.
        let Self {
            name,
            scheme,
            verifier,
            forward_to,
            event_id,
            guard,
        } = self;
        f.debug_struct("Source")
            .field("name", name)
            .field("scheme", scheme)
            .field("verifier", verifier)
            .field("forward_to", &herald_core::redact::url(forward_to.as_str()))
            .field("event_id", event_id)
            .field("guard", guard)
            .finish()
    }
}

/// Where a source's events carry the resource they are about and its version.
#[derive(Debug, Clone)]
pub struct Guard {
    /// The resource key's location.
    pub resource_key: Location,
    /// The version's location.
    pub version: Location,
}

/// The file as written (no `Debug`: its sources hold the secrets in clear).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    retry_schedule: Option<String>,
    max_body_bytes: Option<usize>,
    forward_timeout: Option<String>,
    forward_concurrency: Option<usize>,
    database_timeout: Option<String>,
    database_statement_timeout: Option<String>,
    sqlite_check: Option<String>,
    #[serde(default)]
    source: Vec<RawSource>,
}

/// A source as the file gives it (no `Debug`: it holds the secrets in clear).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSource {
    name: Option<String>,
    scheme: Option<String>,
    #[serde(default)]
    secrets: Vec<String>,
    tolerance: Option<String>,
    forward_to: Option<String>,
    event_id: Option<String>,
    resource_key: Option<String>,
    version: Option<String>,
    header: Option<String>,
    encoding: Option<String>,
    prefix: Option<String>,
}

impl InboxConfig {
    /// Read and check the file at `path`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`], naming the source and the key at fault.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text)
    }

    /// Parse and check a configuration given as TOML text.
    ///
    /// # Errors
    ///
    /// [`ConfigError`], naming the source and the key at fault.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let raw: RawFile = toml::from_str(text).map_err(|e| ConfigError::Syntax(e.message().to_owned()))?;
        if raw.source.is_empty() {
            return Err(ConfigError::NoSources);
        }
        let mut names = HashSet::new();
        let mut sources = Vec::with_capacity(raw.source.len());
        for (index, source) in raw.source.into_iter().enumerate() {
            let source = source.check(index)?;
            if !names.insert(source.name.clone()) {
                return Err(ConfigError::Source {
                    name: source.name,
                    reason: "two sources have this name".into(),
                });
            }
            sources.push(Arc::new(source));
        }
        let setting = |key, reason: String| ConfigError::Setting { key, reason };
        let retry_schedule = match raw.retry_schedule {
            Some(text) => text.parse().map_err(|e| setting("retry_schedule", format!("{e}")))?,
            None => RetrySchedule::default(),
        };
        let forward_timeout = match raw.forward_timeout {
            Some(text) => parse_duration(&text).map_err(|e| setting("forward_timeout", e.to_string()))?,
            None => DEFAULT_FORWARD_TIMEOUT,
        };
        let max_body_bytes = raw.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
        let forward_concurrency = raw.forward_concurrency.unwrap_or(DEFAULT_FORWARD_CONCURRENCY);
        if max_body_bytes == 0 || forward_concurrency == 0 || forward_timeout.is_zero() {
            return Err(setting(
                "max_body_bytes, forward_concurrency, forward_timeout",
                "must be more than zero".into(),
            ));
        }
        let defaults = crate::store::DatabaseOptions::default();
        let database = crate::store::DatabaseOptions {
            timeouts: defaults
                .timeouts
                .with_settings(
                    raw.database_timeout.as_deref(),
                    raw.database_statement_timeout.as_deref(),
                )
                .map_err(|reason| setting("database_timeout, database_statement_timeout", reason))?,
            sqlite_check: match raw.sqlite_check {
                Some(text) => text.parse().map_err(|reason| setting("sqlite_check", reason))?,
                None => defaults.sqlite_check,
            },
        };
        Ok(Self {
            sources,
            retry_schedule,
            max_body_bytes,
            forward_timeout,
            forward_concurrency,
            database,
        })
    }
}

impl RawSource {
    fn check(self, index: usize) -> Result<Source, ConfigError> {
        let label = self.name.clone().unwrap_or_else(|| format!("#{}", index + 1));
        let fail = |reason: String| ConfigError::Source {
            name: label.clone(),
            reason,
        };
        let name = self.name.clone().ok_or_else(|| fail("name is missing".into()))?;
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
            return Err(fail("name may only use letters, digits, `-`, `_` and `.`".into()));
        }
        let scheme_text = self.scheme.as_deref().ok_or_else(|| fail("scheme is missing".into()))?;
        let scheme = Scheme::parse(scheme_text).ok_or_else(|| {
            fail(format!(
                "unknown scheme {scheme_text:?}; expected standard-webhooks, stripe, github or hmac"
            ))
        })?;
        let forward_to = self
            .forward_to
            .as_deref()
            .ok_or_else(|| fail("forward_to is missing: every source needs the URL of its handler".into()))?;
        let forward_to = url::Url::parse(forward_to)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.has_host())
            .ok_or_else(|| fail(format!("forward_to: {forward_to:?} is not an http(s) URL")))?;
        if self.secrets.is_empty() {
            return Err(fail("secrets is empty: list at least one".into()));
        }
        if let Some(position) = self.secrets.iter().position(|s| s.trim().is_empty()) {
            return Err(fail(format!("secrets[{position}] is empty")));
        }
        let tolerance = match &self.tolerance {
            Some(text) => parse_duration(text).map_err(|e| fail(format!("tolerance: {e}")))?,
            None => DEFAULT_TOLERANCE,
        };
        if scheme != Scheme::Hmac && (self.header.is_some() || self.encoding.is_some() || self.prefix.is_some()) {
            return Err(fail("header, encoding and prefix apply to scheme \"hmac\" only".into()));
        }
        let verifier = match scheme {
            Scheme::StandardWebhooks => SchemeVerifier::standard_webhooks(&self.secrets, tolerance)
                .map_err(|(i, reason)| fail(format!("secrets[{i}]: {reason} (expected whsec_… or whpk_…)")))?,
            Scheme::Stripe => SchemeVerifier::Stripe {
                secrets: self.secrets.clone(),
                tolerance,
            },
            Scheme::GitHub => SchemeVerifier::GitHub {
                secrets: self.secrets.clone(),
            },
            Scheme::Hmac => self.hmac_verifier().map_err(fail)?,
        };
        let location = |key: &str, text: &str| Location::parse(text).map_err(|e| fail(format!("{key}: {e}")));
        let event_id = match (&self.event_id, scheme) {
            (Some(text), _) => location("event_id", text)?,
            (None, Scheme::Stripe) => Location::Pointer("/id".into()),
            (None, _) => match verifier.default_event_id() {
                Some(header) => location("event_id", header)?,
                None => {
                    return Err(fail(
                        "event_id is required for scheme \"hmac\": a header name or a JSON pointer such as \"/id\""
                            .into(),
                    ));
                }
            },
        };
        let guard = match (&self.resource_key, &self.version) {
            (Some(key), Some(version)) => Some(Guard {
                resource_key: location("resource_key", key)?,
                version: location("version", version)?,
            }),
            (None, None) => None,
            _ => {
                return Err(fail(
                    "resource_key and version turn the version guard on together: set both or neither".into(),
                ));
            }
        };
        Ok(Source {
            name,
            scheme,
            verifier,
            forward_to,
            event_id,
            guard,
        })
    }

    fn hmac_verifier(&self) -> Result<SchemeVerifier, String> {
        let header = self
            .header
            .as_deref()
            .ok_or("header is required for scheme \"hmac\" (the header carrying the signature)")?;
        let header = axum::http::HeaderName::from_bytes(header.as_bytes())
            .map_err(|_| format!("header: {header:?} is not a header name"))?;
        let encoding = match self.encoding.as_deref() {
            Some("hex") | None => Encoding::Hex,
            Some("base64") => Encoding::Base64,
            Some(other) => return Err(format!("encoding: {other:?} is not hex or base64")),
        };
        Ok(SchemeVerifier::Hmac {
            secrets: self.secrets.clone(),
            header,
            encoding,
            prefix: self.prefix.clone().unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ISSUE_EXAMPLE: &str = r#"
[[source]]
name = "billing"
scheme = "standard-webhooks"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"]
forward_to = "http://127.0.0.1:9000/handler"
resource_key = "/data/id"
version = "/data/version"
"#;

    #[test]
    fn debug_output_shows_no_secret_and_no_password() {
        let text = r#"
[[source]]
name = "stripe"
scheme = "stripe"
secrets = ["whsec_StripeSecretValue1"]
forward_to = "https://handler:Hunter2pw@handler.example/stripe"

[[source]]
name = "github"
scheme = "github"
secrets = ["GitHubSecretValue2"]
forward_to = "http://127.0.0.1:9000/github"

[[source]]
name = "acme"
scheme = "hmac"
header = "X-Acme-Signature"
encoding = "hex"
event_id = "X-Acme-Delivery"
secrets = ["AcmeSecretValue3"]
forward_to = "http://127.0.0.1:9000/acme"

[[source]]
name = "billing"
scheme = "standard-webhooks"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
forward_to = "http://127.0.0.1:9000/billing"
"#;
        let config = InboxConfig::from_toml(text).unwrap();
        let shown = format!("{config:?} {config:#?}");
        for secret in [
            "StripeSecretValue1",
            "GitHubSecretValue2",
            "AcmeSecretValue3",
            "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "Hunter2pw",
        ] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(
            shown.contains("handler.example") && shown.contains("x-acme-signature"),
            "{shown}"
        );
    }

    #[test]
    fn the_database_settings_are_read_from_the_file_and_default_to_the_senders() {
        let defaults = InboxConfig::from_toml(ISSUE_EXAMPLE).unwrap().database;
        assert_eq!(defaults, crate::store::DatabaseOptions::default());
        let text = format!(
            "database_timeout = \"250ms\"\ndatabase_statement_timeout = \"2s\"\nsqlite_check = \"quick\"\n{ISSUE_EXAMPLE}"
        );
        let database = InboxConfig::from_toml(&text).unwrap().database;
        assert_eq!(database.timeouts.acquire, Duration::from_millis(250));
        assert_eq!(database.timeouts.statement, Duration::from_secs(2));
        assert_eq!(database.sqlite_check, herald_sql::integrity::SqliteCheck::Quick);
        for bad in [
            "database_timeout = \"0s\"",
            "database_statement_timeout = \"soon\"",
            "sqlite_check = \"deep\"",
        ] {
            let error = InboxConfig::from_toml(&format!("{bad}\n{ISSUE_EXAMPLE}")).unwrap_err();
            assert!(matches!(error, ConfigError::Setting { .. }), "{bad}: {error}");
        }
    }

    #[test]
    fn the_issue_example_loads_with_defaults() {
        let config = InboxConfig::from_toml(ISSUE_EXAMPLE).unwrap();
        let source = &config.sources[0];
        assert_eq!(source.name, "billing");
        assert_eq!(source.scheme, Scheme::StandardWebhooks);
        assert_eq!(source.event_id, Location::parse("webhook-id").unwrap());
        assert!(source.guard.is_some());
        assert_eq!(config.retry_schedule, RetrySchedule::default());
        assert_eq!(config.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
    }

    #[test]
    fn scheme_defaults_for_the_event_id() {
        let config = InboxConfig::from_toml(
            r#"
[[source]]
name = "s"
scheme = "stripe"
secrets = ["whsec_test_secret"]
forward_to = "http://127.0.0.1:1/"
[[source]]
name = "g"
scheme = "github"
secrets = ["It's a Secret to Everybody"]
forward_to = "https://handler.internal/g"
"#,
        )
        .unwrap();
        assert_eq!(config.sources[0].event_id, Location::Pointer("/id".into()));
        assert_eq!(
            config.sources[1].event_id,
            Location::parse("x-github-delivery").unwrap()
        );
    }

    fn error_of(text: &str) -> String {
        InboxConfig::from_toml(text).unwrap_err().to_string()
    }

    #[test]
    fn mistakes_are_named() {
        let base = "name = \"a\"\nscheme = \"github\"\nsecrets = [\"s\"]\nforward_to = \"http://127.0.0.1:1/\"\n";
        let with = |extra: &str| format!("[[source]]\n{base}{extra}");
        assert!(error_of("").contains("no [[source]]"));
        assert!(error_of(&format!("{}\n{}", with(""), with(""))).contains("two sources have this name"));
        assert!(error_of(&with("").replace("github", "gitlab")).contains("unknown scheme \"gitlab\""));
        assert!(
            error_of(&with("").replace("forward_to = \"http://127.0.0.1:1/\"", "")).contains("forward_to is missing")
        );
        assert!(error_of(&with("").replace("http://127.0.0.1:1/", "ftp://x/")).contains("not an http(s) URL"));
        assert!(error_of(&with("").replace("[\"s\"]", "[]")).contains("secrets is empty"));
        assert!(error_of(&with("").replace("[\"s\"]", "[\"\"]")).contains("secrets[0] is empty"));
        assert!(error_of(&with("colour = 1")).contains("unknown field"));
        assert!(error_of(&with("version = \"/v\"")).contains("set both or neither"));
        assert!(error_of(&with("tolerance = \"5 minutes\"")).contains("tolerance"));
        assert!(error_of(&with("event_id = \"bad header\"")).contains("event_id"));
        assert!(error_of(&with("header = \"x-sig\"")).contains("apply to scheme \"hmac\" only"));
        assert!(error_of(&with("").replace("name = \"a\"", "name = \"a/b\"")).contains("name may only use"));
        let sw = with("")
            .replace("github", "standard-webhooks")
            .replace("[\"s\"]", "[\"whsec_ok+A\", \"whsec_!!\"]");
        assert!(error_of(&sw).contains("secrets[1]"), "{}", error_of(&sw));
        let hmac = with("").replace("github", "hmac");
        assert!(error_of(&hmac).contains("header is required"));
        assert!(error_of(&format!("{hmac}header = \"x-sig\"\n")).contains("event_id is required"));
        assert!(
            error_of(&format!(
                "{hmac}header = \"x-sig\"\nevent_id = \"/id\"\nencoding = \"b32\"\n"
            ))
            .contains("encoding")
        );
        assert!(
            InboxConfig::from_toml(&format!(
                "{hmac}header = \"x-sig\"\nevent_id = \"/id\"\nencoding = \"base64\"\nprefix = \"sha256=\"\n"
            ))
            .is_ok()
        );
        assert!(error_of(&format!("retry_schedule = \"5x\"\n{}", with(""))).contains("retry_schedule"));
        assert!(error_of(&format!("forward_concurrency = 0\n{}", with(""))).contains("more than zero"));
    }
}
