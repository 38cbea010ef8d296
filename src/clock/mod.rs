//! Time as `u64` nanoseconds since a clock's epoch.
//!
//! Five clocks:
//!
//! - [`RealClock`], the default: the TSC through quanta where the kernel itself
//!   keeps time on the TSC and the TSC's rate agrees with the OS clock's at
//!   start, the OS monotonic clock otherwise (checked once per process).
//! - [`MonotonicClock`]: the OS monotonic clock (`std::time::Instant`).
//! - [`TscClock`]: quanta's calibrated TSC, unchecked.
//! - [`CoarseClock`]: a reading kept fresh by an upkeep thread from the OS
//!   monotonic clock: about a millisecond of resolution for about a nanosecond
//!   per reading.
//! - [`ManualClock`]: set by hand, for tests and examples.

use core::fmt;
use core::time::Duration;
use std::sync::OnceLock;
use std::time::Instant;

use crate::sync::{Arc, AtomicU64, Ordering};

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
/// So:
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
}

/// What [`skip_sleep`] did with a sleep.
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
}

/// The OS monotonic clock: [`std::time::Instant`], nanoseconds since the clock
/// was created.
///
/// On Linux a reading is `clock_gettime(CLOCK_MONOTONIC)` through the vDSO: the
/// kernel's own clocksource, which the kernel checks (TSCs synchronized across
/// CPUs at boot, a watchdog against a second clock after) and replaces when it
/// finds it unreliable. It costs about three TSC reads (35–40 ns against
/// 12–13 ns on the machine of `BENCHMARKS.md`; a decision on it, 47–51 ns
/// against 16–22 ns) and is never wrong in a way the kernel would not also be. Choose it when readings must agree across cores whatever
/// the hardware; [`RealClock`] reads it wherever it does not trust the TSC.
///
/// ```
/// use turnstile::{Clock, MonotonicClock};
///
/// let clock = MonotonicClock::new();
/// let a = clock.now();
/// std::thread::sleep(std::time::Duration::from_millis(2));
/// assert!(clock.now() >= a + 2_000_000);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    epoch: Instant,
}

impl MonotonicClock {
    /// A clock whose epoch is now.
    pub fn new() -> MonotonicClock {
        MonotonicClock {
            epoch: Instant::now(),
        }
    }

    /// A clock whose epoch is `epoch` (readings before it are 0).
    pub fn since(epoch: Instant) -> MonotonicClock {
        MonotonicClock { epoch }
    }
}

impl Default for MonotonicClock {
    fn default() -> MonotonicClock {
        MonotonicClock::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> u64 {
        // `saturating_duration_since`: an `Instant` before the epoch reads 0
        // rather than panicking on a platform whose clock misbehaves.
        saturating_nanos(Instant::now().saturating_duration_since(self.epoch))
    }
}

/// quanta's TSC clock, unchecked: one `rdtsc` and a multiply per reading on
/// x86-64 (the system counter on AArch64), scaled to nanoseconds since the
/// counter's zero.
///
/// quanta reads the counter only where CPUID reports an invariant TSC and
/// `rdtscp` (x86-64) or on AArch64, and the OS clock otherwise. The first
/// clock in a process calibrates the counter's rate against the OS clock in a
/// busy loop (at least 500 rounds of 1 µs, until the mean error is under
/// 10 ns, at most 200 ms). quanta does *not* check that the TSCs of different
/// cores agree, whether the kernel trusts the TSC, or whether the rate drifts
/// after calibration: on hardware whose TSCs are offset between cores, a thread
/// that migrates sees time jump (limiters then under-admit; see [`Clock`] for
/// the bound on over-admission). [`RealClock`] adds those checks; this clock
/// is for machines known to be good, and for measuring.
#[derive(Clone)]
pub struct TscClock {
    clock: quanta::Clock,
}

impl TscClock {
    /// quanta's clock (calibrated on first use in a process, a few
    /// milliseconds).
    pub fn new() -> TscClock {
        TscClock {
            clock: quanta::Clock::new(),
        }
    }
}

impl Default for TscClock {
    fn default() -> TscClock {
        TscClock::new()
    }
}

impl Clock for TscClock {
    #[inline]
    fn now(&self) -> u64 {
        self.clock.delta_as_nanos(0, self.clock.raw())
    }
}

impl fmt::Debug for TscClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TscClock").finish_non_exhaustive()
    }
}

