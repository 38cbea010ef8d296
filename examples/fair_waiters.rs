//! 10,000 asynchronous waiters on a 1,000/s limit, on tokio's multi-thread
//! runtime, through a fair queue: are they admitted in arrival order, is any
//! lost or admitted twice, and how far does each admission fall from the
//! ideal schedule (one every millisecond)?
//!
//! ```text
//! cargo run --release -p turnstile-dev --example fair_waiters [WAITERS] [RATE] [BURST]
//! ```
//!
//! Each waiter learns the exact instant of its own admission: the limiter's
//! clock records, per thread, the last reading it gave, and the admitting
//! decision's reading is the last one taken in the poll that returns from the
//! acquire. Only the queue's head decides, one head after another, so these
//! instants increase in admission order.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use turnstile::{Clock, Fair, Quota, RateLimiter, RealClock};

thread_local! {
    static LAST: Cell<u64> = const { Cell::new(0) };
}

/// The real clock, remembering per thread the last reading it gave.
#[derive(Debug)]
struct Recording(RealClock);

impl Clock for Recording {
    fn now(&self) -> u64 {
        let now = self.0.now();
        LAST.with(|last| last.set(now));
        now
    }
}

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    let at = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[at]
}

fn ms(nanos: i64) -> String {
    format!("{:.3} ms", nanos as f64 / 1e6)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let waiters = (arg(1, 10_000) as usize).max(2);
    let rate = u32::try_from(arg(2, 1_000))?;
    let burst = u32::try_from(arg(3, 1))?;
    let quota = Quota::per_second(rate)?.burst(burst)?;
    let limiter = RateLimiter::from_parts(
        turnstile::TokenBucket::new(quota),
        Recording(RealClock::new()),
    )
    .counted();
    // Spend the burst, so that every waiter waits its turn.
    while limiter.try_acquire().is_allowed() {}
    let spent = limiter.stats().admitted;
    let fair = Arc::new(Fair::new(limiter, waiters)?);

    let admitted_at: Arc<Vec<AtomicU64>> =
        Arc::new((0..waiters).map(|_| AtomicU64::new(0)).collect());
    let done = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let mut handles = Vec::with_capacity(waiters);
    for i in 0..waiters {
        let (fair2, at, done2, errors) = (
            Arc::clone(&fair),
            Arc::clone(&admitted_at),
            Arc::clone(&done),
            Arc::clone(&errors),
        );
        handles.push(tokio::spawn(async move {
            match fair2.acquire(None).await {
                Ok(_) => {
                    let now = LAST.with(Cell::get);
                    // Relaxed: read after the tasks are joined.
                    if at[i].swap(now, Ordering::Relaxed) != 0 {
                        errors.lock().unwrap().push(format!("{i} admitted twice"));
                    }
                }
                Err(e) => errors.lock().unwrap().push(format!("{i}: {e}")),
            }
            // Release, paired with the registration loop's Acquire: a waiter
            // seen done is seen out of the queue.
            done2.fetch_add(1, Ordering::Release);
        }));
        // Arrival order is spawn order: the next waiter is spawned only once
        // this one has joined the queue (finished plus queued reaches i + 1).
        // The finished are read first: a waiter that finishes in between is
        // then counted at most once (as queued, or not at all), never twice.
        while done.load(Ordering::Acquire) + fair.waiting() < i + 1 {
            tokio::task::yield_now().await;
        }
    }
    for h in handles {
        h.await?;
    }

    let errors = errors.lock().unwrap();
    let at: Vec<u64> = admitted_at
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .collect();
    let lost = at.iter().filter(|&&t| t == 0).count();
    let mut by_time: Vec<(u64, usize)> = at.iter().copied().zip(0..).collect();
    by_time.sort_unstable();
    let inversions = by_time.windows(2).filter(|w| w[1].1 < w[0].1).count();
    let ties = by_time.windows(2).filter(|w| w[1].0 == w[0].0).count();
    let stats = fair.inner().stats();

    // The ideal schedule: waiter i admitted i periods after waiter 0.
    let period = 1e9 / f64::from(rate);
    let t0 = at[0];
    let mut lag: Vec<i64> = at
        .iter()
        .enumerate()
        .map(|(i, &t)| (t as f64 - t0 as f64 - i as f64 * period).round() as i64)
        .collect();
    let last_lag = lag[waiters - 1];
    lag.sort_unstable();
    let mut gaps: Vec<i64> = at.windows(2).map(|w| w[1] as i64 - w[0] as i64).collect();
    gaps.sort_unstable();

    println!("{waiters} waiters, {rate}/s, burst {burst}, tokio multi-thread runtime");
    println!(
        "admitted {} (limiter counted {} beyond the {spent} spent first), lost {lost}, errors {}",
        at.len() - lost,
        stats.admitted - spent,
        errors.len()
    );
    for e in errors.iter().take(5) {
        println!("  {e}");
    }
    println!("order: {inversions} inversions, {ties} equal instants");
    println!(
        "span: {:.3} s (ideal {:.3} s)",
        (at[waiters - 1] - t0) as f64 / 1e9,
        (waiters - 1) as f64 * period / 1e9
    );
    println!(
        "lag behind the ideal schedule: min {}, median {}, p99 {}, max {}, last {}",
        ms(lag[0]),
        ms(percentile(&lag, 0.5)),
        ms(percentile(&lag, 0.99)),
        ms(lag[waiters - 1]),
        ms(last_lag)
    );
    println!(
        "gap between admissions: min {}, median {}, p99 {}, max {}",
        ms(gaps[0]),
        ms(percentile(&gaps, 0.5)),
        ms(percentile(&gaps, 0.99)),
        ms(gaps[gaps.len() - 1])
    );
    if lost > 0 || inversions > 0 || !errors.is_empty() || stats.admitted - spent != waiters as u64
    {
        return Err("fairness violated".into());
    }
    Ok(())
}
