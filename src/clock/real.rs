//! The clocks that read the hardware or the OS: [`MonotonicClock`],
//! [`TscClock`], and [`RealClock`] with the start-up check that chooses
//! between them ([`ClockSource`]).

use core::fmt;
use core::time::Duration;
use std::sync::OnceLock;
use std::time::Instant;

use super::{Clock, saturating_nanos};

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
/// [`CoarseClock`]: crate::CoarseClock
/// [`ManualClock`]: crate::ManualClock
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

/// [`Clock::shared_readings`] of every [`RealClock`]. (A [`ManualClock`]'s
/// is the address of its shared count, never 1.)
///
/// [`ManualClock`]: crate::ManualClock
const REAL_READINGS: usize = 1;

impl Clock for RealClock {
    #[inline]
    fn now(&self) -> u64 {
        match &self.source {
            Source::Tsc(tsc) => tsc.now(),
            Source::Os(os) => os.now(),
        }
    }

    /// Every real clock in a process reads the same: on the TSC, through
    /// quanta's one calibration, scaled from the counter's zero; on the OS
    /// clock, from the one epoch of the process's verdict.
    fn shared_readings(&self) -> Option<usize> {
        Some(REAL_READINGS)
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
    // Miri cannot read the counter (quanta asks the CPU with `cpuid`, inline
    // assembly it does not run): the OS clock, as on a machine whose kernel
    // does not keep time on the counter.
    if cfg!(miri) || !kernel_keeps_time_on_the_counter() {
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

#[cfg(all(test, not(turnstile_loom)))]
mod tests {
    use super::*;
    use crate::sync::{AtomicU64, Ordering};

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
}
