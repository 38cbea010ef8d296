//! The algorithm modes: `paired-algorithms` (each algorithm against
//! governor's GCRA in alternating blocks) and, for callgrind, `algorithm`
//! (one algorithm's decision on a manual clock).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::process::ExitCode;
use std::time::Duration;

use crate::{ALLOW_RATE, measured};

/// Each algorithm's direct decision against governor's GCRA, coarse clocks, in
/// alternating blocks; allow-path limiters are replaced every 2^20 decisions
/// (window counts are bounded), governor's alike.
pub(crate) fn run_paired_algorithms() {
    use turnstile::{
        Algorithm, CoarseClock, FixedWindow, Gcra, Quota, RateLimiter, SlidingWindow, TokenBucket,
    };
    const HOUR: Duration = Duration::from_secs(3_600);
    const BLOCKS: usize = 41;
    const BLOCK: u32 = 1 << 18;
    let nz = |n| NonZeroU32::new(n).expect("nonzero");
    let coarse = CoarseClock::new().expect("upkeep thread");
    let upkeep = governor::clock::QuantaUpkeepClock::from_interval(Duration::from_millis(1))
        .expect("upkeep thread");
    fn median(v: &mut [f64]) -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }
    /// Median ns per decision of `ours` and of governor over alternating blocks,
    /// each block on a fresh limiter made untimed.
    fn blocks<A: Algorithm + Copy>(
        a: A,
        coarse: &CoarseClock,
        theirs: &dyn Fn() -> f64,
    ) -> (f64, f64) {
        let (mut ours, mut gov) = (Vec::new(), Vec::new());
        for _ in 0..BLOCKS {
            let l = RateLimiter::from_parts(a, coarse.clone());
            let _ = l.try_acquire(); // deny limiters: take the one permit
            let start = std::time::Instant::now();
            for _ in 0..BLOCK {
                let _ = black_box(l.try_acquire());
            }
            ours.push(start.elapsed().as_nanos() as f64 / f64::from(BLOCK));
            gov.push(theirs());
        }
        (median(&mut ours), median(&mut gov))
    }
    for allow in [true, false] {
        let quota = if allow {
            Quota::per_second(ALLOW_RATE)
        } else {
            Quota::per_hour(1)
        }
        .expect("a valid quota");
        let limit = if allow { (1 << 24) - 1 } else { 1 };
        let governor_quota = if allow {
            governor::Quota::per_second(nz(ALLOW_RATE))
        } else {
            governor::Quota::per_hour(nz(1))
        };
        let theirs = || {
            let g = governor::RateLimiter::direct_with_clock(governor_quota, upkeep.clone());
            let _ = g.check();
            let start = std::time::Instant::now();
            for _ in 0..BLOCK {
                let _ = black_box(g.check());
            }
            start.elapsed().as_nanos() as f64 / f64::from(BLOCK)
        };
        let path = if allow { "allow" } else { "deny" };
        let results = [
            (
                "token-bucket",
                blocks(TokenBucket::new(quota), &coarse, &theirs),
            ),
            (
                "fixed-window",
                blocks(
                    FixedWindow::new(limit, HOUR).expect("valid"),
                    &coarse,
                    &theirs,
                ),
            ),
            (
                "sliding-window",
                blocks(
                    SlidingWindow::new(limit, 2 * HOUR).expect("valid"),
                    &coarse,
                    &theirs,
                ),
            ),
            ("gcra", blocks(Gcra::new(quota), &coarse, &theirs)),
        ];
        for (name, (ours, gov)) in results {
            println!(
                "{path:<5} {name:<15} turnstile {ours:6.2} ns  governor {gov:6.2} ns  ratio {:.2}",
                ours / gov
            );
        }
    }
}

