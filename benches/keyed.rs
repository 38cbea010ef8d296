//! The keyed limiter against governor's keyed limiter (its default DashMap store),
//! in the same groups so that every figure is a ratio from one run.
//!
//! `cargo bench --bench keyed`
//!
//! - `keyed_hot_key`: one thread, one key, every check admitted.
//! - `keyed_1m_keys`: 1,000,000 u64 keys inserted first, then visited in a
//!   shuffled order, every check admitted.
//! - `keyed_scaling`: one thread, then two threads on disjoint keys; each
//!   iteration is one check per thread, so two threads scale perfectly when their
//!   time per iteration equals one thread's.
//! - `keyed_two_threads_hot_key`: two threads on one key, every check admitted
//!   (`allow`) or all but the first denied (`deny`).
//!
//! Precise clocks are quanta's TSC for both crates; coarse clocks are
//! turnstile's `CoarseClock` and governor's `QuantaUpkeepClock`, both 1 ms.

#[path = "../examples/shared/keys.rs"]
mod keys;
use keys::shuffled;

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use governor::clock::{DefaultClock, QuantaUpkeepClock};
use governor::state::keyed::DashMapStateStore;

const ALLOW_RATE: u32 = 1_000_000_000;
const COARSE: Duration = Duration::from_millis(1);
const MANY: u64 = 1_000_000;

type Ours<C> = turnstile::KeyedLimiter<u64, turnstile::TokenBucket, C>;
type Theirs<C> = governor::RateLimiter<
    u64,
    DashMapStateStore<u64>,
    C,
    governor::middleware::NoOpMiddleware<<C as governor::clock::Clock>::Instant>,
>;

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

fn allow_quotas() -> (turnstile::Quota, governor::Quota) {
    (
        turnstile::Quota::per_second(ALLOW_RATE).expect("a valid quota"),
        governor::Quota::per_second(nonzero(ALLOW_RATE)),
    )
}

fn hot_key(c: &mut Criterion) {
    let mut group = c.benchmark_group("keyed_hot_key");
    let (q, gq) = allow_quotas();

    let l = ours(q, turnstile::RealClock::new());
    group.bench_function("turnstile/precise", |b| {
        b.iter(|| black_box(l.try_acquire(&42)))
    });
    assert!(l.try_acquire(&42).is_allowed());
    let g = theirs(gq, DefaultClock::default());
    group.bench_function("governor/precise", |b| {
        b.iter(|| black_box(g.check_key(&42)))
    });
    assert!(g.check_key(&42).is_ok());

    let l = ours(
        q,
        turnstile::CoarseClock::with_resolution(COARSE).expect("upkeep thread"),
    );
    group.bench_function("turnstile/coarse", |b| {
        b.iter(|| black_box(l.try_acquire(&42)))
    });
    assert!(l.try_acquire(&42).is_allowed());
    let g = theirs(
        gq,
        QuantaUpkeepClock::from_interval(COARSE).expect("upkeep thread"),
    );
    group.bench_function("governor/coarse", |b| {
        b.iter(|| black_box(g.check_key(&42)))
    });
    assert!(g.check_key(&42).is_ok());
    group.finish();
}

