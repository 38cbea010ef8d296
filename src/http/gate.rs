//! The HTTP gate, independent of any framework: a request's key in, a status
//! and headers out.

use core::any::Any;
use core::borrow::Borrow;
use core::hash::{BuildHasher, Hash};
use core::time::Duration;
use std::borrow::Cow;

use crate::algorithm::gcra::Gcra;
use crate::algorithm::live::LiveTokenBucket;
use crate::algorithm::switch::LiveGcra;
use crate::algorithm::token_bucket::TokenBucket;
use crate::wait::reserve::Lend;

use crate::admission::{Receipt, Stage};
use crate::algorithm::Algorithm;
use crate::clock::Clock;
use crate::decision::KeyedDecision;
use crate::error::AcquireError;
use crate::keyed::tiered::Tiered;
use crate::keyed::{KeyedLimiter, KeyedStats};
use crate::limiter::{Counter, RateLimiter};
use crate::reclaim::thread_slot;
use crate::sync::{AtomicBool, Ordering};
use crate::tally::Tally;

pub use crate::http::outcome::Outcome;
pub use crate::http::policy::{AdvertisedQuota, PolicyError, RateLimitPolicy};
#[cfg(feature = "tower")]
use crate::http::policy::{Fields, policy_fields, policy_fields_with};

/// A limiter as an HTTP gate: no key is a 401, a key over its limit a 429
/// with `Retry-After` in whole seconds rounded up, a new key past the key
/// bound a 503 with `Retry-After`; `RateLimit` header fields optionally.
///
/// `L` is the limiter: a [`KeyedLimiter`] (the default, with `String` keys),
/// a [`Tiered`] set of them, or a [`RateLimiter`], one limit for every
/// request whatever its key ([`Gate::new`]).
///
/// ```
/// use turnstile::{Gate, KeyedLimiter, Outcome, Quota};
///
/// let gate = Gate::new(KeyedLimiter::<String>::new(Quota::per_second(2)?));
/// assert_eq!(gate.check(Some("alice")).status(), 200);
/// assert_eq!(gate.check(None::<&str>), Outcome::Unauthorized);
///
/// let outcome = gate.check(Some("alice"));
/// let outcome = if outcome.is_admitted() { gate.check(Some("alice")) } else { outcome };
/// assert_eq!(outcome.status(), 429);
/// assert_eq!(gate.headers(&outcome), vec![("Retry-After", "1".to_string())]);
/// # Ok::<(), turnstile::QuotaError>(())
/// ```
///
/// **Choosing the key.** Use an authenticated key (an API key or user id
/// checked before the gate) where there is one. The peer address is the
/// fallback for anonymous traffic, but users behind one NAT share it. A
/// forwarded header (`X-Forwarded-For`) is client input: trust it only from
/// proxies you run, or any client can claim a fresh address per request and
/// never be limited. Keys from unauthenticated input can be forged in any
/// number, so give them a limiter with a tight `max_keys`: past it, new keys get
/// 503 and memory stays bounded.
///
/// **Counting and shadow mode.** [`stats`](Self::stats) counts what the gate
/// answered (200, 401, 429, 503) with no locked instruction per request, in
/// per-thread counters of its own: decisions made on the limiter directly
/// ([`limiter`](Self::limiter), [`tiers`](Self::tiers)) are not among them.
/// In shadow mode ([`shadow`](Self::shadow),
/// [`set_shadow`](Self::set_shadow)) every denial is decided and counted but
/// answered 200 (with `remaining: 0`): a way to try a limit on live traffic
/// before enforcing it.
///
/// **Tiers.** [`Gate::tiered`] puts a [`Tiered`] set of keyed limiters
/// (different quotas for different keys) behind the gate instead of one
/// limiter; `L`, the limiter's type, is then that `Tiered`.
///
/// ```
/// use turnstile::{Gate, KeyedLimiter, Quota, Tiered};
///
/// let tiers = Tiered::new(
///     [
///         ("free", KeyedLimiter::<String>::new(Quota::per_minute(1)?)),
///         ("paid", KeyedLimiter::<String>::new(Quota::per_minute(100)?)),
///     ],
///     |key: &str| usize::from(key.starts_with("paid_")),
/// )?;
/// let gate = Gate::tiered(tiers);
/// assert_eq!(gate.check(Some("free_1")).status(), 200);
/// assert_eq!(gate.check(Some("free_1")).status(), 429);
/// assert_eq!(gate.check(Some("paid_1")).status(), 200);
/// assert_eq!(gate.check(Some("paid_1")).status(), 200);
/// assert_eq!(gate.stats().too_many_requests, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Gate<L = KeyedLimiter<String>> {
    limiter: L,
    policy: Option<RateLimitPolicy>,
    /// Set by `with_derived_policy`: the fields are derived at each answer
    /// from the key's own limit, under this name (with `.tier` for tiers).
    derived: Option<String>,
    /// `policy`'s `RateLimit-Policy` item, written once: what every answer
    /// advertising that policy sends.
    #[cfg(feature = "tower")]
    policy_item: Option<Box<[u8]>>,
    shadow: AtomicBool,
    counts: Tally<6>,
}

/// The gate's own counters, beside the limiter's.
const UNAUTHORIZED: usize = 0;
const SHADOWED_RATE: usize = 1;
const SHADOWED_KEY_LIMIT: usize = 2;
const TOO_MANY: usize = 3;
const UNAVAILABLE: usize = 4;
const ADMITTED: usize = 5;

/// `policy`'s `RateLimit-Policy` item.
#[cfg(feature = "tower")]
fn policy_item(policy: &RateLimitPolicy) -> Box<[u8]> {
    let mut item = Vec::with_capacity(48);
    policy.push_policy_item(&mut item);
    item.into()
}

