//! The warm-up bucket: a token bucket whose refills ramp up from a cold rate
//! to the stable rate, as a pure function on one word.

use core::fmt;
use core::num::NonZeroU64;
use core::time::Duration;

use crate::algorithm::Algorithm;
use crate::algorithm::token_bucket::TokenBucket;
use crate::decision::{Decision, RetryAfter};
use crate::quota::Quota;
use crate::word::Layout;

/// The cold factor is kept in thousandths.
const COLD_SCALE: u64 = 1_000;
/// The largest cold factor: a cold bucket refills at no less than a
/// thousandth of the stable rate.
const MAX_COLD_FACTOR: f64 = 1_000.0;
/// The widest bracket [`WarmUp::periods_for`] bisects without first cutting
/// it with a tangent: two steps at most.
const TANGENT_SPAN: u64 = 3;
/// The narrowest time field a warm-up word keeps: half its span is at least
/// `2^39` time units (6.4 days at 1 µs).
const MIN_TIME_BITS: u32 = 40;
/// The shortest stretch behind a warm-up word's time (in its time units,
/// 2^32: 71.6 minutes at 1 µs) that a reading is taken as behind, not as one
/// after a long idle (see `WarmUp::forward`).
const BEHIND_FLOOR: u64 = 1 << 32;
/// The time field a refund needs to recognize its word: a span of at least
/// `2^47` units, beyond twice the refund horizon (`2^45` µs).
const REFUND_TIME_BITS: u32 = 47;

