//! Connections to Redis: one multiplexed connection per node, and, for a Redis Cluster, the
//! routing of each key to the master of its slot.
//!
//! A multiplexed connection pipelines concurrent commands: whatever callers send while
//! earlier commands are on the wire goes out in the next write, so concurrent operations share
//! round trips without a queue of our own. The compact layout's hot path sends its pipelines
//! on connections of our own instead (`lean`), with the same deadlines and routing.
//!
//! In a cluster, the slot map comes from `CLUSTER SLOTS`, asked of every known node at once
//! (the masters in the map and the seeds), the first answer winning, so that a dead or frozen
//! node never holds up the others. An operation goes to the master of its key's slot; `MOVED`
//! updates the map and sends it on to the new master, `ASK` sends it once to the importing
//! node with `ASKING` first (in the same write, so nothing comes between), and a dead node or
//! `CLUSTERDOWN` reloads the map and tries again until the operation's time limit: a failover
//! is answered as soon as the cluster has promoted a replica.
//!
//! # Failures stay with their node
//!
//! A sidecar sends bursts: many operations at once, spread over every master. Each operation
//! is bounded by its own deadline ([`RedisConfig::timeout`]), and what happens at one node
//! stays with it:
//! - an operation that runs out of time drops the connection it waited on (that node's only),
//!   and marks the slot map stale: the next operation in a cluster reads it again first, so a
//!   master that froze (no error, no answer) is replaced by its promoted replica as soon as
//!   the cluster says so;
//! - connecting to one node never waits for a connection to another (a lock per node);
//! - the slot map is read once per failure, however many operations saw that failure (a
//!   generation number), and never by more than one operation at a time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{ErrorKind, IntoConnectionInfo, RedisError, Script};
use tokio::time::Instant;

mod lean;
mod operation;
mod routing;

use super::config::RedisConfig;
use super::refusal::{self, Credentials};
use super::slots::SlotMap;
use crate::error::StoreError;
use crate::wording::Wording;

/// The connections to the servers of one store.
pub(super) struct Link {
    /// `host:port` of each URL: the server, or the cluster's seed nodes.
    seeds: Vec<String>,
    cluster: bool,
    /// The time limit of one operation (`store.timeout`).
    timeout: Duration,
    /// How to open a connection to a node, given its `host:port`.
    template: Template,
    /// Open connections by `host:port`. A `std` mutex: held only to clone, add or remove an
    /// entry, never across an `.await`.
    nodes: Mutex<HashMap<String, Open>>,
    /// The id of the next connection opened.
    next_id: AtomicU64,
    /// A lock per node, held while connecting to it, so that many callers waiting for one
    /// node open one connection, and a node that does not answer holds up no other.
    connecting: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The cluster's slot map (empty until first read, and for a standalone server).
    slots: Mutex<SlotMap>,
    /// How many times the slot map was read: an operation that failed reads it again only if
    /// nobody did since it failed.
    generation: AtomicU64,
    /// Set when an operation ran out of time at a node: the next operation reads the slot map
    /// before routing.
    stale: AtomicBool,
    /// Held while the slot map is read again, so that one failover reloads it once.
    refreshing: tokio::sync::Mutex<()>,
    /// The idle connections of the hot path's pipelines (`lean`), by node.
    lean: lean::Idle,
    /// `MOVED` and `ASK` answers followed.
    pub(super) redirects: AtomicU64,
    /// Operations tried again after a node failed or the cluster was failing over.
    pub(super) retries: AtomicU64,
    /// For errors and logs: the servers' addresses, without user or password.
    pub(super) addr: String,
    /// Who this client is, for the message of a server's refusal.
    credentials: Credentials,
}

