//! Several limits on one request: the combined layer (`Limits`), stacked
//! layers and tiers, their `RateLimit` fields parsed as the structured-field
//! Lists they are, and requests priced by their responses.

use std::collections::BTreeMap;

#[allow(dead_code)]
#[path = "support/fields.rs"]
mod fields;

use fields::{list, names, param};
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;
use http::{Request, Response, StatusCode};
use proptest::prelude::*;
use tower::{Layer, Service, ServiceExt, service_fn};
use turnstile::tower::{
    ApiKeyHeader, Global, Limits, LimitsBuilder, LimitsError, PeerIp, RateLimitLayer,
};
use turnstile::{Gate, KeyedLimiter, ManualClock, Quota, RateLimiter, Tiered};

fn request(key: Option<&str>, peer: &str) -> Request<()> {
    let mut builder = Request::builder();
    if let Some(key) = key {
        builder = builder.header("x-api-key", key);
    }
    let mut request = builder.body(()).unwrap();
    request
        .extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    request
}

/// A request the test service answers with `status` (see [`echo`]).
fn answered(key: &str, peer: &str, status: &str) -> Request<()> {
    let mut r = request(Some(key), peer);
    r.headers_mut().insert("x-answer", status.parse().unwrap());
    r
}

fn api_key() -> ApiKeyHeader {
    ApiKeyHeader::new(HeaderName::from_static("x-api-key"))
}

/// A service answering 200, or the status and header a request asks for in
/// `x-answer` / `x-cost`.
fn echo() -> impl Service<
    Request<()>,
    Response = Response<String>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<String>, Infallible>> + Send,
> + Clone {
    service_fn(|request: Request<()>| async move {
        let mut response = Response::new(String::new());
        if let Some(status) = request.headers().get("x-answer") {
            *response.status_mut() = StatusCode::from_bytes(status.as_bytes()).expect("a status");
        }
        if let Some(cost) = request.headers().get("x-cost") {
            response.headers_mut().insert("x-tokens-used", cost.clone());
        }
        Ok(response)
    })
}

/// The cost a response reports (`echo` copies a request's `x-cost` there).
fn tokens_used(parts: &http::response::Parts) -> Option<u32> {
    parts
        .headers
        .get("x-tokens-used")?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

async fn send<S>(service: &mut S, request: Request<()>) -> Response<String>
where
    S: Service<Request<()>, Response = Response<String>, Error = Infallible>,
{
    service.ready().await.unwrap().call(request).await.unwrap()
}

struct Three {
    clock: ManualClock,
    per_key: Arc<KeyedLimiter<String, turnstile::TokenBucket, ManualClock>>,
    per_ip: Arc<KeyedLimiter<IpAddr, turnstile::TokenBucket, ManualClock>>,
    global: Arc<RateLimiter<turnstile::TokenBucket, ManualClock>>,
}

fn three(key: u32, ip: u32, global: u32) -> Three {
    let clock = ManualClock::new();
    let quota = |n: u32| Quota::new(n, 1, Duration::from_secs(1)).unwrap();
    Three {
        per_key: Arc::new(
            KeyedLimiter::builder(quota(key))
                .clock(clock.clone())
                .build()
                .unwrap(),
        ),
        per_ip: Arc::new(
            KeyedLimiter::builder(quota(ip))
                .clock(clock.clone())
                .build()
                .unwrap(),
        ),
        global: Arc::new(RateLimiter::with_clock(quota(global), clock.clone())),
        clock,
    }
}

impl Three {
    fn layer(&self) -> Limits {
        self.builder().build().unwrap()
    }

    fn builder(&self) -> LimitsBuilder {
        Limits::builder()
            .limit_shared("key", api_key(), Arc::clone(&self.per_key))
            .unwrap()
            .limit_shared("ip", PeerIp::new(), Arc::clone(&self.per_ip))
            .unwrap()
            .limit_shared("all", Global, Arc::clone(&self.global))
            .unwrap()
    }

    fn state(&self, key: &str, ip: &str) -> (u32, u32, u32) {
        (
            self.per_key.remaining(key),
            self.per_ip.remaining(&ip.parse::<IpAddr>().unwrap()),
            self.global.remaining(),
        )
    }
}

#[tokio::test]
async fn a_denial_by_a_later_limit_spends_nothing_in_the_earlier_ones() {
    let t = three(5, 2, 100);
    let layer = t.layer();
    let mut service = layer.clone().layer(echo());
    assert_eq!(
        send(&mut service, request(Some("a"), "10.0.0.1:1"))
            .await
            .status(),
        200
    );
    assert_eq!(
        send(&mut service, request(Some("b"), "10.0.0.1:1"))
            .await
            .status(),
        200
    );
    assert_eq!(t.state("c", "10.0.0.1"), (5, 0, 98));
    // The per-IP limit refuses "c": its key and the global limit keep their permits.
    let denied = send(&mut service, request(Some("c"), "10.0.0.1:1")).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["retry-after"], "1");
    assert_eq!(t.state("c", "10.0.0.1"), (5, 0, 98));
    let stats = layer.stats();
    assert_eq!(
        stats.denied_by,
        vec![("key".into(), 0), ("ip".into(), 1), ("all".into(), 0)]
    );
    assert_eq!((stats.admitted, stats.too_many_requests), (2, 1));
    // Each limiter counts what went through it, and the refusal only where
    // it was made: "c" was given back by the per-key limit, not admitted.
    let (per_key, per_ip) = (t.per_key.stats(), t.per_ip.stats());
    assert_eq!((per_key.admitted, per_key.denied), (2, 0), "{per_key:?}");
    assert_eq!((per_ip.admitted, per_ip.denied), (2, 1), "{per_ip:?}");
}

/// A tier of a [`Tiered`] limit counts as a keyed limiter does: a request a
/// later limit refused is not counted as admitted in the tier.
#[tokio::test]
async fn a_tier_counts_only_requests_every_limit_admitted() {
    let tiered = Arc::new(tiers());
    let global =
        Arc::new(RateLimiter::new(Quota::new(1, 1, Duration::from_secs(3_600)).unwrap()).counted());
    let layer = Limits::builder()
        .limit_shared("api", api_key(), Arc::clone(&tiered))
        .unwrap()
        .limit_shared("all", Global, Arc::clone(&global))
        .unwrap()
        .build()
        .unwrap();
    let mut service = layer.clone().layer(echo());
    for status in [200, 429, 429] {
        let response = send(&mut service, request(Some("paid_1"), "10.0.0.1:1")).await;
        assert_eq!(response.status(), status);
    }
    let paid = tiered.tier(1).unwrap().stats();
    assert_eq!((paid.admitted, paid.denied), (1, 0), "{paid:?}");
    let all = global.stats();
    assert_eq!((all.admitted, all.denied), (1, 2), "{all:?}");
}

