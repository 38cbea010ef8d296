//! Leased mode: see [`LeasedLimiter`].

use core::fmt;
use core::time::Duration;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use ::redis::{ConnectionLike, RedisResult, ScriptInvocation, Value};

use crate::admission::Stage;
use crate::algorithm::token_bucket::TokenBucket;
use crate::clock::{Clock, RealClock};
use crate::decision::{Decision, KeyedDecision, RetryAfter};
use crate::error::AcquireError;
use crate::keyed::KeyedLimiter;
use crate::redis::RedisLimiter;
use crate::redis::failover::{Claimed, Debt, Ledger, Strikes};
use crate::redis::guarded::OnFailure;
use crate::redis::health::Health;
use crate::sync::{AtomicU64, Ordering};

mod backoff;
mod builder;
mod give_back;
mod lease;
mod local;
mod probe;
mod refresher;
mod stats;
mod wait;
mod word;

use backoff::Turn;
pub use builder::LeasedBuilder;
use give_back::Holders;
use lease::Claim;
use local::{LeaseWord, Since};
use refresher::Queue;
pub use refresher::Refresher;
use stats::Counters;
pub use stats::LeasedStats;
use wait::Signal;

/// The longest lease lifetime (the word's time field covers 208 days; an hour
/// keeps every comparison far from its end).
const MAX_LIFETIME: Duration = Duration::from_secs(3_600);
/// The shortest lease lifetime: the word keeps time in units of 4.19 ms
/// (`word::UNIT_SHIFT`), and a shorter lifetime would be one unit or none.
const MIN_LIFETIME: Duration = Duration::from_millis(10);

fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A limit kept in Redis, spent here from leases (leased mode): a process
/// takes permits from a key's global limit in Redis in batches (leases) and
/// spends them from a word of its own, by compare-and-swap, at in-process
/// speed. Every algorithm leases (see [Algorithms](#algorithms)); what
/// follows says "tokens" and "bucket" for the token bucket, and means the
/// permits and the key's limit for each.
///
/// # How a decision goes
///
/// Each key has one word in a [`KeyedLimiter`] of this process (the same
/// lock-free map and compare-and-swap cell as every in-process limit): the
/// tokens of its lease, the lease's expiry, its size (and so its low-water
/// mark), and three flags.
/// A request for `n` permits spends `n` of those tokens by one
/// compare-and-swap, with no call to Redis, while the lease is valid and holds
/// them. The request whose spend takes the count below the prefetch mark
/// claims the key's fetch (a flag in the word, so exactly one request fetches
/// while the others keep spending): the next lease is fetched ahead of need,
/// in one script call. The mark is what the key spends while a fetch is under
/// way: a quarter of the lease size, or up to half of it for a key that, at
/// the rate it spent its lease so far, would run out within twice the fetch
/// latency measured (claim to answer, a moving average per limiter). With a [`Refresher`]
/// ([`start_refresher`](LeasedLimiter::start_refresher), a thread with a
/// connection of its own) the request only queues the key and the thread
/// makes the call, off the request path ([`start_refresher_async`](LeasedLimiter::start_refresher_async)
/// is the same as a tokio task); without one, the claiming request makes it
/// after its own decision is made (its answer does not depend on it). A request that finds no tokens (a new key, a lease spent or expired)
/// claims the fetch and takes a lease for itself (one call, within the
/// connection's deadline); if another request (or the refresher) is fetching
/// already, it waits for that fetch, up to the fetch wait
/// ([`LeasedBuilder::fetch_wait`], default 5 ms), and spends from what it
/// brought, with no call of its own; a fetch not back by then answers it by
/// the failure policy, as its own call timing out would. A bucket that
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
/// its prefetch mark in under a quarter of the lease lifetime or ran out
/// before the next one came, and halves when a lease expired with tokens
/// left; it never exceeds the configured largest lease `L`. No prefetch runs
/// below a size of 4.
///
/// # Algorithms
///
/// Each algorithm's lease script works on the key and state of its exact
/// script, so exact and leased processes share one limit, and takes
/// `min(want, room)` permits when at least `need` fit, as `k` admissions in
/// a row at that reading would; its give-back returns what was not spent.
///
/// - **Token bucket** (`lease.lua`): the tokens leave the bucket; a
///   give-back adds them back, up to the capacity.
/// - **GCRA** (`gcra_lease.lua`): a lease of `k` moves the theoretical
///   arrival time (TAT) from `max(TAT, now)` by `k·T` (`T` the emission
///   interval) when the burst tolerance allows it, exactly as `k`
///   admissions would; a give-back of `m` moves it back by `m·T`, but never
///   before the reading (a TAT at or before now is a fresh key, deleted):
///   the token bucket's "back up to the capacity" in GCRA's terms. It never
///   returns more than the lease took, and it does not undo the leases
///   other processes took after it (their `k·T` stay in the sum), so it
///   never declines. GCRA with burst `B` admits at most `B + t/T` in any time
///   `t`, so the bound below holds with `r(t) = t/T`.
/// - **Fixed window** (`fixed_window_lease.lua`): a lease counts `k` permits
///   in the current window and ends with that window: its expiry is the
///   window's end, counted from before the call was sent and rounded down
///   to the word's unit (4.19 ms), so no permit is spent outside the window
///   that counted it. A give-back returns the unspent permits to that window
///   only, while the key still counts it, and declines once it counts a
///   later one. The bound is the fixed window's own: at most `limit`
///   permits per window, with no lease term (leased permits are counted
///   before they are spent, in their window), given clocks that run at one
///   rate (a clock running `ε` slow stretches a lease by `ε` of its window).
///   What it costs instead: permits held unspent when a window ends are lost
///   to that window, up to `N·(L + ⌊L/2⌋)` per window.
/// - **Sliding window** (`sliding_window_lease.lua`): a lease counts `k`
///   permits in the current window when the estimate
///   `current + k + previous·(w − e)/w` stays within the limit (exactly as
///   `k` admissions would), and ends with the window, as the fixed window's.
///   A permit spent later in the window still passes the check that counted
///   it (the previous window's weight only falls through a window), and the
///   counts hold at least the permits spent, so every admission satisfies
///   the invariant the sliding window's bounds come from: at most `limit`
///   in any whole window and `limit·(1 + s/w)` in any interval `s ≤ w`, with
///   no lease term. A give-back returns unspent permits to the current count
///   of the window that counted them, only while it is still the current
///   one.
///
/// The failure policy's local share is a token bucket for every algorithm
/// ([`OnFailure::local_share_of`] derives one that admits no more than the
/// algorithm over any interval): the local share must start empty in a
/// degraded period and have what it admitted charged to Redis later (the
/// failover rule), which a bucket's level does and a window's count, reset
/// at each boundary, would not.
///
/// # Fair shares of a dry key
///
/// When the processes together ask for more than the bucket refills, each
/// keeps Redis' denial and answers its requests from it with no call, and one
/// such request in every `L` asks Redis instead (a probe; [`LeasedStats`]
/// counts them). A process's calls to a dry key so come in proportion to its
/// requests, and the tokens the bucket refills go to the first call that
/// finds a quarter lease of them: each process's share of the admissions
/// follows its share of the requests (`tests/leased.rs` runs four processes
/// on one key, one flat out beside three slower ones and then all four flat
/// out, and checks that each process's share of the admissions is within
/// 0.2 of its share of the requests). The probes cost at most one call per
/// `L` denials.
///
/// # Bounds
///
/// For the token bucket and GCRA (the windows keep their own bounds, with no
/// lease term: see [Algorithms](#algorithms)):
/// `N` processes share a key; leases have at most `L` tokens and lifetime
/// `τ`; the bucket has capacity `B` and refills `r(T)` over a time `T` (for
/// GCRA, `B` its burst and `r(T) = T/t_e`, `t_e` the emission interval). A
/// process holds at most `L + ⌊L/2⌋ − 1` tokens of a key: a fetch starts below
/// the prefetch mark, at most `⌊size/2⌋`, and brings at most one lease, and a
/// request that finds too few tokens asks only for what it lacks beyond that.
///
/// - **Over-admission.** Every token spent from a lease was taken from the
///   global bucket first. In any interval of length `T` the bucket gives out
///   at most `B + r(T)` tokens plus what is given back to it meanwhile, and
///   tokens given back were never spent. What a process admits in an interval
///   is at most what it took in the interval plus what it held when the
///   interval began. So all processes together admit at most
///   `B + r(T) + N·(L + ⌊L/2⌋)` in any interval of length `T`, against exact
///   mode's `B + r(T)`, for as long as Redis keeps the key (a Redis that
///   loses its data starts the bucket full again, in either mode). The
///   tokens left when a lease is topped up (fewer than the prefetch mark)
///   take the new lease's expiry.
/// - **Stranded tokens.** At any moment at most `N·(L + ⌊L/2⌋)` tokens are out
///   of the global bucket and not yet spent. Others cannot use them until they
///   are spent, given back ([`give_back_idle`](LeasedLimiter::give_back_idle),
///   one script per key), or expire: a lease is never spent after `τ`, and
///   what it left is lost to the bucket, which refills it at its own rate.
/// - **Redis calls.** Once the lease size has grown to `L`, one call brings
///   `L` tokens: at most one call per `L` admissions while the bucket has
///   tokens, with or without a refresher, however many threads spend (the
///   size grows to `L` only for a key that spends its leases within their
///   idle time; a slower key's leases are given back or expire unspent, and
///   it makes a call, and a give-back, for each lease it takes): a
///   request that finds the key dry while its lease is being fetched waits
///   for that fetch instead of calling. While the bucket is dry, a lease
///   brings only what has refilled, and costs two calls: the one that grants
///   it and a prefetch at its mark that finds the bucket dry (then none until
///   the lease runs out). A denial costs one call per wait (at most one lease
///   lifetime) per process for the requests its count covers, one per `L`
///   denials it answers (the probes), and one for each larger request.
///
/// # Failures
///
/// Every call runs on the caller's connection, with its deadline
/// ([`Deadlines`](super::Deadlines)); a request makes at most one call, and
/// one that waits for another's fetch makes none and waits at most the fetch
/// wait, so with the fetch wait set to the response deadline no request
/// waits longer than one call's deadlines (`Deadlines` names the cases in
/// redis-rs that take more than one). A failed call starts a backoff
/// (a timeout, only the third in a row:
/// [`timeouts_to_back_off`](LeasedBuilder::timeouts_to_back_off)), for
/// which no request calls Redis; while it lasts a request that the leases held
/// here cannot serve is answered by the [`OnFailure`] policy: denied (fail
/// closed: only tokens already leased are spent) or decided by a local keyed
/// limit (fail open), which starts empty in each degraded period and whose
/// admissions are charged to Redis by the key's next exact-mode call. Over any
/// interval of length `T` holding a failure and its recovery, all processes
/// admit at most `B + r(T) + N·(L + ⌊L/2⌋)`, plus what the local shares
/// admitted and Redis was not yet charged for (the guide's
/// [failover rule](crate::guide::redis#the-failover-rule-and-its-bound)).
/// After the backoff one request probes Redis; its success ends the backoff.
/// [`stats`](LeasedLimiter::stats) counts failures, fallback decisions and
/// what is owed.
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
    /// How long a request that finds its key dry waits for the key's fetch
    /// in flight.
    fetch_wait: Duration,
    /// The fetches' latency (claim to answer, queueing included), a moving
    /// average in nanoseconds; 0 before the first.
    fetch_latency: AtomicU64,
    /// Wakes the requests waiting for a fetch.
    signal: Signal,
    epoch: Instant,
    /// Nanoseconds since `epoch` before which Redis is not called; 0 when it
    /// is called.
    retry_at: AtomicU64,
    counters: Counters,
    /// The degraded periods: counted and logged once each.
    health: Health,
    /// Timeouts in a row, and how many start the backoff.
    strikes: Strikes,
    /// Local shares emptied per degraded period, and what they owe Redis.
    ledger: Ledger,
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
    /// When it was claimed, on the words' clock: its latency is measured
    /// from here.
    started: u64,
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
            self.limiter.release_fetch(self.key);
        }
    }
}

