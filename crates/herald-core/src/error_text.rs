//! One line for an error and its causes.
//!
//! HTTP client errors (hyper, reqwest) say only the outermost layer ("error sending request"); what went
//! wrong (refused, reset, a TLS failure) is in their sources. Every outbound client of Herald — the
//! delivery client, the inbox's forwarder, the outbox relay — logs and records the whole chain, written
//! here once.

/// `error` followed by each of its causes, separated by `": "`.
pub fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::with_causes;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("inner")]
    struct Inner(#[source] std::io::Error);

    #[test]
    fn every_cause_is_on_the_line() {
        let error = Outer(Inner(std::io::Error::other("refused")));
        assert_eq!(with_causes(&error), "outer: inner: refused");
        assert_eq!(with_causes(&std::io::Error::other("alone")), "alone");
    }
}
