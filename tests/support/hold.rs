//! A loopback proxy that holds back one chosen write of its client, to make a race between
//! two round trips of a store happen on purpose.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Notify};

/// A loopback proxy to `server` that forwards everything, except that once armed it holds
/// back the first write of a client that carries `marker` (a command's name) until released.
pub struct Hold {
    pub addr: SocketAddr,
    armed: Arc<Mutex<Option<oneshot::Sender<()>>>>,
    pub release: Arc<Notify>,
}

impl Hold {
    pub async fn start(server: SocketAddr, marker: &'static [u8]) -> Hold {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let armed: Arc<Mutex<Option<oneshot::Sender<()>>>> = Arc::default();
        let release = Arc::new(Notify::new());
        let (a, r) = (Arc::clone(&armed), Arc::clone(&release));
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = TcpStream::connect(server).await.unwrap();
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, mut to_server) = upstream.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
                });
                let (armed, release) = (Arc::clone(&a), Arc::clone(&r));
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 1 << 16];
                    loop {
                        let n = match from_client.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        let holds = buf[..n].windows(marker.len()).any(|w| w == marker);
                        let held = if holds {
                            armed.lock().unwrap().take()
                        } else {
                            None
                        };
                        if let Some(held) = held {
                            let _ = held.send(());
                            release.notified().await;
                        }
                        if to_server.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Hold {
            addr,
            armed,
            release,
        }
    }

    /// Holds the next write that carries the marker; the receiver hears when it is held.
    pub fn arm(&self) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        *self.armed.lock().unwrap() = Some(tx);
        rx
    }
}
