//! Writing a new shape into a table's descriptor: [`resize`], as `nsq-dedupe resize` does, and
//! one consumer's growth, a compare-and-set that only the shape it decided on lets through.

use super::{Descriptor, Generation, Shape};
use crate::dedup::shared::now_ms;
use crate::dedup::Geometry;
use crate::error::StoreError;

/// The outcome of [`resize`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resized {
    /// The descriptor before (`None`: the store had none).
    pub before: Option<Descriptor>,
    /// The descriptor written (equal to `before` when the table had the size already).
    pub after: Descriptor,
}

/// Sets the table of `store`'s namespace to `geometry`: replaces the descriptor with a
/// compare-and-set, the current shape becoming the previous one (a store without a
/// descriptor gets one naming `geometry` alone). A table already of that shape is left as it
/// is.
///
/// # Errors
///
/// [`StoreError`] when the store does not answer, its descriptor cannot be read, or other
/// writers kept changing it.
pub async fn resize<S: Generation>(store: &S, geometry: Geometry) -> Result<Resized, StoreError> {
    let key = store.descriptor_key();
    let target = Shape {
        format: store.format(),
        geometry,
    };
    const ATTEMPTS: u32 = 8;
    for _ in 0..ATTEMPTS {
        let text = store.descriptor(None).await?;
        let before = text
            .as_deref()
            .map(|text| Descriptor::parse(&key, text))
            .transpose()?;
        let after = match before {
            Some(before) if before.current == target => {
                return Ok(Resized {
                    before: Some(before),
                    after: before,
                })
            }
            Some(before) => Descriptor {
                current: target,
                previous: Some((before.current, now_ms())),
            },
            None => Descriptor {
                current: target,
                previous: None,
            },
        };
        let encoded = after.encode();
        let held = store
            .descriptor(Some((text.as_deref(), encoded.as_str())))
            .await?;
        if held == text {
            return Ok(Resized { before, after });
        }
    }
    Err(StoreError::Contended { attempts: ATTEMPTS })
}

/// Grows the table of `store`'s namespace from `from` to `to` if no one changed it since
/// this consumer decided: one compare-and-set of the descriptor, whose current shape must
/// still be `from` (see [`Generations::grow`](super::Generations::grow)). Answers whether this write made the change.
///
/// # Errors
///
/// [`StoreError`] when the store does not answer or its descriptor cannot be read.
pub(super) async fn grow_once<S: Generation>(
    store: &S,
    from: Shape,
    to: Geometry,
) -> Result<bool, StoreError> {
    let key = store.descriptor_key();
    let Some(text) = store.descriptor(None).await? else {
        // A descriptor deleted under a running fleet: the next follow writes it again.
        return Ok(false);
    };
    let before = Descriptor::parse(&key, &text)?;
    if before.current != from {
        return Ok(false);
    }
    let after = Descriptor {
        current: Shape {
            format: from.format,
            geometry: to,
        },
        previous: Some((from, now_ms())),
    }
    .encode();
    let held = store
        .descriptor(Some((Some(text.as_str()), after.as_str())))
        .await?;
    Ok(held.as_deref() == Some(text.as_str()))
}
