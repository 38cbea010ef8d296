//! The rate-limiter pattern's traces, shared by the examples that print them and
//! the tests that assert them byte for byte. Each includer uses some of them.

#![allow(dead_code)]

use std::fmt::Write as _;
use std::time::Duration;

use turnstile::{Decision, ManualClock, Quota, RateLimiter};

/// The rate-limiter pattern's first example: eight requests to a bucket of
/// capacity 3 that gains one token every 1000 ms, on a manual clock.
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

/// The rate-limiter pattern's per-client trace: alice, bob and a request with
/// no key through per-key buckets of capacity 3 that gain one token every
/// 1000 ms. Without a key there is no bucket to ask: 401.
pub fn per_client_trace() -> String {
    use turnstile::{Gate, KeyedLimiter};

    let clock = ManualClock::new();
    let quota = Quota::new(3, 1, Duration::from_millis(1000)).expect("a valid quota");
    let limiter = KeyedLimiter::<String>::builder(quota)
        .clock(clock.clone())
        .build()
        .expect("a valid configuration");
    let gate = Gate::new(limiter);
    let trace: [(u64, Option<&str>); 8] = [
        (0, Some("alice")),
        (100, Some("alice")),
        (200, Some("alice")),
        (250, Some("bob")),
        (300, Some("alice")),
        (350, None),
        (400, Some("bob")),
        (1300, Some("alice")),
    ];
    let mut out = String::from("== per-client token buckets (capacity 3, 1 token per 1000 ms)\n");
    for (at, key) in trace {
        clock.set(Duration::from_millis(at));
        let outcome = gate.check(key);
        let _ = writeln!(out, "t={at:4} {:<6} -> {outcome}", key.unwrap_or("(none)"));
    }
    out
}

/// The rate-limiter pattern's whole extended output: the per-client gate, a blank
/// line, then the fixed window against the token bucket.
pub fn extended_trace() -> String {
    format!("{}\n{}", per_client_trace(), window_vs_bucket_trace())
}

/// The rate-limiter pattern's comparison of a fixed window and a token bucket
/// with the same nominal limit of two per second, on one flow across the 1000 ms
/// boundary.
pub fn window_vs_bucket_trace() -> String {
    use turnstile::FixedWindow;

    let clock = ManualClock::new();
    let fixed_window = RateLimiter::from_parts(
        FixedWindow::new(2, Duration::from_millis(1000)).expect("a valid window"),
        clock.clone(),
    );
    let quota = Quota::new(2, 1, Duration::from_millis(500)).expect("a valid quota");
    let bucket = RateLimiter::with_clock(quota, clock.clone());
    let show = |d: Decision| match d {
        Decision::Allowed { .. } => "allowed".to_string(),
        Decision::Denied { retry_after } => format!("rejected {} ms", retry_after.millis_ceil()),
    };
    let (mut fixed_in_span, mut bucket_in_span) = (0, 0);
    let mut out = String::from("== limit 2 per second: fixed window vs token bucket\n");
    for at in [900, 950, 1000, 1050, 1400] {
        clock.set(Duration::from_millis(at));
        let f = fixed_window.try_acquire();
        let b = bucket.try_acquire();
        if at <= 1050 && f.is_allowed() {
            fixed_in_span += 1;
        }
        if at <= 1050 && b.is_allowed() {
            bucket_in_span += 1;
        }
        let _ = writeln!(
            out,
            "t={at:4}  fixed window: {:<16} token bucket: {}",
            show(f),
            show(b)
        );
    }
    let _ = writeln!(
        out,
        "admitted from 900 to 1050 ms: fixed window {fixed_in_span}, token bucket {bucket_in_span}"
    );
    out
}
