//! Throughput from 1 to N threads, every contender in one run: turnstile,
//! governor (default hasher), governor with `ahash`, and the floor of
//! `shared/floor.rs`.
//!
//! ```text
//! cargo run --profile bench -p turnstile-dev --example scaling -- [THREADS...] [--ms MS] [--reps R] [--case NAME]... [--keys K]
//! ```
//!
//! `THREADS` defaults to `1 2 4 8 16` (counts above the machine's cores are
//! still run, and marked). Each case runs every contender at every thread count
//! for `MS` milliseconds (default 200), `R` times (default 3) with the
//! contenders in a rotated order each time, and prints the median decisions per
//! second, the spread, the speed-up over the contender's own one-thread median,
//! and the smallest and largest share of decisions any one thread made (an
//! even split is 100/threads %).
//!
//! Cases, all on the precise clock (quanta's TSC for every contender):
//! - `keyed-disjoint`: each thread its own `K` keys (a power of two, default
//!   1,024, at most 2^19), every check admitted; `turnstile-mixed` inserts
//!   the threads' keys in turn rather than thread by thread, and
//!   `turnstile-apart` gives each thread a limiter of its own (nothing
//!   shared: the machine's ceiling for the others).
//! - `keyed-1m`: 1,000,000 keys held; each thread walks one fixed shuffled
//!   order from its own offset, every check admitted.
//! - `keyed-hot-allow` / `keyed-hot-deny`: every thread on one key, every check
//!   admitted / denied.
//! - `direct-allow` / `direct-deny`: every thread on one direct limiter
//!   (governor's direct limiter; the floor is keyed only). `turnstile` is
//!   `try_acquire`, which computes a denial's wait; `turnstile-check` is
//!   `check`, which defers it as governor's `check` does.

#[path = "shared/floor.rs"]
mod floor;
#[path = "shared/keys.rs"]
mod keys;
use floor::Floor;

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use governor::clock::DefaultClock;
use governor::state::keyed::DashMapStateStore;

const ALLOW_RATE: u32 = 1_000_000_000;
const MANY: u64 = 1_000_000;
const HOUR_NANOS: u64 = 3_600_000_000_000;

type Ours = turnstile::KeyedLimiter<u64, turnstile::TokenBucket, turnstile::RealClock>;
type Theirs<S = std::hash::RandomState> = governor::RateLimiter<
    u64,
    DashMapStateStore<u64, S>,
    DefaultClock,
    governor::middleware::NoOpMiddleware<<DefaultClock as governor::clock::Clock>::Instant>,
>;

/// One check by thread `t`, its `i`-th.
type Check = Arc<dyn Fn(usize, u64) + Send + Sync>;

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("nonzero")
}

/// A path's quotas: turnstile's, governor's, the floor's (interval, burst).
#[derive(Clone, Copy)]
struct Quotas {
    ours: turnstile::Quota,
    theirs: governor::Quota,
    floor: (u64, u64),
}

fn allow() -> Quotas {
    Quotas {
        ours: turnstile::Quota::per_second(ALLOW_RATE).expect("a valid quota"),
        theirs: governor::Quota::per_second(nz(ALLOW_RATE)),
        floor: (1, ALLOW_RATE as u64),
    }
}

fn deny() -> Quotas {
    Quotas {
        ours: turnstile::Quota::per_hour(1).expect("a valid quota"),
        theirs: governor::Quota::per_hour(nz(1)),
        floor: (HOUR_NANOS, 1),
    }
}

/// 1,000 tokens, one back per hour: every visit of the million-key walk is
/// admitted and no key becomes sweepable while the run lasts.
fn many() -> Quotas {
    Quotas {
        ours: turnstile::Quota::new(1_000, 1, Duration::from_secs(3_600)).expect("a valid quota"),
        theirs: governor::Quota::with_period(Duration::from_secs(3_600))
            .expect("a nonzero period")
            .allow_burst(nz(1_000)),
        floor: (HOUR_NANOS, 1_000),
    }
}

