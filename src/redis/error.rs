//! What can go wrong with a limit kept in Redis.

use core::fmt;
use core::time::Duration;

use crate::error::AcquireError;

/// Why a [`RedisLimiter`](super::RedisLimiter) or a
/// [`LeasedLimiter`](super::LeasedLimiter) could not be built: its name,
/// arithmetic that Lua's numbers (doubles, exact below `2^53`) could not
/// keep exact, or a leased mode's lease, lifetime, idle time or key bound.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisConfigError {
    /// The name is empty or holds `{` or `}`, which would break the hash tag
    /// of the default prefix.
    Name {
        /// The name asked for.
        name: String,
    },
    /// A window is not a whole number of microseconds, the unit of the scripts.
    SubMicrosecondWindow {
        /// The window asked for.
        window: Duration,
    },
    /// A duration is longer than the scripts can handle exactly.
    TooLong {
        /// Which duration.
        what: &'static str,
        /// Its value.
        value: Duration,
        /// The longest allowed.
        max: Duration,
    },
    /// A [`Deadlines`](super::Deadlines) deadline is shorter than 1 µs (zero
    /// included): no call could finish within it.
    DeadlineTooShort {
        /// Which deadline: `"connect deadline"` or `"response deadline"`.
        what: &'static str,
        /// Its value.
        value: Duration,
        /// The shortest allowed.
        min: Duration,
    },
    /// A sliding window whose `limit * window` (in microseconds) reaches
    /// `2^53`: its weighting would not be exact.
    SlidingTooWide {
        /// The limit asked for.
        limit: u32,
        /// The window asked for.
        window: Duration,
        /// The longest window for that limit.
        max_window: Duration,
    },
    /// Leased mode's map of keys could not be built (its `max_keys`).
    Keyed(crate::error::KeyedConfigError),
    /// Leased mode was asked for leases of at most 0 tokens; a lease holds
    /// at least one.
    ZeroLease,
    /// Leased mode was asked for leases larger than the bucket's capacity
    /// (no lease could ever be that large) or than
    /// [`MAX_LEASE`](super::MAX_LEASE) (the lease word's count).
    LeaseTooLarge {
        /// The `max_lease` asked for.
        max_lease: u32,
        /// The bucket's capacity.
        capacity: u32,
        /// The largest lease allowed: the capacity or `MAX_LEASE`, whichever
        /// is smaller.
        max: u32,
    },
    /// A lease lifetime outside what leased mode keeps: at least 10 ms (the
    /// lease word counts time in units of 4.19 ms) and at most an hour.
    LeaseLifetime {
        /// The lifetime asked for.
        lifetime: Duration,
        /// The shortest lifetime allowed.
        min: Duration,
        /// The longest lifetime allowed.
        max: Duration,
    },
    /// The idle time after which a lease is given back is longer than the
    /// lease lifetime: every lease would expire before it is idle that long.
    IdleLongerThanLifetime {
        /// The idle time asked for.
        idle: Duration,
        /// The lease lifetime.
        lifetime: Duration,
    },
}

