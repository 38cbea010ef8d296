//! Per-key limiting: a sharded map from key to one word, read without locks,
//! swept without loss, and bounded in the keys it holds.

use core::borrow::Borrow;
use core::fmt;
use core::hash::{BuildHasher, Hash};
use core::marker::PhantomData;

use crossbeam_utils::CachePadded;

use crate::admission::{Admission, admit};
use crate::algorithm::Algorithm;
use crate::cell::Cell;

/// An admission by one key of a [`KeyedLimiter`], to give back with
/// [`Admission::refund`] ([`KeyedLimiter::try_acquire_refundable`]).
pub type KeyedAdmission<'a, K, Q, A, C, S> = Admission<KeyedStage<'a, K, Q, A, C, S>>;
use crate::algorithm::live::LiveTokenBucket;
use crate::algorithm::token_bucket::TokenBucket;
use crate::clock::{Clock, RealClock, saturating_nanos};
use crate::decision::{KeyedDecision, NotYet, RetryAfter};
use crate::error::{AcquireError, KeyedConfigError, QuotaError};
use crate::limiter::check_permits;
use crate::quota::Quota;
use crate::reclaim::{Busy, Collector};
use crate::sync::{Arc, AtomicU64, AtomicUsize, Ordering};
use crate::tally::Tally;

mod stage;
#[allow(unsafe_code)]
mod table;
pub(crate) mod tiered;

pub use stage::KeyedStage;
use table::{Counts, Locked, NEVER_SWEPT, NoRoom, Shard};

/// The default bound on keys held.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;
/// The default number of inserts after which a shard sweeps itself.
pub const DEFAULT_SWEEP_EVERY: usize = 1_024;
const MAX_SHARDS: usize = 1 << 16;
/// A sweep that inserts trigger unlinks only keys idle for at least this long
/// (nanoseconds), as well as since the shard's previous sweep.
const AUTO_SWEEP_MIN_IDLE_NS: u64 = 1_000_000_000;

/// Table slots one request at the key bound examines, at most, to reclaim room
/// (its own shard first, then the others from where the last look stopped).
const RECLAIM_BUDGET: usize = 4_096;
/// After a reclaim that found nothing, requests at the bound are refused
/// without looking again for this long (clock time), or for the algorithm's
/// idle-to-fresh time if that is shorter: a flood of new keys pays for one
/// bounded look per interval, not one per request.
const RECLAIM_COOLDOWN_NS: u64 = 1_000_000;

/// A rate limiter per key (API key, user, IP address): each key has its own
/// word, so one client's burst cannot spend another's tokens.
///
/// # The read path: no lock, one compare-and-swap
///
/// Keys live in a power-of-two number of shards. A decision on a known key
/// hashes the key once, reads the clock, pins its thread's reclamation record
/// (one store to a line only that thread writes; see the crate's design notes
/// on grace periods), probes its shard's table with plain acquire loads (a
/// group of eight control bytes, then the slot whose byte matches the key's
/// tag, which holds the key and its word side by side), and runs one
/// compare-and-swap on the key's word: no lock, no allocation, no key clone,
/// and no write to any shared cache line but the word itself (the admitted and
/// denied counters are per thread). `String` keys are looked up by `&str`.
/// Inserts, sweeps and table rebuilds serialize on a per-shard mutex that
/// readers never take. A rebuild (the table grows past 3/4 full, or a sweep
/// leaves it under 1/8) moves every word of its shard: it closes the table,
/// and once every reader pinned before the close has finished (a grace
/// period, typically microseconds), the next writer moves the words into a
/// table built aside. Meanwhile decisions on that shard take its mutex and
/// decide on the closed table's words; no thread waits for the grace period
/// but a new key whose shard's table is 7/8 full, which tries again a
/// bounded number of times and is then refused as at the key bound.
///
/// # User code, panics and re-entry
///
/// A keyed limiter runs user code: the key's `Hash` (before the lookup, and
/// for every key when a table is rebuilt, under the shard's mutex), `Eq`
/// (during lookups, pinned or under the mutex), `ToOwned` and `Drop` (when a
/// key is stored or freed, under the mutex), the algorithm (pinned or under
/// the mutex) and the clock (before the lookup, and under the mutex for a
/// key not found). A panic in any of them leaves the limiter consistent: no
/// key is dropped twice, the key bound's count is exact (a place reserved
/// for a new key is given back), a rebuild interrupted midway leaves the old
/// table whole (the next writer finishes it), and the limiter keeps
/// working. Such code must not call back into the same limiter on the same
/// thread (a lookup or a lock would wait for itself): that is detected and
/// refused with a panic, in debug and release builds alike. The first
/// `Hash` of a request runs before anything is pinned or locked and may
/// call into it; calling another limiter is always allowed.
///
/// # Grace periods and a stuck reader
///
/// Each limiter keeps its own reclamation records, so a thread stuck while
/// pinned in one limiter (descheduled in the middle of a lookup, stopped in
/// a debugger, blocked in a key's `Eq`) holds back only that limiter: its
/// evicted keys wait in limbo (at most `max_keys` of them), a shard whose
/// table is being rebuilt decides under its mutex, and new keys of that
/// shard are refused as at the key bound once its table is 7/8 full. Other
/// limiters, and decisions on keys already held, go on. On Linux, readers
/// pin with a plain store and writers issue
/// `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`; if that barrier fails
/// after start-up the process switches to fences (see [`reclamation`](crate::reclamation)),
/// and until a global barrier succeeds a limiter frees memory only once
/// every thread that used it has called it again or exited.
///
/// # Sweeping that loses nothing
///
/// A key is evicted only when its word is indistinguishable from a fresh one
/// (for a token bucket: the bucket would be full by now), never by a timer
/// alone, so a key that comes back finds exactly the allowance it would have
/// had. The invariant that makes this hold under concurrency:
///
/// > **No decision runs on a fresh word with a clock reading older than the one
/// > a sweep used to judge that key's previous word.**
///
/// It holds by construction:
/// - a decision on a key it *finds* decides on that word, the key's real state,
///   whatever a sweep does meanwhile: a sweep only unlinks an entry and parks it
///   in limbo, where a late compare-and-swap still lands; the entry is freed
///   only after every reader that could hold it has unpinned *and* its word is
///   still fresh-equivalent at a reading the freeing writer takes afterwards.
///   So its clock reading may be of any age (an old reading meets a word that
///   has seen later ones, and refills nothing), and it is taken before the
///   lookup, where its latency overlaps the lookup's;
/// - a decision that does *not* find its key takes the shard's mutex and reads
///   the clock only then, after any sweep of the shard that came before; it
///   relinks the key's entry if it is still in limbo, and only otherwise starts
///   from a fresh word.
///
/// Sweeps run on [`sweep`](Self::sweep), after every `sweep_every` inserts into
/// a shard (amortized: at least as many as the shard held after its last sweep),
/// and from a background thread that the limiter owns
/// ([`with_sweeper`](Self::with_sweeper): it stops when the limiter is dropped,
/// so it works wherever the limiter goes, behind a [`Gate`](crate::Gate) or a
/// tower layer too) or that an `Arc` of it feeds
/// ([`start_sweeper`](Self::start_sweeper)).
///
/// A sweep that inserts trigger is gentler than the others: after a shard's
/// first, it unlinks only keys idle for at least a second and since the
/// shard's previous sweep (their words were already fresh-equivalent at the
/// earlier of those two readings). A key in use under a generous quota has a
/// full bucket again between its requests; evicting it at every sweep would
/// make its next request an insert, and with many such keys those inserts
/// would trigger the next sweeps: on a million keys visited in turn under a
/// 1,000-per-second quota, every check became an insert, at 1.8–2.1 times the
/// time of governor with `ahash` (0.62–0.65 now; BENCHMARKS.md, "Sweeps
/// that spare keys in use" and "Keyed limiter: criterion"). A shard's first
/// such sweep (it has no previous one to go by), [`sweep`](Self::sweep), the
/// background sweeper and a new key at the key bound take every sweepable
/// key.
///
/// # A bound on keys, and memory that stays bounded
///
/// At most `max_keys` keys are linked at once. A new key at the bound reclaims
/// room with bounded work: it sweeps up to 4,096 table slots, its own shard's
/// first and then the other shards' from where the last such look stopped,
/// passing over shards that hold no key without locking them (a shard another
/// thread holds at that moment is swept once the request has let go of its
/// own, and the request starts over), so a key that is sweepable anywhere is
/// found by the requests that need the room. With the keys waiting out their
/// grace period (below) as many as `max_keys`, every shard's are freed first.
/// If none is
/// found the request is denied with [`KeyedDecision::KeyLimit`], distinct from
/// a rate denial, and nothing is stored; for the next millisecond (or the
/// algorithm's idle-to-fresh time, if shorter) further new keys are refused
/// without looking again, so a flood of new keys does not make every request
/// pay for a search. The `retry_after` of a key-limit denial is the
/// algorithm's [idle-to-fresh time](Algorithm::fresh_after_idle), plus, once
/// [reservations](KeyedLimiter::reserve_n) have been made, the furthest one
/// may reach ahead (a loan stamps its key's word in the future): by then every
/// key left idle since is sweepable. (Its room is reusable once every thread
/// that was in the middle of a lookup when an earlier eviction happened has
/// finished it, the grace period below: microseconds, unless such a thread
/// was descheduled mid-lookup.)
///
/// Evicted keys wait in limbo for a grace period (until every reader that
/// could still hold them has finished, typically microseconds) before they are
/// freed; at most `max_keys` keys wait at once. So at most `2 * max_keys` keys
/// are stored at once, whatever the keys. Memory follows them: a shard's
/// table is rebuilt for twice the keys it stores when it passes 3/4 full, and
/// a sweep that leaves it under 1/8 full rebuilds it smaller, so after a
/// flood of keys is swept away its tables (and the keys' own heap data, such
/// as a `String`'s bytes) are given back. A freed key's slot stays unusable
/// until its table's next rebuild, which drops it.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{KeyedDecision, KeyedLimiter, ManualClock, Quota};
///
/// let clock = ManualClock::new();
/// let limiter = KeyedLimiter::<String>::builder(Quota::new(3, 1, Duration::from_secs(1))?)
///     .clock(clock.clone())
///     .max_keys(10_000)
///     .build()?;
///
/// let alice = String::from("alice");
/// for left in [2, 1, 0] {
///     assert_eq!(limiter.try_acquire(alice.as_str()), KeyedDecision::Allowed { remaining: left });
/// }
/// assert!(limiter.try_acquire("alice").is_denied());
/// // bob has his own bucket
/// assert_eq!(limiter.try_acquire("bob"), KeyedDecision::Allowed { remaining: 2 });
/// assert_eq!(limiter.len(), 2);
///
/// // Once both buckets would be full again, a sweep drops them without loss.
/// clock.advance(Duration::from_secs(3));
/// assert_eq!(limiter.sweep(), 2);
/// assert_eq!(limiter.remaining("alice"), 3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct KeyedLimiter<K, A = TokenBucket, C = RealClock, S = ahash::RandomState> {
    inner: Arc<Inner<K, A, C, S>>,
    /// The limiter's own background sweeper, stopped when it is dropped.
    #[cfg(not(turnstile_loom))]
    sweeper: Option<Sweeper>,
}

