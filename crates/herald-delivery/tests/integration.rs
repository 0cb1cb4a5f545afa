//! The delivery client's integration tests, one binary: real sockets on loopback.

mod checked_addresses_props;
mod common;
mod hostile_responses;
mod proxy;
mod rebinding;