/// A token bucket that warms up: a cold bucket refills at `1 / cold_factor`
/// of its quota's rate, and the rate rises linearly in time to the quota's
/// over the warm-up period. It warms in each period the bucket is below
/// capacity (refilling after a burst counts, idle or not) and cools in each
/// period it stays full ([Semantics](#semantics)).
///
/// A service that has just started (cold caches, a new replica, a key seen
/// for the first time) is not sent its full rate at once.
///
/// The warm-up is like Guava's `SmoothWarmingUp`, on another curve: here the
/// refill rate is linear in time (in the heat, which under full demand rises
/// a period at a time); there the *cost per permit* is linear in the permits
/// stored, so the rate, its inverse, rises slowly at first and steeply at the
/// end (under full demand, `1 / √(c² - (c² - 1)·t/T)` of the stable rate at
/// time `t` of a warm-up `T`). Over the warm-up, under full demand, this
/// bucket's refills average `(1 + c) / (2c)` of the stable rate and Guava's
/// permits `2 / (1 + c)` of it. At 100 per second with a 30 s warm-up, from
/// cold under full demand, the permits admitted from 0 s to 30 s inclusive
/// (this bucket's with its full burst of 100) are:
///
/// | cold factor `c` | `WarmUp` | Guava's `SmoothWarmingUp` |
/// |---|---|---|
/// | 3 | 2,100 | 1,501 |
/// | 10 | 1,750 | 546 |
/// | 100 | 1,615 | 60 |
/// | 1,000 | 1,601 | 6 |
///
/// (`100 + ⌊3000·(1 + c)/(2c)⌋` here; `1 + ⌊6000/(1 + c)⌋` in Guava's model,
/// whose first permit is free and whose next 6,000/(1 + c) cost the warm-up
/// period.) Two of Guava's defects are avoided: a zero warm-up is exactly a
/// [`TokenBucket`] of the same quota (Guava #2730: a zero warm-up there
/// disabled the limit), and under full demand the stable rate is reached
/// exactly at the end of the warm-up period and kept (Guava #3552: there it
/// could be missed).
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, ManualClock, Quota, RateLimiter, WarmUp};
///
/// let clock = ManualClock::new();
/// // 1 per 100 ms when warm, a burst of 1; cold, a third of that; warm after
/// // 1.2 s below capacity.
/// let quota = Quota::new(1, 1, Duration::from_millis(100))?;
/// let warm_up = WarmUp::new(quota, Duration::from_millis(1_200), 3.0)?;
/// let limiter = RateLimiter::from_parts(warm_up, clock.clone());
///
/// // Under full demand: one request every 100 ms.
/// let mut admitted = Vec::new();
/// for _ in 0..=16 {
///     admitted.push(u8::from(limiter.try_acquire().is_allowed()));
///     clock.advance(Duration::from_millis(100));
/// }
/// // The full bucket's one permit, then periods 1 to 12 refill ⌊B(j)⌋ (below)
/// // = 8 permits, not 12; from the end of the warm-up on, one every period.
/// assert_eq!(admitted, [1, 0, 0, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
///
/// // Idle (full) for the warm-up period and one fill: cold again, as fresh.
/// clock.advance(warm_up.fresh_after_idle());
/// assert!(limiter.try_acquire().is_allowed());
/// clock.advance(Duration::from_millis(100));
/// assert!(limiter.try_acquire().is_denied());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Semantics
///
/// The bucket is the [`TokenBucket`] of the same quota (capacity `C`, `A`
/// tokens every period `P`, all-or-nothing requests, exact waits, the
/// fraction of a period kept while the bucket is below capacity and dropped
/// when it is full), with a *heat* `h`, a whole number of periods from 0
/// (cold) to `N`, the warm-up period in periods (rounded up to whole
/// periods). With the cold factor `c`:
///
/// ```text
/// B(j) = (2·N·j + (c - 1)·j²) / (2·c·N)    for 0 <= j <= N
/// B(j) = B(N) + (j - N)                    for j >= N
/// ```
///
/// - **Warming.** Each whole period that ends while the bucket is below
///   capacity raises the heat from `h` to `h + 1` and refills
///   `A · (⌊B(h + 1)⌋ - ⌊B(h)⌋)` tokens: 0 or `A`. `B` is the integral of a
///   rate that rises linearly in the heat from `1 / c` batch per period at
///   heat 0 to 1 at heat `N` (Guava's `SmoothWarmingUp` makes the cost per
///   permit linear instead, in the permits stored: another curve, compared
///   above); from heat `N` on, every period refills `A`, the quota's rate.
///   The heat stops at `N`.
/// - **From cold, under full demand** (the bucket drained and kept below
///   capacity), the permits admitted in the first `j` periods are
///   `C + A · ⌊B(j)⌋`: `C + A · ⌊N · (1 + c) / (2c)⌋` by the end of the
///   warm-up (the refills two thirds of the stable rate's `A · N` for
///   `c = 3`), and exactly `A` in every period after it.
/// - **Cooling.** Each whole period that passes while the bucket is full
///   lowers the heat by one (to no less than 0); the fraction is dropped,
///   as the grid is. A full bucket at heat 0 is fresh: a bucket left idle
///   for [`fresh_after_idle`](Algorithm::fresh_after_idle) (at most the cold
///   fill time plus the warm-up period) is cold again. That is also what a
///   swept key of a [`KeyedLimiter`](crate::KeyedLimiter) is: the keyed
///   limiter sweeps only fresh-equivalent words, and a swept key comes back
///   fresh, which is cold.
/// - **A fresh bucket** is full and cold: it admits a burst of `C`, then
///   refills at the cold rate.
/// - **A warm-up of zero** is the [`TokenBucket`] of the same quota, word
///   for word: never "no limit".
///
/// With `c = 1` the heat changes nothing: `B(j) = j` and the bucket is its
/// quota's token bucket (with a heat field that is never read). The cold
/// factor is taken to the nearest thousandth.
///
/// # The packed word
///
/// | bits | field | contents |
/// |---|---|---|
/// | `63 ..= 64-w` | tokens | `0 ..= C`, as in the token bucket (`w` = bits of `C`) |
/// | `63-w ..= 64-w-v` | heat | `0 ..= N` periods (`v` = bits of `N`) |
/// | `63-w-v ..= 0` | time | last refill time in the quota's [time units](Quota::time_unit), modulo `2^(64-w-v)` |
///
/// The time field keeps at least 40 bits, so `w + v <= 24`
/// ([`WarmUpError::WarmUpTooLong`] names the longest warm-up a capacity
/// allows): a capacity of 100 (7 bits) warms up over at most 131,071
/// periods. The cold fill time plus the warm-up period must be within half
/// the time field's span, at least `2^39` units (6.4 days at 1 µs)
/// ([`WarmUpError::ColdFillTooLong`]): a word idle that long is fresh.
///
/// An elapsed time is read forwards up to the span less a stretch *behind*:
/// the larger of that idle time and `2^32` units (71.6 minutes at 1 µs), at
/// most half the span. A reading behind the stored time by less than the
/// stretch refills nothing, cools nothing and never moves the time back, as
/// in the token bucket; one further back is taken as a reading after a long
/// idle, and finds the bucket fresh (a clock set back that far, which
/// [`RealClock`](crate::RealClock) and the other clocks of the crate never
/// are, refills it: [`Clock`](crate::Clock#readings-years-off)). So a word
/// idle any time up to the span less the stretch (12.7 days less 71.6 minutes,
/// at 40 bits) is read exactly, and comes back fresh. One idle longer is read
/// modulo the span: within the stretch below a multiple of it as behind
/// (nothing refills or cools until the clock comes round), within the idle
/// time above one as a shorter idle. Either way the word is read as it was
/// left, aged only by that shorter reading, not as fresh: a word left below
/// capacity is short of a fresh bucket's tokens for at most the stretch and
/// one cold fill, and a word left warm can come back warm instead of cold (a
/// word idle the span and `δ`, for `δ` below the idle time, is read as one
/// idle `δ`), refilling faster than the fresh, cold bucket it should be and
/// so able to admit more than that bucket would; never more than the stable
/// quota allows, since no heat refills faster than the quota's token bucket.
///
/// # Refunds
///
/// A refund is exact when the word is still the one the admission wrote and
/// giving the permits back leaves the bucket below capacity (that word is
/// the refilled one the admission found, less its permits), or fills it at
/// heat 0 (fresh-equivalent either way, from the admission on). Otherwise, and
/// whenever the time field is narrower than 47 bits (too narrow to
/// recognize a word across the refund horizon), it declines (the permits
/// stay spent). A warm-up bucket does not lend: it has no `reserve_n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WarmUp {
    /// The stable bucket: the whole algorithm when `periods == 0`.
    bucket: TokenBucket,
    /// `N`: the warm-up period in whole periods, rounded up; 0 for none.
    periods: u64,
    /// The cold factor in thousandths, `1_000 ..= 1_000_000`.
    cold: u64,
    /// Tokens at the top, time at the bottom (`time_mask`); the heat between.
    layout: Layout,
    /// The shift of the heat field: the width of the time field.
    heat_shift: u32,
    /// The heat field's bits, shifted down.
    heat_mask: u64,
    /// The heat field's bits in place.
    heat_bits: u64,
    /// `N` in place in the heat field: a word whose heat bits compare at
    /// least this high is warm, read without shifting.
    warm_bits: u64,
    /// Whether `ramp_numerator(N)` and `⌊B(N)⌋·den` fit in 64 bits, so that
    /// the ramp is computed in machine words.
    narrow: bool,
    capacity: u64,
    amount: NonZeroU64,
    /// In time units, at least 1.
    period: NonZeroU64,
    half: u64,
    /// Elapsed times below this are read forwards, the rest as readings
    /// behind the stored time: `half` with no warm-up (the token bucket's
    /// rule, word for word), else the span less the larger of the cold fill
    /// plus the warm-up and [`BEHIND_FLOOR`] units, that at most `half`.
    forward: u64,
    /// `forward - period`, as the token bucket's `half - period`.
    refill_window: u64,
    /// `⌊B(N)⌋`.
    ramp: u64,
    /// `2·c·N`, `c` in thousandths: the denominator of `B` (1 when
    /// `N = 0`, where no ramp is read).
    den: NonZeroU64,
    /// `c - s` (`s` = 1,000): the ramp numerator's `j²` coefficient.
    quad: u64,
    /// `2·s·N`: the ramp numerator's `j` coefficient.
    lin: u64,
    /// `⌈c⌉`.
    cold_ceil: u64,
    /// Periods to fill an empty cold bucket.
    cold_fill: u64,
    /// Whether the time field is wide enough for exact refunds.
    refunds: bool,
}

