//! Limiters on clocks whose readings disagree: the bound on over-admission that
//! `Clock`'s documentation states, for every algorithm, with threads whose
//! readings are offset from one another and one whose readings go backwards;
//! and readings behind ones already seen, which create no permits.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use turnstile::{
    Algorithm, Clock, ClockSource, FixedWindow, Gcra, KeyedBuilder, ManualClock, MonotonicClock,
    Quota, RateLimiter, RealClock, SlidingWindow, TokenBucket, TscClock,
};

const MS: u64 = 1_000_000;
const US: u64 = 1_000;

// ---------------------------------------------------------------------------
// A clock read differently by each thread.

thread_local! {
    /// This thread's offset from the true time, in nanoseconds.
    static OFFSET: Cell<i64> = const { Cell::new(0) };
    /// Added to the offset after each reading (negative: a clock that goes
    /// backwards), and the lowest offset it may reach.
    static DRIFT: Cell<(i64, i64)> = const { Cell::new((0, 0)) };
}

/// The true time, shared, read by each thread at its own offset.
#[derive(Clone)]
struct SkewedClock {
    truth: Arc<AtomicU64>,
}

impl SkewedClock {
    fn new(start: u64) -> SkewedClock {
        SkewedClock {
            truth: Arc::new(AtomicU64::new(start)),
        }
    }
}

impl Clock for SkewedClock {
    fn now(&self) -> u64 {
        // Relaxed: the truth moves only between rounds, and the barriers
        // between rounds order that write before every reading of the next.
        let t = self.truth.load(Ordering::Relaxed);
        let offset = OFFSET.get();
        let (drift, floor) = DRIFT.get();
        OFFSET.set((offset + drift).max(floor));
        t.saturating_add_signed(offset)
    }
}

/// How a thread reads the clock: `offset` nanoseconds from the truth, moving
/// by `drift` per reading down to `floor`.
#[derive(Clone, Copy, Debug)]
struct Reader {
    offset: i64,
    drift: i64,
    floor: i64,
}

const fn fixed(offset: i64) -> Reader {
    Reader {
        offset,
        drift: 0,
        floor: offset,
    }
}

/// Readings at most `BEHIND` behind the truth and `AHEAD` ahead of it.
const BEHIND: i64 = 1_500 * US as i64;
const AHEAD: i64 = 1_000 * US as i64;
/// The spread `s = a + b`.
const SPREAD: u64 = (BEHIND + AHEAD) as u64;

/// One thread ahead, one behind, one on time, and one whose readings go
/// backwards from ahead to behind (2 µs per reading: 1,250 readings, 5 rounds
/// of 250 µs, for 2.5 ms of backwards travel), each by a fixed amount.
const READERS: [Reader; 4] = [
    fixed(AHEAD),
    fixed(-BEHIND),
    fixed(0),
    Reader {
        offset: AHEAD,
        drift: -2 * US as i64,
        floor: -BEHIND,
    },
];

/// The truth advances by this much between rounds.
const STEP: u64 = 250 * US;
const ROUNDS: usize = 400;
const PER_ROUND: usize = 50;
/// The truth at the first round: far enough from 0 that no reading saturates.
const START: u64 = 1_000 * MS;

