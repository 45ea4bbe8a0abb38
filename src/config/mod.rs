//! The sidecar's configuration: a TOML file and flags, merged, then validated into [`Settings`].
//!
//! Two stages, as ripgrep's low-level and high-level arguments: [`RawConfig`] is what the file
//! says (every key optional, unknown keys rejected), flags overwrite its fields, and
//! [`RawConfig::validate`] turns it into [`Settings`], checking every value and naming the key
//! and the value when one is wrong.
//!
//! ```toml
//! [source]                          # what to consume (names as in NSQ's own tools)
//! nsqd_tcp_addresses = ["127.0.0.1:4150"]
//! lookupd_http_addresses = []       # host:port or http://host:port
//! topic = "events"
//! channel = "nsq-dedupe"            # default
//! max_in_flight = 200               # default
//! msg_timeout = "60s"               # default
//! max_attempts = 5                  # default; then the dead-letter
//! backoff = "1s"                    # handler-failure REQ delay and consumer pause, doubling
//! max_backoff = "2m"
//!
//! [dedupe]
//! key = "json:/id"                  # or "body" (default)
//! digest = "xxh3"                   # or "xxh3:<seed>", "md5", "blake3" (with the key file)
//! # digest_key_file = "/run/secrets/digest-key"  # 32 bytes: keyed BLAKE3
//! on_in_flight = "requeue"          # or "finish"
//! in_flight_requeue_delay = "1s"
//! on_store_error = "requeue"        # or "process"
//! store_error_requeue_delay = "1s"
//! # max_age = "10m"                 # copies older than this pass (off by default)
//!
//! [store]
//! kind = "memory"                   # or "memcached", "redis", "none"
//! ways = 8
//! buckets = 8388608                 # or: memory, or probability + rate + window
//! # memory = "64MiB"                # in-process table: its slots' memory
//! # probability = 0.99
//! # rate = 1000
//! # window = "1h"
//! memcached_addresses = ["127.0.0.1:11211"]
//! # redis_urls = ["redis://127.0.0.1:6379"]  # or rediss://; user:password@ or the two below
//! # redis_cluster = false          # true: the URLs are seed nodes of a Redis Cluster
//! # redis_password_file = "/run/secrets/redis"  # or NSQ_DEDUPE_REDIS_PASSWORD
//! # redis_tls_root_ca_file = "/etc/nsq-dedupe/redis-ca.pem"
//! namespace = "events"            # default: "nsq-dedupe.<topic>.<channel>", a table per stream
//! lease = "65s"                     # default: msg_timeout + 5 s
//! # table_file = "/var/lib/nsq-dedupe/table"  # memory: kept between runs
//! # snapshot_interval = "10s"       # default
//! # table_file_on_mismatch = "resize"  # default; or "error", "recreate"
//! # journal_fsync = false          # true: a machine crash loses nothing FINished
//! # near_table = "16MiB"            # memcached, redis: local table of this process's commits
//!                                   # (default: a quarter of the table's slots, 1-64 MiB; "off")
//! timeout = "500ms"
//! # eject_after = "10s"             # memcached: a server failing this long is skipped; "off"
//! # fleet_interval = "10s"          # memcached: how often the fleet's counts are shared
//!
//! [sink]
//! kind = "stdout"                   # or "nsq", "http", "file", "null", "serve"
//! destination_nsqd_tcp_addresses = ["127.0.0.1:4150"]
//! destination_topic = "events.unique"
//! post = "http://127.0.0.1:8080/ingest" # or a list of URLs
//! mode = "round-robin"              # or "multicast"
//! content_type = "application/octet-stream"  # default
//! headers = { "X-Source" = "nsq-dedupe" }
//! http_client_connect_timeout = "2s"   # default
//! http_client_request_timeout = "10s"  # default
//! # http_client_tls_root_ca_file = "/etc/nsq-dedupe/ca.pem"
//! http_concurrency = 100               # default: most connections (and requests) per endpoint
//! http_idempotency_header = "Idempotency-Key"  # default; or "off"
//! http_batch_size = 1                  # default: each body POSTed as it is
//! http_batch_timeout = "100ms"         # default; how long a batch not full waits for more
//! http_batch_format = "lines"          # default; or "json-array"
//! # kind = "file": output_dir, work_dir, filename_format, datetime_format, rotate_interval,
//! # rotate_size = "100MiB", gzip, gzip_level, sync_interval, host_identifier, skip_empty_files
//! # kind = "serve" (an nsqd for NSQ consumers): serve_tcp_address = "127.0.0.1:4250",
//! # serve_http_address = "127.0.0.1:4251" (or "off"), serve_msg_timeout = "60s",
//! # serve_max_msg_timeout = "15m", serve_heartbeat_interval = "30s", serve_max_rdy_count,
//! # serve_max_connections, serve_tls_cert, serve_tls_key, serve_tls_required,
//! # serve_auth_secret_file
//!
//! [dead_letter]                     # optional
//! kind = "file"                     # or "nsq"
//! path = "/var/lib/nsq-dedupe/dead-letter.ndjson"
//! # nsqd_tcp_addresses = [...]; topic = "events.dead"
//!
//! [metrics]
//! address = "127.0.0.1:9150"        # or ":9150" (every IPv4 interface), or "off"
//! status_interval = "10s"
//!
//! [shutdown]
//! grace = "10s"
//!
//! [consumer_opt]                    # go-nsq's options, as nsq_to_nsq's --consumer-opt
//! # tls_v1 = true; tls_root_ca_file, tls_cert, tls_key, tls_insecure_skip_verify,
//! # tls_min_version; snappy = true or deflate = true (deflate_level = 6);
//! # auth_secret_file = "/run/secrets/nsq" (or auth_secret); user_agent;
//! # output_buffer_size, output_buffer_timeout, sample_rate
//!
//! [producer_opt]                    # the same for the nsq sink and nsq dead-letter
//! ```
//!
//! # Layout
//!
//! Each TOML section has its own module, with its raw form and the validation that turns it
//! into what the component needs; the rules themselves (name syntax, table shapes, Memcached
//! settings) belong to the components and are only called from here:
//! `source` (`[source]`), `dedupe` (`[dedupe]`), `store` (`[store]`), `dead_letter`
//! (`[dead_letter]`), `service` (`[metrics]`, `[shutdown]`) and `nsq_opts` (`[consumer_opt]`,
//! `[producer_opt]`). `[sink]` is the sinks' ([`crate::sink`]): each sink's keys, their
//! validation and its build are in the sink's own module, and [`RawSink`] is made from the
//! list of the sinks. Rules shared by sections have their own: `unused` (a setting the others
//! leave unused) and `toml_error` (the parser's message, naming the key). What a section is
//! made of (each setting defined once: key, flag, help and the kinds it belongs to, from which
//! the binary makes its flags; [`ConfigError`], durations, addresses and output file names)
//! is `crate::setting`'s, below this module and the sinks alike. Which flag gave which key,
//! and messages that name settings, are [`crate::wording`]'s.