/// What a [`Gate`] answered ([`Gate::stats`]). Each counter is read in turn,
/// not all at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GateStats {
    /// 200s: requests admitted, including denials let through in shadow mode.
    pub admitted: u64,
    /// 401s: requests without a key.
    pub unauthorized: u64,
    /// 429s: requests over their key's limit.
    pub too_many_requests: u64,
    /// 503s: requests for a new key while the key bound was full.
    pub unavailable: u64,
    /// Requests the limiter denied (429) that shadow mode admitted.
    pub shadowed_too_many_requests: u64,
    /// Requests the key bound refused (503) that shadow mode admitted.
    pub shadowed_unavailable: u64,
    /// Keys held now.
    pub keys: usize,
    /// Keys evicted by sweeps.
    pub evicted: u64,
}

/// What a [`Gate`] decides with, for keys looked up as `Q`: a
/// [`KeyedLimiter`] ([`Gate::new`]) or a [`Tiered`] set of them
/// ([`Gate::tiered`]). Sealed: implemented for those two only.
pub trait GateLimiter<Q: ?Sized>: LimiterStats {
    /// The limiter that decides a key: the limiter itself, or for tiers
    /// one tier's.
    #[doc(hidden)]
    type Decider: GateLimiter<Q> + ?Sized;
    /// The limiter that decides `key` ([`Decider`](Self::Decider)), and the
    /// name of its tier for a limiter with tiers: asked once per request,
    /// so a tier function is called once and every step of the request is
    /// decided, counted and advertised in the one tier it named.
    #[doc(hidden)]
    fn decider(&self, key: &Q) -> (&Self::Decider, Option<&str>);
    /// One permit for `key`.
    #[doc(hidden)]
    fn acquire(&self, key: &Q) -> KeyedDecision;
    /// `n` permits for `key`.
    #[doc(hidden)]
    fn acquire_n(&self, key: &Q, n: u32) -> Result<KeyedDecision, AcquireError>;
    /// The most permits one request can ever get, whatever its key (for
    /// tiers, the smallest tier's).
    #[doc(hidden)]
    fn min_capacity(&self) -> u32;
    /// The most permits one request for `key` can get now (its tier's
    /// capacity, for tiers; a live quota's current one).
    #[doc(hidden)]
    fn capacity_for(&self, key: &Q) -> u32 {
        let _ = key;
        self.min_capacity()
    }
    /// Whether every key shares one allowance (a direct limiter, whatever
    /// key it is asked for): a response about one client must not drain it.
    #[doc(hidden)]
    fn one_allowance(&self) -> bool {
        false
    }
    /// `n` permits for `key` (`1 <= n <= min_capacity()`), and the receipt
    /// that gives them back; for one limit of several deciding a request
    /// together, so a denial is counted in the limiter's stats at once, an
    /// admission only by [`stage_count_admission`](Self::stage_count_admission)
    /// ([`Stage::take_pending`](crate::chain::Stage::take_pending)).
    #[doc(hidden)]
    fn stage_take(&self, key: &Q, n: u32) -> (KeyedDecision, Option<Receipt>);
    /// Count the admission of a [`stage_take`](Self::stage_take) for `key`:
    /// every limit admitted the request.
    #[doc(hidden)]
    fn stage_count_admission(&self, key: &Q);
    /// [`Clock::shared_readings`] of the clock every decision of this
    /// limiter reads; `None` when it has none, or its tiers' differ.
    #[doc(hidden)]
    fn shared_readings(&self) -> Option<usize> {
        None
    }
    /// A reading of that clock.
    #[doc(hidden)]
    fn reading(&self) -> u64 {
        0
    }
    /// [`stage_take`](Self::stage_take) at `now`, a reading of a clock whose
    /// readings are this limiter's (the same
    /// [`shared_readings`](Self::shared_readings)).
    #[doc(hidden)]
    fn stage_take_at(&self, key: &Q, n: u32, now: u64) -> (KeyedDecision, Option<Receipt>) {
        let _ = now;
        self.stage_take(key, n)
    }
    /// `n` permits for `key` (`1 <= n <=` the key's capacity), not counted in
    /// the limiter's stats (a combined layer settling a response's cost: no
    /// decision on a request); whether they were taken.
    #[doc(hidden)]
    fn settle_take(&self, key: &Q, n: u32) -> bool;
    /// Give back what [`stage_take`](Self::stage_take) took for `key`, exactly
    /// or not at all.
    #[doc(hidden)]
    fn stage_give_back(&self, key: &Q, receipt: Receipt) -> bool;
    /// The decision `n` permits for `key` would get now, taking nothing.
    #[doc(hidden)]
    fn stage_peek(&self, key: &Q, n: u32) -> KeyedDecision;
    /// What `key`'s limit may advertise ([`Algorithm::advertise`]), with the
    /// name of its tier when the limiter has tiers.
    #[doc(hidden)]
    fn advertise_for(&self, key: &Q) -> Option<Advertised<'_>>;
    /// The names of the tiers, for a limiter with tiers; empty otherwise.
    #[doc(hidden)]
    fn tier_names(&self) -> Vec<&str> {
        Vec::new()
    }
    /// Take `n` more permits for `key` from the limiter's future, when it
    /// can lend (a token bucket or GCRA, as [`RateLimiter::reserve_n`] does,
    /// at most one fill time ahead): the permits taken, 0 when it cannot. Requests
    /// after it wait for the refills it took.
    #[doc(hidden)]
    fn stage_owe(&self, key: &Q, n: u32) -> u32
    where
        Self: 'static,
    {
        let _ = (key, n);
        0
    }
    /// What every key's limit advertises, for a limiter without tiers;
    /// `None` for tiers (each key's tier says) or when nothing is advertised.
    #[doc(hidden)]
    fn advertise_untiered(&self) -> Option<(u32, core::time::Duration)> {
        None
    }
}

/// What one key's limit may advertise: `q` permits at once, again after `w`,
/// and the name of the key's tier, if any.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Advertised<'a> {
    pub quota: u32,
    pub window: core::time::Duration,
    pub tier: Option<&'a str>,
}

