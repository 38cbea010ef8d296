//! The generic cell rate algorithm (the leaky bucket as a meter) as a pure
//! function on one word.

use core::num::NonZeroU64;
use core::time::Duration;

use crate::algorithm::Algorithm;
use crate::algorithm::divide::Divisor;
use crate::decision::{Decision, RetryAfter};
use crate::quota::Quota;

/// The leaky bucket as pacing: the generic cell rate algorithm (GCRA, ITU-T
/// I.371), the algorithm of governor and of Redis' `redis-cell`.
///
/// Permits drain at a constant rate, one every *emission interval*
/// `T = period / amount`; a *tolerance* `τ = (capacity - 1) * T` lets a burst of
/// `capacity` through at once. The word holds one number, the *theoretical
/// arrival time* (TAT): when the meter would be empty again if nothing else
/// arrived. A request for `n` at `now` conforms when
///
/// ```text
/// max(TAT, now) + n * T <= now + τ + T
/// ```
///
/// and then moves the TAT there; a denial writes nothing and waits exactly until
/// the request would conform.
///
/// Against [`TokenBucket`](crate::TokenBucket) with the same [`Quota`]: the
/// same burst and long-run rate, but permits come back one at a time, every
/// `T`, instead of `amount` at the end of each `period`. It keeps arrivals
/// evenly spaced in front of a backend that wants steady traffic (the
/// rate-limiter pattern's "leaky bucket"), and with `capacity = 1` it is a pure
/// pacer: one request every `T`.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Gcra, ManualClock, Quota, RateLimiter};
///
/// let clock = ManualClock::new();
/// // 2 per second, burst 2: one permit comes back every 500 ms.
/// let quota = Quota::new(2, 1, Duration::from_millis(500))?;
/// let limiter = RateLimiter::from_parts(Gcra::new(quota), clock.clone());
///
/// assert!(limiter.try_acquire_n(2)?.is_allowed());
/// clock.advance(Duration::from_millis(200));
/// let denied = limiter.try_acquire();
/// assert_eq!(denied.retry_after().unwrap().duration(), Duration::from_millis(300));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # The word
///
/// The TAT in nanoseconds of the clock, the whole 64 bits: exact for 584 years
/// of a clock's readings, and past that every request is denied (never
/// admitted). A reading behind the TAT (a clock that went back, a thread that
/// read it before another wrote) can only find the meter fuller: it never admits
/// more than a later reading would. A word is fresh again once the TAT is not
/// after the reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gcra {
    quota: Quota,
    /// `T` in nanoseconds, with its reciprocal: the permits left are a division
    /// by `T` on every admission.
    interval: Divisor,
    /// `τ + T = capacity * T`: how far ahead of a reading the TAT may be after
    /// an admission.
    horizon: u64,
}

impl Gcra {
    /// The meter for `quota`: burst `capacity`, one permit every
    /// `period / amount`, rounded up to whole nanoseconds (never faster than the
    /// quota), and held to at most `2^62 / capacity` ns (73 years for a burst
    /// of 2), so that a burst's TAT fits the clock's range: only a quota of
    /// one permit in more than a century is refilled sooner than it asks.
    pub const fn new(quota: Quota) -> Gcra {
        let period = quota.period().as_nanos();
        let amount = quota.amount() as u128;
        // A valid quota has `amount >= 1` and a period of at least 1 µs; a
        // small capacity allows a period of up to 2^62 µs (146,000 years for
        // one permit), whose interval does not fit 64 bits of nanoseconds.
        // Cut to 64 bits, it wrapped to an interval of a few nanoseconds,
        // millions of permits a second; saturated, a burst's second permit
        // overflowed the TAT and the meter denied from its first request on.
        // The interval is held to a quarter of the clock's range over the
        // capacity, so a whole burst's TAT fits (in 63 bits, for the live
        // form) from any reading in the first quarter of the range (146
        // years): such a meter admits its burst, then a permit every
        // `2^62 / capacity` ns at most (73 years for a burst of 2), where
        // the quota asked for one every few centuries.
        let interval = period.div_ceil(if amount == 0 { 1 } else { amount });
        let capacity = quota.capacity() as u128;
        let most = (u64::MAX / 4) as u128 / if capacity == 0 { 1 } else { capacity };
        let interval = if interval > most {
            most as u64
        } else {
            interval as u64
        };
        let interval = match NonZeroU64::new(interval) {
            Some(interval) => interval,
            None => NonZeroU64::MIN,
        };
        Gcra {
            quota,
            interval: Divisor::new(interval),
            horizon: interval.get().saturating_mul(quota.capacity() as u64),
        }
    }