fn ours(q: Quotas) -> Ours {
    turnstile::KeyedLimiter::<u64>::builder(q.ours)
        .clock(turnstile::RealClock::new())
        .max_keys(2 * MANY as usize)
        .build()
        .expect("a valid configuration")
}

fn theirs(q: Quotas) -> Theirs {
    governor::RateLimiter::dashmap_with_clock(q.theirs, DefaultClock::default())
}

fn theirs_ahash(q: Quotas) -> Theirs<ahash::RandomState> {
    governor::RateLimiter::dashmap_with_clock_and_hasher(
        q.theirs,
        DefaultClock::default(),
        ahash::RandomState::new(),
    )
}

fn floor(q: Quotas, keys: impl IntoIterator<Item = u64>) -> Floor<turnstile::RealClock> {
    Floor::new(keys, turnstile::RealClock::new(), q.floor.0, q.floor.1)
}

/// Thread `t`'s `i`-th check's key, one of its own `keys` (a power of two, at
/// most `MANY`).
fn disjoint(t: usize, i: u64, keys: u64) -> u64 {
    t as u64 * MANY + (i & (keys - 1))
}

/// Runs `check` on `threads` threads for `ms` milliseconds; returns each
/// thread's count of checks and the elapsed time.
fn run(threads: usize, ms: u64, check: &Check) -> (Vec<u64>, Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(threads + 1));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (check, stop, start) = (Arc::clone(check), Arc::clone(&stop), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                let mut i = 0_u64;
                // Relaxed: the flag only ends the loop; the count comes back
                // through `join`, which synchronizes.
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..64 {
                        check(t, i);
                        i += 1;
                    }
                }
                i
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    std::thread::sleep(Duration::from_millis(ms));
    // Relaxed: as the load; nothing else is published with the flag.
    stop.store(true, Ordering::Relaxed);
    let counts: Vec<u64> = workers
        .into_iter()
        .map(|w| w.join().expect("a bench thread panicked"))
        .collect();
    (counts, began.elapsed())
}

/// One contender of a case: its name and, per thread count, its check.
struct Contender {
    name: &'static str,
    make: Box<dyn Fn(usize) -> Check>,
}

fn contender(name: &'static str, make: impl Fn(usize) -> Check + 'static) -> Contender {
    Contender {
        name,
        make: Box::new(make),
    }
}

/// Every key of `threads` threads with `keys` keys each.
fn held(threads: usize, keys: u64) -> impl Iterator<Item = u64> {
    (0..threads).flat_map(move |t| (0..keys).map(move |i| disjoint(t, i, keys)))
}

fn keyed_disjoint(keys: u64) -> Vec<Contender> {
    let q = allow();
    // Every contender holds its threads' keys before the run, so the run
    // times decisions on held keys, not inserts.
    vec![
        contender("turnstile", move |threads| {
            let l = ours(q);
            held(threads, keys).for_each(|k| assert!(l.try_acquire(&k).is_allowed()));
            Arc::new(move |t, i| {
                let _ = black_box(l.try_acquire(&disjoint(t, i, keys)));
            })
        }),
        // The same keys inserted in turn, one of each thread's at a time, as
        // a server's threads meet new keys; above, each thread's keys go in
        // one after another. A map that placed words in insertion order would
        // keep each thread's words together above and mix them here.
        contender("turnstile-mixed", move |threads| {
            let l = ours(q);
            (0..keys)
                .flat_map(|i| (0..threads).map(move |t| disjoint(t, i, keys)))
                .for_each(|k| assert!(l.try_acquire(&k).is_allowed()));
            Arc::new(move |t, i| {
                let _ = black_box(l.try_acquire(&disjoint(t, i, keys)));
            })
        }),
        // Nothing shared: each thread its own limiter. What two threads can
        // make of this machine's two cores when no cache line is shared, the
        // ceiling of the shared-limiter figures above.
        contender("turnstile-apart", move |threads| {
            let ls: Vec<Ours> = (0..threads)
                .map(|t| {
                    let l = ours(q);
                    (0..keys)
                        .for_each(|i| assert!(l.try_acquire(&disjoint(t, i, keys)).is_allowed()));
                    l
                })
                .collect();
            Arc::new(move |t, i| {
                let _ = black_box(ls[t].try_acquire(&disjoint(t, i, keys)));
            })
        }),
        contender("governor", move |threads| {
            let g = theirs(q);
            held(threads, keys).for_each(|k| assert!(g.check_key(&k).is_ok()));
            Arc::new(move |t, i| {
                let _ = black_box(g.check_key(&disjoint(t, i, keys)));
            })
        }),
        contender("governor-ahash", move |threads| {
            let g = theirs_ahash(q);
            held(threads, keys).for_each(|k| assert!(g.check_key(&k).is_ok()));
            Arc::new(move |t, i| {
                let _ = black_box(g.check_key(&disjoint(t, i, keys)));
            })
        }),
        contender("floor", move |threads| {
            let f = floor(q, held(threads, keys));
            Arc::new(move |t, i| {
                let _ = black_box(f.check(disjoint(t, i, keys)));
            })
        }),
    ]
}

