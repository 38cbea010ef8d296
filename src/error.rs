//! Typed errors: every invalid quota is refused when it is built, every invalid
//! request when it is made. Nothing here is a panic.

use core::fmt;
use core::time::Duration;

/// Why a [`Quota`](crate::Quota) could not be built.
///
/// Each variant names the offending value and the range that would be accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuotaError {
    /// The capacity (burst) was 0; a bucket must hold at least one token.
    ZeroCapacity,
    /// The refill amount was 0; a bucket that never refills is not a rate.
    ZeroAmount,
    /// A rate constructor such as [`Quota::per_second`](crate::Quota::per_second)
    /// or [`Quota::per_second_with_burst`](crate::Quota::per_second_with_burst)
    /// got 0.
    ZeroRate,
    /// The refill period was zero.
    ZeroPeriod,
    /// The refill period is not a whole number of the bucket's time unit (1 µs up
    /// to a capacity of 65,535, coarser above; see
    /// [`Quota::time_unit`](crate::Quota::time_unit)).
    PeriodResolution {
        /// The period that was asked for.
        period: Duration,
        /// The time unit for the capacity asked for.
        unit: Duration,
    },
    /// [`Quota::burst`](crate::Quota::burst) was given a capacity above 65,535
    /// whose coarser time unit does not divide the quota's refill period (the
    /// period was valid for the old capacity: the burst is at fault).
    BurstResolution {
        /// The capacity (burst) asked for.
        capacity: u32,
        /// The time unit of that capacity.
        unit: Duration,
        /// The quota's refill period, which that unit does not divide.
        period: Duration,
        /// The largest burst whose time unit divides the period.
        max: u32,
    },
    /// Refilling an empty bucket would take longer than the packed word's time field
    /// can measure exactly for this capacity (half its range).
    FillTimeTooLong {
        /// The capacity asked for; it decides how many bits are left for time.
        capacity: u32,
        /// The time to refill an empty bucket: `ceil(capacity / amount) * period`.
        fill_time: Duration,
        /// The longest fill time this capacity allows.
        max: Duration,
    },
    /// [`Quota::per_second_with_burst`](crate::Quota::per_second_with_burst)
    /// cannot keep the rate with this burst: a bucket refills in whole time
    /// units ([`Quota::time_unit`](crate::Quota::time_unit)), and what one
    /// refill must bring to keep the rate, within 0.1%, is more than the
    /// bucket holds (tokens past the capacity are dropped, so the rate would
    /// silently fall to about `burst` per unit).
    BurstBelowRate {
        /// The rate asked for, per second.
        rate: u64,
        /// The burst asked for.
        burst: u32,
        /// The smallest burst that keeps the rate. (Not every larger one
        /// does: a burst above 65,535 has a coarser time unit, whose refill
        /// must bring more.) Above `u32::MAX` when no burst can (a rate
        /// above about 6.56 × 10^10 per second).
        min_burst: u64,
    },
    /// A refill brings more tokens than the bucket holds (`amount >
    /// capacity`, from [`Quota::new`](crate::Quota::new) or a
    /// [`burst`](crate::Quota::burst) below the refill): the tokens past the
    /// capacity would be dropped, so a token bucket would run at `capacity`
    /// per period, below the rate asked for, while GCRA kept the rate.
    AmountAboveCapacity {
        /// The bucket's capacity.
        capacity: u32,
        /// The tokens each refill brings.
        amount: u32,
        /// The refill period.
        period: Duration,
    },
    /// A window algorithm's limit (or a concurrency limit) was 0.
    ZeroLimit,
    /// A fair queue (`Fair::new`, feature `tokio`) was given room for 0
    /// waiters; it must hold at least one.
    ZeroWaiters,
    /// `OnFailure::local_share` (feature `redis`) was told 0 processes share
    /// the quota; at least one does.
    ZeroProcesses,
    /// A window was zero long.
    ZeroWindow,
    /// The window is too short for the limit: the word keeps the count(s) in as
    /// many bits as the limit needs and the window number in the rest, and that
    /// window number must span at least `2^48` µs (8.9 years) so that a word left
    /// idle for up to 4.46 years is still read exactly. A larger limit leaves
    /// fewer bits, so it needs longer windows.
    WindowTooShort {
        /// The limit asked for; for a live window, the larger of it and the
        /// window's ceiling (the counts are as wide as the ceiling, whatever
        /// the limit now).
        limit: u32,
        /// The window asked for.
        window: Duration,
        /// The shortest window this limit allows.
        min: Duration,
    },
    /// A sliding window's limit (or a live window's ceiling) leaves no bits
    /// for the window number beside its two counts: no window can be kept
    /// for it, whatever its length. `max` is the largest limit that can.
    LimitTooLarge {
        /// The limit (or ceiling) asked for.
        limit: u32,
        /// The largest this algorithm keeps.
        max: u32,
    },
    /// The window is longer than any window a word can hold: `2^47` µs
    /// (4.46 years).
    WindowTooLong {
        /// The window asked for.
        window: Duration,
        /// The longest window.
        max: Duration,
    },
    /// A live form ([`LiveTokenBucket`](crate::LiveTokenBucket),
    /// [`LiveFixedWindow`](crate::LiveFixedWindow) or
    /// [`LiveSlidingWindow`](crate::LiveSlidingWindow)) was given a quota
    /// whose capacity (a window's limit) is above the ceiling it was built
    /// with: its word's token (or count) field is only as wide as the ceiling
    /// needs.
    AboveCeiling {
        /// The capacity (a window's limit) asked for.
        capacity: u32,
        /// The largest capacity (limit) this live form can take.
        ceiling: u32,
    },
}

impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuotaError::ZeroCapacity => f.write_str(
                "quota capacity (burst) is 0; it must be between 1 and 4294967295 tokens",
            ),
            QuotaError::ZeroAmount => f.write_str(
                "quota refill amount is 0; it must be between 1 and 4294967295 tokens per period",
            ),
            QuotaError::ZeroRate => f.write_str(
                "quota rate is 0; it must be at least 1 per interval (up to 4294967295 for \
                 Quota::per_second, per_minute, per_hour and per_day; up to about \
                 6.56 × 10^10 per second for Quota::per_second_with_burst)",
            ),
            QuotaError::ZeroPeriod => {
                f.write_str("quota refill period is zero; it must be at least 1 microsecond")
            }
            QuotaError::PeriodResolution { period, unit } => {
                let unit_nanos = unit.as_nanos().max(1);
                let suggestion = period.as_nanos().div_ceil(unit_nanos) * unit_nanos;
                write!(
                    f,
                    "quota refill period {period:?} is not a whole number of the bucket's \
                     time unit, {unit:?} for this capacity; use a multiple of {unit:?}, \
                     e.g. {:?}",
                    Duration::from_nanos(u64::try_from(suggestion).unwrap_or(u64::MAX))
                )
            }
            QuotaError::BurstResolution {
                capacity,
                unit,
                period,
                max,
            } => write!(
                f,
                "a burst (capacity) of {capacity} tokens is too large for this quota's \
                 refill period of {period:?}: that capacity counts time in units of \
                 {unit:?}, which do not divide the period; with this period the burst \
                 must be between 1 and {max}, or build the quota with Quota::new and a \
                 period that is a multiple of {unit:?}"
            ),
            QuotaError::FillTimeTooLong {
                capacity,
                fill_time,
                max,
            } => write!(
                f,
                "quota takes {fill_time:?} to refill an empty bucket of {capacity} tokens; \
                 with that capacity the packed word measures at most {max:?}: \
                 raise the amount per period, shorten the period, or lower the capacity"
            ),
            QuotaError::BurstBelowRate {
                rate,
                burst,
                min_burst,
            } if *min_burst > u64::from(u32::MAX) => write!(
                f,
                "no burst can keep {rate} tokens per second (asked with a burst of {burst}): \
                 a refill of one time unit would bring more than 4294967295 tokens, the \
                 largest bucket; the largest rate is about 6.56 × 10^10 per second \
                 (kept within 0.1%), with a burst of 4294967295"
            ),
            QuotaError::BurstBelowRate {
                rate,
                burst,
                min_burst,
            } if u64::from(*burst) > *min_burst && *min_burst <= 65_535 => write!(
                f,
                "a burst of {burst} tokens cannot keep {rate} tokens per second: a burst \
                 of this size counts time in coarser units, and one unit's refill would \
                 overflow it; a burst between {min_burst} and 65535 keeps it (as do \
                 larger ones in proportion to their coarser units)"
            ),
            QuotaError::BurstBelowRate {
                rate,
                burst,
                min_burst,
            } => write!(
                f,
                "a burst of {burst} tokens cannot keep {rate} tokens per second: the bucket \
                 refills in whole time units, and one unit's refill would overflow it; \
                 the smallest burst that keeps it is {min_burst} (a burst above 65535 \
                 counts time in coarser units and needs proportionally more)"
            ),
            QuotaError::AmountAboveCapacity {
                capacity,
                amount,
                period,
            } => write!(
                f,
                "a refill of {amount} tokens every {period:?} into a bucket of {capacity}: \
                 the tokens past the capacity would be dropped and the rate silently \
                 lowered; make the capacity at least {amount}, or for a rate per second \
                 with a small burst use Quota::per_second_with_burst, which picks a refill \
                 that fits"
            ),
            QuotaError::ZeroLimit => {
                f.write_str("limit is 0; it must be between 1 and 4294967295 permits")
            }
            QuotaError::ZeroWaiters => f.write_str(
                "a fair queue's max_waiters is 0; it must be at least 1 waiter (up to usize::MAX)",
            ),
            QuotaError::ZeroProcesses => f.write_str(
                "a local share for 0 processes; processes must be at least 1 (the \
                 processes that share the global quota, this one among them)",
            ),
            QuotaError::ZeroWindow => {
                f.write_str("window is zero; it must be at least 1 nanosecond")
            }
            QuotaError::WindowTooShort { limit, window, min } => write!(
                f,
                "a window of {window:?} is too short for a limit of {limit}: the packed \
                 word needs windows of at least {min:?} for that limit; lengthen the \
                 window or lower the limit (for a live window, the larger of its limit \
                 and its ceiling: a lower ceiling through its form's `with_ceiling`)"
            ),
            QuotaError::LimitTooLarge { limit, max } => write!(
                f,
                "a limit of {limit} leaves the packed word no room for a window of any \
                 length; this algorithm keeps limits of at most {max}"
            ),
            QuotaError::WindowTooLong { window, max } => write!(
                f,
                "a window of {window:?} is longer than the longest window, {max:?}"
            ),
            QuotaError::AboveCeiling { capacity, ceiling } => write!(
                f,
                "a capacity (or window limit) of {capacity} is above this live limiter's \
                 ceiling of {ceiling}; build it with a ceiling of at least {capacity} through \
                 its form's `with_ceiling` (`LiveTokenBucket::with_ceiling`, \
                 `LiveFixedWindow::with_ceiling` or `LiveSlidingWindow::with_ceiling`)"
            ),
        }
    }
}

