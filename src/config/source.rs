//! `[source]`: what to consume, validated into the consumer's [`ConsumerConfig`].
//!
//! The consumer owns its rules ([`ConsumerConfig::validate`]); this module fills in the
//! sidecar's defaults, which differ from go-nsq's library defaults, and names the key of a
//! setting the consumer refuses.

use std::time::Duration;

use super::{check_host_port, check_name, invalid, quote, ConfigError, Dur, Wording};
use crate::nsq::{self, ConsumerConfig};
use crate::pipeline::Policy;
use crate::setting::{section, DefaultValue, FlagValue};

/// The channel the sidecar consumes when none is given.
pub(crate) const DEFAULT_CHANNEL: &str = "nsq-dedupe";

/// Messages in flight at once when `max_in_flight` is not given: enough to keep a sink with
/// some latency busy, where go-nsq's library default of 1 would serialise it.
pub(crate) const DEFAULT_MAX_IN_FLIGHT: u32 = 200;

/// nsqd's own default message timeout, asked for explicitly so that the keepalive and the
/// store's lease can be derived from it.
pub(crate) const DEFAULT_MSG_TIMEOUT: Duration = Duration::from_secs(60);

section! {
    /// `[source]`: what to consume.
    pub struct RawSource in "source", heading "Source" {
        /// nsqd TCP address to consume from (repeatable, or comma-separated).
        nsqd_tcp_addresses: Vec<String>,
            flag("nsqd-tcp-address", value_name: "ADDR", value: FlagValue::List { delimiter: Some(',') });
        /// nsqlookupd HTTP address, host:port or http:// URL (repeatable, or comma-separated).
        lookupd_http_addresses: Vec<String>,
            flag("lookupd-http-address", value_name: "ADDR", value: FlagValue::List { delimiter: Some(',') });
        /// Topic to consume.
        topic: String, flag("topic", value_name: "TOPIC");
        /// Channel to consume (default {default}).
        channel: String, default(DefaultValue::Text(DEFAULT_CHANNEL)), flag("channel", value_name: "CHANNEL");
        /// Messages in flight at once (default {default}).
        max_in_flight: u32, default(DefaultValue::Number(DEFAULT_MAX_IN_FLIGHT as u64)), flag("max-in-flight", value_name: "N", value: FlagValue::InFlight);
        /// nsqd's redelivery timeout for this consumer, such as 60s.
        msg_timeout: Dur, flag("msg-timeout", value_name: "DURATION", value: FlagValue::Duration);
        /// Deliveries before a failing message goes to the dead-letter (default {default}).
        max_attempts: u16, default(DefaultValue::Number(nsq::DEFAULT_MAX_ATTEMPTS as u64)), flag("max-attempts", value_name: "N", value: FlagValue::Attempts);
        /// First requeue delay and consumer pause after a handler failure, doubling (default {default}).
        backoff: Dur, default(DefaultValue::Duration(nsq::DEFAULT_BACKOFF)), flag("backoff", value_name: "DURATION", value: FlagValue::Duration);
        /// Longest requeue delay and pause (default {default}).
        max_backoff: Dur, default(DefaultValue::Duration(nsq::DEFAULT_MAX_BACKOFF)), flag("max-backoff", value_name: "DURATION", value: FlagValue::Duration);
        /// Heartbeat interval asked of nsqd, 1s to 60s (default {default}).
        heartbeat_interval: Dur, default(DefaultValue::Duration(nsq::DEFAULT_HEARTBEAT_INTERVAL)),
            flag("heartbeat-interval", value_name: "DURATION", value: FlagValue::Duration);
        /// How often nsqlookupd is polled (default {default}).
        lookupd_poll_interval: Dur, default(DefaultValue::Seconds(nsq::DEFAULT_LOOKUPD_POLL_INTERVAL)),
            flag("lookupd-poll-interval", value_name: "DURATION", value: FlagValue::Duration);
    }
}

/// The validated `[source]`: the consumer's settings and what the pipeline takes from them.
#[derive(Debug)]
pub(super) struct Source {
    pub(super) consumer: ConsumerConfig,
    pub(super) msg_timeout: Duration,
    pub(super) max_attempts: u16,
    pub(super) backoff: Duration,
    pub(super) max_backoff: Duration,
}

impl Source {
    /// Adds `[consumer_opt]`'s transport and IDENTIFY details, checked by the consumer's rules.
    pub(super) fn apply(
        &mut self,
        transport: crate::nsq::Transport,
        identity: super::nsq_opts::Identity,
    ) -> Result<(), ConfigError> {
        let consumer = &mut self.consumer;
        consumer.transport = transport;
        if let Some(agent) = identity.user_agent {
            consumer.user_agent = agent;
        }
        if identity.output_buffer_timeout.is_some() {
            consumer.output_buffer_timeout = identity.output_buffer_timeout;
        }
        consumer.output_buffer_size = identity.output_buffer_size;
        consumer.sample_rate = identity.sample_rate.unwrap_or(0);
        consumer.validate().map_err(|error| match error {
            crate::nsq::Error::Config { field, reason } => ConfigError::Invalid {
                key: super::nsq_opts::key(super::nsq_opts::Side::Consumer, field),
                value: match field {
                    "output_buffer_size" => identity.output_buffer_size.unwrap_or(0).to_string(),
                    _ => String::new(),
                },
                reason: reason.into(),
            },
            other => ConfigError::Consumer(other),
        })
    }
}

