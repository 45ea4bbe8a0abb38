//! The subcommands of the binary: each module turns parsed flags into output.

pub(crate) mod filter;
pub(crate) mod run;
pub(crate) mod size;
