//! Per-key quotas: free keys get 5 requests per second, paid keys 50, and a
//! key upgraded while traffic runs gets the paid quota from then on. On a
//! simulated clock.
//!
//! ```text
//! cargo run --example tiers
//! ```

#[path = "shared/tiers.rs"]
mod tiers;

fn main() {
    for line in tiers::story() {
        println!("{line}");
    }
}