/// What [`RealClock`] reads in this process, and why: the verdict of its
/// start-up check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClockSource {
    /// The TSC, through [`TscClock`]: the kernel keeps its own time on it and
    /// its rate agreed with the OS clock's within [`RealClock::RATE_TOLERANCE_PPM`].
    /// (On a CPU without an invariant TSC, quanta itself reads the OS clock
    /// behind [`TscClock`], and the rate check passes on that.)
    Tsc {
        /// The TSC's rate against the OS clock's, in parts per million
        /// (positive: the TSC ran fast).
        rate_error_ppm: i64,
    },
    /// The OS clock ([`MonotonicClock`]): the kernel does not keep its time on
    /// the TSC (on Linux, `current_clocksource` is not `tsc` on x86-64 or
    /// `arch_sys_counter` on AArch64), or the platform offers no verdict to
    /// read (every OS but Linux, and Linux on other architectures).
    OsUntrusted,
    /// The OS clock: the TSC's rate disagreed with the OS clock's by more than
    /// [`RealClock::RATE_TOLERANCE_PPM`] in each of three attempts, or went
    /// backwards across the check's sleep (then `i64::MIN`, at once).
    OsRateMismatch {
        /// The smallest disagreement measured, in parts per million.
        rate_error_ppm: i64,
    },
}

impl ClockSource {
    /// Whether [`RealClock`] reads the TSC.
    pub const fn is_tsc(self) -> bool {
        matches!(self, ClockSource::Tsc { .. })
    }
}

/// The default clock: the TSC where it can be trusted, the OS monotonic clock
/// everywhere else. The choice is made once per process, when the first
/// `RealClock` is created, and every `RealClock` reads the same source.
///
/// The TSC is read ([`TscClock`]) only when both hold:
///
/// 1. **The kernel keeps its own time on it.** On Linux,
///    `/sys/devices/system/clocksource/clocksource0/current_clocksource` is
///    `tsc` (x86-64) or `arch_sys_counter` (AArch64). The kernel checks at boot
///    that the TSCs of all CPUs are synchronized, and a watchdog compares the
///    TSC against a second clock after; when either fails it switches away from
///    the TSC. A kernel that keeps time on the TSC thus vouches that it agrees
///    across cores as far as the kernel can tell: the check quanta lacks, and
///    the failure behind reports of random denials from TSC-clocked limiters
///    on machines whose cores' TSCs are offset. Other OSes
///    offer no such file, so there the OS clock is read (macOS and Windows read
///    the counter in user space themselves when they trust it).
/// 2. **Its rate agrees with the OS clock.** quanta calibrates the TSC against
///    the OS clock; the check then measures both across a 2 ms sleep, pairing
///    each TSC reading with the tightest of five OS readings around it, and
///    requires them to agree within [`RATE_TOLERANCE_PPM`](Self::RATE_TOLERANCE_PPM)
///    (up to three attempts). This catches a calibration gone wrong (a virtual
///    machine whose TSC runs at another rate than it seems to: skews of 2.8x
///    have been reported on some KVM hosts; a calibration disturbed by
///    preemption) and a TSC that jumped while the
///    thread slept and moved to another core.
///
/// Neither check can catch offsets between cores that appear after the check,
/// or that the kernel misses: such offsets spread readings, which limiters
/// absorb within the bound stated on [`Clock`], and never change the rate. A
/// kernel that switches away from the TSC later is not seen either: the choice
/// stands for the process's life.
///
/// The first `RealClock` in a process costs quanta's calibration (1–2 ms on
/// the machine of `BENCHMARKS.md`; quanta stops it at 200 ms) plus 2 to 6 ms
/// for the check; later ones cost a lookup. A reading costs one `rdtsc` and a
/// multiply, or one `Instant::now`, plus a predictable branch between the two,
/// which measured nothing (74 instructions per admitted decision against
/// [`TscClock`]'s 75; `BENCHMARKS.md`, "Clocks").
///
/// It is the default because a decision on the OS clock costs 2.1–3× one on
/// the TSC (47–51 ns against 16–22 ns), and where the kernel trusts the TSC,
/// reading it directly loses nothing the OS clock would give: on Linux the
/// OS clock reads that same TSC.
///
/// # When to choose another
///
/// [`MonotonicClock`] to follow the kernel on every platform and after any
/// change of its mind; [`CoarseClock`] when a millisecond of resolution will do
/// (a decision costs 5–8 ns); [`TscClock`] on hardware known to be good, where
/// even the check's start-up milliseconds matter; [`ManualClock`] in tests.
///
/// ```
/// use turnstile::{Clock, RealClock};
///
/// let clock = RealClock::new();
/// println!("reading {:?}", clock.source());
/// let a = clock.now();
/// std::thread::sleep(std::time::Duration::from_millis(2));
/// assert!(clock.now() > a);
/// ```
#[derive(Clone)]
pub struct RealClock {
    source: Source,
}

