//! The keyed limiter against governor's keyed limiter, in the same groups so that
//! every figure is a ratio from one run.
//!
//! `cargo bench -p turnstile-bench --bench keyed` (the bench profile: fat LTO, one codegen unit,
//! for every crate in the build).
//!
//! Contenders, in every group:
//!
//! - `turnstile`: `KeyedLimiter<u64>` (token bucket, `ahash`, default shards).
//! - `governor`: governor's keyed limiter on its default store, a DashMap with
//!   std's `RandomState` (SipHash-1-3).
//! - `governor-ahash`: the same DashMap store with `ahash::RandomState`, through
//!   `RateLimiter::dashmap_with_clock_and_hasher`: governor's fastest keyed
//!   configuration, with the hasher turnstile uses.
//! - `floor`: `examples/shared/floor.rs`, the least work a keyed decision can
//!   do (one `ahash`, one table lookup, one clock reading, one compare-and-swap;
//!   no lock, no insertion).
//!
//! Groups:
//!
//! - `keyed_hot_key`: one thread, one key, every check admitted.
//! - `keyed_1m_keys`: 1,000,000 u64 keys inserted first, then visited in a
//!   shuffled order, every check admitted.
//! - `keyed_1m_keys_generous`: the same walk under a quota of 1,000 a second
//!   (coarse clocks): each bucket is full again between its key's visits, so
//!   a limiter that evicts full buckets would evict keys in use.
//! - `keyed_new_keys`: a key never seen before at every check, from an empty
//!   limiter each sample (inserts and table growth; no floor, which never
//!   inserts).
//! - `keyed_scaling`: one thread, then two threads on disjoint keys; each
//!   iteration is one check per thread, so two threads scale perfectly when their
//!   time per iteration equals one thread's.
//! - `keyed_two_threads_hot_key`: two threads on one key, every check admitted
//!   (`allow`) or all but the first denied (`deny`). Before the group, in bench
//!   mode only, each contender runs both threads on one key for 200 ms per path
//!   and prints its decisions per second and each thread's share of them to
//!   stderr: an even split means neither thread starves under contention.
//!
//! Precise clocks are quanta's TSC for every contender; coarse clocks are
//! turnstile's `CoarseClock` (turnstile, floor) and governor's
//! `QuantaUpkeepClock`, all 1 ms.

#[path = "../examples/shared/floor.rs"]
mod floor;
#[path = "../examples/shared/keys.rs"]
mod keys;
use floor::Floor;
use keys::shuffled;

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{
    BenchmarkGroup, Criterion, criterion_group, criterion_main, measurement::WallTime,
};
use governor::clock::{DefaultClock, QuantaUpkeepClock};
use governor::state::keyed::DashMapStateStore;

const ALLOW_RATE: u32 = 1_000_000_000;
const COARSE: Duration = Duration::from_millis(1);
const MANY: u64 = 1_000_000;
const HOUR_NANOS: u64 = 3_600_000_000_000;

type Ours<C> = turnstile::KeyedLimiter<u64, turnstile::TokenBucket, C>;
/// governor's keyed limiter on a DashMap hashed by `S` (default: governor's
/// default hasher, std's `RandomState`).
type Theirs<C, S = std::hash::RandomState> = governor::RateLimiter<
    u64,
    DashMapStateStore<u64, S>,
    C,
    governor::middleware::NoOpMiddleware<<C as governor::clock::Clock>::Instant>,
>;

/// A floor's rate: nanoseconds between admissions, and the burst.
#[derive(Clone, Copy)]
struct FloorQuota {
    interval_nanos: u64,
    burst: u64,
}

/// The floor's equivalent of `allow_quotas`: 10^9 per second, burst 10^9.
const FLOOR_ALLOW: FloorQuota = FloorQuota {
    interval_nanos: 1,
    burst: ALLOW_RATE as u64,
};

fn nonzero(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("nonzero")
}

fn ours<C: turnstile::Clock>(quota: turnstile::Quota, clock: C) -> Ours<C> {
    turnstile::KeyedLimiter::<u64>::builder(quota)
        .clock(clock)
        .max_keys(2 * MANY as usize)
        .build()
        .expect("a valid configuration")
}

fn theirs<C: governor::clock::Clock>(quota: governor::Quota, clock: C) -> Theirs<C> {
    governor::RateLimiter::dashmap_with_clock(quota, clock)
}

