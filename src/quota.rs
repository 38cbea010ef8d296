//! Validated token-bucket parameters: capacity, and `amount` tokens every `period`.

use core::time::Duration;

use crate::error::QuotaError;
use crate::word::{Layout, TOKEN_BITS_AT_MICROSECOND};

const MICROS_PER_SECOND: u64 = 1_000_000;
/// The rate constructors keep their rounding below one part in this many.
const PRECISION: u128 = 1_000;

/// A token bucket's parameters: it holds at most `capacity` tokens (the burst) and
/// gains `amount` tokens at the end of every whole `period`.
///
/// Every constructor validates; an invalid value is a [`QuotaError`] naming the
/// value and the allowed range, never a panic and never a silent clamp.
///
/// ```
/// use std::time::Duration;
/// use turnstile::Quota;
///
/// // 100 per second, bursts of up to 20.
/// let api = Quota::per_second(100)?.burst(20)?;
/// assert_eq!(api.capacity(), 20);
/// assert_eq!(api.period(), Duration::from_millis(10));
///
/// // The rate-limiter pattern's bucket: capacity 3, one token every 1000 ms.
/// let pattern = Quota::new(3, 1, Duration::from_millis(1000))?;
/// assert_eq!(pattern.fill_time(), Duration::from_secs(3));
///
/// assert!(Quota::new(0, 1, Duration::from_secs(1)).is_err());
/// # Ok::<(), turnstile::QuotaError>(())
/// ```
///
/// # Time unit
///
/// The bucket keeps time in whole units ([`Quota::time_unit`]): one microsecond
/// for capacities up to 65,535, doubling with each further bit of capacity (16 µs
/// at a million, 65.536 ms at `u32::MAX`), which keeps every bucket exact for at
/// least 4.46 years of idleness (see [`TokenBucket`](crate::TokenBucket#the-packed-word)).
/// A period must be a whole number of units ([`QuotaError::PeriodResolution`]
/// otherwise); the rate constructors choose such a period for you.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Quota {
    capacity: u32,
    amount: u32,
    period_micros: u64,
}

impl Quota {
    /// A bucket of `capacity` tokens that gains `amount` tokens every `period`.
    ///
    /// `amount` tokens arrive together at the end of each whole period (the
    /// rate-limiter pattern's and .NET's token bucket). With `amount = 1` the
    /// bucket admits at most `capacity + floor(T / period)` requests in any
    /// interval `T` (RFC 1363's `B + R·T`), with `T` rounded up to the
    /// [time unit](Quota::time_unit) (the bucket counts from the start of the
    /// unit a request lands in, so a refill can come up to one unit early);
    /// with a larger amount, a batch arriving just after a burst can add up to
    /// `amount - 1` more.
    ///
    /// # Errors
    ///
    /// [`QuotaError::ZeroCapacity`], [`QuotaError::ZeroAmount`],
    /// [`QuotaError::ZeroPeriod`], [`QuotaError::AmountAboveCapacity`] for a
    /// refill larger than the bucket, [`QuotaError::PeriodResolution`] for a period
    /// that is not a whole number of the capacity's time unit, and
    /// [`QuotaError::FillTimeTooLong`] when refilling from empty takes longer than
    /// the packed word can measure (see [`Quota::max_fill_time`]).
    pub fn new(capacity: u32, amount: u32, period: Duration) -> Result<Quota, QuotaError> {
        if period.is_zero() {
            return Err(QuotaError::ZeroPeriod);
        }
        let nanos = period.as_nanos();
        if capacity != 0 && amount != 0 {
            // A fill time the word cannot measure is the fault whatever the
            // period's resolution, and is judged on the period asked for (a
            // period beyond u64 microseconds must not be reported as another).
            let layout = Layout::for_capacity(capacity);
            let max_micros = layout.half_range_micros();
            let fill_nanos = u128::from(capacity.div_ceil(amount)).saturating_mul(nanos);
            if fill_nanos > u128::from(max_micros) * 1_000 {
                return Err(QuotaError::FillTimeTooLong {
                    capacity,
                    fill_time: saturating_duration(fill_nanos),
                    max: Duration::from_micros(max_micros),
                });
            }
        }
        if !nanos.is_multiple_of(1_000) {
            let unit = Layout::for_capacity(capacity).unit_micros();
            return Err(QuotaError::PeriodResolution {
                period,
                unit: Duration::from_micros(unit),
            });
        }
        // A period too long for u64 microseconds is far beyond any fill-time limit.
        let period_micros = u64::try_from(nanos / 1_000).unwrap_or(u64::MAX);
        Quota::from_micros(capacity, amount, period_micros)
    }

