//! Leased mode: see [`LeasedLimiter`].

use core::fmt;
use core::time::Duration;
use std::collections::HashSet;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

use ::redis::{ConnectionLike, RedisResult, ScriptInvocation, Value};

use super::BlockingConnection;

use super::guarded::OnFailure;
use super::{GIVE_BACK, LEASE, RedisAlgorithm, RedisConfigError, RedisLimitError, RedisLimiter};
use crate::algorithm::Algorithm;
use crate::algorithm::token_bucket::TokenBucket;
use crate::clock::{Clock, RealClock};
use crate::decision::{Decision, KeyedDecision, RetryAfter};
use crate::error::AcquireError;
use crate::keyed::{KeyedBuilder, KeyedLimiter};
use crate::sync::{AtomicU64, Ordering};

/// The largest lease, `2^23 − 1`: a process holds at most a lease and a
/// quarter, which the word's 24-bit count holds.
pub const MAX_LEASE: u32 = (1 << 23) - 1;
/// The longest lease lifetime (the word's time field covers 208 days; an hour
/// keeps every comparison far from its end).
const MAX_LIFETIME: Duration = Duration::from_secs(3_600);

/// # The word of one key
///
/// | bits    | field                                                      |
/// |---------|------------------------------------------------------------|
/// | 0..24   | tokens of the lease held here; with `DENIED`, the tokens the denial's wait is for |
/// | 24..29  | size code `e`: lease size `min(2^e, L)`, low water a quarter of it |
/// | 29..61  | time, in units of `2^22` ns (4.19 ms): the lease's expiry, or with `DENIED` the end of a denial |
/// | 61      | `DRY`: the last prefetch found the bucket dry; none until this lease runs out |
/// | 62      | `DENIED`: Redis had no tokens until the time field          |
/// | 63      | `FETCHING`: a request is taking the next lease              |
///
/// The fresh word is 0: no tokens, size code 0, no flags. The time field
/// counts the local clock's nanoseconds since the limiter was built and
/// saturates after `2^54` ns (208 days); from then on every lease reads as
/// expired, and each request takes a lease of its own: a call per decision,
/// never more than the bucket grants, but each lease's tokens beyond the one
/// spent are stranded (not given back), so the process admits less than its
/// share. Rebuild a leased limiter that serves longer than that.
mod word {
    pub(super) const TOKENS_MASK: u64 = (1 << 24) - 1;
    pub(super) const SIZE_SHIFT: u32 = 24;
    pub(super) const SIZE_MASK: u64 = 0x1f;
    pub(super) const TIME_SHIFT: u32 = 29;
    pub(super) const TIME_MASK: u64 = (1 << 32) - 1;
    pub(super) const DRY: u64 = 1 << 61;
    pub(super) const DENIED: u64 = 1 << 62;
    pub(super) const FETCHING: u64 = 1 << 63;
    /// Nanoseconds per time unit, as a shift.
    pub(super) const UNIT_SHIFT: u32 = 22;

    pub(super) fn tokens(word: u64) -> u32 {
        (word & TOKENS_MASK) as u32
    }

    pub(super) fn size_code(word: u64) -> u32 {
        ((word >> SIZE_SHIFT) & SIZE_MASK) as u32
    }

    pub(super) fn time(word: u64) -> u64 {
        (word >> TIME_SHIFT) & TIME_MASK
    }

    pub(super) fn pack(tokens: u32, size_code: u32, time: u64, flags: u64) -> u64 {
        (u64::from(tokens) & TOKENS_MASK)
            | ((u64::from(size_code) & SIZE_MASK) << SIZE_SHIFT)
            | ((time & TIME_MASK) << TIME_SHIFT)
            | (flags & (DRY | DENIED | FETCHING))
    }

    pub(super) fn with_tokens(word: u64, tokens: u32) -> u64 {
        (word & !TOKENS_MASK) | (u64::from(tokens) & TOKENS_MASK)
    }

    /// Nanoseconds as whole units, rounded down; saturated at the field.
    pub(super) fn units_down(nanos: u64) -> u64 {
        (nanos >> UNIT_SHIFT).min(TIME_MASK)
    }

    /// Nanoseconds as whole units, rounded up; saturated at the field.
    pub(super) fn units_up(nanos: u64) -> u64 {
        nanos
            .saturating_add((1 << UNIT_SHIFT) - 1)
            .checked_shr(UNIT_SHIFT)
            .unwrap_or(0)
            .min(TIME_MASK)
    }

    pub(super) fn nanos(units: u64) -> u64 {
        units << UNIT_SHIFT
    }
}

/// The lease word as an algorithm for the keyed map: spend from a valid lease,
/// and say "ask Redis" (a denial with no wait) otherwise.
#[derive(Clone, Copy, Debug)]
struct LeaseWord {
    capacity: u32,
    lifetime: Duration,
}

impl LeaseWord {
    /// The tokens of `word` spendable at `now` (ns): none past the lease's
    /// expiry or during a denial.
    fn usable(word: u64, now: u64) -> u32 {
        if word & word::DENIED == 0 && word::units_down(now) < word::time(word) {
            word::tokens(word)
        } else {
            0
        }
    }

    /// The wait left of a denial kept in `word`, if one is running at `now`.
    fn denial(word: u64, now: u64) -> Option<RetryAfter> {
        let until = word::nanos(word::time(word));
        (word & word::DENIED != 0 && now < until).then(|| RetryAfter::from_nanos(until - now))
    }

    /// The wait left of a denial kept in `word` that answers a request for
    /// `n` permits: Redis' wait was for the tokens kept in the word's token
    /// field (what that request needed), which is when `n` are there too if
    /// `n` is no more. A larger request is not answered by it.
    fn denial_for(word: u64, now: u64, n: u32) -> Option<RetryAfter> {
        Self::denial(word, now).filter(|_| n <= word::tokens(word))
    }
}

impl Algorithm for LeaseWord {
    fn fresh(&self) -> u64 {
        0
    }

    fn capacity(&self) -> u32 {
        self.capacity
    }

    #[inline]
    fn decide(&self, word: u64, now: u64, n: u32) -> (Decision, Option<u64>) {
        let tokens = Self::usable(word, now);
        if n <= tokens {
            let remaining = tokens - n;
            return (
                Decision::Allowed { remaining },
                Some(word::with_tokens(word, remaining)),
            );
        }
        // A denial Redis gave, kept, for as many permits or more; or a wait
        // of 0: not decided here.
        let retry_after = Self::denial_for(word, now, n).unwrap_or(RetryAfter::from_nanos(0));
        (Decision::Denied { retry_after }, None)
    }

    fn remaining(&self, word: u64, now: u64) -> u32 {
        Self::usable(word, now)
    }

    fn refund(&self, _word: u64, _written: u64, _n: u32) -> Option<u64> {
        None
    }

    fn is_fresh_equivalent(&self, word: u64, now: u64) -> bool {
        // Expired tokens are worth nothing; a fetch in flight or a running
        // denial must stay.
        word & word::FETCHING == 0
            && Self::usable(word, now) == 0
            && Self::denial(word, now).is_none()
    }

    fn fresh_after_idle(&self) -> Duration {
        self.lifetime
    }
}

/// Links a key into the map without changing its word (a miss on a new key
/// writes nothing by itself).
#[derive(Clone, Copy, Debug)]
struct Link;

impl Algorithm for Link {
    fn fresh(&self) -> u64 {
        0
    }

    fn capacity(&self) -> u32 {
        u32::MAX
    }

    fn decide(&self, word: u64, _now: u64, _n: u32) -> (Decision, Option<u64>) {
        (Decision::Allowed { remaining: 0 }, Some(word))
    }

    fn remaining(&self, _word: u64, _now: u64) -> u32 {
        0
    }

    fn refund(&self, _word: u64, _written: u64, _n: u32) -> Option<u64> {
        None
    }

    fn is_fresh_equivalent(&self, word: u64, _now: u64) -> bool {
        word == 0
    }

    fn fresh_after_idle(&self) -> Duration {
        Duration::ZERO
    }
}

/// A [`LeasedLimiter`]'s counts: what Redis was asked, and what the failure
/// policy answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeasedStats {
    /// Lease script calls that returned (with or without tokens).
    pub lease_calls: u64,
    /// Tokens those calls granted.
    pub tokens_leased: u64,
    /// Give-back script calls that returned.
    pub give_back_calls: u64,
    /// Tokens given back.
    pub tokens_given_back: u64,
    /// Exact-mode calls (a miss while another request was fetching, or a
    /// request larger than the largest lease).
    pub exact_calls: u64,
    /// Calls to Redis that failed (no connection, a timeout, an error reply).
    pub failures: u64,
    /// Decisions made by the failure policy instead of Redis.
    pub fallbacks: u64,
}