mod builder;
mod dead_letter;
mod dedupe;
mod nsq_opts;
mod service;
mod source;
mod store;
mod toml_error;
mod unused;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::dedup::digest::{DigestAlgorithm, Keyer};
use crate::dedup::Geometry;
use crate::nsq::ConsumerConfig;
use crate::pipeline::Policy;

pub use crate::setting::{ConfigError, Dur};
pub use crate::sink::{OneOrMany, RawSink, SinkKind, SinkSettings};
pub(crate) use crate::wording::{FlagOrigins, Named, Wording};
pub use builder::SettingsBuilder;
pub use dead_letter::{DeadLetterKind, DeadLetterSettings, RawDeadLetter};
#[cfg(feature = "cli")]
pub(crate) use dedupe::read_digest_key;
pub use dedupe::RawDedupe;
pub use nsq_opts::RawNsqOpts;
#[cfg(feature = "cli")]
pub(crate) use nsq_opts::{option_key, OPTION_NAMES};
pub use service::{RawMetrics, RawShutdown};
pub use source::RawSource;
pub use store::{RawStore, StoreKind, StoreSettings, TableFileSettings, DEFAULT_WINDOW};

#[cfg(test)]
use crate::setting::Section as _;
use crate::setting::{check_host_port, check_name, invalid, output_name, quote, resolve};

