//! The seed's per-client gate: alice, bob and a request without a key through
//! per-key token buckets (capacity 3, one token per 1000 ms): 200, 429 with
//! Retry-After rounded up to whole seconds, 401.
//!
//! ```text
//! cargo run --example gate
//! ```

#[path = "shared/seed.rs"]
mod seed;

fn main() {
    print!("{}", seed::per_client_trace());
}
