//! Connections to Redis: one multiplexed connection per node, and, for a Redis Cluster, the
//! routing of each key to the master of its slot.
//!
//! A multiplexed connection pipelines concurrent commands: whatever callers send while
//! earlier commands are on the wire goes out in the next write, so concurrent operations share
//! round trips without a queue of our own. A connection that fails is dropped and the next
//! operation opens a new one (after a server restart, say).
//!
//! In a cluster, the slot map comes from `CLUSTER SLOTS` of any node that answers (the seeds
//! first). An operation goes to the master of its key's slot; `MOVED` updates the map and
//! sends it on to the new master, `ASK` sends it once to the importing node with `ASKING`
//! first (in the same write, so nothing comes between), and a dead node or `CLUSTERDOWN`
//! reloads the map and tries again until the operation's time limit: a failover is answered
//! as soon as the cluster has promoted a replica.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{ErrorKind, IntoConnectionInfo, RedisError, Script, Value};

use super::config::RedisConfig;
use super::refusal::Credentials;
use super::slots::SlotMap;
use crate::error::StoreError;

/// Redirections one operation follows before giving up.
const MAX_REDIRECTS: u32 = 8;

/// The pause before retrying an operation on a cluster that is failing over.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// The connections to the servers of one store.
pub(super) struct Link {
    /// `host:port` of each URL: the server, or the cluster's seed nodes.
    seeds: Vec<String>,
    cluster: bool,
    timeout: Duration,
    /// How to open a connection to a node, given its `host:port`.
    template: Template,
    /// Open connections by `host:port`. A `std` mutex: held only to clone, add or remove an
    /// entry, never across an `.await`.
    nodes: Mutex<HashMap<String, MultiplexedConnection>>,
    /// Held while connecting, so that many callers waiting for one node open one connection.
    connecting: tokio::sync::Mutex<()>,
    /// The cluster's slot map (empty until first read, and for a standalone server).
    slots: Mutex<SlotMap>,
    /// Held while the slot map is read again, so that one failover reloads it once.
    refreshing: tokio::sync::Mutex<()>,
    /// `MOVED` and `ASK` answers followed.
    pub(super) redirects: AtomicU64,
    /// For errors and logs: the servers' addresses, without user or password.
    pub(super) addr: String,
    /// Who this client is, for the message of a server's refusal.
    credentials: Credentials,
}

/// What every node's connection shares: TLS, the user, the password, the database.
struct Template {
    tls: bool,
    /// The PEM roots to trust instead of the client library's default (the system's).
    root_pem: Option<Vec<u8>>,
    username: Option<String>,
    password: Option<String>,
    db: i64,
}

