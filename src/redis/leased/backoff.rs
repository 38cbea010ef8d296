//! Failures: the backoff after a failed call to Redis, the one request that
//! probes Redis after it, and the failure policy's decisions meanwhile.

use core::fmt;
use core::time::Duration;
use std::time::Instant;

use ::redis::{ConnectionLike, RedisResult};

use super::stats::Counters;
use super::{LeasedLimiter, saturating_nanos};
use crate::clock::Clock;
use crate::decision::{Decision, KeyedDecision, RetryAfter};
use crate::redis::RedisLimitError;
use crate::redis::failover::Failure;
use crate::redis::guarded::OnFailure;
use crate::redis::health::{Counts, Source};
use crate::sync::Ordering;

/// Whether this request may call Redis now.
pub(super) enum Turn {
    Call,
    Skip { wait: Duration },
}

impl<C: Clock> LeasedLimiter<C> {
    fn now_nanos(&self) -> u64 {
        // At least 1, so that 0 can mean "no backoff".
        saturating_nanos(self.epoch.elapsed()).max(1)
    }

    /// Whether a request may call Redis now; after a backoff, one request
    /// probes and the others wait for another backoff unless it succeeds.
    pub(super) fn turn(&self) -> Turn {
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

    /// A call that Redis answered: the backoff and the degraded period end.
    pub(super) fn succeed(&self) {
        self.strikes.cleared();
        if self.is_backing_off() {
            // Relaxed: see `turn`.
            self.retry_at.store(0, Ordering::Relaxed);
        }
        if self.health.is_degraded() {
            self.health.succeeded(self.source(), self.counts());
        }
    }

    /// A call that failed with `error`: counted, a degraded period opens if
    /// none is (logged once), and Redis is not called for a backoff unless
    /// this is a timeout short of the run that starts one
    /// ([`timeouts_to_back_off`](super::LeasedBuilder::timeouts_to_back_off)).
    /// An error about the call's key alone ([`Failure::per_key`]) is only
    /// counted: Redis answered, as a success shows.
    pub(super) fn fail<E: Failure + ?Sized>(&self, error: &E) {
        if error.per_key() {
            Counters::add(&self.counters.failures, 1);
            self.succeed();
            return;
        }
        let counts = self.counts();
        Counters::add(&self.counters.failures, 1);
        self.health
            .failed(self.source(), &error as &dyn fmt::Display, counts);
        if !self.strikes.struck(error.timed_out()) {
            return;
        }
        let next = self
            .now_nanos()
            .saturating_add(saturating_nanos(self.backoff));
        // Relaxed: see `turn`.
        self.retry_at.store(next, Ordering::Relaxed);
    }

    /// The timeouts in a row that start the backoff
    /// ([`timeouts_to_back_off`](super::LeasedBuilder::timeouts_to_back_off)).
    pub fn timeouts(&self) -> u32 {
        self.strikes.limit()
    }

    /// Who the log events are about.
    fn source(&self) -> Source<'_> {
        Source {
            mode: "leased",
            prefix: self.limiter.prefix(),
            policy: match self.on_failure {
                OnFailure::Deny => "deny",
                OnFailure::Local(_) => "local",
            },
            backoff: self.backoff,
        }
    }

    fn counts(&self) -> Counts {
        let stats = self.stats();
        Counts {
            failures: stats.failures,
            fallbacks: stats.fallbacks,
        }
    }

    /// `true` while Redis is failing: from a failed call (a lease's, an
    /// exact-mode call's, a give-back's or a [`ping`](Self::ping)'s) until a
    /// call succeeds, whether the backoff is running or a probe is due.
    /// Requests that the leases held here cannot serve are answered by the
    /// failure policy meanwhile. Before any call it is `false`: nothing is
    /// known yet; a [`ping`](Self::ping) at start-up finds out.
    ///
    /// The first failure of each degraded period logs a `warn` event
    /// (feature `tracing`), and the success that ends it an `info` event;
    /// `stats().degraded` publishes it as the gauge
    /// `turnstile_redis_degraded` (feature `metrics`).
    ///
    /// ```
    /// use turnstile::redis::{LeasedBuilder, RedisLimiter};
    /// use turnstile::{Quota, TokenBucket};
    ///
    /// let global = RedisLimiter::new("api", TokenBucket::new(Quota::per_second(1_000)?))?;
    /// let limiter = LeasedBuilder::new(global, 50)?.build()?;
    /// assert!(!limiter.is_degraded());
    /// assert_eq!(limiter.stats().degraded_periods, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_degraded(&self) -> bool {
        self.health.is_degraded()
    }

    /// Check that Redis answers, on `con`: a `PING`, within the connection's
    /// deadlines, and its round-trip time. For a readiness probe: Redis is
    /// reachable from this process. It counts as any call does: a failure
    /// is counted in `failures`, starts the backoff and opens a degraded
    /// period (with its `warn` event) if none was open; a success ends the
    /// backoff and the degraded period.
    ///
    /// ```no_run
    /// use turnstile::redis::{Deadlines, LeasedBuilder, RedisLimiter};
    /// use turnstile::{Quota, TokenBucket};
    ///
    /// let mut con = Deadlines::default().blocking(redis::Client::open("redis://127.0.0.1/")?);
    /// let global = RedisLimiter::new("api", TokenBucket::new(Quota::per_second(1_000)?))?;
    /// let limiter = LeasedBuilder::new(global, 50)?.build()?;
    /// // At start-up: an unreachable Redis shows at once (degraded, and a warn event).
    /// if let Err(e) = limiter.ping(&mut con) {
    ///     println!("Redis is out ({e}); degraded: {}", limiter.is_degraded());
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
        let result: RedisResult<String> = ::redis::cmd("PING").query(con);
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
        let result: RedisResult<String> = ::redis::cmd("PING").query_async(con).await;
        self.settle_ping(start, result)
    }

    fn settle_ping(
        &self,
        start: Instant,
        result: RedisResult<String>,
    ) -> Result<Duration, RedisLimitError> {
        match result {
            Ok(_) => {
                let rtt = start.elapsed();
                self.succeed();
                Ok(rtt)
            }
            Err(e) => {
                let e = RedisLimitError::from(e);
                self.fail(&e);
                Err(e)
            }
        }
    }

    /// The failure policy's decision; `wait` is left until Redis is tried.
    pub(super) fn fallback(&self, key: &[u8], n: u32, wait: Duration) -> Decision {
        Counters::add(&self.counters.fallbacks, 1);
        // At least 1 ns: a backoff of zero still tells a client to come back
        // (Retry-After: 1), never that it was due already.
        let deny = Decision::Denied {
            retry_after: RetryAfter::from_nanos(saturating_nanos(wait).max(1)),
        };
        match &self.on_failure {
            OnFailure::Deny => deny,
            // The share starts empty in each degraded period, and what it
            // admits is owed to Redis (see `failover`).
            OnFailure::Local(local) if !self.ledger.prepare(local, key, self.health.stretch()) => {
                deny
            }
            OnFailure::Local(local) => match local.try_acquire_n(key, n) {
                Ok(KeyedDecision::Allowed { remaining }) => {
                    self.ledger.owe(key, n);
                    Decision::Allowed { remaining }
                }
                Ok(KeyedDecision::Denied { retry_after })
                | Ok(KeyedDecision::KeyLimit { retry_after }) => {
                    crate::redis::guarded::share_denial(retry_after, wait)
                }
                Err(_) => deny,
            },
        }
    }
}