    /// `rate` tokens per second, with a burst of `rate`.
    ///
    /// The refill is one token every `1 s / rate` when that is a whole number of
    /// time units, so the rate is exact. Otherwise the constructor picks the
    /// refill with the shortest period that never exceeds `rate` and stays within
    /// 0.1% of it: the exact rate in small batches where one exists (300,000 per
    /// second is 12 tokens every 40 µs), else one token every `ceil(1 s / rate)`
    /// (3 per second is one every 333,334 µs), else a batch about every
    /// millisecond. Use [`Quota::burst`] to change the burst.
    ///
    /// # Errors
    ///
    /// [`QuotaError::ZeroRate`] for 0.
    pub fn per_second(rate: u32) -> Result<Quota, QuotaError> {
        Quota::per_interval(rate, MICROS_PER_SECOND)
    }

    /// `rate` tokens per second with a burst of `burst`, for rates beyond a
    /// `u32` (bytes per second: up to 10^10 per second and more) and bursts
    /// up to `u32::MAX` (4 GiB less one byte, the widest token field).
    ///
    /// The bucket refills `amount` tokens every `period`, a whole number of
    /// the burst's [time unit](Quota::time_unit) (1 µs up to a burst of
    /// 65,535, 65.536 ms at `u32::MAX`), and each refill must fit in the
    /// bucket. Within those bounds the refill is:
    ///
    /// - **exact** when `rate` is a whole number of tokens per some period
    ///   of at most a millisecond (or at most one time unit where the unit
    ///   is longer) and that refill fits in the bucket: every multiple of
    ///   1,000 per second with a burst up to 65,535, and above that every
    ///   rate that brings whole tokens per unit (10^10 per second is
    ///   655,360,000 tokens every 65.536 ms with a burst of `u32::MAX`);
    /// - otherwise **rounded down**, never above `rate` and within 0.1% of
    ///   it, with the shortest period that allows, as [`Quota::per_second`]
    ///   rounds (999,999,937 per second with a burst of 1,000 is 999 tokens
    ///   every microsecond: 0.09999% slow).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Quota, QuotaError};
    ///
    /// // 10 GB/s with bursts of up to 4 GiB less one byte: exact.
    /// let q = Quota::per_second_with_burst(10_000_000_000, u32::MAX)?;
    /// assert_eq!((q.amount(), q.period()), (655_360_000, Duration::from_micros(65_536)));
    ///
    /// // 1 MB/s with bursts of 64 KiB: 2 bytes every 2 µs.
    /// let q = Quota::per_second_with_burst(1_000_000, 64 * 1024)?;
    /// assert_eq!((q.amount(), q.period()), (2, Duration::from_micros(2)));
    ///
    /// // 10^10 per second cannot be kept by a bucket of 1,000: a microsecond
    /// // brings 10,000. 9,990 a microsecond is within 0.1%.
    /// assert!(matches!(
    ///     Quota::per_second_with_burst(10_000_000_000, 1_000),
    ///     Err(QuotaError::BurstBelowRate { min_burst: 9_990, .. })
    /// ));
    /// # Ok::<(), QuotaError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`QuotaError::ZeroRate`], [`QuotaError::ZeroCapacity`];
    /// [`QuotaError::BurstBelowRate`] when no refill that fits in the bucket
    /// keeps the rate within 0.1% (the error names the smallest burst that
    /// does); [`QuotaError::FillTimeTooLong`] when refilling the burst takes
    /// longer than the word measures (a large burst at a low rate).
    pub fn per_second_with_burst(rate: u64, burst: u32) -> Result<Quota, QuotaError> {
        if rate == 0 {
            return Err(QuotaError::ZeroRate);
        }
        if burst == 0 {
            return Err(QuotaError::ZeroCapacity);
        }
        let unit = Layout::for_capacity(burst).unit_micros();
        match refill_within_burst(rate, MICROS_PER_SECOND, unit, burst) {
            Some((amount, period)) => Quota::from_micros(burst, amount, period),
            None => Err(QuotaError::BurstBelowRate {
                rate,
                burst,
                min_burst: min_burst_for_rate(rate, MICROS_PER_SECOND),
            }),
        }
    }

