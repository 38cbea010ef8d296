//! The token bucket as a pure function on one 64-bit word.

use crate::algorithm::Algorithm;
use crate::decision::{Decision, RetryAfter};
use crate::error::QuotaError;
use crate::quota::{Quota, fill_time};
use crate::word::Layout;

use core::num::NonZeroU64;
use core::time::Duration;

/// `n` as a `NonZeroU64`; validated quotas never pass 0, which would map to 1.
const fn non_zero(n: u64) -> NonZeroU64 {
    match NonZeroU64::new(n) {
        Some(n) => n,
        None => NonZeroU64::MIN,
    }
}

/// The token bucket of the rate-limiter pattern's `TokenBucketLimiter`, as a
/// pure function on a word: no atomics, no clock.
/// [`RateLimiter`](crate::RateLimiter) runs it in a compare-and-swap cell.
///
/// # Semantics
///
/// - A bucket starts full.
/// - On each request it refills `amount` tokens for every whole `period` elapsed
///   since the last refill. While the bucket is not full the fraction of a period
///   is kept (the next refill time stays on the period grid); when it is full the
///   fraction is dropped (the grid restarts at this request).
/// - A request for `n` permits is all or nothing. A denial takes nothing, writes
///   nothing, and reports the exact wait until `n` tokens will be there.
///
/// # The packed word
///
/// | bits | field | contents |
/// |---|---|---|
/// | `63 ..= 64-w` | tokens | tokens in the bucket at the last refill, `0 ..= capacity` |
/// | `63-w ..= 0` | time | last refill time in whole time units of the clock, modulo `2^(64-w)` |
///
/// `w` is the number of bits the capacity needs (1 to 32), so the largest
/// capacity is `u32::MAX` and the time field is 32 to 63 bits wide. The time unit
/// is 1 µs up to 16 token bits (capacity 65,535) and doubles with each bit beyond,
/// so the field always spans at least `2^48` µs (8.9 years); a period must be a
/// whole number of units ([`Quota::time_unit`]).
///
/// | capacity up to | token bits | time unit | time field span | half span (exact idle) |
/// |---|---|---|---|---|
/// | 1 | 1 | 1 µs | 2^63 µs ≈ 292,000 years | ≈ 146,000 years |
/// | 1,023 | 10 | 1 µs | 2^54 µs ≈ 571 years | ≈ 285 years |
/// | 65,535 | 16 | 1 µs | 2^48 µs ≈ 8.9 years | ≈ 4.46 years |
/// | 1,048,575 | 20 | 16 µs | 2^48 µs | ≈ 4.46 years |
/// | 16,777,215 | 24 | 256 µs | 2^48 µs | ≈ 4.46 years |
/// | 4,294,967,295 | 32 | 65,536 µs | 2^48 µs | ≈ 4.46 years |
///
/// Time is compared with wrapping arithmetic. An elapsed time
/// `e = (now - time) mod 2^(64-w)` is read forwards when it is below half the span
/// and as a reading *behind* the stored time otherwise. A quota whose fill time
/// (`ceil(capacity / amount) * period`) exceeds half the span is refused
/// ([`QuotaError::FillTimeTooLong`](crate::QuotaError)), so a forward reading can
/// always tell a full bucket.
///
/// **Clocks that go backwards.** A reading behind the stored time (threads read
/// the clock in one order and compare-and-swap in another; TSC skew between cores;
/// a [`ManualClock`](crate::ManualClock) set back) refills nothing and never moves
/// the stored time backwards: the request is decided on the tokens already there,
/// and a denial's wait counts from the stored time. Such a reading can only
/// under-credit, as long as it is behind by less than half the span: a clock set
/// back further than that (4.46 years or more, by the table) reads as one that
/// far ahead, and refills ([`Clock`](crate::Clock#readings-years-off)).
///
/// **Wrap.** A fresh word (a bucket never used) is immune to wrap: it is full
/// whatever the elapsed time. A word stored full at a later time (by a refund, or
/// a change of quota) keeps that time against readings behind it, so it is read
/// like the words below. A word stored *not* full that then sees no request
/// for at least half the span (4.46 years or more, by the table) is misread: a
/// wrapped elapsed time in the behind half refills nothing, one in the forward half
/// refills for that shorter time. Either way it under-credits (admits fewer, never
/// more) until the clock comes round to the forward half again, or for one fill
/// time of further use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBucket {
    quota: Quota,
    layout: Layout,
    capacity: u64,
    // Non-zero by the quota's validation; the type lets divisions skip the check.
    amount: NonZeroU64,
    /// In time units.
    period: NonZeroU64,
    /// Time units to refill from empty; `<= half`.
    fill: u64,
    /// Half the time field's range, in time units.
    half: u64,
    /// `half - period`: an elapsed time `e` refills something exactly when
    /// `e - period` (wrapping) is below it, which is one comparison for
    /// `period <= e < half`.
    refill_window: u64,
}