impl<'a> Advertised<'a> {
    /// As advertised in `tier` ([`GateLimiter::decider`]'s name): a tier's
    /// own limiter knows no tier.
    #[cfg(feature = "tower")]
    #[inline]
    pub(crate) fn in_tier(self, tier: Option<&'a str>) -> Advertised<'a> {
        Advertised {
            tier: tier.or(self.tier),
            ..self
        }
    }

    fn untiered((quota, window): (u32, core::time::Duration)) -> Advertised<'static> {
        Advertised {
            quota,
            window,
            tier: None,
        }
    }
}

/// The counts of the limiter behind a [`Gate`] (for a [`Tiered`] set,
/// summed over its tiers). Sealed: implemented for [`KeyedLimiter`] and
/// [`Tiered`] only.
pub trait LimiterStats: sealed::Sealed {
    /// The counts now.
    #[doc(hidden)]
    fn limiter_stats(&self) -> KeyedStats;
}

mod sealed {
    pub trait Sealed {}
    impl<K, A, C, S> Sealed for crate::keyed::KeyedLimiter<K, A, C, S> {}
    impl<K, F, A, C, S> Sealed for crate::keyed::tiered::Tiered<K, F, A, C, S> {}
    impl<A, C, M> Sealed for crate::limiter::RateLimiter<A, C, M> {}
}

impl<K, A, C, S> LimiterStats for KeyedLimiter<K, A, C, S>
where
    K: Hash + Eq,
    A: Algorithm,
    C: Clock,
    S: BuildHasher,
{
    fn limiter_stats(&self) -> KeyedStats {
        self.stats()
    }
}

impl<K, A, C, S, Q> GateLimiter<Q> for KeyedLimiter<K, A, C, S>
where
    K: Hash + Eq + Borrow<Q>,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    A: Algorithm,
    C: Clock,
    S: BuildHasher,
{
    type Decider = Self;

    #[inline(always)]
    fn decider(&self, _key: &Q) -> (&Self, Option<&str>) {
        (self, None)
    }

    #[inline]
    fn acquire(&self, key: &Q) -> KeyedDecision {
        self.try_acquire(key)
    }

    #[inline]
    fn acquire_n(&self, key: &Q, n: u32) -> Result<KeyedDecision, AcquireError> {
        self.try_acquire_n(key, n)
    }

    fn min_capacity(&self) -> u32 {
        self.algorithm().capacity()
    }

    #[inline]
    fn stage_take(&self, key: &Q, n: u32) -> (KeyedDecision, Option<Receipt>) {
        self.stage(key).take_pending(n)
    }

    fn stage_count_admission(&self, key: &Q) {
        self.stage(key).count_admission();
    }

    fn settle_take(&self, key: &Q, n: u32) -> bool {
        self.take_uncounted(key, n)
    }

    fn shared_readings(&self) -> Option<usize> {
        self.clock().shared_readings()
    }

    #[inline]
    fn reading(&self) -> u64 {
        self.clock().now()
    }

    #[inline]
    fn stage_take_at(&self, key: &Q, n: u32, now: u64) -> (KeyedDecision, Option<Receipt>) {
        self.stage(key).take_pending_at(n, now)
    }

    fn stage_give_back(&self, key: &Q, receipt: Receipt) -> bool {
        self.stage(key).give_back(receipt)
    }

    fn stage_peek(&self, key: &Q, n: u32) -> KeyedDecision {
        self.stage(key).peek_within(n)
    }

    fn advertise_for(&self, _key: &Q) -> Option<Advertised<'_>> {
        self.algorithm().advertise().map(Advertised::untiered)
    }

    fn advertise_untiered(&self) -> Option<(u32, core::time::Duration)> {
        self.algorithm().advertise()
    }

    fn stage_owe(&self, key: &Q, n: u32) -> u32
    where
        Self: 'static,
    {
        /// The loan through reservations that are kept.
        fn lend<K, A, C, S, Q>(bucket: &KeyedLimiter<K, A, C, S>, key: &Q, n: u32) -> u32
        where
            K: Hash + Eq + Borrow<Q>,
            Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
            A: Lend,
            C: Clock,
            S: BuildHasher,
        {
            owe(bucket.algorithm().capacity(), n, |n| {
                bucket.reserve_counted(key, n, Duration::MAX, false).is_ok()
            })
        }
        let this: &dyn Any = self;
        if let Some(bucket) = this.downcast_ref::<KeyedLimiter<K, TokenBucket, C, S>>() {
            return lend(bucket, key, n);
        }
        if let Some(bucket) = this.downcast_ref::<KeyedLimiter<K, LiveTokenBucket, C, S>>() {
            return lend(bucket, key, n);
        }
        if let Some(meter) = this.downcast_ref::<KeyedLimiter<K, Gcra, C, S>>() {
            return lend(meter, key, n);
        }
        if let Some(meter) = this.downcast_ref::<KeyedLimiter<K, LiveGcra, C, S>>() {
            return lend(meter, key, n);
        }
        0
    }
}

/// Lend up to `n` permits in batches of at most `capacity`, halving a batch
/// the bucket refuses (it lends at most one fill ahead): the permits lent.
fn owe(capacity: u32, n: u32, mut lend: impl FnMut(u32) -> bool) -> u32 {
    let mut left = n;
    let mut batch = n.min(capacity);
    while left > 0 && batch > 0 {
        if lend(batch) {
            left -= batch;
            batch = batch.min(left);
        } else {
            batch /= 2;
        }
    }
    n - left
}

impl<K, F, A, C, S> LimiterStats for Tiered<K, F, A, C, S>
where
    K: Hash + Eq,
    A: Algorithm,
    C: Clock,
    S: BuildHasher,
{
    fn limiter_stats(&self) -> KeyedStats {
        let mut sum = KeyedStats::default();
        for (_, stats) in self.tier_stats() {
            sum.keys += stats.keys;
            sum.admitted += stats.admitted;
            sum.denied += stats.denied;
            sum.denied_key_limit += stats.denied_key_limit;
            sum.evicted += stats.evicted;
        }
        sum
    }
}