#[tokio::test]
async fn a_missing_key_is_a_401_that_spends_nothing() {
    let t = three(5, 5, 5);
    let mut service = t.layer().layer(echo());
    let before = t.state("a", "10.0.0.1");
    let denied = send(&mut service, request(None, "10.0.0.1:1")).await;
    assert_eq!(denied.status(), StatusCode::UNAUTHORIZED);
    assert!(denied.headers().contains_key("www-authenticate"));
    assert!(!denied.headers().contains_key("ratelimit"));
    assert_eq!(t.state("a", "10.0.0.1"), before);
    // No peer address: the server's fault, a 500, nothing spent either.
    let mut no_peer = Request::builder()
        .header("x-api-key", "a")
        .body(())
        .unwrap();
    no_peer.extensions_mut().clear();
    assert_eq!(send(&mut service, no_peer).await.status(), 500);
    assert_eq!(t.state("a", "10.0.0.1"), before);
    assert_eq!(t.global.remaining(), 5);
}

#[tokio::test]
async fn a_denial_tells_the_longest_wait_of_the_limits_that_refuse() {
    let clock = ManualClock::new();
    let per_key =
        KeyedLimiter::<String, _, _>::builder(Quota::new(1, 1, Duration::from_secs(3)).unwrap())
            .clock(clock.clone())
            .build()
            .unwrap();
    let global = RateLimiter::with_clock(Quota::new(1, 1, Duration::from_secs(10)).unwrap(), clock);
    let layer = Limits::builder()
        .limit("key", api_key(), per_key)
        .unwrap()
        .limit("all", Global, global)
        .unwrap()
        .build()
        .unwrap();
    let mut service = layer.layer(echo());
    assert_eq!(
        send(&mut service, request(Some("a"), "10.0.0.1:1"))
            .await
            .status(),
        200
    );
    // "a" is refused by its key (3 s) and would be by the global limit (10 s).
    let denied = send(&mut service, request(Some("a"), "10.0.0.1:1")).await;
    assert_eq!(denied.headers()["retry-after"], "10");
    let value = list(denied.headers(), "ratelimit");
    assert_eq!(names(&value), ["key", "all"]);
    assert_eq!(param(&value, "key", "t"), Some(3));
    assert_eq!(param(&value, "all", "t"), Some(10));
    // "b": its key admits, the global limit refuses; b's permit goes back.
    let denied = send(&mut service, request(Some("b"), "10.0.0.1:1")).await;
    assert_eq!(denied.headers()["retry-after"], "10");
    let value = list(denied.headers(), "ratelimit");
    assert_eq!(
        param(&value, "key", "r"),
        Some(1),
        "b's own limit is untouched"
    );
    assert_eq!(param(&value, "all", "r"), Some(0));
}

#[tokio::test]
async fn a_combined_layer_advertises_one_item_per_limit_with_its_own_remaining() {
    let t = three(5, 50, 1000);
    let mut service = t.layer().layer(echo());
    let admitted = send(&mut service, request(Some("a"), "10.0.0.1:1")).await;
    let policy = list(admitted.headers(), "ratelimit-policy");
    let value = list(admitted.headers(), "ratelimit");
    assert_eq!(names(&policy), ["key", "ip", "all"]);
    assert_eq!(names(&value), ["key", "ip", "all"]);
    assert_eq!(param(&policy, "key", "q"), Some(5));
    assert_eq!(param(&policy, "key", "w"), Some(5));
    assert_eq!(param(&policy, "all", "q"), Some(1000));
    assert_eq!(param(&value, "key", "r"), Some(4));
    assert_eq!(param(&value, "ip", "r"), Some(49));
    assert_eq!(param(&value, "all", "r"), Some(999));
    for (name, params) in &value {
        assert!(
            params["r"] <= param(&policy, name, "q").unwrap(),
            "{name}: r above q"
        );
    }
    t.clock.advance(Duration::from_secs(10));
}

#[tokio::test]
async fn stacked_layers_append_their_items_instead_of_overwriting() {
    // The per-key layer inside, a global one outside: a 429 from the inner
    // one carries both items, and the inner one says r=0.
    let inner = RateLimitLayer::new(
        Gate::new(KeyedLimiter::<String>::new(Quota::per_hour(1).unwrap()))
            .with_derived_policy("api")
            .unwrap(),
        api_key(),
    );
    let outer = RateLimitLayer::new(
        Gate::new(RateLimiter::new(Quota::per_second(1000).unwrap()))
            .with_derived_policy("global")
            .unwrap(),
        Global,
    );
    let mut service = outer.layer(inner.layer(echo()));
    let admitted = send(&mut service, request(Some("a"), "10.0.0.1:1")).await;
    assert_eq!(
        names(&list(admitted.headers(), "ratelimit")),
        ["api", "global"]
    );
    assert_eq!(
        names(&list(admitted.headers(), "ratelimit-policy")),
        ["api", "global"]
    );
    let denied = send(&mut service, request(Some("a"), "10.0.0.1:1")).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let value = list(denied.headers(), "ratelimit");
    assert_eq!(names(&value), ["api", "global"]);
    assert_eq!(param(&value, "api", "r"), Some(0));
    assert_eq!(param(&value, "api", "t"), Some(3600));
    assert_eq!(
        denied.headers().get_all("ratelimit").iter().count(),
        1,
        "one line"
    );
    // A combined layer outside a stacked one appends too.
    let combined = Limits::builder()
        .limit(
            "edge",
            Global,
            RateLimiter::new(Quota::per_second(10).unwrap()),
        )
        .unwrap()
        .build()
        .unwrap();
    let inner = RateLimitLayer::new(
        Gate::new(KeyedLimiter::<String>::new(Quota::per_hour(5).unwrap()))
            .with_derived_policy("api")
            .unwrap(),
        api_key(),
    );
    let mut service = combined.layer(inner.layer(echo()));
    let admitted = send(&mut service, request(Some("a"), "10.0.0.1:1")).await;
    assert_eq!(
        names(&list(admitted.headers(), "ratelimit")),
        ["api", "edge"]
    );
}

fn tiers() -> Tiered<String, impl Fn(&str) -> usize + Send + Sync + 'static> {
    Tiered::new(
        [
            (
                "free",
                KeyedLimiter::<String>::new(Quota::per_second(10).unwrap()),
            ),
            (
                "paid",
                KeyedLimiter::<String>::new(Quota::per_second(100).unwrap()),
            ),
        ],
        |key: &str| usize::from(key.starts_with("paid_")),
    )
    .unwrap()
}

#[tokio::test]
async fn tiers_advertise_the_keys_own_tier() {
    let layer = RateLimitLayer::new(
        Gate::tiered(tiers()).with_derived_policy("api").unwrap(),
        api_key(),
    );
    let mut service = layer.layer(echo());
    let paid = send(&mut service, request(Some("paid_1"), "10.0.0.1:1")).await;
    let (policy, value) = (
        list(paid.headers(), "ratelimit-policy"),
        list(paid.headers(), "ratelimit"),
    );
    assert_eq!(names(&policy), ["api.paid"]);
    assert_eq!(param(&policy, "api.paid", "q"), Some(100));
    assert_eq!(param(&value, "api.paid", "r"), Some(99));
    let free = send(&mut service, request(Some("free_1"), "10.0.0.1:1")).await;
    let (policy, value) = (
        list(free.headers(), "ratelimit-policy"),
        list(free.headers(), "ratelimit"),
    );
    assert_eq!(param(&policy, "api.free", "q"), Some(10));
    assert_eq!(param(&value, "api.free", "r"), Some(9));
    // The same in a combined layer.
    let layer = Limits::builder()
        .limit("api", api_key(), tiers())
        .unwrap()
        .limit(
            "all",
            Global,
            RateLimiter::new(Quota::per_second(1000).unwrap()),
        )
        .unwrap()
        .build()
        .unwrap();
    let mut service = layer.layer(echo());
    let paid = send(&mut service, request(Some("paid_1"), "10.0.0.1:1")).await;
    let (policy, value) = (
        list(paid.headers(), "ratelimit-policy"),
        list(paid.headers(), "ratelimit"),
    );
    assert_eq!(names(&policy), ["api.paid", "all"]);
    assert_eq!(param(&value, "api.paid", "r"), Some(99));
    assert!(param(&value, "api.paid", "r") <= param(&policy, "api.paid", "q"));
}

