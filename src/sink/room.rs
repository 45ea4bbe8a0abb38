//! What a sink's room gives the sidecar, and how the one list of sinks (`sinks!`, in
//! `sink/mod.rs`) makes everything that names every sink from it.
//!
//! A sink's room is its module under `src/sink/`: the sink itself (its [`Handler`] and
//! `BuiltIn`), its keys of `[sink]` (a `sink_keys!` macro of the rows of the section's table,
//! as `section!` reads them), and its [`Room`]: those keys validated into its settings, its
//! summary in the start-up log and its build. The list names each sink once, in a line:
//!
//! ```text
//! /// POST to one or more URLs.
//! Http = "http", http::HttpSink(HttpSinkConfig);
//! ```
//!
//! its variant, its name in the file and on the command line, its room and sink type and the
//! type of its settings (none for a sink without settings); `pub` before the room makes its
//! module public. From the lines, `sinks!` makes the rooms' `mod`s and the sink types'
//! re-exports, `SinkKind` (the names), the `Sink` enum with its `Handler` and `BuiltIn` (each call handed
//! to the sink's own), `SinkSettings` with its summary, the `[sink]` section `RawSink` (the
//! kind, then each room's keys, in the order of the list) with its validation, and
//! `build`. The first sink listed is the one used when `sink.kind` is not given.
//!
//! [`Handler`]: super::Handler

use std::fmt;
use std::future::Future;

use super::{BuildError, RawSink};
use crate::nsq::Transport;
use crate::setting::ConfigError;
use crate::wording::FlagOrigins;

/// A sink's room: its settings, from its keys of `[sink]`, and how it is built from them.
pub(crate) trait Room: Sized {
    /// The sink's validated settings, in its variant of `SinkSettings`; `()` for a sink
    /// without settings.
    type Settings;

    /// The settings from the room's keys of `raw`, for the consumed `topic` and `channel`.
    ///
    /// # Errors
    ///
    /// The first key that is wrong or missing, by its key.
    fn validate(raw: &RawSink, topic: &str, channel: &str) -> Result<Self::Settings, ConfigError>;

    /// The sink's line in the start-up log, never a secret.
    fn summary(settings: &Self::Settings, f: &mut fmt::Formatter<'_>) -> fmt::Result;

    /// The sink, built from its settings (the serve sink starts serving).
    fn build(
        settings: &Self::Settings,
        with: &Build<'_>,
    ) -> impl Future<Output = Result<Self, BuildError>> + Send;
}

/// What a sink's build may use besides its settings.
pub(crate) struct Build<'a> {
    /// How producers talk to nsqd (`[producer_opt]`): the nsq sink's.
    pub(crate) producer: &'a Transport,
    /// Which flags gave which settings, to name a setting in a warning as the user gave it.
    pub(crate) names: &'a FlagOrigins,
}