impl<K, F, A, C, S, Q> GateLimiter<Q> for Tiered<K, F, A, C, S>
where
    F: Fn(&Q) -> usize,
    K: Hash + Eq + Borrow<Q>,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    A: Algorithm,
    C: Clock,
    S: BuildHasher,
{
    type Decider = KeyedLimiter<K, A, C, S>;

    #[inline(always)]
    fn decider(&self, key: &Q) -> (&KeyedLimiter<K, A, C, S>, Option<&str>) {
        let (limiter, name) = self.resolve(key);
        (limiter, Some(name))
    }

    #[inline]
    fn acquire(&self, key: &Q) -> KeyedDecision {
        self.try_acquire(key)
    }

    #[inline]
    fn acquire_n(&self, key: &Q, n: u32) -> Result<KeyedDecision, AcquireError> {
        self.try_acquire_n(key, n)
    }

    fn min_capacity(&self) -> u32 {
        (0..self.len_tiers())
            .filter_map(|i| self.tier(i))
            .map(|tier| tier.algorithm().capacity())
            .min()
            .unwrap_or(0)
    }

    fn capacity_for(&self, key: &Q) -> u32 {
        self.limiter_of(key).algorithm().capacity()
    }

    #[inline]
    fn stage_take(&self, key: &Q, n: u32) -> (KeyedDecision, Option<Receipt>) {
        self.limiter_of(key).stage(key).take_pending(n)
    }

    fn stage_count_admission(&self, key: &Q) {
        self.limiter_of(key).stage(key).count_admission();
    }

    fn settle_take(&self, key: &Q, n: u32) -> bool {
        self.limiter_of(key).take_uncounted(key, n)
    }

    fn shared_readings(&self) -> Option<usize> {
        let mut tiers = (0..self.len_tiers()).filter_map(|i| self.tier(i));
        let first = tiers.next()?.clock().shared_readings()?;
        tiers
            .all(|tier| tier.clock().shared_readings() == Some(first))
            .then_some(first)
    }

    #[inline]
    fn reading(&self) -> u64 {
        self.tier(0).map_or(0, |tier| tier.clock().now())
    }

    #[inline]
    fn stage_take_at(&self, key: &Q, n: u32, now: u64) -> (KeyedDecision, Option<Receipt>) {
        self.limiter_of(key).stage(key).take_pending_at(n, now)
    }

    fn stage_give_back(&self, key: &Q, receipt: Receipt) -> bool {
        self.limiter_of(key).stage(key).give_back(receipt)
    }

    fn stage_peek(&self, key: &Q, n: u32) -> KeyedDecision {
        self.limiter_of(key).stage(key).peek_within(n)
    }

    fn advertise_for(&self, key: &Q) -> Option<Advertised<'_>> {
        let (limiter, tier) = self.resolve(key);
        let (quota, window) = limiter.algorithm().advertise()?;
        Some(Advertised {
            quota,
            window,
            tier: Some(tier),
        })
    }

    fn tier_names(&self) -> Vec<&str> {
        self.names().collect()
    }

    fn stage_owe(&self, key: &Q, n: u32) -> u32
    where
        Self: 'static,
    {
        GateLimiter::<Q>::stage_owe(self.limiter_of(key), key, n)
    }
}

impl<A, C, M> LimiterStats for RateLimiter<A, C, M>
where
    A: Algorithm,
    C: Clock,
    M: Counter,
{
    /// No keys, no evictions: the gate counts its own answers.
    fn limiter_stats(&self) -> KeyedStats {
        KeyedStats::default()
    }
}

/// Every key, and a request without one, is decided by the one limiter: a
/// limit on the whole service. (A request without a key is still a 401: the
/// gate answers that before asking the limiter.)
impl<A, C, M, Q> GateLimiter<Q> for RateLimiter<A, C, M>
where
    A: Algorithm,
    C: Clock,
    M: Counter,
    Q: ?Sized,
{
    type Decider = Self;

    #[inline(always)]
    fn decider(&self, _key: &Q) -> (&Self, Option<&str>) {
        (self, None)
    }

    #[inline]
    fn acquire(&self, _key: &Q) -> KeyedDecision {
        self.try_acquire().into()
    }

    #[inline]
    fn acquire_n(&self, _key: &Q, n: u32) -> Result<KeyedDecision, AcquireError> {
        self.try_acquire_n(n).map(Into::into)
    }

    fn min_capacity(&self) -> u32 {
        self.capacity()
    }

    fn one_allowance(&self) -> bool {
        true
    }

    #[inline]
    fn stage_take(&self, _key: &Q, n: u32) -> (KeyedDecision, Option<Receipt>) {
        Stage::take_pending(self, n)
    }

    fn stage_count_admission(&self, _key: &Q) {
        Stage::count_admission(self);
    }

    fn settle_take(&self, _key: &Q, n: u32) -> bool {
        self.take_counted(n, self.clock().now(), false)
            .0
            .is_allowed()
    }

    fn shared_readings(&self) -> Option<usize> {
        self.clock().shared_readings()
    }

    #[inline]
    fn reading(&self) -> u64 {
        self.clock().now()
    }

    #[inline]
    fn stage_take_at(&self, _key: &Q, n: u32, now: u64) -> (KeyedDecision, Option<Receipt>) {
        self.take_pending_at(n, now)
    }

    fn stage_give_back(&self, _key: &Q, receipt: Receipt) -> bool {
        Stage::give_back(self, receipt)
    }

    fn stage_peek(&self, _key: &Q, n: u32) -> KeyedDecision {
        Stage::peek_within(self, n)
    }

    fn advertise_for(&self, _key: &Q) -> Option<Advertised<'_>> {
        self.algorithm().advertise().map(Advertised::untiered)
    }

    fn advertise_untiered(&self) -> Option<(u32, core::time::Duration)> {
        self.algorithm().advertise()
    }

    fn stage_owe(&self, _key: &Q, n: u32) -> u32
    where
        Self: 'static,
    {
        /// The loan through reservations that are kept.
        fn lend<A: Lend, C: Clock, M: Counter>(bucket: &RateLimiter<A, C, M>, n: u32) -> u32 {
            owe(bucket.capacity(), n, |n| {
                bucket.reserve_counted(n, Duration::MAX, false).is_ok()
            })
        }
        let this: &dyn Any = self;
        if let Some(bucket) = this.downcast_ref::<RateLimiter<TokenBucket, C, M>>() {
            return lend(bucket, n);
        }
        if let Some(bucket) = this.downcast_ref::<RateLimiter<LiveTokenBucket, C, M>>() {
            return lend(bucket, n);
        }
        if let Some(meter) = this.downcast_ref::<RateLimiter<Gcra, C, M>>() {
            return lend(meter, n);
        }
        if let Some(meter) = this.downcast_ref::<RateLimiter<LiveGcra, C, M>>() {
            return lend(meter, n);
        }
        0
    }
}

