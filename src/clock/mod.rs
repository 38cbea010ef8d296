//! Time as `u64` nanoseconds since a clock's epoch.
//!
//! Six clocks; the first four need the `std` feature:
//!
//! - [`RealClock`], the default: the TSC through quanta where the kernel itself
//!   keeps time on the TSC and the TSC's rate agrees with the OS clock's at
//!   start, the OS monotonic clock otherwise (checked once per process).
//! - [`MonotonicClock`]: the OS monotonic clock (`std::time::Instant`).
//! - [`TscClock`]: quanta's calibrated TSC, unchecked.
//! - [`CoarseClock`]: a reading kept fresh by an upkeep thread from the OS
//!   monotonic clock: about a millisecond of resolution for about a nanosecond
//!   per reading.
//! - [`ManualClock`]: set by hand, for tests and examples (without `std`, with
//!   the `alloc` feature).
//! - [`TickClock`]: a closure over a monotonic tick source of the
//!   application's own (a hardware timer without an OS).

use core::time::Duration;

#[cfg(all(feature = "std", not(turnstile_loom)))]
mod coarse;
#[cfg(feature = "alloc")]
mod manual;
#[cfg(feature = "std")]
mod real;
mod tick;

#[cfg(all(feature = "std", not(turnstile_loom)))]
pub use coarse::CoarseClock;
#[cfg(feature = "alloc")]
pub use manual::ManualClock;
#[cfg(feature = "std")]
pub use real::{ClockSource, MonotonicClock, RealClock, TscClock};
pub use tick::TickClock;

/// A source of time for a limiter.
///
/// `now` returns nanoseconds since the clock's own epoch. Readings should not go
/// backwards, but limiters tolerate it when they do (TSC skew between cores,
/// a thread preempted between reading the clock and deciding): a reading behind
/// one already seen creates no permits, within the bounds below.
///
/// # Readings years off
///
/// Every word but GCRA's keeps its time modulo a span, and compares readings
/// with wrapping arithmetic: an elapsed time below half the span is read
/// forwards, one above it as a reading behind. Half the span is at least
/// `2^47` µs (4.46 years) for a [`TokenBucket`](crate::TokenBucket),
/// [`FixedWindow`](crate::FixedWindow) and [`SlidingWindow`](crate::SlidingWindow),
/// and `2^46` µs (2.2 years) for a [`LiveTokenBucket`](crate::LiveTokenBucket).
/// A [`WarmUp`](crate::WarmUp), whose heat takes bits from its time field,
/// keeps a span of at least `2^40` µs (12.7 days) and reads forwards all of
/// it but a stretch behind of at least `2^32` µs (71.6 minutes), so that a
/// word idle past half its span comes back fresh (its
/// [word](crate::WarmUp#the-packed-word) gives the exact figures; a warm-up
/// of zero is a token bucket's). So, with "half the span" read as that
/// stretch for a warm-up:
///
/// - a reading *behind* the word's time by less than half the span creates no
///   permits; one further back is indistinguishable from a reading that far
///   *ahead*, and refills (or opens a new window) as such. [`RealClock`],
///   [`MonotonicClock`], [`TscClock`] and [`CoarseClock`] never go back; a
///   [`ManualClock`] set back, or a clock of your own, can;
/// - a reading far *ahead* is taken as the time: the word moves there, and
///   readings behind it create nothing until the clock catches up, or comes
///   round the span. The limiter admits less, never more, meanwhile; a key of
///   a keyed limiter decided on such a reading is not sweepable meanwhile
///   either (it still counts under `max_keys`). GCRA keeps the whole 64 bits
///   of nanoseconds: a reading within one emission interval of `u64::MAX`
///   denies every request, and its theoretical arrival time stays there.
///
/// # Readings that disagree
///
/// Say every reading a limiter decides on lies within `[t - a, t + b]`, where
/// `t` is the true time at which that decision takes effect (its
/// compare-and-swap), and let `s = a + b`, the *spread* of the readings. Cores
/// whose TSCs are offset from each other spread readings; so does the time
/// between reading the clock and deciding (normally tens of nanoseconds, more
/// for a thread preempted in between), which counts into `a`. Then, refunds
/// aside, one direct limiter, or one key of a keyed limiter, admits in any
/// interval of true time of length `T` at most:
///
/// | algorithm | permits admitted in any interval of length `T` |
/// |---|---|
/// | [`TokenBucket`](crate::TokenBucket) | `capacity - 1 + amount * (floor((T + s) / period) + 1)`, with `T + s` rounded up to the bucket's time unit ([`Quota::time_unit`](crate::Quota::time_unit)) |
/// | [`Gcra`](crate::Gcra) | `capacity + floor((T + s) / I)`, `I` the [emission interval](crate::Gcra::emission_interval) |
/// | [`FixedWindow`](crate::FixedWindow) | `limit * (ceil((T + s) / window) + 1)` |
/// | [`SlidingWindow`](crate::SlidingWindow) | `limit + floor(limit * (T + s) / window)` while `T + s <= window`; the fixed window's bound beyond |
///
/// With `s = 0` each is the algorithm's bound on a perfect clock: a spread of
/// `s` acts as an interval `s` longer, so it admits at most the permits the
/// quota grants in `s` more, once per interval, and leaves the long-run rate as
/// it is. Each bound follows from two facts: a decision's reading is at least
/// `t1 - a` for an interval starting at `t1` and at most `t2 + b` for one
/// ending at `t2`, and a word's time (the bucket's last refill, the TAT, the
/// window) never moves back. A reading behind the word's time creates nothing:
/// the token bucket refills nothing, the GCRA meter measures from its TAT, and
/// the windows count it against the stored window (the sliding window at that
/// window's start, where its estimate is largest).
///
/// In a [`KeyedLimiter`](crate::KeyedLimiter) the bounds hold for a key while
/// it stays in the map. A sweep drops a key whose word is as good as fresh at
/// the sweeper's reading, and that reading may be up to `s` ahead of the next
/// decision's: the re-created key then starts from a fresh word where the old
/// one would still have counted, so each such sweep can add what a second
/// spread `s` would (`T + 2s` in place of `T + s`, once).
///
/// What the spread cannot cover is a clock whose *rate* is wrong: a TSC
/// calibrated 1% fast grants 1% more permits for as long as it runs.
/// [`RealClock`] checks the TSC's rate against the OS clock when it is first
/// created and reads the OS clock when they disagree.
pub trait Clock: Send + Sync {
    /// Nanoseconds since this clock's epoch.
    fn now(&self) -> u64;

