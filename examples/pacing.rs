//! Stay under someone else's limit instead of retrying rejected work: 10,000
//! records to a target that accepts 100 per second, on a simulated clock.
//!
//! ```text
//! cargo run --release --example pacing
//! ```

#[path = "shared/pacing.rs"]
mod pacing;

use std::process::ExitCode;

fn main() -> ExitCode {
    let paced = pacing::paced(10_000);
    let retrying = pacing::retrying(10_000);
    println!("{}", pacing::describe("paced at 95/s (wait):", &paced));
    println!("{}", pacing::describe("sent at once, retried:", &retrying));
    if paced.rejected == 0 {
        println!("the paced client was never rejected");
        ExitCode::SUCCESS
    } else {
        eprintln!("the paced client was rejected {} times", paced.rejected);
        ExitCode::FAILURE
    }
}
