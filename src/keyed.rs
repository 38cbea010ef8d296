//! Per-key limiting: a sharded map from key to one word, with lossless sweeping
//! and a bound on the keys held.

use core::borrow::Borrow;
use core::fmt;
use core::hash::{BuildHasher, Hash};
use core::marker::PhantomData;

use crossbeam_utils::CachePadded;
use hashbrown::HashTable;

use crate::algorithm::Algorithm;
use crate::cell::Cell;
use crate::clock::{Clock, RealClock, saturating_nanos};
use crate::decision::{Decision, KeyedDecision, RetryAfter};
use crate::error::{AcquireError, KeyedConfigError};
use crate::limiter::check_permits;
use crate::quota::Quota;
use crate::sync::{AtomicU64, AtomicUsize, Ordering, ShardLock, thread_slot};
use crate::token_bucket::TokenBucket;

/// The default bound on keys held.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;
/// The default number of inserts after which a shard sweeps itself.
pub const DEFAULT_SWEEP_EVERY: usize = 1_024;
const MAX_SHARDS: usize = 1 << 16;
/// hashbrown takes the top 7 bits of a hash for its control bytes and the low
/// bits for the bucket index; the shard comes from the bits just below the top 7.
const SHARD_HASH_TOP: u32 = 57;
/// Admitted and denied requests are counted in this many cache-padded slots, one
/// chosen per thread.
const COUNTER_SLOTS: usize = 16;
/// A shard at the key bound sweeps again at most this often (clock time), so a
/// flood of new keys cannot make every request pay for a sweep.
const BOUND_SWEEP_COOLDOWN_NS: u64 = 1_000_000;

/// A rate limiter per key (API key, user, IP address): each key has its own
/// bucket, so one client's burst cannot spend another's tokens.
///
/// Keys live in a power-of-two number of shards, each a cache-padded
/// reader-writer lock around a hash table from key to one 64-bit word. A decision
/// on a known key hashes the key once, takes its shard's lock shared, and runs one
/// compare-and-swap on the key's word: no allocation, no key clone. `String` keys
/// are looked up by `&str`.
///
/// # Memory that stays bounded, and sweeping that loses nothing
///
/// A key is evicted only when its word is indistinguishable from a fresh one (for
/// a token bucket: the bucket would be full by now), never by a timer alone, so a
/// key that comes back finds exactly the allowance it would have had. A sweep holds
/// its shard's lock exclusively, one shard at a time, and every decision holds its
/// shard's lock shared, so no decision can be in flight on a word while it is
/// judged and removed. Sweeps run on [`sweep`](Self::sweep), after every
/// `sweep_every` inserts into a shard (amortized, at least as many as the shard
/// held after its last sweep), and from an optional background
/// [`Sweeper`](Self::start_sweeper).
///
/// At most `max_keys` keys are held. A new key beyond the bound first sweeps its
/// shard; if there is still no room the request is denied with
/// [`KeyedDecision::KeyLimit`], distinct from a rate denial, and nothing is stored.
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
    shards: Box<[CachePadded<Shard<K>>]>,
    /// `shards.len() - 1`.
    shard_mask: usize,
    /// `SHARD_HASH_TOP - log2(shards.len())`.
    shard_shift: u32,
    hasher: S,
    algorithm: A,
    clock: C,
    max_keys: usize,
    sweep_every: usize,
    /// Keys held, across shards. Written only by inserts and sweeps, which hold a
    /// shard's exclusive lock anyway; decisions on known keys never touch it.
    len: CachePadded<AtomicUsize>,
    /// Admitted and denied counts, by thread slot: a decision writes only its own
    /// thread's line, never one another core is writing.
    counters: Box<[CachePadded<Counters>]>,
}

/// One shard: its table behind a lock whose readers write only their own
/// thread's cache line.
struct Shard<K> {
    table: ShardLock<Table<K>>,
}

#[derive(Default)]
struct Counters {
    admitted: AtomicU64,
    denied: AtomicU64,
}

/// What a shard's exclusive lock guards.
struct Table<K> {
    entries: HashTable<(K, Cell)>,
    /// Inserts since the last sweep, and how many trigger the next.
    inserts_since_sweep: usize,
    sweep_threshold: usize,
    /// Clock reading of the last sweep.
    last_sweep: u64,
    denied_key_limit: u64,
    evicted: u64,
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
    /// costs O(1) per insert amortized (default [`DEFAULT_SWEEP_EVERY`]).
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
        let now = self.clock.now();
        let shard_array = (0..shards)
            .map(|_| {
                CachePadded::new(Shard {
                    table: ShardLock::new(Table {
                        entries: HashTable::new(),
                        inserts_since_sweep: 0,
                        sweep_threshold: self.sweep_every,
                        last_sweep: now,
                        denied_key_limit: 0,
                        evicted: 0,
                    }),
                })
            })
            .collect();
        KeyedLimiter {
            shards: shard_array,
            shard_mask: shards - 1,
            shard_shift: SHARD_HASH_TOP - shards.trailing_zeros(),
            hasher: self.hasher,
            algorithm: self.algorithm,
            clock: self.clock,
            max_keys: self.max_keys,
            sweep_every: self.sweep_every,
            len: CachePadded::new(AtomicUsize::new(0)),
            counters: (0..COUNTER_SLOTS).map(|_| CachePadded::default()).collect(),
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
        self.decide(key, 1)
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
        check_permits(n, self.algorithm.capacity())?;
        Ok(self.decide(key, n))
    }

