//! Count only failed logins: every attempt is admitted against the user's
//! allowance of failures, and a successful one gives its permit back.

use std::time::Duration;

use turnstile::{KeyedLimiter, ManualClock, Quota};

/// Failed logins allowed per user before a lockout.
pub const FAILURES: u32 = 5;
/// How long the failures are remembered: the allowance refills all at once,
/// this long after the first failure of a run.
pub const LOCKOUT: Duration = Duration::from_secs(15 * 60);

/// A login service: a password check behind a limiter of failures per user.
pub struct Logins {
    failures: KeyedLimiter<String, turnstile::TokenBucket, ManualClock>,
}

/// What one login attempt got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// The password was right; the attempt did not count as a failure.
    Welcome,
    /// The password was wrong; `left` more failures before a lockout.
    WrongPassword { left: u32 },
    /// Too many failures: refused without checking the password.
    LockedOut { retry_after: Duration },
}

impl Logins {
    /// A service on `clock`.
    pub fn new(clock: ManualClock) -> Logins {
        let quota = Quota::new(FAILURES, FAILURES, LOCKOUT).expect("a valid quota");
        let failures = KeyedLimiter::<String>::builder(quota)
            .clock(clock)
            .build()
            .expect("a valid configuration");
        Logins { failures }
    }

    /// One attempt by `user` with `password`.
    pub fn login(&self, user: &str, password: &str) -> Attempt {
        // Admit the attempt as a failure first: a burst of concurrent guesses
        // cannot all slip in before the first one is counted.
        let attempt = match self.failures.try_acquire_refundable(user) {
            Ok(attempt) => attempt,
            // A rate denial, or (with a million users locked out at once) the
            // key bound: refused either way, for as long as the denial says.
            Err(denied) => {
                return Attempt::LockedOut {
                    retry_after: denied
                        .retry_after()
                        .map_or(Duration::ZERO, |r| r.duration()),
                };
            }
        };
        if check_password(user, password) {
            // A success is not a failure: give the permit back. A refund that
            // cannot be exact declines, and the attempt then stays counted
            // (never more allowance than before).
            let _ = attempt.refund();
            Attempt::Welcome
        } else {
            Attempt::WrongPassword {
                left: attempt.remaining(),
            }
        }
    }

    /// Failures `user` may still make now.
    pub fn failures_left(&self, user: &str) -> u32 {
        self.failures.remaining(user)
    }
}

fn check_password(user: &str, password: &str) -> bool {
    matches!(
        (user, password),
        ("alice", "correct horse") | ("bob", "hunter2") | ("carol", "tr0ub4dor")
    )
}

/// The example's story, one line per event.
pub fn story() -> Vec<String> {
    let clock = ManualClock::new();
    let logins = Logins::new(clock.clone());
    let mut lines = Vec::new();
    let log = |lines: &mut Vec<String>, who: &str, attempt: Attempt| {
        lines.push(format!("{who}: {attempt:?}"));
    };

    // Alice logs in ten times in a row: successes never count.
    for _ in 0..10 {
        let attempt = logins.login("alice", "correct horse");
        assert_eq!(attempt, Attempt::Welcome);
    }
    log(&mut lines, "alice x10", Attempt::Welcome);
    let left = logins.failures_left("alice");
    lines.push(format!("alice: {left} failures left"));

    // Someone guesses Bob's password: five failures, then a lockout that
    // holds even for the right password.
    for guess in [
        "123456", "password", "qwerty", "letmein", "dragon", "monkey",
    ] {
        log(&mut lines, "bob (guess)", logins.login("bob", guess));
    }
    log(
        &mut lines,
        "bob (right password)",
        logins.login("bob", "hunter2"),
    );

    // Carol mistypes twice, then gets it right: two failures count.
    log(&mut lines, "carol", logins.login("carol", "troubador"));
    log(&mut lines, "carol", logins.login("carol", "tr0ubador"));
    log(&mut lines, "carol", logins.login("carol", "tr0ub4dor"));
    let left = logins.failures_left("carol");
    lines.push(format!("carol: {left} failures left"));

    // Fifteen minutes later Bob's lockout is over.
    clock.advance(LOCKOUT);
    lines.push(format!("after {} minutes:", LOCKOUT.as_secs() / 60));
    log(
        &mut lines,
        "bob (right password)",
        logins.login("bob", "hunter2"),
    );
    let left = logins.failures_left("bob");
    lines.push(format!("bob: {left} failures left"));
    lines
}
