//! The tour: the rate-limiter pattern's trace on a manual clock, then one limiter
//! hammered from every core on the real clock, checked against the token bucket's
//! bound.
//!
//! ```text
//! cargo run --release --example demo
//! ```

#[path = "shared/pattern.rs"]
mod pattern;

use std::process::ExitCode;
use std::sync::Barrier;
use std::thread;
use std::time::Duration;

use turnstile::{Clock, Quota, RateLimiter, RealClock};

const RUN_FOR: Duration = Duration::from_secs(2);

fn main() -> ExitCode {
    println!(
        "== the rate-limiter pattern's token bucket (capacity 3, 1 token per 1000 ms), manual clock"
    );
    print!("{}", pattern::token_bucket_trace());
    println!();
    print!("{}", pattern::per_client_trace());
    println!();
    match hammer() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("demo: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Every core takes from one bucket for `RUN_FOR`; returns whether the admitted
/// count kept within `capacity + refill(elapsed)`.
fn hammer() -> Result<bool, Box<dyn std::error::Error>> {
    let threads = thread::available_parallelism().map_or(2, |n| n.get());
    let quota = Quota::per_second(100_000)?.burst(1_000)?;
    let clock = RealClock::new();
    let limiter = RateLimiter::with_clock(quota, clock.clone());
    println!(
        "== one limiter, {threads} threads for {RUN_FOR:?}, real clock \
         (capacity {}, {} token every {:?})",
        quota.capacity(),
        quota.amount(),
        quota.period()
    );

    let start_line = Barrier::new(threads + 1);
    let (start, end, counts) = thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let (limiter, start_line, clock) = (&limiter, &start_line, &clock);
                s.spawn(move || {
                    start_line.wait();
                    let deadline = clock.now() + RUN_FOR.as_nanos() as u64;
                    let (mut admitted, mut decisions) = (0u64, 0u64);
                    loop {
                        for _ in 0..1024 {
                            admitted += u64::from(limiter.try_acquire().is_allowed());
                        }
                        decisions += 1024;
                        if clock.now() >= deadline {
                            return (admitted, decisions);
                        }
                    }
                })
            })
            .collect();
        // Read the clock before any worker can decide and after all have finished:
        // every decision's reading lies between the two.
        let start = clock.now();
        start_line.wait();
        let counts: Vec<(u64, u64)> = workers
            .into_iter()
            .map(|w| w.join().expect("a worker panicked"))
            .collect();
        (start, clock.now(), counts)
    });

    let admitted: u64 = counts.iter().map(|c| c.0).sum();
    let decisions: u64 = counts.iter().map(|c| c.1).sum();
    let secs = (end - start) as f64 / 1e9;
    // The bucket keeps time in whole microseconds; refills land on that grid.
    let elapsed_micros = end / 1_000 - start / 1_000;
    let period_micros = quota.period().as_micros() as u64;
    let amount = u64::from(quota.amount());
    let refill = amount * (elapsed_micros / period_micros) + (amount - 1);
    let bound = u64::from(quota.capacity()) + refill;
    println!(
        "decisions: {decisions} in {secs:.2} s = {:.1} M/s ({:.1} ns each per thread)",
        decisions as f64 / secs / 1e6,
        secs * 1e9 * threads as f64 / decisions as f64
    );
    println!("admitted:  {admitted}, denied: {}", decisions - admitted);
    let ok = admitted <= bound;
    println!(
        "bound:     capacity + refill(elapsed) = {} + {refill} = {bound}; admitted {} the bound ({:.3}% of it)",
        quota.capacity(),
        if ok { "within" } else { "EXCEEDS" },
        admitted as f64 * 100.0 / bound as f64
    );
    Ok(ok)
}