    /// The quota this meter enforces.
    pub const fn quota(&self) -> Quota {
        self.quota
    }

    /// `T`: the time between two permits at the sustained rate.
    pub const fn emission_interval(&self) -> Duration {
        Duration::from_nanos(self.interval.get())
    }

    /// `τ = (capacity - 1) * T`: how far ahead of the sustained rate a burst may
    /// run.
    pub const fn tolerance(&self) -> Duration {
        Duration::from_nanos(self.horizon - self.interval.get())
    }

    /// A reservation ([`Lend`](crate::Lend)): the decision, the next word and
    /// the nanoseconds until the permits conform; a request that does not
    /// conform yet is lent when it will within `max_ahead` and within one
    /// fill time (`capacity * T`, so that a lent TAT stays within two of the
    /// reading), its `n * T` added to the TAT as an admission's is, so the
    /// requests after it wait behind it. `Err` carries the wait: too far,
    /// more permits than the meter holds, or a TAT past `top` (the largest a
    /// word may hold).
    #[inline]
    pub(crate) fn lend_within(
        &self,
        word: u64,
        now: u64,
        n: u32,
        max_ahead: u64,
        top: u64,
    ) -> Result<(Decision, u64, u64), u64> {
        let (decision, next) = self.decide(word, now, n);
        if let Some(next) = next {
            return if next <= top {
                Ok((decision, next, 0))
            } else {
                Err(u64::MAX)
            };
        }
        let wait = decision.retry_after().map_or(0, |r| r.as_nanos());
        // More than the meter holds is never lent (a live meter's word of an
        // older quota may meet an `n` checked against a newer one).
        if wait > max_ahead.min(self.horizon) || n > self.capacity() {
            return Err(wait);
        }
        // `n <= capacity`, so the cost is at most the horizon.
        let cost = self.interval.get().saturating_mul(u64::from(n));
        match word.max(now).checked_add(cost) {
            Some(next) if next <= top => Ok((Decision::Allowed { remaining: 0 }, next, wait)),
            _ => Err(wait),
        }
    }
}

impl Algorithm for Gcra {
    #[inline]
    fn fresh(&self) -> u64 {
        // A TAT at the epoch: every reading finds the meter empty.
        0
    }

    #[inline]
    fn capacity(&self) -> u32 {
        self.quota.capacity()
    }

    // Always: out of line, the decision comes back through memory, and reading
    // it whole after the callee wrote it in parts fails store forwarding.
    #[inline(always)]
    fn decide(&self, word: u64, now: u64, n: u32) -> (Decision, Option<u64>) {
        let tat = word.max(now);
        // `n <= capacity`, so at most `horizon`; saturating for other `n`.
        let cost = self.interval.get().saturating_mul(u64::from(n));
        let ahead = (tat - now).saturating_add(cost);
        let wait = match tat.checked_add(cost) {
            Some(next) if ahead <= self.horizon => {
                // `<= capacity`
                let remaining = self.interval.div(self.horizon - ahead) as u32;
                return (Decision::Allowed { remaining }, Some(next));
            }
            // Conforms once `now` has moved up by the excess.
            Some(_) => ahead - self.horizon,
            // Past the end of the clock's range: never.
            None => u64::MAX,
        };
        (
            Decision::Denied {
                retry_after: RetryAfter::from_nanos(wait),
            },
            None,
        )
    }

    #[inline]
    fn remaining(&self, word: u64, now: u64) -> u32 {
        let tat = word.max(now);
        let ahead = tat - now;
        // What `decide` admits: a cost within the horizon that also fits before
        // the end of the clock's range. `<= horizon`, so `<= capacity` permits.
        let room = self.horizon.saturating_sub(ahead).min(u64::MAX - tat);
        self.interval.div(room) as u32
    }