/// What the limiter and its background sweeper share.
struct Inner<K, A, C, S> {
    shards: Box<[CachePadded<Shard<K>>]>,
    /// `shards.len() - 1`.
    shard_mask: usize,
    /// `63 - log2(shards.len())`.
    shard_shift: u32,
    hasher: S,
    algorithm: A,
    clock: C,
    max_keys: usize,
    sweep_every: usize,
    /// Keys linked, across shards; written only by writers, under a shard's
    /// mutex. Decisions on known keys never touch it.
    len: CachePadded<AtomicUsize>,
    /// Entries waiting in limbo, across shards (at most `max_keys`).
    limbo: AtomicUsize,
    /// The shard where the next reclaim at the key bound starts.
    reclaim_from: AtomicUsize,
    /// Until this clock reading, requests at the key bound do not look for room.
    reclaim_idle_until: AtomicU64,
    /// The furthest ahead of the clock a reservation may have stamped a word,
    /// in nanoseconds (0 until the first reservation): an idle key with a
    /// loan becomes sweepable that much later.
    lent_ahead: AtomicU64,
    /// When the key bound was last logged as reached (clock nanoseconds + 1;
    /// 0: never). Feature `tracing`.
    #[cfg(feature = "tracing")]
    key_limit_logged: AtomicU64,
    tally: Tally,
    collector: Collector,
}

/// Counters of a [`KeyedLimiter`], summed over its shards and thread slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyedStats {
    /// Keys held now.
    pub keys: usize,
    /// Requests admitted.
    pub admitted: u64,
    /// Requests denied by a key's rate.
    pub denied: u64,
    /// Requests for new keys denied because the limiter was full.
    pub denied_key_limit: u64,
    /// Keys evicted by sweeps.
    pub evicted: u64,
}

/// Builds a [`KeyedLimiter`]; start from [`KeyedLimiter::builder`] or
/// [`KeyedBuilder::new`].
///
/// The key type is part of the builder, so it is named once, on
/// `KeyedLimiter::<K>::builder`, or inferred from where the limiter goes.
pub struct KeyedBuilder<K, A, C = RealClock, S = ahash::RandomState> {
    key: PhantomData<fn() -> K>,
    algorithm: A,
    clock: C,
    hasher: S,
    shards: Option<usize>,
    max_keys: usize,
    sweep_every: usize,
}

impl<K> KeyedLimiter<K> {
    /// A token-bucket limiter per key for `quota`, with the defaults: the real
    /// clock, a random `ahash` hasher, 4 shards per available core (rounded up to
    /// a power of two), at most [`DEFAULT_MAX_KEYS`] keys.
    pub fn new(quota: Quota) -> KeyedLimiter<K> {
        // The defaults are valid: skip the checks rather than unwrap them.
        KeyedBuilder::new(TokenBucket::new(quota)).assemble(default_shards())
    }

    /// A builder for a token-bucket limiter per key, to set the clock, hasher,
    /// shard count, key bound and sweep interval.
    pub fn builder(quota: Quota) -> KeyedBuilder<K, TokenBucket> {
        KeyedBuilder::new(TokenBucket::new(quota))
    }
}

impl<K> KeyedLimiter<K, LiveTokenBucket> {
    /// A token-bucket limiter per key whose quota can be changed while it
    /// serves ([`set_quota`](KeyedLimiter::set_quota)), with the defaults of
    /// [`KeyedLimiter::new`]; capacities up to 65,535 (or `quota`'s, if
    /// larger; for more, give [`KeyedBuilder::new`] a
    /// [`LiveTokenBucket::with_ceiling`]).
    ///
    /// ```
    /// use turnstile::{KeyedLimiter, Quota};
    ///
    /// let limiter = KeyedLimiter::live(Quota::per_minute(60)?)?;
    /// assert!(limiter.try_acquire("alice").is_allowed());
    /// limiter.set_quota(Quota::per_minute(600)?)?; // raised while serving
    /// assert_eq!(limiter.remaining("bob"), 600);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`LiveTokenBucket::new`].
    pub fn live(quota: Quota) -> Result<KeyedLimiter<K, LiveTokenBucket>, QuotaError> {
        Ok(KeyedBuilder::new(LiveTokenBucket::new(quota)?).assemble(default_shards()))
    }
}

