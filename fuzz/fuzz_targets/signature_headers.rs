//! Header parsing of every scheme in `herald-signature`: no input, however malformed, may panic, and a
//! header built from fuzzed bytes must never verify unless it really is the signature.
//!
//! The input is split on NUL bytes into a message id, a timestamp header, a signature header and a body;
//! each scheme's verifier is run on them with a fixed key and a fixed clock.
#![no_main]

use herald_signature::{HmacSecret, Verifier, VerifyError, body_hmac, github, stripe};
use libfuzzer_sys::fuzz_target;

const NOW: i64 = 1_700_000_000;
const SECRET: &[u8] = b"fuzzing secret key bytes 0123456";

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(4, |&b| b == 0);
    let id = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let timestamp = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let signature = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let body = parts.next().unwrap_or_default();

    let Ok(secret) = HmacSecret::from_bytes(SECRET) else {
        return;
    };
    let verifier = Verifier::new(vec![secret.clone().into()]);
    let result = verifier.verify(&id, &timestamp, &signature, body, NOW);
    if result.is_ok() {
        // Accepted: then the header must hold the real signature for these exact inputs.
        let Ok(ts) = timestamp.parse::<i64>() else {
            panic!("accepted a non-numeric timestamp {timestamp:?}");
        };
        let expected = secret.sign(&id, ts, body);
        assert!(signature.split(' ').any(|entry| entry == expected), "accepted a forged header");
    }
    let _ = verifier.verify_ignoring_timestamp(&id, &timestamp, &signature, body);

    let _ = stripe::verify("whsec_fuzz", &signature, body, NOW, stripe::DEFAULT_TOLERANCE);
    match github::verify(SECRET, &signature, body) {
        Ok(()) => assert_eq!(signature.to_ascii_lowercase(), github::sign(SECRET, body)),
        Err(VerifyError::MissingHeader(_) | VerifyError::MalformedSignatureHeader | VerifyError::NoMatchingSignature) => {}
        Err(other) => panic!("github cannot fail with {other:?}"),
    }
    assert!(body_hmac::verify(SECRET, signature.as_bytes(), body).is_err() || signature.len() == 32);
    let _ = HmacSecret::parse(&signature);
    let _ = herald_signature::Ed25519PublicKey::parse(&signature);
    let _ = herald_signature::Ed25519SigningKey::parse(&signature);
});