/// An open connection to a node, with an id that tells it from the connection that replaced
/// it.
#[derive(Clone)]
struct Open {
    id: u64,
    conn: MultiplexedConnection,
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
                StoreError::Config(
                    Wording::default()
                        .key("store.redis_urls")
                        .text(format!(" entry {:?}: {error}", crate::redact::url(url))),
                )
            })?;
            seeds.push(info.addr.to_string());
            first.get_or_insert(info);
        }
        let Some(first) = first else {
            return Err(StoreError::Config(
                Wording::default()
                    .key("store.redis_urls")
                    .text(" is empty; give a redis:// URL"),
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
            next_id: AtomicU64::new(0),
            connecting: Mutex::new(HashMap::new()),
            slots: Mutex::new(SlotMap::default()),
            generation: AtomicU64::new(0),
            stale: AtomicBool::new(false),
            refreshing: tokio::sync::Mutex::new(()),
            lean: lean::Idle::default(),
            redirects: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            addr,
            credentials: Credentials::of(config, first.redis.username.as_deref()),
        })
    }

    /// The deadline of an operation that starts now.
    pub(in crate::dedup::redis) fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// Loads `script` on the server, or on every master of the cluster (reading the slot
    /// map first): a check that the servers answer and run scripts. Bounded by the time limit.
    ///
    /// # Errors
    ///
    /// The first node that fails, or [`StoreError::Timeout`].
    pub(super) async fn load_script(&self, script: &Script) -> Result<(), StoreError> {
        let deadline = self.deadline();
        let nodes = if self.cluster {
            self.refresh_slots(self.generation(), deadline).await?;
            self.slots_map().all_masters()
        } else {
            self.seeds.clone()
        };
        for node in nodes {
            let open = self.node(&node, deadline).await?;
            let mut conn = open.conn.clone();
            let loaded: Result<String, RedisError> = self
                .within(
                    deadline,
                    &node,
                    &open,
                    script.prepare_invoke().load_async(&mut conn),
                )
                .await?;
            if let Err(error) = loaded {
                return Err(self.failed(&node, &error));
            }
            if !self.cluster {
                self.refuse_cluster_node(&node, &open, deadline).await?;
            }
        }
        Ok(())
    }

    /// Whether every master (the server, standalone) has `SET … IFEQ`: its `COMMAND DOCS
    /// SET` names an argument of that token. A node that answers with an error (a server
    /// before Redis 7.0, a user without the right to ask) has it not. Bounded by the time
    /// limit.
    ///
    /// # Errors
    ///
    /// A node that does not answer, or [`StoreError::Timeout`].
    pub(super) async fn has_set_ifeq(&self) -> Result<bool, StoreError> {
        let deadline = self.deadline();
        let nodes = if self.cluster {
            if self.slots_map().all_masters().is_empty() {
                self.refresh_slots(self.generation(), deadline).await?;
            }
            self.slots_map().all_masters()
        } else {
            self.seeds[..1].to_vec()
        };
        for node in nodes {
            let open = self.node(&node, deadline).await?;
            let mut conn = open.conn.clone();
            let docs: Result<redis::Value, RedisError> = self
                .within(
                    deadline,
                    &node,
                    &open,
                    redis::cmd("COMMAND")
                        .arg("DOCS")
                        .arg("SET")
                        .query_async(&mut conn),
                )
                .await?;
            match docs {
                Ok(docs) if names_token(&docs, "IFEQ") => {}
                Ok(_) => return Ok(false),
                Err(error) if is_connection_error(&error) => return Err(self.failed(&node, &error)),
                Err(_) => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Refuses a node of a Redis Cluster given as a standalone server: it would answer
    /// `MOVED` for the sets of every other master, for ever.
    async fn refuse_cluster_node(
        &self,
        node: &str,
        open: &Open,
        deadline: Instant,
    ) -> Result<(), StoreError> {
        let mut conn = open.conn.clone();
        let info: Result<String, RedisError> = self
            .within(
                deadline,
                node,
                open,
                redis::cmd("INFO").arg("cluster").query_async(&mut conn),
            )
            .await?;
        match info {
            Ok(info) if info.contains("cluster_enabled:1") => Err(StoreError::Refused {
                addr: node.to_owned(),
                detail: Wording::from("it is a node of a Redis Cluster; turn ")
                    .key("store.redis_cluster")
                    .text(" on, with the cluster's nodes as seeds"),
            }),
            // A server without INFO (a proxy, say) is taken as standalone.
            _ => Ok(()),
        }
    }

    /// `step`, a command sent on `open` to `node`, within `deadline`. When the deadline
    /// passes, the node did not answer in time: its connection is dropped (a frozen server
    /// would hold every later command too) and the slot map is marked stale.
    async fn within<T>(
        &self,
        deadline: Instant,
        node: &str,
        open: &Open,
        step: impl std::future::Future<Output = T>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout_at(deadline, step).await {
            Ok(answer) => Ok(answer),
            Err(_) => {
                self.drop_conn(node, Some(open));
                Err(self.no_answer(node))
            }
        }
    }

    /// The error of `node` not answering within the time limit. A standalone server is slow
    /// (a longer `store.timeout` may help); in a cluster it is rather a node that failed,
    /// whose replica the cluster promotes, and the slot map is marked stale to find it.
    fn no_answer(&self, node: &str) -> StoreError {
        if !self.cluster {
            return StoreError::Timeout(self.timeout);
        }
        self.stale.store(true, Ordering::Relaxed);
        StoreError::Unavailable {
            addr: node.to_owned(),
            detail: format!(
                "no answer within {:?}; if the node failed, the cluster promotes its replica \
                 within its cluster-node-timeout",
                self.timeout
            ),
        }
    }

    /// The open connection to `node`, or a new one, within `deadline`.
    async fn node(&self, node: &str, deadline: Instant) -> Result<Open, StoreError> {
        if let Some(conn) = self.open(node) {
            return Ok(conn);
        }
        let lock = Arc::clone(
            self.connecting_map()
                .entry(node.to_owned())
                .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(()))),
        );
        let connect = async {
            let _connecting = lock.lock().await;
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
            let open = Open {
                // Only told apart from other ids: no order depends on it.
                id: self.next_id.fetch_add(1, Ordering::Relaxed),
                conn,
            };
            self.nodes_map().insert(node.to_owned(), open.clone());
            Ok(open)
        };
        match tokio::time::timeout_at(deadline, connect).await {
            Ok(result) => result,
            Err(_) => Err(self.no_answer(node)),
        }
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
        client.map_err(|error| {
            StoreError::Config(
                Wording::default()
                    .key("store.redis_urls")
                    .text(format!(": {error}")),
            )
        })
    }

    /// Drops the connection to `node` after an error that may have broken it: `open`, the
    /// connection the operation used, unless another operation has replaced it already;
    /// with no `open` (an error from a step that does not know it), whichever the node has.
    /// The node's idle connections of the hot path (`lean`) go too.
    fn drop_conn(&self, node: &str, open: Option<&Open>) {
        // The hot path's connections to the node may be broken too.
        self.lean.clear(node);
        let mut nodes = self.nodes_map();
        if open.is_none_or(|open| nodes.get(node).is_some_and(|current| current.id == open.id)) {
            nodes.remove(node);
        }
    }

    /// A [`StoreError`] for `error` at `node` (never showing a password): a refusal when it
    /// means a setting is wrong, out of memory when Redis has no room (see `refusal`); drops the node's connection if the error may
    /// have broken it.
    fn failed(&self, node: &str, error: &RedisError) -> StoreError {
        if is_connection_error(error) {
            self.drop_conn(node, None);
        }
        if error.is_timeout() {
            return StoreError::Timeout(self.timeout);
        }
        if let Some(refused) = self.credentials.refusal(node, error) {
            return refused;
        }
        if let Some(full) = refusal::out_of_memory(node, error) {
            return full;
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

    fn open(&self, node: &str) -> Option<Open> {
        self.nodes_map().get(node).cloned()
    }

    fn nodes_map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Open>> {
        // A poisoned lock still holds a whole map.
        self.nodes
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    fn connecting_map(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, Arc<tokio::sync::Mutex<()>>>> {
        // As above.
        self.connecting
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

/// Whether `value` (an answer of `COMMAND DOCS`) holds the string `token` itself, as an
/// argument's token does, anywhere in its nesting.
fn names_token(value: &redis::Value, token: &str) -> bool {
    use redis::Value;
    match value {
        Value::BulkString(bytes) => bytes.eq_ignore_ascii_case(token.as_bytes()),
        Value::SimpleString(text) => text.eq_ignore_ascii_case(token),
        Value::Array(values) | Value::Set(values) => {
            values.iter().any(|value| names_token(value, token))
        }
        Value::Map(pairs) => pairs
            .iter()
            .any(|(key, value)| names_token(key, token) || names_token(value, token)),
        _ => false,
    }
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
        StoreError::Config(
            Wording::default()
                .key("store.redis_tls_root_ca_file")
                .text(format!(" {}: {reason}", path.display())),
        )
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
