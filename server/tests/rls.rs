//! The service over real gRPC on 127.0.0.1, with a client from the same
//! protobuf types: every configuration feature, the request's bounds, and
//! the rate-limiter pattern's token-bucket trace on a manual clock.

#![allow(missing_docs)]

mod common;

use std::fmt::Write as _;
use std::time::Duration;

use common::*;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::Code as GrpcCode;
use turnstile::{
    Clock, Decision, FixedWindow, Gcra, Quota, RateLimiter, SlidingWindow, TokenBucket,
};
use turnstile_server::service::Bounds;

const MESSAGING: &str = "\
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 2
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
";

#[tokio::test]
async fn nested_descriptors_and_a_limit_per_value() {
    let mut rls = start(&[("messaging.yaml", MESSAGING)], Options::default()).await;
    let marketing = |n: &str| descriptor(&[("message_type", "marketing"), ("to_number", n)]);
    for left in (0..5).rev() {
        let r = rls
            .decide(request("messaging", vec![marketing("206111")]))
            .await;
        assert!(overall_ok(&r));
        assert_eq!(r.statuses[0].limit_remaining, left);
        let limit = r.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!(limit.requests_per_unit, 5);
    }
    let r = rls
        .decide(request("messaging", vec![marketing("206111")]))
        .await;
    assert!(over(&r.statuses[0]) && !overall_ok(&r));
    // Another number has its own count.
    let r = rls
        .decide(request("messaging", vec![marketing("206222")]))
        .await;
    assert!(ok(&r.statuses[0]));
    assert_eq!(r.statuses[0].limit_remaining, 4);
    // Two descriptors in one request: each decided, overall OVER_LIMIT if one is.
    let lone = descriptor(&[("to_number", "206333")]);
    let r = rls
        .decide(request(
            "messaging",
            vec![marketing("206111"), lone.clone()],
        ))
        .await;
    assert!(over(&r.statuses[0]) && ok(&r.statuses[1]) && !overall_ok(&r));
    assert_eq!(r.statuses[1].limit_remaining, 1);
    // A request deeper than the configuration matches no limit.
    let deep = descriptor(&[("key", "value"), ("subkey", "subvalue")]);
    let r = rls.decide(request("messaging", vec![deep])).await;
    assert!(ok(&r.statuses[0]) && r.statuses[0].current_limit.is_none());
    rls.stop().await;
}