impl<K, A: AdvertisedQuota, C, S> Gate<KeyedLimiter<K, A, C, S>> {
    /// Add `RateLimit-Policy` and `RateLimit` header fields derived from the
    /// limiter's algorithm ([`RateLimitPolicy::from_algorithm`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Gate, KeyedLimiter, Quota};
    ///
    /// let limiter = KeyedLimiter::<String>::new(Quota::new(3, 1, Duration::from_secs(10))?);
    /// let gate = Gate::new(limiter).with_derived_policy("api")?;
    /// assert_eq!(gate.policy().unwrap().policy_value(), "\"api\";q=3;w=30");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`PolicyError::Name`] for a name that could break the header's syntax.
    pub fn with_derived_policy(self, name: &str) -> Result<Self, PolicyError> {
        let policy = RateLimitPolicy::from_algorithm(name, self.limiter.algorithm())?;
        Ok(self.derive(name, Some(policy)))
    }
}

impl<A: AdvertisedQuota + Algorithm, C: Clock, M: Counter> Gate<RateLimiter<A, C, M>> {
    /// Add `RateLimit-Policy` and `RateLimit` header fields derived from the
    /// limiter's algorithm, as for a keyed limiter: the quota is the whole
    /// service's.
    ///
    /// ```
    /// use turnstile::{Gate, Quota, RateLimiter};
    ///
    /// let gate = Gate::new(RateLimiter::new(Quota::per_second(100)?)).with_derived_policy("all")?;
    /// assert_eq!(gate.policy().unwrap().policy_value(), "\"all\";q=100;w=1");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`PolicyError::Name`] for a name that could break the header's syntax.
    pub fn with_derived_policy(self, name: &str) -> Result<Self, PolicyError> {
        let policy = RateLimitPolicy::from_algorithm(name, self.limiter.algorithm())?;
        Ok(self.derive(name, Some(policy)))
    }
}

impl<K, F, A: AdvertisedQuota, C, S> Gate<Tiered<K, F, A, C, S>> {
    /// Add `RateLimit-Policy` and `RateLimit` header fields derived, for each
    /// request, from its key's own tier: one policy per tier, named
    /// `name.tier` (`"api.free";q=10;w=1` for a key of the `free` tier), its
    /// quota and window derived from the tier's algorithm as for one keyed
    /// limiter, and read at each answer (a tier's quota changed with
    /// [`Tiered::set_quota`] is advertised from then on).
    ///
    /// ```
    /// use turnstile::{Gate, KeyedLimiter, Quota, Tiered};
    ///
    /// let tiers = Tiered::new(
    ///     [
    ///         ("free", KeyedLimiter::<String>::new(Quota::per_second(10)?)),
    ///         ("paid", KeyedLimiter::<String>::new(Quota::per_second(100)?)),
    ///     ],
    ///     |key: &str| usize::from(key.starts_with("paid_")),
    /// )?;
    /// let gate = Gate::tiered(tiers).with_derived_policy("api")?;
    /// let outcome = gate.check(Some("paid_1"));
    /// assert_eq!(
    ///     gate.headers_for(Some("paid_1"), &outcome),
    ///     vec![
    ///         ("RateLimit-Policy", "\"api.paid\";q=100;w=1".to_string()),
    ///         ("RateLimit", "\"api.paid\";r=99".to_string()),
    ///     ]
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`PolicyError::Name`] when `name`, or `name.tier` for some tier, could
    /// break the header's syntax.
    pub fn with_derived_policy(self, name: &str) -> Result<Self, PolicyError> {
        for tier in self.limiter.names() {
            RateLimitPolicy::new(
                &format!("{name}.{tier}"),
                1,
                core::time::Duration::from_secs(1),
            )?;
        }
        Ok(self.derive(name, None))
    }
}

impl<K, F, A, C, S> Gate<Tiered<K, F, A, C, S>> {
    /// A gate in front of `tiers`: each key is decided by its tier's limiter
    /// (see [`Tiered`]), without `RateLimit` header fields (the tiers' quotas
    /// differ; [`with_policy`](Gate::with_policy) sets one for all). The same
    /// as [`Gate::new`].
    pub fn tiered(tiers: Tiered<K, F, A, C, S>) -> Self {
        Gate::new(tiers)
    }

    /// The tiers behind the gate.
    pub fn tiers(&self) -> &Tiered<K, F, A, C, S> {
        &self.limiter
    }
}

impl<L> Gate<L> {
    /// A gate in front of `limiter`, without `RateLimit` header fields: a
    /// [`KeyedLimiter`] (a limit per key), a [`Tiered`] set of them (a quota
    /// per kind of key) or a [`RateLimiter`] (one limit for every request,
    /// whatever its key: no keyed map, no key bound).
    ///
    /// ```
    /// use turnstile::{Gate, Quota, RateLimiter};
    ///
    /// // One limit for the whole service: the key is not looked at.
    /// let gate = Gate::new(RateLimiter::new(Quota::per_minute(1)?));
    /// assert_eq!(gate.check(Some("alice")).status(), 200);
    /// assert_eq!(gate.check(Some("bob")).status(), 429);
    /// # Ok::<(), turnstile::QuotaError>(())
    /// ```
    pub fn new(limiter: L) -> Gate<L> {
        Gate {
            limiter,
            policy: None,
            derived: None,
            #[cfg(feature = "tower")]
            policy_item: None,
            shadow: AtomicBool::new(false),
            counts: Tally::new(),
        }
    }

