//! `run` flags of the `[dedupe]` section: how bodies are keyed.

use clap::Args;
use nsq_dedupe::config::RawConfig;

use super::Overlay;

/// How bodies are keyed.
#[derive(Debug, Args)]
#[command(next_help_heading = "De-duplication")]
pub(crate) struct DedupeFlags {
    /// Key of a body: `body` or `json:<pointer>`. `dedupe.key`.
    #[arg(long, value_name = "KEY")]
    pub(crate) key: Option<String>,
}

impl DedupeFlags {
    pub(super) fn apply(&self, raw: &mut RawConfig, overlay: &mut Overlay<'_>) {
        overlay.value(
            &mut raw.dedupe.key,
            self.key.as_ref(),
            "dedupe.key",
            "--key",
        );
    }
}
