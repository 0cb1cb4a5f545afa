//! Pure-logic property and table tests, one binary: the address policy and the scheduler.

mod address_policy;
mod scheduler;
