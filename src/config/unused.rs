//! One rule for settings that would do nothing: each setting given is used, or refused with
//! its name and what it needs (`--post` needs `--sink http`).
//!
//! A setting that silently does nothing hides a mistake: a sink that was meant to be http
//! writes to stdout, a near-table meant for a shared store is never built. The rules are checked
//! before any other, so the refusal names the setting the user typed first.

use super::{ConfigError, DeadLetterKind, RawConfig, RawDeadLetter, SinkKind, StoreKind, Wording};
use crate::pipeline::{InFlightPolicy, StoreErrorPolicy};
use crate::setting::{check_kinds, name_of, Section};
use crate::wording::{FlagOrigins, Named};

/// Refuses the first setting given that the other settings leave unused.
///
/// # Errors
///
/// [`ConfigError::Unused`] naming the setting and what it needs.
pub(super) fn check(raw: &RawConfig) -> Result<(), ConfigError> {
    let sink = raw.sink.kind.unwrap_or_default();
    let store = raw.store.kind.unwrap_or(StoreKind::Memory);
    let (t, d) = (&raw.store, &raw.dedupe);
    let kind_of = |key: &str| match key {
        "sink.kind" => sink.name(),
        "store.kind" => store.name(),
        "dedupe.on_in_flight" => name_of(
            &InFlightPolicy::NAMES,
            d.on_in_flight.unwrap_or(InFlightPolicy::Requeue),
        ),
        "dedupe.on_store_error" => name_of(
            &StoreErrorPolicy::NAMES,
            d.on_store_error.unwrap_or(StoreErrorPolicy::Requeue),
        ),
        "dead_letter.kind" => raw
            .dead_letter
            .as_ref()
            .map_or("", |dl| dl.kind_or_nsq().name()),
        other => unreachable!("no setting's kind is decided by `{other}`"),
    };
    check_kinds(&raw.sink, kind_of)?;
    check_kinds(&raw.store, kind_of)?;
    needs(
        &[
            ("store.snapshot_interval", t.snapshot_interval.is_some()),
            (
                "store.table_file_on_mismatch",
                t.table_file_on_mismatch.is_some(),
            ),
            ("store.journal_fsync", t.journal_fsync.is_some()),
        ],
        t.table_file.is_some(),
        Wording::default().key("store.table_file"),
    )?;
    needs(
        &[("store.max_memory", t.max_memory.is_some())],
        t.probability.is_some() && t.rate.is_none() && t.buckets.is_none() && t.memory.is_none(),
        Wording::default()
            .key("store.probability")
            .text(" without ")
            .key("store.rate"),
    )?;
    check_kinds(&raw.dedupe, kind_of)?;
    needs(
        &[(
            "source.lookupd_poll_interval",
            raw.source.lookupd_poll_interval.is_some(),
        )],
        raw.source
            .lookupd_http_addresses
            .as_ref()
            .is_some_and(|a| !a.is_empty()),
        Wording::default().key("source.lookupd_http_addresses"),
    )?;
    let dead_letter = raw.dead_letter.as_ref().map(|dl| dl.kind_or_nsq());
    let producers = sink == SinkKind::Nsq || dead_letter == Some(DeadLetterKind::Nsq);
    needs(
        &raw.producer_opt.given_keys(super::nsq_opts::Side::Producer),
        producers,
        Wording::from("an nsq producer, ")
            .set("sink.kind", "\"nsq\"")
            .text(" or ")
            .key("dead_letter.topic"),
    )?;
    if let Some(dl) = &raw.dead_letter {
        check_kinds(dl, kind_of).map_err(|error| dead_letter_flag_instead(error, &raw.flags))?;
    }
    Ok(())
}

/// A dead-letter setting refused because a flag chose the other kind (the address of a topic
/// with `--dead-letter-file`) needs the flag of its own kind instead, which no file key sets:
/// names that flag, and the one to give it in place of.
fn dead_letter_flag_instead(error: ConfigError, flags: &FlagOrigins) -> ConfigError {
    let ConfigError::Unused { key, .. } = error else {
        return error;
    };
    let settings = RawDeadLetter::SETTINGS;
    let chosen = settings
        .iter()
        .find(|setting| setting.sets.is_some() && flags.flag_for(setting.key).is_some());
    let kinds = settings
        .iter()
        .find(|setting| setting.key == key)
        .and_then(|setting| setting.only)
        .map_or(&[][..], |only| only.kinds);
    let wanted = settings.iter().find_map(|setting| {
        let (_, kind) = setting.sets?;
        kinds
            .contains(&kind)
            .then_some((setting.name, setting.flag?))
    });
    match (chosen, wanted) {
        (Some(chosen), Some((name, wanted))) => ConfigError::Unused {
            key,
            needs: Wording::from(format!("a dead-letter {name} ("))
                .setting(Named::flag(wanted))
                .text(")"),
            instead: Some(
                Wording::from("use ")
                    .setting(Named::flag(wanted))
                    .text(" instead of ")
                    .key(chosen.key),
            ),
        },
        _ => error,
    }
}

/// Refuses the first of `settings` given when what they need, `needed`, is not set.
fn needs(
    settings: &[(&'static str, bool)],
    used: bool,
    needed: Wording,
) -> Result<(), ConfigError> {
    match settings.iter().find(|(_, given)| *given) {
        Some(&(key, _)) if !used => Err(ConfigError::Unused {
            key,
            needs: needed,
            instead: None,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Settings;

    const SOURCE: &str = "[source]\ntopic = \"t\"\nnsqd_tcp_addresses = [\"127.0.0.1:4150\"]\n";

    fn refused(text: &str) -> String {
        Settings::from_toml(&format!("{SOURCE}{text}"))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_setting_that_would_do_nothing_names_what_it_needs() {
        assert_eq!(
            refused("[sink]\npost = \"http://127.0.0.1/\"\n"),
            "`sink.post` is used only with `sink.kind = \"http\"`: remove it, or set that too"
        );
        assert_eq!(
            refused("[store]\nkind = \"none\"\nbuckets = 1024\n"),
            "`store.buckets` is used only with a table, `store.kind = \"memory\"`, \
             `store.kind = \"memcached\"` or `store.kind = \"redis\"`: remove it, or set that too"
        );
        assert_eq!(
            refused("[producer_opt]\nsnappy = true\n"),
            "`producer_opt.snappy` is used only with an nsq producer, `sink.kind = \"nsq\"` or \
             `dead_letter.topic`: remove it, or set that too"
        );
        assert_eq!(
            refused("[dedupe]\non_in_flight = \"finish\"\nin_flight_requeue_delay = \"2s\"\n"),
            "`dedupe.in_flight_requeue_delay` is used only with `dedupe.on_in_flight = \
             \"requeue\"`: remove it, or set that too"
        );
        // Used: no refusal.
        Settings::from_toml(&format!(
            "{SOURCE}[sink]\nkind = \"http\"\npost = \"http://127.0.0.1/\"\n"
        ))
        .unwrap();
    }
}
