//! Building a [`LeasedLimiter`]: [`LeasedBuilder`], its defaults and limits.

use core::fmt;
use core::time::Duration;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use super::give_back::{Holders, MIN_PRUNE};
use super::local::{LeaseWord, Since};
use super::stats::Counters;
use super::wait::Signal;
use super::{LeasedLimiter, MAX_LIFETIME, MIN_LIFETIME, saturating_nanos, word};
use crate::algorithm::token_bucket::TokenBucket;
use crate::clock::{Clock, RealClock};
use crate::keyed::KeyedBuilder;
use crate::redis::MAX_LEASE;
use crate::redis::failover::{DEFAULT_TIMEOUTS_TO_BACK_OFF, Strikes};
use crate::redis::guarded::OnFailure;
use crate::redis::health::Health;
use crate::redis::{RedisConfigError, RedisLimiter};
use crate::sync::AtomicU64;

/// Builds a [`LeasedLimiter`]: the largest lease, the lease lifetime, the idle
/// time after which a lease is given back, the failure policy and its
/// backoff, the local clock.
///
/// As with [`KeyedBuilder`], the setters take any value and
/// [`build`](LeasedBuilder::build) checks them all, so their order does not
/// matter; the largest lease is checked at once by [`LeasedBuilder::new`].
pub struct LeasedBuilder<C = RealClock> {
    limiter: RedisLimiter,
    /// The algorithm's capacity: the most permits one request can get.
    capacity: u32,
    max_lease: u32,
    lifetime: Duration,
    /// `None`: the default, 250 ms or the lifetime if that is shorter.
    idle: Option<Duration>,
    on_failure: OnFailure<TokenBucket, RealClock>,
    backoff: Duration,
    fetch_wait: Duration,
    timeouts: u32,
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
            .field("fetch_wait", &self.fetch_wait)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl LeasedLimiter {
    /// A [`LeasedBuilder`] for leases of at most `max_lease` tokens from
    /// `limiter`'s token buckets: the same as [`LeasedBuilder::new`], named as
    /// [`KeyedLimiter::builder`](crate::KeyedLimiter::builder) is.
    ///
    /// ```
    /// use turnstile::redis::{LeasedLimiter, RedisLimiter};
    /// use turnstile::{Quota, TokenBucket};
    ///
    /// let global = RedisLimiter::new("api", TokenBucket::new(Quota::per_second(1_000)?))?;
    /// let leased = LeasedLimiter::builder(global, 50)?.max_keys(10_000).build()?;
    /// assert_eq!(leased.max_lease(), 50);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`LeasedBuilder::new`].
    pub fn builder(
        limiter: RedisLimiter,
        max_lease: u32,
    ) -> Result<LeasedBuilder, RedisConfigError> {
        LeasedBuilder::new(limiter, max_lease)
    }
}

impl LeasedBuilder {
    /// Leases of at most `max_lease` permits, from 1 to the limit's capacity
    /// and to [`MAX_LEASE`], from `limiter`'s keys, whichever its algorithm:
    /// a token bucket's tokens, GCRA's conforming cells, or a fixed or
    /// sliding window's count (whose leases end with the window they were
    /// counted in). Defaults: a lifetime of 1 s, give-back after 250 ms idle
    /// (or the lifetime, if one shorter is set), fail closed with a backoff
    /// of 1 s.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::redis::{LeasedBuilder, RedisConfigError, RedisLimiter};
    /// use turnstile::{FixedWindow, Gcra, Quota, TokenBucket};
    ///
    /// let global = RedisLimiter::new("api", TokenBucket::new(Quota::per_second(100)?))?;
    /// assert!(LeasedBuilder::new(global.clone(), 100).is_ok());
    /// assert_eq!(
    ///     LeasedBuilder::new(global, 101).err(),
    ///     Some(RedisConfigError::LeaseTooLarge { max_lease: 101, capacity: 100, max: 100 })
    /// );
    /// let gcra = RedisLimiter::new("gcra", Gcra::new(Quota::per_second(100)?))?;
    /// assert!(LeasedBuilder::new(gcra, 20).is_ok());
    /// let window = RedisLimiter::new("win", FixedWindow::new(100, Duration::from_secs(1))?)?;
    /// assert!(LeasedBuilder::new(window, 20).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`RedisConfigError::ZeroLease`] for a `max_lease` of 0, and
    /// [`RedisConfigError::LeaseTooLarge`] for one above the limit's capacity
    /// or [`MAX_LEASE`].
    pub fn new(limiter: RedisLimiter, max_lease: u32) -> Result<Self, RedisConfigError> {
        let capacity = limiter.capacity();
        if max_lease == 0 {
            return Err(RedisConfigError::ZeroLease);
        }
        let max = MAX_LEASE.min(capacity);
        if max_lease > max {
            return Err(RedisConfigError::LeaseTooLarge {
                max_lease,
                capacity,
                max,
            });
        }
        Ok(LeasedBuilder {
            max_lease,
            limiter,
            capacity,
            lifetime: Duration::from_secs(1),
            idle: None,
            on_failure: OnFailure::Deny,
            backoff: Duration::from_secs(1),
            fetch_wait: DEFAULT_FETCH_WAIT,
            timeouts: DEFAULT_TIMEOUTS_TO_BACK_OFF,
            max_keys: None,
            clock: RealClock::default(),
        })
    }
}

/// The idle time after which a lease is given back, unless set (or the
/// lifetime, if that is shorter).
const DEFAULT_IDLE: Duration = Duration::from_millis(250);

/// How long a request waits for its key's fetch in flight, unless set: the
/// default response deadline of [`Deadlines`](crate::redis::Deadlines).
const DEFAULT_FETCH_WAIT: Duration = Duration::from_millis(5);

impl<C: Clock> LeasedBuilder<C> {
    /// How long a lease may be spent from (at least 10 ms, at most an hour;
    /// default 1 s): a token not spent by then is lost to the bucket, which
    /// refills it. Bounds how long a token may wait in a lease.
    ///
    /// # Errors
    ///
    /// A lifetime outside 10 ms to an hour is reported by
    /// [`build`](LeasedBuilder::build), as
    /// [`RedisConfigError::LeaseLifetime`].
    pub fn lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = lifetime;
        self
    }

