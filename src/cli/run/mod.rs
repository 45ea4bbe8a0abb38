//! Flags of `nsq-dedupe run`: `--config`, and a group of flags per config section, laid over
//! the file's [`RawConfig`] so that a flag given wins over the file's key.
//!
//! Each group is made from its section's table of settings (`crate::config::setting`) by
//! `section`; `nsq_opts` adds `--consumer-opt` and `--producer-opt KEY,VALUE`. Laying a group
//! records which key each flag set, and whether it came from the environment or an alias, so
//! that errors name what the user typed.

mod nsq_opts;
mod section;

use std::path::PathBuf;

use crate::config::{
    FlagOrigins, RawConfig, RawDeadLetter, RawDedupe, RawMetrics, RawShutdown, RawSink, RawSource,
    RawStore,
};
use clap::Args;
use section::SectionFlags;

use crate::cli::{FromEnv, TypedAliases};

/// Flags of `nsq-dedupe run`. Each overrides the config file's key of the same name.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// TOML config file (see config/ for examples).
    #[arg(long, short = 'c', value_name = "FILE", env = "NSQ_DEDUPE_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) source: SectionFlags<RawSource>,
    #[command(flatten)]
    pub(crate) nsq: nsq_opts::NsqOptFlags,
    #[command(flatten)]
    pub(crate) dedupe: SectionFlags<RawDedupe>,
    #[command(flatten)]
    pub(crate) store: SectionFlags<RawStore>,
    #[command(flatten)]
    pub(crate) sink: SectionFlags<RawSink>,
    #[command(flatten)]
    pub(crate) metrics: SectionFlags<RawMetrics>,
    #[command(flatten)]
    pub(crate) shutdown: SectionFlags<RawShutdown>,
    #[command(flatten)]
    pub(crate) dead_letter: SectionFlags<RawDeadLetter>,
}

impl RunArgs {
    /// Lays the flags over the file's settings: a flag that was given wins. `from_env` tells
    /// which flags took their value from the environment, so that errors name the variable,
    /// and `aliases` which were typed by an alias, so that errors name the alias.
    pub(crate) fn apply(&self, raw: &mut RawConfig, from_env: &FromEnv, aliases: &TypedAliases) {
        let mut flags = std::mem::take(&mut raw.flags);
        let mut recorder = FlagRecorder {
            flags: &mut flags,
            from_env,
            aliases,
        };
        self.source.apply(&mut raw.source, &mut recorder);
        self.nsq.apply(raw, &mut recorder);
        self.dedupe.apply(&mut raw.dedupe, &mut recorder);
        apply_store(&self.store, &mut raw.store, &mut recorder);
        self.sink.apply(&mut raw.sink, &mut recorder);
        self.metrics.apply(&mut raw.metrics, &mut recorder);
        self.shutdown.apply(&mut raw.shutdown, &mut recorder);
        self.dead_letter
            .apply_optional(&mut raw.dead_letter, &mut recorder);
        raw.flags = flags;
    }
}

/// Lays the store's flags over the file's `[store]`, and the Redis password from the
/// environment: the password itself is never a flag (a command line is visible to every user
/// of the machine).
fn apply_store(
    flags: &SectionFlags<RawStore>,
    store: &mut RawStore,
    recorder: &mut FlagRecorder<'_>,
) {
    flags.apply(store, recorder);
    if let Ok(password) = std::env::var(crate::RedisConfig::PASSWORD_ENV) {
        if !password.is_empty() {
            store.redis_password = Some(crate::RedisPassword::new(password));
        }
    }
}

