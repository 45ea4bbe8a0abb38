//! Generations of a shared store's table: a fleet resizes its table together, without
//! forgetting what the previous size held.
//!
//! A shared store's keys name the table's shape (`<prefix>:v<format>:<sets>x<ways>:<set>`),
//! and an entry cannot move to a table of another shape (its set comes from the digest, and
//! the set count differs). So, as the in-process table does (`table/generations.rs`), a resize
//! starts a new *generation*: the new shape's keys take every new entry, and the previous
//! shape's keys stay behind them, read-only, until they no longer count.
//!
//! - **The descriptor.** A small key in the namespace, `<prefix>:table`, names the current
//!   shape, the previous one if any and when the switch happened ([`Descriptor`]). A store
//!   without one is created at the size given (the descriptor written only if absent; a
//!   table of an earlier layout found there, [`Generation::earlier_table`], becomes its
//!   previous shape); a
//!   consumer given another size follows the descriptor's table and says so once.
//!   `nsq-dedupe resize` replaces it with a compare-and-set, and every consumer reads it again
//!   at each share of the fleet's counters (`store.fleet_interval`), so a fleet follows a
//!   resize within one interval. Until the store has answered one read of the descriptor
//!   (down at start), claims read it first and fail, as in an outage, while it does not
//!   answer: a consumer that does not know the size claims nowhere. A descriptor of another
//!   key format (another version's) is not followed: the consumer keeps the size given and
//!   logs why.
//! - **A claim** goes to the current shape's keys and, while a previous shape counts, looks the
//!   digest up in the previous shape's set in the same round trip (one extra read). Found done
//!   there, it is a duplicate; found in flight, it is in flight; either way the entry the
//!   claim wrote in the current table is erased again, so that it neither hides the
//!   previous entry's outcome nor outlives it. Nothing inserts into the previous shape once
//!   every consumer follows, so its entries change only by their owners' commits and erases.
//! - **Commit, erase and renew** go to the current shape, and those it does not hold (answered
//!   `false`) to the previous one: a message claimed before the switch is committed, or
//!   erased, where its entry is. Each generation has its own owner id, so the other
//!   generation's entry of the same digest is never touched.
//! - **When the previous shape goes.** With `max_age`, once `max_age` has passed since the
//!   switch (every done entry of the previous shape has expired); without it, once this
//!   consumer has made as many new entries in the current shape as it has slots (the fleet
//!   has then made at least as many, and a table of the new size would have turned over).
//!   Each consumer decides for itself, at its fleet interval; a consumer started later counts
//!   from its start, which keeps the previous shape read longer, never shorter. The first
//!   consumer to retire it drops it from the descriptor (a compare-and-set), and the others
//!   follow: a descriptor that names a previous shape is one still read, which is how
//!   `nsq-dedupe resize` refuses a second resize that would forget it.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::dedup::fleet::FleetCounters;
use crate::dedup::shared::now_ms;
use crate::dedup::{Claim, Digest, Geometry, Store};
use crate::error::StoreError;

mod descriptor;
mod notice;
mod resize;

pub use descriptor::{Descriptor, Shape};
use resize::{forget_previous, grow_once};
pub use resize::{resize, resize_if, Resized};

/// The name of the descriptor's key after the namespace's prefix: `<prefix>:table`.
pub(crate) const DESCRIPTOR_SUFFIX: &str = "table";

