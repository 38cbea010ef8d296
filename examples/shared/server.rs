//! The example server's app, shared by `examples/server.rs` and the integration
//! test that drives it over TCP: an axum router behind turnstile's tower
//! layers (`/api` behind one combined layer of three limits), served by
//! hyper's HTTP/1 connection builder with a header read timeout.

#![allow(dead_code)]

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
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
use turnstile::tower::{ApiKeyHeader, Denial, Global, Limits, PeerIp, RateLimitLayer};
use turnstile::{Gate, KeyedLimiter, Quota, RateLimiter, Tiered};

/// How many requests each handler actually ran.
#[derive(Debug, Default)]
pub struct Handled {
    pub api: AtomicU64,
    pub public: AtomicU64,
}

/// The longest API key `/api` accepts, in bytes.
pub const API_KEY_MAX_LEN: usize = 64;

/// Memory each tier of the `/api` per-key limiter may use for its keys (32
/// MiB for both: without a key store, anyone may send a paid-looking key).
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

/// The key bound that keeps each `/api` tier within `API_KEY_MEMORY`:
/// 16 MiB / 176 B = 95,325 keys.
pub const API_MAX_KEYS: usize = API_KEY_MEMORY / API_BYTES_PER_KEY;

/// How long a client may take to send a request's header section before its
/// connection is closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The limits the app enforces.
pub struct Settings {
    /// Per API key on `/api`, for the free tier (any key not starting with
    /// [`PAID_PREFIX`]).
    pub api: Quota,
    /// Per API key on `/api`, for the paid tier.
    pub api_paid: Quota,
    /// Per peer IP address on `/api`, whatever keys it sends.
    pub api_per_ip: Quota,
    /// Every `/api` request together.
    pub api_global: Quota,
    /// Per peer IP address on `/public`.
    pub public: Quota,
    /// API keys held at most, by each tier.
    pub api_max_keys: usize,
    /// Peer addresses held at most, by each per-address limiter.
    pub ip_max_keys: usize,
    /// How often each limiter's own sweeper reclaims idle keys.
    pub sweep_every: Duration,
    /// The API keys issued, or `None` to accept any well-formed key (1 to 64
    /// characters from `A-Z a-z 0-9 _ -`), as a stand-in for a key store.
    pub known_api_keys: Option<HashSet<String>>,
}

impl Default for Settings {
    /// `/api`: 3 requests per free API key, one more every 10 s; 30 per paid
    /// key, one more a second; 1,000 per peer address, 100 more a second;
    /// 10,000 in all, 1,000 more a second; at most [`API_MAX_KEYS`] keys per
    /// tier, any well-formed key. `/public`: 5 per peer IP address, one more
    /// every 12 s. At most 10,000 addresses per limiter (an `IpAddr` key is
    /// 17 bytes: about 52 bytes a key, 0.5 MB in all). Idle keys are swept
    /// every 10 s.
    fn default() -> Settings {
        Settings {
            api: Quota::new(3, 1, Duration::from_secs(10)).expect("a valid quota"),
            api_paid: Quota::new(30, 1, Duration::from_secs(1)).expect("a valid quota"),
            api_per_ip: Quota::new(1_000, 100, Duration::from_secs(1)).expect("a valid quota"),
            api_global: Quota::new(10_000, 1_000, Duration::from_secs(1)).expect("a valid quota"),
            public: Quota::new(5, 1, Duration::from_secs(12)).expect("a valid quota"),
            api_max_keys: API_MAX_KEYS,
            ip_max_keys: 10_000,
            sweep_every: Duration::from_secs(10),
            known_api_keys: None,
        }
    }
}

/// API keys starting with this are in the paid tier: a stand-in for a key
/// store that knows which keys are paid.
pub const PAID_PREFIX: &str = "k_paid_";

/// A key's tier: 1 (paid) for a key starting with [`PAID_PREFIX`], else 0
/// (free, the first tier: a key the function cannot place gets the least).
pub fn tier_of(key: &str) -> usize {
    usize::from(key.starts_with(PAID_PREFIX))
}

