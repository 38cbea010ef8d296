//! Count only failed logins, as a layer: `POST /login` behind a `Limits`
//! layer of 5 failures per user per 15 minutes, keyed by the `x-user` header,
//! that gives a successful login's permit back.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, Request, StatusCode};
use axum::routing::post;
use tower::ServiceExt;
use turnstile::tower::{ApiKeyHeader, Limits};
use turnstile::{KeyedLimiter, ManualClock, Quota, TokenBucket};

/// Failed logins allowed per user before a lockout.
pub const FAILURES: u32 = 5;
/// How long the failures are remembered: the allowance refills all at once,
/// this long after the first failure of a run.
pub const LOCKOUT: Duration = Duration::from_secs(15 * 60);

/// A login service: a password check behind a limit of failures per user.
pub struct Logins {
    app: Router,
    failures: Arc<KeyedLimiter<String, TokenBucket, ManualClock>>,
}

/// What one login attempt got back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// 200 welcome, 401 wrong password, 429 locked out.
    pub status: StatusCode,
    /// `Retry-After`, in seconds, on a 429.
    pub retry_after: Option<u64>,
    /// The `RateLimit` field: the failures left, or the wait.
    pub ratelimit: String,
}

impl std::fmt::Display for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.status)?;
        if let Some(secs) = self.retry_after {
            write!(f, ", Retry-After: {secs}")?;
        }
        write!(f, ", RateLimit: {}", self.ratelimit)
    }
}

impl Logins {
    /// A service on `clock`.
    pub fn new(clock: ManualClock) -> Logins {
        let quota = Quota::new(FAILURES, FAILURES, LOCKOUT).expect("a valid quota");
        let failures = Arc::new(
            KeyedLimiter::<String>::builder(quota)
                .clock(clock)
                .build()
                .expect("a valid configuration"),
        );
        // Every attempt is admitted as a failure first, so a burst of
        // concurrent guesses cannot all slip in before the first one counts;
        // a successful response gives its permit back. A refund that cannot
        // be exact declines, and the attempt then stays counted.
        let layer = Limits::builder()
            .limit_shared(
                "login",
                ApiKeyHeader::new(HeaderName::from_static("x-user")),
                Arc::clone(&failures),
            )
            .expect("a valid limit name")
            .refund_when(|parts| parts.status.is_success())
            .build()
            .expect("a cost of 1 the limit can admit");
        let app = Router::new().route("/login", post(check).route_layer(layer));
        Logins { app, failures }
    }

    /// One attempt by `user` with `password`.
    pub async fn login(&self, user: &str, password: &str) -> Reply {
        let request = Request::post("/login")
            .header("x-user", user)
            .body(Body::from(password.to_owned()))
            .expect("a valid request");
        let response = match self.app.clone().oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        };
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        Reply {
            status: response.status(),
            retry_after: header("retry-after").and_then(|s| s.parse().ok()),
            ratelimit: header("ratelimit").unwrap_or_default(),
        }
    }

    /// Failures `user` may still make now.
    pub fn failures_left(&self, user: &str) -> u32 {
        self.failures.remaining(user)
    }
}

/// The handler: the user (from `x-user`) and the password (the body).
async fn check(headers: HeaderMap, password: String) -> StatusCode {
    let user = headers
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let known = matches!(
        (user, password.as_str()),
        ("alice", "correct horse") | ("bob", "hunter2") | ("carol", "tr0ub4dor")
    );
    if known {
        StatusCode::OK
    } else {
        StatusCode::UNAUTHORIZED
    }
}

/// The example's story, one line per event.
pub async fn story() -> Vec<String> {
    let clock = ManualClock::new();
    let logins = Logins::new(clock.clone());
    let mut lines = Vec::new();

    // Alice logs in ten times in a row: successes never count.
    for _ in 1..10 {
        logins.login("alice", "correct horse").await;
    }
    let tenth = logins.login("alice", "correct horse").await;
    lines.push(format!("alice (10th login): {tenth}"));
    lines.push(format!(
        "alice: {} failures left",
        logins.failures_left("alice")
    ));

    // Someone guesses Bob's password: five failures, then a lockout that
    // holds even for the right password.
    for guess in [
        "123456", "password", "qwerty", "letmein", "dragon", "monkey",
    ] {
        lines.push(format!("bob (guess): {}", logins.login("bob", guess).await));
    }
    let reply = logins.login("bob", "hunter2").await;
    lines.push(format!("bob (right password): {reply}"));

    // Carol mistypes twice, then gets it right: two failures count.
    for password in ["troubador", "tr0ubador", "tr0ub4dor"] {
        lines.push(format!("carol: {}", logins.login("carol", password).await));
    }
    lines.push(format!(
        "carol: {} failures left",
        logins.failures_left("carol")
    ));

    // Fifteen minutes later Bob's lockout is over.
    clock.advance(LOCKOUT);
    lines.push(format!("after {} minutes:", LOCKOUT.as_secs() / 60));
    let reply = logins.login("bob", "hunter2").await;
    lines.push(format!("bob (right password): {reply}"));
    lines.push(format!(
        "bob: {} failures left",
        logins.failures_left("bob")
    ));
    lines
}
