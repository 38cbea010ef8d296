//! Redis' leased mode beside an in-process keyed decision (and governor's
//! keyed check), in one group per setup so that every figure is a ratio from
//! one run.
//!
//! `cargo bench -p turnstile-bench --bench leased` (needs `redis-server` on PATH;
//! without it the bench says so and measures nothing). Built with the bench
//! profile (fat LTO, one codegen unit) for every crate alike.
//!
//! - `leased_hot_key`: a decision while a lease is held. Leases of the largest
//!   size the bucket allows (its capacity, a million tokens), so a call to
//!   Redis falls once per million decisions and the loop measures the local
//!   word: the key's lookup in the keyed map and one compare-and-swap;
//!   without a refresher and with one started (its queue checked on the
//!   prefetch path only).
//! - `leased_l1000` (one thread) and `leased_l1000_4_threads`: leases of
//!   L = 1,000 from a bucket that never runs dry, the fetches included in the
//!   average, without and with a refresher. Each prints the Redis calls per
//!   decision it made while measured (the target: at most 1/L = 0.001).
//!
//! All on the real clock, one hot key; the in-process limiters admit every
//! check.

// The test suites' helper; this bench uses part of it.
#[allow(dead_code)]
#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use turnstile::redis::{
    BlockingConnection, Deadlines, LeasedBuilder, LeasedLimiter, MAX_LEASE, RedisLimiter, Refresher,
};
use turnstile::{KeyedLimiter, Quota, TokenBucket};

/// A bucket that never runs dry here: a billion a second, a million at once.
fn plenty() -> Quota {
    Quota::per_second_with_burst(1_000_000_000, 1_000_000).expect("a valid quota")
}

fn connection(server: &redis_server::Server) -> BlockingConnection {
    Deadlines::default()
        .response(Duration::from_millis(50))
        .expect("a valid deadline")
        .blocking(server.client())
}

/// A leased limiter on its own key prefix, leases of at most `lease`, with a
/// refresher on a connection of its own when `refresher`.
fn leased(
    server: &redis_server::Server,
    name: &str,
    lease: u32,
    refresher: bool,
) -> (Arc<LeasedLimiter>, Option<Refresher>) {
    let global = RedisLimiter::new(name, TokenBucket::new(plenty())).expect("a token bucket");
    let limiter = Arc::new(
        LeasedBuilder::new(global, lease)
            .expect("a token bucket and a lease within its capacity")
            .lifetime(Duration::from_secs(3_600))
            .fetch_wait(Duration::from_millis(50))
            .build()
            .expect("a leased limiter"),
    );
    let refresher = refresher.then(|| {
        limiter
            .start_refresher(connection(server))
            .expect("a thread")
            .expect("the first refresher")
    });
    // Grow the lease to its largest size before measuring.
    let mut con = connection(server);
    for _ in 0..(4 * lease.max(1_000)) {
        let _ = limiter.try_acquire(&mut con, b"k");
    }
    (limiter, refresher)
}

fn leased_hot_key(c: &mut Criterion) {
    let Some(server) = redis_server::server("leased bench") else {
        eprintln!("redis-server not found: the leased bench measured nothing");
        return;
    };
    let mut con = connection(&server);
    // The largest lease this bucket allows: its capacity is below MAX_LEASE.
    let largest = MAX_LEASE.min(plenty().capacity());
    let (held, _) = leased(&server, "held", largest, false);
    let (held_refreshed, _refresher) = leased(&server, "held-refresher", largest, true);
    let keyed = KeyedLimiter::<Vec<u8>>::new(plenty());
    let governor = governor::RateLimiter::<Vec<u8>, _, _>::dashmap(governor::Quota::per_second(
        NonZeroU32::new(1_000_000_000).expect("nonzero"),
    ));

    let mut group = c.benchmark_group("leased_hot_key");
    group.bench_function("turnstile-keyed/precise", |b| {
        b.iter(|| black_box(keyed.try_acquire(black_box(&b"k"[..]))))
    });
    let before = held.stats().redis_calls() + held_refreshed.stats().redis_calls();
    group.bench_function("turnstile-leased-held/precise", |b| {
        b.iter(|| black_box(held.try_acquire(&mut con, black_box(b"k")).ok()))
    });
    group.bench_function("turnstile-leased-held-refresher/precise", |b| {
        b.iter(|| black_box(held_refreshed.try_acquire(&mut con, black_box(b"k")).ok()))
    });
    let calls = held.stats().redis_calls() + held_refreshed.stats().redis_calls() - before;
    let key = b"k".to_vec();
    group.bench_function("governor/precise", |b| {
        b.iter(|| black_box(governor.check_key(black_box(&key)).is_ok()))
    });
    group.finish();
    eprintln!("leased_hot_key: Redis calls while the held leases were measured: {calls}");
    assert!(
        keyed.try_acquire(&b"k"[..]).is_allowed(),
        "the bench must allow"
    );
}