impl<K, A> KeyedBuilder<K, A> {
    /// A builder for a limiter per key running `algorithm`, with the defaults of
    /// [`KeyedLimiter::new`].
    pub fn new(algorithm: A) -> KeyedBuilder<K, A> {
        KeyedBuilder {
            key: PhantomData,
            algorithm,
            clock: RealClock::new(),
            hasher: ahash::RandomState::new(),
            shards: None,
            max_keys: DEFAULT_MAX_KEYS,
            sweep_every: DEFAULT_SWEEP_EVERY,
        }
    }
}

impl<K, A, C, S> KeyedBuilder<K, A, C, S> {
    /// The clock (a [`ManualClock`](crate::ManualClock) for tests, a
    /// [`CoarseClock`](crate::CoarseClock) for speed).
    pub fn clock<C2: Clock>(self, clock: C2) -> KeyedBuilder<K, A, C2, S> {
        KeyedBuilder {
            key: PhantomData,
            algorithm: self.algorithm,
            clock,
            hasher: self.hasher,
            shards: self.shards,
            max_keys: self.max_keys,
            sweep_every: self.sweep_every,
        }
    }

    /// The hasher. The default, `ahash` with random keys, resists keys chosen to
    /// collide; a fixed hasher suits tests.
    pub fn hasher<S2: BuildHasher>(self, hasher: S2) -> KeyedBuilder<K, A, C, S2> {
        KeyedBuilder {
            key: PhantomData,
            algorithm: self.algorithm,
            clock: self.clock,
            hasher,
            shards: self.shards,
            max_keys: self.max_keys,
            sweep_every: self.sweep_every,
        }
    }

    /// The number of shards: a power of two from 1 to 65,536. The default is 4 per
    /// available core, rounded up to a power of two.
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// The most keys held at once (default [`DEFAULT_MAX_KEYS`]).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// A shard sweeps itself on the insert after this many inserts, or after as
    /// many inserts as it held after its last sweep if that is more, so sweeping
    /// costs O(1) per insert amortized (default [`DEFAULT_SWEEP_EVERY`]). After
    /// a shard's first, such a sweep unlinks only keys idle since the shard's
    /// previous sweep and for at least a second (see [`KeyedLimiter`]'s
    /// "Sweeping that loses nothing").
    pub fn sweep_every(mut self, inserts: usize) -> Self {
        self.sweep_every = inserts;
        self
    }

    /// The limiter.
    ///
    /// # Errors
    ///
    /// [`KeyedConfigError`] for a shard count that is not a power of two from 1 to
    /// 65,536, a `max_keys` of 0 or a `sweep_every` of 0.
    pub fn build(self) -> Result<KeyedLimiter<K, A, C, S>, KeyedConfigError>
    where
        A: Algorithm,
        C: Clock,
        S: BuildHasher,
    {
        let shards = self.shards.unwrap_or_else(default_shards);
        if !shards.is_power_of_two() || shards > MAX_SHARDS {
            return Err(KeyedConfigError::Shards { shards });
        }
        if self.max_keys == 0 {
            return Err(KeyedConfigError::ZeroMaxKeys);
        }
        if self.sweep_every == 0 {
            return Err(KeyedConfigError::ZeroSweepEvery);
        }
        Ok(self.assemble(shards))
    }

    /// The limiter for a valid configuration.
    fn assemble(self, shards: usize) -> KeyedLimiter<K, A, C, S>
    where
        A: Algorithm,
        C: Clock,
        S: BuildHasher,
    {
        KeyedLimiter {
            inner: Arc::new(Inner {
                shards: (0..shards)
                    .map(|_| {
                        CachePadded::new(Shard::new(
                            self.sweep_every,
                            table::prefetch_from::<K>(shards),
                        ))
                    })
                    .collect(),
                shard_mask: shards - 1,
                shard_shift: 63 - shards.trailing_zeros(),
                hasher: self.hasher,
                algorithm: self.algorithm,
                clock: self.clock,
                max_keys: self.max_keys,
                sweep_every: self.sweep_every,
                len: CachePadded::new(AtomicUsize::new(0)),
                limbo: AtomicUsize::new(0),
                reclaim_from: AtomicUsize::new(0),
                reclaim_idle_until: AtomicU64::new(0),
                lent_ahead: AtomicU64::new(0),
                #[cfg(feature = "tracing")]
                key_limit_logged: AtomicU64::new(0),
                tally: Tally::new(),
                #[allow(clippy::default_constructed_unit_structs)]
                collector: Collector::default(),
            }),
            #[cfg(not(turnstile_loom))]
            sweeper: None,
        }
    }
}

impl<K, A: fmt::Debug, C: fmt::Debug, S> fmt::Debug for KeyedBuilder<K, A, C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedBuilder")
            .field("algorithm", &self.algorithm)
            .field("clock", &self.clock)
            .field("shards", &self.shards)
            .field("max_keys", &self.max_keys)
            .field("sweep_every", &self.sweep_every)
            .finish_non_exhaustive()
    }
}

fn default_shards() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores * 4).next_power_of_two().min(MAX_SHARDS)
}

