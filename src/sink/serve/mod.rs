//! The serve sink: the sidecar stands where nsqd stands for its consumers.
//!
//! Any NSQ client (go-nsq, pynsq, nsqjs, `nsq_tail`) connects to the served port as if it
//! were nsqd, subscribes to the served topic and channel, and receives each unique message
//! once. Its FIN is the handler's success (the pipeline commits the claim and FINs upstream);
//! its REQ, its timeout or its disconnection is the handler's failure (the pipeline erases the
//! claim and REQs upstream at once): erase-on-failure end to end, in any language.
//! A burst's records are handed over in one call, and answered in parts
//! ([`Handler::handle_in_parts`]): each consumer's run of FINs and REQs (those of one read
//! from it) is one part, which the pipeline settles and answers upstream at once, while it
//! keeps the burst's other records alive. So a consumer that FINs in batches of its own
//! (`nsq_to_file` FINs once it holds `--max-in-flight` messages) gets each batch answered
//! upstream as it FINs it, and the RDY those messages held upstream brings the next ones.
//! Per-record calls would cost a future, a keep-alive timer, a commit and an upstream answer
//! per message, most of what serving a message cost.
//!
//! # Layout
//!
//! - `config`: [`ServeConfig`] and its defaults.
//! - `listener`: the accept loop, the connection limit and the protocol magic.
//! - `connection`: one consumer's commands, answers, messages and heartbeats.
//! - `command`: the bounded command parser and nsqd's error frames.
//! - `identify`: IDENTIFY's checks and JSON answer.
//! - `dispatch`: who gets which message; FIN/REQ/TOUCH, timeouts and disconnections routed
//!   back to the waiting handler call.
//! - `answers`: a handler call's results, handed over as consumers answer, and the stream of
//!   parts it reads, woken once per consumer's run of answers.
//! - `flights`: the messages in flight by the IDs this endpoint gave them.
//! - `auth`: the shared AUTH secret, compared in constant time.
//! - `http`: `/ping`, `/lookup` as nsqlookupd answers it, and `/stats` as nsqd's.
//! - `metrics`: the endpoint's figures on the sidecar's `/metrics` page.
//! - `settings`: its keys of `[sink]`, validated into [`ServeConfig`]; its summary, and its
//!   build, which warns of a port open beyond loopback without TLS or AUTH.
//!
//! Deviations from nsqd, each on purpose: the endpoint takes no messages (PUB, MPUB and DPUB
//! are refused with `E_INVALID`); snappy, deflate and sampling are answered `false`/`0`;
//! a consumer that disconnects or times out has its messages handed back at once, not after
//! their timeout; after CLS a consumer gets no more messages but may still answer those it
//! holds (as go-nsq does when it stops), and whatever it still holds when it disconnects is
//! handed back; a consumer holding many messages has its answers read at most every
//! millisecond, many at once, and the messages that came for it meanwhile written then
//! (`connection`).
//!
//! What serving a message costs the sidecar is kept per burst, not per message: a consumer's
//! run of answers is settled under one lock and wakes its call once, the frames written from
//! a buffer each connection reuses (see docs/benchmarks.md).

mod answers;
mod auth;
mod command;
mod config;
mod connection;
mod dispatch;
mod flights;
mod http;
mod identify;
mod listener;
mod metrics;
pub(super) mod settings;

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use bytes::Bytes;
use futures::Stream;

pub use auth::ServeSecret;
pub use config::{
    ServeConfig, ServeTls, DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_HTTP_ADDRESS, DEFAULT_MAX_BODY_SIZE,
    DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_HEARTBEAT_INTERVAL, DEFAULT_MAX_MSG_TIMEOUT,
    DEFAULT_MAX_RDY_COUNT, DEFAULT_MAX_REQ_TIMEOUT, DEFAULT_MSG_TIMEOUT, DEFAULT_SCAN_INTERVAL,
    DEFAULT_TCP_ADDRESS,
};
pub use dispatch::{ConsumerInfo, ConsumerStats, DispatchStats, ServeCounters};

use super::{BuiltIn, Delivery, Handler, HandlerError, Part, Watch};
use dispatch::Dispatcher;
pub(crate) use settings::sink_keys;

