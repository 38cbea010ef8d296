//! A decision of Redis' leased mode while a lease is held, beside an
//! in-process keyed decision and governor's keyed check, in one group so that
//! every figure is a ratio from one run.
//!
//! `cargo bench -p turnstile-bench --bench leased` (needs `redis-server` on PATH; without it the
//! bench says so and measures nothing).
//!
//! The leased limiter takes leases of the largest size its bucket allows (the
//! bucket's capacity, a million tokens; `MAX_LEASE` is larger) from a bucket
//! that never runs dry, so a call to Redis falls once per four million
//! decisions and the loop measures the local word: the key's lookup in the
//! keyed map and one compare-and-swap. All three on the real clock, one hot
//! key, one thread; the in-process limiters admit every check.

// The test suites' helper; this bench uses part of it.
#[allow(dead_code)]
#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use turnstile::redis::{Deadlines, LeasedBuilder, MAX_LEASE, RedisLimiter};
use turnstile::{KeyedLimiter, Quota, TokenBucket};

fn leased_hot_key(c: &mut Criterion) {
    let Some(server) = redis_server::server("leased bench") else {
        eprintln!("redis-server not found: the leased bench measured nothing");
        return;
    };
    let mut con = Deadlines::default()
        .response(Duration::from_millis(50))
        .expect("a valid deadline")
        .blocking(server.client());
    let plenty = Quota::per_second(1_000_000_000)
        .and_then(|q| q.burst(1_000_000))
        .expect("a valid quota");
    let global = RedisLimiter::new("bench", TokenBucket::new(plenty)).expect("a token bucket");
    // The largest lease this bucket allows: its capacity is below MAX_LEASE.
    let leased = LeasedBuilder::new(global, MAX_LEASE.min(plenty.capacity()))
        .expect("a token bucket and a lease within its capacity")
        .lifetime(Duration::from_secs(3_600))
        .build()
        .expect("a leased limiter");
    // Grow the lease to its largest size before measuring.
    for _ in 0..(4 * MAX_LEASE) {
        let _ = leased.try_acquire(&mut con, b"k");
    }
    let keyed = KeyedLimiter::<Vec<u8>>::new(plenty);
    let governor = governor::RateLimiter::<Vec<u8>, _, _>::dashmap(governor::Quota::per_second(
        NonZeroU32::new(1_000_000_000).expect("nonzero"),
    ));

    let mut group = c.benchmark_group("leased_hot_key");
    group.bench_function("turnstile-keyed/precise", |b| {
        b.iter(|| black_box(keyed.try_acquire(black_box(&b"k"[..]))))
    });
    let before = leased.stats().redis_calls();
    group.bench_function("turnstile-leased-held/precise", |b| {
        b.iter(|| black_box(leased.try_acquire(&mut con, black_box(b"k")).ok()))
    });
    let calls = leased.stats().redis_calls() - before;
    let key = b"k".to_vec();
    group.bench_function("governor/precise", |b| {
        b.iter(|| black_box(governor.check_key(black_box(&key)).is_ok()))
    });
    group.finish();
    eprintln!("Redis calls while the leased decisions were measured: {calls}");
    assert!(
        keyed.try_acquire(&b"k"[..]).is_allowed(),
        "the bench must allow"
    );
    drop(server);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = leased_hot_key
}
criterion_main!(benches);