impl<K, A, C, S> KeyedLimiter<K, A, C, S>
where
    K: Hash + Eq,
    A: Algorithm,
    C: Clock,
    S: BuildHasher,
{
    /// Ask for one permit for `key`.
    #[inline]
    pub fn try_acquire<Q>(&self, key: &Q) -> KeyedDecision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // Every algorithm's capacity is at least 1.
        self.inner.decide(key, 1)
    }

    /// Ask for `n` permits for `key`, all or nothing.
    ///
    /// # Errors
    ///
    /// As [`RateLimiter::try_acquire_n`](crate::RateLimiter::try_acquire_n): `n = 0`,
    /// or `n` above the capacity. Neither touches the map.
    #[inline]
    pub fn try_acquire_n<Q>(&self, key: &Q, n: u32) -> Result<KeyedDecision, AcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        check_permits(n, self.inner.algorithm.capacity())?;
        Ok(self.inner.decide(key, n))
    }

    /// Ask for one permit for `key`, and leave a denial's wait to be worked
    /// out only if asked for ([`NotYet::retry_after`]): `Ok` with the permits
    /// left, or `Err` (a rate denial, or a new key refused at the bound:
    /// [`NotYet::is_key_limit`]). The same decision as
    /// [`try_acquire`](Self::try_acquire), with a cheaper denial.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{KeyedLimiter, ManualClock, Quota};
    ///
    /// let clock = ManualClock::new();
    /// let limiter = KeyedLimiter::<u64>::builder(Quota::new(1, 1, Duration::from_secs(1))?)
    ///     .clock(clock.clone())
    ///     .build()?;
    /// assert_eq!(limiter.check(&7).ok(), Some(0));
    /// clock.advance(Duration::from_millis(250));
    /// let not_yet = limiter.check(&7).unwrap_err();
    /// assert!(!not_yet.is_key_limit());
    /// assert_eq!(not_yet.retry_after().duration(), Duration::from_millis(750));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn check<Q>(&self, key: &Q) -> Result<u32, NotYet<'_, A>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let inner = &*self.inner;
        let hash = inner.hasher.hash_one(key);
        let shard = inner.shard(hash);
        // As in `Inner::decide`.
        let now = inner.clock.now();
        {
            let guard = inner.collector.pin();
            if let Some(cell) = shard.find(hash, key, &guard) {
                let admitted = cell.admit(&inner.algorithm, now, 1);
                inner.tally.count_outcome(admitted.is_ok(), guard.slot());
                return admitted.map_err(|word| NotYet::rate(&inner.algorithm, word, now, 1));
            }
        }
        match inner
            .insert_and_decide(&inner.algorithm, key, hash, shard, now, 1, true)
            .0
        {
            KeyedDecision::Allowed { remaining } => Ok(remaining),
            KeyedDecision::Denied { retry_after } => {
                Err(NotYet::known(&inner.algorithm, retry_after, false))
            }
            KeyedDecision::KeyLimit { retry_after } => {
                Err(NotYet::known(&inner.algorithm, retry_after, true))
            }
        }
    }

    /// Ask for one permit for `key`, keeping what is needed to give it back:
    /// `Ok` with an [`Admission`] to [`refund`](Admission::refund), or `Err`
    /// with the denial (a rate denial, or a new key refused at the bound). The
    /// same decision as [`try_acquire`](Self::try_acquire), counted the same.
    ///
    /// The admission borrows the key and refunds by looking it up again: a
    /// key evicted since (or evicted and created again) declines the refund.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{KeyedLimiter, ManualClock, Quota};
    ///
    /// let clock = ManualClock::new();
    /// // 5 failed logins per user per 15 minutes.
    /// let failures = KeyedLimiter::<String>::builder(Quota::new(5, 5, Duration::from_secs(900))?)
    ///     .clock(clock)
    ///     .build()?;
    /// let attempt = failures.try_acquire_refundable("alice").expect("under the limit");
    /// assert!(attempt.refund()); // the password was right: the attempt does not count
    /// assert_eq!(failures.remaining("alice"), 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_acquire_refundable<'a, Q>(
        &'a self,
        key: &'a Q,
    ) -> Result<KeyedAdmission<'a, K, Q, A, C, S>, KeyedDecision>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        admit(self.stage(key), 1)
    }

    /// [`try_acquire_n`](Self::try_acquire_n), keeping what is needed to give
    /// the permits back ([`try_acquire_refundable`](Self::try_acquire_refundable)):
    /// `Ok(Err(_))` is a denial.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n): `n = 0`, or `n` above the
    /// capacity. Neither touches the map.
    // The shape of `try_acquire_n`: the outer error for input that no
    // decision can answer, the inner result for the decision.
    #[allow(clippy::type_complexity)]
    pub fn try_acquire_n_refundable<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u32,
    ) -> Result<Result<KeyedAdmission<'a, K, Q, A, C, S>, KeyedDecision>, AcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        check_permits(n, self.inner.algorithm.capacity())?;
        Ok(admit(self.stage(key), n))
    }

    /// The permits `key`'s bucket holds now, without taking any and without
    /// storing the key: what a request for it would be decided on by its
    /// rate. A key not held reports a fresh bucket's, also while the key
    /// bound is full: a request for it may then be refused for the bound
    /// ([`KeyedDecision::KeyLimit`], a 503 rather than a 429) unless it finds
    /// an idle key to evict, which a look that takes nothing does not try.
    /// [`len`](Self::len) and [`max_keys`](Self::max_keys) tell when the
    /// bound is full.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{KeyedBuilder, ManualClock, Quota, TokenBucket};
    ///
    /// let bucket = TokenBucket::new(Quota::new(5, 1, Duration::from_secs(1))?);
    /// let limiter = KeyedBuilder::new(bucket)
    ///     .clock(ManualClock::new())
    ///     .max_keys(1)
    ///     .build()?;
    /// assert!(limiter.try_acquire("a").is_allowed()); // the bound is full now
    /// assert_eq!(limiter.remaining("a"), 4);
    /// assert_eq!(limiter.remaining("b"), 5); // b's bucket, were it admitted
    /// assert_eq!(limiter.len(), limiter.max_keys());
    /// assert!(limiter.try_acquire("b").is_key_limit()); // but there is no room
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn remaining<Q>(&self, key: &Q) -> u32
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let inner = &*self.inner;
        inner.on_word(key, |word, now, _| inner.algorithm.remaining(word, now))
    }

    /// Sweep every shard, one at a time: evict the keys whose words are
    /// indistinguishable from fresh ones. Returns how many were evicted.
    pub fn sweep(&self) -> usize {
        self.inner.sweep()
    }

    /// Keys held now.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// `true` when no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counters summed over the shards and thread slots (each read in turn, not
    /// at one instant).
    pub fn stats(&self) -> KeyedStats {
        let inner = &*self.inner;
        let mut stats = KeyedStats {
            keys: inner.len(),
            admitted: inner.tally.admitted(),
            denied: inner.tally.denied(),
            ..KeyedStats::default()
        };
        let busy = inner.collector.enter();
        for shard in inner.shards.iter() {
            let mut locked = shard.lock(&busy);
            let writer = locked.writer();
            stats.denied_key_limit += writer.denied_key_limit;
            stats.evicted += writer.evicted;
        }
        stats
    }

    /// Decide for `key`, also returning the word an admission wrote and a
    /// clock reading no later than the decision's (what a refund needs).
    pub(crate) fn take<Q>(&self, key: &Q, n: u32) -> (KeyedDecision, Option<u64>, u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.inner.take(key, n, true)
    }

    /// Note that a reservation stamps a word `ahead` nanoseconds ahead of the
    /// clock, before its compare-and-swap writes it: key-limit denials wait
    /// that much longer for idle keys to become sweepable.
    pub(crate) fn note_loan(&self, ahead: u64) {
        self.inner.note_loan(ahead);
    }

    /// [`take`](Self::take), deciding with `algorithm` on this limiter's
    /// words (a reservation's).
    pub(crate) fn take_with<B, Q>(
        &self,
        algorithm: &B,
        key: &Q,
        n: u32,
    ) -> (KeyedDecision, Option<u64>, u64)
    where
        B: Algorithm,
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.inner.take_with(algorithm, key, n, true)
    }

    /// Replace `key`'s word by `next(word)` if the key is linked and `next`
    /// gives one; whether it did.
    pub(crate) fn transform_linked<Q>(&self, key: &Q, next: impl FnMut(u64) -> Option<u64>) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.inner
            .on_linked_cell(key, |cell| cell.transform(next).is_some())
            .unwrap_or(false)
    }

    /// One try of a wait: the decision for `key`, not counted (the wait
    /// counts its outcome once, [`count_outcome`](Self::count_outcome)).
    pub(crate) fn try_uncounted<Q>(&self, key: &Q, n: u32) -> KeyedDecision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.inner.take(key, n, false).0
    }

    /// Count a wait's outcome: admitted, or refused by its deadline.
    pub(crate) fn count_outcome(&self, admitted: bool) {
        let inner = &*self.inner;
        inner
            .tally
            .count_outcome(admitted, crate::reclaim::thread_slot());
    }

    /// The decision `key` would get for `n` permits now, taking nothing and
    /// storing nothing.
    pub(crate) fn peek<Q>(&self, key: &Q, n: u32) -> KeyedDecision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let inner = &*self.inner;
        inner.on_word(key, |word, now, linked| {
            // A key not linked (new, or waiting in limbo) meets the key bound
            // first when it is full. (A request might still find a sweepable
            // key to make room; the peek takes nothing, so it answers with the
            // bound's wait, an upper bound on when room is certain.)
            if !linked && inner.len() >= inner.max_keys {
                return KeyedDecision::KeyLimit {
                    retry_after: inner.key_limit_wait(),
                };
            }
            inner.algorithm.decide(word, now, n).0.into()
        })
    }

    /// Give back `n` permits an admission for `key` took (see
    /// [`Algorithm::refund`]); `true` when they went back. Only a key that is
    /// linked takes a refund. A key evicted since was fresh-equivalent with the
    /// permits spent, so nothing it owes matters any more: while it is not
    /// linked (waiting in limbo, or freed) the refund declines; created again,
    /// its word is a later one than `written` (a later refill time, window or
    /// theoretical arrival time), and every algorithm declines a refund
    /// against it.
    pub(crate) fn refund<Q>(&self, key: &Q, written: u64, n: u32) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let inner = &*self.inner;
        inner
            .on_linked_cell(key, |cell| cell.refund(&inner.algorithm, written, n))
            .unwrap_or(false)
    }
}

