//! The framework-agnostic gate: statuses, Retry-After rounded up, RateLimit
//! header fields, and typed errors.

use std::time::Duration;

use turnstile::{
    AcquireError, Gate, KeyedLimiter, ManualClock, Outcome, PolicyError, Quota, RateLimitPolicy,
    RetryAfter,
};

fn gate(
    capacity: u32,
    period: Duration,
    max_keys: usize,
) -> (
    Gate<KeyedLimiter<String, turnstile::TokenBucket, ManualClock>>,
    ManualClock,
) {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<String>::builder(Quota::new(capacity, 1, period).unwrap())
        .clock(clock.clone())
        .max_keys(max_keys)
        .build()
        .unwrap();
    (Gate::new(limiter), clock)
}

#[test]
fn statuses_and_retry_after_rounded_up() {
    let (gate, clock) = gate(1, Duration::from_millis(1_500), 1);
    assert_eq!(gate.check(Some("a")), Outcome::Admitted { remaining: 0 });
    assert!(gate.headers(&Outcome::Admitted { remaining: 0 }).is_empty());
    clock.advance(Duration::from_millis(400));
    let denied = gate.check(Some("a"));
    assert_eq!(denied.status(), 429);
    // 1.1 s to wait: the header says 2, never 1.
    assert_eq!(
        denied.retry_after().unwrap().duration(),
        Duration::from_millis(1_100)
    );
    assert_eq!(denied.retry_after_secs(), Some(2));
    assert_eq!(
        gate.headers(&denied),
        vec![("Retry-After", "2".to_string())]
    );
    assert_eq!(denied.to_string(), "429 Too Many Requests, Retry-After: 2");
    // No key: 401 with its challenge (RFC 9110), and nothing stored.
    let none = gate.check(None::<&str>);
    assert_eq!(
        (none.status(), none.to_string()),
        (401, "401 Unauthorized".to_string())
    );
    assert_eq!(
        gate.headers(&none),
        [("WWW-Authenticate", "ApiKey".to_string())]
    );
    // The key bound: a new key gets 503 with Retry-After, not 429.
    let full = gate.check(Some("b"));
    assert_eq!(full.status(), 503);
    assert_eq!(
        full.retry_after_secs(),
        Some(2),
        "the fill time, 1.5 s, rounded up"
    );
    assert_eq!(full.to_string(), "503 Service Unavailable, Retry-After: 2");
    assert_eq!(gate.limiter().len(), 1);
}

#[test]
fn ratelimit_fields_are_off_by_default_and_exact_when_on() {
    let policy = RateLimitPolicy::new("per-key", 3, Duration::from_secs(3)).unwrap();
    let (gate, clock) = gate(3, Duration::from_secs(1), 10);
    let gate = gate.with_policy(policy.clone());
    let ok = gate.check(Some("k"));
    assert_eq!(
        gate.headers(&ok),
        vec![
            ("RateLimit-Policy", "\"per-key\";q=3;w=3".to_string()),
            ("RateLimit", "\"per-key\";r=2".to_string()),
        ]
    );
    assert!(gate.check_n(Some("k"), 2).unwrap().is_admitted());
    clock.advance(Duration::from_millis(200));
    let denied = gate.check(Some("k"));
    assert_eq!(
        gate.headers(&denied),
        vec![
            ("Retry-After", "1".to_string()),
            ("RateLimit-Policy", "\"per-key\";q=3;w=3".to_string()),
            ("RateLimit", "\"per-key\";r=0;t=1".to_string()),
        ]
    );
    // A 401 carries its challenge and no policy fields.
    assert_eq!(
        gate.headers(&Outcome::Unauthorized),
        [("WWW-Authenticate", "ApiKey".to_string())]
    );
    // Windows round up to whole seconds.
    let policy = RateLimitPolicy::new("p", 1, Duration::from_millis(1_001)).unwrap();
    assert_eq!(policy.policy_value(), "\"p\";q=1;w=2");
}

#[test]
fn bad_policies_and_requests_are_typed_errors() {
    for name in ["", "has space", "quote\"", "new\nline", &"x".repeat(65)] {
        assert!(
            matches!(
                RateLimitPolicy::new(name, 1, Duration::from_secs(1)),
                Err(PolicyError::Name(_))
            ),
            "{name:?}"
        );
    }
    assert_eq!(
        RateLimitPolicy::new("ok", 1, Duration::from_millis(999)),
        Err(PolicyError::Window(Duration::from_millis(999)))
    );
    // The longest window a structured field can carry: 15 digits. One
    // second more (up to `Duration::MAX`) is refused: written, `w` was not
    // a valid integer and a strict parser refused the whole field.
    let longest = Duration::from_secs(RateLimitPolicy::MAX_WINDOW_SECS);
    let policy = RateLimitPolicy::new("long", 1, longest).unwrap();
    assert_eq!(policy.policy_value(), "\"long\";q=1;w=999999999999999");
    for window in [
        longest + Duration::from_nanos(1),
        Duration::MAX,
        Duration::new(u64::MAX, 1),
    ] {
        assert_eq!(
            RateLimitPolicy::new("long", 1, window),
            Err(PolicyError::Window(window))
        );
    }
    let (gate, _) = gate(3, Duration::from_secs(1), 10);
    assert_eq!(gate.check_n(Some("k"), 0), Err(AcquireError::ZeroPermits));
    assert!(gate.check_n(Some("k"), 4).is_err());
    assert_eq!(gate.check_n(None::<&str>, 0), Ok(Outcome::Unauthorized));
    assert_eq!(gate.limiter().len(), 0);
}

