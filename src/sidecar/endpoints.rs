//! The HTTP endpoints on the metrics address: `GET /metrics` (Prometheus' text format),
//! `/ping` (liveness, as nsqd answers it) and `/ready` (readiness).

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::StatusCode;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::status::{table_view, Target};
use super::RunError;
use crate::dedup::backend::Backend;
use crate::http::server::Page;
use crate::metrics::exposition::CONTENT_TYPE;
use crate::pipeline::Dedupe;
use crate::sink::Handler;

/// Binds the metrics address, if there is one.
pub(super) async fn bind(address: Option<SocketAddr>) -> Result<Option<TcpListener>, RunError> {
    let Some(addr) = address else {
        return Ok(None);
    };
    TcpListener::bind(addr)
        .await
        .map(Some)
        .map_err(|source| RunError::metrics(addr, source))
}

/// Serves the endpoints on `listener` until `stop`.
pub(super) fn spawn<H: Handler>(
    listener: TcpListener,
    dedupe: &Dedupe<Backend, H>,
    target: Target,
    stop: &CancellationToken,
) {
    let metrics = dedupe.metrics().clone();
    let store = dedupe.clone();
    let render: Page = (
        CONTENT_TYPE,
        Arc::new(move || {
            let view = table_view(store.store(), target);
            (StatusCode::OK, metrics.render(&view))
        }),
    );
    // nsqd's liveness convention: `GET /ping` answers `OK`.
    let ping: Page = ("text/plain", Arc::new(|| (StatusCode::OK, "OK".to_owned())));
    let readiness = dedupe.metrics().clone();
    let ready: Page = (
        "text/plain",
        Arc::new(move || match readiness.readiness() {
            Ok(()) => (StatusCode::OK, "ready\n".to_owned()),
            Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why.to_owned()),
        }),
    );
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "Serving /metrics, /ping and /ready.");
    }
    let stop = stop.clone();
    tokio::spawn(crate::http::serve(
        listener,
        vec![("/metrics", render), ("/ping", ping), ("/ready", ready)],
        async move { stop.cancelled().await },
    ));
}