impl LeasedStats {
    /// Every call to Redis that returned: lease, give-back and exact-mode
    /// calls.
    pub fn redis_calls(&self) -> u64 {
        self.lease_calls + self.give_back_calls + self.exact_calls
    }
}

/// Counters, each on its own.
#[derive(Default)]
struct Counters {
    lease_calls: AtomicU64,
    tokens_leased: AtomicU64,
    give_back_calls: AtomicU64,
    tokens_given_back: AtomicU64,
    exact_calls: AtomicU64,
    failures: AtomicU64,
    fallbacks: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64, by: u64) {
        // Relaxed: a count, which publishes no other data.
        counter.fetch_add(by, Ordering::Relaxed);
    }
}

/// Builds a [`LeasedLimiter`]: the largest lease, the lease lifetime, the idle
/// time after which a lease is given back, the failure policy and its
/// backoff, the local clock.
pub struct LeasedBuilder<C = RealClock> {
    limiter: RedisLimiter,
    bucket: TokenBucket,
    max_lease: u32,
    lifetime: Duration,
    idle: Duration,
    on_failure: OnFailure<TokenBucket, RealClock>,
    backoff: Duration,
    max_keys: Option<usize>,
    clock: C,
}

impl<C: fmt::Debug> fmt::Debug for LeasedBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedBuilder")
            .field("limiter", &self.limiter)
            .field("max_lease", &self.max_lease)
            .field("lifetime", &self.lifetime)
            .field("idle", &self.idle)
            .field("on_failure", &self.on_failure)
            .field("backoff", &self.backoff)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl LeasedBuilder {
    /// Leases of at most `max_lease` tokens (clamped to `1..=`[`MAX_LEASE`]
    /// and to the bucket's capacity) from `limiter`'s token buckets.
    /// Defaults: a lifetime of 1 s, give-back after 250 ms idle, fail closed
    /// with a backoff of 1 s.
    ///
    /// # Errors
    ///
    /// [`RedisConfigError::NotLeasable`] when `limiter` is not a token bucket.
    pub fn new(limiter: RedisLimiter, max_lease: u32) -> Result<Self, RedisConfigError> {
        let RedisAlgorithm::TokenBucket(bucket) = *limiter.algorithm() else {
            return Err(RedisConfigError::NotLeasable);
        };
        Ok(LeasedBuilder {
            max_lease: max_lease.clamp(1, MAX_LEASE).min(bucket.capacity()),
            limiter,
            bucket,
            lifetime: Duration::from_secs(1),
            idle: Duration::from_millis(250),
            on_failure: OnFailure::Deny,
            backoff: Duration::from_secs(1),
            max_keys: None,
            clock: RealClock::default(),
        })
    }
}

impl<C: Clock> LeasedBuilder<C> {
    /// How long a lease may be spent from (at least 10 ms, at most an hour):
    /// a token not spent by then is lost to the bucket, which refills it.
    /// Bounds how long a token may wait in a lease.
    pub fn lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = lifetime.clamp(Duration::from_millis(10), MAX_LIFETIME);
        self
    }

    /// A lease not topped up for `idle` is given back by
    /// [`give_back_idle`](LeasedLimiter::give_back_idle).
    pub fn idle(mut self, idle: Duration) -> Self {
        self.idle = idle;
        self
    }

    /// What to answer, for requests the leases held here cannot serve, while
    /// Redis fails and for `backoff` after each failure.
    pub fn on_failure(mut self, on_failure: OnFailure, backoff: Duration) -> Self {
        self.on_failure = on_failure;
        self.backoff = backoff;
        self
    }

    /// At most `max_keys` keys hold a lease word at once (the keyed map's
    /// bound; past it a new key is decided by exact mode).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys);
        self
    }

    /// The clock that times leases here (lifetimes and idle times; Redis'
    /// own clock decides the bucket).
    pub fn clock<C2: Clock>(self, clock: C2) -> LeasedBuilder<C2> {
        LeasedBuilder {
            limiter: self.limiter,
            bucket: self.bucket,
            max_lease: self.max_lease,
            lifetime: self.lifetime,
            idle: self.idle,
            on_failure: self.on_failure,
            backoff: self.backoff,
            max_keys: self.max_keys,
            clock,
        }
    }

    /// The limiter.
    ///
    /// # Errors
    ///
    /// [`RedisConfigError::Keyed`] if the map of keys cannot be built (never
    /// in practice: a `max_keys` of 0 is taken as 1).
    pub fn build(self) -> Result<LeasedLimiter<C>, RedisConfigError> {
        let algorithm = LeaseWord {
            capacity: self.bucket.capacity(),
            lifetime: self.lifetime,
        };
        // Leases count time from now, not from the clock's epoch (the TSC's is
        // the host's boot): the word's time field spans 208 days from here.
        let start = self.clock.now();
        let clock = Since {
            clock: self.clock,
            start,
        };
        let mut builder = KeyedBuilder::new(algorithm).clock(clock);
        if let Some(max_keys) = self.max_keys {
            builder = builder.max_keys(max_keys.max(1));
        }
        let local = builder.build().map_err(RedisConfigError::Keyed)?;
        let lifetime_units = word::units_down(saturating_nanos(self.lifetime)).max(1);
        Ok(LeasedLimiter {
            limiter: self.limiter,
            capacity: self.bucket.capacity(),
            max_lease: self.max_lease,
            lifetime_units,
            idle: self.idle,
            local,
            holders: Mutex::new(Holders {
                keys: HashSet::new(),
                prune_at: MIN_PRUNE,
            }),
            refresher: OnceLock::new(),
            on_failure: self.on_failure,
            backoff: self.backoff,
            epoch: Instant::now(),
            retry_at: AtomicU64::new(0),
            counters: Counters::default(),
        })
    }
}

/// A clock's readings since `start`: what the lease words count in.
#[derive(Clone, Debug)]
struct Since<C> {
    clock: C,
    start: u64,
}

impl<C: Clock> Clock for Since<C> {
    #[inline]
    fn now(&self) -> u64 {
        self.clock.now().saturating_sub(self.start)
    }

    fn skip(&self, duration: Duration) -> bool {
        self.clock.skip(duration)
    }
}

fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A limit kept in a token bucket in Redis, spent here from leases (leased
/// mode): a process takes tokens from a key's global bucket in Redis in
/// batches (leases) and spends them from a word of its own, by
/// compare-and-swap, at in-process speed.
///
/// # How a decision goes
///
/// Each key has one word in a [`KeyedLimiter`] of this process (the same
/// lock-free map and compare-and-swap cell as every in-process limit): the
/// tokens of its lease, the lease's expiry, its size (and so its low-water
/// mark), and three flags.
/// A request for `n` permits spends `n` of those tokens by one
/// compare-and-swap, with no call to Redis, while the lease is valid and holds
/// them. The request whose spend takes the count below the low-water mark
/// claims the key's fetch (a flag in the word, so exactly one request fetches
/// while the others keep spending): the next lease is fetched ahead of need,
/// in one script call. With a [`Refresher`]
/// ([`start_refresher`](LeasedLimiter::start_refresher), a thread with a
/// connection of its own) the request only queues the key and the thread
/// makes the call, off the request path ([`start_refresher_async`](LeasedLimiter::start_refresher_async)
/// is the same as a tokio task); without one, the claiming request makes it
/// after its own decision is made (its answer does not depend on it). A request that finds no tokens (a new key, a lease spent or expired)
/// claims the fetch and takes a lease for itself (one call, within the
/// connection's deadline); if another request is fetching already it asks
/// Redis for its own permits, as exact mode does (one call). A bucket that
/// has too few tokens answers with the wait until it has what was asked for.
/// With no tokens held here the word keeps that denial (up to one lease
/// lifetime) with the count its wait is for, so the denials that follow for
/// as many permits or fewer cost no call either; a larger request asks Redis
/// for its own wait (the denial kept stays if it is for fewer permits and
/// ends no later, for the requests it covers). A request that
/// needs more than the tokens held here is denied with the wait for what it
/// lacks beyond them, and they stay, for smaller requests and for its retry.
/// That wait is a lower bound, not exact mode's exact one: other processes
/// may take the tokens first, and a kept wait longer than the lifetime is cut
/// to it. A client that comes back too early is denied again with what
/// remains.
///
/// The lease script (`lease.lua`) works on the token bucket's own key and
/// state, so processes in exact mode ([`RedisLimiter`]) and in leased mode
/// share one limit. It takes `min(want, available)` tokens atomically when at
/// least `need` are there, and none otherwise, with the wait until `need`
/// are: `want` is the key's lease size (or what the request lacks, if more),
/// `need` a quarter of the lease size (or what the request lacks, if more).
/// The quarter is the difference from taking whatever is there: on a bucket
/// that is dry under load, calls for one or two tokens at a time would cost a
/// call per decision, as exact mode does, where waiting for a quarter of a
/// lease costs one call per quarter lease (and delays this process's next
/// admission by at most a quarter lease's refill time). The lease size adapts
/// to the key's demand: it starts at 1, doubles when a lease was spent down to
/// its low-water mark in under a quarter of the lease lifetime or ran out
/// before the next one came, and halves when a lease expired with tokens
/// left; it never exceeds the configured largest lease `L`. The low-water
/// mark is a quarter of the lease size (none below a size of 4).
///
/// # Bounds
///
/// `N` processes share a key; leases have at most `L` tokens and lifetime
/// `τ`; the bucket has capacity `B` and refills `r(T)` over a time `T`. A
/// process holds at most `L + ⌊L/4⌋ − 1` tokens of a key: a fetch starts below
/// the low-water mark `⌊size/4⌋` and brings at most one lease, and a request
/// that finds too few tokens asks only for what it lacks beyond that.
///
/// - **Over-admission.** Every token spent from a lease was taken from the
///   global bucket first. In any interval of length `T` the bucket gives out
///   at most `B + r(T)` tokens plus what is given back to it meanwhile, and
///   tokens given back were never spent. What a process admits in an interval
///   is at most what it took in the interval plus what it held when the
///   interval began. So all processes together admit at most
///   `B + r(T) + N·(L + ⌊L/4⌋)` in any interval of length `T`, against exact
///   mode's `B + r(T)`, for as long as Redis keeps the key (a Redis that
///   loses its data starts the bucket full again, in either mode). The
///   tokens left when a lease is topped up (fewer than the low-water mark)
///   take the new lease's expiry.
/// - **Stranded tokens.** At any moment at most `N·(L + ⌊L/4⌋)` tokens are out
///   of the global bucket and not yet spent. Others cannot use them until they
///   are spent, given back ([`give_back_idle`](LeasedLimiter::give_back_idle),
///   one script per key), or expire: a lease is never spent after `τ`, and
///   what it left is lost to the bucket, which refills it at its own rate.
/// - **Redis calls.** Once the lease size has grown to `L`, one call brings
///   `L` tokens: at most one call per `L` admissions while the bucket has
///   tokens. While it is dry, a lease brings only what has refilled, and costs
///   two calls: the one that grants it and a prefetch at its low-water mark
///   that finds the bucket dry (then none until the lease runs out). A denial
///   costs one call per wait (at most one lease lifetime) per process for
///   the requests its count covers, and one for each larger request; a
///   request that misses while another fetches costs one.
///
/// # Failures
///
/// Every call runs on the caller's connection, with its deadline
/// ([`Deadlines`](super::Deadlines)); a request makes at most one call, so no
/// request waits longer than one call's deadlines (`Deadlines` names the two
/// cases in redis-rs that take more than one). A failed call starts a backoff, for
/// which no request calls Redis; while it lasts a request that the leases held
/// here cannot serve is answered by the [`OnFailure`] policy: denied (fail
/// closed: only tokens already leased are spent) or decided by a local keyed
/// limit (fail open). After the backoff one request probes Redis; its success
/// ends the backoff. [`stats`](LeasedLimiter::stats) counts failures and
/// fallback decisions.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use turnstile::redis::{Deadlines, LeasedBuilder, RedisLimiter};
/// use turnstile::{Quota, TokenBucket};
///
/// let mut con = Deadlines::default().blocking(redis::Client::open("redis://127.0.0.1/")?);
/// let global = RedisLimiter::new("api", TokenBucket::new(Quota::per_second(10_000)?))?;
/// // Leases of up to 100 tokens, each spendable for 1 s.
/// let limiter = LeasedBuilder::new(global, 100)?
///     .lifetime(Duration::from_secs(1))
///     .build()?;
/// let decision = limiter.try_acquire(&mut con, "k_live_123")?;
/// println!("{decision:?}; {} calls to Redis so far", limiter.stats().redis_calls());
/// // Now and then (a timer): give back leases left idle.
/// limiter.give_back_idle(&mut con);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct LeasedLimiter<C = RealClock> {
    limiter: RedisLimiter,
    capacity: u32,
    max_lease: u32,
    lifetime_units: u64,
    idle: Duration,
    local: KeyedLimiter<Vec<u8>, LeaseWord, Since<C>>,
    /// Keys that took a lease since the last give-back pass.
    holders: Mutex<Holders>,
    /// The refresher's queue, once one is started: prefetches go there
    /// instead of being made by the request that claimed them.
    refresher: OnceLock<Queue>,
    on_failure: OnFailure<TokenBucket, RealClock>,
    backoff: Duration,
    epoch: Instant,
    /// Nanoseconds since `epoch` before which Redis is not called; 0 when it
    /// is called.
    retry_at: AtomicU64,
    counters: Counters,
}

impl<C: Clock + fmt::Debug> fmt::Debug for LeasedLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedLimiter")
            .field("limiter", &self.limiter)
            .field("max_lease", &self.max_lease)
            .field("on_failure", &self.on_failure)
            .field("backoff", &self.backoff)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// Why a request calls Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Purpose {
    /// The request was decided from the lease; this tops the lease up.
    Prefetch(Decision),
    /// The request needs `n` tokens the lease does not have.
    Miss,
}

/// A claimed fetch: the call to make, and how to read its answer.
pub(crate) struct Fetch {
    purpose: Purpose,
    /// The size code the next lease gets.
    size_code: u32,
    /// The tokens Redis is asked to have before it grants any: its wait,
    /// when it grants none, is for this many.
    need: u32,
    invocation: ScriptInvocation<'static>,
}

/// Releases a key's fetch claim when a fetch is dropped before its reply.
#[cfg(feature = "tokio")]
struct ReleaseOnDrop<'a, C: Clock> {
    limiter: &'a LeasedLimiter<C>,
    key: &'a [u8],
    armed: bool,
}

#[cfg(feature = "tokio")]
impl<C: Clock> Drop for ReleaseOnDrop<'_, C> {
    fn drop(&mut self) {
        if self.armed {
            self.limiter
                .local
                .transform_linked(self.key, |w| Some(w & !word::FETCHING));
        }
    }
}

/// What a request does next.
pub(crate) enum Step {
    /// Decided without Redis.
    Done(Decision),
    /// Take a lease.
    Lease(Fetch),
    /// Ask Redis for the permits themselves (exact mode).
    Exact(ScriptInvocation<'static>),
}

#[cfg(all(feature = "tower", feature = "tokio"))]
impl Step {
    /// The request's decision, when it is made without waiting for Redis:
    /// from the lease (with or without a prefetch to make after it).
    pub(crate) fn decided(&self) -> Option<Decision> {
        match self {
            Step::Done(decision) => Some(*decision),
            Step::Lease(Fetch {
                purpose: Purpose::Prefetch(decision),
                ..
            }) => Some(*decision),
            Step::Lease(_) | Step::Exact(_) => None,
        }
    }

    /// Whether a call to Redis is left to make.
    pub(crate) fn calls(&self) -> bool {
        !matches!(self, Step::Done(_))
    }
}

/// Whether this request may call Redis now.
enum Turn {
    Call,
    Skip { wait: Duration },
}

impl<C: Clock> LeasedLimiter<C> {
    /// The limit in Redis.
    pub fn limiter(&self) -> &RedisLimiter {
        &self.limiter
    }

    /// The largest lease.
    pub fn max_lease(&self) -> u32 {
        self.max_lease
    }

    /// The tokens of `key`'s lease held here now, without taking any.
    pub fn held(&self, key: impl AsRef<[u8]>) -> u32 {
        self.local.remaining(key.as_ref())
    }

    /// Counts so far.
    pub fn stats(&self) -> LeasedStats {
        // Relaxed: counts, which publish no other data.
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let c = &self.counters;
        LeasedStats {
            lease_calls: load(&c.lease_calls),
            tokens_leased: load(&c.tokens_leased),
            give_back_calls: load(&c.give_back_calls),
            tokens_given_back: load(&c.tokens_given_back),
            exact_calls: load(&c.exact_calls),
            failures: load(&c.failures),
            fallbacks: load(&c.fallbacks),
        }
    }

