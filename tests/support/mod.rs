//! Test tools: servers that the integration tests start and stop themselves.

pub mod broker;
pub mod child;
pub mod hold;
pub mod http;
pub mod lookupd;
pub mod memcached;
pub mod nsqd_stats;
pub mod redis;
pub mod server;
pub mod wire;
