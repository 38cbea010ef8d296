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
//! sides under the same conditions. `decision_cost paired-keyed` does the same
//! for the keyed limiters: one hot key, and 1,000,000 keys visited in a shuffled
//! order (blocks of 100,000 decisions, 41 blocks each).
//!
//! `decision_cost layer bare|turnstile-admitted|turnstile-denied|tower_governor-admitted|tower_governor-denied N`
//! sends `N` requests through an axum router, bare or behind a rate-limiting
//! layer (callgrind: `--toggle-collect='*requests_measured*'`).
//!
//! `decision_cost paired-algorithms` times each algorithm's direct decision
//! against governor's GCRA in alternating blocks, coarse clocks.
//!
//! `decision_cost algorithm allow|deny token-bucket|fixed-window|sliding-window|gcra|governor N`
//! runs one algorithm's direct decision on a manual clock (governor's GCRA on
//! its fake clock), so that callgrind counts the algorithm without a clock read.
//!
//! `decision_cost keyed-1m turnstile|governor N` fills a keyed limiter with
//! 1,000,000 keys, then makes `N` checks in a shuffled order inside the measured
//! loop; under callgrind with `--cache-sim=yes` it counts cache misses per check.

#[path = "shared/keys.rs"]
mod keys;
#[path = "shared/layer.rs"]
mod layer;
use keys::shuffled;

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

fn run_paired_keyed() {
    const MANY: u64 = 1_000_000;
    const BLOCK: usize = 100_000;
    let nz = |n| NonZeroU32::new(n).expect("nonzero");
    // As in `benches/keyed.rs`: 1,000 tokens, one back per hour.
    let quota = turnstile::Quota::new(1_000, 1, Duration::from_secs(3_600)).expect("a valid quota");
    fn ours<C: turnstile::Clock>(
        quota: turnstile::Quota,
        clock: C,
    ) -> turnstile::KeyedLimiter<u64, turnstile::TokenBucket, C> {
        turnstile::KeyedLimiter::<u64>::builder(quota)
            .max_keys(2 * MANY as usize)
            .clock(clock)
            .build()
            .expect("a valid configuration")
    }
    let precise = ours(quota, turnstile::RealClock::new());
    let coarse = ours(quota, turnstile::CoarseClock::new().expect("upkeep thread"));
    let theirs = governor::RateLimiter::<u64, _, _>::dashmap(
        governor::Quota::with_period(Duration::from_secs(3_600))
            .expect("a nonzero period")
            .allow_burst(nz(1_000)),
    );
    for k in 0..MANY {
        let _ = (
            precise.try_acquire(&k),
            coarse.try_acquire(&k),
            theirs.check_key(&k),
        );
    }
    let hot = turnstile::KeyedLimiter::<u64>::new(
        turnstile::Quota::per_second(ALLOW_RATE).expect("a valid quota"),
    );
    let theirs_hot =
        governor::RateLimiter::<u64, _, _>::dashmap(governor::Quota::per_second(nz(ALLOW_RATE)));
    let order = shuffled(MANY);
    let mut times = [const { Vec::new() }; 5];
    let mut at = 0;
    for _ in 0..41 {
        let keys = &order[at..at + BLOCK];
        at = (at + BLOCK) % MANY as usize;
        let mut time = |slot: usize, f: &mut dyn FnMut()| {
            let start = std::time::Instant::now();
            f();
            times[slot].push(start.elapsed().as_nanos() as f64 / BLOCK as f64);
        };
        time(0, &mut || {
            keys.iter().for_each(|k| {
                let _ = black_box(precise.try_acquire(k));
            })
        });
        time(1, &mut || {
            keys.iter().for_each(|k| {
                let _ = black_box(coarse.try_acquire(k));
            })
        });
        time(2, &mut || {
            keys.iter().for_each(|k| {
                let _ = black_box(theirs.check_key(k));
            })
        });
        time(3, &mut || {
            (0..BLOCK).for_each(|_| {
                let _ = black_box(hot.try_acquire(&42));
            })
        });
        time(4, &mut || {
            (0..BLOCK).for_each(|_| {
                let _ = black_box(theirs_hot.check_key(&42));
            })
        });
    }
    let m: Vec<f64> = times
        .iter_mut()
        .map(|v| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        })
        .collect();
    println!(
        "1M keys, precise  turnstile {:6.1} ns  governor {:6.1} ns  ratio {:.2}",
        m[0],
        m[2],
        m[0] / m[2]
    );
    println!(
        "1M keys, coarse   turnstile {:6.1} ns  governor {:6.1} ns (precise)  ratio {:.2}",
        m[1],
        m[2],
        m[1] / m[2]
    );
    println!(
        "hot key, precise  turnstile {:6.1} ns  governor {:6.1} ns  ratio {:.2}",
        m[3],
        m[4],
        m[3] / m[4]
    );

    // Scaling on disjoint keys: one thread, then two, alternating; each thread
    // checks its own 1,024 keys.
    let scale = |check: &(dyn Fn(u64) + Sync)| {
        let run = |threads: u64| {
            let start = std::time::Instant::now();
            std::thread::scope(|s| {
                for t in 0..threads {
                    s.spawn(move || {
                        for i in 0..BLOCK as u64 {
                            check(t * 1_000_000 + (i & 1_023));
                        }
                    });
                }
            });
            start.elapsed().as_nanos() as f64
        };
        let (mut one, mut two) = (Vec::new(), Vec::new());
        for _ in 0..41 {
            one.push(run(1));
            two.push(run(2));
        }
        one.sort_by(f64::total_cmp);
        two.sort_by(f64::total_cmp);
        2.0 * one[20] / two[20]
    };
    let ours = turnstile::KeyedLimiter::<u64>::new(
        turnstile::Quota::per_second(ALLOW_RATE).expect("a valid quota"),
    );
    let theirs =
        governor::RateLimiter::<u64, _, _>::dashmap(governor::Quota::per_second(nz(ALLOW_RATE)));
    let ours_scaling = scale(&|k| {
        let _ = black_box(ours.try_acquire(&k));
    });
    let theirs_scaling = scale(&|k| {
        let _ = black_box(theirs.check_key(&k));
    });
    // The same with a limiter per thread: nothing shared at all.
    let own = [
        turnstile::KeyedLimiter::<u64>::new(
            turnstile::Quota::per_second(ALLOW_RATE).expect("a valid quota"),
        ),
        turnstile::KeyedLimiter::<u64>::new(
            turnstile::Quota::per_second(ALLOW_RATE).expect("a valid quota"),
        ),
    ];
    let unshared_scaling = scale(&|k| {
        let _ = black_box(own[(k / 1_000_000) as usize].try_acquire(&k));
    });
    println!(
        "two threads on disjoint keys, throughput vs one thread: turnstile {ours_scaling:.2}x  \
         governor {theirs_scaling:.2}x  (a turnstile limiter per thread: {unshared_scaling:.2}x)"
    );
}

