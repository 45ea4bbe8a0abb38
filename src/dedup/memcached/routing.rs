//! Which server takes a set: rendezvous hashing over the configured servers, and around a
//! server that `health` has ejected, with the task that takes it back once it answers.

use std::sync::atomic::Ordering;

use super::conn::PipeConn;
use super::health::{self, Failed};
use super::{is_connection_error, Inner, MemcachedStore, Server};
use crate::error::StoreError;

impl MemcachedStore {
    /// The index in [`MemcachedConfig::servers`](super::MemcachedConfig::servers) of the server that holds `key`.
    ///
    /// Rendezvous hashing: the server with the highest `xxh3_64(key, seed = xxh3_64(addr))`
    /// wins. It depends only on the key and the server strings.
    pub fn server_of(&self, key: &str) -> usize {
        if self.inner.servers.len() == 1 {
            return 0;
        }
        let mut best = (0, 0);
        for (index, server) in self.inner.servers.iter().enumerate() {
            let score = xxhash_rust::xxh3::xxh3_64_with_seed(key.as_bytes(), server.route_seed);
            if index == 0 || score > best.1 {
                best = (index, score);
            }
        }
        best.0
    }

    /// The index of the server that takes `key` now: [`server_of`](Self::server_of), or,
    /// while that one is ejected, the next server in the key's rendezvous order that is not
    /// (the first choice again if all are out).
    pub(super) fn route(&self, key: &str) -> usize {
        let servers = &self.inner.servers;
        if servers.len() == 1 || !servers.iter().any(|s| s.health.is_ejected()) {
            return self.server_of(key);
        }
        let mut best: Option<(usize, u64)> = None;
        for (index, server) in servers.iter().enumerate() {
            let score = xxhash_rust::xxh3::xxh3_64_with_seed(key.as_bytes(), server.route_seed);
            if !server.health.is_ejected() && best.is_none_or(|(_, s)| score > s) {
                best = Some((index, score));
            }
        }
        best.map_or_else(|| self.server_of(key), |(index, _)| index)
    }

    /// Servers ejected so far (each time one failed for `eject_after`).
    pub fn ejections(&self) -> u64 {
        self.inner.ejections.load(Ordering::Relaxed)
    }

    /// Ejected servers that answered again and were taken back, so far.
    pub fn returns(&self) -> u64 {
        self.inner.returns.load(Ordering::Relaxed)
    }

    /// Servers ejected now.
    pub fn ejected(&self) -> Vec<String> {
        self.inner
            .servers
            .iter()
            .filter(|s| s.health.is_ejected())
            .map(|s| s.addr.clone())
            .collect()
    }

    /// Notes how an operation on `server` went; ejects it after `eject_after` of failures and
    /// starts asking it whether it is back.
    pub(super) fn note_health(&self, server: &Server, result: &Result<impl Sized, StoreError>) {
        match result {
            Ok(_) => server.health.succeeded(),
            Err(error) if is_connection_error(error) => {
                if self.inner.servers.len() == 1 {
                    return;
                }
                let now = self.inner.started.elapsed().as_millis() as u64;
                let after = self.inner.config.eject_after;
                if server.health.failed(now, after) == Failed::Ejected {
                    self.inner.ejections.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(server = %server.addr, %error, eject_after = ?after, "Memcached server ejected: its sets go to the next server (starting empty there) until it answers again.");
                    if let Ok(handle) = tokio::runtime::Handle::try_current() {
                        let inner = std::sync::Arc::downgrade(&self.inner);
                        let addr = server.addr.clone();
                        handle.spawn(probe(inner, addr));
                    }
                }
            }
            Err(_) => {}
        }
    }
}

/// Asks the ejected server `addr` for its version every `probe_interval` until it answers,
/// then takes it back; ends early when the store is dropped.
async fn probe(inner: std::sync::Weak<Inner>, addr: String) {
    loop {
        let (every, timeout) = match inner.upgrade() {
            Some(inner) => (
                health::probe_interval(inner.config.eject_after.unwrap_or_default()),
                inner.config.timeout,
            ),
            None => return,
        };
        tokio::time::sleep(every).await;
        let answered = tokio::time::timeout(timeout, async {
            let mut conn = PipeConn::connect(&addr).await?;
            conn.version().await
        })
        .await
        .is_ok_and(|r| r.is_ok());
        if answered {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            if let Some(server) = inner.servers.iter().find(|s| s.addr == addr) {
                server.pipes.clear();
                server.health.returned();
                // Its sets come back from the servers that took them.
                inner.forget_known();
                inner.returns.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(server = %addr, "Memcached server answers again: its sets return to it.");
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::MemcachedConfig;
    use super::*;
    use crate::dedup::Geometry;

    #[test]
    fn routing_is_pinned() {
        // Routing must never change between releases: these values were computed once with
        // xxh3 and must stay as they are.
        let config = MemcachedConfig {
            servers: vec![
                "10.0.0.1:11211".into(),
                "10.0.0.2:11211".into(),
                "10.0.0.3:11211".into(),
            ],
            ..MemcachedConfig::default()
        };
        // Keys of format 1 (an item per set), whose names are those the values were computed for.
        let store =
            MemcachedStore::new_lazy_in(config, Geometry::new(1024, 8).unwrap(), 1).unwrap();
        let routes: Vec<usize> = (0..12)
            .map(|set| store.server_of(&store.key_of_set(set)))
            .collect();
        assert_eq!(routes, PINNED_ROUTES);
        assert_eq!(store.namespace(), "nsq-dedupe:v1:128x8");
    }

    const PINNED_ROUTES: [usize; 12] = [1, 0, 2, 2, 0, 2, 2, 2, 2, 1, 0, 2];
}