/// The settings of every section defined by its table, in the order of `run --help`: what the
/// flags, the guide's flag table and the man page are checked against.
#[cfg(test)]
pub(crate) const SECTIONS: [&[crate::setting::Setting]; 8] = [
    RawSource::SETTINGS,
    RawNsqOpts::SETTINGS,
    RawDedupe::SETTINGS,
    RawStore::SETTINGS,
    RawSink::SETTINGS,
    RawMetrics::SETTINGS,
    RawShutdown::SETTINGS,
    RawDeadLetter::SETTINGS,
];

/// The configuration as written: every key optional, unknown keys rejected.
#[allow(missing_docs)]
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub source: RawSource,
    #[serde(default)]
    pub dedupe: RawDedupe,
    #[serde(default)]
    pub store: RawStore,
    #[serde(default)]
    pub sink: RawSink,
    #[serde(default, deserialize_with = "dead_letter::with_kinds")]
    pub dead_letter: Option<RawDeadLetter>,
    #[serde(default)]
    pub metrics: RawMetrics,
    #[serde(default)]
    pub shutdown: RawShutdown,
    #[serde(default)]
    pub consumer_opt: RawNsqOpts,
    #[serde(default)]
    pub producer_opt: RawNsqOpts,
    /// Which keys flags set (not part of the file).
    #[serde(skip)]
    pub(crate) flags: FlagOrigins,
}

/// Everything `run` needs, checked.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The consumer's configuration.
    pub source: ConsumerConfig,
    /// How the `nsq` sink and the `nsq` dead-letter talk to nsqd.
    pub producer: crate::nsq::Transport,
    /// How bodies are keyed.
    pub keyer: Keyer,
    /// The pipeline's decisions.
    pub policy: Policy,
    /// The store.
    pub store: StoreSettings,
    /// Where the in-process table is kept between runs, if anywhere.
    pub table_file: Option<TableFileSettings>,
    /// How the in-process table sizes itself, when it does (`store.probability` without
    /// `store.rate` or a size); `store` is then its first generation.
    pub(crate) growth: Option<crate::sizing::growth::Growth>,
    /// The catch probability the table should keep, `store.probability`, if given; else the
    /// sidecar expects the default target and says it is the default. Below it, the sidecar
    /// warns and suggests a size.
    pub target_probability: Option<f64>,
    /// The near-table in front of a shared store, if any (on by default).
    pub near_table: Option<crate::Geometry>,
    /// Done entries older than this count as not seen, if set.
    pub max_age: Option<Duration>,
    /// The window the catch probability is reported for.
    pub window: Duration,
    /// The sink.
    pub sink: SinkSettings,
    /// The dead-letter, if any.
    pub dead_letter: Option<DeadLetterSettings>,
    /// Where metrics are served, if anywhere.
    pub metrics_address: Option<SocketAddr>,
    /// How often the one-line status is logged.
    pub status_interval: Duration,
    /// How long in-flight handlers may finish at shutdown.
    pub grace: Duration,
    /// Which flags gave which settings, to name them as the user gave them.
    pub(crate) names: FlagOrigins,
}

