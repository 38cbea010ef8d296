//! Limits in Redis as members of a combined layer (`Limits::redis_limit`),
//! against a real `redis-server` each test starts on a free port of its own.
//!
//! Without `redis-server` on PATH each test says so and passes, unless
//! `TURNSTILE_REQUIRE_REDIS=1` is set (CI sets it), when it fails.

#[allow(dead_code)]
#[path = "support/redis_server.rs"]
mod redis_server;

#[allow(dead_code)]
#[path = "support/fields.rs"]
mod fields;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::header::HeaderName;
use http::{Request, Response, StatusCode};
use redis::Client;
use tower::{Service, ServiceExt, service_fn};
use turnstile::redis::{
    Deadlines, Guarded, LeasedBuilder, OnFailure, ReconnectingConnection, RedisLimiter,
};
use turnstile::tower::{ApiKeyHeader, Global, Layer, Limits};
use turnstile::{KeyedLimiter, ManualClock, Quota, TokenBucket};

fn connection(client: Client) -> ReconnectingConnection {
    Deadlines::default()
        .connect(Duration::from_secs(2))
        .unwrap()
        .response(Duration::from_secs(2))
        .unwrap()
        .reconnecting(client)
}

fn api_key() -> ApiKeyHeader {
    ApiKeyHeader::new(HeaderName::from_static("x-api-key"))
}

fn with_key(key: &str) -> Request<()> {
    Request::builder()
        .header("x-api-key", key)
        .body(())
        .unwrap()
}

/// A request for `key` that the test service answers with `status`.
fn answered(key: &str, status: &str) -> Request<()> {
    let mut request = with_key(key);
    request
        .headers_mut()
        .insert("x-answer", status.parse().unwrap());
    request
}

/// A service answering 200, or the status a request asks for in
/// `x-answer`; counts the requests that reach it.
fn inner(
    calls: Arc<AtomicU64>,
) -> impl Service<
    Request<()>,
    Response = Response<String>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<String>, Infallible>> + Send,
> + Clone
+ Send {
    service_fn(move |request: Request<()>| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut response = Response::new(String::new());
            if let Some(status) = request.headers().get("x-answer") {
                *response.status_mut() = StatusCode::from_bytes(status.as_bytes()).unwrap();
            }
            Ok(response)
        }
    })
}

/// An exact-mode limit of `capacity` at once, refilled one an hour.
fn exact(prefix: &str, capacity: u32) -> Arc<Guarded> {
    let quota = Quota::new(capacity, 1, Duration::from_secs(3_600)).unwrap();
    Arc::new(Guarded::<TokenBucket>::new(
        RedisLimiter::new(prefix, TokenBucket::new(quota)).unwrap(),
        OnFailure::Deny,
        Duration::from_secs(1),
    ))
}