fn million_keys(c: &mut Criterion) {
    let mut group = c.benchmark_group("keyed_1m_keys");
    // 1,000 tokens, one back per hour: after its first check no bucket is full
    // (sweepable) again for an hour, and every visit is admitted.
    let q = turnstile::Quota::new(1_000, 1, Duration::from_secs(3_600)).expect("a valid quota");
    let gq = governor::Quota::with_period(Duration::from_secs(3_600))
        .expect("a nonzero period")
        .allow_burst(nonzero(1_000));
    let order = shuffled(MANY);

    fn visit<F: FnMut(u64)>(order: &[u64], next: &mut usize, mut check: F) {
        let key = order[*next];
        *next = if *next + 1 == order.len() {
            0
        } else {
            *next + 1
        };
        check(key);
    }

    let l = ours(q, turnstile::RealClock::new());
    (0..MANY).for_each(|k| assert!(l.try_acquire(&k).is_allowed()));
    assert_eq!(l.len(), MANY as usize);
    let mut next = 0;
    group.bench_function("turnstile/precise", |b| {
        b.iter(|| {
            visit(&order, &mut next, |k| {
                let _ = black_box(l.try_acquire(&k));
            })
        })
    });
    drop(l);
    let g = theirs(gq, DefaultClock::default());
    (0..MANY).for_each(|k| assert!(g.check_key(&k).is_ok()));
    let mut next = 0;
    group.bench_function("governor/precise", |b| {
        b.iter(|| {
            visit(&order, &mut next, |k| {
                let _ = black_box(g.check_key(&k));
            })
        })
    });
    drop(g);

    let l = ours(
        q,
        turnstile::CoarseClock::with_resolution(COARSE).expect("upkeep thread"),
    );
    (0..MANY).for_each(|k| assert!(l.try_acquire(&k).is_allowed()));
    let mut next = 0;
    group.bench_function("turnstile/coarse", |b| {
        b.iter(|| {
            visit(&order, &mut next, |k| {
                let _ = black_box(l.try_acquire(&k));
            })
        })
    });
    drop(l);
    let g = theirs(
        gq,
        QuantaUpkeepClock::from_interval(COARSE).expect("upkeep thread"),
    );
    (0..MANY).for_each(|k| assert!(g.check_key(&k).is_ok()));
    let mut next = 0;
    group.bench_function("governor/coarse", |b| {
        b.iter(|| {
            visit(&order, &mut next, |k| {
                let _ = black_box(g.check_key(&k));
            })
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

/// Disjoint key sets: thread `t` uses keys `t * 1_000_000 + (i % 1024)`.
fn disjoint(t: usize, i: u64) -> u64 {
    t as u64 * 1_000_000 + (i & 1_023)
}

fn scaling(c: &mut Criterion) {
    let mut group = c.benchmark_group("keyed_scaling");
    let (q, gq) = allow_quotas();
    for threads in [1, 2] {
        let l = Arc::new(ours(q, turnstile::RealClock::new()));
        group.bench_function(format!("turnstile/{threads}_threads_disjoint"), |b| {
            b.iter_custom(|iters| {
                let l = Arc::clone(&l);
                parallel(threads, iters, move |t, i| {
                    let _ = black_box(l.try_acquire(&disjoint(t, i)));
                })
            })
        });
        let g = Arc::new(theirs(gq, DefaultClock::default()));
        group.bench_function(format!("governor/{threads}_threads_disjoint"), |b| {
            b.iter_custom(|iters| {
                let g = Arc::clone(&g);
                parallel(threads, iters, move |t, i| {
                    let _ = black_box(g.check_key(&disjoint(t, i)));
                })
            })
        });
    }
    group.finish();
}

fn two_threads_hot_key(c: &mut Criterion) {
    let mut group = c.benchmark_group("keyed_two_threads_hot_key");
    let (q, gq) = allow_quotas();
    let cases = [
        ("allow", q, gq),
        (
            "deny",
            turnstile::Quota::per_hour(1).expect("a valid quota"),
            governor::Quota::per_hour(nonzero(1)),
        ),
    ];
    for (path, q, gq) in cases {
        let l = Arc::new(ours(q, turnstile::RealClock::new()));
        let _ = l.try_acquire(&42);
        group.bench_function(format!("turnstile/{path}"), |b| {
            b.iter_custom(|iters| {
                let l = Arc::clone(&l);
                parallel(2, iters, move |_, _| {
                    let _ = black_box(l.try_acquire(&42));
                })
            })
        });
        assert_eq!(l.try_acquire(&42).is_allowed(), path == "allow");
        let g = Arc::new(theirs(gq, DefaultClock::default()));
        let _ = g.check_key(&42);
        group.bench_function(format!("governor/{path}"), |b| {
            b.iter_custom(|iters| {
                let g = Arc::clone(&g);
                parallel(2, iters, move |_, _| {
                    let _ = black_box(g.check_key(&42));
                })
            })
        });
        assert_eq!(g.check_key(&42).is_ok(), path == "allow");
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = hot_key, million_keys, scaling, two_threads_hot_key
}
criterion_main!(benches);
