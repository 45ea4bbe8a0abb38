//! Which answers of nsqd no retry can change, and what the user changes instead.
//!
//! nsqd refuses some requests for good: an IDENTIFY whose settings it does not accept
//! (`E_BAD_BODY`), a topic or channel name it does not accept, a missing or refused AUTH, a
//! required TLS upgrade (nsqd's `protocol_v2.go`). Reconnecting with the same settings gets the
//! same answer for ever, so these become [`Error::Refused`], which stops the consumer's
//! reconnection to that nsqd and tells the caller, naming the setting to change. Everything
//! else (refused connections, resets, timeouts, a non-fatal error frame) stays transient.

use super::error::Error;

/// The [`Error::Refused`] that `error`, an answer to `command`, stands for, or `error` itself
/// when a retry may succeed.
pub(crate) fn classify(command: &'static str, error: Error) -> Error {
    let Error::Broker {
        addr, code, text, ..
    } = &error
    else {
        return error;
    };
    let Some(advice) = advice(command, code, text) else {
        return error;
    };
    Error::Refused {
        addr: addr.clone(),
        command,
        text: text.clone(),
        advice,
    }
}

/// What to change, for a refusal that no retry can change.
fn advice(command: &str, code: &str, text: &str) -> Option<&'static str> {
    Some(match code {
        "E_BAD_BODY" if command == "IDENTIFY" && text.contains("msg timeout") => {
            "set `--msg-timeout` (`source.msg_timeout`) between 1s and nsqd's --max-msg-timeout \
             (15m unless nsqd was started with another)"
        }
        "E_BAD_BODY" if command == "IDENTIFY" && text.contains("heartbeat interval") => {
            "set `source.heartbeat_interval` between 1s and nsqd's --max-heartbeat-interval \
             (60s unless nsqd was started with another)"
        }
        "E_BAD_BODY" | "E_IDENTIFY_FAILED" if command == "IDENTIFY" => {
            "nsqd does not accept this client's IDENTIFY settings; retrying cannot help"
        }
        "E_BAD_TOPIC" => "check `--topic` (`source.topic`) against nsqd's rules",
        "E_BAD_CHANNEL" => "check `--channel` (`source.channel`) against nsqd's rules",
        "E_INVALID" if text.contains("TLS") => {
            "nsqd requires TLS (--tls-required), which this version of nsq-dedupe cannot do yet"
        }
        "E_AUTH_FIRST" | "E_AUTH_FAILED" | "E_UNAUTHORIZED" | "E_AUTH_DISABLED" => {
            "nsqd requires AUTH (--auth-http-address), which this version of nsq-dedupe cannot \
             do yet"
        }
        _ => return None,
    })
}

/// The refusal of an nsqd whose IDENTIFY answer asks for what this client cannot do.
pub(crate) fn unsupported(addr: &str, wants: &'static str) -> Error {
    Error::Refused {
        addr: addr.to_string(),
        command: "IDENTIFY",
        text: format!("the answer asks for {wants}"),
        advice: match wants {
            "AUTH" => {
                "nsqd requires AUTH (--auth-http-address), which this version of nsq-dedupe \
                 cannot do yet"
            }
            _ => {
                "nsqd asks for a transport upgrade (TLS, snappy or deflate) that this client \
                  did not offer; nsqd's answer does not match the protocol"
            }
        },
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
        );
        assert!(error.is_permanent());
        assert_eq!(
            error.to_string(),
            "nsqd 127.0.0.1:4150 refused IDENTIFY: E_BAD_BODY IDENTIFY msg timeout (3600000) is \
             invalid; set `--msg-timeout` (`source.msg_timeout`) between 1s and nsqd's \
             --max-msg-timeout (15m unless nsqd was started with another)"
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
                classify(command, broker(code, text)).is_permanent(),
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
                !classify(command, broker(code, text)).is_permanent(),
                "{text}"
            );
        }
        let io = Error::ConnectionClosed {
            addr: "127.0.0.1:4150".into(),
        };
        assert!(!classify("IDENTIFY", io).is_permanent());
    }
}