    /// `rate` tokens per minute, with a burst of `rate`; refill chosen as
    /// [`Quota::per_second`] does.
    ///
    /// # Errors
    ///
    /// [`QuotaError::ZeroRate`] for 0.
    pub fn per_minute(rate: u32) -> Result<Quota, QuotaError> {
        Quota::per_interval(rate, 60 * MICROS_PER_SECOND)
    }

    /// `rate` tokens per hour, with a burst of `rate`; refill chosen as
    /// [`Quota::per_second`] does.
    ///
    /// # Errors
    ///
    /// [`QuotaError::ZeroRate`] for 0.
    pub fn per_hour(rate: u32) -> Result<Quota, QuotaError> {
        Quota::per_interval(rate, 3_600 * MICROS_PER_SECOND)
    }

    /// `rate` tokens per day, with a burst of `rate`; refill chosen as
    /// [`Quota::per_second`] does.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::Quota;
    ///
    /// // 86,400 a day: one token a second.
    /// let quota = Quota::per_day(86_400)?;
    /// assert_eq!((quota.capacity(), quota.amount(), quota.period()), (86_400, 1, Duration::from_secs(1)));
    /// # Ok::<(), turnstile::QuotaError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`QuotaError::ZeroRate`] for 0.
    pub fn per_day(rate: u32) -> Result<Quota, QuotaError> {
        Quota::per_interval(rate, 86_400 * MICROS_PER_SECOND)
    }

    /// One token every `period`, with a burst of 1 (pacing); widen the burst with
    /// [`Quota::burst`].
    ///
    /// # Errors
    ///
    /// As [`Quota::new`] for the period.
    pub fn with_period(period: Duration) -> Result<Quota, QuotaError> {
        Quota::new(1, 1, period)
    }

    /// The same refill with a different capacity (burst).
    ///
    /// A capacity above 65,535 has a coarser [time unit](Quota::time_unit),
    /// which must divide the refill period this quota already has: with
    /// `Quota::per_second(100)`'s 10 ms period the burst can be at most
    /// 1,048,575 (a 16 µs unit), and `u32::MAX` (a 65.536 ms unit) needs a period
    /// that is a multiple of 65.536 ms.
    ///
    /// ```
    /// use turnstile::{Quota, QuotaError};
    ///
    /// let per_second = Quota::per_second(100)?;
    /// assert_eq!(per_second.burst(1_048_575)?.capacity(), 1_048_575);
    /// assert!(matches!(
    ///     per_second.burst(u32::MAX),
    ///     Err(QuotaError::BurstResolution { capacity: u32::MAX, max: 1_048_575, .. })
    /// ));
    /// # Ok::<(), QuotaError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`QuotaError::ZeroCapacity`]; [`QuotaError::BurstResolution`] when the
    /// new capacity is above 65,535 and its coarser time unit does not divide the
    /// period (the error names the capacity and the largest burst the period
    /// allows); [`QuotaError::AmountAboveCapacity`] for a burst below the
    /// quota's refill amount (a high rate refills in batches:
    /// `Quota::per_second(1_000_000)` brings 16 tokens every 16 µs, so a
    /// burst of 10 would drop 6 of them each time; ask
    /// [`Quota::per_second_with_burst`] instead); [`QuotaError::FillTimeTooLong`].
    pub fn burst(self, capacity: u32) -> Result<Quota, QuotaError> {
        let unit = Layout::for_capacity(capacity).unit_micros();
        if capacity != 0 && !self.period_micros.is_multiple_of(unit) {
            return Err(QuotaError::BurstResolution {
                capacity,
                unit: Duration::from_micros(unit),
                period: Duration::from_micros(self.period_micros),
                max: max_capacity_for_period(self.period_micros),
            });
        }
        Quota::from_micros(capacity, self.amount, self.period_micros)
    }

    /// The most tokens the bucket holds: the largest burst, and the most permits
    /// one request can ask for.
    pub const fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Tokens added at the end of each period.
    pub const fn amount(&self) -> u32 {
        self.amount
    }

    /// The refill period.
    pub const fn period(&self) -> Duration {
        Duration::from_micros(self.period_micros)
    }

    /// The time to refill an empty bucket: `ceil(capacity / amount) * period`.
    pub const fn fill_time(&self) -> Duration {
        Duration::from_micros(fill_time(self.capacity, self.amount, self.period_micros))
    }

