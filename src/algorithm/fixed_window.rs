//! The fixed window counter as a pure function on one word.

use core::time::Duration;

use crate::algorithm::Algorithm;
use crate::algorithm::window::{Position, Windows};
use crate::decision::{Decision, RetryAfter};
use crate::error::QuotaError;

/// The rate-limiter pattern's `FixedWindowLimiter`: at most `limit` permits per
/// window, windows at fixed boundaries from the clock's epoch (0, `window`,
/// `2 * window`, …), the count reset when a request lands in a new window.
///
/// Simple and cheap, but it admits a burst of `limit` just before a boundary and
/// another just after: up to **twice the limit** in a short interval across a
/// boundary. Any interval that is one whole window (from a boundary) admits at
/// most `limit`. A denial waits until the window ends.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{FixedWindow, ManualClock, RateLimiter};
///
/// let clock = ManualClock::new();
/// let limiter = RateLimiter::from_parts(FixedWindow::new(2, Duration::from_secs(1))?, clock.clone());
///
/// clock.set(Duration::from_millis(900));
/// assert!(limiter.try_acquire().is_allowed());
/// assert!(limiter.try_acquire().is_allowed());
/// let denied = limiter.try_acquire();
/// assert_eq!(denied.retry_after().unwrap().duration(), Duration::from_millis(100));
///
/// clock.set(Duration::from_millis(1000)); // a new window: two more at once
/// assert!(limiter.try_acquire_n(2)?.is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # The packed word
///
/// | bits | field |
/// |---|---|
/// | `63 ..= 64-w` | the count in the window, `0 ..= limit` (`w` = bits of `limit`) |
/// | `63-w ..= 0` | the window's number, modulo `2^(64-w)` |
///
/// The window number must span `2^48` µs, so a limit above 65,535 needs windows
/// of more than 1 µs ([`QuotaError::WindowTooShort`] names the minimum). A
/// reading in a window *behind* the stored one (a clock that went back, or a
/// thread that read it before another wrote) counts against the stored window:
/// it never resets the count, unless it is behind by half the window number's
/// span (4.46 years) or more, when it reads as a window that far ahead
/// ([`Clock`](crate::Clock#readings-years-off)). As with the token bucket, a word with a count
/// that sees no request for 4.46 years or more may be misread as behind, which
/// under-admits, never over-admits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedWindow {
    windows: Windows,
    limit: u64,
}

impl FixedWindow {
    /// At most `limit` permits per `window`.
    ///
    /// # Errors
    ///
    /// [`QuotaError::ZeroLimit`], [`QuotaError::ZeroWindow`],
    /// [`QuotaError::WindowTooLong`] above `2^47` µs, and
    /// [`QuotaError::WindowTooShort`] when the limit leaves too few bits for the
    /// window number: the shortest window is `2^(w - 16)` µs for a limit of
    /// `w` bits, so under a microsecond for limits up to 65,535 (1 µs at
    /// 65,535, 2 ns at 64), and up to 65.5 ms for the largest limits.
    pub fn new(limit: u32, window: Duration) -> Result<FixedWindow, QuotaError> {
        Ok(FixedWindow {
            windows: Windows::new(limit, window, 1)?,
            limit: u64::from(limit),
        })
    }

    /// The most permits per window.
    pub const fn limit(&self) -> u32 {
        // Built from a u32.
        self.limit as u32
    }

    /// The window.
    pub const fn window(&self) -> Duration {
        self.windows.duration()
    }

    #[inline(always)]
    const fn count(&self, word: u64) -> u64 {
        word >> self.windows.index_bits()
    }

    #[inline(always)]
    const fn pack(&self, count: u64, index: u64) -> u64 {
        (count << self.windows.index_bits()) | index
    }

    /// The count that applies to a reading in window `index`, the window it is
    /// counted in, and how many windows ahead of the reading that one is.
    #[inline(always)]
    fn state(&self, word: u64, index: u64) -> (u64, u64, u64) {
        let count = self.count(word);
        let stored = self.windows.stored(word);
        if count | stored == 0 {
            // A fresh word: nothing counted, in any window (so it cannot be
            // misread after a wrap). A word left at 0 in a later window (a
            // refund) is not: a reading behind it still counts against that
            // window, or a refund followed by a stale reading would move the
            // window back and admit more than the refund gave.
            return (0, index, 0);
        }
        match self.windows.position(stored, index) {
            Position::Same => (count, index, 0),
            Position::Later(_) => (0, index, 0),
            Position::Behind(k) => (count, stored, k),
        }
    }
}

