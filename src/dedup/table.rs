//! The in-process table (work in progress).

/// The in-process table.
#[derive(Debug)]
pub struct Table;
