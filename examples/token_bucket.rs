//! The rate-limiter pattern's first trace: a bucket of capacity 3 refilled with
//! one token every 1000 ms, driven by a manual clock so nothing waits.
//!
//! ```text
//! cargo run --example token_bucket
//! ```

#[path = "shared/pattern.rs"]
mod pattern;

fn main() {
    print!("{}", pattern::token_bucket_trace());
}
