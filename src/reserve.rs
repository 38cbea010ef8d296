//! Reservations: permits taken now, usable after a known wait.

use core::fmt;
use core::time::Duration;

use crate::clock::{Clock, RealClock, saturating_nanos};
use crate::decision::RetryAfter;
use crate::error::AcquireError;
use crate::limiter::{Counter, RateLimiter, Uncounted, check_permits};
use crate::token_bucket::TokenBucket;

/// Permits reserved from a token bucket ([`RateLimiter::reserve_n`]): taken
/// now, usable once [`delay`](Reservation::delay) has passed.
///
/// Dropping a reservation keeps its permits taken (the caller goes ahead
/// after the delay). [`cancel`](Reservation::cancel) gives them back when that
/// can be done exactly. Neither `Clone` nor `Copy`: it cancels at most once.
#[must_use = "dropping a reservation keeps its permits taken; call `cancel` to give them back"]
pub struct Reservation<'a, C = RealClock, M = Uncounted> {
    limiter: &'a RateLimiter<TokenBucket, C, M>,
    previous: u64,
    written: u64,
    n: u32,
    delay: Duration,
}

/// Why a reservation was refused. Nothing was reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReserveError {
    /// `n = 0`, or more permits than the bucket ever holds.
    Acquire(AcquireError),
    /// The permits would be usable only after `retry_after`: later than the
    /// longest delay asked for, or than the bucket's fill time (a bucket
    /// lends at most one fill ahead).
    TooFar {
        /// When `n` permits will be there (what a denial would say now).
        retry_after: RetryAfter,
    },
}

impl fmt::Display for ReserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReserveError::Acquire(e) => e.fmt(f),
            ReserveError::TooFar { retry_after } => write!(
                f,
                "the permits would be usable only after {:?}, later than the reservation allows",
                retry_after.duration()
            ),
        }
    }
}

impl std::error::Error for ReserveError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReserveError::Acquire(e) => Some(e),
            ReserveError::TooFar { .. } => None,
        }
    }
}

impl From<AcquireError> for ReserveError {
    fn from(e: AcquireError) -> Self {
        ReserveError::Acquire(e)
    }
}

impl<C: Clock, M: Counter> RateLimiter<TokenBucket, C, M> {
    /// Reserve one permit, usable after at most `max_delay`
    /// ([`reserve_n`](Self::reserve_n)).
    ///
    /// # Errors
    ///
    /// As [`reserve_n`](Self::reserve_n).
    pub fn reserve(&self, max_delay: Duration) -> Result<Reservation<'_, C, M>, ReserveError> {
        self.reserve_n(1, max_delay)
    }

    /// Reserve `n` permits now and learn when they are usable: at once if the
    /// bucket holds them (an admission), else after the exact wait until the
    /// refill that completes them. Requests after a reservation queue behind
    /// it: the bucket lends from its future, so nothing is admitted twice.
    ///
    /// The bound of the token bucket holds with reservations counted at the
    /// time they become usable. When the refill that completes a reservation
    /// brings more than the reservation needs (an `amount` above 1), the rest
    /// of that batch is dropped: a reservation may under-admit by less than
    /// `amount`, never over-admit. A reservation counts as an admission in
    /// [`stats`](RateLimiter::stats), a refused one as a denial.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ManualClock, Quota, RateLimiter};
    ///
    /// let clock = ManualClock::new();
    /// let limiter = RateLimiter::with_clock(Quota::new(2, 1, Duration::from_millis(100))?, clock);
    /// let now = limiter.reserve_n(2, Duration::ZERO)?;
    /// assert_eq!(now.delay(), Duration::ZERO);
    /// // The bucket is empty: the next permit is lent from the refill at 100 ms.
    /// let later = limiter.reserve(Duration::from_secs(1))?;
    /// assert_eq!(later.delay(), Duration::from_millis(100));
    /// // Others queue behind it.
    /// assert_eq!(
    ///     limiter.try_acquire().retry_after().map(|r| r.duration()),
    ///     Some(Duration::from_millis(200))
    /// );
    /// // Too far: nothing is reserved.
    /// assert!(limiter.reserve(Duration::from_millis(150)).is_err());
    /// // Nothing changed since `later`: cancelling it is exact.
    /// assert!(later.cancel());
    /// assert_eq!(
    ///     limiter.try_acquire().retry_after().map(|r| r.duration()),
    ///     Some(Duration::from_millis(100))
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ReserveError::Acquire`] for `n = 0` or `n` above the capacity, and
    /// [`ReserveError::TooFar`] when the permits would be usable only after
    /// `max_delay`, or after the bucket's fill time. Neither changes the
    /// bucket.
    pub fn reserve_n(
        &self,
        n: u32,
        max_delay: Duration,
    ) -> Result<Reservation<'_, C, M>, ReserveError> {
        let bucket = self.algorithm();
        check_permits(n, bucket.quota().capacity())?;
        let max_ahead =
            saturating_nanos(max_delay).min(saturating_nanos(bucket.quota().fill_time()));
        let now = self.clock().now();
        let mut delay = 0;
        let mut refused = None;
        let taken = self
            .cell()
            .transform(|word| match bucket.reserve(word, now, n, max_ahead) {
                Ok((next, wait)) => {
                    delay = wait;
                    Some(next)
                }
                Err(wait) => {
                    refused = Some(wait);
                    None
                }
            });
        self.count(taken.is_some());
        match taken {
            Some((previous, written)) => Ok(Reservation {
                limiter: self,
                previous,
                written,
                n,
                delay: Duration::from_nanos(delay),
            }),
            None => Err(ReserveError::TooFar {
                retry_after: RetryAfter::from_nanos(refused.unwrap_or(0)),
            }),
        }
    }
}

impl<C: Clock, M: Counter> Reservation<'_, C, M> {
    /// How long after the reservation (its clock reading) the permits are
    /// usable: zero when the bucket held them.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// The permits reserved.
    pub fn permits(&self) -> u32 {
        self.n
    }

    /// Give the permits back: `true` when the bucket is now exactly as if the
    /// reservation had never been made; `false` when it declined, keeping
    /// them taken, because another decision changed the bucket since (later
    /// requests may already be queued behind this reservation, or have spent
    /// from it; undoing it then could admit more than the quota allows).
    pub fn cancel(self) -> bool {
        let (previous, written) = (self.previous, self.written);
        self.limiter
            .cell()
            .transform(|word| (word == written).then_some(previous))
            .is_some()
    }
}

impl<C, M> fmt::Debug for Reservation<'_, C, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("permits", &self.n)
            .field("delay", &self.delay)
            .finish()
    }
}