#[derive(Clone)]
enum Source {
    Tsc(TscClock),
    Os(MonotonicClock),
}

/// The verdict, and the epoch every `RealClock` on the OS clock shares.
struct Verdict {
    source: ClockSource,
    epoch: Instant,
}

static VERDICT: OnceLock<Verdict> = OnceLock::new();

impl RealClock {
    /// How far the TSC's rate may stray from the OS clock's, in parts per
    /// million, for [`RealClock`] to read it: 0.2%. NTP slews the OS clock by
    /// at most 500 ppm, and quanta calibrated against that same clock moments
    /// earlier, so a sound TSC measures within a few tens of ppm.
    pub const RATE_TOLERANCE_PPM: i64 = 2_000;

    /// The process's real clock (the first call checks the TSC; see above).
    pub fn new() -> RealClock {
        let verdict = VERDICT.get_or_init(|| Verdict {
            epoch: Instant::now(),
            source: check_tsc(),
        });
        let source = if verdict.source.is_tsc() {
            Source::Tsc(TscClock::new())
        } else {
            Source::Os(MonotonicClock::since(verdict.epoch))
        };
        RealClock { source }
    }

    /// What this process's real clocks read, and why.
    pub fn source(&self) -> ClockSource {
        VERDICT
            .get()
            .map_or(ClockSource::OsUntrusted, |verdict| verdict.source)
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
        match &self.source {
            Source::Tsc(tsc) => tsc.now(),
            Source::Os(os) => os.now(),
        }
    }
}

impl fmt::Debug for RealClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RealClock")
            .field("source", &self.source())
            .finish()
    }
}

/// The start-up check behind [`RealClock`].
fn check_tsc() -> ClockSource {
    if !kernel_keeps_time_on_the_counter() {
        return ClockSource::OsUntrusted;
    }
    check_rate(&TscClock::new(), Duration::from_millis(2))
}

/// The rate half of the check, for any candidate clock.
fn check_rate(candidate: &impl Clock, interval: Duration) -> ClockSource {
    let mut closest = i64::MAX;
    for _ in 0..3 {
        let error = rate_error_ppm(candidate, interval);
        if error == i64::MIN {
            // Backwards: no preemption explains that, so no retry.
            return ClockSource::OsRateMismatch {
                rate_error_ppm: error,
            };
        }
        if error.abs() <= RealClock::RATE_TOLERANCE_PPM {
            return ClockSource::Tsc {
                rate_error_ppm: error,
            };
        }
        if error.abs() < closest.abs() {
            closest = error;
        }
    }
    ClockSource::OsRateMismatch {
        rate_error_ppm: closest,
    }
}

/// The kernel's verdict: whether it keeps its own time on the counter quanta
/// reads.
fn kernel_keeps_time_on_the_counter() -> bool {
    const COUNTER: Option<&str> = if cfg!(target_arch = "x86_64") {
        Some("tsc")
    } else if cfg!(target_arch = "aarch64") {
        Some("arch_sys_counter")
    } else {
        None
    };
    if !cfg!(target_os = "linux") {
        return false;
    }
    let Some(counter) = COUNTER else {
        return false;
    };
    std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .is_ok_and(|current| current.trim() == counter)
}

/// A candidate clock's rate against the OS clock's across a sleep of
/// `interval`, in parts per million; `i64::MIN` when it went backwards.
fn rate_error_ppm(tsc: &impl Clock, interval: Duration) -> i64 {
    let (tsc0, os0) = paired_reading(tsc);
    std::thread::sleep(interval);
    let (tsc1, os1) = paired_reading(tsc);
    let os = os1.saturating_duration_since(os0).as_nanos();
    let Some(elapsed) = tsc1.checked_sub(tsc0) else {
        return i64::MIN;
    };
    if os == 0 {
        return i64::MIN;
    }
    let error = (i128::from(elapsed) - os as i128) * 1_000_000 / os as i128;
    i64::try_from(error).unwrap_or(i64::MAX)
}

/// A TSC reading and the OS time at the middle of the tightest of five
/// brackets of OS readings around a TSC reading: a preempted bracket is wide
/// and loses.
fn paired_reading(tsc: &impl Clock) -> (u64, Instant) {
    let mut best: Option<(Duration, u64, Instant)> = None;
    for _ in 0..5 {
        let before = Instant::now();
        let reading = tsc.now();
        let after = Instant::now();
        let width = after.saturating_duration_since(before);
        if best.is_none_or(|(w, _, _)| width < w) {
            best = Some((width, reading, before + width / 2));
        }
    }
    match best {
        Some((_, reading, at)) => (reading, at),
        None => (tsc.now(), Instant::now()),
    }
}

