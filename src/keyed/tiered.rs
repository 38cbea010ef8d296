//! Per-key quotas: keys sorted into tiers (free and paid API keys, say), each
//! tier a keyed limiter of its own (see [`Tiered`]).

use core::borrow::Borrow;
use core::fmt;
use core::hash::{BuildHasher, Hash};

use crate::algorithm::Algorithm;
use crate::algorithm::switch::Reconfigure;
use crate::algorithm::token_bucket::TokenBucket;
use crate::clock::{Clock, RealClock};
use crate::decision::KeyedDecision;
use crate::error::{AcquireError, QuotaError};
use crate::keyed::{KeyedLimiter, KeyedStats};

/// Different quotas for different keys: a keyed limiter per tier, and a
/// function that names a key's tier.
///
/// Each decision asks `tier_of` for the key's tier (an index into the tiers,
/// in the order given) and decides in that tier's [`KeyedLimiter`]: one word
/// per key, as in a single-quota limiter, and no lock. The function is called
/// on every decision, so make it cheap: a prefix of the key, a bit of it, a
/// lookup in a map you keep of paid keys. An index past the last tier means
/// the first tier: put the most restrictive tier first, so a key the function
/// cannot place gets the least.
///
/// **A key that changes tier** (an upgrade) starts the new tier with that
/// tier's fresh allowance, and its word in the old tier is swept once idle. So
/// for one change, a key may be admitted up to the new tier's capacity on top
/// of what the old tier admitted; a key cannot change tier on its own (the
/// function decides).
///
/// Each tier keeps its own key bound, sweeping and counters
/// ([`tier_stats`](Tiered::tier_stats)).
///
/// ```
/// use std::time::Duration;
/// use turnstile::{KeyedLimiter, Quota, Tiered};
///
/// let free = KeyedLimiter::<String>::new(Quota::per_minute(3)?);
/// let paid = KeyedLimiter::<String>::new(Quota::per_minute(1_000)?);
/// let per_key = Tiered::new(vec![("free", free), ("paid", paid)], |key: &str| {
///     usize::from(key.starts_with("k_paid_"))
/// })?;
/// for _ in 0..3 {
///     assert!(per_key.try_acquire("k_free_1").is_allowed());
/// }
/// assert!(!per_key.try_acquire("k_free_1").is_allowed()); // the free tier's 3
/// assert!(per_key.try_acquire("k_paid_1").is_allowed());
/// assert_eq!(per_key.remaining("k_paid_1"), 999);
/// assert_eq!(per_key.tier_name("k_paid_1"), "paid");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// **Naming the type** (to keep tiers in a struct or in a server's state):
/// `F` is the tier function's type, which a closure cannot name. Pass a
/// function pointer, `Tiered<String, fn(&str) -> usize>`, or a boxed
/// closure, `Tiered<String, Box<dyn Fn(&str) -> usize + Send + Sync>>` (a
/// closure that captures, such as a shared set of paid keys).
///
/// ```
/// use std::collections::HashSet;
/// use std::sync::Arc;
/// use turnstile::{KeyedLimiter, Quota, Tiered};
///
/// type TierOf = Box<dyn Fn(&str) -> usize + Send + Sync>;
///
/// struct AppState {
///     limits: Tiered<String, TierOf>,
/// }
///
/// let paid: Arc<HashSet<String>> = Arc::new(["k_7".to_owned()].into());
/// let tier_of: TierOf = Box::new(move |key| usize::from(paid.contains(key)));
/// let state = AppState {
///     limits: Tiered::new(
///         [
///             ("free", KeyedLimiter::new(Quota::per_minute(3)?)),
///             ("paid", KeyedLimiter::new(Quota::per_minute(1_000)?)),
///         ],
///         tier_of,
///     )?,
/// };
/// assert_eq!(state.limits.tier_name("k_7"), "paid");
/// assert_eq!(state.limits.tier_name("k_8"), "free");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Tiered<K, F, A = TokenBucket, C = RealClock, S = ahash::RandomState> {
    tiers: Box<[KeyedLimiter<K, A, C, S>]>,
    names: Box<[String]>,
    tier_of: F,
}

