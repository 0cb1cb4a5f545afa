//! Prefixed, time-ordered identifiers (`app_…`, `ep_…`, `msg_…`, `atmpt_…`, `evt_…`, `sink_…`).
//!
//! An id is a type prefix followed by 22 base62 characters encoding a UUIDv7. UUIDv7 starts with a
//! millisecond timestamp and `uuid` keeps it monotonic within a process, and the encoding is fixed-width
//! over an alphabet in ASCII order, so sorting ids as strings sorts them by creation time. That lets
//! listings page by id alone ("newest first" is `ORDER BY id DESC`) without a second time column.

use crate::clock::Millis;

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

/// The kind of object an [`Id`] names, as a type: [`App`], [`Endpoint`], [`Message`], [`Attempt`], [`Task`],
/// [`Sink`], [`InboxEvent`]. Each is a type without values; it only tells ids of one kind from those of another.
pub trait Kind: 'static {
    /// The kind, with its prefix.
    const KIND: IdKind;
}

macro_rules! kinds {
    ($($(#[$doc:meta])* $marker:ident = $kind:ident, $alias:ident;)*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $marker {}

        impl Kind for $marker {
            const KIND: IdKind = IdKind::$kind;
        }

        $(#[$doc])*
        pub type $alias = Id<$marker>;
    )*};
}

kinds! {
    /// An application's id, `app_…`.
    App = Application, AppId;
    /// An endpoint's id, `ep_…`.
    Endpoint = Endpoint, EndpointId;
    /// A message's id, `msg_…`.
    Message = Message, MessageId;
    /// A delivery attempt's id, `atmpt_…`.
    Attempt = Attempt, AttemptId;
    /// A background task's id, `qtask_…`.
    Task = Task, TaskId;
    /// A polling endpoint's id, `sink_…`.
    Sink = PollingEndpoint, SinkId;
    /// The id `herald inbox` gives an event it received, `evt_…`.
    InboxEvent = InboxEvent, InboxEventId;
}

/// A text that is not an id of the kind expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not an id of the form {prefix}… (the prefix and 22 letters or digits)")]
pub struct NotAnId {
    /// The prefix expected.
    pub prefix: &'static str,
    /// The text given.
    pub text: String,
}

/// The id of one object of kind `K`: its prefix and 22 base62 characters, checked when it is made from
/// text ([`Id::parse`]), so an endpoint's id cannot be passed where an application's is expected and a
/// value of this type is always well-formed.
///
/// It dereferences to `str` because an id is read as text far more often than it is made (SQL binds,
/// log fields, JSON, map keys by `&str`): the type guards where ids are *accepted*, not where they are
/// printed. The text is shared, so a clone (an endpoint's id on each of its deliveries, a map key) costs
/// no copy.
pub struct Id<K> {
    text: std::sync::Arc<str>,
    kind: std::marker::PhantomData<K>,
}

impl<K: Kind> Id<K> {
    /// A new id, ordered after every id of any kind this process made before.
    #[allow(clippy::new_without_default)] // a default id would be a fresh one: better said out loud
    pub fn new() -> Self {
        Self {
            // Spelled on the stack: the shared text is the id's one allocation.
            text: Spelled::fresh(K::KIND).as_str().into(),
            kind: std::marker::PhantomData,
        }
    }

    /// The id `text` spells, if it is one of this kind.
    pub fn parse(text: &str) -> Result<Self, NotAnId> {
        Self::try_from(text.to_owned())
    }

    /// The smallest id of this kind that can have been made at or after `at` (see [`lower_bound`]).
    pub fn lower_bound(at: Millis) -> Self {
        Self::trusted(lower_bound(K::KIND, at))
    }

    fn trusted(text: String) -> Self {
        Self {
            text: text.into(),
            kind: std::marker::PhantomData,
        }
    }
}

impl<K> Id<K> {
    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The id's text, shared with this id: a bound SQL value or a map key that holds it costs no copy.
    pub fn shared(&self) -> std::sync::Arc<str> {
        std::sync::Arc::clone(&self.text)
    }

    /// The id as owned text.
    pub fn into_string(self) -> String {
        self.text.to_string()
    }
}

impl<K: Kind> TryFrom<String> for Id<K> {
    type Error = NotAnId;

    fn try_from(text: String) -> Result<Self, NotAnId> {
        if K::KIND.matches(&text) {
            Ok(Self::trusted(text))
        } else {
            Err(NotAnId {
                prefix: K::KIND.prefix(),
                text,
            })
        }
    }
}

impl<K: Kind> std::str::FromStr for Id<K> {
    type Err = NotAnId;

    fn from_str(text: &str) -> Result<Self, NotAnId> {
        Self::parse(text)
    }
}

impl<K> std::ops::Deref for Id<K> {
    type Target = str;

    fn deref(&self) -> &str {
        &self.text
    }
}

impl<K> AsRef<str> for Id<K> {
    fn as_ref(&self) -> &str {
        &self.text
    }
}

impl<K> std::borrow::Borrow<str> for Id<K> {
    fn borrow(&self) -> &str {
        &self.text
    }
}

impl<K> From<Id<K>> for String {
    fn from(id: Id<K>) -> String {
        id.into_string()
    }
}

// Written out instead of derived: a derive would ask `K` (a type without values) for each trait.
impl<K> Clone for Id<K> {
    fn clone(&self) -> Self {
        Self {
            text: self.text.clone(),
            kind: std::marker::PhantomData,
        }
    }
}

impl<K> PartialEq for Id<K> {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl<K> Eq for Id<K> {}

impl<K> PartialEq<str> for Id<K> {
    fn eq(&self, other: &str) -> bool {
        &*self.text == other
    }
}

impl<K> PartialEq<&str> for Id<K> {
    fn eq(&self, other: &&str) -> bool {
        &*self.text == *other
    }
}

impl<K> PartialOrd for Id<K> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<K> Ord for Id<K> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.text.cmp(&other.text)
    }
}

impl<K> std::hash::Hash for Id<K> {
    // The same hash as the text's, which `Borrow<str>` requires (maps keyed by id looked up by `&str`).
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.text.hash(state);
    }
}