/// Tiers whose tier function counts its calls: `paid_` keys are paid.
fn counted_tiers(
    calls: Arc<std::sync::atomic::AtomicUsize>,
) -> Tiered<String, impl Fn(&str) -> usize + Send + Sync + 'static> {
    Tiered::new(
        [
            (
                "free",
                KeyedLimiter::<String>::new(Quota::per_second(10).unwrap()),
            ),
            (
                "paid",
                KeyedLimiter::<String>::new(Quota::per_second(100).unwrap()),
            ),
        ],
        move |key: &str| {
            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            usize::from(key.starts_with("paid_"))
        },
    )
    .unwrap()
}

/// Sends a paid, a free and a paid request through `service`: each admitted,
/// with one call of the tier function, and advertising its own tier first,
/// then `others`.
async fn one_tier_call_each<S>(
    service: &mut S,
    calls: &std::sync::atomic::AtomicUsize,
    others: &[&str],
) where
    S: Service<Request<()>, Response = Response<String>, Error = Infallible>,
{
    use std::sync::atomic::Ordering;
    for (i, key) in ["paid_1", "free_1", "paid_1"].into_iter().enumerate() {
        let before = calls.load(Ordering::Relaxed);
        let response = send(service, request(Some(key), "10.0.0.1:1")).await;
        assert_eq!(response.status(), 200, "{key}");
        assert_eq!(calls.load(Ordering::Relaxed) - before, 1, "request {i}");
        let policy = list(response.headers(), "ratelimit-policy");
        let tier = if key.starts_with("paid_") {
            "api.paid"
        } else {
            "api.free"
        };
        let mut expected = vec![tier];
        expected.extend_from_slice(others);
        assert_eq!(names(&policy), expected);
    }
}

/// A tier function (a lookup in a map of paid keys, say) is asked once per
/// request, in the gate's layer and in a combined layer: the request is
/// decided, counted and advertised in the one tier it named, and a key
/// upgraded while a request is decided cannot be decided in one tier and
/// advertised in another.
#[tokio::test]
async fn a_tier_function_is_asked_once_a_request() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = RateLimitLayer::new(
        Gate::tiered(counted_tiers(Arc::clone(&calls)))
            .with_derived_policy("api")
            .unwrap(),
        api_key(),
    );
    let mut service = layer.layer(echo());
    one_tier_call_each(&mut service, &calls, &[]).await;
    // A refusal too.
    for _ in 0..9 {
        send(&mut service, request(Some("free_1"), "10.0.0.1:1")).await;
    }
    let before = calls.load(Ordering::Relaxed);
    let refused = send(&mut service, request(Some("free_1"), "10.0.0.1:1")).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(calls.load(Ordering::Relaxed) - before, 1);

    let calls = Arc::new(AtomicUsize::new(0));
    let tiers = Arc::new(counted_tiers(Arc::clone(&calls)));
    let layer = Limits::builder()
        .limit_shared("api", api_key(), Arc::clone(&tiers))
        .unwrap()
        .limit(
            "all",
            Global,
            RateLimiter::new(Quota::per_second(1000).unwrap()),
        )
        .unwrap()
        .build()
        .unwrap();
    let mut service = layer.layer(echo());
    one_tier_call_each(&mut service, &calls, &["all"]).await;
    let admitted: Vec<u64> = tiers.tier_stats().iter().map(|(_, s)| s.admitted).collect();
    assert_eq!(admitted, [1, 2]);
}

#[test]
fn the_builder_refuses_what_could_never_work() {
    let quota = Quota::per_second(10).unwrap();
    assert!(matches!(
        Limits::builder().limit("bad name", Global, RateLimiter::new(quota)),
        Err(LimitsError::Name(_))
    ));
    let twice = Limits::builder()
        .limit("a", Global, RateLimiter::new(quota))
        .unwrap()
        .limit("a", Global, RateLimiter::new(quota));
    assert!(matches!(twice, Err(LimitsError::DuplicateName(name)) if name == "a"));
    // A name a tier makes (`api` with tier `free` advertises `api.free`),
    // either way round: the field would carry two items of one name.
    let after_tiers = Limits::builder()
        .limit("api", api_key(), tiers())
        .unwrap()
        .limit("api.free", Global, RateLimiter::new(quota));
    assert!(matches!(after_tiers, Err(LimitsError::DuplicateName(name)) if name == "api.free"));
    let before_tiers = Limits::builder()
        .limit("api.paid", Global, RateLimiter::new(quota))
        .unwrap()
        .limit("api", api_key(), tiers());
    assert!(matches!(before_tiers, Err(LimitsError::DuplicateName(name)) if name == "api.paid"));
    let too_dear = Limits::builder()
        .limit("a", Global, RateLimiter::new(quota))
        .unwrap()
        .cost(11)
        .build();
    assert!(matches!(
        too_dear,
        Err(LimitsError::Cost {
            cost: 11,
            capacity: 10,
            ..
        })
    ));
    assert!(matches!(
        Limits::builder().cost(0).build(),
        Err(LimitsError::Cost { cost: 0, .. })
    ));
}

#[tokio::test]
async fn refund_when_counts_only_failures() {
    let t = three(3, 100, 100);
    let layer = Limits::builder()
        .limit_shared("login", api_key(), Arc::clone(&t.per_key))
        .unwrap()
        .limit_shared("all", Global, Arc::clone(&t.global))
        .unwrap()
        .refund_when(|parts| parts.status.is_success())
        .build()
        .unwrap();
    let mut service = layer.clone().layer(echo());
    let login = |ok: bool| {
        let mut r = request(Some("alice"), "10.0.0.1:1");
        if !ok {
            r.headers_mut().insert("x-answer", "401".parse().unwrap());
        }
        r
    };
    // Successes are free: any number of them.
    for _ in 0..10 {
        let ok = send(&mut service, login(true)).await;
        assert_eq!(ok.status(), 200);
        assert_eq!(
            param(&list(ok.headers(), "ratelimit"), "login", "r"),
            Some(3)
        );
    }
    // Three failures, then the fourth attempt is refused.
    for left in [2, 1, 0] {
        let failed = send(&mut service, login(false)).await;
        assert_eq!(failed.status(), 401);
        assert_eq!(
            param(&list(failed.headers(), "ratelimit"), "login", "r"),
            Some(left)
        );
    }
    assert_eq!(send(&mut service, login(true)).await.status(), 429);
    let stats = layer.stats();
    assert_eq!(
        (stats.refunded, stats.refund_declined),
        (20, 0),
        "two limits, ten refunds"
    );
    assert_eq!(t.global.remaining(), 97);
}