/// Every reader thread makes `PER_ROUND` decisions per round, all at once, at
/// a true time that stands still within a round and advances by `STEP`
/// between rounds, so a decision's true time is its round's. Returns the
/// permits admitted in each round.
fn hammer(clock: &SkewedClock, decide: impl Fn() -> bool + Sync) -> Vec<u64> {
    let admitted: Vec<AtomicU64> = (0..ROUNDS).map(|_| AtomicU64::new(0)).collect();
    let barrier = Barrier::new(READERS.len());
    std::thread::scope(|scope| {
        for reader in READERS {
            let (admitted, barrier, decide) = (&admitted, &barrier, &decide);
            scope.spawn(move || {
                OFFSET.set(reader.offset);
                DRIFT.set((reader.drift, reader.floor));
                for round in admitted {
                    for _ in 0..PER_ROUND {
                        if decide() {
                            // Relaxed: a count, read after the threads are joined.
                            round.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    if barrier.wait().is_leader() {
                        // Relaxed: the barrier below orders it before the next round.
                        clock.truth.fetch_add(STEP, Ordering::Relaxed);
                    }
                    barrier.wait();
                }
            });
        }
    });
    // Relaxed: the threads are joined.
    admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect()
}

/// Checks every interval of rounds `i..=j` (length `T = (j - i) * STEP`)
/// against `bound(T)`, and that the limiter admitted at least `floor` in all.
fn assert_bounded(name: &str, admitted: &[u64], bound: impl Fn(u64) -> u64, floor: u64) {
    let total: u64 = admitted.iter().sum();
    assert!(
        total >= floor,
        "{name}: {total} admitted in all, expected at least {floor}: the skew starved it"
    );
    for i in 0..admitted.len() {
        let mut sum = 0;
        for (j, n) in admitted.iter().enumerate().skip(i) {
            sum += n;
            let t = (j - i) as u64 * STEP;
            let limit = bound(t);
            assert!(
                sum <= limit,
                "{name}: {sum} admitted in rounds {i}..={j} (T = {t} ns, s = {SPREAD} ns), bound {limit}"
            );
        }
    }
}

// The bounds of `Clock`'s documentation, for a spread of `s`.

fn token_bucket_bound(q: Quota, t: u64, s: u64) -> u64 {
    let unit = q.time_unit().as_nanos() as u64;
    let span = (t + s).div_ceil(unit) * unit;
    let period = q.period().as_nanos() as u64;
    u64::from(q.capacity()) - 1 + u64::from(q.amount()) * (span / period + 1)
}

fn gcra_bound(g: Gcra, t: u64, s: u64) -> u64 {
    u64::from(g.quota().capacity()) + (t + s) / g.emission_interval().as_nanos() as u64
}

fn fixed_window_bound(limit: u32, window: Duration, t: u64, s: u64) -> u64 {
    u64::from(limit) * ((t + s).div_ceil(window.as_nanos() as u64) + 1)
}

fn sliding_window_bound(limit: u32, window: Duration, t: u64, s: u64) -> u64 {
    let w = window.as_nanos() as u64;
    if t + s <= w {
        u64::from(limit) + u64::from(limit) * (t + s) / w
    } else {
        fixed_window_bound(limit, window, t, s)
    }
}

/// The whole run in true time.
const RUN: u64 = ROUNDS as u64 * STEP;

fn direct<A: Algorithm + Sync>(name: &str, algorithm: A, bound: impl Fn(u64) -> u64, floor: u64) {
    let clock = SkewedClock::new(START);
    let limiter = RateLimiter::from_parts(algorithm, clock.clone());
    let admitted = hammer(&clock, || limiter.try_acquire().is_allowed());
    assert_bounded(name, &admitted, bound, floor);
}

fn keyed<A: Algorithm + Send + Sync>(
    name: &str,
    algorithm: A,
    bound: impl Fn(u64) -> u64,
    floor: u64,
) {
    let clock = SkewedClock::new(START);
    let limiter = KeyedBuilder::<u64, A>::new(algorithm)
        .clock(clock.clone())
        .build()
        .unwrap();
    let admitted = hammer(&clock, || limiter.try_acquire(&7).is_allowed());
    assert_bounded(name, &admitted, bound, floor);
}

fn quota() -> Quota {
    // 8 at once, then 3 every 3 ms (1 per ms on average).
    Quota::new(8, 3, Duration::from_millis(3)).unwrap()
}

const WINDOW: Duration = Duration::from_millis(10);
const LIMIT: u32 = 8;

/// At least 90% of what the quota grants over the run: skew must not starve
/// a limiter.
fn per_ms_floor() -> u64 {
    RUN / MS * 9 / 10
}

fn per_window_floor() -> u64 {
    u64::from(LIMIT) * (RUN / WINDOW.as_nanos() as u64) * 9 / 10
}

#[test]
fn token_bucket_over_admits_at_most_what_the_spread_creates() {
    let q = quota();
    let bound = |t| token_bucket_bound(q, t, SPREAD);
    direct(
        "direct token bucket",
        TokenBucket::new(q),
        bound,
        per_ms_floor(),
    );
    keyed(
        "keyed token bucket",
        TokenBucket::new(q),
        bound,
        per_ms_floor(),
    );
}

#[test]
fn gcra_over_admits_at_most_what_the_spread_creates() {
    let g = Gcra::new(quota());
    let bound = |t| gcra_bound(g, t, SPREAD);
    direct("direct GCRA", g, bound, per_ms_floor());
    keyed("keyed GCRA", g, bound, per_ms_floor());
}

#[test]
fn fixed_window_over_admits_at_most_what_the_spread_creates() {
    let f = FixedWindow::new(LIMIT, WINDOW).unwrap();
    let bound = |t| fixed_window_bound(LIMIT, WINDOW, t, SPREAD);
    direct("direct fixed window", f, bound, per_window_floor());
    keyed("keyed fixed window", f, bound, per_window_floor());
}

#[test]
fn sliding_window_over_admits_at_most_what_the_spread_creates() {
    let w = SlidingWindow::new(LIMIT, WINDOW).unwrap();
    let bound = |t| sliding_window_bound(LIMIT, WINDOW, t, SPREAD);
    direct("direct sliding window", w, bound, per_window_floor());
    keyed("keyed sliding window", w, bound, per_window_floor());
}

// ---------------------------------------------------------------------------
// The bounds are reached: readings spread by `s` across an interval of `T`
// admit exactly the bound, so none of them is looser than it says.

/// Drains `l` at readings `MS` apart from `t1 - a` to `t2 + b`: readings of a
/// clock whose offset moves from `-a` to `+b` while the true time goes from
/// `t1` to `t2 = t1 + t`. Returns the permits admitted.
fn drain_across<A: Algorithm>(l: &RateLimiter<A, ManualClock>, clock: &ManualClock, t: u64) -> u64 {
    let mut admitted = 0;
    let mut reading = START - BEHIND as u64;
    while reading <= START + t + AHEAD as u64 {
        clock.set_nanos(reading);
        while l.try_acquire().is_allowed() {
            admitted += 1;
        }
        reading += MS;
    }
    admitted
}

#[test]
fn gcra_reaches_its_bound() {
    let g = Gcra::new(quota());
    let clock = ManualClock::new();
    let l = RateLimiter::from_parts(g, clock.clone());
    let t = 7 * MS;
    let admitted = drain_across(&l, &clock, t);
    assert_eq!(admitted, gcra_bound(g, t, SPREAD));
    assert!(admitted > gcra_bound(g, t, 0), "the spread shows");
}

#[test]
fn token_bucket_reaches_its_bound() {
    // One permit per period, so the bound is `capacity + floor((T + s) / period)`.
    let q = Quota::new(8, 1, Duration::from_millis(1)).unwrap();
    let clock = ManualClock::new();
    let l = RateLimiter::with_clock(q, clock.clone());
    let t = 7 * MS;
    let admitted = drain_across(&l, &clock, t);
    assert_eq!(admitted, token_bucket_bound(q, t, SPREAD));
    assert!(admitted > token_bucket_bound(q, t, 0), "the spread shows");
}

#[test]
fn fixed_window_reaches_its_bound() {
    let f = FixedWindow::new(LIMIT, WINDOW).unwrap();
    let clock = ManualClock::new();
    let l = RateLimiter::from_parts(f, clock.clone());
    let w = WINDOW.as_nanos() as u64;
    // `t1 - a` is the last nanosecond of a window; `t2 + b` lands 1 ns into the
    // window after next, so `T + s = w + 2` touches three windows.
    let first = 100 * w - 1;
    let t = w + 2 - SPREAD;
    let mut admitted = 0;
    for reading in [first, first + w, first + t + SPREAD] {
        clock.set_nanos(reading);
        while l.try_acquire().is_allowed() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, fixed_window_bound(LIMIT, WINDOW, t, SPREAD));
    assert!(admitted > fixed_window_bound(LIMIT, WINDOW, t, 0));
}

#[test]
fn sliding_window_reaches_its_bound() {
    let sw = SlidingWindow::new(LIMIT, WINDOW).unwrap();
    let clock = ManualClock::new();
    let l = RateLimiter::from_parts(sw, clock.clone());
    let w = WINDOW.as_nanos() as u64;
    // The burst in the last nanosecond of a window, then `T + s` later, with
    // `limit * (T + s) / w` not a whole number.
    let first = 100 * w - 1;
    let t = 4 * MS + 300 * US - SPREAD + 1;
    let mut admitted = 0;
    for reading in [first, first + t + SPREAD] {
        clock.set_nanos(reading);
        while l.try_acquire().is_allowed() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, sliding_window_bound(LIMIT, WINDOW, t, SPREAD));
    assert!(admitted > sliding_window_bound(LIMIT, WINDOW, t, 0));
}

// ---------------------------------------------------------------------------
// Readings that go backwards create no permits.

/// After the limiter is drained at `at`, every reading behind it is denied and
/// finds no more permits than there were.
fn backwards_creates_nothing<A: Algorithm>(name: &str, algorithm: A, at: u64) {
    let clock = ManualClock::new();
    let l = RateLimiter::from_parts(algorithm, clock.clone());
    clock.set_nanos(at);
    while l.try_acquire().is_allowed() {}
    assert_eq!(l.remaining(), 0, "{name}");
    for back in [1, US, MS, 10 * MS, 999 * MS] {
        clock.set_nanos(at - back);
        assert_eq!(l.remaining(), 0, "{name}: {back} ns back");
        assert!(l.try_acquire().is_denied(), "{name}: {back} ns back");
    }
    // And going forward again from far back refills only by the time since
    // the drain, not since the backward reading.
    clock.set_nanos(at);
    assert!(l.try_acquire().is_denied(), "{name}: back at the drain");
}

#[test]
fn readings_that_go_backwards_create_no_permits() {
    let at = START + 3 * MS + 7;
    backwards_creates_nothing("token bucket", TokenBucket::new(quota()), at);
    backwards_creates_nothing("GCRA", Gcra::new(quota()), at);
    backwards_creates_nothing("fixed window", FixedWindow::new(LIMIT, WINDOW).unwrap(), at);
    backwards_creates_nothing(
        "sliding window",
        SlidingWindow::new(LIMIT, WINDOW).unwrap(),
        at,
    );
}

/// One thread whose every reading is behind the last, hammering a drained
/// limiter beside threads whose readings stand still: nothing is admitted.
fn backwards_threads_create_nothing<A: Algorithm + Sync>(name: &str, algorithm: A) {
    let clock = SkewedClock::new(START);
    let l = RateLimiter::from_parts(algorithm, clock.clone());
    while l.try_acquire().is_allowed() {}
    let admitted = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for drift in [-(US as i64), 0, 0] {
            let (l, admitted) = (&l, &admitted);
            scope.spawn(move || {
                OFFSET.set(0);
                DRIFT.set((drift, i64::MIN / 2));
                for _ in 0..20_000 {
                    if l.try_acquire().is_allowed() {
                        // Relaxed: a count, read after the threads are joined.
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    // Relaxed: the threads are joined.
    assert_eq!(admitted.load(Ordering::Relaxed), 0, "{name}");
}

#[test]
fn threads_whose_readings_go_backwards_create_no_permits() {
    backwards_threads_create_nothing("token bucket", TokenBucket::new(quota()));
    backwards_threads_create_nothing("GCRA", Gcra::new(quota()));
    backwards_threads_create_nothing("fixed window", FixedWindow::new(LIMIT, WINDOW).unwrap());
    backwards_threads_create_nothing("sliding window", SlidingWindow::new(LIMIT, WINDOW).unwrap());
}

// ---------------------------------------------------------------------------
// The real clocks.

#[test]
fn every_real_clock_moves_forward_in_nanoseconds() {
    fn check(name: &str, clock: &dyn Clock) {
        let a = clock.now();
        std::thread::sleep(Duration::from_millis(5));
        let b = clock.now();
        // At least the sleep, and not absurdly more (a clock in the wrong unit).
        assert!(b - a >= 5 * MS, "{name}: {a} then {b}");
        assert!(b - a < 5_000 * MS, "{name}: {a} then {b}");
    }
    check("RealClock", &RealClock::new());
    check("MonotonicClock", &MonotonicClock::new());
    check("TscClock", &TscClock::new());
}

#[test]
fn the_real_clock_says_what_it_reads() {
    let clock = RealClock::new();
    let source = clock.source();
    match source {
        ClockSource::Tsc { rate_error_ppm } => {
            assert!(rate_error_ppm.abs() <= RealClock::RATE_TOLERANCE_PPM)
        }
        ClockSource::OsRateMismatch { rate_error_ppm } => {
            assert!(rate_error_ppm.abs() > RealClock::RATE_TOLERANCE_PPM)
        }
        _ => {}
    }
    let kernel =
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource");
    // Where the kernel keeps time elsewhere, the TSC is never read.
    if cfg!(all(target_os = "linux", target_arch = "x86_64"))
        && kernel.as_deref().map(str::trim).ok() != Some("tsc")
    {
        assert_eq!(source, ClockSource::OsUntrusted);
    }
    assert!(format!("{clock:?}").contains("source"));
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_default_clock_keeps_a_limiter_in_one_128_byte_block() {
    // The checked clock must not push the limiter to a second block.
    assert_eq!(size_of::<RateLimiter>(), 128);
    assert!(size_of::<RealClock>() <= size_of::<TscClock>() + 8);
}

/// `Clock`'s "Readings years off": a reading behind by less than half the
/// word's time span creates nothing; one behind by more reads as that far
/// ahead (the span wraps), which the documentation states.
#[test]
fn a_reading_years_behind_creates_nothing_within_half_the_span_and_wraps_beyond() {
    const YEAR: u64 = 365 * 24 * 3_600 * 1_000_000_000;
    let quota = Quota::new(65_535, 1, Duration::from_secs(1)).unwrap();
    for (back, admitted) in [(YEAR, false), (4 * YEAR, false), (5 * YEAR, true)] {
        let clock = ManualClock::new();
        let limiter = RateLimiter::with_clock(quota, clock.clone());
        clock.set_nanos(10 * YEAR);
        assert!(limiter.try_acquire_n(65_535).unwrap().is_allowed());
        clock.set_nanos(10 * YEAR - back);
        assert_eq!(
            limiter.try_acquire().is_allowed(),
            admitted,
            "{} years back",
            back / YEAR
        );
    }
}
