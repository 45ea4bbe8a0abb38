//! Error types of the library.
//!
//! Each message says what is wrong and what is accepted. Where one setting is at fault and the
//! library cannot know whether the user typed a flag or a config key, the caller (the binary or
//! the config's validation) puts that name in front, or the error carries the setting as a
//! field of a [`Wording`] that the caller names as the user gave it. Outcomes that happen in normal
//! running (a duplicate, a keyless body, a store timeout) are enum variants, never panics.

use std::time::Duration;

use crate::wording::Wording;

/// Building a table with an impossible shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    /// `ways` was not one of the supported associativities.
    #[error("{0} ways: expected 1, 2, 4 or 8 (a set must fit in one 64-byte cache line)")]
    Ways(u32),
    /// The slot count was zero.
    #[error("a table needs at least 1 slot, got 0")]
    ZeroSlots,
    /// A memory budget too small for a single set.
    #[error("a budget of {bytes} B holds no complete set of {ways} slots (8 B each); the smallest table of {ways} ways takes {minimum} B")]
    MemoryTooSmall {
        /// The budget that was given.
        bytes: u64,
        /// The associativity that was asked for.
        ways: u32,
        /// The smallest budget that works.
        minimum: u64,
    },
    /// The table's memory is more than the machine has, or the system would not give it.
    #[error("cannot allocate {} for the table{}{}", crate::units::format_bytes(*bytes), if *timed { " with a time beside each slot" } else { "" }, machine_bytes.map_or_else(String::new, |m| format!(" (this machine has {} of memory)", crate::units::format_bytes(m))))]
    Alloc {
        /// The table's size, its times included.
        bytes: u64,
        /// Whether the table keeps a time beside each slot (with `max_age`), which takes as
        /// much memory again as the slots.
        timed: bool,
        /// The machine's physical memory, when known.
        machine_bytes: Option<u64>,
    },
    /// The table would not fit in this machine's address space.
    #[error("{0} slots are too many for this machine's address space")]
    TooLarge(u64),
}

/// A message body from which no de-duplication key could be taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The key is a JSON field but the body is not JSON.
    #[error("body is not valid JSON ({detail}), so key `json:{pointer}` cannot be read")]
    NotJson {
        /// The configured JSON pointer.
        pointer: String,
        /// What the JSON parser said.
        detail: String,
    },
    /// The body is JSON but lacks the field.
    #[error("body has no field at JSON pointer `{pointer}` of the key `json:{pointer}`")]
    MissingField {
        /// The configured JSON pointer.
        pointer: String,
    },
}

/// Parsing a key or digest specification given by the user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// `--key` / `key` was not understood.
    #[error("expected `body` or `json:<JSON pointer>` such as `json:/id`")]
    Key(String),
    /// The JSON pointer of a `json:` key is not valid by RFC 6901.
    #[error("a JSON pointer escapes `~` as `~0` and `/` as `~1`; no other `~` may appear")]
    Pointer(String),
    /// `--digest` / `digest` was not understood.
    #[error("expected `xxh3`, `xxh3:<seed>`, `md5`, or `blake3` with a digest key file")]
    Digest(String),
}

/// A failed operation on a de-duplication store.
///
/// These are values, not panics: the consumer decides what to do with them (requeue the message
/// or process it without de-duplication), so nothing is lost whatever the store does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store did not answer in time.
    #[error("store did not answer within {0:?}; raise `store.timeout` if the server is slow")]
    Timeout(Duration),
    /// The store could not be reached.
    #[error("store at {addr} is unavailable: {detail}")]
    Unavailable {
        /// The server address.
        addr: String,
        /// What went wrong.
        detail: String,
    },
    /// Compare-and-swap kept losing against other writers of the same set.
    #[error("gave up on a set after {attempts} compare-and-swap conflicts with other writers of the same set")]
    Contended {
        /// How many times the update was tried.
        attempts: u32,
    },
    /// The server answered something this client does not understand.
    #[error("store protocol error: {0}")]
    Protocol(String),
    /// The server is out of memory and refuses writes (Redis past its `maxmemory`, with a
    /// `maxmemory-policy` that evicts none of the table's keys). Like an outage, its
    /// operations fail until it has room, and their messages follow `on_store_error`; unlike
    /// most outages it lasts until its settings change, and `detail` names the change.
    #[error("store at {addr} is out of memory: {detail}")]
    OutOfMemory {
        /// The server address.
        addr: String,
        /// What it answered, and the setting to change.
        detail: String,
    },
    /// The store's settings are unusable; the message names the setting.
    #[error("invalid store configuration: {0}")]
    Config(Wording),
    /// The server answered and refused this client (a wrong password, a missing one), or is
    /// not the kind of server the settings name (an HTTP port given as Memcached's). Unlike
    /// an outage, waiting does not help: a setting is wrong, and `detail` names it.
    #[error("store at {addr} refused this client: {detail}")]
    Refused {
        /// The server address.
        addr: String,
        /// What it answered, and the setting to correct.
        detail: Wording,
    },
}
