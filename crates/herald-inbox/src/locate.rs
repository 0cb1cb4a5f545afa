//! Where a value lives in a verified request: a header, or a JSON pointer into the body.
//!
//! Used for a source's event id (the deduplication key), resource key and version. Extraction runs only
//! after the signature was verified: nothing of an unverified body is ever parsed.

use std::fmt;

use axum::http::HeaderMap;
use serde_json::Value;

/// A place to read a value from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A request header, by (case-insensitive) name.
    Header(axum::http::HeaderName),
    /// An RFC 6901 JSON pointer into the body, e.g. `/data/id`.
    Pointer(String),
}

/// Why a location string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is neither a header name nor a JSON pointer (which starts with `/`)")]
pub struct BadLocation(pub String);

impl Location {
    /// Parse the configured form: a string starting with `/` is a JSON pointer, anything else a header
    /// name.
    pub fn parse(text: &str) -> Result<Self, BadLocation> {
        if text.starts_with('/') {
            return Ok(Self::Pointer(text.to_owned()));
        }
        axum::http::HeaderName::from_bytes(text.as_bytes())
            .map(Self::Header)
            .map_err(|_| BadLocation(text.to_owned()))
    }

    /// Whether reading this location needs the body parsed as JSON.
    pub fn needs_json(&self) -> bool {
        matches!(self, Self::Pointer(_))
    }

    /// Read the value: a header's text, or the JSON value at the pointer as text (a string as is, a
    /// number in its JSON form). `json` is the parsed body, when it parsed.
    ///
    /// # Errors
    ///
    /// [`Missing`] naming this location when the header is absent, empty or not UTF-8, the body is not
    /// JSON, the pointer resolves to nothing, or the value is not a string or a number.
    pub fn read(&self, headers: &HeaderMap, json: Option<&Value>) -> Result<String, Missing> {
        let found = match self {
            Self::Header(name) => headers
                .get(name)
                .and_then(|v| std::str::from_utf8(v.as_bytes()).ok())
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_owned),
            Self::Pointer(pointer) => json.and_then(|j| j.pointer(pointer)).and_then(|v| match v {
                Value::String(s) if !s.is_empty() => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            }),
        };
        found.ok_or_else(|| Missing(self.clone()))
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Header(name) => write!(f, "header {name}"),
            Self::Pointer(pointer) => write!(f, "JSON pointer {pointer}"),
        }
    }
}

/// A location held no usable value (a string or a number).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no string or number at {0}")]
pub struct Missing(pub Location);

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn parses_both_forms() {
        assert_eq!(Location::parse("/data/id"), Ok(Location::Pointer("/data/id".into())));
        assert!(matches!(Location::parse("X-GitHub-Delivery"), Ok(Location::Header(_))));
        assert!(Location::parse("bad header").is_err());
        assert!(Location::parse("").is_err());
    }

    #[test]
    fn reads_headers_and_pointers() {
        let mut headers = HeaderMap::new();
        headers.insert("x-id", "  abc ".parse().unwrap());
        headers.insert("x-empty", "".parse().unwrap());
        let body = json!({"data": {"id": "inv_1", "version": 7, "obj": {}, "empty": ""}});
        let read = |loc: &str| Location::parse(loc).unwrap().read(&headers, Some(&body));
        assert_eq!(read("X-Id").unwrap(), "abc");
        assert!(read("x-empty").is_err());
        assert!(read("x-absent").is_err());
        assert_eq!(read("/data/id").unwrap(), "inv_1");
        assert_eq!(read("/data/version").unwrap(), "7");
        assert!(read("/data/obj").is_err());
        assert!(read("/data/empty").is_err());
        assert!(read("/nope").is_err());
        let unparsed = Location::parse("/data/id").unwrap().read(&headers, None);
        assert_eq!(
            unparsed.unwrap_err().to_string(),
            "no string or number at JSON pointer /data/id"
        );
    }
}
