//! The tower layer's key extractors and responses, without a server.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use std::collections::HashSet;

use http::header::{HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use tower::{ServiceBuilder, ServiceExt, service_fn};
use turnstile::tower::{
    ApiKeyHeader, Denial, ExtractorConfigError, ForwardedFor, Global, IpNet, KeyExtractor, PeerIp,
    RateLimitLayer, RequestHead,
};
use turnstile::{
    AdvertisedQuota, FixedWindow, Gate, Gcra, KeyedLimiter, ManualClock, Quota, RateLimitPolicy,
    RateLimiter, SlidingWindow, TokenBucket,
};

fn request(peer: &str, forwarded: &[&str]) -> Request<()> {
    with_header(peer, "x-forwarded-for", forwarded)
}

fn with_header(peer: &str, name: &'static str, values: &[&str]) -> Request<()> {
    let mut builder = Request::builder();
    for v in values {
        builder = builder.header(name, *v);
    }
    let mut request = builder.body(()).unwrap();
    request
        .extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    request
}

fn key<X: KeyExtractor>(x: &X, request: &Request<()>) -> Option<X::Key> {
    x.extract(&RequestHead::of(request)).map(|k| k.into_owned())
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn forwarded_headers_are_believed_only_from_trusted_proxies() {
    let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap(), "::1".parse().unwrap()];
    let x = ForwardedFor::new(PeerIp::new(), trusted);
    // From an untrusted peer the header is ignored.
    let r = request("203.0.113.9:5000", &["198.51.100.1"]);
    assert_eq!(key(&x, &r), Some(ip("203.0.113.9")));
    // Through one trusted proxy: the address it saw.
    let r = request("10.1.2.3:443", &["198.51.100.1"]);
    assert_eq!(key(&x, &r), Some(ip("198.51.100.1")));
    // A client prepending a forged address: the rightmost untrusted one counts.
    let r = request("10.1.2.3:443", &["6.6.6.6, 198.51.100.1, 10.9.9.9"]);
    assert_eq!(key(&x, &r), Some(ip("198.51.100.1")));
    // Several field lines form one list.
    let r = request("10.1.2.3:443", &["6.6.6.6", "198.51.100.7"]);
    assert_eq!(key(&x, &r), Some(ip("198.51.100.7")));
    // Garbage stops the walk at the last address vouched for.
    let r = request("10.1.2.3:443", &["198.51.100.1, not-an-ip"]);
    assert_eq!(key(&x, &r), Some(ip("10.1.2.3")));
    // No header: the proxy itself.
    let r = request("10.1.2.3:443", &[]);
    assert_eq!(key(&x, &r), Some(ip("10.1.2.3")));
    // No peer address at all: no key.
    assert_eq!(key(&x, &Request::new(())), None);
}

/// An IPv6 prefix longer than an address (129 to 255 bits) is refused, not
/// taken as 128; 0 and 128 are the bounds accepted.
#[test]
fn an_ipv6_prefix_over_128_bits_is_refused() {
    for bits in [129, 200, u8::MAX] {
        let result = PeerIp::new().ipv6_prefix(bits);
        assert!(
            matches!(result, Err(ExtractorConfigError::Ipv6PrefixTooLong { bits: b }) if b == bits),
            "{result:?}"
        );
        let text = result.unwrap_err().to_string();
        assert!(
            text.contains(&format!("{bits} bits")) && text.contains("between 0 and 128"),
            "{text}"
        );
    }
    assert!(PeerIp::new().ipv6_prefix(0).is_ok());
    assert!(PeerIp::new().ipv6_prefix(128).is_ok());
}

#[test]
fn peer_addresses_group_ipv6_by_prefix() {
    let x = PeerIp::new().ipv6_prefix(64).unwrap();
    let a = request("[2001:db8:1:2:aaaa::1]:80", &[]);
    let b = request("[2001:db8:1:2:bbbb::2]:80", &[]);
    assert_eq!(key(&x, &a), Some(ip("2001:db8:1:2::")));
    assert_eq!(key(&x, &a), key(&x, &b), "one /64, one key");
    // The default groups by /48.
    let other_64 = request("[2001:db8:1:ffff::2]:80", &[]);
    assert_eq!(key(&PeerIp::new(), &other_64), Some(ip("2001:db8:1::")));
    assert_eq!(key(&PeerIp::new(), &a), key(&PeerIp::new(), &other_64));
    assert_ne!(key(&x, &a), key(&x, &other_64));
    let each = PeerIp::new().ipv6_prefix(128).unwrap();
    assert_ne!(key(&each, &a), key(&each, &b));
    let mapped = request("[::ffff:192.0.2.1]:80", &[]);
    assert_eq!(key(&x, &mapped), Some(ip("192.0.2.1")));
}

#[test]
fn ip_networks_parse_strictly() {
    for bad in [
        "",
        "10.0.0.0/33",
        "::/129",
        "10.0.0.0/x",
        "host.example",
        "10.0.0.0/-1",
    ] {
        assert!(bad.parse::<IpNet>().is_err(), "{bad:?}");
    }
    let net: IpNet = "192.168.0.0/16".parse().unwrap();
    assert!(net.contains(ip("192.168.200.1")) && !net.contains(ip("192.169.0.1")));
    assert!(!net.contains(ip("::1")));
    let all: IpNet = "0.0.0.0/0".parse().unwrap();
    assert!(all.contains(ip("8.8.8.8")));
}

#[tokio::test]
async fn denials_carry_the_gates_status_and_headers_and_skip_the_service() {
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let limiter = KeyedLimiter::builder(Quota::new(1, 1, Duration::from_secs(90)).unwrap())
        .max_keys(1)
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(Gate::new(limiter), PeerIp::new());
    let service = ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(move |_: Request<()>| {
            counted.fetch_add(1, Ordering::Relaxed);
            async { Ok::<_, Infallible>(Response::new(String::new())) }
        }));
    let call = |peer: &str| service.clone().oneshot(request(peer, &[]));
    assert_eq!(call("192.0.2.1:1").await.unwrap().status(), StatusCode::OK);
    let limited = call("192.0.2.1:2").await.unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.headers()["retry-after"], "90");
    // A second address meets the key bound: 503, with the fill time to wait.
    let full = call("192.0.2.2:1").await.unwrap();
    assert_eq!(full.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(full.headers()["retry-after"], "90");
    assert_eq!(calls.load(Ordering::Relaxed), 1);
    assert_eq!(layer.gate().limiter().len(), 1);
}

