//! The serve sink's keys of `[sink]` (`sink.kind = "serve"`, the sidecar as an nsqd for NSQ
//! consumers) validated into its [`ServeConfig`], its start-up summary and its build. A
//! setting not given keeps the serve sink's own default ([`ServeConfig::new`]); the ranges are
//! the serve sink's rules ([`ServeConfig::validate`]), named here by the key the user typed.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;

use super::{ServeConfig, ServeError, ServeSecret, ServeSink, ServeTls, DEFAULT_HTTP_ADDRESS};
use crate::setting::{invalid, quote, resolve, ConfigError, Section as _};
use crate::sink::room::{Build, Room};
use crate::sink::{BuildError, RawSink};
use crate::wording::{FlagOrigins, Wording};

/// The serve sink's flags are listed under their own heading.
pub(crate) const SERVE_HEADING: &str = "Serve sink (as nsqd, for NSQ consumers)";

/// The serve sink's keys: the rows of `[sink]`'s table, for `sinks!`.
macro_rules! sink_keys {
    ($kind:literal [$($rest:tt)*] [$($rows:tt)*]) => {
        $crate::sink::room::sink_section! { [$($rest)*] [$($rows)*
            /// Where NSQ consumers connect, as to nsqd (default {default}).
            serve_tcp_address: String,
                default($crate::setting::DefaultValue::Text($crate::sink::serve::DEFAULT_TCP_ADDRESS)),
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("serve-tcp-address", heading: $crate::sink::serve::settings::SERVE_HEADING,
                     value_name: "ADDR");
            /// Where /ping, /lookup (as nsqlookupd) and /stats (as nsqd) answer, or off (default
            /// {default}).
            serve_http_address: String,
                default($crate::setting::DefaultValue::Text($crate::sink::serve::DEFAULT_HTTP_ADDRESS)),
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("serve-http-address", heading: $crate::sink::serve::settings::SERVE_HEADING,
                     value_name: "ADDR|off");
            /// A served message not answered within this goes back upstream; a consumer may ask
            /// for another in IDENTIFY (default {default}).
            serve_msg_timeout: $crate::setting::Dur,
                default($crate::setting::DefaultValue::Duration($crate::sink::serve::DEFAULT_MSG_TIMEOUT)),
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("serve-msg-timeout", heading: $crate::sink::serve::settings::SERVE_HEADING,
                     value_name: "DURATION", value: $crate::setting::FlagValue::Duration);
            /// The longest message timeout a consumer may ask for, and the longest a TOUCHed
            /// message stays out (default {default}).
            serve_max_msg_timeout: $crate::setting::Dur,
                default($crate::setting::DefaultValue::Duration($crate::sink::serve::DEFAULT_MAX_MSG_TIMEOUT)),
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("serve-max-msg-timeout", heading: $crate::sink::serve::settings::SERVE_HEADING,
                     value_name: "DURATION", value: $crate::setting::FlagValue::Duration);
            /// Heartbeats to a consumer that asks for none in IDENTIFY; one that misses two is
            /// closed (default {default}).
            serve_heartbeat_interval: $crate::setting::Dur,
                default($crate::setting::DefaultValue::Duration($crate::sink::serve::DEFAULT_HEARTBEAT_INTERVAL)),
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("serve-heartbeat-interval", heading: $crate::sink::serve::settings::SERVE_HEADING,
                     value_name: "DURATION", value: $crate::setting::FlagValue::Duration);
            /// The largest RDY a consumer may send (default {default}).
            serve_max_rdy_count: u32,
                default($crate::setting::DefaultValue::Number($crate::sink::serve::DEFAULT_MAX_RDY_COUNT as u64)),
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("serve-max-rdy-count", heading: $crate::sink::serve::settings::SERVE_HEADING,
                     value_name: "N", value: $crate::setting::FlagValue::InFlight);
            /// Consumers connected at once; more are closed at once (default {default}).
            serve_max_connections: usize,
                default($crate::setting::DefaultValue::Number($crate::sink::serve::DEFAULT_MAX_CONNECTIONS as u64)),
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("serve-max-connections", heading: $crate::sink::serve::settings::SERVE_HEADING,
                     value_name: "N", value: $crate::setting::FlagValue::Count);
            /// PEM certificate chain: TLS offered to consumers (IDENTIFY tls_v1); needs --serve-tls-key.
            serve_tls_cert: std::path::PathBuf, only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("serve-tls-cert", heading: $crate::sink::serve::settings::SERVE_HEADING,
                     value_name: "FILE", value: $crate::setting::FlagValue::Path);
            /// PEM private key of --serve-tls-cert.
            serve_tls_key: std::path::PathBuf, only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("serve-tls-key", heading: $crate::sink::serve::settings::SERVE_HEADING,
                     value_name: "FILE", value: $crate::setting::FlagValue::Path);
            /// Refuse every command but IDENTIFY before the TLS upgrade.
            serve_tls_required: bool, only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("serve-tls-required", heading: $crate::sink::serve::settings::SERVE_HEADING,
                     value: $crate::setting::FlagValue::Switch);
            /// File holding the secret consumers must send with AUTH before SUB.
            serve_auth_secret_file: std::path::PathBuf,
                only(&$crate::setting::Only::one("sink.kind", &[$kind])),
                flag("serve-auth-secret-file", heading: $crate::sink::serve::settings::SERVE_HEADING,
                     value_name: "FILE", value: $crate::setting::FlagValue::Path);
        ] }
    };
}

