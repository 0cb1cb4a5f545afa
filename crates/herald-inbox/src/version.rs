//! Comparing the versions the version guard reads from events.
//!
//! Versions are kept as text (a JSON number in its JSON form, or a string). Two versions compare:
//!
//! 1. as integers, exactly and at any size, when both are integers (`-?[0-9]+`): `10` is newer than `9`;
//! 2. as decimal numbers (`f64`) when both parse as finite numbers but are not both integers: `1.5` is newer
//!    than `1.25`;
//! 3. otherwise byte by byte (lexicographically): RFC 3339 timestamps written the same way (same offset,
//!    same precision) compare chronologically, and so do zero-padded sequence strings.
//!
//! A version is *newer* only when it compares strictly greater: an equal version is not newer, so a
//! redelivered copy of an already applied event is stale.

use std::cmp::Ordering;

/// Whether `candidate` is strictly newer than `newest` (see the module docs for the order).
pub fn is_newer(candidate: &str, newest: &str) -> bool {
    compare(candidate, newest) == Ordering::Greater
}

/// The order of two versions (see the module docs).
pub fn compare(a: &str, b: &str) -> Ordering {
    if let (Some(x), Some(y)) = (Integer::parse(a), Integer::parse(b)) {
        return x.cmp(&y);
    }
    match (parse_finite(a), parse_finite(b)) {
        (Some(x), Some(y)) => x.total_cmp(&y),
        _ => a.as_bytes().cmp(b.as_bytes()),
    }
}

fn parse_finite(s: &str) -> Option<f64> {
    s.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// An integer of any size: its sign and its digits without leading zeros.
#[derive(Debug, PartialEq, Eq)]
struct Integer<'a> {
    negative: bool,
    digits: &'a str,
}

impl<'a> Integer<'a> {
    fn parse(s: &'a str) -> Option<Self> {
        let (negative, digits) = match s.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let digits = digits.trim_start_matches('0');
        // -0 is 0.
        Some(Self {
            negative: negative && !digits.is_empty(),
            digits,
        })
    }

    /// Magnitude order: more digits is larger; equal lengths compare digit by digit.
    fn magnitude(&self, other: &Self) -> Ordering {
        self.digits
            .len()
            .cmp(&other.digits.len())
            .then_with(|| self.digits.cmp(other.digits))
    }
}

impl Ord for Integer<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self.negative, other.negative) {
            (false, false) => self.magnitude(other),
            (true, true) => other.magnitude(self),
            (false, true) => Ordering::Greater,
            (true, false) => Ordering::Less,
        }
    }
}

impl PartialOrd for Integer<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn integers_compare_numerically_at_any_size() {
        assert!(is_newer("10", "9"));
        assert!(!is_newer("9", "10"));
        assert!(!is_newer("7", "7"));
        assert!(!is_newer("007", "7"));
        assert!(is_newer("0", "-1"));
        assert!(is_newer("-1", "-2"));
        assert!(!is_newer("-0", "0"));
        assert!(is_newer(
            "123456789012345678901234567890",
            "123456789012345678901234567889"
        ));
    }

    #[test]
    fn decimals_compare_as_numbers() {
        assert!(is_newer("1.5", "1.25"));
        assert!(is_newer("2", "1.5"));
        assert!(!is_newer("2.0", "2"));
        assert!(is_newer("1e3", "999"));
    }

    #[test]
    fn other_strings_compare_lexicographically() {
        assert!(is_newer("2024-05-02T00:00:00Z", "2024-05-01T23:59:59Z"));
        assert!(is_newer("b", "a"));
        assert!(!is_newer("a", "a"));
        // Mixed numeric and non-numeric: byte order.
        assert!(is_newer("v2", "10"));
    }

    proptest! {
        #[test]
        fn integer_order_matches_i128(a in any::<i64>(), b in any::<i64>()) {
            prop_assert_eq!(compare(&a.to_string(), &b.to_string()), i128::from(a).cmp(&i128::from(b)));
        }

        #[test]
        fn order_is_antisymmetric(a in "[-0-9a-z.]{0,8}", b in "[-0-9a-z.]{0,8}") {
            prop_assert_eq!(compare(&a, &b), compare(&b, &a).reverse());
        }
    }
}