/// Why a [`Tiered`] limiter was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TieredError {
    /// No tiers: there would be no limiter to decide in.
    NoTiers,
    /// Two tiers have the same name.
    DuplicateName(String),
    /// [`set_quota`](Tiered::set_quota) named no tier.
    UnknownTier(String),
    /// [`set_quota`](Tiered::set_quota) was given a quota the tier cannot take.
    Quota(QuotaError),
}

impl fmt::Display for TieredError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TieredError::NoTiers => f.write_str("a tiered limiter needs at least one tier"),
            TieredError::DuplicateName(name) => write!(f, "two tiers are named {name:?}"),
            TieredError::UnknownTier(name) => write!(f, "no tier is named {name:?}"),
            TieredError::Quota(error) => write!(f, "the tier cannot take this quota: {error}"),
        }
    }
}

impl std::error::Error for TieredError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TieredError::Quota(error) => Some(error),
            _ => None,
        }
    }
}

impl<K, F, A: Reconfigure, C: Clock, S> Tiered<K, F, A, C, S> {
    /// Change tier `name`'s quota while traffic runs: every key of that tier
    /// moves to it ([`KeyedLimiter::set_quota`]), and the other tiers are
    /// untouched.
    ///
    /// ```
    /// use turnstile::{KeyedBuilder, LiveTokenBucket, Quota, Tiered};
    ///
    /// let tier = |per_minute| -> Result<_, Box<dyn std::error::Error>> {
    ///     let bucket = LiveTokenBucket::new(Quota::per_minute(per_minute)?)?;
    ///     Ok(KeyedBuilder::<String, _>::new(bucket).build()?)
    /// };
    /// let per_key = Tiered::new([("free", tier(3)?), ("paid", tier(100)?)], |key: &str| {
    ///     usize::from(key.starts_with("k_paid_"))
    /// })?;
    /// per_key.set_quota("free", Quota::per_minute(10)?)?;
    /// assert_eq!(per_key.remaining("k_free_1"), 10);
    /// assert!(per_key.set_quota("gold", Quota::per_minute(1)?).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TieredError::UnknownTier`] when no tier is named `name`, and
    /// [`TieredError::Quota`] when the tier cannot take `quota` (nothing
    /// changes then).
    pub fn set_quota(&self, name: &str, quota: A::Quota) -> Result<(), TieredError> {
        let index = self
            .names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| TieredError::UnknownTier(name.to_owned()))?;
        self.tiers[index]
            .set_quota(quota)
            .map_err(TieredError::Quota)
    }
}

impl<K, F, A, C, S> Tiered<K, F, A, C, S> {
    /// Tiers in order (index 0 first), each a name and a keyed limiter, and the
    /// function that gives a key's tier index.
    ///
    /// # Errors
    ///
    /// [`TieredError::NoTiers`] for an empty list, and
    /// [`TieredError::DuplicateName`] when two tiers share a name.
    pub fn new<N: Into<String>>(
        tiers: impl IntoIterator<Item = (N, KeyedLimiter<K, A, C, S>)>,
        tier_of: F,
    ) -> Result<Tiered<K, F, A, C, S>, TieredError> {
        let (names, tiers): (Vec<String>, Vec<_>) = tiers
            .into_iter()
            .map(|(name, limiter)| (name.into(), limiter))
            .unzip();
        if tiers.is_empty() {
            return Err(TieredError::NoTiers);
        }
        for (i, name) in names.iter().enumerate() {
            if names[..i].contains(name) {
                return Err(TieredError::DuplicateName(name.clone()));
            }
        }
        Ok(Tiered {
            tiers: tiers.into(),
            names: names.into(),
            tier_of,
        })
    }

    /// The tiers' names, in order.
    pub fn names(&self) -> impl ExactSizeIterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    /// How many tiers there are.
    pub(crate) fn len_tiers(&self) -> usize {
        self.tiers.len()
    }

