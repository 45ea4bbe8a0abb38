//! The integration tests: one binary, one module per area.
//!
//! Tests that need servers start them themselves on free loopback ports: a real `memcached`
//! (see `support::memcached`), `redis-server` (see `support::redis`) and a test broker that
//! speaks NSQ's wire protocol (see `support::broker`).

mod support;
mod util;

mod batch;
mod cli_completions;
mod cli_docs;
mod cli_env;
mod cli_errors;
mod cli_filter;
mod cli_settings;
mod cli_size;
mod cli_size_growth;
mod cli_size_nsqd;
mod cli_start;
mod closed_at_start;
mod closed_output;
mod cluster_failover;
mod code_shape;
mod copies_wait;
mod deferral_race;
mod doc_commands;
mod docs;
mod file_sink;
mod final_handler;
mod http_sink;
mod layout;
mod memcached;
mod near_table;
mod nsq;
mod nsq_transport;
mod odd_files;
mod outage_backoff;
mod outage_logs;
mod package;
mod redis;
mod redis_commit;
mod redis_compact;
mod redis_ifeq;
mod redis_tls;
mod resize_safety;
mod secrets;
mod self_sizing;
mod serve;
mod serve_run;
mod shared_resize;
mod sidecar;
mod sidecar_config;
mod sidecar_delivery;
mod sidecar_http_sink;
mod sidecar_metrics;
mod sidecar_nsq_sink;
mod sidecar_shared_store;
mod sidecar_shutdown;
mod sidecar_stdout;
mod sidecar_throughput;
mod store_contract;
mod store_refusals;
mod table;
mod table_file;
