//! Cross-checks against independent implementations: the `standardwebhooks`
//! crate for `v1` and `ring` for `v1a`.

use std::time::{SystemTime, UNIX_EPOCH};

use herald_signature::{Ed25519PublicKey, Ed25519SigningKey, HmacSecret, Verifier};
use http::HeaderMap;
use proptest::prelude::*;
use ring::signature::{ED25519, Ed25519KeyPair, UnparsedPublicKey};
use standardwebhooks::Webhook;

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .try_into()
        .unwrap()
}

fn headers(id: &str, ts: i64, sig: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("webhook-id", id.parse().unwrap());
    h.insert("webhook-timestamp", ts.to_string().parse().unwrap());
    h.insert("webhook-signature", sig.parse().unwrap());
    h
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Ours signs, `standardwebhooks` verifies (its check uses the real clock).
    #[test]
    fn ours_sign_theirs_verify(
        key in proptest::collection::vec(any::<u8>(), 24..=64),
        id in "[A-Za-z0-9_]{1,40}",
        body in "\\PC{0,300}",
    ) {
        let ours = HmacSecret::from_bytes(&key).unwrap();
        let theirs = Webhook::new(&ours.to_whsec()).unwrap();
        let ts = now();
        let sig = ours.sign(&id, ts, body.as_bytes());
        prop_assert!(theirs.verify(body.as_bytes(), &headers(&id, ts, &sig)).is_ok());
        // Tampering is caught by theirs too.
        let tampered = format!("{body}!");
        prop_assert!(theirs.verify(tampered.as_bytes(), &headers(&id, ts, &sig)).is_err());
    }

    /// `standardwebhooks` signs, ours verifies.
    #[test]
    fn theirs_sign_ours_verify(
        key in proptest::collection::vec(any::<u8>(), 24..=64),
        id in "[A-Za-z0-9_]{1,40}",
        body in "\\PC{0,300}",
        ts in 1_000_000_000i64..4_000_000_000,
    ) {
        let ours = HmacSecret::from_bytes(&key).unwrap();
        let theirs = Webhook::from_bytes(key.clone()).unwrap();
        let sig = theirs.sign(&id, ts, body.as_bytes()).unwrap();
        prop_assert_eq!(&sig, &ours.sign(&id, ts, body.as_bytes()));
        let verifier = Verifier::new(vec![ours.into()]);
        prop_assert_eq!(verifier.verify(&id, &ts.to_string(), &sig, body.as_bytes(), ts), Ok(()));
    }

    /// Same secret text means the same key on both sides.
    #[test]
    fn secret_text_is_compatible(key in proptest::collection::vec(any::<u8>(), 1..=64)) {
        let text = HmacSecret::from_bytes(&key).unwrap().to_whsec();
        let theirs = Webhook::new(&text).unwrap();
        let ours = HmacSecret::parse(&text).unwrap();
        prop_assert_eq!(theirs.sign("m", 1, b"x").unwrap(), ours.sign("m", 1, b"x"));
    }

    /// Ours signs `v1a`, ring verifies; ring signs, ours verifies.
    #[test]
    fn ed25519_against_ring(
        seed in any::<[u8; 32]>(),
        id in "[A-Za-z0-9_]{1,40}",
        ts in 1_000_000_000i64..4_000_000_000,
        body in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;

        let ours = Ed25519SigningKey::from_seed(&seed);
        let ring_key = Ed25519KeyPair::from_seed_unchecked(&seed).unwrap();
        let ring_public = ring::signature::KeyPair::public_key(&ring_key).as_ref().to_vec();
        prop_assert_eq!(ours.public_key().to_bytes().to_vec(), ring_public.clone());

        let mut content = format!("{id}.{ts}.").into_bytes();
        content.extend_from_slice(&body);

        let sig = ours.sign(&id, ts, &body);
        let raw = b64.decode(sig.strip_prefix("v1a,").unwrap()).unwrap();
        prop_assert!(UnparsedPublicKey::new(&ED25519, &ring_public).verify(&content, &raw).is_ok());

        let ring_sig = format!("v1a,{}", b64.encode(ring_key.sign(&content).as_ref()));
        prop_assert_eq!(&ring_sig, &sig); // Ed25519 is deterministic.
        let public = Ed25519PublicKey::from_bytes(&ring_public.try_into().unwrap()).unwrap();
        let verifier = Verifier::new(vec![public.into()]);
        prop_assert_eq!(verifier.verify(&id, &ts.to_string(), &ring_sig, &body, ts), Ok(()));
    }
}

/// Multiple signatures produced by ours, verified by theirs (their parser
/// handles space-separated lists and ignores `v1a`).
#[test]
fn rotation_header_is_understood_by_standardwebhooks() {
    let old = HmacSecret::from_bytes(&[1; 32]).unwrap();
    let new = HmacSecret::from_bytes(&[2; 32]).unwrap();
    let asym = Ed25519SigningKey::from_seed(&[3; 32]);
    let ts = now();
    let header = herald_signature::signature_header(&[
        asym.sign("msg_x", ts, b"{}"),
        new.sign("msg_x", ts, b"{}"),
        old.sign("msg_x", ts, b"{}"),
    ]);
    for secret in [&old, &new] {
        let theirs = Webhook::new(&secret.to_whsec()).unwrap();
        theirs.verify(b"{}", &headers("msg_x", ts, &header)).unwrap();
    }
}