    /// `true` while a failure is being backed off from: requests the leases
    /// cannot serve are answered by the failure policy.
    pub fn is_backing_off(&self) -> bool {
        // Relaxed: a hint; `retry_at` publishes no other data.
        self.retry_at.load(Ordering::Relaxed) != 0
    }

    /// Ask for one permit for `key`; see [`try_acquire_n`](Self::try_acquire_n).
    ///
    /// # Errors
    ///
    /// None in practice: a request for one permit always fits.
    pub fn try_acquire(
        &self,
        con: &mut dyn ConnectionLike,
        key: impl AsRef<[u8]>,
    ) -> Result<Decision, AcquireError> {
        self.try_acquire_n(con, key, 1)
    }

    /// Ask for `n` permits for `key`, all or nothing: from the lease held
    /// here when it has them (no call), else from Redis in at most one call on
    /// `con`, or from the failure policy while Redis fails. An admission's
    /// `remaining` is what the lease held here has left, not the global
    /// bucket, except for a request decided in Redis itself (exact mode: `n`
    /// above `max_lease`, or a miss while another request fetches this key's
    /// lease), whose `remaining` is the global bucket's.
    ///
    /// A request that finds too few tokens here asks Redis for a lease; if
    /// the tokens it counted on are spent by other requests while it waits,
    /// it is denied with the least wait there is (1 ns; `Retry-After: 1`),
    /// and a retry takes another lease.
    ///
    /// # Errors
    ///
    /// [`AcquireError`] for `n = 0` or above the capacity, before anything else.
    pub fn try_acquire_n(
        &self,
        con: &mut dyn ConnectionLike,
        key: impl AsRef<[u8]>,
        n: u32,
    ) -> Result<Decision, AcquireError> {
        let key = key.as_ref();
        match self.step(key, n)? {
            Step::Done(decision) => Ok(decision),
            Step::Lease(fetch) => {
                let result = fetch.invocation.invoke(con);
                Ok(self.finish_lease(key, n, &fetch, result))
            }
            Step::Exact(invocation) => {
                let result = invocation.invoke(con);
                Ok(self.finish_exact(key, n, result))
            }
        }
    }

    /// [`try_acquire`](Self::try_acquire) on an asynchronous connection
    /// (feature `tokio` too); a decision from a lease held here completes
    /// without awaiting anything.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    #[cfg(feature = "tokio")]
    pub async fn try_acquire_async<Con: ::redis::aio::ConnectionLike>(
        &self,
        con: &mut Con,
        key: impl AsRef<[u8]>,
    ) -> Result<Decision, AcquireError> {
        self.try_acquire_n_async(con, key, 1).await
    }

    /// [`try_acquire_n`](Self::try_acquire_n) on an asynchronous connection
    /// (feature `tokio` too). A decision from the lease held here completes
    /// without awaiting anything; the request that claims a prefetch awaits
    /// it after its decision is made (a `RedisRateLimitLayer`,
    /// features `tower` and `tokio`, fetches it in a task of its own
    /// instead). Dropped while it awaits a call, the future releases the
    /// key's claim on the fetch: a cancelled request leaves no key unable
    /// to take a lease.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n).
    #[cfg(feature = "tokio")]
    pub async fn try_acquire_n_async<Con: ::redis::aio::ConnectionLike>(
        &self,
        con: &mut Con,
        key: impl AsRef<[u8]>,
        n: u32,
    ) -> Result<Decision, AcquireError> {
        let key = key.as_ref();
        let step = self.step(key, n)?;
        Ok(self.complete_async(con, key, n, step).await)
    }

    /// Make the call `step` asked for, if any, and answer the request. Dropped
    /// before the call returns, it releases the key's fetch, so that a
    /// cancelled request (a client that hung up) does not leave the key
    /// claimed; the tokens of a lease Redis granted meanwhile are lost to the
    /// bucket, which refills them, as after a timeout.
    #[cfg(feature = "tokio")]
    pub(crate) async fn complete_async<Con: ::redis::aio::ConnectionLike>(
        &self,
        con: &mut Con,
        key: &[u8],
        n: u32,
        step: Step,
    ) -> Decision {
        match step {
            Step::Done(decision) => decision,
            Step::Lease(fetch) => {
                let mut claim = ReleaseOnDrop {
                    limiter: self,
                    key,
                    armed: true,
                };
                let result = fetch.invocation.invoke_async(con).await;
                claim.armed = false;
                self.finish_lease(key, n, &fetch, result)
            }
            Step::Exact(invocation) => {
                let result = invocation.invoke_async(con).await;
                self.finish_exact(key, n, result)
            }
        }
    }

    /// Give back the leases not topped up for the idle time (one script call
    /// per key), and forget the keys whose leases are spent or expired.
    /// Returns the tokens given back. Call it now and then (every idle time,
    /// say); a lease not given back expires after its lifetime anyway.
    pub fn give_back_idle(&self, con: &mut dyn ConnectionLike) -> u64 {
        self.give_back(con, Some(self.idle))
    }

    /// Give back every lease held here, however recent (at shutdown).
    pub fn give_back_all(&self, con: &mut dyn ConnectionLike) -> u64 {
        self.give_back(con, None)
    }

    /// [`give_back_idle`](Self::give_back_idle) on an asynchronous connection
    /// (feature `tokio` too).
    #[cfg(feature = "tokio")]
    pub async fn give_back_idle_async<Con: ::redis::aio::ConnectionLike>(
        &self,
        con: &mut Con,
    ) -> u64 {
        let idle = Some(self.idle);
        let mut total = 0;
        for key in self.idle_keys(idle) {
            // A failure starts a backoff: the rest wait for the next pass.
            if self.is_backing_off() {
                break;
            }
            let Some(tokens) = self.take_lease(&key, idle) else {
                continue;
            };
            let result = self
                .give_back_invocation(&key, tokens)
                .invoke_async(con)
                .await;
            total += self.settle_give_back(tokens, result);
        }
        total
    }

    fn give_back(&self, con: &mut dyn ConnectionLike, idle: Option<Duration>) -> u64 {
        let mut total = 0;
        for key in self.idle_keys(idle) {
            // A failure starts a backoff: the rest wait for the next pass,
            // so that a dead Redis costs one call's deadlines, not one per key.
            if self.is_backing_off() {
                break;
            }
            let Some(tokens) = self.take_lease(&key, idle) else {
                continue;
            };
            let result = self.give_back_invocation(&key, tokens).invoke(con);
            total += self.settle_give_back(tokens, result);
        }
        total
    }

    /// The keys whose leases are idle (all that hold tokens, for `None`);
    /// forget those whose leases are spent or expired.
    fn idle_keys(&self, idle: Option<Duration>) -> Vec<Vec<u8>> {
        if self.is_backing_off() {
            return Vec::new();
        }
        let now = self.local.clock().now();
        let mut holders = self.holders.lock().unwrap_or_else(|e| e.into_inner());
        let mut keys = Vec::new();
        holders.keys.retain(|key| {
            let mut state = Lease::Spent;
            self.local.transform_linked(key.as_slice(), |w| {
                state = self.lease_state(w, now, idle);
                None
            });
            if state == Lease::Idle(true) {
                keys.push(key.clone());
            }
            state != Lease::Spent
        });
        keys
    }

    /// Empty `key`'s lease word if its lease is still idle, and forget the
    /// key; the tokens it held.
    fn take_lease(&self, key: &[u8], idle: Option<Duration>) -> Option<u32> {
        // Held across the word's emptying and the key's removal: a lease
        // granted in between (which inserts the key under this lock) must not
        // lose its key to this removal. (Taking the word needs no shard lock,
        // so the order of the two locks is the one `idle_keys` keeps.)
        let mut holders = self.holders.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.local.clock().now();
        let mut took = 0;
        self.local.transform_linked(key, |w| {
            took = 0;
            if self.lease_state(w, now, idle) != Lease::Idle(true) {
                return None;
            }
            took = LeaseWord::usable(w, now);
            Some(word::with_tokens(w, 0))
        });
        if took == 0 {
            return None;
        }
        holders.keys.remove(key);
        Some(took)
    }

    /// Forget the keys whose leases are spent, expired or gone, and prune
    /// again when the keys left have doubled: the set stays within twice the
    /// keys that hold tokens (so within twice `max_keys`), at a cost per
    /// insert that is constant on average, with or without give-back passes.
    fn prune(&self, holders: &mut Holders, now: u64) {
        holders.keys.retain(|key| {
            let mut keep = false;
            self.local.transform_linked(key.as_slice(), |w| {
                // A fetch under way may be about to store a lease.
                keep = LeaseWord::usable(w, now) > 0 || w & word::FETCHING != 0;
                None
            });
            keep
        });
        holders.prune_at = holders.keys.len().saturating_mul(2).max(MIN_PRUNE);
    }

