//! [`CoarseClock`]: a reading that an upkeep thread of its own keeps fresh
//! from the OS monotonic clock, and that thread.

use core::fmt;
use core::time::Duration;
use std::sync::{Mutex, PoisonError, Weak};
use std::thread::{self, JoinHandle};

use crossbeam_utils::CachePadded;

use super::{Clock, MonotonicClock};
use crate::sync::{Arc, AtomicU64, Ordering};

/// A cheap, coarse clock: one load of a shared word that an upkeep thread
/// refreshes from the OS monotonic clock ([`MonotonicClock`]) every
/// `resolution` (1 ms by default); its epoch is when it was created.
///
/// The upkeep reads the OS clock rather than the TSC: it reads once per
/// resolution, so the TSC's speed buys nothing there, and the OS clock is the
/// one the kernel vouches for.
///
/// For callers who take speed over precision: a limiter on this clock sees time
/// in steps of the resolution. A reading is never early (it under-credits,
/// never over-credits) but it is late: by up to one resolution, plus however
/// long the upkeep thread waits to be woken and run once its sleep is over.
/// That delay is the OS scheduler's, and nothing bounds it: typically tens of
/// microseconds, so that now and then a reading is more than one resolution
/// late; under load it can be milliseconds, and while the thread is not run at
/// all the reading stands still. The thread sleeps to the next point of a grid
/// of the resolution, read from the OS clock, so that its delays do not add up
/// from one refresh to the next. Clones share one upkeep thread; it stops when
/// the last clone is dropped.
///
/// The thread is the clock's own rather than quanta's global upkeep: quanta allows
/// one upkeep per process, so a second user (another library) would make ours
/// fail to start, and its owner stopping it would freeze our time.
///
/// ```
/// use turnstile::{Clock, CoarseClock};
///
/// let clock = CoarseClock::new()?;
/// let a = clock.now();
/// std::thread::sleep(std::time::Duration::from_millis(20));
/// assert!(clock.now() > a);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone)]
pub struct CoarseClock {
    shared: Arc<Shared>,
}

impl CoarseClock {
    /// A coarse clock refreshed every millisecond.
    ///
    /// # Errors
    ///
    /// The upkeep thread could not be spawned.
    pub fn new() -> std::io::Result<CoarseClock> {
        CoarseClock::with_resolution(Duration::from_millis(1))
    }

    /// The finest resolution [`with_resolution`](Self::with_resolution)
    /// takes: 100 µs. Finer, the upkeep thread wakes tens of thousands of
    /// times a second (a core's worth of wake-ups on a loaded host), while
    /// the OS clock's own reading ([`RealClock`](crate::RealClock)) costs
    /// tens of nanoseconds and is exact: a coarse clock that fine buys
    /// nothing.
    pub const MIN_RESOLUTION: Duration = Duration::from_micros(100);

    /// A coarse clock refreshed every `resolution`.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a resolution below [`MIN_RESOLUTION`](Self::MIN_RESOLUTION)
    /// (100 µs; zero included), or the upkeep thread could not be spawned.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::CoarseClock;
    ///
    /// assert!(CoarseClock::with_resolution(Duration::from_millis(5)).is_ok());
    /// let err = CoarseClock::with_resolution(Duration::from_nanos(1)).unwrap_err();
    /// assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    /// ```
    pub fn with_resolution(resolution: Duration) -> std::io::Result<CoarseClock> {
        if resolution < CoarseClock::MIN_RESOLUTION {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "coarse clock resolution {resolution:?} is below the finest kept, 100µs \
                     (1 ms is typical; for finer readings use RealClock)"
                ),
            ));
        }
        start(resolution).map(|shared| CoarseClock { shared })
    }

    /// How often the upkeep thread refreshes the reading.
    pub fn resolution(&self) -> Duration {
        self.shared.resolution
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> u64 {
        // Relaxed: the reading publishes no other data; any recent value will do,
        // and coherence keeps one thread's readings from going backwards.
        self.shared.now.load(Ordering::Relaxed)
    }
}

impl fmt::Debug for CoarseClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoarseClock")
            .field("resolution", &self.shared.resolution)
            .field("now", &self.now())
            .finish()
    }
}

pub(super) struct Shared {
    /// The latest reading. Padded: every limiter thread reads this line, and
    /// only the upkeep thread writes it.
    pub(super) now: CachePadded<AtomicU64>,
    pub(super) resolution: Duration,
    /// The clock the upkeep thread samples.
    pub(super) os: MonotonicClock,
    upkeep: Mutex<Option<JoinHandle<()>>>,
}

