//! The values settings hold and the rules several sections share: a duration ([`Dur`]), a
//! `host:port`, a listen address and an NSQ name, each refused with the key and the value.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use serde::Deserialize;

use super::{invalid, quote, ConfigError};

impl From<Duration> for Dur {
    fn from(duration: Duration) -> Self {
        Dur(duration)
    }
}

/// A duration written as `500ms`, `30s`, `5m`, `1h`, `1h30m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(DurVisitor)
    }
}

/// Reads a [`Dur`] from a string. A value of another type (`msg_timeout = 30`) is refused with
/// the form a duration takes, quotes included, rather than serde's bare "expected a string".
struct DurVisitor;

impl serde::de::Visitor<'_> for DurVisitor {
    type Value = Dur;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a duration in quotes, such as \"30s\", \"5m\", \"1h\" or \"2d\"")
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Dur, E> {
        // The value is named in the error (config errors quote no line of the file), in
        // serde's words: `invalid value: string "10 parsecs", expected a duration such as …`.
        crate::units::parse_duration(text)
            .map(Dur)
            .map_err(|reason| {
                let expected = reason.strip_prefix("expected ").unwrap_or(&reason);
                E::invalid_value(serde::de::Unexpected::Str(text), &expected)
            })
    }
}

/// Checks a `host:port` address, such as an nsqd's.
pub(crate) fn check_host_port(key: &'static str, addr: &str) -> Result<(), ConfigError> {
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => {
            Ok(())
        }
        _ => Err(invalid(
            key,
            quote(Some(addr)),
            "expected host:port such as 127.0.0.1:4150",
        )),
    }
}

/// Checks an NSQ topic or channel name (`what`) by nsqd's rule.
pub(crate) fn check_name(key: &'static str, what: &str, name: &str) -> Result<(), ConfigError> {
    if crate::nsq::is_valid_name(name) {
        Ok(())
    } else {
        Err(invalid(
            key,
            quote(Some(name)),
            format!("NSQ {what} names are 1 to 64 of letters, digits, '.', '_' and '-', optionally ending in #ephemeral"),
        ))
    }
}

/// A listen address in the forms NSQ's tools and Prometheus exporters take to the first
/// address it names: `127.0.0.1:9150`, `[::1]:9150`, `localhost:9150` (host names are
/// resolved as any server does), and `:9150`, a port alone, which listens on every IPv4
/// interface as `0.0.0.0:9150` does (`[::]:9150` for IPv6 as well).
///
/// `key` is the setting, `port` its default port (for the example) and `off` whether it may be
/// "off".
pub(crate) fn resolve(
    key: &'static str,
    text: &str,
    port: u16,
    off: bool,
) -> Result<SocketAddr, ConfigError> {
    let expected = format!(
        "expected host:port such as 127.0.0.1:{port}, localhost:{port} or :{port} (every IPv4 \
         interface){}",
        if off { ", or \"off\"" } else { "" }
    );
    let refuse = |reason: String| invalid(key, quote(Some(text)), reason);
    let listen = match text.strip_prefix(':') {
        Some(port) => {
            let port: u16 = port.parse().map_err(|_| refuse(expected.clone()))?;
            return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
        }
        None => text.to_socket_addrs(),
    };
    let mut addrs: Vec<SocketAddr> = listen
        .map_err(|error| refuse(format!("{error}; {expected}")))?
        .collect();
    // Prefer IPv4 loopback for `localhost`, where most scrapers look first.
    addrs.sort_by_key(|addr| !addr.is_ipv4());
    addrs.into_iter().next().ok_or_else(|| refuse(expected))
}