#[tokio::test]
async fn cost_from_response_settles_lends_and_forgives_no_more_than_it_counts() {
    // 10 tokens, one more a second: a fill time of 10 s.
    let t = three(10, 100, 100);
    let layer = Limits::builder()
        .limit_shared("tokens", api_key(), Arc::clone(&t.per_key))
        .unwrap()
        .cost(2)
        .cost_from_response(tokens_used)
        .build()
        .unwrap();
    let mut service = layer.clone().layer(echo());
    let costing = |cost: u32| {
        let mut r = request(Some("a"), "10.0.0.1:1");
        r.headers_mut().insert("x-cost", cost.into());
        r
    };
    let r_of = |r: &Response<String>| param(&list(r.headers(), "ratelimit"), "tokens", "r");
    // Cheaper than charged: 2 taken, 1 used.
    assert_eq!(r_of(&send(&mut service, costing(1)).await), Some(9));
    // Dearer: 2 taken, 6 used: 4 more.
    assert_eq!(r_of(&send(&mut service, costing(6)).await), Some(3));
    // 2 taken, 8 used: 1 more is held, 5 are lent from the next refills.
    assert_eq!(r_of(&send(&mut service, costing(8)).await), Some(0));
    let stats = layer.stats();
    assert_eq!(
        (stats.charged, stats.lent, stats.forgiven),
        // The cheaper one gave back its one unused permit in place: nothing
        // charged again.
        (4 + 1, 5, 0)
    );
    // Used 1 + 6 + 8 = what the bucket held (10) + what it lent (5).
    assert_eq!(1 + 6 + 8, 10 + stats.lent);
    // The debt is waited out: the next request (2) waits for 5 + 2 refills.
    let refused = send(&mut service, costing(1)).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "7");
    t.clock.advance(Duration::from_secs(7));
    // A debt beyond one fill is not carried: 28 more than charged, of which
    // the bucket lends at most a fill's worth (10); the rest is forgiven.
    let r = send(&mut service, costing(30)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r_of(&r), Some(0));
    let after = layer.stats();
    let (lent, forgiven) = (after.lent - stats.lent, after.forgiven - stats.forgiven);
    assert_eq!(lent + forgiven, 28);
    assert!((1..=10).contains(&lent), "lent {lent}");
    // And the requests after wait no longer than one fill plus their own.
    let refused = send(&mut service, costing(1)).await;
    let wait: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((3..=12).contains(&wait), "wait {wait}");
}

/// GCRA lends as the token bucket does: a response dearer than what a key
/// holds moves its meter on by the rest (a keyed meter and a direct live
/// one), and the next request waits the debt out.
#[tokio::test]
async fn cost_from_response_lends_from_gcra_meters_too() {
    let clock = ManualClock::new();
    // A burst of 10, one permit back a second: a fill time of 10 s.
    let quota = Quota::new(10, 1, Duration::from_secs(1)).unwrap();
    let per_key = Arc::new(
        turnstile::KeyedBuilder::<String, _>::new(turnstile::Gcra::new(quota))
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let global = Arc::new(RateLimiter::from_parts(
        turnstile::LiveGcra::new(quota),
        clock.clone(),
    ));
    let layer = Limits::builder()
        .limit_shared("tokens", api_key(), Arc::clone(&per_key))
        .unwrap()
        .limit_shared("all", Global, Arc::clone(&global))
        .unwrap()
        .cost(2)
        .cost_from_response(tokens_used)
        .build()
        .unwrap();
    let mut service = layer.clone().layer(echo());
    let costing = |cost: u32| {
        let mut r = request(Some("a"), "10.0.0.1:1");
        r.headers_mut().insert("x-cost", cost.into());
        r
    };
    // 2 taken, 12 used: 8 more are held, 2 lent, in each limit.
    let r = send(&mut service, costing(12)).await;
    assert_eq!(r.status(), 200);
    let stats = layer.stats();
    assert_eq!((stats.charged, stats.lent, stats.forgiven), (16, 4, 0));
    assert_eq!((per_key.remaining("a"), global.remaining()), (0, 0));
    // The next request (2) waits for the 2 lent and its own 2: 4 s, where
    // without the loan it would wait 2 s.
    let refused = send(&mut service, costing(1)).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "4");
    clock.advance(Duration::from_millis(3_999));
    assert_eq!(send(&mut service, costing(1)).await.status(), 429);
    clock.advance(Duration::from_millis(1));
    assert_eq!(send(&mut service, costing(2)).await.status(), 200);
    // A debt beyond one fill is not carried: 28 more than charged, of
    // which each meter lends at most a fill's worth (10).
    clock.advance(Duration::from_secs(60));
    let before = layer.stats();
    assert_eq!(send(&mut service, costing(30)).await.status(), 200);
    let after = layer.stats();
    let (charged, lent, forgiven) = (
        after.charged - before.charged,
        after.lent - before.lent,
        after.forgiven - before.forgiven,
    );
    assert_eq!(charged, 2 * 8, "each meter's 8 left after the 2 charged");
    assert_eq!(lent, 2 * 10, "one fill each");
    assert_eq!(forgiven, 2 * 10);
    // The requests after wait one fill plus their own two permits.
    let refused = send(&mut service, costing(1)).await;
    assert_eq!(refused.headers()["retry-after"], "12");
}

#[tokio::test]
async fn drain_when_empties_the_allowance() {
    let t = three(10, 100, 100);
    let layer = Limits::builder()
        .limit_shared("up", api_key(), Arc::clone(&t.per_key))
        .unwrap()
        .drain_when(|parts| parts.status == StatusCode::TOO_MANY_REQUESTS)
        .build()
        .unwrap();
    let mut service = layer.clone().layer(echo());
    let upstream_429 = answered("a", "10.0.0.1:1", "429");
    let r = send(&mut service, upstream_429).await;
    assert_eq!(r.status(), 429, "the upstream's own answer");
    assert_eq!(param(&list(r.headers(), "ratelimit"), "up", "r"), Some(0));
    assert_eq!(t.per_key.remaining("a"), 0);
    assert_eq!(layer.stats().drained, 9);
    let refused = send(&mut service, request(Some("a"), "10.0.0.1:1")).await;
    assert_eq!(refused.status(), 429);
    assert!(
        refused.headers().contains_key("retry-after"),
        "refused by the layer"
    );
}