impl TokenBucket {
    /// The algorithm for a validated quota.
    pub const fn new(quota: Quota) -> TokenBucket {
        let layout = Layout::for_capacity(quota.capacity());
        // The quota's period is a whole number of the layout's units.
        let period = quota.period_micros() >> layout.unit_shift;
        TokenBucket {
            quota,
            layout,
            capacity: quota.capacity() as u64,
            amount: non_zero(quota.amount() as u64),
            period: non_zero(period),
            fill: fill_time(quota.capacity(), quota.amount(), period),
            half: layout.half_range(),
            // `period <= fill <= half` by the quota's validation.
            refill_window: layout.half_range() - period,
        }
    }

    /// The bucket for `quota` in a word laid out by `layout` (whose token
    /// field holds `quota`'s capacity): the period must be a whole number of
    /// the layout's units, and the fill time at most half its span.
    pub(crate) fn with_layout(quota: Quota, layout: Layout) -> Result<TokenBucket, QuotaError> {
        let unit = layout.unit_micros();
        if !quota.period_micros().is_multiple_of(unit) {
            return Err(QuotaError::PeriodResolution {
                period: quota.period(),
                unit: Duration::from_micros(unit),
            });
        }
        let max = layout.half_range_micros();
        let fill = fill_time(quota.capacity(), quota.amount(), quota.period_micros());
        if fill > max {
            return Err(QuotaError::FillTimeTooLong {
                capacity: quota.capacity(),
                fill_time: quota.fill_time(),
                max: Duration::from_micros(max),
            });
        }
        let period = quota.period_micros() >> layout.unit_shift;
        Ok(TokenBucket::from_raw(
            layout,
            layout.half_range(),
            quota.capacity(),
            quota.amount(),
            period,
            fill_time(quota.capacity(), quota.amount(), period),
        ))
    }

    /// A bucket from parameters already validated together: `half` is
    /// `layout.half_range()`, `period` and `fill` are in `layout`'s units,
    /// `period <= fill <= half`, and `capacity`, `amount` and `period` are at
    /// least 1.
    #[inline(always)]
    pub(crate) const fn from_raw(
        layout: Layout,
        half: u64,
        capacity: u32,
        amount: u32,
        period: u64,
        fill: u64,
    ) -> TokenBucket {
        TokenBucket {
            quota: Quota::from_raw(capacity, amount, period << layout.unit_shift),
            layout,
            capacity: capacity as u64,
            amount: non_zero(amount as u64),
            period: non_zero(period),
            fill,
            half,
            // Wrapping: `period <= half` for parameters that belong together;
            // others only reach a decision whose result is discarded.
            refill_window: half.wrapping_sub(period),
        }
    }

    /// The fields a decision reads, for a [`LiveTokenBucket`] to keep in its
    /// parameter slots.
    ///
    /// [`LiveTokenBucket`]: crate::LiveTokenBucket
    pub(crate) const fn raw(&self) -> RawBucket {
        RawBucket {
            capacity: self.capacity,
            amount: self.amount.get(),
            period: self.period.get(),
            fill: self.fill,
            refill_window: self.refill_window,
        }
    }

