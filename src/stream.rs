//! De-duplicating a plain stream of records, outside NSQ: [`filter_stream`].
//!
//! This is the library's smallest pipeline: no acknowledgements, no sink, no network. It
//! needs no feature, so a program that links only the table gets it.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};

use crate::dedup::digest::Keyer;
use crate::dedup::{Claim, Store};

/// Filters a stream of records: yields each record whose key was not seen before, drops the
/// copies. Keyless records, and records met while the store fails, are yielded (nothing is
/// lost; a store error may let a copy through). A record whose key another consumer of a
/// shared store is handling right now (`InFlight`) counts as a copy.
///
/// Claims are committed at once: a plain stream has no acknowledgement to wait for.
///
/// # Example
///
/// ```
/// use bytes::Bytes;
/// use futures::StreamExt;
/// use nsq_dedupe::{filter_stream, Keyer, Table};
///
/// # tokio_test_block_on(async {
/// let table = std::sync::Arc::new(Table::with_slots(1024, 8).unwrap());
/// let records = futures::stream::iter(["a", "b", "a", "c", "b"].map(Bytes::from));
/// let unique: Vec<Bytes> = filter_stream(table, Keyer::new("body".parse().unwrap(), Default::default()), records)
///     .collect()
///     .await;
/// assert_eq!(unique, ["a", "b", "c"].map(Bytes::from));
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
pub fn filter_stream<S, R>(store: Arc<S>, keyer: Keyer, records: R) -> impl Stream<Item = Bytes>
where
    S: Store + 'static,
    R: Stream<Item = Bytes>,
{
    let keyer = Arc::new(keyer);
    records.filter_map(move |record| {
        let store = store.clone();
        let keyer = keyer.clone();
        async move {
            let Ok(digest) = keyer.digest(&record) else {
                return Some(record);
            };
            match store.claim(digest).await {
                Ok(Claim::New) => {
                    let _ = store.commit(digest).await;
                    Some(record)
                }
                Ok(Claim::Duplicate | Claim::InFlight) => None,
                Err(_) => Some(record),
            }
        }
    })
}