fn keyed_million() -> Vec<Contender> {
    let q = many();
    let order: Arc<[u64]> = keys::shuffled(MANY).into();
    // Thread `t` starts `t / 16` of the way along the walk.
    let at =
        |order: &[u64], t: usize, i: u64| order[((i + t as u64 * (MANY / 16)) % MANY) as usize];
    let o = Arc::clone(&order);
    let o2 = Arc::clone(&order);
    let o3 = Arc::clone(&order);
    let o4 = order;
    vec![
        contender("turnstile", move |_| {
            let l = ours(q);
            (0..MANY).for_each(|k| assert!(l.try_acquire(&k).is_allowed()));
            let o = Arc::clone(&o);
            Arc::new(move |t, i| {
                let _ = black_box(l.try_acquire(&at(&o, t, i)));
            })
        }),
        contender("governor", move |_| {
            let g = theirs(q);
            (0..MANY).for_each(|k| assert!(g.check_key(&k).is_ok()));
            let o = Arc::clone(&o2);
            Arc::new(move |t, i| {
                let _ = black_box(g.check_key(&at(&o, t, i)));
            })
        }),
        contender("governor-ahash", move |_| {
            let g = theirs_ahash(q);
            (0..MANY).for_each(|k| assert!(g.check_key(&k).is_ok()));
            let o = Arc::clone(&o3);
            Arc::new(move |t, i| {
                let _ = black_box(g.check_key(&at(&o, t, i)));
            })
        }),
        contender("floor", move |_| {
            let f = floor(q, 0..MANY);
            let o = Arc::clone(&o4);
            Arc::new(move |t, i| {
                let _ = black_box(f.check(at(&o, t, i)));
            })
        }),
    ]
}

fn keyed_hot(q: Quotas) -> Vec<Contender> {
    vec![
        contender("turnstile", move |_| {
            let l = ours(q);
            let _ = l.try_acquire(&42);
            Arc::new(move |_, _| {
                let _ = black_box(l.try_acquire(&42));
            })
        }),
        contender("governor", move |_| {
            let g = theirs(q);
            let _ = g.check_key(&42);
            Arc::new(move |_, _| {
                let _ = black_box(g.check_key(&42));
            })
        }),
        contender("governor-ahash", move |_| {
            let g = theirs_ahash(q);
            let _ = g.check_key(&42);
            Arc::new(move |_, _| {
                let _ = black_box(g.check_key(&42));
            })
        }),
        contender("floor", move |_| {
            let f = floor(q, [42]);
            let _ = f.check(42);
            Arc::new(move |_, _| {
                let _ = black_box(f.check(42));
            })
        }),
    ]
}

