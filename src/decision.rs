//! What a limiter answers: admitted with tokens left, or denied with the exact wait.

use core::fmt;
use core::time::Duration;

/// The answer to a request for permits.
///
/// A denial changes nothing: the permits were not taken, and
/// [`Denied::retry_after`](Decision::Denied) says how long until the same request
/// would be admitted, if nobody else takes the permits first.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Decision, ManualClock, Quota, RateLimiter};
///
/// let clock = ManualClock::new();
/// let quota = Quota::new(1, 1, Duration::from_secs(1)).unwrap();
/// let limiter = RateLimiter::with_clock(quota, clock.clone());
///
/// assert_eq!(limiter.try_acquire(), Decision::Allowed { remaining: 0 });
/// clock.advance(Duration::from_millis(300));
/// match limiter.try_acquire() {
///     Decision::Allowed { .. } => unreachable!("the only token is spent"),
///     Decision::Denied { retry_after } => {
///         assert_eq!(retry_after.duration(), Duration::from_millis(700));
///         assert_eq!(retry_after.header_secs(), 1); // "Retry-After: 1"
///     }
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use = "a rate limiter's decision must be checked: a denied request must not proceed"]
pub enum Decision {
    /// The permits were taken; `remaining` tokens are left in the bucket.
    Allowed {
        /// Tokens left after this request.
        remaining: u32,
    },
    /// Not enough permits now; nothing was taken.
    Denied {
        /// The wait until the request would be admitted.
        retry_after: RetryAfter,
    },
}

impl Decision {
    /// The tokens left after an admission, or the denial as an error for `?`.
    #[inline]
    pub const fn into_result(self) -> Result<u32, RateLimited> {
        match self {
            Decision::Allowed { remaining } => Ok(remaining),
            Decision::Denied { retry_after } => Err(RateLimited::new(retry_after, false)),
        }
    }

    /// `true` when the permits were taken.
    #[inline]
    pub const fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allowed { .. })
    }

    /// `true` when the request was denied.
    #[inline]
    pub const fn is_denied(&self) -> bool {
        !self.is_allowed()
    }

    /// Tokens left after an admitted request; `None` for a denial.
    #[inline]
    pub const fn remaining(&self) -> Option<u32> {
        match self {
            Decision::Allowed { remaining } => Some(*remaining),
            Decision::Denied { .. } => None,
        }
    }

    /// The wait of a denial; `None` when admitted.
    #[inline]
    pub const fn retry_after(&self) -> Option<RetryAfter> {
        match self {
            Decision::Allowed { .. } => None,
            Decision::Denied { retry_after } => Some(*retry_after),
        }
    }
}

/// The answer of a [`KeyedLimiter`](crate::KeyedLimiter): a [`Decision`], or a
/// denial because the limiter already holds as many keys as it may.
///
/// A key-limit denial is not a rate denial: the key itself may be well within its
/// quota, but the limiter will not grow its memory for it. An HTTP gate answers it
/// with 503 Service Unavailable rather than 429.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use = "a rate limiter's decision must be checked: a denied request must not proceed"]
pub enum KeyedDecision {
    /// The permits were taken; `remaining` tokens are left in this key's bucket.
    Allowed {
        /// Tokens left after this request.
        remaining: u32,
    },
    /// Not enough permits in this key's bucket now; nothing was taken.
    Denied {
        /// The wait until the request would be admitted.
        retry_after: RetryAfter,
    },
    /// The key is new and the limiter is full (`max_keys`), even after looking
    /// for sweepable keys; nothing was stored.
    KeyLimit {
        /// The time after which every bucket idle since now can be swept: for
        /// a token bucket, its fill time, plus the furthest a reservation may
        /// have lent ahead once reservations have been made.
        retry_after: RetryAfter,
    },
}

impl KeyedDecision {
    /// The tokens left after an admission, or the denial (of either kind) as
    /// an error for `?`.
    #[inline]
    pub const fn into_result(self) -> Result<u32, RateLimited> {
        match self {
            KeyedDecision::Allowed { remaining } => Ok(remaining),
            KeyedDecision::Denied { retry_after } => Err(RateLimited::new(retry_after, false)),
            KeyedDecision::KeyLimit { retry_after } => Err(RateLimited::new(retry_after, true)),
        }
    }

    /// `true` when the permits were taken.
    #[inline]
    pub const fn is_allowed(&self) -> bool {
        matches!(self, KeyedDecision::Allowed { .. })
    }

    /// `true` for a denial of either kind.
    #[inline]
    pub const fn is_denied(&self) -> bool {
        !self.is_allowed()
    }

    /// `true` for a key-limit denial.
    #[inline]
    pub const fn is_key_limit(&self) -> bool {
        matches!(self, KeyedDecision::KeyLimit { .. })
    }

    /// Tokens left after an admitted request; `None` for a denial.
    #[inline]
    pub const fn remaining(&self) -> Option<u32> {
        match self {
            KeyedDecision::Allowed { remaining } => Some(*remaining),
            _ => None,
        }
    }

    /// The wait of a denial of either kind; `None` when admitted.
    #[inline]
    pub const fn retry_after(&self) -> Option<RetryAfter> {
        match self {
            KeyedDecision::Allowed { .. } => None,
            KeyedDecision::Denied { retry_after } | KeyedDecision::KeyLimit { retry_after } => {
                Some(*retry_after)
            }
        }
    }
}

