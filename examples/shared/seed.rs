//! The seed's traces, shared by the examples that print them and the tests that
//! assert them byte for byte.

use std::fmt::Write as _;
use std::time::Duration;

use turnstile::{Decision, ManualClock, Quota, RateLimiter};

/// The seed's first example: eight requests to a bucket of capacity 3 that gains
/// one token every 1000 ms, on a manual clock.
pub fn token_bucket_trace() -> String {
    let clock = ManualClock::new();
    let quota = Quota::new(3, 1, Duration::from_millis(1000)).expect("a valid quota");
    let bucket = RateLimiter::with_clock(quota, clock.clone());
    let mut out = String::new();
    for t in [0, 100, 200, 300, 500, 1300, 1400, 3500] {
        clock.set(Duration::from_millis(t));
        // Writing to a String cannot fail.
        let _ = match bucket.try_acquire() {
            Decision::Allowed { remaining } => {
                writeln!(out, "t={t:4} ms allowed  tokens left {remaining}")
            }
            Decision::Denied { retry_after } => writeln!(
                out,
                "t={t:4} ms rejected Retry-After: {} (next token in {} ms)",
                retry_after.header_secs(),
                retry_after.millis_ceil()
            ),
        };
    }
    out
}
