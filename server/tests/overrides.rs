//! A descriptor's `limit` override, as envoyproxy/ratelimit applies it: in a
//! configured domain, the descriptor is decided against the override's
//! quota in a fixed window, not the configuration's limit.

#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::{Options, descriptor, ok, over, overall_ok, request, reset_nanos, start};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as PbUnit;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use turnstile::Clock;

const YAML: &str = "\
domain: api
descriptors:
  - key: user
    rate_limit: { unit: second, requests_per_unit: 100, name: users }
  - key: quiet
    shadow_mode: true
    rate_limit: { unit: second, requests_per_unit: 1 }
";

fn limited(
    mut d: RateLimitDescriptor,
    requests_per_unit: u32,
    unit: RateLimitUnit,
) -> RateLimitDescriptor {
    d.limit = Some(RateLimitOverride {
        requests_per_unit,
        unit: unit as i32,
    });
    d
}

#[tokio::test]
async fn an_override_takes_the_place_of_the_configured_limit() {
    let mut rls = start(&[("api.yaml", YAML)], Options::default()).await;
    let alice = || limited(descriptor(&[("user", "alice")]), 3, RateLimitUnit::Second);
    for left in [2, 1, 0] {
        let answer = rls.decide(request("api", vec![alice()])).await;
        let status = &answer.statuses[0];
        assert!(ok(status), "{answer:?}");
        assert_eq!(status.limit_remaining, left);
        let limit = status.current_limit.as_ref().expect("the override's limit");
        assert_eq!(limit.requests_per_unit, 3);
        assert_eq!(limit.unit, PbUnit::Second as i32);
        assert_eq!(limit.name, "", "an override has no name");
    }
    let answer = rls.decide(request("api", vec![alice()])).await;
    assert!(
        over(&answer.statuses[0]),
        "the fourth in the second: {answer:?}"
    );
    // Without the override, the same descriptor is the configuration's
    // (100 per second), counted apart.
    let answer = rls
        .decide(request("api", vec![descriptor(&[("user", "alice")])]))
        .await;
    assert!(ok(&answer.statuses[0]));
    assert_eq!(answer.statuses[0].limit_remaining, 99);
    assert_eq!(
        answer.statuses[0].current_limit.as_ref().unwrap().name,
        "users"
    );
    // A fixed window: the next second admits again.
    rls.clock.advance(Duration::from_secs(1));
    let answer = rls.decide(request("api", vec![alice()])).await;
    assert!(ok(&answer.statuses[0]), "{answer:?}");
    assert_eq!(answer.statuses[0].limit_remaining, 2);
    rls.stop().await;
}

#[tokio::test]
async fn an_override_limits_any_descriptor_of_a_configured_domain_and_no_other() {
    let mut rls = start(&[("api.yaml", YAML)], Options::default()).await;
    // No configured limit matches `path`: the override still applies.
    let path = || limited(descriptor(&[("path", "/login")]), 1, RateLimitUnit::Minute);
    assert!(ok(
        &rls.decide(request("api", vec![path()])).await.statuses[0]
    ));
    assert!(over(
        &rls.decide(request("api", vec![path()])).await.statuses[0]
    ));
    // Descriptors that differ in a key or a value are counted apart; the
    // same entries share one count whatever else is in the request.
    let other_key = limited(descriptor(&[("route", "/login")]), 1, RateLimitUnit::Minute);
    assert!(ok(&rls
        .decide(request("api", vec![other_key]))
        .await
        .statuses[0]));
    let two = limited(
        descriptor(&[("path", "/login"), ("user", "bob")]),
        1,
        RateLimitUnit::Minute,
    );
    let answer = rls.decide(request("api", vec![two, path()])).await;
    assert!(ok(&answer.statuses[0]), "{answer:?}");
    assert!(over(&answer.statuses[1]), "{answer:?}");
    // A domain not configured: no limit at all, as envoyproxy/ratelimit.
    for _ in 0..3 {
        let answer = rls.decide(request("elsewhere", vec![path()])).await;
        assert!(ok(&answer.statuses[0]));
        assert!(answer.statuses[0].current_limit.is_none());
    }
    rls.stop().await;
}

