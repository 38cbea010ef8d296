//! The direct limiters timed against governor's: `paired` (alternating
//! blocks, precise and coarse clocks) and `neighbours` (two threads on two
//! adjacent limiters, then on one).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use crate::ALLOW_RATE;

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
pub(crate) fn run_neighbours() {
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

pub(crate) fn run_paired() {
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