/// Why a [`WarmUp`] could not be built.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum WarmUpError {
    /// The cold factor was below 1, above 1,000, or not a number.
    ColdFactor {
        /// The cold factor asked for.
        cold_factor: f64,
    },
    /// The warm-up period, in whole periods, needs more bits than the word
    /// has beside the capacity's tokens and a 40-bit time field.
    WarmUpTooLong {
        /// The warm-up period asked for.
        warm_up: Duration,
        /// The longest warm-up period this quota allows: zero when the
        /// capacity leaves no room for one (a capacity of 2^23, 8,388,608,
        /// or more), whatever the refill period.
        max: Duration,
    },
    /// Filling an empty cold bucket and cooling it from warm takes longer
    /// than half the word's time span: an idle word could not be read
    /// exactly until it is fresh again.
    ColdFillTooLong {
        /// The cold fill time plus the warm-up period.
        idle: Duration,
        /// Half the time field's span.
        max: Duration,
    },
}

impl fmt::Display for WarmUpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WarmUpError::ColdFactor { cold_factor } => write!(
                f,
                "a cold factor of {cold_factor} is out of range; it must be a number from 1 \
                 (no warm-up) to 1000 (a cold bucket refills at 1/1000 of the stable rate)"
            ),
            WarmUpError::WarmUpTooLong { warm_up, max } if max.is_zero() => write!(
                f,
                "a warm-up period of {warm_up:?} does not fit this quota at any refill period: \
                 a capacity of 8388608 (2^23) or more leaves the packed word no bits for a \
                 warm-up; lower the capacity below 8388608 (a capacity of w bits leaves \
                 24 - w bits for the warm-up, counted in refill periods), or use a warm-up of \
                 zero (the token bucket of the quota)"
            ),
            WarmUpError::WarmUpTooLong { warm_up, max } => write!(
                f,
                "a warm-up period of {warm_up:?} is too long for this quota: the packed word \
                 holds a warm-up of at most {max:?} beside its capacity; shorten the warm-up, \
                 lengthen the refill period, or lower the capacity"
            ),
            WarmUpError::ColdFillTooLong { idle, max } => write!(
                f,
                "filling an empty cold bucket and cooling it takes {idle:?}, longer than the \
                 packed word measures exactly ({max:?}); lower the cold factor, shorten the \
                 warm-up, or raise the refill amount"
            ),
        }
    }
}

impl core::error::Error for WarmUpError {}

/// `x` rounded to the nearest whole number, halves away from zero: `f64::round`
/// for `0 <= x < 2^52`, without `std` (which `f64::round` needs).
fn round_positive(x: f64) -> u64 {
    let whole = x as u64;
    // Exact: `whole <= x < whole + 1`, both below 2^52, so the difference is
    // a float of `x`'s own precision.
    if x - whole as f64 >= 0.5 {
        whole.saturating_add(1)
    } else {
        whole
    }
}

/// The bits `x` needs.
const fn bits(x: u64) -> u32 {
    u64::BITS - x.leading_zeros()
}

