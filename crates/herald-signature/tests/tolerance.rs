//! Timestamp tolerance edges: exactly at the tolerance is accepted, one second
//! beyond is rejected, in both directions.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use herald_signature::{DEFAULT_TOLERANCE, HmacSecret, Verifier, VerifyError, VerifyKey, stripe};

const TS: i64 = 1_700_000_000;
const ID: &str = "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W";
const BODY: &[u8] = br#"{"type":"invoice.paid"}"#;

fn setup() -> (String, Verifier) {
    let secret = HmacSecret::from_bytes(&[0x42; 32]).unwrap();
    let sig = secret.sign(ID, TS, BODY);
    (sig, Verifier::new(vec![VerifyKey::from(secret)]))
}

#[test]
fn default_tolerance_is_five_minutes() {
    assert_eq!(DEFAULT_TOLERANCE, Duration::from_secs(300));
    let (_, v) = setup();
    assert_eq!(v.tolerance(), DEFAULT_TOLERANCE);
}

#[test]
fn default_edges() {
    let (sig, v) = setup();
    let check = |now| v.verify(ID, &TS.to_string(), &sig, BODY, now);
    assert_eq!(check(TS), Ok(()));
    // Message older than now.
    assert_eq!(check(TS + 300), Ok(()));
    assert_eq!(check(TS + 301), Err(VerifyError::TooOld));
    // Message from the future.
    assert_eq!(check(TS - 300), Ok(()));
    assert_eq!(check(TS - 301), Err(VerifyError::TooNew));
    // Far away in both directions, including the extremes.
    assert_eq!(check(i64::MAX), Err(VerifyError::TooOld));
    assert_eq!(check(i64::MIN), Err(VerifyError::TooNew));
}

#[test]
fn custom_edges() {
    let (sig, v) = setup();
    for secs in [0u64, 1, 30, 3600, 86_400] {
        let v = v.clone().with_tolerance(Duration::from_secs(secs));
        let tol = secs as i64;
        let check = |now| v.verify(ID, &TS.to_string(), &sig, BODY, now);
        assert_eq!(check(TS + tol), Ok(()), "old edge, tolerance {secs}");
        assert_eq!(check(TS + tol + 1), Err(VerifyError::TooOld), "tolerance {secs}");
        assert_eq!(check(TS - tol), Ok(()), "new edge, tolerance {secs}");
        assert_eq!(check(TS - tol - 1), Err(VerifyError::TooNew), "tolerance {secs}");
    }
}

#[test]
fn sub_second_tolerance_rounds_down() {
    let (sig, v) = setup();
    let v = v.with_tolerance(Duration::from_millis(1_999));
    assert_eq!(v.verify(ID, &TS.to_string(), &sig, BODY, TS + 1), Ok(()));
    assert_eq!(
        v.verify(ID, &TS.to_string(), &sig, BODY, TS + 2),
        Err(VerifyError::TooOld)
    );
}

#[test]
fn timestamp_is_checked_before_signature() {
    let (_, v) = setup();
    assert_eq!(
        v.verify(ID, &TS.to_string(), "v1,bogus", BODY, TS + 301),
        Err(VerifyError::TooOld)
    );
    assert_eq!(
        v.verify_ignoring_timestamp(ID, &TS.to_string(), "v1,bogus", BODY),
        Err(VerifyError::NoMatchingSignature)
    );
}

#[test]
fn ignoring_timestamp_still_requires_a_valid_one() {
    let (sig, v) = setup();
    for bad in [
        "+1700000000",
        "01700000000",
        " 1700000000",
        "1700000000 ",
        "-1",
        "1.7e9",
    ] {
        assert_eq!(
            v.verify_ignoring_timestamp(ID, bad, &sig, BODY),
            Err(VerifyError::BadTimestamp),
            "{bad:?}"
        );
    }
}

#[test]
fn verify_now_uses_the_clock() {
    let secret = HmacSecret::from_bytes(&[7; 24]).unwrap();
    let v = Verifier::new(vec![secret.clone().into()]);
    let now: i64 = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .try_into()
        .unwrap();
    // Margins of 10 s keep the test robust against the clock ticking.
    for (ts, want) in [
        (now, Ok(())),
        (now - 290, Ok(())),
        (now + 290, Ok(())),
        (now - 310, Err(VerifyError::TooOld)),
        (now + 310, Err(VerifyError::TooNew)),
    ] {
        let sig = secret.sign(ID, ts, BODY);
        assert_eq!(v.verify_now(ID, &ts.to_string(), &sig, BODY), want, "{ts}");
    }
}

#[test]
fn stripe_edges() {
    let header = stripe::sign("whsec_x", TS, BODY);
    let tol = Duration::from_secs(300);
    let check = |now| stripe::verify("whsec_x", &header, BODY, now, tol);
    assert_eq!(check(TS + 300), Ok(()));
    assert_eq!(check(TS + 301), Err(VerifyError::TooOld));
    assert_eq!(check(TS - 300), Ok(()));
    assert_eq!(check(TS - 301), Err(VerifyError::TooNew));
}