    /// The limiter behind the gate.
    pub fn limiter(&self) -> &L {
        &self.limiter
    }

    /// This gate in shadow mode: decide and count every request, and deny none
    /// for its rate: a 429 or 503 is answered 200 and counted as shadowed. A
    /// request without a valid key is still answered 401: it has no key to be
    /// limited under, so letting it through would let it past the limit once
    /// enforced too (and a layer still answers 500 for a missing peer
    /// address).
    ///
    /// ```
    /// use turnstile::{Gate, KeyedLimiter, Quota};
    ///
    /// let gate = Gate::new(KeyedLimiter::<String>::new(Quota::per_minute(1)?)).shadow();
    /// assert_eq!(gate.check(Some("alice")).status(), 200);
    /// assert_eq!(gate.check(Some("alice")).status(), 200); // would be 429
    /// let stats = gate.stats();
    /// assert_eq!((stats.admitted, stats.too_many_requests), (2, 0));
    /// assert_eq!(stats.shadowed_too_many_requests, 1);
    /// gate.set_shadow(false);
    /// assert_eq!(gate.check(Some("alice")).status(), 429);
    /// gate.set_shadow(true);
    /// assert_eq!(gate.check(None::<&str>).status(), 401); // no key: not a rate decision
    /// # Ok::<(), turnstile::QuotaError>(())
    /// ```
    pub fn shadow(self) -> Gate<L> {
        self.set_shadow(true);
        self
    }

    /// Turn shadow mode on or off, from any thread, while serving.
    pub fn set_shadow(&self, shadow: bool) {
        // Relaxed: a switch read on its own; a request decided just after the
        // change may still see the old mode.
        self.shadow.store(shadow, Ordering::Relaxed);
    }

    /// Whether the gate is in shadow mode.
    pub fn is_shadow(&self) -> bool {
        // Relaxed: as in `set_shadow`.
        self.shadow.load(Ordering::Relaxed)
    }

    /// Add `RateLimit-Policy` and `RateLimit` header fields to every answer
    /// ([`headers`](Self::headers)).
    pub fn with_policy(self, policy: RateLimitPolicy) -> Gate<L> {
        Gate {
            #[cfg(feature = "tower")]
            policy_item: Some(policy_item(&policy)),
            policy: Some(policy),
            derived: None,
            ..self
        }
    }

    /// The `RateLimit` header policy, if one is set: as given to
    /// [`with_policy`](Self::with_policy), or as derived when
    /// `with_derived_policy` was called. `None` for tiers, whose policy is
    /// each key's tier's ([`policy_for`](Self::policy_for)).
    pub fn policy(&self) -> Option<&RateLimitPolicy> {
        self.policy.as_ref()
    }

    /// Keep the derived policy's name, with a snapshot for [`policy`](Self::policy).
    fn derive(self, name: &str, snapshot: Option<RateLimitPolicy>) -> Gate<L> {
        Gate {
            #[cfg(feature = "tower")]
            policy_item: snapshot.as_ref().map(policy_item),
            policy: snapshot,
            derived: Some(name.to_owned()),
            ..self
        }
    }

    /// `outcome` as an HTTP response with an empty body (feature `tower`,
    /// for the `http` crate's types): its status, and the fields of
    /// [`headers`](Self::headers) (with a derived policy, use
    /// [`headers_for`](Self::headers_for) the key: see there). For a handler that calls the gate itself
    /// and answers a denial at once (an admitted request gets the handler's
    /// own response, with [`headers`](Self::headers) added if a policy is
    /// set).
    ///
    /// ```
    /// use turnstile::{Gate, KeyedLimiter, Quota};
    ///
    /// let gate = Gate::new(KeyedLimiter::<String>::new(Quota::per_hour(1)?));
    /// let _ = gate.check(Some("alice"));
    /// let outcome = gate.check(Some("alice"));
    /// let response: http::Response<String> = gate.response(&outcome);
    /// assert_eq!(response.status(), http::StatusCode::TOO_MANY_REQUESTS);
    /// assert_eq!(response.headers()["retry-after"], "3600");
    /// // No key: 401, with the challenge RFC 9110 requires.
    /// let anonymous: http::Response<String> = gate.response(&gate.check(None::<&str>));
    /// assert_eq!(anonymous.status(), http::StatusCode::UNAUTHORIZED);
    /// assert_eq!(anonymous.headers()["www-authenticate"], "ApiKey");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "tower")]
    pub fn response<B: Default>(&self, outcome: &Outcome) -> http::Response<B> {
        let mut response = http::Response::new(B::default());
        *response.status_mut() = http::StatusCode::from_u16(outcome.status())
            .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
        for (name, value) in self.headers(outcome) {
            // The names are valid (`from_bytes` lowers their case); the values
            // are numbers and validated policy text.
            if let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(name.as_bytes()),
                http::HeaderValue::from_str(&value),
            ) {
                response.headers_mut().insert(name, value);
            }
        }
        response
    }

    /// The header fields to send with `outcome`: `Retry-After` (whole
    /// seconds, rounded up) on 429 and 503, `WWW-Authenticate: ApiKey` on a
    /// 401 (RFC 9110 requires a challenge there; the tower layer sends its
    /// extractor's, which names the header it reads), and the `RateLimit`
    /// fields when a policy is set. Empty (and not allocated) for an admitted
    /// request without a policy.
    ///
    /// The policy is [`policy`](Self::policy): the one set by hand, or the
    /// snapshot taken when the policy was derived. A derived policy of tiers
    /// has no snapshot (each key has its tier's: no fields here), and one of
    /// a live limiter is the quota of the moment it was derived, which a
    /// quota changed since makes stale (a `RateLimit` remaining above its
    /// policy's quota). With a derived policy, send
    /// [`headers_for`](Self::headers_for) the request's key instead, which
    /// reads the key's limit now.
    pub fn headers(&self, outcome: &Outcome) -> Vec<(&'static str, String)> {
        let mut headers = Vec::new();
        if let Some(secs) = outcome.retry_after_secs() {
            headers.push(("Retry-After", secs.to_string()));
        }
        if matches!(outcome, Outcome::Unauthorized) {
            headers.push(("WWW-Authenticate", "ApiKey".to_string()));
        }
        if let Some(policy) = &self.policy
            && let Some(value) = policy.value(outcome)
        {
            headers.push(("RateLimit-Policy", policy.policy_value()));
            headers.push(("RateLimit", value));
        }
        headers
    }
}