    /// What a give-back pass does with lease word `w` at `now`.
    fn lease_state(&self, w: u64, now: u64, idle: Option<Duration>) -> Lease {
        // First: a fetch under way (whose lease may not be stored yet, with
        // its key already noted) keeps the key, whatever the word holds now.
        if w & word::FETCHING != 0 {
            return Lease::Idle(false);
        }
        if LeaseWord::usable(w, now) == 0 {
            return Lease::Spent;
        }
        let Some(idle) = idle else {
            return Lease::Idle(true);
        };
        // The lease was granted a lifetime before its expiry.
        let granted = word::time(w).saturating_sub(self.lifetime_units);
        let idle_units = word::units_up(saturating_nanos(idle));
        Lease::Idle(word::units_down(now) >= granted.saturating_add(idle_units))
    }

    fn give_back_invocation(&self, key: &[u8], tokens: u32) -> ScriptInvocation<'static> {
        let mut invocation = GIVE_BACK.prepare_invoke();
        invocation
            .key(self.limiter.redis_key(key))
            .arg("")
            .arg(tokens)
            .arg(self.limiter.slack_millis);
        for param in &self.limiter.params {
            invocation.arg(*param);
        }
        invocation
    }

    fn settle_give_back(&self, tokens: u32, result: RedisResult<Value>) -> u64 {
        match result {
            Ok(_) => {
                Counters::add(&self.counters.give_back_calls, 1);
                Counters::add(&self.counters.tokens_given_back, u64::from(tokens));
                u64::from(tokens)
            }
            Err(_) => {
                // The tokens are lost to the bucket until it refills them.
                self.fail();
                0
            }
        }
    }

    /// Decide what the request does: spend, fall back, or call Redis.
    pub(crate) fn step(&self, key: &[u8], n: u32) -> Result<Step, AcquireError> {
        if n == 0 {
            return Err(AcquireError::ZeroPermits);
        }
        if n > self.capacity {
            return Err(AcquireError::InsufficientCapacity {
                requested: n,
                capacity: self.capacity,
            });
        }
        if n > self.max_lease {
            return Ok(self.exact_or_fallback(key, n));
        }
        let (decision, written, _) = self.local.take(key, n);
        match decision {
            KeyedDecision::Allowed { remaining } => {
                let decision = Decision::Allowed { remaining };
                let Some(written) = written else {
                    return Ok(Step::Done(decision));
                };
                let low = self.size(word::size_code(written)) / 4;
                if remaining >= low
                    || written & (word::FETCHING | word::DRY) != 0
                    || self.is_backing_off()
                {
                    return Ok(Step::Done(decision));
                }
                Ok(match self.claim(key, n, Purpose::Prefetch(decision)) {
                    // Claimed first, then the turn: a probe after a backoff
                    // is only taken by a request that will call.
                    Claim::Fetch(_) if matches!(self.turn(), Turn::Skip { .. }) => {
                        self.local
                            .transform_linked(key, |w| Some(w & !word::FETCHING));
                        Step::Done(decision)
                    }
                    Claim::Fetch(fetch) => match self.refresher.get() {
                        None => Step::Lease(fetch),
                        // The queue is full, or its refresher stopped: this
                        // request fetches, as without a refresher.
                        Some(queue) => match queue.send(key, fetch) {
                            Ok(()) => Step::Done(decision),
                            Err(Some(fetch)) => Step::Lease(fetch),
                            Err(None) => {
                                // Not reached (see `Queue::send`); were it,
                                // the claim is released, and a later request
                                // prefetches.
                                self.local
                                    .transform_linked(key, |w| Some(w & !word::FETCHING));
                                Step::Done(decision)
                            }
                        },
                    },
                    _ => Step::Done(decision),
                })
            }
            KeyedDecision::Denied { retry_after } if retry_after.as_nanos() > 0 => {
                Ok(Step::Done(Decision::Denied { retry_after }))
            }
            KeyedDecision::Denied { .. } | KeyedDecision::KeyLimit { .. } => {
                if let Turn::Skip { wait } = self.turn() {
                    return Ok(Step::Done(self.fallback(key, n, wait)));
                }
                Ok(match self.claim(key, n, Purpose::Miss) {
                    Claim::Fetch(fetch) => Step::Lease(fetch),
                    Claim::Spent(decision) => Step::Done(decision),
                    // The turn is taken: no second look at the backoff.
                    Claim::Busy | Claim::Claimed => self.exact(key, n),
                })
            }
        }
    }

    fn exact_or_fallback(&self, key: &[u8], n: u32) -> Step {
        if let Turn::Skip { wait } = self.turn() {
            return Step::Done(self.fallback(key, n, wait));
        }
        self.exact(key, n)
    }

    /// Ask Redis for the permits themselves, as exact mode does.
    fn exact(&self, key: &[u8], n: u32) -> Step {
        match self.limiter.invocation(key, n, None) {
            Ok(invocation) => Step::Exact(invocation),
            // Checked already: n is within 1..=capacity.
            Err(_) => Step::Done(Decision::Denied {
                retry_after: RETRY_AT_ONCE,
            }),
        }
    }

    /// The lease size for a size code.
    fn size(&self, code: u32) -> u32 {
        1u32.checked_shl(code)
            .unwrap_or(u32::MAX)
            .min(self.max_lease)
    }

    /// The largest useful size code.
    fn max_code(&self) -> u32 {
        32 - (self.max_lease - 1).leading_zeros()
    }

    /// Claim `key`'s fetch, adapting the lease size; or, for a miss, find
    /// the tokens another fetch brought meanwhile.
    fn claim(&self, key: &[u8], n: u32, purpose: Purpose) -> Claim {
        if purpose == Purpose::Miss {
            // A miss on a new key wrote nothing: link it, so that its word
            // can carry the claim.
            let _ = self.local.take_with(&Link, key, 1);
        }
        let now = self.local.clock().now();
        let now_units = word::units_down(now);
        let lifetime = self.lifetime_units;
        let max_code = self.max_code();
        let mut outcome = Claim::Busy;
        let mut fetch = None;
        let linked = self.local.transform_linked(key, |w| {
            outcome = Claim::Busy;
            fetch = None;
            if w & word::FETCHING != 0 {
                return None;
            }
            let usable = LeaseWord::usable(w, now);
            let code = word::size_code(w);
            let code = match purpose {
                Purpose::Miss if usable >= n => {
                    outcome = Claim::Spent(Decision::Allowed {
                        remaining: usable - n,
                    });
                    return Some(word::with_tokens(w, usable - n));
                }
                Purpose::Miss if w & word::DENIED == 0 && word::tokens(w) > 0 && usable == 0 => {
                    // The lease expired with tokens left: smaller next time.
                    code.saturating_sub(1)
                }
                Purpose::Miss if w & word::DENIED == 0 && w != 0 => {
                    // Spent before the next lease came: larger.
                    (code + 1).min(max_code)
                }
                Purpose::Miss => code,
                Purpose::Prefetch(_) => {
                    if usable >= self.size(code) / 4 {
                        // Another fetch topped it up meanwhile.
                        return None;
                    }
                    // Spent to its low-water mark within a quarter of its
                    // lifetime: larger.
                    let granted = word::time(w).saturating_sub(lifetime);
                    if now_units.saturating_sub(granted).saturating_mul(4) < lifetime {
                        (code + 1).min(max_code)
                    } else {
                        code
                    }
                }
            };
            outcome = Claim::Claimed;
            fetch = Some((code, usable));
            Some(w | word::FETCHING)
        });
        if !linked {
            return match outcome {
                Claim::Spent(d) => Claim::Spent(d),
                _ => Claim::Busy,
            };
        }
        match (outcome, fetch) {
            (Claim::Claimed, Some((code, usable))) => {
                let target = self.size(code);
                // A whole lease per call, and none smaller than a quarter of
                // one: a bucket that has fewer tokens keeps them until it has
                // that many, so that a dry bucket is not drained by calls for
                // a token or two.
                let short = match purpose {
                    Purpose::Miss => n - usable.min(n),
                    Purpose::Prefetch(_) => 1,
                };
                let need = short.max(target / 4).max(1);
                let want = target.max(short);
                Claim::Fetch(Fetch {
                    purpose,
                    size_code: code,
                    need,
                    invocation: self.lease_invocation(key, need, want),
                })
            }
            (outcome, _) => outcome,
        }
    }

