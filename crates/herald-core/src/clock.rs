//! The wall clock in the unit Herald stores: Unix milliseconds.
//!
//! The pure logic in this crate never calls this; the I/O shells (store, engine, API) do, and hand the
//! value in.

/// Milliseconds since the Unix epoch (0 if the clock is before it; saturating far in the future).
pub fn now_ms() -> i64 {
    let elapsed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
}
