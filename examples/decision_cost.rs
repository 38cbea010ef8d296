//! Runs one kind of decision many times, for counting instructions per decision
//! under callgrind, where timings are too noisy to compare (see BENCHMARKS.md):
//!
//! ```text
//! cargo build --release --example decision_cost
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null --toggle-collect='*measured*' \
//!     target/release/examples/decision_cost deny turnstile precise 1000000
//! ```
//!
//! Arguments: `allow|deny`, `turnstile|governor|governor+wait` (governor's check
//! plus the wait a 429 needs; precise only), `precise|coarse`, and the number of
//! decisions. Divide callgrind's `Collected` count by that number.
//!
//! `decision_cost paired` instead times turnstile and governor in alternating
//! blocks of 200,000 decisions, 101 blocks each, and prints the median block of
//! each and their ratio: on a machine whose speed drifts, alternating keeps both
//! sides under the same conditions.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::process::ExitCode;
use std::time::Duration;

const ALLOW_RATE: u32 = 1_000_000_000;

#[inline(never)]
fn measured<T>(n: u64, mut decide: impl FnMut() -> T) {
    for _ in 0..n {
        black_box(decide());
    }
}

/// Median nanoseconds per decision of each closure, timed in alternating blocks.
fn paired(mut a: impl FnMut(), mut b: impl FnMut()) -> (f64, f64) {
    const BLOCK: u32 = 200_000;
    let time = |f: &mut dyn FnMut()| {
        let start = std::time::Instant::now();
        for _ in 0..BLOCK {
            f();
        }
        start.elapsed().as_nanos() as f64 / f64::from(BLOCK)
    };
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for _ in 0..101 {
        ta.push(time(&mut a));
        tb.push(time(&mut b));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (median(&mut ta), median(&mut tb))
}

fn run_paired() {
    let nz = |n| NonZeroU32::new(n).expect("nonzero");
    let report = |what: &str, (ours, theirs): (f64, f64)| {
        println!(
            "{what:<16} turnstile {ours:6.2} ns  governor {theirs:6.2} ns  ratio {:.2}",
            ours / theirs
        );
    };
    let coarse = turnstile::CoarseClock::new().expect("upkeep thread");
    let upkeep = governor::clock::QuantaUpkeepClock::from_interval(Duration::from_millis(1))
        .expect("upkeep thread");
    for allow in [true, false] {
        let ours_quota = if allow {
            turnstile::Quota::per_second(ALLOW_RATE)
        } else {
            turnstile::Quota::per_hour(1)
        }
        .expect("a valid quota");
        let theirs_quota = if allow {
            governor::Quota::per_second(nz(ALLOW_RATE))
        } else {
            governor::Quota::per_hour(nz(1))
        };
        let path = if allow { "allow" } else { "deny" };

        let ours = turnstile::RateLimiter::new(ours_quota);
        let theirs = governor::RateLimiter::direct(theirs_quota);
        let (_, _) = (ours.try_acquire(), theirs.check());
        report(
            &format!("{path}, precise"),
            paired(
                || {
                    let _ = black_box(ours.try_acquire());
                },
                || {
                    let _ = black_box(theirs.check());
                },
            ),
        );

        let ours = turnstile::RateLimiter::with_clock(ours_quota, coarse.clone());
        let theirs = governor::RateLimiter::direct_with_clock(theirs_quota, upkeep.clone());
        let (_, _) = (ours.try_acquire(), theirs.check());
        report(
            &format!("{path}, coarse"),
            paired(
                || {
                    let _ = black_box(ours.try_acquire());
                },
                || {
                    let _ = black_box(theirs.check());
                },
            ),
        );
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("paired") {
        run_paired();
        return ExitCode::SUCCESS;
    }
    let [path, who, clock, n] = args.as_slice() else {
        eprintln!(
            "usage: decision_cost allow|deny turnstile|governor|governor+wait precise|coarse N"
        );
        return ExitCode::FAILURE;
    };
    let Ok(n) = n.parse::<u64>() else {
        eprintln!("N must be a number, not {n:?}");
        return ExitCode::FAILURE;
    };
    let allow = match path.as_str() {
        "allow" => true,
        "deny" => false,
        other => {
            eprintln!("unknown path {other:?}: allow or deny");
            return ExitCode::FAILURE;
        }
    };
    let ours_quota = if allow {
        turnstile::Quota::per_second(ALLOW_RATE)
    } else {
        turnstile::Quota::per_hour(1)
    }
    .expect("a valid quota");
    let nz = |n| NonZeroU32::new(n).expect("nonzero");
    let theirs_quota = if allow {
        governor::Quota::per_second(nz(ALLOW_RATE))
    } else {
        governor::Quota::per_hour(nz(1))
    };
    match (who.as_str(), clock.as_str()) {
        ("turnstile", "precise") => {
            let l = turnstile::RateLimiter::new(ours_quota);
            let _ = l.try_acquire();
            measured(n, || l.try_acquire());
        }
        ("turnstile", "coarse") => {
            let coarse = turnstile::CoarseClock::new().expect("upkeep thread");
            let l = turnstile::RateLimiter::with_clock(ours_quota, coarse);
            let _ = l.try_acquire();
            measured(n, || l.try_acquire());
        }
        ("governor", "precise") => {
            let l = governor::RateLimiter::direct(theirs_quota);
            let _ = l.check();
            measured(n, || l.check());
        }
        ("governor+wait", "precise") => {
            // A 429 needs the wait, which governor computes from a second reading.
            use governor::clock::Clock as _;
            let clock = governor::clock::DefaultClock::default();
            let l = governor::RateLimiter::direct(theirs_quota);
            let _ = l.check();
            measured(n, || l.check().map_err(|e| e.wait_time_from(clock.now())));
        }
        ("governor", "coarse") => {
            let upkeep =
                governor::clock::QuantaUpkeepClock::from_interval(Duration::from_millis(1))
                    .expect("upkeep thread");
            let l = governor::RateLimiter::direct_with_clock(theirs_quota, upkeep);
            let _ = l.check();
            measured(n, || l.check());
        }
        other => {
            eprintln!(
                "unknown limiter {other:?}: turnstile|governor|governor+wait, precise|coarse"
            );
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