    /// A lease not topped up for `idle` is given back by
    /// [`give_back_idle`](LeasedLimiter::give_back_idle) (default 250 ms, or
    /// the lifetime if that is shorter). The time counts from the lease's
    /// grant (or last top-up), not from its last spend: the lease word keeps
    /// only the expiry, so a lease still being spent, slowly enough not to
    /// reach its prefetch mark within `idle`, is given back too.
    ///
    /// # Errors
    ///
    /// An `idle` longer than the lifetime, which no lease would ever reach
    /// (it expires first), is reported by [`build`](LeasedBuilder::build), as
    /// [`RedisConfigError::IdleLongerThanLifetime`].
    pub fn idle(mut self, idle: Duration) -> Self {
        self.idle = Some(idle);
        self
    }

    /// What to answer, for requests the leases held here cannot serve, while
    /// Redis fails and for `backoff` after each failure.
    pub fn on_failure(mut self, on_failure: OnFailure, backoff: Duration) -> Self {
        self.on_failure = on_failure;
        self.backoff = backoff;
        self
    }

    /// How long a request that finds its key dry while the key's next lease
    /// is being fetched (by another request or the refresher) waits for that
    /// fetch, instead of a call of its own (default 5 ms, the default
    /// response deadline of [`Deadlines`](crate::redis::Deadlines)). Set it
    /// to the response deadline of the connections the fetches run on, so
    /// that a request waits no longer for another's call than for its own. A
    /// fetch not back by then answers the request by the failure policy, as
    /// a call of its own that timed out would; zero answers it so at once,
    /// and a wait too long for a clock reading to hold (`Duration::MAX`)
    /// waits for the fetch's own end, however long its call takes.
    pub fn fetch_wait(mut self, fetch_wait: Duration) -> Self {
        self.fetch_wait = fetch_wait;
        self
    }

