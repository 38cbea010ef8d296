//! Per-key quotas: free keys get 5 requests per second, paid keys 50; a key
//! upgraded while traffic runs gets the paid quota from then on, and the free
//! tier's quota is raised to 10 per second while traffic runs. On a simulated
//! clock.
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
