//! What to answer while Redis cannot: a failure policy around a
//! [`RedisLimiter`], with a backoff and a count of failures.

use core::fmt;
use core::time::Duration;
use std::time::Instant;

use ::redis::ConnectionLike;

use super::failover::{Claimed, DEFAULT_TIMEOUTS_TO_BACK_OFF, Debt, Failure, Ledger, Strikes};
use super::health::{Counts, Health, Source};
use super::{RedisAlgorithm, RedisLimitError, RedisLimiter, RedisReceipt};
use crate::admission::{Receipt, Stage};
use crate::algorithm::Algorithm;
use crate::algorithm::token_bucket::TokenBucket;
use crate::clock::Clock;
use crate::decision::{Decision, KeyedDecision, RetryAfter};
use crate::error::{AcquireError, QuotaError};
use crate::keyed::KeyedLimiter;
use crate::quota::Quota;
use crate::sync::{AtomicU64, Ordering};
use crate::word::Layout;

/// The answer of a [`Guarded`] limiter while Redis fails and for the backoff
/// after each failure.
pub enum OnFailure<A = TokenBucket, C = crate::clock::RealClock> {
    /// Fail closed: deny every request, with the wait until Redis is tried
    /// again.
    Deny,
    /// Fail open, to a limit in this process: each key gets its own bucket in
    /// this keyed limiter, which should hold this process's share of the
    /// global quota (the quota divided by the processes that share it, say),
    /// so that all of them together stay near the global limit. A request
    /// the share refuses is told the shorter of the share's own wait and the
    /// wait until Redis is tried again (the share starts empty in each
    /// degraded period, so its own wait can be its whole refill).
    ///
    /// Fail-open reaches as many keys as the limiter's
    /// [`max_keys`](KeyedLimiter::max_keys) (an eighth more, for an uneven
    /// spread): each key the share answers in a degraded period takes a line
    /// in the ledger of what it owes Redis, kept for the period. A key past
    /// that room, or one the limiter itself has no room for, is denied, as
    /// failing closed would: what it admitted could not be charged.
    Local(KeyedLimiter<Vec<u8>, A, C>),
}

impl<A: fmt::Debug, C: fmt::Debug> fmt::Debug for OnFailure<A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OnFailure::Deny => f.write_str("Deny"),
            OnFailure::Local(local) => f.debug_tuple("Local").field(local).finish(),
        }
    }
}

impl<A: Algorithm, C: Clock> OnFailure<A, C> {
    /// Whether the local share (if any) holds nothing a new one would not:
    /// every key back at its whole allowance. Sweeps it to find out.
    pub(crate) fn share_holds_nothing(&self) -> bool {
        match self {
            OnFailure::Local(share) => {
                share.sweep();
                share.is_empty()
            }
            _ => true,
        }
    }

    /// The policy's answer to a peek of `n` permits for `key` (`n` checked)
    /// while Redis is not called, taking nothing: the local share's. As a
    /// request does, the key's first peek of a stretch empties its share
    /// (the share starts empty in each outage), so that the share refills
    /// from then on whether requests or only peeks come. Failing closed (or
    /// with no room in the share for the key), a denial with `wait` until
    /// Redis is tried.
    pub(crate) fn peek(
        &self,
        ledger: &Ledger,
        stretch: u64,
        key: &[u8],
        n: u32,
        wait: Duration,
    ) -> Decision {
        match self {
            OnFailure::Local(local) if ledger.prepare(local, key, stretch) => {
                match local.stage(key).peek(n) {
                    Ok(KeyedDecision::Allowed { remaining }) => Decision::Allowed { remaining },
                    Ok(
                        KeyedDecision::Denied { retry_after }
                        | KeyedDecision::KeyLimit { retry_after },
                    ) => Decision::Denied { retry_after },
                    // More than the share holds: as the request would be.
                    Err(_) => deny_for(wait),
                }
            }
            _ => deny_for(wait),
        }
    }
}

impl<A, C> OnFailure<A, C> {
    /// A ledger of the fail-open debts for this policy: sized for its local
    /// share's keys, if any.
    pub(crate) fn ledger(&self) -> Ledger {
        match self {
            OnFailure::Local(local) => Ledger::for_keys(local.max_keys()),
            OnFailure::Deny => Ledger::default(),
        }
    }
}

impl OnFailure {
    /// Fail open to this process's share of `quota` when `processes` share
    /// it: a token bucket per key with `capacity / processes` tokens (at least
    /// one) refilled `processes` times slower, so that the processes together
    /// admit no more than `quota` would (but when the capacity is below the
    /// number of processes: one token each). A refill that fits the share's
    /// bucket comes whole, `processes` times less often; a larger one (a
    /// fixed window's share: its whole limit each window) comes as often as
    /// the quota's, `processes` times smaller (rounded down; when that is
    /// less than one token, one token, as many periods apart as the share
    /// allows).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::Quota;
    /// use turnstile::redis::OnFailure;
    ///
    /// // 100 per second, bursts of 40, across 4 processes: bursts of 10 and 25 per second each.
    /// let share = OnFailure::local_share(Quota::per_second(100)?.burst(40)?, 4)?;
    /// # let _ = share;
    /// # Ok::<(), turnstile::QuotaError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`QuotaError::ZeroProcesses`] when `processes` is 0, and
    /// [`QuotaError::FillTimeTooLong`] when the share's refill is too slow
    /// for a bucket.
    pub fn local_share(quota: Quota, processes: u32) -> Result<OnFailure, QuotaError> {
        if processes == 0 {
            return Err(QuotaError::ZeroProcesses);
        }
        let capacity = (quota.capacity() / processes).max(1);
        let (amount, period) = if quota.amount() <= capacity {
            (quota.amount(), quota.period().saturating_mul(processes))
        } else if quota.amount() >= processes {
            // A refill larger than the share's bucket (a fixed window's share:
            // its whole limit each window) is split, not slowed: slowed, the
            // bucket dropped what it could not hold and ran at a fraction of
            // its share. `amount / processes` tokens (rounded down: never
            // more than the share) each period, within the share's capacity
            // (`amount <= quota's capacity`, so the quotient fits).
            ((quota.amount() / processes).min(capacity), quota.period())
        } else {
            // Fewer tokens a refill than processes: one token, as many
            // periods apart as it takes to stay within the share.
            let periods = processes.div_ceil(quota.amount());
            (1, quota.period().saturating_mul(periods))
        };
        let share = Quota::new(capacity, amount, period)?;
        Ok(OnFailure::Local(KeyedLimiter::new(share)))
    }

