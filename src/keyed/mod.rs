//! Per-key limiting: a sharded map from key to one word, read without locks,
//! swept without loss, and bounded in the keys it holds.

use core::borrow::Borrow;
use core::fmt;
use core::hash::{BuildHasher, Hash};

use crossbeam_utils::CachePadded;

use crate::admission::{Admission, admit};
use crate::algorithm::Algorithm;
use crate::cell::Cell;

/// An admission by one key of a [`KeyedLimiter`], to give back with
/// [`Admission::refund`] ([`KeyedLimiter::try_acquire_refundable`]).
pub type KeyedAdmission<'a, K, Q, A, C, S> = Admission<KeyedStage<'a, K, Q, A, C, S>>;
use crate::algorithm::not_yet::NotYet;
use crate::algorithm::token_bucket::TokenBucket;
use crate::clock::{Clock, RealClock};
use crate::decision::KeyedDecision;
use crate::error::AcquireError;
use crate::error::check_permits;
use crate::reclaim::{Busy, Collector};
use crate::sync::{Arc, AtomicU64, AtomicUsize, Ordering};
use crate::tally::Tally;

mod access;
mod bound;
mod builder;
mod live;
mod stage;
mod stats;
mod sweep;
#[allow(unsafe_code)]
mod table;
pub(crate) mod tiered;

pub use builder::KeyedBuilder;
pub use stage::KeyedStage;
pub use stats::KeyedStats;
#[cfg(not(turnstile_loom))]
pub use sweep::Sweeper;
use table::{Counts, Locked, NEVER_SWEPT, NoRoom, Shard};

/// The default bound on keys held.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;
/// The default number of inserts after which a shard sweeps itself.
pub const DEFAULT_SWEEP_EVERY: usize = 1_024;
/// The shortest interval of a background sweeper
/// ([`KeyedLimiter::with_sweeper`], [`KeyedLimiter::start_sweeper`]): 1 ms.
///
/// Each sweep takes every shard's lock in turn and walks its table, and it
/// can only reclaim keys idle long enough to be as good as fresh; inserts
/// already sweep their shard as they go. A sweeper waking more often than
/// every millisecond would spend a core contending with requests for locks
/// and find next to nothing new, and below that the operating system's timers
/// stop honouring the sleep anyway (the thread spins). Seconds are typical.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(turnstile::MIN_SWEEP_INTERVAL, Duration::from_millis(1));
/// ```
pub const MIN_SWEEP_INTERVAL: core::time::Duration = core::time::Duration::from_millis(1);
const MAX_SHARDS: usize = 1 << 16;
/// A sweep that inserts trigger unlinks only keys idle for at least this long
/// (nanoseconds), as well as since the shard's previous sweep.
const AUTO_SWEEP_MIN_IDLE_NS: u64 = 1_000_000_000;

/// Table slots one request at the key bound examines, at most, to reclaim room
/// (its own shard first, then the others from where the last look stopped).
const RECLAIM_BUDGET: usize = 4_096;
/// After a reclaim that found nothing, requests at the bound are refused
/// without looking again for this long (clock time), or until every key
/// held can be fresh if that is sooner: a flood of new keys pays for one
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
/// a rate denial, and nothing is stored; for the next millisecond (or until
/// every key held can be fresh, if sooner) further new keys are refused
/// without looking again, so a flood of new keys does not make every request
/// pay for a search. The `retry_after` of a key-limit denial is the
/// algorithm's [idle-to-fresh time](Algorithm::fresh_after_idle) (a window's
/// words are fresh sooner: when the window of the denial ends, a sliding
/// window's one window later), plus, once
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
