//! Telling a refusal from an outage: the Redis answers that mean a setting is wrong (the
//! password, the user's rights, cluster mode, an address that is not Redis's), each said as
//! a [`StoreError::Refused`] that names the setting to correct and never the password; and
//! `OOM`, a server whose memory settings leave it no room for our writes, said as
//! [`StoreError::OutOfMemory`] with the settings that give it room.
//!
//! Everything else (a refused connection, a reset, a timeout, `CLUSTERDOWN`) is an outage,
//! which waiting may end. The sidecar stops at start on a refusal; while running, a refusal
//! (a password changed under it) or `OOM` is a store error like an outage's, logged when it
//! appears, its messages following `on_store_error`.

use redis::{ErrorKind, RedisError};

use super::config::RedisConfig;
use crate::error::StoreError;
use crate::wording::Wording;

/// What the settings say about who this client is, for the message of a refusal.
pub(super) struct Credentials {
    /// The user name of the URLs, if any (not a secret).
    user: Option<String>,
    has_password: bool,
    /// Where the password came from (see [`RedisConfig::password_setting`]).
    password_setting: Option<&'static str>,
    cluster: bool,
}

impl Credentials {
    /// The credentials of `config`, whose URLs carry `user`.
    pub(super) fn of(config: &RedisConfig, user: Option<&str>) -> Self {
        Credentials {
            user: user.map(str::to_owned),
            has_password: config.password.is_some(),
            password_setting: config.password_setting,
            cluster: config.cluster,
        }
    }

    /// The refusal `error` from `node` is, or `None` when it is not one.
    pub(super) fn refusal(&self, node: &str, error: &RedisError) -> Option<StoreError> {
        let detail = match (error.kind(), error.code()) {
            (ErrorKind::AuthenticationFailed, _) | (_, Some("WRONGPASS")) => {
                let password = match self.password_setting {
                    Some(setting) => Wording::from("the password from ").key(setting),
                    None => Wording::from("the password given"),
                };
                let user = self
                    .user
                    .as_ref()
                    .map_or_else(String::new, |user| format!(" for user {user:?}"));
                Wording::from("AUTH failed: it does not accept ")
                    .then(password)
                    .text(format!(
                        "{user} (a wrong password, or a server without one)"
                    ))
            }
            (_, Some("NOAUTH")) if !self.has_password => {
                Wording::from("it requires a password and none was given; give it in ")
                    .key("store.redis_urls")
                    .text(" (redis://:PASSWORD@host:port), ")
                    .key("store.redis_password_file")
                    .text(" or ")
                    .key(RedisConfig::PASSWORD_ENV)
            }
            (_, Some("NOPERM")) => Wording::from(format!(
                "{}; user {:?} of ",
                error.detail().unwrap_or("permission denied"),
                self.user.as_deref().unwrap_or("default"),
            ))
            .key("store.redis_urls")
            .text(format!(
                " needs the right to run EVALSHA and SCRIPT LOAD{}",
                if self.cluster {
                    " and CLUSTER SLOTS"
                } else {
                    ""
                }
            )),
            (ErrorKind::ResponseError, _)
                if self.cluster
                    && error
                        .detail()
                        .is_some_and(|d| d.contains("cluster support disabled")) =>
            {
                Wording::from("it is a standalone server, not a node of a Redis Cluster; turn ")
                    .key("store.redis_cluster")
                    .text(" off")
            }
            // The parser's own text lists the bytes it did not expect, over several lines.
            (ErrorKind::ParseError, _) => Wording::from(
                "its answer is not in Redis's protocol, so it is not Redis (an HTTP port, say); \
                 give Redis's address (port 6379 unless it was started with another) in ",
            )
            .key("store.redis_urls"),
            _ => return None,
        };
        Some(StoreError::Refused {
            addr: node.to_owned(),
            detail,
        })
    }
}

/// The [`StoreError::OutOfMemory`] that `error` from `node` is, or `None` when it is not one.
///
/// Redis answers `OOM` to a write once its memory is past `maxmemory` and its
/// `maxmemory-policy` finds nothing to evict: with `noeviction`, or a `volatile-*` policy, as
/// the table's keys have no expiry. Raising `maxmemory` gives it room; an `allkeys-*` policy
/// lets it evict sets, which forget their digests (a copy of one of those messages may then
/// pass), never a message.
pub(super) fn out_of_memory(node: &str, error: &RedisError) -> Option<StoreError> {
    if error.code() != Some("OOM") {
        return None;
    }
    // A script's error adds where in the script it failed, which says nothing to the user.
    let detail = error.detail().unwrap_or_default();
    let said = detail.split(" script:").next().unwrap_or_default().trim();
    Some(StoreError::OutOfMemory {
        addr: node.to_owned(),
        detail: format!(
            "it answered {:?}; raise its `maxmemory`, or let it evict with a policy such as \
             `maxmemory-policy allkeys-lru`, which only costs some copies being missed (an \
             evicted set forgets its digests)",
            format!("OOM {said}")
        ),
    })
}
