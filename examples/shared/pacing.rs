//! Client-side pacing, shared by `examples/pacing.rs` and its test: pushing
//! records to a target that limits its callers, either waiting for a local
//! limiter below the target's rate, or sending at once and retrying rejections.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::time::Duration;

use turnstile::{Gcra, ManualClock, Quota, RateLimiter, WaitOptions};

/// The target: 100 records per second (one token every 10 ms), bursts of 10.
fn target(clock: &ManualClock) -> RateLimiter<turnstile::TokenBucket, ManualClock> {
    let quota = Quota::new(10, 1, Duration::from_millis(10)).expect("a valid quota");
    RateLimiter::with_clock(quota, clock.clone())
}

/// What it took to deliver every record.
#[derive(Debug, PartialEq, Eq)]
pub struct Report {
    pub records: u64,
    pub sends: u64,
    pub rejected: u64,
    pub elapsed: Duration,
}

/// Wait for a local pacer at 95 per second (one every 10.526 ms, no burst)
/// before each send: the target never has to refuse one.
pub fn paced(records: u64) -> Report {
    let clock = ManualClock::new();
    let target = target(&clock);
    let pacer = RateLimiter::from_parts(
        Gcra::new(Quota::new(1, 1, Duration::from_micros(10_527)).expect("a valid quota")),
        clock.clone(),
    );
    let mut report = Report {
        records,
        sends: 0,
        rejected: 0,
        elapsed: Duration::ZERO,
    };
    for _ in 0..records {
        // No deadline: a pacer with capacity 1 always admits within 10.5 ms.
        if pacer.wait(WaitOptions::new()).is_err() {
            break;
        }
        report.sends += 1;
        if target.try_acquire().is_denied() {
            report.rejected += 1;
        }
    }
    report.elapsed = clock.elapsed();
    report
}

/// Send as fast as the client can (one record per millisecond) and put every
/// rejected record back in the queue to send again.
pub fn retrying(records: u64) -> Report {
    let clock = ManualClock::new();
    let target = target(&clock);
    let mut queue: VecDeque<u64> = (0..records).collect();
    let mut report = Report {
        records,
        sends: 0,
        rejected: 0,
        elapsed: Duration::ZERO,
    };
    while let Some(record) = queue.pop_front() {
        report.sends += 1;
        if target.try_acquire().is_denied() {
            report.rejected += 1;
            queue.push_back(record);
        }
        clock.advance(Duration::from_millis(1));
    }
    report.elapsed = clock.elapsed();
    report
}

pub fn describe(what: &str, r: &Report) -> String {
    format!(
        "{what:<28} {} records, {} sends, {} rejected by the target, {:.1} s",
        r.records,
        r.sends,
        r.rejected,
        r.elapsed.as_secs_f64()
    )
}
