//! The layer-overhead setups, shared by `benches/layer.rs` and
//! `examples/decision_cost/`: an axum router with one small handler, bare,
//! behind turnstile's layer, and behind tower_governor's, all keyed by the same
//! API-key header; and three limits (per API key, per peer address, global)
//! as one combined layer (`Limits`) and as three stacked layers.

#![allow(dead_code)]

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, header::HeaderName};
use axum::routing::get;
use tower::Layer;
use turnstile::tower::{ApiKeyHeader, Global, Limits, PeerIp, RateLimitLayer};
use turnstile::{Gate, KeyedLimiter, Quota, RateLimiter};

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
        // The peer address a server puts in the extensions (read by
        // `PeerIp` in the three-limit setups only).
        .extension(SocketAddr::from(([203, 0, 113, 7], 40_000)))
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

/// The router behind turnstile's layer with a derived policy (the
/// `RateLimit` fields on every answer), every request admitted.
pub fn turnstile_fields_service() -> impl tower::Service<
    Request<Body>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
> + Clone {
    let quota = Quota::per_second(1_000_000_000).expect("a valid quota");
    RateLimitLayer::new(
        Gate::new(KeyedLimiter::<String>::new(quota))
            .with_derived_policy("key")
            .expect("a valid policy name"),
        ApiKeyHeader::new(HeaderName::from_static("x-api-key")),
    )
    .layer(router())
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

/// The quota of the three-limit setups: `admit` every request, or deny all
/// but the first (in the per-key limit, asked first).
fn three_quotas(admit: bool) -> [Quota; 3] {
    let wide = Quota::per_second(1_000_000_000).expect("a valid quota");
    let key = if admit {
        wide
    } else {
        Quota::per_hour(1).expect("a valid quota")
    };
    [key, wide, wide]
}

/// The router behind one combined layer of three limits: per API key, per
/// peer address and global, all or nothing, with the `RateLimit` fields.
pub fn combined_service(
    admit: bool,
) -> impl tower::Service<
    Request<Body>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
> + Clone {
    combined_service_advertising(admit, true)
}

/// [`combined_service`], with or without the `RateLimit` fields.
pub fn combined_service_advertising(
    admit: bool,
    advertise: bool,
) -> impl tower::Service<
    Request<Body>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
> + Clone {
    let [key, ip, all] = three_quotas(admit);
    Limits::builder()
        .limit(
            "key",
            ApiKeyHeader::new(HeaderName::from_static("x-api-key")),
            KeyedLimiter::<String>::new(key),
        )
        .and_then(|b| b.limit("ip", PeerIp::new(), KeyedLimiter::<IpAddr>::new(ip)))
        .and_then(|b| b.limit("all", Global, RateLimiter::new(all)))
        .and_then(|b| b.advertise(advertise).build())
        .expect("a valid configuration")
        .layer(router())
}

/// One limit (per API key) in a combined layer, without the fields: the
/// combined layer's own cost beside one `RateLimitLayer`'s.
pub fn combined_one_service() -> impl tower::Service<
    Request<Body>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
> + Clone {
    let [key, _, _] = three_quotas(true);
    Limits::builder()
        .limit(
            "key",
            ApiKeyHeader::new(HeaderName::from_static("x-api-key")),
            KeyedLimiter::<String>::new(key),
        )
        .and_then(|b| b.advertise(false).build())
        .expect("a valid configuration")
        .layer(router())
}

/// The same three limits as three stacked layers (the per-key one closest
/// to the router, as a combined layer asks it first), each advertising its
/// policy as the combined layer does (its items appended to the inner ones').
pub fn stacked_service(
    admit: bool,
) -> impl tower::Service<
    Request<Body>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
> + Clone {
    let [key, ip, all] = three_quotas(admit);
    let policy = "a valid policy name";
    let key = RateLimitLayer::new(
        Gate::new(KeyedLimiter::<String>::new(key))
            .with_derived_policy("key")
            .expect(policy),
        ApiKeyHeader::new(HeaderName::from_static("x-api-key")),
    );
    let ip = RateLimitLayer::new(
        Gate::new(KeyedLimiter::<IpAddr>::new(ip))
            .with_derived_policy("ip")
            .expect(policy),
        PeerIp::new(),
    );
    let all = RateLimitLayer::new(
        Gate::new(RateLimiter::new(all))
            .with_derived_policy("all")
            .expect(policy),
        Global,
    );
    all.layer(ip.layer(key.layer(router())))
}