fn ok_service() -> impl tower::Service<
    Request<()>,
    Response = Response<String>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<String>, Infallible>>,
> + Clone {
    service_fn(|_: Request<()>| async { Ok::<_, Infallible>(Response::new("served".to_string())) })
}

#[test]
fn x_forwarded_for_entries_with_ports_key_by_the_address() {
    let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
    let x = ForwardedFor::new(PeerIp::new(), trusted);
    for (header, client) in [
        ("203.0.113.9:4711", "203.0.113.9"),
        ("203.0.113.9:4711, 10.0.0.7:80", "203.0.113.9"),
        ("[2001:db8::1]:80", "2001:db8::"),
        ("[2001:db8::1]", "2001:db8::"),
        ("2001:db8::1", "2001:db8::"),
        // A port that is not one stops the walk at the proxy.
        ("203.0.113.9:123456", "10.1.2.3"),
        ("203.0.113.9:80:80", "10.1.2.3"),
        ("203.0.113.9:", "10.1.2.3"),
        ("[2001:db8::1]x", "10.1.2.3"),
    ] {
        let r = request("10.1.2.3:443", &[header]);
        assert_eq!(key(&x, &r), Some(ip(client)), "{header:?}");
    }
}

#[test]
fn rfc7239_forwarded_for_parameters_are_walked_like_x_forwarded_for() {
    let trusted: Vec<IpNet> = vec![
        "10.0.0.0/8".parse().unwrap(),
        "2001:db8:ffff::/48".parse().unwrap(),
    ];
    let x = ForwardedFor::rfc7239(PeerIp::new(), trusted);
    let forwarded = |values: &[&str]| with_header("10.1.2.3:443", "forwarded", values);
    for (values, client) in [
        (
            &["for=192.0.2.60;proto=http;by=203.0.113.43"][..],
            "192.0.2.60",
        ),
        (&[r#"for="[2001:db8:cafe::17]:4711""#], "2001:db8:cafe::"),
        (&[r#"For="192.0.2.43:47011""#], "192.0.2.43"),
        // Several elements: the rightmost that is not a trusted proxy.
        (
            &["for=198.51.100.17, for=192.0.2.60, for=10.9.9.9"],
            "192.0.2.60",
        ),
        (
            &[r#"for=198.51.100.17, for="[2001:db8:ffff::1]""#],
            "198.51.100.17",
        ),
        // Several field lines are one list, in order.
        (
            &["for=198.51.100.17", "for=192.0.2.61;proto=https"],
            "192.0.2.61",
        ),
        // A comma inside a quoted string does not split elements.
        (&[r#"for=192.0.2.1;ext="a,b", for=10.0.0.5"#], "192.0.2.1"),
        // Obfuscated and unknown nodes stop the walk at the last vouched address.
        (&["for=192.0.2.60, for=_hidden, for=10.0.0.5"], "10.0.0.5"),
        (&["for=192.0.2.60, for=unknown"], "10.1.2.3"),
        (&[r#"for="_gazonk""#], "10.1.2.3"),
        // An element without exactly one `for=`, or garbage, stops it too.
        (&["for=192.0.2.60, proto=https"], "10.1.2.3"),
        (&["for=192.0.2.60;for=192.0.2.61"], "10.1.2.3"),
        (&["for=\"192.0.2.60"], "10.1.2.3"),
        (&["nonsense"], "10.1.2.3"),
        (&[], "10.1.2.3"),
    ] {
        assert_eq!(key(&x, &forwarded(values)), Some(ip(client)), "{values:?}");
    }
    // X-Forwarded-For is not read by the RFC 7239 extractor, nor the other way.
    assert_eq!(
        key(&x, &request("10.1.2.3:443", &["192.0.2.99"])),
        Some(ip("10.1.2.3"))
    );
    let xff = ForwardedFor::new(PeerIp::new(), vec!["10.0.0.0/8".parse().unwrap()]);
    assert_eq!(
        key(&xff, &forwarded(&["for=192.0.2.60"])),
        Some(ip("10.1.2.3"))
    );
    // From an untrusted peer the header is ignored.
    let r = with_header("203.0.113.1:443", "forwarded", &["for=192.0.2.60"]);
    assert_eq!(key(&x, &r), Some(ip("203.0.113.1")));
}

#[test]
fn forwarded_walks_are_bounded_to_64_entries() {
    let x = ForwardedFor::rfc7239(PeerIp::new(), vec!["10.0.0.0/8".parse().unwrap()]);
    // A client address followed by 100 trusted hops: only 64 are examined, so
    // the walk ends on a trusted address, never reaching the client.
    let hops = std::iter::once("for=192.0.2.1".to_string())
        .chain((0..100).map(|i| format!("for=10.0.{}.{}", i / 250, i % 250)))
        .collect::<Vec<_>>()
        .join(", ");
    let k = key(&x, &with_header("10.1.2.3:443", "forwarded", &[&hops])).unwrap();
    assert!("10.0.0.0/8".parse::<IpNet>().unwrap().contains(k), "{k}");
    let short = "for=192.0.2.1, for=10.0.0.1";
    assert_eq!(
        key(&x, &with_header("10.1.2.3:443", "forwarded", &[short])),
        Some(ip("192.0.2.1"))
    );
}

/// One /48 holder rotating through its 65,536 /64s presents one key by
/// default, so a bound of 10,000 keys stays open to everyone else; grouped by
/// /64 the same client fills it and shuts new clients out.
#[tokio::test]
async fn one_slash_48_cannot_exhaust_the_key_bound_by_default() {
    async fn flood(peer: PeerIp) -> (usize, StatusCode) {
        let quota = Quota::new(1_000_000, 1, Duration::from_secs(1)).unwrap();
        let limiter = KeyedLimiter::builder(quota)
            .max_keys(10_000)
            .build()
            .unwrap();
        let layer = RateLimitLayer::new(Gate::new(limiter), peer);
        let service = ServiceBuilder::new()
            .layer(layer.clone())
            .service(ok_service());
        for subnet in 0..12_000u32 {
            let peer = format!("[2001:db8:1:{subnet:x}::1]:443");
            service.clone().oneshot(request(&peer, &[])).await.unwrap();
        }
        let newcomer = service
            .oneshot(request("[2001:db8:2::1]:443", &[]))
            .await
            .unwrap();
        (layer.gate().limiter().len(), newcomer.status())
    }
    assert_eq!(flood(PeerIp::new()).await, (2, StatusCode::OK));
    let (held, newcomer) = flood(PeerIp::new().ipv6_prefix(64).unwrap()).await;
    assert_eq!((held, newcomer), (10_000, StatusCode::SERVICE_UNAVAILABLE));
}

#[tokio::test]
async fn validators_may_be_closures_over_known_keys() {
    let issued: HashSet<String> = ["k_live_1".to_string(), "k_live_2".to_string()].into();
    let calls = Arc::new(AtomicU32::new(0));
    let seen = calls.clone();
    let keys = ApiKeyHeader::new(HeaderName::from_static("x-api-key")).validate(move |key| {
        seen.fetch_add(1, Ordering::Relaxed);
        issued.contains(key)
    });
    // Clone and Debug survive the closure.
    let copy = keys.clone();
    assert!(format!("{copy:?}").contains("x-api-key"));
    let with = |k: &str| Request::builder().header("x-api-key", k).body(()).unwrap();
    assert_eq!(key(&copy, &with("k_live_2")), Some("k_live_2".to_string()));
    assert_eq!(key(&keys, &with("k_forged")), None);
    assert_eq!(
        calls.load(Ordering::Relaxed),
        2,
        "one closure, shared by the clones"
    );
    let service = ServiceBuilder::new()
        .layer(RateLimitLayer::new(
            Gate::new(KeyedLimiter::<String>::new(Quota::per_minute(5).unwrap())),
            keys,
        ))
        .service(ok_service());
    let forged = service.oneshot(with("k_forged")).await.unwrap();
    assert_eq!(forged.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        forged.headers()["www-authenticate"],
        "ApiKey header=\"x-api-key\""
    );
}

#[tokio::test]
async fn the_global_extractor_shares_one_limit_across_every_client() {
    let layer = RateLimitLayer::new(
        Gate::new(KeyedLimiter::<()>::new(
            Quota::new(2, 1, Duration::from_secs(60)).unwrap(),
        )),
        Global,
    );
    let service = ServiceBuilder::new()
        .layer(layer.clone())
        .service(ok_service());
    let mut statuses = Vec::new();
    for peer in ["192.0.2.1:1", "192.0.2.2:1", "198.51.100.9:1"] {
        statuses.push(
            service
                .clone()
                .oneshot(request(peer, &[]))
                .await
                .unwrap()
                .status(),
        );
    }
    statuses.push(service.oneshot(Request::new(())).await.unwrap().status());
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(layer.gate().limiter().len(), 1);
}

/// RFC 9457 problem details, overwriting what the layer owns to show that
/// the layer wins.
fn problem(denial: &Denial) -> Response<String> {
    let status = denial.status();
    let mut response = Response::new(format!(
        r#"{{"type":"about:blank","status":{},"retry_after":{}}}"#,
        status.as_u16(),
        denial.retry_after_secs().unwrap_or(0)
    ));
    *response.status_mut() = StatusCode::IM_A_TEAPOT;
    let headers = response.headers_mut();
    headers.insert(
        "content-type",
        HeaderValue::from_static("application/problem+json"),
    );
    headers.insert("retry-after", HeaderValue::from_static("1"));
    headers.insert("www-authenticate", HeaderValue::from_static("Basic"));
    response
}

#[tokio::test]
async fn a_denial_hook_sets_the_body_and_the_layer_keeps_its_fields() {
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let gate = Gate::new(KeyedLimiter::<String>::new(
        Quota::new(1, 1, Duration::from_secs(90)).unwrap(),
    ))
    .with_derived_policy("per-key")
    .unwrap();
    let layer = RateLimitLayer::new(
        gate,
        ApiKeyHeader::new(HeaderName::from_static("x-api-key")),
    )
    .deny_with(move |d: &Denial| {
        counted.fetch_add(1, Ordering::Relaxed);
        problem(d)
    });
    let service = ServiceBuilder::new().layer(layer).service(ok_service());
    let with = |k: &str| Request::builder().header("x-api-key", k).body(()).unwrap();
    let admitted = service.clone().oneshot(with("a")).await.unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
    assert_eq!(admitted.body(), "served");
    assert_eq!(
        calls.load(Ordering::Relaxed),
        0,
        "the hook runs for denials only"
    );
    let limited = service.clone().oneshot(with("a")).await.unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        limited.headers()["content-type"],
        "application/problem+json"
    );
    assert_eq!(limited.headers()["retry-after"], "90");
    assert_eq!(
        limited.headers()["ratelimit-policy"],
        "\"per-key\";q=1;w=90"
    );
    assert_eq!(limited.headers()["ratelimit"], "\"per-key\";r=0;t=90");
    assert_eq!(
        limited.body(),
        r#"{"type":"about:blank","status":429,"retry_after":90}"#
    );
    let anonymous = service.oneshot(Request::new(())).await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        anonymous.headers()["www-authenticate"],
        "ApiKey header=\"x-api-key\""
    );
    assert!(!anonymous.headers().contains_key("retry-after"));
    assert_eq!(calls.load(Ordering::Relaxed), 2);
}

#[tokio::test]
async fn the_challenge_can_be_configured_on_the_layer() {
    let layer = RateLimitLayer::new(
        Gate::new(KeyedLimiter::<String>::new(Quota::per_minute(5).unwrap())),
        ApiKeyHeader::new(HeaderName::from_static("authorization")),
    )
    .challenge(HeaderValue::from_static("Bearer realm=\"api\""));
    let service = ServiceBuilder::new().layer(layer).service(ok_service());
    let anonymous = service.oneshot(Request::new(())).await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        anonymous.headers()["www-authenticate"],
        "Bearer realm=\"api\""
    );
}

#[tokio::test]
async fn a_missing_peer_address_is_a_configuration_error_not_a_401() {
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let inner = service_fn(move |_: Request<()>| {
        counted.fetch_add(1, Ordering::Relaxed);
        async { Ok::<_, Infallible>(Response::new(String::new())) }
    });
    let limiter = || KeyedLimiter::new(Quota::per_minute(5).unwrap());
    for layer in [
        RateLimitLayer::new(Gate::new(limiter()), PeerIp::new()),
        RateLimitLayer::new(
            Gate::new(limiter()),
            PeerIp::new().ipv6_prefix(128).unwrap(),
        ),
    ] {
        let service = ServiceBuilder::new().layer(layer).service(inner.clone());
        let response = service.oneshot(Request::new(())).await.unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            response.headers()["content-type"],
            "text/plain; charset=utf-8"
        );
        assert!(
            response.body().contains("no peer-address extension"),
            "{}",
            response.body()
        );
        assert!(!response.headers().contains_key("www-authenticate"));
    }
    let forwarded = RateLimitLayer::new(
        Gate::new(limiter()),
        ForwardedFor::rfc7239(PeerIp::connect_info(), vec!["10.0.0.0/8".parse().unwrap()]),
    );
    // A plain `SocketAddr` is not what this extractor reads: still misconfigured.
    let service = ServiceBuilder::new().layer(forwarded).service(inner);
    let response = service.oneshot(request("10.0.0.1:1", &[])).await.unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(calls.load(Ordering::Relaxed), 0);
}

/// Each algorithm's derived policy is honest: `q` permits sent at once, and
/// again each time the advertised `w` (whole seconds) has passed, are always
/// admitted, whatever the phase against the algorithm's own boundaries; and
/// `q` is tight, since one more at once is refused.
#[test]
fn derived_policies_never_advertise_more_than_the_limiter_allows() {
    fn check<A: turnstile::Algorithm + AdvertisedQuota + Clone>(algorithm: A, expected: &str) {
        let policy = RateLimitPolicy::from_algorithm("p", &algorithm).unwrap();
        let value = policy.policy_value();
        assert_eq!(value, expected);
        let field = |name: &str| -> u64 {
            value
                .split(';')
                .find_map(|p| p.strip_prefix(name))
                .unwrap()
                .parse()
                .unwrap()
        };
        let (q, w) = (field("q=") as u32, Duration::from_secs(field("w=")));
        for phase_ms in [0, 1, 333, 999, 1_500, 7_777] {
            let clock = ManualClock::new();
            clock.set(Duration::from_millis(phase_ms));
            let limiter = RateLimiter::from_parts(algorithm.clone(), clock.clone());
            for round in 0..6 {
                for i in 0..q {
                    let d = limiter.try_acquire();
                    assert!(
                        d.is_allowed(),
                        "{expected}: phase {phase_ms} ms, round {round}, permit {i}"
                    );
                }
                assert!(
                    !limiter.try_acquire().is_allowed(),
                    "{expected}: q is not tight"
                );
                clock.advance(w);
            }
        }
    }
    let secs = Duration::from_secs;
    check(
        TokenBucket::new(Quota::new(3, 1, secs(10)).unwrap()),
        "\"p\";q=3;w=30",
    );
    check(
        TokenBucket::new(Quota::new(5, 2, secs(10)).unwrap()),
        "\"p\";q=5;w=30",
    );
    check(
        TokenBucket::new(Quota::per_second(100).unwrap().burst(20).unwrap()),
        "\"p\";q=20;w=1",
    );
    check(
        TokenBucket::new(Quota::new(4, 1, Duration::from_millis(1_500)).unwrap()),
        "\"p\";q=4;w=6",
    );
    check(
        Gcra::new(Quota::new(3, 1, secs(10)).unwrap()),
        "\"p\";q=3;w=30",
    );
    check(Gcra::new(Quota::per_second(3).unwrap()), "\"p\";q=3;w=2");
    check(FixedWindow::new(50, secs(60)).unwrap(), "\"p\";q=50;w=60");
    check(
        FixedWindow::new(5, Duration::from_millis(2_500)).unwrap(),
        "\"p\";q=5;w=3",
    );
    check(
        SlidingWindow::new(10, secs(60)).unwrap(),
        "\"p\";q=10;w=120",
    );
    assert_eq!(
        Quota::new(3, 1, secs(10)).unwrap().advertised_quota(),
        (3, secs(30))
    );
}

mod any_input {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..300),
            "[ -~]{0,200}".prop_map(String::into_bytes),
            "([0-9.:a-f]{1,40}, ?){0,6}[0-9.:a-f]{0,40}".prop_map(String::into_bytes),
            r#"((for|by|proto)=("?\[?[0-9.:a-f_]{0,30}\]?(:[0-9_a-z]{0,6})?"?|unknown|_x)[;, ]{0,2}){0,8}"#
                .prop_map(String::into_bytes),
        ]
    }

    proptest! {
        /// Any header bytes the http crate accepts, for the API key and for
        /// X-Forwarded-For from a trusted proxy: the answer is 200, 401 or 429,
        /// never a panic or a 500.
        #[test]
        fn no_header_makes_the_layer_panic_or_fail(
            key in header_bytes(),
            forwarded in prop::collection::vec(header_bytes(), 0..4),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let ok = || service_fn(|_: Request<()>| async { Ok::<_, Infallible>(Response::new(String::new())) });
            let quota = Quota::new(1, 1, Duration::from_secs(60)).unwrap();
            let by_key = ServiceBuilder::new()
                .layer(RateLimitLayer::new(
                    Gate::new(KeyedLimiter::<String>::builder(quota).max_keys(4).build().unwrap()),
                    ApiKeyHeader::new(http::header::HeaderName::from_static("x-api-key")),
                ))
                .service(ok());
            let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
            let by_ip = ServiceBuilder::new()
                .layer(RateLimitLayer::new(
                    Gate::new(KeyedLimiter::builder(quota).max_keys(4).build().unwrap()),
                    ForwardedFor::new(PeerIp::new(), trusted.clone()),
                ))
                .service(ok());
            let by_forwarded = ServiceBuilder::new()
                .layer(RateLimitLayer::new(
                    Gate::new(KeyedLimiter::builder(quota).max_keys(4).build().unwrap()),
                    ForwardedFor::rfc7239(PeerIp::new(), trusted),
                ))
                .service(ok());
            let mut request = request("10.0.0.1:1", &[]);
            if let Ok(value) = HeaderValue::from_bytes(&key) {
                request.headers_mut().insert("x-api-key", value);
            }
            for f in &forwarded {
                if let Ok(value) = HeaderValue::from_bytes(f) {
                    request.headers_mut().append("x-forwarded-for", value.clone());
                    request.headers_mut().append("forwarded", value);
                }
            }
            let (parts, body) = request.into_parts();
            for _ in 0..2 {
                let request = Request::from_parts(parts.clone(), body);
                let statuses = runtime.block_on(async {
                    let a = by_key.clone().oneshot(request).await.unwrap().status();
                    let mut again = Request::from_parts(parts.clone(), ());
                    again.extensions_mut().insert("10.0.0.1:1".parse::<SocketAddr>().unwrap());
                    let mut third = again.clone();
                    third.extensions_mut().insert("10.0.0.1:1".parse::<SocketAddr>().unwrap());
                    let b = by_ip.clone().oneshot(again).await.unwrap().status();
                    let c = by_forwarded.clone().oneshot(third).await.unwrap().status();
                    [a, b, c]
                });
                for status in statuses {
                    prop_assert!(
                        [StatusCode::OK, StatusCode::UNAUTHORIZED, StatusCode::TOO_MANY_REQUESTS, StatusCode::SERVICE_UNAVAILABLE].contains(&status),
                        "{}", status
                    );
                }
            }
        }
    }
}

/// A proxy behind `10.0.0.1` that appends to the client's own
/// `X-Forwarded-For` line (nginx's `$proxy_add_x_forwarded_for`).
fn via_proxy(name: &'static str, value: &[u8]) -> Request<()> {
    let mut request = Request::builder()
        .header(
            name,
            HeaderValue::from_bytes(value).expect("a header value"),
        )
        .body(())
        .expect("a request");
    request
        .extensions_mut()
        .insert("10.0.0.1:443".parse::<SocketAddr>().expect("an address"));
    request
}

/// A byte that is not UTF-8 in the client's part of the line made the whole
/// line unreadable, so the trusted proxy's own entry was lost and the request
/// was keyed by the proxy's address: one client could spend the allowance of
/// everyone behind the proxy, its health checks included.
#[tokio::test]
async fn a_non_utf8_client_entry_does_not_hide_the_proxys_entry() {
    let trusted = ["10.0.0.0/8".parse::<IpNet>().expect("a network")];
    let client = Some("203.0.113.9".parse::<IpAddr>().expect("an address"));
    let xff = ForwardedFor::new(PeerIp::new(), trusted);
    let request = via_proxy("x-forwarded-for", b"\xff, 203.0.113.9");
    assert_eq!(
        xff.extract(&RequestHead::of(&request))
            .map(|k| k.into_owned()),
        client
    );
    let forwarded = ForwardedFor::rfc7239(PeerIp::new(), trusted);
    let request = via_proxy("forwarded", b"for=\"\xff\", for=203.0.113.9");
    assert_eq!(
        forwarded
            .extract(&RequestHead::of(&request))
            .map(|k| k.into_owned()),
        client
    );

    // Through the layer: the client's request does not spend the proxy's own
    // allowance.
    let service = ServiceBuilder::new()
        .layer(RateLimitLayer::new(
            Gate::new(KeyedLimiter::<IpAddr>::new(
                Quota::per_minute(1).expect("a valid quota"),
            )),
            ForwardedFor::new(PeerIp::new(), trusted),
        ))
        .service(service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        }));
    let response = service
        .clone()
        .oneshot(via_proxy("x-forwarded-for", b"\x80, 203.0.113.9"))
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::OK);
    let mut health_check = Request::new(());
    health_check
        .extensions_mut()
        .insert("10.0.0.1:2".parse::<SocketAddr>().expect("an address"));
    let response = service.oneshot(health_check).await.expect("infallible");
    assert_eq!(response.status(), StatusCode::OK);
}