    fn lease_invocation(&self, key: &[u8], need: u32, want: u32) -> ScriptInvocation<'static> {
        let mut invocation = LEASE.prepare_invoke();
        invocation
            .key(self.limiter.redis_key(key))
            .arg("")
            .arg(need)
            .arg(self.limiter.slack_millis);
        for param in &self.limiter.params {
            invocation.arg(*param);
        }
        invocation.arg(want);
        invocation
    }

    /// Put a lease's answer into the key's word, and answer the request.
    fn finish_lease(
        &self,
        key: &[u8],
        n: u32,
        fetch: &Fetch,
        result: RedisResult<Value>,
    ) -> Decision {
        let Fetch {
            purpose,
            size_code: code,
            need,
            ..
        } = *fetch;
        let now = self.local.clock().now();
        let now_units = word::units_down(now);
        let reply = result
            .map_err(RedisLimitError::from)
            .and_then(|v| parse_lease(&v));
        let (granted, wait) = match reply {
            Ok(answer) => answer,
            Err(_) => {
                self.fail();
                // Release the claim; the tokens held stay.
                self.local
                    .transform_linked(key, |w| Some(w & !word::FETCHING));
                return match purpose {
                    Purpose::Prefetch(decision) => decision,
                    Purpose::Miss => self.fallback(key, n, self.backoff),
                };
            }
        };
        self.succeed();
        Counters::add(&self.counters.lease_calls, 1);
        Counters::add(&self.counters.tokens_leased, u64::from(granted));
        if granted > 0 {
            let mut holders = self.holders.lock().unwrap_or_else(|e| e.into_inner());
            if !holders.keys.contains(key) {
                if holders.keys.len() >= holders.prune_at {
                    self.prune(&mut holders, now);
                }
                holders.keys.insert(key.to_vec());
            }
        }
        let expiry = now_units.saturating_add(self.lifetime_units);
        // A miss whose word is gone (not linked any more) is denied, to be
        // tried again at once.
        let mut decision = match purpose {
            Purpose::Prefetch(decision) => decision,
            Purpose::Miss => Decision::Denied {
                retry_after: RETRY_AT_ONCE,
            },
        };
        let lifetime_nanos = word::nanos(self.lifetime_units);
        self.local.transform_linked(key, |w| {
            let usable = LeaseWord::usable(w, now);
            if granted == 0 {
                // A denial kept in the word lasts at most one lifetime.
                let kept = wait.min(lifetime_nanos);
                return Some(match purpose {
                    // The lease held here runs on; no more prefetching
                    // until it runs out.
                    Purpose::Prefetch(_) => word::pack(
                        word::tokens(w),
                        word::size_code(w),
                        word::time(w),
                        (w & word::DENIED) | word::DRY,
                    ),
                    // Tokens are still held here (fewer than this request
                    // needs): they stay, for the requests they cover and for
                    // this one's retry, which Redis's wait (for what it
                    // lacked beyond them) is for. No denial is kept, so a
                    // larger request asks Redis for its own wait, and no
                    // prefetch runs until the lease runs out.
                    Purpose::Miss if usable > 0 => {
                        decision = Decision::Denied {
                            retry_after: RetryAfter::from_nanos(wait),
                        };
                        (w & !word::FETCHING) | word::DRY
                    }
                    // A denial kept already that answers for fewer tokens
                    // (a smaller request's) stays: it is the sooner answer
                    // for the requests it covers, and this one has its own.
                    Purpose::Miss
                        if LeaseWord::denial(w, now).is_some_and(|running| {
                            word::tokens(w) < need && running.as_nanos() <= wait
                        }) =>
                    {
                        decision = Decision::Denied {
                            retry_after: RetryAfter::from_nanos(wait),
                        };
                        w & !word::FETCHING
                    }
                    // The denial is kept with the tokens its wait is for:
                    // it answers the key's requests for as many or fewer.
                    Purpose::Miss => {
                        let until = word::units_up(now.saturating_add(kept));
                        decision = Decision::Denied {
                            retry_after: RetryAfter::from_nanos(
                                word::nanos(until).saturating_sub(now),
                            ),
                        };
                        let kept_for = need.min(word::TOKENS_MASK as u32);
                        word::pack(kept_for, code, until, word::DENIED)
                    }
                });
            }
            let mut tokens = usable.saturating_add(granted);
            if purpose == Purpose::Miss {
                if tokens >= n {
                    tokens -= n;
                    decision = Decision::Allowed { remaining: tokens };
                } else {
                    // The tokens held here when the lease was asked for were
                    // spent meanwhile (or expired): the request may be tried
                    // again at once, and will take another lease.
                    decision = Decision::Denied {
                        retry_after: RETRY_AT_ONCE,
                    };
                }
            }
            Some(word::pack(tokens, code, expiry, 0))
        });
        decision
    }

    fn finish_exact(&self, key: &[u8], n: u32, result: RedisResult<Value>) -> Decision {
        match self.limiter.decide(result) {
            Ok(decision) => {
                self.succeed();
                Counters::add(&self.counters.exact_calls, 1);
                decision
            }
            Err(_) => {
                self.fail();
                self.fallback(key, n, self.backoff)
            }
        }
    }

    fn now_nanos(&self) -> u64 {
        // At least 1, so that 0 can mean "no backoff".
        saturating_nanos(self.epoch.elapsed()).max(1)
    }

    /// Whether a request may call Redis now; after a backoff, one request
    /// probes and the others wait for another backoff unless it succeeds.
    fn turn(&self) -> Turn {
        // Relaxed: `retry_at` publishes no other data; at worst a request
        // calls Redis once more, or falls back once more, than it had to.
        let retry_at = self.retry_at.load(Ordering::Relaxed);
        if retry_at == 0 {
            return Turn::Call;
        }
        let now = self.now_nanos();
        if now < retry_at {
            return Turn::Skip {
                wait: Duration::from_nanos(retry_at - now),
            };
        }
        let next = now.saturating_add(saturating_nanos(self.backoff));
        // Relaxed: as above.
        match self
            .retry_at
            .compare_exchange(retry_at, next, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => Turn::Call,
            Err(_) => Turn::Skip { wait: self.backoff },
        }
    }

    fn succeed(&self) {
        if self.is_backing_off() {
            // Relaxed: see `turn`.
            self.retry_at.store(0, Ordering::Relaxed);
        }
    }

    fn fail(&self) {
        Counters::add(&self.counters.failures, 1);
        let next = self
            .now_nanos()
            .saturating_add(saturating_nanos(self.backoff));
        // Relaxed: see `turn`.
        self.retry_at.store(next, Ordering::Relaxed);
    }

    /// The failure policy's decision; `wait` is left until Redis is tried.
    fn fallback(&self, key: &[u8], n: u32, wait: Duration) -> Decision {
        Counters::add(&self.counters.fallbacks, 1);
        // At least 1 ns: a backoff of zero still tells a client to come back
        // (Retry-After: 1), never that it was due already.
        let deny = Decision::Denied {
            retry_after: RetryAfter::from_nanos(saturating_nanos(wait).max(1)),
        };
        match &self.on_failure {
            OnFailure::Deny => deny,
            OnFailure::Local(local) => match local.try_acquire_n(key, n) {
                Ok(KeyedDecision::Allowed { remaining }) => Decision::Allowed { remaining },
                Ok(KeyedDecision::Denied { retry_after })
                | Ok(KeyedDecision::KeyLimit { retry_after }) => Decision::Denied { retry_after },
                Err(_) => deny,
            },
        }
    }
}

/// The wait of a request denied by a race rather than by the bucket (the
/// tokens it was to be served with were spent by others while its lease was
/// fetched): the least wait there is, which `Retry-After` rounds up to 1 s.
/// Never 0, which would tell a client that it was admitted no later than
/// now.
const RETRY_AT_ONCE: RetryAfter = RetryAfter::from_nanos(1);

/// A thread that takes the prefetches of a [`LeasedLimiter`] off the request
/// path, on a connection of its own, and gives back idle leases every idle
/// time. Stopped (and joined) when dropped; from then on (and whenever its
/// queue is full) the requests make their prefetches themselves.
pub struct Refresher {
    stop: Arc<AtomicBool>,
    /// Wakes the thread from its wait for work, so that dropping the handle
    /// does not wait out the idle time.
    wake: SyncSender<Option<Queued>>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for Refresher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refresher")
            .field("running", &self.thread.is_some())
            .finish()
    }
}

