//! Test tools: servers that the integration tests start and stop themselves.

pub mod broker;
pub mod lookupd;
pub mod memcached;
