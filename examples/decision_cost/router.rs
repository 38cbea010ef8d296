//! The `layer` mode: requests through an axum router, bare or behind
//! turnstile's or tower_governor's rate-limiting layer (callgrind toggles
//! on `requests_measured`).

use std::hint::black_box;
use std::process::ExitCode;

use crate::layer;

/// `n` requests through the router bare or behind a layer; requests are built
/// before the measured loop.
pub(crate) fn run_layer(which: &str, n: u64) -> ExitCode {
    use tower::Service;
    #[inline(never)]
    fn requests_measured<S>(service: &mut S, requests: Vec<axum::http::Request<axum::body::Body>>)
    where
        S: Service<axum::http::Request<axum::body::Body>>,
    {
        for r in requests {
            let _ = black_box(layer::poll_ready_now(service.call(r)));
        }
    }
    let requests: Vec<_> = (0..n).map(|_| layer::request()).collect();
    match which {
        "bare" => requests_measured(&mut layer::router(), requests),
        "turnstile-admitted" | "turnstile-denied" => {
            let mut s = layer::turnstile_service(which == "turnstile-admitted");
            // The first request takes the deny limiters' one permit.
            let _ = layer::poll_ready_now(s.call(layer::request()));
            requests_measured(&mut s, requests);
        }
        "turnstile-fields-admitted" => {
            let mut s = layer::turnstile_fields_service();
            let _ = layer::poll_ready_now(s.call(layer::request()));
            requests_measured(&mut s, requests);
        }
        "combined3-admitted" | "combined3-denied" => {
            let mut s = layer::combined_service(which == "combined3-admitted");
            let _ = layer::poll_ready_now(s.call(layer::request()));
            requests_measured(&mut s, requests);
        }
        "combined3-nofields-admitted" => {
            let mut s = layer::combined_service_advertising(true, false);
            let _ = layer::poll_ready_now(s.call(layer::request()));
            requests_measured(&mut s, requests);
        }
        "stacked3-admitted" | "stacked3-denied" => {
            let mut s = layer::stacked_service(which == "stacked3-admitted");
            let _ = layer::poll_ready_now(s.call(layer::request()));
            requests_measured(&mut s, requests);
        }
        "tower_governor-admitted" | "tower_governor-denied" => {
            let mut s = layer::governor_service(which == "tower_governor-admitted");
            // The first request takes the deny limiters' one permit.
            let _ = layer::poll_ready_now(s.call(layer::request()));
            requests_measured(&mut s, requests);
        }
        other => {
            eprintln!(
                "unknown layer case {other:?}: bare, turnstile-admitted, turnstile-denied, turnstile-fields-admitted, \
                 combined3-admitted, combined3-denied, combined3-nofields-admitted, stacked3-admitted, stacked3-denied, \
                 tower_governor-admitted or tower_governor-denied"
            );
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
