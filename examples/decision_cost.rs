//! Measurements that criterion cannot make well: instruction counts under
//! callgrind, where timings are too noisy to compare, and timings in alternating
//! blocks, so that both sides of a ratio see the same machine (see
//! BENCHMARKS.md).
//!
//! Run it under the bench profile, so that it is built as the benchmarks are
//! (fat LTO, one codegen unit, every crate in the build):
//!
//! ```text
//! cargo run --profile bench --example decision_cost              # lists the modes
//! cargo run --profile bench --example decision_cost -- paired-keyed
//! ```
//!
//! The bench profile writes to `target/release/`, as `--release` does, so under
//! callgrind build it first and run the binary there (a later `--release`
//! build overwrites it with the release profile's):
//!
//! ```text
//! cargo build --profile bench --example decision_cost
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null --toggle-collect='*measured*' \
//!     target/release/examples/decision_cost deny turnstile precise 1000000
//! ```
//!
//! Modes (with no arguments, the program prints this list):
//!
//! - `allow|deny turnstile|turnstile-check|governor|governor+wait precise|coarse N`:
//!   `N` direct decisions inside `measured` (`turnstile-check` is `check`, whose
//!   denial defers the wait; `governor+wait` is governor's check plus the
//!   wait a 429 needs; precise only). Divide callgrind's `Collected` count by `N`.
//! - `paired`: turnstile's and governor's direct limiters timed in alternating
//!   blocks of 200,000 decisions, 101 blocks each, the median block of each and
//!   their ratio: on a machine whose speed drifts, alternating keeps both sides
//!   under the same conditions.
//! - `paired-keyed`: the same for the keyed limiters (turnstile, governor,
//!   governor with `ahash`, and the floor of `shared/floor.rs`): 1,000,000 keys
//!   visited in a shuffled order, and one hot key, each with precise and coarse
//!   clocks (blocks of 100,000 checks, 41 blocks each); then one thread against
//!   two on disjoint keys.
//! - `paired-algorithms`: each algorithm's direct decision against governor's
//!   GCRA in alternating blocks, coarse clocks.
//! - `algorithm allow|deny token-bucket|fixed-window|sliding-window|gcra|governor N`:
//!   one algorithm's direct decision on a manual clock (governor's GCRA on its
//!   fake clock), so that callgrind counts the algorithm without a clock read.
//! - `keyed-hot turnstile|turnstile-tiered|turnstile-admitted|turnstile-admitted-coarse|floor-admitted-coarse N`:
//!   N decisions on one key, on a keyed limiter or on per-key quotas
//!   (`Tiered`, two tiers), for callgrind; the first two on a quota that denies
//!   most of them, `turnstile-admitted` (precise clock) and
//!   `turnstile-admitted-coarse` on one that admits every check, as the
//!   `keyed_hot_key` benchmark does, and `floor-admitted-coarse` the floor
//!   (see `paired-keyed`) on the same quota.
//! - `keyed-1m turnstile|turnstile-tiered|governor|governor-ahash|floor N`: fills a keyed limiter
//!   (or the floor) with 1,000,000 keys, then makes `N` checks in a shuffled
//!   order inside `measured`; under callgrind with `--cache-sim=yes` it counts
//!   cache misses per check.
//! - `keyed-new turnstile|governor|governor-ahash N`: `N` checks inside
//!   `measured`, each of a key never seen before, from an empty limiter (coarse
//!   clocks): the inserts and the tables' growth of `keyed_new_keys`.
//! - `clock read|decide tsc|real|monotonic|coarse N`: `N` readings of one
//!   clock, or `N` admitted token-bucket decisions on it, inside `measured`.
//! - `paired-clocks`: each clock's reading and admitted decision, timed in
//!   alternating blocks of 200,000 (51 blocks each), the median block of each.
//! - `layer bare|turnstile-admitted|turnstile-denied|tower_governor-admitted|tower_governor-denied N`:
//!   sends `N` requests through an axum router, bare or behind a rate-limiting
//!   layer (callgrind: `--toggle-collect='*requests_measured*'`).

#[path = "shared/floor.rs"]
mod floor;
#[path = "shared/keys.rs"]
mod keys;
#[path = "shared/layer.rs"]
mod layer;
use floor::Floor;
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