fn direct(q: Quotas) -> Vec<Contender> {
    vec![
        contender("turnstile", move |_| {
            let l = turnstile::RateLimiter::new(q.ours);
            let _ = l.try_acquire();
            Arc::new(move |_, _| {
                let _ = black_box(l.try_acquire());
            })
        }),
        // `check` defers a denial's wait, as governor's `check` does.
        contender("turnstile-check", move |_| {
            let l = turnstile::RateLimiter::new(q.ours);
            let _ = l.check();
            Arc::new(move |_, _| {
                let _ = black_box(l.check());
            })
        }),
        contender("governor", move |_| {
            let g = governor::RateLimiter::direct(q.theirs);
            let _ = g.check();
            Arc::new(move |_, _| {
                let _ = black_box(g.check());
            })
        }),
    ]
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn usage() -> ExitCode {
    eprintln!("usage: scaling [THREADS...] [--ms MS] [--reps R] [--case NAME]... [--keys K]");
    ExitCode::from(2)
}

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut threads = Vec::new();
    let (mut ms, mut reps) = (200_u64, 3_usize);
    let mut only = Vec::new();
    let mut keys = 1_024_u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--ms" => match args.next().and_then(|v| v.parse().ok()) {
                Some(v) if v > 0 => ms = v,
                _ => return usage(),
            },
            "--reps" => match args.next().and_then(|v| v.parse().ok()) {
                Some(v) if v > 0 => reps = v,
                _ => return usage(),
            },
            "--keys" => match args.next().and_then(|v| v.parse().ok()) {
                Some(v) if v <= MANY && u64::is_power_of_two(v) => keys = v,
                _ => return usage(),
            },
            "--case" => match args.next() {
                Some(v) => only.push(v),
                None => return usage(),
            },
            _ => match a.parse::<usize>() {
                Ok(n) if n > 0 => threads.push(n),
                _ => return usage(),
            },
        }
    }
    if threads.is_empty() {
        threads = vec![1, 2, 4, 8, 16];
    }
    if !threads.contains(&1) {
        threads.insert(0, 1);
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    println!(
        "{cores} cores available; {ms} ms per run, {reps} runs per point, contenders rotated each run"
    );

    let cases: Vec<(&str, Vec<Contender>)> = vec![
        ("keyed-disjoint", keyed_disjoint(keys)),
        ("keyed-1m", keyed_million()),
        ("keyed-hot-allow", keyed_hot(allow())),
        ("keyed-hot-deny", keyed_hot(deny())),
        ("direct-allow", direct(allow())),
        ("direct-deny", direct(deny())),
    ];
    for (case, contenders) in &cases {
        if !only.is_empty() && !only.iter().any(|o| o == case) {
            continue;
        }
        println!();
        println!("## {case}");
        println!();
        println!(
            "| threads | contender | M decisions/s, median | spread | vs own 1 thread | thread shares, min–max % |"
        );
        println!("|---|---|---|---|---|---|");
        let mut one_thread = vec![0.0_f64; contenders.len()];
        for &n in &threads {
            let mut rates = vec![Vec::new(); contenders.len()];
            let mut shares = vec![(f64::MAX, 0.0_f64); contenders.len()];
            for rep in 0..reps {
                for k in 0..contenders.len() {
                    let c = (k + rep) % contenders.len();
                    let check = (contenders[c].make)(n);
                    let (counts, elapsed) = run(n, ms, &check);
                    drop(check);
                    let all: u64 = counts.iter().sum();
                    rates[c].push(all as f64 / elapsed.as_secs_f64() / 1e6);
                    for &x in &counts {
                        let s = 100.0 * x as f64 / all.max(1) as f64;
                        shares[c].0 = shares[c].0.min(s);
                        shares[c].1 = shares[c].1.max(s);
                    }
                }
            }
            for (c, contender) in contenders.iter().enumerate() {
                let (lo, hi) = rates[c]
                    .iter()
                    .fold((f64::MAX, 0.0_f64), |(l, h), &r| (l.min(r), h.max(r)));
                let m = median(&mut rates[c]);
                if n == 1 {
                    one_thread[c] = m;
                }
                let over = if n > cores { " (over cores)" } else { "" };
                println!(
                    "| {n}{over} | {} | {m:.1} | {lo:.1}–{hi:.1} | {:.2}× | {:.1}–{:.1} |",
                    contender.name,
                    m / one_thread[c],
                    shares[c].0,
                    shares[c].1,
                );
            }
        }
    }
    ExitCode::SUCCESS
}
