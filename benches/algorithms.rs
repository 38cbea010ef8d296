//! Every algorithm's allow and deny paths, direct and keyed (one hot key), with
//! governor's GCRA beside them in the same groups, so every figure is a ratio
//! from one run.
//!
//! `cargo bench -p turnstile-bench --bench algorithms`
//!
//! All on coarse clocks (turnstile's `CoarseClock`, governor's
//! `QuantaUpkeepClock`, both 1 ms), so that the figures show the algorithms
//! rather than a TSC read (about 12 ns here, see `direct`'s `clock_read`).
//!
//! - `*_allow`: every check admitted. Windows hold a bounded count, so each
//!   limiter serves at most `CHUNK` checks and is replaced, untimed; every entry,
//!   governor's too, is measured the same way.
//! - `*_deny`: one permit per hour, taken first; every check denied.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use governor::clock::QuantaUpkeepClock;
use turnstile::{
    Algorithm, CoarseClock, FixedWindow, Gcra, KeyedBuilder, Quota, RateLimiter, SlidingWindow,
    TokenBucket,
};

const COARSE: Duration = Duration::from_millis(1);
/// Checks per limiter in the allow groups: within every algorithm's limit.
const CHUNK: u64 = 1 << 20;
const HOUR: Duration = Duration::from_secs(3_600);

/// Time `iters` calls of `check` on limiters made by `make`, a fresh one every
/// `CHUNK` calls; only the calls are timed.
fn chunked<L>(iters: u64, make: &impl Fn() -> L, check: &impl Fn(&L)) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(CHUNK);
        let limiter = make();
        let start = Instant::now();
        for _ in 0..n {
            check(&limiter);
        }
        total += start.elapsed();
        left -= n;
    }
    total
}

