//! Command-line flags (clap derive) of the `nsq-dedupe` binary.
//!
//! Flags belong to the binary: the library knows nothing of clap. Each subcommand has its
//! flags here and its code under `cmd`, which reads these types; nothing here calls `cmd`.
//! `run`'s flags are grouped by the config section they override.

mod filter;
mod parse;
mod run;
mod size;
mod table;

use clap::{Parser, Subcommand};

pub(crate) use filter::{FilterArgs, MissingKey};
pub(crate) use parse::MAX_WINDOW_MESSAGES;
pub(crate) use run::RunArgs;
pub(crate) use size::SizeArgs;

/// Removes duplicate messages from NSQ streams with bounded memory.
#[derive(Debug, Parser)]
#[command(name = "nsq-dedupe", version, about, propagate_version = true)]
pub(crate) struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Turn a catch probability, a message rate and a window into a table size, or back.
    ///
    /// Give two of --probability, the table size (--buckets or --memory) and the window
    /// (--window with --rate, or --messages); the third is computed.
    Size(SizeArgs),
    /// Write each newline-delimited record whose key was not seen before; drop the copies.
    Filter(FilterArgs),
    /// Consume an NSQ topic, drop the copies, deliver the rest to a sink (the sidecar).
    ///
    /// Settings come from `--config FILE` (TOML) and these flags, which override the file.
    Run(Box<RunArgs>),
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn command_line_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
