//! `GET /metrics`: Prometheus text, scraped and parsed.

#![allow(missing_docs)]

mod common;

use std::collections::HashMap;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use turnstile_server::metrics::DETAILED_PER_LIMIT;

async fn scrape(addr: std::net::SocketAddr) -> HashMap<String, u64> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4")
    );
    let mut series = HashMap::new();
    for line in body.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, value) = line.rsplit_once(' ').expect("`name value`");
        let value: u64 = value.parse().expect("a counter");
        assert!(
            series.insert(name.to_string(), value).is_none(),
            "{name} twice"
        );
    }
    series
}

fn decisions(descriptor: &str, outcome: &str) -> String {
    format!(
        "turnstile_rls_decisions_total{{domain=\"m\",descriptor=\"{descriptor}\",outcome=\"{outcome}\"}}"
    )
}

const CONFIG: &str = "\
domain: m
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: shadow
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: free
    rate_limit: { unlimited: true }
";

#[tokio::test]
async fn decisions_per_limit_and_outcome_and_bounded_detail() {
    let mut rls = start(&[("m.yaml", CONFIG)], Options::default()).await;
    for _ in 0..3 {
        rls.decide(request("m", vec![descriptor(&[("user", "alice")])]))
            .await;
        rls.decide(request("m", vec![descriptor(&[("shadow", "s")])]))
            .await;
    }
    rls.decide(request("m", vec![descriptor(&[("free", "f")])]))
        .await;
    rls.decide(request("m", vec![descriptor(&[("nothing", "n")])]))
        .await;
    rls.decide(request("elsewhere", vec![descriptor(&[("user", "u")])]))
        .await;
    // A value with characters the text format escapes.
    rls.decide(request("m", vec![descriptor(&[("user", "a\"b\\c\nd")])]))
        .await;
    let invalid = rls.ask(request("m", vec![])).await;
    assert!(invalid.is_err());

    let m = scrape(rls.http).await;
    assert_eq!(m[&decisions("m.user", "ok")], 3);
    assert_eq!(m[&decisions("m.user", "over_limit")], 1);
    assert_eq!(m[&decisions("m.shadow", "ok")], 1);
    assert_eq!(m[&decisions("m.shadow", "shadow_over_limit")], 2);
    assert_eq!(m[&decisions("m.shadow", "over_limit")], 0);
    assert_eq!(m[&decisions("m.free", "ok")], 1);
    let detailed = |value: &str, outcome: &str| {
        format!(
            "turnstile_rls_detailed_decisions_total{{domain=\"m\",descriptor=\"m.user_{value}\",outcome=\"{outcome}\"}}"
        )
    };
    assert_eq!(m[&detailed("alice", "ok")], 2);
    assert_eq!(m[&detailed("alice", "over_limit")], 1);
    assert_eq!(m[&detailed("a\\\"b\\\\c\\nd", "ok")], 1);
    // Not detailed: no per-value series.
    assert!(!m.keys().any(|k| k.contains("m.shadow_s")));
    assert_eq!(m["turnstile_rls_unknown_domain_total"], 1);
    assert_eq!(m["turnstile_rls_unknown_descriptor_total"], 1);
    assert_eq!(m["turnstile_rls_requests_total"], 10);
    assert_eq!(m["turnstile_rls_invalid_requests_total"], 1);
    assert_eq!(m["turnstile_rls_config_reloads_total"], 0);
    assert_eq!(m["turnstile_rls_config_reload_errors_total"], 0);

    // A value of a megabyte: its series' name cut and hashed, never held
    // whole (a hundred of them would be 100 MB a limit).
    let long = "v".repeat(1 << 20);
    rls.decide(request("m", vec![descriptor(&[("user", &long)])]))
        .await;
    let m = scrape(rls.http).await;
    let long_series: Vec<&String> = m
        .keys()
        .filter(|k| {
            k.starts_with("turnstile_rls_detailed_decisions_total") && k.contains("m.user_vvv")
        })
        .collect();
    assert_eq!(long_series.len(), 3, "three outcomes: {long_series:?}");
    for series in long_series {
        assert!(series.len() < 400, "{} bytes", series.len());
        assert!(series.contains('#'), "{series}");
    }
    // A flood of distinct values: the detailed series stay bounded, the
    // rest are counted in the overflow and the aggregate.
    let flood = 3 * DETAILED_PER_LIMIT;
    for i in 0..flood {
        rls.decide(request(
            "m",
            vec![descriptor(&[("user", &format!("v{i}"))])],
        ))
        .await;
    }
    let m = scrape(rls.http).await;
    let per_value = m
        .keys()
        .filter(|k| k.starts_with("turnstile_rls_detailed_decisions_total"))
        .count();
    assert_eq!(
        per_value,
        DETAILED_PER_LIMIT * 3,
        "three outcomes per value"
    );
    let kept = DETAILED_PER_LIMIT - 3; // alice, the escaped and the long value came first
    let overflow = "turnstile_rls_detailed_overflow_total{domain=\"m\",descriptor=\"m.user\"}";
    assert_eq!(m[overflow], (flood - kept) as u64);
    assert_eq!(m[&decisions("m.user", "ok")], 4 + flood as u64);
    rls.stop().await;
}

/// Two detailed limits whose values give one series name (`a` per value,
/// asked for `b.c_v`; `a: b` above `c` per value, asked for `v`): one
/// series, their decisions added (the same series twice is not valid
/// exposition; the scrape above refuses it).
#[tokio::test]
async fn detailed_values_of_two_limits_with_one_name_are_one_series() {
    let yaml = "\
domain: d
descriptors:
  - key: a
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: a
    value: b
    descriptors:
      - key: c
        detailed_metric: true
        rate_limit: { unit: minute, requests_per_unit: 5 }
";
    let mut rls = start(&[("d.yaml", yaml)], Options::default()).await;
    rls.decide(request("d", vec![descriptor(&[("a", "b.c_v")])]))
        .await;
    for _ in 0..2 {
        rls.decide(request("d", vec![descriptor(&[("a", "b"), ("c", "v")])]))
            .await;
    }
    let m = scrape(rls.http).await;
    assert_eq!(
        m["turnstile_rls_detailed_decisions_total{domain=\"d\",descriptor=\"d.a_b.c_v\",outcome=\"ok\"}"],
        3
    );
    rls.stop().await;
}
