//! What a consumer says, once, when it follows a store's table other than the one it was
//! given: an earlier layout (WARN, naming `nsq-dedupe resize`, which moves it); another size
//! given (WARN: both sizes, that the data is intact, and the size to give); a resize from the
//! size given (INFO: following a resize is what it is for; and the size to give before the next
//! start); or no size given, its table sizing itself (INFO).

use super::{Descriptor, Shape};

/// Says that this consumer, `given` a shape (or sizing itself), follows the store's table as
/// `descriptor` (the store's, at the key `key`) names it.
pub(super) fn following(key: &str, given: Shape, descriptor: &Descriptor, sizes_itself: bool) {
    let current = descriptor.current;
    if current.format != given.format {
        let (buckets, ways) = (current.geometry.slots(), current.geometry.ways());
        // The descriptor's key is `<namespace>:<DESCRIPTOR_SUFFIX>`.
        let namespace = key
            .strip_suffix(super::DESCRIPTOR_SUFFIX)
            .and_then(|key| key.strip_suffix(':'))
            .unwrap_or(key);
        tracing::warn!(
            descriptor = %key,
            store_format = current.format,
            given_format = given.format,
            store_buckets = buckets,
            "The store's table has an earlier layout (key format {}): following it. Once every \
             consumer of the table runs this version, `nsq-dedupe resize --namespace \
             {namespace} --buckets {buckets} --ways {ways}` (with the store's flags) moves it to key format {} without forgetting; a consumer \
             of an earlier version still running after that works on the earlier keys alone, \
             and copies can pass between it and the others.",
            current.format,
            given.format,
        );
        return;
    }
    let (given, store) = (given.geometry.slots(), current.geometry.slots());
    if sizes_itself {
        tracing::info!(descriptor = %key, store_buckets = store, "The table sizes itself and follows the store's table of {store} buckets.");
        return;
    }
    let resized =
        matches!(descriptor.previous, Some((previous, _)) if previous.geometry.slots() == given);
    if resized {
        // A resize, most likely the operator's own: following it is the point of one.
        tracing::info!(
            descriptor = %key,
            given_buckets = given,
            store_buckets = store,
            "The store's table was resized from {given} to {store} buckets: following it. Give \
             this consumer the new size ({store} buckets), or no size (a probability and a \
             window without a rate: a table that sizes itself), before it next starts."
        );
        return;
    }
    tracing::warn!(
        descriptor = %key,
        given_buckets = given,
        store_buckets = store,
        "The store's table has {store} buckets, not the {given} given here: following the \
         store's table, whose data is intact. Give this consumer the store's size ({store} \
         buckets), or no size (a probability and a window without a rate: a table that sizes \
         itself); `nsq-dedupe resize` changes the store's size."
    );
}
