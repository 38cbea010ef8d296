//! The example server's app, shared by `examples/server.rs` and the integration
//! test that drives it over TCP: an axum router behind turnstile's tower layer,
//! served by hyper's HTTP/1 connection builder with a header read timeout.

#![allow(dead_code)]

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use axum::http::{Request, Response};
use axum::routing::get;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};
use tower::ServiceExt;
use turnstile::metrics::Registry;
use turnstile::tower::{ApiKeyHeader, Denial, PeerIp, RateLimitLayer};
use turnstile::{Gate, KeyedLimiter, Quota};

/// How many requests each handler actually ran.
#[derive(Debug, Default)]
pub struct Handled {
    pub api: AtomicU64,
    pub public: AtomicU64,
}

/// The longest API key `/api` accepts, in bytes.
pub const API_KEY_MAX_LEN: usize = 64;

/// Memory the `/api` limiter may use for its keys.
pub const API_KEY_MEMORY: usize = 16 << 20;

/// The most bytes one `/api` key can cost: the keyed map keeps a `String` key
/// (24 bytes) beside its 8-byte word in a 32-byte slot with a control byte, in
/// tables at least 3/8 full while keys arrive (a table grows when 3/4 full, to
/// twice the room), so at most about 88 bytes of table;
/// the key's heap block holds at most `API_KEY_MAX_LEN` = 64 bytes, which the
/// allocator may round up by about 16. 88 + 64 + 16 = 168, rounded up to 176
/// for margin. (Measured with 64-byte keys on 8 shards: 155 bytes a key at
/// 116,508 keys, 167 at 200,000, 127 at 95,000.)
pub const API_BYTES_PER_KEY: usize = 176;

/// The `/api` key bound that keeps the limiter within `API_KEY_MEMORY`:
/// 16 MiB / 176 B = 95,325 keys.
pub const API_MAX_KEYS: usize = API_KEY_MEMORY / API_BYTES_PER_KEY;

/// How long a client may take to send a request's header section before its
/// connection is closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// The API keys issued, or `None` to accept any well-formed key (1 to 64
    /// characters from `A-Z a-z 0-9 _ -`), as a stand-in for a key store.
    pub known_api_keys: Option<HashSet<String>>,
}

impl Default for Settings {
    /// `/api`: 3 requests per API key, one more every 10 s, at most
    /// [`API_MAX_KEYS`] keys, any well-formed key. `/public`: 5 per peer IP
    /// address, one more every 12 s, at most 10,000 addresses (an `IpAddr` key
    /// is 17 bytes: about 52 bytes a key, 0.5 MB in all). Idle keys are swept
    /// every 10 s.
    fn default() -> Settings {
        Settings {
            api: Quota::new(3, 1, Duration::from_secs(10)).expect("a valid quota"),
            public: Quota::new(5, 1, Duration::from_secs(12)).expect("a valid quota"),
            api_max_keys: API_MAX_KEYS,
            public_max_keys: 10_000,
            sweep_every: Duration::from_secs(10),
            known_api_keys: None,
        }
    }
}

/// The gates behind the routes, to read their limiters' state.
pub struct Gates {
    pub api: Arc<Gate<KeyedLimiter<String>>>,
    pub public: Arc<Gate<KeyedLimiter<std::net::IpAddr>>>,
}

/// The app with the default [`Settings`], with RateLimit header fields on `/api`.
pub fn app(handled: Arc<Handled>) -> Router {
    app_with(handled, Settings::default()).0
}