impl<K, A, C, S> Inner<K, A, C, S>
where
    K: Hash + Eq,
    A: Algorithm,
    C: Clock,
    S: BuildHasher,
{
    /// The read path: find the word without a lock, then read the clock, then
    /// one compare-and-swap.
    #[inline(always)]
    fn decide<Q>(&self, key: &Q, n: u32) -> KeyedDecision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        // Read before the lookup, so that the clock's latency overlaps it. A
        // reading of any age is sound here: it only ever meets the key's real
        // word (see the type's invariant); a new key reads again under its
        // shard's lock.
        let now = self.clock.now();
        {
            let guard = self.collector.pin();
            if let Some(cell) = shard.find(hash, key, &guard) {
                // The plain decision, not `take`'s pair: returning the written
                // word too kept the pair on the stack, and reading the decision
                // back across two stores cost a failed store forward.
                let decision = cell.apply(&self.algorithm, now, n);
                self.tally.count(decision, guard.slot());
                return decision.into();
            }
        }
        self.insert_and_decide(&self.algorithm, key, hash, shard, now, n, true)
            .0
    }

    /// As [`decide`](Self::decide), also returning the word an admission
    /// wrote; counted in the tally only when `counted` (a wait counts its
    /// outcome once, not every try).
    fn take<Q>(&self, key: &Q, n: u32, counted: bool) -> (KeyedDecision, Option<u64>, u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.take_with(&self.algorithm, key, n, counted)
    }

    /// [`take`](Self::take), deciding with `algorithm`: the limiter's own, or
    /// one acting for it on the same words (a reservation's). The reading
    /// returned is the first this takes: the decision's, or (for a key not
    /// found without the lock) an earlier one.
    fn take_with<B, Q>(
        &self,
        algorithm: &B,
        key: &Q,
        n: u32,
        counted: bool,
    ) -> (KeyedDecision, Option<u64>, u64)
    where
        B: Algorithm,
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        // As in `decide`: any reading will do for a word found in the table.
        let now = self.clock.now();
        {
            let guard = self.collector.pin();
            if let Some(cell) = shard.find(hash, key, &guard) {
                let (decision, written) = self.decide_on(algorithm, cell, now, n, counted);
                return (decision, written, now);
            }
        }
        let (decision, written) =
            self.insert_and_decide(algorithm, key, hash, shard, now, n, counted);
        (decision, written, now)
    }

    /// `f(word, now, linked)` on `key`'s word (linked, or in limbo) and a
    /// reading taken after it was found; for a key not held, on a fresh word.
    /// `linked` is true only for a key that holds a place under the key bound
    /// (a key in limbo does not: linking it again takes one). Stores nothing.
    fn on_word<Q, R>(&self, key: &Q, f: impl FnOnce(u64, u64, bool) -> R) -> R
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        {
            let guard = self.collector.pin();
            if let Some(cell) = shard.find(hash, key, &guard) {
                let word = cell.load();
                return f(word, self.clock.now(), true);
            }
        }
        // Not linked: it may wait in limbo with a word that still counts.
        let busy = self.collector.enter();
        let (locked, now) = self.lock_settled(shard, &busy);
        if let Some(entry) = locked.find(hash, key) {
            return f(locked.cell(entry).load(), now, true);
        }
        // In limbo the word still counts, but the key holds no place under
        // the bound: linking it again takes one, as a new key does.
        match locked.find_in_limbo(hash, key) {
            Some(entry) => f(locked.cell(entry).load(), now, false),
            None => f(self.algorithm.fresh(), now, false),
        }
    }

    /// `f` on `key`'s word cell, if the key is linked.
    fn on_linked_cell<Q, R>(&self, key: &Q, f: impl FnOnce(&Cell) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        {
            let guard = self.collector.pin();
            if let Some(cell) = shard.find(hash, key, &guard) {
                return Some(f(cell));
            }
        }
        // Not linked, or its shard's table is closed for a rebuild: decided
        // under the lock.
        let busy = self.collector.enter();
        let (locked, _) = self.lock_settled(shard, &busy);
        locked.find(hash, key).map(|entry| f(locked.cell(entry)))
    }

    /// The limiter's counts, for a shard's changes to keep.
    fn counts(&self) -> Counts<'_> {
        Counts {
            linked: &self.len,
            limbo: &self.limbo,
            max_keys: self.max_keys,
        }
    }

    /// Lock `shard`, read the clock under the lock, and finish a rebuild of
    /// its table whose readers are gone ([`Locked::settle`]).
    fn lock_settled<'s>(&'s self, shard: &'s Shard<K>, busy: &Busy<'_>) -> (Locked<'s, K>, u64) {
        let mut locked = shard.lock(busy);
        let now = self.clock.now();
        self.settle(&mut locked, now);
        (locked, now)
    }

    /// [`Locked::settle`] with this limiter's rules, at `now` (read under
    /// the lock).
    fn settle(&self, locked: &mut Locked<'_, K>, now: u64) {
        locked.settle(
            &|word| self.algorithm.is_fresh_equivalent(word, now),
            &self.collector,
            &|k| self.hasher.hash_one(k),
            &self.counts(),
        );
    }

    /// [`Locked::make_room`] with this limiter's rules, at `now` (read under
    /// the lock).
    fn make_room(&self, locked: &mut Locked<'_, K>, now: u64) -> Result<usize, NoRoom> {
        locked.make_room(
            &|word| self.algorithm.is_fresh_equivalent(word, now),
            &self.collector,
            &|k| self.hasher.hash_one(k),
            &self.counts(),
        )
    }

    /// A key not linked in its shard: take the shard's mutex, read the clock,
    /// and decide on the key's entry (linked meanwhile by another thread, or
    /// waiting in limbo) or on a fresh word stored as a new entry.
    ///
    /// `_early` is the reading the caller took before its lookup. It is not
    /// used: a sweep may have judged the key's word at a later reading and
    /// freed it since, and a fresh word decided at `_early` would then count
    /// the key's last window or burst twice. (The loom mutant
    /// `stale_insert_reading` uses it, and its model fails.)
    ///
    /// User code runs here (the key's `Eq` and `ToOwned`, the algorithm, the
    /// clock, and in a rebuild the keys' `Hash` and `Drop`) with the thread
    /// marked busy in this limiter, so a call back into it panics rather than
    /// deadlocks; a panic leaves the books as they were (a place reserved
    /// under the key bound is given back by its guard).
    #[inline(never)]
    // One argument more than clippy's limit: the algorithm a reservation
    // decides with.
    #[allow(clippy::too_many_arguments)]
    fn insert_and_decide<B, Q>(
        &self,
        algorithm: &B,
        key: &Q,
        hash: u64,
        shard: &Shard<K>,
        _early: u64,
        n: u32,
        counted: bool,
    ) -> (KeyedDecision, Option<u64>)
    where
        B: Algorithm,
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let busy = self.collector.enter();
        // Busy shards a first look at the bound could not sweep: swept after
        // this shard's lock is let go, and the insert starts over, once.
        let mut busy_shards = Vec::new();
        // Times this request found its shard's table full while a rebuild
        // waited for a reader: it lets the lock go and tries again, a bounded
        // number of times.
        let mut waits = 0;
        loop {
            let (mut locked, now) = self.lock_settled(shard, &busy);
            // Read under the lock: after every sweep of this shard that came
            // before, so never older than a reading that judged this key's
            // last word.
            #[cfg(turnstile_mutant = "stale_insert_reading")]
            let now = _early;
            if let Some(entry) = locked.find(hash, key) {
                return self.decide_on(algorithm, locked.cell(entry), now, n, counted);
            }
            // The decision on a fresh word, for a key neither linked nor in
            // limbo (nor will it be in limbo below: only a linked key can be
            // unlinked).
            let mut on_fresh = None;
            if locked.find_in_limbo(hash, key).is_none() {
                let (decision, next) = algorithm.decide(self.algorithm.fresh(), now, n);
                if next.is_none() {
                    // The word would stay fresh: nothing to remember.
                    if counted {
                        self.tally.count(decision, crate::reclaim::thread_slot());
                    }
                    return (decision.into(), None);
                }
                on_fresh = Some((decision, next));
            }
            if locked.writer().inserts_since_sweep >= locked.writer().sweep_threshold {
                // Only keys idle since the shard's last sweep and for a
                // second: a key in use whose bucket is full again at every
                // visit (a generous quota) would otherwise be evicted at each
                // sweep and inserted again at its next request, and with many
                // such keys the inserts trigger the sweeps that evict them.
                // The shard's first sweep has no last one to go by, and takes
                // every sweepable key, as `sweep()` does.
                let swept_at = locked.writer().swept_at;
                let since = (swept_at != NEVER_SWEPT)
                    .then(|| swept_at.min(now.saturating_sub(AUTO_SWEEP_MIN_IDLE_NS)));
                self.sweep_shard_idle_since(&mut locked, now, usize::MAX, since);
            }
            let retried = !busy_shards.is_empty();
            let reserved = match self.reserve_key() {
                Some(reserved) => Some(reserved),
                None => self.reclaim(&mut locked, shard, now, &mut busy_shards, &busy),
            };
            let Some(reserved) = reserved else {
                if !retried && !busy_shards.is_empty() {
                    // Other threads held shards the look skipped (a sweep, a
                    // stats reading, another insert): a key sweepable there
                    // must not be missed. This thread lets its own lock go, so
                    // waiting for theirs cannot deadlock, sweeps them and
                    // starts over.
                    drop(locked);
                    for &index in &busy_shards {
                        let mut other = self.shards[index].lock(&busy);
                        let now = self.clock.now();
                        self.sweep_shard(&mut other, now, RECLAIM_BUDGET);
                    }
                    continue;
                }
                if !busy_shards.is_empty() {
                    // The second look found shards busy again: refuse, and let
                    // the next new keys refuse without looking for a while (a
                    // look that skipped nothing has started the pause itself).
                    self.start_reclaim_cooldown(now);
                }
                return self.refuse_new_key(&mut locked, now);
            };
            // Looked up again: the sweeps above may have freed the key's entry
            // from limbo, which they do only when its word is fresh-equivalent
            // at `now`, so a fresh word decided at `now` then loses nothing.
            if let Some(entry) = locked.find_in_limbo(hash, key) {
                locked.relink(hash, entry, &self.counts());
                reserved.keep();
                return self.decide_on(algorithm, locked.cell(entry), now, n, counted);
            }
            match self.make_room(&mut locked, now) {
                Ok(_) => {}
                Err(NoRoom::Waiting) if waits < MAX_ROOM_WAITS => {
                    // The table is full until its rebuild's readers are gone:
                    // let go of the place, the lock and the busy mark of this
                    // shard, and try again.
                    waits += 1;
                    drop(reserved);
                    drop(locked);
                    crate::sync::wait_for_readers();
                    continue;
                }
                Err(no_room) => {
                    // The shard's table cannot grow (2^31 slots), or a reader
                    // has held its rebuild for longer than this request waits:
                    // later new keys of this shard are refused without
                    // waiting, until the rebuild finishes.
                    if no_room == NoRoom::Waiting {
                        locked.writer().gave_up_waiting = true;
                    }
                    drop(reserved);
                    return self.refuse_new_key(&mut locked, now);
                }
            }
            // Stored already decided on, rather than fresh and then decided on
            // with a compare-and-swap: under the lock, before the key is
            // published, no decision can come between. (A key found in limbo
            // above and freed since has no decision yet.)
            let (decision, next) =
                on_fresh.unwrap_or_else(|| algorithm.decide(self.algorithm.fresh(), now, n));
            let owned = key.to_owned();
            locked.put_new(hash, owned, next.unwrap_or_else(|| self.algorithm.fresh()));
            reserved.keep();
            locked.writer().inserts_since_sweep += 1;
            if counted {
                self.tally.count(decision, crate::reclaim::thread_slot());
            }
            return (decision.into(), next);
        }
    }

    /// A new key refused at the bound: counted, logged, and told when every
    /// key left idle is sweepable.
    fn refuse_new_key(&self, locked: &mut Locked<'_, K>, now: u64) -> (KeyedDecision, Option<u64>) {
        locked.writer().denied_key_limit += 1;
        #[cfg(feature = "tracing")]
        self.log_key_limit(now);
        #[cfg(not(feature = "tracing"))]
        let _ = now;
        (
            KeyedDecision::KeyLimit {
                retry_after: self.key_limit_wait(),
            },
            None,
        )
    }

    /// Room for one more key at the bound: look for sweepable keys, with
    /// bounded work, in this shard (`own`, locked) and then the others. A
    /// place reserved under the bound once one is found. Shards another
    /// thread holds are skipped and noted in `busy_shards`, for the caller to
    /// sweep once it has let its own lock go.
    #[cold]
    fn reclaim(
        &self,
        own: &mut Locked<'_, K>,
        own_shard: &Shard<K>,
        now: u64,
        busy_shards: &mut Vec<usize>,
        busy: &Busy<'_>,
    ) -> Option<Reserved<'_>> {
        busy_shards.clear();
        // Relaxed: a hint about when to look again; a stale value costs one
        // extra look or one refusal within the cooldown.
        if now < self.reclaim_idle_until.load(Ordering::Relaxed) {
            return None;
        }
        // A full limbo stops a sweep unlinking anything; its entries may wait
        // in any shard, so free them everywhere first (a sweep of budget 0
        // only frees limbo).
        // Relaxed: a count, as in `reserve_key`.
        if self.limbo.load(Ordering::Relaxed) >= self.max_keys {
            self.sweep_shard(own, now, 0);
            for shard in self.shards.iter() {
                if let Some(mut other) = shard.try_lock(busy) {
                    let now = self.clock.now();
                    self.sweep_shard(&mut other, now, 0);
                }
            }
        }
        let mut budget = RECLAIM_BUDGET;
        budget -= self.sweep_shard(own, now, budget).min(budget);
        if let Some(reserved) = self.reserve_key() {
            return Some(reserved);
        }
        let shards = self.shards.len();
        // A cursor, as a clock hand: each look starts where the last one
        // stopped, so that looks one after another cover every shard in turn
        // (starting one shard further each time, they went over the same
        // shards again, and with many shards to few keys most new keys were
        // refused while idle keys sat further on). Shards with no linked key
        // are passed over without their lock and without spending the
        // budget. Relaxed: where to start is a hint; looks that race may
        // cover a shard twice, which costs work, not keys.
        let start = self.reclaim_from.load(Ordering::Relaxed);
        let mut i = 0;
        let found = loop {
            if i == shards || budget == 0 {
                break None;
            }
            let index = start.wrapping_add(i) & self.shard_mask;
            i += 1;
            let shard = &self.shards[index];
            if core::ptr::eq(&**shard, own_shard) || shard.linked_hint() == 0 {
                continue;
            }
            // `try_lock`: this thread holds its own shard's lock, so it must not
            // wait for another's (that thread may be waiting for ours).
            let Some(mut other) = shard.try_lock(busy) else {
                busy_shards.push(index);
                continue;
            };
            let now = self.clock.now();
            budget -= self.sweep_shard(&mut other, now, budget).min(budget);
            drop(other);
            if let Some(reserved) = self.reserve_key() {
                break Some(reserved);
            }
        };
        // Relaxed: as above.
        self.reclaim_from
            .store(start.wrapping_add(i) & self.shard_mask, Ordering::Relaxed);
        if found.is_none() && busy_shards.is_empty() {
            self.start_reclaim_cooldown(now);
        }
        found
    }

    /// Let new keys at the bound refuse without looking for room until a
    /// little after `now`: a flood of new keys does not make each one pay for
    /// a look that just found nothing.
    fn start_reclaim_cooldown(&self, now: u64) {
        let cooldown = saturating_nanos(self.algorithm.fresh_after_idle()).min(RECLAIM_COOLDOWN_NS);
        // Relaxed: as in `reclaim`.
        self.reclaim_idle_until
            .store(now.saturating_add(cooldown), Ordering::Relaxed);
    }

    /// Sweep up to `budget` table slots of a locked shard at `now` (read under
    /// its lock); returns the slots examined.
    fn sweep_shard(&self, locked: &mut Locked<'_, K>, now: u64, budget: usize) -> usize {
        self.sweep_shard_idle_since(locked, now, budget, None)
    }

    /// [`sweep_shard`](Self::sweep_shard), unlinking only keys whose words
    /// were already fresh-equivalent at the reading `since`, if given, as well
    /// as at `now`.
    ///
    /// Every algorithm here reads a word at a reading before the one that
    /// wrote it as refilling (or expiring) nothing, so a word that an
    /// admission wrote at a reading after `since` is not fresh-equivalent at
    /// `since`: the keys this spares include every key admitted since then.
    /// The test only spares keys; whether a key may go is still decided at
    /// `now`, so eviction loses nothing either way.
    fn sweep_shard_idle_since(
        &self,
        locked: &mut Locked<'_, K>,
        now: u64,
        budget: usize,
        since: Option<u64>,
    ) -> usize {
        let capacity = locked.capacity();
        let examined = capacity.min(budget);
        locked.sweep(
            |word| self.algorithm.is_fresh_equivalent(word, now),
            |word| since.is_none_or(|since| self.algorithm.is_fresh_equivalent(word, since)),
            budget,
            &self.collector,
            |k| self.hasher.hash_one(k),
            &self.counts(),
        );
        if budget >= capacity {
            // A whole sweep: the amortized schedule starts again.
            let linked = locked.linked();
            let writer = locked.writer();
            writer.inserts_since_sweep = 0;
            writer.sweep_threshold = self.sweep_every.max(linked);
            writer.swept_at = now;
        }
        examined
    }

    fn sweep(&self) -> usize {
        let busy = self.collector.enter();
        // A full limbo stops a sweep unlinking anything, and its entries may
        // wait in a shard visited after the one with idle keys: free every
        // shard's limbo first (a sweep of budget 0 only frees limbo).
        for shard in self.shards.iter() {
            let mut locked = shard.lock(&busy);
            let now = self.clock.now();
            self.sweep_shard(&mut locked, now, 0);
        }
        let evicted = self
            .shards
            .iter()
            .map(|shard| {
                let mut locked = shard.lock(&busy);
                let now = self.clock.now();
                let before = locked.writer().evicted;
                self.sweep_shard(&mut locked, now, usize::MAX);
                (locked.writer().evicted - before) as usize
            })
            .sum();
        #[cfg(feature = "tracing")]
        tracing::debug!(
            evicted,
            keys = self.len(),
            max_keys = self.max_keys,
            shards = self.shards.len(),
            "turnstile keyed limiter swept"
        );
        evicted
    }

    /// Log that the key bound refused a new key: at most once a second per
    /// limiter (by its clock), so a flood of new keys logs a line a second,
    /// not a line a request.
    #[cfg(feature = "tracing")]
    #[cold]
    fn log_key_limit(&self, now: u64) {
        const EVERY: u64 = 1_000_000_000;
        // Relaxed: the stamp guards only the log line; two threads racing
        // for it log once between them, or twice at worst.
        let last = self.key_limit_logged.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_add(1).saturating_sub(last) >= EVERY;
        if due
            && self
                .key_limit_logged
                .compare_exchange(
                    last,
                    now.saturating_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            tracing::warn!(
                max_keys = self.max_keys,
                keys = self.len(),
                retry_after_ms = self.algorithm.fresh_after_idle().as_millis() as u64,
                "turnstile keyed limiter at its key bound: new keys are refused (KeyLimit, \
                 503) until idle keys are swept; logged at most once a second"
            );
        }
    }

    /// A key-limit denial's wait: by then every key left idle since is
    /// sweepable. The algorithm's idle-to-fresh time, plus the furthest a
    /// reservation may have stamped a word ahead of the clock.
    fn key_limit_wait(&self) -> RetryAfter {
        // Relaxed: a bound noted before each loan it covers (see `note_loan`).
        let lent_ahead = self.lent_ahead.load(Ordering::Relaxed);
        RetryAfter::from_nanos(
            saturating_nanos(self.algorithm.fresh_after_idle()).saturating_add(lent_ahead),
        )
    }

    /// Note, before a loan's word is written, how far ahead of the clock it
    /// stamps it.
    fn note_loan(&self, ahead: u64) {
        // Relaxed: a bound read by key-limit denials; a denial that races the
        // first loan of a longer reach may still give the shorter wait, as it
        // would had it come just before the loan.
        if self.lent_ahead.load(Ordering::Relaxed) < ahead {
            self.lent_ahead.fetch_max(ahead, Ordering::Relaxed);
        }
    }

    /// Take one key place under the bound: given back when the guard is
    /// dropped, unless [kept](Reserved::keep) by the key that took it.
    fn reserve_key(&self) -> Option<Reserved<'_>> {
        reserve(&self.len, self.max_keys).then(|| Reserved { count: &self.len })
    }

    fn len(&self) -> usize {
        // Relaxed: a snapshot of a counter.
        self.len.load(Ordering::Relaxed)
    }

    /// Decide on a key's word, which the caller's pin or lock keeps allocated.
    #[inline(always)]
    fn decide_on<B: Algorithm>(
        &self,
        algorithm: &B,
        cell: &Cell,
        now: u64,
        n: u32,
        counted: bool,
    ) -> (KeyedDecision, Option<u64>) {
        let (decision, written) = cell.take(algorithm, now, n);
        if counted {
            self.tally.count(decision, crate::reclaim::thread_slot());
        }
        (decision.into(), written)
    }

    #[inline(always)]
    fn shard(&self, hash: u64) -> &Shard<K> {
        // The top bits (the table's groups use the low ones, and its tags
        // bits 40 to 46): `hash >> (64 - log2(shards))`, in two shifts so that one shard
        // (a shift of 64) needs no branch.
        &self.shards[((hash >> 1) >> self.shard_shift) as usize]
    }
}