/// A network written as an IPv4-mapped address (as dual-stack listeners log
/// IPv4 peers) matched nothing, not even its own address, so a proxy named
/// that way was never trusted.
#[test]
fn an_ipv4_mapped_network_is_its_ipv4_network() {
    let net: IpNet = "::ffff:10.0.0.1".parse().expect("a network");
    assert!(net.contains("::ffff:10.0.0.1".parse().expect("an address")));
    assert!(net.contains("10.0.0.1".parse().expect("an address")));
    assert!(!net.contains("10.0.0.2".parse().expect("an address")));
    let net: IpNet = "::ffff:10.0.0.0/104".parse().expect("a network");
    assert_eq!(net, "10.0.0.0/8".parse().expect("a network"));
    assert!(net.contains("::ffff:10.9.9.9".parse().expect("an address")));
    // Not mapped: an IPv6 network as it was.
    let net: IpNet = "2001:db8::/32".parse().expect("a network");
    assert!(net.contains("2001:db8::1".parse().expect("an address")));
}

/// A client's unclosed quote in its part of a `Forwarded` line, with the
/// trusted proxy's element appended after a comma, used to swallow that
/// element (a left-to-right scan ran the quoted string on to the end), so the
/// client's own `for=` became the key: any address it liked, a fresh one per
/// request, or a victim's. The elements are found from the right now.
#[test]
fn an_unclosed_quote_in_the_clients_forwarded_part_does_not_choose_the_key() {
    let trusted = ["10.0.0.0/8".parse::<IpNet>().expect("a network")];
    let client = Some("203.0.113.9".parse::<IpAddr>().expect("an address"));
    let forwarded = ForwardedFor::rfc7239(PeerIp::new(), trusted);
    let key = |line: &[u8]| {
        forwarded
            .extract(&RequestHead::of(&via_proxy("forwarded", line)))
            .map(|k| k.into_owned())
    };
    for line in [
        &b"for=203.0.113.9"[..],
        b"for=6.6.6.1;x=\", for=203.0.113.9",
        b"for=6.6.6.2;by=\", for=203.0.113.9",
        b"for=\"6.6.6.6, for=203.0.113.9",
        b"for=\"6.6.6.6\\\", for=203.0.113.9",
        b"for=\"6.6.6.6\\\\\", for=203.0.113.9",
        b"for=x;y=\", for=\"203.0.113.9\"",
        b"for=x;y=\", for=\"203.0.113.9:443\"",
        // Well-formed quoted strings with commas and escapes, left of the
        // proxy's element.
        b"for=\"a,b\";x=\"c\\\"d,e\", for=203.0.113.9",
        // A trusted hop between the client's element and the peer.
        b"for=6.6.6.7;x=\", for=203.0.113.9, for=10.1.1.1",
    ] {
        assert_eq!(key(line), client, "{}", String::from_utf8_lossy(line));
    }
    // Several field lines, the last the proxy's: the same.
    let mut request = via_proxy("forwarded", b"for=6.6.6.8;x=\"");
    request
        .headers_mut()
        .append("forwarded", HeaderValue::from_static("for=203.0.113.9"));
    assert_eq!(
        forwarded
            .extract(&RequestHead::of(&request))
            .map(|k| k.into_owned()),
        client
    );
}

