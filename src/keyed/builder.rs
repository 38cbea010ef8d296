//! Building a keyed limiter: [`KeyedLimiter::new`] and
//! [`KeyedLimiter::builder`] with the defaults, and [`KeyedBuilder`] with its
//! checks.

use core::fmt;
use core::hash::BuildHasher;
use core::marker::PhantomData;

use crossbeam_utils::CachePadded;

use super::table::{self, Shard};
use super::{DEFAULT_MAX_KEYS, DEFAULT_SWEEP_EVERY, Inner, KeyedLimiter, MAX_SHARDS};
use crate::algorithm::Algorithm;
use crate::algorithm::token_bucket::TokenBucket;
use crate::clock::{Clock, RealClock};
use crate::error::KeyedConfigError;
use crate::quota::Quota;
use crate::reclaim::Collector;
use crate::sync::{Arc, AtomicU64, AtomicUsize};
use crate::tally::Tally;

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
    pub(super) fn assemble(self, shards: usize) -> KeyedLimiter<K, A, C, S>
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

pub(super) fn default_shards() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores * 4).next_power_of_two().min(MAX_SHARDS)
}