    /// The bucket whose [`raw`](Self::raw) fields are `raw`, in `layout` with
    /// `half` its `half_range()`. Fields of two buckets may be mixed (a live
    /// bucket's decision on a stale word): the result must then not panic,
    /// and is discarded.
    #[inline(always)]
    pub(crate) const fn from_raw_parts(layout: Layout, half: u64, raw: RawBucket) -> TokenBucket {
        TokenBucket {
            quota: Quota::from_raw(
                raw.capacity as u32,
                raw.amount as u32,
                raw.period << layout.unit_shift,
            ),
            layout,
            capacity: raw.capacity,
            amount: non_zero(raw.amount),
            period: non_zero(raw.period),
            fill: raw.fill,
            half,
            refill_window: raw.refill_window,
        }
    }

    /// The bucket's tokens in `word` at `now` (a clock reading), refilled.
    #[inline(always)]
    pub(crate) fn level_at(&self, word: u64, now: u64) -> u64 {
        level(self, word, self.layout.time_of(now)).tokens()
    }

    /// The quota this bucket enforces.
    pub const fn quota(&self) -> Quota {
        self.quota
    }
}

impl Algorithm for TokenBucket {
    #[inline]
    fn fresh(&self) -> u64 {
        // Time is irrelevant in a full bucket, so a fresh word needs no clock.
        self.layout.pack(self.capacity, 0)
    }

    #[inline]
    fn capacity(&self) -> u32 {
        self.quota.capacity()
    }

    #[inline(always)]
    fn decide(&self, word: u64, now: u64, n: u32) -> (Decision, Option<u64>) {
        decide(self, word, now, n)
    }

    #[cfg(feature = "std")]
    fn owe(&self, word: u64, now: u64, n: u32) -> Option<(u64, u64)> {
        // At most one fill time ahead (`reserve`'s own bound).
        reserve(self, word, now, n, u64::MAX)
            .ok()
            .map(|(_, next, ahead)| (next, ahead))
    }

    #[inline]
    fn remaining(&self, word: u64, now: u64) -> u32 {
        // `<= capacity <= u32::MAX`
        level(self, word, self.layout.time_of(now)).tokens() as u32
    }

    #[inline]
    fn refund(&self, word: u64, written: u64, n: u32) -> Option<u64> {
        // A bucket that spends keeps its refill grid; a full one starts a new
        // grid at its next admission. So the tokens go back only when that
        // cannot have moved a refill earlier than it would have been without
        // the admission:
        let time = self.layout.time(word);
        if time != self.layout.time(written) {
            // A refill was recorded since: the bucket may have reached
            // capacity and dropped tokens it would otherwise have kept.
            return None;
        }
        let n = u64::from(n);
        let tokens = self.layout.tokens(word) + n;
        if tokens >= self.capacity {
            // Full again: the grid no longer matters.
            return Some(self.layout.pack(self.capacity, time));
        }
        if self.layout.tokens(word) >= self.layout.tokens(written) {
            // No admission since is still standing, and this one found the
            // bucket below capacity (or it would be full again), so the grid is
            // the one it found: exact.
            return Some(self.layout.pack(tokens, time));
        }
        // Later admissions stand on a grid this one may have started; without
        // it, the first of them would have started a later one. Keep the
        // tokens spent (under-admission, never over).
        None
    }

    #[inline]
    fn is_fresh_equivalent(&self, word: u64, now: u64) -> bool {
        level(self, word, self.layout.time_of(now)).tokens() == self.capacity
    }

    fn fresh_after_idle(&self) -> Duration {
        self.quota.fill_time()
    }

    fn advertise(&self) -> Option<(u32, Duration)> {
        // A bucket emptied at `t` has gained at least `capacity` tokens by
        // `t + fill_time`.
        Some((self.quota.capacity(), self.quota.fill_time()))
    }
}

