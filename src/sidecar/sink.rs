//! Builds the sink and the dead-letter the settings ask for.

use super::RunError;
use crate::config::{DeadLetterSettings, SinkSettings};
use crate::nsq::{ProducerConfig, Transport};
use crate::sink::{DeadLetter, FileSink, HttpSink, NsqSink, Sink, StdoutSink};

/// Builds the sink the settings ask for.
///
/// # Errors
///
/// [`RunError::Nsq`] for an unusable producer configuration, [`RunError::Http`] for an
/// unusable CA file.
pub fn build_sink(sink: &SinkSettings, producer: &Transport) -> Result<Sink, RunError> {
    Ok(match sink {
        SinkSettings::Stdout => Sink::Stdout(StdoutSink::default()),
        SinkSettings::File(config) => Sink::File(
            FileSink::new(config.clone())
                .map_err(|(field, reason)| RunError::FileSink { field, reason })?,
        ),
        SinkSettings::Null => Sink::Null,
        SinkSettings::Nsq {
            nsqd_tcp_addresses,
            topic,
        } => Sink::Nsq(NsqSink::new(
            producer_config(nsqd_tcp_addresses, producer),
            topic.clone(),
        )?),
        SinkSettings::Http(config) => Sink::Http(HttpSink::new(config)?),
    })
}

/// Opens the dead-letter the settings ask for, if any.
pub(super) fn build_dead_letter(
    dead_letter: Option<&DeadLetterSettings>,
    producer: &Transport,
) -> Result<Option<DeadLetter>, RunError> {
    Ok(match dead_letter {
        None => None,
        Some(DeadLetterSettings::File(path)) => Some(DeadLetter::file(path.clone())?),
        Some(DeadLetterSettings::Nsq {
            nsqd_tcp_addresses,
            topic,
        }) => Some(DeadLetter::nsq(
            producer_config(nsqd_tcp_addresses, producer),
            topic.clone(),
        )?),
    })
}

/// A producer's settings: the addresses, and the transport of `[producer_opt]`.
fn producer_config(addresses: &[String], transport: &Transport) -> ProducerConfig {
    let mut config = ProducerConfig::new(addresses.to_vec());
    config.transport = transport.clone();
    config
}