/// A cheap, coarse clock: one load of a shared word that an upkeep thread
/// refreshes from the OS monotonic clock ([`MonotonicClock`]) every
/// `resolution` (1 ms by default); its epoch is when it was created.
///
/// The upkeep reads the OS clock rather than the TSC: it reads once per
/// resolution, so the TSC's speed buys nothing there, and the OS clock is the
/// one the kernel vouches for.
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

    use super::{Clock, MonotonicClock};
    use crate::sync::{Arc, AtomicU64, Ordering};

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
        let shared = Arc::new(Shared {
            now: CachePadded::new(AtomicU64::new(os.now())),
            os,
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
                    // monotonic whatever the platform's `Instant` does.
                    shared.now.fetch_max(shared.os.now(), Ordering::Relaxed);
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
    fn monotonic_clock_counts_from_its_epoch() {
        let clock = MonotonicClock::new();
        let a = clock.now();
        std::thread::sleep(Duration::from_millis(3));
        let b = clock.now();
        assert!(b >= a + 3_000_000, "{a} then {b}");
        // An epoch in the future reads 0 until it passes, never panics.
        let later = MonotonicClock::since(Instant::now() + Duration::from_secs(3_600));
        assert_eq!(later.now(), 0);
    }

    #[test]
    fn the_verdict_is_one_per_process() {
        let a = RealClock::new();
        let b = RealClock::new();
        assert_eq!(a.source(), b.source());
        assert_eq!(matches!(a.source, Source::Tsc(_)), a.source().is_tsc());
        // Two clocks on one source agree to within the time between readings.
        let (x, y) = (a.now(), b.now());
        assert!(y >= x, "{x} then {y}");
        assert!(y - x < 1_000_000_000, "{x} then {y}");
    }

    /// The OS clock scaled by `num / den`, and optionally stepped back by
    /// `back` nanoseconds on every reading after the first five (the first
    /// paired reading of the check).
    struct Skewed {
        os: MonotonicClock,
        num: u64,
        den: u64,
        back: u64,
        readings: AtomicU64,
    }

    impl Skewed {
        fn new(num: u64, den: u64, back: u64) -> Skewed {
            Skewed {
                // An epoch a second back, so that scaling shows at once.
                os: MonotonicClock::since(
                    Instant::now()
                        .checked_sub(Duration::from_secs(1))
                        .unwrap_or_else(Instant::now),
                ),
                num,
                den,
                back,
                readings: AtomicU64::new(0),
            }
        }
    }

    impl Clock for Skewed {
        fn now(&self) -> u64 {
            // Relaxed: a count of this clock's readings, read by no one else.
            let n = self.readings.fetch_add(1, Ordering::Relaxed);
            let t = self.os.now() / self.den * self.num;
            if n >= 5 {
                t.saturating_sub(self.back)
            } else {
                t
            }
        }
    }

    #[test]
    fn the_rate_check_passes_the_os_clock_and_fails_skewed_ones() {
        let interval = Duration::from_millis(2);
        let os = check_rate(&MonotonicClock::new(), interval);
        assert!(os.is_tsc(), "{os:?}");
        // 2.8x fast, as a mis-calibrated virtual machine's TSC.
        match check_rate(&Skewed::new(28, 10, 0), interval) {
            ClockSource::OsRateMismatch { rate_error_ppm } => {
                assert!(
                    (1_700_000..1_900_000).contains(&rate_error_ppm),
                    "{rate_error_ppm}"
                )
            }
            other => panic!("{other:?}"),
        }
        // 1% slow: beyond the tolerance.
        assert!(matches!(
            check_rate(&Skewed::new(99, 100, 0), interval),
            ClockSource::OsRateMismatch { rate_error_ppm } if rate_error_ppm < -5_000
        ));
        // A clock that jumps back by a second across the sleep (a thread moved
        // to a core whose counter lags).
        assert_eq!(
            check_rate(&Skewed::new(1, 1, 1_000_000_000), interval),
            ClockSource::OsRateMismatch {
                rate_error_ppm: i64::MIN
            }
        );
    }

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
    fn coarse_clock_refuses_zero_resolution() {
        let err = CoarseClock::with_resolution(Duration::ZERO).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    }
}
