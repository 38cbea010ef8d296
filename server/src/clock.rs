//! The service's clock: the real one, with windows on the calendar's
//! boundaries, or a manual one for tests.

use std::time::{SystemTime, UNIX_EPOCH};

use turnstile::{Clock, ManualClock, RealClock};

/// Nanoseconds in a day: every unit of the configuration divides it.
const DAY_NANOS: u64 = 86_400 * 1_000_000_000;

/// The clock every limit of a service reads.
///
/// The windows of `fixed_window` and `sliding_window` sit at fixed
/// boundaries from the clock's zero. [`ServiceClock::real`] places that zero
/// on a midnight (UTC) of the wall clock, so a minute's window starts on the
/// minute and a day's at midnight, as envoyproxy/ratelimit's do, while the
/// readings themselves come from the monotonic clock (a wall clock set back
/// moves no window). [`ServiceClock::manual`] is for tests: time moves only
/// when the test advances it.
#[derive(Clone, Debug)]
pub enum ServiceClock {
    /// The real clock, shifted so that its zero falls on a midnight (UTC).
    Real {
        /// The monotonic clock.
        clock: RealClock,
        /// Added to its readings: the time since the last midnight (UTC) at
        /// the clock's zero.
        offset: u64,
    },
    /// A clock that moves only when told to.
    Manual(ManualClock),
}

impl ServiceClock {
    /// The real clock, its zero on a midnight (UTC).
    pub fn real() -> ServiceClock {
        let clock = RealClock::new();
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_nanos() % u128::from(DAY_NANOS)).unwrap_or(0)
            });
        // Within a day of the real clock's zero: the offset is the wall
        // clock's time of day less the monotonic reading, modulo a day.
        let offset = (wall + DAY_NANOS - clock.now() % DAY_NANOS) % DAY_NANOS;
        ServiceClock::Real { clock, offset }
    }

    /// A manual clock, for tests (its clones share one time).
    pub fn manual(clock: ManualClock) -> ServiceClock {
        ServiceClock::Manual(clock)
    }
}

impl Default for ServiceClock {
    fn default() -> ServiceClock {
        ServiceClock::real()
    }
}

impl Clock for ServiceClock {
    #[inline]
    fn now(&self) -> u64 {
        match self {
            // A reading is at most ~584 years of nanoseconds; the offset is
            // under a day: the sum wraps only after centuries of uptime, and
            // the algorithms compare times with wrapping arithmetic.
            ServiceClock::Real { clock, offset } => clock.now().wrapping_add(*offset),
            ServiceClock::Manual(clock) => clock.now(),
        }
    }
}
