//! Flags that give a table's size and shape, shared by `size` and `filter`.

use crate::Geometry;
use anyhow::Context as _;
use clap::Args;

use super::parse::{parse_buckets, parse_memory, parse_ways};

/// The table's size (`--buckets` or `--memory`) and associativity (`--ways`).
#[derive(Debug, Args)]
pub(crate) struct TableFlags {
    /// Table size in buckets (slots); rounded up to whole sets.
    #[arg(long, value_name = "N", value_parser = parse_buckets, conflicts_with = "memory")]
    pub(crate) buckets: Option<u64>,
    /// Table size as in-process memory, such as 64MiB or 1GiB; rounded down to whole sets.
    #[arg(long, value_name = "SIZE", value_parser = parse_memory)]
    pub(crate) memory: Option<u64>,
    /// Buckets per set: 1 (the classic one-bucket table), 2, 4 or 8.
    #[arg(long, value_name = "W", default_value_t = 8, value_parser = parse_ways)]
    pub(crate) ways: u32,
}

impl TableFlags {
    /// The shape the flags give, or `None` when neither `--buckets` nor `--memory` was given.
    ///
    /// # Errors
    ///
    /// A shape that cannot exist, naming the flag.
    pub(crate) fn geometry(&self) -> anyhow::Result<Option<Geometry>> {
        Ok(match (self.buckets, self.memory) {
            (Some(buckets), _) => {
                Some(Geometry::new(buckets, self.ways).context("invalid `--buckets`")?)
            }
            (None, Some(bytes)) => {
                Some(Geometry::with_memory(bytes, self.ways).context("invalid `--memory`")?)
            }
            (None, None) => None,
        })
    }
}
