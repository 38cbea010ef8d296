//! The service's clock: the real one, with windows on the calendar's
//! boundaries, or a manual one for tests.

use std::time::{SystemTime, UNIX_EPOCH};

use turnstile::{Clock, ManualClock, RealClock};

/// Nanoseconds in a day.
const DAY_NANOS: u64 = 86_400 * 1_000_000_000;

/// 15,330 days (about 42 years), the least common multiple of the units'
/// lengths (a day, 7, 30 and 365 days): every unit of the configuration
/// divides it, so a clock whose zero is a multiple of it from the Unix
/// epoch has every unit's windows where envoyproxy/ratelimit has them
/// (`now / unit`). Its nanoseconds fit a `u64` 13 times over.
const ALIGN_NANOS: u64 = 15_330 * DAY_NANOS;

/// The clock every limit of a service reads.
///
/// The windows of `fixed_window` and `sliding_window` sit at fixed
/// boundaries from the clock's zero. [`ServiceClock::real`] places that zero
/// on a multiple of 15,330 days from the Unix epoch, so a minute's window
/// starts on the minute, a day's at midnight (UTC) and a week's, month's
/// (30 days) or year's (365 days) on a multiple of its length from the
/// epoch, as envoyproxy/ratelimit's do, while the
/// readings themselves come from the monotonic clock (a wall clock set back
/// moves no window). [`ServiceClock::manual`] is for tests: time moves only
/// when the test advances it.
#[derive(Clone, Debug)]
pub enum ServiceClock {
    /// The real clock, shifted so that its zero falls on a multiple of
    /// every unit from the Unix epoch.
    Real {
        /// The monotonic clock.
        clock: RealClock,
        /// Added to its readings: the wall clock's time since the last
        /// multiple of 15,330 days from the epoch, at the clock's zero.
        offset: u64,
    },
    /// A clock that moves only when told to.
    Manual(ManualClock),
}

impl ServiceClock {
    /// The real clock, its zero on a multiple of every unit from the Unix
    /// epoch (a midnight, UTC, among them).
    pub fn real() -> ServiceClock {
        let clock = RealClock::new();
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_nanos() % u128::from(ALIGN_NANOS)).unwrap_or(0)
            });
        // The offset is the wall clock's time since the last alignment less
        // the monotonic reading, modulo the alignment: below 2^61, so the
        // sums cannot overflow.
        let offset = (wall + ALIGN_NANOS - clock.now() % ALIGN_NANOS) % ALIGN_NANOS;
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
            // under 42 years: the sum wraps only after centuries of uptime, and
            // the algorithms compare times with wrapping arithmetic.
            ServiceClock::Real { clock, offset } => clock.now().wrapping_add(*offset),
            ServiceClock::Manual(clock) => clock.now(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real clock's windows of every unit sit where envoyproxy/ratelimit
    /// puts them: at multiples of the unit from the Unix epoch.
    #[test]
    fn every_unit_is_aligned_on_the_epoch() {
        let clock = ServiceClock::real();
        let now = u128::from(clock.now());
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_nanos();
        for days in [1_u128, 7, 30, 365] {
            let unit = days * u128::from(DAY_NANOS);
            let apart = (wall % unit + unit - now % unit) % unit;
            // The two readings are a moment apart (and the wall clock may
            // have been stepped in between, by little).
            let apart = apart.min(unit - apart);
            assert!(apart < 1_000_000_000, "{days} days: {apart} ns apart");
        }
    }
}
