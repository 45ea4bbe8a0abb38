//! The served TCP port: accepts consumers up to `max_connections`, checks the protocol
//! magic, and runs each connection in its own task (`connection.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::Shared;
use crate::nsq::frame::{encode_frame, FRAME_TYPE_ERROR, MAGIC_V2};

/// How long a new connection has to send its 4-byte magic.
const MAGIC_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts consumers until the endpoint stops or the sidecar starts to stop; the listener is
/// closed on return.
pub(crate) async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let slots = Arc::new(Semaphore::new(shared.config.max_connections));
    let next_client = AtomicU64::new(1);
    loop {
        let (stream, remote) = tokio::select! {
            () = shared.stop_accepting.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "The serve endpoint failed to accept a connection.");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            shared.refused_connections.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%remote, max_connections = shared.config.max_connections, "Consumer refused: too many connections.");
            tokio::spawn(refuse(
                stream,
                format!(
                    "E_INVALID too many connections: the endpoint takes {} consumers (max_connections)",
                    shared.config.max_connections
                ),
            ));
            continue;
        };
        let id = next_client.fetch_add(1, Ordering::Relaxed);
        let shared = shared.clone();
        tokio::spawn(async move {
            let _slot = slot;
            if let Some(stream) = read_magic(stream).await {
                super::connection::run(shared, id, stream, remote).await;
            }
        });
    }
}

/// The connection once it sent `"  V2"`; anything else gets nsqd's `E_BAD_PROTOCOL`.
async fn read_magic(mut stream: TcpStream) -> Option<TcpStream> {
    let mut magic = [0u8; 4];
    match tokio::time::timeout(MAGIC_TIMEOUT, stream.read_exact(&mut magic)).await {
        Ok(Ok(_)) if &magic == MAGIC_V2 => Some(stream),
        Ok(Ok(_)) => {
            refuse(stream, "E_BAD_PROTOCOL".into()).await;
            None
        }
        _ => None,
    }
}

/// Sends one error frame and closes.
async fn refuse(mut stream: TcpStream, text: String) {
    let mut frame = BytesMut::new();
    encode_frame(FRAME_TYPE_ERROR, text.as_bytes(), &mut frame);
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(&frame).await?;
        stream.shutdown().await
    })
    .await;
}