/// Allow-path algorithms: each admits at least `CHUNK` at once.
fn allowing() -> [(&'static str, Dyn); 4] {
    let big = Quota::per_second(1_000_000_000).unwrap();
    [
        ("token-bucket", Dyn::Bucket(TokenBucket::new(big))),
        (
            "fixed-window",
            Dyn::Fixed(FixedWindow::new(u32::MAX, HOUR).unwrap()),
        ),
        (
            "sliding-window",
            Dyn::Sliding(SlidingWindow::new((1 << 24) - 1, 2 * HOUR).unwrap()),
        ),
        ("gcra", Dyn::Gcra(Gcra::new(big))),
    ]
}

/// Deny-path algorithms: one permit an hour.
fn denying() -> [(&'static str, Dyn); 4] {
    let hourly = Quota::per_hour(1).unwrap();
    [
        ("token-bucket", Dyn::Bucket(TokenBucket::new(hourly))),
        (
            "fixed-window",
            Dyn::Fixed(FixedWindow::new(1, HOUR).unwrap()),
        ),
        (
            "sliding-window",
            Dyn::Sliding(SlidingWindow::new(1, HOUR).unwrap()),
        ),
        ("gcra", Dyn::Gcra(Gcra::new(hourly))),
    ]
}

/// The four algorithms as one type for the tables above; each benchmark is
/// monomorphized through [`with`].
#[derive(Clone, Copy)]
enum Dyn {
    Bucket(TokenBucket),
    Fixed(FixedWindow),
    Sliding(SlidingWindow),
    Gcra(Gcra),
}

/// Call `f` with the concrete algorithm.
macro_rules! with {
    ($dyn:expr, |$a:ident| $body:expr) => {
        match $dyn {
            Dyn::Bucket($a) => $body,
            Dyn::Fixed($a) => $body,
            Dyn::Sliding($a) => $body,
            Dyn::Gcra($a) => $body,
        }
    };
}

fn nonzero(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("nonzero")
}

fn direct<A: Algorithm + Copy>(a: A, clock: &CoarseClock) -> RateLimiter<A, CoarseClock> {
    RateLimiter::from_parts(a, clock.clone())
}

fn direct_allow(c: &mut Criterion) {
    let mut group = c.benchmark_group("algorithm_direct_allow");
    let clock = CoarseClock::with_resolution(COARSE).unwrap();
    for (name, algorithm) in allowing() {
        with!(algorithm, |a| {
            group.bench_function(format!("turnstile/{name}"), |b| {
                b.iter_custom(|iters| {
                    chunked(iters, &|| direct(a, &clock), &|l| {
                        let _ = black_box(l.try_acquire());
                    })
                })
            });
            assert!(direct(a, &clock).try_acquire().is_allowed());
        });
    }
    let upkeep = QuantaUpkeepClock::from_interval(COARSE).unwrap();
    let quota = governor::Quota::per_second(nonzero(u32::MAX));
    let make = || governor::RateLimiter::direct_with_clock(quota, upkeep.clone());
    group.bench_function("governor/gcra", |b| {
        b.iter_custom(|iters| {
            chunked(iters, &make, &|l| {
                let _ = black_box(l.check());
            })
        })
    });
    assert!(make().check().is_ok());
    group.finish();
}

fn direct_deny(c: &mut Criterion) {
    let mut group = c.benchmark_group("algorithm_direct_deny");
    let clock = CoarseClock::with_resolution(COARSE).unwrap();
    for (name, algorithm) in denying() {
        with!(algorithm, |a| {
            let l = direct(a, &clock);
            assert!(l.try_acquire().is_allowed());
            group.bench_function(format!("turnstile/{name}"), |b| {
                b.iter(|| black_box(l.try_acquire()))
            });
            assert!(l.try_acquire().is_denied(), "the deny bench must deny");
        });
    }
    let upkeep = QuantaUpkeepClock::from_interval(COARSE).unwrap();
    let g = governor::RateLimiter::direct_with_clock(governor::Quota::per_hour(nonzero(1)), upkeep);
    assert!(g.check().is_ok());
    group.bench_function("governor/gcra", |b| b.iter(|| black_box(g.check())));
    assert!(g.check().is_err(), "the deny bench must deny");
    group.finish();
}

type Keyed<A> = turnstile::KeyedLimiter<u64, A, CoarseClock>;

fn keyed<A: Algorithm>(a: A, clock: &CoarseClock) -> Keyed<A> {
    KeyedBuilder::new(a).clock(clock.clone()).build().unwrap()
}

fn keyed_allow(c: &mut Criterion) {
    let mut group = c.benchmark_group("algorithm_keyed_allow");
    let clock = CoarseClock::with_resolution(COARSE).unwrap();
    for (name, algorithm) in allowing() {
        with!(algorithm, |a| {
            group.bench_function(format!("turnstile/{name}"), |b| {
                b.iter_custom(|iters| {
                    chunked(iters, &|| keyed(a, &clock), &|l| {
                        let _ = black_box(l.try_acquire(&42));
                    })
                })
            });
            assert!(keyed(a, &clock).try_acquire(&42).is_allowed());
        });
    }
    let upkeep = QuantaUpkeepClock::from_interval(COARSE).unwrap();
    let quota = governor::Quota::per_second(nonzero(u32::MAX));
    let make = || governor::RateLimiter::dashmap_with_clock(quota, upkeep.clone());
    group.bench_function("governor/gcra", |b| {
        b.iter_custom(|iters| {
            chunked(iters, &make, &|l| {
                let _ = black_box(l.check_key(&42u64));
            })
        })
    });
    assert!(make().check_key(&42u64).is_ok());
    group.finish();
}

fn keyed_deny(c: &mut Criterion) {
    let mut group = c.benchmark_group("algorithm_keyed_deny");
    let clock = CoarseClock::with_resolution(COARSE).unwrap();
    for (name, algorithm) in denying() {
        with!(algorithm, |a| {
            let l = keyed(a, &clock);
            assert!(l.try_acquire(&42).is_allowed());
            group.bench_function(format!("turnstile/{name}"), |b| {
                b.iter(|| black_box(l.try_acquire(&42)))
            });
            assert!(l.try_acquire(&42).is_denied(), "the deny bench must deny");
        });
    }
    let upkeep = QuantaUpkeepClock::from_interval(COARSE).unwrap();
    let g =
        governor::RateLimiter::dashmap_with_clock(governor::Quota::per_hour(nonzero(1)), upkeep);
    assert!(g.check_key(&42u64).is_ok());
    group.bench_function("governor/gcra", |b| {
        b.iter(|| black_box(g.check_key(&42u64)))
    });
    assert!(g.check_key(&42u64).is_err(), "the deny bench must deny");
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = direct_allow, direct_deny, keyed_allow, keyed_deny
}
criterion_main!(benches);
