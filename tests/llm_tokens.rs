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
        r#"uses 2000: 200 OK, RateLimit: "tokens";r=0 (1500 more charged, 1420 of them lent from the next refills)"#,
        r#"used 11420 = 10000 the bucket held + 1420 lent + 0 forgiven"#,
        r#"a call: 429 Too Many Requests, Retry-After: 12, RateLimit: "tokens";r=0;t=12 (refused before the model ran)"#,
        r#"after 12 s:"#,
        r#"uses 200: 200 OK, RateLimit: "tokens";r=380 (300 given back)"#,
    ];
    assert_eq!(llm_tokens::story().await, expected);
}

/// After every call: the tokens charged (used, less those forgiven) never
/// exceed what the bucket held plus one minute's budget lent ahead; once
/// every debt is waited out, they are exactly what the bucket held; and no
/// call is forgiven more than it used beyond its up-front charge.
#[tokio::test]
async fn tokens_used_are_what_the_bucket_held_plus_what_was_forgiven() {
    let clock = ManualClock::new();
    let gateway = Gateway::new(clock.clone());
    // 10,000 a minute: one token every 6 ms.
    let refill = |elapsed: Duration| u64::try_from(elapsed.as_millis() / 6).unwrap();
    let mut elapsed = Duration::ZERO;
    let mut used = 0u64;
    let mut forgivable = 0u64;
    let mut statuses = Vec::new();
    for (wait_ms, tokens) in [
        (0, 120),
        (0, 300),
        (0, 4_000),
        (0, 5_000),
        (0, 2_000),
        (0, 100),
        (3_000, 200),
        (12_000, 900),
        (6_000, 900),
        (60_000, 30_000),
        (0, 100),
    ] {
        clock.advance(Duration::from_millis(wait_ms));
        elapsed += Duration::from_millis(wait_ms);
        let reply = gateway.complete("k_1", tokens).await;
        statuses.push(reply.status.as_u16());
        if reply.status == StatusCode::OK {
            used += u64::from(tokens);
            forgivable += u64::from(tokens.saturating_sub(UP_FRONT));
        }
        let stats = gateway.stats();
        let held = u64::from(BUDGET) + refill(elapsed);
        assert!(
            used - stats.forgiven <= held + u64::from(BUDGET),
            "after a call using {tokens}: {used} used, {} forgiven",
            stats.forgiven
        );
        assert!(stats.forgiven <= forgivable);
    }
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 200, 429, 429, 200, 200, 200, 429]
    );
    // The last big call: 9,500 held, 10,000 lent (a minute ahead, no more),
    // 10,000 forgiven.
    let stats = gateway.stats();
    assert_eq!(stats.forgiven, 10_000, "{stats:?}");
    // The debt is never more than a minute's budget: two minutes later the
    // key's budget is whole again.
    clock.advance(Duration::from_secs(120));
    assert_eq!(gateway.remaining("k_1"), BUDGET);
    // Another key has a budget of its own.
    let other = gateway.complete("k_2", 120).await;
    assert_eq!(other.ratelimit, r#""tokens";r=9880"#);
}
