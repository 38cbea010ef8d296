//! The keyed modes: `paired-keyed` (1,000,000 keys and a hot key, then two
//! threads), and for callgrind `keyed-1m`, `keyed-new` and `keyed-hot`;
//! turnstile's keyed limiter and per-key quotas beside governor's and the
//! floor.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::process::ExitCode;
use std::time::Duration;

use crate::floor::Floor;
use crate::keys::shuffled;
use crate::{ALLOW_RATE, measured};

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

pub(crate) fn run_paired_keyed() {
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
pub(crate) fn run_keyed_new(who: &str, n: u64) -> ExitCode {
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

pub(crate) fn run_keyed_million(who: &str, n: u64) -> ExitCode {
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
pub(crate) fn run_keyed_hot(who: &str, n: u64) -> ExitCode {
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
