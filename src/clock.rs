//! Time as `u64` nanoseconds since a clock's epoch.
//!
//! Three clocks: [`RealClock`] (quanta, monotonic, the default), [`CoarseClock`]
//! (a reading kept fresh by an upkeep thread: about a millisecond of resolution
//! for about a nanosecond per reading), and [`ManualClock`] (set by hand, for tests
//! and examples).

use core::fmt;
use core::time::Duration;

use crate::sync::{Arc, AtomicU64, Ordering};

/// A source of time for a limiter.
///
/// `now` returns nanoseconds since the clock's own epoch. Readings should not go
/// backwards, but limiters tolerate it when they do (TSC skew between cores,
/// a thread preempted between reading the clock and deciding): a reading behind
/// one already seen creates no permits.
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
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now(&self) -> u64 {
        (**self).now()
    }

    fn skip(&self, duration: Duration) -> bool {
        (**self).skip(duration)
    }
}

/// The default clock: quanta's calibrated TSC where the CPU has a usable one,
/// the OS monotonic clock otherwise.
///
/// A reading costs one `rdtsc` and a multiply on x86-64. Creating the first one
/// in a process calibrates quanta against the OS clock (a few milliseconds,
/// once).
#[derive(Clone)]
pub struct RealClock {
    clock: quanta::Clock,
}

impl RealClock {
    /// The process's real clock.
    pub fn new() -> RealClock {
        RealClock {
            clock: quanta::Clock::new(),
        }
    }
}

impl Default for RealClock {
    fn default() -> RealClock {
        RealClock::new()
    }
}

impl Clock for RealClock {
    #[inline]
    fn now(&self) -> u64 {
        self.clock.delta_as_nanos(0, self.clock.raw())
    }
}

impl fmt::Debug for RealClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RealClock").finish_non_exhaustive()
    }
}

/// A cheap, coarse clock: one load of a shared word that an upkeep thread
/// refreshes from [`RealClock`] every `resolution` (1 ms by default).
///
/// For callers who take speed over precision: a limiter on this clock sees time
/// in steps of the resolution, so refills arrive up to one resolution late (it
/// under-credits, never over-credits). Clones share one upkeep thread; it stops
/// when the last clone is dropped.
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
#[cfg(not(turnstile_loom))]
#[derive(Clone)]
pub struct CoarseClock {
    shared: Arc<coarse::Shared>,
}

#[cfg(not(turnstile_loom))]
impl CoarseClock {
    /// A coarse clock refreshed every millisecond.
    ///
    /// # Errors
    ///
    /// The upkeep thread could not be spawned.
    pub fn new() -> std::io::Result<CoarseClock> {
        CoarseClock::with_resolution(Duration::from_millis(1))
    }

    /// A coarse clock refreshed every `resolution`.
    ///
    /// # Errors
    ///
    /// `resolution` is zero (`InvalidInput`: the thread would spin a core), or the
    /// upkeep thread could not be spawned.
    pub fn with_resolution(resolution: Duration) -> std::io::Result<CoarseClock> {
        if resolution.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "coarse clock resolution is zero; it must be at least 1 ns (1 ms is typical)",
            ));
        }
        coarse::start(resolution).map(|shared| CoarseClock { shared })
    }

    /// How often the upkeep thread refreshes the reading.
    pub fn resolution(&self) -> Duration {
        self.shared.resolution
    }
}

#[cfg(not(turnstile_loom))]
impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> u64 {
        // Relaxed: the reading publishes no other data; any recent value will do,
        // and coherence keeps one thread's readings from going backwards.
        self.shared.now.load(Ordering::Relaxed)
    }
}

#[cfg(not(turnstile_loom))]
impl fmt::Debug for CoarseClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoarseClock")
            .field("resolution", &self.shared.resolution)
            .field("now", &self.now())
            .finish()
    }
}

#[cfg(not(turnstile_loom))]
mod coarse {
    use core::time::Duration;
    use std::sync::{Mutex, PoisonError, Weak};
    use std::thread::{self, JoinHandle};

    use crossbeam_utils::CachePadded;

    use super::{Clock, RealClock};
    use crate::sync::{Arc, AtomicU64, Ordering};

    pub(super) struct Shared {
        /// The latest reading. Padded: every limiter thread reads this line, and
        /// only the upkeep thread writes it.
        pub(super) now: CachePadded<AtomicU64>,
        pub(super) resolution: Duration,
        upkeep: Mutex<Option<JoinHandle<()>>>,
    }

    pub(super) fn start(resolution: Duration) -> std::io::Result<Arc<Shared>> {
        let real = RealClock::new();
        let shared = Arc::new(Shared {
            now: CachePadded::new(AtomicU64::new(real.now())),
            resolution,
            upkeep: Mutex::new(None),
        });
        // The thread holds only a weak reference, so dropping the last clock ends it.
        let weak: Weak<Shared> = Arc::downgrade(&shared);
        let handle = thread::Builder::new()
            .name("turnstile-coarse-clock".into())
            .spawn(move || {
                loop {
                    thread::park_timeout(resolution);
                    let Some(shared) = weak.upgrade() else { return };
                    // Relaxed: see `CoarseClock::now`. `fetch_max` keeps the reading
                    // monotonic even if this thread migrates to a core whose TSC lags.
                    shared.now.fetch_max(real.now(), Ordering::Relaxed);
                }
            })?;
        *shared.upkeep.lock().unwrap_or_else(PoisonError::into_inner) = Some(handle);
        Ok(shared)
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
}

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

    /// Set the time to `since_epoch`. Setting it backwards is allowed (limiters
    /// create no permits from it); times beyond `u64::MAX` nanoseconds (584
    /// years) saturate.
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
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ManualClock").field(&self.elapsed()).finish()
    }
}

/// `d` in nanoseconds, saturating at `u64::MAX` (584 years).
pub(crate) fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
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

    #[test]
    fn real_clock_moves_forward() {
        let clock = RealClock::new();
        let a = clock.now();
        std::thread::sleep(Duration::from_millis(2));
        let b = clock.now();
        assert!(b > a, "{a} then {b}");
    }

    #[test]
    fn coarse_clock_tracks_the_real_clock_and_stops_on_drop() {
        let clock = CoarseClock::with_resolution(Duration::from_millis(1)).unwrap();
        let real = RealClock::new();
        let before = clock.now();
        std::thread::sleep(Duration::from_millis(30));
        let after = clock.now();
        assert!(after > before, "{before} then {after}");
        // Never ahead of the real clock it samples.
        assert!(after <= real.now());
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
    fn coarse_clock_refuses_zero_resolution() {
        let err = CoarseClock::with_resolution(Duration::ZERO).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    }
}
