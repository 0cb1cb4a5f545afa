//! Keeping passwords out of everything Herald prints: help texts, logs, error messages, `Debug` output.
//!
//! Configured URLs (the database, the inbox database, the operational webhook, the egress proxy, the
//! OTLP collector) may carry a password, in the userinfo (`postgres://user:pw@host/db`) or as a
//! `password=` parameter (`?password=pw`, libpq's key/value form `host=… password=pw`). [`url()`] masks
//! all of those; [`SecretUrl`] holds such a URL and only ever shows it masked.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What replaces a password.
pub const MASK: &str = "***";

/// Parameter names whose values are credentials, in a query string or a key/value connection string.
const SECRET_PARAMS: [&str; 6] = ["password", "passwd", "pwd", "secret", "token", "sslpassword"];

fn is_secret_param(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    SECRET_PARAMS.contains(&lower.as_str())
}

/// `text` with every password in it replaced by [`MASK`]: the userinfo password of a URL, credential
/// query parameters, and `password=` pairs of a key/value connection string. Text that holds none is
/// returned unchanged.
pub fn url(text: &str) -> String {
    match url::Url::parse(text) {
        Ok(parsed) if parsed.has_host() => {
            let secret_query = parsed.query_pairs().any(|(name, _)| is_secret_param(&name));
            if parsed.password().is_some() || secret_query {
                url_form(parsed)
            } else {
                text.to_owned()
            }
        }
        _ => key_value_form(text),
    }
}

/// `text` with only a URL's userinfo password masked (query parameters kept): for endpoint URLs, whose
/// query strings are the receiver's business and must read back as they were given.
pub fn userinfo(text: &str) -> String {
    match url::Url::parse(text) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some(MASK));
            parsed.to_string()
        }
        _ => text.to_owned(),
    }
}

/// Free text (a log line, a `Debug` dump) with the password of every URL in it masked: whatever stands
/// between `scheme://user:` and the `@` that ends the authority.
pub fn in_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("://") {
        let (before, after) = rest.split_at(start + 3);
        out.push_str(before);
        let authority_end = after
            .find(['/', '?', '#', '"', '\'', ' ', '\t', '\n', ')', ',', '>'])
            .unwrap_or(after.len());
        let authority = &after[..authority_end];
        match authority
            .rfind('@')
            .and_then(|at| authority[..at].find(':').map(|colon| (colon, at)))
        {
            Some((colon, at)) => {
                out.push_str(&authority[..=colon]);
                out.push_str(MASK);
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &after[authority_end..];
    }
    out.push_str(rest);
    out
}

fn url_form(mut parsed: url::Url) -> String {
    if parsed.password().is_some() {
        // Only fails for URLs that cannot have a password, which this one has.
        let _ = parsed.set_password(Some(MASK));
    }
    if parsed.query().is_some() {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(name, value)| {
                let value = if is_secret_param(&name) {
                    MASK.to_owned()
                } else {
                    value.into_owned()
                };
                (name.into_owned(), value)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

/// libpq's `host=db user=u password='p w'` form: mask each credential's value (quoted or not).
fn key_value_form(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(eq) = rest.find('=') {
        let (before, after) = rest.split_at(eq);
        let name = before.rsplit(|c: char| c.is_whitespace()).next().unwrap_or("");
        out.push_str(before);
        out.push('=');
        let after = &after[1..];
        let end = value_end(after);
        if is_secret_param(name.trim()) {
            out.push_str(MASK);
        } else {
            out.push_str(&after[..end]);
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Where a key/value connection string's value starting `text` ends (after its closing quote, or at
/// the next whitespace).
fn value_end(text: &str) -> usize {
    let trimmed = text.trim_start();
    let lead = text.len() - trimmed.len();
    if let Some(quoted) = trimmed.strip_prefix('\'') {
        let mut escaped = false;
        for (i, c) in quoted.char_indices() {
            match c {
                '\\' if !escaped => escaped = true,
                '\'' if !escaped => return lead + 1 + i + 1,
                _ => escaped = false,
            }
        }
        return text.len();
    }
    lead + trimmed.find(char::is_whitespace).unwrap_or(trimmed.len())
}

/// A configured URL that may hold a password: `Debug` and `Display` show it masked (see [`url()`]);
/// [`SecretUrl::expose`] gives the real one, to connect with.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// Wrap a URL.
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The URL with its password: only for connecting, never for printing.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether it is empty (not configured).
    pub fn is_empty(&self) -> bool {
        self.0.trim().is_empty()
    }
}

impl From<String> for SecretUrl {
    fn from(url: String) -> Self {
        Self(url)
    }
}

impl From<&str> for SecretUrl {
    fn from(url: &str) -> Self {
        Self(url.to_owned())
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", url(&self.0))
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&url(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked_in_every_form() {
        assert_eq!(
            url("postgres://herald:hunter2@db:5432/herald"),
            "postgres://herald:***@db:5432/herald"
        );
        assert_eq!(
            url("postgres://db/herald?user=h&password=hunter2&sslmode=require"),
            "postgres://db/herald?user=h&password=***&sslmode=require"
        );
        assert_eq!(
            url("http://proxy:hunter2@10.0.0.1:3128"),
            "http://proxy:***@10.0.0.1:3128/"
        );
        assert_eq!(
            url("host=db user=h password=hunter2 dbname=x"),
            "host=db user=h password=*** dbname=x"
        );
        assert_eq!(
            url("host=db password='hun ter\\'2' dbname=x"),
            "host=db password=*** dbname=x"
        );
    }

    #[test]
    fn passwords_in_free_text_are_masked() {
        assert_eq!(
            in_text(r#"Some(Export { url: "https://u:pw@otel.example/v1", x: "a://b" })"#),
            r#"Some(Export { url: "https://u:***@otel.example/v1", x: "a://b" })"#
        );
        assert_eq!(in_text("no urls here"), "no urls here");
        assert_eq!(
            in_text("http://user@host/ only a user"),
            "http://user@host/ only a user"
        );
    }

    #[test]
    fn userinfo_masks_only_the_password() {
        assert_eq!(
            userinfo("https://u:pw@h.example/x?token=t"),
            "https://u:***@h.example/x?token=t"
        );
        assert_eq!(userinfo("https://h.example/x?token=t"), "https://h.example/x?token=t");
    }

    #[test]
    fn text_without_a_password_is_unchanged() {
        for text in [
            "sqlite://./herald.db",
            "sqlite:/var/lib/herald.db?mode=rwc",
            "postgres://h@db/x",
            "",
        ] {
            assert_eq!(url(text), text);
        }
    }

    #[test]
    fn a_secret_url_never_prints_its_password() {
        let secret = SecretUrl::new("postgres://u:hunter2@db/x");
        assert!(!format!("{secret:?} {secret}").contains("hunter2"));
        assert_eq!(secret.expose(), "postgres://u:hunter2@db/x");
    }
}
