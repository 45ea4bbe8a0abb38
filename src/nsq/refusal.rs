//! Which answers of nsqd no retry can change, and what the user changes instead.
//!
//! nsqd refuses some requests for good: an IDENTIFY whose settings it does not accept
//! (`E_BAD_BODY`), a topic or channel name it does not accept, a missing or refused AUTH, a
//! required TLS upgrade (nsqd's `protocol_v2.go`), a TLS handshake whose certificates or
//! versions do not match. Reconnecting with the same settings gets the
//! same answer for ever, so these become [`Error::Refused`], which stops the consumer's
//! reconnection to that nsqd and tells the caller, naming the setting to change. Everything
//! else (refused connections, resets, timeouts, a non-fatal error frame) stays transient.

use super::error::Error;
use crate::wording::{Named, Wording};

/// Who opens the connection, so that a refusal names the setting the user has for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The consumer: flags of `run` and the `[consumer_opt]` table.
    Consumer,
    /// A producer (the `nsq` sink and dead-letter): `--producer-opt` and `[producer_opt]`.
    Producer,
}

/// The go-nsq options a refusal names: the option, then the consumer's flag and key and the
/// producer's flag and key for it.
/// An option with no flag of its own is set with `--consumer-opt OPTION,…`.
macro_rules! refused_options {
    ($($option:literal $(by $flag:literal)?),* $(,)?) => {
        const REFUSED_OPTIONS: &[[&str; 5]] = &[$([
            $option,
            refused_options!(@flag $option $($flag)?),
            concat!("consumer_opt.", $option),
            concat!("--producer-opt ", $option, ",…"),
            concat!("producer_opt.", $option),
        ]),*];
    };
    (@flag $option:literal $flag:literal) => { concat!("--", $flag) };
    (@flag $option:literal) => { concat!("--consumer-opt ", $option, ",…") };
}

refused_options!(
    "auth_secret" by "auth-secret",
    "tls_v1" by "tls",
    "tls_root_ca_file" by "tls-root-ca-file",
    "tls_insecure_skip_verify" by "tls-insecure-skip-verify",
    "tls_cert" by "tls-cert",
    "tls_key" by "tls-key",
    "tls_min_version" by "tls-min-version",
    "output_buffer_timeout",
    "output_buffer_size",
    "sample_rate",
);

impl Role {
    /// How the user sets go-nsq option `option` for this role, e.g. ``--auth-secret`
    /// (`consumer_opt.auth_secret`)``, as a [`Wording`] whose settings a caller names as the
    /// user gave them. An option no refusal names is said as it is.
    pub fn setting(self, option: &str) -> Wording {
        let Some(&[_, flag, key, producer_flag, producer_key]) =
            REFUSED_OPTIONS.iter().find(|names| names[0] == option)
        else {
            return Wording::from(format!("`{option}`"));
        };
        match self {
            Role::Consumer => flag_and_key(flag, key),
            Role::Producer => flag_and_key(producer_flag, producer_key),
        }
    }
}

/// The [`Error::Refused`] that `error`, an answer to `command`, stands for, or `error` itself
/// when a retry may succeed.
pub(crate) fn classify(command: &'static str, error: Error, role: Role) -> Error {
    let Error::Broker {
        addr, code, text, ..
    } = &error
    else {
        return error;
    };
    let Some(advice) = advice(command, code, text, role) else {
        return error;
    };
    Error::Refused {
        addr: addr.clone(),
        command,
        text: text.clone(),
        advice,
    }
}

/// `` `--flag` (`key`) ``: a setting of `run` named by its flag and its key.
fn flag_and_key(flag: &'static str, key: &'static str) -> Wording {
    Wording::default().both(Named::flag(flag), Named::key(key))
}

/// The go-nsq options of IDENTIFY that nsqd checks against its own limits, named as nsqd's
/// refusal names them (`output buffer timeout (…) is invalid`), with the range it accepts.
const IDENTIFY_RULES: &[(&str, &str)] = &[
    (
        "output_buffer_timeout",
        "between nsqd's --min-output-buffer-timeout and --max-output-buffer-timeout (25ms and \
         30s unless nsqd was started with others)",
    ),
    (
        "output_buffer_size",
        "between 64 and nsqd's --max-output-buffer-size (64KiB unless nsqd was started with \
         another), or -1 (off)",
    ),
    ("sample_rate", "between 0 (every message) and 99"),
];