    /// Fail open to this process's share of `algorithm`'s limit when
    /// `processes` share it: [`local_share`](Self::local_share) of a token
    /// bucket that admits no more than the algorithm does over any interval,
    /// so that leased and exact mode fail open with any algorithm.
    ///
    /// - a token bucket or GCRA: its own quota (GCRA with capacity `B` and
    ///   emission interval `T` admits at most `B + t/T` in any time `t`, as
    ///   the token bucket of the same quota does);
    /// - a fixed window of `limit` per `w`: `limit` tokens refilled whole
    ///   every `w`, at most `limit · (1 + ⌊t/w⌋)` in any time `t`, within
    ///   the window's own `limit` per window and `2 · limit` across a
    ///   boundary;
    /// - a sliding window of `limit` per `w`: `limit` tokens, refilled at
    ///   `limit` per `w` or a little less (the refill
    ///   [`Quota::per_minute`] would choose for that rate: never faster,
    ///   within 0.1%), at most `limit · (1 + t/w)` in any time `t`: the
    ///   sliding window's own bound for `t ≤ w`.
    ///
    /// A window is rounded up to whole microseconds, and a fixed window to
    /// the bucket's [time unit](Quota::time_unit) (a longer period admits
    /// less).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::redis::OnFailure;
    /// use turnstile::{FixedWindow, SlidingWindow};
    ///
    /// let fixed = FixedWindow::new(100, Duration::from_secs(1))?;
    /// let share = OnFailure::local_share_of(fixed, 4)?;
    /// # let _ = share;
    /// let sliding = SlidingWindow::new(100, Duration::from_secs(1))?;
    /// let share = OnFailure::local_share_of(sliding, 4)?;
    /// # let _ = share;
    /// # Ok::<(), turnstile::QuotaError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`local_share`](Self::local_share).
    pub fn local_share_of(
        algorithm: impl Into<RedisAlgorithm>,
        processes: u32,
    ) -> Result<OnFailure, QuotaError> {
        let quota = match algorithm.into() {
            RedisAlgorithm::TokenBucket(bucket) => bucket.quota(),
            RedisAlgorithm::Gcra(gcra) => gcra.quota(),
            RedisAlgorithm::FixedWindow(fixed) => {
                // The window rounded up to the bucket's time unit: a longer
                // period only admits less.
                let limit = fixed.limit();
                let unit = Layout::for_capacity(limit).unit_micros();
                let micros = window_micros(fixed.window()).div_ceil(unit) * unit;
                Quota::new(limit, limit, Duration::from_micros(micros))?
            }
            RedisAlgorithm::SlidingWindow(sliding) => {
                // `limit` per window (rounded up to whole microseconds), in
                // the refill `Quota::per_minute` would choose: never faster.
                Quota::per_interval(sliding.limit(), window_micros(sliding.window()))?
            }
        };
        Self::local_share(quota, processes)
    }
}

/// A window in whole microseconds, rounded up (a window is at most a few
/// years: it fits, and the product with a time unit below does too).
fn window_micros(window: Duration) -> u64 {
    u64::try_from(window.as_nanos().div_ceil(1_000)).unwrap_or(u64::MAX / 2)
}

/// A [`Guarded`] limiter's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GuardedStats {
    /// Calls to Redis that failed (no connection, a timeout, an error reply),
    /// including those that failed for their key alone (it holds something
    /// other than this limiter's state), which start no degraded period.
    pub failures: u64,
    /// Decisions made by the failure policy instead of Redis (peeks
    /// included: a check before a request counts as well as the request).
    pub fallbacks: u64,
    /// Refunds that gave the permits back ([`Guarded::refund`]), to Redis or
    /// to the local limit.
    pub refunded: u64,
    /// Refunds that did not: declined (the permits could not go back
    /// exactly), failed (counted in `failures` too), or not sent while
    /// backing off, or a receipt of another limiter.
    pub refund_declined: u64,
    /// Whether Redis is failing now: from a failed call until a call
    /// succeeds ([`Guarded::is_degraded`]). A call that failed for its key
    /// alone is answered, and counts as a success here.
    pub degraded: bool,
    /// Degraded periods so far: each begins with a failed call while none
    /// was open, and ends when a call succeeds.
    pub degraded_periods: u64,
    /// Permits the local share of [`OnFailure::Local`](crate::redis::OnFailure::Local)
    /// admitted that Redis has not yet been charged for: each key's next
    /// call that decides in Redis asks for them too (see the guide's
    /// failover rule).
    pub owed: u64,
}

