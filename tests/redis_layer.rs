//! The tower layer over a limit in Redis (`turnstile::redis::RedisRateLimitLayer`),
//! through `tower::ServiceExt::oneshot`, against a real `redis-server` that
//! each test starts on a free port of its own and stops when done.
//!
//! Without `redis-server` on PATH each test says so and passes, unless
//! `TURNSTILE_REQUIRE_REDIS=1` is set (CI sets it), when it fails.

#[allow(dead_code)]
#[path = "support/redis_server.rs"]
mod redis_server;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use http::header::HeaderName;
use http::{Request, Response, StatusCode};
use redis::Client;
use tower::{Service, ServiceExt, service_fn};
use turnstile::redis::{
    Deadlines, Guarded, LeasedBuilder, OnFailure, ReconnectingConnection, RedisLimiter,
    RedisRateLimitLayer,
};
use turnstile::tower::{ApiKeyHeader, Global, Layer, PeerIp};
use turnstile::{FixedWindow, Quota, TokenBucket};

use redis_server::{FailingAfter, Server, spawn_on};

fn server() -> Option<Server> {
    redis_server::server("redis_layer")
}

/// Deadlines generous enough for a loaded CI machine.
fn connection(client: Client) -> ReconnectingConnection {
    Deadlines::default()
        .connect(Duration::from_secs(2))
        .unwrap()
        .response(Duration::from_secs(2))
        .unwrap()
        .reconnecting(client)
}

/// The service behind the layer: counts the requests that reach it.
#[derive(Clone)]
struct Inner(Arc<AtomicU64>);

impl Inner {
    fn new() -> Inner {
        Inner(Arc::new(AtomicU64::new(0)))
    }

    fn calls(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    fn service(
        &self,
    ) -> impl Service<
        Request<()>,
        Response = Response<String>,
        Error = Infallible,
        Future = impl Future<Output = Result<Response<String>, Infallible>> + Send + use<>,
    > + Clone
    + Send
    + use<> {
        let calls = Arc::clone(&self.0);
        service_fn(move |_: Request<()>| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Infallible>(Response::new("hello".to_string())) }
        })
    }
}

fn with_key(key: &str) -> Request<()> {
    Request::builder()
        .header("x-api-key", key)
        .body(())
        .unwrap()
}

fn api_key() -> ApiKeyHeader {
    ApiKeyHeader::new(HeaderName::from_static("x-api-key"))
}