    #[inline]
    fn refund(&self, word: u64, written: u64, n: u32) -> Option<u64> {
        // Exact only while the word is still the one the admission wrote. Once
        // another decision has moved the TAT, time may already have drained the
        // meter through this admission's `n * T` (a decision reading past the
        // TAT less that cost), and the one number cannot tell: moving the TAT
        // back then would return permits time already returned. The admission
        // stays spent instead (under-admission, never over).
        if word != written {
            return None;
        }
        Some(word.saturating_sub(self.interval.get().saturating_mul(u64::from(n))))
    }

    /// A loan of at most one fill time ahead ([`lend_within`](Gcra::lend_within)).
    fn owe(&self, word: u64, now: u64, n: u32) -> Option<(u64, u64)> {
        self.lend_within(word, now, n, u64::MAX, u64::MAX)
            .ok()
            .map(|(_, next, wait)| (next, wait))
    }

    #[inline]
    fn is_fresh_equivalent(&self, word: u64, now: u64) -> bool {
        word <= now
    }

    fn fresh_after_idle(&self) -> Duration {
        Duration::from_nanos(self.horizon)
    }

    fn advertise(&self) -> Option<(u32, Duration)> {
        // The interval is rounded up to whole nanoseconds: `capacity` of them
        // may outlast the quota's fill time.
        let quota = self.quota();
        let intervals = self.emission_interval().saturating_mul(quota.capacity());
        Some((quota.capacity(), quota.fill_time().max(intervals)))
    }
}

/// The 63 bits of a live word below its generation bit
/// ([`LiveGcra`](crate::LiveGcra)): the TAT.
const TAT_MASK: u64 = u64::MAX >> 1;

impl crate::algorithm::form::Form for Gcra {
    type Quota = Quota;

    fn build(quota: Quota, _ceiling: u32) -> Result<Gcra, crate::error::QuotaError> {
        // The TAT takes no more bits for a larger quota: any quota fits.
        Ok(Gcra::new(quota))
    }

    fn quota(&self) -> Quota {
        self.quota
    }

    fn to_raw(&self) -> crate::algorithm::form::Raw {
        let [d, magic, shift] = self.interval.to_raw();
        [
            u64::from(self.quota.capacity()) | u64::from(self.quota.amount()) << 32,
            self.quota.period_micros(),
            d,
            magic,
            shift,
            self.horizon,
            0,
        ]
    }

    #[inline(always)]
    fn from_raw(raw: &crate::algorithm::form::Raw) -> Gcra {
        Gcra {
            // Built from two u32s.
            quota: Quota::from_raw_parts(raw[0] as u32, (raw[0] >> 32) as u32, raw[1]),
            interval: Divisor::from_raw([raw[2], raw[3], raw[4]]),
            horizon: raw[5],
        }
    }

    #[inline(always)]
    fn decide_low(&self, word: u64, now: u64, n: u32) -> (Decision, Option<u64>) {
        match self.decide(word, now, n) {
            // A TAT that needs the generation bit: past the end of the live
            // word's range (292 years of readings), never admitted.
            (Decision::Allowed { .. }, Some(next)) if next > TAT_MASK => (
                Decision::Denied {
                    retry_after: RetryAfter::from_nanos(u64::MAX),
                },
                None,
            ),
            decided => decided,
        }
    }

    #[inline]
    fn lend_low(
        &self,
        word: u64,
        now: u64,
        n: u32,
        max_ahead: u64,
    ) -> Option<Result<(Decision, u64, u64), u64>> {
        Some(self.lend_within(word, now, n, max_ahead, TAT_MASK))
    }

    /// Permits kept, not debt: the meter's permits available at `now`
    /// ([`remaining`](Algorithm::remaining)), at most the new capacity, with
    /// the next one a whole new emission interval away; an idle meter (TAT
    /// not after `now`) is a fresh one. A loan's reach past an empty meter
    /// (a reservation's, [`Lend`](crate::Lend)) is kept on top, in time: the
    /// permits lent stay lent, and the requests after them wait as long
    /// past the new quota's empty meter as they would have past the old.
    fn convert(&self, to: &Gcra, word: u64, now: u64) -> u64 {
        if word <= now {
            return to.fresh();
        }
        let lent = word.saturating_sub(now.saturating_add(self.horizon));
        let available = u64::from(self.remaining(word, now).min(to.quota.capacity()));
        // `available <= capacity`, so within the horizon.
        let debt = to
            .horizon
            .saturating_sub(available.saturating_mul(to.interval.get()));
        now.saturating_add(debt).saturating_add(lent).min(TAT_MASK)
    }
}