impl WarmUp {
    /// A bucket of `quota` that warms up over `warm_up` (rounded up to whole
    /// refill periods) from a cold rate of `1 / cold_factor` of the quota's.
    /// Guava's default cold factor is 3.
    ///
    /// # Errors
    ///
    /// [`WarmUpError::ColdFactor`] outside `1 ..= 1000` (or NaN);
    /// [`WarmUpError::WarmUpTooLong`] when the word has too few bits for the
    /// warm-up beside the capacity ([the word](WarmUp#the-packed-word));
    /// [`WarmUpError::ColdFillTooLong`] when the cold fill time plus the
    /// warm-up exceeds half the time field's span.
    pub fn new(quota: Quota, warm_up: Duration, cold_factor: f64) -> Result<WarmUp, WarmUpError> {
        if !(1.0..=MAX_COLD_FACTOR).contains(&cold_factor) {
            return Err(WarmUpError::ColdFactor { cold_factor });
        }
        // In range: 1_000 ..= 1_000_000.
        let cold = round_positive(cold_factor * COLD_SCALE as f64);
        let bucket = TokenBucket::new(quota);
        let plain = Layout::for_capacity(quota.capacity());
        let unit_micros = plain.unit_micros();
        let period_micros = quota.period_micros();
        let period = period_micros >> plain.unit_shift;
        let token_bits = u64::BITS - plain.time_bits;
        // The most heat bits the word has room for, and so the longest warm-up.
        let room = (u64::BITS - MIN_TIME_BITS).saturating_sub(token_bits);
        let max_periods = (1u64 << room) - 1;
        let max = Duration::from_micros(max_periods.saturating_mul(period_micros));
        let periods = warm_up
            .as_nanos()
            .div_ceil(u128::from(period_micros) * 1_000);
        let periods = match u64::try_from(periods) {
            Ok(n) if n <= max_periods => n,
            _ => return Err(WarmUpError::WarmUpTooLong { warm_up, max }),
        };
        let time_bits = plain.time_bits - bits(periods);
        let layout = Layout {
            time_bits: plain.time_bits,
            time_mask: u64::MAX >> (u64::BITS - time_bits),
            unit_shift: plain.unit_shift,
        };
        let mut w = WarmUp {
            bucket,
            periods,
            cold,
            layout,
            heat_shift: time_bits,
            heat_mask: (1 << bits(periods)) - 1,
            heat_bits: ((1 << bits(periods)) - 1) << time_bits,
            warm_bits: periods << time_bits,
            // `2·N²·(c + s) < 2^64` bounds both; `N < 2^24` and `c <= 2^20`
            // keep the product itself below 2^70.
            narrow: 2 * u128::from(periods) * u128::from(periods) * u128::from(cold + COLD_SCALE)
                <= u128::from(u64::MAX),
            capacity: u64::from(quota.capacity()),
            amount: NonZeroU64::new(u64::from(quota.amount())).unwrap_or(NonZeroU64::MIN),
            period: NonZeroU64::new(period).unwrap_or(NonZeroU64::MIN),
            half: layout.half_range(),
            forward: layout.half_range(),
            // Saturating: the heat bits can leave a half range shorter than
            // the period, a warm-up refused below (`ColdFillTooLong`) before
            // this is read; subtracted, it overflowed first (a panic in a
            // debug build).
            refill_window: layout.half_range().saturating_sub(period.max(1)),
            ramp: 0,
            // Below 2^1 * 2^20 * 2^24.
            den: NonZeroU64::new(2 * cold * periods).unwrap_or(NonZeroU64::MIN),
            quad: cold - COLD_SCALE,
            lin: 2 * COLD_SCALE * periods,
            cold_ceil: cold.div_ceil(COLD_SCALE),
            cold_fill: 0,
            refunds: time_bits >= REFUND_TIME_BITS,
        };
        if periods == 0 {
            return Ok(w);
        }
        w.ramp = w.ramp_batches(periods);
        w.cold_fill = w.periods_for(0, w.capacity.div_ceil(w.amount.get()));
        let idle = (w.cold_fill + periods).saturating_mul(w.period.get());
        if idle > w.half {
            return Err(WarmUpError::ColdFillTooLong {
                idle: Duration::from_micros(idle.saturating_mul(unit_micros)),
                max: Duration::from_micros(w.half.saturating_mul(unit_micros)),
            });
        }
        // A word idle for `idle` is fresh, however much longer: read an
        // elapsed time forwards up to the span less a short stretch behind,
        // so that a word idle past half the span (6.4 days at 40 bits) is
        // taken as fresh, not as a reading behind it that refills nothing
        // until the clock comes round (days of denials).
        let behind = idle.max(BEHIND_FLOOR).min(w.half);
        w.forward = 2 * w.half - behind;
        w.refill_window = w.forward - w.period.get();
        Ok(w)
    }

    /// The stable quota.
    pub const fn quota(&self) -> Quota {
        self.bucket.quota()
    }

    /// The warm-up period as counted: whole refill periods, rounded up.
    pub const fn warm_up(&self) -> Duration {
        Duration::from_micros(self.periods * self.quota().period_micros())
    }

