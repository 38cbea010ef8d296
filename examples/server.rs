//! A small axum app behind turnstile's tower layers, on 127.0.0.1, served by
//! hyper's HTTP/1 builder with a 10 s header read timeout.
//!
//! `/api` is behind one combined layer of three limits, all or nothing: per
//! API key (3 for a free key, one more every 10 s; 30 for a key starting
//! `k_paid_`, one more a second), per peer address, and every request
//! together. Each answer tells every limit's policy and what is left, one
//! item each. `/public` is limited per peer address.
//!
//! ```text
//! cargo run --release --example server            # port 3000
//! cargo run --release --example server -- 8080    # another port
//! curl -i -H 'x-api-key: k_1' http://127.0.0.1:3000/api       # 200 three times, then 429 (problem+json)
//! curl -i -H 'x-api-key: k_paid_1' http://127.0.0.1:3000/api  # "api.paid";q=30;w=30: its own tier
//! curl -i http://127.0.0.1:3000/api                           # 401 with WWW-Authenticate: no key
//! curl -i -X POST http://127.0.0.1:3000/api                   # 405, and no allowance spent
//! curl -i http://127.0.0.1:3000/public                        # per peer address
//! curl http://127.0.0.1:3000/metrics                          # the layers' counts, Prometheus text
//! ```
//!
//! A free key's answer carries, for instance:
//!
//! ```text
//! ratelimit-policy: "api.free";q=3;w=30, "ip";q=1000;w=10, "all";q=10000;w=10
//! ratelimit: "api.free";r=2, "ip";r=999, "all";r=9999
//! ```

#[path = "shared/server.rs"]
mod server;

use std::process::ExitCode;
use std::sync::Arc;

#[tokio::main]
async fn main() -> ExitCode {
    let port = match std::env::args().nth(1).map(|p| p.parse::<u16>()) {
        None => 3000,
        Some(Ok(port)) => port,
        Some(Err(e)) => {
            eprintln!("server: the port must be a number from 0 to 65535 ({e})");
            return ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("server: cannot listen on 127.0.0.1:{port}: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Ok(addr) = listener.local_addr() {
        println!("listening on http://{addr} (/api with an x-api-key header, /public, /metrics)");
    }
    let handled = Arc::new(server::Handled::default());
    match server::serve(listener, server::app(handled)).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("server: {e}");
            ExitCode::FAILURE
        }
    }
}
