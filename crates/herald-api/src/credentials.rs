//! Basic-auth credentials in an endpoint URL (`https://user:password@host/hook`).
//!
//! Svix accepts them, so Herald does too, but it never keeps them in the URL: the URL is stored in
//! clear, listed by the API, shown on the dashboard and written to logs and attempt records. Instead
//! the credentials become the endpoint's `Authorization: Basic …` custom header, which is sealed at rest
//! with the other secrets and listed without its value (see docs/security.md). The receiver sees exactly
//! what it would have seen from a client that sent the userinfo itself.

use base64::Engine as _;
use percent_encoding::percent_decode_str;
use url::Url;

/// Remove the userinfo from `url`, answering it as an `Authorization` header value (`Basic`, with the
/// percent-decoded `user:password` encoded in base64), or `None` when the URL has none.
pub(crate) fn take_basic_auth(url: &mut Url) -> Option<String> {
    if url.username().is_empty() && url.password().is_none() {
        return None;
    }
    let decode = |text: &str| percent_decode_str(text).collect::<Vec<u8>>();
    let mut pair = decode(url.username());
    pair.push(b':');
    pair.extend(decode(url.password().unwrap_or("")));
    // Only fails for URLs that cannot carry userinfo, which this one did.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    Some(format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(&pair)
    ))
}

/// Whether a URL as given by a client holds userinfo.
pub(crate) fn has_userinfo(text: &str) -> bool {
    Url::parse(text).is_ok_and(|url| !url.username().is_empty() || url.password().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_becomes_a_basic_header_and_leaves_the_url() {
        let mut url = Url::parse("https://al%40ice:s%3Acret%20pw@example.com/hook?x=1").expect("url");
        let header = take_basic_auth(&mut url).expect("credentials");
        assert_eq!(url.as_str(), "https://example.com/hook?x=1");
        let encoded = header.strip_prefix("Basic ").expect("basic");
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .expect("base64");
        assert_eq!(decoded, b"al@ice:s:cret pw");
    }

    #[test]
    fn a_user_alone_counts_and_none_is_none() {
        let mut url = Url::parse("https://token@example.com/").expect("url");
        assert!(take_basic_auth(&mut url).is_some());
        assert!(!has_userinfo(url.as_str()));
        let mut plain = Url::parse("https://example.com/").expect("url");
        assert_eq!(take_basic_auth(&mut plain), None);
        assert!(has_userinfo("https://u:p@example.com/"));
    }
}
