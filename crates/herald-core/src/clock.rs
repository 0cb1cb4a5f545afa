//! The wall clock in the unit Herald stores: Unix milliseconds.
//!
//! The pure logic in this crate never calls this; the I/O shells (store, engine, API) do, and hand the
//! value in.

/// A point in time in milliseconds, on whichever clock the caller uses consistently (the wall clock's
/// [`now_ms`] in production, a virtual one in tests). The scheduler and the breaker both count in it.
pub type Millis = i64;

/// Milliseconds since the Unix epoch (0 if the clock is before it; saturating far in the future).
pub fn now_ms() -> i64 {
    let elapsed = now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
}

/// The wall clock as a [`std::time::SystemTime`], for the shells that format or compare one (HTTP dates,
/// `Retry-After`). This is the one place Herald reads the wall clock (see `clippy.toml`).
#[allow(clippy::disallowed_methods)]
pub fn now() -> std::time::SystemTime {
    std::time::SystemTime::now()
}
