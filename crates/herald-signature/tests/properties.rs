//! Property tests: round trips, tamper detection, and robustness against
//! arbitrary headers.

use herald_signature::{
    Ed25519SigningKey, HmacSecret, Verifier, VerifyError, VerifyKey, github, signature_header, stripe,
};
use proptest::prelude::*;

/// Message ids as senders produce them (ASCII, no dot).
fn msg_id() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_-]{1,40}"
}

/// Realistic timestamps (canonical, positive).
fn timestamp() -> impl Strategy<Value = i64> {
    1_000_000_000i64..4_000_000_000
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..512)
}

fn hmac_secret() -> impl Strategy<Value = HmacSecret> {
    proptest::collection::vec(any::<u8>(), 24..=64).prop_map(|bytes| HmacSecret::from_bytes(&bytes).unwrap())
}

fn ed25519_key() -> impl Strategy<Value = Ed25519SigningKey> {
    any::<[u8; 32]>().prop_map(|seed| Ed25519SigningKey::from_seed(&seed))
}

/// Either kind of key, with its verifier and a signing function.
#[derive(Debug, Clone)]
enum AnyKey {
    Hmac(HmacSecret),
    Ed(Ed25519SigningKey),
}

impl AnyKey {
    fn sign(&self, id: &str, ts: i64, body: &[u8]) -> String {
        match self {
            AnyKey::Hmac(k) => k.sign(id, ts, body),
            AnyKey::Ed(k) => k.sign(id, ts, body),
        }
    }

    fn verify_key(&self) -> VerifyKey {
        match self {
            AnyKey::Hmac(k) => k.clone().into(),
            AnyKey::Ed(k) => k.into(),
        }
    }
}

fn any_key() -> impl Strategy<Value = AnyKey> {
    prop_oneof![hmac_secret().prop_map(AnyKey::Hmac), ed25519_key().prop_map(AnyKey::Ed)]
}

/// Flips bits of one ASCII byte so that it stays ASCII (so the string stays
/// valid UTF-8) and differs from the original.
fn flip_ascii(s: &str, index: prop::sample::Index, mask: u8) -> String {
    let mut bytes = s.as_bytes().to_vec();
    let i = index.index(bytes.len());
    bytes[i] ^= mask & 0x7f;
    assert_ne!(bytes[i], s.as_bytes()[i]);
    String::from_utf8(bytes).unwrap()
}

