//! Herald's pure domain logic: identifiers, the retry policy, the classification of attempt outcomes,
//! the SSRF address policy and the delivery scheduler.
//!
//! Nothing in this crate performs I/O, and no decision reads a clock on its own (only minting an id and
//! [`clock::now`], which the I/O shells call, do), so every decision can be tested exhaustively with
//! plain values (and a virtual clock for the scheduler).

pub mod address;
pub mod backoff;
pub mod breaker;
pub mod clock;
pub mod error_text;
pub mod id;
pub mod model;
pub mod outcome;
pub mod redact;
pub mod retry;
pub mod scheduler;