/// Where a token bucket's decision reads its parameters: a [`TokenBucket`]'s
/// own fields, or the slot of a [`LiveTokenBucket`] that the word names, read
/// field by field only where the decision needs it.
///
/// [`LiveTokenBucket`]: crate::LiveTokenBucket
pub(crate) trait Params {
    fn layout(&self) -> Layout;
    /// `layout().half_range()`.
    fn half(&self) -> u64;
    fn max_tokens(&self) -> u64;
    fn amount(&self) -> NonZeroU64;
    /// The period in time units, for a division.
    fn period(&self) -> NonZeroU64;
    /// The same period (at least 1), for arithmetic that cannot divide by it.
    fn period_raw(&self) -> u64;
    fn fill(&self) -> u64;
    fn refill_window(&self) -> u64;
    /// A new word of `tokens` refilled at `time`. (A live bucket's words carry
    /// their generation in the layout's spare bit, which reading and spending
    /// keep; a packed word must be given it again.)
    #[inline(always)]
    fn pack(&self, tokens: u64, time: u64) -> u64 {
        self.layout().pack(tokens, time)
    }
}

impl Params for TokenBucket {
    #[inline(always)]
    fn layout(&self) -> Layout {
        self.layout
    }
    #[inline(always)]
    fn half(&self) -> u64 {
        self.half
    }
    #[inline(always)]
    fn max_tokens(&self) -> u64 {
        self.capacity
    }
    #[inline(always)]
    fn amount(&self) -> NonZeroU64 {
        self.amount
    }
    #[inline(always)]
    fn period(&self) -> NonZeroU64 {
        self.period
    }
    #[inline(always)]
    fn period_raw(&self) -> u64 {
        self.period.get()
    }
    #[inline(always)]
    fn fill(&self) -> u64 {
        self.fill
    }
    #[inline(always)]
    fn refill_window(&self) -> u64 {
        self.refill_window
    }
}

/// The bucket in `word` as of time `now` (units, wrapped).
#[inline(always)]
fn level<P: Params>(p: &P, word: u64, now: u64) -> Level {
    let tokens = p.layout().tokens(word);
    let last = p.layout().time(word);
    let elapsed = p.layout().wrap(now.wrapping_sub(last));
    if tokens >= p.max_tokens() {
        // Full: any elapsed time leaves it full, and the fraction is dropped.
        // A reading behind the stored time keeps that time: a word stored full
        // at a later time (by a refund, or a change of quota) must not let a
        // stale reading move it back and refill again from there. A fresh
        // word (time 0, never used) takes any reading, so it is immune to wrap.
        let base = if elapsed < p.half() || last == 0 {
            now
        } else {
            last
        };
        return Level::Refilled {
            tokens: p.max_tokens(),
            base,
        };
    }
    if elapsed.wrapping_sub(p.period_raw()) >= p.refill_window() {
        // Not a whole period yet, or a reading behind the stored time:
        // refill nothing, move nothing.
        return Level::AsStored { tokens, last };
    }
    if elapsed >= p.fill() {
        return Level::Refilled {
            tokens: p.max_tokens(),
            base: now,
        };
    }
    let periods = elapsed / p.period();
    // periods * amount < ceil(capacity / amount) * amount <= capacity + amount,
    // so this cannot overflow. (Wrapping, not checked: a live bucket's
    // decision on a stale word may read parameters that do not belong
    // together, and its compare-and-swap then fails and discards the
    // result; it must not panic first. The same instructions in release.)
    let filled = tokens.wrapping_add(periods.wrapping_mul(p.amount().get()));
    if filled >= p.max_tokens() {
        Level::Refilled {
            tokens: p.max_tokens(),
            base: now,
        }
    } else {
        Level::Refilled {
            tokens: filled,
            // `periods * period <= elapsed`: no overflow (wrapping: as above).
            base: last.wrapping_add(periods.wrapping_mul(p.period_raw())),
        }
    }
}