/// governor's keyed limiter with `ahash` in place of SipHash.
fn theirs_ahash<C: governor::clock::Clock>(
    quota: governor::Quota,
    clock: C,
) -> Theirs<C, ahash::RandomState> {
    governor::RateLimiter::dashmap_with_clock_and_hasher(quota, clock, ahash::RandomState::new())
}

fn floor<C: turnstile::Clock>(
    keys: impl IntoIterator<Item = u64>,
    quota: FloorQuota,
    clock: C,
) -> Floor<C> {
    Floor::new(keys, clock, quota.interval_nanos, quota.burst)
}

fn allow_quotas() -> (turnstile::Quota, governor::Quota) {
    (
        turnstile::Quota::per_second(ALLOW_RATE).expect("a valid quota"),
        governor::Quota::per_second(nonzero(ALLOW_RATE)),
    )
}

/// One check per iteration of `check`.
fn bench<T>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, mut check: impl FnMut() -> T) {
    group.bench_function(name, |b| b.iter(|| black_box(check())));
}

fn hot_key(c: &mut Criterion) {
    let mut group = c.benchmark_group("keyed_hot_key");

    /// Every contender on one key, `ours` for turnstile and the floor, `theirs`
    /// for both governor limiters.
    fn contenders<C, G>(
        group: &mut BenchmarkGroup<'_, WallTime>,
        clock: &str,
        ours_clock: C,
        theirs_clock: G,
    ) where
        C: turnstile::Clock + Clone,
        G: governor::clock::Clock + Clone,
    {
        let (q, gq) = allow_quotas();
        let l = ours(q, ours_clock.clone());
        bench(group, &format!("turnstile/{clock}"), || l.try_acquire(&42));
        assert!(l.try_acquire(&42).is_allowed());
        // Per-key quotas: two tiers, the key's tier from a bit of the key.
        let t = turnstile::Tiered::new(
            [
                ("free", ours(q, ours_clock.clone())),
                ("paid", ours(q, ours_clock.clone())),
            ],
            |key: &u64| (*key & 1) as usize,
        )
        .expect("two tiers");
        bench(group, &format!("turnstile-tiered/{clock}"), || {
            t.try_acquire(&42)
        });
        assert!(t.try_acquire(&42).is_allowed());
        let g = theirs(gq, theirs_clock.clone());
        bench(group, &format!("governor/{clock}"), || g.check_key(&42));
        assert!(g.check_key(&42).is_ok());
        let g = theirs_ahash(gq, theirs_clock);
        bench(group, &format!("governor-ahash/{clock}"), || {
            g.check_key(&42)
        });
        assert!(g.check_key(&42).is_ok());
        let f = floor([42], FLOOR_ALLOW, ours_clock);
        bench(group, &format!("floor/{clock}"), || f.check(42));
        assert!(f.check(42));
    }

    contenders(
        &mut group,
        "precise",
        turnstile::RealClock::new(),
        DefaultClock::default(),
    );
    // quanta allows one upkeep thread per process: both governor limiters share
    // one clock, whose thread stops when its last clone is dropped.
    contenders(
        &mut group,
        "coarse",
        turnstile::CoarseClock::with_resolution(COARSE).expect("upkeep thread"),
        QuantaUpkeepClock::from_interval(COARSE).expect("upkeep thread"),
    );
    group.finish();
}

