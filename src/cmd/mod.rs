//! The subcommands of the binary: each module turns parsed flags into output.

pub(crate) mod filter;
pub(crate) mod size;
