//! Query-string parsing shared by the listing routes: pagination, times and lists.
//!
//! Svix clients send lists both as repeated keys and comma-joined, and some send times without an
//! offset; both are accepted here, in one place.

use std::borrow::Cow;

use axum::http::Uri;
use herald_core::clock::Millis;
use herald_store::PageRequest;

use crate::error::ApiError;

/// The decoded query string of a request, borrowing from it where nothing needed decoding.
pub(crate) struct Query<'a> {
    pairs: Vec<(Cow<'a, str>, Cow<'a, str>)>,
}

impl<'a> Query<'a> {
    /// Decode the query of `uri`.
    pub(crate) fn of(uri: &'a Uri) -> Self {
        let raw = uri.query().unwrap_or("");
        Self {
            pairs: url::form_urlencoded::parse(raw.as_bytes()).collect(),
        }
    }

    /// The last value of the first key present among `keys`.
    pub(crate) fn get(&self, keys: &[&str]) -> Option<&str> {
        keys.iter()
            .find_map(|key| self.pairs.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_ref()))
    }

    /// The most values a list parameter may carry.
    const MAX_LIST: usize = 250;

    /// Every value of `keys`, with comma-joined values split (at most 250).
    pub(crate) fn list(&self, keys: &[&str]) -> Result<Option<Vec<String>>, ApiError> {
        let items: Vec<String> = self
            .pairs
            .iter()
            .filter(|(k, _)| keys.contains(&k.as_ref()))
            .flat_map(|(_, v)| v.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        if items.len() > Self::MAX_LIST {
            return Err(ApiError::query(keys[0], format!("at most {} values", Self::MAX_LIST)));
        }
        Ok((!items.is_empty()).then_some(items))
    }

    /// `limit` and `iterator`.
    pub(crate) fn page(&self) -> Result<PageRequest, ApiError> {
        let limit = match self.get(&["limit"]) {
            Some(text) => Some(
                text.parse::<usize>()
                    .map_err(|_| ApiError::query("limit", "expected an integer from 1 to 250"))?,
            ),
            None => None,
        };
        Ok(PageRequest::new(limit, self.get(&["iterator"]).map(str::to_owned)))
    }

    /// One of a closed set of names (a state, a kind), read by `parse`; a 422 naming `key` if it is none
    /// of them (the document's contract refuses those first, this keeps the handler honest without it).
    pub(crate) fn named<T>(&self, key: &str, parse: fn(&str) -> Option<T>) -> Result<Option<T>, ApiError> {
        self.get(&[key])
            .map(|name| parse(name).ok_or_else(|| ApiError::query(key, format!("unknown value {name:?}"))))
            .transpose()
    }

    /// A boolean flag (`true`/`false`), defaulting when absent.
    /// Whether a listing runs in descending order: `order=descending` or `order=ascending` (Svix's
    /// `Ordering`, whose value the query contract checked), else `default`.
    pub(crate) fn descending(&self, default: bool) -> bool {
        match self.get(&["order"]) {
            Some("descending") => true,
            Some("ascending") => false,
            _ => default,
        }
    }

    pub(crate) fn flag(&self, key: &str, default: bool) -> Result<bool, ApiError> {
        match self.get(&[key]) {
            None => Ok(default),
            Some("true") => Ok(true),
            Some("false") => Ok(false),
            Some(_) => Err(ApiError::query(key, "expected true or false")),
        }
    }

    /// A time in RFC 3339 (a missing offset means UTC).
    pub(crate) fn time(&self, keys: &[&str]) -> Result<Option<Millis>, ApiError> {
        let Some((key, text)) = keys.iter().find_map(|key| self.get(&[key]).map(|text| (*key, text))) else {
            return Ok(None);
        };
        let parsed = crate::contract::parse_date_time(text)
            .ok_or_else(|| ApiError::query(key, "expected an RFC 3339 date-time"))?;
        Ok(Some(Millis::from_datetime(parsed)))
    }
}