    /// The cold factor, to the thousandth.
    pub fn cold_factor(&self) -> f64 {
        self.cold as f64 / COLD_SCALE as f64
    }

    /// `2·s·N·j + (c - s)·j²` with `c` the cold factor in thousandths and
    /// `s` = 1,000: `B(j)` times `2·c·N` (`self.den`), for `j <= N`. Below
    /// 2^24 periods and a cold factor below 2^20 thousandths it stays below
    /// 2^70.
    #[inline(always)]
    fn ramp_numerator(&self, j: u64) -> u128 {
        if self.narrow {
            // `j <= N`: within the bound the constructor checked.
            return u128::from(self.ramp_narrow(j));
        }
        let (n, j) = (u128::from(self.periods), u128::from(j));
        let s = u128::from(COLD_SCALE);
        2 * s * n * j + u128::from(self.cold - COLD_SCALE) * j * j
    }

    /// [`ramp_numerator`](Self::ramp_numerator) in machine words, for a
    /// narrow ramp (`self.narrow`) and `j <= N`: `(c - s)·j² + 2·s·N·j`, at
    /// most `ramp_numerator(N)`, which the constructor checked fits.
    #[inline(always)]
    const fn ramp_narrow(&self, j: u64) -> u64 {
        (self.quad * j + self.lin) * j
    }

    /// `⌊B(j)⌋` for `j <= N` (`N >= 1`): at most `j`.
    #[inline]
    fn ramp_batches(&self, j: u64) -> u64 {
        let num = self.ramp_numerator(j);
        // One machine division when the numerator fits in 64 bits, as it
        // does for every warm-up below 2^16 periods at a cold factor below 16.
        match u64::try_from(num) {
            Ok(num) => num / self.den,
            Err(_) => (num / u128::from(self.den.get())) as u64,
        }
    }

    /// `⌊B(x)⌋` for any `x`.
    #[inline]
    fn batches(&self, x: u64) -> u64 {
        if x <= self.periods {
            self.ramp_batches(x)
        } else {
            self.ramp + (x - self.periods)
        }
    }

    /// The fewest periods `j >= 1` after which a bucket warming from heat
    /// `heat` has refilled `m >= 1` batches: `⌊B(heat + j)⌋ - ⌊B(heat)⌋ >= m`.
    ///
    /// On a narrow ramp below the top, in machine words: the answer is
    /// bracketed by `[heat + m, heat + m·⌈c⌉]` (the rate is between `1/c`
    /// and 1 batch a period), which a bisection narrows. A wide bracket is
    /// first cut by a tangent: the ramp numerator `f(x) = (c - s)·x² +
    /// 2·s·N·x` is convex, so its tangent at `heat + m` reaches the goal no
    /// later than `f` does, and one division gives an upper bound that is
    /// usually the answer or one past it. (The exact inverse would need a
    /// square root.)
    #[inline(never)]
    fn periods_for(&self, heat: u64, m: u64) -> u64 {
        if heat >= self.periods {
            return self.periods_search(heat, m);
        }
        self.periods_warming(heat, m)
    }