/// One client's 429 from the upstream empties that client's allowances, not
/// the one every client shares: a `Global` limit is never drained (it let
/// one client over its own limit refuse every other client).
#[tokio::test]
async fn a_drain_spares_the_global_limit() {
    let t = three(10, 100, 100);
    let layer = t
        .builder()
        .drain_when(|parts| parts.status == StatusCode::TOO_MANY_REQUESTS)
        .build()
        .unwrap();
    let mut service = layer.clone().layer(echo());
    let upstream_429 = answered("mallory", "10.0.0.1:1", "429");
    let r = send(&mut service, upstream_429).await;
    assert_eq!(r.status(), 429, "the upstream's own answer");
    assert_eq!(
        t.per_key.remaining("mallory"),
        0,
        "the client's own: drained"
    );
    let ip: std::net::IpAddr = "10.0.0.1".parse().unwrap();
    assert_eq!(t.per_ip.remaining(&ip), 0, "and its address's");
    assert_eq!(
        t.global.remaining(),
        99,
        "the request's one permit, no more"
    );
    assert_eq!(param(&list(r.headers(), "ratelimit"), "all", "r"), Some(99));
    assert_eq!(layer.stats().drained, 9 + 99);
    let other = send(&mut service, request(Some("alice"), "10.0.0.2:1")).await;
    assert_eq!(other.status(), 200, "another client is not refused");
    assert_eq!(t.global.remaining(), 98);
}

/// A direct limiter is one allowance whatever key it is asked for: keyed
/// by API key in the layer, it is still every client's, and not drained.
#[tokio::test]
async fn a_drain_spares_a_direct_limiter_under_any_key() {
    let t = three(10, 100, 100);
    let layer = Limits::builder()
        .limit_shared("key", api_key(), Arc::clone(&t.per_key))
        .unwrap()
        .limit_shared("all", api_key(), Arc::clone(&t.global))
        .unwrap()
        .drain_when(|parts| parts.status == StatusCode::TOO_MANY_REQUESTS)
        .build()
        .unwrap();
    let mut service = layer.clone().layer(echo());
    let upstream_429 = answered("mallory", "10.0.0.1:1", "429");
    assert_eq!(send(&mut service, upstream_429).await.status(), 429);
    assert_eq!(t.per_key.remaining("mallory"), 0);
    assert_eq!(t.global.remaining(), 99);
    let other = send(&mut service, request(Some("alice"), "10.0.0.2:1")).await;
    assert_eq!(other.status(), 200);
}

/// A response that never comes settles nothing and says so: the service's
/// error, or the response future dropped before the service answered,
/// leaves the up-front charge spent and counts the request as unsettled.
#[tokio::test]
async fn a_response_that_never_comes_is_counted_unsettled() {
    let t = three(10, 100, 100);
    let layer = t
        .builder()
        .refund_when(|parts| parts.status.is_server_error())
        .build()
        .unwrap();
    // The service fails: no response to settle by.
    let failing = layer.clone().layer(service_fn(|_: Request<()>| async {
        Err::<Response<String>, &'static str>("down")
    }));
    let answer = failing.oneshot(request(Some("a"), "10.0.0.1:1")).await;
    assert_eq!(answer.unwrap_err(), "down");
    let stats = layer.stats();
    assert_eq!(
        (stats.unsettled, stats.refunded, stats.refund_declined),
        (1, 0, 0)
    );
    assert_eq!(t.per_key.remaining("a"), 9, "the up-front charge stays");
    // The service never answers, and the caller gives up.
    let mut hanging = layer.clone().layer(service_fn(|_: Request<()>| {
        std::future::pending::<Result<Response<String>, Infallible>>()
    }));
    {
        let call = hanging
            .ready()
            .await
            .unwrap()
            .call(request(Some("a"), "10.0.0.1:1"));
        let timed_out = tokio::time::timeout(Duration::from_millis(10), call).await;
        assert!(timed_out.is_err());
    }
    assert_eq!(layer.stats().unsettled, 2);
    assert_eq!(t.per_key.remaining("a"), 8);
    // Settled responses are not counted.
    let mut service = layer.clone().layer(echo());
    assert_eq!(
        send(&mut service, request(Some("a"), "10.0.0.1:1"))
            .await
            .status(),
        200
    );
    let failed = answered("a", "10.0.0.1:1", "503");
    assert_eq!(send(&mut service, failed).await.status(), 503);
    let stats = layer.stats();
    // The 503 refunded in each of the three limits.
    assert_eq!((stats.unsettled, stats.refunded), (2, 3), "{stats:?}");
}

/// A drain empties a tiered key's own allowance, whatever its tier's size:
/// a paid key holding 99 after its request holds nothing after the upstream's
/// 429 (each take was capped at the smallest tier's capacity, 10, four
/// times, and left 59).
#[tokio::test]
async fn drain_when_empties_a_tiered_keys_own_allowance() {
    let layer = Limits::builder()
        .limit("api", api_key(), tiers())
        .unwrap()
        .drain_when(|parts| parts.status == StatusCode::TOO_MANY_REQUESTS)
        .build()
        .unwrap();
    let mut service = layer.clone().layer(echo());
    let upstream_429 = answered("paid_1", "10.0.0.1:1", "429");
    let r = send(&mut service, upstream_429).await;
    assert_eq!(r.status(), 429, "the upstream's own answer");
    // 99 held after the request (the tiers run on the real clock: a refill
    // of a token every 10 ms may land while this runs, on a slow machine).
    let r = param(&list(r.headers(), "ratelimit"), "api.paid", "r");
    assert!(r <= Some(1), "{r:?}");
    assert!(layer.stats().drained >= 90, "{:?}", layer.stats());
}

/// One limit of a random combined layer: a global or a keyed token bucket.
#[derive(Clone, Debug)]
struct Spec {
    keyed: bool,
    capacity: u32,
    period_ms: u64,
}