/// What to change, for a refusal that no retry can change.
fn advice(command: &str, code: &str, text: &str, role: Role) -> Option<Wording> {
    let secret = || role.setting("auth_secret");
    let check = |flag, key| {
        Wording::from("check ")
            .then(flag_and_key(flag, key))
            .text(" against nsqd's rules")
    };
    Some(match code {
        "E_BAD_BODY" if command == "IDENTIFY" && text.contains("msg timeout") => {
            Wording::from("set ")
                .then(flag_and_key("--msg-timeout", "source.msg_timeout"))
                .text(
                    " between 1s and nsqd's --max-msg-timeout (15m unless nsqd was started \
                     with another)",
                )
        }
        "E_BAD_BODY" if command == "IDENTIFY" && text.contains("heartbeat interval") => {
            Wording::from("set ").key("source.heartbeat_interval").text(
                " between 1s and nsqd's --max-heartbeat-interval (60s unless nsqd was started \
                 with another)",
            )
        }
        "E_BAD_BODY" if command == "IDENTIFY" => {
            if let Some((option, rule)) = IDENTIFY_RULES
                .iter()
                .find(|(option, _)| text.contains(&option.replace('_', " ")))
            {
                return Some(
                    Wording::from("set ")
                        .then(role.setting(option))
                        .text(format!(" {rule}")),
                );
            }
            "nsqd does not accept this client's IDENTIFY settings; retrying cannot help".into()
        }
        "E_IDENTIFY_FAILED" if command == "IDENTIFY" => {
            "nsqd does not accept this client's IDENTIFY settings; retrying cannot help".into()
        }
        "E_BAD_TOPIC" if role == Role::Producer => {
            "check the topic published to against nsqd's rules".into()
        }
        "E_BAD_TOPIC" => check("--topic", "source.topic"),
        "E_BAD_CHANNEL" => check("--channel", "source.channel"),
        "E_INVALID" if text.contains("TLS required") => {
            Wording::from("nsqd requires TLS (--tls-required); turn it on with ")
                .then(role.setting("tls_v1"))
        }
        "E_AUTH_FIRST" => Wording::from("nsqd requires AUTH; set the secret with ").then(secret()),
        "E_AUTH_FAILED" => Wording::from(
            "nsqd's auth server refused the secret, or nsqd could not reach it; check ",
        )
        .then(secret())
        .text(" and nsqd's --auth-http-address"),
        "E_UNAUTHORIZED" => Wording::from("the secret (").then(secret()).text(format!(
            ") grants no permission for this {}; grant it in nsqd's auth server",
            if role == Role::Producer {
                "topic"
            } else {
                "topic and channel"
            }
        )),
        "E_AUTH_DISABLED" => Wording::from("nsqd does not use AUTH; remove the secret (")
            .then(secret())
            .text(")"),
        _ => return None,
    })
}

/// The refusal for a peer at `addr` that answered the NSQ magic with text starting `start`:
/// an HTTP port (nsqd's own, most often) or another service, which no retry changes.
pub(crate) fn not_nsq(addr: &str, start: &str, role: Role) -> Error {
    let protocol = if start.starts_with("HTTP") || start.starts_with('<') {
        "HTTP"
    } else {
        "text"
    };
    let setting = match role {
        Role::Consumer => flag_and_key("--nsqd-tcp-address", "source.nsqd_tcp_addresses"),
        Role::Producer => Wording::default()
            .setting(Named::flag("--destination-nsqd-tcp-address"))
            .text(" or ")
            .setting(Named::flag("--dead-letter-nsqd-tcp-address"))
            .text(" (")
            .key("sink.destination_nsqd_tcp_addresses")
            .text(", ")
            .key("dead_letter.nsqd_tcp_addresses")
            .text(")"),
    };
    Error::Refused {
        addr: addr.to_string(),
        command: "the NSQ protocol",
        text: format!("it answered in {protocol} ({start:?}…), so this is not nsqd's TCP port"),
        advice: Wording::from(
            "give nsqd's TCP address (its --tcp-address, port 4150 unless nsqd was started with \
             another; 4151 is its HTTP port) with ",
        )
        .then(setting),
    }
}