/// A [`RedisLimiter`] that never returns a Redis error: when a call fails it
/// answers by its [`OnFailure`] policy, and for the `backoff` after a failure
/// (a timeout, only the third in a row:
/// [`timeouts_to_back_off`](Self::timeouts_to_back_off)) it does not call
/// Redis at all, so a dead Redis costs the requests in flight one call's
/// deadlines ([`Deadlines`](super::Deadlines) names the longer cases) and the
/// rest nothing. A call that fails for its key alone (the key holds a value
/// that is not this limiter's state, or one of another type: `WRONGTYPE`)
/// is answered by the policy too, but Redis answered it: it starts no
/// backoff and no degraded period, and the other keys decide in Redis as
/// before. A local share starts empty in each degraded period, and what
/// it admitted is charged to Redis by the key's next call there: over any
/// interval of length `T` holding a failure and its recovery, all processes
/// admit at most `B + r(T)` plus what was admitted locally and not yet
/// charged (the guide's
/// [failover rule](crate::guide::redis#the-failover-rule-and-its-bound)). After the backoff one request tries
/// Redis again (the others keep to the policy until it has answered); its
/// success ends the backoff. Admissions can be given back
/// ([`try_acquire_refundable`](Self::try_acquire_refundable),
/// [`refund`](Self::refund)) to whichever made them, Redis or the local
/// fallback.
///
/// ```no_run
/// use std::time::Duration;
/// use turnstile::redis::{Deadlines, Guarded, OnFailure, RedisLimiter};
/// use turnstile::{KeyedLimiter, Quota, TokenBucket};
///
/// let mut con = Deadlines::default().blocking(redis::Client::open("redis://127.0.0.1/")?);
/// // 100 per second across 4 processes; while Redis is out, 25 per second here.
/// let global = RedisLimiter::new("api", TokenBucket::new(Quota::per_second(100)?))?;
/// let local = KeyedLimiter::new(Quota::per_second(25)?);
/// let limiter = Guarded::new(global, OnFailure::Local(local), Duration::from_secs(1));
/// let decision = limiter.try_acquire(&mut con, "k_live_123")?;
/// println!("{decision:?}; {} failures so far", limiter.stats().failures);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Guarded<A = TokenBucket, C = crate::clock::RealClock> {
    limiter: RedisLimiter,
    on_failure: OnFailure<A, C>,
    backoff: Duration,
    epoch: Instant,
    /// Nanoseconds since `epoch` before which Redis is not called; 0 when it
    /// is called (no failure, or the last call succeeded).
    retry_at: AtomicU64,
    failures: AtomicU64,
    fallbacks: AtomicU64,
    refunded: AtomicU64,
    refund_declined: AtomicU64,
    /// The degraded periods: counted and logged once each.
    health: Health,
    /// Timeouts in a row, and how many start the backoff.
    strikes: Strikes,
    /// Local shares emptied per degraded period, and what they owe Redis.
    ledger: Ledger,
    /// This limiter among all others, so that a receipt is given back only to
    /// the limiter that made it.
    id: u64,
}

/// The next [`Guarded`]'s id: core's atomic, not the model-checked one (a
/// static needs a `const` constructor, and no model checks ids).
static NEXT_ID: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// Who admitted a request that a [`GuardedReceipt`] can give back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AdmittedBy {
    /// The limit in Redis.
    Redis,
    /// The local limit of [`OnFailure::Local`], while Redis failed or was
    /// backed off from.
    Local,
}

/// Proof of one admission by a [`Guarded`] limiter, by Redis or by its local
/// fallback ([`admitted_by`](Self::admitted_by)): what
/// [`Guarded::refund`] needs to give the permits back to the one that took
/// them.
///
/// Neither `Clone` nor `Copy`: an admission is refunded at most once. It owns
/// its bytes (`Send + Sync + 'static`), so it can be kept with a request and
/// given back from another task. Dropping it keeps the permits spent. Only the
/// limiter that made it takes it back: any other declines it.
#[derive(Debug)]
#[must_use = "a receipt is what gives the permits back; dropping it keeps them spent"]
pub struct GuardedReceipt {
    /// The [`Guarded`] that made it.
    id: u64,
    n: u32,
    by: Taker,
}

/// What took the permits, and what gives them back there.
#[derive(Debug)]
enum Taker {
    Redis(RedisReceipt),
    Local {
        key: Vec<u8>,
        /// `None` when the local admission wrote nothing (so took nothing).
        receipt: Option<Receipt>,
    },
}

impl GuardedReceipt {
    /// Who admitted: Redis, or the local fallback.
    pub fn admitted_by(&self) -> AdmittedBy {
        match self.by {
            Taker::Redis(_) => AdmittedBy::Redis,
            Taker::Local { .. } => AdmittedBy::Local,
        }
    }

    /// The permits the admission took.
    pub fn permits(&self) -> u32 {
        self.n
    }

    /// The same receipt for `n` of the permits the admission took (at most
    /// those): its refund gives back only those, leaving the key (in Redis
    /// or in the local share) as if the admission had taken the rest.
    #[cfg(all(feature = "tokio", feature = "tower"))]
    pub(crate) fn for_permits(self, n: u32) -> Self {
        let n = self.n.min(n);
        let by = match self.by {
            Taker::Redis(receipt) => Taker::Redis(receipt.for_permits(n)),
            Taker::Local { key, receipt } => Taker::Local {
                key,
                receipt: receipt.map(|receipt| Receipt { n, ..receipt }),
            },
        };
        GuardedReceipt { n, by, ..self }
    }
}

impl<A: fmt::Debug, C: fmt::Debug> fmt::Debug for Guarded<A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guarded")
            .field("limiter", &self.limiter)
            .field("on_failure", &self.on_failure)
            .field("backoff", &self.backoff)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// A call to Redis that a request must make (from [`Guarded::begin`]).
#[cfg(feature = "tokio")]
pub(crate) struct Call(Turn);

/// A refund's next step ([`Guarded::refund`]).
enum Refund {
    /// Settled without a call: given back or not.
    Done(bool),
    /// A call to Redis to make.
    Redis(RedisReceipt),
}

/// Whether to call Redis now.
enum Turn {
    /// Yes: no failure is being backed off from.
    Call,
    /// Yes, as the one probe after a backoff.
    Probe,
    /// No: `wait` is left of the backoff.
    Skip { wait: Duration },
}

impl Guarded {
    /// `limiter` failing closed ([`OnFailure::Deny`]) with a backoff of
    /// `backoff` after each failure: `Guarded::new(limiter, OnFailure::Deny,
    /// backoff)` without naming the policy's unused type parameters.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::redis::{Guarded, RedisLimiter};
    /// use turnstile::{Quota, TokenBucket};
    ///
    /// let global = RedisLimiter::new("api", TokenBucket::new(Quota::per_second(100)?))?;
    /// let limiter = Guarded::fail_closed(global, Duration::from_secs(1));
    /// assert!(!limiter.is_backing_off());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fail_closed(limiter: RedisLimiter, backoff: Duration) -> Guarded {
        Guarded::new(limiter, OnFailure::Deny, backoff)
    }
}

