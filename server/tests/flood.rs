//! A flood of 1,000,000 distinct descriptor values against a bound of
//! 10,000 keys per limit, through the service's in-process API (no TCP, so
//! it runs in seconds even unoptimised): every answer is a typed decision,
//! a key over its limit before the flood is still over it after, and the
//! resident set stops growing once the bound is reached.
//!
//! A test binary of its own, so that the resident set it measures is this
//! test's alone (no other test allocating on a thread beside it).

mod common;

use std::time::Duration;

use common::{descriptor, ok, over, overall_ok, request};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use turnstile::ManualClock;
use turnstile_server::backend::InProcess;
use turnstile_server::clock::ServiceClock;
use turnstile_server::config::Config;
use turnstile_server::metrics::DETAILED_PER_LIMIT;
use turnstile_server::service::{Bounds, RateLimitService};

/// The bound on keys per limit (the server's `--max-keys`).
const MAX_KEYS: usize = 10_000;
/// Distinct values sent, the hot key aside.
const VALUES: usize = 1_000_000;
/// Values sent before the first measure: twice the bound, so that the map,
/// the allocator's arenas and the metrics' bounded series are all at their
/// working size when the growth starts to count.
const WARM_UP: usize = 2 * MAX_KEYS;
/// Descriptors per request: the default bound.
const PER_REQUEST: usize = 64;
/// The resident growth allowed after the warm-up, in KiB. The 980,000
/// values after it must all be refused untracked. Kept, they cost about
/// 100 bytes each (the key's `String` and heap block, the bucket's word,
/// the map's slot): with the bound raised to 1,000,000 this test measures a
/// growth of about 95 MiB (97,112 KiB) and fails. 4 MiB is room for the
/// allocator's noise (0 KiB measured with the bound of 10,000), not for
/// 40,000 keys.
const GROWTH_BOUND_KIB: u64 = 4 * 1024;

const YAML: &str = "\
domain: flood
descriptors:
  - key: ip
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
";

/// The resident set in KiB (`VmRSS` of `/proc/self/status`), or `None` where
/// there is no procfs.
fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Value `i`: distinct for every `i`, the same length as a dotted IPv4.
fn value(i: usize) -> String {
    format!("v{i:09}")
}

#[test]
fn a_million_values_are_refused_past_the_bound_in_bounded_memory() {
    let clock = ManualClock::new();
    let backend = InProcess::new(ServiceClock::manual(clock.clone()), MAX_KEYS);
    let config = Config::from_files(&[("f.yaml".to_string(), YAML.to_string())], &backend)
        .expect("a valid configuration");
    let service = RateLimitService::new(config, Bounds::default(), false);
    // The in-process backend's decisions are ready at once: a current-thread
    // runtime polls each to its end, with no thread beside this one.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let decide = |request: &RateLimitRequest| {
        let response = runtime
            .block_on(service.should_rate_limit(request))
            .unwrap_or_else(|error| panic!("a decision, not an error: {error}"));
        assert_eq!(response.statuses.len(), request.descriptors.len());
        for status in &response.statuses {
            assert!(
                ok(status) || over(status),
                "a typed decision, OK or OVER_LIMIT: {status:?}"
            );
        }
        response
    };
    let hot = request("flood", vec![descriptor(&[("ip", "hot")])]);
    assert!(overall_ok(&decide(&hot)));
    assert!(!overall_ok(&decide(&hot)), "one per minute");

    let mut admitted = 0;
    let mut before = None;
    let mut sent = 0;
    let mut requests = 0;
    while sent < VALUES {
        if sent == WARM_UP {
            before = rss_kib();
        }
        // A request never straddles the warm-up's end.
        let end = if sent < WARM_UP { WARM_UP } else { VALUES };
        let n = PER_REQUEST.min(end - sent);
        let descriptors = (sent..sent + n)
            .map(|i| descriptor(&[("ip", &value(i))]))
            .collect();
        let response = decide(&request("flood", descriptors));
        admitted += response.statuses.iter().filter(|s| ok(s)).count();
        sent += n;
        requests += 1;
        if requests % 1_000 == 0 {
            assert!(
                !overall_ok(&decide(&hot)),
                "the hot key was forgotten after {sent} values"
            );
        }
    }
    let after = rss_kib();
    match (before, after) {
        (Some(before), Some(after)) => {
            let growth = after.saturating_sub(before);
            eprintln!(
                "resident set: {before} KiB after {WARM_UP} values, {after} KiB after {VALUES} \
                 (growth {growth} KiB, bound {GROWTH_BOUND_KIB} KiB)"
            );
            assert!(
                growth < GROWTH_BOUND_KIB,
                "the resident set grew by {growth} KiB after the warm-up \
                 ({before} -> {after} KiB): more than {GROWTH_BOUND_KIB} KiB"
            );
        }
        _ => eprintln!("no /proc/self/status here: the resident set is not measured"),
    }

    assert!(
        !overall_ok(&decide(&hot)),
        "the hot key was forgotten after the flood"
    );
    // The hot key holds one place; the rest went to the first values, and
    // no value past the bound was admitted untracked.
    assert_eq!(admitted, MAX_KEYS - 1);

    // The detailed series kept their bound too.
    let metrics = service.metrics().render();
    let detailed = metrics
        .lines()
        .filter(|l| l.starts_with("turnstile_rls_detailed_decisions_total{"))
        .count();
    assert_eq!(detailed, DETAILED_PER_LIMIT * 3, "one series per outcome");

    // A minute later every key is as good as fresh: room again for a new
    // value, and the hot key's new window admits it.
    clock.advance(Duration::from_secs(60));
    let new = request("flood", vec![descriptor(&[("ip", "new")])]);
    assert!(overall_ok(&decide(&new)));
    assert!(overall_ok(&decide(&hot)));
}
