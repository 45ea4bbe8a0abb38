//! `[sink]`'s serve settings (`sink.kind = "serve"`, the sidecar as an nsqd for NSQ
//! consumers) validated into the serve sink's [`ServeConfig`]. A setting not given keeps the
//! serve sink's own default ([`ServeConfig::new`]); the ranges are the serve sink's rules
//! ([`ServeConfig::validate`]), named here by the key the user typed.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;

use super::RawSink;
use crate::config::{invalid, quote, ConfigError, Wording};
use crate::setting::resolve;
use crate::setting::Section as _;
use crate::sink::serve::{ServeConfig, ServeError, ServeSecret, ServeTls, DEFAULT_HTTP_ADDRESS};

/// The serve sink's settings, serving the consumed `topic` and `channel`.
///
/// # Errors
///
/// The first setting that is wrong, by its key: an address that is none, a duration or count
/// out of range, a TLS file without its pair or unusable, an AUTH secret file that cannot be
/// read or is empty.
pub(super) fn validate(
    raw: &RawSink,
    topic: &str,
    channel: &str,
) -> Result<ServeConfig, ConfigError> {
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
pub(super) fn summary(config: &ServeConfig, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
