//! What `nsq-dedupe resize` refuses: settings it cannot use, and a resize that would forget
//! (the table's previous size still read), create a table no one asked for (a namespace
//! without one), or change a table's ways unasked. Each refusal is a setting to change
//! (exit 78), and names the flag that overrides it where one does.

use std::time::{Duration, UNIX_EPOCH};

use crate::dedup::generational::{Descriptor, Shape};
use crate::units::format_duration;

/// When a resize is let through (see [`Rules::admit`]).
pub(super) struct Rules {
    /// Whether `--ways` was given: without it, the table's ways are kept.
    pub(super) ways_given: bool,
    /// `--force`: resize even while the previous size is still read.
    pub(super) force: bool,
    /// `--create`: write a table where the namespace has none.
    pub(super) create: bool,
    /// `store.rate`, to tell when the previous size stops being read without `max_age`.
    pub(super) rate: Option<f64>,
}

impl Rules {
    /// Lets the descriptor `before` (`None`: the store has none) be replaced by `after`, or
    /// says why not; `max_age` is the consumers' (as the settings give it), `now_ms` the time.
    pub(super) fn admit(
        &self,
        before: Option<&Descriptor>,
        after: &Descriptor,
        max_age: Option<Duration>,
        now_ms: u64,
    ) -> Result<(), Refused> {
        let Some(before) = before else {
            return match (after.previous, self.create) {
                (None, false) => Err(Refused::NoTable),
                _ => Ok(()),
            };
        };
        let (table, given) = (
            before.current.geometry.ways(),
            after.current.geometry.ways(),
        );
        if !self.ways_given && table != given {
            return Err(Refused::OtherWays {
                table,
                default: given,
            });
        }
        match forgets(before, after, max_age, now_ms) {
            Some(previous) if !self.force => Err(Refused::StillRead(Oldest {
                previous,
                current: before.current,
                max_age,
                rate: self.rate,
                now_ms,
            })),
            _ => Ok(()),
        }
    }
}

/// The previous shape of `before`, and the switch from it, that replacing `before` by
/// `after` forgets: one still read (a consumer drops it from the descriptor once it no
/// longer counts, so one that is named counts, unless `max_age`, when known, has passed since
/// the switch), and not the shape `after` makes current again.
pub(super) fn forgets(
    before: &Descriptor,
    after: &Descriptor,
    max_age: Option<Duration>,
    now_ms: u64,
) -> Option<(Shape, u64)> {
    before.previous.filter(|&(shape, since)| {
        shape != after.current
            && max_age.is_none_or(|age| now_ms < since.saturating_add(millis(age)))
    })
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The previous shape of a descriptor, still read, and what tells when it stops being read.
#[derive(Debug)]
pub(crate) struct Oldest {
    /// The previous shape, and the switch from it (Unix ms).
    pub(super) previous: (Shape, u64),
    /// The current shape.
    pub(super) current: Shape,
    /// The consumers' `max_age`, if the settings give it.
    pub(super) max_age: Option<Duration>,
    /// The fleet's rate, if given.
    pub(super) rate: Option<f64>,
    /// Now (Unix ms).
    pub(super) now_ms: u64,
}

impl Oldest {
    /// The previous size's buckets.
    pub(super) fn buckets(&self) -> u64 {
        self.previous.0.geometry.slots()
    }

    /// When the resize to the current size happened, and how long ago.
    pub(super) fn since(&self) -> String {
        let since = self.previous.1;
        format!(
            "{} ago ({})",
            format_duration(Duration::from_millis(self.now_ms.saturating_sub(since))),
            date(since)
        )
    }

    /// Until when the consumers read it: a time when `max_age` is known, else the entries
    /// each consumer makes before it stops, and with the rate, the earliest time that may be.
    pub(super) fn until(&self) -> String {
        let since = self.previous.1;
        let in_ = |at: u64| {
            let left = Duration::from_millis(at.saturating_sub(self.now_ms));
            format!("{} (in {})", date(at), format_duration(left))
        };
        if let Some(age) = self.max_age {
            return format!(
                "until `max_age` ({}) has passed since, at {}",
                format_duration(age),
                in_(since.saturating_add(millis(age)))
            );
        }
        let slots = self.current.geometry.slots();
        let mut until = format!(
            "until one of them has made {slots} new entries in the {slots}-bucket table (as \
             many as it has slots; its status line counts them down as `previous_inserts_left`), \
             or `max_age` has passed since, if they set one"
        );
        let earliest = self
            .rate
            .map(|rate| since.saturating_add((slots as f64 / rate * 1000.0) as u64))
            .filter(|&at| at > self.now_ms);
        match (self.rate, earliest) {
            (Some(rate), Some(at)) => until.push_str(&format!(
                ": at {rate} distinct messages a second, not before {}",
                in_(at)
            )),
            (Some(_), None) => {}
            (None, _) => until.push_str(
                "; `resize` cannot tell when without their rate (`--rate`) or their `max_age` \
                 (`--config` with their file)",
            ),
        }
        until
    }
}

/// A Unix time in ms as an HTTP date, in UTC: `Sun, 29 Nov 2026 19:50:01 GMT`.
fn date(ms: u64) -> String {
    httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_millis(ms))
}