const EDGE: &str = "\
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
  - key: path
    value: /api/*
    rate_limit:
      unit: second
      requests_per_unit: 1
  - key: internal
    rate_limit:
      unlimited: true
";

#[tokio::test]
async fn key_and_value_before_key_alone_wildcards_and_unlimited() {
    let mut rls = start(&[("edge.yaml", EDGE)], Options::default()).await;
    let r = rls
        .decide(request(
            "edge",
            vec![
                descriptor(&[("remote_address", "50.0.0.1")]),
                descriptor(&[("remote_address", "50.0.0.5")]),
            ],
        ))
        .await;
    assert!(ok(&r.statuses[0]) && r.statuses[0].limit_remaining == 9);
    assert!(over(&r.statuses[1]));
    assert_eq!(
        r.statuses[1]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        0
    );
    // `/api/*` matches by prefix; both paths share the wildcard's limit node
    // but each value is its own key.
    for path in ["/api/a", "/api/b"] {
        let r = rls
            .decide(request("edge", vec![descriptor(&[("path", path)])]))
            .await;
        assert!(ok(&r.statuses[0]), "{path}");
        let r = rls
            .decide(request("edge", vec![descriptor(&[("path", path)])]))
            .await;
        assert!(over(&r.statuses[0]), "{path}");
    }
    let r = rls
        .decide(request("edge", vec![descriptor(&[("path", "/web")])]))
        .await;
    assert!(ok(&r.statuses[0]) && r.statuses[0].current_limit.is_none());
    for _ in 0..100 {
        let r = rls
            .decide(request("edge", vec![descriptor(&[("internal", "x")])]))
            .await;
        assert!(ok(&r.statuses[0]));
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    }
    rls.stop().await;
}

/// `share_threshold: true` on a wildcard: every value it matches counts
/// against one allowance, as envoyproxy/ratelimit keys it by the pattern;
/// without it, each value has its own. Nested below a shared wildcard, the
/// other entries still key their own counts.
#[tokio::test]
async fn share_threshold_makes_a_wildcard_one_count() {
    let yaml = "\
domain: files
descriptors:
  - key: path
    value: files/*
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: path
    value: docs/*
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: user
    value: u*
    share_threshold: yes
    descriptors:
      - key: op
        rate_limit: { unit: minute, requests_per_unit: 2 }
";
    let mut rls = start(&[("files.yaml", yaml)], Options::default()).await;
    let path = |p: &str| request("files", vec![descriptor(&[("path", p)])]);
    for (file, left) in [("files/a", 2), ("files/b", 1), ("files/c", 0)] {
        let r = rls.decide(path(file)).await;
        assert!(overall_ok(&r), "{file}");
        assert_eq!(r.statuses[0].limit_remaining, left, "{file}");
    }
    assert!(!overall_ok(&rls.decide(path("files/d")).await));
    assert!(!overall_ok(&rls.decide(path("files/a")).await));
    // Not shared: each value its own three.
    for file in ["docs/a", "docs/b", "docs/c", "docs/d"] {
        let r = rls.decide(path(file)).await;
        assert_eq!(r.statuses[0].limit_remaining, 2, "{file}");
    }
    let op = |u: &str, o: &str| request("files", vec![descriptor(&[("user", u), ("op", o)])]);
    assert!(overall_ok(&rls.decide(op("u1", "read")).await));
    assert!(overall_ok(&rls.decide(op("u2", "read")).await));
    assert!(!overall_ok(&rls.decide(op("u3", "read")).await));
    let r = rls.decide(op("u3", "write")).await;
    assert_eq!(r.statuses[0].limit_remaining, 1);
    rls.stop().await;
}

/// A wildcard matches entries of different keys (`key: user*` matches
/// `user_id` and `userx`; `value: ba*` under `foo` matches the key
/// `foo_bar` as well as `foo` with a value `bar`): each key counts on its
/// own, as envoyproxy/ratelimit's keys hold every entry's key. Keyed by
/// the values alone, `{userx: 7}` was refused for `{user_id: 7}`'s hit.
#[tokio::test]
async fn a_wildcard_counts_each_key_it_matches_on_its_own() {
    let yaml = "\
domain: w
descriptors:
  - key: user*
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: foo
    value: ba*
    rate_limit: { unit: hour, requests_per_unit: 1 }
";
    let mut rls = start(&[("w.yaml", yaml)], Options::default()).await;
    let one = |k: &str, v: &str| request("w", vec![descriptor(&[(k, v)])]);
    assert!(overall_ok(&rls.decide(one("user_id", "7")).await));
    assert!(overall_ok(&rls.decide(one("userx", "7")).await));
    assert!(!overall_ok(&rls.decide(one("user_id", "7")).await));
    assert!(!overall_ok(&rls.decide(one("userx", "7")).await));
    assert!(overall_ok(&rls.decide(one("foo", "bar")).await));
    assert!(overall_ok(&rls.decide(one("foo_bar", "x")).await));
    assert!(overall_ok(&rls.decide(one("foo_ba", "rx")).await));
    assert!(!overall_ok(&rls.decide(one("foo", "bar")).await));
    assert!(!overall_ok(&rls.decide(one("foo_bar", "x")).await));
    rls.stop().await;
}

#[tokio::test]
async fn unknown_domain_or_descriptor_is_ok() {
    let mut rls = start(&[("edge.yaml", EDGE)], Options::default()).await;
    for _ in 0..20 {
        let r = rls
            .decide(request(
                "nowhere",
                vec![descriptor(&[("remote_address", "1")])],
            ))
            .await;
        assert!(overall_ok(&r) && r.statuses.len() == 1 && ok(&r.statuses[0]));
        let r = rls
            .decide(request("edge", vec![descriptor(&[("unknown", "1")])]))
            .await;
        assert!(overall_ok(&r) && r.statuses[0].current_limit.is_none());
    }
    rls.stop().await;
}

#[tokio::test]
async fn shadow_mode_answers_ok_and_counts() {
    let yaml = "\
domain: shadow
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        shadow_mode: true
        rate_limit:
          requests_per_unit: 2
          unit: second
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 2
          unit: second
";
    let mut rls = start(&[("shadow.yaml", yaml)], Options::default()).await;
    let user = |u: &str| {
        request(
            "shadow",
            vec![descriptor(&[("service", "auth"), ("user", u)])],
        )
    };
    let mut b_over = 0;
    for _ in 0..5 {
        let a = rls.decide(user("user-a")).await;
        assert!(overall_ok(&a) && ok(&a.statuses[0]));
        if !overall_ok(&rls.decide(user("user-b")).await) {
            b_over += 1;
        }
    }
    assert_eq!(b_over, 3);
    let stats = rls.service.stats();
    assert_eq!(stats.shadow_denials, 3);
    assert_eq!(stats.over_limit, 3);
    rls.stop().await;
}

/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: with it, a request whose user
/// is over its limit spends nothing of its path's limit (each descriptor
/// answered by its check), and one within every limit spends them all;
/// without it, the path's limit is spent by every request.
#[tokio::test]
async fn with_stop_increments_a_descriptor_over_its_limit_spends_nothing_of_the_others() {
    let yaml = "\
domain: stop
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: fixed_window}
  - key: free
    rate_limit: {unlimited: true}
  - key: watch
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
";
    for stop in [false, true] {
        let options = Options {
            stop_increments: stop,
            ..Options::default()
        };
        let mut rls = start(&[("stop.yaml", yaml)], options).await;
        let asked = |user: &str, path_hits: Option<u64>| {
            let mut path = descriptor(&[("path", "/")]);
            if let Some(hits) = path_hits {
                path = with_hits(path, hits);
            }
            request(
                "stop",
                vec![
                    descriptor(&[("user", user)]),
                    path,
                    descriptor(&[("free", "x")]),
                ],
            )
        };
        for _ in 0..2 {
            assert!(overall_ok(&rls.decide(asked("alice", None)).await));
        }
        for _ in 0..5 {
            let r = rls.decide(asked("alice", None)).await;
            assert!(!overall_ok(&r) && over(&r.statuses[0]), "{r:?}");
            assert!(ok(&r.statuses[1]) && ok(&r.statuses[2]), "{r:?}");
            assert!(reset_nanos(&r.statuses[0]).is_some_and(|n| n > 0), "{r:?}");
        }
        // The path's limit: 2 spent by alice's admitted requests, and with
        // the setting nothing by the 5 refused.
        let spent = if stop { 2 } else { 7 };
        let r = rls.decide(asked("bob", None)).await;
        assert!(overall_ok(&r), "{r:?}");
        assert_eq!(
            r.statuses[1].limit_remaining,
            100 - spent - 1,
            "stop: {stop}"
        );
        // More hits than the path's limit holds: never admitted, so bob's
        // own limit spends nothing of it with the setting.
        let r = rls.decide(asked("bob", Some(101))).await;
        assert!(
            over(&r.statuses[1]) && reset_nanos(&r.statuses[1]).is_none(),
            "{r:?}"
        );
        let check = request("stop", vec![with_hits(descriptor(&[("user", "bob")]), 0)]);
        let r = rls.decide(check).await;
        let bob_left = if stop { 1 } else { 0 };
        assert_eq!(
            r.statuses[0].limit_remaining, bob_left,
            "stop: {stop}: {r:?}"
        );
        // A limit in shadow mode is not enforced: over it, the request goes
        // on and the path's limit is spent (admitted and not counted would
        // let it past the path's limit).
        let watched = || {
            request(
                "stop",
                vec![descriptor(&[("watch", "w")]), descriptor(&[("path", "/w")])],
            )
        };
        for i in 0..3u32 {
            let r = rls.decide(watched()).await;
            assert!(overall_ok(&r), "{r:?}");
            assert_eq!(r.statuses[1].limit_remaining, 99 - i, "stop: {stop}: {r:?}");
        }
        rls.stop().await;
    }
}

/// With the setting, descriptors of one request on the same limit and key
/// are checked for their hits together: two for a user with one left are
/// refused before anything spends, and the path's limit is left whole.
#[tokio::test]
async fn with_stop_increments_the_same_key_twice_is_checked_for_both() {
    let yaml = "\
domain: twice
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 3}
";
    let options = Options {
        stop_increments: true,
        ..Options::default()
    };
    let mut rls = start(&[("twice.yaml", yaml)], options).await;
    for user in ["a", "b", "c"] {
        let r = rls
            .decide(request(
                "twice",
                vec![
                    descriptor(&[("user", user)]),
                    descriptor(&[("user", user)]),
                    descriptor(&[("path", "/")]),
                ],
            ))
            .await;
        assert!(!overall_ok(&r), "{user}: {r:?}");
    }
    let r = rls
        .decide(request("twice", vec![descriptor(&[("path", "/")])]))
        .await;
    assert_eq!(r.statuses[0].limit_remaining, 2, "{r:?}");
    rls.stop().await;
}

#[tokio::test]
async fn replaces_drops_the_named_limit() {
    let yaml = "\
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
";
    let mut rls = start(&[("r.yaml", yaml)], Options::default()).await;
    let one = descriptor(&[("key_1", "value_1"), ("user", "bkthomps")]);
    let two = descriptor(&[("key_2", "value_2"), ("user", "bkthomps")]);
    // Both together: only the 10 per second applies.
    for i in 0..10 {
        let r = rls
            .decide(request("example7", vec![one.clone(), two.clone()]))
            .await;
        assert!(overall_ok(&r), "request {i}");
        assert!(r.statuses[0].current_limit.is_none());
        assert_eq!(r.statuses[1].limit_remaining, 9 - i);
    }
    // The replaced limit is untouched: alone, it still has its 5.
    for left in (0..5).rev() {
        let r = rls.decide(request("example7", vec![one.clone()])).await;
        assert_eq!(r.statuses[0].limit_remaining, left);
        assert_eq!(
            r.statuses[0].current_limit.as_ref().unwrap().name,
            "specific_limit"
        );
    }
    rls.stop().await;
}

/// An unlimited limit that another matched limit names in `replaces` is
/// still answered unlimited (`limit_remaining` 4294967295), as
/// envoyproxy/ratelimit marks a descriptor unlimited before it applies
/// `replaces`; it was answered with 0 remaining.
#[tokio::test]
async fn an_unlimited_limit_replaced_by_another_is_still_answered_unlimited() {
    let yaml = "\
domain: unlimited_replaced
descriptors:
  - key: free
    rate_limit:
      name: open
      unlimited: true
  - key: user
    rate_limit:
      replaces:
        - name: open
      requests_per_unit: 10
      unit: second
";
    let mut rls = start(&[("u.yaml", yaml)], Options::default()).await;
    let r = rls
        .decide(request(
            "unlimited_replaced",
            vec![descriptor(&[("free", "x")]), descriptor(&[("user", "u")])],
        ))
        .await;
    assert!(overall_ok(&r), "{r:?}");
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX, "{r:?}");
    assert_eq!(r.statuses[1].limit_remaining, 9, "{r:?}");
    rls.stop().await;
}

/// A count reported after the fact (Envoy's `apply_on_stream_done` with a
/// descriptor's `hits_addend` read from the response: an LLM's tokens),
/// checked before the request with a `hits_addend` of 0: a report larger
/// than what is left empties the limit, so the next check refuses until it
/// refills. Were a refused report to spend nothing, the limit would never
/// run out.
#[tokio::test]
async fn usage_reported_after_the_fact_empties_the_limit() {
    let yaml = "\
domain: llm
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 1000 }
  - key: bucket
    rate_limit: { unit: minute, requests_per_unit: 1000, algorithm: token_bucket }
  - key: meter
    rate_limit: { unit: minute, requests_per_unit: 1000, algorithm: gcra }
";
    let mut rls = start(&[("llm.yaml", yaml)], Options::default()).await;
    for key in ["user", "bucket", "meter"] {
        let check = || request("llm", vec![with_hits(descriptor(&[(key, "u")]), 0)]);
        let report = |tokens| request("llm", vec![with_hits(descriptor(&[(key, "u")]), tokens)]);
        assert!(overall_ok(&rls.decide(check()).await), "{key}");
        assert!(overall_ok(&rls.decide(report(600)).await), "{key}");
        let r = rls.decide(check()).await;
        assert!(overall_ok(&r), "{key}");
        assert_eq!(r.statuses[0].limit_remaining, 400, "{key}");
        // 600 more against the 400 left: refused, and the 400 are spent.
        assert!(!overall_ok(&rls.decide(report(600)).await), "{key}");
        let r = rls.decide(check()).await;
        assert!(over(&r.statuses[0]), "{key}: the next request is refused");
        // A report larger than the whole limit empties it as well.
        let other = |tokens| request("llm", vec![with_hits(descriptor(&[(key, "v")]), tokens)]);
        assert!(!overall_ok(&rls.decide(other(1200)).await), "{key}");
        assert!(!overall_ok(&rls.decide(other(1)).await), "{key}");
    }
    // The token bucket lent the 200 beyond the 400 left from its next
    // refills (1000 a minute: 60 ms a token): the next hit waits for 201
    // tokens, 12.06 s, and is admitted then (forgiven, it waited 60 ms).
    // GCRA lent them from its next permits, one every 60 ms: the same.
    let hit = |key| request("llm", vec![descriptor(&[(key, "u")])]);
    for key in ["bucket", "meter"] {
        let r = rls.decide(hit(key)).await;
        assert!(over(&r.statuses[0]), "{key}");
        assert_eq!(reset_nanos(&r.statuses[0]), Some(12_060_000_000), "{key}");
    }
    rls.clock.advance(Duration::from_millis(12_059));
    for key in ["bucket", "meter"] {
        assert!(!overall_ok(&rls.decide(hit(key)).await), "{key}");
    }
    rls.clock.advance(Duration::from_millis(1));
    for key in ["bucket", "meter"] {
        assert!(overall_ok(&rls.decide(hit(key)).await), "{key}");
    }
    // The window's end gives the fixed window back whole.
    rls.clock.advance(Duration::from_secs(60));
    let r = rls
        .decide(request("llm", vec![descriptor(&[("user", "u")])]))
        .await;
    assert_eq!(r.statuses[0].limit_remaining, 999);
    rls.stop().await;
}

/// With `--stop-increments-over-limit`, as envoyproxy/ratelimit with
/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, a descriptor refused for more
/// hits than are left spends nothing, even alone.
#[tokio::test]
async fn with_stop_increments_a_lone_refused_descriptor_spends_nothing() {
    let yaml = "domain: s\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 10 }\n";
    let mut rls = start(
        &[("s.yaml", yaml)],
        Options {
            stop_increments: true,
            ..Options::default()
        },
    )
    .await;
    let asked = |hits| request("s", vec![with_hits(descriptor(&[("user", "u")]), hits)]);
    assert!(overall_ok(&rls.decide(asked(6)).await));
    assert!(!overall_ok(&rls.decide(asked(6)).await));
    let r = rls.decide(asked(0)).await;
    assert!(overall_ok(&r));
    assert_eq!(r.statuses[0].limit_remaining, 4);
    rls.stop().await;
}

/// Answers go out at once: without `TCP_NODELAY` on the service's sockets,
/// the end of a response waited for the client's delayed ACK of its start
/// (about 40 ms on Linux), past Envoy's default timeout of 20 ms for a call
/// to the rate limit service, on every request of 16 descriptors (measured
/// 44 ms each). The median of nine answers, of one descriptor and of
/// sixteen, is held well under 40 ms.
#[tokio::test]
async fn answers_are_not_held_back_by_nagles_algorithm() {
    let mut yaml = String::from("domain: n\ndescriptors:\n");
    for i in 0..16 {
        yaml.push_str(&format!(
            "  - key: l{i}\n    rate_limit: {{ unit: second, requests_per_unit: 1000 }}\n"
        ));
    }
    let mut rls = start(&[("n.yaml", &yaml)], Options::default()).await;
    for count in [1, 16] {
        let all: Vec<_> = (0..count)
            .map(|i| descriptor(&[(&format!("l{i}"), "v")]))
            .collect();
        let mut took = Vec::new();
        for _ in 0..9 {
            let start = std::time::Instant::now();
            let r = rls.decide(request("n", all.clone())).await;
            took.push(start.elapsed());
            assert!(overall_ok(&r));
        }
        took.sort();
        assert!(
            took[4] < Duration::from_millis(30),
            "{count} descriptors: {took:?}"
        );
    }
    rls.stop().await;
}

/// A descriptor value that is not UTF-8 (a header byte above 0x7F, which
/// Envoy passes on as it came) is decided with replacement characters: the
/// call used to fail as a whole (`INTERNAL`), and Envoy admits a request
/// whose rate-limit call failed, so one such byte skipped every limit of
/// the request, the per-address one beside it included.
#[tokio::test]
async fn a_value_that_is_not_utf8_is_still_limited_with_the_others() {
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    use prost::Message as _;
    use prost::bytes::{Buf as _, BufMut as _};

    /// Sends a request's bytes as they are; decodes the answer with prost.
    #[derive(Clone, Copy)]
    struct Raw;
    impl tonic::codec::Codec for Raw {
        type Encode = Vec<u8>;
        type Decode = RateLimitResponse;
        type Encoder = Raw;
        type Decoder = Raw;
        fn encoder(&mut self) -> Raw {
            Raw
        }
        fn decoder(&mut self) -> Raw {
            Raw
        }
    }
    impl tonic::codec::Encoder for Raw {
        type Item = Vec<u8>;
        type Error = tonic::Status;
        fn encode(
            &mut self,
            item: Vec<u8>,
            dst: &mut tonic::codec::EncodeBuf<'_>,
        ) -> Result<(), tonic::Status> {
            dst.put_slice(&item);
            Ok(())
        }
    }
    impl tonic::codec::Decoder for Raw {
        type Item = RateLimitResponse;
        type Error = tonic::Status;
        fn decode(
            &mut self,
            src: &mut tonic::codec::DecodeBuf<'_>,
        ) -> Result<Option<RateLimitResponse>, tonic::Status> {
            let bytes = src.copy_to_bytes(src.remaining());
            RateLimitResponse::decode(bytes)
                .map(Some)
                .map_err(|e| tonic::Status::internal(e.to_string()))
        }
    }
    /// A length-delimited field.
    fn field(tag: u8, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![(tag << 3) | 2];
        let mut n = bytes.len();
        while n >= 0x80 {
            out.push((n as u8) | 0x80);
            n >>= 7;
        }
        out.push(n as u8);
        out.extend_from_slice(bytes);
        out
    }
    let descriptor =
        |key: &[u8], value: &[u8]| field(2, &field(1, &[field(1, key), field(2, value)].concat()));

    let yaml = "domain: d\ndescriptors:\n  - key: api_key\n    rate_limit: { unit: hour, requests_per_unit: 2 }\n  - key: ip\n    rate_limit: { unit: hour, requests_per_unit: 3 }\n";
    let rls = start(&[("d.yaml", yaml)], Options::default()).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", rls.grpc))
        .expect("an address")
        .connect()
        .await
        .expect("connected");
    let mut grpc = tonic::client::Grpc::new(channel);
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    );
    let mut codes = Vec::new();
    for _ in 0..4 {
        let bytes = [
            field(1, b"d"),
            descriptor(b"api_key", b"k\xff\xfe"),
            descriptor(b"ip", b"10.0.0.1"),
        ]
        .concat();
        grpc.ready().await.expect("ready");
        let response = grpc
            .unary(tonic::Request::new(bytes), path.clone(), Raw)
            .await
            .expect("an answer, not INTERNAL")
            .into_inner();
        codes.push(response.statuses.iter().map(|s| s.code).collect::<Vec<_>>());
    }
    // The key's 2 an hour, then the address's 3 (spent by the admitted two
    // and the third, which the key refused), both enforced.
    assert_eq!(codes, [vec![1, 1], vec![1, 1], vec![2, 1], vec![2, 2]]);
    rls.stop().await;
}

#[tokio::test]
async fn hits_addend_rules() {
    let yaml = "\
domain: hits
descriptors:
  - key: k
    rate_limit:
      unit: minute
      requests_per_unit: 10
";
    let mut rls = start(&[("h.yaml", yaml)], Options::default()).await;
    let d = || descriptor(&[("k", "v")]);
    // Request-level 0 (unset) spends 1.
    let r = rls.decide(request("hits", vec![d()])).await;
    assert_eq!(r.statuses[0].limit_remaining, 9);
    // Request-level 3 spends 3.
    let mut req = request("hits", vec![d()]);
    req.hits_addend = 3;
    assert_eq!(rls.decide(req.clone()).await.statuses[0].limit_remaining, 6);
    // A descriptor's explicit 0 checks without spending, over a request-level 3.
    req.descriptors = vec![with_hits(d(), 0)];
    for _ in 0..3 {
        let r = rls.decide(req.clone()).await;
        assert!(ok(&r.statuses[0]));
        assert_eq!(r.statuses[0].limit_remaining, 6);
    }
    // A descriptor's 4 overrides the request's 3.
    req.descriptors = vec![with_hits(d(), 4)];
    assert_eq!(rls.decide(req.clone()).await.statuses[0].limit_remaining, 2);
    // 4 more than the 2 left: denied, and the 2 left are spent (as
    // envoyproxy/ratelimit counts a refused request's hits).
    assert!(over(&rls.decide(req.clone()).await.statuses[0]));
    req.descriptors = vec![with_hits(d(), 1)];
    assert!(over(&rls.decide(req.clone()).await.statuses[0]));
    // With nothing left, a check of 0 is OVER_LIMIT and still spends nothing.
    req.descriptors = vec![with_hits(d(), 0)];
    assert!(over(&rls.decide(req.clone()).await.statuses[0]));
    // More hits than the limit can ever give: OVER_LIMIT.
    req.descriptors = vec![with_hits(descriptor(&[("k", "fresh")]), 11)];
    assert!(over(&rls.decide(req).await.statuses[0]));
    rls.stop().await;
}

/// A check (`hits_addend: 0`) on a fixed window's key not yet seen answers
/// the window's end, as envoyproxy/ratelimit does and as every other
/// answer of a fixed window does; it answered 0 s (nothing missing).
#[tokio::test]
async fn a_fixed_window_check_on_a_new_key_answers_the_windows_end() {
    let yaml = "\
domain: f
descriptors:
  - key: k
    rate_limit: { unit: minute, requests_per_unit: 5 }
";
    let mut rls = start(&[("f.yaml", yaml)], Options::default()).await;
    let window = 60_000_000_000_u64;
    let end = window - rls.clock.now() % window;
    let check = |value: &str| request("f", vec![with_hits(descriptor(&[("k", value)]), 0)]);
    let r = rls.decide(check("new")).await;
    assert!(ok(&r.statuses[0]));
    assert_eq!(r.statuses[0].limit_remaining, 5);
    assert_eq!(reset_nanos(&r.statuses[0]), Some(end));
    // The same as a request's answer in that window.
    let r = rls
        .decide(request("f", vec![descriptor(&[("k", "other")])]))
        .await;
    assert_eq!(reset_nanos(&r.statuses[0]), Some(end));
    rls.stop().await;
}

#[tokio::test]
async fn each_unit_is_its_window() {
    let mut yaml = String::from("domain: units\ndescriptors:\n");
    for unit in ["second", "minute", "hour", "DAY", "week", "Month", "year"] {
        write!(
            yaml,
            "  - key: {unit}\n    rate_limit:\n      unit: {unit}\n      requests_per_unit: 2\n"
        )
        .unwrap();
    }
    let mut rls = start(&[("u.yaml", &yaml)], Options::default()).await;
    for (unit, secs) in [
        ("second", 1),
        ("minute", 60),
        ("hour", 3_600),
        ("DAY", 86_400),
        // envoyproxy/ratelimit's lengths: 7, 30 and 365 days.
        ("week", 7 * 86_400),
        ("Month", 30 * 86_400),
        ("year", 365 * 86_400),
    ] {
        let d = || request("units", vec![descriptor(&[(unit, "x")])]);
        let start = rls.clock.now();
        assert!(overall_ok(&rls.decide(d()).await));
        let r = rls.decide(d()).await;
        assert!(overall_ok(&r));
        // The window began at the clock's whole unit: it ends within one unit.
        let window = Duration::from_secs(secs).as_nanos() as u64;
        let reset = reset_nanos(&r.statuses[0]).unwrap();
        assert_eq!(reset, window - start % window, "{unit}");
        let r = rls.decide(d()).await;
        assert!(over(&r.statuses[0]), "{unit}");
        assert_eq!(reset_nanos(&r.statuses[0]), Some(reset), "{unit}");
        rls.clock.advance(Duration::from_nanos(reset - 1));
        assert!(
            !overall_ok(&rls.decide(d()).await),
            "{unit}: a nanosecond early"
        );
        rls.clock.advance(Duration::from_nanos(1));
        assert!(
            overall_ok(&rls.decide(d()).await),
            "{unit}: the next window"
        );
    }
    rls.stop().await;
}

/// Every algorithm takes the long units: `requests_per_unit` per week,
/// month or year, and (for the buckets) a refill of one unit's share.
#[tokio::test]
async fn each_algorithm_takes_weeks_months_and_years() {
    let mut yaml = String::from("domain: long\ndescriptors:\n");
    let algorithms = ["fixed_window", "sliding_window", "token_bucket", "gcra"];
    for unit in ["week", "month", "year"] {
        for algorithm in algorithms {
            write!(
                yaml,
                "  - key: {algorithm}_{unit}\n    rate_limit: {{ unit: {unit}, requests_per_unit: 1000, algorithm: {algorithm} }}\n"
            )
            .unwrap();
        }
        // The largest limit and a burst, on the buckets.
        write!(
            yaml,
            "  - key: big_{unit}\n    rate_limit: {{ unit: {unit}, requests_per_unit: 4294967295 }}\n  - key: burst_{unit}\n    rate_limit: {{ unit: {unit}, requests_per_unit: 1000, algorithm: token_bucket, burst: 5 }}\n"
        )
        .unwrap();
    }
    let mut rls = start(&[("long.yaml", &yaml)], Options::default()).await;
    for (unit, days) in [("week", 7_u64), ("month", 30), ("year", 365)] {
        let length = Duration::from_secs(days * 86_400);
        for algorithm in algorithms {
            let key = format!("{algorithm}_{unit}");
            let d = || request("long", vec![with_hits(descriptor(&[(&key, "x")]), 1000)]);
            let r = rls.decide(d()).await;
            assert!(overall_ok(&r), "{key}");
            assert_eq!(r.statuses[0].limit_remaining, 0, "{key}");
            let r = rls
                .decide(request("long", vec![descriptor(&[(&key, "x")])]))
                .await;
            assert!(over(&r.statuses[0]), "{key}");
            // The next permit comes within one unit (the sliding window's
            // once the previous window weighs little enough: within two),
            // and not within a thousandth of one less a little.
            let wait = reset_nanos(&r.statuses[0]).unwrap();
            let most = if algorithm == "sliding_window" { 2 } else { 1 };
            assert!(wait <= most * length.as_nanos() as u64, "{key}: {wait}");
            assert!(wait >= length.as_nanos() as u64 / 1001, "{key}: {wait}");
        }
        let big = format!("big_{unit}");
        let r = rls
            .decide(request("long", vec![descriptor(&[(&big, "x")])]))
            .await;
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX - 1, "{big}");
        let burst = format!("burst_{unit}");
        let d = || request("long", vec![descriptor(&[(&burst, "x")])]);
        for _ in 0..5 {
            assert!(overall_ok(&rls.decide(d()).await), "{burst}");
        }
        assert!(!overall_ok(&rls.decide(d()).await), "{burst}");
    }
    rls.stop().await;
}

/// The service and the library's limiter of the same algorithm, on the same
/// manual clock, agree on every decision of an irregular sequence.
#[tokio::test]
async fn each_algorithm_decides_as_the_library() {
    let yaml = "\
domain: algos
descriptors:
  - key: fixed_window
    rate_limit: { unit: second, requests_per_unit: 4, algorithm: fixed_window }
  - key: sliding_window
    rate_limit: { unit: second, requests_per_unit: 4, algorithm: sliding_window }
  - key: token_bucket
    rate_limit: { unit: second, requests_per_unit: 4, algorithm: token_bucket, burst: 6 }
  - key: gcra
    rate_limit: { unit: second, requests_per_unit: 4, algorithm: gcra, burst: 6 }
";
    let mut rls = start(&[("a.yaml", yaml)], Options::default()).await;
    let clock = rls.clock.clone();
    let window = Duration::from_secs(1);
    let quota = Quota::per_second(4).unwrap().burst(6).unwrap();
    type Decide = Box<dyn Fn() -> Decision>;
    let library: Vec<(&str, Decide)> = vec![
        ("fixed_window", {
            let l = RateLimiter::from_parts(FixedWindow::new(4, window).unwrap(), clock.clone());
            Box::new(move || l.try_acquire())
        }),
        ("sliding_window", {
            let l = RateLimiter::from_parts(SlidingWindow::new(4, window).unwrap(), clock.clone());
            Box::new(move || l.try_acquire())
        }),
        ("token_bucket", {
            let l = RateLimiter::from_parts(TokenBucket::new(quota), clock.clone());
            Box::new(move || l.try_acquire())
        }),
        ("gcra", {
            let l = RateLimiter::from_parts(Gcra::new(quota), clock.clone());
            Box::new(move || l.try_acquire())
        }),
    ];
    let mut denied = 0;
    // Steps of 0 to 370 ms, a fixed pseudo-random walk.
    let mut x: u64 = 12345;
    for _ in 0..120 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        clock.advance(Duration::from_millis((x >> 33) % 371 / 3));
        for (key, decide) in &library {
            let r = rls
                .decide(request("algos", vec![descriptor(&[(key, "k")])]))
                .await;
            let status = &r.statuses[0];
            match decide() {
                Decision::Allowed { remaining } => {
                    assert!(ok(status), "{key}");
                    assert_eq!(status.limit_remaining, remaining, "{key}");
                }
                Decision::Denied { retry_after } => {
                    denied += 1;
                    assert!(over(status), "{key}");
                    assert_eq!(reset_nanos(status), Some(retry_after.as_nanos()), "{key}");
                }
            }
        }
    }
    assert!(denied > 0, "the sequence must reach the limits");
    rls.stop().await;
}

const PATTERN_TOKEN_BUCKET: &str = "\
t=   0 ms allowed  tokens left 2
t= 100 ms allowed  tokens left 1
t= 200 ms allowed  tokens left 0
t= 300 ms rejected Retry-After: 1 (next token in 700 ms)
t= 500 ms rejected Retry-After: 1 (next token in 500 ms)
t=1300 ms allowed  tokens left 0
t=1400 ms rejected Retry-After: 1 (next token in 600 ms)
t=3500 ms allowed  tokens left 1
";

#[tokio::test]
async fn the_pattern_token_bucket_trace_through_the_service() {
    // Capacity 3, one token every 1000 ms: 1 per second with a burst of 3.
    let yaml = "\
domain: pattern
descriptors:
  - key: client
    rate_limit: { unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 3 }
";
    let mut rls = start(
        &[("p.yaml", yaml)],
        Options {
            headers: true,
            ..Options::default()
        },
    )
    .await;
    let library = RateLimiter::with_clock(
        Quota::new(3, 1, Duration::from_millis(1000)).unwrap(),
        rls.clock.clone(),
    );
    let (mut service_trace, mut library_trace) = (String::new(), String::new());
    for t in [0u64, 100, 200, 300, 500, 1300, 1400, 3500] {
        rls.clock.set(Duration::from_millis(t));
        let r = rls
            .decide(request("pattern", vec![descriptor(&[("client", "alice")])]))
            .await;
        let status = &r.statuses[0];
        if ok(status) {
            writeln!(
                service_trace,
                "t={t:4} ms allowed  tokens left {}",
                status.limit_remaining
            )
            .unwrap();
        } else {
            let nanos = reset_nanos(status).unwrap();
            let retry_after = r
                .response_headers_to_add
                .iter()
                .find(|h| h.key == "Retry-After")
                .map(|h| h.value.clone())
                .unwrap();
            writeln!(
                service_trace,
                "t={t:4} ms rejected Retry-After: {retry_after} (next token in {} ms)",
                nanos.div_ceil(1_000_000)
            )
            .unwrap();
        }
        match library.try_acquire() {
            Decision::Allowed { remaining } => {
                writeln!(library_trace, "t={t:4} ms allowed  tokens left {remaining}").unwrap()
            }
            Decision::Denied { retry_after } => writeln!(
                library_trace,
                "t={t:4} ms rejected Retry-After: {} (next token in {} ms)",
                retry_after.header_secs(),
                retry_after.millis_ceil()
            )
            .unwrap(),
        }
    }
    assert_eq!(service_trace, library_trace);
    assert_eq!(service_trace, PATTERN_TOKEN_BUCKET);
    rls.stop().await;
}

/// The value of the response header field `key` Envoy is asked to add.
fn header(
    response: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse,
    key: &str,
) -> Option<String> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key == key)
        .map(|h| h.value.clone())
}

#[tokio::test]
async fn response_headers_carry_the_policy_and_retry_after() {
    let yaml = "\
domain: h
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 2, name: per_user }
";
    let mut rls = start(
        &[("h.yaml", yaml)],
        Options {
            headers: true,
            ..Options::default()
        },
    )
    .await;
    rls.clock.set(Duration::from_millis(59_500));
    let d = || request("h", vec![descriptor(&[("user", "u")])]);
    let r = rls.decide(d()).await;
    assert_eq!(
        header(&r, "RateLimit-Policy").as_deref(),
        Some("\"h.user\";q=2;w=60")
    );
    assert_eq!(header(&r, "RateLimit").as_deref(), Some("\"h.user\";r=1"));
    assert_eq!(header(&r, "Retry-After"), None);
    rls.decide(d()).await;
    let r = rls.decide(d()).await;
    // 500 ms to the window's end: rounded up to a whole second.
    assert_eq!(header(&r, "Retry-After").as_deref(), Some("1"));
    assert_eq!(
        header(&r, "RateLimit").as_deref(),
        Some("\"h.user\";r=0;t=1")
    );
    rls.stop().await;
}

/// More hits than a limit can ever hold (or a limit of 0) are refused with
/// no `Retry-After` and no `t`: a wait of 0 would invite an immediate retry
/// that is refused again, forever. Beside a descriptor refused with a wait,
/// the field is that one's.
#[tokio::test]
async fn a_request_never_admitted_is_told_no_time_to_retry() {
    let yaml = "\
domain: h
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: closed
    rate_limit: { unit: minute, requests_per_unit: 0 }
";
    let mut rls = start(
        &[("h.yaml", yaml)],
        Options {
            headers: true,
            ..Options::default()
        },
    )
    .await;
    let too_many = with_hits(descriptor(&[("user", "u")]), 3);
    let r = rls.decide(request("h", vec![too_many.clone()])).await;
    assert!(!overall_ok(&r));
    assert!(over(&r.statuses[0]));
    assert_eq!(reset_nanos(&r.statuses[0]), None);
    assert_eq!(header(&r, "Retry-After"), None);
    assert_eq!(header(&r, "RateLimit").as_deref(), Some("\"h.user\";r=0"));
    // What was left is spent: the two permits are gone (a count reported
    // after the fact that is larger than the limit still empties it).
    let r = rls
        .decide(request("h", vec![descriptor(&[("user", "u")])]))
        .await;
    assert!(!overall_ok(&r));

    let r = rls
        .decide(request("h", vec![descriptor(&[("closed", "c")])]))
        .await;
    assert!(!overall_ok(&r));
    assert_eq!(header(&r, "Retry-After"), None);

    // Beside a descriptor refused with a wait (the spent user), the wait.
    let r = rls
        .decide(request(
            "h",
            vec![descriptor(&[("closed", "c")]), descriptor(&[("user", "u")])],
        ))
        .await;
    assert!(!overall_ok(&r));
    let secs: u64 = header(&r, "Retry-After")
        .expect("the spent user's wait")
        .parse()
        .expect("whole seconds");
    assert!((1..=60).contains(&secs), "{secs}");
    rls.stop().await;
}

#[tokio::test]
async fn bounds_are_invalid_argument() {
    let bounds = Bounds::default();
    let mut rls = start(&[("edge.yaml", EDGE)], Options::default()).await;
    let d = || descriptor(&[("remote_address", "1")]);
    let cases: Vec<(&str, RateLimitRequest)> = vec![
        ("10,000 descriptors", request("edge", vec![d(); 10_000])),
        (
            "a long domain",
            request(&"d".repeat(bounds.max_length + 1), vec![d()]),
        ),
        (
            "too many entries",
            request(
                "edge",
                vec![descriptor(&vec![("k", "v"); bounds.max_entries + 1])],
            ),
        ),
        ("no domain", request("", vec![d()])),
        ("no descriptor", request("edge", vec![])),
    ];
    for (what, req) in cases {
        let status = rls.ask(req).await.expect_err(what);
        assert_eq!(
            status.code(),
            GrpcCode::InvalidArgument,
            "{what}: {status:?}"
        );
    }
    // Each counted, those the codec refused before decoding among them.
    assert_eq!(rls.service.metrics().invalid_requests(), 5);
    // At the bounds exactly: answered.
    let most = request(
        "edge",
        vec![descriptor(&[("internal", "x")]); bounds.max_descriptors],
    );
    assert_eq!(
        rls.decide(most).await.statuses.len(),
        bounds.max_descriptors
    );
    rls.stop().await;
}

/// A key or value of any length (up to the message size) is decided, not
/// refused: Envoy allows a request whose rate-limit call fails
/// (`failure_mode_deny` is off by default), so refusing a long value let a
/// client that padded the header or path behind one descriptor past every
/// limit of its request, the per-address limit among them. A long value is
/// limited as any other, under its own key.
#[tokio::test]
async fn a_long_value_is_limited_not_refused() {
    let mut rls = start(&[("edge.yaml", EDGE)], Options::default()).await;
    let long = "x".repeat(1 << 20);
    let key = "k".repeat(Bounds::default().max_length + 1);
    let padded = || {
        request(
            "edge",
            vec![
                descriptor(&[("remote_address", "50.0.0.9")]),
                descriptor(&[("path", &format!("/api/{long}"))]),
                descriptor(&[(&key, "v")]),
            ],
        )
    };
    // `path` `/api/*`: one a second, the long path its own key.
    let first = rls.decide(padded()).await;
    assert!(overall_ok(&first), "{first:?}");
    let second = rls.decide(padded()).await;
    assert!(!overall_ok(&second), "the path's limit holds: {second:?}");
    assert_eq!(rls.service.metrics().invalid_requests(), 0);
    // The address's own limit counted both: 10 a second, 8 left.
    let again = rls
        .decide(request(
            "edge",
            vec![descriptor(&[("remote_address", "50.0.0.9")])],
        ))
        .await;
    assert_eq!(again.statuses[0].limit_remaining, 7, "{again:?}");
    rls.stop().await;
}

/// Bytes that are not a `RateLimitRequest` (its descriptors written as a
/// number) are refused by prost's decoding, as a gRPC error, and counted;
/// the service goes on answering. (Strings that are not UTF-8 are decided:
/// `a_value_that_is_not_utf8_is_still_limited_with_the_others`.)
#[tokio::test]
async fn a_malformed_request_is_refused_and_the_service_goes_on() {
    #[derive(Clone, PartialEq, prost::Message)]
    struct RawRequest {
        #[prost(bytes = "vec", tag = "1")]
        domain: Vec<u8>,
        #[prost(uint64, tag = "2")]
        descriptors: u64,
    }
    let mut rls = start(&[("edge.yaml", EDGE)], Options::default()).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", rls.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    );
    let codec: tonic_prost::ProstCodec<RawRequest, RawRequest> = tonic_prost::ProstCodec::default();
    let raw = RawRequest {
        domain: vec![0xff, 0xfe, b'x'],
        descriptors: 7,
    };
    let status = grpc
        .unary(tonic::Request::new(raw), path, codec)
        .await
        .expect_err("a malformed request must be refused");
    assert_ne!(status.code(), GrpcCode::Ok);
    assert_eq!(rls.service.metrics().invalid_requests(), 1, "counted");
    assert!(
        status.message().contains("UTF-8")
            || status.message().contains("utf-8")
            || status.message().contains("decode"),
        "{status:?}"
    );
    let r = rls
        .decide(request(
            "edge",
            vec![descriptor(&[("remote_address", "1")])],
        ))
        .await;
    assert!(overall_ok(&r));
    rls.stop().await;
}

/// A flood of distinct values past the key bound: the bound holds (new values
/// are refused, never admitted untracked), and a key over its limit is never
/// forgotten; once the window has passed, idle keys make room again.
#[tokio::test]
async fn a_flood_of_values_is_bounded_and_forgets_no_key_over_its_limit() {
    let yaml = "\
domain: flood
descriptors:
  - key: ip
    rate_limit: { unit: minute, requests_per_unit: 1 }
";
    let max_keys = 100;
    let mut rls = start(
        &[("f.yaml", yaml)],
        Options {
            max_keys,
            ..Options::default()
        },
    )
    .await;
    let ip = |v: &str| request("flood", vec![descriptor(&[("ip", v)])]);
    assert!(overall_ok(&rls.decide(ip("hot")).await));
    assert!(!overall_ok(&rls.decide(ip("hot")).await));
    let mut admitted = 0;
    for chunk in 0..20 {
        // 50 values per request: 1,000 distinct values in all.
        let descriptors = (0..50)
            .map(|i| descriptor(&[("ip", &format!("10.0.{chunk}.{i}"))]))
            .collect();
        let r = rls.decide(request("flood", descriptors)).await;
        admitted += r.statuses.iter().filter(|s| ok(s)).count();
        let hot = rls.decide(ip("hot")).await;
        assert!(
            !overall_ok(&hot),
            "the hot key was forgotten after chunk {chunk}"
        );
    }
    // The hot key holds one place; no more than the rest were admitted.
    assert_eq!(admitted, max_keys - 1);
    // A minute later every key is as good as fresh: room again, and the hot
    // key's new window admits it.
    rls.clock.advance(Duration::from_secs(60));
    assert!(overall_ok(&rls.decide(ip("new")).await));
    assert!(overall_ok(&rls.decide(ip("hot")).await));
    rls.stop().await;
}

#[tokio::test]
async fn several_domains_from_a_directory() {
    let dir = std::env::temp_dir().join(format!("turnstile-rls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("edge.yaml"), EDGE).unwrap();
    std::fs::write(dir.join("messaging.yml"), MESSAGING).unwrap();
    std::fs::write(dir.join(".hidden.yaml"), "not: [valid").unwrap();
    std::fs::write(dir.join("notes.txt"), "ignored").unwrap();
    let backend = turnstile_server::backend::InProcess::default();
    let config = turnstile_server::config::Config::load_dir(&dir, &backend).unwrap();
    let mut domains: Vec<&str> = config.domains().collect();
    domains.sort_unstable();
    assert_eq!(domains, ["edge", "messaging"]);
    assert!(config.lookup("messaging", [("to_number", "1")]).is_some());
    assert!(config.lookup("edge", [("remote_address", "1")]).is_some());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn the_health_service_and_graceful_shutdown() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let rls = start(&[("edge.yaml", EDGE)], Options::default()).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", rls.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    // `ratelimit`: envoyproxy/ratelimit's name, which its probes ask for.
    let names = [
        "",
        "ratelimit",
        "envoy.service.ratelimit.v3.RateLimitService",
    ];
    for service in names {
        let answer = health
            .check(HealthCheckRequest {
                service: service.to_string(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            answer.status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "{service:?}"
        );
    }
    // Once the shutdown has begun, every name answers NOT_SERVING (the
    // statuses follow the service's within a moment).
    rls.service.set_serving(false);
    for service in names {
        let mut status = 0;
        for _ in 0..200 {
            status = health
                .check(HealthCheckRequest {
                    service: service.to_string(),
                })
                .await
                .unwrap()
                .into_inner()
                .status;
            if status == NOT_SERVING {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(status, NOT_SERVING, "{service:?}");
    }
    // An unknown name is NOT_FOUND, as gRPC's health protocol says.
    let unknown = health
        .check(HealthCheckRequest {
            service: "nothing".to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    drop(health);
    rls.stop().await;
}

/// The shutdown signal itself turns every gRPC health name `NOT_SERVING`
/// while the server drains. A new connection is refused once the listener
/// closes, and an open one takes no new request (HTTP/2's `GOAWAY`), so the
/// change is watched: a `Watch` opened before the signal reads `SERVING`,
/// then `NOT_SERVING`, and keeps its connection, and so the drain, open.
/// When the statuses are updated, both the service's change and the
/// listeners' stop are ready (the signal makes them one after the other,
/// with no wait between); picked at random, the stop would end the updates
/// first half the time, and the statuses would stay `SERVING`. Several
/// rounds make that plain.
#[tokio::test]
async fn the_shutdown_signal_turns_grpc_health_not_serving() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let names = [
        "",
        "ratelimit",
        "envoy.service.ratelimit.v3.RateLimitService",
    ];
    for round in 0..16 {
        let mut rls = start(&[("edge.yaml", EDGE)], Options::default()).await;
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", rls.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut health = HealthClient::new(channel);
        let mut watches = Vec::new();
        for service in names {
            let mut watch = health
                .watch(HealthCheckRequest {
                    service: service.to_string(),
                })
                .await
                .unwrap()
                .into_inner();
            let first = watch.message().await.unwrap().expect("a status");
            assert_eq!(first.status, SERVING, "round {round}, {service:?}");
            watches.push(watch);
        }
        rls.begin_shutdown();
        for (service, watch) in names.iter().zip(&mut watches) {
            let next = tokio::time::timeout(Duration::from_secs(5), watch.message())
                .await
                .unwrap_or_else(|_| panic!("round {round}, {service:?}: still SERVING"))
                .unwrap()
                .expect("a status");
            assert_eq!(next.status, NOT_SERVING, "round {round}, {service:?}");
        }
        // `/healthcheck` answers from the same flag (500 once it is false:
        // tests/json.rs); its listener is closed by now.
        assert!(!rls.service.serving());
        // Still draining: the watches hold their connection open.
        assert!(!rls.finished());
        drop(watches);
        drop(health);
        tokio::time::timeout(Duration::from_secs(5), rls.stop())
            .await
            .expect("serve returns once the watches are gone");
    }
}

const SERVING: i32 = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
const NOT_SERVING: i32 = tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;

/// A check (`hits_addend: 0`) on a sliding window over its limit answers
/// the wait a request would get: past the window's end, while the previous
/// window still counts. It answered the window's end, when the same check
/// (and a request) was still refused.
#[tokio::test]
async fn a_sliding_window_check_waits_as_long_as_a_request() {
    let yaml = "\
domain: s
descriptors:
  - key: k
    rate_limit: { unit: minute, requests_per_unit: 2, algorithm: sliding_window }
";
    let mut rls = start(&[("s.yaml", yaml)], Options::default()).await;
    let spend = || request("s", vec![descriptor(&[("k", "v")])]);
    let check = || request("s", vec![with_hits(descriptor(&[("k", "v")]), 0)]);
    assert!(overall_ok(&rls.decide(spend()).await));
    assert!(overall_ok(&rls.decide(spend()).await));
    rls.clock.advance(Duration::from_secs(1));
    let r = rls.decide(check()).await;
    assert!(!overall_ok(&r));
    let wait = reset_nanos(&r.statuses[0]).expect("a wait");
    // Not before the wait: refused a nanosecond short of it.
    rls.clock.advance(Duration::from_nanos(wait - 1));
    assert!(!overall_ok(&rls.decide(check()).await));
    rls.clock.advance(Duration::from_nanos(1));
    assert!(overall_ok(&rls.decide(check()).await), "after {wait} ns");
    assert!(overall_ok(&rls.decide(spend()).await), "after {wait} ns");
    rls.stop().await;
}

/// A check on a new key while the limit holds `--max-keys` keys is refused
/// as a request for it is (the key bound), never answered OK with a full
/// allowance that nothing would grant.
#[tokio::test]
async fn a_check_on_a_new_key_at_the_key_bound_is_refused_as_a_request_is() {
    let yaml = "\
domain: b
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 5 }
";
    let mut rls = start(
        &[("b.yaml", yaml)],
        Options {
            max_keys: 1,
            ..Options::default()
        },
    )
    .await;
    assert!(overall_ok(
        &rls.decide(request("b", vec![descriptor(&[("user", "a")])]))
            .await
    ));
    let check = rls
        .decide(request(
            "b",
            vec![with_hits(descriptor(&[("user", "b")]), 0)],
        ))
        .await;
    let real = rls
        .decide(request("b", vec![descriptor(&[("user", "b")])]))
        .await;
    assert!(!overall_ok(&real), "the key bound refuses b");
    assert!(!overall_ok(&check), "{:?}", check.statuses[0]);
    assert_eq!(check.statuses[0].limit_remaining, 0);
    rls.stop().await;
}
