//! The rate-limiter pattern's whole extended example: the per-client gate, then a
//! fixed window and a token bucket with the same nominal limit on one flow across
//! a window boundary.
//!
//! ```text
//! cargo run --example extended
//! ```

#[path = "shared/pattern.rs"]
mod pattern;

fn main() {
    print!("{}", pattern::extended_trace());
}