impl RawConfig {
    /// Parses TOML text; `origin` names it in errors.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Parse`] naming the key, line and value.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|error| ConfigError::Parse {
            path: origin.to_owned(),
            message: toml_error::describe(text, &error),
        })
    }

    /// Reads and parses a file.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Read`] or [`ConfigError::Parse`].
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut raw = Self::from_toml(&text, &path.display().to_string())?;
        raw.flags.with_file();
        Ok(raw)
    }

    /// Checks every value and builds [`Settings`].
    ///
    /// # Errors
    ///
    /// The first problem found, naming its key; shown in the user's words
    /// ([`FlagOrigins::show`] of the flags that gave the settings), its flag when a flag set
    /// it.
    pub fn validate(&self) -> Result<Settings, ConfigError> {
        self.validate_sections()
    }

    /// Checks the store's settings alone (`[store]` and its flags, the lease from
    /// `source.msg_timeout`, `max_age` from `dedupe.max_age`) as [`RawConfig::validate`]
    /// checks them: for a command that opens
    /// the store and nothing else (`nsq-dedupe resize`).
    ///
    /// # Errors
    ///
    /// The first problem found, as [`RawConfig::validate`] names it.
    pub fn validate_store(&self) -> Result<StoreSettings, ConfigError> {
        let msg_timeout = self
            .source
            .msg_timeout
            .map_or(source::DEFAULT_MSG_TIMEOUT, |d| d.0);
        let max_age = self.dedupe.max_age_duration()?;
        let (mut store, _, _) = self.store.validate(msg_timeout, max_age.is_some())?;
        match &mut store {
            StoreSettings::Memcached(config, _) => config.max_age = max_age,
            StoreSettings::Redis(config, _) => config.max_age = max_age,
            StoreSettings::Memory(_) | StoreSettings::None => {}
        }
        let channel = self.source.channel_or_default();
        let stream = self.source.topic.as_deref().map(|topic| (topic, channel));
        self.name_table(&mut store, stream, self.dedupe.digest_algorithm()?);
        Ok(store)
    }

    /// Whether a shared store's table is named: by `store.namespace`, or by `source.topic`
    /// (a consumer's default namespace is its stream's, see [`RawConfig::name_table`]).
    #[cfg(feature = "cli")]
    pub(crate) fn names_its_table(&self) -> bool {
        self.store.namespace.is_some() || self.source.topic.is_some()
    }

    /// Gives a shared store the namespace of its consumers' table: the one given, else the
    /// stores' default followed by the topic and channel of `stream` (streams that share a
    /// store never share a table unless told to: another topic's or channel's messages would
    /// be taken for copies and dropped); then, for a keyed digest, its key's fingerprint
    /// (consumers with different keys must never read each other's sets: their digests of
    /// one body differ, so a shared set would only hold noise for the other).
    fn name_table(
        &self,
        store: &mut StoreSettings,
        stream: Option<(&str, &str)>,
        digest: DigestAlgorithm,
    ) {
        let namespace = match store {
            StoreSettings::Memcached(config, _) => &mut config.namespace,
            StoreSettings::Redis(config, _) => &mut config.namespace,
            StoreSettings::Memory(_) | StoreSettings::None => return,
        };
        if let (None, Some((topic, channel))) = (&self.store.namespace, stream) {
            *namespace = format!("{namespace}.{topic}.{channel}");
        }
        if let DigestAlgorithm::Blake3Keyed(key) = digest {
            *namespace = format!("{namespace}.k{}", key.fingerprint());
        }
    }

    fn validate_sections(&self) -> Result<Settings, ConfigError> {
        unused::check(self)?;
        let mut source = self.source.validate().map_err(|error| {
            // Every missing setting at once, the sink's too, not one per attempt.
            let mut missing = match error {
                ConfigError::Missing { .. } => vec![error],
                ConfigError::MissingAll(all) => all,
                other => return other,
            };
            match self.sink.validate("topic", "channel") {
                Err(sink @ ConfigError::Missing { .. }) => missing.push(sink),
                Err(ConfigError::MissingAll(sink)) => missing.extend(sink),
                _ => {}
            }
            ConfigError::all_missing(missing)
        })?;
        let (transport, identity) = self.consumer_opt.validate(nsq_opts::Side::Consumer)?;
        source.apply(transport, identity)?;
        let (producer, _) = self.producer_opt.validate(nsq_opts::Side::Producer)?;
        let (keyer, policy) = self.dedupe.validate(&source)?;
        let max_age = self.dedupe.max_age_duration()?;
        let (mut store, window, growth) =
            self.store.validate(source.msg_timeout, max_age.is_some())?;
        let table_file = self.store.table_file_settings()?;
        let near_table = self.store.near_table_geometry(match &store {
            StoreSettings::Memcached(_, geometry)
            | StoreSettings::Redis(_, geometry)
            | StoreSettings::Memory(geometry) => *geometry,
            StoreSettings::None => Geometry::new(Geometry::DEFAULT_SLOTS, 8)
                .expect("the default size is valid for every supported way count"),
        })?;
        self.store
            .check_fits(&store, near_table, max_age.is_some())?;
        if let StoreSettings::Memcached(config, _) = &mut store {
            config.max_age = max_age;
        }
        if let StoreSettings::Redis(config, _) = &mut store {
            config.max_age = max_age;
        }
        let stream = (
            source.consumer.topic.as_str(),
            source.consumer.channel.as_str(),
        );
        self.name_table(&mut store, Some(stream), keyer.algorithm());
        let sink = self
            .sink
            .validate(&source.consumer.topic, &source.consumer.channel)?;
        let dead_letter =
            dead_letter::validate_dead_letter(self.dead_letter.as_ref(), &self.source)?;
        let service = service::validate(&self.metrics, &self.shutdown)?;
        Ok(Settings {
            source: source.consumer,
            producer,
            keyer,
            policy,
            store,
            table_file,
            growth,
            target_probability: self.store.probability,
            near_table,
            max_age,
            window,
            sink,
            dead_letter,
            metrics_address: service.metrics_address,
            status_interval: service.status_interval,
            grace: service.grace,
            names: self.flags.clone(),
        })
    }
}

