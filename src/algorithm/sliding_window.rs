//! The sliding window counter as a pure function on one word.

use core::time::Duration;

use crate::algorithm::Algorithm;
use crate::algorithm::window::{Position, Windows};
use crate::decision::{Decision, RetryAfter};
use crate::error::QuotaError;

/// The sliding window counter: at most `limit` permits in the window that ends
/// now, estimated from two fixed windows.
///
/// Windows sit at fixed boundaries from the clock's epoch, as for
/// [`FixedWindow`](crate::FixedWindow), and the word keeps the count of the
/// current window `c` and of the previous one `p`. A reading `e` into the current
/// window (of length `w`) estimates the permits of the last `w` as
///
/// ```text
/// c + p * (w - e) / w
/// ```
///
/// the previous window's count weighted by how much of it the sliding window
/// still covers, and admits `n` when the estimate plus `n` is at most `limit`
/// (computed exactly, in integers, to the nanosecond).
///
/// # Error bound
///
/// The estimate is exact when the previous window's permits were spread evenly
/// over it. When they were not, the limiter can admit more than `limit` in some
/// interval of one window, but never much more across a boundary: **any interval
/// of length `s <= w` admits at most `limit * (1 + s / w)`**, and any interval
/// that is one whole fixed window admits at most `limit`. The worst case is
/// `p = limit` permits at the very end of one window: the next window then
/// admits permits only as fast as the previous one's weight fades. Compare
/// [`FixedWindow`](crate::FixedWindow), which admits `2 * limit` in an interval
/// as short as two requests across a boundary.
///
/// A denial waits until the estimate has fallen enough (within the window, or
/// in the next one), to the nanosecond.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{ManualClock, RateLimiter, SlidingWindow};
///
/// let clock = ManualClock::new();
/// let limiter = RateLimiter::from_parts(SlidingWindow::new(2, Duration::from_secs(1))?, clock.clone());
///
/// clock.set(Duration::from_millis(900));
/// assert!(limiter.try_acquire_n(2)?.is_allowed());
/// clock.set(Duration::from_millis(1000)); // a new window, but the last 1 s holds 2
/// let denied = limiter.try_acquire();
/// // At 1500 ms the previous window weighs 2 * 0.5 = 1: room for one more.
/// assert_eq!(denied.retry_after().unwrap().duration(), Duration::from_millis(500));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # The packed word
///
/// | bits | field |
/// |---|---|
/// | `63 ..= 64-w` | `c`, the current window's count (`w` = bits of `limit`) |
/// | `63-w ..= 64-2w` | `p`, the previous window's count |
/// | `63-2w ..= 0` | the current window's number, modulo `2^(64-2w)` |
///
/// Two counts leave fewer bits for the window number than a fixed window has, so
/// the shortest window grows faster with the limit: `2^(2w - 16)` µs for a limit
/// of `w` bits, so 250 ns at 100, 1 µs at 255, 16 µs at 1,023, 4.1 ms at
/// 16,383, 65.5 ms at 65,535 ([`QuotaError::WindowTooShort`] names it). A reading behind the stored window
/// is decided at the stored window's start, where the estimate is largest: it
/// never admits more than a reading in that window would (for a reading behind
/// by less than half the window number's span, at least 4.46 years; see
/// [`Clock`](crate::Clock#readings-years-off)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingWindow {
    windows: Windows,
    limit: u64,
    /// `2^count_bits - 1`.
    count_mask: u64,
}

/// The counts that apply to a reading, and where.
#[derive(Clone, Copy, Debug)]
struct State {
    previous: u64,
    current: u64,
    /// The window the counts belong to (wrapped), where a write goes.
    window: u64,
    /// How many windows ahead of the reading's own that window is.
    ahead: u64,
    /// Nanoseconds into that window at which to evaluate: the reading's own, or
    /// 0 for a reading behind.
    into: u64,
    /// Nanoseconds into its own window of the reading itself: waits count from it.
    reading_into: u64,
}

impl SlidingWindow {
    /// At most `limit` permits in any sliding window of length `window` (within
    /// the error bound above).
    ///
    /// # Errors
    ///
    /// [`QuotaError::ZeroLimit`], [`QuotaError::ZeroWindow`],
    /// [`QuotaError::WindowTooLong`] above `2^47` µs,
    /// [`QuotaError::LimitTooLarge`] for a limit of `2^31` or more (its two
    /// counts of 32 bits leave no bit for the window number), and
    /// [`QuotaError::WindowTooShort`] when the two counts leave too few bits for
    /// the window number: a window shorter than `2^(2w - 16)` µs for a limit
    /// of `w` bits (250 ns at 100, 1 µs at 255, 65.5 ms at 65,535; see the
    /// table above).
    pub fn new(limit: u32, window: Duration) -> Result<SlidingWindow, QuotaError> {
        let windows = Windows::new(limit, window, 2)?;
        Ok(SlidingWindow {
            windows,
            limit: u64::from(limit),
            count_mask: u64::MAX >> (64 - windows.count_bits()),
        })
    }

