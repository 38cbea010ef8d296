//! What each clock costs, per reading and per decision.
//!
//! `cargo bench -p turnstile-bench --bench clocks`
//!
//! - `clock_read`: one reading of each clock: quanta's raw TSC (`rdtsc`, no
//!   scaling), `TscClock` (quanta scaled to nanoseconds), `RealClock` (the
//!   checked default: the same plus a branch on its source, or the OS clock),
//!   `MonotonicClock` and `std::time::Instant::now` (the OS clock, through the
//!   vDSO on Linux), and `CoarseClock` (one load).
//! - `clock_decision`: one admitted `try_acquire` on a direct token bucket
//!   (too big to run dry) on each clock, so the difference between two rows is
//!   what the clock adds to a decision.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use turnstile::{
    Clock, CoarseClock, MonotonicClock, Quota, RateLimiter, RealClock, TokenBucket, TscClock,
};

fn reads(c: &mut Criterion) {
    let mut group = c.benchmark_group("clock_read");
    let q = quanta::Clock::new();
    group.bench_function("quanta_raw", |b| b.iter(|| black_box(q.raw())));
    let tsc = TscClock::new();
    group.bench_function("tsc", |b| b.iter(|| black_box(tsc.now())));
    let real = RealClock::new();
    group.bench_function("real", |b| b.iter(|| black_box(real.now())));
    let os = MonotonicClock::new();
    group.bench_function("monotonic", |b| b.iter(|| black_box(os.now())));
    group.bench_function("std_instant", |b| {
        b.iter(|| black_box(std::time::Instant::now()))
    });
    let coarse = CoarseClock::new().unwrap();
    group.bench_function("coarse", |b| b.iter(|| black_box(coarse.now())));
    group.finish();
    eprintln!("RealClock reads {:?}", real.source());
}

fn decide_on<C: Clock>(
    c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    clock: C,
) {
    let l: RateLimiter<TokenBucket, C> =
        RateLimiter::with_clock(Quota::per_second(1_000_000_000).unwrap(), clock);
    c.bench_function(name, |b| b.iter(|| black_box(l.try_acquire())));
    assert!(l.try_acquire().is_allowed(), "the bench must admit");
}

fn decisions(c: &mut Criterion) {
    let mut group = c.benchmark_group("clock_decision");
    decide_on(&mut group, "tsc", TscClock::new());
    decide_on(&mut group, "real", RealClock::new());
    decide_on(&mut group, "monotonic", MonotonicClock::new());
    decide_on(&mut group, "coarse", CoarseClock::new().unwrap());
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = reads, decisions
}
criterion_main!(benches);