impl Settings {
    /// Parses and validates TOML text (with no flags): convenient for tests and embedding.
    ///
    /// # Errors
    ///
    /// As [`RawConfig::from_toml`] and [`RawConfig::validate`].
    pub fn from_toml(text: &str) -> Result<Settings, ConfigError> {
        RawConfig::from_toml(text, "<string>")?.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Settings::from_toml(text).unwrap_err().to_string()
    }

    #[test]
    fn minimal_config_gets_the_defaults() {
        let s = Settings::from_toml(
            "[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"127.0.0.1:4150\"]\n",
        )
        .unwrap();
        assert_eq!(s.source.channel, "nsq-dedupe");
        assert_eq!(s.source.max_in_flight, 200);
        assert_eq!(s.source.max_attempts, 0);
        assert_eq!(s.policy.max_attempts, 5);
        assert_eq!(
            s.store,
            StoreSettings::Memory(crate::Geometry::new(crate::Geometry::DEFAULT_SLOTS, 8).unwrap())
        );
        assert_eq!(s.sink, SinkSettings::Stdout);
        assert_eq!(s.metrics_address, Some("127.0.0.1:9150".parse().unwrap()));
    }

    #[test]
    fn errors_name_the_key_and_value() {
        assert!(err("[store]\nbukets = 5\n").contains("unknown field `bukets`"));
        assert_eq!(
            err("[source]\nnsqd_tcp_addresses = [\"a:1\"]\n"),
            "`source.topic` is required: set it in the config file or with `Settings::builder()`"
        );
        let e = err(
            "[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"a:1\"]\nmsg_timeout = \"soon\"\n",
        );
        assert!(e.contains("msg_timeout") && e.contains("soon"), "{e}");
        let e = err("[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"a:1\"]\n[store]\nways = 3\n");
        assert_eq!(e, "invalid `store.ways` = 3: expected 1, 2, 4 or 8");
    }

    #[test]
    fn a_shared_tables_namespace_is_the_streams_unless_one_is_given() {
        let shared = |store: &str| {
            let text = format!(
                "[source]\ntopic = \"orders\"\nchannel = \"billing\"\n\
                 nsqd_tcp_addresses = [\"a:1\"]\n[store]\nkind = \"redis\"\n\
                 redis_urls = [\"redis://127.0.0.1:6379\"]\n{store}"
            );
            match Settings::from_toml(&text).unwrap().store {
                StoreSettings::Redis(config, _) => config.namespace,
                other => panic!("redis, not {other:?}"),
            }
        };
        assert_eq!(shared(""), "nsq-dedupe.orders.billing");
        assert_eq!(shared("namespace = \"events\"\n"), "events");
    }

