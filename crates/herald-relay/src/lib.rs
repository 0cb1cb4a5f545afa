//! Herald's transactional-outbox relay.
//!
//! A producer writes each event into an outbox table *in the same transaction* as the state change it
//! describes; a relay publishes committed rows through Herald's Svix-compatible API and then deletes (or
//! marks) them. A rolled-back transaction leaves no row, so nothing is published; a committed row is
//! published at least once, and because each publish carries the row's event id as `eventId`, Herald
//! keeps exactly one message per row however often it is published (after a crash, say).
//!
//! - [`dialect`]: the SQL for PostgreSQL, MariaDB/MySQL and SQLite (the DDL is in docs/outbox.md).
//! - [`outbox`]: the table: claim (`FOR UPDATE SKIP LOCKED` where the database has it), delete, mark.
//! - [`order`]: which claimed rows may go now, so rows of one ordering key keep outbox order even with
//!   several relays on one table.
//! - [`publish`]: `POST /api/v1/app/{app}/msg`, and which answers are final.
//! - [`relay`]: the loop, with back-off while Herald or the source is unreachable.
//! - [`config`]: `[[relay]]` sections and `herald relay`'s flags; [`metrics`]: lag and throughput.

pub mod config;
pub mod dialect;
pub mod metrics;
pub mod order;
pub mod outbox;
pub mod publish;
pub mod relay;
pub mod row;

pub use config::{RelayConfig, RelaySection};
pub use relay::{BatchReport, Relay};