/// One direct limiter's size beside governor's, then the time per decision of
/// two threads each on its own of two limiters side by side in a `Vec` (what
/// the limiter's alignment is for), and of two threads on one limiter: five
/// runs of 20 M decisions per thread, coarse clock, every decision admitted.
fn run_neighbours() {
    use std::sync::{Arc, Barrier};
    type Ours = turnstile::RateLimiter<turnstile::TokenBucket, turnstile::CoarseClock>;
    fn run(limiters: &Arc<Vec<Ours>>, own: bool) -> f64 {
        const N: u64 = 20_000_000;
        let start = Arc::new(Barrier::new(3));
        let workers: Vec<_> = (0..2)
            .map(|t| {
                let (limiters, start) = (Arc::clone(limiters), Arc::clone(&start));
                std::thread::spawn(move || {
                    let l = &limiters[if own { t } else { 0 }];
                    start.wait();
                    for _ in 0..N {
                        let _ = black_box(l.try_acquire());
                    }
                })
            })
            .collect();
        start.wait();
        let began = std::time::Instant::now();
        workers
            .into_iter()
            .for_each(|w| w.join().expect("a worker"));
        began.elapsed().as_nanos() as f64 / N as f64
    }
    let clock = turnstile::CoarseClock::new().expect("upkeep thread");
    let quota = turnstile::Quota::per_second(ALLOW_RATE).expect("a valid quota");
    let limiters = Arc::new(
        (0..2)
            .map(|_| turnstile::RateLimiter::with_clock(quota, clock.clone()))
            .collect::<Vec<Ours>>(),
    );
    println!(
        "size: turnstile RateLimiter<TokenBucket, CoarseClock> {} bytes (align {}), \
         governor direct limiter {} bytes",
        std::mem::size_of::<Ours>(),
        std::mem::align_of::<Ours>(),
        std::mem::size_of::<
            governor::RateLimiter<
                governor::state::NotKeyed,
                governor::state::InMemoryState,
                governor::clock::QuantaUpkeepClock,
            >,
        >()
    );
    for _ in 0..5 {
        let own = run(&limiters, true);
        let one = run(&limiters, false);
        println!("two threads, own adjacent limiters {own:.2} ns, one shared limiter {one:.2} ns");
    }
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

const MANY: u64 = 1_000_000;
const HOUR_NANOS: u64 = 3_600_000_000_000;

/// turnstile's keyed limiter with room for `MANY` keys.
fn ours_keyed<C: turnstile::Clock>(
    quota: turnstile::Quota,
    clock: C,
) -> turnstile::KeyedLimiter<u64, turnstile::TokenBucket, C> {
    turnstile::KeyedLimiter::<u64>::builder(quota)
        .max_keys(2 * MANY as usize)
        .clock(clock)
        .build()
        .expect("a valid configuration")
}

/// governor's keyed limiter on a DashMap hashed by `S`.
type Theirs<C, S> = governor::RateLimiter<
    u64,
    governor::state::keyed::DashMapStateStore<u64, S>,
    C,
    governor::middleware::NoOpMiddleware<<C as governor::clock::Clock>::Instant>,
>;

/// governor's keyed limiter with its default hasher (std's `RandomState`).
fn theirs_keyed<C: governor::clock::Clock>(
    quota: governor::Quota,
    clock: C,
) -> Theirs<C, std::hash::RandomState> {
    governor::RateLimiter::dashmap_with_clock(quota, clock)
}

/// governor's keyed limiter with `ahash` in place of SipHash.
fn theirs_ahash<C: governor::clock::Clock>(
    quota: governor::Quota,
    clock: C,
) -> Theirs<C, ahash::RandomState> {
    governor::RateLimiter::dashmap_with_clock_and_hasher(quota, clock, ahash::RandomState::new())
}

/// The 1M-key quotas of `benches/keyed.rs`: 1,000 tokens, one back per hour.
fn million_quotas() -> (turnstile::Quota, governor::Quota) {
    (
        turnstile::Quota::new(1_000, 1, Duration::from_secs(3_600)).expect("a valid quota"),
        governor::Quota::with_period(Duration::from_secs(3_600))
            .expect("a nonzero period")
            .allow_burst(NonZeroU32::new(1_000).expect("nonzero")),
    )
}

/// One timed block: checks for the keys it is given (or as many checks of one
/// hot key).
type Block = Box<dyn FnMut(&[u64])>;

/// A block that checks each of its keys in turn.
fn walk(check: impl Fn(u64) + 'static) -> Block {
    Box::new(move |keys| keys.iter().for_each(|&k| check(k)))
}

/// A block that checks key 42 once per key it is given.
fn hot(check: impl Fn(u64) + 'static) -> Block {
    Box::new(move |keys| (0..keys.len()).for_each(|_| check(42)))
}

/// The contenders' blocks over `MANY` keys, each limiter filled first.
fn million_blocks<C, G>(clock: C, upkeep: G) -> [Block; 4]
where
    C: turnstile::Clock + Clone + 'static,
    G: governor::clock::Clock + Clone + 'static,
{
    let (q, gq) = million_quotas();
    let l = ours_keyed(q, clock.clone());
    let g = theirs_keyed(gq, upkeep.clone());
    let ga = theirs_ahash(gq, upkeep);
    let f = Floor::new(0..MANY, clock, HOUR_NANOS, 1_000);
    for k in 0..MANY {
        let _ = (
            l.try_acquire(&k),
            g.check_key(&k),
            ga.check_key(&k),
            f.check(k),
        );
    }
    [
        walk(move |k| {
            let _ = black_box(l.try_acquire(&k));
        }),
        walk(move |k| {
            let _ = black_box(g.check_key(&k));
        }),
        walk(move |k| {
            let _ = black_box(ga.check_key(&k));
        }),
        walk(move |k| {
            let _ = black_box(f.check(k));
        }),
    ]
}

/// The contenders' blocks on one hot key, every check admitted.
fn hot_blocks<C, G>(clock: C, upkeep: G) -> [Block; 4]
where
    C: turnstile::Clock + Clone + 'static,
    G: governor::clock::Clock + Clone + 'static,
{
    let nz = |n| NonZeroU32::new(n).expect("nonzero");
    let q = turnstile::Quota::per_second(ALLOW_RATE).expect("a valid quota");
    let gq = governor::Quota::per_second(nz(ALLOW_RATE));
    let l = ours_keyed(q, clock.clone());
    let g = theirs_keyed(gq, upkeep.clone());
    let ga = theirs_ahash(gq, upkeep);
    let f = Floor::new([42], clock, 1, u64::from(ALLOW_RATE));
    [
        hot(move |k| {
            let _ = black_box(l.try_acquire(&k));
        }),
        hot(move |k| {
            let _ = black_box(g.check_key(&k));
        }),
        hot(move |k| {
            let _ = black_box(ga.check_key(&k));
        }),
        hot(move |k| {
            let _ = black_box(f.check(k));
        }),
    ]
}

fn run_paired_keyed() {
    const BLOCK: usize = 100_000;
    const BLOCKS: usize = 41;
    let coarse = turnstile::CoarseClock::new().expect("upkeep thread");
    // One quanta upkeep thread per process: every governor limiter shares it.
    let upkeep = governor::clock::QuantaUpkeepClock::from_interval(Duration::from_millis(1))
        .expect("upkeep thread");
    let precise = (
        turnstile::RealClock::new(),
        governor::clock::DefaultClock::default(),
    );
    let mut rows = [
        (
            "1M keys, precise",
            million_blocks(precise.0.clone(), precise.1.clone()),
        ),
        (
            "1M keys, coarse",
            million_blocks(coarse.clone(), upkeep.clone()),
        ),
        ("hot key, precise", hot_blocks(precise.0, precise.1)),
        ("hot key, coarse", hot_blocks(coarse, upkeep)),
    ];
    let order = shuffled(MANY);
    let mut times = [const { [const { Vec::new() }; 4] }; 4];
    let mut at = 0;
    for _ in 0..BLOCKS {
        let keys = &order[at..at + BLOCK];
        at = (at + BLOCK) % MANY as usize;
        for ((_, blocks), times) in rows.iter_mut().zip(&mut times) {
            for (block, times) in blocks.iter_mut().zip(times) {
                let start = std::time::Instant::now();
                block(keys);
                times.push(start.elapsed().as_nanos() as f64 / BLOCK as f64);
            }
        }
    }
    println!(
        "median ns per check, {BLOCKS} alternating blocks of {BLOCK}; \
         ratios are turnstile's time over governor's"
    );
    println!(
        "{:<18} {:>9} {:>9} {:>14} {:>9}  {:>11} {:>17}",
        "case",
        "turnstile",
        "governor",
        "governor-ahash",
        "floor",
        "/ governor",
        "/ governor-ahash"
    );
    for ((what, _), times) in rows.iter().zip(&mut times) {
        let [t, g, ga, f] = times.each_mut().map(|v| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        });
        println!(
            "{what:<18} {t:9.1} {g:9.1} {ga:14.1} {f:9.1}  {:>11.2} {:>17.2}",
            t / g,
            t / ga
        );
    }
    drop(rows);

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
        for _ in 0..BLOCKS {
            one.push(run(1));
            two.push(run(2));
        }
        one.sort_by(f64::total_cmp);
        two.sort_by(f64::total_cmp);
        2.0 * one[BLOCKS / 2] / two[BLOCKS / 2]
    };
    let q = turnstile::Quota::per_second(ALLOW_RATE).expect("a valid quota");
    let gq = governor::Quota::per_second(NonZeroU32::new(ALLOW_RATE).expect("nonzero"));
    let ours = ours_keyed(q, turnstile::RealClock::new());
    let theirs = theirs_keyed(gq, governor::clock::DefaultClock::default());
    let theirs_a = theirs_ahash(gq, governor::clock::DefaultClock::default());
    let floor = Floor::new(
        (0..2).flat_map(|t| (0..1_024).map(move |i| t * 1_000_000 + i)),
        turnstile::RealClock::new(),
        1,
        u64::from(ALLOW_RATE),
    );
    let ours_scaling = scale(&|k| {
        let _ = black_box(ours.try_acquire(&k));
    });
    let theirs_scaling = scale(&|k| {
        let _ = black_box(theirs.check_key(&k));
    });
    let ahash_scaling = scale(&|k| {
        let _ = black_box(theirs_a.check_key(&k));
    });
    let floor_scaling = scale(&|k| {
        let _ = black_box(floor.check(k));
    });
    // The same with a limiter per thread: nothing shared at all.
    let own = [
        ours_keyed(q, turnstile::RealClock::new()),
        ours_keyed(q, turnstile::RealClock::new()),
    ];
    let unshared_scaling = scale(&|k| {
        let _ = black_box(own[(k / 1_000_000) as usize].try_acquire(&k));
    });
    println!(
        "two threads on disjoint keys, throughput vs one thread: turnstile {ours_scaling:.2}x  \
         governor {theirs_scaling:.2}x  governor-ahash {ahash_scaling:.2}x  \
         floor {floor_scaling:.2}x  (a turnstile limiter per thread: {unshared_scaling:.2}x)"
    );
}