/// A resize the store's table refuses (see [`Rules::admit`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refused {
    /// `--ways` was not given, and the table has other ways than the default.
    #[error(
        "the table has {table} ways, and `resize` without `--ways` would give it {default}: pass \
         `--ways {table}` to keep them (or `--ways {default}` to change them)"
    )]
    OtherWays {
        /// The table's.
        table: u32,
        /// The default's.
        default: u32,
    },
    /// The table's previous size is still read: a new size would forget it.
    #[error(
        "the table was resized {since} from {from} to {to} buckets, and its consumers still \
         read the {from}-bucket table {until}. A resize now would stop that: copies of the \
         messages remembered only in the {from}-bucket table would pass as new. Resize after \
         that, or pass `--force` to resize now (those copies slip through; nothing is lost)",
        since = .0.since(),
        from = .0.buckets(),
        to = .0.current.geometry.slots(),
        until = .0.until(),
    )]
    StillRead(Oldest),
    /// The namespace has no table: likely mistyped.
    #[error(
        "the store holds no table in this namespace (no descriptor), and `resize` would start \
         one that no sidecar uses if the namespace is mistyped: pass the sidecars' own, their \
         `--namespace` (by default `nsq-dedupe.<topic>.<channel>` of their stream), or \
         `--config` with their config file; to create the table before the fleet starts, \
         pass `--create`"
    )]
    NoTable,
}

/// `resize` was given a store without a shared table.
#[derive(Debug, thiserror::Error)]
#[error(
    "`resize` changes the size of a table shared through Redis or Memcached, and the store \
     given is {0:?}: pass `--store redis` with `--redis-url`, or `--store memcached` with \
     `--memcached-address` (or set `store.kind` in the config file); an in-process table \
     takes its size from `--buckets` at start"
)]
pub(crate) struct NotShared(pub(super) &'static str);

/// `resize` was given no size: it would write the default size into every consumer's table.
#[derive(Debug, thiserror::Error)]
#[error(
    "`resize` sets the size of the table every consumer shares, and none was given: pass \
     `--buckets N`, `--memory SIZE` or `--rate R` (or set `store.buckets`, `store.memory` or \
     `store.rate` in the config file). The size the table has now, given again, moves it to \
     this version's layout without resizing it (a consumer following a table of an earlier \
     layout names it in its WARN)"
)]
pub(crate) struct NoSize;

/// `resize` was given neither the table's namespace nor its consumers' stream: each stream's
/// consumers keep their own table by default, and `resize` cannot tell which is meant.
#[derive(Debug, thiserror::Error)]
#[error(
    "`resize` needs to know whose table to resize, and neither `--namespace` nor `--config` \
     naming a topic was given: pass the sidecars' `--namespace`, or `--config` with the \
     sidecars' config file \
     (its `[source]` topic and channel name their table when it sets no `store.namespace`: \
     `nsq-dedupe.<topic>.<channel>`)"
)]
pub(crate) struct NoNamespace;

/// `resize` was given a flag that only a running consumer uses.
#[derive(Debug, thiserror::Error)]
#[error(
    "`{0}` is used only by a running consumer (`run`), and `resize` does not use it: remove \
     it (a `[store]` key of the sidecars' config file given with `--config` is left unused)"
)]
pub(crate) struct RunOnly(pub(super) &'static str);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dedup::Geometry;

    fn shape(buckets: u64) -> Shape {
        Shape {
            format: 3,
            geometry: Geometry::new(buckets, 8).unwrap(),
        }
    }

    const SINCE: u64 = 1_795_982_000_000;

    #[test]
    fn with_the_rate_the_earliest_time_the_previous_size_retires_is_said() {
        let oldest = Oldest {
            previous: (shape(262_144), SINCE),
            current: shape(1_048_576),
            max_age: None,
            rate: Some(1000.0),
            now_ms: SINCE + 60_000,
        };
        assert_eq!(oldest.since(), "1m ago (Sun, 29 Nov 2026 19:53:20 GMT)");
        assert!(
            oldest.until().ends_with(
                ": at 1000 distinct messages a second, not before Sun, 29 Nov 2026 20:10:48 GMT \
                 (in 16m28s)"
            ),
            "{}",
            oldest.until()
        );
        // Past that time, no estimate: a consumer has not said it stopped reading it.
        let later = Oldest {
            now_ms: SINCE + 3_600_000,
            ..oldest
        };
        assert!(
            later.until().ends_with("if they set one"),
            "{}",
            later.until()
        );
    }

    #[test]
    fn only_a_previous_size_still_read_and_not_made_current_again_is_forgotten() {
        let before = Descriptor {
            current: shape(1_048_576),
            previous: Some((shape(262_144), SINCE)),
        };
        let to = |buckets| Descriptor {
            current: shape(buckets),
            previous: Some((before.current, SINCE + 1)),
        };
        let now = SINCE + 1_000;
        assert_eq!(forgets(&before, &to(524_288), None, now), before.previous);
        assert_eq!(forgets(&before, &to(262_144), None, now), None, "back");
        let age = Some(Duration::from_secs(1));
        assert_eq!(forgets(&before, &to(524_288), age, now), None, "aged");
        assert_eq!(
            forgets(&before, &to(524_288), age, now - 1),
            before.previous
        );
    }
}
