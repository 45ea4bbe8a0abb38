//! Builds the sink and the dead-letter the settings ask for.

use super::RunError;
use crate::config::{DeadLetterSettings, FlagOrigins, SinkSettings};
use crate::nsq::{ProducerConfig, Transport};
use crate::sink::serve::ServeSink;
use crate::sink::{DeadLetter, FileSink, HttpSink, NsqSink, Sink, StdoutSink};

/// Builds the sink the settings ask for; the serve sink starts serving (binds its ports).
///
/// # Errors
///
/// [`RunError::Nsq`] for an unusable producer configuration, [`RunError::Http`] for an
/// unusable CA file, [`RunError::Serve`] for a serve port that cannot be bound.
pub(crate) async fn build_sink(
    sink: &SinkSettings,
    producer: &Transport,
) -> Result<Sink, RunError> {
    Ok(match sink {
        SinkSettings::Serve(config) => Sink::Serve(ServeSink::start(config.clone()).await?),
        SinkSettings::Stdout => Sink::Stdout(StdoutSink::default()),
        SinkSettings::File(config) => {
            Sink::File(FileSink::new(config.clone()).map_err(|(key, reason)| {
                RunError::FileSink {
                    setting: crate::wording::Named::key(key),
                    reason,
                }
            })?)
        }
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

/// Warns when a served port is reachable beyond this machine while consumers need neither TLS
/// nor the AUTH secret: anyone who reaches it can take (and FIN) the stream. Not refused: a
/// private network may be all the protection wanted. The setting is named as the user gave it
/// (`names`).
pub(super) fn warn_if_exposed(sink: &SinkSettings, names: &FlagOrigins) {
    let SinkSettings::Serve(config) = sink else {
        return;
    };
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