impl<K> std::fmt::Debug for Id<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.text, f)
    }
}

impl<K> std::fmt::Display for Id<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl<K> serde::Serialize for Id<K> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de, K: Kind> serde::Deserialize<'de> for Id<K> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::try_from(text).map_err(serde::de::Error::custom)
    }
}

/// An application named by its id or its uid.
pub type AppIdOrUid = IdOrUid<App>;
/// An endpoint named by its id or its uid (within its application).
pub type EndpointIdOrUid = IdOrUid<Endpoint>;
/// A polling endpoint named by its id or its uid (within its application).
pub type SinkIdOrUid = IdOrUid<Sink>;
/// A message named by its id or by the producer's `eventId` (within its application): the event id is
/// to a message what a uid is to an application.
pub type MessageIdOrEventId = IdOrUid<Message>;

/// What the API accepts where an object may be named by its id or by the `uid` its client gave it
/// (applications, endpoints, polling endpoints). Which of the two a text is cannot be told for sure —
/// a uid may look like an id — so it stays text and the store matches it against both columns; the type
/// says which kind of object it names.
pub struct IdOrUid<K> {
    text: String,
    kind: std::marker::PhantomData<K>,
}

impl<K: Kind> IdOrUid<K> {
    /// The object named `text` (an id or a uid).
    pub fn new(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            kind: std::marker::PhantomData,
        }
    }
}

impl<K> IdOrUid<K> {
    /// The text as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

// Any text may name an object (a uid is the client's choice), so reading one never fails: a path segment
// or a field that names nothing is the lookup's to answer, as an id nobody has is.
impl<'de, K: Kind> serde::Deserialize<'de> for IdOrUid<K> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self::new)
    }
}

impl<K: Kind> From<&Id<K>> for IdOrUid<K> {
    fn from(id: &Id<K>) -> Self {
        Self::new(id.as_str())
    }
}

impl<K> Clone for IdOrUid<K> {
    fn clone(&self) -> Self {
        Self {
            text: self.text.clone(),
            kind: std::marker::PhantomData,
        }
    }
}

impl<K> std::fmt::Debug for IdOrUid<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.text, f)
    }
}

impl<K> std::fmt::Display for IdOrUid<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
/// 62^22 > 2^128, so every u128 fits in 22 characters.
const ENCODED_LEN: usize = 22;

/// A new id of the given kind, ordered after every id this process made before.
pub fn new_id(kind: IdKind) -> String {
    Spelled::fresh(kind).as_str().to_owned()
}

/// The longest prefix of any [`IdKind`] (checked below, when the crate compiles).
const MAX_PREFIX_LEN: usize = 6;

/// Every kind, for the check that each prefix fits [`Spelled`]'s buffer.
const ALL_KINDS: [IdKind; 7] = [
    IdKind::Application,
    IdKind::Endpoint,
    IdKind::Message,
    IdKind::Attempt,
    IdKind::Task,
    IdKind::InboxEvent,
    IdKind::PollingEndpoint,
];

const _: () = {
    let mut i = 0;
    while i < ALL_KINDS.len() {
        // Exhaustive on purpose: a kind added to `IdKind` stops the build here until it is listed in
        // `ALL_KINDS` (and its prefix checked).
        match ALL_KINDS[i] {
            IdKind::Application
            | IdKind::Endpoint
            | IdKind::Message
            | IdKind::Attempt
            | IdKind::Task
            | IdKind::InboxEvent
            | IdKind::PollingEndpoint => {}
        }
        assert!(
            ALL_KINDS[i].prefix().len() <= MAX_PREFIX_LEN,
            "an id prefix is longer than MAX_PREFIX_LEN"
        );
        i += 1;
    }
};

/// An id's text spelled on the stack, so that making an id allocates only where its text is kept.
struct Spelled {
    bytes: [u8; MAX_PREFIX_LEN + ENCODED_LEN],
    len: usize,
}

