//! placeholder
pub mod model;