    /// The granularity of the bucket's time for this capacity: 1 µs up to a
    /// capacity of 65,535, then doubling with each bit (65.536 ms at `u32::MAX`).
    /// The period is a whole number of these; refills land on them.
    pub const fn time_unit(&self) -> Duration {
        Duration::from_micros(Layout::for_capacity(self.capacity).unit_micros())
    }

    /// The longest fill time that a bucket of this capacity can have, and also the
    /// longest idle time after which a bucket that was not full is still read
    /// exactly: half the span of the packed word's time field, at least `2^47` µs
    /// (4.46 years).
    pub const fn max_fill_time(&self) -> Duration {
        Duration::from_micros(Layout::for_capacity(self.capacity).half_range_micros())
    }

    /// A quota from parts already validated (a live bucket's snapshot).
    pub(crate) const fn from_raw(capacity: u32, amount: u32, period_micros: u64) -> Quota {
        Quota {
            capacity,
            amount,
            period_micros,
        }
    }

    pub(crate) const fn period_micros(&self) -> u64 {
        self.period_micros
    }

    /// A quota from the fields of one that was validated (a live form's
    /// parameter slot keeps them as words), not validated again.
    pub(crate) const fn from_raw_parts(capacity: u32, amount: u32, period_micros: u64) -> Quota {
        Quota {
            capacity,
            amount,
            period_micros,
        }
    }

    fn from_micros(capacity: u32, amount: u32, period_micros: u64) -> Result<Quota, QuotaError> {
        if capacity == 0 {
            return Err(QuotaError::ZeroCapacity);
        }
        if amount == 0 {
            return Err(QuotaError::ZeroAmount);
        }
        if period_micros == 0 {
            return Err(QuotaError::ZeroPeriod);
        }
        if amount > capacity {
            return Err(QuotaError::AmountAboveCapacity {
                capacity,
                amount,
                period: Duration::from_micros(period_micros),
            });
        }
        let layout = Layout::for_capacity(capacity);
        let unit = layout.unit_micros();
        if !period_micros.is_multiple_of(unit) {
            return Err(QuotaError::PeriodResolution {
                period: Duration::from_micros(period_micros),
                unit: Duration::from_micros(unit),
            });
        }
        let max = layout.half_range_micros();
        let fill = u128::from(capacity.div_ceil(amount)) * u128::from(period_micros);
        if fill > u128::from(max) {
            return Err(QuotaError::FillTimeTooLong {
                capacity,
                fill_time: saturating_duration(fill.saturating_mul(1_000)),
                max: Duration::from_micros(max),
            });
        }
        Ok(Quota {
            capacity,
            amount,
            period_micros,
        })
    }

    pub(crate) fn per_interval(rate: u32, interval_micros: u64) -> Result<Quota, QuotaError> {
        if rate == 0 {
            return Err(QuotaError::ZeroRate);
        }
        let unit = Layout::for_capacity(rate).unit_micros();
        let (amount, period) = refill_for_rate(u64::from(rate), interval_micros, unit);
        // `refill_for_rate` keeps the amount within a u32 (see its tests).
        let amount = u32::try_from(amount).unwrap_or(u32::MAX);
        Quota::from_micros(rate, amount, period)
    }
}

/// The largest capacity whose time unit divides `period_micros` (at least
/// 65,535, whose unit is 1 µs): the unit of a capacity of `16 + k` bits is
/// `2^k` µs, so the period's factors of two decide.
fn max_capacity_for_period(period_micros: u64) -> u32 {
    let bits = 16 + period_micros.trailing_zeros();
    if bits >= u32::BITS {
        u32::MAX
    } else {
        (1 << bits) - 1
    }
}

/// `nanos` as a `Duration`, `Duration::MAX` beyond it.
fn saturating_duration(nanos: u128) -> Duration {
    let secs = u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX);
    // The remainder is below 10^9: it fits.
    let subsec = u32::try_from(nanos % 1_000_000_000).unwrap_or(0);
    if secs == u64::MAX {
        return Duration::MAX;
    }
    Duration::new(secs, subsec)
}

/// `ceil(capacity / amount) * period`, in the period's unit. Validated quotas keep
/// it below `2^62` microseconds, so it cannot overflow.
pub(crate) const fn fill_time(capacity: u32, amount: u32, period: u64) -> u64 {
    (capacity.div_ceil(amount) as u64).saturating_mul(period)
}