impl Spelled {
    /// `kind`'s prefix and `value` in base62.
    fn new(kind: IdKind, value: u128) -> Self {
        let prefix = kind.prefix().as_bytes();
        let mut bytes = [0; MAX_PREFIX_LEN + ENCODED_LEN];
        bytes[..prefix.len()].copy_from_slice(prefix);
        let len = prefix.len() + ENCODED_LEN;
        encode_base62_into(value, &mut bytes[prefix.len()..len]);
        Self { bytes, len }
    }

    /// A new id of `kind`, ordered after every id this process made before (UUIDv7).
    fn fresh(kind: IdKind) -> Self {
        Self::new(kind, uuid::Uuid::now_v7().as_u128())
    }

    fn as_str(&self) -> &str {
        // Only prefixes (ASCII) and base62 digits (ASCII) were written.
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }
}

/// The smallest id of this kind that can have been made at or after `at`: every id made from that
/// millisecond on sorts at or after it, every id made before sorts before it. Lets a store bound a range
/// of ids by time.
pub fn lower_bound(kind: IdKind, at: Millis) -> String {
    // A UUIDv7 keeps its 48-bit millisecond timestamp in the top bits.
    let ms = u128::try_from(at.as_unix_ms().max(0)).unwrap_or(0) & ((1 << 48) - 1);
    Spelled::new(kind, ms << 80).as_str().to_owned()
}

/// `value` in base62, most significant digit first, filling `out` (22 digits hold every u128).
fn encode_base62_into(mut value: u128, out: &mut [u8]) {
    for slot in out.iter_mut().rev() {
        *slot = ALPHABET[(value % 62) as usize];
        value /= 62;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `value`'s 22 digits alone.
    fn encode_base62(value: u128) -> String {
        let mut buf = [b'0'; ENCODED_LEN];
        encode_base62_into(value, &mut buf);
        buf.iter().map(|&b| b as char).collect()
    }

    #[test]
    fn a_lower_bound_separates_ids_by_time() {
        let before = crate::clock::now();
        let id = new_id(IdKind::Attempt);
        let after = crate::clock::now();
        assert!(lower_bound(IdKind::Attempt, before) <= id, "{id}");
        assert!(lower_bound(IdKind::Attempt, after.add_ms(1)) > id, "{id}");
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
    fn every_kind_is_spelled_whole_on_the_stack() {
        for kind in ALL_KINDS {
            for value in [0, 61, u128::MAX] {
                let spelled = Spelled::new(kind, value);
                assert!(kind.matches(spelled.as_str()), "{}", spelled.as_str());
                assert_eq!(&spelled.as_str()[kind.prefix().len()..], encode_base62(value));
            }
        }
        assert!(MessageId::new().starts_with("msg_"));
        assert!(IdKind::Task.matches(&TaskId::new()));
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
    fn a_typed_id_parses_prints_and_checks_its_prefix() {
        let id = EndpointId::new();
        assert!(id.starts_with("ep_"));
        assert_eq!(EndpointId::parse(&format!("{id}")), Ok(id.clone()));
        assert_eq!(id.as_str().parse::<EndpointId>(), Ok(id.clone()));
        let wrong = AppId::parse(&id).unwrap_err();
        assert_eq!(wrong.prefix, "app_");
        assert!(wrong.to_string().contains(id.as_str()), "{wrong}");
        assert!(MessageId::parse("msg_short").is_err());
        assert!(MessageId::parse("").is_err());
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, format!("\"{id}\""));
        assert_eq!(serde_json::from_str::<EndpointId>(&json).unwrap(), id);
        assert!(serde_json::from_str::<AppId>(&json).is_err());
        // A map keyed by ids is looked up by text.
        let map = std::collections::HashMap::from([(id.clone(), 1)]);
        assert_eq!(map.get(id.as_str()), Some(&1));
        assert!(AttemptId::lower_bound(Millis::EPOCH) < AttemptId::new());
    }

    #[test]
    fn an_id_or_uid_reads_any_text_as_given() {
        let id = AppId::new();
        let json = serde_json::to_string(id.as_str()).unwrap();
        assert_eq!(serde_json::from_str::<AppIdOrUid>(&json).unwrap().as_str(), id.as_str());
        // A uid, even one shaped like another kind's id, is kept for the store to match.
        let endpoint_shaped = serde_json::to_string(EndpointId::new().as_str()).unwrap();
        let named: AppIdOrUid = serde_json::from_str(&endpoint_shaped).unwrap();
        assert_eq!(serde_json::to_string(named.as_str()).unwrap(), endpoint_shaped);
        assert_eq!(
            serde_json::from_str::<AppIdOrUid>(r#""acme""#).unwrap().as_str(),
            "acme"
        );
        assert!(serde_json::from_str::<AppIdOrUid>("1").is_err());
    }

    #[test]
    fn base62_is_order_preserving() {
        assert_eq!(encode_base62(0), "0".repeat(ENCODED_LEN));
        assert!(encode_base62(61) < encode_base62(62));
        assert!(encode_base62(u128::MAX - 1) < encode_base62(u128::MAX));
    }
}