fn spec() -> impl Strategy<Value = Spec> {
    (any::<bool>(), 1u32..6, 50u64..2_000).prop_map(|(keyed, capacity, period_ms)| Spec {
        keyed,
        capacity,
        period_ms,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Over random traces through 2 to 4 random limits: each limit admits no
    /// more than its own bound, and a denied request changes no limit's state.
    #[test]
    fn every_limit_holds_its_bound_and_denials_change_nothing(
        specs in prop::collection::vec(spec(), 2..=4),
        trace in prop::collection::vec((0u8..3, 0u64..400), 1..120),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let clock = ManualClock::new();
        enum One {
            Keyed(Arc<KeyedLimiter<String, turnstile::TokenBucket, ManualClock>>),
            Direct(Arc<RateLimiter<turnstile::TokenBucket, ManualClock>>),
        }
        let mut builder = Limits::builder();
        let mut limits = Vec::new();
        for (i, s) in specs.iter().enumerate() {
            let quota = Quota::new(s.capacity, 1, Duration::from_millis(s.period_ms)).unwrap();
            let name = format!("l{i}");
            if s.keyed {
                let l = Arc::new(KeyedLimiter::builder(quota).clock(clock.clone()).build().unwrap());
                builder = builder.limit_shared(&name, api_key(), Arc::clone(&l)).unwrap();
                limits.push(One::Keyed(l));
            } else {
                let l = Arc::new(RateLimiter::with_clock(quota, clock.clone()));
                builder = builder.limit_shared(&name, Global, Arc::clone(&l)).unwrap();
                limits.push(One::Direct(l));
            }
        }
        let mut service = builder.build().unwrap().layer(echo());
        let keys = ["k0", "k1", "k2"];
        let state = |key: &str| -> Vec<u32> {
            limits.iter().map(|l| match l {
                One::Keyed(l) => l.remaining(key),
                One::Direct(l) => l.remaining(),
            }).collect()
        };
        // Admissions per limit and key (a direct limit: one key).
        let mut admitted: Vec<BTreeMap<&str, u64>> = vec![BTreeMap::new(); specs.len()];
        let mut elapsed_ms = 0u64;
        for (k, advance) in trace {
            clock.advance(Duration::from_millis(advance));
            elapsed_ms += advance;
            let key = keys[usize::from(k)];
            let before: Vec<Vec<u32>> = keys.iter().map(|k| state(k)).collect();
            let response = runtime.block_on(send(&mut service, request(Some(key), "10.0.0.1:1")));
            if response.status() == StatusCode::OK {
                for (i, s) in specs.iter().enumerate() {
                    let slot = if s.keyed { key } else { "" };
                    *admitted[i].entry(slot).or_default() += 1;
                }
            } else {
                prop_assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
                let after: Vec<Vec<u32>> = keys.iter().map(|k| state(k)).collect();
                prop_assert_eq!(before, after, "a denial changed a limit");
            }
        }
        // A token bucket admits at most capacity + elapsed / period.
        for (i, s) in specs.iter().enumerate() {
            let bound = u64::from(s.capacity) + elapsed_ms / s.period_ms;
            for (key, n) in &admitted[i] {
                prop_assert!(*n <= bound, "limit {} key {:?}: {} > {}", i, key, n, bound);
            }
        }
    }
}

#[tokio::test]
async fn the_metrics_series_carry_refunds_settled_permits_and_denials_by_limit() {
    use metrics_exporter_prometheus::PrometheusBuilder;
    use turnstile::metrics::Registry;

    let t = three(2, 100, 100);
    let layer = Limits::builder()
        .limit_shared("key", api_key(), Arc::clone(&t.per_key))
        .unwrap()
        .limit_shared("all", Global, Arc::clone(&t.global))
        .unwrap()
        .refund_when(|parts| parts.status == StatusCode::NO_CONTENT)
        .build()
        .unwrap();
    let mut service = layer.clone().layer(echo());
    let mut free = request(Some("a"), "10.0.0.1:1");
    free.headers_mut()
        .insert("x-answer", "204".parse().unwrap());
    assert_eq!(send(&mut service, free).await.status(), 204);
    for status in [200, 200, 429] {
        let r = send(&mut service, request(Some("a"), "10.0.0.1:1")).await;
        assert_eq!(r.status().as_u16(), status);
    }
    let _ = send(&mut service, request(None, "10.0.0.1:1")).await;
    let registry = Registry::new();
    registry.register("edge", layer);
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || registry.publish());
    let text = handle.render();
    for line in [
        r#"turnstile_responses_total{limiter="edge",status="200"} 3"#,
        r#"turnstile_responses_total{limiter="edge",status="429"} 1"#,
        r#"turnstile_responses_total{limiter="edge",status="401"} 1"#,
        r#"turnstile_denied_by_total{limiter="edge",limit="key"} 1"#,
        r#"turnstile_denied_by_total{limiter="edge",limit="all"} 0"#,
        r#"turnstile_refunds_total{limiter="edge",result="exact"} 2"#,
        r#"turnstile_refunds_total{limiter="edge",result="declined"} 0"#,
        r#"turnstile_settled_permits_total{limiter="edge",kind="forgiven"} 0"#,
        r#"turnstile_unsettled_total{limiter="edge"} 0"#,
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(line)),
            "missing {line:?} in:\n{text}"
        );
    }
}

#[tokio::test]
async fn a_changed_quota_is_advertised_from_then_on_and_fields_can_be_off() {
    use turnstile::{KeyedBuilder, LiveTokenBucket};

    let live = Arc::new(
        KeyedBuilder::<String, _>::new(
            LiveTokenBucket::new(Quota::per_minute(10).unwrap()).unwrap(),
        )
        .build()
        .unwrap(),
    );
    let layer = Limits::builder()
        .limit_shared("key", api_key(), Arc::clone(&live))
        .unwrap()
        .limit(
            "all",
            Global,
            RateLimiter::new(Quota::per_second(100).unwrap()),
        )
        .unwrap()
        .build()
        .unwrap();
    let mut service = layer.layer(echo());
    let r = send(&mut service, request(Some("a"), "10.0.0.1:1")).await;
    assert_eq!(
        r.headers()["ratelimit-policy"],
        r#""key";q=10;w=60, "all";q=100;w=1"#
    );
    live.set_quota(Quota::per_minute(5).unwrap()).unwrap();
    let r = send(&mut service, request(Some("a"), "10.0.0.1:1")).await;
    assert_eq!(
        r.headers()["ratelimit-policy"],
        r#""key";q=5;w=60, "all";q=100;w=1"#
    );
    let value = list(r.headers(), "ratelimit");
    assert!(
        param(&value, "key", "r") <= Some(5),
        "never more than the new quota"
    );

    let quiet = Limits::builder()
        .limit("all", Global, RateLimiter::new(Quota::per_hour(1).unwrap()))
        .unwrap()
        .advertise(false)
        .build()
        .unwrap();
    let mut service = quiet.layer(echo());
    let r = send(&mut service, request(Some("a"), "10.0.0.1:1")).await;
    assert!(
        !r.headers().contains_key("ratelimit") && !r.headers().contains_key("ratelimit-policy")
    );
    let r = send(&mut service, request(Some("a"), "10.0.0.1:1")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "3600");
    assert!(!r.headers().contains_key("ratelimit"));
}

/// A clock that counts its readings; `shared` says whether it declares its
/// readings shared with every clock of the same identity.
#[derive(Clone)]
struct CountingClock {
    inner: ManualClock,
    reads: Arc<std::sync::atomic::AtomicU64>,
    shared: Option<usize>,
}

impl turnstile::Clock for CountingClock {
    fn now(&self) -> u64 {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.now()
    }

    fn shared_readings(&self) -> Option<usize> {
        self.shared
    }
}