/// Add one to `count` unless it is at `bound`.
fn reserve(count: &AtomicUsize, bound: usize) -> bool {
    // Relaxed: the count publishes nothing. Each insert or eviction is ordered
    // with its table change by its shard's mutex; the count only has to stay
    // within the bound, which the compare-and-swap alone ensures.
    let mut held = count.load(Ordering::Relaxed);
    loop {
        if held >= bound {
            return false;
        }
        match count.compare_exchange_weak(held, held + 1, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(actual) => held = actual,
        }
    }
}

/// A place under the key bound, taken by a new key on its way in. Given
/// back when dropped (the key was not stored: refused, or user code run
/// meanwhile panicked), so that no path leaks it.
#[must_use]
struct Reserved<'a> {
    count: &'a AtomicUsize,
}

impl Reserved<'_> {
    /// The key took its place: it stays counted.
    fn keep(self) {
        core::mem::forget(self);
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if crate::sync::unwinding_under_loom() {
            return;
        }
        // Relaxed: as in `reserve`.
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How many times a new key whose shard's table is full while its rebuild
/// waits for a reader lets the lock go and tries again before it is refused
/// as at the key bound: a reader that stays pinned (descheduled, stopped)
/// then costs new keys of that one shard a refusal, not a hang, and only the
/// first of them waits (the shard remembers until the rebuild finishes).
const MAX_ROOM_WAITS: u32 = 10_000;

impl<K, A, C, S> KeyedLimiter<K, A, C, S> {
    /// The most keys held at once.
    pub fn max_keys(&self) -> usize {
        self.inner.max_keys
    }

    /// The number of shards.
    pub fn shard_count(&self) -> usize {
        self.inner.shards.len()
    }

    /// The algorithm and its parameters.
    pub fn algorithm(&self) -> &A {
        &self.inner.algorithm
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        &self.inner.clock
    }
}

impl<K, C: Clock, S> KeyedLimiter<K, LiveTokenBucket, C, S> {
    /// Change every key's quota while the limiter serves (see
    /// [`LiveTokenBucket`] for what a change does to a key's bucket). Keys
    /// first seen from now on start in the new quota.
    ///
    /// The change converts each held key's word, one shard at a time under
    /// that shard's writer lock (the lock inserts and sweeps take; decisions
    /// on held keys take none and go on meanwhile, each on the quota its
    /// key's word belongs to). It costs a walk over every key, so it is for
    /// a changed configuration, not for every request. Changes are
    /// serialized.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{KeyedBuilder, LiveTokenBucket, ManualClock, Quota};
    ///
    /// let limiter = KeyedBuilder::<String, _>::new(LiveTokenBucket::new(Quota::per_minute(10)?)?)
    ///     .clock(ManualClock::new())
    ///     .build()?;
    /// assert!(limiter.try_acquire_n("alice", 8)?.is_allowed());
    /// limiter.set_quota(Quota::per_minute(5)?)?;
    /// assert_eq!(limiter.remaining("alice"), 2); // kept, within the new 5
    /// assert_eq!(limiter.remaining("bob"), 5); // a new key: the new quota
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`LiveTokenBucket::with_ceiling`]: the quota is refused, and nothing
    /// changes, when it is above the bucket's ceiling or does not fit its
    /// word.
    pub fn set_quota(&self, quota: Quota) -> Result<(), QuotaError> {
        let inner = &*self.inner;
        let change = inner.algorithm.begin(quota)?;
        let busy = inner.collector.enter();
        for shard in inner.shards.iter() {
            let locked = shard.lock(&busy);
            // Read under the lock, as a sweep does.
            let now = inner.clock.now();
            locked.for_each_held(|cell| cell.convert(|word| change.convert(word, now)));
        }
        Ok(())
    }

    /// The quota in force.
    pub fn quota(&self) -> Quota {
        self.inner.algorithm.quota()
    }
}