/// What a shared store offers for generations: its table at another shape on the same
/// servers, a read-only look-up, and its descriptor key.
pub trait Generation: Store + FleetCounters + Clone + Sized + 'static {
    /// The key format's version, part of the namespace (`v<format>`).
    fn format(&self) -> u8;

    /// The table's shape.
    fn table(&self) -> Geometry;

    /// `max_age`, when done entries expire.
    fn max_age(&self) -> Option<Duration>;

    /// Whether this store reads and writes tables of key format `format`: its own, and
    /// earlier layouts that a table moves from (read as a previous generation).
    fn reads_format(&self, format: u8) -> bool {
        format == self.format()
    }

    /// The same servers and settings, for a table of shape `shape` (a key format that
    /// [`reads_format`](Generation::reads_format)), opened without contacting them; its owner
    /// id is its own.
    ///
    /// # Errors
    ///
    /// As the store's lazy constructor.
    fn reshaped(&self, shape: Shape) -> Result<Self, StoreError>;

    /// What a claim of each digest would answer, without writing: [`Claim::New`] for a digest
    /// the table does not hold (or holds expired), else what it holds it as.
    fn look_up_many(
        &self,
        digests: &[Digest],
    ) -> impl Future<Output = Vec<Result<Claim, StoreError>>> + Send;

    /// Claims `digests` in this table (each written done at once with `done`, as
    /// [`Store::claim_done_many`]) and looks each up in `previous`, the table's previous
    /// generation: each digest's claim and what [`look_up_many`](Generation::look_up_many)
    /// answers for it. By default the two run side by side; a store may send both in one
    /// round trip.
    fn claim_looking_up(
        &self,
        previous: &Self,
        digests: &[Digest],
        done: bool,
    ) -> impl Future<Output = LookedUp> + Send {
        async move {
            let claim = async {
                if done {
                    self.claim_done_many(digests).await
                } else {
                    self.claim_many(digests).await
                }
            };
            futures_util::future::join(claim, previous.look_up_many(digests)).await
        }
    }

    /// The shape of a table of an earlier layout that the store holds in this namespace
    /// without a descriptor (written by a version before descriptors), to be read as the
    /// previous generation of the table a first descriptor names; `None` when there is none.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store does not answer.
    fn earlier_table(&self) -> impl Future<Output = Result<Option<Shape>, StoreError>> + Send {
        std::future::ready(Ok(None))
    }

    /// The descriptor key's value, and with `replace = Some((expected, new))` writes `new`
    /// if the key holds `expected` (`None`: nothing), in one atomic step. Answers what the key
    /// held before: the write happened if that is `expected`.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the server does not answer.
    fn descriptor(
        &self,
        replace: Option<(Option<&str>, &str)>,
    ) -> impl Future<Output = Result<Option<String>, StoreError>> + Send;

    /// The descriptor's key, for messages.
    fn descriptor_key(&self) -> String;
}

/// Each digest's claim in the current generation, and what the previous one answers for it
/// (see [`Generation::claim_looking_up`]).
pub type LookedUp = (
    Vec<Result<Claim, StoreError>>,
    Vec<Result<Claim, StoreError>>,
);

/// A shared store whose table follows its descriptor (see the module docs): the generation
/// claims write to, and the previous one while it counts.
///
/// Cloning is cheap and shares the generations.
#[derive(Clone)]
pub struct Generations<S> {
    shared: Arc<Shared<S>>,
}

struct Shared<S> {
    /// The shape this consumer was given.
    given: Shape,
    /// The generations in use; replaced whole when the descriptor changes.
    state: RwLock<Arc<State<S>>>,
    /// Whether this consumer was given no size, its table sizing itself: following the
    /// store's size is then what it is meant to do, not a difference to warn of.
    sizes_itself: bool,
    /// Whether the difference between the size given and the store's was logged.
    warned: AtomicBool,
    /// The switch time of a previous generation this consumer retired: not read again.
    retired_since: AtomicU64,
    /// Whether the store has answered a read of the descriptor. Until it has, the table's
    /// size is not known, and claims fail as in an outage (see [`Generations::follow`]).
    read: AtomicBool,
    /// Whether the last read of the descriptor in the fleet's rounds failed: its WARN is
    /// logged once an outage, and its return once.
    follow_failing: AtomicBool,
}

struct State<S> {
    current: S,
    shape: Shape,
    previous: Option<Previous<S>>,
}

struct Previous<S> {
    store: S,
    shape: Shape,
    since_ms: u64,
    /// New entries this consumer made in the current generation while this one counted.
    new_entries: AtomicU64,
}

impl<S: Generation + std::fmt::Debug> std::fmt::Debug for Generations<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state();
        f.debug_struct("Generations")
            .field("current", &state.current)
            .field("previous", &state.previous.as_ref().map(|p| p.shape))
            .finish()
    }
}

impl<S: Generation> Generations<S> {
    /// A table of one generation, `store`'s; [`Generations::follow`] reads the descriptor.
    pub fn new(store: S) -> Self {
        Self::given(store, false)
    }

    /// A table of one generation, `store`'s, that sizes itself (no size was given): the
    /// store's size, when it has another, is followed and said once at INFO, not warned of.
    #[cfg(feature = "sidecar")]
    pub(crate) fn sizing_itself(store: S) -> Self {
        Self::given(store, true)
    }

    fn given(store: S, sizes_itself: bool) -> Self {
        let shape = shape_of(&store);
        Generations {
            shared: Arc::new(Shared {
                given: shape,
                sizes_itself,
                state: RwLock::new(Arc::new(State {
                    current: store,
                    shape,
                    previous: None,
                })),
                warned: AtomicBool::new(false),
                retired_since: AtomicU64::new(0),
                read: AtomicBool::new(false),
                follow_failing: AtomicBool::new(false),
            }),
        }
    }

