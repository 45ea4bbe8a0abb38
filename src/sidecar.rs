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

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{DeadLetterSettings, Settings, SinkSettings, StoreSettings};
use crate::dedup::backend::Backend;
use crate::dedup::fleet::{FleetCounters, FLEET_BUCKETS};
use crate::dedup::journal::Journal;
use crate::dedup::near::NearTable;
use crate::dedup::table_file::{SaveReport, TableFile};
use crate::dedup::Geometry;
use crate::error::StoreError;
use crate::metrics::{get, Metrics, TableView};
use crate::nsq::{Consumer, ProducerConfig, ShutdownReport, Transport};
use crate::pipeline::Dedupe;
use crate::sink::{DeadLetter, Handler, HttpSink, NsqSink, Sink, StdoutSink};
use crate::{MemcachedStore, NoStore, RedisStore, Table};
use hyper::StatusCode;

/// Why the service could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The store could not be built.
    #[error("cannot open the de-duplication store")]
    Store(#[from] StoreError),
    /// The table could not be allocated.
    #[error("cannot build the in-process table; choose a smaller `store.buckets` (`--buckets`), `store.memory` (`--memory`) or `store.probability`")]
    Table(#[from] crate::error::TableError),
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
    #[error("cannot start the file sink: `sink.{field}`: {reason}")]
    FileSink {
        /// The setting.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The metrics address could not be bound.
    #[error("cannot listen on metrics address {addr} (change `--metrics-address` / `metrics.address`, or set it to \"off\")")]
    Metrics {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

impl RunError {
    /// Whether starting again with the same settings fails the same way, so that a setting
    /// must change: a store that refuses this client or cannot use its settings, a table file
    /// written for another table or at a path that cannot hold one. The binary exits with
    /// `EX_CONFIG` (78) for these, as for an invalid config, and a service manager does not
    /// restart it in a loop; any other error may pass with time (a server coming back, a
    /// lock let go).
    pub fn is_setting(&self) -> bool {
        use crate::dedup::table_file::TableFileError;
        match self {
            RunError::Store(error) => {
                matches!(error, StoreError::Config(_) | StoreError::Refused { .. })
            }
            RunError::TableFile(error) => matches!(
                error,
                TableFileError::Mismatch { .. }
                    | TableFileError::NoDirectory { .. }
                    | TableFileError::NotAFile { .. }
            ),
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
    /// The in-process table's file, locked while this sidecar lives.
    table_file: Option<Arc<TableFile>>,
}

/// A future that completes with a refusal no retry changes.
type Refusal = std::pin::Pin<Box<dyn Future<Output = Arc<crate::nsq::Error>> + Send>>;

/// A producer's settings: the addresses, and the transport of `[producer_opt]`.
fn producer_config(addresses: &[String], transport: &Transport) -> ProducerConfig {
    let mut config = ProducerConfig::new(addresses.to_vec());
    config.transport = transport.clone();
    config
}

/// Builds the store the settings ask for.
///
/// # Errors
///
/// [`RunError`] if a table cannot be allocated, a shared store's settings are unusable, or
/// its server refuses this client (see [`RunError::is_setting`]).
pub async fn build_store(
    store: &StoreSettings,
    near_table: Option<Geometry>,
    max_age: Option<Duration>,
) -> Result<Backend, RunError> {
    Ok(open_store(store, near_table, max_age).await?.0)
}

/// [`build_store`], and whether a shared store answered at start (`false`: it is down or
/// silent, and the service is not ready until it answers).
async fn open_store(
    store: &StoreSettings,
    near_table: Option<Geometry>,
    max_age: Option<Duration>,
) -> Result<(Backend, bool), RunError> {
    let near = match (store, near_table) {
        (StoreSettings::Memcached(..) | StoreSettings::Redis(..), Some(geometry)) => {
            Some(NearTable::new(geometry, timing(max_age))?)
        }
        _ => None,
    };
    Ok(match store {
        StoreSettings::Memory(geometry) => (
            Backend::Memory(match timing(max_age) {
                None => Table::new(*geometry)?,
                Some((age, clock)) => Table::with_max_age(*geometry, age, clock)?,
            }),
            true,
        ),
        StoreSettings::None => (Backend::None(NoStore), true),
        StoreSettings::Memcached(config, geometry) => {
            let (opened, answered) = open_shared(
                MemcachedStore::connect(config.clone(), *geometry),
                config.timeout * 4,
                || MemcachedStore::new_lazy(config.clone(), *geometry),
                ("Memcached", config.servers.join(",")),
            )
            .await?;
            (Backend::Memcached(opened, near), answered)
        }
        // The URLs carry no password (it was moved out of them), so they can be logged.
        StoreSettings::Redis(config, geometry) => {
            let (opened, answered) = open_shared(
                RedisStore::connect(config.clone(), *geometry),
                config.timeout * 4,
                || RedisStore::new_lazy(config.clone(), *geometry),
                ("Redis", config.urls.join(",")),
            )
            .await?;
            (Backend::Redis(opened, near), answered)
        }
    })
}

/// Opens a shared store at start with `connect`, within `limit`.
///
/// A server that is down or does not answer in time is an outage: a store error per message
/// (handled by `on_store_error`) until it answers, not a reason to refuse to start; we say so
/// at once and open the store `lazy`, without contacting it. A server that answered and
/// refused us, or settings the store cannot use, stop the start: waiting would not help.
async fn open_shared<S>(
    connect: impl Future<Output = Result<S, StoreError>>,
    limit: Duration,
    lazy: impl FnOnce() -> Result<S, StoreError>,
    (store, servers): (&str, String),
) -> Result<(S, bool), RunError> {
    match tokio::time::timeout(limit, connect).await {
        Ok(Ok(opened)) => return Ok((opened, true)),
        Ok(Err(error @ (StoreError::Config(_) | StoreError::Refused { .. }))) => {
            return Err(error.into())
        }
        Ok(Err(error)) => {
            tracing::warn!(%servers, %error, "{store} is not answering; messages follow `dedupe.on_store_error` until it does.");
        }
        Err(_) => {
            tracing::warn!(%servers, "{store} did not answer in time; messages follow `dedupe.on_store_error` until it does.");
        }
    }
    Ok((lazy()?, false))
}

/// `max_age` with the clock tables read it by.
fn timing(max_age: Option<Duration>) -> Option<(Duration, Arc<dyn crate::dedup::clock::Clock>)> {
    max_age.map(|age| {
        let clock: Arc<dyn crate::dedup::clock::Clock> = Arc::new(crate::dedup::clock::CoarseClock);
        (age, clock)
    })
}

/// Builds the sink the settings ask for.
///
/// # Errors
///
/// [`RunError::Nsq`] for an unusable producer configuration, [`RunError::Http`] for an
/// unusable CA file.
pub fn build_sink(sink: &SinkSettings, producer: &Transport) -> Result<Sink, RunError> {
    Ok(match sink {
        SinkSettings::Stdout => Sink::Stdout(StdoutSink::default()),
        SinkSettings::File(config) => Sink::File(
            crate::sink::FileSink::new(config.clone())
                .map_err(|(field, reason)| RunError::FileSink { field, reason })?,
        ),
        SinkSettings::Null => Sink::Null,
        SinkSettings::Nsq {
            nsqd_tcp_addresses,
            topic,
        } => Sink::Nsq(NsqSink::new(
            producer_config(nsqd_tcp_addresses, producer),
            topic.clone(),
        )?),
        SinkSettings::Http(config) => Sink::Http(HttpSink::new(config)?),
    })
}

impl Sidecar<Sink> {
    /// Builds the store, the configured sink and the dead-letter, and binds the metrics
    /// address.
    ///
    /// # Errors
    ///
    /// [`RunError`] naming what could not be built.
    pub async fn new(settings: Settings) -> Result<Self, RunError> {
        let sink = build_sink(&settings.sink, &settings.producer)?;
        Self::with_handler(settings, sink).await
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
        // A shared store that did not answer at start is failing until it does: `/ready`
        // says so from the start, not only after the first message's claim.
        let mut store_answered = true;
        let (store, table_file) = match (&settings.store, &settings.table_file) {
            (StoreSettings::Memory(geometry), Some(file)) => {
                let identity = format!("{} {}", settings.keyer.key(), settings.keyer.algorithm());
                let (opened, table, report) = TableFile::open(
                    &file.path,
                    *geometry,
                    &identity,
                    file.on_mismatch,
                    timing(settings.max_age),
                )?;
                if let Some(reason) = &report.recreated {
                    let names = &settings.names;
                    let reason = names.rename(reason);
                    let setting = names.rename("`store.table_file_on_mismatch = \"recreate\"`");
                    tracing::error!(table_file = %file.path.display(), %reason, "Starting with an empty table ({setting}).");
                }
                let (journal, replayed) =
                    Journal::open(&opened, report.journal, &table, file.journal_fsync)?;
                if let Some(reason) = &replayed.ignored {
                    tracing::warn!(journal = %journal.path().display(), %reason, "Journal not replayed.");
                }
                tracing::info!(
                    table_file = %file.path.display(),
                    entries = report.entries,
                    released_in_flight = report.released_in_flight,
                    snapshot_age = report.snapshot_at.and_then(|t| t.elapsed().ok()).map(|age| tracing::field::display(crate::units::format_duration(age))),
                    journal_commits = replayed.commits,
                    journal_erases = replayed.erases,
                    saved_at_start = replayed.saved_at_start,
                    "Table loaded from its file."
                );
                (
                    Backend::Journalled(table, Arc::new(journal)),
                    Some(Arc::new(opened)),
                )
            }
            (store, _) => {
                let (backend, answered) =
                    open_store(store, settings.near_table, settings.max_age).await?;
                store_answered = answered;
                (backend, None)
            }
        };
        let dead_letter = match &settings.dead_letter {
            None => None,
            Some(DeadLetterSettings::File(path)) => Some(DeadLetter::file(path.clone())?),
            Some(DeadLetterSettings::Nsq {
                nsqd_tcp_addresses,
                topic,
            }) => Some(DeadLetter::nsq(
                producer_config(nsqd_tcp_addresses, &settings.producer),
                topic.clone(),
            )?),
        };
        let dead_letter_refused = dead_letter.as_ref().map(|d| Box::pin(d.refused()) as _);
        let metrics_listener = match settings.metrics_address {
            None => None,
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|source| RunError::Metrics { addr, source })?,
            ),
        };
        let metrics = Arc::new(Metrics::with_window(settings.window));
        if !store_answered {
            metrics
                .store_failing
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let dedupe = Dedupe::new(
            store,
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
            table_file,
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
            table_file,
        } = self;
        let mut consumer = Consumer::new(settings.source.clone())?;
        let background = CancellationToken::new();
        // Stops the background tasks whichever way we leave this function.
        let _stop_background = background.clone().drop_guard();
        let table = table_view(&dedupe, &settings);
        tracing::info!(
            topic = %settings.source.topic,
            channel = %settings.source.channel,
            // Only the sources given: a consumer of nsqlookupd alone has no nsqd to name.
            nsqd = (!settings.source.nsqd_tcp_addresses.is_empty()).then(|| tracing::field::display(settings.source.nsqd_tcp_addresses.join(","))),
            lookupd = (!settings.source.lookupd_http_addresses.is_empty()).then(|| tracing::field::display(crate::redact::urls(settings.source.lookupd_http_addresses.iter().map(String::as_str)))),
            store = dedupe.store().kind(),
            buckets = table.geometry.map(|g| g.slots()),
            ways = table.geometry.map(|g| g.ways()),
            sink = %settings.sink,
            dead_letter = settings.dead_letter.as_ref().map(tracing::field::display),
            "Sidecar started."
        );
        if let Some(listener) = metrics_listener {
            let metrics = dedupe.metrics().clone();
            let store = dedupe.clone();
            let window = settings.window;
            let target = settings.target_probability;
            let render: crate::http::server::Page = (
                crate::metrics::exposition::CONTENT_TYPE,
                Arc::new(move || {
                    let view = TableView {
                        geometry: crate::Store::geometry(store.store()),
                        occupancy: store.store().occupancy(),
                        near: store.store().near_stats(),
                        window,
                        target,
                        ejections: store.store().ejections(),
                        cluster_retries: store.store().cluster_retries(),
                    };
                    (StatusCode::OK, metrics.render(&view))
                }),
            );
            // nsqd's liveness convention: `GET /ping` answers `OK`.
            let ping: crate::http::server::Page =
                ("text/plain", Arc::new(|| (StatusCode::OK, "OK".to_owned())));
            let readiness = dedupe.metrics().clone();
            let ready: crate::http::server::Page = (
                "text/plain",
                Arc::new(move || match readiness.readiness() {
                    Ok(()) => (StatusCode::OK, "ready\n".to_owned()),
                    Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why.to_owned()),
                }),
            );
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(%addr, "Serving /metrics, /ping and /ready.");
            }
            let stop = background.clone();
            tokio::spawn(crate::http::serve(
                listener,
                vec![("/metrics", render), ("/ping", ping), ("/ready", ready)],
                async move { stop.cancelled().await },
            ));
        }
        tokio::spawn(status_loop(
            dedupe.clone(),
            consumer.connection_count(),
            settings.status_interval,
            (settings.window, settings.target_probability),
            background.clone(),
        ));

        match dedupe.store() {
            Backend::Memcached(store, _) => {
                tokio::spawn(fleet_loop(
                    store.clone(),
                    dedupe.metrics().clone(),
                    background.clone(),
                ));
            }
            Backend::Redis(store, _) => {
                tokio::spawn(fleet_loop(
                    store.clone(),
                    dedupe.metrics().clone(),
                    background.clone(),
                ));
            }
            _ => {}
        }
        if let (Some(file), Some(settings)) = (&table_file, &settings.table_file) {
            tokio::spawn(snapshot_loop(
                file.clone(),
                dedupe.clone(),
                settings.snapshot_interval,
                background.clone(),
            ));
        }
        let tracker = TaskTracker::new();
        tokio::pin!(shutdown);
        let sink_closed = dedupe.handler().closed();
        tokio::pin!(sink_closed);
        let nsqd_refused = consumer.refused();
        tokio::pin!(nsqd_refused);
        // A producer's refusal (the nsq sink's or dead-letter's nsqd) stops the run as the
        // consumer's does: a misconfiguration must be seen, not retried for ever.
        let sink_refused = dedupe.handler().refused();
        tokio::pin!(sink_refused);
        let mut dead_letter_refused =
            dead_letter_refused.unwrap_or_else(|| Box::pin(std::future::pending()));
        let mut closed = None;
        let mut refused = None;
        loop {
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                error = &mut nsqd_refused => {
                    refused = Some(error);
                    break;
                }
                error = &mut sink_refused => {
                    tracing::error!(%error, "The nsq sink's nsqd refused this client; stopping.");
                    refused = Some(error);
                    break;
                }
                error = &mut dead_letter_refused => {
                    tracing::error!(%error, "The dead-letter's nsqd refused this client; stopping.");
                    refused = Some(error);
                    break;
                }
                error = &mut sink_closed => {
                    tracing::error!(%error, "The sink's output was closed; stopping.");
                    closed = Some(error);
                    break;
                }
                burst = consumer.next_burst() => match burst {
                    Some(burst) => {
                        let dedupe = dedupe.clone();
                        tracker.spawn(async move { dedupe.process_batch(burst).await });
                    }
                    None => break,
                },
            }
        }
        tracing::info!(grace = ?settings.grace, records = dedupe.handling(), "Shutting down: no new messages; waiting for the records with the handler.");
        // The consumer sends CLS, REQs what it received but never handed out, waits up to the
        // grace period for the running handlers' answers and REQs what is left.
        let report = consumer.shutdown(settings.grace).await;
        tracker.close();
        let abandoned = dedupe.handling();
        if abandoned > 0 {
            tracing::warn!(
                records = abandoned,
                "Records still with the handler after the grace period; their messages were requeued."
            );
        }
        // Their messages are requeued already; drop the handlers and erase their claims, so a
        // redelivery is not held back by a claim nobody works on.
        dedupe.abandon();
        if tokio::time::timeout(Duration::from_secs(2), tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                records = dedupe.handling(),
                "Handlers did not stop within 2 s of being abandoned."
            );
        }
        if let Err(error) = dedupe.handler().flush().await {
            tracing::error!(%error, "Flushing the sink failed.");
        }
        if let Some(file) = &table_file {
            // Every handler is done or abandoned: what the table holds now is final.
            background.cancel();
            let report = save_snapshot(file.clone(), dedupe.clone()).await?;
            tracing::info!(table_file = %file.path().display(), bytes = report.bytes, took = ?report.took, "Table saved to its file.");
        }
        log_status(
            &dedupe,
            settings.window,
            settings.target_probability,
            "Sidecar stopped.",
        );
        tracing::info!(
            requeued_unseen = report.requeued_unseen,
            requeued_at_deadline = report.requeued_at_deadline,
            clean = report.clean,
            "Consumer closed."
        );
        if let Some(error) = refused {
            return Err(RunError::Refused(error));
        }
        if let Some(error) = closed {
            return Err(RunError::SinkClosed(error));
        }
        Ok(RunReport {
            shutdown: report,
            abandoned_handlers: abandoned,
        })
    }
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

/// Shares this consumer's distinct count with the others of the shared store once per
/// `store.fleet_interval`, in the middle of each bucket, and records the fleet's rate once the
/// counters cover whole buckets of this consumer's.
async fn fleet_loop(
    store: impl FleetCounters + 'static,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut shared = metrics.distinct();
    let mut shares = 0u64;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(store.until_next_share()) => {}
            _ = stop.cancelled() => return,
        }
        let now = metrics.distinct();
        match store.share_distinct(now - shared).await {
            Ok(rate) => {
                shared = now;
                shares += 1;
                // The first buckets read were written before this consumer counted in them.
                if shares > FLEET_BUCKETS {
                    metrics.rates.note_fleet(std::time::Instant::now(), rate);
                }
            }
            // Added to the next share instead.
            Err(error) => tracing::debug!(%error, "Sharing the distinct count failed."),
        }
    }
}