impl<L> Gate<L> {
    /// The policy `key`'s answers advertise: the one set with
    /// [`with_policy`](Self::with_policy), or the one derived now from
    /// `key`'s own limit (its tier's, for tiers) when `with_derived_policy`
    /// was called; `None` when no policy is set.
    pub fn policy_for<Q>(&self, key: &Q) -> Option<RateLimitPolicy>
    where
        L: GateLimiter<Q>,
        Q: ?Sized,
    {
        self.advertised(key).map(Cow::into_owned)
    }

    /// [`policy_for`](Self::policy_for), borrowing a policy set by hand.
    #[inline]
    pub(crate) fn advertised<Q>(&self, key: &Q) -> Option<Cow<'_, RateLimitPolicy>>
    where
        L: GateLimiter<Q>,
        Q: ?Sized,
    {
        self.advertised_as(|| self.limiter.advertise_for(key))
    }

    /// [`advertised`](Self::advertised), with what the key's limit
    /// advertises found by `advertise` (asked only for a derived policy).
    #[inline]
    fn advertised_as<'a>(
        &'a self,
        advertise: impl FnOnce() -> Option<Advertised<'a>>,
    ) -> Option<Cow<'a, RateLimitPolicy>> {
        let Some(name) = &self.derived else {
            return self.policy.as_ref().map(Cow::Borrowed);
        };
        let advertised = advertise()?;
        let window = advertised.window.max(core::time::Duration::from_secs(1));
        match advertised.tier {
            Some(tier) => RateLimitPolicy::new(&format!("{name}.{tier}"), advertised.quota, window),
            None => RateLimitPolicy::new(name, advertised.quota, window),
        }
        .ok()
        .map(Cow::Owned)
    }

    /// The `RateLimit-Policy` and `RateLimit` values of `key`'s answer
    /// `outcome`: those of [`advertised`](Self::advertised), with the policy
    /// item written once when `key`'s policy is the gate's own (set by hand,
    /// or derived from a limiter without tiers whose quota is still the one
    /// it was derived from). The layer asks [`check_fields`](Self::check_fields),
    /// which decides too; the tests ask this.
    #[cfg(all(test, feature = "tower"))]
    pub(crate) fn fields<Q>(&self, key: &Q, outcome: &Outcome) -> Option<Fields>
    where
        L: GateLimiter<Q>,
        Q: ?Sized,
    {
        self.fields_as(self.limiter.advertise_for(key), outcome)
    }

    /// [`fields`](Self::fields) of a key whose limit advertises
    /// `advertised`.
    #[cfg(feature = "tower")]
    #[inline]
    fn fields_as(&self, advertised: Option<Advertised<'_>>, outcome: &Outcome) -> Option<Fields> {
        if let (Some(policy), Some(item)) = (&self.policy, &self.policy_item) {
            let own = self.derived.is_none()
                || advertised.is_some_and(|advertised| {
                    advertised.tier.is_none()
                        && policy.advertises(advertised.quota, advertised.window)
                });
            if own {
                return Some(policy_fields_with(policy, item, outcome));
            }
        }
        self.advertised_as(|| advertised)
            .map(|policy| policy_fields(&policy, outcome))
    }

    /// As [`headers`](Self::headers), with the policy advertised for `key`
    /// ([`policy_for`](Self::policy_for)): for tiers, the key's own tier's.
    /// `None` is a request without a key (401: no policy fields).
    pub fn headers_for<Q>(&self, key: Option<&Q>, outcome: &Outcome) -> Vec<(&'static str, String)>
    where
        L: GateLimiter<Q>,
        Q: ?Sized,
    {
        let mut headers = Vec::new();
        if let Some(secs) = outcome.retry_after_secs() {
            headers.push(("Retry-After", secs.to_string()));
        }
        if matches!(outcome, Outcome::Unauthorized) {
            headers.push(("WWW-Authenticate", "ApiKey".to_string()));
        }
        if let Some(policy) = key.and_then(|key| self.policy_for(key))
            && let Some(value) = policy.value(outcome)
        {
            headers.push(("RateLimit-Policy", policy.policy_value()));
            headers.push(("RateLimit", value));
        }
        headers
    }
}

impl<L: LimiterStats> Gate<L> {
    /// What the gate has answered so far.
    pub fn stats(&self) -> GateStats {
        let limiter: KeyedStats = self.limiter.limiter_stats();
        let shadowed_rate = self.counts.sum(SHADOWED_RATE);
        let shadowed_key_limit = self.counts.sum(SHADOWED_KEY_LIMIT);
        GateStats {
            admitted: self.counts.sum(ADMITTED) + shadowed_rate + shadowed_key_limit,
            unauthorized: self.counts.sum(UNAUTHORIZED),
            too_many_requests: self.counts.sum(TOO_MANY),
            unavailable: self.counts.sum(UNAVAILABLE),
            shadowed_too_many_requests: shadowed_rate,
            shadowed_unavailable: shadowed_key_limit,
            keys: limiter.keys,
            evicted: limiter.evicted,
        }
    }