#[test]
fn outcomes_map_from_decisions() {
    use turnstile::KeyedDecision;
    let wait = RetryAfter::from_nanos(1);
    assert_eq!(Outcome::from_decision(None).status(), 401);
    assert_eq!(
        Outcome::from_decision(Some(KeyedDecision::Allowed { remaining: 1 })).status(),
        200
    );
    assert_eq!(
        Outcome::from_decision(Some(KeyedDecision::Denied { retry_after: wait })).status(),
        429
    );
    assert_eq!(
        Outcome::from_decision(Some(KeyedDecision::KeyLimit { retry_after: wait })).status(),
        503
    );
    assert_eq!(
        Outcome::from_decision(Some(KeyedDecision::Denied { retry_after: wait }))
            .retry_after_secs(),
        Some(1)
    );
}

/// The 429 count is published as a counter, so it must never go down. It was
/// the limiter's denials less the shadowed ones, read one after the other: with
/// shadowed denials counted between the two reads, it fell (from 1,000 to as
/// low as 0 in runs of this test).
#[test]
fn the_429_count_never_goes_down_while_shadowed_denials_are_counted() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let gate = Arc::new(Gate::new(KeyedLimiter::<String>::new(
        Quota::per_hour(1).expect("a valid quota"),
    )));
    let _ = gate.check(Some("a"));
    for _ in 0..1_000 {
        assert_eq!(gate.check(Some("a")).status(), 429);
    }
    gate.set_shadow(true);
    let stop = Arc::new(AtomicBool::new(false));
    let hammer = {
        let (gate, stop) = (Arc::clone(&gate), Arc::clone(&stop));
        std::thread::spawn(move || {
            // Relaxed: only ends the loop.
            while !stop.load(Ordering::Relaxed) {
                let _ = gate.check(Some("a"));
            }
        })
    };
    let start = std::time::Instant::now();
    let mut lowest = u64::MAX;
    while start.elapsed() < Duration::from_millis(500) {
        lowest = lowest.min(gate.stats().too_many_requests);
    }
    stop.store(true, Ordering::Relaxed);
    hammer.join().expect("the hammering thread");
    assert_eq!(lowest, 1_000, "the 429 count went down");
    let stats = gate.stats();
    assert_eq!(stats.too_many_requests, 1_000);
    assert!(stats.shadowed_too_many_requests > 0);
}

/// The gate counts what it answered, and only that: decisions made on its
/// limiter directly are not 200s (nor 429s) of the gate's.
#[test]
fn the_counts_are_the_gates_answers_not_the_limiters_decisions() {
    let (gate, _clock) = gate(5, Duration::from_secs(1), 10);
    assert_eq!(gate.check(Some("a")).status(), 200);
    assert!(gate.limiter().try_acquire("b").is_allowed());
    assert!(gate.limiter().try_acquire_n("b", 5).unwrap().is_denied());
    let stats = gate.stats();
    assert_eq!((stats.admitted, stats.too_many_requests), (1, 0));
    assert_eq!(gate.limiter().stats().admitted, 2);
    assert_eq!(stats.keys, 2);
}

/// A direct limiter behind the gate is one limit for every key: what one key
/// spends, another cannot; a request without a key is still a 401 and spends
/// nothing.
#[test]
fn a_direct_limiter_behind_the_gate_limits_all_keys_together() {
    let clock = ManualClock::new();
    let gate = Gate::new(turnstile::RateLimiter::with_clock(
        Quota::new(2, 1, Duration::from_secs(10)).unwrap(),
        clock.clone(),
    ))
    .with_derived_policy("all")
    .unwrap();
    assert_eq!(gate.check(None::<&str>), Outcome::Unauthorized);
    assert_eq!(gate.check(Some("alice")).status(), 200);
    assert_eq!(gate.check(Some("bob")).status(), 200);
    let denied = gate.check(Some("carol"));
    assert_eq!(denied.status(), 429);
    assert_eq!(gate.headers(&denied)[0], ("Retry-After", "10".to_string()));
    assert_eq!(
        gate.check_n(Some("dave"), 3),
        Err(AcquireError::InsufficientCapacity {
            requested: 3,
            capacity: 2
        })
    );
    clock.advance(Duration::from_secs(10));
    assert_eq!(gate.check(Some("erin")).status(), 200);
    let stats = gate.stats();
    assert_eq!(
        (
            stats.admitted,
            stats.too_many_requests,
            stats.unauthorized,
            stats.keys
        ),
        (3, 1, 1, 0)
    );
}
