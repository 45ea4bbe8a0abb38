//! Builds the store the settings ask for: the in-process table (with its file and journal
//! when `store.table_file` is set), Memcached or Redis (with the near-table in front), or none.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::RunError;
use crate::config::{Named, Settings, StoreSettings, TableFileSettings};
use crate::dedup::backend::Backend;
use crate::dedup::clock::{Clock, CoarseClock};
use crate::dedup::generational::{Generation, Generations};
use crate::dedup::journal::Journal;
use crate::dedup::near::NearTable;
use crate::dedup::table_file::TableFile;
use crate::dedup::Geometry;
use crate::error::StoreError;
use crate::{LocalTable, MemcachedConfig, MemcachedStore, NoStore, RedisConfig, RedisStore, Table};

/// The sidecar's store, as [`Settings`] ask for it.
pub(super) struct Opened {
    /// The store.
    pub(super) backend: Backend,
    /// The in-process table's file, locked while it lives.
    pub(super) table_file: Option<Arc<TableFile>>,
    /// Whether a shared store answered at start (`false`: it is down or silent, and the
    /// service is not ready until it answers).
    pub(super) answered: bool,
}

/// Opens the store of `settings`: the in-process table from its file when it has one,
/// otherwise [`open_store`].
pub(super) async fn open(settings: &Settings) -> Result<Opened, RunError> {
    if let (StoreSettings::Memory(geometry), Some(file)) = (&settings.store, &settings.table_file) {
        let (backend, table_file) = open_table_file(settings, *geometry, file)?;
        return Ok(Opened {
            backend,
            table_file: Some(table_file),
            answered: true,
        });
    }
    let (backend, answered) = open_store(
        &settings.store,
        settings.near_table,
        settings.max_age,
        settings.growth.is_some(),
    )
    .await?;
    Ok(Opened {
        backend,
        table_file: None,
        answered,
    })
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
    Ok(open_store(store, near_table, max_age, false).await?.0)
}

/// [`build_store`] (with a table that sizes itself when `growable`), and whether a
/// shared store answered at start (`false`: it is down or silent, and the service is not
/// ready until it answers).
async fn open_store(
    store: &StoreSettings,
    near_table: Option<Geometry>,
    max_age: Option<Duration>,
    growable: bool,
) -> Result<(Backend, bool), RunError> {
    let near = match (store, near_table) {
        (StoreSettings::Memcached(..) | StoreSettings::Redis(..), Some(geometry)) => {
            Some(NearTable::new(geometry, timing(max_age))?)
        }
        _ => None,
    };
    Ok(match store {
        StoreSettings::Memory(geometry) => (
            Backend::Memory(local(
                match timing(max_age) {
                    None => Table::new(*geometry)?,
                    Some((age, clock)) => Table::with_max_age(*geometry, age, clock)?,
                },
                growable,
            )),
            true,
        ),
        StoreSettings::None => (Backend::None(NoStore), true),
        StoreSettings::Memcached(config, geometry) => {
            let (opened, answered) = open_shared(config, *geometry).await?;
            (
                Backend::Memcached(following(opened, answered, growable).await, near),
                answered,
            )
        }
        StoreSettings::Redis(config, geometry) => {
            let (opened, answered) = open_shared(config, *geometry).await?;
            (
                Backend::Redis(following(opened, answered, growable).await, near),
                answered,
            )
        }
    })
}

/// A shared store's settings: how to open it, at once or without contacting it.
trait SharedConfig: Clone {
    /// The store these settings open.
    type Store;
    /// The store's name in the log.
    const NAME: &'static str;
    /// Its servers, as they may be logged.
    fn servers(&self) -> String;
    /// How long one call may take.
    fn timeout(&self) -> Duration;
    /// Opens the store, contacting its servers.
    fn connect(self, geometry: Geometry) -> impl Future<Output = Result<Self::Store, StoreError>>;
    /// Opens the store without contacting its servers.
    fn lazy(self, geometry: Geometry) -> Result<Self::Store, StoreError>;
}

