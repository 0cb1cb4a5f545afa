//! Set-valued body fields (`filterTypes`, `channels`) capped on the list as sent.
//!
//! The document caps these lists with `maxItems`, which counts the items of the JSON array; duplicates
//! collapse into one (they are sets), so counting after collapsing would accept a list the document
//! refuses. These `deserialize_with` helpers read the list, refuse it past `MAX` items, then collapse it.

use std::collections::BTreeSet;

use serde::de::{Deserialize, Deserializer, Error};

use crate::model::Patch;

fn collapse<E: Error, const MAX: usize>(items: Vec<String>) -> Result<BTreeSet<String>, E> {
    if items.len() > MAX {
        return Err(E::custom(format!("at most {MAX} items, got {}", items.len())));
    }
    Ok(items.into_iter().collect())
}

/// `deserialize_with` for `Option<BTreeSet<String>>` (pair it with `#[serde(default)]`).
pub(crate) fn option<'de, D: Deserializer<'de>, const MAX: usize>(
    deserializer: D,
) -> Result<Option<BTreeSet<String>>, D::Error> {
    Option::<Vec<String>>::deserialize(deserializer)?
        .map(collapse::<D::Error, MAX>)
        .transpose()
}

/// `deserialize_with` for a PATCH field `Patch<BTreeSet<String>>` (pair it with `#[serde(default)]`).
pub(crate) fn patch<'de, D: Deserializer<'de>, const MAX: usize>(
    deserializer: D,
) -> Result<Patch<BTreeSet<String>>, D::Error> {
    Ok(match Option::<Vec<String>>::deserialize(deserializer)? {
        None => Patch::Null,
        Some(items) => Patch::Value(collapse::<D::Error, MAX>(items)?),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Sample {
        #[serde(default, deserialize_with = "option::<_, 2>")]
        listed: Option<BTreeSet<String>>,
        #[serde(default, deserialize_with = "patch::<_, 2>")]
        patched: Patch<BTreeSet<String>>,
    }

    #[test]
    fn duplicates_collapse_but_count_against_the_cap_as_sent() {
        let sample: Sample = serde_json::from_value(json!({"listed": ["a", "a"], "patched": null})).expect("two items");
        assert_eq!(sample.listed.expect("a set").len(), 1);
        assert_eq!(sample.patched, Patch::Null);
        for body in [json!({"listed": ["a", "a", "a"]}), json!({"patched": ["a", "b", "b"]})] {
            let error = serde_json::from_value::<Sample>(body)
                .expect_err("three items")
                .to_string();
            assert!(error.contains("at most 2 items, got 3"), "{error}");
        }
    }
}