    /// The most permits in one window.
    pub const fn limit(&self) -> u32 {
        // Built from a u32.
        self.limit as u32
    }

    /// The window.
    pub const fn window(&self) -> Duration {
        self.windows.duration()
    }

    #[inline(always)]
    const fn current(&self, word: u64) -> u64 {
        word >> (self.windows.index_bits() + self.windows.count_bits())
    }

    #[inline(always)]
    const fn previous(&self, word: u64) -> u64 {
        (word >> self.windows.index_bits()) & self.count_mask
    }

    #[inline(always)]
    const fn pack(&self, previous: u64, current: u64, window: u64) -> u64 {
        let shift = self.windows.index_bits();
        (current << (shift + self.windows.count_bits())) | (previous << shift) | window
    }

    /// `floor(p * e / w)`: how much of the previous window's count has slid out,
    /// divided by the window's reciprocal (a count times a window fits in 64 bits
    /// unless `limit * window >= 2^64` ns).
    #[inline(always)]
    fn faded(&self, s: &State) -> u64 {
        match s.previous.checked_mul(s.into) {
            Some(product) => self.windows.divide(product),
            // `< p`
            None => mul_div(s.previous, s.into, self.windows.nanos()) as u64,
        }
    }

    #[inline(always)]
    fn state(&self, word: u64, now: u64) -> State {
        let (index, into) = self.windows.locate(now);
        let (previous, current) = (self.previous(word), self.current(word));
        let fresh = State {
            previous: 0,
            current: 0,
            window: index,
            ahead: 0,
            into,
            reading_into: into,
        };
        let stored = self.windows.stored(word);
        if previous | current | stored == 0 {
            // A fresh word: as in `FixedWindow::state`, a word counting nothing
            // in a later window still holds a reading behind it to that window.
            return fresh;
        }
        match self.windows.position(stored, index) {
            Position::Same => State {
                previous,
                current,
                ..fresh
            },
            Position::Later(1) => State {
                previous: current,
                ..fresh
            },
            Position::Later(_) => fresh,
            Position::Behind(k) => State {
                previous,
                current,
                window: stored,
                ahead: k,
                into: 0,
                ..fresh
            },
        }
    }
}

/// `floor(a * b / d)` for `d > 0`: in 64 bits when the product fits (a count
/// times a window in nanoseconds, so whenever `limit * window < 2^64` ns), in 128
/// otherwise; a 128-bit division is a library call, several times slower.
#[inline(always)]
fn mul_div(a: u64, b: u64, d: u64) -> u128 {
    match a.checked_mul(b) {
        Some(product) => u128::from(product / d),
        None => u128::from(a) * u128::from(b) / u128::from(d),
    }
}

impl Algorithm for SlidingWindow {
    #[inline]
    fn fresh(&self) -> u64 {
        0
    }

    #[inline]
    fn capacity(&self) -> u32 {
        self.limit()
    }

    // Always: out of line, the decision comes back through memory, and reading
    // it whole after the callee wrote it in parts fails store forwarding.
    #[inline(always)]
    fn decide(&self, word: u64, now: u64, n: u32) -> (Decision, Option<u64>) {
        let s = self.state(word, now);
        let w = self.windows.nanos();
        let n = u64::from(n);
        // The offset, in the counted window or the one after it, from which the
        // request fits.
        let (ahead, offset) = if s.current + n <= self.limit {
            // Admitted when `c + n + p * (w - e) / w <= limit`, that is when
            // `ceil(p * (w - e) / w) = p - floor(p * e / w)` is at most `room`.
            let room = self.limit - s.current - n;
            let faded = self.faded(&s);
            if s.previous <= room + faded {
                // `<= limit`
                let remaining = (room + faded - s.previous) as u32;
                return (
                    Decision::Allowed { remaining },
                    Some(self.pack(s.previous, s.current + n, s.window)),
                );
            }
            // Within this window, once `p * (w - e') <= room * w`; the weight is
            // over, so `p > 0`.
            let fits = mul_div(room, w, s.previous.max(1));
            (s.ahead, u128::from(w).saturating_sub(fits))
        } else {
            // In the next window, where `c` becomes the previous count (`c > 0`):
            // once `c * (w - e') <= (limit - n) * w`.
            let fits = mul_div(self.limit.saturating_sub(n), w, s.current.max(1));
            (s.ahead + 1, u128::from(w).saturating_sub(fits))
        };
        let wait = self.windows.wait(ahead, s.reading_into, offset);
        (
            Decision::Denied {
                retry_after: RetryAfter::from_nanos(wait),
            },
            None,
        )
    }