/// What a request the key's word did not decide on its own
/// ([`LeasedLimiter::spend`]) has left to do.
enum Spend {
    /// `n` is 0 or above the largest lease: an error, or a request decided
    /// in Redis (exact mode).
    Unchecked,
    /// The word's answer (an admission that took the lease below its mark,
    /// or a denial), with the word written.
    Taken(KeyedDecision, Option<u64>),
}

/// What a request does next.
pub(crate) enum Step {
    /// Decided without Redis.
    Done(Decision),
    /// Take a lease.
    Lease(Fetch),
    /// Ask Redis for the permits themselves (exact mode), and for the debt
    /// claimed (see `failover`).
    Exact(ScriptInvocation<'static>, Claimed),
    /// Wait for the key's fetch in flight, then spend from what it brought.
    Wait,
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
            Step::Lease(_) | Step::Exact(..) | Step::Wait => None,
        }
    }

    /// Whether a call to Redis is left to make.
    pub(crate) fn calls(&self) -> bool {
        !matches!(self, Step::Done(_))
    }
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

    /// Whether this limiter holds nothing a new one for the same limit would
    /// not: Redis is not failing now, no key has lease tokens left
    /// unexpired, a fetch in flight or a denial kept, no permits its local
    /// share admitted are still owed to Redis, and every key of the local
    /// share (if any) is back at its whole allowance. Sweeps to find out. Dropping it then
    /// loses nothing (what a dropped limiter held otherwise: unspent leases,
    /// taken from Redis and lost until they refill; and debts, never
    /// charged).
    pub fn holds_nothing(&self) -> bool {
        if self.is_degraded() || self.ledger.total() != 0 {
            return false;
        }
        self.local.sweep();
        self.local.is_empty() && self.on_failure.share_holds_nothing()
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
        match self.spend(key, n) {
            Ok(decision) => Ok(decision),
            Err(spend) => self.complete(con, key, n, spend),
        }
    }

    /// The rest of a request the word alone did not decide: its step, and
    /// the call that asks for, on `con`. Kept out of line, so that a
    /// decision from the lease held carries none of its frame.
    #[inline(never)]
    fn complete(
        &self,
        con: &mut dyn ConnectionLike,
        key: &[u8],
        n: u32,
        spend: Spend,
    ) -> Result<Decision, AcquireError> {
        Ok(match self.step_after(key, n, spend)? {
            Step::Done(decision) => decision,
            Step::Lease(fetch) => {
                let result = fetch.invocation.invoke(con);
                self.finish_lease(key, n, &fetch, result)
            }
            Step::Exact(invocation, debt) => {
                let debt = Debt::claimed(&self.ledger, key, debt);
                let result = invocation.invoke(con);
                self.finish_exact(key, n, debt, result)
            }
            Step::Wait => {
                self.wait_for_fetch(key);
                self.after_wait(key, n)
            }
        })
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
        let step = match self.spend(key, n) {
            Ok(decision) => return Ok(decision),
            Err(spend) => self.step_after(key, n, spend)?,
        };
        Ok(self.complete_async(con, key, n, step).await)
    }

    /// The decision `n` permits for `key` would get now, taking nothing.
    /// Where the key's word answers a request with no call, the peek is that
    /// answer: an admission from the lease held here (`remaining` what it
    /// would have left), or the denial kept here. Otherwise it asks Redis
    /// ([`RedisLimiter::peek_n`]) for what a request would: the tokens the
    /// lease held lacks for `n` (a lease call may ask for more at once, up
    /// to a quarter of the lease size, so a request can wait where the peek
    /// admitted), or, for `n` above the largest lease or a key that owes
    /// Redis for a fail-open outage, `n` and the debt as an exact call; an
    /// admission's `remaining` is then what Redis would have left. The
    /// tokens other processes' leases hold are not counted, as a request
    /// here could not spend them. While Redis fails, the failure policy
    /// answers, from the local share without spending it (failing closed, a
    /// denial with the wait until Redis is tried). A failed peek counts and
    /// starts a backoff as any call does.
    ///
    /// ```no_run
    /// use turnstile::redis::{Deadlines, LeasedBuilder, RedisLimiter};
    /// use turnstile::{Quota, TokenBucket};
    ///
    /// let mut con = Deadlines::default().blocking(redis::Client::open("redis://127.0.0.1/")?);
    /// let global = RedisLimiter::new("api", TokenBucket::new(Quota::per_second(1_000)?))?;
    /// let leased = LeasedBuilder::new(global, 100)?.build()?;
    /// // Answered from the lease held here when it has the permits: no call.
    /// let would = leased.peek_n(&mut con, "k_live_123", 5)?;
    /// println!("5 permits now: {would:?}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n).
    pub fn peek_n(
        &self,
        con: &mut dyn ConnectionLike,
        key: impl AsRef<[u8]>,
        n: u32,
    ) -> Result<Decision, AcquireError> {
        let key = key.as_ref();
        match self.peek_step(key, n)? {
            Ok(decision) => Ok(decision),
            Err((claimed, ask)) => {
                let result = self.limiter.peek_n(con, key, ask);
                self.finish_peek(key, n, claimed, result)
            }
        }
    }

    /// [`peek_n`](Self::peek_n) on an asynchronous connection (feature
    /// `tokio` too); a peek the key's word answers awaits nothing.
    ///
    /// # Errors
    ///
    /// As [`peek_n`](Self::peek_n).
    #[cfg(feature = "tokio")]
    pub async fn peek_n_async<Con: ::redis::aio::ConnectionLike>(
        &self,
        con: &mut Con,
        key: impl AsRef<[u8]>,
        n: u32,
    ) -> Result<Decision, AcquireError> {
        let key = key.as_ref();
        match self.peek_step(key, n)? {
            Ok(decision) => Ok(decision),
            Err((claimed, ask)) => {
                let result = self.limiter.peek_n_async(con, key, ask).await;
                self.finish_peek(key, n, claimed, result)
            }
        }
    }

    /// A peek's answer without a call (`Ok`), or the debt claim it reads
    /// and the permits to ask Redis about (`Err`).
    fn peek_step(
        &self,
        key: &[u8],
        n: u32,
    ) -> Result<Result<Decision, (Claimed, u32)>, AcquireError> {
        crate::error::check_permits(n, self.capacity)?;
        // What a lease call would ask for: `None` for an exact call.
        let mut lease = None;
        if n <= self.max_lease {
            match self.local.stage(key).peek(n) {
                Ok(KeyedDecision::Allowed { remaining }) => {
                    return Ok(Ok(Decision::Allowed { remaining }));
                }
                // A denial kept here answers a request with no call.
                Ok(KeyedDecision::Denied { retry_after }) if retry_after.as_nanos() > 0 => {
                    return Ok(Ok(Decision::Denied { retry_after }));
                }
                // Dry: a lease for what the tokens held lack.
                Ok(KeyedDecision::Denied { .. }) => lease = Some(n - self.held(key).min(n)),
                // Not held here (the key bound): an exact call.
                _ => {}
            }
        }
        if let Turn::Skip { wait } = self.turn() {
            return Ok(Ok(self.fallback_peek(key, n, wait)));
        }
        Ok(Err(match lease {
            // A key that owes Redis pays by an exact call first.
            Some(lack) if !self.ledger.owes(key) => (Claimed::NONE, lack),
            _ => {
                let claimed = self.ledger.peek(key, n, self.capacity - n);
                (claimed, claimed.ask(n))
            }
        }))
    }

    /// A peek's answer from Redis' reply, or from the policy when the call
    /// failed (which counts and starts a backoff, as any call's failure).
    fn finish_peek(
        &self,
        key: &[u8],
        n: u32,
        claimed: Claimed,
        result: Result<Decision, crate::redis::RedisLimitError>,
    ) -> Result<Decision, AcquireError> {
        match result {
            Ok(decision) => {
                self.succeed();
                Ok(claimed.answer(decision))
            }
            Err(crate::redis::RedisLimitError::Acquire(e)) => Err(e),
            Err(e) => {
                self.fail(&e);
                Ok(self.fallback_peek(key, n, self.backoff))
            }
        }
    }

    /// The failure policy's answer to a peek: counted as its decision,
    /// taking nothing.
    fn fallback_peek(&self, key: &[u8], n: u32, wait: Duration) -> Decision {
        Counters::add(&self.counters.fallbacks, 1);
        self.on_failure
            .peek(&self.ledger, self.health.stretch(), key, n, wait)
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
            Step::Exact(invocation, debt) => {
                let debt = Debt::claimed(&self.ledger, key, debt);
                let result = invocation.invoke_async(con).await;
                self.finish_exact(key, n, debt, result)
            }
            Step::Wait => {
                self.wait_for_fetch_async(key).await;
                self.after_wait(key, n)
            }
        }
    }

    /// Undo what `step` claimed for `key`, when it will never be made (a
    /// layer's response future dropped before its first poll, a prefetch
    /// task dropped unrun by a runtime shutting down): a fetch claim is
    /// released, and a debt claimed is owed again.
    #[cfg(all(feature = "tower", feature = "tokio"))]
    pub(crate) fn abandon(&self, key: &[u8], step: Step) {
        match step {
            Step::Lease(_) => self.release_fetch(key),
            Step::Exact(_, claimed) => drop(Debt::claimed(&self.ledger, key, claimed)),
            Step::Done(_) | Step::Wait => {}
        }
    }

    /// Decide what the request does: spend, fall back, or call Redis (for the
    /// layer, which makes the call in a task of its own, and the unit tests;
    /// the calls above spend first and go on with `step_after`).
    #[cfg(any(test, all(feature = "tower", feature = "tokio")))]
    pub(crate) fn step(&self, key: &[u8], n: u32) -> Result<Step, AcquireError> {
        match self.spend(key, n) {
            Ok(decision) => Ok(Step::Done(decision)),
            Err(spend) => self.step_after(key, n, spend),
        }
    }

    /// A request's first step, on the key's word alone: spend `n` from the
    /// lease held here; when that leaves it at or above its prefetch mark,
    /// the decision is made (`Ok`), and nothing else is read: no flag, no
    /// backoff, no debt, no refresher, which matter only to a request that
    /// fetches or calls. Otherwise what is left to do (`Err`), for
    /// [`step_after`](Self::step_after).
    #[inline(always)]
    fn spend(&self, key: &[u8], n: u32) -> Result<Decision, Spend> {
        // `n` is 0 or above the largest lease: checked, and decided in Redis,
        // by `step_after`.
        if n.wrapping_sub(1) >= self.max_lease {
            return Err(Spend::Unchecked);
        }
        let (decision, written, now, _) = self.local.take(key, n);
        if let KeyedDecision::Allowed { remaining } = decision
            && written.is_none_or(|w| !self.below_mark(w, remaining, now))
        {
            return Ok(Decision::Allowed { remaining });
        }
        Err(Spend::Taken(decision, written))
    }

    /// The rest of [`step`](Self::step), after [`spend`](Self::spend).
    ///
    /// # Errors
    ///
    /// [`AcquireError`] for `n = 0` or above the capacity.
    #[inline(never)]
    fn step_after(&self, key: &[u8], n: u32, spend: Spend) -> Result<Step, AcquireError> {
        let (decision, written) = match spend {
            Spend::Unchecked if n == 0 => return Err(AcquireError::ZeroPermits),
            Spend::Unchecked if n > self.capacity => {
                return Err(AcquireError::InsufficientCapacity {
                    requested: n,
                    capacity: self.capacity,
                });
            }
            Spend::Unchecked => return Ok(self.exact_or_fallback(key, n)),
            Spend::Taken(decision, written) => (decision, written),
        };
        Ok(self.step_taken(key, n, decision, written))
    }

    /// A request's step after its word answered `decision` (and wrote
    /// `written`), not from the lease held above its mark.
    fn step_taken(
        &self,
        key: &[u8],
        n: u32,
        decision: KeyedDecision,
        written: Option<u64>,
    ) -> Step {
        match decision {
            KeyedDecision::Allowed { remaining } => {
                let decision = Decision::Allowed { remaining };
                // `spend` answered every admission but those that took the
                // lease below its mark.
                let Some(written) = written else {
                    return Step::Done(decision);
                };
                if written & (word::FETCHING | word::DRY) != 0
                    || self.is_backing_off()
                    || self.ledger.owes(key)
                {
                    return Step::Done(decision);
                }
                match self.claim(key, n, Purpose::Prefetch(decision)) {
                    // Claimed first, then the turn: a probe after a backoff
                    // is only taken by a request that will call.
                    Claim::Fetch(_) if matches!(self.turn(), Turn::Skip { .. }) => {
                        self.release_fetch(key);
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
                                self.release_fetch(key);
                                Step::Done(decision)
                            }
                        },
                    },
                    _ => Step::Done(decision),
                }
            }
            KeyedDecision::Denied { retry_after } if retry_after.as_nanos() > 0 => {
                let kept = Step::Done(Decision::Denied { retry_after });
                // One kept-denial answer in every `L` asks Redis instead
                // (`probe`); never during a backoff, nor while the key's
                // fetch is in flight.
                if self.is_backing_off() || !probe::probes(self.max_lease) {
                    return kept;
                }
                if self.ledger.owes(key) {
                    // A debt is paid by an exact call before leases resume.
                    return self.exact(key, n);
                }
                match self.claim(key, n, Purpose::Miss) {
                    Claim::Fetch(fetch) => {
                        if let Turn::Skip { .. } = self.turn() {
                            self.release_fetch(key);
                            kept
                        } else {
                            Counters::add(&self.counters.probes, 1);
                            Step::Lease(fetch)
                        }
                    }
                    Claim::Spent(decision) => Step::Done(decision),
                    Claim::Busy | Claim::Claimed | Claim::Unlinked => kept,
                }
            }
            KeyedDecision::Denied { .. } | KeyedDecision::KeyLimit { .. } => {
                if self.ledger.owes(key) {
                    // What the local share admitted is charged to Redis by an
                    // exact call before the key takes a lease again (the
                    // failover rule): leased first, the debt was paid only
                    // where the bucket ran dry, and a key that never did
                    // owed it for good.
                    return self.exact_or_fallback(key, n);
                }
                match self.claim(key, n, Purpose::Miss) {
                    Claim::Spent(decision) => Step::Done(decision),
                    // Another request (or the refresher) is fetching this
                    // key's lease: wait for it, with no call of this
                    // request's own.
                    Claim::Busy => Step::Wait,
                    // Claimed first, then the turn: a probe after a backoff
                    // is only taken by a request that will call.
                    Claim::Fetch(fetch) => match self.turn() {
                        Turn::Skip { wait } => {
                            self.release_fetch(key);
                            Step::Done(self.fallback(key, n, wait))
                        }
                        Turn::Call => Step::Lease(fetch),
                    },
                    // Not held here (the key bound is reached): as exact
                    // mode.
                    Claim::Claimed | Claim::Unlinked => self.exact_or_fallback(key, n),
                }
            }
        }
    }

    fn exact_or_fallback(&self, key: &[u8], n: u32) -> Step {
        if let Turn::Skip { wait } = self.turn() {
            return Step::Done(self.fallback(key, n, wait));
        }
        self.exact(key, n)
    }

    /// Ask Redis for the permits themselves, as exact mode does, and for
    /// what the key's local admissions owe (up to the capacity).
    fn exact(&self, key: &[u8], n: u32) -> Step {
        let debt = Debt::claim(&self.ledger, key, n, self.capacity - n);
        match self.limiter.invocation(key, debt.ask(n), None) {
            Ok(invocation) => Step::Exact(invocation, debt.keep()),
            // Checked already: n + debt is within 1..=capacity.
            Err(_) => Step::Done(Decision::Denied {
                retry_after: RETRY_AT_ONCE,
            }),
        }
    }

    fn finish_exact(
        &self,
        key: &[u8],
        n: u32,
        debt: Debt<'_>,
        result: RedisResult<Value>,
    ) -> Decision {
        match self.limiter.decide(result) {
            Ok(decision) => {
                self.succeed();
                Counters::add(&self.counters.exact_calls, 1);
                debt.settle(decision)
            }
            Err(e) => {
                self.fail(&e);
                self.fallback(key, n, self.backoff)
            }
        }
    }
}

/// The wait of a request denied by a race rather than by the bucket (the
/// tokens it was to be served with were spent by others while its lease was
/// fetched): the least wait there is, which `Retry-After` rounds up to 1 s.
/// Never 0, which would tell a client that it was admitted no later than
/// now.
const RETRY_AT_ONCE: RetryAfter = RetryAfter::from_nanos(1);
