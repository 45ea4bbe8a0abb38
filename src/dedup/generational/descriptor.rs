//! The descriptor of a shared table, `<prefix>:table`: the current shape, and the previous one
//! with when the switch happened, as the store holds them (see the parent module).

use crate::dedup::Geometry;
use crate::error::StoreError;

/// A table's shape in the store: its key format and geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// The key format's version.
    pub format: u8,
    /// The geometry.
    pub geometry: Geometry,
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}x{}",
            self.format,
            self.geometry.sets(),
            self.geometry.ways()
        )
    }
}

impl Shape {
    fn parse(text: &str) -> Option<Shape> {
        let (format, geometry) = text.split_once(':')?;
        let (sets, ways) = geometry.split_once('x')?;
        let (sets, ways): (u64, u32) = (sets.parse().ok()?, ways.parse().ok()?);
        let geometry = Geometry::new(sets.checked_mul(u64::from(ways))?, ways).ok()?;
        (geometry.sets() == sets).then_some(Shape {
            format: format.parse().ok()?,
            geometry,
        })
    }
}

/// The descriptor key's value: `v1 current=<format>:<sets>x<ways>`, then, after a resize,
/// ` previous=<format>:<sets>x<ways> since=<Unix ms of the switch>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    /// The shape claims write to.
    pub current: Shape,
    /// The shape before the last resize, and when the switch happened (Unix ms).
    pub previous: Option<(Shape, u64)>,
}

impl Descriptor {
    /// The value as stored.
    pub fn encode(&self) -> String {
        match self.previous {
            None => format!("v1 current={}", self.current),
            Some((shape, since)) => {
                format!("v1 current={} previous={shape} since={since}", self.current)
            }
        }
    }

    /// Reads a stored value.
    ///
    /// # Errors
    ///
    /// A [`StoreError::Protocol`] naming `key` when it holds something else.
    pub fn parse(key: &str, text: &str) -> Result<Descriptor, StoreError> {
        let mut words = text.split(' ');
        let mut current = None;
        let mut previous = None;
        let mut since = None;
        let ok = words.next() == Some("v1")
            && words.all(|word| match word.split_once('=') {
                Some(("current", shape)) => {
                    current = Shape::parse(shape);
                    current.is_some()
                }
                Some(("previous", shape)) => {
                    previous = Shape::parse(shape);
                    previous.is_some()
                }
                Some(("since", ms)) => {
                    since = ms.parse::<u64>().ok();
                    since.is_some()
                }
                _ => false,
            });
        match (ok, current, previous, since) {
            (true, Some(current), None, None) => Ok(Descriptor {
                current,
                previous: None,
            }),
            (true, Some(current), Some(previous), Some(since)) => Ok(Descriptor {
                current,
                previous: Some((previous, since)),
            }),
            _ => Err(StoreError::Protocol(format!(
                "the table's descriptor `{key}` holds {text:?}, which is not a descriptor \
                 (`v1 current=<format>:<sets>x<ways>[ previous=... since=<ms>]`); delete it \
                 to start a table at the size given"
            ))),
        }
    }
}