/// Makes everything that names every sink from the one list of them; see the module's docs.
macro_rules! sinks {
    ($(
        $(#[doc = $doc:literal])*
        $variant:ident = $name:literal, $vis:vis $room:ident :: $sink:ident $(($settings:ty))?;
    )*) => {
        $( $vis mod $room; pub use $room::$sink; )*

        /// Where unique messages go: the value of `sink.kind` and `--sink`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
        pub enum SinkKind {
            $( $(#[doc = $doc])* #[serde(rename = $name)] $variant, )*
        }

        impl SinkKind {
            /// Every kind with its name in the config file and on the command line.
            pub const NAMES: [(&'static str, SinkKind); [$($name),*].len()] =
                [$( ($name, SinkKind::$variant), )*];

            /// The kind's name in the config file and on the command line.
            pub fn name(self) -> &'static str {
                $crate::setting::name_of(&Self::NAMES, self)
            }
        }

        /// The first sink listed: the one used when `sink.kind` is not given.
        impl Default for SinkKind {
            fn default() -> Self {
                SinkKind::NAMES[0].1
            }
        }

        impl $crate::setting::Overlay for SinkKind {}

        /// The names of the sinks, as `--sink` lists them.
        const SINK_KINDS: [&str; [$($name),*].len()] = $crate::setting::names(&SinkKind::NAMES);

        /// The sidecar's sinks, chosen by `sink.kind`. An enum, so the hot path calls it
        /// without boxing; each call goes to the sink's own [`Handler`] (and, for what only the
        /// sidecar asks, its `BuiltIn`).
        #[derive(Debug)]
        pub enum Sink {
            $( $(#[doc = $doc])* $variant($room::$sink), )*
        }

        impl Handler for Sink {
            async fn handle(&self, body: Bytes) -> Result<(), HandlerError> {
                // Boxed: these futures are up to kilobytes, and an enum's future is as large
                // as its largest arm, which every message's task would carry. Next to a write
                // or a network round trip the allocation is free.
                match self { $( Sink::$variant(sink) => Box::pin(sink.handle(body)).await, )* }
            }

            async fn handle_batch(&self, bodies: Vec<Bytes>) -> Vec<Result<(), HandlerError>> {
                match self { $( Sink::$variant(sink) => sink.handle_batch(bodies).await, )* }
            }

            /// Boxed, one stream per burst: each sink's stream is of its own type.
            fn handle_in_parts(
                &self,
                deliveries: Vec<Delivery>,
            ) -> impl Stream<Item = Part> + Send {
                match self {
                    $( Sink::$variant(sink) => sink.handle_in_parts(deliveries).boxed(), )*
                }
            }

            fn handles_batches(&self) -> bool {
                match self { $( Sink::$variant(sink) => sink.handles_batches(), )* }
            }

            fn accepts_for_good(&self) -> bool {
                match self { $( Sink::$variant(sink) => sink.accepts_for_good(), )* }
            }

            fn backs_off(&self) -> bool {
                match self { $( Sink::$variant(sink) => sink.backs_off(), )* }
            }

            fn stopping(&self) {
                match self { $( Sink::$variant(sink) => sink.stopping(), )* }
            }

            async fn flush(&self) -> Result<(), HandlerError> {
                match self { $( Sink::$variant(sink) => sink.flush().await, )* }
            }
        }

        impl BuiltIn for Sink {
            fn watch(&self) -> Watch {
                match self { $( Sink::$variant(sink) => sink.watch(), )* }
            }
        }

        /// The validated sink. `Debug` and `Display` never show a secret: URLs lose their
        /// user info and query values, headers their values (`crate::redact`), in each sink's
        /// settings.
        #[derive(Debug, Clone, PartialEq)]
        pub enum SinkSettings {
            $( $(#[doc = $doc])* $variant $(($settings))?, )*
        }

        /// One line a person reads, e.g. `http POST https://host/path (2 URLs, round-robin)`,
        /// `nsq PUB events.unique to 10.0.0.1:4150` or
        /// `file dir=/var/archive format=<TOPIC>.<HOST><REV>.<DATETIME>.log`; never a secret.
        impl std::fmt::Display for SinkSettings {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                match self {$(
                    $crate::sink::room::settings_of!(SinkSettings::$variant, settings $(, $settings)?) => {
                        <$room::$sink as Room>::summary(
                            $crate::sink::room::settings_or_none!(settings $(, $settings)?),
                            f,
                        )
                    }
                )*}
            }
        }

        impl RawSink {
            /// The sink's settings, its room's keys validated; `topic` and `channel` are the
            /// consumed ones.
            ///
            /// # Errors
            ///
            /// The first key of the sink that is wrong or missing.
            pub(crate) fn validate(
                &self,
                topic: &str,
                channel: &str,
            ) -> Result<SinkSettings, $crate::setting::ConfigError> {
                match self.kind.unwrap_or_default() {$(
                    SinkKind::$variant => {
                        let settings = <$room::$sink as Room>::validate(self, topic, channel)?;
                        Ok($crate::sink::room::with_settings!(
                            SinkSettings::$variant, settings $(, $settings)?
                        ))
                    }
                )*}
            }
        }

        /// Builds the sink the settings ask for; the serve sink starts serving (binds its
        /// ports).
        ///
        /// # Errors
        ///
        /// What the sink's build refused, by the kind of failure ([`BuildError`]).
        pub(crate) async fn build(
            settings: &SinkSettings,
            with: &Build<'_>,
        ) -> Result<Sink, BuildError> {
            Ok(match settings {$(
                $crate::sink::room::settings_of!(SinkSettings::$variant, settings $(, $settings)?) => {
                    Sink::$variant(
                        <$room::$sink as Room>::build(
                            $crate::sink::room::settings_or_none!(settings $(, $settings)?),
                            with,
                        )
                        .await?,
                    )
                }
            )*})
        }

        $crate::sink::room::sink_section! { [$($name $room)*] [] }
    };
}

/// The `[sink]` section: `sink.kind`, then each room's keys, gathered by handing the rows so
/// far to the next room's `sink_keys!`, which hands them back with its own.
macro_rules! sink_section {
    ([] [$($rows:tt)*]) => {
        $crate::setting::section! {
            /// `[sink]`. The http sink's flags are `nsq_to_http`'s, the file sink's
            /// `nsq_to_file`'s.
            pub struct RawSink in "sink", heading "Sink" {
                /// Where unique messages go.
                kind: SinkKind,
                    flag("sink", value_name: "SINK", value: $crate::setting::FlagValue::Names(&SINK_KINDS));
                $($rows)*
            }
        }
    };
    ([$name:literal $room:ident $($rest:tt)*] [$($rows:tt)*]) => {
        $room::sink_keys! { $name [$($rest)*] [$($rows)*] }
    };
}

/// A pattern of a `SinkSettings` variant, binding its settings, if it has any, to `$bound`.
macro_rules! settings_of {
    ($enum:ident :: $variant:ident, $bound:ident) => {
        $enum::$variant
    };
    ($enum:ident :: $variant:ident, $bound:ident, $settings:ty) => {
        $enum::$variant($bound)
    };
}

/// The settings bound by [`settings_of!`], or `&()` for a sink without settings.
macro_rules! settings_or_none {
    ($bound:ident) => {
        &()
    };
    ($bound:ident, $settings:ty) => {
        $bound
    };
}

/// The `SinkSettings` variant holding `$settings`, or the bare variant for a sink without
/// settings (whose settings are `()`).
macro_rules! with_settings {
    ($enum:ident :: $variant:ident, $value:ident) => {{
        let () = $value;
        $enum::$variant
    }};
    ($enum:ident :: $variant:ident, $value:ident, $settings:ty) => {
        $enum::$variant($value)
    };
}

/// The keys of a sink that has none but `sink.kind` (its `sink_keys!`): none.
macro_rules! no_sink_keys {
    ($kind:literal [$($rest:tt)*] [$($rows:tt)*]) => {
        $crate::sink::room::sink_section! { [$($rest)*] [$($rows)*] }
    };
}

/// The room of a sink without settings: its line `$summary` in the start-up log, and its
/// build, `$build`.
macro_rules! room_without_settings {
    ($sink:ty, $summary:literal, $build:expr) => {
        impl $crate::sink::room::Room for $sink {
            type Settings = ();

            fn validate(
                _raw: &$crate::sink::RawSink,
                _topic: &str,
                _channel: &str,
            ) -> Result<(), $crate::setting::ConfigError> {
                Ok(())
            }

            fn summary(_settings: &(), f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str($summary)
            }

            async fn build(
                _settings: &(),
                _with: &$crate::sink::room::Build<'_>,
            ) -> Result<Self, $crate::sink::BuildError> {
                Ok($build)
            }
        }
    };
}

pub(crate) use {
    no_sink_keys, room_without_settings, settings_of, settings_or_none, sink_section, sinks,
    with_settings,
};
