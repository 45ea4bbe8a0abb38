//! [`SettingsBuilder`]: the sidecar's settings built in code, section by section, with the
//! same checks as a config file's, for programs that embed the sidecar.

use super::{
    ConfigError, RawConfig, RawDeadLetter, RawDedupe, RawMetrics, RawNsqOpts, RawShutdown, RawSink,
    RawSource, RawStore, Settings,
};

/// Builds [`Settings`] without writing TOML: each section is its raw form, whose generated
/// methods, one per key, set it; [`build`](SettingsBuilder::build) checks every value
/// as [`Settings::from_toml`] does. A key left unset takes its default.
///
/// # Example
///
/// ```
/// use std::time::Duration;
///
/// let settings = nsq_dedupe::Settings::builder()
///     .source(|source| {
///         source
///             .nsqd_tcp_addresses(vec!["127.0.0.1:4150".into()])
///             .topic("events")
///     })
///     .dedupe(|dedupe| dedupe.key("json:/id"))
///     .store(|store| {
///         store
///             .probability(0.99)
///             .rate(100.0)
///             .window(Duration::from_secs(600))
///     })
///     .build()
///     .unwrap();
/// assert_eq!(settings.source.topic, "events");
/// ```
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct SettingsBuilder {
    raw: RawConfig,
}

impl Settings {
    /// A builder of settings in code; see [`SettingsBuilder`].
    pub fn builder() -> SettingsBuilder {
        SettingsBuilder::default()
    }
}

impl SettingsBuilder {
    /// Sets `[source]`: what to consume.
    pub fn source(mut self, set: impl FnOnce(RawSource) -> RawSource) -> Self {
        self.raw.source = set(std::mem::take(&mut self.raw.source));
        self
    }

    /// Sets `[dedupe]`: how bodies are keyed and what happens to each outcome.
    pub fn dedupe(mut self, set: impl FnOnce(RawDedupe) -> RawDedupe) -> Self {
        self.raw.dedupe = set(std::mem::take(&mut self.raw.dedupe));
        self
    }

    /// Sets `[store]`: where the table lives and how large it is.
    pub fn store(mut self, set: impl FnOnce(RawStore) -> RawStore) -> Self {
        self.raw.store = set(std::mem::take(&mut self.raw.store));
        self
    }

    /// Sets `[sink]`: where unique messages go (`nsq-dedupe run`'s sidecar; a program with its
    /// own handler has none).
    pub fn sink(mut self, set: impl FnOnce(RawSink) -> RawSink) -> Self {
        self.raw.sink = set(std::mem::take(&mut self.raw.sink));
        self
    }

    /// Sets `[metrics]`: where metrics are served and how often the status is logged.
    pub fn metrics(mut self, set: impl FnOnce(RawMetrics) -> RawMetrics) -> Self {
        self.raw.metrics = set(std::mem::take(&mut self.raw.metrics));
        self
    }

    /// Sets `[shutdown]`: how long in-flight handlers may finish.
    pub fn shutdown(mut self, set: impl FnOnce(RawShutdown) -> RawShutdown) -> Self {
        self.raw.shutdown = set(std::mem::take(&mut self.raw.shutdown));
        self
    }

    /// Sets `[dead_letter]`: where undeliverable messages go.
    pub fn dead_letter(mut self, dead_letter: RawDeadLetter) -> Self {
        self.raw.dead_letter = Some(dead_letter);
        self
    }

    /// Sets `[consumer_opt]`: go-nsq's options of the consumer.
    pub fn consumer_opt(mut self, options: RawNsqOpts) -> Self {
        self.raw.consumer_opt = options;
        self
    }

    /// Sets `[producer_opt]`: go-nsq's options of the nsq sink and the nsq dead-letter.
    pub fn producer_opt(mut self, options: RawNsqOpts) -> Self {
        self.raw.producer_opt = options;
        self
    }

    /// Checks every value and builds the settings.
    ///
    /// # Errors
    ///
    /// As [`RawConfig::validate`]: the first problem, naming its config key.
    pub fn build(&self) -> Result<Settings, ConfigError> {
        self.raw.validate()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::{SinkKind, SinkSettings};
    use crate::Settings;

    #[test]
    fn a_built_config_is_the_one_its_toml_gives() {
        let built = Settings::builder()
            .source(|source| {
                source
                    .nsqd_tcp_addresses(vec!["127.0.0.1:4150".into()])
                    .topic("events")
                    .msg_timeout(Duration::from_secs(30))
            })
            .dedupe(|dedupe| dedupe.key("json:/id"))
            .store(|store| {
                store
                    .probability(0.99)
                    .rate(100.0)
                    .window(Duration::from_secs(600))
            })
            .sink(|sink| {
                sink.kind(SinkKind::Http)
                    .post(vec!["http://127.0.0.1:8080/in".to_owned()])
            })
            .metrics(|metrics| metrics.address("off"))
            .build()
            .unwrap();
        let toml = Settings::from_toml(
            "[source]\nnsqd_tcp_addresses = [\"127.0.0.1:4150\"]\ntopic = \"events\"\n\
             msg_timeout = \"30s\"\n[dedupe]\nkey = \"json:/id\"\n[store]\nprobability = 0.99\n\
             rate = 100\nwindow = \"10m\"\n[sink]\nkind = \"http\"\n\
             post = \"http://127.0.0.1:8080/in\"\n[metrics]\naddress = \"off\"\n",
        )
        .unwrap();
        assert_eq!(format!("{built:?}"), format!("{toml:?}"));
        assert!(matches!(built.sink, SinkSettings::Http(_)));
    }

    #[test]
    fn a_built_config_is_checked_as_a_file_is() {
        let error = Settings::builder()
            .source(|source| source.nsqd_tcp_addresses(vec!["127.0.0.1:4150".into()]))
            .build()
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "`source.topic` is required: set it in the config file or with `Settings::builder()`"
        );
        let error = Settings::builder()
            .source(|source| {
                source
                    .nsqd_tcp_addresses(vec!["127.0.0.1:4150".into()])
                    .topic("t")
            })
            .store(|store| store.ways(3_u32))
            .build()
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid `store.ways` = 3: expected 1, 2, 4 or 8"
        );
    }
}
