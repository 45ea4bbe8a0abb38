//! What the shared stores (Memcached and Redis) have in common: the versions in their keys and
//! set values, the namespace rule, lease owners and the wall clock that leases and `max_age`
//! are measured by. Redis, and Memcached's earlier layout, keep a set as the same 34-byte
//! entries, so their value formats are written once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::StoreError;
use crate::wording::Wording;

/// The bound on each network step or operation of a shared store when none is given.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_millis(500);

/// The Redis key format's version, part of the namespace. Since version 2 a Redis set keeps
/// every entry at a fixed offset (see `redis/set.lua`), so its values are no longer the
/// Memcached store's, and the sets of version 1 are never read as version 2's, nor the reverse.
#[cfg(feature = "redis")]
pub(crate) const REDIS_KEY_VERSION: u8 = 2;

/// The value format of 34-byte entries (Redis, and Memcached's earlier layout) written without
/// `max_age`: a done entry's time field is 0. Every version of nsq-dedupe reads it.
pub(crate) const FORMAT_VERSION: u8 = 1;

/// The value format written with `max_age`: a done entry's time field is the time of its
/// commit. Values of version 1 are read as they are (their done entries never expire) and
/// replaced by version 2 on their next write.
pub(crate) const FORMAT_VERSION_TIMED: u8 = 2;

/// The value format a store writes: timed only when entries expire (`max_age`), so that a
/// table without it stays readable by every version.
pub(crate) fn value_version(max_age: Option<Duration>) -> u8 {
    if max_age.is_some() {
        FORMAT_VERSION_TIMED
    } else {
        FORMAT_VERSION
    }
}

/// The rule for a namespace: it becomes part of every key, and Memcached keys are printable
/// ASCII without spaces, at most 250 bytes with the rest of the key.
///
/// # Errors
///
/// What is wrong, for an error message that names the setting.
pub(crate) fn check_namespace(namespace: &str) -> Result<(), &'static str> {
    if namespace.is_empty()
        || namespace.len() > 160
        || !namespace.bytes().all(|b| b.is_ascii_graphic())
    {
        Err("must be 1 to 160 printable ASCII characters without spaces")
    } else {
        Ok(())
    }
}

/// Checks the settings both shared stores have: the namespace, the lease, the timeout and
/// the fleet's interval.
///
/// # Errors
///
/// [`StoreError::Config`] naming the first that is wrong.
pub(crate) fn check_settings(
    namespace: &str,
    lease: Duration,
    timeout: Duration,
    fleet_interval: Duration,
) -> Result<(), StoreError> {
    let invalid = |key: &'static str, reason: String| {
        Err(StoreError::Config(Wording::default().key(key).text(reason)))
    };
    if let Err(reason) = check_namespace(namespace) {
        return invalid("store.namespace", format!(" = {namespace:?}: {reason}"));
    }
    if lease.as_millis() == 0 {
        return invalid("store.lease", " must be at least 1 ms".into());
    }
    if timeout.is_zero() {
        return invalid("store.timeout", " must be more than 0".into());
    }
    if let Err(reason) = crate::dedup::fleet::check_fleet_interval(fleet_interval) {
        return invalid(
            "store.fleet_interval",
            format!(" = {fleet_interval:?}: {reason}"),
        );
    }
    Ok(())
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A random owner id: xxh3 of the process id, the time, a per-process counter and a stack
/// address, so two stores (in one process or in two) practically never share one.
pub(crate) fn random_owner() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let local = 0u8;
    let mut seed = Vec::with_capacity(40);
    seed.extend_from_slice(&u64::from(std::process::id()).to_le_bytes());
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    seed.extend_from_slice(&nanos.to_le_bytes());
    // Relaxed: only uniqueness of the returned number matters.
    seed.extend_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    seed.extend_from_slice(&(std::ptr::addr_of!(local) as usize as u64).to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&seed)
}
