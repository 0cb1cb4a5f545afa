//! Validation of an endpoint's custom headers: what a client may add to every request Herald sends.
//!
//! Herald owns the headers receivers rely on for authenticity and framing, so a custom header may never
//! replace them: the Standard Webhooks headers (the whole `webhook-` prefix), the content headers, `host`,
//! `user-agent`, and the hop-by-hop headers (they describe one connection, and some — `transfer-encoding`,
//! `connection` — would change how the body is framed), and the `svix-` signature headers Herald sends in
//! Svix mode. Names are HTTP tokens, compared case-insensitively and stored as the client spelled them (Svix
//! echoes them so); values are visible ASCII with inner spaces or tabs (no CR/LF, so no header injection).

use std::collections::BTreeMap;

use herald_core::model::Headers;

use crate::error::ApiError;

/// The most custom headers an endpoint may have.
pub(crate) const MAX_HEADERS: usize = 20;
/// The longest header name.
const MAX_NAME_LEN: usize = 256;
/// The longest header value.
const MAX_VALUE_LEN: usize = 4_096;
/// The most bytes of names and values together.
const MAX_TOTAL_BYTES: usize = 16 * 1_024;

/// Names Herald sets (or that describe the connection) and a client may not.
const RESERVED: [&str; 17] = [
    "content-type",
    "content-length",
    "content-encoding",
    "host",
    "user-agent",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
    "http2-settings",
    "date",
];

/// The prefix of the Standard Webhooks headers (`webhook-id`, `webhook-timestamp`, `webhook-signature`),
/// reserved as a whole so future ones are covered too.
const RESERVED_PREFIX: &str = "webhook-";

/// The signature headers Herald sends under their Svix names when an endpoint asks for them.
const RESERVED_SVIX: [&str; 3] = ["svix-id", "svix-timestamp", "svix-signature"];

/// Names whose values are credentials: `GET …/headers` lists them under `sensitive` without the value.
const SENSITIVE: [&str; 5] = ["authorization", "cookie", "x-api-key", "x-auth-token", "api-key"];

/// Whether a header name (in any case) carries a credential.
pub(crate) fn is_sensitive(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    let name = name.as_str();
    SENSITIVE.contains(&name) || ["secret", "token", "password"].iter().any(|w| name.contains(w))
}

/// Check one header and return its name in lower case. `field` prefixes error messages.
fn check(field: &str, name: &str, value: &str) -> Result<String, ApiError> {
    let is_tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || name.len() > MAX_NAME_LEN || !name.bytes().all(is_tchar) {
        return Err(ApiError::body(
            field,
            format!("{name:?} is not a valid header name (1 to {MAX_NAME_LEN} token characters)"),
        ));
    }
    let lower = name.to_ascii_lowercase();
    if RESERVED.contains(&lower.as_str())
        || RESERVED_SVIX.contains(&lower.as_str())
        || lower.starts_with(RESERVED_PREFIX)
    {
        return Err(ApiError::body(
            &format!("{field}.{lower}"),
            "this header is set by Herald and cannot be overridden",
        ));
    }
    let visible = |b: u8| (0x21..=0x7e).contains(&b) || b == b' ' || b == b'\t';
    if value.len() > MAX_VALUE_LEN || !value.bytes().all(visible) || value.trim() != value {
        return Err(ApiError::body(
            &format!("{field}.{lower}"),
            format!(
                "the value must be at most {MAX_VALUE_LEN} visible ASCII characters (spaces and tabs \
             only inside)"
            ),
        ));
    }
    Ok(lower)
}

/// Validate a whole set of headers (as given by a client) and return it, names spelled as given.
pub(crate) fn validate(field: &str, given: &BTreeMap<String, String>) -> Result<Headers, ApiError> {
    let mut headers = Headers::new();
    for (name, value) in given {
        let lower = check(field, name, value)?;
        if remove(&mut headers, &lower) {
            return Err(ApiError::body(
                &format!("{field}.{lower}"),
                "given more than once (header names are case-insensitive)",
            ));
        }
        headers.insert(name.clone(), value.clone());
    }
    limits(field, &headers)?;
    Ok(headers)
}