    /// The permits `key` could get now, without taking any and without storing
    /// the key.
    pub fn remaining<Q>(&self, key: &Q) -> u32
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let now = self.clock.now();
        self.algorithm.remaining(self.word_of(key), now)
    }

    #[inline(always)]
    fn decide<Q>(&self, key: &Q, n: u32) -> KeyedDecision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        let now = self.clock.now();
        {
            let table = shard.table.read();
            if let Some((_, cell)) = table.entries.find(hash, |(k, _)| k.borrow() == key) {
                // The plain decision, not `take`'s pair: returning the written word
                // too kept the pair on the stack, and reading the decision back
                // across two stores cost a failed store forward (3 ns a denial).
                // Written out rather than through `on_held`: the closure form
                // cost 49 more instructions per check (callgrind, 1M keys).
                let decision = cell.apply(&self.algorithm, now, n);
                self.count(decision);
                return decision.into();
            }
        }
        self.insert_and_decide(key, hash, shard, now, n).0
    }

    /// Decide for `key` at `now`, also returning the word an admission wrote.
    pub(crate) fn take<Q>(&self, key: &Q, now: u64, n: u32) -> (KeyedDecision, Option<u64>)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        match self.on_held(key, hash, shard, |cell| self.decide_on(cell, now, n)) {
            Some(taken) => taken,
            None => self.insert_and_decide(key, hash, shard, now, n),
        }
    }

    /// `f` on `key`'s cell under its shard's shared lock, if the key is held.
    #[inline(always)]
    fn on_held<Q, R>(
        &self,
        key: &Q,
        hash: u64,
        shard: &Shard<K>,
        f: impl FnOnce(&Cell) -> R,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let table = shard.table.read();
        let (_, cell) = table.entries.find(hash, |(k, _)| k.borrow() == key)?;
        Some(f(cell))
    }

    /// A key not in its shard: take the shard exclusively, and insert the key
    /// unless another thread did meanwhile. Two first requests for one key share
    /// one bucket.
    #[inline(never)]
    fn insert_and_decide<Q>(
        &self,
        key: &Q,
        hash: u64,
        shard: &Shard<K>,
        now: u64,
        n: u32,
    ) -> (KeyedDecision, Option<u64>)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut table = shard.table.write();
        if let Some((_, cell)) = table.entries.find(hash, |(k, _)| k.borrow() == key) {
            return self.decide_on(cell, now, n);
        }
        let (decision, next) = self.algorithm.decide(self.algorithm.fresh(), now, n);
        let Some(next) = next else {
            // The word would stay fresh: nothing to remember.
            self.count(decision);
            return (decision.into(), None);
        };
        if table.inserts_since_sweep >= table.sweep_threshold {
            self.sweep_table(&mut table, now);
        }
        if !self.reserve_key() {
            // At the bound: sweep this shard first, unless it just did.
            let since = now.wrapping_sub(table.last_sweep);
            if since >= BOUND_SWEEP_COOLDOWN_NS || table.inserts_since_sweep > 0 {
                self.sweep_table(&mut table, now);
            }
            if !self.reserve_key() {
                table.denied_key_limit += 1;
                let retry_after =
                    RetryAfter::from_nanos(saturating_nanos(self.algorithm.fresh_after_idle()));
                return (KeyedDecision::KeyLimit { retry_after }, None);
            }
        }
        table
            .entries
            .insert_unique(hash, (key.to_owned(), Cell::new(next)), |(k, _)| {
                self.hasher.hash_one(k)
            });
        table.inserts_since_sweep += 1;
        self.count(decision);
        (decision.into(), Some(next))
    }

    /// Take one key slot under the bound.
    fn reserve_key(&self) -> bool {
        // Relaxed: the count publishes nothing. Each insert or eviction is ordered
        // with the table change by its shard's exclusive lock; the count only has to
        // stay within the bound, which the compare-and-swap alone ensures.
        let mut held = self.len.load(Ordering::Relaxed);
        loop {
            if held >= self.max_keys {
                return false;
            }
            match self.len.compare_exchange_weak(
                held,
                held + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => held = actual,
            }
        }
    }

    /// Evict every fresh-equivalent word of a shard whose exclusive lock is held.
    fn sweep_table(&self, table: &mut Table<K>, now: u64) -> usize {
        let before = table.entries.len();
        table
            .entries
            .retain(|(_, cell)| !self.algorithm.is_fresh_equivalent(cell.load(), now));
        let evicted = before - table.entries.len();
        if evicted > 0 {
            // Relaxed: as in `reserve_key`.
            self.len.fetch_sub(evicted, Ordering::Relaxed);
            table.evicted += evicted as u64;
            // Give memory back once the table is mostly empty.
            if table.entries.len() < table.entries.capacity() / 4 {
                table
                    .entries
                    .shrink_to_fit(|(k, _)| self.hasher.hash_one(k));
            }
        }
        table.inserts_since_sweep = 0;
        table.sweep_threshold = self.sweep_every.max(table.entries.len());
        table.last_sweep = now;
        evicted
    }

    /// Sweep every shard, one at a time: evict the keys whose buckets are
    /// indistinguishable from fresh ones. Returns how many were evicted.
    pub fn sweep(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                let now = self.clock.now();
                self.sweep_table(&mut shard.table.write(), now)
            })
            .sum()
    }

    /// Keys held now.
    pub fn len(&self) -> usize {
        // Relaxed: a snapshot of a counter.
        self.len.load(Ordering::Relaxed)
    }

    /// `true` when no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counters summed over the shards and thread slots (each read in turn, not
    /// at one instant).
    pub fn stats(&self) -> KeyedStats {
        let mut stats = KeyedStats {
            keys: self.len(),
            ..KeyedStats::default()
        };
        for counters in self.counters.iter() {
            // Relaxed: counters, read for reporting.
            stats.admitted += counters.admitted.load(Ordering::Relaxed);
            stats.denied += counters.denied.load(Ordering::Relaxed);
        }
        for shard in self.shards.iter() {
            let table = shard.table.read();
            stats.denied_key_limit += table.denied_key_limit;
            stats.evicted += table.evicted;
        }
        stats
    }

    /// Decide on a key's word, which the caller's shard guard keeps in place.
    #[inline(always)]
    fn decide_on(&self, cell: &Cell, now: u64, n: u32) -> (KeyedDecision, Option<u64>) {
        let (decision, written) = cell.take(&self.algorithm, now, n);
        self.count(decision);
        (decision.into(), written)
    }

    /// The decision `key` would get for `n` permits at `now`, taking nothing and
    /// storing nothing.
    pub(crate) fn peek<Q>(&self, key: &Q, now: u64, n: u32) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.algorithm.decide(self.word_of(key), now, n).0
    }

    /// Give back `n` permits an admission for `key` took (see
    /// [`Algorithm::refund`]). A key swept since holds a fresh word, which owes
    /// nothing.
    pub(crate) fn refund<Q>(&self, key: &Q, written: u64, n: u32)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        self.on_held(key, hash, self.shard(hash), |cell| {
            cell.refund(&self.algorithm, written, n);
        });
    }

    /// The word of `key`, or a fresh one for a key not held.
    fn word_of<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        self.on_held(key, hash, self.shard(hash), Cell::load)
            .unwrap_or_else(|| self.algorithm.fresh())
    }

    #[inline(always)]
    fn count(&self, decision: Decision) {
        let counters = &self.counters[thread_slot() % COUNTER_SLOTS];
        let counter = if decision.is_allowed() {
            &counters.admitted
        } else {
            &counters.denied
        };
        // Relaxed: counters publish nothing; `stats` reads totals.
        counter.fetch_add(1, Ordering::Relaxed);
    }

    #[inline(always)]
    fn shard(&self, hash: u64) -> &Shard<K> {
        &self.shards[(hash >> self.shard_shift) as usize & self.shard_mask]
    }
}

