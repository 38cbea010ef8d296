//! The model-token budget example: calls priced by their responses, the
//! exact story, and the bound: the tokens used are the tokens the bucket
//! held plus the tokens forgiven, never more.

#[path = "../examples/shared/llm_tokens.rs"]
mod llm_tokens;

use std::time::Duration;

use axum::http::StatusCode;
use llm_tokens::{BUDGET, Gateway, UP_FRONT};
use turnstile::ManualClock;

#[tokio::test]
async fn the_story_prints_exactly_this() {
    let expected = [
        r#"policy: "tokens";q=10000;w=60, 500 charged up front"#,
        r#"uses 120: 200 OK, RateLimit: "tokens";r=9880 (380 given back)"#,
        r#"uses 300: 200 OK, RateLimit: "tokens";r=9580 (200 given back)"#,
        r#"uses 4000: 200 OK, RateLimit: "tokens";r=5580 (3500 more charged)"#,
        r#"uses 5000: 200 OK, RateLimit: "tokens";r=580 (4500 more charged)"#,
        r#"uses 2000: 200 OK, RateLimit: "tokens";r=0 (80 more charged, 1420 forgiven)"#,
        r#"used 11420 = 10000 the bucket held + 1420 forgiven"#,
        r#"a call: 429 Too Many Requests, Retry-After: 3, RateLimit: "tokens";r=0;t=3 (refused before the model ran)"#,
        r#"after 3 s:"#,
        r#"uses 200: 200 OK, RateLimit: "tokens";r=300 (300 given back)"#,
    ];
    assert_eq!(llm_tokens::story().await, expected);
}

/// After every call: the tokens the model used are the tokens the bucket
/// held (its budget, plus what refilled, less what it holds now) plus the
/// tokens forgiven; and no call is forgiven more than it used beyond its
/// up-front charge.
#[tokio::test]
async fn tokens_used_are_what_the_bucket_held_plus_what_was_forgiven() {
    let clock = ManualClock::new();
    let gateway = Gateway::new(clock.clone());
    // 10,000 a minute: one token every 6 ms.
    let refill = |elapsed: Duration| u64::try_from(elapsed.as_millis() / 6).unwrap();
    let mut elapsed = Duration::ZERO;
    let mut used = 0u64;
    let mut forgivable = 0u64;
    for (wait_ms, tokens, status) in [
        (0, 120, StatusCode::OK),
        (0, 300, StatusCode::OK),
        (0, 4_000, StatusCode::OK),
        (0, 5_000, StatusCode::OK),
        (0, 2_000, StatusCode::OK),
        (0, 100, StatusCode::TOO_MANY_REQUESTS),
        (3_000, 200, StatusCode::OK),
        // 300 held: the up-front charge is refused.
        (0, 900, StatusCode::TOO_MANY_REQUESTS),
        // 1,300 held: 500 up front, then 400 more.
        (6_000, 900, StatusCode::OK),
        // 400 held, and 100 more: 500 up front, and 4,500 forgiven.
        (600, 5_000, StatusCode::OK),
    ] {
        clock.advance(Duration::from_millis(wait_ms));
        elapsed += Duration::from_millis(wait_ms);
        let reply = gateway.complete("k_1", tokens).await;
        assert_eq!(reply.status, status, "a call using {tokens}");
        if status == StatusCode::OK {
            used += u64::from(tokens);
            forgivable += u64::from(tokens.saturating_sub(UP_FRONT));
        }
        let held = u64::from(BUDGET) + refill(elapsed) - u64::from(gateway.remaining("k_1"));
        let stats = gateway.stats();
        assert_eq!(used, held + stats.forgiven, "after a call using {tokens}");
        assert!(stats.forgiven <= forgivable);
    }
    let stats = gateway.stats();
    assert_eq!(stats.forgiven, 1_420 + 4_500);
    assert_eq!((stats.admitted, stats.too_many_requests), (8, 2));
    // Another key has a budget of its own.
    let other = gateway.complete("k_2", 120).await;
    assert_eq!(other.ratelimit, r#""tokens";r=9880"#);
}