impl Link {
    /// A link for `config`; nothing is contacted yet.
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] for URLs the client refuses or an unusable CA file.
    pub(super) fn new(config: &RedisConfig) -> Result<Self, StoreError> {
        let mut seeds = Vec::with_capacity(config.urls.len());
        let mut first = None;
        for url in &config.urls {
            super::config::parse_url(url)?;
            let info = url.as_str().into_connection_info().map_err(|error| {
                StoreError::Config(format!(
                    "`store.redis_urls` entry {:?}: {error}",
                    crate::redact::url(url)
                ))
            })?;
            seeds.push(info.addr.to_string());
            first.get_or_insert(info);
        }
        let Some(first) = first else {
            return Err(StoreError::Config(
                "`store.redis_urls` is empty; give a redis:// URL".into(),
            ));
        };
        let tls = config.uses_tls();
        let root_pem = match (&config.tls_root_ca_file, tls) {
            (Some(path), true) => Some(trusted_roots_pem(path)?),
            _ => None,
        };
        let addr = if config.cluster {
            format!("redis cluster {}", seeds.join(","))
        } else {
            seeds.join(",")
        };
        Ok(Link {
            seeds,
            cluster: config.cluster,
            timeout: config.timeout,
            template: Template {
                tls,
                root_pem,
                username: first.redis.username.clone(),
                password: config.password.as_ref().map(|p| p.expose().to_owned()),
                db: first.redis.db,
            },
            nodes: Mutex::new(HashMap::new()),
            connecting: tokio::sync::Mutex::new(()),
            slots: Mutex::new(SlotMap::default()),
            refreshing: tokio::sync::Mutex::new(()),
            redirects: AtomicU64::new(0),
            addr,
            credentials: Credentials::of(config, first.redis.username.as_deref()),
        })
    }

    /// Loads `script` on the server, or on every master of the cluster (reading the slot
    /// map first): a check that the servers answer and run scripts.
    ///
    /// # Errors
    ///
    /// The first node that fails.
    pub(super) async fn load_script(&self, script: &Script) -> Result<(), StoreError> {
        let nodes = if self.cluster {
            self.refresh_slots().await?;
            self.slots_map().all_masters()
        } else {
            self.seeds.clone()
        };
        for node in nodes {
            let mut conn = self.node(&node).await?;
            let loaded: Result<String, RedisError> =
                script.prepare_invoke().load_async(&mut conn).await;
            if let Err(error) = loaded {
                return Err(self.failed(&node, &error));
            }
        }
        Ok(())
    }

    /// Runs `evalsha` (an `EVALSHA` of `script` whose keys all lie in `slot`, which a
    /// standalone server ignores) on the node that serves `slot`, following redirections,
    /// loading the script where it is missing, and (in a cluster) waiting out a failover.
    /// Time-limited by the caller.
    ///
    /// # Errors
    ///
    /// The node's error; in a standalone server the first error, in a cluster the last one.
    pub(super) async fn eval(
        &self,
        script: &Script,
        slot: u16,
        evalsha: &redis::Cmd,
    ) -> Result<Value, StoreError> {
        let mut ask: Option<String> = None;
        let mut redirects = 0;
        loop {
            let node = match &ask {
                Some(node) => node.clone(),
                None => self.route(slot).await?,
            };
            let mut conn = match self.node(&node).await {
                Ok(conn) => conn,
                Err(error) if !self.cluster => return Err(error),
                Err(_) => {
                    // The node died: its replica takes over once the cluster notices.
                    tokio::time::sleep(RETRY_PAUSE).await;
                    let _ = self.refresh_slots().await;
                    ask = None;
                    continue;
                }
            };
            let result: Result<Value, RedisError> = if ask.is_some() {
                let mut pipe = redis::pipe();
                pipe.cmd("ASKING").ignore().add_command(evalsha.clone());
                pipe.query_async::<(Value,)>(&mut conn)
                    .await
                    .map(|(value,)| value)
            } else {
                evalsha.query_async(&mut conn).await
            };
            let error = match result {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            match error.kind() {
                ErrorKind::NoScriptError => {
                    // A restarted server, or a replica promoted before it saw the script.
                    let loaded: Result<String, RedisError> =
                        script.prepare_invoke().load_async(&mut conn).await;
                    if let Err(error) = loaded {
                        return Err(self.failed(&node, &error));
                    }
                }
                ErrorKind::Moved | ErrorKind::Ask if self.cluster => {
                    redirects += 1;
                    // A statistic: nothing else depends on it.
                    self.redirects.fetch_add(1, Ordering::Relaxed);
                    let Some((to, to_slot)) = error.redirect_node() else {
                        return Err(self.failed(&node, &error));
                    };
                    if redirects > MAX_REDIRECTS {
                        return Err(self.failed(&node, &error));
                    }
                    let to = if to.starts_with(':') {
                        // Redis leaves the host out when it does not know its own name.
                        format!("{}{to}", host_of(&node))
                    } else {
                        to.to_owned()
                    };
                    if error.kind() == ErrorKind::Moved {
                        self.slots_map().moved(to_slot, &to);
                        ask = None;
                    } else {
                        ask = Some(to);
                    }
                }
                ErrorKind::TryAgain
                | ErrorKind::ClusterDown
                | ErrorKind::MasterDown
                | ErrorKind::ReadOnly
                    if self.cluster =>
                {
                    tokio::time::sleep(RETRY_PAUSE).await;
                    let _ = self.refresh_slots().await;
                    ask = None;
                }
                _ if self.cluster && is_connection_error(&error) => {
                    // The node died: its replica takes over once the cluster notices.
                    self.drop_node(&node);
                    tokio::time::sleep(RETRY_PAUSE).await;
                    let _ = self.refresh_slots().await;
                    ask = None;
                }
                _ => return Err(self.failed(&node, &error)),
            }
        }
    }

    /// The master of `slot` (the server, when standalone).
    async fn route(&self, slot: u16) -> Result<String, StoreError> {
        if !self.cluster {
            return Ok(self.seeds[0].clone());
        }
        if let Some(master) = self.slots_map().master(slot) {
            return Ok(master.to_owned());
        }
        self.refresh_slots().await?;
        self.slots_map()
            .master(slot)
            .map(str::to_owned)
            .ok_or_else(|| StoreError::Unavailable {
                addr: self.addr.clone(),
                detail: format!("no master serves slot {slot}"),
            })
    }

    /// Reads the slot map from the first node that answers: known masters, then the seeds.
    async fn refresh_slots(&self) -> Result<(), StoreError> {
        let _refreshing = self.refreshing.lock().await;
        let mut candidates = self.slots_map().all_masters();
        candidates.extend(self.seeds.iter().cloned());
        let mut last = None;
        for node in candidates {
            let mut conn = match self.node(&node).await {
                Ok(conn) => conn,
                Err(error) => {
                    last = Some(error);
                    continue;
                }
            };
            let answer: Result<Value, RedisError> = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async(&mut conn)
                .await;
            match answer {
                Ok(value) => match SlotMap::from_cluster_slots(&value, host_of(&node)) {
                    Ok(map) if !map.all_masters().is_empty() => {
                        *self.slots_map() = map;
                        return Ok(());
                    }
                    Ok(_) => {
                        last = Some(StoreError::Unavailable {
                            addr: node.clone(),
                            detail: "CLUSTER SLOTS named no master".into(),
                        })
                    }
                    Err(detail) => last = Some(StoreError::Protocol(detail)),
                },
                Err(error) => last = Some(self.failed(&node, &error)),
            }
        }
        Err(last.unwrap_or_else(|| StoreError::Unavailable {
            addr: self.addr.clone(),
            detail: "no node to ask for the slot map".into(),
        }))
    }

    /// The open connection to `node`, or a new one.
    async fn node(&self, node: &str) -> Result<MultiplexedConnection, StoreError> {
        if let Some(conn) = self.open(node) {
            return Ok(conn);
        }
        let _connecting = self.connecting.lock().await;
        if let Some(conn) = self.open(node) {
            return Ok(conn);
        }
        let client = self.client_for(node)?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(self.timeout)
            .set_response_timeout(self.timeout);
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|error| self.failed(node, &error))?;
        self.nodes_map().insert(node.to_owned(), conn.clone());
        Ok(conn)
    }

    fn client_for(&self, node: &str) -> Result<redis::Client, StoreError> {
        let t = &self.template;
        let scheme = if t.tls { "rediss" } else { "redis" };
        let mut info = format!("{scheme}://{node}/{}", t.db)
            .into_connection_info()
            .map_err(|error| self.failed(node, &error))?;
        info.redis.username.clone_from(&t.username);
        info.redis.password.clone_from(&t.password);
        let client = match &t.root_pem {
            Some(root_pem) => redis::Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root_pem.clone()),
                },
            ),
            None => redis::Client::open(info),
        };
        client.map_err(|error| StoreError::Config(format!("`store.redis_urls`: {error}")))
    }

    /// Drops the connection to `node` after an error that may have broken it.
    pub(super) fn drop_node(&self, node: &str) {
        self.nodes_map().remove(node);
    }

    /// Drops every connection after an operation ran out of time: a server that stopped
    /// answering; the next operation connects again.
    pub(super) fn forget_after_timeout(&self) {
        self.nodes_map().clear();
    }

    /// A [`StoreError`] for `error` at `node` (never showing a password): a refusal when it
    /// means a setting is wrong (see `refusal`); drops the node's connection if the error may
    /// have broken it.
    fn failed(&self, node: &str, error: &RedisError) -> StoreError {
        if is_connection_error(error) {
            self.drop_node(node);
        }
        if error.is_timeout() {
            return StoreError::Timeout(self.timeout);
        }
        if let Some(refused) = self.credentials.refusal(node, error) {
            return refused;
        }
        match error.kind() {
            ErrorKind::ResponseError | ErrorKind::ExtensionError | ErrorKind::TypeError => {
                StoreError::Protocol(format!("{node}: {error}"))
            }
            _ => StoreError::Unavailable {
                addr: node.to_owned(),
                detail: error.to_string(),
            },
        }
    }

    fn open(&self, node: &str) -> Option<MultiplexedConnection> {
        self.nodes_map().get(node).cloned()
    }

    fn nodes_map(&self) -> std::sync::MutexGuard<'_, HashMap<String, MultiplexedConnection>> {
        // A poisoned lock still holds a whole map.
        self.nodes
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    fn slots_map(&self) -> std::sync::MutexGuard<'_, SlotMap> {
        // As above.
        self.slots
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

/// Whether `error` means the connection is gone or useless.
fn is_connection_error(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_unrecoverable_error()
        || error.kind() == ErrorKind::ClientError
}

/// The host part of `host:port`.
fn host_of(node: &str) -> &str {
    node.rsplit_once(':').map_or(node, |(host, _)| host)
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