impl<A, C> Guarded<A, C> {
    /// `limiter` with the policy `on_failure` and a backoff of `backoff` after
    /// each failure. With [`OnFailure::Deny`] the policy's type parameters are
    /// not inferred: use [`Guarded::fail_closed`] (or name the type,
    /// `Guarded::<TokenBucket>::new`).
    pub fn new(limiter: RedisLimiter, on_failure: OnFailure<A, C>, backoff: Duration) -> Self {
        Guarded {
            limiter,
            ledger: on_failure.ledger(),
            on_failure,
            backoff,
            epoch: Instant::now(),
            retry_at: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
            refunded: AtomicU64::new(0),
            refund_declined: AtomicU64::new(0),
            health: Health::default(),
            strikes: Strikes::new(DEFAULT_TIMEOUTS_TO_BACK_OFF),
            // Relaxed: only unique values are needed, which any order of
            // read-modify-writes on one atomic gives.
            id: NEXT_ID.fetch_add(1, core::sync::atomic::Ordering::Relaxed),
        }
    }

    /// The limiter in Redis.
    pub fn limiter(&self) -> &RedisLimiter {
        &self.limiter
    }

    /// Start the backoff at the `timeouts`-th call in a row that timed out
    /// (3 by default; 0 is taken as 1). A call that timed out may only have
    /// met a slow Redis (a loaded host), so each is answered by the policy
    /// without stopping the calls of the others; any other failure (a
    /// refused or dropped connection, an error reply) starts the backoff at
    /// once, and an answered call ends the run.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::redis::{Guarded, RedisLimiter};
    /// use turnstile::{Quota, TokenBucket};
    ///
    /// let global = RedisLimiter::new("api", TokenBucket::new(Quota::per_second(100)?))?;
    /// let limiter = Guarded::fail_closed(global, Duration::from_secs(1)).timeouts_to_back_off(1);
    /// assert_eq!(limiter.timeouts(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn timeouts_to_back_off(mut self, timeouts: u32) -> Self {
        self.strikes = Strikes::new(timeouts);
        self
    }

    /// The timeouts in a row that start the backoff
    /// ([`timeouts_to_back_off`](Self::timeouts_to_back_off)).
    pub fn timeouts(&self) -> u32 {
        self.strikes.limit()
    }

    /// Failures, fallback decisions and refunds so far.
    pub fn stats(&self) -> GuardedStats {
        // Counters only: they publish no other data, so Relaxed.
        GuardedStats {
            failures: self.failures.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            refunded: self.refunded.load(Ordering::Relaxed),
            refund_declined: self.refund_declined.load(Ordering::Relaxed),
            degraded: self.health.is_degraded(),
            degraded_periods: self.health.periods(),
            owed: self.ledger.total(),
        }
    }

    /// `true` while Redis is failing: from a failed call (a decision's, a
    /// refund's or a [`ping`](Self::ping)'s) until a call succeeds, whether
    /// the backoff is running or a probe is due. Decisions meanwhile come
    /// from the policy. Before any call it is `false`: nothing is known yet;
    /// a [`ping`](Self::ping) at start-up finds out.
    ///
    /// The first failure of each degraded period logs a `warn` event
    /// (feature `tracing`), and the success that ends it an `info` event;
    /// `stats().degraded` publishes it as the gauge
    /// `turnstile_redis_degraded` (feature `metrics`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::redis::{Guarded, RedisLimiter};
    /// use turnstile::{Quota, TokenBucket};
    ///
    /// let global = RedisLimiter::new("api", TokenBucket::new(Quota::per_second(100)?))?;
    /// let limiter = Guarded::fail_closed(global, Duration::from_secs(1));
    /// assert!(!limiter.is_degraded());
    /// assert_eq!(limiter.stats().degraded_periods, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_degraded(&self) -> bool {
        self.health.is_degraded()
    }

    /// Who the log events are about.
    fn source(&self) -> Source<'_> {
        Source {
            mode: "exact",
            prefix: self.limiter.prefix(),
            policy: match self.on_failure {
                OnFailure::Deny => "deny",
                OnFailure::Local(_) => "local",
            },
            backoff: self.backoff,
        }
    }

    fn counts(&self) -> Counts {
        // Relaxed: counters, for a log line.
        Counts {
            failures: self.failures.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
        }
    }

    /// Check that Redis answers, on `con`: a `PING`, within the connection's
    /// deadlines, and its round-trip time. For a readiness probe: Redis is
    /// reachable from this process. It counts as any call does: a failure
    /// is counted in `failures`, starts the backoff and opens a degraded
    /// period (with its `warn` event) if none was open; a success ends the
    /// backoff and the degraded period.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use turnstile::redis::{Deadlines, Guarded, RedisLimiter};
    /// use turnstile::{Quota, TokenBucket};
    ///
    /// let mut con = Deadlines::default().blocking(redis::Client::open("redis://127.0.0.1/")?);
    /// let global = RedisLimiter::new("api", TokenBucket::new(Quota::per_second(100)?))?;
    /// let limiter = Guarded::fail_closed(global, Duration::from_secs(1));
    /// // At start-up: an unreachable Redis shows at once (degraded, and a warn event).
    /// match limiter.ping(&mut con) {
    ///     Ok(rtt) => println!("Redis answers in {rtt:?}"),
    ///     Err(e) => println!("Redis is out ({e}); degraded: {}", limiter.is_degraded()),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`RedisLimitError::Redis`] when the `PING` fails: no connection, a
    /// timeout, an error reply.
    pub fn ping(&self, con: &mut dyn ConnectionLike) -> Result<Duration, RedisLimitError> {
        let start = Instant::now();
        let result: ::redis::RedisResult<String> = ::redis::cmd("PING").query(con);
        self.settle_ping(start, result)
    }

    /// [`ping`](Self::ping) on an asynchronous connection (feature `tokio`
    /// too).
    ///
    /// # Errors
    ///
    /// As [`ping`](Self::ping).
    #[cfg(feature = "tokio")]
    pub async fn ping_async<Con: ::redis::aio::ConnectionLike>(
        &self,
        con: &mut Con,
    ) -> Result<Duration, RedisLimitError> {
        let start = Instant::now();
        let result: ::redis::RedisResult<String> = ::redis::cmd("PING").query_async(con).await;
        self.settle_ping(start, result)
    }

    fn settle_ping(
        &self,
        start: Instant,
        result: ::redis::RedisResult<String>,
    ) -> Result<Duration, RedisLimitError> {
        match result {
            Ok(_) => {
                let rtt = start.elapsed();
                self.succeeded(&Turn::Probe);
                Ok(rtt)
            }
            Err(e) => {
                let e = RedisLimitError::from(e);
                self.failed(&e);
                Err(e)
            }
        }
    }

    /// `true` while a failure is being backed off from: decisions come from
    /// the policy.
    pub fn is_backing_off(&self) -> bool {
        // Relaxed: a hint, and `retry_at` publishes no other data.
        self.retry_at.load(Ordering::Relaxed) != 0
    }

    /// A call that Redis answered: a probe's answer ends the backoff, and
    /// any answer the degraded period.
    fn succeeded(&self, turn: &Turn) {
        self.strikes.cleared();
        if matches!(turn, Turn::Probe) || self.is_backing_off() {
            // Relaxed: see `turn`.
            self.retry_at.store(0, Ordering::Relaxed);
        }
        if self.health.is_degraded() {
            self.health.succeeded(self.source(), self.counts());
        }
    }

    /// A call that failed with `error`: counted, a degraded period opens if
    /// none is (logged once), and Redis is not called for a backoff if this
    /// is not a timeout or the last of the timeouts in a row that start one
    /// ([`timeouts_to_back_off`](Self::timeouts_to_back_off)). An error about
    /// the call's key alone ([`Failure::per_key`]) is only counted: Redis
    /// answered, as a success shows.
    fn failed(&self, error: &RedisLimitError) {
        if error.per_key() {
            // Relaxed: a counter.
            self.failures.fetch_add(1, Ordering::Relaxed);
            self.succeeded(&Turn::Call);
            return;
        }
        let counts = self.counts();
        // Relaxed: a counter, and `retry_at` publishes no other data (see
        // `turn`).
        self.failures.fetch_add(1, Ordering::Relaxed);
        self.health.failed(self.source(), error, counts);
        if self.strikes.struck(error.is_timeout()) {
            let next = self.now().saturating_add(self.backoff_nanos());
            self.retry_at.store(next, Ordering::Relaxed);
        }
    }

    fn now(&self) -> u64 {
        // At least 1, so that 0 can mean "no backoff"; 584 years saturate.
        u64::try_from(self.epoch.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    fn backoff_nanos(&self) -> u64 {
        u64::try_from(self.backoff.as_nanos()).unwrap_or(u64::MAX)
    }
}

impl<A: Algorithm, C: Clock> Guarded<A, C> {
    /// Whether this limiter holds nothing a new one for the same limit would
    /// not: Redis is not failing now, no permits its local share admitted
    /// are still owed to Redis, and every key of the local share (if any)
    /// is back at its whole allowance. Sweeps the local share to find out.
    /// Dropping it then loses no count: the limit's counts are in Redis.
    pub fn holds_nothing(&self) -> bool {
        !self.is_degraded() && self.ledger.total() == 0 && self.on_failure.share_holds_nothing()
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

    /// Ask for `n` permits for `key` from Redis, or from the policy while
    /// Redis fails.
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
        let turn = self.turn(n)?;
        if let Turn::Skip { wait } = turn {
            return Ok(self.fallback(key, n, wait));
        }
        let debt = self.debt(key, n);
        let result = self.limiter.try_acquire_n(con, key, debt.ask(n));
        self.settle(turn, key, n, debt, result)
    }

    /// [`try_acquire`](Self::try_acquire) on an asynchronous connection
    /// (feature `tokio` too).
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
    /// (feature `tokio` too).
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
        match self.begin(key, n)? {
            Ok(decision) => Ok(decision),
            Err(call) => self.call_async(con, key, n, call).await,
        }
    }

    /// The decision `n` permits for `key` would get now, taking nothing:
    /// Redis' answer to the same call ([`RedisLimiter::peek_n`], the key's
    /// debt to Redis asked for beside it as a request would), or, while
    /// Redis fails, the policy's: failing closed, a denial with the wait
    /// until Redis is tried; failing open, the local share's answer without
    /// spending it (the key's first peek or request of an outage empties its
    /// share, which starts empty in each outage). A failed peek counts and
    /// starts a backoff as any call does.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use turnstile::redis::{Deadlines, Guarded, RedisLimiter};
    /// use turnstile::{Quota, TokenBucket};
    ///
    /// let mut con = Deadlines::default().blocking(redis::Client::open("redis://127.0.0.1/")?);
    /// let tokens = RedisLimiter::new("llm", TokenBucket::new(Quota::per_minute(10_000)?))?;
    /// let limiter = Guarded::fail_closed(tokens, Duration::from_secs(1));
    /// // Is anything left for this team? Nothing is taken.
    /// if limiter.peek_n(&mut con, "team-a", 1)?.is_allowed() {
    ///     // ... run the request, then charge what it used.
    ///     let _ = limiter.try_acquire_n(&mut con, "team-a", 1_200)?;
    /// }
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
        match self.begin_peek(key, n)? {
            Ok(decision) => Ok(decision),
            Err((turn, claimed)) => {
                let result = self.limiter.peek_n(con, key, claimed.ask(n));
                self.settle_peek(turn, key, n, claimed, result)
            }
        }
    }

    /// [`peek_n`](Self::peek_n) on an asynchronous connection (feature
    /// `tokio` too).
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
        match self.begin_peek(key, n)? {
            Ok(decision) => Ok(decision),
            Err((turn, claimed)) => {
                let result = self.limiter.peek_n_async(con, key, claimed.ask(n)).await;
                self.settle_peek(turn, key, n, claimed, result)
            }
        }
    }

    /// A peek's answer by the policy while Redis is not called (`Ok`), or
    /// the turn it calls on and what a call for `n` would claim of `key`'s
    /// debt, claiming nothing (`Err`).
    fn begin_peek(
        &self,
        key: &[u8],
        n: u32,
    ) -> Result<Result<Decision, (Turn, Claimed)>, AcquireError> {
        let turn = self.turn(n)?;
        if let Turn::Skip { wait } = turn {
            return Ok(Ok(self.fallback_peek(key, n, wait)));
        }
        let room = self.limiter.capacity().saturating_sub(n);
        Ok(Err((turn, self.ledger.peek(key, n, room))))
    }

    /// A peek's answer: as [`settle`](Self::settle) records a call, with the
    /// debt left as it is.
    fn settle_peek(
        &self,
        turn: Turn,
        key: &[u8],
        n: u32,
        claimed: Claimed,
        result: Result<Decision, RedisLimitError>,
    ) -> Result<Decision, AcquireError> {
        match result {
            Ok(decision) => {
                self.succeeded(&turn);
                Ok(claimed.answer(decision))
            }
            Err(RedisLimitError::Acquire(e)) => Err(e),
            Err(e) => {
                self.failed(&e);
                Ok(self.fallback_peek(key, n, self.backoff))
            }
        }
    }

    /// [`fallback`](Self::fallback) for a peek: counted as the policy's
    /// decision, taking nothing.
    fn fallback_peek(&self, key: &[u8], n: u32, wait: Duration) -> Decision {
        // Relaxed: a counter.
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
        self.on_failure
            .peek(&self.ledger, self.health.stretch(), key, n, wait)
    }

    /// [`try_acquire`](Self::try_acquire), keeping what is needed to give the
    /// permit back: the same decision, made and counted the same way, and on
    /// an admission (only then) a [`GuardedReceipt`] for
    /// [`refund`](Self::refund), which knows whether Redis or the local
    /// fallback admitted.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use turnstile::redis::{Deadlines, Guarded, OnFailure, RedisLimiter};
    /// use turnstile::{KeyedLimiter, Quota, TokenBucket};
    ///
    /// let mut con = Deadlines::default().blocking(redis::Client::open("redis://127.0.0.1/")?);
    /// let global = RedisLimiter::new("api", TokenBucket::new(Quota::per_second(100)?))?;
    /// let local = KeyedLimiter::new(Quota::per_second(25)?);
    /// let limiter = Guarded::new(global, OnFailure::Local(local), Duration::from_secs(1));
    /// let (decision, receipt) = limiter.try_acquire_refundable(&mut con, "k_live_123")?;
    /// if let Some(receipt) = receipt {
    ///     // Served from a cache after all: the request does not count.
    ///     let given_back = limiter.refund(&mut con, receipt);
    ///     println!("{decision:?}; refunded: {given_back}");
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    pub fn try_acquire_refundable(
        &self,
        con: &mut dyn ConnectionLike,
        key: impl AsRef<[u8]>,
    ) -> Result<(Decision, Option<GuardedReceipt>), AcquireError> {
        self.try_acquire_n_refundable(con, key, 1)
    }

    /// [`try_acquire_n`](Self::try_acquire_n), keeping what is needed to give
    /// the `n` permits back ([`try_acquire_refundable`](Self::try_acquire_refundable)).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n).
    pub fn try_acquire_n_refundable(
        &self,
        con: &mut dyn ConnectionLike,
        key: impl AsRef<[u8]>,
        n: u32,
    ) -> Result<(Decision, Option<GuardedReceipt>), AcquireError> {
        let key = key.as_ref();
        let turn = self.turn(n)?;
        if let Turn::Skip { wait } = turn {
            return Ok(self.fallback_refundable(key, n, wait));
        }
        let debt = self.debt(key, n);
        let result = self.limiter.try_acquire_n_refundable(con, key, debt.ask(n));
        self.settle_refundable(turn, key, n, debt, result)
    }

    /// [`try_acquire_refundable`](Self::try_acquire_refundable) on an
    /// asynchronous connection (feature `tokio` too).
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    #[cfg(feature = "tokio")]
    pub async fn try_acquire_refundable_async<Con: ::redis::aio::ConnectionLike>(
        &self,
        con: &mut Con,
        key: impl AsRef<[u8]>,
    ) -> Result<(Decision, Option<GuardedReceipt>), AcquireError> {
        self.try_acquire_n_refundable_async(con, key, 1).await
    }

    /// [`try_acquire_n_refundable`](Self::try_acquire_n_refundable) on an
    /// asynchronous connection (feature `tokio` too). Dropped before it
    /// completes, it leaves nothing to undo but, if Redis admitted meanwhile,
    /// permits that stay spent.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n).
    #[cfg(feature = "tokio")]
    pub async fn try_acquire_n_refundable_async<Con: ::redis::aio::ConnectionLike>(
        &self,
        con: &mut Con,
        key: impl AsRef<[u8]>,
        n: u32,
    ) -> Result<(Decision, Option<GuardedReceipt>), AcquireError> {
        let key = key.as_ref();
        let turn = self.turn(n)?;
        if let Turn::Skip { wait } = turn {
            return Ok(self.fallback_refundable(key, n, wait));
        }
        let debt = self.debt(key, n);
        let result = self
            .limiter
            .try_acquire_n_refundable_async(con, key, debt.ask(n))
            .await;
        self.settle_refundable(turn, key, n, debt, result)
    }

    /// Give back what an admission took, to whichever admitted it: `true`
    /// when the permits went back exactly, `false` when they stay spent.
    /// Never more than the admission took goes back. Counted in
    /// [`stats`](Self::stats) as `refunded` or `refund_declined`.
    ///
    /// - **Admitted by Redis**: [`RedisLimiter::refund`], whose rules per
    ///   algorithm say when it is exact. It is one call, within the
    ///   connection's deadlines, never sent again; a failure counts as one
    ///   (and starts the backoff, as a decision's does) and answers `false`,
    ///   although a call that timed out may have given the permits back.
    ///   While backing off (from a failure until a decision's probe finds
    ///   Redis again) no refund is sent: `false`.
    /// - **Admitted by the local fallback** ([`OnFailure::Local`]): the local
    ///   limiter's own refund, as [`Admission::refund`](crate::Admission::refund)
    ///   gives it (exact or declines, per its algorithm), whether or not Redis
    ///   is back; no call.
    ///
    /// A receipt made by another `Guarded` declines.
    pub fn refund(&self, con: &mut dyn ConnectionLike, receipt: GuardedReceipt) -> bool {
        let given = match self.begin_refund(receipt) {
            Refund::Done(given) => given,
            Refund::Redis(receipt) => self.end_refund(self.limiter.refund(con, receipt)),
        };
        self.count_refund(given)
    }

    /// [`refund`](Self::refund) on an asynchronous connection (feature
    /// `tokio` too): callable from any task, the receipt owning its bytes.
    #[cfg(feature = "tokio")]
    pub async fn refund_async<Con: ::redis::aio::ConnectionLike>(
        &self,
        con: &mut Con,
        receipt: GuardedReceipt,
    ) -> bool {
        let given = match self.begin_refund(receipt) {
            Refund::Done(given) => given,
            Refund::Redis(receipt) => {
                self.end_refund(self.limiter.refund_async(con, receipt).await)
            }
        };
        self.count_refund(given)
    }

    /// A refund's outcome when it needs no call (a local admission's, a
    /// receipt of another limiter's, or one while backing off), or the
    /// Redis receipt to send.
    fn begin_refund(&self, receipt: GuardedReceipt) -> Refund {
        if receipt.id != self.id {
            return Refund::Done(false);
        }
        let permits = receipt.n;
        match receipt.by {
            Taker::Local { key, receipt: None } => {
                // The local admission wrote nothing, so took nothing: nothing
                // is owed, to the local share or to Redis.
                self.ledger.forgive(&key, permits);
                Refund::Done(true)
            }
            Taker::Local {
                key,
                receipt: Some(receipt),
            } => Refund::Done(match &self.on_failure {
                OnFailure::Local(local) => {
                    let given = local.stage(key.as_slice()).give_back(receipt);
                    if given {
                        self.ledger.forgive(&key, permits);
                    }
                    given
                }
                // Not reached: only a local limit makes local receipts.
                OnFailure::Deny => false,
            }),
            Taker::Redis(_) if self.is_backing_off() => Refund::Done(false),
            Taker::Redis(receipt) => Refund::Redis(receipt),
        }
    }

    /// A Redis refund's outcome; a failure counts, and starts a backoff; an
    /// answer, as any call's, ends the degraded period.
    fn end_refund(&self, result: Result<bool, RedisLimitError>) -> bool {
        match result {
            Ok(given) => {
                self.succeeded(&Turn::Call);
                given
            }
            Err(e) => {
                self.failed(&e);
                false
            }
        }
    }

    fn count_refund(&self, given: bool) -> bool {
        // Relaxed: counters, publishing no other data.
        if given {
            self.refunded.fetch_add(1, Ordering::Relaxed);
        } else {
            self.refund_declined.fetch_add(1, Ordering::Relaxed);
        }
        given
    }

    /// The decision for `n` permits for `key` when it needs no call (while
    /// backing off), or the call to make: the part of a decision that
    /// awaits nothing.
    #[cfg(feature = "tokio")]
    pub(crate) fn begin(&self, key: &[u8], n: u32) -> Result<Result<Decision, Call>, AcquireError> {
        Ok(match self.turn(n)? {
            Turn::Skip { wait } => Ok(self.fallback(key, n, wait)),
            turn => Err(Call(turn)),
        })
    }

    /// Make the call [`begin`](Self::begin) asked for. Dropped before it
    /// completes, it leaves nothing to undo: a probe's backoff simply runs on.
    #[cfg(feature = "tokio")]
    pub(crate) async fn call_async<Con: ::redis::aio::ConnectionLike>(
        &self,
        con: &mut Con,
        key: &[u8],
        n: u32,
        Call(turn): Call,
    ) -> Result<Decision, AcquireError> {
        let debt = self.debt(key, n);
        let result = self
            .limiter
            .try_acquire_n_async(con, key, debt.ask(n))
            .await;
        self.settle(turn, key, n, debt, result)
    }

    /// Check `n`, then decide whether this request calls Redis.
    fn turn(&self, n: u32) -> Result<Turn, AcquireError> {
        let capacity = self.limiter.capacity();
        if n == 0 {
            return Err(AcquireError::ZeroPermits);
        }
        if n > capacity {
            return Err(AcquireError::InsufficientCapacity {
                requested: n,
                capacity,
            });
        }
        // Relaxed: `retry_at` publishes no other data; at worst a thread calls
        // Redis once more, or falls back once more, than it had to.
        let retry_at = self.retry_at.load(Ordering::Relaxed);
        if retry_at == 0 {
            return Ok(Turn::Call);
        }
        let now = self.now();
        if now < retry_at {
            return Ok(Turn::Skip {
                wait: Duration::from_nanos(retry_at - now),
            });
        }
        // The backoff is over: one request probes, the others wait another
        // backoff's worth unless the probe succeeds first.
        let next = now.saturating_add(self.backoff_nanos());
        match self
            .retry_at
            .compare_exchange(retry_at, next, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => Ok(Turn::Probe),
            Err(_) => Ok(Turn::Skip { wait: self.backoff }),
        }
    }

    /// What `key`'s local admissions owe Redis, claimed for a call that
    /// asks for `n` permits (`n` is within the capacity): paid if it admits,
    /// owed again otherwise (see [`failover`](super::failover)).
    fn debt<'a>(&'a self, key: &'a [u8], n: u32) -> Debt<'a> {
        Debt::claim(
            &self.ledger,
            key,
            n,
            self.limiter.capacity().saturating_sub(n),
        )
    }

    /// Record how the call went, and answer.
    fn settle(
        &self,
        turn: Turn,
        key: &[u8],
        n: u32,
        debt: Debt<'_>,
        result: Result<Decision, RedisLimitError>,
    ) -> Result<Decision, AcquireError> {
        match result {
            Ok(decision) => {
                self.succeeded(&turn);
                Ok(debt.settle(decision))
            }
            Err(RedisLimitError::Acquire(e)) => Err(e),
            Err(e) => {
                self.failed(&e);
                Ok(self.fallback(key, n, self.backoff))
            }
        }
    }

    /// [`settle`](Self::settle) for a refundable decision.
    fn settle_refundable(
        &self,
        turn: Turn,
        key: &[u8],
        n: u32,
        debt: Debt<'_>,
        result: Result<(Decision, Option<RedisReceipt>), RedisLimitError>,
    ) -> Result<(Decision, Option<GuardedReceipt>), AcquireError> {
        match result {
            Ok((decision, receipt)) => {
                self.succeeded(&turn);
                let decision = debt.settle(decision);
                // A refund gives back the request's own permits, never the
                // debt it paid (none, if the admission paid it).
                let receipt = receipt
                    .filter(|_| decision.is_allowed())
                    .map(|r| self.receipt(n, Taker::Redis(r.for_permits(n))));
                Ok((decision, receipt))
            }
            Err(RedisLimitError::Acquire(e)) => Err(e),
            Err(e) => {
                self.failed(&e);
                Ok(self.fallback_refundable(key, n, self.backoff))
            }
        }
    }

    fn receipt(&self, n: u32, by: Taker) -> GuardedReceipt {
        GuardedReceipt { id: self.id, n, by }
    }

    /// [`fallback`](Self::fallback), keeping what gives a local admission
    /// back.
    fn fallback_refundable(
        &self,
        key: &[u8],
        n: u32,
        wait: Duration,
    ) -> (Decision, Option<GuardedReceipt>) {
        let OnFailure::Local(local) = &self.on_failure else {
            return (self.fallback(key, n, wait), None);
        };
        // Relaxed: a counter.
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
        // A local limiter smaller than the global capacity may refuse `n`
        // outright: deny, with the wait until Redis is tried.
        if n == 0
            || n > local.algorithm().capacity()
            || !self.ledger.prepare(local, key, self.health.stretch())
        {
            return (deny_for(wait), None);
        }
        match local.stage(key).take_within(n) {
            (KeyedDecision::Allowed { remaining }, receipt) => (
                {
                    self.ledger.owe(key, n);
                    Decision::Allowed { remaining }
                },
                Some(self.receipt(
                    n,
                    Taker::Local {
                        key: key.to_vec(),
                        receipt,
                    },
                )),
            ),
            (
                KeyedDecision::Denied { retry_after } | KeyedDecision::KeyLimit { retry_after },
                _,
            ) => (share_denial(retry_after, wait), None),
        }
    }

    /// The policy's decision; `wait` is left until Redis is tried again.
    fn fallback(&self, key: &[u8], n: u32, wait: Duration) -> Decision {
        // Relaxed: a counter.
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
        match &self.on_failure {
            OnFailure::Deny => deny_for(wait),
            OnFailure::Local(local) => {
                // A local limiter smaller than the global capacity may refuse
                // `n` outright: deny, with the wait until Redis is tried.
                let deny = || deny_for(wait);
                if !self.ledger.prepare(local, key, self.health.stretch()) {
                    return deny();
                }
                match local.try_acquire_n(key, n) {
                    Ok(KeyedDecision::Allowed { remaining }) => {
                        self.ledger.owe(key, n);
                        Decision::Allowed { remaining }
                    }
                    Ok(KeyedDecision::Denied { retry_after })
                    | Ok(KeyedDecision::KeyLimit { retry_after }) => {
                        share_denial(retry_after, wait)
                    }
                    Err(_) => deny(),
                }
            }
        }
    }
}

