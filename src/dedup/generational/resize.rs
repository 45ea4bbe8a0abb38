//! Writing a new shape into a table's descriptor: [`resize`] and [`resize_if`], as
//! `nsq-dedupe resize` does, one consumer's growth, a compare-and-set that only the shape it
//! decided on lets through, and a consumer's note that the previous shape is no longer read.

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
/// descriptor gets one naming `geometry`, with a table of an earlier layout found there,
/// [`Generation::earlier_table`], as its previous shape). A table already of that shape is
/// left as it is. A previous shape the descriptor held is dropped: [`resize_if`] lets the
/// caller refuse while it is still read.
///
/// # Errors
///
/// [`StoreError`] when the store does not answer, its descriptor cannot be read, or other
/// writers kept changing it.
pub async fn resize<S: Generation>(store: &S, geometry: Geometry) -> Result<Resized, StoreError> {
    let admitted = resize_if(store, geometry, |_, _| {
        Ok::<(), std::convert::Infallible>(())
    });
    admitted.await.map(|resized| match resized {
        Ok(resized) => resized,
        Err(never) => match never {},
    })
}

/// [`resize`], if `admit` lets it through: `admit` is shown the descriptor the store holds
/// (`None`: none) and the one that would replace it, each time the compare-and-set is tried,
/// and its error stops the resize with nothing written. A table already of the shape given is
/// left as it is without asking.
///
/// # Errors
///
/// [`StoreError`] when the store does not answer, its descriptor cannot be read, or other
/// writers kept changing it; `Ok(Err(_))` with `admit`'s error.
pub async fn resize_if<S, E, F>(
    store: &S,
    geometry: Geometry,
    mut admit: F,
) -> Result<Result<Resized, E>, StoreError>
where
    S: Generation,
    F: FnMut(Option<&Descriptor>, &Descriptor) -> Result<(), E>,
{
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
                return Ok(Ok(Resized {
                    before: Some(before),
                    after: before,
                }))
            }
            Some(before) => Descriptor {
                current: target,
                previous: Some((before.current, now_ms())),
            },
            None => Descriptor {
                current: target,
                previous: store
                    .earlier_table()
                    .await?
                    .filter(|&earlier| earlier != target)
                    .map(|earlier| (earlier, now_ms())),
            },
        };
        if let Err(refused) = admit(before.as_ref(), &after) {
            return Ok(Err(refused));
        }
        let encoded = after.encode();
        let held = store
            .descriptor(Some((text.as_deref(), encoded.as_str())))
            .await?;
        if held == text {
            return Ok(Ok(Resized { before, after }));
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

/// Drops the previous shape from the descriptor `text` (`descriptor`, as read) once this
/// consumer no longer reads it (see [`Generations::follow`](super::Generations::follow)),
/// with a compare-and-set: a descriptor changed meanwhile is left to its writer. By then the
/// previous shape no longer counts for any consumer (`max_age` has passed since the switch,
/// or this consumer alone made as many new entries as the table has slots, and the fleet at
/// least as many), so the others stop reading it at their next follow, and `nsq-dedupe
/// resize` can tell that a new size forgets nothing.
pub(super) async fn forget_previous<S: Generation>(store: &S, text: &str, descriptor: Descriptor) {
    let after = Descriptor {
        previous: None,
        ..descriptor
    }
    .encode();
    if let Err(error) = store.descriptor(Some((Some(text), after.as_str()))).await {
        // The next follow tries again.
        tracing::debug!(%error, "Writing that the previous table is no longer read failed.");
    }
}
