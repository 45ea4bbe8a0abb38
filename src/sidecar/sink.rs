//! Builds the sink and the dead-letter the settings ask for.

use super::RunError;
use crate::config::{DeadLetterSettings, SinkSettings};
use crate::nsq::Transport;
use crate::sink::{producer_config, Build, BuildError, DeadLetter, Sink};
use crate::wording::{FlagOrigins, Named};

/// Builds the sink the settings ask for, with its room's build; the serve sink starts serving
/// (binds its ports). `names` says which flags gave which settings, for a warning.
///
/// # Errors
///
/// [`RunError::Nsq`] for an unusable producer configuration, [`RunError::Http`] for an
/// unusable CA file, [`RunError::FileSink`] for the file sink's unusable directories or
/// formats, [`RunError::Serve`] for a serve port that cannot be bound.
pub(crate) async fn build_sink(
    sink: &SinkSettings,
    producer: &Transport,
    names: &FlagOrigins,
) -> Result<Sink, RunError> {
    let with = Build { producer, names };
    crate::sink::build(sink, &with)
        .await
        .map_err(|error| match error {
            BuildError::Nsq(error) => RunError::Nsq(error),
            BuildError::Http(error) => RunError::Http(error),
            BuildError::FileSink { key, reason } => RunError::FileSink {
                setting: Named::key(key),
                reason,
            },
            BuildError::Serve(error) => RunError::Serve(error),
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