#[tokio::test]
async fn an_override_is_never_in_shadow_mode_and_zero_denies_everything() {
    let mut rls = start(&[("api.yaml", YAML)], Options::default()).await;
    // `quiet` is configured in shadow mode; its override is enforced.
    let quiet = || limited(descriptor(&[("quiet", "q")]), 1, RateLimitUnit::Hour);
    assert!(ok(&rls
        .decide(request("api", vec![quiet()]))
        .await
        .statuses[0]));
    let answer = rls.decide(request("api", vec![quiet()])).await;
    assert!(over(&answer.statuses[0]), "{answer:?}");
    // Shadow mode alone answers OK past its limit.
    let plain = || descriptor(&[("quiet", "q")]);
    assert!(ok(&rls
        .decide(request("api", vec![plain()]))
        .await
        .statuses[0]));
    assert!(ok(&rls
        .decide(request("api", vec![plain()]))
        .await
        .statuses[0]));
    let zero = limited(descriptor(&[("user", "carol")]), 0, RateLimitUnit::Day);
    let answer = rls.decide(request("api", vec![zero])).await;
    assert!(over(&answer.statuses[0]), "a limit of 0: {answer:?}");
    rls.stop().await;
}

#[tokio::test]
async fn new_quotas_past_the_bound_are_refused_and_counted() {
    let mut rls = start(
        &[("api.yaml", YAML)],
        Options {
            max_overrides: 2,
            ..Options::default()
        },
    )
    .await;
    let user = |n: u32| limited(descriptor(&[("user", "dave")]), n, RateLimitUnit::Second);
    assert!(ok(&rls
        .decide(request("api", vec![user(5)]))
        .await
        .statuses[0]));
    assert!(ok(&rls
        .decide(request("api", vec![user(6)]))
        .await
        .statuses[0]));
    // A third quota: not made, answered OVER_LIMIT (never admitted untracked).
    let answer = rls.decide(request("api", vec![user(7)])).await;
    assert!(over(&answer.statuses[0]), "{answer:?}");
    assert_eq!(
        answer.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        7
    );
    assert_eq!(rls.service.metrics().overrides_refused(), 1);
    assert!(
        rls.service
            .metrics()
            .render()
            .contains("turnstile_rls_override_refused_total 1\n")
    );
    // The two held go on deciding.
    let answer = rls.decide(request("api", vec![user(5)])).await;
    assert!(ok(&answer.statuses[0]));
    assert_eq!(answer.statuses[0].limit_remaining, 3);
    rls.stop().await;
}

/// A slot is not kept for good by a quota asked for once: once a held
/// limit's every key is back at its whole allowance (its windows ended), a
/// new quota takes its place; a limit whose key still counts is kept. (A
/// search runs at most once a second, so the test waits that out.)
#[tokio::test]
async fn an_idle_override_limit_makes_room_for_a_new_quota() {
    let mut rls = start(
        &[("api.yaml", YAML)],
        Options {
            max_overrides: 2,
            ..Options::default()
        },
    )
    .await;
    let user = |n: u32, unit| limited(descriptor(&[("user", "erin")]), n, unit);
    let decide = |answer: envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        ok(&answer.statuses[0])
    };
    // One quota per second, one per day: both held, the second's key counts
    // for a day.
    assert!(decide(
        rls.decide(request("api", vec![user(5, RateLimitUnit::Second)]))
            .await
    ));
    assert!(decide(
        rls.decide(request("api", vec![user(1, RateLimitUnit::Day)]))
            .await
    ));
    let third = || request("api", vec![user(7, RateLimitUnit::Second)]);
    assert!(!decide(rls.decide(third()).await), "no room yet");
    // The per-second window ends: its key is whole again, and swept.
    rls.clock.advance(Duration::from_secs(2));
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert!(
        decide(rls.decide(third()).await),
        "room made by the idle limit"
    );
    // The per-day limit was kept: its key is still spent.
    assert!(!decide(
        rls.decide(request("api", vec![user(1, RateLimitUnit::Day)]))
            .await
    ));
    rls.stop().await;
}

#[tokio::test]
async fn an_override_in_an_unknown_unit_is_an_invalid_argument() {
    let mut rls = start(&[("api.yaml", YAML)], Options::default()).await;
    for (unit, name) in [(RateLimitUnit::Unknown as i32, "UNKNOWN"), (99, "99")] {
        let mut d = descriptor(&[("user", "erin")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 10,
            unit,
        });
        let error = rls
            .ask(request("api", vec![descriptor(&[("user", "x")]), d]))
            .await
            .expect_err("refused");
        assert_eq!(error.code(), tonic::Code::InvalidArgument);
        assert!(
            error
                .message()
                .contains("descriptor 1's limit override has unit")
                && error.message().contains(name)
                && error
                    .message()
                    .contains("SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR"),
            "{}",
            error.message()
        );
    }
    // Nothing was spent by the refused requests.
    let answer = rls
        .decide(request("api", vec![descriptor(&[("user", "x")])]))
        .await;
    assert_eq!(answer.statuses[0].limit_remaining, 99);
    rls.stop().await;
}

