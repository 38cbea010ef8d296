//! The tower layer's key extractors and responses, without a server.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tower::{ServiceBuilder, ServiceExt, service_fn};
use turnstile::tower::{ForwardedFor, IpNet, KeyExtractor, PeerIp, RateLimitLayer, RequestHead};
use turnstile::{Gate, KeyedLimiter, Quota};

fn request(peer: &str, forwarded: &[&str]) -> Request<()> {
    let mut builder = Request::builder();
    for f in forwarded {
        builder = builder.header("x-forwarded-for", *f);
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

#[test]
fn peer_addresses_group_ipv6_by_prefix() {
    let x = PeerIp::new();
    let a = request("[2001:db8:1:2:aaaa::1]:80", &[]);
    let b = request("[2001:db8:1:2:bbbb::2]:80", &[]);
    assert_eq!(key(&x, &a), Some(ip("2001:db8:1:2::")));
    assert_eq!(key(&x, &a), key(&x, &b), "one /64, one key");
    let each = PeerIp::new().ipv6_prefix(128);
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
            async { Ok::<_, Infallible>(Response::new(())) }
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

mod any_input {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;
    use turnstile::tower::ApiKeyHeader;

    fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..300),
            "[ -~]{0,200}".prop_map(String::into_bytes),
            "([0-9.:a-f]{1,40}, ?){0,6}[0-9.:a-f]{0,40}".prop_map(String::into_bytes),
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
            let ok = || service_fn(|_: Request<()>| async { Ok::<_, Infallible>(Response::new(())) });
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
                    ForwardedFor::new(PeerIp::new(), trusted),
                ))
                .service(ok());
            let mut request = request("10.0.0.1:1", &[]);
            if let Ok(value) = HeaderValue::from_bytes(&key) {
                request.headers_mut().insert("x-api-key", value);
            }
            for f in &forwarded {
                if let Ok(value) = HeaderValue::from_bytes(f) {
                    request.headers_mut().append("x-forwarded-for", value);
                }
            }
            let (parts, body) = request.into_parts();
            for _ in 0..2 {
                let request = Request::from_parts(parts.clone(), body);
                let statuses = runtime.block_on(async {
                    let a = by_key.clone().oneshot(request).await.unwrap().status();
                    let mut again = Request::from_parts(parts.clone(), ());
                    again.extensions_mut().insert("10.0.0.1:1".parse::<SocketAddr>().unwrap());
                    let b = by_ip.clone().oneshot(again).await.unwrap().status();
                    [a, b]
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