/// The `(amount, period)` refill for `rate` tokens per `interval` microseconds with
/// a period that is a whole number of `unit` microseconds: never faster than the
/// rate, within one part in `PRECISION` of it, and with the shortest period among
/// the candidates.
fn refill_for_rate(rate: u64, interval: u64, unit: u64) -> (u64, u64) {
    // In u128: products of a rate, an interval and a unit reach 2^80.
    let (rate, interval, unit) = (u128::from(rate), u128::from(interval), u128::from(unit));
    let round_up = |micros: u128| micros.div_ceil(unit) * unit;
    // Exact: `rate / interval = a / p` with `p` the smallest whole number of units
    // that is a multiple of `interval / gcd`.
    let step = interval / gcd(rate, interval);
    let exact_period = step / gcd(step, unit) * unit;
    let exact = (rate * exact_period / interval, exact_period);
    // Batches rounded down: `k` units long, at least PRECISION tokens each, so
    // flooring the batch loses less than one part in PRECISION.
    let k = (PRECISION * interval).div_ceil(rate * unit).max(1);
    let floored = (rate * k * unit / interval, k * unit);
    // Periods rounded up: a batch of `a` tokens every `a * interval / rate`
    // rounded up to whole units, with the period at least PRECISION units long so
    // the rounding costs less than one part in PRECISION.
    let a = (rate * PRECISION * unit).div_ceil(interval);
    let rounded = (a, round_up((a * interval).div_ceil(rate)));
    let (amount, period) = [floored, rounded]
        .into_iter()
        .fold(exact, |best, c| if c.1 < best.1 { c } else { best });
    // The chosen period is at most about PRECISION units or one token's interval,
    // and the amount at most about PRECISION plus one unit's tokens: both fit.
    (
        u64::try_from(amount).unwrap_or(u64::MAX),
        u64::try_from(period).unwrap_or(u64::MAX),
    )
}

/// The `(amount, period)` refill for `rate` tokens per `interval`
/// microseconds in a bucket of `burst` tokens whose time unit is `unit`
/// microseconds: `amount <= burst` (a refill the bucket cannot hold would
/// lose tokens), never faster than the rate and within one part in
/// `PRECISION` of it. The exact refill when its period is at most a
/// millisecond or one unit, else the candidate with the shortest period.
/// `None` when no candidate fits.
fn refill_within_burst(rate: u64, interval: u64, unit: u64, burst: u32) -> Option<(u32, u64)> {
    let (r, i, u, b) = (
        u128::from(rate),
        u128::from(interval),
        u128::from(unit),
        u128::from(burst),
    );
    // Exact: as in `refill_for_rate`.
    let step = i / gcd(r, i);
    let exact_period = step / gcd(step, u) * u;
    let exact = (r * exact_period / i, exact_period);
    // Inexact: `refill_for_rate`'s two, and the longest period whose batch
    // still fits in the bucket (below).
    let k = (PRECISION * i).div_ceil(r * u).max(1);
    let floored = (r * k * u / i, k * u);
    let a = (r * PRECISION * u).div_ceil(i);
    let rounded = (a, ((a * i).div_ceil(r)).div_ceil(u) * u);
    // The longest period whose batch fits, and at least one unit: a batch
    // of one unit cut to the burst, when that is within PRECISION.
    let fit_units = (b * i / (r * u)).max(1);
    let fit = ((r * fit_units * u / i).min(b), fit_units * u);
    let valid = |&(amount, period): &(u128, u128)| {
        amount >= 1
            && amount <= b
            && period >= u
            && u64::try_from(period).is_ok()
            // Never faster than the rate, within one part in PRECISION.
            && amount * i <= r * period
            && amount * i * PRECISION >= r * period * (PRECISION - 1)
    };
    // Small batches and short periods the four above skip (5,001 per second
    // in a bucket of 5: one token every 200 µs, 0.02% slow): every batch up
    // to the rounded one's, each with the shortest period that does not
    // exceed the rate; and every period up to the floored one's, each with
    // the largest batch that does not (cut to the bucket). A refill that
    // keeps the rate has a candidate at least as short in one of them: its
    // own batch with its period rounded down to the first that keeps the
    // rate, or (batch above `rounded`'s) `rounded`, no longer. The two
    // counts multiply to about PRECISION², so one of them is at most about
    // PRECISION and is searched whole; the other is cut at `SEARCH`.
    const SEARCH: u128 = 2 * PRECISION + 2;
    let by_batch = (1..=a.min(b).min(SEARCH)).map(|a| (a, (a * i).div_ceil(r).div_ceil(u) * u));
    let by_period = (1..=k.min(SEARCH)).map(|p| ((r * p * u / i).min(b), p * u));
    let chosen = if valid(&exact) && exact.1 <= u.max(1_000) {
        exact
    } else {
        [exact, floored, rounded, fit]
            .into_iter()
            .chain(by_batch)
            .chain(by_period)
            .filter(valid)
            .min_by_key(|&(amount, period)| (period, core::cmp::Reverse(amount)))?
    };
    // `amount <= burst` and the period fits in a u64, by `valid`.
    Some((u32::try_from(chosen.0).ok()?, u64::try_from(chosen.1).ok()?))
}

