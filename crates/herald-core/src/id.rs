//! Prefixed, time-ordered identifiers (`app_…`, `ep_…`, `msg_…`, `atmpt_…`, `evt_…`, `sink_…`).
//!
//! An id is a type prefix followed by 22 base62 characters encoding a UUIDv7. UUIDv7 starts with a
//! millisecond timestamp and `uuid` keeps it monotonic within a process, and the encoding is fixed-width
//! over an alphabet in ASCII order, so sorting ids as strings sorts them by creation time. That lets
//! listings page by id alone ("newest first" is `ORDER BY id DESC`) without a second time column.

/// The kinds of object that get an id, each with its own prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    /// An application (tenant): `app_`.
    Application,
    /// An endpoint: `ep_`.
    Endpoint,
    /// A message: `msg_`.
    Message,
    /// A delivery attempt: `atmpt_`.
    Attempt,
    /// A background task: `qtask_`.
    Task,
    /// An event received by `herald inbox`: `evt_`.
    InboxEvent,
    /// A polling endpoint (a "sink" in the SDKs' paths): `sink_`.
    PollingEndpoint,
}

impl IdKind {
    /// The prefix, including the trailing underscore.
    pub const fn prefix(self) -> &'static str {
        match self {
            IdKind::Application => "app_",
            IdKind::Endpoint => "ep_",
            IdKind::Message => "msg_",
            IdKind::Attempt => "atmpt_",
            IdKind::Task => "qtask_",
            IdKind::InboxEvent => "evt_",
            IdKind::PollingEndpoint => "sink_",
        }
    }

    /// Whether `s` looks like an id of this kind (prefix plus 22 base62 characters).
    ///
    /// Used to tell an id from a user-chosen `uid` when both are accepted in the same path segment.
    pub fn matches(self, s: &str) -> bool {
        s.strip_prefix(self.prefix())
            .is_some_and(|rest| rest.len() == ENCODED_LEN && rest.bytes().all(|b| b.is_ascii_alphanumeric()))
    }
}

const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
/// 62^22 > 2^128, so every u128 fits in 22 characters.
const ENCODED_LEN: usize = 22;

/// A new id of the given kind, ordered after every id this process made before.
pub fn new_id(kind: IdKind) -> String {
    let value = uuid::Uuid::now_v7().as_u128();
    let mut out = String::with_capacity(kind.prefix().len() + ENCODED_LEN);
    out.push_str(kind.prefix());
    out.push_str(&encode_base62(value));
    out
}

/// The smallest id of this kind that can have been made at or after `unix_ms`: every id made from that
/// millisecond on sorts at or after it, every id made before sorts before it. Lets a store bound a range
/// of ids by time.
pub fn lower_bound(kind: IdKind, unix_ms: i64) -> String {
    // A UUIDv7 keeps its 48-bit millisecond timestamp in the top bits.
    let ms = u128::try_from(unix_ms.max(0)).unwrap_or(0) & ((1 << 48) - 1);
    format!("{}{}", kind.prefix(), encode_base62(ms << 80))
}

fn encode_base62(mut value: u128) -> String {
    let mut buf = [b'0'; ENCODED_LEN];
    for slot in buf.iter_mut().rev() {
        *slot = ALPHABET[(value % 62) as usize];
        value /= 62;
    }
    // The buffer only ever holds bytes from ALPHABET, which is ASCII.
    buf.iter().map(|&b| b as char).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lower_bound_separates_ids_by_time() {
        let before = crate::clock::now_ms();
        let id = new_id(IdKind::Attempt);
        let after = crate::clock::now_ms();
        assert!(lower_bound(IdKind::Attempt, before) <= id, "{id}");
        assert!(lower_bound(IdKind::Attempt, after + 1) > id, "{id}");
        assert!(IdKind::Attempt.matches(&lower_bound(IdKind::Attempt, before)));
    }

    #[test]
    fn ids_have_prefix_and_fixed_width() {
        let id = new_id(IdKind::Message);
        assert!(id.starts_with("msg_"));
        assert_eq!(id.len(), 4 + ENCODED_LEN);
        assert!(IdKind::Message.matches(&id));
        assert!(!IdKind::Endpoint.matches(&id));
        assert!(!IdKind::Message.matches("msg_short"));
    }

    #[test]
    fn ids_sort_in_creation_order() {
        let ids: Vec<String> = (0..2000).map(|_| new_id(IdKind::Attempt)).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
        let unique: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len());
    }

    #[test]
    fn base62_is_order_preserving() {
        assert_eq!(encode_base62(0), "0".repeat(ENCODED_LEN));
        assert!(encode_base62(61) < encode_base62(62));
        assert!(encode_base62(u128::MAX - 1) < encode_base62(u128::MAX));
    }
}
