//! Count only failed logins, with a layer: `POST /login` behind a combined
//! `Limits` layer of 5 failures per user per 15 minutes (keyed by the
//! `x-user` header) whose successful responses give their permit back. Served
//! in-process with `tower::ServiceExt::oneshot`, on a simulated clock.
//!
//! ```text
//! cargo run --example login
//! ```

#[path = "shared/login.rs"]
mod login;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    for line in login::story().await {
        println!("{line}");
    }
}