/// An IPv6 network that holds the IPv4-mapped range holds IPv4 peers.
#[test]
fn an_ipv6_network_holding_mapped_addresses_holds_ipv4_peers() {
    let all: IpNet = "::/0".parse().expect("a network");
    assert!(all.contains("10.0.0.1".parse().expect("an address")));
    assert!(all.contains("::ffff:10.0.0.1".parse().expect("an address")));
    let mapped: IpNet = "::ffff:0.0.0.0/95".parse().expect("a network");
    assert!(mapped.contains("10.0.0.1".parse().expect("an address")));
    let other: IpNet = "2001:db8::/32".parse().expect("a network");
    assert!(!other.contains("10.0.0.1".parse().expect("an address")));
}

/// Prefixes are digits only.
#[test]
fn a_network_with_a_signed_or_spaced_prefix_is_refused() {
    for bad in [
        "10.0.0.0/+8",
        "10.0.0.0/ 8",
        "10.0.0.0 /8",
        "10.0.0.0/",
        "10.0.0.0/8 /8",
    ] {
        assert!(bad.parse::<IpNet>().is_err(), "{bad}");
    }
    assert_eq!(
        " 10.0.0.0/8 "
            .parse::<IpNet>()
            .expect("spaces around are trimmed"),
        "10.0.0.0/8".parse::<IpNet>().expect("a network")
    );
}