impl From<Decision> for KeyedDecision {
    #[inline(always)]
    fn from(decision: Decision) -> KeyedDecision {
        match decision {
            Decision::Allowed { remaining } => KeyedDecision::Allowed { remaining },
            Decision::Denied { retry_after } => KeyedDecision::Denied { retry_after },
        }
    }
}

/// How long a denied request must wait, to the nanosecond.
///
/// [`header_secs`](RetryAfter::header_secs) gives the value of an HTTP
/// `Retry-After` header: whole seconds, rounded **up**, because a client told to
/// come back too early only gets another 429.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RetryAfter {
    nanos: u64,
}

impl RetryAfter {
    /// A wait of `nanos` nanoseconds.
    #[inline]
    pub const fn from_nanos(nanos: u64) -> Self {
        RetryAfter { nanos }
    }

    /// The wait in nanoseconds.
    #[inline]
    pub const fn as_nanos(&self) -> u64 {
        self.nanos
    }

    /// The wait as a [`Duration`].
    #[inline]
    pub const fn duration(&self) -> Duration {
        Duration::from_nanos(self.nanos)
    }

    /// Whole seconds for a `Retry-After` header, rounded up: 700 ms gives 1,
    /// 1000 ms gives 1, 1001 ms gives 2. Never rounds down.
    #[inline]
    pub const fn header_secs(&self) -> u64 {
        self.nanos.div_ceil(1_000_000_000)
    }

    /// Whole milliseconds, rounded up.
    #[inline]
    pub const fn millis_ceil(&self) -> u64 {
        self.nanos.div_ceil(1_000_000)
    }
}

/// A denial as an error, owned, for `?`: what
/// [`Decision::into_result`], [`KeyedDecision::into_result`] and
/// `RateLimited::from(not_yet)` make of a denial, so that a function
/// returning `Result<_, Box<dyn Error>>` (or any error type with a `From`
/// for it) can write `limiter.try_acquire().into_result()?`.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{ManualClock, Quota, RateLimited, RateLimiter};
///
/// fn send(limiter: &RateLimiter<turnstile::TokenBucket, ManualClock>) -> Result<u32, Box<dyn std::error::Error>> {
///     let left = limiter.try_acquire().into_result()?;
///     // ... send ...
///     Ok(left)
/// }
///
/// let clock = ManualClock::new();
/// let limiter = RateLimiter::with_clock(Quota::new(1, 1, Duration::from_secs(2))?, clock);
/// assert_eq!(send(&limiter)?, 0);
/// let err = send(&limiter).unwrap_err();
/// let limited = err.downcast_ref::<RateLimited>().expect("a denial");
/// assert_eq!(limited.retry_after().header_secs(), 2);
/// assert_eq!(err.to_string(), "rate limited: retry after 2s");
///
/// // `check`'s denial, which borrows the limiter, converts too.
/// let denial = limiter.check().map_err(RateLimited::from);
/// assert!(denial.is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RateLimited {
    retry_after: RetryAfter,
    key_limit: bool,
}

impl RateLimited {
    /// A denial with `retry_after`; `key_limit` when a keyed limiter refused
    /// a new key at its bound.
    pub const fn new(retry_after: RetryAfter, key_limit: bool) -> RateLimited {
        RateLimited {
            retry_after,
            key_limit,
        }
    }

    /// The wait until the request would be admitted.
    pub const fn retry_after(&self) -> RetryAfter {
        self.retry_after
    }

    /// `true` when a keyed limiter refused a new key at its bound (HTTP 503
    /// rather than 429).
    pub const fn is_key_limit(&self) -> bool {
        self.key_limit
    }
}

impl fmt::Display for RateLimited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key_limit {
            write!(
                f,
                "the rate limiter holds its most keys: retry after {}s",
                self.retry_after.header_secs()
            )
        } else {
            write!(
                f,
                "rate limited: retry after {}s",
                self.retry_after.header_secs()
            )
        }
    }
}

impl core::error::Error for RateLimited {}

impl From<RetryAfter> for Duration {
    fn from(retry_after: RetryAfter) -> Duration {
        retry_after.duration()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_secs_rounds_up_never_down() {
        let cases = [
            (0, 0),
            (1, 1),
            (700_000_000, 1),
            (999_999_999, 1),
            (1_000_000_000, 1),
            (1_000_000_001, 2),
            (u64::MAX, u64::MAX.div_ceil(1_000_000_000)),
        ];
        for (nanos, secs) in cases {
            assert_eq!(
                RetryAfter::from_nanos(nanos).header_secs(),
                secs,
                "{nanos} ns"
            );
        }
    }

    #[test]
    fn millis_ceil_rounds_up() {
        assert_eq!(RetryAfter::from_nanos(700_000_000).millis_ceil(), 700);
        assert_eq!(RetryAfter::from_nanos(700_000_001).millis_ceil(), 701);
        assert_eq!(RetryAfter::from_nanos(1).millis_ceil(), 1);
    }

    #[test]
    fn accessors_agree() {
        let allowed = Decision::Allowed { remaining: 4 };
        assert!(allowed.is_allowed() && !allowed.is_denied());
        assert_eq!(allowed.remaining(), Some(4));
        assert_eq!(allowed.retry_after(), None);

        let wait = RetryAfter::from_nanos(1_500);
        let denied = Decision::Denied { retry_after: wait };
        assert!(denied.is_denied() && !denied.is_allowed());
        assert_eq!(denied.remaining(), None);
        assert_eq!(denied.retry_after(), Some(wait));
        assert_eq!(Duration::from(wait), Duration::from_nanos(1_500));
    }
}
