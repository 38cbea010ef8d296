//! Count only failed logins: a keyed limiter of 5 failures per 15 minutes per
//! user, where every attempt is admitted and a successful one is refunded. On
//! a simulated clock.
//!
//! ```text
//! cargo run --example login
//! ```

#[path = "shared/login.rs"]
mod login;

fn main() {
    for line in login::story() {
        println!("{line}");
    }
}
