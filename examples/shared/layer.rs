//! The layer-overhead setups, shared by `benches/layer.rs` and
//! `examples/decision_cost/`: an axum router with one small handler, bare,
//! behind turnstile's layer, and behind tower_governor's, all keyed by the same
//! API-key header.

#![allow(dead_code)]

use std::future::Future;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, header::HeaderName};
use axum::routing::get;
use tower::Layer;
use turnstile::tower::{ApiKeyHeader, RateLimitLayer};
use turnstile::{Gate, KeyedLimiter, Quota};

pub fn poll_ready_now<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the bench's futures are ready at once"),
    }
}

pub fn request() -> Request<Body> {
    Request::builder()
        .uri("/")
        .header("x-api-key", "k_live_0123456789")
        .body(Body::empty())
        .expect("a valid request")
}

pub fn router() -> Router {
    Router::new().route("/", get(|| async { "{\"ok\":true}" }))
}

pub fn layer(quota: Quota) -> RateLimitLayer<ApiKeyHeader> {
    RateLimitLayer::new(
        Gate::new(KeyedLimiter::<String>::new(quota)),
        ApiKeyHeader::new(HeaderName::from_static("x-api-key")),
    )
}

/// The same API-key header as `ApiKeyHeader`, for tower_governor.
#[derive(Clone, Debug)]
pub struct GovernorApiKey;

impl tower_governor::key_extractor::KeyExtractor for GovernorApiKey {
    type Key = String;

    fn extract<T>(&self, req: &Request<T>) -> Result<String, tower_governor::GovernorError> {
        req.headers()
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .ok_or(tower_governor::GovernorError::UnableToExtractKey)
    }
}

pub fn governor_layer(
    period: Duration,
    burst: u32,
) -> tower_governor::GovernorLayer<GovernorApiKey, governor::middleware::NoOpMiddleware, Body> {
    let config = tower_governor::governor::GovernorConfigBuilder::default()
        .key_extractor(GovernorApiKey)
        .period(period)
        .burst_size(burst)
        .finish()
        .expect("a valid configuration");
    tower_governor::GovernorLayer::new(config)
}

/// The router behind turnstile's layer: `admit` every request, or deny all
/// but the first.
pub fn turnstile_service(
    admit: bool,
) -> impl tower::Service<
    Request<Body>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
> + Clone {
    let quota = if admit {
        Quota::per_second(1_000_000_000)
    } else {
        Quota::per_hour(1)
    };
    layer(quota.expect("a valid quota")).layer(router())
}

/// The router behind tower_governor's layer, likewise.
pub fn governor_service(
    admit: bool,
) -> impl tower::Service<
    Request<Body>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
> + Clone {
    if admit {
        governor_layer(Duration::from_nanos(1), 1_000_000).layer(router())
    } else {
        governor_layer(Duration::from_secs(3_600), 1).layer(router())
    }
}