/// The error for a failed TLS handshake: a refusal when the peers disagree in a way no retry
/// changes (the certificate, the protocol version, a client certificate nsqd wants), else the
/// socket error it is.
pub(crate) fn tls_failure(addr: &str, cause: std::io::Error, role: Role) -> Error {
    use rustls::{AlertDescription as Alert, Error as Tls};
    let Some(tls) = cause.get_ref().and_then(|e| e.downcast_ref::<Tls>()) else {
        return Error::Io {
            addr: addr.to_string(),
            cause,
        };
    };
    let advice = match tls {
        Tls::InvalidCertificate(_) | Tls::UnsupportedNameType => {
            Wording::from("trust nsqd's CA with ")
                .then(role.setting("tls_root_ca_file"))
                .text(" (or, only for a test, ")
                .then(role.setting("tls_insecure_skip_verify"))
                .text(")")
        }
        Tls::AlertReceived(Alert::CertificateRequired | Alert::HandshakeFailure)
        | Tls::AlertReceived(Alert::BadCertificate | Alert::UnknownCA) => Wording::from(
            "nsqd wants a client certificate it trusts (--tls-client-auth-policy); set ",
        )
        .then(role.setting("tls_cert"))
        .text(" and ")
        .then(role.setting("tls_key")),
        Tls::AlertReceived(Alert::ProtocolVersion) | Tls::PeerIncompatible(_) => {
            Wording::from("nsqd and this client share no TLS version or cipher; check ")
                .then(role.setting("tls_min_version"))
                .text(" and nsqd's --tls-min-version")
        }
        _ => {
            return Error::Io {
                addr: addr.to_string(),
                cause,
            }
        }
    };
    Error::Refused {
        addr: addr.to_string(),
        command: "TLS",
        text: tls.to_string(),
        advice,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn broker(code: &str, text: &str) -> Error {
        Error::Broker {
            addr: "127.0.0.1:4150".into(),
            code: code.into(),
            text: text.into(),
            fatal: true,
        }
    }

    #[test]
    fn settings_nsqd_refuses_are_permanent_and_named() {
        let error = classify(
            "IDENTIFY",
            broker(
                "E_BAD_BODY",
                "E_BAD_BODY IDENTIFY msg timeout (3600000) is invalid",
            ),
            Role::Consumer,
        );
        assert!(error.is_permanent());
        assert_eq!(
            error.to_string(),
            "nsqd 127.0.0.1:4150 refused IDENTIFY: E_BAD_BODY IDENTIFY msg timeout (3600000) is \
             invalid; set `--msg-timeout` (`source.msg_timeout`) between 1s and nsqd's \
             --max-msg-timeout (15m unless nsqd was started with another)"
        );
        let error = classify(
            "IDENTIFY",
            broker(
                "E_BAD_BODY",
                "E_BAD_BODY IDENTIFY output buffer timeout (5) is invalid",
            ),
            Role::Consumer,
        );
        assert!(error.is_permanent());
        assert_eq!(
            error.to_string(),
            "nsqd 127.0.0.1:4150 refused IDENTIFY: E_BAD_BODY IDENTIFY output buffer timeout (5) \
             is invalid; set `--consumer-opt output_buffer_timeout,…` \
             (`consumer_opt.output_buffer_timeout`) between nsqd's --min-output-buffer-timeout \
             and --max-output-buffer-timeout (25ms and 30s unless nsqd was started with \
             others)"
        );
        for (command, code, text) in [
            (
                "SUB",
                "E_BAD_TOPIC",
                "E_BAD_TOPIC SUB topic name \"a\" is not valid",
            ),
            (
                "SUB",
                "E_AUTH_FIRST",
                "E_AUTH_FIRST AUTH required before SUB",
            ),
            (
                "SUB",
                "E_INVALID",
                "E_INVALID cannot SUB in current state (TLS required)",
            ),
            (
                "IDENTIFY",
                "E_IDENTIFY_FAILED",
                "E_IDENTIFY_FAILED failed to upgrade",
            ),
        ] {
            assert!(
                classify(command, broker(code, text), Role::Consumer).is_permanent(),
                "{text}"
            );
        }
    }

    #[test]
    fn everything_else_stays_transient() {
        for (command, code, text) in [
            ("SUB", "E_INVALID", "E_INVALID cannot SUB in current state"),
            (
                "FIN",
                "E_FIN_FAILED",
                "E_FIN_FAILED FIN 0a1b failed ID not in flight",
            ),
            (
                "IDENTIFY",
                "E_INVALID",
                "E_INVALID cannot IDENTIFY in current state",
            ),
        ] {
            assert!(
                !classify(command, broker(code, text), Role::Consumer).is_permanent(),
                "{text}"
            );
        }
        let io = Error::ConnectionClosed {
            addr: "127.0.0.1:4150".into(),
        };
        assert!(!classify("IDENTIFY", io, Role::Consumer).is_permanent());
    }
}