/// Limits whose clocks share their readings decide at one reading a
/// request; limits on clocks of their own each read theirs; a mix reads
/// each.
#[tokio::test]
async fn limits_on_one_clocks_readings_read_the_time_once_a_request() {
    let reads = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let manual = ManualClock::new();
    let clock = |shared: Option<usize>| CountingClock {
        inner: manual.clone(),
        reads: Arc::clone(&reads),
        shared,
    };
    let quota = Quota::new(100, 1, Duration::from_secs(1)).unwrap();
    let layer = |a: Option<usize>, b: Option<usize>, c: Option<usize>| {
        Limits::builder()
            .limit(
                "key",
                api_key(),
                KeyedLimiter::<String, _, _>::builder(quota)
                    .clock(clock(a))
                    .build()
                    .unwrap(),
            )
            .unwrap()
            .limit(
                "ip",
                PeerIp::new(),
                KeyedLimiter::<IpAddr, _, _>::builder(quota)
                    .clock(clock(b))
                    .build()
                    .unwrap(),
            )
            .unwrap()
            .limit("all", Global, RateLimiter::with_clock(quota, clock(c)))
            .unwrap()
            .build()
            .unwrap()
    };
    let reads_per_request = |a, b, c| {
        let layer = layer(a, b, c);
        let reads = Arc::clone(&reads);
        async move {
            let mut service = layer.layer(echo());
            // The first request inserts each key (a new key reads its
            // limiter's clock again under its shard's lock): counted from
            // the second.
            assert_eq!(
                send(&mut service, request(Some("a"), "10.0.0.1:1"))
                    .await
                    .status(),
                200
            );
            let before = reads.load(std::sync::atomic::Ordering::Relaxed);
            for _ in 0..10 {
                let response = send(&mut service, request(Some("a"), "10.0.0.1:1")).await;
                assert_eq!(response.status(), 200);
            }
            (reads.load(std::sync::atomic::Ordering::Relaxed) - before) / 10
        }
    };
    assert_eq!(reads_per_request(Some(7), Some(7), Some(7)).await, 1);
    assert_eq!(reads_per_request(None, None, None).await, 3);
    assert_eq!(reads_per_request(Some(7), Some(8), Some(7)).await, 3);
    assert_eq!(reads_per_request(Some(7), Some(7), None).await, 3);
}

/// A live quota changed below the layer's cost can never admit a request:
/// the answer is a 500 naming the misconfiguration, not a 429 whose
/// Retry-After would never come true; nothing is taken from the others.
#[tokio::test]
async fn a_live_quota_shrunk_below_the_cost_is_a_misconfiguration_not_a_wait() {
    use turnstile::{KeyedBuilder, LiveTokenBucket};

    let live = Arc::new(
        KeyedBuilder::<String, _>::new(
            LiveTokenBucket::new(Quota::per_minute(10).unwrap()).unwrap(),
        )
        .build()
        .unwrap(),
    );
    let global = Arc::new(RateLimiter::new(Quota::per_hour(100).unwrap()));
    let layer = Limits::builder()
        .limit_shared("all", Global, Arc::clone(&global))
        .unwrap()
        .limit_shared("key", api_key(), Arc::clone(&live))
        .unwrap()
        .cost(5)
        .build()
        .unwrap();
    let mut service = layer.layer(echo());
    let r = send(&mut service, request(Some("a"), "10.0.0.1:1")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(global.remaining(), 95);

    live.set_quota(Quota::per_minute(2).unwrap()).unwrap();
    for _ in 0..3 {
        let r = send(&mut service, request(Some("a"), "10.0.0.1:1")).await;
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            !r.headers().contains_key("retry-after"),
            "{:?}",
            r.headers()
        );
    }
    assert_eq!(
        global.remaining(),
        95,
        "the refusal spent nothing elsewhere"
    );

    // Refused first by a drained limit, with the shrunk one after it: the
    // same answer, not the drained limit's wait.
    let drained = Arc::new(RateLimiter::new(Quota::per_hour(5).unwrap()));
    let behind = Limits::builder()
        .limit_shared("all", Global, Arc::clone(&drained))
        .unwrap()
        .limit_shared("key", api_key(), Arc::clone(&live))
        .unwrap()
        .build()
        .unwrap();
    live.set_quota(Quota::per_minute(10).unwrap()).unwrap();
    let mut first = behind.layer(echo());
    let _ = drained.try_acquire_n(5).unwrap();
    let r = send(&mut first, request(Some("a"), "10.0.0.1:1")).await;
    assert_eq!(r.status(), 429, "a cost of 1 fits the live quota");
    let costly = Limits::builder()
        .limit_shared("all", Global, Arc::clone(&drained))
        .unwrap()
        .limit_shared("key", api_key(), Arc::clone(&live))
        .unwrap()
        .cost(5)
        .build()
        .unwrap();
    live.set_quota(Quota::per_minute(2).unwrap()).unwrap();
    let r = send(&mut costly.layer(echo()), request(Some("a"), "10.0.0.1:1")).await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(!r.headers().contains_key("retry-after"));

    // Back at a quota the cost fits in: admitted again.
    live.set_quota(Quota::per_minute(10).unwrap()).unwrap();
    let r = send(&mut service, request(Some("b"), "10.0.0.1:1")).await;
    assert_eq!(r.status(), 200);
}

/// Settling a response's cost (charging, lending, draining) is no decision
/// on a request: the limiters' own stats count the one admission, not the
/// takes and halving loans of the settlement (one request charged 1 whose
/// response said 1,000 counted 3 admissions and 4 denials).
#[tokio::test]
async fn settling_is_not_counted_as_decisions_in_the_limiters_stats() {
    use turnstile::KeyedBuilder;

    let clock = ManualClock::new();
    let per_key = Arc::new(
        KeyedBuilder::<String, _>::new(turnstile::TokenBucket::new(
            Quota::new(100, 1, Duration::from_secs(1)).unwrap(),
        ))
        .clock(clock.clone())
        .build()
        .unwrap(),
    );
    let global = Arc::new(
        RateLimiter::with_clock(
            Quota::new(10_000, 1, Duration::from_secs(1)).unwrap(),
            clock.clone(),
        )
        .counted(),
    );
    let layer = Limits::builder()
        .limit_shared("key", api_key(), Arc::clone(&per_key))
        .unwrap()
        .limit_shared("all", Global, Arc::clone(&global))
        .unwrap()
        .cost_from_response(tokens_used)
        .drain_when(|parts| parts.status == StatusCode::TOO_MANY_REQUESTS)
        .build()
        .unwrap();
    let mut service = layer.layer(echo());
    let mut r = request(Some("a"), "10.0.0.1:1");
    r.headers_mut().insert("x-cost", "1000".parse().unwrap());
    assert_eq!(send(&mut service, r).await.status(), 200);
    let r = answered("b", "10.0.0.1:1", "429");
    assert_eq!(send(&mut service, r).await.status(), 429);
    let stats = layer.stats();
    assert!(
        stats.charged + stats.lent > 0,
        "the settlement took: {stats:?}"
    );
    let keyed = per_key.stats();
    assert_eq!((keyed.admitted, keyed.denied), (2, 0), "{keyed:?}");
    let direct = global.stats();
    assert_eq!((direct.admitted, direct.denied), (2, 0), "{direct:?}");
}