/// A denial: nothing changes, and the wait is until `n` tokens exist in a
/// bucket holding `available < n` tokens refilled at `base`, read at `now_ns`.
#[inline(always)]
fn deny<P: Params>(
    p: &P,
    available: u64,
    base: u64,
    now_ns: u64,
    n: u64,
) -> (Decision, Option<u64>) {
    let missing = n - available;
    // Read once: a live bucket's view loads the field at each reading, and
    // two loads could differ, so the compiler could not fold
    // `(1 + amount - 1) / amount` to 1 for a request of one.
    let amount = p.amount();
    let periods = if amount.get() == 1 {
        missing
    } else {
        // `missing` and `amount` are below 2^32: no overflow.
        (missing + amount.get() - 1) / amount
    };
    // With `n <= capacity` this is at most the fill time, at most half the
    // span; saturating keeps larger `n` from wrapping.
    let refill = periods.saturating_mul(p.period_raw()).min(p.half());
    // The refill lands at `base + refill`. Forwards, `now - base` is less
    // than a period, so it is ahead; behind the stored time, it is ahead by
    // up to half the span plus `refill`. Both fit in the span, and only a
    // distance of exactly one span wraps to 0.
    let now = p.layout().time_of(now_ns);
    let ahead = p.layout().wrap(base.wrapping_add(refill).wrapping_sub(now));
    let ahead = if ahead == 0 { p.half() * 2 } else { ahead };
    let wait = p.layout().nanos_until(ahead, now_ns);
    (
        Decision::Denied {
            retry_after: RetryAfter::from_nanos(wait),
        },
        None,
    )
}

/// A token bucket's decision on `word` at clock reading `now`, with the
/// parameters `p` gives.
#[inline(always)]
pub(crate) fn decide<P: Params>(p: &P, word: u64, now: u64, n: u32) -> (Decision, Option<u64>) {
    let t = p.layout().time_of(now);
    let n = u64::from(n);
    // `remaining <= capacity <= u32::MAX` in both arms.
    match level(p, word, t) {
        Level::AsStored { tokens, last } => {
            if tokens < n {
                return deny(p, tokens, last, now, n);
            }
            // The time stays, so spending is one subtraction from the word.
            let remaining = (tokens - n) as u32;
            let next = p.layout().spend(word, n);
            (Decision::Allowed { remaining }, Some(next))
        }
        Level::Refilled { tokens, base } => {
            if tokens < n {
                return deny(p, tokens, base, now, n);
            }
            let remaining = (tokens - n) as u32;
            let next = p.pack(tokens - n, base);
            (Decision::Allowed { remaining }, Some(next))
        }
    }
}

/// Reserve `n` permits at `now` (a clock reading): the decision (permits
/// left, 0 for a loan), the next word and the nanoseconds until the
/// permits are there; or `Err` with that wait when it would be more than
/// `max_ahead` nanoseconds.
///
/// With the permits there, this is an admission. Otherwise the bucket
/// lends from its future: the word is stamped with the refill at which
/// `n` tokens will have arrived and holds none, so every later decision
/// before that refill finds nothing and waits past it. The rest of that
/// refill's batch beyond `n` (less than `amount` tokens, none when
/// `amount` is 1) is dropped, so a reservation never admits more than the
/// bucket would have. `n` must be at least 1; more than the capacity is refused.
#[cfg(feature = "std")]
pub(crate) fn reserve<P: Params>(
    p: &P,
    word: u64,
    now: u64,
    n: u32,
    max_ahead: u64,
) -> Result<(Decision, u64, u64), u64> {
    let (decision, next) = decide(p, word, now, n);
    if let Some(next) = next {
        return Ok((decision, next, 0));
    }
    let wait = decision.retry_after().map_or(0, |r| r.as_nanos());
    // At most one fill time ahead, the fill of the quota the word was
    // decided under (a live bucket's may have changed since the caller
    // looked): the word's time stays within its span.
    let fill = p
        .fill()
        .saturating_mul(p.layout().unit_micros())
        .saturating_mul(1_000);
    // More than the bucket holds is never lent (a live bucket's word of
    // an older quota may meet an `n` checked against a newer one): it
    // would spend refills a full bucket drops.
    if wait > max_ahead.min(fill) || u64::from(n) > p.max_tokens() {
        return Err(wait);
    }
    let (tokens, base) = match level(p, word, p.layout().time_of(now)) {
        Level::AsStored { tokens, last } => (tokens, last),
        Level::Refilled { tokens, base } => (tokens, base),
    };
    let missing = u64::from(n).saturating_sub(tokens);
    let periods = missing.div_ceil(p.amount().get());
    let ready = base.wrapping_add(periods.wrapping_mul(p.period_raw()));
    Ok((Decision::Allowed { remaining: 0 }, p.pack(0, ready), wait))
}