fn dbsize(server: &Server) -> i64 {
    redis::cmd("DBSIZE").query(&mut server.plain()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_mode_admits_then_answers_429_with_retry_after_rounded_up() {
    let Some(server) = server() else { return };
    // 3 at once, one more every 1.9 s: the fourth waits 1.9 s less the time
    // the four took (up to 0.9 s on a loaded machine), sent as 2.
    let quota = Quota::new(3, 1, Duration::from_millis(1_900)).unwrap();
    let limit = Guarded::<TokenBucket>::new(
        RedisLimiter::new("exact", TokenBucket::new(quota)).unwrap(),
        OnFailure::Deny,
        Duration::from_secs(1),
    );
    let inner = Inner::new();
    let layer = RedisRateLimitLayer::new(limit, connection(server.client()), api_key())
        .with_derived_policy("api")
        .unwrap();
    let service = layer.layer(inner.service());
    for remaining in [2, 1, 0] {
        let response = service.clone().oneshot(with_key("k_1")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.body(), "hello");
        assert_eq!(response.headers()["ratelimit-policy"], "\"api\";q=3;w=6");
        assert_eq!(
            response.headers()["ratelimit"],
            format!("\"api\";r={remaining}").as_str()
        );
    }
    let denied = service.clone().oneshot(with_key("k_1")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.body(), "");
    assert_eq!(denied.headers()["retry-after"], "2");
    assert_eq!(denied.headers()["ratelimit"], "\"api\";r=0;t=2");
    // Denied requests never reach the inner service; another key has its own
    // limit.
    assert_eq!(inner.calls(), 3);
    let other = service.oneshot(with_key("k_2")).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    assert_eq!(inner.calls(), 4);
    let stats = layer.stats();
    assert_eq!((stats.admitted, stats.too_many_requests), (4, 1));
    assert_eq!(layer.limit().stats().failures, 0);
    assert_eq!(dbsize(&server), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_key_is_401_and_a_missing_peer_address_is_500_without_a_call() {
    let Some(server) = server() else { return };
    let window = FixedWindow::new(5, Duration::from_secs(60)).unwrap();
    let limit = || {
        Guarded::<TokenBucket>::new(
            RedisLimiter::new("keys", window).unwrap(),
            OnFailure::Deny,
            Duration::from_secs(1),
        )
    };
    let inner = Inner::new();
    let by_key = RedisRateLimitLayer::new(limit(), connection(server.client()), api_key());
    let anonymous = by_key
        .layer(inner.service())
        .oneshot(Request::new(()))
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        anonymous.headers()["www-authenticate"],
        "ApiKey header=\"x-api-key\""
    );
    assert!(anonymous.headers().get("retry-after").is_none());
    assert_eq!(by_key.stats().unauthorized, 1);

    let by_peer = RedisRateLimitLayer::new(limit(), connection(server.client()), PeerIp::new());
    let broken = by_peer
        .layer(inner.service())
        .oneshot(Request::new(()))
        .await
        .unwrap();
    assert_eq!(broken.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(broken.body().contains("peer"), "{}", broken.body());
    assert_eq!(by_peer.stats().misconfigured, 1);
    // With the address, the peer is the key.
    let mut request = Request::new(());
    request
        .extensions_mut()
        .insert("192.0.2.7:5000".parse::<SocketAddr>().unwrap());
    let served = by_peer
        .layer(inner.service())
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    assert_eq!(inner.calls(), 1);
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut server.plain())
        .unwrap();
    assert_eq!(keys, ["turnstile:{keys}:192.0.2.7"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_exact_limit_admit_exactly_the_limit_together() {
    let Some(server) = server() else { return };
    // An hour's window, on Redis' clock: a window that ended mid-burst would
    // admit more (one burst in 36,000 with a 100 ms burst).
    let window = FixedWindow::new(50, Duration::from_secs(3_600)).unwrap();
    // Two replicas: each its own limit object, layer and connection.
    let replica = || {
        let limit = Guarded::<TokenBucket>::new(
            RedisLimiter::new("shared", window).unwrap(),
            OnFailure::Deny,
            Duration::from_secs(1),
        );
        RedisRateLimitLayer::new(limit, connection(server.client()), Global)
    };
    let (a, b) = (replica(), replica());
    let inner = Inner::new();
    let mut tasks = Vec::new();
    for i in 0..160 {
        let service = if i % 2 == 0 { &a } else { &b }.layer(inner.service());
        tasks.push(tokio::spawn(async move {
            service.oneshot(Request::new(())).await.unwrap().status()
        }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    let limited = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!((ok, limited), (50, 110));
    assert_eq!(inner.calls(), 50);
    assert_eq!(a.stats().admitted + b.stats().admitted, 50);
    // Both replicas took part.
    assert!(a.stats().admitted + a.stats().too_many_requests == 80);
    assert!(b.stats().admitted + b.stats().too_many_requests == 80);
}

/// Poll `future` once: its output if it is ready without waiting.
fn ready_at_once<F: Future>(future: F) -> Option<F::Output> {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_mode_decides_at_once_while_the_lease_holds_and_calls_about_once_per_lease() {
    let Some(server) = server() else { return };
    const L: u32 = 50;
    let global = RedisLimiter::new(
        "leased",
        TokenBucket::new(Quota::new(10_000, 1, Duration::from_secs(3_600)).unwrap()),
    )
    .unwrap();
    let limiter = LeasedBuilder::new(global, L)
        .unwrap()
        .lifetime(Duration::from_secs(30))
        .build()
        .unwrap();
    let layer = RedisRateLimitLayer::new(limiter, connection(server.client()), api_key());
    let inner = Inner::new();
    let mut service = layer.layer(inner.service());
    // Warm up: the lease size grows from 1 to L.
    for _ in 0..200 {
        let response = service.clone().oneshot(with_key("k")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    // Until a prefetch under way (held below the low-water mark) has landed.
    let prefetched = async || {
        let waited = Instant::now();
        while layer.limit().held("k") < L / 4 {
            assert!(
                waited.elapsed() < Duration::from_secs(10),
                "no prefetch landed"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    prefetched().await;
    let before = layer.limit().stats();
    let mut at_once = 0;
    let decisions = 1_000;
    for _ in 0..decisions {
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .unwrap();
        let future = service.call(with_key("k"));
        // While the lease covers the request, the response is ready on its
        // first poll: nothing was awaited.
        let mut future = Box::pin(future);
        let response = match ready_at_once(future.as_mut()) {
            Some(response) => {
                at_once += 1;
                response.unwrap()
            }
            None => future.await.unwrap(),
        };
        assert_eq!(response.status(), StatusCode::OK);
        // Requests a millisecond apart, and none while a prefetch is under
        // way: on a loaded machine the prefetch's task may not run for
        // longer than the lease lasts.
        tokio::time::sleep(Duration::from_millis(1)).await;
        prefetched().await;
    }
    let after = layer.limit().stats();
    let calls = after.redis_calls() - before.redis_calls();
    assert!(
        at_once >= decisions * 9 / 10,
        "{at_once} of {decisions} decided at once; {after:?}"
    );
    // About one call per L decisions: a lease per L tokens, plus a few for
    // timing.
    assert!(
        calls <= u64::from(decisions / L) + 5,
        "{calls} calls for {decisions} decisions; {after:?}"
    );
    assert!(calls >= 1, "the leases were topped up; {after:?}");
    assert_eq!(after.failures, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_replicas_behind_layers_admit_within_the_stated_bound() {
    let Some(server) = server() else { return };
    const L: u32 = 10;
    const B: u64 = 100;
    // 100 at once, then one more a minute: the test runs for well under one.
    let quota = Quota::new(100, 1, Duration::from_secs(60)).unwrap();
    let replica = || {
        let global = RedisLimiter::new("bound", TokenBucket::new(quota)).unwrap();
        let limiter = LeasedBuilder::new(global, L).unwrap().build().unwrap();
        RedisRateLimitLayer::new(limiter, connection(server.client()), Global)
    };
    let replicas = [replica(), replica()];
    let inner = Inner::new();
    let start = Instant::now();
    let mut ok = 0;
    // 40 waves of 10 concurrent requests, 5 to each replica.
    for _ in 0..40 {
        let mut tasks = Vec::new();
        for i in 0..10 {
            let service = replicas[i % 2].layer(inner.service());
            tasks.push(tokio::spawn(async move {
                service.oneshot(Request::new(())).await.unwrap().status()
            }));
        }
        for task in tasks {
            ok += u64::from(task.await.unwrap() == StatusCode::OK);
        }
    }
    let refill = start.elapsed().as_secs() / 60 + 1;
    // At most B + r(T) + N·(L + ⌊L/2⌋); and what no lease holds is not
    // stranded: at least B less what two leases can hold.
    let n = replicas.len() as u64;
    let held = n * u64::from(L + L / 2);
    assert!(ok <= B + refill + held, "{ok} admitted");
    assert!(ok >= B - held, "{ok} admitted");
    assert_eq!(inner.calls(), ok);
    let calls: u64 = replicas
        .iter()
        .map(|r| r.limit().stats().redis_calls())
        .sum();
    assert!(calls < 200, "{calls} calls for 400 requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_request_leaves_its_key_free_to_take_a_lease() {
    let Some(server) = server() else { return };
    let global = RedisLimiter::new(
        "cancel",
        TokenBucket::new(Quota::new(100, 1, Duration::from_secs(3_600)).unwrap()),
    )
    .unwrap();
    let limiter = LeasedBuilder::new(global, 10).unwrap().build().unwrap();
    let layer = RedisRateLimitLayer::new(limiter, connection(server.client()), Global);
    let inner = Inner::new();
    let mut service = layer.layer(inner.service());
    // A new key has no lease: its first request must call Redis. With every
    // command held for a while (`Server::pause`, in effect once it returns),
    // its future is pending at first whatever the scheduling; dropped there
    // (a client that hung up).
    let _paused = server.pause(Duration::from_millis(300));
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    let future = service.call(Request::new(()));
    assert!(ready_at_once(future).is_none(), "a miss awaits a call");
    // The claim was released: the next request takes a lease, not an
    // exact-mode call for want of one.
    let response = service.oneshot(Request::new(())).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let stats = layer.limit().stats();
    assert_eq!(stats.exact_calls, 0, "{stats:?}");
    assert!(stats.lease_calls >= 1, "{stats:?}");
    assert_eq!(inner.calls(), 1);
}

/// A request through `layer`'s service, and how long it took.
async fn timed<S>(service: S, request: Request<()>) -> (Response<String>, Duration)
where
    S: Service<Request<()>, Response = Response<String>, Error = Infallible>,
{
    let start = Instant::now();
    let response = service.oneshot(request).await.unwrap();
    (response, start.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_the_layer_answers_by_its_policy_within_the_deadline_then_recovers() {
    let Some(server) = server() else { return };
    let port = server.port();
    let client = server.client();
    let deadlines = Deadlines::default()
        .connect(Duration::from_millis(200))
        .unwrap()
        .response(Duration::from_millis(200))
        .unwrap();
    // Long enough that the outage's requests below all fall within it on a
    // loaded machine (at 300 ms, one run saw the backoff end before the
    // check that no request calls Redis during it).
    let backoff = Duration::from_secs(1);
    let quota = Quota::per_second(1_000).unwrap();
    let global = || RedisLimiter::new("outage", TokenBucket::new(quota)).unwrap();
    // Failing closed and failing open, exact mode; failing closed, leased.
    let closed = RedisRateLimitLayer::new(
        Guarded::<TokenBucket>::new(global(), OnFailure::Deny, backoff),
        deadlines.reconnecting(client.clone()),
        Global,
    );
    let open = RedisRateLimitLayer::new(
        Guarded::<TokenBucket>::new(global(), OnFailure::local_share(quota, 2).unwrap(), backoff),
        deadlines.reconnecting(client.clone()),
        Global,
    );
    let leased = RedisRateLimitLayer::new(
        LeasedBuilder::new(global(), 4)
            .unwrap()
            .on_failure(OnFailure::Deny, backoff)
            .build()
            .unwrap(),
        deadlines.reconnecting(client.clone()),
        api_key(),
    );
    let inner = Inner::new();
    for layer in [&closed, &open] {
        let (response, _) = timed(layer.layer(inner.service()), Request::new(())).await;
        assert_eq!(response.status(), StatusCode::OK);
    }
    let (response, _) = timed(leased.layer(inner.service()), with_key("fresh")).await;
    assert_eq!(response.status(), StatusCode::OK);

    drop(server); // SIGKILL to the server's own process id
    let deadline = Duration::from_millis(400 + 300); // connect + response, and slack
    let (response, elapsed) = timed(closed.layer(inner.service()), Request::new(())).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1);
    assert!(elapsed < deadline, "{elapsed:?}");
    let (response, elapsed) = timed(open.layer(inner.service()), Request::new(())).await;
    assert_eq!(
        response.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the local share starts empty in the degraded period"
    );
    assert!(elapsed < deadline, "{elapsed:?}");
    // 500 a second: it admits what refills, and Redis is owed for it.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (response, _) = timed(open.layer(inner.service()), Request::new(())).await;
    assert_eq!(response.status(), StatusCode::OK, "the local limit admits");
    assert_eq!(open.limit().stats().owed, 1);
    // A key with no lease held: failing closed denies.
    let (response, elapsed) = timed(leased.layer(inner.service()), with_key("other")).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(elapsed < deadline, "{elapsed:?}");
    // During the backoff no request calls Redis (a call would fail, one
    // failure more): answered by the policy.
    let failures = closed.limit().stats().failures;
    assert!(failures >= 1);
    let (response, elapsed) = timed(closed.layer(inner.service()), Request::new(())).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(closed.limit().stats().failures, failures);
    assert!(elapsed < deadline, "{elapsed:?}");
    assert!(open.limit().stats().fallbacks >= 1);
    assert!(leased.limit().stats().failures >= 1);

    let server = spawn_on(port).expect("redis-server restarts on its port");
    tokio::time::sleep(backoff + Duration::from_millis(50)).await;
    // Redis again, on a new connection: the probe after the backoff succeeds.
    let failures = closed.limit().stats().failures;
    let (response, _) = timed(closed.layer(inner.service()), Request::new(())).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(closed.limit().stats().failures, failures);
    assert!(!closed.limit().is_backing_off());
    let (response, _) = timed(open.layer(inner.service()), Request::new(())).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(!open.limit().is_backing_off());
    assert_eq!(
        open.limit().stats().owed,
        0,
        "charged to Redis with the call"
    );
    let leases = leased.limit().stats().lease_calls;
    let (response, _) = timed(leased.layer(inner.service()), with_key("other")).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(leased.limit().stats().lease_calls > leases);
    // The decisions were Redis': the keys are in the new server.
    assert!(dbsize(&server) >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_deadline_drops_the_connection_so_a_restarted_redis_answers_next() {
    let Some(server) = server() else { return };
    let port = server.port();
    let mut con = Deadlines::default()
        .connect(Duration::from_secs(2))
        .unwrap()
        .response(Duration::from_millis(200))
        .unwrap()
        .reconnecting(server.client());
    let limiter = RedisLimiter::new(
        "late",
        FixedWindow::new(100, Duration::from_secs(60)).unwrap(),
    )
    .unwrap();
    let first = limiter.try_acquire_async(&mut con, "k").await;
    assert!(first.is_ok_and(|d| d.is_allowed()) && con.is_connected());
    // Redis busy past the deadline, then killed while the request is in
    // flight: whether the connection still works is unknown, so it goes.
    let _paused = server.pause(Duration::from_secs(1));
    let err = limiter
        .try_acquire_async(&mut con, "k")
        .await
        .expect_err("Redis is asleep");
    assert!(err.is_timeout(), "{err}");
    assert!(
        !con.is_connected(),
        "a connection past its deadline is dropped"
    );
    drop(server);
    // The next call connects to the server now on the port, instead of
    // failing on the dead connection (and a layer backing off again).
    let _server = spawn_on(port).expect("redis-server restarts on its port");
    let next = limiter.try_acquire_async(&mut con, "k").await;
    assert!(matches!(next, Ok(d) if d.is_allowed()), "{next:?}");
    assert!(con.is_connected());
}

/// Calls that find no connection do not each open one: one attempt to
/// connect at a time, and the calls wait for it within their connect
/// deadline. (Fifty calls at once opened fifty connections before.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_a_connection_wait_for_one_connect_not_each_their_own() {
    let Some(server) = server() else { return };
    let received = |server: &Server| -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query(&mut server.plain())
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("INFO stats")
    };
    let con = Deadlines::default()
        .connect(Duration::from_millis(300))
        .unwrap()
        .response(Duration::from_millis(300))
        .unwrap()
        .reconnecting(server.client());
    let limiter = Arc::new(
        RedisLimiter::new(
            "storm",
            FixedWindow::new(100, Duration::from_secs(60)).unwrap(),
        )
        .unwrap(),
    );
    let before = received(&server);
    let paused = server.pause(Duration::from_millis(800));
    let calls: Vec<_> = (0..50)
        .map(|_| {
            let (limiter, mut con) = (Arc::clone(&limiter), con.clone());
            tokio::spawn(async move { limiter.try_acquire_async(&mut con, "k").await })
        })
        .collect();
    let start = Instant::now();
    for call in calls {
        assert!(call.await.unwrap().is_err(), "Redis is paused");
    }
    let took = start.elapsed();
    tokio::task::block_in_place(|| paused.wait());
    // One connection to pause, one per connect deadline while it lasts at
    // most, and the two `received` opens.
    let opened = received(&server) - before;
    assert!(opened <= 6, "{opened} connections for 50 calls");
    // No call waited past its connect deadline (and the response's).
    assert!(took < Duration::from_millis(600 + 300), "{took:?}");
}

/// A `GET /` on a fresh connection: the status and the `Retry-After` value.
async fn http_get(addr: SocketAddr) -> (u16, Option<String>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    let mut lines = reply.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let retry_after = lines
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("retry-after"))
        .map(|(_, value)| value.trim().to_string());
    (status, retry_after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_axum_server_keyed_by_peer_address_over_real_http() {
    let Some(server) = server() else { return };
    let limit = Guarded::<TokenBucket>::new(
        RedisLimiter::new(
            "axum",
            // An hour: a window ending between the requests would admit the
            // third.
            FixedWindow::new(2, Duration::from_secs(3_600)).unwrap(),
        )
        .unwrap(),
        OnFailure::Deny,
        Duration::from_secs(1),
    );
    let layer =
        RedisRateLimitLayer::new(limit, connection(server.client()), PeerIp::connect_info());
    let handled = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&handled);
    let app = axum::Router::new()
        .route(
            "/",
            axum::routing::get(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                async { "ok" }
            }),
        )
        .layer(layer.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    assert_eq!(http_get(addr).await, (200, None));
    assert_eq!(http_get(addr).await, (200, None));
    let (status, retry_after) = http_get(addr).await;
    assert_eq!(status, 429);
    let secs: u64 = retry_after.expect("a Retry-After").parse().unwrap();
    assert!((1..=3_600).contains(&secs), "{secs}");
    assert_eq!(handled.load(Ordering::SeqCst), 2);
    let stats = layer.stats();
    assert_eq!((stats.admitted, stats.too_many_requests), (2, 1));
    let key: Option<String> = redis::cmd("GET")
        .arg("turnstile:{axum}:127.0.0.1")
        .query(&mut server.plain())
        .unwrap();
    assert!(key.is_some(), "the peer address is the key in Redis");
}

/// A leased layer decides in `call`: a response future dropped before its
/// first poll (a `select!`, a client gone) claimed the key's fetch there,
/// and must release it. It left the key claimed for good: every later
/// request waited out the fetch wait and was refused by the failure policy,
/// with Redis up and the bucket full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_response_future_dropped_unpolled_leaves_the_key_free() {
    let Some(server) = server() else { return };
    let global = RedisLimiter::new(
        "dropped-unpolled",
        TokenBucket::new(Quota::new(1_000, 1, Duration::from_secs(3_600)).unwrap()),
    )
    .unwrap();
    let limiter = LeasedBuilder::new(global, 10).unwrap().build().unwrap();
    let layer = RedisRateLimitLayer::new(limiter, connection(server.client()), Global);
    let inner = Inner::new();
    let mut service = layer.layer(inner.service());
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    drop(service.call(Request::new(())));
    for _ in 0..5 {
        let status = service
            .clone()
            .oneshot(Request::new(()))
            .await
            .unwrap()
            .status();
        assert_eq!(status, StatusCode::OK, "{:?}", layer.limit().stats());
    }
    assert_eq!(layer.limit().stats().fallbacks, 0);
}

/// The same for a debt: permits the local share admitted while Redis
/// failed are owed to Redis, and the request that claims the debt in
/// `call` must give the claim back if its future never runs. It was
/// forgotten: those admissions were never charged to Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_response_future_dropped_unpolled_keeps_the_debt_owed() {
    let Some(server) = server() else { return };
    let quota = Quota::new(100, 1, Duration::from_millis(1)).unwrap();
    let global = RedisLimiter::new("debt-unpolled", TokenBucket::new(quota)).unwrap();
    let limiter = LeasedBuilder::new(global, 10)
        .unwrap()
        .on_failure(
            OnFailure::local_share(quota, 1).unwrap(),
            Duration::from_millis(20),
        )
        .build()
        .unwrap();
    let layer = RedisRateLimitLayer::new(limiter, connection(server.client()), Global);
    let limit = Arc::clone(layer.limit());
    // Redis fails; the local share admits, and those admissions are owed.
    let _ = limit.try_acquire(&mut FailingAfter(Duration::ZERO), b"".as_slice());
    // The local share starts empty at the failure and refills at its rate.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let mut admitted = 0;
    for _ in 0..5 {
        if limit
            .try_acquire(&mut FailingAfter(Duration::ZERO), b"".as_slice())
            .unwrap()
            .is_allowed()
        {
            admitted += 1;
        }
    }
    let owed = limit.stats().owed;
    assert!(admitted > 0 && owed > 0, "admitted {admitted}, owed {owed}");
    // The backoff over, the next request claims the debt in `call`.
    tokio::time::sleep(Duration::from_millis(40)).await;
    let mut service = layer.layer(Inner::new().service());
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    drop(service.call(Request::new(())));
    assert_eq!(limit.stats().owed, owed, "the debt is still owed");
}