/// Each nsqd address is a host:port, and each nsqlookupd address one the consumer can ask.
fn check_addresses(consumer: &ConsumerConfig) -> Result<(), ConfigError> {
    for addr in &consumer.nsqd_tcp_addresses {
        check_host_port("source.nsqd_tcp_addresses", addr)?;
    }
    for addr in &consumer.lookupd_http_addresses {
        crate::nsq::lookupd::parse_address(addr).map_err(|error| match error {
            crate::nsq::Error::Config { reason, .. } => {
                // The consumer's reason starts with the address, which we show already.
                let quoted = quote(Some(addr));
                let reason = reason
                    .strip_prefix(&format!("{quoted}: "))
                    .map_or(reason.clone(), str::to_owned);
                invalid("source.lookupd_http_addresses", quoted, reason)
            }
            other => ConfigError::Consumer(other),
        })?;
    }
    Ok(())
}

impl RawSource {
    /// The channel given, else the default.
    pub(super) fn channel_or_default(&self) -> &str {
        self.channel.as_deref().unwrap_or(DEFAULT_CHANNEL)
    }

    pub(super) fn validate(&self) -> Result<Source, ConfigError> {
        let no_addresses = [&self.nsqd_tcp_addresses, &self.lookupd_http_addresses]
            .iter()
            .all(|addrs| addrs.as_ref().is_none_or(Vec::is_empty));
        let missing_addresses = ConfigError::Missing {
            key: "source.nsqd_tcp_addresses",
            flags: &["--nsqd-tcp-address", "--lookupd-http-address"],
        };
        let Some(topic) = self.topic.clone() else {
            let topic = ConfigError::Missing {
                key: "source.topic",
                flags: &["--topic"],
            };
            return Err(if no_addresses {
                ConfigError::MissingAll(vec![topic, missing_addresses])
            } else {
                topic
            });
        };
        let channel = self.channel_or_default().to_owned();
        check_name("source.topic", "topic", &topic)?;
        check_name("source.channel", "channel", &channel)?;
        let mut consumer = ConsumerConfig::new(topic, channel);
        consumer.nsqd_tcp_addresses = self.nsqd_tcp_addresses.clone().unwrap_or_default();
        consumer.lookupd_http_addresses = self.lookupd_http_addresses.clone().unwrap_or_default();
        if no_addresses {
            return Err(missing_addresses);
        }
        check_addresses(&consumer)?;
        consumer.max_in_flight = self.max_in_flight.unwrap_or(DEFAULT_MAX_IN_FLIGHT);
        let msg_timeout = self.msg_timeout.map_or(DEFAULT_MSG_TIMEOUT, |d| d.0);
        consumer.msg_timeout = Some(msg_timeout);
        // The pipeline decides what happens after many attempts (the dead-letter); the
        // consumer's own check would FIN such messages without handing them out.
        consumer.max_attempts = 0;
        if let Some(Dur(d)) = self.heartbeat_interval {
            consumer.heartbeat_interval = d;
        }
        if let Some(Dur(d)) = self.lookupd_poll_interval {
            consumer.lookupd_poll_interval = d;
        }
        let defaults = Policy::default();
        let backoff = self.backoff.map_or(defaults.backoff, |d| d.0);
        let max_backoff = self.max_backoff.map_or(defaults.max_backoff, |d| d.0);
        if max_backoff < backoff {
            return Err(invalid(
                "source.max_backoff",
                format!("{max_backoff:?}"),
                Wording::from("must be at least ")
                    .key("source.backoff")
                    .text(format!(" ({backoff:?})")),
            ));
        }
        // go-nsq-style RDY backoff on handler failures: a failing sink slows consumption down
        // instead of cycling messages through requeues at full speed.
        consumer.backoff_multiplier = backoff;
        consumer.max_backoff = max_backoff;
        consumer.max_requeue_delay = consumer.max_requeue_delay.max(max_backoff);
        consumer.validate().map_err(|error| match error {
            crate::nsq::Error::Config { field, reason } => ConfigError::Invalid {
                key: source_key(field),
                value: self.value_of(field),
                reason: reason.into(),
            },
            other => ConfigError::Consumer(other),
        })?;
        let max_attempts = self.max_attempts.unwrap_or(defaults.max_attempts);
        if max_attempts == 0 {
            return Err(invalid(
                "source.max_attempts",
                "0",
                "must be at least 1 (messages failing that often go to the dead-letter)",
            ));
        }
        Ok(Source {
            consumer,
            msg_timeout,
            max_attempts,
            backoff,
            max_backoff,
        })
    }

    /// The value of the key behind a consumer setting, as written, for an error message.
    fn value_of(&self, field: &str) -> String {
        let shown = |d: Option<Dur>| d.map_or_else(String::new, |d| format!("{:?}", d.0));
        match field {
            "max_in_flight" => self.max_in_flight.unwrap_or_default().to_string(),
            "msg_timeout" => shown(self.msg_timeout),
            "heartbeat_interval" => shown(self.heartbeat_interval),
            "lookupd_poll_interval" => shown(self.lookupd_poll_interval),
            _ => String::new(),
        }
    }
}

/// The `[source]` key of a consumer setting. Settings without a key cannot be set by a user,
/// so they cannot be the cause of a refusal; they are reported under the section.
fn source_key(field: &str) -> &'static str {
    match field {
        "nsqd_tcp_addresses" => "source.nsqd_tcp_addresses",
        "lookupd_http_addresses" => "source.lookupd_http_addresses",
        "max_in_flight" => "source.max_in_flight",
        "msg_timeout" => "source.msg_timeout",
        "heartbeat_interval" => "source.heartbeat_interval",
        "lookupd_poll_interval" => "source.lookupd_poll_interval",
        _ => "source",
    }
}