pub(super) fn start(resolution: Duration) -> std::io::Result<Arc<Shared>> {
    let os = MonotonicClock::new();
    let first = os.now();
    let shared = Arc::new(Shared {
        now: CachePadded::new(AtomicU64::new(first)),
        os,
        resolution,
        upkeep: Mutex::new(None),
    });
    // The thread holds only a weak reference, so dropping the last clock ends it.
    let weak: Weak<Shared> = Arc::downgrade(&shared);
    // At least 100 µs (`MIN_RESOLUTION`), and below 2^64 ns (584 years).
    let step = u64::try_from(resolution.as_nanos()).unwrap_or(u64::MAX);
    let handle = thread::Builder::new()
        .name("turnstile-coarse-clock".into())
        .spawn(move || {
            let mut due = first.saturating_add(step);
            let mut sleep = resolution;
            loop {
                thread::park_timeout(sleep);
                let Some(shared) = weak.upgrade() else { return };
                let now = shared.os.now();
                // Relaxed: see `CoarseClock::now`. `fetch_max` keeps the reading
                // monotonic whatever the platform's `Instant` does.
                shared.now.fetch_max(now, Ordering::Relaxed);
                sleep = Duration::from_nanos(next_sleep(&mut due, now, step));
            }
        })?;
    *shared.upkeep.lock().unwrap_or_else(PoisonError::into_inner) = Some(handle);
    Ok(shared)
}

/// How long the upkeep thread sleeps after a refresh at `now`: until `due`, the
/// next point of its grid (`due` moves on, to the first point after `now`, once
/// `now` has reached it). A wake-up that came late shortens the next sleep by as
/// much, so the refreshes keep to the grid instead of each adding its delay to
/// the next; one later than a whole step (a thread not run for a while) skips
/// the points it missed rather than refreshing in a burst; one that came early
/// (a spurious wake-up) sleeps on to the same point.
fn next_sleep(due: &mut u64, now: u64, step: u64) -> u64 {
    if now >= *due {
        // `now - due` < 2^64, and its remainder < `step`: the point is after
        // `now`, by at most one step.
        *due = now.saturating_add(step - (now - *due) % step);
    }
    match *due - now {
        // Only where the grid meets the end of time (584 years on).
        0 => step,
        sleep => sleep,
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let handle = self
            .upkeep
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(handle) = handle {
            // The upkeep thread may itself hold the last reference for an
            // instant; it then simply returns on its next upgrade.
            if handle.thread().id() != thread::current().id() {
                handle.thread().unpark();
                let _ = handle.join();
            }
        }
    }
}

#[cfg(all(test, not(turnstile_loom)))]
mod tests {
    use super::*;

    #[test]
    fn coarse_clock_tracks_the_os_clock_and_stops_on_drop() {
        let clock = CoarseClock::with_resolution(Duration::from_millis(1)).unwrap();
        let before = clock.now();
        let mark = clock.shared.os.now();
        // It catches up with a reading of the OS clock taken before: waited
        // for, not timed, since on a loaded machine the upkeep thread may
        // not run for a while (5 s is a hang guard).
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while clock.now() < mark {
            assert!(
                std::time::Instant::now() < deadline,
                "the coarse clock does not move"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let after = clock.now();
        assert!(after > before, "{before} then {after}");
        // Never ahead of the OS clock it samples.
        let os = clock.shared.os.now();
        assert!(after <= os, "{after} ahead of {os}");
        let weak = Arc::downgrade(&clock.shared);
        drop(clock);
        // The upkeep thread holds a strong reference for an instant each tick at
        // most; give it a generous second to let go.
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        while weak.upgrade().is_some() {
            assert!(
                std::time::Instant::now() < deadline,
                "the upkeep thread keeps it alive"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn the_upkeep_sleeps_to_the_next_point_of_its_grid() {
        let step = 1_000;
        let mut due = 1_000;
        // On time, or late by less than a step: the next point.
        assert_eq!(next_sleep(&mut due, 1_000, step), 1_000);
        assert_eq!(due, 2_000);
        assert_eq!(next_sleep(&mut due, 2_300, step), 700);
        assert_eq!(due, 3_000);
        // Early (a spurious wake-up): the same point.
        assert_eq!(next_sleep(&mut due, 2_900, step), 100);
        assert_eq!(due, 3_000);
        // Several steps late: the points missed are skipped.
        assert_eq!(next_sleep(&mut due, 7_250, step), 750);
        assert_eq!(due, 8_000);
        // At the end of time: no overflow.
        let mut due = u64::MAX - 10;
        assert_eq!(next_sleep(&mut due, u64::MAX - 5, step), 5);
        assert_eq!(due, u64::MAX);
        assert_eq!(next_sleep(&mut due, u64::MAX, step), step);
    }

    #[test]
    fn coarse_clock_refuses_a_resolution_below_the_floor() {
        for too_fine in [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_micros(99),
        ] {
            let err = CoarseClock::with_resolution(too_fine).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
            assert!(err.to_string().contains("100µs"), "{err}");
        }
        let floor = CoarseClock::with_resolution(CoarseClock::MIN_RESOLUTION).unwrap();
        assert_eq!(floor.resolution(), CoarseClock::MIN_RESOLUTION);
    }
}