/// Why the serve endpoint cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A setting out of range.
    #[error("serve `{field}` = {value}: {reason}")]
    Config {
        /// The setting, a field of [`ServeConfig`].
        field: &'static str,
        /// The value given.
        value: String,
        /// What is wrong and what is accepted.
        reason: String,
    },
    /// A port cannot be bound.
    #[error("cannot listen on the serve {what} address {address}")]
    Bind {
        /// `TCP` or `HTTP`.
        what: &'static str,
        /// The address asked for.
        address: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The TLS certificate or key cannot be used.
    #[error("serve TLS: {0}")]
    Tls(#[from] crate::tls::TlsFileError),
}

/// What the endpoint's tasks share.
pub(crate) struct Shared {
    pub(crate) config: ServeConfig,
    pub(crate) dispatcher: Dispatcher,
    pub(crate) tls: Option<tokio_rustls::TlsAcceptor>,
    /// Cancelled when the [`ServeSink`] is dropped: every task stops and closes its socket.
    pub(crate) cancel: tokio_util::sync::CancellationToken,
    /// Cancelled when the sidecar starts to stop ([`ServeSink::stopping`]) or with `cancel`:
    /// the TCP port is closed, so no new consumer comes and a restart can bind it.
    pub(crate) stop_accepting: tokio_util::sync::CancellationToken,
    /// Consumers closed for missing two heartbeats.
    pub(crate) heartbeat_timeouts: AtomicU64,
    /// Connections refused at `max_connections`.
    pub(crate) refused_connections: AtomicU64,
    /// The bound TCP address, as `/lookup` advertises it.
    pub(crate) tcp_address: SocketAddr,
    /// The bound HTTP address, if any.
    pub(crate) http_address: Option<SocketAddr>,
    /// When the endpoint started, in seconds since the Unix epoch (`/stats`' `start_time`).
    pub(crate) started_at: u64,
}

/// A [`Handler`] that serves each record to NSQ consumers and succeeds once one FINs it.
///
/// Records wait while no consumer has RDY room (the pipeline bounds them by its
/// `max_in_flight` and keeps their upstream messages alive). Dropping the sink stops the
/// endpoint and closes every consumer's connection.
///
/// # Example
///
/// ```no_run
/// use nsq_dedupe::serve::{ServeConfig, ServeSink};
///
/// # async fn example() -> Result<(), nsq_dedupe::serve::ServeError> {
/// let mut config = ServeConfig::new("events", "app");
/// config.tcp_address = "127.0.0.1:4250".parse().unwrap();
/// let sink = ServeSink::start(config).await?;
/// println!("nsq_tail --nsqd-tcp-address {} --topic events --channel app", sink.tcp_address());
/// # Ok(())
/// # }
/// ```
pub struct ServeSink {
    shared: Arc<Shared>,
    _stop: tokio_util::sync::DropGuard,
}

impl std::fmt::Debug for ServeSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeSink")
            .field("tcp_address", &self.shared.tcp_address)
            .field("http_address", &self.shared.http_address)
            .finish()
    }
}