/// envoyproxy/ratelimit keeps every unit of Envoy's enum: a month is 30
/// days, a year 365, and a week (7 in Envoy's newer enum) 7.
#[tokio::test]
async fn an_override_in_weeks_months_or_years_is_kept() {
    let mut rls = start(&[("api.yaml", YAML)], Options::default()).await;
    for (unit, days, name) in [
        (7, 7_u64, PbUnit::Week),
        (RateLimitUnit::Month as i32, 30, PbUnit::Month),
        (RateLimitUnit::Year as i32, 365, PbUnit::Year),
    ] {
        let who = format!("{days}");
        let d = || {
            let mut d = descriptor(&[("user", who.as_str())]);
            d.limit = Some(RateLimitOverride {
                requests_per_unit: 2,
                unit,
            });
            d
        };
        let start = rls.clock.now();
        for left in [1, 0] {
            let answer = rls.decide(request("api", vec![d()])).await;
            assert!(overall_ok(&answer), "{name:?}");
            assert_eq!(answer.statuses[0].limit_remaining, left);
            let limit = answer.statuses[0].current_limit.as_ref().unwrap();
            assert_eq!((limit.requests_per_unit, limit.unit), (2, name as i32));
        }
        let answer = rls.decide(request("api", vec![d()])).await;
        assert!(!overall_ok(&answer), "{name:?}");
        let window = days * 86_400 * 1_000_000_000;
        assert_eq!(
            reset_nanos(&answer.statuses[0]),
            Some(window - start % window),
            "{name:?}"
        );
    }
    rls.stop().await;
}

#[tokio::test]
async fn the_json_endpoint_takes_an_override() {
    let rls = start(&[("api.yaml", YAML)], Options::default()).await;
    let post = |body: &'static str| async move {
        let mut stream = tokio::net::TcpStream::connect(rls.http).await.unwrap();
        let head = format!(
            "POST /json HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(body.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        let status: u16 = answer[9..12].parse().unwrap();
        let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
        (status, body.unwrap_or_default())
    };
    let body = r#"{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"frank"}],
        "limit":{"requests_per_unit":1,"unit":"MINUTE"}}]}"#;
    let (status, first) = post(body).await;
    assert_eq!(status, 200, "{first}");
    let first: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(first["statuses"][0]["currentLimit"]["requestsPerUnit"], 1);
    assert_eq!(first["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    let (status, second) = post(body).await;
    assert_eq!(status, 429, "{second}");
    // The enum's number and proto3's field name are taken too.
    let body = r#"{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"frank"}],
        "limit":{"requestsPerUnit":1,"unit":2}}]}"#;
    let (status, third) = post(body).await;
    assert_eq!(status, 429, "the same limit: {third}");
    let (status, bad) = post(
        r#"{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"g"}],
        "limit":{"requests_per_unit":1,"unit":"FORTNIGHT"}}]}"#,
    )
    .await;
    assert_eq!(status, 400, "{bad}");
    assert!(bad.contains("unknown unit"), "{bad}");
    // WEEK, which the enum this service is built with lacks, by name.
    let (status, week) = post(
        r#"{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"h"}],
        "limit":{"requests_per_unit":1,"unit":"WEEK"}}]}"#,
    )
    .await;
    assert_eq!(status, 200, "{week}");
    assert!(week.contains(r#""unit":"WEEK""#), "{week}");
    rls.stop().await;
}

/// Every override quota a request names is counted in one series per
/// domain: the metrics label never takes the quota (a request's value), so
/// clients naming new quotas cannot grow the series.
#[tokio::test]
async fn override_decisions_are_one_series_per_domain_whatever_the_quota() {
    let mut rls = start(&[("api.yaml", YAML)], Options::default()).await;
    for n in 1..=5 {
        let d = limited(descriptor(&[("user", "erin")]), n, RateLimitUnit::Second);
        assert!(ok(&rls.decide(request("api", vec![d])).await.statuses[0]));
    }
    let text = rls.service.metrics().render();
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("turnstile_rls_decisions_total{") && l.contains("override"))
        .collect();
    assert_eq!(series.len(), 3, "one series per outcome: {text}");
    assert!(
        series
            .iter()
            .all(|l| l.contains(r#"descriptor="api.limit_override""#)),
        "{text}"
    );
    assert!(series.contains(
        &r#"turnstile_rls_decisions_total{domain="api",descriptor="api.limit_override",outcome="ok"} 5"#
    ));
    rls.stop().await;
}