fn million_keys(c: &mut Criterion) {
    let mut group = c.benchmark_group("keyed_1m_keys");
    let order = shuffled(MANY);

    /// Each iteration checks the next key of `order`, wrapping around.
    fn walk<T>(
        group: &mut BenchmarkGroup<'_, WallTime>,
        name: &str,
        order: &[u64],
        check: impl Fn(u64) -> T,
    ) {
        let mut next = 0;
        group.bench_function(name, |b| {
            b.iter(|| {
                let key = order[next];
                next = if next + 1 == order.len() { 0 } else { next + 1 };
                black_box(check(key))
            })
        });
    }

    /// Every contender holding `MANY` keys, one at a time (each holds about
    /// 36 MB), then walking them.
    fn contenders<C, G>(
        group: &mut BenchmarkGroup<'_, WallTime>,
        order: &[u64],
        clock: &str,
        ours_clock: C,
        theirs_clock: G,
    ) where
        C: turnstile::Clock + Clone,
        G: governor::clock::Clock + Clone,
    {
        // 1,000 tokens, one back per hour: after its first check no bucket is full
        // (sweepable) again for an hour, and every visit is admitted.
        let q = turnstile::Quota::new(1_000, 1, Duration::from_secs(3_600)).expect("a valid quota");
        let gq = governor::Quota::with_period(Duration::from_secs(3_600))
            .expect("a nonzero period")
            .allow_burst(nonzero(1_000));
        let fq = FloorQuota {
            interval_nanos: HOUR_NANOS,
            burst: 1_000,
        };
        contenders_on(group, order, clock, (q, gq, fq), ours_clock, theirs_clock);
    }

    /// As `contenders`, on the quotas given.
    fn contenders_on<C, G>(
        group: &mut BenchmarkGroup<'_, WallTime>,
        order: &[u64],
        clock: &str,
        (q, gq, fq): (turnstile::Quota, governor::Quota, FloorQuota),
        ours_clock: C,
        theirs_clock: G,
    ) where
        C: turnstile::Clock + Clone,
        G: governor::clock::Clock + Clone,
    {
        let l = ours(q, ours_clock.clone());
        // Twice: under the generous quota each shard's first automatic sweep
        // takes the keys already full then (the later ones spare keys in
        // use), and the second visit brings them back, so that every key is
        // held when the timing starts.
        for _ in 0..2 {
            (0..MANY).for_each(|k| assert!(l.try_acquire(&k).is_allowed()));
        }
        assert_eq!(l.len(), MANY as usize);
        walk(group, &format!("turnstile/{clock}"), order, |k| {
            l.try_acquire(&k)
        });
        drop(l);
        let g = theirs(gq, theirs_clock.clone());
        (0..MANY).for_each(|k| assert!(g.check_key(&k).is_ok()));
        assert_eq!(g.len(), MANY as usize);
        walk(group, &format!("governor/{clock}"), order, |k| {
            g.check_key(&k)
        });
        drop(g);
        let g = theirs_ahash(gq, theirs_clock);
        (0..MANY).for_each(|k| assert!(g.check_key(&k).is_ok()));
        assert_eq!(g.len(), MANY as usize);
        walk(group, &format!("governor-ahash/{clock}"), order, |k| {
            g.check_key(&k)
        });
        drop(g);
        let f = floor(0..MANY, fq, ours_clock);
        (0..MANY).for_each(|k| assert!(f.check(k)));
        walk(group, &format!("floor/{clock}"), order, |k| f.check(k));
    }

    contenders(
        &mut group,
        &order,
        "precise",
        turnstile::RealClock::new(),
        DefaultClock::default(),
    );
    let coarse = turnstile::CoarseClock::with_resolution(COARSE).expect("upkeep thread");
    let upkeep = QuantaUpkeepClock::from_interval(COARSE).expect("upkeep thread");
    contenders(&mut group, &order, "coarse", coarse.clone(), upkeep.clone());
    group.finish();

    // A generous quota, 1,000 a second with a burst of 1,000: a key visited
    // every few tens of milliseconds has a full (sweepable) bucket again
    // between its visits. Every contender still admits every check.
    let mut group = c.benchmark_group("keyed_1m_keys_generous");
    let quotas = (
        turnstile::Quota::per_second(1_000).expect("a valid quota"),
        governor::Quota::per_second(nonzero(1_000)),
        FloorQuota {
            interval_nanos: 1_000_000,
            burst: 1_000,
        },
    );
    contenders_on(&mut group, &order, "coarse", quotas, coarse, upkeep);
    group.finish();
}