/// Flags of `nsq-dedupe resize`: `run`'s store flags, with the table's new size.
#[derive(Debug, Args)]
pub(crate) struct ResizeArgs {
    /// The sidecars' TOML config file: its `[store]` section names the store, and its
    /// `store.namespace` (else its `[source]` topic and channel, and its digest key) the table.
    #[arg(long, short = 'c', value_name = "FILE", env = "NSQ_DEDUPE_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) store: SectionFlags<RawStore>,
    /// Resize even while the table's previous size is still read: the copies of messages
    /// remembered only in that table then pass as new (nothing is lost).
    #[arg(long)]
    pub(crate) force: bool,
    /// Start the table where the namespace has none (no descriptor), before the fleet starts;
    /// without it, such a namespace is refused, as a namespace mistyped would be.
    #[arg(long)]
    pub(crate) create: bool,
}

impl ResizeArgs {
    /// Lays the store's flags over the file's, as [`RunArgs::apply`] does.
    pub(crate) fn apply(&self, raw: &mut RawConfig, from_env: &FromEnv, aliases: &TypedAliases) {
        let mut flags = std::mem::take(&mut raw.flags);
        let mut recorder = FlagRecorder {
            flags: &mut flags,
            from_env,
            aliases,
        };
        apply_store(&self.store, &mut raw.store, &mut recorder);
        raw.flags = flags;
    }
}

/// Records which flag set which config key, and for a flag whose value came from the
/// environment, its variable; for one typed by an alias, the alias.
pub(super) struct FlagRecorder<'a> {
    flags: &'a mut FlagOrigins,
    from_env: &'a FromEnv,
    aliases: &'a TypedAliases,
}

