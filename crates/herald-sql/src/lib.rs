//! The database plumbing Herald's two stores share — the sender's (`herald-store`) and the inbox's
//! (`herald-inbox`), each with its own tables, both on SQLite or PostgreSQL:
//!
//! - [`custody`]: storage faults told from request errors, the SQLite writer's clean-state check, the
//!   PostgreSQL timeouts and the client-side [`custody::Bound`] on every call, the write health `/health`
//!   reports.
//! - [`integrity`]: the start-up check of a SQLite file, so a damaged one is refused with what to do.
//! - [`bounded_trait!`]: a store trait and its bounded decorator, written from one list of methods.
//! - [`text`]: PostgreSQL's `text` cannot hold NUL; free text is stored escaped.
//! - [`proc_net`]: Linux's tables of TCP sockets and open descriptors, read.
//! - `tcp_nodelay`: `TCP_NODELAY` on every PostgreSQL connection over TCP.
//! - [`loopback`]: connection options, without TLS on a loopback host unless a mode is chosen.
//! - `testdb` (feature `testdb`, tests only): a fresh PostgreSQL database per test.

mod bounded;
pub mod custody;
pub mod integrity;
pub mod loopback;
pub mod proc_net;
pub mod tcp_nodelay;
#[cfg(feature = "testdb")]
pub mod testdb;
pub mod text;

/// Whether a URL names a PostgreSQL database.
pub fn is_postgres_url(database_url: &str) -> bool {
    database_url.starts_with("postgres://") || database_url.starts_with("postgresql://")
}
