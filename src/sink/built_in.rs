//! What the sidecar asks of its own sinks beyond [`Handler`](super::Handler): their figures
//! for `/metrics`, and whether their output closed or a server refused them for good. Only
//! some built-in sinks have any (the serve sink's consumers, stdout's reader, the nsq sink's
//! nsqd), so the public [`Handler`](super::Handler) keeps only what every handler needs, and
//! each sink's room says what it has by implementing [`BuiltIn`]. A library user's handler
//! has none: the sidecar watches [`Watch::default`] for it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// A sink's extras, which the sidecar watches. Crate-private: implemented by the [`Sink`]
/// enum (each variant's own) and by each sink.
///
/// [`Sink`]: super::Sink
pub(crate) trait BuiltIn {
    /// What the sidecar watches of the sink. Defaults to: nothing.
    fn watch(&self) -> Watch {
        Watch::default()
    }
}

/// A future the sidecar waits on while it runs.
pub(crate) type Watched<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What the sidecar watches of a sink besides its answers; each part `None` when the sink has
/// no such thing.
#[derive(Default)]
pub(crate) struct Watch {
    /// The sink's own figures for `/metrics` (the serve sink's consumers and their answers).
    pub(crate) metrics: Option<Arc<dyn crate::metrics::HandlerMetrics>>,
    /// Completes, with the reason, once the sink can never take a message again (its output
    /// was closed for good, as a stdout whose reader went away). The sidecar then stops
    /// gracefully, requeueing what it holds.
    pub(crate) closed: Option<Watched<std::io::Error>>,
    /// Completes, with the refusal, once a server refused the sink in a way no retry changes
    /// (an nsqd refusing AUTH or TLS). The sidecar then stops gracefully and exits with the
    /// error, which names the setting to change.
    pub(crate) refused: Option<Watched<Arc<crate::nsq::Error>>>,
}
