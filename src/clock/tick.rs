//! [`TickClock`]: a clock read from a closure, for a time source of the
//! application's own.

use core::fmt;
use core::num::NonZeroU64;

use super::Clock;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// A clock read from a closure over a monotonic tick source: a hardware
/// timer or cycle counter on a target without an OS, an RTOS's tick count,
/// or any time source of the application's own. It needs no `std`.
///
/// The closure returns ticks at a fixed rate (`ticks_per_second`), which the
/// clock turns into nanoseconds: `floor(ticks * 10^9 / ticks_per_second)`,
/// exactly, saturating at `u64::MAX` nanoseconds (584 years). Readings should
/// not go back ([`Clock`] says what a limiter makes of one that does): a
/// counter narrower than 64 bits must be extended by the application, since a
/// wrap to zero reads as a clock set back, and the limiter then admits
/// nothing new until the clock has caught up with the word's time; a
/// [`WarmUp`](crate::WarmUp) word (of a nonzero warm-up) instead takes a wrap
/// further back than its stretch behind (the larger of its cold fill time
/// plus warm-up period and `2^32` time units, 71.6 minutes at 1 µs) as a long
/// idle, and finds the bucket fresh, refilled
/// ([`Clock`](Clock#readings-years-off)).
///
/// ```
/// use core::sync::atomic::{AtomicU64, Ordering};
/// use turnstile::{Clock, Quota, RateLimiter, TickClock};
///
/// // A 32,768 Hz timer, here a counter the test moves by hand.
/// static TICKS: AtomicU64 = AtomicU64::new(0);
/// let clock = TickClock::new(32_768.try_into()?, || TICKS.load(Ordering::Relaxed));
///
/// TICKS.store(16_384, Ordering::Relaxed);
/// assert_eq!(clock.now(), 500_000_000); // half a second
///
/// let limiter = RateLimiter::with_clock(Quota::per_second(2)?, clock);
/// assert!(limiter.try_acquire().is_allowed());
/// assert!(limiter.try_acquire().is_allowed());
/// assert!(!limiter.try_acquire().is_allowed());
/// TICKS.store(16_384 + 32_768, Ordering::Relaxed); // one second later
/// assert_eq!(limiter.remaining(), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A closure that returns nanoseconds itself takes [`TickClock::nanos`].
#[derive(Clone, Copy)]
pub struct TickClock<F> {
    read: F,
    ticks_per_second: NonZeroU64,
}

impl<F: Fn() -> u64 + Send + Sync> TickClock<F> {
    /// A clock whose `read` returns ticks at `ticks_per_second`.
    pub const fn new(ticks_per_second: NonZeroU64, read: F) -> TickClock<F> {
        TickClock {
            read,
            ticks_per_second,
        }
    }

    /// A clock whose `read` returns nanoseconds.
    pub const fn nanos(read: F) -> TickClock<F> {
        // 10^9 is not zero; the fallback only keeps the type's promise
        // without `unsafe` or a panic.
        let hz = match NonZeroU64::new(NANOS_PER_SEC) {
            Some(hz) => hz,
            None => NonZeroU64::MIN,
        };
        TickClock::new(hz, read)
    }

    /// The tick rate the closure counts at.
    pub const fn ticks_per_second(&self) -> NonZeroU64 {
        self.ticks_per_second
    }
}

/// `ticks` at `hz` per second in nanoseconds, rounded down, saturating at
/// `u64::MAX`.
#[inline]
fn ticks_to_nanos(ticks: u64, hz: NonZeroU64) -> u64 {
    let hz = hz.get();
    if hz == NANOS_PER_SEC {
        return ticks;
    }
    // ticks = q·hz + r, so ticks·10^9/hz = q·10^9 + r·10^9/hz exactly, and
    // `r < hz` keeps r·10^9 within 64 bits while hz is below 18.4 GHz; two
    // 64-bit divisions, not one of 128 bits.
    let (q, r) = (ticks / hz, ticks % hz);
    let part = match r.checked_mul(NANOS_PER_SEC) {
        Some(scaled) => scaled / hz,
        None => {
            // hz above 18.4 GHz. The quotient is below 10^9 (`r < hz`), so
            // the cast keeps it whole.
            (u128::from(r) * u128::from(NANOS_PER_SEC) / u128::from(hz)) as u64
        }
    };
    q.saturating_mul(NANOS_PER_SEC).saturating_add(part)
}

impl<F: Fn() -> u64 + Send + Sync> Clock for TickClock<F> {
    #[inline]
    fn now(&self) -> u64 {
        ticks_to_nanos((self.read)(), self.ticks_per_second)
    }
}

impl<F> fmt::Debug for TickClock<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TickClock")
            .field("ticks_per_second", &self.ticks_per_second)
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(turnstile_loom)))]
mod tests {
    use super::*;

    /// The conversion against the 128-bit formula it stands for.
    fn reference(ticks: u64, hz: u64) -> u64 {
        u64::try_from(u128::from(ticks) * u128::from(NANOS_PER_SEC) / u128::from(hz))
            .unwrap_or(u64::MAX)
    }

    #[test]
    fn ticks_convert_exactly_and_saturate() {
        let rates = [
            1,
            3,
            1_000,
            32_768,
            1_000_000,
            80_000_000,
            999_999_937,
            NANOS_PER_SEC,
            3_000_000_000,
            u64::MAX / NANOS_PER_SEC,
            u64::MAX / NANOS_PER_SEC + 1,
            u64::MAX,
        ];
        let mut ticks = vec![0, 1, 2, 999, u64::MAX - 1, u64::MAX];
        // A spread of readings: x ↦ 6364136223846793005·x + 1, the
        // multiplier of Knuth's MMIX generator.
        let mut x = 1u64;
        for _ in 0..2_000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            ticks.push(x);
            ticks.push(x >> 20);
            ticks.push(x >> 40);
        }
        for &hz in &rates {
            let nz = NonZeroU64::new(hz).expect("every rate listed is above zero");
            for &t in &ticks {
                assert_eq!(
                    ticks_to_nanos(t, nz),
                    reference(t, hz),
                    "{t} ticks at {hz} Hz"
                );
            }
        }
    }

    #[test]
    fn a_tick_clock_reads_its_closure() {
        let counter = std::sync::Arc::new(crate::sync::AtomicU64::new(0));
        let source = counter.clone();
        // Relaxed: a test's counter, read on this thread only.
        let clock = TickClock::new(NonZeroU64::new(1_000).expect("1000 > 0"), move || {
            source.load(crate::sync::Ordering::Relaxed)
        });
        assert_eq!(clock.now(), 0);
        counter.store(1_500, crate::sync::Ordering::Relaxed);
        assert_eq!(clock.now(), 1_500_000_000);
        let nanos = TickClock::nanos(|| 42);
        assert_eq!(nanos.now(), 42);
        assert_eq!(nanos.ticks_per_second().get(), NANOS_PER_SEC);
        assert_eq!(
            format!("{clock:?}"),
            "TickClock { ticks_per_second: 1000, .. }"
        );
    }
}