pub(crate) use sink_keys;

impl Room for ServeSink {
    type Settings = ServeConfig;

    fn validate(raw: &RawSink, topic: &str, channel: &str) -> Result<ServeConfig, ConfigError> {
        validate(raw, topic, channel)
    }

    fn summary(config: &ServeConfig, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        summary(config, f)
    }

    /// Warns of a port open beyond loopback without TLS or AUTH, then binds the ports.
    async fn build(config: &ServeConfig, with: &Build<'_>) -> Result<ServeSink, BuildError> {
        warn_if_exposed(config, with.names);
        ServeSink::start(config.clone())
            .await
            .map_err(BuildError::Serve)
    }
}

/// Warns when a served port is reachable beyond this machine while consumers need neither TLS
/// nor the AUTH secret: anyone who reaches it can take (and FIN) the stream. Not refused: a
/// private network may be all the protection wanted. The setting is named as the user gave it
/// (`names`).
fn warn_if_exposed(config: &ServeConfig, names: &FlagOrigins) {
    if config.tls.is_some() || config.auth_secret.is_some() {
        return;
    }
    let addresses = [
        ("sink.serve_tcp_address", Some(config.tcp_address)),
        ("sink.serve_http_address", config.http_address),
    ];
    for (key, address) in addresses {
        if let Some(address) = address.filter(|a| !a.ip().is_loopback()) {
            tracing::warn!(
                setting = %names.flag_for(key).unwrap_or(key),
                %address,
                "The serve sink listens beyond loopback without TLS or an AUTH secret: anyone \
                 who reaches it can consume the stream. Give --serve-tls-cert and \
                 --serve-tls-key, or --serve-auth-secret-file (`sink.serve_tls_cert`, \
                 `sink.serve_tls_key`, `sink.serve_auth_secret_file`), or listen on 127.0.0.1."
            );
        }
    }
}

/// The serve sink's settings, serving the consumed `topic` and `channel`.
///
/// # Errors
///
/// The first setting that is wrong, by its key: an address that is none, a duration or count
/// out of range, a TLS file without its pair or unusable, an AUTH secret file that cannot be
/// read or is empty.
fn validate(raw: &RawSink, topic: &str, channel: &str) -> Result<ServeConfig, ConfigError> {
    let mut config = ServeConfig::new(topic, channel);
    if let Some(text) = &raw.serve_tcp_address {
        let port = config.tcp_address.port();
        config.tcp_address = resolve("sink.serve_tcp_address", text, port, false)?;
    }
    let default_http: SocketAddr = DEFAULT_HTTP_ADDRESS.parse().expect("a valid address");
    config.http_address = match raw
        .serve_http_address
        .as_deref()
        .unwrap_or(DEFAULT_HTTP_ADDRESS)
    {
        "off" => None,
        text => Some(resolve(
            "sink.serve_http_address",
            text,
            default_http.port(),
            true,
        )?),
    };
    if let Some(d) = raw.serve_msg_timeout {
        config.msg_timeout = d.0;
    }
    if let Some(d) = raw.serve_max_msg_timeout {
        config.max_msg_timeout = d.0;
    }
    if let Some(d) = raw.serve_heartbeat_interval {
        config.heartbeat_interval = d.0;
    }
    if let Some(n) = raw.serve_max_rdy_count {
        config.max_rdy_count = n;
    }
    if let Some(n) = raw.serve_max_connections {
        config.max_connections = n;
    }
    config.tls = tls(raw)?;
    if let Some(path) = &raw.serve_auth_secret_file {
        config.auth_secret = Some(ServeSecret::from_file(path).map_err(|reason| {
            invalid("sink.serve_auth_secret_file", quote(path.to_str()), reason)
        })?);
    }
    config.validate().map_err(|error| match error {
        ServeError::Config {
            field,
            value,
            reason,
        } => invalid(key_of(field), value, keys_in(&reason)),
        other => invalid("sink.kind", "\"serve\"", other.to_string()),
    })?;
    Ok(config)
}

