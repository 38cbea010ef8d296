//! A budget of model tokens per API key, priced by each response: 10,000
//! tokens a minute per key, 500 charged when a call is admitted, the real
//! cost settled from the `x-tokens-used` header the model sets. Cheap calls
//! give the rest back, expensive ones take more, one that uses more than is
//! left borrows from the next refills, and then the key waits its debt
//! out. Served
//! in-process with `tower::ServiceExt::oneshot`, on a simulated clock.
//!
//! ```text
//! cargo run --example llm_tokens
//! ```

#[path = "shared/llm_tokens.rs"]
mod llm_tokens;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    for line in llm_tokens::story().await {
        println!("{line}");
    }
}