impl core::error::Error for QuotaError {}

/// Why a request for `n` permits was refused outright, before any rate decision.
///
/// These are not rate denials: retrying later cannot help, so they carry no wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcquireError {
    /// `n = 0` was requested. A request must ask for at least one permit; to look at
    /// the tokens available without spending any, use `remaining()`.
    ZeroPermits,
    /// More permits were requested than the bucket can ever hold.
    InsufficientCapacity {
        /// The permits requested.
        requested: u32,
        /// The bucket's capacity, the most one request can ever get.
        capacity: u32,
    },
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AcquireError::ZeroPermits => f.write_str(
                "a request for 0 permits; ask for at least 1, or call remaining() to look \
                 without spending",
            ),
            AcquireError::InsufficientCapacity {
                requested,
                capacity,
            } => write!(
                f,
                "a request for {requested} permits can never succeed: the bucket holds at \
                 most {capacity}; ask for between 1 and {capacity}"
            ),
        }
    }
}

impl core::error::Error for AcquireError {}

/// Why a [`KeyedLimiter`](crate::KeyedLimiter) could not be built.
#[cfg(feature = "std")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyedConfigError {
    /// The shard count must be a power of two from 1 to 65,536.
    Shards {
        /// The count asked for.
        shards: usize,
    },
    /// `max_keys` was 0; a keyed limiter must be able to hold at least one key.
    ZeroMaxKeys,
    /// `sweep_every` was 0; a shard sweeps itself after at least one insert.
    ZeroSweepEvery,
    /// A background sweeper's interval was shorter than
    /// [`MIN_SWEEP_INTERVAL`](crate::MIN_SWEEP_INTERVAL) (1 ms), zero
    /// included: such a thread would do little but spin.
    SweepIntervalTooShort {
        /// The interval asked for.
        interval: Duration,
        /// The shortest interval allowed.
        min: Duration,
    },
    /// The background sweeper's thread could not be started.
    SweeperThread {
        /// The operating system's error.
        kind: std::io::ErrorKind,
    },
}

#[cfg(feature = "std")]
impl fmt::Display for KeyedConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyedConfigError::Shards { shards } => write!(
                f,
                "{shards} shards: the shard count must be a power of two from 1 to 65536"
            ),
            KeyedConfigError::ZeroMaxKeys => {
                f.write_str("max_keys is 0; it must be at least 1 (it bounds the keys held)")
            }
            KeyedConfigError::ZeroSweepEvery => f.write_str(
                "sweep_every is 0; it must be at least 1 (inserts between a shard's sweeps)",
            ),
            KeyedConfigError::SweepIntervalTooShort { interval, min } => write!(
                f,
                "a sweeper interval of {interval:?} is too short; it must be at least \
                 {min:?} (seconds are typical): a shorter one keeps a thread spinning \
                 over the shards' locks"
            ),
            KeyedConfigError::SweeperThread { kind } => {
                write!(f, "the background sweeper's thread could not start: {kind}")
            }
        }
    }
}

#[cfg(feature = "std")]
impl core::error::Error for KeyedConfigError {}

/// Refuse requests that no rate decision can answer.
#[inline]
pub(crate) fn check_permits(n: u32, capacity: u32) -> Result<(), AcquireError> {
    if n == 0 {
        Err(AcquireError::ZeroPermits)
    } else if n > capacity {
        Err(AcquireError::InsufficientCapacity {
            requested: n,
            capacity,
        })
    } else {
        Ok(())
    }
}