    /// The store of the current generation.
    pub fn current(&self) -> S {
        self.state().current.clone()
    }

    /// The shape of the previous generation while it is read, and when the switch happened.
    pub fn previous(&self) -> Option<(Shape, u64)> {
        self.state()
            .previous
            .as_ref()
            .map(|previous| (previous.shape, previous.since_ms))
    }

    /// Where a resize stands while the previous generation is read, as the in-process
    /// table's generations say it ([`crate::Resizing`]): the new entries this consumer
    /// makes before it retires the previous one, and with `max_age`, the seconds left.
    pub fn resizing(&self) -> Option<crate::Resizing> {
        let state = self.state();
        let previous = state.previous.as_ref()?;
        let since_s = previous.since_ms / 1000;
        Some(crate::Resizing {
            generations: 2,
            previous_slots: previous.shape.geometry.slots(),
            inserts_left: state
                .shape
                .geometry
                .slots()
                .saturating_sub(previous.new_entries.load(Ordering::Relaxed)),
            seconds_left: state.current.max_age().map(|age| {
                since_s
                    .saturating_add(age.as_secs())
                    .saturating_sub(now_ms() / 1000)
            }),
        })
    }

    /// Whether the store has answered a read of the descriptor (see [`Generations::follow`]).
    #[cfg(feature = "sidecar")]
    pub(crate) fn descriptor_read(&self) -> bool {
        self.shared.read.load(Ordering::Relaxed)
    }

