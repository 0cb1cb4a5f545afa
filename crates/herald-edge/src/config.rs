//! The edge's settings: as written (durations as text, for the TOML file and `HERALD_*` variables) and
//! as checked.

use std::time::Duration;

use herald_core::retry::parse_duration;
use serde::{Deserialize, Serialize};

/// The edge's settings as a human writes them. `herald serve` reads them from its TOML file, its
/// `HERALD_*` variables and flags with its other settings; `herald inbox` from variables and flags.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EdgeConfig {
    /// Time for a request's line and headers to arrive: from the connection's opening for its first
    /// request, from the first byte for the next ones.
    pub header_read_timeout: String,
    /// How long a connection may stay open between requests.
    pub keep_alive_timeout: String,
    /// Time for a whole request body to arrive, from the end of its headers.
    pub request_body_timeout: String,
    /// Time for a response to be read by the client, from its first byte written.
    pub response_write_timeout: String,
    /// Open client connections at most (lowered to what the file-descriptor limit allows).
    pub max_connections: usize,
    /// Request bodies being received at once at most.
    pub max_request_bodies: usize,
    /// Response bytes waiting for clients to read them, over all connections, at most; past it the
    /// connections that have left theirs unread longest are closed.
    pub max_unread_response_bytes: u64,
}

impl Default for EdgeConfig {
    fn default() -> Self {
        Self {
            header_read_timeout: "10s".to_owned(),
            keep_alive_timeout: "60s".to_owned(),
            request_body_timeout: "30s".to_owned(),
            response_write_timeout: "30s".to_owned(),
            max_connections: 4096,
            max_request_bodies: 256,
            max_unread_response_bytes: 64 * 1024 * 1024,
        }
    }
}

/// A setting of the edge that is not valid.
#[derive(Debug, thiserror::Error)]
#[error("{setting}: {reason}")]
pub struct InvalidSetting {
    setting: &'static str,
    reason: String,
}

impl EdgeConfig {
    /// Parse and check every value.
    ///
    /// # Errors
    ///
    /// [`InvalidSetting`] naming the first setting that is not a duration or is zero.
    pub fn limits(&self) -> Result<Limits, InvalidSetting> {
        let duration = |setting: &'static str, text: &str| {
            let value = parse_duration(text).map_err(|e| InvalidSetting {
                setting,
                reason: e.to_string(),
            })?;
            if value.is_zero() {
                return Err(InvalidSetting {
                    setting,
                    reason: "must be longer than zero".to_owned(),
                });
            }
            Ok(value)
        };
        let count = |setting: &'static str, value: u64| {
            if value == 0 {
                return Err(InvalidSetting {
                    setting,
                    reason: "must be at least 1".to_owned(),
                });
            }
            Ok(value)
        };
        Ok(Limits {
            header_read_timeout: duration("header_read_timeout", &self.header_read_timeout)?,
            keep_alive_timeout: duration("keep_alive_timeout", &self.keep_alive_timeout)?,
            request_body_timeout: duration("request_body_timeout", &self.request_body_timeout)?,
            response_write_timeout: duration("response_write_timeout", &self.response_write_timeout)?,
            max_connections: usize::try_from(count("max_connections", self.max_connections as u64)?)
                .unwrap_or(usize::MAX),
            max_request_bodies: usize::try_from(count("max_request_bodies", self.max_request_bodies as u64)?)
                .unwrap_or(usize::MAX),
            max_unread_response_bytes: count("max_unread_response_bytes", self.max_unread_response_bytes)?,
        })
    }
}

/// The edge's settings, checked. See [`EdgeConfig`] for each one's meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Time for a request head to arrive.
    pub header_read_timeout: Duration,
    /// Idle time allowed between requests.
    pub keep_alive_timeout: Duration,
    /// Time for a request body to arrive.
    pub request_body_timeout: Duration,
    /// Time for a response to be read.
    pub response_write_timeout: Duration,
    /// Open connections at most.
    pub max_connections: usize,
    /// Request bodies in progress at most.
    pub max_request_bodies: usize,
    /// Unread response bytes at most.
    pub max_unread_response_bytes: u64,
}

/// The connections a metrics listener (`herald serve`'s `metrics_listen`, `herald relay
/// --metrics-listen`) keeps open at most: a scraper or two need no more, and a flood of sockets there must
/// not take the descriptors the API needs.
pub const METRICS_CONNECTIONS: usize = 16;

impl Limits {
    /// These limits for a metrics listener: the same timeouts, at most [`METRICS_CONNECTIONS`]
    /// connections.
    #[must_use]
    pub fn for_metrics(self) -> Self {
        Self {
            max_connections: self.max_connections.min(METRICS_CONNECTIONS),
            ..self
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        EdgeConfig::default()
            .limits()
            .unwrap_or_else(|_| unreachable!("the default settings are valid"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse() {
        let limits = Limits::default();
        assert_eq!(limits.header_read_timeout, Duration::from_secs(10));
        assert_eq!(limits.keep_alive_timeout, Duration::from_secs(60));
        assert_eq!(limits.max_connections, 4096);
    }

    #[test]
    fn bad_values_name_their_setting() {
        let bad = EdgeConfig {
            keep_alive_timeout: "soon".into(),
            ..EdgeConfig::default()
        };
        assert!(bad.limits().unwrap_err().to_string().starts_with("keep_alive_timeout"));
        let zero = EdgeConfig {
            max_request_bodies: 0,
            ..EdgeConfig::default()
        };
        assert!(zero.limits().unwrap_err().to_string().starts_with("max_request_bodies"));
        let instant = EdgeConfig {
            header_read_timeout: "0s".into(),
            ..EdgeConfig::default()
        };
        assert!(instant.limits().is_err());
    }
}