/// One algorithm's direct decision on a manual clock (governor's on its fake
/// clock): the algorithm alone, without a clock read's cost.
///
/// `deny-check` denies as `deny` does, through `check` (the wait left to be
/// worked out only if asked, as governor's `check` leaves it) instead of
/// `try_acquire`.
pub(crate) fn run_algorithm(path: &str, which: &str, n: u64) -> ExitCode {
    use turnstile::{FixedWindow, Gcra, ManualClock, Quota, RateLimiter, SlidingWindow};
    const HOUR: Duration = Duration::from_secs(3_600);
    let (allow, check) = match path {
        "allow" | "allow-call" => (true, false),
        "deny" | "deny-call" => (false, false),
        "deny-check" => (false, true),
        other => {
            eprintln!("unknown path {other:?}: allow, deny, deny-check, allow-call or deny-call");
            return ExitCode::FAILURE;
        }
    };
    let call = path.ends_with("-call");
    macro_rules! run {
        ($a:expr, $n:expr $(,)?) => {
            run_on($a, $n, check, call)
        };
    }
    /// One decision behind a call of its own, as a request's is: nothing of
    /// the limiter (its parameters above all) is kept in registers from the
    /// decision before, as it can be in `measured`'s loop.
    #[inline(never)]
    fn once<A: turnstile::Algorithm>(l: &RateLimiter<A, ManualClock>) -> turnstile::Decision {
        l.try_acquire()
    }
    fn run_on<A: turnstile::Algorithm>(a: A, n: u64, check: bool, call: bool) {
        let l = RateLimiter::from_parts(a, ManualClock::new());
        let _ = l.try_acquire();
        if call {
            measured(n, || once(black_box(&l)));
        } else if check {
            measured(n, || l.check().is_ok());
        } else {
            measured(n, || l.try_acquire());
        }
    }
    let quota = if allow {
        Quota::per_second(ALLOW_RATE)
    } else {
        Quota::per_hour(1)
    }
    .expect("a valid quota");
    let limit = if allow { (1 << 24) - 1 } else { 1 };
    match which {
        "token-bucket" => run!(turnstile::TokenBucket::new(quota), n),
        "live-token-bucket" => run!(
            turnstile::LiveTokenBucket::new(quota).expect("a quota within the ceiling"),
            n,
        ),
        "fixed-window" => run!(FixedWindow::new(limit, HOUR).expect("valid"), n),
        "sliding-window" => run!(SlidingWindow::new(limit, 2 * HOUR).expect("valid"), n),
        "gcra" => run!(Gcra::new(quota), n),
        "live-gcra" => run!(turnstile::LiveGcra::new(quota), n),
        // The live windows laid out for their limit (the ceiling): the same
        // counts as the fixed forms'. The live sliding window's word has one
        // bit less for the window number, too few for two hours at this
        // ceiling: three hours (the arithmetic is the same).
        "live-fixed-window" => run!(
            turnstile::LiveFixedWindow::with_ceiling(
                FixedWindow::new(limit, HOUR).expect("valid"),
                limit,
            )
            .expect("valid"),
            n,
        ),
        "live-sliding-window" => run!(
            turnstile::LiveSlidingWindow::with_ceiling(
                SlidingWindow::new(limit, 3 * HOUR).expect("valid"),
                limit,
            )
            .expect("valid"),
            n,
        ),
        // The token bucket's quota, with a burst that leaves the word room
        // for a heat field (21 token bits: up to 7 periods of warm-up).
        "warm-up" => {
            let quota = if allow {
                Quota::per_second_with_burst(u64::from(ALLOW_RATE), (1 << 21) - 1)
                    .expect("a valid burst")
            } else {
                quota
            };
            let warm = turnstile::WarmUp::new(quota, quota.period() * 4, 3.0).expect("valid");
            run!(warm, n)
        }
        // The same bucket warmed: used period after period (heat at its
        // top), then, for denials, emptied; the clock stops there. A bucket
        // under sustained demand is warm once its warm-up period has passed.
        "warm-up-warm" => {
            let quota = if allow {
                Quota::per_second_with_burst(u64::from(ALLOW_RATE), (1 << 21) - 1)
                    .expect("a valid burst")
            } else {
                quota
            };
            let warm = turnstile::WarmUp::new(quota, quota.period() * 4, 3.0).expect("valid");
            let clock = ManualClock::new();
            let l = RateLimiter::from_parts(warm, clock.clone());
            for _ in 0..12 {
                let _ = l.try_acquire();
                clock.advance(quota.period());
                let _ = l.try_acquire();
            }
            while !allow && l.try_acquire().is_allowed() {}
            if check {
                measured(n, || l.check().is_ok());
            } else {
                measured(n, || l.try_acquire());
            }
        }
        "governor" => {
            let nz = |n| NonZeroU32::new(n).expect("nonzero");
            let quota = if allow {
                governor::Quota::per_second(nz(ALLOW_RATE))
            } else {
                governor::Quota::per_hour(nz(1))
            };
            let clock = governor::clock::FakeRelativeClock::default();
            let g = governor::RateLimiter::direct_with_clock(quota, clock);
            let _ = g.check();
            measured(n, || g.check());
        }
        other => {
            eprintln!(
                "unknown algorithm {other:?}: token-bucket, live-token-bucket, fixed-window, \
                 sliding-window, gcra, live-gcra, live-fixed-window, live-sliding-window, \
                 warm-up, warm-up-warm or governor"
            );
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