    /// [`periods_for`](Self::periods_for) below the top (`heat < N`), as a
    /// denial on a warming bucket needs it. Out of line, so that it keeps
    /// the registers of the decisions on a warm bucket free.
    #[inline(never)]
    fn periods_warming(&self, heat: u64, m: u64) -> u64 {
        if !self.narrow {
            return self.periods_search(heat, m);
        }
        // `f(heat) / den = ⌊B(heat)⌋ <= heat < 2^24` and `m < 2^33` (`n`
        // is a `u32`): no overflow.
        let target = self.ramp_narrow(heat) / self.den + m;
        if target > self.ramp {
            // Past the ramp, one batch a period.
            return self.periods + (target - self.ramp) - heat;
        }
        // `target <= ⌊B(N)⌋`: the goal is at most `f(N)`, and `⌊B⌋` rises by
        // at most one a period, so the answer `x` is in `[heat + m, N]`.
        let goal = target * self.den.get();
        let lo = heat + m;
        let at = self.ramp_narrow(lo);
        if at >= goal {
            return m;
        }
        // `m·(⌈c⌉ - 1) < 2^33 · 2^10`: no overflow.
        let span = m * (self.cold_ceil - 1);
        let mut hi = (lo + span).min(self.periods);
        if span > TANGENT_SPAN {
            // The tangent at `lo`, `f(lo) + f'(lo)·(x - lo)`, lies below `f`
            // (convex), so where it reaches the goal `f` has: `f(x) >= goal`.
            // `f'(lo) >= 2·s·N > 0`; both within `f(N)`'s bound.
            let slope = 2 * self.quad * lo + self.lin;
            hi = hi.min(lo + (goal - at).div_ceil(slope));
        }
        let mut lo = lo + 1;
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.ramp_narrow(mid) >= goal {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo - heat
    }

    /// [`periods_for`](Self::periods_for) by bisection over the whole
    /// bracket, in `u128` where the ramp needs it: for a wide ramp, and past
    /// the top. Out of line, so that the narrow path saves few registers.
    #[inline(never)]
    fn periods_search(&self, heat: u64, m: u64) -> u64 {
        let target = self.batches(heat).saturating_add(m);
        if heat < self.periods && target <= self.ramp {
            // Within the ramp: the smallest `x` in `(heat, N]` with
            // `⌊B(x)⌋ >= target`, that is `B(x)·den >= target·den`. `⌊B⌋`
            // never falls and rises by at most one a period, and by at least
            // one every `⌈c⌉` periods (the rate is at least `1/c`): `x` is
            // within `[heat + m, heat + m·⌈c⌉]`.
            // `target <= ⌊B(N)⌋`: the goal is at most `ramp_numerator(N)`.
            let goal = u128::from(target) * u128::from(self.den.get());
            let (mut lo, mut hi) = (
                heat + m,
                self.periods
                    .min(heat.saturating_add(m.saturating_mul(self.cold_ceil))),
            );
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if self.ramp_numerator(mid) >= goal {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            return lo - heat;
        }
        // Past the ramp, one batch a period.
        let x = self
            .periods
            .max(heat)
            .saturating_add(target - self.batches(self.periods.max(heat)));
        x - heat
    }

    #[inline(always)]
    const fn heat(&self, word: u64) -> u64 {
        (word >> self.heat_shift) & self.heat_mask
    }

    #[inline(always)]
    const fn pack(&self, tokens: u64, heat: u64, time: u64) -> u64 {
        self.layout.pack(tokens, time) | (heat << self.heat_shift)
    }

    /// The bucket in `word` as of time `now` (units, wrapped).
    #[inline(always)]
    fn level(&self, word: u64, now: u64) -> Level {
        let tokens = self.layout.tokens(word);
        let last = self.layout.time(word);
        let elapsed = self.layout.wrap(now.wrapping_sub(last));
        if tokens < self.capacity && elapsed.wrapping_sub(self.period.get()) >= self.refill_window {
            // Not a whole period yet, or a reading behind the stored time.
            // (First: the path of every admission within a period, which
            // reads no heat.)
            return Level::AsStored { tokens, last };
        }
        let heat = self.heat(word);
        if tokens >= self.capacity {
            // Full: cools a degree each whole period; the fraction is
            // dropped. Behind the stored time nothing changes (a fresh word,
            // time 0, takes any reading, as the token bucket's does).
            let forward = elapsed < self.forward;
            let heat = if forward {
                heat.saturating_sub(elapsed / self.period)
            } else {
                heat
            };
            let base = if forward || last == 0 { now } else { last };
            return Level::Refilled {
                tokens: self.capacity,
                heat,
                base,
            };
        }
        let periods = elapsed / self.period;
        let need = (self.capacity - tokens).div_ceil(self.amount.get());
        let batches = self.batches(heat + periods) - self.batches(heat);
        if batches >= need {
            // Full after `j` periods, at heat `heat + j` (at most N); it
            // cools for the whole periods left.
            let j = self.periods_for(heat, need);
            let hot = (heat + j).min(self.periods.max(heat));
            return Level::Refilled {
                tokens: self.capacity,
                heat: hot.saturating_sub(periods - j),
                base: now,
            };
        }
        Level::Refilled {
            tokens: tokens + batches * self.amount.get(),
            heat: (heat + periods).min(self.periods.max(heat)),
            base: last.wrapping_add(periods * self.period.get()),
        }
    }

    /// Whether the heat field of `word` is at the top (`N`): compared in
    /// place, without shifting it down.
    #[inline(always)]
    const fn is_warm(&self, word: u64) -> bool {
        word & self.heat_bits >= self.warm_bits
    }

    /// [`decide`](Algorithm::decide), with the denial's wait worked out
    /// when `WAIT` (else a denial says 0: see `decide_untimed`).
    #[inline(always)]
    fn decide_as<const WAIT: bool>(&self, word: u64, now: u64, n: u32) -> (Decision, Option<u64>) {
        // No dispatch to the token bucket for `N = 0`: with no heat bits
        // every word is warm and the steps below are the token bucket's.
        let t = self.layout.time_of(now);
        let n = u64::from(n);
        let untimed = || {
            (
                Decision::Denied {
                    retry_after: RetryAfter::from_nanos(0),
                },
                None,
            )
        };
        // `remaining <= capacity <= u32::MAX` in both arms.
        match self.level(word, t) {
            Level::AsStored { tokens, last } => {
                if tokens < n {
                    if !WAIT {
                        return untimed();
                    }
                    return self.deny(tokens, self.is_warm(word), self.heat(word), last, now, n);
                }
                let remaining = (tokens - n) as u32;
                (
                    Decision::Allowed { remaining },
                    Some(self.layout.spend(word, n)),
                )
            }
            Level::Refilled { tokens, heat, base } => {
                if tokens < n {
                    if !WAIT {
                        return untimed();
                    }
                    return self.deny(tokens, heat >= self.periods, heat, base, now, n);
                }
                let remaining = (tokens - n) as u32;
                (
                    Decision::Allowed { remaining },
                    Some(self.pack(tokens - n, heat, base)),
                )
            }
        }
    }

    /// A denial: `available < n` tokens, refilled at `base`, at heat `heat`
    /// (read only when `warm` is false).
    #[inline(always)]
    fn deny(
        &self,
        available: u64,
        warm: bool,
        heat: u64,
        base: u64,
        now_ns: u64,
        n: u64,
    ) -> (Decision, Option<u64>) {
        // `available < n`, both below 2^32: no overflow, `missing >= 1`.
        let missing = n - available;
        let missing = if self.amount.get() == 1 {
            missing
        } else {
            (missing + self.amount.get() - 1) / self.amount
        };
        let periods = if warm {
            // Warm: one batch a period, as the token bucket.
            missing
        } else {
            // Warming: the ramp inverted.
            self.periods_warming(heat, missing)
        };
        let refill = periods.saturating_mul(self.period.get()).min(self.half);
        let now = self.layout.time_of(now_ns);
        let ahead = self
            .layout
            .wrap(base.wrapping_add(refill).wrapping_sub(now));
        let ahead = if ahead == 0 { self.half * 2 } else { ahead };
        let wait = self.layout.nanos_until(ahead, now_ns);
        (
            Decision::Denied {
                retry_after: RetryAfter::from_nanos(wait),
            },
            None,
        )
    }
}

/// A bucket's tokens and heat at some reading, and whether the word already
/// says so.
#[derive(Clone, Copy, Debug)]
enum Level {
    /// No refill is due: the word's fields stand.
    AsStored { tokens: u64, last: u64 },
    /// Refilled (or full, or cooled) as of `base`.
    Refilled { tokens: u64, heat: u64, base: u64 },
}

impl Level {
    #[inline(always)]
    fn tokens(self) -> u64 {
        match self {
            Level::AsStored { tokens, .. } | Level::Refilled { tokens, .. } => tokens,
        }
    }
}

impl Algorithm for WarmUp {
    #[inline]
    fn fresh(&self) -> u64 {
        if self.periods == 0 {
            return self.bucket.fresh();
        }
        // Full and cold; time is irrelevant in a full bucket at heat 0.
        self.pack(self.capacity, 0, 0)
    }

    #[inline]
    fn capacity(&self) -> u32 {
        self.bucket.capacity()
    }

    #[inline(always)]
    fn decide(&self, word: u64, now: u64, n: u32) -> (Decision, Option<u64>) {
        self.decide_as::<true>(word, now, n)
    }

    /// Without the denial's wait: a denial on a warming bucket skips the
    /// ramp's inversion (out of line, so the compiler cannot drop it unused),
    /// and `check` denies a cold bucket at a warm one's cost.
    #[inline(always)]
    fn decide_untimed(&self, word: u64, now: u64, n: u32) -> (Decision, Option<u64>) {
        self.decide_as::<false>(word, now, n)
    }

    #[inline]
    fn remaining(&self, word: u64, now: u64) -> u32 {
        if self.periods == 0 {
            return self.bucket.remaining(word, now);
        }
        // `<= capacity <= u32::MAX`
        self.level(word, self.layout.time_of(now)).tokens() as u32
    }

    #[inline]
    fn refund(&self, word: u64, written: u64, n: u32) -> Option<u64> {
        if self.periods == 0 {
            return self.bucket.refund(word, written, n);
        }
        // The word the admission wrote is the refilled bucket it found, less
        // `n`; with them back, and the bucket still below capacity (no grid
        // restarted, no cooling skipped), it is the word the bucket would
        // have without the admission. Anything else: keep them spent.
        let n = u64::from(n);
        let (tokens, heat) = (self.layout.tokens(word), self.heat(word));
        if !self.refunds || word != written {
            return None;
        }
        if tokens.saturating_add(n) < self.capacity {
            return Some(self.pack(tokens + n, heat, self.layout.time(word)));
        }
        // Full again. At heat 0 the bucket is fresh-equivalent from the
        // admission's reading on, with it or without it; warmer, the
        // admission dropped a fraction of a period of cooling, which the
        // permits back would turn into warmth.
        (heat == 0).then(|| self.pack(self.capacity, 0, self.layout.time(word)))
    }

    #[inline]
    fn is_fresh_equivalent(&self, word: u64, now: u64) -> bool {
        if self.periods == 0 {
            return self.bucket.is_fresh_equivalent(word, now);
        }
        matches!(
            self.level(word, self.layout.time_of(now)),
            Level::Refilled { tokens, heat: 0, .. } if tokens == self.capacity
        )
    }

    fn fresh_after_idle(&self) -> Duration {
        if self.periods == 0 {
            return self.bucket.fresh_after_idle();
        }
        // Filling from empty is slowest cold; a full bucket is at most N
        // degrees warm. Within half the span by the constructor.
        let units = (self.cold_fill + self.periods) * self.period.get();
        Duration::from_micros(units << self.layout.unit_shift)
    }

    fn advertise(&self) -> Option<(u32, Duration)> {
        if self.periods == 0 {
            return self.bucket.advertise();
        }
        // An emptied bucket has its capacity again after the cold fill at
        // most (a warmer one fills sooner).
        let units = self.cold_fill * self.period.get();
        Some((
            self.bucket.capacity(),
            Duration::from_micros(units << self.layout.unit_shift),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_positive_is_f64_round() {
        let mut xs = vec![0.0, 0.5, 1.5, 2.5, 0.49999999999999994, 1000.0, 1_000_000.0];
        for k in 0..=4_000u32 {
            // Every cold factor to a ten-thousandth from 1 to 1.4, scaled as
            // `new` scales it, and each half-way point.
            let cold = 1.0 + f64::from(k) / 10_000.0;
            xs.push(cold * COLD_SCALE as f64);
            xs.push(f64::from(k) + 0.5);
            xs.push(f64::from(k) * 250.0 + 0.499_999_999);
        }
        for x in xs {
            assert_eq!(round_positive(x), x.round() as u64, "{x}");
        }
    }

    fn warm(c: u32, a: u32, period_ms: u64, periods: u64, cold: f64) -> WarmUp {
        let quota = Quota::new(c, a, Duration::from_millis(period_ms)).unwrap();
        WarmUp::new(quota, Duration::from_millis(period_ms * periods), cold).unwrap()
    }

    #[test]
    fn the_ramp_is_the_integral_of_a_linear_rate() {
        for cold in [1.0, 1.5, 2.0, 3.0, 7.25, 1_000.0] {
            for n in [1, 2, 3, 10, 12, 1_000] {
                let w = warm(5, 1, 10, n, cold);
                let c = cold;
                let nf = n as f64;
                let mut last = 0;
                for j in 0..=n + 5 {
                    let b = w.batches(j);
                    let exact = if j <= n {
                        let j = j as f64;
                        (2.0 * nf * j + (c - 1.0) * j * j) / (2.0 * c * nf)
                    } else {
                        (nf * (1.0 + c)) / (2.0 * c) + (j - n) as f64
                    };
                    assert!(
                        (b as f64 - exact.floor()).abs() <= 1.0 && b as f64 <= exact + 1e-9,
                        "cold {cold}, N {n}, j {j}: {b} against {exact}"
                    );
                    assert!(b == last || b == last + 1, "0 or 1 batch a period");
                    last = b;
                }
                // Past the ramp, every period refills one batch.
                assert_eq!(w.batches(n + 1), w.batches(n) + 1);
                for heat in 0..=n {
                    for m in 1..=5 {
                        let j = w.periods_for(heat, m);
                        assert!(w.batches(heat + j) - w.batches(heat) >= m);
                        assert!(w.batches(heat + j - 1) - w.batches(heat) < m);
                    }
                }
            }
        }
    }

    #[test]
    fn the_tangent_step_finds_what_the_bisection_finds() {
        for cold in [1.0, 1.001, 1.5, 2.0, 3.0, 7.25, 64.0, 999.999, 1_000.0] {
            for n in [1, 2, 3, 4, 7, 12, 100, 1_001] {
                let w = warm(5, 1, 10, n, cold);
                assert!(w.narrow);
                let heats = (0..=n.min(40)).chain([n / 2, n.saturating_sub(1), n]);
                for heat in heats {
                    for m in (1..=30).chain([n / 3 + 1, n, 2 * n + 5]) {
                        assert_eq!(
                            w.periods_for(heat, m),
                            w.periods_search(heat, m),
                            "cold {cold}, N {n}, heat {heat}, m {m}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_ramp_too_wide_for_machine_words_is_computed_in_u128() {
        let quota = Quota::new(1, 1, Duration::from_millis(1)).unwrap();
        let n = (1u64 << 23) - 1;
        let w = WarmUp::new(quota, Duration::from_millis(n), 1_000.0).unwrap();
        assert!(!w.narrow);
        let exact = |j: u64| {
            let (n, j) = (u128::from(n), u128::from(j));
            ((2_000 * n * j + 999_000 * j * j) / (2_000_000 * n)) as u64
        };
        for j in [0, 1, 1_000, n / 2, n - 1, n] {
            assert_eq!(w.batches(j), exact(j), "j = {j}");
        }
        for heat in [0, 1, n / 3, n - 2] {
            let j = w.periods_for(heat, 1);
            assert!(w.batches(heat + j) > w.batches(heat));
            assert_eq!(w.batches(heat + j - 1), w.batches(heat));
        }
        assert!(warm(1, 1, 1, 1_000, 3.0).narrow);
    }

    #[test]
    fn the_word_keeps_its_fields_apart() {
        let w = warm(100, 1, 10, 6_000, 3.0);
        assert_eq!(w.heat_shift, 64 - 7 - 13);
        for (tokens, heat, time) in [(0, 0, 0), (100, 6_000, w.layout.time_mask), (37, 1, 5)] {
            let word = w.pack(tokens, heat, time);
            assert_eq!(w.layout.tokens(word), tokens);
            assert_eq!(w.heat(word), heat);
            assert_eq!(w.layout.time(word), time);
            if tokens > 0 {
                let spent = w.layout.spend(word, 1);
                assert_eq!((w.heat(spent), w.layout.time(spent)), (heat, time));
            }
        }
        // No refunds with a 44-bit time field; with 47 and more, yes.
        assert!(!w.refunds);
        assert!(warm(100, 1, 10, 60, 3.0).refunds);
    }
}