impl FlagRecorder<'_> {
    /// Records that `flag` sets `key` by a merge of its own, and whether it was given. `flag`
    /// may name an option of a repeatable flag, `--consumer-opt deflate_level`: from the
    /// environment, that is `NSQ_DEDUPE_CONSUMER_OPT=deflate_level`.
    pub(super) fn record(&mut self, key: &'static str, flag: &'static str, given: bool) {
        self.flags.record(key, flag, given);
        if !given {
            return;
        }
        let (base, option) = flag.split_once(' ').unwrap_or((flag, ""));
        // Leaked as the flag's own name is: one short string per option given.
        let with_option = |name: &'static str, separator: char| -> &'static str {
            if option.is_empty() {
                name
            } else {
                Box::leak(format!("{name}{separator}{option}").into_boxed_str())
            }
        };
        if let Some(alias) = self.aliases.typed(base) {
            self.flags.record_alias(key, with_option(alias, ' '));
        }
        if let Some(variable) = self.from_env.variable(base) {
            self.flags.record_variable(key, with_option(variable, '='));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::{DeadLetterSettings, RawConfig, StoreSettings};
    use crate::pipeline::{InFlightPolicy, StoreErrorPolicy};
    use clap::Parser as _;

    use crate::cli::{Cli, Command};

    fn settings(flags: &[&str]) -> crate::Settings {
        settings_over(RawConfig::default(), flags)
    }

    /// The file-less config of `run` with `flags`, not yet validated.
    fn applied(flags: &[&str]) -> RawConfig {
        applied_over(RawConfig::default(), flags)
    }

    /// `flags` of `run` (with a topic and an nsqd) laid over the config file `file`.
    fn applied_over(mut file: RawConfig, flags: &[&str]) -> RawConfig {
        let args = [
            "nsq-dedupe",
            "run",
            "--topic",
            "t",
            "--nsqd-tcp-address",
            "127.0.0.1:4150",
        ];
        let cli = Cli::try_parse_from(args.iter().chain(flags)).unwrap();
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        run.apply(
            &mut file,
            &crate::cli::FromEnv::default(),
            &crate::cli::TypedAliases::default(),
        );
        file
    }

    #[test]
    fn a_number_above_tomls_largest_is_quoted_as_typed() {
        let raw = applied(&["--buckets", "18446744073709551615"]);
        assert_eq!(raw.store.buckets, Some(u64::MAX));
        assert!(raw
            .flags
            .show(raw.validate().unwrap_err())
            .to_string()
            .starts_with("invalid `--buckets` = 18446744073709551615: "));
    }

    /// The settings of `run` with `flags` laid over the config file `file`.
    fn settings_over(file: RawConfig, flags: &[&str]) -> crate::Settings {
        applied_over(file, flags).validate().unwrap()
    }

    #[test]
    fn memory_sizes_the_table_and_wins_over_the_files_size() {
        let StoreSettings::Memory(geometry) = settings(&["--memory", "2MiB", "--ways", "4"]).store
        else {
            panic!("not the in-process table")
        };
        assert_eq!((geometry.slots(), geometry.ways()), (262_144, 4));
        let file = RawConfig::from_toml("[store]\nbuckets = 1000\n", "test").unwrap();
        let StoreSettings::Memory(geometry) = settings_over(file, &["--memory", "1MiB"]).store
        else {
            panic!("not the in-process table")
        };
        assert_eq!(geometry.slots(), 131_072);
    }

    #[test]
    fn probability_sizing_takes_the_default_window_of_an_hour() {
        let StoreSettings::Memory(geometry) =
            settings(&["--probability", "0.9", "--rate", "1000"]).store
        else {
            panic!("not the in-process table")
        };
        assert_eq!(geometry.slots(), 6_185_416, "as with `--window 1h`");
    }

    #[test]
    fn deploy_time_settings_have_flags() {
        let s = settings(&[
            "--probability",
            "0.9",
            "--rate",
            "1000",
            "--window",
            "1h",
            "--max-attempts",
            "9",
            "--backoff",
            "2s",
            "--max-backoff",
            "1m",
            "--heartbeat-interval",
            "10s",
            "--on-in-flight",
            "finish",
            "--on-store-error",
            "process",
            "--digest",
            "md5",
            "--shutdown-grace",
            "3s",
            "--status-interval",
            "1m",
            "--dead-letter-file",
            "/var/lib/dead.ndjson",
        ]);
        let StoreSettings::Memory(geometry) = s.store else {
            panic!("{:?}", s.store)
        };
        assert_eq!(
            geometry.slots(),
            6_185_416,
            "sized from probability, rate and window"
        );
        assert_eq!(s.policy.max_attempts, 9);
        assert_eq!(s.policy.backoff, Duration::from_secs(2));
        assert_eq!(s.policy.max_backoff, Duration::from_secs(60));
        assert_eq!(s.source.heartbeat_interval, Duration::from_secs(10));
        assert_eq!(s.policy.on_in_flight, InFlightPolicy::Finish);
        assert_eq!(s.policy.on_store_error, StoreErrorPolicy::Process);
        assert_eq!(s.keyer.algorithm().to_string(), "md5");
        assert_eq!(s.grace, Duration::from_secs(3));
        assert_eq!(s.status_interval, Duration::from_secs(60));
        assert_eq!(
            s.dead_letter,
            Some(DeadLetterSettings::File("/var/lib/dead.ndjson".into()))
        );
        let s = settings(&[
            "--dead-letter-topic",
            "events.dead",
            "--store",
            "memcached",
            "--namespace",
            "orders",
            "--lease",
            "90s",
            "--store-timeout",
            "1s",
        ]);
        assert!(
            matches!(s.dead_letter, Some(DeadLetterSettings::Nsq { ref topic, .. }) if topic == "events.dead")
        );
        let StoreSettings::Memcached(config, _) = s.store else {
            panic!("{:?}", s.store)
        };
        assert_eq!(
            (config.namespace.as_str(), config.lease, config.timeout),
            ("orders", Duration::from_secs(90), Duration::from_secs(1))
        );
    }

    #[test]
    fn a_dead_letter_flag_replaces_the_files_dead_letter_and_an_address_alone_asks_for_a_topic() {
        let nsq = "[dead_letter]\nkind = \"nsq\"\ntopic = \"x\"\nnsqd_tcp_addresses = [\"127.0.0.1:2\"]\n";
        let file = || RawConfig::from_toml(nsq, "test").unwrap();
        assert_eq!(
            settings_over(file(), &["--dead-letter-file", "/var/lib/dead.ndjson"]).dead_letter,
            Some(DeadLetterSettings::File("/var/lib/dead.ndjson".into()))
        );
        assert_eq!(
            settings_over(file(), &["--dead-letter-topic", "d"]).dead_letter,
            Some(DeadLetterSettings::Nsq {
                nsqd_tcp_addresses: vec!["127.0.0.1:4150".into()],
                topic: "d".into()
            }),
            "the file's addresses go with the file's dead-letter"
        );
        assert_eq!(
            settings_over(file(), &["--dead-letter-nsqd-tcp-address", "127.0.0.1:5"]).dead_letter,
            Some(DeadLetterSettings::Nsq {
                nsqd_tcp_addresses: vec!["127.0.0.1:5".into()],
                topic: "x".into()
            }),
            "an address adds to the file's dead-letter"
        );
        let in_file = "[dead_letter]\nkind = \"file\"\npath = \"/var/lib/p\"\n";
        let file = RawConfig::from_toml(in_file, "test").unwrap();
        assert_eq!(
            settings_over(
                file,
                &[
                    "--dead-letter-topic",
                    "d",
                    "--dead-letter-nsqd-tcp-address",
                    "127.0.0.1:5,127.0.0.1:6"
                ]
            )
            .dead_letter,
            Some(DeadLetterSettings::Nsq {
                nsqd_tcp_addresses: vec!["127.0.0.1:5".into(), "127.0.0.1:6".into()],
                topic: "d".into()
            })
        );
        let raw = applied(&["--dead-letter-nsqd-tcp-address", "127.0.0.1:5"]);
        let error = raw.flags.show(raw.validate().unwrap_err()).to_string();
        assert_eq!(
            error,
            "`dead_letter.topic` is required with `dead_letter.kind = \"nsq\"`: set it in the \
             config file or pass `--dead-letter-topic`"
        );
        assert!(
            applied(&[]).dead_letter.is_none(),
            "no flag, no dead-letter"
        );
    }

    #[test]
    fn redis_flags_reach_the_store_and_the_password_stays_hidden() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("redis-password");
        std::fs::write(&file, "from-the-file\n").unwrap();
        let s = settings(&[
            "--store",
            "redis",
            "--redis-url",
            "redis://10.0.0.1:7000",
            "--redis-url",
            "redis://10.0.0.2:7000",
            "--redis-cluster",
            "--redis-password-file",
            file.to_str().unwrap(),
            "--namespace",
            "orders",
        ]);
        let StoreSettings::Redis(config, _) = s.store else {
            panic!("{:?}", s.store)
        };
        assert!(config.cluster);
        assert_eq!(
            config.urls,
            ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]
        );
        assert_eq!(config.namespace, "orders");
        assert_eq!(
            config.password,
            Some(crate::RedisPassword::new("from-the-file"))
        );
        assert!(!format!("{config:?}").contains("from-the-file"));

        // A password in the URL leaves it; a bad URL is named without it.
        let s = settings(&["--store", "redis", "--redis-url", "redis://:in-url@h:1/2"]);
        let StoreSettings::Redis(config, _) = s.store else {
            panic!("{:?}", s.store)
        };
        assert_eq!(config.urls, ["redis://h:1/2"]);
        assert_eq!(config.password, Some(crate::RedisPassword::new("in-url")));
        let bad = ["--store", "redis", "--redis-url", "http://user:hunter2@h:1"];
        let raw = applied(&bad);
        let error = raw.flags.show(raw.validate().unwrap_err()).to_string();
        assert!(
            error.contains("--redis-url") || error.contains("redis_urls"),
            "{error}"
        );
        assert!(
            error.contains("http://<redacted>@h:1") && !error.contains("hunter2"),
            "{error}"
        );
    }
}
