//! The store's error type.

use std::time::Duration;

use crate::{custody, integrity};

/// Errors from the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The object does not exist.
    #[error("not found")]
    NotFound,
    /// A unique field (named) is already taken.
    #[error("{0} already exists")]
    Conflict(&'static str),
    /// A pagination iterator that this store did not issue.
    #[error("invalid iterator")]
    BadIterator,
    /// The database failed or could not be reached.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Migrations failed at start-up.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored value could not be decoded (e.g. corrupt JSON text).
    #[error("stored data is invalid: {0}")]
    Corrupt(String),
    /// The store is shutting down.
    #[error("the store is shutting down")]
    Closed,
    /// The database did not answer within the bound of [`custody::DatabaseTimeouts`].
    #[error("the database did not answer within {0:?}")]
    TimedOut(Duration),
    /// A failure shared by every request of a group commit (the underlying error, as text).
    #[error("database error: {0}")]
    Batch(String),
    /// The storage is full (the disk, or the database's quota): nothing was written; retry once space
    /// is freed.
    #[error("storage full: {0}")]
    StorageFull(String),
    /// The database reports its file damaged (what it said): nothing was written.
    #[error("the database file is damaged: {0}")]
    FileCorrupt(String),
    /// The start-up check found the SQLite file damaged (see [`integrity`]).
    #[error(transparent)]
    Damaged(#[from] integrity::Damaged),
    /// The secret key given to the store does not open the secrets stored with it (refused at open, so a
    /// wrong key never signs with garbage), or a stored secret does not decrypt.
    #[error("secret key: {0}")]
    SecretKey(String),
}

impl StoreError {
    /// The storage fault behind this error, if it is one (see [`custody::fault_of`]).
    pub fn fault(&self) -> Option<custody::Fault> {
        match self {
            StoreError::Database(error) => custody::fault_of(error),
            StoreError::StorageFull(_) => Some(custody::Fault::Full),
            StoreError::FileCorrupt(_) | StoreError::Damaged(_) => Some(custody::Fault::Corrupt),
            StoreError::Batch(_) | StoreError::Closed | StoreError::TimedOut(_) => Some(custody::Fault::Unavailable),
            _ => None,
        }
    }

    /// A rollback of a failed batch that failed itself: a fault whatever the database said (a storage
    /// fault stays what it is), since the connection may still hold the batch's transaction — nobody may
    /// replay the batch on it (see `group_commit::close_own_transaction`).
    pub(crate) fn unrolled(error: sqlx::Error) -> StoreError {
        if custody::fault_of(&error).is_some() {
            StoreError::Database(error)
        } else {
            StoreError::Batch(format!("a failed batch could not be rolled back: {error}"))
        }
    }

    /// The error every request of a failed group commit gets: [`StoreError::StorageFull`] when the
    /// storage is full, [`StoreError::Batch`] otherwise.
    pub(crate) fn shared_by_batch(error: &StoreError) -> StoreError {
        match error.fault() {
            Some(custody::Fault::Full) => StoreError::StorageFull(error.to_string()),
            Some(custody::Fault::Corrupt) => StoreError::FileCorrupt(error.to_string()),
            _ => StoreError::Batch(error.to_string()),
        }
    }
}

/// Shorthand for store results.
pub type StoreResult<T> = Result<T, StoreError>;

impl From<custody::TimedOut> for StoreError {
    fn from(timed_out: custody::TimedOut) -> Self {
        StoreError::TimedOut(timed_out.0)
    }
}
