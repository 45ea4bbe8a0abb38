//! Test tools: servers that the integration tests start and stop themselves.

pub mod memcached;
