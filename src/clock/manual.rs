//! [`ManualClock`]: a clock set by hand, for tests, examples and replays.

use core::fmt;
use core::time::Duration;

use super::{Clock, saturating_nanos};
use crate::sync::{Arc, AtomicU64, Ordering};

/// A clock set by hand: the rate-limiter pattern's `FakeClock`, for tests,
/// examples and replaying recorded traffic.
///
/// Clones share one time, so a test keeps a clone and moves time under the
/// limiter that owns the other.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// let view = clock.clone();
/// clock.set(Duration::from_millis(300));
/// clock.advance(Duration::from_millis(200));
/// assert_eq!(view.now(), 500_000_000);
/// ```
#[derive(Clone)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at time zero.
    pub fn new() -> ManualClock {
        ManualClock {
            nanos: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Set the time to `since_epoch`. Setting it backwards is allowed: a word's
    /// time never moves back, so a limiter creates no permits from it, with two
    /// exceptions. A [`WarmUp`](crate::WarmUp) word (of a nonzero warm-up)
    /// takes a reading further behind it than its stretch behind, the larger of
    /// its cold fill time plus warm-up period and `2^32` time units (71.6
    /// minutes at 1 µs), as one after a long idle, and finds the bucket fresh:
    /// setting the clock back 72 minutes refills it (the other words do so only
    /// for a step back beyond half their span, years, and GCRA's never:
    /// [`Clock`](Clock#readings-years-off)). And a key of a keyed limiter swept
    /// at the later time comes back fresh at the earlier one, where its old
    /// word would still have counted: the spread of readings of [`Clock`]'s
    /// "Readings that disagree", here as large as the step back, once per such
    /// sweep (and a refund of an admission made before the sweep can then find
    /// the re-created key's word alike and take it). Times beyond `u64::MAX`
    /// nanoseconds (584 years) saturate.
    pub fn set(&self, since_epoch: Duration) {
        self.set_nanos(saturating_nanos(since_epoch));
    }

    /// Set the time in nanoseconds.
    pub fn set_nanos(&self, nanos: u64) {
        // Relaxed: the time publishes no other data (see `Cell`'s orderings); a
        // test orders its threads by joining them.
        self.nanos.store(nanos, Ordering::Relaxed);
    }

    /// Move the time forward by `by`, saturating at `u64::MAX` nanoseconds.
    pub fn advance(&self, by: Duration) {
        let by = saturating_nanos(by);
        // Relaxed: as in `set_nanos`. The closure never returns `None`.
        let _ = self
            .nanos
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(by))
            });
    }

    /// The time as a [`Duration`] since the epoch.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.now())
    }
}

impl Default for ManualClock {
    fn default() -> ManualClock {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> u64 {
        // Relaxed: as in `set_nanos`.
        self.nanos.load(Ordering::Relaxed)
    }

    /// Advances the clock by `duration`: a wait on a manual clock takes no real
    /// time.
    fn skip(&self, duration: Duration) -> bool {
        self.advance(duration);
        true
    }

    /// Clones share their count: the count's address names them.
    fn shared_readings(&self) -> Option<usize> {
        Some(Arc::as_ptr(&self.nanos).addr())
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ManualClock").field(&self.elapsed()).finish()
    }
}

#[cfg(all(test, not(turnstile_loom)))]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_set_advance_and_saturate() {
        let clock = ManualClock::new();
        assert_eq!(clock.now(), 0);
        clock.advance(Duration::from_millis(1));
        assert_eq!(clock.now(), 1_000_000);
        clock.set(Duration::from_nanos(5));
        assert_eq!(clock.now(), 5);
        clock.set(Duration::MAX);
        assert_eq!(clock.now(), u64::MAX);
        clock.advance(Duration::from_secs(1));
        assert_eq!(clock.now(), u64::MAX);
    }
}
