//! Provides [`run`]: the `nsq-dedupe run` service, from validated [`Settings`] to a stopped
//! consumer.
//!
//! Tasks: the main loop takes bursts of messages from the [`Consumer`] (every message one
//! connection's reader found at once) and spawns one task per burst (tracked by a
//! [`TaskTracker`]), which runs [`Dedupe::process_batch`]; a status task logs one line
//! every `status_interval`; the metrics server answers `GET /metrics`. When `shutdown`
//! completes, we stop taking messages (the consumer sends `CLS`), let the running handlers
//! finish within the grace period (the consumer REQs whatever is still unanswered when it
//! ends), flush the sink and return.
//!
//! - `store.rs` and `sink.rs` build the store, the sink and the dead-letter from their
//!   settings.
//! - `stop.rs` is the main loop, which returns why it stopped; `drain.rs` the graceful stop.
//! - `status.rs` (the status line), `snapshot.rs` (the table file's saves), `grow.rs` (the
//!   table that sizes itself) and `fleet.rs` (the fleet's counts) are the background tasks; `endpoints.rs` serves `/metrics`, `/ping`
//!   and `/ready`.

mod drain;
mod endpoints;
mod fleet;
mod grow;
mod grow_log;
mod grow_shared;
mod sink;
mod snapshot;
mod status;
mod stop;
mod store;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Settings;
use crate::dedup::backend::Backend;
use crate::dedup::table_file::TableFile;
use crate::error::StoreError;
use crate::metrics::Metrics;
use crate::nsq::{Consumer, ShutdownReport};
use crate::pipeline::Dedupe;
use crate::sink::{BuiltIn, Handler, Sink, Watch};
use crate::wording::{Named, Wording};
use status::Target;
use stop::Refusal;

pub(crate) use sink::build_sink;
pub use store::build_store;

