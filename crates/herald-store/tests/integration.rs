//! The store's integration tests, one binary: the contract suite on SQLite and PostgreSQL, leases, collation, polling.

mod fan_out;
mod leases;
mod locked_app;
mod outbox;
mod polling;
mod postgres_collation;
mod postgres_tls;
mod split_fan_out;
mod store;
