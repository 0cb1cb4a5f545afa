//! A statement written once for both SQL dialects: its text, with `$n` placeholders (sqlx's SQLite driver
//! reads them as PostgreSQL does), and its binds as a list of [`Arg`]s that each dialect binds to its own
//! driver (see [`crate::dialect`]). Binding goes through a list instead of sqlx's generic `Encode` bounds
//! so that the portable code stays free of per-type trait bounds; the cost is one small vector per
//! statement, nothing next to a round trip.

use std::borrow::Cow;

/// One bind parameter of a portable statement.
#[derive(Debug, Clone)]
pub(crate) enum Arg<'a> {
    /// Text the store itself makes (ids, names it validated, JSON it encoded): bound as it is.
    Text(Option<Cow<'a, str>>),
    /// Free text: anything a client or a receiver chose, which may hold any character. PostgreSQL's
    /// `text` cannot hold NUL, so that dialect binds it escaped (see `crate::text`).
    Free(Option<Cow<'a, str>>),
    /// An integer.
    Int(Option<i64>),
    /// A boolean.
    Bool(Option<bool>),
    /// Bytes.
    Bytes(Cow<'a, [u8]>),
    /// A list of integers, read by a [`crate::dialect::Dialect::in_list`] condition or a
    /// [`crate::dialect::Dialect::list_rows`] table: PostgreSQL binds an array, SQLite a JSON array. One
    /// placeholder whatever its length, so a statement over many rows is one text on both dialects (no
    /// chunks, one prepared statement).
    Ints(Cow<'a, [i64]>),
    /// A list of text the store itself makes (ids), bound as [`Arg::Ints`] is.
    Texts(Vec<&'a str>),
}

impl<'a> Arg<'a> {
    /// Free text (see [`Arg::Free`]).
    pub(crate) fn free(text: &'a str) -> Self {
        Arg::Free(Some(Cow::Borrowed(text)))
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(value: &'a str) -> Self {
        Arg::Text(Some(Cow::Borrowed(value)))
    }
}

impl<'a> From<&'a String> for Arg<'a> {
    fn from(value: &'a String) -> Self {
        Arg::Text(Some(Cow::Borrowed(value)))
    }
}

impl From<String> for Arg<'_> {
    fn from(value: String) -> Self {
        Arg::Text(Some(Cow::Owned(value)))
    }
}

impl<'a> From<Option<&'a str>> for Arg<'a> {
    fn from(value: Option<&'a str>) -> Self {
        Arg::Text(value.map(Cow::Borrowed))
    }
}

impl<'a> From<&'a Option<String>> for Arg<'a> {
    fn from(value: &'a Option<String>) -> Self {
        Arg::Text(value.as_deref().map(Cow::Borrowed))
    }
}

impl From<Option<String>> for Arg<'_> {
    fn from(value: Option<String>) -> Self {
        Arg::Text(value.map(Cow::Owned))
    }
}

// An id is checked when it is made (`herald_core::id`): prefix and base62 only, so it is bound as it is.
impl<'a, K> From<&'a herald_core::id::Id<K>> for Arg<'a> {
    fn from(value: &'a herald_core::id::Id<K>) -> Self {
        Arg::Text(Some(Cow::Borrowed(value.as_str())))
    }
}

impl<'a, K> From<Option<&'a herald_core::id::Id<K>>> for Arg<'a> {
    fn from(value: Option<&'a herald_core::id::Id<K>>) -> Self {
        Arg::Text(value.map(|id| Cow::Borrowed(id.as_str())))
    }
}

impl<'a, K> From<&'a Option<herald_core::id::Id<K>>> for Arg<'a> {
    fn from(value: &'a Option<herald_core::id::Id<K>>) -> Self {
        Self::from(value.as_ref())
    }
}

// An id or a uid is what a client sent: free text until the store has matched it.
impl<'a, K> From<&'a herald_core::id::IdOrUid<K>> for Arg<'a> {
    fn from(value: &'a herald_core::id::IdOrUid<K>) -> Self {
        Arg::Free(Some(Cow::Borrowed(value.as_str())))
    }
}

impl From<i64> for Arg<'_> {
    fn from(value: i64) -> Self {
        Arg::Int(Some(value))
    }
}

// A moment is stored as integer Unix milliseconds on both dialects.
impl From<herald_core::clock::Millis> for Arg<'_> {
    fn from(value: herald_core::clock::Millis) -> Self {
        Arg::Int(Some(value.as_unix_ms()))
    }
}

impl From<Option<herald_core::clock::Millis>> for Arg<'_> {
    fn from(value: Option<herald_core::clock::Millis>) -> Self {
        Arg::Int(value.map(herald_core::clock::Millis::as_unix_ms))
    }
}

impl From<i32> for Arg<'_> {
    fn from(value: i32) -> Self {
        Arg::Int(Some(i64::from(value)))
    }
}

impl From<Option<i64>> for Arg<'_> {
    fn from(value: Option<i64>) -> Self {
        Arg::Int(value)
    }
}

impl From<bool> for Arg<'_> {
    fn from(value: bool) -> Self {
        Arg::Bool(Some(value))
    }
}

impl From<Option<bool>> for Arg<'_> {
    fn from(value: Option<bool>) -> Self {
        Arg::Bool(value)
    }
}

impl<'a> From<&'a [u8]> for Arg<'a> {
    fn from(value: &'a [u8]) -> Self {
        Arg::Bytes(Cow::Borrowed(value))
    }
}

/// A statement written once for both dialects: its text, with `$n` placeholders, and its binds in order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sql<'a> {
    text: String,
    args: Vec<Arg<'a>>,
}

impl<'a> Sql<'a> {
    /// A statement whose placeholders the caller numbered.
    pub(crate) fn new(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            args: Vec::new(),
        }
    }

    /// Bind the next placeholder.
    pub(crate) fn bind(mut self, arg: impl Into<Arg<'a>>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Bind the next placeholder to free text (see [`Arg::Free`]).
    pub(crate) fn free(self, text: &'a str) -> Self {
        self.opt_free(Some(text))
    }

    /// Bind the next placeholder to optional free text.
    pub(crate) fn opt_free(mut self, text: Option<&'a str>) -> Self {
        self.args.push(Arg::Free(text.map(Cow::Borrowed)));
        self
    }

    /// Append text to a statement assembled piece by piece.
    pub(crate) fn push(&mut self, text: &str) -> &mut Self {
        self.text.push_str(text);
        self
    }

    /// Bind `arg` to a new placeholder and return the placeholder (`$n`), for a statement assembled piece
    /// by piece.
    pub(crate) fn mark(&mut self, arg: impl Into<Arg<'a>>) -> String {
        self.args.push(arg.into());
        format!("${}", self.args.len())
    }

    /// Bind `arg` to a new placeholder and append the placeholder.
    pub(crate) fn push_bind(&mut self, arg: impl Into<Arg<'a>>) -> &mut Self {
        let mark = self.mark(arg);
        self.push(&mark)
    }

    /// `$a, $b, …`: one new placeholder for each of `args`, for an `IN (…)` list.
    pub(crate) fn marks<A: Into<Arg<'a>>>(&mut self, args: impl IntoIterator<Item = A>) -> String {
        args.into_iter()
            .map(|arg| self.mark(arg))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The statement's text.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// Its binds, in placeholder order.
    pub(crate) fn args(&self) -> &[Arg<'a>] {
        &self.args
    }
}
