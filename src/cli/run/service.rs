//! `run` flags of the `[metrics]` and `[shutdown]` sections: how the service reports and stops.

use clap::Args;
use nsq_dedupe::config::RawConfig;

use super::Overlay;

/// How the service reports and stops.
#[derive(Debug, Args)]
#[command(next_help_heading = "Service")]
pub(crate) struct ServiceFlags {
    /// Where to serve Prometheus metrics, host:port or `off`. `metrics.address`.
    #[arg(long, value_name = "ADDR", env = "NSQ_DEDUPE_METRICS_ADDRESS")]
    pub(crate) metrics_address: Option<String>,
}

impl ServiceFlags {
    pub(super) fn apply(&self, raw: &mut RawConfig, overlay: &mut Overlay<'_>) {
        overlay.value(
            &mut raw.metrics.address,
            self.metrics_address.as_ref(),
            "metrics.address",
            "--metrics-address",
        );
    }
}