    #[test]
    fn a_digest_key_puts_its_fingerprint_in_the_memcached_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, [5u8; 32]).unwrap();
        let text = format!(
            "[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"a:1\"]\n[dedupe]\n\
             digest_key_file = {:?}\n[store]\nkind = \"memcached\"\nmemcached_addresses = \
             [\"127.0.0.1:11211\"]\n",
            path.display().to_string()
        );
        let settings = Settings::from_toml(&text).unwrap();
        let key = crate::DigestKey::from_file_contents(&[5u8; 32]).unwrap();
        assert_eq!(
            settings.keyer.algorithm(),
            DigestAlgorithm::Blake3Keyed(key)
        );
        let StoreSettings::Memcached(config, _) = settings.store else {
            panic!("memcached")
        };
        // After the stream's topic and channel, the default's.
        assert_eq!(
            config.namespace,
            format!("nsq-dedupe.t.nsq-dedupe.k{}", key.fingerprint())
        );
        let e = err("[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"a:1\"]\n[dedupe]\ndigest = \"blake3\"\n");
        assert_eq!(
            e,
            "`dedupe.digest_key_file` is required: set it in the config file or with \
             `Settings::builder()`"
        );
    }

    #[test]
    fn probability_sizing_picks_the_buckets() {
        let s = Settings::from_toml(
            "[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"a:1\"]\n[store]\nprobability = 0.9\nrate = 1000\nwindow = \"1h\"\nways = 8\n",
        )
        .unwrap();
        let StoreSettings::Memory(g) = s.store else {
            panic!()
        };
        assert_eq!(g.slots(), 6_185_416);
    }

    #[test]
    fn probability_without_a_rate_makes_the_table_size_itself() {
        let s = Settings::from_toml(
            "[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"a:1\"]\n[store]\nprobability = 0.99\nwindow = \"30s\"\nmax_memory = \"16MiB\"\n[dedupe]\nmax_age = \"1m\"\n",
        )
        .unwrap();
        let growth = s.growth.expect("the table sizes itself");
        assert_eq!(
            (growth.probability, growth.window, growth.max_bytes),
            (0.99, Duration::from_secs(30), 16 << 20)
        );
        // A time beside each slot with max_age.
        assert_eq!(growth.slot_bytes, 16);
        let StoreSettings::Memory(first) = s.store else {
            panic!("{:?}", s.store)
        };
        assert_eq!(first, growth.initial(8).unwrap());
        // With a rate, the size is fixed.
        let fixed = Settings::from_toml(
            "[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"a:1\"]\n[store]\nprobability = 0.99\nrate = 10\nwindow = \"30s\"\n",
        )
        .unwrap();
        assert_eq!(fixed.growth, None);
    }

    #[test]
    fn a_shared_store_gets_a_near_table_unless_it_is_off() {
        let memcached = "[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"a:1\"]\n[store]\nkind = \"memcached\"\n";
        let near = |extra: &str| {
            Settings::from_toml(&format!("{memcached}{extra}"))
                .unwrap()
                .near_table
        };
        // The default table's quarter: 2,097,152 slots, 16 MiB.
        assert_eq!(near(""), Some(crate::Geometry::new(1 << 21, 8).unwrap()));
        assert_eq!(near("near_table = \"off\"\n"), None);
        assert_eq!(
            near("near_table = \"1MiB\"\n"),
            Some(crate::Geometry::new(1 << 17, 8).unwrap())
        );
        // Bounded: a small table's near-table is 1 MiB, a large one's 64 MiB.
        assert_eq!(
            near("buckets = 1000\n").map(|g| g.memory_bytes()),
            Some(1 << 20)
        );
        assert_eq!(
            near("buckets = 4000000000\n").map(|g| g.memory_bytes()),
            Some(64 << 20)
        );
        // The in-process table has none, and says so when one is asked for.
        let memory = "[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"a:1\"]\n";
        assert_eq!(Settings::from_toml(memory).unwrap().near_table, None);
        assert_eq!(
            err(&format!("{memory}[store]\nnear_table = \"1MiB\"\n")),
            "`store.near_table` is used only with a shared table, `store.kind = \"memcached\"` \
             or `store.kind = \"redis\"`: remove it, or set that too"
        );
    }
}