/// The local share's denial, with its own wait or, when that is longer, the
/// wait until Redis is tried again: then the request may be admitted by
/// Redis, whatever the share holds. (The share starts empty in each degraded
/// period, so its own wait can be its whole refill: one false timeout told
/// a client to come back in two hours where Redis was tried after a
/// second.)
pub(super) fn share_denial(retry_after: RetryAfter, wait: Duration) -> Decision {
    Decision::Denied {
        retry_after: retry_after.min(until_retried(wait)),
    }
}

/// The policy's denial with `wait` left until Redis is tried again: at least
/// 1 ns, so that a backoff of zero still tells a client to come back
/// (Retry-After: 1), never that it was due already.
fn deny_for(wait: Duration) -> Decision {
    Decision::Denied {
        retry_after: until_retried(wait),
    }
}

/// `wait` left until Redis is tried again, as a denial's wait: at least 1 ns.
fn until_retried(wait: Duration) -> RetryAfter {
    RetryAfter::from_nanos(u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixed window's share: its limit split per window, not its window
    /// lengthened. Lengthened (a refill of the whole limit into a bucket of
    /// the share, `processes` times less often), the bucket dropped what it
    /// could not hold: 100 per second over 4 processes ran at 6.25 per
    /// second each, a quarter of the share.
    #[test]
    fn a_fixed_windows_share_is_its_limit_split_per_window() {
        let fixed = crate::FixedWindow::new(100, Duration::from_secs(1)).unwrap();
        let OnFailure::Local(local) = OnFailure::local_share_of(fixed, 4).unwrap() else {
            panic!("a local share");
        };
        let share = local.algorithm().quota();
        assert_eq!(
            (share.capacity(), share.amount(), share.period()),
            (25, 25, Duration::from_secs(1))
        );
        // 3 processes: 33 a second each (rounded down, never above the share).
        let OnFailure::Local(local) = OnFailure::local_share_of(fixed, 3).unwrap() else {
            panic!("a local share");
        };
        let share = local.algorithm().quota();
        assert_eq!(
            (share.amount(), share.period()),
            (33, Duration::from_secs(1))
        );
        // A refill of 3 over 4 processes: one token every 2 periods (0.5 per
        // period, within the share's 0.75).
        let quota = Quota::new(3, 3, Duration::from_secs(1)).unwrap();
        let OnFailure::Local(local) = OnFailure::local_share(quota, 4).unwrap() else {
            panic!("a local share");
        };
        let share = local.algorithm().quota();
        assert_eq!(
            (share.capacity(), share.amount(), share.period()),
            (1, 1, Duration::from_secs(2))
        );
    }

    #[test]
    fn a_local_share_divides_the_burst_and_the_rate() {
        let quota = Quota::new(40, 1, Duration::from_millis(10)).unwrap();
        let OnFailure::Local(local) = OnFailure::local_share(quota, 4).unwrap() else {
            panic!("a local share");
        };
        let share = local.algorithm().quota();
        assert_eq!(share.capacity(), 10);
        assert_eq!(
            (share.amount(), share.period()),
            (1, Duration::from_millis(40))
        );
        // Fewer tokens than processes: one each; one process: the whole quota.
        let OnFailure::Local(local) = OnFailure::local_share(quota, 100).unwrap() else {
            panic!("a local share");
        };
        assert_eq!(local.algorithm().quota().capacity(), 1);
        let OnFailure::Local(local) = OnFailure::local_share(quota, 1).unwrap() else {
            panic!("a local share");
        };
        assert_eq!(local.algorithm().quota(), quota);
    }
}
