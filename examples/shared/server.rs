//! The example server's app, shared by `examples/server.rs` and the integration
//! test that drives it over TCP: an axum router behind turnstile's tower layer.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::header::HeaderName;
use axum::routing::get;
use turnstile::tower::{ApiKeyHeader, PeerIp, RateLimitLayer};
use turnstile::{Gate, KeyedLimiter, Quota, RateLimitPolicy};

/// How many requests each handler actually ran.
#[derive(Debug, Default)]
pub struct Handled {
    pub api: AtomicU64,
    pub public: AtomicU64,
}

/// `/api`: 3 requests per API key, one more every 10 s, with RateLimit header
/// fields. `/public`: 5 per peer IP address, one more every 12 s, at most
/// 10,000 addresses held.
pub fn app(handled: Arc<Handled>) -> Router {
    let per_key = KeyedLimiter::<String>::new(
        Quota::new(3, 1, Duration::from_secs(10)).expect("a valid quota"),
    );
    let policy = RateLimitPolicy::new("api", 3, Duration::from_secs(30)).expect("a valid policy");
    let api_layer = RateLimitLayer::new(
        Gate::new(per_key).with_policy(policy),
        ApiKeyHeader::new(HeaderName::from_static("x-api-key")),
    );
    let per_ip =
        KeyedLimiter::builder(Quota::new(5, 1, Duration::from_secs(12)).expect("a valid quota"))
            .max_keys(10_000)
            .build()
            .expect("a valid configuration");
    let ip_layer = RateLimitLayer::new(
        Gate::new(per_ip),
        PeerIp::from_extension(|c: &ConnectInfo<SocketAddr>| c.0),
    );
    let (api, public) = (handled.clone(), handled);
    Router::new()
        .route(
            "/api",
            get(move || async move {
                api.api.fetch_add(1, Ordering::Relaxed);
                "api: served\n"
            })
            .layer(api_layer),
        )
        .route(
            "/public",
            get(move || async move {
                public.public.fetch_add(1, Ordering::Relaxed);
                "public: served\n"
            })
            .layer(ip_layer),
        )
}

/// Serve `app` on `listener`, with each connection's peer address available
/// to the per-IP layer.
pub async fn serve(listener: tokio::net::TcpListener, app: Router) -> std::io::Result<()> {
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}
