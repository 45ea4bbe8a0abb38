//! The null sink: takes every record at once and discards it (benchmarks, dry runs).

use bytes::Bytes;

use super::{BuiltIn, Handler, HandlerError};

/// Accepts and discards everything: the sink of `sink.kind = "null"` ([`super::Sink::Null`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct NullSink;

impl Handler for NullSink {
    async fn handle(&self, _body: Bytes) -> Result<(), HandlerError> {
        Ok(())
    }

    async fn handle_batch(&self, bodies: Vec<Bytes>) -> Vec<Result<(), HandlerError>> {
        vec![Ok(()); bodies.len()]
    }

    fn handles_batches(&self) -> bool {
        true
    }

    /// The only built-in sink that does: it discards every record at once and never fails.
    /// Every other sink can fail after it took a record (a write, a publish, a consumer's REQ).
    fn accepts_for_good(&self) -> bool {
        true
    }
}

impl BuiltIn for NullSink {}

/// The null sink has no keys of `[sink]` but `sink.kind`, and no settings.
pub(crate) use super::room::no_sink_keys as sink_keys;

super::room::room_without_settings!(NullSink, "null (records are discarded)", NullSink);
