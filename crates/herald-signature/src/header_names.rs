//! Under which names a sender puts the three signature headers.
//!
//! Standard Webhooks names them `webhook-id`, `webhook-timestamp` and `webhook-signature`; Svix sends the
//! same values as `svix-id`, `svix-timestamp` and `svix-signature`, and receivers written against Svix
//! often read those by hand. A sender switching from Svix keeps such receivers working by sending the
//! Svix names, or both sets (the values, and so the signature, are the same in every set).

use std::fmt;
use std::str::FromStr;

use crate::{HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP};

/// Svix's name for the message id header.
pub const SVIX_HEADER_ID: &str = "svix-id";
/// Svix's name for the timestamp header.
pub const SVIX_HEADER_TIMESTAMP: &str = "svix-timestamp";
/// Svix's name for the signature header.
pub const SVIX_HEADER_SIGNATURE: &str = "svix-signature";

/// One set of names: id, timestamp, signature.
pub type HeaderSet = [&'static str; 3];

const WEBHOOK_SET: HeaderSet = [HEADER_ID, HEADER_TIMESTAMP, HEADER_SIGNATURE];
const SVIX_SET: HeaderSet = [SVIX_HEADER_ID, SVIX_HEADER_TIMESTAMP, SVIX_HEADER_SIGNATURE];

/// Which names the signature headers are sent under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderNames {
    /// `webhook-*` (Standard Webhooks), the default.
    #[default]
    Webhook,
    /// `svix-*`, as Svix sends them.
    Svix,
    /// Both sets, with the same values.
    Both,
}

impl HeaderNames {
    /// Every choice, in the order documentation lists them.
    pub const ALL: [HeaderNames; 3] = [HeaderNames::Webhook, HeaderNames::Svix, HeaderNames::Both];

    /// The sets of names to send.
    pub fn sets(self) -> &'static [HeaderSet] {
        match self {
            HeaderNames::Webhook => &[WEBHOOK_SET],
            HeaderNames::Svix => &[SVIX_SET],
            HeaderNames::Both => &[WEBHOOK_SET, SVIX_SET],
        }
    }

    /// The setting's spelling: `webhook`, `svix` or `both`.
    pub fn as_str(self) -> &'static str {
        match self {
            HeaderNames::Webhook => "webhook",
            HeaderNames::Svix => "svix",
            HeaderNames::Both => "both",
        }
    }
}

impl fmt::Display for HeaderNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The text was none of `webhook`, `svix`, `both`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected webhook, svix or both, got {0:?}")]
pub struct UnknownHeaderNames(pub String);

impl FromStr for HeaderNames {
    type Err = UnknownHeaderNames;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        HeaderNames::ALL
            .into_iter()
            .find(|names| names.as_str() == text)
            .ok_or_else(|| UnknownHeaderNames(text.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_choice_names_its_sets_and_parses_back() {
        assert_eq!(HeaderNames::default().sets(), &[WEBHOOK_SET]);
        assert_eq!(HeaderNames::Svix.sets()[0][2], "svix-signature");
        assert_eq!(HeaderNames::Both.sets().len(), 2);
        for names in HeaderNames::ALL {
            assert_eq!(names.as_str().parse::<HeaderNames>(), Ok(names));
        }
        assert!("Svix".parse::<HeaderNames>().is_err());
    }
}