/// `keyed-1m turnstile|governor N`: a keyed limiter holding 1,000,000 keys, then
/// `N` checks in the shuffled order, inside `measured`. With callgrind's
/// `--cache-sim=yes` this counts cache misses per check.
fn run_keyed_million(who: &str, n: u64) -> ExitCode {
    const MANY: u64 = 1_000_000;
    let order = shuffled(MANY);
    let mut next = order.iter().cycle();
    match who {
        "turnstile" => {
            // 1,000 tokens, one back per hour: no bucket is full (sweepable) again
            // for an hour, however slowly this runs under callgrind.
            let quota =
                turnstile::Quota::new(1_000, 1, Duration::from_secs(3_600)).expect("a valid quota");
            let l = turnstile::KeyedLimiter::<u64>::builder(quota)
                .max_keys(2 * MANY as usize)
                .build()
                .expect("a valid configuration");
            (0..MANY).for_each(|k| {
                let _ = l.try_acquire(&k);
            });
            measured(n, || l.try_acquire(next.next().unwrap_or(&0)));
        }
        "governor" => {
            let quota = governor::Quota::with_period(Duration::from_secs(3_600))
                .expect("a nonzero period")
                .allow_burst(NonZeroU32::new(1_000).expect("nonzero"));
            let l = governor::RateLimiter::<u64, _, _>::dashmap(quota);
            (0..MANY).for_each(|k| {
                let _ = l.check_key(&k);
            });
            measured(n, || l.check_key(next.next().unwrap_or(&0)).is_ok());
        }
        other => {
            eprintln!("unknown limiter {other:?}: turnstile|governor");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// Each algorithm's direct decision against governor's GCRA, coarse clocks, in
/// alternating blocks; allow-path limiters are replaced every 2^20 decisions
/// (window counts are bounded), governor's alike.
fn run_paired_algorithms() {
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

/// `n` requests through the router bare or behind a layer; requests are built
/// before the measured loop.
fn run_layer(which: &str, n: u64) -> ExitCode {
    use tower::Service;
    #[inline(never)]
    fn requests_measured<S>(service: &mut S, requests: Vec<axum::http::Request<axum::body::Body>>)
    where
        S: Service<axum::http::Request<axum::body::Body>>,
    {
        for r in requests {
            let _ = black_box(layer::poll_ready_now(service.call(r)));
        }
    }
    let requests: Vec<_> = (0..n).map(|_| layer::request()).collect();
    match which {
        "bare" => requests_measured(&mut layer::router(), requests),
        "turnstile-admitted" | "turnstile-denied" => {
            let mut s = layer::turnstile_service(which == "turnstile-admitted");
            // The first request takes the deny limiters' one permit.
            let _ = layer::poll_ready_now(s.call(layer::request()));
            requests_measured(&mut s, requests);
        }
        "tower_governor-admitted" | "tower_governor-denied" => {
            let mut s = layer::governor_service(which == "tower_governor-admitted");
            // The first request takes the deny limiters' one permit.
            let _ = layer::poll_ready_now(s.call(layer::request()));
            requests_measured(&mut s, requests);
        }
        other => {
            eprintln!(
                "unknown layer case {other:?}: bare, turnstile-admitted, turnstile-denied, \
                 tower_governor-admitted or tower_governor-denied"
            );
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// One algorithm's direct decision on a manual clock (governor's on its fake
/// clock): the algorithm alone, without a clock read's cost.
fn run_algorithm(allow: bool, which: &str, n: u64) -> ExitCode {
    use turnstile::{FixedWindow, Gcra, ManualClock, Quota, RateLimiter, SlidingWindow};
    const HOUR: Duration = Duration::from_secs(3_600);
    fn run<A: turnstile::Algorithm>(a: A, n: u64) {
        let l = RateLimiter::from_parts(a, ManualClock::new());
        let _ = l.try_acquire();
        measured(n, || l.try_acquire());
    }
    let quota = if allow {
        Quota::per_second(ALLOW_RATE)
    } else {
        Quota::per_hour(1)
    }
    .expect("a valid quota");
    let limit = if allow { (1 << 24) - 1 } else { 1 };
    match which {
        "token-bucket" => run(turnstile::TokenBucket::new(quota), n),
        "fixed-window" => run(FixedWindow::new(limit, HOUR).expect("valid"), n),
        "sliding-window" => run(SlidingWindow::new(limit, 2 * HOUR).expect("valid"), n),
        "gcra" => run(Gcra::new(quota), n),
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
                "unknown algorithm {other:?}: token-bucket, fixed-window, sliding-window, gcra \
                 or governor"
            );
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [mode, who, n] = args.as_slice()
        && mode == "keyed-1m"
    {
        let Ok(n) = n.parse::<u64>() else {
            eprintln!("N must be a number, not {n:?}");
            return ExitCode::FAILURE;
        };
        return run_keyed_million(who, n);
    }
    if let [mode, which, n] = args.as_slice()
        && mode == "layer"
    {
        let Ok(n) = n.parse::<u64>() else {
            eprintln!("N must be a number, not {n:?}");
            return ExitCode::FAILURE;
        };
        return run_layer(which, n);
    }
    if let [mode, path, which, n] = args.as_slice()
        && mode == "algorithm"
    {
        let Ok(n) = n.parse::<u64>() else {
            eprintln!("N must be a number, not {n:?}");
            return ExitCode::FAILURE;
        };
        return run_algorithm(path == "allow", which, n);
    }
    match args.first().map(String::as_str) {
        Some("paired") => {
            run_paired();
            return ExitCode::SUCCESS;
        }
        Some("paired-keyed") => {
            run_paired_keyed();
            return ExitCode::SUCCESS;
        }
        Some("paired-algorithms") => {
            run_paired_algorithms();
            return ExitCode::SUCCESS;
        }
        _ => {}
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
