//! Herald's end-to-end tests, one binary: each module drives the real `herald` binary (or several) against real stores and receivers on loopback.

// Tests stand outside the rule of `clippy.toml`: they compare what Herald did with the wall clock.
#![allow(clippy::disallowed_methods)]

mod api_errors;
mod bench;
mod browser;
mod cli;
mod cluster;
mod common;
mod corrupt_database;
mod dashboard;
mod database_faults;
mod delivery;
mod disk_full;
mod durability;
mod edge;
mod flow_control;
mod inbox;
mod io_errors;
mod locked_database;
mod metrics;
mod operational;
mod operations;
mod ops_cli;
mod ownership;
mod polling;
mod postgres;
mod relay;
mod repository;
mod resources;
mod retention;
mod scheduled;
mod secrets;
mod ssrf;
mod svix_compat;
mod tenancy;