/// Writes a snapshot of the in-process table every `every` until `stop`.
async fn snapshot_loop<H: Handler>(
    file: Arc<TableFile>,
    dedupe: Dedupe<Backend, H>,
    every: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let journal = match dedupe.store() {
        Backend::Journalled(_, journal) => Some(journal.clone()),
        _ => None,
    };
    let mut unjournalled = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            // The journal's half is half full: a snapshot now starts an empty one.
            () = async {
                match &journal {
                    Some(journal) => journal.wants_snapshot().await,
                    None => std::future::pending().await,
                }
            } => tick.reset(),
            _ = stop.cancelled() => return,
        }
        if let Some(journal) = &journal {
            let now = journal.unjournalled();
            if now > unjournalled {
                tracing::warn!(
                    journal = %journal.path().display(),
                    unjournalled = now - unjournalled,
                    "Commits found the journal full (snapshots fall behind or fail); a kill -9 before the next snapshot forgets them."
                );
                unjournalled = now;
            }
        }
        match save_snapshot(file.clone(), dedupe.clone()).await {
            Ok(report) => {
                tracing::debug!(table_file = %file.path().display(), bytes = report.bytes, took = ?report.took, "Table snapshot written.");
            }
            // The previous snapshot is still in place; the next tick tries again.
            Err(error) => tracing::warn!(%error, "Writing the table snapshot failed."),
        }
    }
}

