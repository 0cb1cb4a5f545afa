//! Every vector of `tests/vectors/signatures.json`.

use std::time::Duration;

use herald_signature::{
    Ed25519PublicKey, Ed25519SigningKey, HEADER_SIGNATURE, HmacSecret, Verifier, VerifyError, VerifyKey, github, stripe,
};
use serde_json::Value;

const VECTORS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/vectors/signatures.json");

fn vectors() -> Value {
    let text = std::fs::read_to_string(VECTORS).unwrap_or_else(|e| panic!("cannot read {VECTORS}: {e}"));
    serde_json::from_str(&text).expect("vectors are valid JSON")
}

fn str_field<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_else(|| panic!("missing string field {key}"))
}

fn int_field(v: &Value, key: &str) -> i64 {
    v[key].as_i64().unwrap_or_else(|| panic!("missing integer field {key}"))
}

fn list<'a>(v: &'a Value, key: &str) -> &'a Vec<Value> {
    v[key].as_array().unwrap_or_else(|| panic!("missing array {key}"))
}

#[test]
fn standard_webhooks_v1() {
    let all = vectors();
    let cases = list(&all, "standard_webhooks_v1");
    assert!(!cases.is_empty());
    for case in cases {
        let secret_text = str_field(case, "secret");
        let msg_id = str_field(case, "msg_id");
        let ts = int_field(case, "timestamp");
        let ts_text = ts.to_string();
        let body = str_field(case, "payload").as_bytes();
        let expected = str_field(case, "signature");

        let secret = HmacSecret::parse(secret_text).unwrap();
        assert_eq!(secret.to_whsec(), secret_text, "to_whsec round trip");
        // The same secret without the `whsec_` prefix is the same key.
        let bare = HmacSecret::parse(secret_text.strip_prefix("whsec_").unwrap()).unwrap();
        assert_eq!(bare, secret);

        for key in [&secret, &bare] {
            assert_eq!(key.sign(msg_id, ts, body), expected);
            let verifier = Verifier::new(vec![key.clone().into()]);
            verifier
                .verify_ignoring_timestamp(msg_id, &ts_text, expected, body)
                .unwrap();
            // With the clock at the vector's time, the full check passes too.
            verifier.verify(msg_id, &ts_text, expected, body, ts).unwrap();
            // The vectors are old: the live check rejects them.
            assert_eq!(
                verifier.verify_now(msg_id, &ts_text, expected, body),
                Err(VerifyError::TooOld)
            );

            for bad in list(case, "must_reject") {
                let bad = bad.as_str().unwrap();
                let err = verifier
                    .verify_ignoring_timestamp(msg_id, &ts_text, bad, body)
                    .expect_err(bad);
                let want = match bad {
                    "" => VerifyError::MissingHeader(HEADER_SIGNATURE),
                    "v1," => VerifyError::MalformedSignatureHeader,
                    _ => VerifyError::NoMatchingSignature,
                };
                assert_eq!(err, want, "{bad:?}");
                assert_eq!(verifier.verify(msg_id, &ts_text, bad, body, ts), Err(want));
            }

            if let Some(header) = case["must_accept_header"].as_str() {
                verifier
                    .verify_ignoring_timestamp(msg_id, &ts_text, header, body)
                    .unwrap();
                verifier.verify(msg_id, &ts_text, header, body, ts).unwrap();
            }
        }
    }
}

