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
        "combined1-nofields-admitted" => {
            let mut s = layer::combined_one_service();
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
                 combined3-admitted, combined3-denied, combined3-nofields-admitted, combined1-nofields-admitted, stacked3-admitted, stacked3-denied, \
                 tower_governor-admitted or tower_governor-denied"
            );
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// Pairs of layer cases timed in alternating blocks of requests, so that both
/// sides of each ratio meet the same moments of the machine: per pair, 101
/// rounds of a block through each service (requests built before each
/// block; each side first in every other round), then each side's median
/// time per request and the median and quartiles of the per-round ratios.
pub(crate) fn run_paired_layer() {
    type Request = axum::http::Request<axum::body::Body>;
    type Response = axum::response::Response;
    const BLOCK: usize = 2_000;
    const ROUNDS: usize = 101;
    fn block<S: tower::Service<Request, Response = Response>>(service: &mut S) -> f64 {
        let requests: Vec<_> = (0..BLOCK).map(|_| layer::request()).collect();
        // As criterion's `iter_batched` times them: the responses are kept,
        // and dropped after the clock is read.
        let mut responses = Vec::with_capacity(BLOCK);
        let start = std::time::Instant::now();
        for r in requests {
            responses.push(layer::poll_ready_now(service.call(r)));
        }
        let elapsed = start.elapsed();
        drop(black_box(responses));
        elapsed.as_nanos() as f64 / BLOCK as f64
    }
    fn quantile(v: &[f64], q: f64) -> f64 {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * q).round() as usize]
    }
    fn pair<A, B>(a_name: &str, mut a: A, b_name: &str, mut b: B)
    where
        A: tower::Service<Request, Response = Response>,
        B: tower::Service<Request, Response = Response>,
    {
        for ok in [
            layer::poll_ready_now(a.call(layer::request())).is_ok_and(|r| r.status().is_success()),
            layer::poll_ready_now(b.call(layer::request())).is_ok_and(|r| r.status().is_success()),
        ] {
            assert!(ok, "every request of a pair is admitted");
        }
        let (mut ta, mut tb, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            let (x, y) = if round % 2 == 0 {
                let x = block(&mut a);
                (x, block(&mut b))
            } else {
                let y = block(&mut b);
                (block(&mut a), y)
            };
            ta.push(x);
            tb.push(y);
            ratios.push(x / y);
        }
        println!(
            "{a_name:<24} {:7.1} ns  {b_name:<22} {:7.1} ns  ratio median {:.3} (quartiles {:.3}-{:.3})",
            quantile(&ta, 0.5),
            quantile(&tb, 0.5),
            quantile(&ratios, 0.5),
            quantile(&ratios, 0.25),
            quantile(&ratios, 0.75),
        );
    }
    pair(
        "three limits, no fields",
        layer::combined_service_advertising(true, false),
        "one limit, no fields",
        layer::turnstile_service(true),
    );
    pair(
        "three limits, fields",
        layer::combined_service(true),
        "one limit, fields",
        layer::turnstile_fields_service(),
    );
    pair(
        "one limit, no fields",
        layer::turnstile_service(true),
        "tower_governor",
        layer::governor_service(true),
    );
}