    /// For a simulated clock: move forward by `duration` and return `true`, so
    /// that a wait ([`RateLimiter::wait`](crate::RateLimiter::wait)) skips its
    /// sleep. A real clock returns `false` (the default) and the caller sleeps.
    /// [`ManualClock`] skips, so tests and replays never wait.
    fn skip(&self, duration: Duration) -> bool {
        let _ = duration;
        false
    }

    /// An identity shared by every clock whose readings are this one's: a
    /// reading of one is a reading of all, so a combined layer whose limits
    /// all answer the same `Some` reads the time once per request. `None`
    /// (the default): this clock's readings are its own.
    #[doc(hidden)]
    fn shared_readings(&self) -> Option<usize> {
        None
    }
}

/// What [`skip_sleep`] did with a sleep.
#[cfg(feature = "std")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Skip {
    /// A real clock: the caller sleeps.
    Sleep,
    /// A simulated clock moved forward instead.
    Skipped,
    /// A simulated clock that cannot move any more (a [`ManualClock`] at the
    /// end of its range): a wait on it would never end.
    Stuck,
}

/// A wait's sleep of `d` on `clock`: skipped on a simulated clock
/// ([`Clock::skip`]), and `Stuck` when skipping left the clock where it was.
#[cfg(feature = "std")]
pub(crate) fn skip_sleep<C: Clock + ?Sized>(clock: &C, d: Duration) -> Skip {
    let before = clock.now();
    if !clock.skip(d) {
        Skip::Sleep
    } else if d.is_zero() || clock.now() > before {
        Skip::Skipped
    } else {
        Skip::Stuck
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now(&self) -> u64 {
        (**self).now()
    }

    fn skip(&self, duration: Duration) -> bool {
        (**self).skip(duration)
    }

    fn shared_readings(&self) -> Option<usize> {
        (**self).shared_readings()
    }
}

/// `d` in nanoseconds, saturating at `u64::MAX` (584 years).
#[cfg(feature = "alloc")]
pub(crate) fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
