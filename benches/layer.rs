//! The tower layer's cost, on an axum router with one small handler:
//!
//! - `layer/bare`: the router alone;
//! - `layer/turnstile/admitted`: through turnstile's layer, every request
//!   admitted (per API key, read from a header and looked up in the keyed
//!   limiter);
//! - `layer/turnstile/denied`: every request denied (429 with `Retry-After`;
//!   the router is never called);
//! - `layer/tower_governor/*`: tower_governor 0.8 (governor's keyed limiter as
//!   a layer) on the same router, keyed by the same header. Its `Retry-After`
//!   is the wait in whole seconds rounded *down*;
//! - `layer/turnstile-fields/admitted`: the same layer with a derived policy,
//!   so every answer carries the `RateLimit` fields;
//! - `layer/combined3/*`: three limits (per API key, per peer address, global)
//!   in one `Limits` layer, all or nothing, one `RateLimit` item each
//!   (`combined3-nofields`: the same without the fields, as
//!   `layer/turnstile` has none);
//! - `layer/stacked3/*`: the same three limits as three stacked
//!   `RateLimitLayer`s (a denial by the per-key one, closest to the router,
//!   has already spent the other two's permits).
//!
//! `cargo bench -p turnstile-bench --bench layer`. Requests are built outside the timed region;
//! futures are polled once (every one here is ready at once).

#[path = "../examples/shared/layer.rs"]
mod layer;

use std::hint::black_box;
use std::time::Duration;

use axum::http::StatusCode;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use layer::{
    combined_service, combined_service_advertising, governor_service, poll_ready_now, request,
    router, stacked_service, turnstile_fields_service, turnstile_service,
};
use tower::Service;

fn run<S>(
    c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    mut service: S,
    expect: StatusCode,
) where
    S: Service<axum::http::Request<axum::body::Body>, Response = axum::response::Response>,
    S::Error: std::fmt::Debug,
{
    // The first request takes the deny limiters' one permit.
    assert_eq!(
        poll_ready_now(service.call(request())).unwrap().status(),
        StatusCode::OK
    );
    let status = poll_ready_now(service.call(request())).unwrap().status();
    assert_eq!(status, expect, "{name}");
    c.bench_function(name, |b| {
        b.iter_batched(
            request,
            |r| black_box(poll_ready_now(service.call(r))),
            BatchSize::SmallInput,
        )
    });
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("layer");
    run(&mut group, "bare", router(), StatusCode::OK);
    run(
        &mut group,
        "turnstile/admitted",
        turnstile_service(true),
        StatusCode::OK,
    );
    run(
        &mut group,
        "turnstile/denied",
        turnstile_service(false),
        StatusCode::TOO_MANY_REQUESTS,
    );
    for (name, admit, expect) in [
        ("admitted", true, StatusCode::OK),
        ("denied", false, StatusCode::TOO_MANY_REQUESTS),
    ] {
        run(
            &mut group,
            &format!("combined3/{name}"),
            combined_service(admit),
            expect,
        );
        run(
            &mut group,
            &format!("stacked3/{name}"),
            stacked_service(admit),
            expect,
        );
    }
    run(
        &mut group,
        "turnstile-fields/admitted",
        turnstile_fields_service(),
        StatusCode::OK,
    );
    run(
        &mut group,
        "combined3-nofields/admitted",
        combined_service_advertising(true, false),
        StatusCode::OK,
    );
    run(
        &mut group,
        "tower_governor/admitted",
        governor_service(true),
        StatusCode::OK,
    );
    run(
        &mut group,
        "tower_governor/denied",
        governor_service(false),
        StatusCode::TOO_MANY_REQUESTS,
    );
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