/// An API key is the value with the spaces around it trimmed; spaces inside
/// stay (`Authorization: Bearer <token>` is one key), and a value with a byte
/// that is neither visible ASCII nor a space or tab has none.
#[test]
fn an_api_key_is_the_trimmed_value_spaces_inside_included() {
    let keys = ApiKeyHeader::new(HeaderName::from_static("authorization"));
    let key = |value: &[u8]| {
        let request = Request::builder()
            .header(
                "authorization",
                HeaderValue::from_bytes(value).expect("a header value"),
            )
            .body(())
            .expect("a request");
        keys.extract(&RequestHead::of(&request))
            .map(|k| k.into_owned())
    };
    assert_eq!(key(b"k1"), Some("k1".to_owned()));
    assert_eq!(key(b"  k1 "), Some("k1".to_owned()));
    assert_eq!(key(b"Bearer abc123"), Some("Bearer abc123".to_owned()));
    assert_eq!(key(b"\xffk1"), None);
    assert_eq!(key(b"   "), None);
    // Tabs are whitespace around a key too (a header value holds no other).
    assert_eq!(key(b"\tk1 \t"), Some("k1".to_owned()));
    assert_eq!(key(b"\t \t"), None);
}

/// Tiers behind the layer: each key decided by its tier's quota, one gate's
/// counts for all.
#[tokio::test]
async fn a_tiered_gate_sits_behind_the_layer() {
    let tiers = turnstile::Tiered::new(
        [
            (
                "free",
                KeyedLimiter::<String>::new(Quota::per_hour(1).expect("a valid quota")),
            ),
            (
                "paid",
                KeyedLimiter::<String>::new(Quota::per_hour(3).expect("a valid quota")),
            ),
        ],
        |key: &str| usize::from(key.starts_with("paid_")),
    )
    .expect("two tiers");
    let layer = RateLimitLayer::new(
        Gate::tiered(tiers),
        ApiKeyHeader::new(HeaderName::from_static("x-api-key")),
    );
    let service = ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        }));
    let send = |key: &'static str| {
        let request = Request::builder()
            .header("x-api-key", key)
            .body(())
            .expect("a request");
        service.clone().oneshot(request)
    };
    let mut statuses = Vec::new();
    for key in ["free_1", "free_1", "paid_1", "paid_1", "paid_1", "paid_1"] {
        statuses.push(send(key).await.expect("infallible").status().as_u16());
    }
    assert_eq!(statuses, [200, 429, 200, 200, 200, 429]);
    let denied = send("free_1").await.expect("infallible");
    assert_eq!(denied.headers()["retry-after"], "3600");
    let stats = layer.stats().gate;
    assert_eq!((stats.admitted, stats.too_many_requests), (4, 3));
    assert_eq!(stats.keys, 2);
    assert_eq!(layer.gate().tiers().tier_name("paid_9"), "paid");
}

