//! The NSQ layer's error type.
//!
//! Messages name the setting to change where there is one. Outcomes of normal running that a
//! caller must handle (a message no longer in flight, a connection that went away) are variants,
//! so the hot path never boxes.

use std::time::Duration;

use super::frame::{error_code, is_non_fatal_error, FrameError};
use crate::wording::Wording;

/// Errors from the NSQ consumer, producer, connections and lookupd queries.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is out of range or missing.
    #[error("invalid NSQ setting `{field}`: {reason}")]
    Config {
        /// The setting's name.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// Connecting or talking to nsqd failed at the socket level.
    #[error("I/O error with nsqd {addr}: {cause}")]
    Io {
        /// The nsqd address.
        addr: String,
        /// The underlying error. Part of the message, so that a log line of this error alone
        /// says why; not also its `source`, so that an error chain says it once.
        cause: std::io::Error,
    },
    /// nsqd sent bytes that are not valid frames.
    #[error("protocol error from nsqd {addr}: {cause}")]
    Protocol {
        /// The nsqd address.
        addr: String,
        /// What was wrong (in the message, as for `Io`).
        cause: FrameError,
    },
    /// nsqd answered with an error frame. `fatal` errors close the connection.
    #[error("nsqd {addr} answered {text}")]
    Broker {
        /// The nsqd address.
        addr: String,
        /// The code at the start of the text, e.g. `E_PUB_FAILED`.
        code: String,
        /// The whole error text.
        text: String,
        /// Whether nsqd closes the connection after this error.
        fatal: bool,
    },
    /// nsqd refused a request in a way no retry can change (see `refusal`): the consumer stops
    /// reconnecting to that nsqd and reports it.
    #[error("nsqd {addr} refused {command}: {text}; {advice}")]
    Refused {
        /// The nsqd address.
        addr: String,
        /// The command it refused.
        command: &'static str,
        /// nsqd's answer.
        text: String,
        /// The setting to change.
        advice: Wording,
    },
    /// nsqd answered something we did not expect at this point of the conversation.
    #[error("nsqd {addr} answered {answer:?} to {command}")]
    UnexpectedResponse {
        /// The nsqd address.
        addr: String,
        /// The command we sent.
        command: &'static str,
        /// What came back.
        answer: String,
    },
    /// A step did not complete in time.
    #[error("{what} with {addr} did not complete within {after:?} (see `{knob}`)")]
    Timeout {
        /// The peer.
        addr: String,
        /// What timed out.
        what: &'static str,
        /// How long we waited.
        after: Duration,
        /// The setting that bounds the wait.
        knob: &'static str,
    },
    /// The connection a message came from (or a request was sent on) is closed.
    ///
    /// For a message, nsqd will deliver it again after `msg_timeout`.
    #[error("the connection to nsqd {addr} is closed")]
    ConnectionClosed {
        /// The nsqd address.
        addr: String,
    },
    /// The message was already finished or requeued (possibly by shutdown's final requeue).
    #[error(
        "message {id} is no longer in flight on its connection (already finished or requeued)"
    )]
    NotInFlight {
        /// The message ID.
        id: String,
    },
    /// No nsqd could take a publish.
    #[error("no nsqd available to publish to (tried {tried}); last error: {last}")]
    NoProducer {
        /// How many nsqd were tried.
        tried: usize,
        /// The last error seen.
        last: String,
    },
    /// An nsqlookupd query failed.
    #[error("nsqlookupd {}: {reason}", crate::redact::url(addr))]
    Lookupd {
        /// The lookupd address as configured (shown without its user info).
        addr: String,
        /// What went wrong.
        reason: String,
    },
}

impl Error {
    /// Whether retrying with the same settings can never succeed.
    pub fn is_permanent(&self) -> bool {
        matches!(self, Error::Refused { .. })
    }

    /// A copy of a refusal (errors holding I/O causes are not `Clone`); `None` for any other
    /// error.
    pub(crate) fn refusal_copy(&self) -> Option<Error> {
        match self {
            Error::Refused {
                addr,
                command,
                text,
                advice,
            } => Some(Error::Refused {
                addr: addr.clone(),
                command,
                text: text.clone(),
                advice: advice.clone(),
            }),
            _ => None,
        }
    }

    /// Whether this is an error frame after which nsqd keeps the connection open.
    pub fn is_non_fatal_broker_error(&self) -> bool {
        matches!(self, Error::Broker { fatal: false, .. })
    }
}

/// Builds [`Error::Broker`] from an error frame's text.
pub(crate) fn broker_error(addr: &str, text: &[u8]) -> Error {
    Error::Broker {
        addr: addr.to_string(),
        code: String::from_utf8_lossy(error_code(text)).into_owned(),
        text: String::from_utf8_lossy(text).into_owned(),
        fatal: !is_non_fatal_error(text),
    }
}