/// The smallest burst that keeps `rate` tokens per `interval` microseconds
/// ([`refill_within_burst`] finds a refill for it); above `u32::MAX` when
/// none does. Among bursts of one bit width (one time unit) a larger burst
/// only relaxes the fit, so each width is searched by bisection, narrowest
/// first. (Across widths it is not monotonic: a wider burst has a coarser
/// unit, whose refill must bring more.)
fn min_burst_for_rate(rate: u64, interval: u64) -> u64 {
    let works = |burst: u32| {
        let unit = Layout::for_capacity(burst).unit_micros();
        refill_within_burst(rate, interval, unit, burst).is_some()
    };
    for bits in 1..=u32::BITS {
        let (mut low, high) = (1u32 << (bits - 1), u32::MAX >> (u32::BITS - bits));
        if !works(high) {
            continue;
        }
        // `works(high)`; find the smallest in `low..=high`.
        let mut high = high;
        while low < high {
            let mid = low + (high - low) / 2;
            if works(mid) {
                high = mid;
            } else {
                low = mid + 1;
            }
        }
        return u64::from(low);
    }
    // What one unit of the widest burst would have to hold.
    let unit = 1u128 << (u32::BITS - TOKEN_BITS_AT_MICROSECOND);
    u64::try_from((u128::from(rate) * unit).div_ceil(u128::from(interval))).unwrap_or(u64::MAX)
}

const fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_refills_never_exceed_the_rate_and_stay_within_a_thousandth() {
        let intervals = [
            MICROS_PER_SECOND,
            60 * MICROS_PER_SECOND,
            3_600 * MICROS_PER_SECOND,
        ];
        let rates = [
            1,
            2,
            3,
            7,
            999,
            1_000,
            1_001,
            1_500,
            7_777,
            65_535,
            65_536,
            100_000,
            300_000,
            333_333,
            1_000_000,
            3_000_000,
            3_600_000,
            999_999_937,
            u64::from(u32::MAX),
        ];
        for interval in intervals {
            for rate in rates {
                let unit = Layout::for_capacity(rate as u32).unit_micros();
                let (amount, period) = refill_for_rate(rate, interval, unit);
                let case = format!("{rate}/{interval}µs (unit {unit}): {amount} per {period}µs");
                assert!(amount >= 1 && amount <= u64::from(u32::MAX), "{case}");
                assert!(period >= unit && period % unit == 0, "{case}");
                // amount / period <= rate / interval
                let (lhs, rhs) = (
                    u128::from(amount) * u128::from(interval),
                    u128::from(rate) * u128::from(period),
                );
                assert!(lhs <= rhs, "too fast: {case}");
                assert!(lhs * 1_000 >= rhs * 999, "too slow: {case}");
                // Batches stay short: at most about a millisecond, or a few units.
                let one_token = interval.div_ceil(rate).div_ceil(unit) * unit;
                assert!(
                    period <= one_token.max(2_000 * unit),
                    "batches too long: {case}"
                );
                Quota::from_micros(rate as u32, amount as u32, period).expect(&case);
            }
        }
    }

    #[test]
    fn rate_refills_prefer_exact_and_smooth() {
        let s = MICROS_PER_SECOND;
        assert_eq!(refill_for_rate(100, s, 1), (1, 10_000));
        assert_eq!(refill_for_rate(1_000_000, s, 16), (16, 16));
        assert_eq!(refill_for_rate(3, s, 1), (1, 333_334));
        assert_eq!(refill_for_rate(300_000, s, 8), (12, 40));
        assert_eq!(refill_for_rate(3_000_000, s, 64), (192, 64));
    }
}