/// `Gate::response`: the status and fields of each outcome, for a handler
/// that calls the gate itself.
#[test]
fn a_gate_answers_each_outcome_as_a_response() {
    let limiter = KeyedLimiter::<String>::builder(Quota::per_hour(1).expect("a valid quota"))
        .max_keys(1)
        .build()
        .expect("a limiter");
    let gate = Gate::new(limiter)
        .with_derived_policy("api")
        .expect("a valid name");
    let admitted = gate.check(Some("a"));
    let response: Response<String> = gate.response(&admitted);
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().get("retry-after").is_none());
    assert_eq!(response.headers()["ratelimit-policy"], "\"api\";q=1;w=3600");
    let denied: Response<String> = gate.response(&gate.check(Some("a")));
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["retry-after"], "3600");
    assert!(denied.headers().get("ratelimit").is_some());
    let full: Response<String> = gate.response(&gate.check(Some("b")));
    assert_eq!(full.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(full.headers().get("retry-after").is_some());
    let no_key: Response<String> = gate.response(&gate.check(None::<&str>));
    assert_eq!(no_key.status(), StatusCode::UNAUTHORIZED);
}

/// The one-call layers through the service: `per_key` keys each peer apart;
/// `global` is one budget for every request, with no keys held.
#[tokio::test]
async fn the_one_call_layers_limit_per_key_and_globally() {
    let per_key = RateLimitLayer::per_key(PeerIp::new(), Quota::per_hour(1).unwrap());
    let service = ServiceBuilder::new()
        .layer(per_key.clone())
        .service(ok_service());
    let call = |peer: &str| service.clone().oneshot(request(peer, &[]));
    assert_eq!(call("192.0.2.1:1").await.unwrap().status(), StatusCode::OK);
    let limited = call("192.0.2.1:2").await.unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.headers()["retry-after"], "3600");
    assert_eq!(call("192.0.2.2:1").await.unwrap().status(), StatusCode::OK);
    assert_eq!(per_key.stats().gate.keys, 2);

    let global: RateLimitLayer<Global, RateLimiter> =
        RateLimitLayer::global(Quota::per_hour(2).unwrap());
    let service = ServiceBuilder::new()
        .layer(global.clone())
        .service(ok_service());
    let call = |peer: &str| service.clone().oneshot(request(peer, &[]));
    assert_eq!(call("192.0.2.1:1").await.unwrap().status(), StatusCode::OK);
    assert_eq!(call("192.0.2.2:1").await.unwrap().status(), StatusCode::OK);
    let limited = call("192.0.2.3:1").await.unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.headers()["retry-after"], "1800");
    let stats = global.stats().gate;
    assert_eq!(
        (stats.admitted, stats.too_many_requests, stats.keys),
        (2, 1, 0)
    );
}