/// A refusal whose give-back in an earlier limit declined (another request
/// changed that limit's word meanwhile) leaves that limit spent, so it may
/// now refuse for longer than the limit that refused: `Retry-After` covers
/// it too, and honouring it admits.
#[tokio::test]
async fn retry_after_covers_an_earlier_limit_whose_give_back_declined() {
    use std::borrow::Cow;
    use std::sync::atomic::{AtomicU32, Ordering};
    use turnstile::TokenBucket;
    use turnstile::tower::{KeyExtractor, RequestHead};

    type Direct = RateLimiter<TokenBucket, ManualClock>;
    /// One key for every request; on its armed call it stands for another
    /// request (another thread, in a server) that takes a permit of the
    /// direct limit at that moment.
    #[derive(Clone)]
    struct Racer {
        global: Arc<Direct>,
        calls_until_race: Arc<AtomicU32>,
    }
    impl KeyExtractor for Racer {
        type Key = ();
        type Lookup = ();
        fn extract<'r>(&self, _: &RequestHead<'r>) -> Option<std::borrow::Cow<'r, ()>> {
            if self.calls_until_race.fetch_sub(1, Ordering::Relaxed) == 1 {
                assert!(self.global.try_acquire().is_allowed(), "the other request");
            }
            Some(Cow::Owned(()))
        }
    }

    let clock = ManualClock::new();
    clock.set(Duration::from_millis(250));
    // 3 at once, one more every 10 s.
    let global = Arc::new(RateLimiter::with_clock(
        Quota::new(3, 1, Duration::from_secs(10)).unwrap(),
        clock.clone(),
    ));
    let per_key =
        KeyedLimiter::<String>::builder(Quota::new(1, 1, Duration::from_secs(1)).unwrap())
            .clock(clock.clone())
            .build()
            .unwrap();
    let calls = Arc::new(AtomicU32::new(u32::MAX));
    let racer = Racer {
        global: Arc::clone(&global),
        calls_until_race: Arc::clone(&calls),
    };
    let layer = Limits::builder()
        .limit_shared("all", Global, Arc::clone(&global))
        .unwrap()
        .limit("key", api_key(), per_key)
        .unwrap()
        .limit(
            "racer",
            racer,
            RateLimiter::with_clock(
                Quota::new(1000, 1000, Duration::from_secs(1)).unwrap(),
                clock.clone(),
            ),
        )
        .unwrap()
        .build()
        .unwrap();
    let mut service = layer.layer(echo());
    let with_key = || {
        Request::builder()
            .header("x-api-key", "a")
            .body(())
            .unwrap()
    };
    // `all` 3 -> 2.
    assert_eq!(send(&mut service, with_key()).await.status(), 200);
    // The next request: `all` 2 -> 1, key "a" refuses (1 s); while the
    // refusal's waits are gathered (the racer's second call) the other
    // request takes `all`'s last permit, so `all`'s give-back declines.
    calls.store(2, std::sync::atomic::Ordering::Relaxed);
    let denied = send(&mut service, with_key()).await;
    assert_eq!(denied.status(), 429);
    let retry: u64 = denied.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let all_t = param(&list(denied.headers(), "ratelimit"), "all", "t");
    assert!(
        all_t.is_some_and(|t| t as u64 <= retry),
        "Retry-After {retry}, `all` says t={all_t:?}"
    );
    // Honouring Retry-After admits.
    clock.advance(Duration::from_secs(retry));
    assert_eq!(send(&mut service, with_key()).await.status(), 200);
}

/// A real cost below the up-front charge gives back, in process, only the
/// permits it did not use, in one step: requests racing on the key can
/// never take the charge given back before the real cost is taken, so
/// nothing is forgiven or lent, for GCRA (which cannot lend) and the token
/// bucket alike.
#[test]
fn a_smaller_real_cost_is_never_forgiven_in_process() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use turnstile::{Gcra, KeyedBuilder};
    for gcra in [true, false] {
        let clock = ManualClock::new();
        clock.set(Duration::from_millis(250));
        let quota = Quota::new(3, 3, Duration::from_secs(3_600)).unwrap();
        let builder = if gcra {
            Limits::builder().limit(
                "key",
                api_key(),
                KeyedBuilder::<String, Gcra>::new(Gcra::new(quota))
                    .clock(clock.clone())
                    .build()
                    .unwrap(),
            )
        } else {
            Limits::builder().limit(
                "key",
                api_key(),
                KeyedLimiter::<String>::builder(quota)
                    .clock(clock.clone())
                    .build()
                    .unwrap(),
            )
        };
        let layer = builder
            .unwrap()
            .cost(3)
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
        let service = layer.clone().layer(echo());
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let service = service.clone();
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .build()
                        .unwrap();
                    runtime.block_on(async {
                        while !stop.load(Ordering::Relaxed) {
                            let mut request = request(Some("k"), "192.0.2.1:1");
                            request.headers_mut().insert("x-cost", "1".parse().unwrap());
                            let _ = service.clone().oneshot(request).await.unwrap();
                        }
                    })
                })
            })
            .collect();
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(1_500) {
            std::thread::sleep(Duration::from_micros(300));
            // A whole refill: every request admitted after it races the others.
            clock.advance(Duration::from_secs(3_600));
        }
        stop.store(true, Ordering::Relaxed);
        for thread in threads {
            thread.join().unwrap();
        }
        let stats = layer.stats();
        assert!(stats.refunded > 0, "{stats:?}");
        assert_eq!(
            (stats.forgiven, stats.lent),
            (0, 0),
            "gcra {gcra}: {stats:?}"
        );
    }
}

/// A panic in a later limit's user code (here its key's `Hash`, run when
/// that limit takes) gives back what the earlier limits took: the request
/// was admitted by none. They stayed spent until they refilled.
#[test]
fn a_panic_in_a_later_limit_gives_the_earlier_limits_back() {
    use std::borrow::Cow;
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::sync::atomic::{AtomicBool, Ordering};
    use turnstile::tower::{KeyExtractor, RequestHead};

    static PANIC_ON_HASH: AtomicBool = AtomicBool::new(false);
    #[derive(Clone, PartialEq, Eq, Debug)]
    struct Panicky(u32);
    impl std::hash::Hash for Panicky {
        fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
            assert!(
                !PANIC_ON_HASH.load(Ordering::SeqCst),
                "the key's Hash panicked"
            );
            self.0.hash(state);
        }
    }
    #[derive(Clone)]
    struct One;
    impl KeyExtractor for One {
        type Key = Panicky;
        type Lookup = Panicky;
        fn extract<'r>(&self, _: &RequestHead<'r>) -> Option<Cow<'r, Panicky>> {
            Some(Cow::Owned(Panicky(7)))
        }
    }

    let clock = ManualClock::new();
    // One permit an hour: one spent by the panicking request would refuse
    // the next.
    let global = Arc::new(RateLimiter::with_clock(
        Quota::new(1, 1, Duration::from_secs(3_600)).unwrap(),
        clock.clone(),
    ));
    let per_key =
        KeyedLimiter::<Panicky>::builder(Quota::new(5, 1, Duration::from_secs(1)).unwrap())
            .clock(clock.clone())
            .build()
            .unwrap();
    let layer = Limits::builder()
        .limit_shared("all", Global, Arc::clone(&global))
        .unwrap()
        .limit("key", One, per_key)
        .unwrap()
        .build()
        .unwrap();
    let mut service = layer.layer(echo());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    PANIC_ON_HASH.store(true, Ordering::SeqCst);
    let panicked = catch_unwind(AssertUnwindSafe(|| {
        runtime.block_on(send(&mut service, Request::new(())))
    }));
    PANIC_ON_HASH.store(false, Ordering::SeqCst);
    assert!(panicked.is_err(), "the key's Hash ran in the decision");
    assert_eq!(global.remaining(), 1, "the earlier limit's permit");
    let status = runtime.block_on(async { send(&mut service, Request::new(())).await.status() });
    assert_eq!(status, 200);
}