/// `keyed-1m turnstile|governor|governor-ahash|floor N`: a keyed limiter (or
/// the floor) holding 1,000,000 keys, then `N` checks in the shuffled order,
/// inside `measured`. With callgrind's `--cache-sim=yes` this counts cache
/// misses per check.
/// `keyed-new turnstile|governor|governor-ahash N`: `N` checks inside
/// `measured`, each of a key never seen before, from an empty limiter (the
/// `keyed_new_keys` benchmark's work: inserts and the tables' growth).
fn run_keyed_new(who: &str, n: u64) -> ExitCode {
    // Keys spread over the whole `u64` range, as in the benchmark.
    let mut keys = (0u64..).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut key = move || keys.next().unwrap_or(0);
    let q = turnstile::Quota::per_second(10).expect("a valid quota");
    let gq = governor::Quota::per_second(NonZeroU32::new(10).expect("nonzero"));
    let coarse = turnstile::CoarseClock::new().expect("upkeep thread");
    let upkeep = governor::clock::QuantaUpkeepClock::from_interval(Duration::from_millis(1))
        .expect("upkeep thread");
    match who {
        "turnstile" => {
            let l = turnstile::KeyedLimiter::<u64>::builder(q)
                .clock(coarse)
                .max_keys(usize::MAX)
                .build()
                .expect("a valid configuration");
            measured(n, || l.try_acquire(&key()));
        }
        "governor" => {
            let l = theirs_keyed(gq, upkeep);
            measured(n, || l.check_key(&key()).is_ok());
        }
        "governor-ahash" => {
            let l = theirs_ahash(gq, upkeep);
            measured(n, || l.check_key(&key()).is_ok());
        }
        other => {
            eprintln!("unknown limiter {other:?}: turnstile|governor|governor-ahash");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

fn run_keyed_million(who: &str, n: u64) -> ExitCode {
    let order = shuffled(MANY);
    let mut next = order.iter().cycle();
    // 1,000 tokens, one back per hour: no bucket is full (sweepable) again for an
    // hour, however slowly this runs under callgrind.
    let (quota, governor_quota) = million_quotas();
    match who {
        "turnstile" => {
            let l = ours_keyed(quota, turnstile::RealClock::new());
            (0..MANY).for_each(|k| {
                let _ = l.try_acquire(&k);
            });
            measured(n, || l.try_acquire(next.next().unwrap_or(&0)));
        }
        "turnstile-tiered" => {
            let l = tiered(quota);
            (0..MANY).for_each(|k| {
                let _ = l.try_acquire(&k);
            });
            measured(n, || l.try_acquire(next.next().unwrap_or(&0)));
        }
        "governor" => {
            let l = theirs_keyed(governor_quota, governor::clock::DefaultClock::default());
            (0..MANY).for_each(|k| {
                let _ = l.check_key(&k);
            });
            measured(n, || l.check_key(next.next().unwrap_or(&0)).is_ok());
        }
        "governor-ahash" => {
            let l = theirs_ahash(governor_quota, governor::clock::DefaultClock::default());
            (0..MANY).for_each(|k| {
                let _ = l.check_key(&k);
            });
            measured(n, || l.check_key(next.next().unwrap_or(&0)).is_ok());
        }
        "floor" => {
            let f = Floor::new(0..MANY, turnstile::RealClock::new(), HOUR_NANOS, 1_000);
            (0..MANY).for_each(|k| {
                let _ = f.check(k);
            });
            measured(n, || f.check(*next.next().unwrap_or(&0)));
        }
        other => {
            eprintln!(
                "unknown limiter {other:?}: turnstile|turnstile-tiered|governor|governor-ahash|floor"
            );
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// Per-key quotas as the benches measure them: two tiers of `quota`, a key's
/// tier its lowest bit.
fn tiered(
    quota: turnstile::Quota,
) -> turnstile::Tiered<
    u64,
    impl Fn(&u64) -> usize,
    turnstile::TokenBucket,
    turnstile::RealClock,
    ahash::RandomState,
> {
    turnstile::Tiered::new(
        [
            ("free", ours_keyed(quota, turnstile::RealClock::new())),
            ("paid", ours_keyed(quota, turnstile::RealClock::new())),
        ],
        |key: &u64| (*key & 1) as usize,
    )
    .expect("two tiers")
}

/// One key, again and again: the keyed hot path.
fn run_keyed_hot(who: &str, n: u64) -> ExitCode {
    let (quota, _) = million_quotas();
    match who {
        "turnstile" => {
            let l = ours_keyed(quota, turnstile::RealClock::new());
            measured(n, || l.try_acquire(&42));
        }
        "turnstile-tiered" => {
            let l = tiered(quota);
            measured(n, || l.try_acquire(&42));
        }
        "turnstile-admitted" => {
            let q = turnstile::Quota::per_second(ALLOW_RATE).expect("a valid quota");
            let l = ours_keyed(q, turnstile::RealClock::new());
            measured(n, || l.try_acquire(&42));
        }
        "turnstile-admitted-coarse" => {
            let q = turnstile::Quota::per_second(ALLOW_RATE).expect("a valid quota");
            let l = ours_keyed(q, turnstile::CoarseClock::new().expect("upkeep thread"));
            measured(n, || l.try_acquire(&42));
        }
        "floor-admitted-coarse" => {
            let clock = turnstile::CoarseClock::new().expect("upkeep thread");
            let f = Floor::new([42], clock, 1, u64::from(ALLOW_RATE));
            measured(n, || f.check(42));
        }
        other => {
            eprintln!(
                "unknown limiter {other:?}: turnstile|turnstile-tiered|turnstile-admitted|turnstile-admitted-coarse|floor-admitted-coarse"
            );
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
        "live-token-bucket" => run(
            turnstile::LiveTokenBucket::new(quota).expect("a quota within the ceiling"),
            n,
        ),
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
                "unknown algorithm {other:?}: token-bucket, live-token-bucket, fixed-window, \
                 sliding-window, gcra or governor"
            );
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// One clock's readings (`read`) or admitted token-bucket decisions on it
/// (`decide`), `n` of them inside `measured`.
fn run_clock(what: &str, which: &str, n: u64) -> ExitCode {
    use turnstile::{Clock, CoarseClock, MonotonicClock, Quota, RateLimiter, RealClock, TscClock};
    fn run<C: Clock>(what: &str, clock: C, n: u64) -> ExitCode {
        match what {
            "read" => measured(n, || clock.now()),
            "decide" => {
                let quota = Quota::per_second(ALLOW_RATE).expect("a valid quota");
                let l = RateLimiter::with_clock(quota, clock);
                let _ = l.try_acquire();
                measured(n, || l.try_acquire());
            }
            other => {
                eprintln!("unknown {other:?}: read or decide");
                return ExitCode::FAILURE;
            }
        }
        ExitCode::SUCCESS
    }
    match which {
        "tsc" => run(what, TscClock::new(), n),
        "real" => {
            let real = RealClock::new();
            eprintln!("RealClock reads {:?}", real.source());
            run(what, real, n)
        }
        "monotonic" => run(what, MonotonicClock::new(), n),
        "coarse" => run(what, CoarseClock::new().expect("upkeep thread"), n),
        other => {
            eprintln!("unknown clock {other:?}: tsc, real, monotonic or coarse");
            ExitCode::FAILURE
        }
    }
}

/// Each clock's reading and admitted decision, timed in alternating blocks.
fn run_paired_clocks() {
    use turnstile::{Clock, CoarseClock, MonotonicClock, Quota, RateLimiter, RealClock, TscClock};
    const BLOCK: u32 = 200_000;
    // The one-time costs: quanta's calibration, then the start-up check.
    let start = std::time::Instant::now();
    let tsc = TscClock::new();
    let calibrated = start.elapsed();
    let real = RealClock::new();
    println!(
        "first TscClock::new (quanta's calibration): {calibrated:.2?}; then the first \
         RealClock::new (the check): {:.2?}; RealClock reads {:?}",
        start.elapsed() - calibrated,
        real.source()
    );
    let (os, coarse) = (
        MonotonicClock::new(),
        CoarseClock::new().expect("upkeep thread"),
    );
    let quota = Quota::per_second(ALLOW_RATE).expect("a valid quota");
    let (l_tsc, l_real, l_os, l_coarse) = (
        RateLimiter::with_clock(quota, tsc.clone()),
        RateLimiter::with_clock(quota, real.clone()),
        RateLimiter::with_clock(quota, os),
        RateLimiter::with_clock(quota, coarse.clone()),
    );
    type Case<'a> = (&'static str, Box<dyn FnMut() + 'a>);
    let mut cases: Vec<Case<'_>> = vec![
        ("read tsc", Box::new(|| _ = black_box(tsc.now()))),
        ("read real", Box::new(|| _ = black_box(real.now()))),
        ("read monotonic", Box::new(|| _ = black_box(os.now()))),
        ("read coarse", Box::new(|| _ = black_box(coarse.now()))),
        (
            "decide tsc",
            Box::new(|| _ = black_box(l_tsc.try_acquire())),
        ),
        (
            "decide real",
            Box::new(|| _ = black_box(l_real.try_acquire())),
        ),
        (
            "decide monotonic",
            Box::new(|| _ = black_box(l_os.try_acquire())),
        ),
        (
            "decide coarse",
            Box::new(|| _ = black_box(l_coarse.try_acquire())),
        ),
    ];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..51 {
        for (i, (_, f)) in cases.iter_mut().enumerate() {
            let start = std::time::Instant::now();
            for _ in 0..BLOCK {
                f();
            }
            times[i].push(start.elapsed().as_nanos() as f64 / f64::from(BLOCK));
        }
    }
    for ((name, _), t) in cases.iter().zip(&mut times) {
        t.sort_by(f64::total_cmp);
        println!("{name:>18}: {:6.2} ns (median block)", t[t.len() / 2]);
    }
}

/// The modes, one line each: printed with no arguments (or `--help`), and on
/// stderr after a malformed command line.
const MODES: &str = "\
usage: decision_cost MODE ARGS (cargo run --profile bench --example decision_cost -- MODE ARGS)
  allow|deny turnstile|turnstile-check|governor|governor+wait precise|coarse N: N direct decisions inside `measured`, for callgrind
  paired: direct limiters, turnstile against governor, timed in alternating blocks
  neighbours: one direct limiter's size, and two threads on two adjacent limiters, then on one
  paired-keyed: keyed limiters (turnstile, governor, governor-ahash, floor) on 1M keys and a hot key, then 2-thread scaling
  paired-algorithms: each algorithm against governor's GCRA, direct, coarse clocks, alternating blocks
  algorithm allow|deny token-bucket|live-token-bucket|fixed-window|sliding-window|gcra|governor N: N decisions on a manual clock inside `measured`
  keyed-1m turnstile|turnstile-tiered|governor|governor-ahash|floor N: 1,000,000 keys, then N shuffled checks inside `measured`
  keyed-new turnstile|governor|governor-ahash N: N checks of keys never seen before, from an empty limiter, inside `measured`
  keyed-hot turnstile|turnstile-tiered|turnstile-admitted|turnstile-admitted-coarse|floor-admitted-coarse N: N decisions on one key inside `measured` (tiered: two tiers, per-key quotas; admitted: every check admitted, as in the keyed_hot_key benchmark)
  layer bare|turnstile-admitted|turnstile-denied|tower_governor-admitted|tower_governor-denied N: N requests through an axum router
  clock read|decide tsc|real|monotonic|coarse N: N readings of a clock, or N admitted decisions on it, inside `measured`
  paired-clocks: each clock's reading and admitted decision, timed in alternating blocks";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() || matches!(args.as_slice(), [a] if a == "-h" || a == "--help") {
        println!("{MODES}");
        return ExitCode::SUCCESS;
    }
    if let [mode, who, n] = args.as_slice()
        && mode == "keyed-1m"
    {
        let Ok(n) = n.parse::<u64>() else {
            eprintln!("N must be a number, not {n:?}");
            return ExitCode::FAILURE;
        };
        return run_keyed_million(who, n);
    }
    if let [mode, who, n] = args.as_slice()
        && mode == "keyed-new"
    {
        let Ok(n) = n.parse::<u64>() else {
            eprintln!("N must be a number, not {n:?}");
            return ExitCode::FAILURE;
        };
        return run_keyed_new(who, n);
    }
    if let [mode, who, n] = args.as_slice()
        && mode == "keyed-hot"
    {
        let Ok(n) = n.parse::<u64>() else {
            eprintln!("N must be a number, not {n:?}");
            return ExitCode::FAILURE;
        };
        return run_keyed_hot(who, n);
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
    if let [mode, what, which, n] = args.as_slice()
        && mode == "clock"
    {
        let Ok(n) = n.parse::<u64>() else {
            eprintln!("N must be a number, not {n:?}");
            return ExitCode::FAILURE;
        };
        return run_clock(what, which, n);
    }
    match args.first().map(String::as_str) {
        Some("paired-clocks") => {
            run_paired_clocks();
            return ExitCode::SUCCESS;
        }
        Some("paired") => {
            run_paired();
            return ExitCode::SUCCESS;
        }
        Some("neighbours") => {
            run_neighbours();
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
        eprintln!("{MODES}");
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
        ("turnstile-check", "precise") => {
            let l = turnstile::RateLimiter::new(ours_quota);
            let _ = l.check();
            measured(n, || l.check().is_ok());
        }
        ("turnstile-check", "coarse") => {
            let coarse = turnstile::CoarseClock::new().expect("upkeep thread");
            let l = turnstile::RateLimiter::with_clock(ours_quota, coarse);
            let _ = l.check();
            measured(n, || l.check().is_ok());
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
                "unknown limiter {other:?}: turnstile|turnstile-check|governor|governor+wait, \
                 precise|coarse"
            );
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