    /// Start the backoff at the `timeouts`-th call in a row that timed out
    /// (3 by default; 0 is taken as 1), as
    /// [`Guarded::timeouts_to_back_off`](crate::redis::Guarded::timeouts_to_back_off)
    /// does: a call that timed out may only have met a slow Redis, so it is
    /// answered by the policy without stopping the calls of the others; any
    /// other failure starts the backoff at once.
    ///
    /// ```
    /// use turnstile::redis::{LeasedBuilder, RedisLimiter};
    /// use turnstile::{Quota, TokenBucket};
    ///
    /// let global = RedisLimiter::new("api", TokenBucket::new(Quota::per_second(1_000)?))?;
    /// let limiter = LeasedBuilder::new(global, 50)?.timeouts_to_back_off(5).build()?;
    /// assert_eq!(limiter.timeouts(), 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn timeouts_to_back_off(mut self, timeouts: u32) -> Self {
        self.timeouts = timeouts;
        self
    }

    /// At most `max_keys` keys hold a lease word at once (the keyed map's
    /// bound; past it a new key is decided by exact mode).
    ///
    /// # Errors
    ///
    /// A `max_keys` of 0 is reported by [`build`](LeasedBuilder::build), as
    /// [`RedisConfigError::Keyed`]`(`[`KeyedConfigError::ZeroMaxKeys`](crate::KeyedConfigError::ZeroMaxKeys)`)`,
    /// as [`KeyedBuilder::build`] reports it.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys);
        self
    }

    /// The clock that times leases here (lifetimes and idle times; Redis'
    /// own clock decides the bucket).
    pub fn clock<C2: Clock>(self, clock: C2) -> LeasedBuilder<C2> {
        LeasedBuilder {
            limiter: self.limiter,
            capacity: self.capacity,
            max_lease: self.max_lease,
            lifetime: self.lifetime,
            idle: self.idle,
            on_failure: self.on_failure,
            backoff: self.backoff,
            fetch_wait: self.fetch_wait,
            timeouts: self.timeouts,
            max_keys: self.max_keys,
            clock,
        }
    }

    /// The limiter.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::redis::{LeasedBuilder, RedisConfigError, RedisLimiter};
    /// use turnstile::{Quota, TokenBucket};
    ///
    /// let global = RedisLimiter::new("api", TokenBucket::new(Quota::per_second(100)?))?;
    /// let err = LeasedBuilder::new(global, 10)?
    ///     .lifetime(Duration::from_millis(500))
    ///     .idle(Duration::from_secs(1))
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(
    ///     err,
    ///     RedisConfigError::IdleLongerThanLifetime {
    ///         idle: Duration::from_secs(1),
    ///         lifetime: Duration::from_millis(500),
    ///     }
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`RedisConfigError::LeaseLifetime`] for a lifetime outside 10 ms to an
    /// hour (zero included), [`RedisConfigError::IdleLongerThanLifetime`] for
    /// an `idle` set longer than the lifetime, and [`RedisConfigError::Keyed`]
    /// if the map of keys cannot be built (a `max_keys` of 0).
    pub fn build(self) -> Result<LeasedLimiter<C>, RedisConfigError> {
        if !(MIN_LIFETIME..=MAX_LIFETIME).contains(&self.lifetime) {
            return Err(RedisConfigError::LeaseLifetime {
                lifetime: self.lifetime,
                min: MIN_LIFETIME,
                max: MAX_LIFETIME,
            });
        }
        let idle = match self.idle {
            Some(idle) if idle > self.lifetime => {
                return Err(RedisConfigError::IdleLongerThanLifetime {
                    idle,
                    lifetime: self.lifetime,
                });
            }
            Some(idle) => idle,
            None => DEFAULT_IDLE.min(self.lifetime),
        };
        let algorithm = LeaseWord {
            capacity: self.capacity,
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
            builder = builder.max_keys(max_keys);
        }
        let local = builder.build().map_err(RedisConfigError::Keyed)?;
        let lifetime_units = word::units_down(saturating_nanos(self.lifetime)).max(1);
        Ok(LeasedLimiter {
            limiter: self.limiter,
            capacity: self.capacity,
            max_lease: self.max_lease,
            lifetime_units,
            idle,
            local,
            holders: Mutex::new(Holders {
                keys: HashMap::new(),
                prune_at: MIN_PRUNE,
            }),
            refresher: OnceLock::new(),
            backoff: self.backoff,
            fetch_wait: self.fetch_wait,
            fetch_latency: AtomicU64::new(0),
            signal: Signal::default(),
            epoch: Instant::now(),
            retry_at: AtomicU64::new(0),
            counters: Counters::default(),
            health: Health::default(),
            strikes: Strikes::new(self.timeouts),
            ledger: self.on_failure.ledger(),
            on_failure: self.on_failure,
        })
    }
}
