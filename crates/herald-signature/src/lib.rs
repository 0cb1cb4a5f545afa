//! Sign and verify webhooks.
//!
//! This crate implements the signature side of Herald, for senders and
//! receivers alike:
//!
//! * [Standard Webhooks] — the `webhook-id`, `webhook-timestamp` and
//!   `webhook-signature` headers, with `v1` signatures (HMAC-SHA256, keyed by
//!   a `whsec_…` [`HmacSecret`]) and `v1a` signatures (Ed25519, signed by a
//!   `whsk_…` [`Ed25519SigningKey`] and verified with a `whpk_…`
//!   [`Ed25519PublicKey`]);
//! * [Stripe](stripe)'s `Stripe-Signature` header;
//! * [GitHub](github)'s `X-Hub-Signature-256` header;
//! * a [bare HMAC-SHA256 of the body](body_hmac), for providers that put it in
//!   a header of their own.
//!
//! Everything here is pure computation over bytes: no I/O, and no clock reads
//! except in the `*_now` convenience functions. Signatures are compared in
//! constant time, and no header, however malformed, can make verification
//! panic.
//!
//! # Signed content
//!
//! A Standard Webhooks signature covers `{id}.{timestamp}.{body}`, where `body`
//! is the raw request body byte for byte. Verify the raw bytes *before*
//! parsing them, then parse those same bytes. The timestamp is the Unix time in
//! seconds, as a canonical decimal integer.
//!
//! During a key rotation the sender signs with every still-valid key and sends
//! the entries space-separated (see [`signature_header`]); the receiver accepts
//! a message if any entry verifies against any of its keys.
//!
//! # Examples
//!
//! Sender side — sign a message with the current and the previous secret:
//!
//! ```
//! use herald_signature::{signature_header, HmacSecret};
//!
//! let current = HmacSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
//! let previous = HmacSecret::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD")?;
//!
//! let msg_id = "msg_p5jXN8AQM9LWM0D4loKWxJek";
//! let timestamp = 1614265330; // seconds since the Unix epoch
//! let body = br#"{"test": 2432232314}"#;
//!
//! let header = signature_header(&[
//!     current.sign(msg_id, timestamp, body),
//!     previous.sign(msg_id, timestamp, body),
//! ]);
//! assert!(header.starts_with("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= v1,"));
//! # Ok::<(), herald_signature::SecretError>(())
//! ```
//!
//! Receiver side — verify the three headers and the raw body:
//!
//! ```
//! use herald_signature::{Ed25519PublicKey, HmacSecret, Verifier, VerifyError, VerifyKey};
//!
//! let verifier = Verifier::new(vec![
//!     VerifyKey::from(HmacSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?),
//!     VerifyKey::from(Ed25519PublicKey::parse(
//!         "whpk_ebVWLo/mVPlAeLES6KmLp5AfhTrmlb7X4OORC60ElmQ=",
//!     )?),
//! ]);
//!
//! // Values as they arrive in the request:
//! let (id, timestamp, signature) = (
//!     "msg_p5jXN8AQM9LWM0D4loKWxJek",
//!     "1614265330",
//!     "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
//! );
//! let body = br#"{"test": 2432232314}"#;
//!
//! // Live traffic: `verify_now` (or `verify` with your own clock reading).
//! // This message is from 2021, so it is rejected as a possible replay...
//! assert_eq!(
//!     verifier.verify_now(id, timestamp, signature, body),
//!     Err(VerifyError::TooOld),
//! );
//! // ...but it is authentic: at the time, it verified.
//! verifier.verify(id, timestamp, signature, body, 1614265330 + 60)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [Standard Webhooks]: https://www.standardwebhooks.com/

#![warn(missing_debug_implementations)]

pub mod body_hmac;
mod ed25519;
mod error;
pub mod github;
mod header_names;
mod hmac_secret;
mod signing_key;
pub mod stripe;
mod util;
mod verify;

pub use crate::ed25519::{Ed25519PublicKey, Ed25519SigningKey};
pub use crate::error::{SecretError, VerifyError};
pub use crate::header_names::{
    HeaderNames, HeaderSet, SVIX_HEADER_ID, SVIX_HEADER_SIGNATURE, SVIX_HEADER_TIMESTAMP, UnknownHeaderNames,
};
pub use crate::hmac_secret::HmacSecret;
pub use crate::signing_key::SigningKey;
pub use crate::verify::{
    DEFAULT_TOLERANCE, HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP, Verifier, VerifyKey, signature_header,
};
