//! envoyproxy/ratelimit's response header fields
//! (`LIMIT_RESPONSE_HEADERS_ENABLED`): the limit, remaining and reset of the
//! descriptor closest to its limit.

#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::{Options, descriptor, request, start, with_hits};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use turnstile_server::service::{EnvoyHeaderNames, ResponseHeaders};

const YAML: &str = "\
domain: h
descriptors:
  - key: a
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: b
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: c
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: d
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: e
    rate_limit: { unit: hour, requests_per_unit: 5 }
  - key: z
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: zero
    rate_limit: { unit: minute, requests_per_unit: 0 }
  - key: free
    rate_limit: { unlimited: true }
";

fn headers(response: &RateLimitResponse) -> Vec<(String, String)> {
    response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

fn fields(limit: u32, remaining: u32, reset: u64) -> Vec<(String, String)> {
    [
        ("RateLimit-Limit", limit.to_string()),
        ("RateLimit-Remaining", remaining.to_string()),
        ("RateLimit-Reset", reset.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn ask(keys: &[&str]) -> envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
    request("h", keys.iter().map(|k| descriptor(&[(k, "v")])).collect())
}

#[tokio::test]
async fn the_descriptor_closest_to_its_limit_as_envoyproxy_ratelimit() {
    let mut rls = start(
        &[("h.yaml", YAML)],
        Options {
            response_headers: Some(ResponseHeaders::Envoy(EnvoyHeaderNames::default())),
            ..Options::default()
        },
    )
    .await;
    // 12.3 s into the minute: 48 s to its end (envoyproxy/ratelimit: 60 - 12).
    rls.clock.advance(Duration::from_millis(12_300));
    // a: 9 left, b: 2 left: b. Unlimited and unknown descriptors have no limit.
    let r = rls.decide(ask(&["free", "a", "b", "unknown"])).await;
    assert_eq!(headers(&r), fields(3, 2, 48));
    // A tie: the first. d and e both at 4: d's minute.
    let r = rls.decide(ask(&["d", "e"])).await;
    assert_eq!(headers(&r), fields(5, 4, 48));
    let r = rls.decide(ask(&["e", "d"])).await;
    assert_eq!(headers(&r), fields(5, 3, 3_588));
    // Both admitted with none left: the first.
    let r = rls.decide(ask(&["z", "c"])).await;
    assert_eq!(headers(&r), fields(1, 0, 48));
    // Over a limit: that descriptor, with nothing remaining. c: one a
    // second, 0.7 s to go.
    let r = rls.decide(ask(&["c", "a"])).await;
    assert_eq!(headers(&r), fields(1, 0, 1));
    // Two over: the last.
    let r = rls.decide(ask(&["c", "z"])).await;
    assert_eq!(headers(&r), fields(1, 0, 48));
    let r = rls.decide(ask(&["z", "c"])).await;
    assert_eq!(headers(&r), fields(1, 0, 1));
    // No descriptor with a limit: no field.
    let r = rls.decide(ask(&["free", "unknown"])).await;
    assert!(r.response_headers_to_add.is_empty(), "{r:?}");
    // A limit of 0 is never admitted and has no duration_until_reset: the
    // reset is envoyproxy/ratelimit's, the seconds to the wall clock's
    // next minute.
    let r = rls.decide(ask(&["zero"])).await;
    let got = headers(&r);
    assert_eq!(&got[..2], &fields(0, 0, 0)[..2]);
    let reset: u64 = got[2].1.parse().unwrap();
    assert!((1..=60).contains(&reset), "{got:?}");
    // A check of 0 hits on a key with its whole allowance: its window's end
    // too (it said 0: nothing to wait for until whole).
    let r = rls
        .decide(request(
            "h",
            vec![with_hits(descriptor(&[("a", "fresh")]), 0)],
        ))
        .await;
    let got = headers(&r);
    assert_eq!(&got[..2], &fields(10, 10, 0)[..2]);
    let reset: u64 = got[2].1.parse().unwrap();
    assert!((1..=60).contains(&reset), "{got:?}");
    rls.stop().await;
}

#[tokio::test]
async fn the_names_are_the_operators() {
    let names = EnvoyHeaderNames {
        limit: "X-Limit".to_string(),
        remaining: "X-Remaining".to_string(),
        reset: "X-Reset".to_string(),
    };
    let mut rls = start(
        &[("h.yaml", YAML)],
        Options {
            response_headers: Some(ResponseHeaders::Envoy(names)),
            ..Options::default()
        },
    )
    .await;
    let r = rls.decide(ask(&["a"])).await;
    let keys: Vec<String> = headers(&r).into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["X-Limit", "X-Remaining", "X-Reset"]);
    // Only envoyproxy/ratelimit's fields: none of the draft's.
    let r = rls.decide(ask(&["z", "z"])).await;
    assert_eq!(
        headers(&r),
        [
            ("X-Limit".to_string(), "1".to_string()),
            ("X-Remaining".to_string(), "0".to_string()),
            ("X-Reset".to_string(), "60".to_string()),
        ]
    );
    rls.stop().await;
}
