//! Settings of the Redis store ([`RedisConfig`]): defaults, the password kept out of logs and
//! errors, and validation that names the setting without connecting.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::StoreError;
use crate::wording::Wording;

/// A password for Redis. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisPassword(String);

impl RedisPassword {
    /// Wraps a password.
    pub fn new(password: impl Into<String>) -> Self {
        RedisPassword(password.into())
    }

    /// The password itself, for the connection's `AUTH`.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for RedisPassword {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisPassword({})", crate::redact::REDACTED)
    }
}

/// Settings of a [`RedisStore`](super::RedisStore).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use nsq_dedupe::RedisConfig;
///
/// let config = RedisConfig {
///     urls: vec!["redis://10.0.0.5:6379".into()],
///     namespace: "orders".into(),
///     ..RedisConfig::default()
/// };
/// assert_eq!(config.lease, Duration::from_secs(65));
/// assert!(config.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// `redis://[user@]host:port[/db]` or `rediss://…` (TLS). One server, or with `cluster`
    /// the seed nodes of a Redis Cluster. A password in a URL is moved to `password` by
    /// [`RedisConfig::take_url_passwords`], so that these strings can be logged. Defaults to:
    /// `["redis://127.0.0.1:6379"]`.
    pub urls: Vec<String>,
    /// The URLs are seed nodes of a Redis Cluster: the store learns the slot map from them,
    /// follows `MOVED` and `ASK` and refreshes the map after a failover. Defaults to: `false`.
    pub cluster: bool,
    /// The password sent with `AUTH` (with the URL's user name, if any). Defaults to: none.
    pub password: Option<RedisPassword>,
    /// The setting `password` came from (`store.redis_urls`, `store.redis_password_file` or
    /// [`RedisConfig::PASSWORD_ENV`]), so that a server that refuses it is answered with what
    /// to correct. Set by [`RedisConfig::take_url_passwords`] for a password it moves out of a
    /// URL. Defaults to: `None` (the password is then called "the password given").
    pub password_setting: Option<&'static str>,
    /// A PEM file of CA certificates trusted besides the system's roots, for `rediss://`.
    pub tls_root_ca_file: Option<PathBuf>,
    /// The user's part of the namespace, as for Memcached. Defaults to: `nsq-dedupe`.
    pub namespace: String,
    /// How long a claim stays in flight without `commit` or `renew`. Defaults to: 65 s.
    pub lease: Duration,
    /// Time limit of one operation (connecting included). Defaults to: 500 ms.
    pub timeout: Duration,
    /// Done entries committed longer ago than this count as not seen (`dedupe.max_age`).
    /// Defaults to: `None`.
    pub max_age: Option<Duration>,
    /// How often this consumer adds its distinct count to the fleet's counters, and the
    /// length of one counter, as for Memcached (see [`fleet`](crate::dedup::fleet)). Every
    /// consumer of the table needs the same. Defaults to:
    /// 10 s.
    pub fleet_interval: Duration,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            urls: vec!["redis://127.0.0.1:6379".to_owned()],
            cluster: false,
            password: None,
            password_setting: None,
            tls_root_ca_file: None,
            namespace: "nsq-dedupe".to_owned(),
            lease: Duration::from_secs(65),
            timeout: crate::dedup::shared::DEFAULT_TIMEOUT,
            max_age: None,
            fleet_interval: crate::dedup::fleet::DEFAULT_FLEET_INTERVAL,
        }
    }
}

impl RedisConfig {
    /// The environment variable the binary reads the password from when neither a URL nor
    /// `store.redis_password_file` gives one.
    pub const PASSWORD_ENV: &'static str = "NSQ_DEDUPE_REDIS_PASSWORD";