/// A key never seen before at every check: each sample starts from an empty
/// limiter (built and dropped outside the timing) and checks `iters` new keys,
/// so the time includes the inserts and the tables' growth. No floor: it
/// never inserts.
fn new_keys(c: &mut Criterion) {
    let mut group = c.benchmark_group("keyed_new_keys");
    let (q, gq) = (
        turnstile::Quota::per_second(10).expect("a valid quota"),
        governor::Quota::per_second(nonzero(10)),
    );
    // Keys spread over the whole `u64` range, as hashed identifiers are.
    let key = |i: u64| i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    /// `iters` checks of new keys on a fresh limiter from `build`.
    fn timed<L, T>(iters: u64, build: impl Fn() -> L, check: impl Fn(&L, u64) -> T) -> Duration {
        let l = build();
        let start = Instant::now();
        for i in 0..iters {
            black_box(check(&l, i));
        }
        let elapsed = start.elapsed();
        drop(l);
        elapsed
    }
    let coarse = turnstile::CoarseClock::with_resolution(COARSE).expect("upkeep thread");
    let upkeep = QuantaUpkeepClock::from_interval(COARSE).expect("upkeep thread");
    group.bench_function("turnstile/coarse", |b| {
        b.iter_custom(|iters| {
            timed(
                iters,
                || {
                    turnstile::KeyedLimiter::<u64>::builder(q)
                        .clock(coarse.clone())
                        .max_keys(usize::MAX)
                        .build()
                        .expect("a valid configuration")
                },
                |l, i| l.try_acquire(&key(i)),
            )
        })
    });
    group.bench_function("governor/coarse", |b| {
        b.iter_custom(|iters| {
            timed(
                iters,
                || theirs(gq, upkeep.clone()),
                |g, i| g.check_key(&key(i)),
            )
        })
    });
    group.bench_function("governor-ahash/coarse", |b| {
        b.iter_custom(|iters| {
            timed(
                iters,
                || theirs_ahash(gq, upkeep.clone()),
                |g, i| g.check_key(&key(i)),
            )
        })
    });
    group.finish();
}

/// `threads` threads, started before timing, each running `iters` checks;
/// returns the wall time from the common start to the last finish.
fn parallel<F>(threads: usize, iters: u64, check: F) -> Duration
where
    F: Fn(usize, u64) + Send + Sync + 'static,
{
    let check = Arc::new(check);
    let start = Arc::new(Barrier::new(threads + 1));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (check, start) = (Arc::clone(&check), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                for i in 0..iters {
                    check(t, i);
                }
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    for w in workers {
        w.join().expect("a bench thread panicked");
    }
    began.elapsed()
}

/// Times `threads` threads running `check` in parallel, one check per thread per
/// iteration.
fn bench_parallel<T: Send + Sync + 'static>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    threads: usize,
    shared: &Arc<T>,
    check: fn(&T, usize, u64),
) {
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let shared = Arc::clone(shared);
            parallel(threads, iters, move |t, i| check(&shared, t, i))
        })
    });
}

/// Disjoint key sets: thread `t` uses keys `t * 1_000_000 + (i % 1024)`.
fn disjoint(t: usize, i: u64) -> u64 {
    t as u64 * 1_000_000 + (i & 1_023)
}

fn scaling(c: &mut Criterion) {
    let mut group = c.benchmark_group("keyed_scaling");
    let (q, gq) = allow_quotas();
    for threads in [1, 2] {
        let name = |who: &str| format!("{who}/{threads}_threads_disjoint");
        let l = Arc::new(ours(q, turnstile::RealClock::new()));
        bench_parallel(&mut group, &name("turnstile"), threads, &l, |l, t, i| {
            let _ = black_box(l.try_acquire(&disjoint(t, i)));
        });
        let g = Arc::new(theirs(gq, DefaultClock::default()));
        bench_parallel(&mut group, &name("governor"), threads, &g, |g, t, i| {
            let _ = black_box(g.check_key(&disjoint(t, i)));
        });
        let g = Arc::new(theirs_ahash(gq, DefaultClock::default()));
        bench_parallel(
            &mut group,
            &name("governor-ahash"),
            threads,
            &g,
            |g, t, i| {
                let _ = black_box(g.check_key(&disjoint(t, i)));
            },
        );
        let keys = (0..threads).flat_map(|t| (0..1_024).map(move |i| disjoint(t, i)));
        let f = Arc::new(floor(keys, FLOOR_ALLOW, turnstile::RealClock::new()));
        bench_parallel(&mut group, &name("floor"), threads, &f, |f, t, i| {
            let _ = black_box(f.check(disjoint(t, i)));
        });
    }
    group.finish();
}

