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

/// The limits the app enforces.
pub struct Settings {
    /// Per API key on `/api`.
    pub api: Quota,
    /// Per peer IP address on `/public`.
    pub public: Quota,
    /// Keys held at most, per route.
    pub api_max_keys: usize,
    pub public_max_keys: usize,
    /// How often each limiter's own sweeper reclaims idle keys.
    pub sweep_every: Duration,
}

impl Default for Settings {
    /// `/api`: 3 requests per API key, one more every 10 s, at most 100,000
    /// keys. `/public`: 5 per peer IP address, one more every 12 s, at most
    /// 10,000 addresses. Idle keys are swept every 10 s.
    fn default() -> Settings {
        Settings {
            api: Quota::new(3, 1, Duration::from_secs(10)).expect("a valid quota"),
            public: Quota::new(5, 1, Duration::from_secs(12)).expect("a valid quota"),
            api_max_keys: 100_000,
            public_max_keys: 10_000,
            sweep_every: Duration::from_secs(10),
        }
    }
}

/// The gates behind the routes, to read their limiters' state.
pub struct Gates {
    pub api: Arc<Gate<String>>,
    pub public: Arc<Gate<std::net::IpAddr>>,
}

/// The app with the default [`Settings`], with RateLimit header fields on `/api`.
pub fn app(handled: Arc<Handled>) -> Router {
    app_with(handled, Settings::default()).0
}

/// The app with `settings`, and its gates. Each limiter owns a sweeper, so
/// the keys of a flood are reclaimed even while no request comes.
pub fn app_with(handled: Arc<Handled>, settings: Settings) -> (Router, Gates) {
    let per_key = KeyedLimiter::<String>::builder(settings.api)
        .max_keys(settings.api_max_keys)
        .build()
        .expect("a valid configuration")
        .with_sweeper(settings.sweep_every)
        .expect("a sweeper thread");
    let policy = RateLimitPolicy::new("api", 3, Duration::from_secs(30)).expect("a valid policy");
    let api_gate = Arc::new(Gate::new(per_key).with_policy(policy));
    let api_layer = RateLimitLayer::shared(
        api_gate.clone(),
        ApiKeyHeader::new(HeaderName::from_static("x-api-key")),
    );
    let per_ip = KeyedLimiter::builder(settings.public)
        .max_keys(settings.public_max_keys)
        .build()
        .expect("a valid configuration")
        .with_sweeper(settings.sweep_every)
        .expect("a sweeper thread");
    let public_gate = Arc::new(Gate::new(per_ip));
    let ip_layer = RateLimitLayer::shared(
        public_gate.clone(),
        PeerIp::from_extension(|c: &ConnectInfo<SocketAddr>| c.0),
    );
    let (api, public) = (handled.clone(), handled);
    let router = Router::new()
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
        );
    (
        router,
        Gates {
            api: api_gate,
            public: public_gate,
        },
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
