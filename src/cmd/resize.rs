//! `nsq-dedupe resize`: sets the size of a shared store's table for every consumer of it,
//! through the store's descriptor (see `crate::dedup::generational`).

use anyhow::Context as _;

use crate::cli::{FromEnv, ResizeArgs, TypedAliases};
use crate::config::{RawConfig, StoreSettings};
use crate::dedup::generational::{resize, Generation, Resized};
use crate::{Descriptor, Geometry, MemcachedStore, RedisStore, Shape};

/// Builds the store's settings from `--config`, the flags and the environment, and writes
/// the new size into the store's descriptor; prints what changed.
pub(crate) fn run(
    args: &ResizeArgs,
    from_env: &FromEnv,
    aliases: &TypedAliases,
) -> anyhow::Result<()> {
    let mut raw = match &args.config {
        Some(path) => RawConfig::from_file(path)?,
        None => RawConfig::default(),
    };
    args.apply(&mut raw, from_env, aliases);
    crate::cmd::entry::name_settings_as(raw.flags.clone());
    if raw.store.buckets.is_none() && raw.store.memory.is_none() && raw.store.rate.is_none() {
        return Err(NoSize.into());
    }
    let store = raw.validate_store()?;
    let shared = matches!(
        store,
        StoreSettings::Redis(..) | StoreSettings::Memcached(..)
    );
    if shared && !raw.names_its_table() {
        return Err(NoNamespace.into());
    }
    let namespace = match &store {
        StoreSettings::Redis(config, _) => config.namespace.clone(),
        StoreSettings::Memcached(config, _) => config.namespace.clone(),
        StoreSettings::Memory(_) => return Err(NotShared("memory").into()),
        StoreSettings::None => return Err(NotShared("none").into()),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let ways_given = raw.store.ways.is_some();
    let resized = runtime.block_on(async move {
        match store {
            StoreSettings::Redis(config, geometry) => {
                let store = RedisStore::connect(config, geometry).await?;
                resize_keeping_ways(&store, geometry, ways_given).await
            }
            StoreSettings::Memcached(config, geometry) => {
                let store = MemcachedStore::connect(config, geometry).await?;
                resize_keeping_ways(&store, geometry, ways_given).await
            }
            StoreSettings::Memory(_) => Err(NotShared("memory").into()),
            StoreSettings::None => Err(NotShared("none").into()),
        }
    });
    let resized =
        resized.with_context(|| format!("resizing the table of namespace {namespace:?}"))?;
    crate::cmd::output::write_stdout(report(&namespace, resized.before, resized.after).as_bytes())?;
    Ok(())
}

/// [`resize`], refused when `--ways` was not given and the table has other ways than the
/// default: a resize is not where a table's ways change unasked.
async fn resize_keeping_ways<S: Generation>(
    store: &S,
    geometry: Geometry,
    ways_given: bool,
) -> anyhow::Result<Resized> {
    if !ways_given {
        if let Some(text) = store.descriptor(None).await? {
            let current = Descriptor::parse(&store.descriptor_key(), &text)?.current;
            let ways = current.geometry.ways();
            if ways != geometry.ways() {
                return Err(OtherWays {
                    table: ways,
                    default: geometry.ways(),
                }
                .into());
            }
        }
    }
    Ok(resize(store, geometry).await?)
}

/// What `resize` prints.
fn report(namespace: &str, before: Option<Descriptor>, after: Descriptor) -> String {
    // The layout is named where it changed (a store's key format: see docs/design.md).
    let relaid = before.is_some_and(|before| before.current.format != after.current.format);
    let size = |shape: Shape| {
        let geometry = shape.geometry;
        let layout = if relaid {
            format!(", key format {}", shape.format)
        } else {
            String::new()
        };
        format!(
            "{} buckets ({} sets of {} ways{layout})",
            geometry.slots(),
            geometry.sets(),
            geometry.ways()
        )
    };
    match (before, after.previous) {
        (Some(before), _) if before == after => format!(
            "The table of namespace {namespace:?} is already {}: nothing changed.\n",
            size(after.current)
        ),
        (Some(before), Some(_)) => format!(
            "The table of namespace {namespace:?} is now {}; it was {}, which claims read \
             until it has turned over (or `max_age` has passed). Running consumers follow \
             within one fleet interval.\n",
            size(after.current),
            size(before.current)
        ),
        _ => format!(
            "The table of namespace {namespace:?} had no descriptor: it is now {}.\n",
            size(after.current)
        ),
    }
}

/// `resize` was given a store without a shared table.
#[derive(Debug, thiserror::Error)]
#[error(
    "`resize` changes the size of a table shared through Redis or Memcached, and the store \
     given is {0:?}: pass `--store redis` with `--redis-url`, or `--store memcached` with \
     `--memcached-address` (or set `store.kind` in the config file); an in-process table \
     takes its size from `--buckets` at start"
)]
pub(crate) struct NotShared(&'static str);

/// `resize` was given no size: it would write the default size into every consumer's table.
#[derive(Debug, thiserror::Error)]
#[error(
    "`resize` sets the size of the table every consumer shares, and none was given: pass \
     `--buckets N`, `--memory SIZE` or `--rate R` (or set `store.buckets`, `store.memory` or \
     `store.rate` in the config file). The size the table has now, given again, moves it to \
     this version's layout without resizing it (a consumer following a table of an earlier \
     layout names it in its WARN)"
)]
pub(crate) struct NoSize;

/// `resize` was given neither the table's namespace nor its consumers' stream: each stream's
/// consumers keep their own table by default, and `resize` cannot tell which is meant.
#[derive(Debug, thiserror::Error)]
#[error(
    "`resize` needs to know whose table to resize, and neither a namespace nor a topic was \
     given: pass the sidecars' `--namespace`, or `--config` with the sidecars' config file \
     (its `[source]` topic and channel name their table when it sets no `store.namespace`: \
     `nsq-dedupe.<topic>.<channel>`)"
)]
pub(crate) struct NoNamespace;

/// `resize` was not given `--ways`, and the table has other ways than the default.
#[derive(Debug, thiserror::Error)]
#[error(
    "the table has {table} ways, and `resize` without `--ways` would give it {default}: pass \
     `--ways {table}` to keep them (or `--ways {default}` to change them)"
)]
pub(crate) struct OtherWays {
    table: u32,
    default: u32,
}