/// TLS for the served port: the certificate and the key, each needing the other, both usable.
fn tls(raw: &RawSink) -> Result<Option<ServeTls>, ConfigError> {
    let (cert_file, key_file) = match (&raw.serve_tls_cert, &raw.serve_tls_key) {
        (Some(cert), Some(key)) => (cert.clone(), key.clone()),
        (Some(_), None) => {
            return Err(ConfigError::required(
                "sink.serve_tls_key",
                Wording::default().key("sink.serve_tls_cert"),
            ))
        }
        (None, Some(_)) => {
            return Err(ConfigError::required(
                "sink.serve_tls_cert",
                Wording::default().key("sink.serve_tls_key"),
            ))
        }
        (None, None) if raw.serve_tls_required == Some(true) => {
            return Err(ConfigError::required(
                "sink.serve_tls_cert",
                Wording::default().set("sink.serve_tls_required", "true"),
            ))
        }
        (None, None) => return Ok(None),
    };
    crate::tls::server_config(&cert_file, &key_file).map_err(|error| {
        let (key, path): (_, &Path) = match error.what {
            "server certificate" => ("sink.serve_tls_cert", &cert_file),
            _ => ("sink.serve_tls_key", &key_file),
        };
        invalid(key, quote(path.to_str()), error.cause)
    })?;
    Ok(Some(ServeTls {
        cert_file,
        key_file,
        required: raw.serve_tls_required.unwrap_or(false),
    }))
}

/// The key of the serve sink's field `field` (`msg_timeout`: `sink.serve_msg_timeout`); the
/// topic and channel are the source's.
fn key_of(field: &str) -> &'static str {
    match field {
        "topic" => "source.topic",
        "channel" => "source.channel",
        field => setting_of(field).unwrap_or("sink.kind"),
    }
}

/// The key of the setting for the serve sink's field `field`, if it has one.
fn setting_of(field: &str) -> Option<&'static str> {
    RawSink::SETTINGS
        .iter()
        .find(|setting| setting.name.strip_prefix("serve_") == Some(field))
        .map(|setting| setting.key)
}

/// `reason` with each of the serve sink's fields in backquotes named as a setting.
fn keys_in(reason: &str) -> Wording {
    let mut wording = Wording::default();
    for (i, piece) in reason.split('`').enumerate() {
        wording = match setting_of(piece) {
            Some(key) if i % 2 == 1 => wording.key(key),
            _ if i % 2 == 1 => wording.text(format!("`{piece}`")),
            _ => wording.text(piece),
        };
    }
    wording
}