impl ServeSink {
    /// Validates `config`, binds its ports and starts serving.
    ///
    /// # Errors
    ///
    /// A setting out of range, a port that cannot be bound, or TLS files that cannot be used.
    ///
    /// # Panics
    ///
    /// When called outside a Tokio runtime.
    pub async fn start(config: ServeConfig) -> Result<ServeSink, ServeError> {
        config.validate()?;
        let tls = match &config.tls {
            Some(tls) => Some(tokio_rustls::TlsAcceptor::from(Arc::new(
                crate::tls::server_config(&tls.cert_file, &tls.key_file)?,
            ))),
            None => None,
        };
        let bind = |what, address| async move {
            tokio::net::TcpListener::bind(address)
                .await
                .map_err(|source| ServeError::Bind {
                    what,
                    address,
                    source,
                })
        };
        let tcp = bind("TCP", config.tcp_address).await?;
        let http = match config.http_address {
            Some(address) => Some(bind("HTTP", address).await?),
            None => None,
        };
        let local = |listener: &tokio::net::TcpListener, what, address| {
            listener.local_addr().map_err(|source| ServeError::Bind {
                what,
                address,
                source,
            })
        };
        let tcp_address = local(&tcp, "TCP", config.tcp_address)?;
        let http_address = match (&http, config.http_address) {
            (Some(listener), Some(address)) => Some(local(listener, "HTTP", address)?),
            _ => None,
        };
        let cancel = tokio_util::sync::CancellationToken::new();
        let shared = Arc::new(Shared {
            dispatcher: Dispatcher::new(config.max_msg_timeout),
            config,
            tls,
            stop_accepting: cancel.child_token(),
            cancel: cancel.clone(),
            heartbeat_timeouts: AtomicU64::new(0),
            refused_connections: AtomicU64::new(0),
            tcp_address,
            http_address,
            started_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        });
        tokio::spawn(listener::accept_loop(tcp, shared.clone()));
        tokio::spawn(expire_loop(shared.clone()));
        if let Some(http) = http {
            tokio::spawn(http::serve(http, shared.clone()));
        }
        tracing::info!(%tcp_address, http_address = http_address.map(tracing::field::display), topic = %shared.config.topic, channel = %shared.config.channel, "Serving consumers.");
        Ok(ServeSink {
            shared,
            _stop: cancel.drop_guard(),
        })
    }

    /// The bound TCP address consumers connect to.
    pub fn tcp_address(&self) -> SocketAddr {
        self.shared.tcp_address
    }

    /// The bound HTTP address, if HTTP is served.
    pub fn http_address(&self) -> Option<SocketAddr> {
        self.shared.http_address
    }

    /// A snapshot of what waits, what is in flight, the counters and the consumers.
    pub fn stats(&self) -> DispatchStats {
        self.shared.dispatcher.stats()
    }

    /// The sidecar starts to stop: the TCP port is closed (the consumers connected keep being
    /// served within the shutdown grace), and whenever no consumer can take messages the
    /// records waiting for one are handed back at once, requeued upstream with no delay,
    /// rather than held until the grace ends.
    pub fn stop(&self) {
        self.shared.stop_accepting.cancel();
        self.shared.dispatcher.stop();
    }

    /// Consumers closed for missing two heartbeats.
    pub fn heartbeat_timeouts(&self) -> u64 {
        self.shared
            .heartbeat_timeouts
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Hands back messages whose consumer did not answer in time, every `scan_interval`.
async fn expire_loop(shared: Arc<Shared>) {
    let mut ticker = tokio::time::interval(shared.config.scan_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shared.cancel.cancelled() => return,
            now = ticker.tick() => shared.dispatcher.expire(now),
        }
    }
}

impl Handler for ServeSink {
    /// A body without its message: served as a first attempt, stamped now.
    async fn handle(&self, body: Bytes) -> Result<(), HandlerError> {
        let timestamp_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        let delivery = Delivery {
            body,
            attempts: 1,
            timestamp_ns,
        };
        let mut results = self
            .shared
            .dispatcher
            .submit_many(vec![delivery])
            .in_order()
            .await;
        results
            .pop()
            .unwrap_or_else(|| Err(HandlerError::Retry("the record got no answer".into())))
    }

    /// A burst's records queued for consumers under one lock; each consumer's run of answers
    /// (the FINs and REQs of one read from it) is one part, and wakes the call once.
    fn handle_in_parts(&self, deliveries: Vec<Delivery>) -> impl Stream<Item = Part> + Send {
        self.shared.dispatcher.submit_many(deliveries)
    }

    /// A burst is handed over in one call: one keep-alive, and one settle and one answer per
    /// consumer's run of answers rather than per message, which is most of what serving a
    /// message costs.
    fn handles_batches(&self) -> bool {
        true
    }

    /// Closes the port and hands back what no consumer can take ([`ServeSink::stop`]).
    fn stopping(&self) {
        self.stop();
    }

    /// A consumer's REQ, timeout or disconnection is its own; it backs off itself.
    fn backs_off(&self) -> bool {
        false
    }
}

impl BuiltIn for ServeSink {
    fn watch(&self) -> Watch {
        Watch {
            metrics: Some(Arc::new(metrics::ServeMetrics(self.shared.clone()))),
            ..Watch::default()
        }
    }
}