/// The `/api` limiter per API key: the free and paid tiers.
pub type ApiKeys = Tiered<String, fn(&str) -> usize>;

/// The limiters behind the routes, to read their state.
pub struct Gates {
    /// `/api`, per API key, by tier.
    pub api_keys: Arc<ApiKeys>,
    /// `/api`, per peer IP address.
    pub api_ips: Arc<KeyedLimiter<IpAddr>>,
    /// `/api`, every request.
    pub api_global: Arc<RateLimiter>,
    /// `/public`, per peer IP address.
    pub public: Arc<Gate<KeyedLimiter<IpAddr>>>,
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

/// A keyed limiter of `quota` holding at most `max_keys` keys, with its own
/// sweeper, so that the keys of a flood are reclaimed even while no request
/// comes.
fn keyed<K>(quota: Quota, max_keys: usize, sweep_every: Duration) -> KeyedLimiter<K>
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
{
    KeyedLimiter::builder(quota)
        .max_keys(max_keys)
        .build()
        .expect("a valid configuration")
        .with_sweeper(sweep_every)
        .expect("a sweeper thread")
}

/// The app with `settings`, and its limiters.
///
/// `/api` is behind one combined layer of three limits, asked in this order
/// (the most likely to refuse first), all or nothing: per API key (its
/// tier's quota), per peer IP address, and all requests together. A request
/// one limit refuses spends nothing in the others, and every answer carries
/// one `RateLimit-Policy` and `RateLimit` item per limit: `"api.free"` or
/// `"api.paid"` (the key's own tier), `"ip"` and `"all"`.
///
/// The layers are route layers: they run only for a request that matches a
/// route and method, so a 405 (a POST to a GET route) spends no allowance.
pub fn app_with(handled: Arc<Handled>, settings: Settings) -> (Router, Gates) {
    let api_keys: Arc<ApiKeys> = Arc::new(
        Tiered::new(
            [
                (
                    "free",
                    keyed(settings.api, settings.api_max_keys, settings.sweep_every),
                ),
                (
                    "paid",
                    keyed(
                        settings.api_paid,
                        settings.api_max_keys,
                        settings.sweep_every,
                    ),
                ),
            ],
            tier_of as fn(&str) -> usize,
        )
        .expect("two tiers of distinct names"),
    );
    let api_ips = Arc::new(keyed(
        settings.api_per_ip,
        settings.ip_max_keys,
        settings.sweep_every,
    ));
    let api_global = Arc::new(RateLimiter::new(settings.api_global));
    let known = settings.known_api_keys.map(Arc::new);
    let keys = ApiKeyHeader::new(HeaderName::from_static("x-api-key"))
        .max_len(API_KEY_MAX_LEN)
        .validate(move |key| match &known {
            Some(known) => known.contains(key),
            None => well_formed(key),
        });
    // `"api.free";q=3;w=30, "ip";q=1000;w=10, "all";q=10000;w=10` for a
    // free key and the default quotas: derived, so they cannot drift.
    let api_layer = Limits::builder()
        .limit_shared("api", keys, Arc::clone(&api_keys))
        .expect("a valid limit name")
        .limit_shared("ip", PeerIp::connect_info(), Arc::clone(&api_ips))
        .expect("a valid limit name")
        .limit_shared("all", Global, Arc::clone(&api_global))
        .expect("a valid limit name")
        .build()
        .expect("a cost of 1 every limit can admit")
        .deny_with(problem);
    // Every layer's counts, under one name each, for `/metrics`.
    let registry = Registry::new();
    registry.register("api", api_layer.clone());
    registry.register("api.keys", Arc::clone(&api_keys));
    registry.register("api.ip", Arc::clone(&api_ips));
    let public_gate = Arc::new(Gate::new(keyed(
        settings.public,
        settings.ip_max_keys,
        settings.sweep_every,
    )));
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
            api_keys,
            api_ips,
            api_global,
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
