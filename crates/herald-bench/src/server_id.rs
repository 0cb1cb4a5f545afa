//! The ids a server answers, tagged with their kind.
//!
//! The harness measures any server with the Svix-compatible API (`--target`), not only Herald: Svix's ids
//! are 27-character KSUIDs after the prefix, Herald's 22 base62 characters. So an id read from an answer is
//! checked for its kind's prefix only (an endpoint's id cannot be taken for an application's), and its
//! text after the prefix is the server's business — unlike [`herald_core::id::Id`], which guarantees
//! Herald's own form.

use std::fmt;
use std::marker::PhantomData;

use herald_core::id::{App, Endpoint, Kind, Message, Sink};
use serde::{Deserialize, Deserializer};

/// An id of kind `K` as a server spelled it: its kind's prefix, then whatever the server uses.
pub struct ServerId<K> {
    text: String,
    kind: PhantomData<K>,
}

/// An application's id, `app_…`.
pub type AppId = ServerId<App>;
/// An endpoint's id, `ep_…`.
pub type EndpointId = ServerId<Endpoint>;
/// A message's id, `msg_…`.
pub type MessageId = ServerId<Message>;
/// A polling endpoint's id, `sink_…`.
pub type SinkId = ServerId<Sink>;

/// A text that does not start with the prefix of the kind of id expected.
#[derive(Debug, thiserror::Error)]
#[error("{text:?} is not an id of the form {prefix}…")]
pub struct NotOfKind {
    prefix: &'static str,
    text: String,
}

impl<K: Kind> ServerId<K> {
    /// `text`, if it is an id of kind `K` by its prefix (with something after it).
    pub fn parse(text: String) -> Result<Self, NotOfKind> {
        let prefix = K::KIND.prefix();
        if text.len() > prefix.len() && text.starts_with(prefix) {
            Ok(Self {
                text,
                kind: PhantomData,
            })
        } else {
            Err(NotOfKind { prefix, text })
        }
    }
}

impl<K> ServerId<K> {
    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl<K> std::ops::Deref for ServerId<K> {
    type Target = str;

    fn deref(&self) -> &str {
        &self.text
    }
}

impl<K> Clone for ServerId<K> {
    fn clone(&self) -> Self {
        Self {
            text: self.text.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> PartialEq for ServerId<K> {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl<K> Eq for ServerId<K> {}

impl<K> std::hash::Hash for ServerId<K> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.text.hash(state);
    }
}

impl<K> fmt::Display for ServerId<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl<K> fmt::Debug for ServerId<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.text, f)
    }
}

impl<'de, K: Kind> Deserialize<'de> for ServerId<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Self::parse(String::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn herald_and_svix_ids_are_taken_by_their_prefix() {
        assert!(AppId::parse(herald_core::id::AppId::new().to_string()).is_ok());
        assert!(
            AppId::parse("app_1srOrx2ZWZBpBUvZwXKQmoEYga2".to_owned()).is_ok(),
            "a Svix KSUID id"
        );
    }

    #[test]
    fn an_id_of_another_kind_or_a_bare_prefix_is_refused() {
        let error = AppId::parse("ep_1srOrx2ZWZBpBUvZwXKQmoEYga2".to_owned()).expect_err("an endpoint's id");
        assert!(error.to_string().contains("app_"), "{error}");
        assert!(EndpointId::parse("ep_".to_owned()).is_err());
    }
}