impl<K, A: fmt::Debug, C: fmt::Debug, S> fmt::Debug for KeyedLimiter<K, A, C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedLimiter")
            // Relaxed: a snapshot for display.
            .field("keys", &self.inner.len.load(Ordering::Relaxed))
            .field("max_keys", &self.inner.max_keys)
            .field("shards", &self.inner.shards.len())
            .field("algorithm", &self.inner.algorithm)
            .field("clock", &self.inner.clock)
            .finish_non_exhaustive()
    }
}

#[cfg(not(turnstile_loom))]
pub use sweeper::Sweeper;

#[cfg(not(turnstile_loom))]
mod sweeper {
    use core::fmt;
    use core::hash::{BuildHasher, Hash};
    use core::time::Duration;
    use std::sync::{Arc, Weak};
    use std::thread::{self, JoinHandle};

    use super::{Inner, KeyedLimiter};
    use crate::algorithm::Algorithm;
    use crate::clock::Clock;
    use crate::error::KeyedConfigError;
    use crate::sync::{AtomicBool, Ordering};

    /// A background thread sweeping a [`KeyedLimiter`] every interval; dropping
    /// the handle stops it. It holds the limiter weakly, so it also stops once the
    /// limiter is dropped. Keep it for as long as the sweeping should go on
    /// (`let _sweeper = ...`, not `let _ = ...` or a bare statement, both of
    /// which drop it at once).
    #[must_use = "dropping the Sweeper stops its thread at once: keep it in a binding"]
    pub struct Sweeper {
        stop: Arc<AtomicBool>,
        thread: Option<JoinHandle<()>>,
    }