/// The fields of a [`TokenBucket`] that a decision reads ([`TokenBucket::raw`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawBucket {
    pub(crate) capacity: u64,
    pub(crate) amount: u64,
    pub(crate) period: u64,
    pub(crate) fill: u64,
    pub(crate) refill_window: u64,
}

/// A bucket's tokens at some reading, and whether the word already says so.
#[derive(Clone, Copy, Debug)]
enum Level {
    /// No refill is due: the word's tokens and time stand.
    AsStored { tokens: u64, last: u64 },
    /// Refilled (or full): `tokens` as of the refill time `base`.
    Refilled { tokens: u64, base: u64 },
}

impl Level {
    #[inline(always)]
    fn tokens(self) -> u64 {
        match self {
            Level::AsStored { tokens, .. } | Level::Refilled { tokens, .. } => tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(capacity: u32, amount: u32, period_ms: u64) -> TokenBucket {
        TokenBucket::new(Quota::new(capacity, amount, Duration::from_millis(period_ms)).unwrap())
    }

    #[test]
    fn layout_widths_and_units_at_every_capacity_edge() {
        // (capacity, time bits, unit shift)
        let cases = [
            (0, 63, 0),
            (1, 63, 0),
            (2, 62, 0),
            (3, 62, 0),
            (4, 61, 0),
            (1_023, 54, 0),
            (1_024, 53, 0),
            (65_535, 48, 0),
            (65_536, 47, 1),
            ((1 << 20) - 1, 44, 4),
            (u32::MAX >> 1, 33, 15),
            (u32::MAX, 32, 16),
        ];
        for (capacity, time_bits, unit_shift) in cases {
            let layout = Layout::for_capacity(capacity);
            assert_eq!(layout.time_bits, time_bits, "capacity {capacity}");
            assert_eq!(layout.unit_shift, unit_shift, "capacity {capacity}");
            assert_eq!(layout.half_range(), 1 << (time_bits - 1));
            assert_eq!(layout.time_mask, u64::MAX >> (64 - time_bits));
            // The span never drops below 2^48 µs.
            assert!(layout.half_range_micros() >= 1 << 47, "capacity {capacity}");
        }
    }

    #[test]
    fn a_spare_bit_layout_keeps_its_bit_out_of_tokens_and_time() {
        for ceiling in [1, 2, 3, 1_023, 65_535, 65_536, (1 << 20) - 1, u32::MAX] {
            let spare = Layout::with_spare_bit(ceiling);
            let plain = Layout::for_capacity(ceiling);
            // Tokens where a plain layout of the ceiling has them; the time
            // field one bit narrower, the spare bit between the two.
            assert_eq!(spare.time_bits, plain.time_bits, "ceiling {ceiling}");
            assert_eq!(spare.unit_shift, plain.unit_shift, "ceiling {ceiling}");
            assert_eq!(spare.time_mask, plain.time_mask >> 1, "ceiling {ceiling}");
            assert_eq!(spare.spare_bit(), 1 << (spare.time_bits - 1));
            assert_eq!(spare.half_range(), plain.half_range() / 2);
            assert!(spare.half_range_micros() >= 1 << 46, "ceiling {ceiling}");
            let bit = spare.spare_bit();
            let time = spare.time_mask; // the largest time
            let word = spare.pack(u64::from(ceiling), time);
            assert_eq!(word & bit, 0, "pack writes the bit as 0");
            for w in [word, word | bit] {
                assert_eq!(spare.tokens(w), u64::from(ceiling), "ceiling {ceiling}");
                assert_eq!(spare.time(w), time, "ceiling {ceiling}");
                let spent = spare.spend(w, 1);
                assert_eq!(spent & bit, w & bit, "spending keeps the bit");
                assert_eq!(spare.tokens(spent), u64::from(ceiling) - 1);
                assert_eq!(spare.time(spent), time);
            }
        }
    }

    #[test]
    fn clock_readings_convert_to_units_and_waits_to_nanoseconds() {
        let layout = Layout::for_capacity(u32::MAX); // 65,536 µs units
        let unit_ns = 65_536_000;
        for now in [
            0,
            1,
            999,
            1_000,
            unit_ns - 1,
            unit_ns,
            5 * unit_ns + 123_456,
        ] {
            let t = layout.time_of(now);
            assert_eq!(t, now / unit_ns);
            // One unit ahead is the start of the next unit.
            assert_eq!(layout.nanos_until(1, now), (t + 1) * unit_ns - now);
            assert_eq!(layout.nanos_until(3, now), (t + 3) * unit_ns - now);
        }
        // Wraps at the field, and the wait saturates.
        assert_eq!(
            layout.time_of(u64::MAX),
            (u64::MAX / unit_ns) & layout.time_mask
        );
        assert_eq!(layout.nanos_until(u64::MAX >> 16, 5), u64::MAX);
    }

    #[test]
    fn pack_unpack_round_trips_at_the_edges() {
        for capacity in [1, 2, 3, 255, 256, 1_023, 65_535, 1 << 24, u32::MAX] {
            let layout = Layout::for_capacity(capacity);
            let max_time = layout.time_mask;
            let capacity = u64::from(capacity);
            for tokens in [0, 1, capacity / 2, capacity - 1, capacity] {
                for time in [0, 1, max_time / 2, max_time - 1, max_time] {
                    let word = layout.pack(tokens, time);
                    assert_eq!(layout.tokens(word), tokens, "tokens of {word:#x}");
                    assert_eq!(layout.time(word), time, "time of {word:#x}");
                    for n in [0, 1.min(tokens), tokens / 2, tokens] {
                        assert_eq!(layout.spend(word, n), layout.pack(tokens - n, time));
                    }
                }
            }
            // Time beyond the field wraps into it and never touches the tokens.
            let word = layout.pack(capacity, max_time + 1);
            assert_eq!(layout.tokens(word), capacity);
            assert_eq!(layout.time(word), 0);
        }
    }

    #[test]
    fn full_word_uses_every_bit_at_u32_max() {
        let layout = Layout::for_capacity(u32::MAX);
        assert_eq!(
            layout.pack(u64::from(u32::MAX), u64::from(u32::MAX)),
            u64::MAX
        );
    }

    #[test]
    fn fresh_word_is_full_at_any_time() {
        let b = bucket(3, 1, 1000);
        for now in [0, 1, 999_999_999, u64::MAX / 2, u64::MAX] {
            assert_eq!(b.remaining(b.fresh(), now), 3);
            assert!(b.is_fresh_equivalent(b.fresh(), now));
        }
    }

    #[test]
    fn denial_writes_nothing_and_admission_writes_the_next_word() {
        let b = bucket(1, 1, 1000);
        let (d, next) = b.decide(b.fresh(), 0, 1);
        assert_eq!(d, Decision::Allowed { remaining: 0 });
        let next = next.unwrap();
        let (d, none) = b.decide(next, 300_000_000, 1);
        assert_eq!(
            d.retry_after().unwrap().duration(),
            Duration::from_millis(700)
        );
        assert_eq!(none, None);
    }

    #[test]
    fn sub_microsecond_clock_readings_give_exact_nanosecond_waits() {
        let b = bucket(1, 1, 1000);
        let (_, w) = b.decide(b.fresh(), 0, 1);
        let (d, _) = b.decide(w.unwrap(), 300_000_123, 1);
        assert_eq!(d.retry_after().unwrap().as_nanos(), 699_999_877);
    }
}