impl<K, A, C, S> KeyedLimiter<K, A, C, S> {
    /// The most keys held at once.
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// The number of shards.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The algorithm and its parameters.
    pub fn algorithm(&self) -> &A {
        &self.algorithm
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }
}

impl<K, A: fmt::Debug, C: fmt::Debug, S> fmt::Debug for KeyedLimiter<K, A, C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedLimiter")
            // Relaxed: a snapshot for display.
            .field("keys", &self.len.load(Ordering::Relaxed))
            .field("max_keys", &self.max_keys)
            .field("shards", &self.shards.len())
            .field("algorithm", &self.algorithm)
            .field("clock", &self.clock)
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

    use super::KeyedLimiter;
    use crate::algorithm::Algorithm;
    use crate::clock::Clock;
    use crate::sync::{AtomicBool, Ordering};

    /// A background thread sweeping a [`KeyedLimiter`] every interval; dropping
    /// the handle stops it. It holds the limiter weakly, so it also stops once the
    /// limiter is dropped.
    pub struct Sweeper {
        stop: Arc<AtomicBool>,
        thread: Option<JoinHandle<()>>,
    }

    impl<K, A, C, S> KeyedLimiter<K, A, C, S>
    where
        K: Hash + Eq + Send + Sync + 'static,
        A: Algorithm + Send + Sync + 'static,
        C: Clock + 'static,
        S: BuildHasher + Send + Sync + 'static,
    {
        /// Start a thread that sweeps every shard, one at a time, every `interval`.
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
            let stop = Arc::new(AtomicBool::new(false));
            let limiter: Weak<Self> = Arc::downgrade(self);
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
                            let Some(limiter) = limiter.upgrade() else {
                                return;
                            };
                            limiter.sweep();
                        }
                    })?
            };
            Ok(Sweeper {
                stop,
                thread: Some(thread),
            })
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
