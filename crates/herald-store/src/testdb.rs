//! Test support: a fresh PostgreSQL database per test ([`herald_sql::testdb`], whose items this module
//! hands on so that the sender's tests find them in one place), and the key test stores are opened with.

pub use herald_sql::testdb::{DEFAULT_SERVER, TestDatabase, fresh, fresh_linguistic};

/// The key test stores encrypt endpoint secrets with (base64 of 32 bytes), e.g. as `HERALD_SECRET_KEY`
/// for a node on a test database: a PostgreSQL database needs the key configured.
pub const TEST_SECRET_KEY: &str = "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=";

/// A cipher with [`TEST_SECRET_KEY`], to open test stores with.
///
/// # Panics
/// Never: the key is valid.
pub fn test_cipher() -> crate::SecretCipher {
    crate::SecretCipher::from_base64(TEST_SECRET_KEY).expect("the test key is valid")
}
