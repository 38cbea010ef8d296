//! The rate-limiter pattern's comparison: a fixed window (2 per 1000 ms window)
//! and a token bucket (capacity 2, one token every 500 ms) on the same flow across
//! the 1000 ms boundary. The fixed window admits twice its limit in 150 ms.
//!
//! ```text
//! cargo run --example window_vs_bucket
//! ```

#[path = "shared/pattern.rs"]
mod pattern;

fn main() {
    print!("{}", pattern::window_vs_bucket_trace());
}