    /// Start a thread sweeping `inner` every `interval` (not zero).
    pub(super) fn spawn<K, A, C, S>(
        inner: Weak<Inner<K, A, C, S>>,
        interval: Duration,
    ) -> std::io::Result<Sweeper>
    where
        K: Hash + Eq + Send + Sync + 'static,
        A: Algorithm + Send + Sync + 'static,
        C: Clock + 'static,
        S: BuildHasher + Send + Sync + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            thread::Builder::new()
                .name("turnstile-sweeper".into())
                .spawn(move || {
                    loop {
                        thread::park_timeout(interval);
                        // Acquire: pairs with the Release in `drop`, though the flag
                        // publishes nothing but itself.
                        if stop.load(Ordering::Acquire) {
                            return;
                        }
                        let Some(inner) = inner.upgrade() else {
                            return;
                        };
                        inner.sweep();
                    }
                })?
        };
        Ok(Sweeper {
            stop,
            thread: Some(thread),
        })
    }

    impl<K, A, C, S> KeyedLimiter<K, A, C, S>
    where
        K: Hash + Eq + Send + Sync + 'static,
        A: Algorithm + Send + Sync + 'static,
        C: Clock + 'static,
        S: BuildHasher + Send + Sync + 'static,
    {
        /// The limiter, with a thread of its own that sweeps every shard, one at
        /// a time, every `interval`, and stops when the limiter is dropped. Idle
        /// keys are then reclaimed even while no request comes, wherever the
        /// limiter is (inside a [`Gate`](crate::Gate), behind a tower layer). A
        /// sweeper started earlier this way is replaced.
        ///
        /// ```
        /// use std::time::Duration;
        /// use turnstile::{Gate, KeyedLimiter, Quota};
        ///
        /// let limiter = KeyedLimiter::<String>::builder(Quota::per_second(10)?)
        ///     .max_keys(100_000)
        ///     .build()?
        ///     .with_sweeper(Duration::from_secs(10))?;
        /// let gate = Gate::new(limiter);
        /// # drop(gate);
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        ///
        /// # Errors
        ///
        /// [`KeyedConfigError::ZeroSweepInterval`] for a zero interval, and
        /// [`KeyedConfigError::SweeperThread`] when the thread could not start.
        pub fn with_sweeper(mut self, interval: Duration) -> Result<Self, KeyedConfigError> {
            if interval.is_zero() {
                return Err(KeyedConfigError::ZeroSweepInterval);
            }
            let sweeper = spawn(Arc::downgrade(&self.inner), interval)
                .map_err(|e| KeyedConfigError::SweeperThread { kind: e.kind() })?;
            self.sweeper = Some(sweeper);
            Ok(self)
        }

        /// Start a thread that sweeps every shard, one at a time, every `interval`,
        /// for a limiter shared through an `Arc`; the thread stops when the handle
        /// or the limiter is dropped.
        ///
        /// ```
        /// use std::sync::Arc;
        /// use std::time::Duration;
        /// use turnstile::{KeyedLimiter, Quota};
        ///
        /// let limiter = Arc::new(KeyedLimiter::<u64>::new(Quota::per_second(10)?));
        /// // Kept in a binding: the thread sweeps for as long as `_sweeper` lives.
        /// let _sweeper = limiter.start_sweeper(Duration::from_secs(1))?;
        /// assert!(limiter.try_acquire(&7).is_allowed());
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        ///
        /// # Errors
        ///
        /// `InvalidInput` for a zero interval, or the thread could not be spawned.
        pub fn start_sweeper(self: &Arc<Self>, interval: Duration) -> std::io::Result<Sweeper> {
            if interval.is_zero() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "sweeper interval is zero; it must be at least 1 ns (seconds are typical)",
                ));
            }
            spawn(Arc::downgrade(&self.inner), interval)
        }
    }

    impl Drop for Sweeper {
        fn drop(&mut self) {
            // Release: see the thread's load.
            self.stop.store(true, Ordering::Release);
            if let Some(thread) = self.thread.take() {
                thread.thread().unpark();
                let _ = thread.join();
            }
        }
    }

    impl fmt::Debug for Sweeper {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("Sweeper").finish_non_exhaustive()
        }
    }
}
