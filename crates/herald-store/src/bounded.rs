//! Every call to a PostgreSQL store within the client-side bound ([`herald_sql::custody::Bound`]).
//!
//! The store traits are declared through [`bounded_trait!`](herald_sql::bounded_trait), which writes, from
//! the one list of methods, both the trait and its bounded decorator: each `async` method of the
//! decorator runs the inner store's within the bound. A method added to the trait is bounded without
//! anyone having to remember it, and the decorator cannot drift from the trait. [`BoundedStore`] is the
//! sender's decorator ([`crate::open_with`] puts every PostgreSQL store in one); the inbox declares its
//! store the same way.
//!
//! The bound is per call, not per statement: every call is short by design (listings are paged,
//! maintenance works in chunks), and a call that outlasts `statement_timeout + acquire timeout` is
//! answered 503 like one whose server went silent.
//!
//! The two exceptions are [`crate::Store::ingest`] and [`crate::Store::ingest_many`], which bound
//! themselves (declared in the trait's `unbounded` block): cut from outside, a request could be answered
//! 503 while the group-commit writer goes on to commit its message. Their wait is cut only while the
//! writer has not taken the message (see `crate::group_commit::Ticket`).

use crate::SharedStore;
use herald_sql::custody::Bound;

/// The sender's store with every call bounded (see the module's documentation).
pub struct BoundedStore {
    pub(crate) inner: SharedStore,
    pub(crate) bound: Bound,
}

impl BoundedStore {
    /// `inner`, each of its calls given up after `bound`.
    pub fn new(inner: SharedStore, bound: Bound) -> Self {
        Self { inner, bound }
    }

    /// Hand over what the node holds, within the bound: a silent database must not keep the node from
    /// stopping (its leases then expire instead).
    pub(crate) async fn shutdown_within(&self) {
        if !self.bound.run_quietly(self.inner.shutdown()).await {
            tracing::warn!(bound = ?self.bound.limit(), "the store did not shut down in time; its leases expire instead");
        }
    }
}