#[test]
fn standard_webhooks_v1a() {
    let all = vectors();
    let cases = list(&all, "standard_webhooks_v1a");
    assert!(!cases.is_empty());
    for case in cases {
        let seed: [u8; 32] = hex::decode(str_field(case, "ed25519_seed_hex"))
            .unwrap()
            .try_into()
            .unwrap();
        let whsk = str_field(case, "secret_key");
        let whpk = str_field(case, "public_key");
        let msg_id = str_field(case, "msg_id");
        let ts = int_field(case, "timestamp");
        let ts_text = ts.to_string();
        let body = str_field(case, "payload").as_bytes();
        let expected = str_field(case, "signature");

        let key = Ed25519SigningKey::from_seed(&seed);
        assert_eq!(key.to_whsk(), whsk);
        assert_eq!(key.public_key().to_whpk(), whpk);
        assert_eq!(Ed25519SigningKey::parse(whsk).unwrap(), key);
        let public = Ed25519PublicKey::parse(whpk).unwrap();
        assert_eq!(public, key.public_key());

        assert_eq!(key.sign(msg_id, ts, body), expected);

        let verifier = Verifier::new(vec![VerifyKey::from(public)]);
        verifier
            .verify_ignoring_timestamp(msg_id, &ts_text, expected, body)
            .unwrap();
        verifier.verify(msg_id, &ts_text, expected, body, ts).unwrap();
        assert_eq!(
            verifier.verify_ignoring_timestamp(msg_id, &ts_text, expected, b"{}"),
            Err(VerifyError::NoMatchingSignature)
        );

        // Independent check with ring.
        let sig = herald_b64_decode(expected.strip_prefix("v1a,").unwrap());
        let content = format!("{msg_id}.{ts}.{}", str_field(case, "payload"));
        ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, public.to_bytes().as_slice())
            .verify(content.as_bytes(), &sig)
            .expect("ring accepts the v1a vector");

        // An HMAC-only verifier never accepts a v1a entry.
        let hmac_only = Verifier::new(vec![HmacSecret::from_bytes(&seed).unwrap().into()]);
        assert_eq!(
            hmac_only.verify_ignoring_timestamp(msg_id, &ts_text, expected, body),
            Err(VerifyError::NoMatchingSignature)
        );
    }
}

#[test]
fn stripe_vectors() {
    let all = vectors();
    let cases = list(&all, "stripe");
    assert!(!cases.is_empty());
    for case in cases {
        let secret = str_field(case, "secret");
        let ts = int_field(case, "timestamp");
        let body = str_field(case, "payload").as_bytes();
        let header = str_field(case, "header");
        let tol = Duration::from_secs(300);

        assert_eq!(stripe::sign(secret, ts, body), header);
        stripe::verify(secret, header, body, ts, tol).unwrap();
        stripe::verify(secret, header, body, ts + 300, tol).unwrap();
        assert_eq!(
            stripe::verify(secret, header, body, ts + 301, tol),
            Err(VerifyError::TooOld)
        );
        assert_eq!(
            stripe::verify(secret, header, b"tampered", ts, tol),
            Err(VerifyError::NoMatchingSignature)
        );
        // The key is the whole secret text, not its base64 decoding.
        assert_eq!(
            stripe::verify(secret.strip_prefix("whsec_").unwrap(), header, body, ts, tol),
            Err(VerifyError::NoMatchingSignature)
        );
        // A v0 entry and a second, wrong v1 are ignored.
        let extended = format!("{header},v1={},v0=deadbeef", "ab".repeat(32));
        stripe::verify(secret, &extended, body, ts, tol).unwrap();
        assert_eq!(stripe::verify_now(secret, header, body, tol), Err(VerifyError::TooOld));
    }
}

#[test]
fn github_vectors() {
    let all = vectors();
    let cases = list(&all, "github");
    assert!(!cases.is_empty());
    for case in cases {
        let secret = str_field(case, "secret").as_bytes();
        let body = str_field(case, "payload").as_bytes();
        let header = str_field(case, "header");

        assert_eq!(github::sign(secret, body), header);
        github::verify(secret, header, body).unwrap();
        assert_eq!(
            github::verify(secret, header, b"Hello, World?"),
            Err(VerifyError::NoMatchingSignature)
        );
        assert_eq!(
            github::verify(b"wrong", header, body),
            Err(VerifyError::NoMatchingSignature)
        );
    }
}

fn herald_b64_decode(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}