    /// The outcome to answer for the limiter's `outcome`, counted.
    ///
    /// The gate counts the 429s and 503s it answers itself rather than
    /// deriving them from the limiter's denials less the shadowed ones: each
    /// count then only grows, as a counter must, even while shadowed denials
    /// are being counted between two reads.
    #[inline(always)]
    fn answer(&self, outcome: Outcome) -> Outcome {
        let (enforced, shadowed) = match outcome {
            Outcome::Admitted { .. } => {
                self.counts.add(ADMITTED, thread_slot());
                return outcome;
            }
            Outcome::Unauthorized => {
                self.counts.add(UNAUTHORIZED, thread_slot());
                return outcome;
            }
            Outcome::TooManyRequests { .. } => (TOO_MANY, SHADOWED_RATE),
            Outcome::Unavailable { .. } => (UNAVAILABLE, SHADOWED_KEY_LIMIT),
        };
        if !self.is_shadow() {
            self.counts.add(enforced, thread_slot());
            return outcome;
        }
        self.counts.add(shadowed, thread_slot());
        Outcome::Admitted { remaining: 0 }
    }

    /// Decide a request by its key; `None` when it has none.
    #[inline]
    pub fn check<Q>(&self, key: Option<&Q>) -> Outcome
    where
        L: GateLimiter<Q>,
        Q: ?Sized,
    {
        self.answer(Outcome::from_decision(
            key.map(|key| self.limiter.acquire(key)),
        ))
    }

    /// [`check`](Self::check) and the request's [`fields`](Self::fields),
    /// from one call of a tier function: the key is decided and advertised
    /// in the one tier it names.
    #[cfg(feature = "tower")]
    #[inline(always)]
    pub(crate) fn check_fields<Q>(&self, key: Option<&Q>, fields: &mut Option<Fields>) -> Outcome
    where
        L: GateLimiter<Q>,
        Q: ?Sized,
    {
        let Some(key) = key else {
            return self.answer(Outcome::from_decision(None));
        };
        let (limiter, tier) = self.limiter.decider(key);
        let outcome = self.answer(Outcome::from_decision(Some(limiter.acquire(key))));
        let advertised = if self.derived.is_some() {
            limiter.advertise_for(key).map(|a| a.in_tier(tier))
        } else {
            None
        };
        *fields = self.fields_as(advertised, &outcome);
        outcome
    }

    /// Decide a request that costs `n` permits.
    ///
    /// # Errors
    ///
    /// As [`KeyedLimiter::try_acquire_n`]: `n = 0` or `n` above the capacity.
    /// A request without a key is a 401 whatever `n`.
    pub fn check_n<Q>(&self, key: Option<&Q>, n: u32) -> Result<Outcome, AcquireError>
    where
        L: GateLimiter<Q>,
        Q: ?Sized,
    {
        let outcome = match key {
            None => Outcome::Unauthorized,
            Some(key) => Outcome::from_decision(Some(self.limiter.acquire_n(key, n)?)),
        };
        Ok(self.answer(outcome))
    }
}

#[cfg(all(test, feature = "tower"))]
mod tests {
    use super::*;
    use crate::decision::RetryAfter;
    use crate::quota::Quota;

    /// `fields` against writing the advertised policy afresh, for `key`'s
    /// own answer now, a 401 and a 429.
    fn fields_are_the_advertised_ones<L: GateLimiter<str>>(gate: &Gate<L>, key: &str) {
        let denied = Outcome::from_decision(Some(KeyedDecision::Denied {
            retry_after: RetryAfter::from_nanos(1_500_000_000),
        }));
        for outcome in [gate.check(Some(key)), Outcome::Unauthorized, denied] {
            let afresh = gate
                .advertised(key)
                .map(|policy| policy_fields(&policy, &outcome));
            assert_eq!(gate.fields(key, &outcome), afresh, "{outcome:?}");
        }
    }

    fn policy_value(fields: Option<Fields>) -> String {
        let [policy, _] = fields.expect("a policy");
        policy.expect("a value").to_str().expect("ASCII").to_owned()
    }

    #[test]
    fn written_once_or_afresh_the_fields_are_the_same() {
        let quota = Quota::per_second(10).unwrap();
        let keyed = Gate::new(KeyedLimiter::<String>::new(quota))
            .with_derived_policy("api")
            .unwrap();
        fields_are_the_advertised_ones(&keyed, "alice");
        assert!(keyed.fields("alice", &Outcome::Unauthorized).is_some());

        let by_hand = Gate::new(KeyedLimiter::<String>::new(quota))
            .with_policy(RateLimitPolicy::new("hand", 5, Duration::from_secs(60)).unwrap());
        fields_are_the_advertised_ones(&by_hand, "alice");
        let outcome = Outcome::Admitted { remaining: 0 };
        assert_eq!(
            policy_value(by_hand.fields("bob", &outcome)),
            "\"hand\";q=5;w=60"
        );

        let direct = Gate::new(RateLimiter::new(Quota::per_minute(100).unwrap()))
            .with_derived_policy("all")
            .unwrap();
        fields_are_the_advertised_ones(&direct, "anyone");

        let tiers = Tiered::new(
            [
                ("free", KeyedLimiter::<String>::new(quota)),
                (
                    "paid",
                    KeyedLimiter::<String>::new(Quota::per_second(100).unwrap()),
                ),
            ],
            |key: &str| usize::from(key.starts_with("paid_")),
        )
        .unwrap();
        let tiered = Gate::tiered(tiers).with_derived_policy("api").unwrap();
        fields_are_the_advertised_ones(&tiered, "free_1");
        fields_are_the_advertised_ones(&tiered, "paid_1");
    }

    /// A live quota changed after the policy was derived: the item written
    /// once is not the key's policy any more, and the new one is advertised.
    #[test]
    fn a_changed_live_quota_is_advertised_not_the_item_written_once() {
        let limiter =
            KeyedLimiter::<String, LiveTokenBucket>::live(Quota::per_second(10).unwrap()).unwrap();
        let gate = Gate::new(limiter).with_derived_policy("api").unwrap();
        let outcome = Outcome::Admitted { remaining: 3 };
        assert_eq!(policy_value(gate.fields("k", &outcome)), "\"api\";q=10;w=1");
        gate.limiter()
            .set_quota(Quota::per_minute(5).unwrap())
            .unwrap();
        fields_are_the_advertised_ones(&gate, "k");
        assert_eq!(policy_value(gate.fields("k", &outcome)), "\"api\";q=5;w=60");
    }
}