fn ratelimit(response: &Response<String>) -> String {
    response
        .headers()
        .get("ratelimit")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_is_asked_only_after_every_in_process_limit_and_gives_nothing_away() {
    let Some(server) = redis_server::server("limits_redis") else {
        return;
    };
    let per_key = Arc::new(
        KeyedLimiter::<String>::builder(Quota::new(1, 1, Duration::from_secs(3_600)).unwrap())
            .clock(ManualClock::new())
            .build()
            .unwrap(),
    );
    let fleet = exact("fleet", 3);
    let layer = Limits::builder()
        .redis_limit(
            "fleet",
            Global,
            Arc::clone(&fleet),
            connection(server.client()),
        )
        .unwrap()
        // Added after, asked first: in-process limits come before Redis.
        .limit_shared("key", api_key(), Arc::clone(&per_key))
        .unwrap()
        .build()
        .unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let service = layer.clone().layer(inner(Arc::clone(&calls)));
    let send = |key: &str| service.clone().oneshot(with_key(key));

    let a = send("a").await.unwrap();
    assert_eq!(a.status(), 200);
    assert_eq!(ratelimit(&a), r#""key";r=0, "fleet";r=2"#);
    // Refused by its key: Redis is not called, the fleet keeps its permits.
    let again = send("a").await.unwrap();
    assert_eq!(again.status(), 429);
    assert_eq!(ratelimit(&again), r#""key";r=0;t=3600"#);
    assert_eq!(send("b").await.unwrap().status(), 200);
    assert_eq!(send("c").await.unwrap().status(), 200);
    // The fleet is empty: "d" is refused by Redis, and its own key's permit
    // goes back.
    let d = send("d").await.unwrap();
    assert_eq!(d.status(), 429);
    assert_eq!(d.headers()["retry-after"], "3600");
    assert_eq!(ratelimit(&d), r#""key";r=1, "fleet";r=0;t=3600"#);
    assert_eq!(per_key.remaining("d"), 1);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // The per-key limiter counts what went through it: "d", which it
    // admitted before the fleet refused, is not counted as admitted.
    let keyed = per_key.stats();
    assert_eq!((keyed.admitted, keyed.denied), (3, 1), "{keyed:?}");
    let stats = layer.stats();
    assert_eq!(
        stats.denied_by,
        vec![("key".to_string(), 1), ("fleet".to_string(), 1)]
    );
    assert_eq!(
        stats.unsettled, 0,
        "a layer that settles nothing leaves nothing unsettled"
    );
    assert_eq!(fleet.stats().failures, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_redis_limit_refusing_gives_back_the_earlier_ones_exactly() {
    let Some(server) = redis_server::server("limits_redis") else {
        return;
    };
    let con = connection(server.client());
    let per_key = exact("per_key", 5);
    let fleet = exact("fleet2", 2);
    let layer = Limits::builder()
        .redis_limit("key", api_key(), Arc::clone(&per_key), con.clone())
        .unwrap()
        .redis_limit("fleet", Global, Arc::clone(&fleet), con)
        .unwrap()
        .build()
        .unwrap();
    let service = layer.layer(inner(Arc::new(AtomicU64::new(0))));
    for left in [1, 0] {
        let r = service.clone().oneshot(with_key("x")).await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(
            ratelimit(&r),
            format!(r#""key";r={}, "fleet";r={left}"#, 3 + left)
        );
    }
    // The fleet refuses; the key's admission is refunded by its script:
    // it says 3 left, as before the request.
    let r = service.clone().oneshot(with_key("x")).await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(ratelimit(&r), r#""key";r=3, "fleet";r=0;t=3600"#);
    assert_eq!(per_key.stats().refunded, 1);
    // And Redis agrees: three more for "x" fit in its own limit.
    let mut plain = server.plain();
    for _ in 0..3 {
        assert!(
            per_key
                .limiter()
                .try_acquire(&mut plain, "x")
                .unwrap()
                .is_allowed()
        );
    }
    assert!(
        !per_key
            .limiter()
            .try_acquire(&mut plain, "x")
            .unwrap()
            .is_allowed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_settle_redis_limits_beside_the_response() {
    let Some(server) = redis_server::server("limits_redis") else {
        return;
    };
    let fleet = exact("settle", 3);
    let layer = Limits::builder()
        .redis_limit(
            "fleet",
            Global,
            Arc::clone(&fleet),
            connection(server.client()),
        )
        .unwrap()
        .refund_when(|parts| parts.status.is_server_error())
        .build()
        .unwrap();
    let service = layer.clone().layer(inner(Arc::new(AtomicU64::new(0))));
    // Ten upstream failures: each refunded, so the fleet still holds 3.
    for _ in 0..10 {
        let request = answered("k", "503");
        let r = service.clone().oneshot(request).await.unwrap();
        assert_eq!(r.status(), 503, "the upstream's own answer");
        // Each refund is a call made beside the response: wait for it
        // before the next request.
        let deadline = Instant::now() + Duration::from_secs(5);
        while fleet.stats().refunded + fleet.stats().refund_declined < layer.stats().admitted {
            assert!(Instant::now() < deadline, "the refund never ran");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    assert_eq!(layer.stats().refunded, 10);
    assert_eq!(layer.stats().unsettled, 0, "every response came");
    assert_eq!(fleet.stats().refund_declined, 0);
    for _ in 0..3 {
        assert_eq!(
            service
                .clone()
                .oneshot(with_key("k"))
                .await
                .unwrap()
                .status(),
            200
        );
    }
    assert_eq!(
        service
            .clone()
            .oneshot(with_key("k"))
            .await
            .unwrap()
            .status(),
        429
    );
}

/// An upstream's 429 to one client drains that client's Redis limit, never
/// the one every client shares (`Global`), nor advertises it as drained.
#[tokio::test]
async fn a_drain_spares_a_global_redis_limit() {
    let Some(server) = redis_server::server("limits_redis") else {
        return;
    };
    let fleet = exact("drain-fleet", 5);
    let per_key = exact("drain-key", 5);
    let layer = Limits::builder()
        .redis_limit(
            "fleet",
            Global,
            Arc::clone(&fleet),
            connection(server.client()),
        )
        .unwrap()
        .redis_limit(
            "key",
            api_key(),
            Arc::clone(&per_key),
            connection(server.client()),
        )
        .unwrap()
        .drain_when(|parts| parts.status == StatusCode::TOO_MANY_REQUESTS)
        .build()
        .unwrap();
    let service = layer.clone().layer(inner(Arc::new(AtomicU64::new(0))));
    let request = answered("mallory", "429");
    let r = service.clone().oneshot(request).await.unwrap();
    assert_eq!(r.status(), 429, "the upstream's own answer");
    let items = list(&r, "ratelimit");
    assert!(items.contains(&("fleet".to_owned(), 4)), "{items:?}");
    assert!(items.contains(&("key".to_owned(), 0)), "{items:?}");
    // The drain is a call made beside the response: wait for it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while layer.stats().drained < 4 {
        assert!(Instant::now() < deadline, "the drain never ran");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        layer.stats().drained,
        4,
        "the client's 4 left, not the fleet's"
    );
    let refused = service.clone().oneshot(with_key("mallory")).await.unwrap();
    assert_eq!(refused.status(), 429, "mallory's own allowance is empty");
    for who in ["alice", "bob", "carol"] {
        let r = service.clone().oneshot(with_key(who)).await.unwrap();
        assert_eq!(r.status(), 200, "{who} is not refused for mallory");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_limit_joins_a_combined_layer_too() {
    let Some(server) = redis_server::server("limits_redis") else {
        return;
    };
    let quota = Quota::new(4, 1, Duration::from_secs(3_600)).unwrap();
    let leased = Arc::new(
        LeasedBuilder::new(
            RedisLimiter::new("leased", TokenBucket::new(quota)).unwrap(),
            2,
        )
        .unwrap()
        .build()
        .unwrap(),
    );
    let layer = Limits::builder()
        .redis_limit("fleet", Global, leased, connection(server.client()))
        .unwrap()
        .build()
        .unwrap();
    let service = layer.clone().layer(inner(Arc::new(AtomicU64::new(0))));
    let mut admitted = 0;
    for _ in 0..10 {
        if service
            .clone()
            .oneshot(with_key("k"))
            .await
            .unwrap()
            .status()
            == 200
        {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 4, "the bucket's 4, leased two at a time");
    assert_eq!(layer.stats().too_many_requests, 6);
}

/// The items of the List field `name`, parsed: each item's name and its
/// `r` parameter (its `q`, in `RateLimit-Policy`).
fn list(response: &Response<String>, name: &str) -> Vec<(String, i64)> {
    fields::list(response.headers(), name)
        .into_iter()
        .map(|(item, params)| {
            let value = params.get("r").or(params.get("q")).copied();
            (item, value.unwrap_or(-1))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_limits_append_their_items_stacked_or_combined() {
    use turnstile::redis::RedisRateLimitLayer;
    use turnstile::tower::RateLimitLayer;
    use turnstile::{Gate, RateLimiter};

    let Some(server) = redis_server::server("limits_redis") else {
        return;
    };
    let quota = Quota::new(3, 1, Duration::from_secs(3_600)).unwrap();
    let fleet = Guarded::<TokenBucket>::new(
        RedisLimiter::new("stacked", TokenBucket::new(quota)).unwrap(),
        OnFailure::Deny,
        Duration::from_secs(1),
    );
    // A Redis layer inside an in-process one: both items, the inner first.
    let inner_layer = RedisRateLimitLayer::new(fleet, connection(server.client()), Global)
        .with_derived_policy("fleet")
        .unwrap();
    let edge = RateLimitLayer::new(
        Gate::new(RateLimiter::new(Quota::per_hour(100).unwrap()))
            .with_derived_policy("edge")
            .unwrap(),
        Global,
    );
    let service = edge.layer(inner_layer.layer(inner(Arc::new(AtomicU64::new(0)))));
    let r = service.clone().oneshot(with_key("k")).await.unwrap();
    assert_eq!(
        list(&r, "ratelimit"),
        [("fleet".into(), 2), ("edge".into(), 99)]
    );
    assert_eq!(
        list(&r, "ratelimit-policy"),
        [("fleet".into(), 3), ("edge".into(), 100)]
    );

    // The same limit in a combined layer, beside an in-process one.
    let layer = Limits::builder()
        .limit(
            "edge",
            Global,
            RateLimiter::new(Quota::per_hour(100).unwrap()),
        )
        .unwrap()
        .redis_limit(
            "fleet",
            Global,
            exact("combined", 3),
            connection(server.client()),
        )
        .unwrap()
        .build()
        .unwrap();
    let service = layer.layer(inner(Arc::new(AtomicU64::new(0))));
    for left in [2, 1, 0] {
        let r = service.clone().oneshot(with_key("k")).await.unwrap();
        assert_eq!(
            list(&r, "ratelimit"),
            [("edge".into(), 97 + left), ("fleet".into(), left)]
        );
    }
    let refused = service.clone().oneshot(with_key("k")).await.unwrap();
    assert_eq!(refused.status(), 429);
    // The edge limit's permit went back: it still says 97.
    assert_eq!(
        list(&refused, "ratelimit"),
        [("edge".into(), 97), ("fleet".into(), 0)]
    );
}

/// A request dropped while its Redis limit decides (a timeout around the
/// service, a client gone) never reaches the service: its in-process
/// admissions are given back, as a refusal would give them back. They were
/// kept: a Redis stall behind a timeout spent every key's allowance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_while_redis_decides_gives_its_in_process_permits_back() {
    let Some(server) = redis_server::server("limits_redis") else {
        return;
    };
    let per_key = Arc::new(
        KeyedLimiter::<String>::builder(Quota::new(1, 1, Duration::from_secs(3_600)).unwrap())
            .clock(ManualClock::new())
            .build()
            .unwrap(),
    );
    let layer = Limits::builder()
        .limit_shared("key", api_key(), Arc::clone(&per_key))
        .unwrap()
        .redis_limit(
            "fleet",
            Global,
            exact("dropped", 100),
            connection(server.client()),
        )
        .unwrap()
        .build()
        .unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let service = layer.layer(inner(Arc::clone(&calls)));
    // Connected and the script loaded before Redis is held.
    let first = service.clone().oneshot(with_key("warm")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);

    let paused = server.pause(Duration::from_millis(600));
    let abandoned = tokio::time::timeout(
        Duration::from_millis(200),
        service.clone().oneshot(with_key("z")),
    )
    .await;
    assert!(
        abandoned.is_err(),
        "the request waits for Redis: {abandoned:?}"
    );
    assert_eq!(per_key.remaining("z"), 1, "the key's one permit is back");
    paused.wait();
    let r = service.clone().oneshot(with_key("z")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "{:?}", r.headers());
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the dropped request never ran"
    );
    // Nor is it counted as admitted by the key's limiter.
    let keyed = per_key.stats();
    assert_eq!((keyed.admitted, keyed.denied), (2, 0), "{keyed:?}");
}

/// A Redis limit refuses after an in-process limit admitted, and that
/// admission's give-back declines (its word changed during the round trip):
/// the in-process limit now refuses too, and the answer's wait is never
/// shorter than its. It was the Redis limit's alone: a client told to come
/// back in a minute was refused for an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wait_after_a_redis_refusal_covers_an_in_process_permit_kept_spent() {
    use turnstile::RateLimiter;

    let Some(server) = redis_server::server("limits_redis") else {
        return;
    };
    // Three at once, one more an hour.
    let global = Arc::new(RateLimiter::new(
        Quota::new(3, 1, Duration::from_secs(3_600)).unwrap(),
    ));
    // One at once, one more a minute.
    let fleet = Arc::new(Guarded::<TokenBucket>::new(
        RedisLimiter::new(
            "kept",
            TokenBucket::new(Quota::new(1, 1, Duration::from_secs(60)).unwrap()),
        )
        .unwrap(),
        OnFailure::Deny,
        Duration::from_secs(1),
    ));
    let layer = Limits::builder()
        .limit_shared("all", Global, Arc::clone(&global))
        .unwrap()
        .redis_limit("fleet", Global, fleet, connection(server.client()))
        .unwrap()
        .build()
        .unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let service = layer.layer(inner(Arc::clone(&calls)));
    let first = service.clone().oneshot(with_key("a")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(global.remaining(), 2);

    let paused = server.pause(Duration::from_millis(400));
    let refused = tokio::spawn(service.clone().oneshot(with_key("b")));
    // The request took the global limit's permit and waits for Redis;
    // another decision changes the word meanwhile.
    let began = Instant::now();
    while global.remaining() != 1 {
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "the request never took its permit"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(global.try_acquire().is_allowed());
    paused.wait();
    let r = refused.await.unwrap().unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(global.remaining(), 0, "the give-back declined");
    let retry_after: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        retry_after > 3_000,
        "the global limit refuses for about an hour, told {retry_after} s"
    );
}

/// A limit in Redis that refuses advertises its own wait as its `t`, while
/// `Retry-After` covers the longest: here an in-process limit whose
/// give-back declined (another request took its last permit during the
/// round trip) waits an hour, and the Redis limit under a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_redis_limit_advertises_its_own_wait() {
    let Some(server) = redis_server::server("limits_redis") else {
        return;
    };
    // Redis: 1 at once, one more a second.
    let fleet = Arc::new(Guarded::<TokenBucket>::new(
        RedisLimiter::new(
            "own-wait",
            TokenBucket::new(Quota::new(1, 1, Duration::from_secs(1)).unwrap()),
        )
        .unwrap(),
        OnFailure::Deny,
        Duration::from_secs(1),
    ));
    // In process: 3 at once, one more an hour.
    let clock = ManualClock::new();
    let global = Arc::new(turnstile::RateLimiter::with_clock(
        Quota::new(3, 1, Duration::from_secs(3_600)).unwrap(),
        clock.clone(),
    ));
    let layer = Limits::builder()
        .limit_shared("all", Global, Arc::clone(&global))
        .unwrap()
        .redis_limit(
            "fleet",
            Global,
            Arc::clone(&fleet),
            connection(server.client()),
        )
        .unwrap()
        .build()
        .unwrap();
    let mut service = layer.layer(inner(Arc::new(AtomicU64::new(0))));
    // `all` 3 -> 2, `fleet` 1 -> 0.
    let first = service
        .ready()
        .await
        .unwrap()
        .call(with_key("a"))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    // The next: `all` 2 -> 1 in `call` (the in-process limits decide
    // there; the Redis phase runs when the future is polled); before Redis
    // answers, another request takes `all`'s last permit; Redis refuses;
    // `all`'s give-back declines.
    service.ready().await.unwrap();
    let future = service.call(with_key("a"));
    assert_eq!(global.remaining(), 1, "the in-process take, in `call`");
    assert!(global.try_acquire().is_allowed(), "the other request");
    let denied = future.await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["retry-after"], "3600");
    let items = fields::list(denied.headers(), "ratelimit");
    assert_eq!(fields::param(&items, "all", "t"), Some(3_600));
    assert_eq!(
        fields::param(&items, "fleet", "t"),
        Some(1),
        "the Redis limit's own wait is under a second"
    );
}

/// Script calls Redis has run so far (`EVAL` and `EVALSHA`, from `INFO
/// commandstats`).
fn script_calls(client: &Client) -> u64 {
    let mut con = client.get_connection().unwrap();
    let commands: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut con)
        .unwrap();
    commands
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .map(|l| {
            l.split_once("calls=")
                .and_then(|(_, rest)| rest.split(',').next())
                .and_then(|calls| calls.parse::<u64>().ok())
                .expect("a calls count")
        })
        .sum()
}

/// A real cost below the charge taken up front is settled in a limit in
/// Redis by one call, which gives back only the permits not used (exact or
/// declined): nothing is given back that another replica could take before
/// the real cost is charged, so nothing of it is forgiven, and the charge
/// is never taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_smaller_real_cost_in_redis_gives_back_the_unused_permits_in_one_call() {
    let Some(server) = redis_server::server("limits_redis") else {
        return;
    };
    let fleet = exact("smaller", 10);
    let layer = Limits::builder()
        .redis_limit(
            "fleet",
            Global,
            Arc::clone(&fleet),
            connection(server.client()),
        )
        .unwrap()
        .cost(5)
        .cost_from_response(|parts| {
            parts
                .headers
                .get("x-tokens-used")?
                .to_str()
                .ok()?
                .parse()
                .ok()
        })
        .build()
        .unwrap();
    // Answers with the cost the request names in `x-cost`.
    let service = layer
        .clone()
        .layer(service_fn(|request: Request<()>| async move {
            let mut response = Response::new(String::new());
            if let Some(cost) = request.headers().get("x-cost") {
                response.headers_mut().insert("x-tokens-used", cost.clone());
            }
            Ok::<_, Infallible>(response)
        }));
    let costing = |cost: u32| {
        let mut request = with_key("k");
        request
            .headers_mut()
            .insert("x-cost", cost.to_string().parse().unwrap());
        request
    };
    let settled = |n: u64| {
        let layer = layer.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(5);
            while layer.stats().refunded + layer.stats().refund_declined < n {
                assert!(Instant::now() < deadline, "the settlement never ran");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    // The first request loads both scripts (the take's and the refund's).
    let r = service.clone().oneshot(costing(2)).await.unwrap();
    assert_eq!(r.status(), 200);
    settled(1).await;
    let before = script_calls(&server.client());
    let r = service.clone().oneshot(costing(2)).await.unwrap();
    assert_eq!(r.status(), 200);
    settled(2).await;
    assert_eq!(
        script_calls(&server.client()) - before,
        2,
        "the take, then one call giving back 3 of its 5"
    );
    let stats = layer.stats();
    assert_eq!((stats.refunded, stats.refund_declined), (2, 0), "{stats:?}");
    assert_eq!((stats.charged, stats.forgiven), (0, 0), "{stats:?}");
    // 10 - 2 - 2: 6 left, so one more charge of 5 is admitted (its real
    // cost all of it) and the next refused.
    assert_eq!(
        service.clone().oneshot(costing(5)).await.unwrap().status(),
        200
    );
    assert_eq!(
        service.clone().oneshot(costing(5)).await.unwrap().status(),
        429
    );
}

/// A limit in Redis that admitted a request a later one refused, and whose
/// permit could not be given back (another replica spent its key while the
/// request waited on the later limit, so the refund declined), is asked
/// what the same request would get now: its wait is in the 429's, and its
/// item tells it. The answer said `Retry-After: 2` (the later limit's) and
/// `"key";r=1`, and a client that waited 2 s was refused again for an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_redis_limit_kept_spent_is_in_the_wait() {
    let Some(a) = redis_server::server("limits_redis") else {
        return;
    };
    let Some(b) = redis_server::server("limits_redis") else {
        return;
    };
    let hour = Duration::from_secs(3_600);
    let per_key = Arc::new(Guarded::<TokenBucket>::new(
        RedisLimiter::new("key", TokenBucket::new(Quota::new(2, 1, hour).unwrap())).unwrap(),
        OnFailure::Deny,
        Duration::from_secs(1),
    ));
    let fleet = Arc::new(Guarded::<TokenBucket>::new(
        RedisLimiter::new(
            "fleet",
            TokenBucket::new(Quota::new(1, 1, Duration::from_secs(2)).unwrap()),
        )
        .unwrap(),
        OnFailure::Deny,
        Duration::from_secs(1),
    ));
    let layer = Limits::builder()
        .redis_limit(
            "key",
            api_key(),
            Arc::clone(&per_key),
            connection(a.client()),
        )
        .unwrap()
        .redis_limit("fleet", Global, Arc::clone(&fleet), connection(b.client()))
        .unwrap()
        .build()
        .unwrap();
    let service = layer.clone().layer(inner(Arc::new(AtomicU64::new(0))));
    // The fleet's one permit is spent.
    assert_eq!(
        service
            .clone()
            .oneshot(with_key("w"))
            .await
            .unwrap()
            .status(),
        200
    );
    let mut plain_a = a.plain();
    let holds = |con: &mut redis::Connection| -> bool {
        per_key.limiter().peek_n(con, "x", 2).unwrap().is_allowed()
    };
    // The fleet's Redis hangs while "x" waits on it, after "key" admitted.
    b.stop();
    let request = tokio::spawn(service.clone().oneshot(with_key("x")));
    let deadline = Instant::now() + Duration::from_secs(2);
    while holds(&mut plain_a) {
        assert!(
            Instant::now() < deadline,
            "the key's admission was not seen"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Another replica spends the key's last permit meanwhile.
    assert!(
        per_key
            .limiter()
            .try_acquire(&mut plain_a, "x")
            .unwrap()
            .is_allowed()
    );
    b.resume();
    let denied = request.await.unwrap().unwrap();
    assert_eq!(denied.status(), 429);
    assert_eq!(per_key.stats().refund_declined, 1);
    let told: u64 = denied.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(told > 3_000, "Retry-After: {told}");
    let fields = ratelimit(&denied);
    assert!(fields.starts_with("\"key\";r=0;t="), "{fields}");
}

/// A request dropped while its second limit in Redis decides gives the
/// first one's permit back too (it was kept spent, uncounted; the
/// in-process permits already went back), by a task of its own, counted as
/// a refund.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_while_a_later_redis_limit_decides_gives_the_earlier_one_back() {
    let Some(a) = redis_server::server("limits_redis") else {
        return;
    };
    let Some(b) = redis_server::server("limits_redis") else {
        return;
    };
    let per_key = exact("key3", 5);
    let layer = Limits::builder()
        .redis_limit(
            "key",
            api_key(),
            Arc::clone(&per_key),
            connection(a.client()),
        )
        .unwrap()
        .redis_limit(
            "fleet",
            Global,
            exact("fleet3", 100),
            connection(b.client()),
        )
        .unwrap()
        .build()
        .unwrap();
    let service = layer.clone().layer(inner(Arc::new(AtomicU64::new(0))));
    // Connected and the scripts loaded before the fleet's Redis hangs.
    assert_eq!(
        service
            .clone()
            .oneshot(with_key("w"))
            .await
            .unwrap()
            .status(),
        200
    );
    let mut plain_a = a.plain();
    b.stop();
    let abandoned = tokio::time::timeout(
        Duration::from_millis(300),
        service.clone().oneshot(with_key("z")),
    )
    .await;
    assert!(abandoned.is_err(), "the request waits for the fleet");
    let deadline = Instant::now() + Duration::from_secs(2);
    while layer.stats().refunded == 0 {
        assert!(Instant::now() < deadline, "{:?}", layer.stats());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    b.resume();
    // All 5 of the key's permits are there again.
    assert!(
        per_key
            .limiter()
            .peek_n(&mut plain_a, "z", 5)
            .unwrap()
            .is_allowed()
    );
}

/// A request dropped while a refusal is giving the earlier Redis limits'
/// permits back: those not yet given back are given back by the guard (the
/// give-back loop had taken them all out of it first, and they stayed spent
/// for an hour, uncounted). Three Redis servers: the fleet (the third) has
/// no permit left, and the second limit's server hangs during its refund.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_during_a_refusals_give_back_gives_the_rest_back() {
    let Some(a) = redis_server::server("limits_redis") else {
        return;
    };
    let Some(b) = redis_server::server("limits_redis") else {
        return;
    };
    let Some(c) = redis_server::server("limits_redis") else {
        return;
    };
    let one = exact("rk1", 5);
    let two = exact("rk2", 5);
    let layer = Limits::builder()
        .redis_limit("one", api_key(), Arc::clone(&one), connection(a.client()))
        .unwrap()
        .redis_limit("two", api_key(), Arc::clone(&two), connection(b.client()))
        .unwrap()
        .redis_limit("fleet", Global, exact("rfleet", 1), connection(c.client()))
        .unwrap()
        .build()
        .unwrap();
    let service = layer.clone().layer(inner(Arc::new(AtomicU64::new(0))));
    // The fleet's one permit is spent.
    assert_eq!(
        service
            .clone()
            .oneshot(with_key("w"))
            .await
            .unwrap()
            .status(),
        200
    );
    let (mut pa, mut pb) = (a.plain(), b.plain());
    c.stop();
    let request = tokio::spawn(service.clone().oneshot(with_key("x")));
    let deadline = Instant::now() + Duration::from_secs(2);
    while one.limiter().peek_n(&mut pa, "x", 5).unwrap().is_allowed()
        || two.limiter().peek_n(&mut pb, "x", 5).unwrap().is_allowed()
    {
        assert!(Instant::now() < deadline, "both limits admit first");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // The fleet refuses; the second limit's refund hangs; the request goes.
    b.stop();
    c.resume();
    tokio::time::sleep(Duration::from_millis(300)).await;
    request.abort();
    assert!(request.await.is_err(), "dropped while giving back");
    b.resume();
    let deadline = Instant::now() + Duration::from_secs(3);
    while !one.limiter().peek_n(&mut pa, "x", 5).unwrap().is_allowed() {
        assert!(
            Instant::now() < deadline,
            "the first limit's permit was never given back: {:?}",
            layer.stats()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(layer.stats().refunded >= 1, "{:?}", layer.stats());
}

/// A request's future dropped outside a runtime while a later Redis limit
/// decides: no call can give the earlier admission back, and it is counted
/// as a refund declined (it was silent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_outside_a_runtime_counts_its_redis_permits_declined() {
    let Some(a) = redis_server::server("limits_redis") else {
        return;
    };
    let Some(b) = redis_server::server("limits_redis") else {
        return;
    };
    let layer = Limits::builder()
        .redis_limit("one", api_key(), exact("ro1", 5), connection(a.client()))
        .unwrap()
        .redis_limit(
            "fleet",
            Global,
            exact("rofleet", 100),
            connection(b.client()),
        )
        .unwrap()
        .build()
        .unwrap();
    let service = layer.clone().layer(inner(Arc::new(AtomicU64::new(0))));
    assert_eq!(
        service
            .clone()
            .oneshot(with_key("w"))
            .await
            .unwrap()
            .status(),
        200
    );
    b.stop();
    let mut pending = Box::pin(service.clone().oneshot(with_key("z")));
    tokio::select! {
        _ = &mut pending => panic!("answered while the fleet's Redis hangs"),
        _ = tokio::time::sleep(Duration::from_millis(300)) => {}
    }
    std::thread::spawn(move || drop(pending)).join().unwrap();
    b.resume();
    assert_eq!(layer.stats().refund_declined, 1, "{:?}", layer.stats());
}

/// A fixed window's refund takes its permits out of a count that later
/// admissions are in too, so after a refusal by a later Redis limit the
/// earlier window's item tells what its key holds then, asked, not what its
/// admission left plus the permits given back: another request that took
/// two permits while the fleet decided made `"key";r=4` of a key with 2
/// left, more than the limit would admit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_given_back_after_other_admissions_advertises_what_it_holds() {
    let Some(a) = redis_server::server("limits_redis") else {
        return;
    };
    let Some(b) = redis_server::server("limits_redis") else {
        return;
    };
    let window = turnstile::FixedWindow::new(5, Duration::from_secs(3_600)).unwrap();
    let per_key = Arc::new(Guarded::<turnstile::FixedWindow>::new(
        RedisLimiter::new("key4", window).unwrap(),
        OnFailure::Deny,
        Duration::from_secs(1),
    ));
    let layer = Limits::builder()
        .redis_limit(
            "key",
            api_key(),
            Arc::clone(&per_key),
            connection(a.client()),
        )
        .unwrap()
        .redis_limit("fleet", Global, exact("fleet4", 1), connection(b.client()))
        .unwrap()
        .build()
        .unwrap();
    let service = layer.clone().layer(inner(Arc::new(AtomicU64::new(0))));
    // The fleet's one permit: connected, scripts loaded, nothing left.
    let first = service.clone().oneshot(with_key("z")).await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(ratelimit(&first), r#""key";r=4, "fleet";r=0"#);
    // The fleet's Redis hangs while a request is decided: the key's window
    // has admitted it (3 left), and another client takes two meanwhile.
    b.stop();
    let request = tokio::spawn(service.clone().oneshot(with_key("z")));
    let mut plain_a = a.plain();
    let deadline = Instant::now() + Duration::from_secs(2);
    while per_key
        .limiter()
        .peek_n(&mut plain_a, "z", 4)
        .unwrap()
        .is_allowed()
    {
        assert!(
            Instant::now() < deadline,
            "the request never reached the key"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        per_key
            .limiter()
            .try_acquire_n(&mut plain_a, "z", 2)
            .unwrap()
            .is_allowed()
    );
    b.resume();
    let refused = request.await.unwrap().unwrap();
    assert_eq!(refused.status(), 429);
    // Given back: 5 less the first request's one and the other client's two.
    assert_eq!(per_key.stats().refunded, 1);
    assert!(
        ratelimit(&refused).starts_with(r#""key";r=2, "fleet";r=0;t="#),
        "{}",
        ratelimit(&refused)
    );
    assert!(
        per_key
            .limiter()
            .peek_n(&mut plain_a, "z", 2)
            .unwrap()
            .is_allowed()
    );
    assert!(
        !per_key
            .limiter()
            .peek_n(&mut plain_a, "z", 3)
            .unwrap()
            .is_allowed()
    );
}