proptest! {
    #[test]
    fn round_trip(key in any_key(), id in msg_id(), ts in timestamp(), body in body()) {
        let sig = key.sign(&id, ts, &body);
        let verifier = Verifier::new(vec![key.verify_key()]);
        prop_assert_eq!(verifier.verify(&id, &ts.to_string(), &sig, &body, ts), Ok(()));
        prop_assert_eq!(verifier.verify_ignoring_timestamp(&id, &ts.to_string(), &sig, &body), Ok(()));
    }

    #[test]
    fn secret_text_round_trip(bytes in proptest::collection::vec(any::<u8>(), 1..=64)) {
        let secret = HmacSecret::from_bytes(&bytes).unwrap();
        let text = secret.to_whsec();
        prop_assert_eq!(HmacSecret::parse(&text).unwrap(), secret.clone());
        prop_assert_eq!(HmacSecret::parse(&text["whsec_".len()..]).unwrap(), secret.clone());
        prop_assert_eq!(HmacSecret::parse(text.trim_end_matches('=')).unwrap(), secret);
    }

    #[test]
    fn ed25519_text_round_trip(key in ed25519_key()) {
        prop_assert_eq!(Ed25519SigningKey::parse(&key.to_whsk()).unwrap(), key.clone());
        let pk = key.public_key();
        prop_assert_eq!(herald_signature::Ed25519PublicKey::parse(&pk.to_whpk()).unwrap(), pk);
    }

    /// Rotation: any one matching key among several entries and several keys
    /// is enough, wherever it sits.
    #[test]
    fn rotation(
        keys in proptest::collection::vec(any_key(), 1..5),
        pick in any::<prop::sample::Index>(),
        id in msg_id(), ts in timestamp(), body in body(),
    ) {
        let sigs: Vec<String> = keys.iter().map(|k| k.sign(&id, ts, &body)).collect();
        let header = signature_header(&sigs);
        let one = &keys[pick.index(keys.len())];
        let verifier = Verifier::new(vec![one.verify_key()]);
        prop_assert_eq!(verifier.verify(&id, &ts.to_string(), &header, &body, ts), Ok(()));
    }

    #[test]
    fn flipped_body_byte_is_rejected(
        key in any_key(), id in msg_id(), ts in timestamp(),
        body in proptest::collection::vec(any::<u8>(), 1..512),
        index in any::<prop::sample::Index>(), mask in 1u8..=255,
    ) {
        let sig = key.sign(&id, ts, &body);
        let mut tampered = body.clone();
        tampered[index.index(body.len())] ^= mask;
        let verifier = Verifier::new(vec![key.verify_key()]);
        prop_assert_eq!(
            verifier.verify(&id, &ts.to_string(), &sig, &tampered, ts),
            Err(VerifyError::NoMatchingSignature)
        );
    }

    #[test]
    fn flipped_id_byte_is_rejected(
        key in any_key(), id in msg_id(), ts in timestamp(), body in body(),
        index in any::<prop::sample::Index>(), mask in 1u8..=127,
    ) {
        let sig = key.sign(&id, ts, &body);
        let tampered = flip_ascii(&id, index, mask);
        let verifier = Verifier::new(vec![key.verify_key()]);
        let result = verifier.verify(&tampered, &ts.to_string(), &sig, &body, ts);
        prop_assert!(result.is_err(), "{:?}", result);
    }

    #[test]
    fn flipped_timestamp_byte_is_rejected(
        key in any_key(), id in msg_id(), ts in timestamp(), body in body(),
        index in any::<prop::sample::Index>(), mask in 1u8..=127,
    ) {
        let sig = key.sign(&id, ts, &body);
        let tampered = flip_ascii(&ts.to_string(), index, mask);
        let verifier = Verifier::new(vec![key.verify_key()]);
        // Ignore the clock so that only the signature (or the syntax) can
        // reject the tampered timestamp.
        let result = verifier.verify_ignoring_timestamp(&id, &tampered, &sig, &body);
        prop_assert!(
            matches!(result, Err(VerifyError::NoMatchingSignature | VerifyError::BadTimestamp)),
            "{:?}", result
        );
    }

    #[test]
    fn flipped_signature_text_byte_is_rejected(
        key in any_key(), id in msg_id(), ts in timestamp(), body in body(),
        index in any::<prop::sample::Index>(), mask in 1u8..=127,
    ) {
        let sig = key.sign(&id, ts, &body);
        let tampered = flip_ascii(&sig, index, mask);
        let verifier = Verifier::new(vec![key.verify_key()]);
        let result = verifier.verify(&id, &ts.to_string(), &tampered, &body, ts);
        prop_assert!(result.is_err(), "{:?}", result);
    }

    #[test]
    fn flipped_signature_bit_is_rejected(
        key in any_key(), id in msg_id(), ts in timestamp(), body in body(),
        index in any::<prop::sample::Index>(), mask in 1u8..=255,
    ) {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let sig = key.sign(&id, ts, &body);
        let (version, value) = sig.split_once(',').unwrap();
        let mut raw = b64.decode(value).unwrap();
        let i = index.index(raw.len());
        raw[i] ^= mask;
        let tampered = format!("{version},{}", b64.encode(&raw));
        let verifier = Verifier::new(vec![key.verify_key()]);
        prop_assert_eq!(
            verifier.verify(&id, &ts.to_string(), &tampered, &body, ts),
            Err(VerifyError::NoMatchingSignature)
        );
    }

    #[test]
    fn wrong_key_is_rejected(
        key in any_key(), other in any_key(), id in msg_id(), ts in timestamp(), body in body(),
    ) {
        prop_assume!(key.verify_key() != other.verify_key());
        let sig = key.sign(&id, ts, &body);
        let verifier = Verifier::new(vec![other.verify_key()]);
        prop_assert_eq!(
            verifier.verify(&id, &ts.to_string(), &sig, &body, ts),
            Err(VerifyError::NoMatchingSignature)
        );
    }

    /// Nothing an attacker puts in the headers can make verification panic.
    #[test]
    fn arbitrary_headers_never_panic(
        id in ".{0,40}", ts in ".{0,24}", sig in ".{0,200}", body in body(), now in any::<i64>(),
        secret in ".{0,40}",
    ) {
        let verifier = Verifier::new(vec![
            HmacSecret::from_bytes(&[1; 32]).unwrap().into(),
            Ed25519SigningKey::from_seed(&[2; 32]).public_key().into(),
        ]);
        let _ = verifier.verify(&id, &ts, &sig, &body, now);
        let _ = verifier.verify_ignoring_timestamp(&id, &ts, &sig, &body);
        let _ = stripe::verify(&secret, &sig, &body, now, std::time::Duration::from_secs(300));
        let _ = github::verify(secret.as_bytes(), &sig, &body);
        let _ = HmacSecret::parse(&secret);
        let _ = Ed25519SigningKey::parse(&sig);
        let _ = herald_signature::Ed25519PublicKey::parse(&sig);
    }

    /// Header-shaped junk: many `vN,` entries with random base64-ish values.
    #[test]
    fn structured_junk_never_verifies(
        entries in proptest::collection::vec(("v[0-9]{1,2}a?", "[A-Za-z0-9+/=]{0,100}"), 0..8),
        id in msg_id(), ts in timestamp(), body in body(),
    ) {
        let header = entries
            .iter()
            .map(|(v, s)| format!("{v},{s}"))
            .collect::<Vec<_>>()
            .join(" ");
        let verifier = Verifier::new(vec![
            HmacSecret::from_bytes(&[1; 32]).unwrap().into(),
            Ed25519SigningKey::from_seed(&[2; 32]).public_key().into(),
        ]);
        prop_assert!(verifier.verify(&id, &ts.to_string(), &header, &body, ts).is_err());
    }

    #[test]
    fn stripe_round_trip_and_tamper(
        secret in "[ -~]{1,40}", ts in timestamp(), body in body(),
        index in any::<prop::sample::Index>(), mask in 1u8..=255,
    ) {
        let tol = std::time::Duration::from_secs(300);
        let header = stripe::sign(&secret, ts, &body);
        prop_assert_eq!(stripe::verify(&secret, &header, &body, ts, tol), Ok(()));
        let mut tampered = body.clone();
        tampered.push(0);
        let i = index.index(tampered.len());
        tampered[i] ^= mask;
        prop_assert_eq!(
            stripe::verify(&secret, &header, &tampered, ts, tol),
            Err(VerifyError::NoMatchingSignature)
        );
    }

    #[test]
    fn github_round_trip_and_tamper(
        secret in proptest::collection::vec(any::<u8>(), 0..64), body in body(),
        index in any::<prop::sample::Index>(), mask in 1u8..=255,
    ) {
        let header = github::sign(&secret, &body);
        prop_assert_eq!(github::verify(&secret, &header, &body), Ok(()));
        let mut tampered = body.clone();
        tampered.push(0);
        let i = index.index(tampered.len());
        tampered[i] ^= mask;
        prop_assert_eq!(
            github::verify(&secret, &header, &tampered),
            Err(VerifyError::NoMatchingSignature)
        );
    }
}