impl Algorithm for FixedWindow {
    #[inline]
    fn fresh(&self) -> u64 {
        // A count of 0 in window 0: every window starts with a count of 0.
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
        let (index, into) = self.windows.locate(now);
        let (count, window, ahead) = self.state(word, index);
        let n = u64::from(n);
        if count + n <= self.limit {
            // `<= limit <= u32::MAX`
            let remaining = (self.limit - count - n) as u32;
            return (
                Decision::Allowed { remaining },
                Some(self.pack(count + n, window)),
            );
        }
        // Admitted when the counted window ends (`n <= limit`).
        let wait = self.windows.wait(ahead + 1, into, 0);
        (
            Decision::Denied {
                retry_after: RetryAfter::from_nanos(wait),
            },
            None,
        )
    }

    #[inline]
    fn remaining(&self, word: u64, now: u64) -> u32 {
        let (index, _) = self.windows.locate(now);
        let (count, _, _) = self.state(word, index);
        // A refund can only lower a count, so `count <= limit`.
        self.limit.saturating_sub(count) as u32
    }

    #[inline]
    fn refund(&self, word: u64, written: u64, n: u32) -> Option<u64> {
        // The permits were counted in the window `written` holds; once the word has
        // moved to another window they no longer count, and nothing is owed.
        let window = self.windows.stored(written);
        if self.windows.stored(word) != window {
            return None;
        }
        let count = self.count(word).saturating_sub(u64::from(n));
        Some(self.pack(count, window))
    }

    #[inline]
    fn is_fresh_equivalent(&self, word: u64, now: u64) -> bool {
        let (index, _) = self.windows.locate(now);
        self.state(word, index).0 == 0
    }

    fn fresh_after_idle(&self) -> Duration {
        self.window()
    }

    fn fresh_by(&self, now: u64) -> Duration {
        // Counts of the window of `now`, or of one before it, are gone when
        // it ends.
        let w = self.windows.nanos();
        let start = self.windows.divide(now).saturating_mul(w);
        Duration::from_nanos(w - (now - start).min(w))
    }

    fn advertise(&self) -> Option<(u32, Duration)> {
        // Two instants one window apart lie in different windows.
        Some((self.limit(), self.window()))
    }
}

impl FixedWindow {
    /// The window a reading at `now` is counted in, as an absolute window
    /// number of the clock (not wrapped), and the permits left in it: the
    /// stored window when the reading is behind it.
    fn standing(&self, word: u64, now: u64) -> (u64, u64) {
        let absolute = self.windows.divide(now);
        let (index, _) = self.windows.locate(now);
        let (count, _, ahead) = self.state(word, index);
        (
            absolute.saturating_add(ahead),
            self.limit.saturating_sub(count),
        )
    }
}

impl crate::algorithm::form::Form for FixedWindow {
    type Quota = FixedWindow;

    fn build(quota: FixedWindow, ceiling: u32) -> Result<FixedWindow, QuotaError> {
        if quota.limit() > ceiling {
            return Err(QuotaError::AboveCeiling {
                capacity: quota.limit(),
                ceiling,
            });
        }
        Ok(FixedWindow {
            windows: Windows::within(quota.limit(), ceiling, quota.window(), 1, u64::BITS - 1)?,
            limit: quota.limit,
        })
    }

    fn quota(&self) -> FixedWindow {
        // A limit and window that fit the live word fit a plain one, which
        // has more bits for the window number.
        FixedWindow::new(self.limit(), self.window()).unwrap_or(*self)
    }

    fn to_raw(&self) -> crate::algorithm::form::Raw {
        let [a, b, c, d, e] = self.windows.to_raw();
        [a, b, c, d, e, self.limit, 0]
    }

    #[inline(always)]
    fn from_raw(raw: &crate::algorithm::form::Raw) -> FixedWindow {
        FixedWindow {
            windows: Windows::from_raw([raw[0], raw[1], raw[2], raw[3], raw[4]]),
            limit: raw[5],
        }
    }

    /// The permits left in the window counted at `now` are kept, at most the
    /// new limit, in the new window containing that window's start (or
    /// `now`, if later): the count becomes `new limit - kept`. A word with
    /// nothing counted at `now` is a fresh one.
    fn convert(&self, to: &FixedWindow, word: u64, now: u64) -> u64 {
        let (window, left) = self.standing(word, now);
        if left >= self.limit {
            return to.fresh();
        }
        let kept = left.min(to.limit);
        // The start of the counted window, or `now` if later (a reading in
        // that window); saturating, as the clock's range ends.
        let start = window.saturating_mul(self.windows.nanos()).max(now);
        let (index, _) = to.windows.locate(start);
        to.pack(to.limit - kept, index)
    }
}