    #[inline]
    fn remaining(&self, word: u64, now: u64) -> u32 {
        let s = self.state(word, now);
        // `floor(limit - c - p * (w - e) / w)`, at least 0: as in `decide`.
        let faded = self.faded(&s);
        // `<= limit`
        (self.limit.saturating_sub(s.current) + faded).saturating_sub(s.previous) as u32
    }

    #[inline]
    fn refund(&self, word: u64, written: u64, n: u32) -> Option<u64> {
        let n = u64::from(n);
        let (previous, current) = (self.previous(word), self.current(word));
        let stored = self.windows.stored(word);
        // Where the window the permits were counted in sits now: still current,
        // or already the previous one.
        match self.windows.position(self.windows.stored(written), stored) {
            Position::Same => Some(self.pack(previous, current.saturating_sub(n), stored)),
            Position::Later(1) => Some(self.pack(previous.saturating_sub(n), current, stored)),
            _ => None,
        }
    }

    #[inline]
    fn is_fresh_equivalent(&self, word: u64, now: u64) -> bool {
        let s = self.state(word, now);
        s.previous | s.current == 0
    }

    fn fresh_after_idle(&self) -> Duration {
        // Counts in window k weigh nothing from the start of window k + 2.
        self.window().saturating_mul(2)
    }

    fn fresh_by(&self, now: u64) -> Duration {
        // Counts of the window of `now`, or of one before it, weigh nothing
        // once the window after it has ended.
        let w = self.windows.nanos();
        let start = self.windows.divide(now).saturating_mul(w);
        Duration::from_nanos(w - (now - start).min(w)).saturating_add(self.window())
    }

    fn advertise(&self) -> Option<(u32, Duration)> {
        // One window later the previous window's count still weighs fully;
        // two windows later it is gone.
        Some((self.limit(), self.window().saturating_mul(2)))
    }
}

impl crate::algorithm::form::Form for SlidingWindow {
    type Quota = SlidingWindow;

    fn build(quota: SlidingWindow, ceiling: u32) -> Result<SlidingWindow, QuotaError> {
        if quota.limit() > ceiling {
            return Err(QuotaError::AboveCeiling {
                capacity: quota.limit(),
                ceiling,
            });
        }
        let windows = Windows::within(quota.limit(), ceiling, quota.window(), 2, u64::BITS - 1)?;
        Ok(SlidingWindow {
            windows,
            limit: quota.limit,
            count_mask: u64::MAX >> (64 - windows.count_bits()),
        })
    }

    fn quota(&self) -> SlidingWindow {
        // A limit and window that fit the live word fit a plain one, which
        // has more bits for the window number.
        SlidingWindow::new(self.limit(), self.window()).unwrap_or(*self)
    }

    fn to_raw(&self) -> crate::algorithm::form::Raw {
        let [a, b, c, d, e] = self.windows.to_raw();
        [a, b, c, d, e, self.limit, self.count_mask]
    }

    #[inline(always)]
    fn from_raw(raw: &crate::algorithm::form::Raw) -> SlidingWindow {
        SlidingWindow {
            windows: Windows::from_raw([raw[0], raw[1], raw[2], raw[3], raw[4]]),
            limit: raw[5],
            count_mask: raw[6],
        }
    }

    /// The permits the estimate leaves at `now` are kept
    /// ([`remaining`](Algorithm::remaining); for a reading behind the stored
    /// window, at that window's start), at most the new limit, as the count
    /// of the new window containing the counted window's start (or `now`, if
    /// later), with nothing in the previous one: the count becomes
    /// `new limit - kept`. A word whose estimate is 0 at `now` is a fresh one.
    fn convert(&self, to: &SlidingWindow, word: u64, now: u64) -> u64 {
        let s = self.state(word, now);
        if s.previous | s.current == 0 {
            return to.fresh();
        }
        let kept = u64::from(self.remaining(word, now)).min(to.limit);
        let start = self
            .windows
            .divide(now)
            .saturating_add(s.ahead)
            .saturating_mul(self.windows.nanos())
            .max(now);
        let (index, _) = to.windows.locate(start);
        to.pack(0, to.limit - kept, index)
    }
}
