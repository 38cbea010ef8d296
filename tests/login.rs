//! The login example: an axum route behind a `Limits` layer that refunds
//! successes, so that only failures count, and the sixth failure within 15
//! minutes locks the user out, whatever the password.

#[path = "../examples/shared/login.rs"]
mod login;

use std::time::Duration;

use axum::http::StatusCode;
use login::Logins;
use turnstile::ManualClock;

#[tokio::test]
async fn the_story_prints_exactly_this() {
    let expected = [
        r#"alice (10th login): 200 OK, RateLimit: "login";r=5"#,
        r#"alice: 5 failures left"#,
        r#"bob (guess): 401 Unauthorized, RateLimit: "login";r=4"#,
        r#"bob (guess): 401 Unauthorized, RateLimit: "login";r=3"#,
        r#"bob (guess): 401 Unauthorized, RateLimit: "login";r=2"#,
        r#"bob (guess): 401 Unauthorized, RateLimit: "login";r=1"#,
        r#"bob (guess): 401 Unauthorized, RateLimit: "login";r=0"#,
        r#"bob (guess): 429 Too Many Requests, Retry-After: 900, RateLimit: "login";r=0;t=900"#,
        r#"bob (right password): 429 Too Many Requests, Retry-After: 900, RateLimit: "login";r=0;t=900"#,
        r#"carol: 401 Unauthorized, RateLimit: "login";r=4"#,
        r#"carol: 401 Unauthorized, RateLimit: "login";r=3"#,
        r#"carol: 200 OK, RateLimit: "login";r=3"#,
        r#"carol: 3 failures left"#,
        r#"after 15 minutes:"#,
        r#"bob (right password): 200 OK, RateLimit: "login";r=5"#,
        r#"bob: 5 failures left"#,
    ];
    assert_eq!(login::story().await, expected);
}

#[tokio::test]
async fn a_lockout_counts_down_and_successes_never_use_up_the_allowance() {
    let clock = ManualClock::new();
    let logins = Logins::new(clock.clone());
    for left in (0..login::FAILURES).rev() {
        let reply = logins.login("dave", "nope").await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
        assert_eq!(logins.failures_left("dave"), left);
    }
    // A minute later, 14 minutes are left of the lockout, and the response
    // says so in both fields.
    clock.advance(Duration::from_secs(60));
    let locked = logins.login("dave", "nope").await;
    assert_eq!(locked.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(locked.retry_after, Some(14 * 60));
    assert_eq!(locked.ratelimit, r#""login";r=0;t=840"#);
    // Locked out, the right password is refused too, until the end.
    clock.advance(Duration::from_secs(13 * 60));
    let locked = logins.login("dave", "hunter2").await;
    assert_eq!(locked.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(locked.retry_after, Some(60));
    clock.advance(Duration::from_secs(60));
    assert_eq!(logins.failures_left("dave"), login::FAILURES);
    // A thousand successes by another user leave all of her failures.
    for _ in 0..1_000 {
        let reply = logins.login("alice", "correct horse").await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    assert_eq!(logins.failures_left("alice"), login::FAILURES);
}

#[tokio::test]
async fn an_attempt_without_a_user_is_a_401_that_counts_for_no_one() {
    let logins = Logins::new(ManualClock::new());
    let reply = logins.login("", "hunter2").await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        reply.ratelimit, "",
        "refused by the layer: no user to count"
    );
}