    fn state(&self) -> Arc<State<S>> {
        // A poisoned lock still holds a whole state: it is only ever replaced whole.
        match self.shared.state.read() {
            Ok(state) => state.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn replace(&self, state: State<S>) {
        let state = Arc::new(state);
        match self.shared.state.write() {
            Ok(mut held) => *held = state,
            Err(poisoned) => *poisoned.into_inner() = state,
        }
    }

    /// Reads the descriptor (writing it, with the shape in use, where the store has none) and
    /// follows it: the current generation becomes the descriptor's, the previous one is read
    /// while it counts (see the module docs), and once it no longer does, dropped from the
    /// descriptor.
    ///
    /// Until the store has answered a read of the descriptor, claims read it first, and fail
    /// with the store's error while it does not answer: a consumer that does not know the
    /// table's size yet would claim in a table that may not hold what the fleet saw, so its
    /// messages follow `on_store_error` as in an outage, until the store answers. A descriptor
    /// the store answered and this consumer cannot follow (another key format, another value)
    /// leaves the table at the size given, and the error says why.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store does not answer, or its descriptor cannot be read; the
    /// generations in use stay as they were.
    pub async fn follow(&self) -> Result<(), StoreError> {
        let state = self.state();
        let key = state.current.descriptor_key();
        let text = match state.current.descriptor(None).await? {
            Some(text) => text,
            None => {
                // A table that an earlier version kept without a descriptor is read as the
                // previous generation, so that an upgraded fleet forgets nothing.
                let first = Descriptor {
                    current: state.shape,
                    previous: state
                        .current
                        .earlier_table()
                        .await?
                        .map(|shape| (shape, now_ms())),
                }
                .encode();
                match state
                    .current
                    .descriptor(Some((None, first.as_str())))
                    .await?
                {
                    None => first,
                    Some(text) => text,
                }
            }
        };
        self.shared.read.store(true, Ordering::Relaxed);
        let descriptor = Descriptor::parse(&key, &text)?;
        if let Some((shape, since)) = descriptor.previous {
            let ours =
                descriptor.current == state.shape && state.current.reads_format(shape.format);
            if ours && self.retired(&state, since) {
                forget_previous(&state.current, &text, descriptor).await;
            }
        }
        self.apply(&state, descriptor)
    }

    fn apply(&self, state: &State<S>, descriptor: Descriptor) -> Result<(), StoreError> {
        let given = self.shared.given;
        if !state.current.reads_format(descriptor.current.format) {
            return Err(StoreError::Protocol(format!(
                "the table's descriptor `{}` names a table of key format {}, and this version \
                 reads and writes key format {}: upgrade every consumer of the table to one \
                 version",
                state.current.descriptor_key(),
                descriptor.current.format,
                given.format
            )));
        }
        // A previous table of a key format we do not read is not ours to read.
        let descriptor = Descriptor {
            previous: descriptor
                .previous
                .filter(|(shape, _)| state.current.reads_format(shape.format)),
            ..descriptor
        };
        if descriptor.current != given && !self.shared.warned.swap(true, Ordering::Relaxed) {
            notice::following(
                &state.current.descriptor_key(),
                given,
                &descriptor,
                self.shared.sizes_itself,
            );
        }
        let previous = descriptor
            .previous
            .filter(|&(shape, since)| shape != descriptor.current && !self.retired(state, since));
        let same_current = descriptor.current == state.shape;
        let same_previous = previous == state.previous.as_ref().map(|p| (p.shape, p.since_ms));
        if same_current && same_previous {
            return Ok(());
        }
        // Reuse the generations already open (their stores keep their in-flight claims).
        let open = |shape: Shape| -> Result<S, StoreError> {
            if shape == state.shape {
                return Ok(state.current.clone());
            }
            match &state.previous {
                Some(previous) if previous.shape == shape => Ok(previous.store.clone()),
                _ => state.current.reshaped(shape),
            }
        };
        let current = open(descriptor.current)?;
        let previous = match previous {
            None => None,
            Some((shape, since_ms)) => Some(Previous {
                store: open(shape)?,
                shape,
                since_ms,
                new_entries: AtomicU64::new(match &state.previous {
                    Some(p) if p.shape == shape && p.since_ms == since_ms => {
                        p.new_entries.load(Ordering::Relaxed)
                    }
                    _ => 0,
                }),
            }),
        };
        if !same_current {
            tracing::info!(
                descriptor = %state.current.descriptor_key(),
                from_buckets = state.shape.geometry.slots(),
                to_buckets = descriptor.current.geometry.slots(),
                from_format = state.shape.format,
                to_format = descriptor.current.format,
                previous_read = previous.is_some(),
                "Following the store's table to the size and layout its descriptor names."
            );
        } else if previous.is_none() {
            tracing::info!(
                descriptor = %state.current.descriptor_key(),
                "The table's previous size is no longer read."
            );
        }
        self.replace(State {
            current,
            shape: descriptor.current,
            previous,
        });
        Ok(())
    }

    /// Whether the previous generation of the switch at `since` no longer counts.
    fn retired(&self, state: &State<S>, since: u64) -> bool {
        if self.shared.retired_since.load(Ordering::Relaxed) == since {
            return true;
        }
        let aged = state
            .current
            .max_age()
            .is_some_and(|age| now_ms().saturating_sub(since) >= duration_ms(age));
        let turned_over = state.previous.as_ref().is_some_and(|previous| {
            previous.since_ms == since
                && previous.new_entries.load(Ordering::Relaxed) >= state.shape.geometry.slots()
        });
        if aged || turned_over {
            self.shared.retired_since.store(since, Ordering::Relaxed);
        }
        aged || turned_over
    }

    async fn claims(&self, done: bool, digests: &[Digest]) -> Vec<Result<Claim, StoreError>> {
        if !self.shared.read.load(Ordering::Relaxed) {
            if let Err(error) = self.follow().await {
                if !self.shared.read.load(Ordering::Relaxed) {
                    return vec![Err(error); digests.len()];
                }
                tracing::warn!(%error, "The table's descriptor cannot be followed; the table stays at the size given.");
            }
        }
        let state = self.state();
        let Some(previous) = &state.previous else {
            return if done {
                state.current.claim_done_many(digests).await
            } else {
                state.current.claim_many(digests).await
            };
        };
        let (mut claims, seen) = state
            .current
            .claim_looking_up(&previous.store, digests, done)
            .await;
        let mut undo = Vec::new();
        let mut new = 0u64;
        for ((claim, seen), &digest) in claims.iter_mut().zip(seen).zip(digests) {
            if *claim != Ok(Claim::New) {
                continue;
            }
            match seen {
                Ok(Claim::New) => new += 1,
                // Seen before the resize, or not known whether: the new entry goes again.
                found => {
                    *claim = found;
                    undo.push(digest);
                }
            }
        }
        previous.new_entries.fetch_add(new, Ordering::Relaxed);
        if !undo.is_empty() {
            for answer in state.current.erase_many(&undo).await {
                if let Err(error) = answer {
                    // Its lease ends it: until then a copy is in flight, then claimed anew.
                    tracing::debug!(%error, "Erasing a claim the previous table answered failed.");
                }
            }
        }
        claims
    }

    async fn held(&self, op: Held, digests: &[Digest]) -> Vec<Result<bool, StoreError>> {
        let state = self.state();
        let mut answers = op.run(&state.current, digests).await;
        let Some(previous) = &state.previous else {
            return answers;
        };
        let rest: Vec<usize> = (0..digests.len())
            .filter(|&i| answers[i] == Ok(false))
            .collect();
        if rest.is_empty() {
            return answers;
        }
        let again: Vec<Digest> = rest.iter().map(|&i| digests[i]).collect();
        for (&i, answer) in rest.iter().zip(op.run(&previous.store, &again).await) {
            answers[i] = answer;
        }
        answers
    }
}

/// Commit, erase or renew.
#[derive(Clone, Copy)]
enum Held {
    Commit,
    Erase,
    Renew,
}

impl Held {
    async fn run<S: Store>(self, store: &S, digests: &[Digest]) -> Vec<Result<bool, StoreError>> {
        match self {
            Held::Commit => store.commit_many(digests).await,
            Held::Erase => store.erase_many(digests).await,
            Held::Renew => {
                let mut answers = Vec::with_capacity(digests.len());
                for &digest in digests {
                    answers.push(store.renew(digest).await);
                }
                answers
            }
        }
    }
}

fn shape_of<S: Generation>(store: &S) -> Shape {
    Shape {
        format: store.format(),
        geometry: store.table(),
    }
}

fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl<S: Generation> Generations<S> {
    /// Makes this consumer's decision to grow the table to `to` the fleet's: replaces the
    /// descriptor with a compare-and-set (as `nsq-dedupe resize` does) if its current shape
    /// is still the one this consumer claims in, then follows the descriptor, whoever wrote
    /// it. A consumer that lost the race to another's growth (or a resize) follows the
    /// winner and does not grow on top of it: the next decision sees the new size. Answers
    /// whether this consumer's write made the change.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store does not answer or its descriptor cannot be read or
    /// followed; the generations in use stay as they were.
    pub async fn grow(&self, to: Geometry) -> Result<bool, StoreError> {
        let state = self.state();
        if to == state.shape.geometry {
            return Ok(false);
        }
        let grew = grow_once(&state.current, state.shape, to).await?;
        self.follow().await?;
        Ok(grew)
    }
}

impl<S: Generation> Store for Generations<S> {
    async fn claim(&self, digest: Digest) -> Result<Claim, StoreError> {
        self.claims(false, &[digest])
            .await
            .pop()
            .unwrap_or_else(|| Err(StoreError::Protocol("no answer to a claim".into())))
    }

    async fn claim_many(&self, digests: &[Digest]) -> Vec<Result<Claim, StoreError>> {
        self.claims(false, digests).await
    }

    async fn claim_done_many(&self, digests: &[Digest]) -> Vec<Result<Claim, StoreError>> {
        self.claims(true, digests).await
    }

    async fn commit(&self, digest: Digest) -> Result<bool, StoreError> {
        one(self.held(Held::Commit, &[digest]).await)
    }

    async fn commit_many(&self, digests: &[Digest]) -> Vec<Result<bool, StoreError>> {
        self.held(Held::Commit, digests).await
    }

    async fn erase(&self, digest: Digest) -> Result<bool, StoreError> {
        one(self.held(Held::Erase, &[digest]).await)
    }

    async fn erase_many(&self, digests: &[Digest]) -> Vec<Result<bool, StoreError>> {
        self.held(Held::Erase, digests).await
    }

    async fn renew(&self, digest: Digest) -> Result<bool, StoreError> {
        one(self.held(Held::Renew, &[digest]).await)
    }

    fn geometry(&self) -> Option<Geometry> {
        Some(self.state().shape.geometry)
    }
}

fn one(mut answers: Vec<Result<bool, StoreError>>) -> Result<bool, StoreError> {
    answers
        .pop()
        .unwrap_or_else(|| Err(StoreError::Protocol("no answer".into())))
}

/// The fleet's counters are the current generation's; each share first reads the
/// descriptor again, which is how a running consumer follows a resize.
impl<S: Generation> FleetCounters for Generations<S> {
    fn fleet_interval(&self) -> Duration {
        self.state().current.fleet_interval()
    }

    async fn share_distinct(&self, distinct: u64) -> Result<f64, StoreError> {
        match self.follow().await {
            Err(error) => {
                if !self.shared.follow_failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(%error, "Reading the table's descriptor failed; this consumer keeps the table size it has until it can (said once until it reads it again).");
                }
            }
            Ok(()) => {
                if self.shared.follow_failing.swap(false, Ordering::Relaxed) {
                    tracing::info!("The table's descriptor reads again.");
                }
            }
        }
        self.current().share_distinct(distinct).await
    }
}

#[cfg(test)]
mod tests;
