//! Integer body fields that take every JSON number JSON Schema counts as an integer.
//!
//! The OpenAPI document declares these fields `"type": "integer"`, and JSON Schema calls `215.0` an
//! integer (a number whose fraction is zero); a client whose JSON library writes whole numbers that way
//! (JavaScript's does for computed values) sends what the document allows. serde's integer types refuse
//! it, so these `deserialize_with` helpers read any JSON number and take it when it is whole and fits
//! the field's type. Use them on integer fields of request bodies only: payloads are never touched.

use std::any::type_name;

use serde::de::{Deserialize, Deserializer, Error, Unexpected};

use crate::model::Patch;

/// An integer of type `T` read from any JSON number that is whole (`7`, `-3`, `7.0`, `7e2`).
struct Whole<T>(T);

impl<'de, T: TryFrom<i64> + TryFrom<u64>> Deserialize<'de> for Whole<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let number = serde_json::Number::deserialize(deserializer)?;
        let expected = &type_name::<T>();
        if let Some(signed) = number.as_i64() {
            return T::try_from(signed)
                .map(Whole)
                .map_err(|_| D::Error::invalid_value(Unexpected::Signed(signed), expected));
        }
        if let Some(unsigned) = number.as_u64() {
            return T::try_from(unsigned)
                .map(Whole)
                .map_err(|_| D::Error::invalid_value(Unexpected::Unsigned(unsigned), expected));
        }
        let float = number.as_f64().unwrap_or(f64::NAN);
        // Beyond ±2^63 no integer field fits anyway; `as` is exact below it for a whole float.
        const LIMIT: f64 = 9_223_372_036_854_775_808.0;
        if float.is_finite() && float.fract() == 0.0 && float.abs() < LIMIT {
            #[expect(clippy::cast_possible_truncation, reason = "whole and within i64, checked above")]
            let signed = float as i64;
            if let Ok(value) = T::try_from(signed) {
                return Ok(Whole(value));
            }
        }
        Err(D::Error::invalid_value(Unexpected::Float(float), expected))
    }
}

/// `deserialize_with` for `Option<T>` (pair it with `#[serde(default)]`): `null` gives `None`.
pub(crate) fn option<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64> + TryFrom<u64>,
{
    Option::<Whole<T>>::deserialize(deserializer).map(|found| found.map(|whole| whole.0))
}

/// `deserialize_with` for a PATCH field [`Patch<T>`] (pair it with `#[serde(default)]`).
pub(crate) fn patch<'de, D, T>(deserializer: D) -> Result<Patch<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64> + TryFrom<u64>,
{
    Ok(match Option::<Whole<T>>::deserialize(deserializer)? {
        None => Patch::Null,
        Some(whole) => Patch::Value(whole.0),
    })
}

/// `deserialize_with` for a required integer field.
pub(crate) fn required<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64> + TryFrom<u64>,
{
    Whole::<T>::deserialize(deserializer).map(|whole| whole.0)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Sample {
        #[serde(default, deserialize_with = "option")]
        small: Option<u16>,
        #[serde(deserialize_with = "required")]
        signed: i64,
        #[serde(default, deserialize_with = "patch")]
        patched: Patch<u32>,
    }

    fn read(value: serde_json::Value) -> Result<Sample, String> {
        serde_json::from_value(value).map_err(|e| e.to_string())
    }

    #[test]
    fn whole_numbers_are_taken_however_they_are_written() {
        let sample = read(json!({"small": 215.0, "signed": -3e2, "patched": 7})).expect("whole numbers");
        assert_eq!(sample.small, Some(215));
        assert_eq!(sample.signed, -300);
        assert_eq!(sample.patched, Patch::Value(7));
        let sample = read(json!({"small": null, "signed": 1, "patched": null})).expect("nulls");
        assert_eq!((sample.small, sample.patched), (None, Patch::Null));
        assert_eq!(read(json!({"signed": 1})).expect("absent").patched, Patch::Absent);
    }

    #[test]
    fn fractions_out_of_range_and_other_types_are_refused_naming_the_type() {
        for (value, needle) in [
            (json!({"small": 2.5, "signed": 1}), "expected u16"),
            (json!({"small": 70000, "signed": 1}), "expected u16"),
            (json!({"small": -1.0, "signed": 1}), "expected u16"),
            (json!({"signed": 1e300}), "expected i64"),
            (json!({"signed": "1"}), "invalid type: string"),
        ] {
            let error = read(value.clone()).expect_err(&value.to_string());
            assert!(error.contains(needle), "{value}: {error}");
        }
    }
}