/// A well-formed API key: 1 to 64 characters from `A-Z a-z 0-9 _ -`.
pub fn well_formed(key: &str) -> bool {
    (1..=API_KEY_MAX_LEN).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// An RFC 9457 problem details body for a denial.
pub fn problem(denial: &Denial) -> Response<axum::body::Body> {
    let status = denial.status();
    let detail = match denial {
        Denial::Misconfigured(message) => message.to_string(),
        _ => match denial.retry_after_secs() {
            Some(secs) => format!("retry after {secs} s"),
            None => "send a valid x-api-key header".to_string(),
        },
    };
    let body = format!(
        "{{\"type\":\"about:blank\",\"title\":\"{}\",\"status\":{},\"detail\":{:?}}}",
        status.canonical_reason().unwrap_or("Error"),
        status.as_u16(),
        detail,
    );
    let mut response = Response::new(axum::body::Body::from(body));
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

/// The app with `settings`, and its gates. Each limiter owns a sweeper, so
/// the keys of a flood are reclaimed even while no request comes.
///
/// The layers are route layers: they run only for a request that matches a
/// route and method, so a 405 (a POST to a GET route) spends no allowance.
pub fn app_with(handled: Arc<Handled>, settings: Settings) -> (Router, Gates) {
    let per_key = KeyedLimiter::<String>::builder(settings.api)
        .max_keys(settings.api_max_keys)
        .build()
        .expect("a valid configuration")
        .with_sweeper(settings.sweep_every)
        .expect("a sweeper thread");
    // `"api";q=3;w=30` for the default quota: derived, so it cannot drift.
    let api_gate = Arc::new(
        Gate::new(per_key)
            .with_derived_policy("api")
            .expect("a valid policy name"),
    );
    let known = settings.known_api_keys.map(Arc::new);
    let keys = ApiKeyHeader::new(HeaderName::from_static("x-api-key"))
        .max_len(API_KEY_MAX_LEN)
        .validate(move |key| match &known {
            Some(known) => known.contains(key),
            None => well_formed(key),
        });
    let api_layer = RateLimitLayer::shared(api_gate.clone(), keys).deny_with(problem);
    // Every layer's counts, under one name each, for `/metrics`.
    let registry = Registry::new();
    registry.register("api", api_layer.clone());
    let per_ip = KeyedLimiter::builder(settings.public)
        .max_keys(settings.public_max_keys)
        .build()
        .expect("a valid configuration")
        .with_sweeper(settings.sweep_every)
        .expect("a sweeper thread");
    let public_gate = Arc::new(Gate::new(per_ip));
    let ip_layer = RateLimitLayer::shared(public_gate.clone(), PeerIp::connect_info());
    registry.register("public", ip_layer.clone());
    // `/metrics`: the layers' counts in Prometheus's text format, published
    // into a recorder of the app's own at each scrape (exact, and no global
    // recorder to install). Serve it where only your scraper can reach it.
    let recorder = Arc::new(PrometheusBuilder::new().build_recorder());
    metrics::with_local_recorder(&*recorder, turnstile::metrics::describe);
    let scrape = move || {
        let recorder: Arc<PrometheusRecorder> = recorder.clone();
        metrics::with_local_recorder(&*recorder, || registry.publish());
        async move {
            (
                [(CONTENT_TYPE, "text/plain; version=0.0.4")],
                recorder.handle().render(),
            )
        }
    };
    let (api, public) = (handled.clone(), handled);
    let router = Router::new()
        .route(
            "/api",
            get(move || async move {
                api.api.fetch_add(1, Ordering::Relaxed);
                "api: served\n"
            })
            .route_layer(api_layer),
        )
        .route(
            "/public",
            get(move || async move {
                public.public.fetch_add(1, Ordering::Relaxed);
                "public: served\n"
            })
            .route_layer(ip_layer),
        )
        .route("/metrics", get(scrape));
    (
        router,
        Gates {
            api: api_gate,
            public: public_gate,
        },
    )
}

/// Serve `app` on `listener` with the default [`HEADER_READ_TIMEOUT`].
pub async fn serve(listener: tokio::net::TcpListener, app: Router) -> std::io::Result<()> {
    serve_with(listener, app, HEADER_READ_TIMEOUT).await
}

/// Serve `app` on `listener`, one HTTP/1 connection per task, each request
/// carrying its connection's peer address (`ConnectInfo<SocketAddr>`, for the
/// per-IP layer). A connection whose header section has not fully arrived
/// within `header_read_timeout` is closed: `axum::serve` cannot set this
/// timeout, so connections are served with hyper's builder directly.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    app: Router,
    header_read_timeout: Duration,
) -> std::io::Result<()> {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Out of descriptors, or a connection reset before it was
            // accepted: back off briefly and keep serving.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let app = app.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
                request
                    .extensions_mut()
                    .insert(ConnectInfo::<SocketAddr>(peer));
                app.clone().oneshot(request)
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout)
                .serve_connection(TokioIo::new(stream), service);
            // A client that is too slow, or goes away, ends its own
            // connection only.
            let _ = connection.await;
        });
    }
}