/// Writes one snapshot on a blocking thread (it is a few hundred megabytes at most, written
/// sequentially).
async fn save_snapshot<H: Handler>(
    file: Arc<TableFile>,
    dedupe: Dedupe<Backend, H>,
) -> Result<SaveReport, RunError> {
    tokio::task::spawn_blocking(move || match dedupe.store() {
        Backend::Memory(table) => file.save(table).map_err(RunError::from),
        Backend::Journalled(table, journal) => journal.save(&file, table).map_err(RunError::from),
        _ => unreachable!("a table file goes with the in-process table"),
    })
    .await
    .unwrap_or_else(|join| std::panic::resume_unwind(join.into_panic()))
}

fn table_view<H: Handler>(dedupe: &Dedupe<Backend, H>, settings: &Settings) -> TableView {
    TableView {
        geometry: crate::Store::geometry(dedupe.store()),
        occupancy: None,
        window: settings.window,
        near: None,
        target: settings.target_probability,
        ejections: None,
        cluster_retries: None,
    }
}

fn log_status<H: Handler>(dedupe: &Dedupe<Backend, H>, window: Duration, target: f64, what: &str) {
    let m = dedupe.metrics();
    let view = TableView {
        geometry: crate::Store::geometry(dedupe.store()),
        occupancy: dedupe.store().occupancy(),
        near: dedupe.store().near_stats(),
        window,
        target,
        ejections: dedupe.store().ejections(),
        cluster_retries: dedupe.store().cluster_retries(),
    };
    let secs = m.uptime().as_secs_f64().max(1e-3);
    tracing::info!(
        nsqd_connections = get(&m.nsqd_connections),
        received = m.received_total(),
        rate = format_args!("{:.1}", m.received_total() as f64 / secs),
        unique = get(&m.unique),
        duplicates = get(&m.duplicates),
        in_flight_requeues = get(&m.in_flight_requeues),
        keyless = get(&m.keyless),
        failures = get(&m.handler_failures),
        dead_lettered = get(&m.dead_lettered),
        store_errors = get(&m.store_errors),
        occupancy = view.occupancy.map(|o| format!("{o:.4}")),
        distinct_rate = format_args!("{:.1}", m.distinct_rate()),
        distinct_rate_peak = format_args!("{:.1}", m.distinct_rate_peak()),
        catch_probability = m.catch_probability(&view).map(|p| format!("{p:.6}")),
        "{what}"
    );
    if let (Some(small), Some(geometry)) = (m.too_small(&view), view.geometry) {
        let memory = match dedupe.store() {
            // `--memory` sizes the in-process table only.
            // Whole MiB, rounded up, so the flag's value is at least the size.
            Backend::Memory(_) | Backend::Journalled(..) => format!(
                " or --memory {}MiB",
                small.suggested.memory_bytes().div_ceil(1 << 20)
            ),
            _ => String::new(),
        };
        tracing::warn!(
            catch_probability = format_args!("{:.6}", small.probability),
            target,
            distinct_rate = format_args!("{:.1}", small.rate),
            window = %crate::units::format_duration(window),
            buckets = geometry.slots(),
            suggested_buckets = small.suggested.slots(),
            "The table is too small for the recent rate: a copy one window late is caught with probability {:.4}, below the target {target}; --buckets {}{memory} (with --ways {}) would meet it.",
            small.probability,
            small.suggested.slots(),
            geometry.ways(),
        );
    }
}

/// Keeps the nsqd connection gauge current (every second) and logs the status line every
/// `every`.
async fn status_loop<H: Handler>(
    dedupe: Dedupe<Backend, H>,
    connections: crate::nsq::ConnectionCount,
    every: Duration,
    (window, target): (Duration, f64),
    stop: CancellationToken,
) {
    let metrics = dedupe.metrics().clone();
    let gauge = |count: &crate::nsq::ConnectionCount| {
        metrics
            .nsqd_connections
            .store(count.get(), std::sync::atomic::Ordering::Relaxed);
    };
    let mut status = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let mut refresh = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = refresh.tick() => {
                gauge(&connections);
                metrics.sample_rate();
            }
            _ = status.tick() => {
                gauge(&connections);
                log_status(&dedupe, window, target, "Status.");
            }
        }
    }
}