impl Drop for Refresher {
    fn drop(&mut self) {
        // Relaxed: the flag publishes no other data; the thread sees it at
        // its next wake-up at the latest.
        self.stop.store(true, Ordering::Relaxed);
        // A full queue means the thread is busy and checks the flag after
        // the fetch in hand; a disconnected one, that it has stopped.
        let _ = self.wake.try_send(None);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl<C: Clock + 'static> LeasedLimiter<C> {
    /// This limiter, weakly, as what a queued prefetch releases its claim on.
    fn owner(self: &Arc<Self>) -> Weak<dyn ReleaseClaim> {
        let owner: Arc<dyn ReleaseClaim> = Arc::clone(self) as Arc<dyn ReleaseClaim>;
        Arc::downgrade(&owner)
    }

    /// Start a thread that makes this limiter's prefetches on `con` (the
    /// request that crosses the low-water mark then only queues the key, and
    /// makes no call), and gives back idle leases every idle time (at least
    /// every 10 ms). A miss (no tokens here) is still fetched by its request.
    /// `None` when a refresher was started already.
    ///
    /// # Errors
    ///
    /// When the thread cannot be spawned.
    pub fn start_refresher(
        self: &Arc<Self>,
        mut con: BlockingConnection,
    ) -> std::io::Result<Option<Refresher>> {
        let (queue, requests) = mpsc::sync_channel::<Option<Queued>>(QUEUE);
        let wake = queue.clone();
        if self
            .refresher
            .set(Queue {
                to: To::Thread(queue),
                owner: self.owner(),
            })
            .is_err()
        {
            return Ok(None);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let limiter = Arc::clone(self);
        let stopped = Arc::clone(&stop);
        let tick = self.idle.max(Duration::from_millis(10));
        let thread = std::thread::Builder::new()
            .name("turnstile-lease-refresher".into())
            .spawn(move || {
                let mut last_give_back = Instant::now();
                // Relaxed: see `Refresher::drop`.
                while !stopped.load(Ordering::Relaxed) {
                    match requests.recv_timeout(tick) {
                        // The handle dropped: the loop's test ends it.
                        Ok(None) => {}
                        Ok(Some(mut queued)) => queued.make(&limiter, &mut con),
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                    if last_give_back.elapsed() >= tick {
                        limiter.give_back_idle(&mut con);
                        last_give_back = Instant::now();
                    }
                }
            })?;
        Ok(Some(Refresher {
            stop,
            wake,
            thread: Some(thread),
        }))
    }
}

/// Prefetches waiting for a refresher, at most.
const QUEUE: usize = 1_024;

/// A refresher's queue, and the limiter whose claims its prefetches hold.
struct Queue {
    to: To,
    owner: Weak<dyn ReleaseClaim>,
}

/// Where a refresher takes its prefetches from.
enum To {
    Thread(SyncSender<Option<Queued>>),
    #[cfg(feature = "tokio")]
    Task(tokio::sync::mpsc::Sender<Queued>),
}

/// Releases a key's fetch claim: a [`LeasedLimiter`] of any clock, for the
/// queue, which is not generic.
trait ReleaseClaim: Send + Sync {
    fn release(&self, key: &[u8]);
}

impl<C: Clock> ReleaseClaim for LeasedLimiter<C> {
    fn release(&self, key: &[u8]) {
        self.local
            .transform_linked(key, |w| Some(w & !word::FETCHING));
    }
}

/// A prefetch handed to a refresher. Dropped before it was made (its
/// refresher stopped or its task was aborted with it queued or in flight, or
/// the queue was discarded), it releases its key's claim, so that the key's
/// next request can take a lease again.
struct Queued {
    key: Vec<u8>,
    /// `None` once taken back by [`into_fetch`](Self::into_fetch).
    fetch: Option<Fetch>,
    /// Set once the fetch's answer is in the key's word.
    made: bool,
    owner: Weak<dyn ReleaseClaim>,
}

impl Drop for Queued {
    fn drop(&mut self) {
        if !self.made
            && self.fetch.is_some()
            && let Some(owner) = self.owner.upgrade()
        {
            owner.release(&self.key);
        }
    }
}

impl Queued {
    /// The fetch, taken back unmade (the queue refused it): the claim goes
    /// with it, to the request that makes it.
    fn into_fetch(mut self) -> Option<Fetch> {
        self.fetch.take()
    }

    /// Make the fetch on `con` and put its answer into the key's word.
    fn make<C: Clock>(&mut self, limiter: &LeasedLimiter<C>, con: &mut dyn ConnectionLike) {
        if let Some(fetch) = &self.fetch {
            let result = fetch.invocation.invoke(con);
            let _ = limiter.finish_lease(&self.key, 1, fetch, result);
            self.made = true;
        }
    }

    /// [`make`](Self::make) on an asynchronous connection. Dropped while it
    /// awaits the call, `self` is still unmade, and releases the claim.
    #[cfg(feature = "tokio")]
    async fn make_async<C: Clock, Con: ::redis::aio::ConnectionLike>(
        &mut self,
        limiter: &LeasedLimiter<C>,
        con: &mut Con,
    ) {
        if let Some(fetch) = &self.fetch {
            let result = fetch.invocation.invoke_async(con).await;
            let _ = limiter.finish_lease(&self.key, 1, fetch, result);
            self.made = true;
        }
    }
}

impl Queue {
    /// Queue `key`'s fetch, or give it back when the queue is full or its
    /// refresher stopped.
    /// (`Err(None)` only in form: what comes back is what was sent, `Some`.)
    fn send(&self, key: &[u8], fetch: Fetch) -> Result<(), Option<Fetch>> {
        let queued = Queued {
            key: key.to_vec(),
            fetch: Some(fetch),
            made: false,
            owner: Weak::clone(&self.owner),
        };
        match &self.to {
            To::Thread(queue) => queue.try_send(Some(queued)).map_err(|e| match e {
                TrySendError::Full(sent) | TrySendError::Disconnected(sent) => {
                    sent.and_then(Queued::into_fetch)
                }
            }),
            #[cfg(feature = "tokio")]
            To::Task(queue) => queue.try_send(queued).map_err(|e| match e {
                tokio::sync::mpsc::error::TrySendError::Full(queued)
                | tokio::sync::mpsc::error::TrySendError::Closed(queued) => queued.into_fetch(),
            }),
        }
    }
}

#[cfg(feature = "tokio")]
impl<C: Clock + 'static> LeasedLimiter<C> {
    /// [`start_refresher`](Self::start_refresher) as a tokio task on an
    /// asynchronous connection (feature `tokio` too): it makes this limiter's
    /// prefetches and gives back idle leases every idle time (at least every
    /// 10 ms), until the returned handle is aborted. `None` when a refresher
    /// was started already. Must be called within a tokio runtime.
    pub fn start_refresher_async<Con>(
        self: &Arc<Self>,
        mut con: Con,
    ) -> Option<tokio::task::JoinHandle<()>>
    where
        Con: ::redis::aio::ConnectionLike + Send + 'static,
    {
        let (queue, mut requests) = tokio::sync::mpsc::channel::<Queued>(QUEUE);
        if self
            .refresher
            .set(Queue {
                to: To::Task(queue),
                owner: self.owner(),
            })
            .is_err()
        {
            return None;
        }
        let limiter = Arc::clone(self);
        let tick = self.idle.max(Duration::from_millis(10));
        Some(tokio::spawn(async move {
            let mut last_give_back = Instant::now();
            loop {
                match tokio::time::timeout(tick, requests.recv()).await {
                    // Aborted while this awaits, `queued` is dropped unmade
                    // and releases the key's claim.
                    Ok(Some(mut queued)) => queued.make_async(&limiter, &mut con).await,
                    Ok(None) => break,
                    Err(_) => {}
                }
                if last_give_back.elapsed() >= tick {
                    limiter.give_back_idle_async(&mut con).await;
                    last_give_back = Instant::now();
                }
            }
        }))
    }
}

/// The keys that may hold a lease here, for give-back passes.
struct Holders {
    keys: HashSet<Vec<u8>>,
    /// The size at which an insert first forgets the keys holding nothing.
    prune_at: usize,
}

/// The least size at which [`Holders`] is pruned.
const MIN_PRUNE: usize = 1_024;

/// A lease word as a give-back pass sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lease {
    /// No usable tokens: nothing to give back, and the key can be forgotten.
    Spent,
    /// Tokens held: given back (`true`) or kept (`false`: in use, or a fetch
    /// is under way).
    Idle(bool),
}

/// How a claim went.
enum Claim {
    /// This request fetches.
    Fetch(Fetch),
    /// Claimed; the fetch is being built.
    Claimed,
    /// A miss found tokens after all, and spent them.
    Spent(Decision),
    /// Another request is fetching.
    Busy,
}

/// The lease script's reply `{granted, left, wait_us, wait_ns}` as the tokens
/// granted and, when none, the wait in nanoseconds.
fn parse_lease(reply: &Value) -> Result<(u32, u64), RedisLimitError> {
    let bad = || RedisLimitError::Reply {
        reply: format!("{reply:?}"),
    };
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    let [
        Value::Int(granted),
        Value::Int(_left),
        Value::Int(us),
        Value::Int(ns),
    ] = items.as_slice()
    else {
        return Err(bad());
    };
    let granted = u32::try_from(*granted).map_err(|_| bad())?;
    if granted > MAX_LEASE || !(-999..=999).contains(ns) {
        return Err(bad());
    }
    let nanos = i128::from(*us) * 1_000 + i128::from(*ns);
    Ok((granted, u64::try_from(nanos.max(0)).unwrap_or(u64::MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_word_packs_and_unpacks_at_every_edge() {
        let all = word::DRY | word::DENIED | word::FETCHING;
        let w = word::pack(MAX_LEASE + MAX_LEASE / 4, 31, word::TIME_MASK, all);
        assert_eq!(word::tokens(w), MAX_LEASE + MAX_LEASE / 4);
        assert_eq!(word::size_code(w), 31);
        assert_eq!(word::time(w), word::TIME_MASK);
        assert_eq!(w & all, all);
        let w = word::pack(0, 0, 0, 0);
        assert_eq!(w, 0);
        let w = word::pack(5, 3, 77, 0);
        assert_eq!(
            (word::tokens(w), word::size_code(w), word::time(w)),
            (5, 3, 77)
        );
        assert_eq!(word::tokens(word::with_tokens(w, 9)), 9);
        assert_eq!(word::time(word::with_tokens(w, 9)), 77);
        assert_eq!(word::units_down(u64::MAX), word::TIME_MASK);
        assert_eq!(word::units_up(u64::MAX), word::TIME_MASK);
        assert_eq!(word::units_up(1), 1);
        assert_eq!(word::units_down((1 << 22) - 1), 0);
    }

    #[test]
    fn a_lease_is_spent_while_valid_and_never_after() {
        let algorithm = LeaseWord {
            capacity: 10,
            lifetime: Duration::from_secs(1),
        };
        let expiry = word::units_down(1_000_000_000);
        let w = word::pack(3, 2, expiry, 0);
        assert_eq!(
            algorithm.decide(w, 0, 2),
            (
                Decision::Allowed { remaining: 1 },
                Some(word::pack(1, 2, expiry, 0))
            )
        );
        // Too few: not decided here (a wait of 0), nothing written.
        let (d, next) = algorithm.decide(w, 0, 4);
        assert_eq!(d.retry_after().map(|r| r.as_nanos()), Some(0));
        assert!(next.is_none());
        // Expired: nothing spendable, and the word is as good as fresh.
        let late = word::nanos(expiry);
        assert_eq!(algorithm.remaining(w, late), 0);
        assert!(algorithm.is_fresh_equivalent(w, late));
        assert!(!algorithm.is_fresh_equivalent(w | word::FETCHING, late));
        // A denial kept, its wait for two tokens: its wait for requests of
        // up to two, until it ends; a larger request is not decided here.
        let denied = word::pack(2, 0, expiry, word::DENIED);
        for n in [1, 2] {
            let (d, _) = algorithm.decide(denied, 0, n);
            assert_eq!(
                d.retry_after().map(|r| r.as_nanos()),
                Some(word::nanos(expiry))
            );
        }
        let (d, next) = algorithm.decide(denied, 0, 3);
        assert_eq!(d.retry_after().map(|r| r.as_nanos()), Some(0));
        assert!(next.is_none());
        assert!(!algorithm.is_fresh_equivalent(denied, 0));
        assert!(algorithm.is_fresh_equivalent(denied, late));
    }

    #[test]
    fn lease_replies_parse_and_others_are_errors() {
        let array = |v: &[i64]| Value::Array(v.iter().map(|x| Value::Int(*x)).collect());
        assert_eq!(parse_lease(&array(&[7, 3, 0, 0])).unwrap(), (7, 0));
        assert_eq!(parse_lease(&array(&[0, 0, 5, -1])).unwrap(), (0, 4_999));
        for bad in [
            array(&[-1, 0, 0, 0]),
            array(&[1 << 40, 0, 0, 0]),
            array(&[0, 0, 0, 1_000]),
            array(&[1, 2, 3]),
            Value::Nil,
        ] {
            assert!(parse_lease(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_keys_kept_for_give_back_passes_stay_bounded_without_them() {
        use crate::clock::ManualClock;
        let clock = ManualClock::new();
        let global = RedisLimiter::new(
            "holders",
            TokenBucket::new(crate::Quota::per_second(1_000).unwrap()),
        )
        .unwrap();
        let limiter = LeasedBuilder::new(global, 8)
            .unwrap()
            .lifetime(Duration::from_secs(1))
            .clock(clock.clone())
            .build()
            .unwrap();
        let granted = Value::Array([4, 0, 0, 0].into_iter().map(Value::Int).collect());
        let miss = Fetch {
            purpose: Purpose::Miss,
            size_code: 2,
            need: 1,
            invocation: limiter.lease_invocation(b"k", 1, 4),
        };
        let mut most = 0;
        for i in 0..20_000u32 {
            // Every key takes one lease, which expires before the next key's:
            // no give-back pass ever runs.
            let key = i.to_be_bytes();
            let _ = limiter.finish_lease(&key, 1, &miss, Ok(granted.clone()));
            clock.advance(Duration::from_secs(2));
            let held = limiter.holders.lock().unwrap().keys.len();
            most = most.max(held);
        }
        assert!(most <= MIN_PRUNE, "{most}");
    }

    /// A give-back pass empties a key's word and then forgets the key; a
    /// lease granted in between must keep its key in `holders`, or no later
    /// pass (nor `give_back_all` at shutdown) sees it. The pass is held at
    /// the `holders` lock while a miss takes a new lease.
    #[test]
    fn a_lease_granted_during_a_give_back_keeps_its_key() {
        use crate::clock::ManualClock;
        use std::sync::Arc;
        let clock = ManualClock::new();
        let global = RedisLimiter::new(
            "race",
            TokenBucket::new(crate::Quota::per_second(1_000).unwrap()),
        )
        .unwrap();
        let limiter = Arc::new(
            LeasedBuilder::new(global, 8)
                .unwrap()
                .lifetime(Duration::from_secs(10))
                .clock(clock)
                .build()
                .unwrap(),
        );
        let granted = Value::Array([4, 0, 0, 0].into_iter().map(Value::Int).collect());
        let mut lost = 0;
        for i in 0..100 {
            let key = format!("k{i}").into_bytes();
            let Ok(Step::Lease(fetch)) = limiter.step(&key, 1) else {
                panic!("a first request takes a lease");
            };
            let _ = limiter.finish_lease(&key, 1, &fetch, Ok(granted.clone()));
            assert!(limiter.held(&key) > 0);
            let pause = limiter.holders.lock().unwrap();
            let pass = {
                let (limiter, key) = (Arc::clone(&limiter), key.clone());
                std::thread::spawn(move || limiter.take_lease(&key, None))
            };
            // Give the pass time to reach the lock (or, on the old order, to
            // empty the word first).
            let start = std::time::Instant::now();
            while limiter.held(&key) != 0 && start.elapsed() < Duration::from_millis(20) {
                std::thread::yield_now();
            }
            if limiter.held(&key) != 0 {
                // The pass waits for the lock before touching the word.
                drop(pause);
                let _ = pass.join().unwrap();
                continue;
            }
            // The word was emptied with the key still listed: a miss takes a
            // new lease before the pass forgets the key.
            let Ok(Step::Lease(fetch)) = limiter.step(&key, 1) else {
                panic!("a miss after the word was emptied");
            };
            let miss = {
                let (limiter, key, granted) = (Arc::clone(&limiter), key.clone(), granted.clone());
                std::thread::spawn(move || limiter.finish_lease(&key, 1, &fetch, Ok(granted)))
            };
            std::thread::sleep(Duration::from_millis(2));
            drop(pause);
            let _ = pass.join().unwrap();
            let _ = miss.join().unwrap();
            if limiter.held(&key) > 0 && !limiter.holders.lock().unwrap().keys.contains(&key) {
                lost += 1;
            }
        }
        assert_eq!(
            lost, 0,
            "{lost} keys hold a lease but are not kept for give-back passes"
        );
    }
}
