//! What `nsq-dedupe resize` prints: the size before and after, how it came to the size, and
//! what the resize costs: a table shrunk catches fewer copies, and a resize forced while the
//! previous size was still read forgets that table.

use std::time::Duration;

use super::rules::{forgets, Oldest, Rules};
use super::{Outcome, Rate, Sizing};
use crate::cmd::format_probability;
use crate::dedup::generational::{Descriptor, Shape};
use crate::units::format_duration;

/// What a resize of one namespace is reported with.
pub(super) struct Report<'a> {
    /// The namespace.
    pub(super) namespace: &'a str,
    /// How the size was come to.
    pub(super) sizing: Sizing,
    /// The fleet's rate, if given.
    pub(super) rate: Rate,
    /// The window the catch probability is given for.
    pub(super) window: Duration,
}

impl Report<'_> {
    /// The lines `resize` prints.
    pub(super) fn text(&self, outcome: &Outcome, rules: &Rules) -> String {
        let (before, after) = (outcome.resized.before, outcome.resized.after);
        let mut text = self.changed(before, after);
        if before == Some(after) {
            return text;
        }
        text.push_str(&self.sized(after.current));
        if let Some(before) = before {
            text.push_str(&self.shrunk(before.current, after.current));
            // Let through while it was still read: `--force` was given.
            if let Some(previous) = forgets(&before, &after, outcome.max_age, outcome.now_ms) {
                let oldest = Oldest {
                    previous,
                    current: before.current,
                    max_age: outcome.max_age,
                    rate: rules.rate,
                    now_ms: outcome.now_ms,
                };
                text.push_str(&format!(
                    "Forgotten (`--force`): the {}-bucket table, from before the resize {}, \
                     which its consumers read {}. Copies of the messages remembered only there \
                     pass as new; nothing is lost.\n",
                    oldest.buckets(),
                    oldest.since(),
                    oldest.until()
                ));
            }
        }
        text
    }

    /// The size before and after.
    fn changed(&self, before: Option<Descriptor>, after: Descriptor) -> String {
        let namespace = self.namespace;
        // The layout is named where it changed (a store's key format: see docs/design.md).
        let relaid = before.is_some_and(|before| before.current.format != after.current.format);
        let size = |shape: Shape| {
            let geometry = shape.geometry;
            let layout = if relaid {
                format!(", key format {}", shape.format)
            } else {
                String::new()
            };
            format!(
                "{} buckets ({} sets of {} ways{layout})",
                geometry.slots(),
                geometry.sets(),
                geometry.ways()
            )
        };
        match (before, after.previous) {
            (Some(before), _) if before == after => format!(
                "The table of namespace {namespace:?} is already {}: nothing changed.\n",
                size(after.current)
            ),
            (Some(before), _) => format!(
                "The table of namespace {namespace:?} is now {}; it was {}, which claims read \
                 until it has turned over (or `max_age` has passed). Running consumers follow \
                 within one fleet interval.\n",
                size(after.current),
                size(before.current)
            ),
            (None, Some((earlier, _))) => format!(
                "The table of namespace {namespace:?} had no descriptor: it is now {}; its \
                 table of an earlier layout, {}, is read until it has turned over (or \
                 `max_age` has passed).\n",
                size(after.current),
                size(earlier)
            ),
            (None, None) => format!(
                "The store held no table in namespace {namespace:?}: it now has one of {} \
                 (`--create`), which the fleet takes when it starts.\n",
                size(after.current)
            ),
        }
    }

    /// How the size was come to.
    fn sized(&self, shape: Shape) -> String {
        let buckets = shape.geometry.slots();
        match self.sizing {
            Sizing::Buckets(by, given) if given == buckets => {
                format!("Size: {buckets} buckets, as `{by}` gave it.\n")
            }
            Sizing::Buckets(by, given) => format!(
                "Size: {buckets} buckets: `{by}` gave {given}, rounded to whole sets of {} ways.\n",
                shape.geometry.ways()
            ),
            Sizing::Rate {
                probability: (probability, by_probability),
                window: (window, by_window),
            } => {
                let (rate, by_rate) = self.rate.unwrap_or((0.0, "store.rate"));
                let given = |by: Option<&str>, what: &str| match by {
                    Some(by) => format!("`{by}`"),
                    None => format!("the default {what}"),
                };
                format!(
                    "Size: {buckets} buckets, for a catch probability of {probability} ({}) \
                     of a copy up to {} late ({}) at {rate} distinct messages a second \
                     (`{by_rate}`).\n",
                    given(by_probability, "target"),
                    format_duration(window),
                    given(by_window, "window"),
                )
            }
        }
    }

    /// What shrinking the table costs, if it shrinks.
    fn shrunk(&self, before: Shape, after: Shape) -> String {
        let (from, to) = (before.geometry.slots(), after.geometry.slots());
        if to >= from {
            return String::new();
        }
        let mut text = format!(
            "This shrinks the table, from {from} to {to} buckets: it remembers fewer messages, \
             so fewer copies are caught"
        );
        match self.rate {
            Some((rate, by)) => {
                let messages = rate * self.window.as_secs_f64();
                let caught = |shape: Shape| {
                    format_probability(crate::sizing::catch_probability(shape.geometry, messages))
                };
                text.push_str(&format!(
                    ": at {rate} distinct messages a second (`{by}`), a copy {} late is caught \
                     with probability {}, where the {from}-bucket table caught it with {}.\n",
                    format_duration(self.window),
                    caught(after),
                    caught(before)
                ));
            }
            None => text.push_str(" (`--rate` with the fleet's rate says how many fewer).\n"),
        }
        text
    }
}
