//! Signature tests, one binary: vectors, interoperability with independent verifiers, properties, tolerance.

// Tests stand outside the rule of `clippy.toml`: they compare what Herald did with the wall clock.
#![allow(clippy::disallowed_methods)]

mod interop;
mod properties;
mod tolerance;
mod vectors;
