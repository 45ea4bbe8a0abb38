//! `[metrics]` and `[shutdown]`: how the service reports and stops.

use std::net::SocketAddr;
use std::time::Duration;

use super::{invalid, resolve, ConfigError, Dur};
use crate::setting::{section, DefaultValue, FlagValue};

/// Where metrics are served when `metrics.address` is not given.
pub(crate) const DEFAULT_METRICS_ADDRESS: &str = "127.0.0.1:9150";

/// How often the one-line status is logged when `metrics.status_interval` is not given.
pub(crate) const DEFAULT_STATUS_INTERVAL: Duration = Duration::from_secs(10);

/// How long running handlers may finish at shutdown when `shutdown.grace` is not given.
pub(crate) const DEFAULT_GRACE: Duration = Duration::from_secs(10);

section! {
    /// `[metrics]`: how the service reports.
    pub struct RawMetrics in "metrics", heading "Service" {
        /// Where to serve Prometheus metrics: host:port, :port (every IPv4 interface) or `off`.
        address: String, flag("metrics-address", value_name: "ADDR");
        /// How often the one-line status is logged (default {default}).
        status_interval: Dur, default(DefaultValue::Duration(DEFAULT_STATUS_INTERVAL)),
            flag("status-interval", value_name: "DURATION", value: FlagValue::Duration);
    }
}

section! {
    /// `[shutdown]`: how the service stops.
    pub struct RawShutdown in "shutdown", heading "Service" {
        /// How long running handlers may finish at shutdown (default {default}).
        grace: Dur, default(DefaultValue::Duration(DEFAULT_GRACE)), flag("shutdown-grace", value_name: "DURATION", value: FlagValue::Duration);
    }
}

/// The validated `[metrics]` and `[shutdown]`.
pub(super) struct Service {
    pub(super) metrics_address: Option<SocketAddr>,
    pub(super) status_interval: Duration,
    pub(super) grace: Duration,
}

pub(super) fn validate(
    metrics: &RawMetrics,
    shutdown: &RawShutdown,
) -> Result<Service, ConfigError> {
    let metrics_address = match metrics
        .address
        .as_deref()
        .unwrap_or(DEFAULT_METRICS_ADDRESS)
    {
        "off" | "" => None,
        text => Some(resolve("metrics.address", text, 9150, true)?),
    };
    let status_interval = metrics
        .status_interval
        .map_or(DEFAULT_STATUS_INTERVAL, |d| d.0);
    if status_interval.is_zero() {
        return Err(invalid(
            "metrics.status_interval",
            "\"0s\"",
            "must be more than 0 (how often the status line is logged)",
        ));
    }
    Ok(Service {
        metrics_address,
        status_interval,
        grace: shutdown.grace.map_or(DEFAULT_GRACE, |d| d.0),
    })
}
