//! Connections to Redis: one multiplexed connection to a server, or a cluster connection that
//! keeps one to each master and routes by slot. Both pipeline concurrent commands: whatever
//! callers send while earlier commands are on the wire goes out in the next write, so
//! concurrent operations share round trips without a queue of our own.
//!
//! A standalone connection that fails is dropped and the next operation opens a new one
//! (after a server restart, say). The cluster connection repairs itself: it reconnects to
//! nodes, follows `MOVED` and `ASK`, and reloads the slot map when a node fails over.

use std::sync::Mutex;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisFuture, Value};

use super::config::RedisConfig;
use crate::error::StoreError;

/// Where the connections come from.
pub(super) enum Client {
    Single(redis::Client),
    Cluster(redis::cluster::ClusterClient),
}

/// One usable connection; clones share it.
#[derive(Clone)]
pub(super) enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(conn) => conn.req_packed_command(cmd),
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(conn) => conn.req_packed_commands(cmd, offset, count),
            Conn::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(conn) => conn.get_db(),
            Conn::Cluster(conn) => conn.get_db(),
        }
    }
}

/// The client and the connection it opened last, opened again after a failure.
pub(super) struct Link {
    client: Client,
    timeout: Duration,
    /// The open connection, if any. A `std` mutex: held only to clone or replace it, never
    /// across an `.await`.
    current: Mutex<Option<Conn>>,
    /// Held while connecting, so that many callers waiting for a connection open one.
    connecting: tokio::sync::Mutex<()>,
    /// For errors and logs: the servers' addresses, without user or password.
    pub(super) addr: String,
}

impl Link {
    /// A link for `config`; nothing is contacted yet.
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] for URLs the client refuses or an unusable CA file.
    pub(super) fn new(config: &RedisConfig) -> Result<Self, StoreError> {
        let refuse = |error: redis::RedisError| {
            StoreError::Config(format!("`store.redis_urls`: {error}"))
        };
        let mut infos = Vec::with_capacity(config.urls.len());
        let mut hosts = Vec::with_capacity(config.urls.len());
        for url in &config.urls {
            // `parse_url` rejects what the client would, naming the entry without its user part.
            super::config::parse_url(url)?;
            let mut info = url.as_str().into_connection_info().map_err(refuse)?;
            if let Some(password) = &config.password {
                info.redis.password = Some(password.expose().to_owned());
            }
            hosts.push(info.addr.to_string());
            infos.push(info);
        }
        let certificates = match (&config.tls_root_ca_file, config.uses_tls()) {
            (Some(path), true) => Some(redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(trusted_roots_pem(path)?),
            }),
            _ => None,
        };
        let client = if config.cluster {
            let mut builder = redis::cluster::ClusterClientBuilder::new(infos)
                .connection_timeout(config.timeout)
                .response_timeout(config.timeout);
            if let Some(password) = &config.password {
                builder = builder.password(password.expose().to_owned());
            }
            if config.uses_tls() {
                builder = builder.tls(redis::cluster::TlsMode::Secure);
            }
            if let Some(certificates) = certificates {
                builder = builder.certs(certificates);
            }
            Client::Cluster(builder.build().map_err(refuse)?)
        } else {
            let info = infos.pop().ok_or_else(|| {
                StoreError::Config("`store.redis_urls` is empty; give a redis:// URL".into())
            })?;
            Client::Single(match certificates {
                Some(certificates) => {
                    redis::Client::build_with_tls(info, certificates).map_err(refuse)?
                }
                None => redis::Client::open(info).map_err(refuse)?,
            })
        };
        let addr = if config.cluster {
            format!("redis cluster {}", hosts.join(","))
        } else {
            hosts.join(",")
        };
        Ok(Link {
            client,
            timeout: config.timeout,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            addr,
        })
    }

    /// The open connection, or a new one.
    ///
    /// # Errors
    ///
    /// What connecting gave, within the time limit.
    pub(super) async fn conn(&self) -> Result<Conn, StoreError> {
        if let Some(conn) = self.open() {
            return Ok(conn);
        }
        let _connecting = match tokio::time::timeout(self.timeout, self.connecting.lock()).await
        {
            Ok(guard) => guard,
            Err(_) => return Err(StoreError::Timeout(self.timeout)),
        };
        if let Some(conn) = self.open() {
            return Ok(conn);
        }
        let conn = match tokio::time::timeout(self.timeout, self.connect()).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(error)) => return Err(self.error(&error)),
            Err(_) => return Err(StoreError::Timeout(self.timeout)),
        };
        *self.slot() = Some(conn.clone());
        Ok(conn)
    }

    /// Drops the open standalone connection after an error that may have broken it; the
    /// cluster connection repairs itself and is kept.
    pub(super) fn forget(&self, error: &redis::RedisError) {
        let broken = error.is_io_error()
            || error.is_timeout()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || error.is_unrecoverable_error();
        if broken && matches!(self.client, Client::Single(_)) {
            *self.slot() = None;
        }
    }

    /// Drops the open standalone connection after an operation ran out of time.
    pub(super) fn forget_after_timeout(&self) {
        if matches!(self.client, Client::Single(_)) {
            *self.slot() = None;
        }
    }

    /// A [`StoreError`] for `error`, naming the servers (never a password).
    pub(super) fn error(&self, error: &redis::RedisError) -> StoreError {
        if error.is_timeout() {
            return StoreError::Timeout(self.timeout);
        }
        StoreError::Unavailable {
            addr: self.addr.clone(),
            detail: error.to_string(),
        }
    }

    fn open(&self) -> Option<Conn> {
        self.slot().clone()
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Conn>> {
        // A poisoned lock still holds a whole `Option`.
        self.current
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    async fn connect(&self) -> Result<Conn, redis::RedisError> {
        match &self.client {
            Client::Single(client) => {
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(self.timeout)
                    .set_response_timeout(self.timeout);
                let conn = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                Ok(Conn::Single(conn))
            }
            Client::Cluster(client) => Ok(Conn::Cluster(client.get_async_connection().await?)),
        }
    }
}

/// The system's trusted roots and the certificates of `path`, as one PEM text: the client
/// library trusts exactly the roots it is given.
fn trusted_roots_pem(path: &std::path::Path) -> Result<Vec<u8>, StoreError> {
    use base64::Engine as _;
    use rustls::pki_types::pem::PemObject as _;
    let unusable = |reason: String| {
        StoreError::Config(format!(
            "`store.redis_tls_root_ca_file` {}: {reason}",
            path.display()
        ))
    };
    let file = std::fs::read(path).map_err(|error| unusable(error.to_string()))?;
    let own: Vec<_> = rustls::pki_types::CertificateDer::pem_slice_iter(&file)
        .collect::<Result<_, _>>()
        .map_err(|error| unusable(format!("not a PEM file of certificates ({error})")))?;
    if own.is_empty() {
        return Err(unusable("holds no PEM certificate".into()));
    }
    let mut pem = Vec::new();
    for der in rustls_native_certs::load_native_certs()
        .certs
        .iter()
        .chain(&own)
    {
        let body = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
        pem.extend_from_slice(b"-----BEGIN CERTIFICATE-----\n");
        for line in body.as_bytes().chunks(64) {
            pem.extend_from_slice(line);
            pem.push(b'\n');
        }
        pem.extend_from_slice(b"-----END CERTIFICATE-----\n");
    }
    Ok(pem)
}