impl SharedConfig for MemcachedConfig {
    type Store = MemcachedStore;
    const NAME: &'static str = "Memcached";
    fn servers(&self) -> String {
        self.servers.join(",")
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn connect(self, geometry: Geometry) -> impl Future<Output = Result<Self::Store, StoreError>> {
        MemcachedStore::connect(self, geometry)
    }
    fn lazy(self, geometry: Geometry) -> Result<Self::Store, StoreError> {
        MemcachedStore::new_lazy(self, geometry)
    }
}

impl SharedConfig for RedisConfig {
    type Store = RedisStore;
    const NAME: &'static str = "Redis";
    // The URLs carry no password (it was moved out of them), so they can be logged.
    fn servers(&self) -> String {
        self.urls.join(",")
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn connect(self, geometry: Geometry) -> impl Future<Output = Result<Self::Store, StoreError>> {
        RedisStore::connect(self, geometry)
    }
    fn lazy(self, geometry: Geometry) -> Result<Self::Store, StoreError> {
        RedisStore::new_lazy(self, geometry)
    }
}

/// Opens a shared store at start, within four of its timeouts.
///
/// A server that is down or does not answer in time is an outage: a store error per message
/// (handled by `on_store_error`) until it answers, not a reason to refuse to start; we say so
/// at once and open the store lazily, without contacting it. A server that answered and
/// refused us, or settings the store cannot use, stop the start: waiting would not help.
async fn open_shared<C: SharedConfig>(
    config: &C,
    geometry: Geometry,
) -> Result<(C::Store, bool), RunError> {
    let (store, servers) = (C::NAME, config.servers());
    let connect = config.clone().connect(geometry);
    match tokio::time::timeout(config.timeout() * 4, connect).await {
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
    Ok((config.clone().lazy(geometry)?, false))
}

/// A shared store's table as its descriptor names it (see
/// [`generational`](crate::dedup::generational)): read at once when the store `answered` at
/// start, else by the first claims, which fail until it is read. `sizes_itself` when no size
/// was given: the store's size is then followed without a warning.
async fn following<S: Generation>(opened: S, answered: bool, sizes_itself: bool) -> Generations<S> {
    let generations = if sizes_itself {
        Generations::sizing_itself(opened)
    } else {
        Generations::new(opened)
    };
    if answered {
        if let Err(error) = generations.follow().await {
            if generations.descriptor_read() {
                tracing::warn!(%error, "The table's descriptor cannot be followed; the table stays at the size given.");
            } else {
                tracing::warn!(%error, "Reading the table's descriptor failed; messages follow `dedupe.on_store_error` until it can be read.");
            }
        }
    }
    generations
}

/// Opens the in-process table from its file and replays its journal.
fn open_table_file(
    settings: &Settings,
    geometry: Geometry,
    file: &TableFileSettings,
) -> Result<(Backend, Arc<TableFile>), RunError> {
    let identity = format!("{} {}", settings.keyer.key(), settings.keyer.algorithm());
    let (opened, table, report) = TableFile::open_sized(
        &file.path,
        geometry,
        &identity,
        file.on_mismatch,
        timing(settings.max_age),
        settings.growth.is_some(),
    )?;
    if let Some(reason) = &report.recreated {
        let names = &settings.names;
        let reason = names.show(reason);
        let setting = Named::set("store.table_file_on_mismatch", "\"recreate\"");
        let setting = names.show(&setting);
        tracing::error!(table_file = %file.path.display(), %reason, "Starting with an empty table ({setting}).");
    }
    if let Some(from) = report.resized_from {
        crate::dedup::table_file::log_resize(&file.path, from, geometry);
    }
    let (journal, replayed) = Journal::open(&opened, report.journal, &table, file.journal_fsync)?;
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
    Ok((
        Backend::Journalled(local(table, settings.growth.is_some()), Arc::new(journal)),
        Arc::new(opened),
    ))
}

/// The in-process table as the store holds it: growable when it sizes itself.
fn local(table: Table, growable: bool) -> LocalTable {
    if growable {
        LocalTable::growable(table)
    } else {
        LocalTable::fixed(table)
    }
}

/// `max_age` with the clock tables read it by.
fn timing(max_age: Option<Duration>) -> Option<(Duration, Arc<dyn Clock>)> {
    max_age.map(|age| {
        let clock: Arc<dyn Clock> = Arc::new(CoarseClock);
        (age, clock)
    })
}