/// The startup line's summary: `serve events/app at 127.0.0.1:4250 (HTTP 127.0.0.1:4251)`.
fn summary(config: &ServeConfig, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    write!(
        f,
        "serve {}/{} at {}",
        config.topic, config.channel, config.tcp_address
    )?;
    let mut notes = Vec::new();
    match config.http_address {
        Some(address) => notes.push(format!("HTTP {address}")),
        None => notes.push("no HTTP".to_owned()),
    }
    match &config.tls {
        Some(tls) if tls.required => notes.push("TLS required".to_owned()),
        Some(_) => notes.push("TLS".to_owned()),
        None => {}
    }
    if config.auth_secret.is_some() {
        notes.push("AUTH".to_owned());
    }
    write!(f, " ({})", notes.join(", "))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::{Settings, SinkSettings};
    use crate::sink::serve::{ServeConfig, DEFAULT_HTTP_ADDRESS};

    const SOURCE: &str =
        "[source]\ntopic = \"events\"\nchannel = \"app\"\nnsqd_tcp_addresses = [\"a:1\"]\n";

    fn serve(extra: &str) -> Result<ServeConfig, String> {
        match Settings::from_toml(&format!("{SOURCE}[sink]\nkind = \"serve\"\n{extra}")) {
            Ok(settings) => match settings.sink {
                SinkSettings::Serve(config) => Ok(config),
                other => panic!("not the serve sink: {other:?}"),
            },
            Err(error) => Err(error.to_string()),
        }
    }

    #[test]
    fn the_serve_sink_serves_the_consumed_topic_and_channel_with_its_defaults() {
        let config = serve("").unwrap();
        let mut expected = ServeConfig::new("events", "app");
        expected.http_address = Some(DEFAULT_HTTP_ADDRESS.parse().unwrap());
        assert_eq!(config, expected);
        assert_eq!(
            SinkSettings::Serve(config).to_string(),
            "serve events/app at 127.0.0.1:4250 (HTTP 127.0.0.1:4251)"
        );
        let config = serve(
            "serve_tcp_address = \":5250\"\nserve_http_address = \"off\"\n\
             serve_msg_timeout = \"10s\"\nserve_max_msg_timeout = \"1m\"\n\
             serve_heartbeat_interval = \"5s\"\nserve_max_rdy_count = 100\n\
             serve_max_connections = 3\n",
        )
        .unwrap();
        assert_eq!(config.tcp_address, "0.0.0.0:5250".parse().unwrap());
        assert_eq!(config.http_address, None);
        assert_eq!(
            (
                config.msg_timeout,
                config.max_msg_timeout,
                config.heartbeat_interval
            ),
            (
                Duration::from_secs(10),
                Duration::from_secs(60),
                Duration::from_secs(5)
            )
        );
        assert_eq!((config.max_rdy_count, config.max_connections), (100, 3));
    }

    #[test]
    fn bad_serve_settings_are_named_by_their_keys() {
        assert_eq!(
            serve("serve_tcp_address = \"4250\"\n").unwrap_err(),
            "invalid `sink.serve_tcp_address` = \"4250\": invalid socket address; expected \
             host:port such as 127.0.0.1:4250, localhost:4250 or :4250 (every IPv4 interface)"
        );
        assert_eq!(
            serve("serve_msg_timeout = \"20m\"\n").unwrap_err(),
            "invalid `sink.serve_msg_timeout` = 20m: must be from 1s to \
             `sink.serve_max_msg_timeout`, 15m"
        );
        assert_eq!(
            serve("serve_heartbeat_interval = \"2m\"\n").unwrap_err(),
            "invalid `sink.serve_heartbeat_interval` = 2m: must be from 1s to 1m, the longest \
             heartbeat interval a consumer may ask for"
        );
        assert_eq!(
            serve("serve_max_connections = 0\n").unwrap_err(),
            "invalid `sink.serve_max_connections` = 0: must be at least 1"
        );
        assert_eq!(
            serve("serve_tls_cert = \"/nonexistent/cert.pem\"\n").unwrap_err(),
            "`sink.serve_tls_key` is required with `sink.serve_tls_cert`: set it in the config \
             file"
        );
        assert_eq!(
            serve("serve_tls_required = true\n").unwrap_err(),
            "`sink.serve_tls_cert` is required with `sink.serve_tls_required = true`: set it in \
             the config file"
        );
        let error = serve("serve_auth_secret_file = \"/nonexistent/secret\"\n").unwrap_err();
        assert!(
            error.starts_with(
                "invalid `sink.serve_auth_secret_file` = \"/nonexistent/secret\": cannot be read: "
            ),
            "{error}"
        );
        assert_eq!(
            Settings::from_toml(&format!("{SOURCE}[sink]\nserve_max_rdy_count = 10\n"))
                .unwrap_err()
                .to_string(),
            "`sink.serve_max_rdy_count` is used only with `sink.kind = \"serve\"`: remove it, \
             or set that too"
        );
    }
}