    /// Tier `index`'s limiter, or `None` past the last.
    pub fn tier(&self, index: usize) -> Option<&KeyedLimiter<K, A, C, S>> {
        self.tiers.get(index)
    }

    /// The index `tier_of` gave, or 0 past the last tier.
    #[inline(always)]
    fn index(&self, tier: usize) -> usize {
        if tier < self.tiers.len() { tier } else { 0 }
    }
}

impl<K, F, A, C, S> Tiered<K, F, A, C, S>
where
    K: Hash + Eq,
    A: Algorithm,
    C: Clock,
    S: BuildHasher,
{
    /// The limiter for `key`'s tier (for the gate's stages).
    #[inline(always)]
    pub(crate) fn limiter_of<Q>(&self, key: &Q) -> &KeyedLimiter<K, A, C, S>
    where
        F: Fn(&Q) -> usize,
        Q: ?Sized,
    {
        self.limiter(key)
    }

    /// The limiter for `key`'s tier and the tier's name, from one call of
    /// the tier function.
    #[inline(always)]
    pub(crate) fn resolve<Q>(&self, key: &Q) -> (&KeyedLimiter<K, A, C, S>, &str)
    where
        F: Fn(&Q) -> usize,
        Q: ?Sized,
    {
        let index = self.index((self.tier_of)(key));
        (&self.tiers[index], &self.names[index])
    }

    /// The limiter for `key`'s tier.
    #[inline(always)]
    fn limiter<Q>(&self, key: &Q) -> &KeyedLimiter<K, A, C, S>
    where
        F: Fn(&Q) -> usize,
        Q: ?Sized,
    {
        &self.tiers[self.index((self.tier_of)(key))]
    }

    /// Ask for one permit for `key`, in its tier.
    #[inline]
    pub fn try_acquire<Q>(&self, key: &Q) -> KeyedDecision
    where
        F: Fn(&Q) -> usize,
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.limiter(key).try_acquire(key)
    }

    /// Ask for `n` permits for `key`, all or nothing, in its tier.
    ///
    /// # Errors
    ///
    /// As [`KeyedLimiter::try_acquire_n`]: `n = 0`, or `n` above the capacity
    /// of the key's tier.
    pub fn try_acquire_n<Q>(&self, key: &Q, n: u32) -> Result<KeyedDecision, AcquireError>
    where
        F: Fn(&Q) -> usize,
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.limiter(key).try_acquire_n(key, n)
    }

    /// The permits `key`'s bucket in its tier holds now, taking none (see
    /// [`KeyedLimiter::remaining`]: a key not held reports a fresh bucket's).
    pub fn remaining<Q>(&self, key: &Q) -> u32
    where
        F: Fn(&Q) -> usize,
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.limiter(key).remaining(key)
    }

    /// The name of `key`'s tier.
    pub fn tier_name<Q>(&self, key: &Q) -> &str
    where
        F: Fn(&Q) -> usize,
        Q: ?Sized,
    {
        &self.names[self.index((self.tier_of)(key))]
    }

    /// Sweep every tier; returns how many keys were evicted.
    pub fn sweep(&self) -> usize {
        self.tiers.iter().map(KeyedLimiter::sweep).sum()
    }

    /// Keys held, over every tier.
    pub fn len(&self) -> usize {
        self.tiers.iter().map(KeyedLimiter::len).sum()
    }

    /// `true` when no tier holds a key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Each tier's name and counters, in order.
    pub fn tier_stats(&self) -> Vec<(&str, KeyedStats)> {
        self.names
            .iter()
            .map(String::as_str)
            .zip(self.tiers.iter().map(KeyedLimiter::stats))
            .collect()
    }
}

impl<K, F, A: fmt::Debug, C: fmt::Debug, S> fmt::Debug for Tiered<K, F, A, C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tiered")
            .field("tiers", &self.names)
            .finish_non_exhaustive()
    }
}