/// Apply a PATCH: a value sets a header, `null` removes it; the result is validated as a whole.
pub(crate) fn merge(
    field: &str,
    current: &Headers,
    patch: &BTreeMap<String, Option<String>>,
    delete: &[String],
) -> Result<Headers, ApiError> {
    let mut headers = current.clone();
    for name in delete {
        remove(&mut headers, name);
    }
    for (name, value) in patch {
        match value {
            Some(value) => {
                let lower = check(field, name, value)?;
                remove(&mut headers, &lower);
                headers.insert(name.clone(), value.clone());
            }
            None => {
                remove(&mut headers, name);
            }
        }
    }
    limits(field, &headers)?;
    Ok(headers)
}

/// Remove the header named `name` in any case; whether there was one.
fn remove(headers: &mut Headers, name: &str) -> bool {
    let before = headers.len();
    headers.retain(|existing, _| !existing.eq_ignore_ascii_case(name));
    headers.len() != before
}

fn limits(field: &str, headers: &Headers) -> Result<(), ApiError> {
    if headers.len() > MAX_HEADERS {
        return Err(ApiError::body(
            field,
            format!("at most {MAX_HEADERS} headers, got {}", headers.len()),
        ));
    }
    let total: usize = headers.iter().map(|(n, v)| n.len() + v.len()).sum();
    if total > MAX_TOTAL_BYTES {
        return Err(ApiError::body(
            field,
            format!("names and values may total {MAX_TOTAL_BYTES} bytes, got {total}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn detail(error: ApiError) -> String {
        error.detail_text()
    }

    #[test]
    fn accepts_ordinary_headers_keeping_the_spelling_of_names() {
        let headers = validate(
            "headers",
            &map(&[("X-Tenant", "acme"), ("Authorization", "Bearer a b")]),
        )
        .unwrap();
        assert_eq!(headers.get("X-Tenant").map(String::as_str), Some("acme"));
        assert!(headers.contains_key("Authorization"));
        assert!(is_sensitive("Authorization") && is_sensitive("x-service-token") && !is_sensitive("x-tenant"));
    }

    #[test]
    fn refuses_reserved_names_naming_the_field() {
        for name in [
            "webhook-signature",
            "Webhook-Id",
            "svix-signature",
            "Svix-Id",
            "webhook-timestamp",
            "content-type",
            "Content-Length",
            "host",
            "user-agent",
            "transfer-encoding",
            "connection",
        ] {
            let error = detail(validate("headers", &map(&[(name, "x")])).unwrap_err());
            assert!(
                error.contains(&format!("headers.{}", name.to_ascii_lowercase())),
                "{name}: {error}"
            );
        }
    }

    #[test]
    fn refuses_bad_names_values_and_too_many() {
        for (name, value) in [
            ("", "x"),
            ("x y", "x"),
            ("x:y", "x"),
            ("x-a", "line\r\nx-injected: 1"),
            ("x-a", "caf\u{e9}"),
            ("x-a", " padded"),
        ] {
            assert!(
                validate("headers", &map(&[(name, value)])).is_err(),
                "{name:?}: {value:?}"
            );
        }
        assert!(validate("headers", &map(&[("X-A", "1"), ("x-a", "2")])).is_err());
        let many: BTreeMap<String, String> = (0..=MAX_HEADERS).map(|i| (format!("x-{i}"), "v".to_owned())).collect();
        assert!(detail(validate("headers", &many).unwrap_err()).contains("at most"));
        let long = "v".repeat(MAX_VALUE_LEN + 1);
        assert!(validate("headers", &map(&[("x-a", &long)])).is_err());
    }

    #[test]
    fn merge_sets_replaces_and_removes_in_any_case() {
        let current = validate("headers", &map(&[("x-a", "1"), ("x-b", "2"), ("X-D", "4")])).unwrap();
        let patch = BTreeMap::from([
            ("X-A".to_owned(), None),
            ("x-c".to_owned(), Some("3".to_owned())),
            ("X-B".to_owned(), Some("5".to_owned())),
        ]);
        let merged = merge("headers", &current, &patch, &["x-d".to_owned()]).unwrap();
        assert_eq!(merged, map(&[("X-B", "5"), ("x-c", "3")]));
        let bad = BTreeMap::from([("webhook-id".to_owned(), Some("forged".to_owned()))]);
        assert!(merge("headers", &current, &bad, &[]).is_err());
    }
}
