//! The rate-limiter pattern's per-client gate: alice, bob and a request without a
//! key through per-key token buckets (capacity 3, one token per 1000 ms): 200, 429
//! with Retry-After rounded up to whole seconds, 401.
//!
//! ```text
//! cargo run --example gate
//! ```

#[path = "shared/pattern.rs"]
mod pattern;

fn main() {
    print!("{}", pattern::per_client_trace());
}