/// Two threads running `check` on one key as fast as they can for 200 ms,
/// after one untimed check (a deny limiter's one permit): prints the decisions
/// per second in all and each thread's share of them.
fn shares(path: &str, who: &str, check: impl Fn() + Sync) {
    check();
    let stop = AtomicBool::new(false);
    let start = Barrier::new(3);
    let (counts, elapsed) = std::thread::scope(|s| {
        let workers = [0, 1].map(|_| {
            s.spawn(|| {
                start.wait();
                let mut n = 0_u64;
                // Relaxed: the flag only ends the loop; the count comes back
                // through `join`, which synchronizes.
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..64 {
                        check();
                    }
                    n += 64;
                }
                n
            })
        });
        start.wait();
        let began = Instant::now();
        std::thread::sleep(Duration::from_millis(200));
        // Relaxed: as the load; nothing else is published with the flag.
        stop.store(true, Ordering::Relaxed);
        let counts = workers.map(|w| w.join().expect("a fairness thread panicked"));
        (counts, began.elapsed())
    });
    let all = (counts[0] + counts[1]) as f64;
    let share = |n: u64| 100.0 * n as f64 / all;
    eprintln!(
        "{path:<5} {who:<15} {:7.1} M decisions/s, thread shares {:.1}% / {:.1}%",
        all / elapsed.as_secs_f64() / 1e6,
        share(counts[0]),
        share(counts[1]),
    );
}

/// Each contender's throughput and per-thread shares with two threads on one
/// key, printed to stderr: a thread that wins most compare-and-swaps or lock
/// acquisitions starves the other, which criterion's time per iteration hides.
fn fairness(cases: &[(&str, turnstile::Quota, governor::Quota, FloorQuota)]) {
    eprintln!("two threads, one key, 200 ms each: decisions/s, each thread's share");
    for &(path, q, gq, fq) in cases {
        let l = ours(q, turnstile::RealClock::new());
        shares(path, "turnstile", || {
            let _ = black_box(l.try_acquire(&42));
        });
        let g = theirs(gq, DefaultClock::default());
        shares(path, "governor", || {
            let _ = black_box(g.check_key(&42));
        });
        let g = theirs_ahash(gq, DefaultClock::default());
        shares(path, "governor-ahash", || {
            let _ = black_box(g.check_key(&42));
        });
        let f = floor([42], fq, turnstile::RealClock::new());
        shares(path, "floor", || {
            let _ = black_box(f.check(42));
        });
    }
}

fn two_threads_hot_key(c: &mut Criterion) {
    let (q, gq) = allow_quotas();
    let cases = [
        ("allow", q, gq, FLOOR_ALLOW),
        (
            "deny",
            turnstile::Quota::per_hour(1).expect("a valid quota"),
            governor::Quota::per_hour(nonzero(1)),
            FloorQuota {
                interval_nanos: HOUR_NANOS,
                burst: 1,
            },
        ),
    ];
    // cargo bench passes `--bench`; without it, or with `--test`, criterion runs
    // each bench once as a test, and `--list` only lists them: none of those
    // wants 1.6 s of fairness runs.
    let flag = |f: &str| std::env::args().any(|a| a == f);
    if flag("--bench") && !flag("--test") && !flag("--list") {
        fairness(&cases);
    }

    let mut group = c.benchmark_group("keyed_two_threads_hot_key");
    for (path, q, gq, fq) in cases {
        let allow = path == "allow";
        let name = |who: &str| format!("{who}/{path}");
        let l = Arc::new(ours(q, turnstile::RealClock::new()));
        let _ = l.try_acquire(&42);
        bench_parallel(&mut group, &name("turnstile"), 2, &l, |l, _, _| {
            let _ = black_box(l.try_acquire(&42));
        });
        assert_eq!(l.try_acquire(&42).is_allowed(), allow);
        let g = Arc::new(theirs(gq, DefaultClock::default()));
        let _ = g.check_key(&42);
        bench_parallel(&mut group, &name("governor"), 2, &g, |g, _, _| {
            let _ = black_box(g.check_key(&42));
        });
        assert_eq!(g.check_key(&42).is_ok(), allow);
        let g = Arc::new(theirs_ahash(gq, DefaultClock::default()));
        let _ = g.check_key(&42);
        bench_parallel(&mut group, &name("governor-ahash"), 2, &g, |g, _, _| {
            let _ = black_box(g.check_key(&42));
        });
        assert_eq!(g.check_key(&42).is_ok(), allow);
        let f = Arc::new(floor([42], fq, turnstile::RealClock::new()));
        let _ = f.check(42);
        bench_parallel(&mut group, &name("floor"), 2, &f, |f, _, _| {
            let _ = black_box(f.check(42));
        });
        assert_eq!(f.check(42), allow);
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = hot_key, million_keys, new_keys, scaling, two_threads_hot_key
}
criterion_main!(benches);
