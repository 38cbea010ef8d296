//! The login example: successes are refunded, failures are counted, and the
//! sixth failure within 15 minutes locks the user out, whatever the password.

#[path = "../examples/shared/login.rs"]
mod login;

use std::time::Duration;

use login::{Attempt, Logins};
use turnstile::ManualClock;

#[test]
fn the_story_prints_exactly_this() {
    let expected = [
        "alice x10: Welcome",
        "alice: 5 failures left",
        "bob (guess): WrongPassword { left: 4 }",
        "bob (guess): WrongPassword { left: 3 }",
        "bob (guess): WrongPassword { left: 2 }",
        "bob (guess): WrongPassword { left: 1 }",
        "bob (guess): WrongPassword { left: 0 }",
        "bob (guess): LockedOut { retry_after: 900s }",
        "bob (right password): LockedOut { retry_after: 900s }",
        "carol: WrongPassword { left: 4 }",
        "carol: WrongPassword { left: 3 }",
        "carol: Welcome",
        "carol: 3 failures left",
        "after 15 minutes:",
        "bob (right password): Welcome",
        "bob: 5 failures left",
    ];
    assert_eq!(login::story(), expected);
}

#[test]
fn a_lockout_counts_down_and_successes_never_use_up_the_allowance() {
    let clock = ManualClock::new();
    let logins = Logins::new(clock.clone());
    for _ in 0..5 {
        assert!(matches!(
            logins.login("dave", "nope"),
            Attempt::WrongPassword { .. }
        ));
    }
    clock.advance(Duration::from_secs(60));
    assert_eq!(
        logins.login("dave", "nope"),
        Attempt::LockedOut {
            retry_after: Duration::from_secs(14 * 60)
        }
    );
    // A thousand successes by another user leave all of her failures.
    for _ in 0..1_000 {
        assert_eq!(logins.login("alice", "correct horse"), Attempt::Welcome);
    }
    assert_eq!(logins.failures_left("alice"), login::FAILURES);
}