/// Print the Redis calls per decision `limiter` made since `before`.
fn report(group: &str, name: &str, limiter: &LeasedLimiter, before: (u64, u64), decisions: u64) {
    let stats = limiter.stats();
    let calls = stats.redis_calls() - before.0;
    eprintln!(
        "{group}/{name}: {calls} Redis calls ({} exact) for {decisions} decisions: {:.6} per \
         decision (1/L = {:.6}); {} waits for a fetch",
        stats.exact_calls - before.1,
        calls as f64 / decisions.max(1) as f64,
        1.0 / f64::from(limiter.max_lease()),
        stats.fetch_waits
    );
}

fn leased_l1000(c: &mut Criterion) {
    let Some(server) = redis_server::server("leased bench") else {
        eprintln!("redis-server not found: the leased bench measured nothing");
        return;
    };
    let mut con = connection(&server);
    let keyed = KeyedLimiter::<Vec<u8>>::new(plenty());
    let (plain, _) = leased(&server, "l1000", 1_000, false);
    let (refreshed, _refresher) = leased(&server, "l1000-refresher", 1_000, true);
    let mut group = c.benchmark_group("leased_l1000");
    group.bench_function("turnstile-keyed/precise", |b| {
        b.iter(|| black_box(keyed.try_acquire(black_box(&b"k"[..]))))
    });
    for (name, limiter) in [("no-refresher", &plain), ("refresher", &refreshed)] {
        let stats = limiter.stats();
        let before = (stats.redis_calls(), stats.exact_calls);
        let mut decisions = 0u64;
        group.bench_function(format!("turnstile-leased/{name}"), |b| {
            b.iter_custom(|iters| {
                decisions += iters;
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(limiter.try_acquire(&mut con, black_box(b"k")).ok());
                }
                start.elapsed()
            })
        });
        report("leased_l1000", name, limiter, before, decisions);
    }
    group.finish();
}

/// `THREADS` threads, started before timing, each deciding `iters / THREADS`
/// times per measurement with `decide` on a connection of its own.
const THREADS: u64 = 4;

struct Pool {
    start: Vec<mpsc::Sender<u64>>,
    done: mpsc::Receiver<Duration>,
}

impl Pool {
    fn new(
        server: &redis_server::Server,
        decide: impl Fn(&mut BlockingConnection) + Send + Sync + Clone + 'static,
    ) -> Self {
        let (done_tx, done) = mpsc::channel();
        let barrier = Arc::new(Barrier::new(THREADS as usize));
        let start = (0..THREADS)
            .map(|_| {
                let (tx, rx) = mpsc::channel::<u64>();
                let (decide, done, barrier) = (decide.clone(), done_tx.clone(), barrier.clone());
                let mut con = connection(server);
                thread::spawn(move || {
                    for n in rx {
                        barrier.wait();
                        let start = Instant::now();
                        for _ in 0..n {
                            decide(&mut con);
                        }
                        let _ = done.send(start.elapsed());
                    }
                });
                tx
            })
            .collect();
        Pool { start, done }
    }

    /// The longest thread's time for `iters` decisions in all.
    fn run(&self, iters: u64) -> Duration {
        let each = iters.div_ceil(THREADS);
        for tx in &self.start {
            tx.send(each).expect("a pool thread");
        }
        (0..THREADS)
            .map(|_| self.done.recv().expect("a pool thread"))
            .max()
            .unwrap_or_default()
    }
}

fn leased_l1000_4_threads(c: &mut Criterion) {
    let Some(server) = redis_server::server("leased bench") else {
        eprintln!("redis-server not found: the leased bench measured nothing");
        return;
    };
    let keyed = Arc::new(KeyedLimiter::<Vec<u8>>::new(plenty()));
    let (plain, _) = leased(&server, "l1000x4", 1_000, false);
    let (refreshed, _refresher) = leased(&server, "l1000x4-refresher", 1_000, true);
    let mut group = c.benchmark_group("leased_l1000_4_threads");
    let pool = {
        let keyed = Arc::clone(&keyed);
        Pool::new(&server, move |_| {
            let _ = black_box(keyed.try_acquire(black_box(&b"k"[..])));
        })
    };
    group.bench_function("turnstile-keyed/precise", |b| {
        b.iter_custom(|i| pool.run(i))
    });
    drop(pool);
    for (name, limiter) in [("no-refresher", &plain), ("refresher", &refreshed)] {
        let stats = limiter.stats();
        let before = (stats.redis_calls(), stats.exact_calls);
        let mut decisions = 0u64;
        let pool = {
            let limiter = Arc::clone(limiter);
            Pool::new(&server, move |con| {
                black_box(limiter.try_acquire(con, black_box(b"k")).ok());
            })
        };
        group.bench_function(format!("turnstile-leased/{name}"), |b| {
            b.iter_custom(|iters| {
                decisions += iters.div_ceil(THREADS) * THREADS;
                pool.run(iters)
            })
        });
        drop(pool);
        report("leased_l1000_4_threads", name, limiter, before, decisions);
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = leased_hot_key, leased_l1000, leased_l1000_4_threads
}
criterion_main!(benches);