impl fmt::Display for RedisConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisConfigError::Name { name } => write!(
                f,
                "limiter name {name:?} must be non-empty and hold no '{{' or '}}' \
                 (it is the hash tag of the keys' prefix)"
            ),
            RedisConfigError::SubMicrosecondWindow { window } => write!(
                f,
                "a window of {window:?} is not a whole number of microseconds, \
                 the unit of the Redis scripts; round it to whole microseconds"
            ),
            RedisConfigError::TooLong { what, value, max } => write!(
                f,
                "the {what} is {value:?}; on Redis it can be at most {max:?} \
                 (Lua numbers are exact below 2^53)"
            ),
            RedisConfigError::DeadlineTooShort { what, value, min } => write!(
                f,
                "the {what} is {value:?}; it must be at least {min:?} (a call cannot \
                 finish in less)"
            ),
            RedisConfigError::SlidingTooWide {
                limit,
                window,
                max_window,
            } => write!(
                f,
                "a sliding window of {limit} per {window:?} is too wide for exact \
                 arithmetic in Lua (limit times window in microseconds must stay below \
                 2^53): use a window of at most {max_window:?} or a lower limit"
            ),
            RedisConfigError::Keyed(e) => write!(f, "leased mode's map of keys: {e}"),
            RedisConfigError::ZeroLease => f.write_str(
                "max_lease is 0; a lease must hold at least 1 token (up to the bucket's \
                 capacity and MAX_LEASE)",
            ),
            RedisConfigError::LeaseTooLarge {
                max_lease,
                capacity,
                max,
            } => write!(
                f,
                "max_lease is {max_lease} tokens; it must be between 1 and {max}, the \
                 smaller of the bucket's capacity ({capacity}) and MAX_LEASE ({})",
                super::MAX_LEASE
            ),
            RedisConfigError::LeaseLifetime { lifetime, min, max } => write!(
                f,
                "a lease lifetime of {lifetime:?}; it must be between {min:?} and {max:?}"
            ),
            RedisConfigError::IdleLongerThanLifetime { idle, lifetime } => write!(
                f,
                "an idle time of {idle:?} is longer than the lease lifetime of {lifetime:?}: \
                 every lease would expire before it is given back; set idle to at most \
                 the lifetime"
            ),
        }
    }
}

impl std::error::Error for RedisConfigError {}

/// Why a decision on Redis gave no [`Decision`](crate::Decision).
#[derive(Debug)]
#[non_exhaustive]
pub enum RedisLimitError {
    /// The call failed: no connection, a timeout, an error from Redis. After a
    /// timeout or a dropped connection the script may or may not have run (a
    /// permit may have been spent); it is not sent again.
    Redis(::redis::RedisError),
    /// The request can never succeed (0 permits, or more than the capacity);
    /// nothing was sent.
    Acquire(AcquireError),
    /// Redis answered something that is not the script's reply (another
    /// script under the same SHA1, a proxy in between): nothing is assumed.
    Reply {
        /// The reply, as debug text.
        reply: String,
    },
    /// An explicit time at or above
    /// [`MAX_EXPLICIT_MICROS`](super::MAX_EXPLICIT_MICROS); nothing was sent.
    Time {
        /// The time given, in microseconds.
        now_micros: u64,
    },
}

impl RedisLimitError {
    /// `true` when the call timed out: Redis may still have made (and
    /// counted) the decision, unless it timed out before it was sent (waiting
    /// for a connection).
    pub fn is_timeout(&self) -> bool {
        matches!(self, RedisLimitError::Redis(e) if e.is_timeout())
    }
}

impl fmt::Display for RedisLimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisLimitError::Redis(e) => write!(f, "the rate limit's Redis call failed: {e}"),
            RedisLimitError::Acquire(e) => e.fmt(f),
            RedisLimitError::Reply { reply } => write!(
                f,
                "Redis answered {reply} where the rate limit's script answers \
                 [allowed, remaining, wait_us, wait_ns]"
            ),
            RedisLimitError::Time { now_micros } => write!(
                f,
                "explicit time {now_micros} us is at or past 2^52 us (the year 2112); \
                 give microseconds since the Unix epoch"
            ),
        }
    }
}

impl std::error::Error for RedisLimitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RedisLimitError::Redis(e) => Some(e),
            RedisLimitError::Acquire(e) => Some(e),
            _ => None,
        }
    }
}

impl From<::redis::RedisError> for RedisLimitError {
    fn from(e: ::redis::RedisError) -> Self {
        RedisLimitError::Redis(e)
    }
}

impl From<AcquireError> for RedisLimitError {
    fn from(e: AcquireError) -> Self {
        RedisLimitError::Acquire(e)
    }
}