/// Why the service could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The store could not be built.
    #[error("cannot open the de-duplication store")]
    Store(#[from] StoreError),
    /// The table could not be allocated.
    #[error("cannot build the in-process table; choose a smaller {choose}")]
    Table {
        /// Why.
        source: crate::error::TableError,
        /// The settings that size the table.
        choose: Wording,
    },
    /// The consumer or a producer could not be built.
    #[error("the NSQ client failed")]
    Nsq(#[from] crate::nsq::Error),
    /// The http sink's client could not be built.
    #[error("cannot build the http sink")]
    Http(#[from] crate::http::HttpError),
    /// The dead-letter could not be opened.
    #[error("cannot open the dead-letter")]
    DeadLetter(#[from] crate::sink::DeadLetterError),
    /// An nsqd refused this client in a way no retry changes (settings it does not accept,
    /// AUTH or TLS it requires); the run stopped gracefully. The cause names the setting.
    #[error("stopped")]
    Refused(#[source] Arc<crate::nsq::Error>),
    /// The sink's output was closed for good (stdout's reader went away); the run stopped
    /// gracefully and its messages were requeued.
    #[error("the sink's output was closed; stopped")]
    SinkClosed(#[source] std::io::Error),
    /// The table file could not be opened or written; the message names the file and what to
    /// do.
    #[error(transparent)]
    TableFile(#[from] crate::dedup::table_file::TableFileError),
    /// The file sink's directories or formats are unusable.
    #[error("cannot start the file sink: {setting}: {reason}")]
    FileSink {
        /// The setting.
        setting: Named,
        /// What is wrong.
        reason: String,
    },
    /// The serve sink could not start (a port that cannot be bound, TLS files that cannot be
    /// used).
    #[error("cannot start the serve sink")]
    Serve(#[from] crate::sink::serve::ServeError),
    /// The metrics address could not be bound.
    #[error("cannot listen on metrics address {addr} (change {setting}, or set it to \"off\")")]
    Metrics {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
        /// The setting that gives the address.
        setting: Wording,
    },
}

/// A table that cannot be had names the settings that size it.
impl From<crate::error::TableError> for RunError {
    fn from(source: crate::error::TableError) -> Self {
        let both = |key, flag| Wording::default().both(Named::key(key), Named::flag(flag));
        RunError::Table {
            source,
            choose: both("store.buckets", "--buckets")
                .text(", ")
                .then(both("store.memory", "--memory"))
                .text(" or ")
                .key("store.probability"),
        }
    }
}

impl RunError {
    /// The metrics address `addr` could not be bound.
    pub(crate) fn metrics(addr: SocketAddr, source: std::io::Error) -> RunError {
        RunError::Metrics {
            addr,
            source,
            setting: Wording::default().either(
                Named::flag("--metrics-address"),
                Named::key("metrics.address"),
            ),
        }
    }

    /// Whether starting again with the same settings fails the same way, so that a setting
    /// must change: a store that refuses this client or cannot use its settings, a table file
    /// written for another table or at a path that cannot hold one, a table the system will
    /// not give the memory of (its size is the settings'; the config's validation refuses one
    /// larger than the machine before this). The binary exits with `EX_CONFIG` (78) for these,
    /// as for an invalid config, and a service manager does not restart it in a loop; any
    /// other error may pass with time (a server coming back, a lock let go).
    pub fn is_setting(&self) -> bool {
        use crate::dedup::table_file::TableFileError;
        match self {
            RunError::Store(error) => {
                matches!(error, StoreError::Config(_) | StoreError::Refused { .. })
            }
            RunError::Table { .. } => true,
            RunError::TableFile(error) => matches!(
                error,
                TableFileError::Mismatch { .. }
                    | TableFileError::NoDirectory { .. }
                    | TableFileError::NotAFile { .. }
                    | TableFileError::Table(_)
            ),
            RunError::Serve(error) => !matches!(error, crate::sink::serve::ServeError::Bind { .. }),
            _ => false,
        }
    }
}

/// What a run did, for callers and tests.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// The consumer's shutdown report.
    pub shutdown: ShutdownReport,
    /// Records still with the handler when the grace period ended (their messages were
    /// requeued).
    pub abandoned_handlers: usize,
}

/// A built, not yet running, sidecar: the store, the handler and the metrics listener.
pub struct Sidecar<H> {
    settings: Settings,
    dedupe: Dedupe<Backend, H>,
    metrics_listener: Option<TcpListener>,
    /// Completes if the dead-letter's nsqd refuses this client for good.
    dead_letter_refused: Option<Refusal>,
    /// What the run watches of the sink: its output closed or a server's refusal for good.
    sink_watch: Watch,
    /// The in-process table's file, locked while this sidecar lives.
    table_file: Option<Arc<TableFile>>,
    /// What the start-up log names as the sink: the configured one, or the caller's handler.
    sink_name: String,
}

impl Sidecar<Sink> {
    /// Builds the store, the configured sink and the dead-letter, and binds the metrics
    /// address.
    ///
    /// # Errors
    ///
    /// [`RunError`] naming what could not be built.
    pub async fn new(settings: Settings) -> Result<Self, RunError> {
        let sink = build_sink(&settings.sink, &settings.producer, &settings.names).await?;
        let sink_name = settings.sink.to_string();
        let watch = sink.watch();
        let mut sidecar = Self::watching(settings, sink, watch).await?;
        sidecar.sink_name = sink_name;
        Ok(sidecar)
    }
}

impl<H: Handler> Sidecar<H> {
    /// Like [`Sidecar::new`] with the library user's own handler instead of the configured
    /// sink (`settings.sink` is ignored).
    ///
    /// # Errors
    ///
    /// [`RunError`] naming what could not be built.
    pub async fn with_handler(settings: Settings, handler: H) -> Result<Self, RunError> {
        Self::watching(settings, handler, Watch::default()).await
    }

    /// The sidecar of `handler`, whose figures, closed output and refusals are `watch`'s: a
    /// built-in sink's own, nothing for a library user's handler.
    async fn watching(settings: Settings, handler: H, mut watch: Watch) -> Result<Self, RunError> {
        let store = store::open(&settings).await?;
        let dead_letter =
            sink::build_dead_letter(settings.dead_letter.as_ref(), &settings.producer)?;
        let dead_letter_refused = dead_letter.as_ref().map(|d| Box::pin(d.refused()) as _);
        let metrics_listener = endpoints::bind(settings.metrics_address).await?;
        let metrics = Arc::new(Metrics::with_window(settings.window));
        if let Some(own) = watch.metrics.take() {
            metrics.watch_handler(own);
        }
        // A shared store that did not answer at start is failing until it does: `/ready`
        // says so from the start, not only after the first message's claim.
        if !store.answered {
            metrics
                .store_failing
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let dedupe = Dedupe::new(
            store.backend,
            settings.keyer.clone(),
            handler,
            settings.policy.clone(),
            dead_letter,
            metrics,
        );
        Ok(Sidecar {
            settings,
            dedupe,
            metrics_listener,
            dead_letter_refused,
            sink_watch: watch,
            table_file: store.table_file,
            sink_name: "the program's own handler".to_owned(),
        })
    }

    /// The bound metrics address (useful with port 0).
    pub fn metrics_address(&self) -> Option<SocketAddr> {
        self.metrics_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
    }

    /// The metrics page's URL at the bound address, such as `http://127.0.0.1:9150/metrics`
    /// (`http://[::1]:9150/metrics` for IPv6); `None` when metrics are off.
    pub fn metrics_url(&self) -> Option<String> {
        self.metrics_address()
            .map(|addr| format!("http://{addr}/metrics"))
    }

    /// The counters, shared with the running pipeline.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.dedupe.metrics().clone()
    }

    /// Consumes until `shutdown` completes, then stops gracefully (see the module docs).
    ///
    /// # Errors
    ///
    /// [`RunError::Nsq`] if the consumer cannot be started.
    pub async fn run(self, shutdown: impl Future) -> Result<RunReport, RunError> {
        let Sidecar {
            settings,
            dedupe,
            metrics_listener,
            dead_letter_refused,
            sink_watch,
            table_file,
            sink_name,
        } = self;
        let mut consumer = Consumer::new(settings.source.clone())?;
        let background = CancellationToken::new();
        // Stops the background tasks whichever way we leave this function.
        let _stop_background = background.clone().drop_guard();
        let target = Target {
            window: settings.window,
            probability: settings
                .target_probability
                .unwrap_or(crate::sizing::DEFAULT_TARGET_PROBABILITY),
            given: settings.target_probability.is_some(),
            sizes_itself: settings.growth.is_some(),
        };
        log_started(&settings, &dedupe, &sink_name);
        if let Some(listener) = metrics_listener {
            endpoints::spawn(listener, &dedupe, target, &background);
        }
        tokio::spawn(status::status_loop(
            dedupe.clone(),
            consumer.connection_count(),
            settings.status_interval,
            target,
            background.clone(),
        ));
        fleet::spawn(dedupe.store(), dedupe.metrics(), &background);
        if let Some(growth) = settings.growth {
            let growing = grow::Growing {
                dedupe: dedupe.clone(),
                growth,
                warn_every: settings.status_interval,
                names: settings.names.clone(),
                stop: background.clone(),
            };
            match dedupe.store() {
                Backend::Redis(table, _) => {
                    tokio::spawn(grow_shared::grow_loop(table.clone(), growing))
                }
                Backend::Memcached(table, _) => {
                    tokio::spawn(grow_shared::grow_loop(table.clone(), growing))
                }
                _ => tokio::spawn(grow::grow_loop(growing)),
            };
        }
        if let (Some(file), Some(settings)) = (&table_file, &settings.table_file) {
            tokio::spawn(snapshot::snapshot_loop(
                file.clone(),
                dedupe.clone(),
                settings.snapshot_interval,
                background.clone(),
            ));
        }
        let tracker = TaskTracker::new();
        let stop = stop::consume(
            &mut consumer,
            &dedupe,
            &tracker,
            sink_watch,
            dead_letter_refused,
            shutdown,
        )
        .await;
        let mut running = drain::Running {
            consumer: Some(consumer),
            tracker,
            dedupe,
            table_file,
            background,
            target,
        };
        let report = drain::drain(&mut running, settings.grace).await?;
        stop.into_result(report)
    }
}

/// Logs what the sidecar consumes, and where it sends the messages.
fn log_started<H: Handler>(settings: &Settings, dedupe: &Dedupe<Backend, H>, sink: &str) {
    let geometry = crate::Store::geometry(dedupe.store());
    let source = &settings.source;
    tracing::info!(
        topic = %source.topic,
        channel = %source.channel,
        // Only the sources given: a consumer of nsqlookupd alone has no nsqd to name.
        nsqd = (!source.nsqd_tcp_addresses.is_empty()).then(|| tracing::field::display(source.nsqd_tcp_addresses.join(","))),
        lookupd = (!source.lookupd_http_addresses.is_empty()).then(|| tracing::field::display(crate::redact::urls(source.lookupd_http_addresses.iter().map(String::as_str)))),
        store = dedupe.store().kind(),
        namespace = dedupe.store().namespace().map(tracing::field::display),
        buckets = geometry.map(|g| g.slots()),
        ways = geometry.map(|g| g.ways()),
        sink = %sink,
        dead_letter = settings.dead_letter.as_ref().map(tracing::field::display),
        "Sidecar started."
    );
}

/// Runs the sidecar described by `settings` with its configured sink until `shutdown`
/// completes. The binary passes a signal future; tests pass any future.
///
/// # Errors
///
/// [`RunError`] if something cannot be built or started.
pub async fn run(settings: Settings, shutdown: impl Future) -> Result<RunReport, RunError> {
    Sidecar::new(settings).await?.run(shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wording::FlagOrigins;

    /// `--memory` given, the other settings of the table and the metrics address not.
    fn names(file: bool) -> FlagOrigins {
        let mut names = FlagOrigins::default();
        names.record("store.buckets", "--buckets", false);
        names.record("store.memory", "--memory", true);
        names.record("store.probability", "--probability", false);
        names.record("metrics.address", "--metrics-address", false);
        names.record("source.msg_timeout", "--msg-timeout", false);
        if file {
            names.with_file();
        }
        names
    }

    #[test]
    fn a_run_error_names_its_settings_as_the_user_gave_them() {
        let table = || RunError::from(crate::error::TableError::ZeroSlots);
        let choose = "cannot build the in-process table; choose a smaller";
        assert_eq!(
            table().to_string(),
            format!(
                "{choose} `store.buckets` (`--buckets`), `store.memory` (`--memory`) or \
                 `store.probability`"
            )
        );
        assert_eq!(
            names(false).show(table()).to_string(),
            format!("{choose} `--buckets`, `--memory` or `--probability`")
        );
        assert_eq!(
            names(true).show(table()).to_string(),
            format!("{choose} `store.buckets` (`--buckets`), `--memory` or `store.probability`")
        );
        let metrics = || {
            let addr = SocketAddr::from(([127, 0, 0, 1], 9187));
            RunError::metrics(addr, std::io::Error::other("in use"))
        };
        let change = |setting: &str| {
            format!(
                "cannot listen on metrics address 127.0.0.1:9187 (change {setting}, or set it \
                 to \"off\")"
            )
        };
        assert_eq!(
            metrics().to_string(),
            change("`--metrics-address` / `metrics.address`")
        );
        assert_eq!(
            names(false).show(metrics()).to_string(),
            change("`--metrics-address`")
        );
        assert_eq!(
            names(true).show(metrics()).to_string(),
            change("`--metrics-address` / `metrics.address`")
        );
    }

    #[test]
    fn a_shared_refusal_is_shown_in_the_users_words_where_it_is_shown() {
        let cause = Arc::new(crate::nsq::Error::Refused {
            addr: "127.0.0.1:4150".into(),
            command: "IDENTIFY",
            text: "E_BAD_BODY".into(),
            advice: Wording::from("set ").both(
                Named::flag("--msg-timeout"),
                Named::key("source.msg_timeout"),
            ),
        });
        let error = RunError::Refused(cause.clone());
        let shown = std::error::Error::source(&error).expect("the refusal is the cause");
        assert_eq!(
            names(false).show(shown).to_string(),
            "nsqd 127.0.0.1:4150 refused IDENTIFY: E_BAD_BODY; set `--msg-timeout`"
        );
        assert_eq!(
            cause.to_string(),
            "nsqd 127.0.0.1:4150 refused IDENTIFY: E_BAD_BODY; set `--msg-timeout` \
             (`source.msg_timeout`)"
        );
    }
}