    /// Moves a password written in a URL (`redis://user:secret@host`) into
    /// [`RedisConfig::password`] and removes it from the URL. Two URLs with different
    /// passwords are refused.
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] for a URL that does not parse (shown without its user part) or
    /// for conflicting passwords.
    pub fn take_url_passwords(&mut self) -> Result<(), StoreError> {
        for text in &mut self.urls {
            let mut url = parse_url(text)?;
            let Some(password) = url.password().map(crate::percent::decode) else {
                continue;
            };
            let password = RedisPassword::new(password);
            match &self.password {
                Some(known) if *known != password => {
                    return Err(StoreError::Config(
                        Wording::from("the entries of ")
                            .key("store.redis_urls")
                            .text(
                            " carry different passwords; a store uses one password for every node",
                        ),
                    ))
                }
                _ => {
                    self.password = Some(password);
                    self.password_setting = Some("store.redis_urls");
                }
            }
            // Setting a password fails only for URLs without a host, which parse_url refused.
            let _ = url.set_password(None);
            *text = url.to_string();
        }
        Ok(())
    }

    /// Checks every setting without connecting.
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] naming the first setting that is wrong.
    pub fn validate(&self) -> Result<(), StoreError> {
        let invalid = |detail: Wording| Err(StoreError::Config(detail));
        if self.urls.is_empty() {
            return invalid(
                Wording::default()
                    .key("store.redis_urls")
                    .text(" is empty; give at least one redis:// URL"),
            );
        }
        for text in &self.urls {
            parse_url(text)?;
        }
        if self.urls.len() > 1 && !self.cluster {
            return invalid(
                Wording::default()
                    .key("store.redis_urls")
                    .text(format!(" has {} URLs but ", self.urls.len()))
                    .key("store.redis_cluster")
                    .text(
                        " is off: give one server, or turn the cluster on to use them as seed \
                         nodes of a Redis Cluster",
                    ),
            );
        }
        crate::dedup::shared::check_settings(
            &self.namespace,
            self.lease,
            self.timeout,
            self.fleet_interval,
        )
    }

    /// Whether any URL asks for TLS.
    pub(crate) fn uses_tls(&self) -> bool {
        self.urls.iter().any(|u| u.starts_with("rediss://"))
    }
}

/// Parses one URL of `store.redis_urls`: `redis://` or `rediss://` with a host.
///
/// # Errors
///
/// [`StoreError::Config`] showing the URL as [`crate::redact::url`] prints it.
pub(crate) fn parse_url(text: &str) -> Result<url::Url, StoreError> {
    let refuse = |reason: &str| {
        StoreError::Config(
            Wording::default()
                .key("store.redis_urls")
                .text(format!(" entry {:?}: {reason}", crate::redact::url(text))),
        )
    };
    let url = url::Url::parse(text).map_err(|error| refuse(&error.to_string()))?;
    if !matches!(url.scheme(), "redis" | "rediss") {
        return Err(refuse(
            "expected redis://[user:password@]host:port[/db] or rediss://… for TLS",
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(refuse("the URL has no host"));
    }
    let db = url.path().trim_start_matches('/');
    if !db.is_empty() && db.parse::<u16>().is_err() {
        return Err(refuse("the path must be a database number such as /0"));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_leave_the_urls_and_never_print() {
        let mut config = RedisConfig {
            urls: vec!["redis://app:s%40cret@10.0.0.1:6379/2".into()],
            ..RedisConfig::default()
        };
        config.take_url_passwords().unwrap();
        assert_eq!(config.urls, ["redis://app@10.0.0.1:6379/2"]);
        assert_eq!(config.password.as_ref().unwrap().expose(), "s@cret");
        let shown = format!("{config:?}");
        assert!(!shown.contains("cret"), "{shown}");
        assert!(config.validate().is_ok());
    }

    #[test]
    fn bad_urls_are_named_without_their_password() {
        let bad = |urls: &[&str], cluster: bool| {
            RedisConfig {
                urls: urls.iter().map(|&u| u.to_owned()).collect(),
                cluster,
                ..RedisConfig::default()
            }
            .validate()
            .unwrap_err()
            .to_string()
        };
        let e = bad(&["http://u:hunter2@host:1"], false);
        assert!(e.contains("\"http://<redacted>@host:1\""), "{e}");
        assert!(!e.contains("hunter2"), "{e}");
        assert!(bad(&["redis://host:1/x"], false).contains("database number"));
        let e = bad(&["redis://:pw@host:99999"], false);
        assert!(e.contains("<redacted>@host") && !e.contains("pw"), "{e}");
        let two = ["redis://a:1", "redis://b:1"];
        assert!(bad(&two, false).contains("store.redis_cluster"));
        let seeds = RedisConfig {
            urls: two.iter().map(|&u| u.to_owned()).collect(),
            cluster: true,
            ..RedisConfig::default()
        };
        assert!(seeds.validate().is_ok());
    }
}
