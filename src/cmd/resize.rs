//! `nsq-dedupe resize`: sets the size of a shared store's table for every consumer of it,
//! through the store's descriptor (see `crate::dedup::generational`).
//!
//! What it refuses, and when (`rules`), and what it prints (`report`), are beside it.

use anyhow::Context as _;

use crate::cli::{FromEnv, ResizeArgs, TypedAliases, RUN_ONLY_STORE_SETTINGS};
use crate::config::{RawConfig, StoreSettings};
use crate::dedup::generational::{resize_if, Generation, Resized};
use crate::{Geometry, MemcachedStore, RedisStore};

mod report;
mod rules;

pub(crate) use rules::{NoNamespace, NoSize, NotShared, Refused, RunOnly};

/// How `resize` came to its size, for its report: each setting as the user gave it (the flag,
/// or the config file's key).
#[derive(Debug, Clone, Copy)]
pub(super) enum Sizing {
    /// `store.buckets`, and the count given.
    Buckets(&'static str, u64),
    /// `store.probability` (`None`: the default target) with `store.rate` and `store.window`
    /// (`None`: the default).
    Rate {
        probability: (f64, Option<&'static str>),
        window: (std::time::Duration, Option<&'static str>),
    },
}

/// The fleet's rate, when given (`store.rate`), and how.
pub(super) type Rate = Option<(f64, &'static str)>;

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
    if let Some(flag) = RUN_ONLY_STORE_SETTINGS
        .iter()
        .find_map(|key| raw.flags.flag_for(key))
    {
        return Err(RunOnly(flag).into());
    }
    let (sizing, rate) = sizing_of(&raw)?;
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
    let rules = rules::Rules {
        ways_given: raw.store.ways.is_some(),
        force: args.force,
        create: args.create,
        rate: rate.map(|(rate, _)| rate),
    };
    let resized = runtime.block_on(async {
        match store {
            StoreSettings::Redis(config, geometry) => {
                let store = RedisStore::connect(config, geometry).await?;
                resize_by(&store, geometry, &rules).await
            }
            StoreSettings::Memcached(config, geometry) => {
                let store = MemcachedStore::connect(config, geometry).await?;
                resize_by(&store, geometry, &rules).await
            }
            StoreSettings::Memory(_) => Err(NotShared("memory").into()),
            StoreSettings::None => Err(NotShared("none").into()),
        }
    });
    let outcome =
        resized.with_context(|| format!("resizing the table of namespace {namespace:?}"))?;
    let text = report::Report {
        namespace: &namespace,
        sizing,
        rate,
        window: raw
            .store
            .window
            .map_or(crate::config::DEFAULT_WINDOW, |w| w.0),
    }
    .text(&outcome, &rules);
    crate::cmd::output::write_stdout(text.as_bytes())?;
    Ok(())
}

/// A resize done, with what judged it: the table's `max_age` as the settings give it, and
/// the time it was judged at (Unix ms).
pub(super) struct Outcome {
    resized: Resized,
    max_age: Option<std::time::Duration>,
    now_ms: u64,
}

/// [`resize_if`] by `rules`.
async fn resize_by<S: Generation>(
    store: &S,
    geometry: Geometry,
    rules: &rules::Rules,
) -> anyhow::Result<Outcome> {
    let max_age = store.max_age();
    let now_ms = crate::dedup::shared::now_ms();
    let resized = resize_if(store, geometry, |before, after| {
        rules.admit(before, after, max_age, now_ms)
    })
    .await??;
    Ok(Outcome {
        resized,
        max_age,
        now_ms,
    })
}

/// Refuses a resize given no size; says which settings gave the size (`store.rate` alone
/// sizes for the default target probability, as the settings' validation does), and the
/// rate.
fn sizing_of(raw: &RawConfig) -> anyhow::Result<(Sizing, Rate)> {
    let store = &raw.store;
    if store.buckets.is_none() && store.memory.is_none() && store.rate.is_none() {
        return Err(NoSize.into());
    }
    let named = |key: &'static str| raw.flags.flag_for(key).unwrap_or(key);
    let rate = store.rate.map(|rate| (rate, named("store.rate")));
    if store.buckets.is_some() || store.memory.is_some() {
        let given = store.buckets.unwrap_or_default();
        return Ok((Sizing::Buckets(named("store.buckets"), given), rate));
    }
    let probability = match store.probability {
        Some(probability) => (probability, Some(named("store.probability"))),
        None => (crate::sizing::DEFAULT_TARGET_PROBABILITY, None),
    };
    let window = match store.window {
        Some(window) => (window.0, Some(named("store.window"))),
        None => (crate::config::DEFAULT_WINDOW, None),
    };
    Ok((
        Sizing::Rate {
            probability,
            window,
        },
        rate,
    ))
}
