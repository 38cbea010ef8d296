//! Counters, shadow mode, the `metrics` facade and `tracing` events: exact
//! counts after known traffic, from several threads.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use turnstile::{Gate, KeyedLimiter, ManualClock, Outcome, Quota, RateLimiter, WaitOptions};

const THREADS: usize = 4;
const PER_THREAD: u64 = 2_500;

#[test]
fn a_counted_direct_limiter_counts_every_decision_of_every_thread() {
    let clock = ManualClock::new();
    let limiter = Arc::new(
        RateLimiter::with_clock(Quota::per_second(1_000).unwrap(), clock.clone()).counted(),
    );
    let admitted: u64 = (0..THREADS)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || {
                (0..PER_THREAD)
                    .filter(|_| limiter.try_acquire().is_allowed())
                    .count() as u64
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .sum();
    assert_eq!(admitted, 1_000, "the clock never moved: one bucket's worth");
    let stats = limiter.stats();
    assert_eq!(stats.admitted, admitted);
    assert_eq!(stats.denied, THREADS as u64 * PER_THREAD - admitted);
    // `check` and `try_acquire_n` count too; a peek does not.
    let _ = limiter.remaining();
    assert!(limiter.check().is_err());
    assert!(!limiter.try_acquire_n(2).unwrap().is_allowed());
    assert_eq!(limiter.stats().denied, stats.denied + 2);
}

#[test]
fn a_counted_direct_limiter_counts_a_wait_once() {
    let clock = ManualClock::new();
    let limiter = RateLimiter::with_clock(Quota::per_second(1).unwrap(), clock).counted();
    limiter.wait(WaitOptions::new()).unwrap();
    // On a manual clock the second wait skips its sleep: one admission, no
    // denial for the sleep it took.
    limiter.wait(WaitOptions::new()).unwrap();
    let stats = limiter.stats();
    assert_eq!((stats.admitted, stats.denied), (2, 0));
    let options = WaitOptions::new().deadline(Duration::from_millis(10));
    assert!(limiter.wait(options).is_err());
    assert_eq!(limiter.stats().denied, 1);
}

/// Known traffic through a gate: `keys` keys at a bound of `max_keys`, each
/// sending `per_key` requests, plus `anonymous` requests without a key.
fn traffic(
    gate: &Gate<KeyedLimiter<u64, turnstile::TokenBucket, ManualClock>>,
    keys: u64,
    per_key: u32,
    anonymous: u32,
) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    for key in 0..keys {
        for _ in 0..per_key {
            outcomes.push(gate.check(Some(&key)));
        }
    }
    for _ in 0..anonymous {
        outcomes.push(gate.check(None::<&u64>));
    }
    outcomes
}

fn gate(max_keys: usize) -> Gate<KeyedLimiter<u64, turnstile::TokenBucket, ManualClock>> {
    let limiter = KeyedLimiter::<u64>::builder(Quota::per_minute(3).unwrap())
        .clock(ManualClock::new())
        .max_keys(max_keys)
        .build()
        .unwrap();
    Gate::new(limiter)
}

#[test]
fn a_gate_counts_each_status_it_answered() {
    let gate = gate(4);
    // 6 keys, 5 requests each, a bound of 4 keys: 4 keys × (3 admitted + 2
    // denied), 2 keys × 5 refused at the bound; 7 without a key.
    let outcomes = traffic(&gate, 6, 5, 7);
    let count = |status| outcomes.iter().filter(|o| o.status() == status).count() as u64;
    let stats = gate.stats();
    assert_eq!(
        (
            stats.admitted,
            stats.unauthorized,
            stats.too_many_requests,
            stats.unavailable,
            stats.keys
        ),
        (12, 7, 8, 10, 4)
    );
    assert_eq!(
        (count(200), count(401), count(429), count(503)),
        (12, 7, 8, 10)
    );
    assert_eq!(
        (stats.shadowed_too_many_requests, stats.shadowed_unavailable),
        (0, 0)
    );
}

#[test]
fn shadow_mode_denies_nothing_and_counts_what_it_would_have_denied() {
    let gate = gate(4).shadow();
    let outcomes = traffic(&gate, 6, 5, 7);
    // 401 is not a rate decision: shadow mode still answers it.
    assert!(
        outcomes
            .iter()
            .all(|o| o.status() == 200 || o.status() == 401)
    );
    let stats = gate.stats();
    assert_eq!(stats.admitted, 12 + 8 + 10);
    assert_eq!((stats.too_many_requests, stats.unavailable), (0, 0));
    assert_eq!(
        (stats.shadowed_too_many_requests, stats.shadowed_unavailable),
        (8, 10)
    );
    assert_eq!(stats.unauthorized, 7);
    // Switched off while serving: the next denial is enforced.
    gate.set_shadow(false);
    assert_eq!(gate.check(Some(&0)).status(), 429);
    assert_eq!(gate.stats().too_many_requests, 1);
}

#[test]
fn gate_counts_are_exact_across_threads() {
    let gate = Arc::new(gate(1_000_000));
    thread::scope(|scope| {
        for t in 0..THREADS as u64 {
            let gate = &gate;
            scope.spawn(move || {
                for i in 0..PER_THREAD {
                    // Each thread its own 500 keys, 5 requests each.
                    let _ = gate.check(Some(&(t * 1_000 + i % 500)));
                    if i % 10 == 0 {
                        let _ = gate.check(None::<&u64>);
                    }
                }
            });
        }
    });
    let stats = gate.stats();
    let keys = THREADS as u64 * 500;
    assert_eq!(stats.admitted, keys * 3);
    assert_eq!(stats.too_many_requests, keys * 2);
    assert_eq!(stats.unauthorized, THREADS as u64 * PER_THREAD / 10);
    assert_eq!(stats.keys as u64, keys);
}

#[test]
fn published_metrics_render_the_exact_counts() {
    let gate = gate(4);
    let _ = traffic(&gate, 6, 5, 7);
    let direct =
        RateLimiter::with_clock(Quota::per_minute(2).unwrap(), ManualClock::new()).counted();
    for _ in 0..5 {
        let _ = direct.try_acquire();
    }
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        turnstile::metrics::describe();
        gate.stats().publish("api");
        gate.limiter().stats().publish("api_keys");
        direct.stats().publish("outbound");
    });
    let text = handle.render();
    for line in [
        r#"turnstile_responses_total{limiter="api",status="200"} 12"#,
        r#"turnstile_responses_total{limiter="api",status="401"} 7"#,
        r#"turnstile_responses_total{limiter="api",status="429"} 8"#,
        r#"turnstile_responses_total{limiter="api",status="503"} 10"#,
        r#"turnstile_shadowed_total{limiter="api",status="429"} 0"#,
        r#"turnstile_keys{limiter="api"} 4"#,
        r#"turnstile_decisions_total{limiter="api_keys",outcome="admitted"} 12"#,
        r#"turnstile_decisions_total{limiter="api_keys",outcome="denied"} 8"#,
        r#"turnstile_decisions_total{limiter="api_keys",outcome="key_limit"} 10"#,
        r#"turnstile_decisions_total{limiter="outbound",outcome="admitted"} 2"#,
        r#"turnstile_decisions_total{limiter="outbound",outcome="denied"} 3"#,
        "# HELP turnstile_responses_total",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(line)),
            "missing {line:?} in:\n{text}"
        );
    }
}

/// One registry publishes every source under its name: a gate shared with
/// the code that checks, its keyed limiter, a counted direct limiter and a
/// layer (as a clone: clones share their counts). Registering a name again
/// replaces its source, so nothing is published twice.
#[test]
fn a_registry_publishes_every_source_under_its_name() {
    use std::sync::Arc;
    use turnstile::metrics::Registry;
    use turnstile::tower::RateLimitLayer;

    let gate = Arc::new(gate(4));
    let _ = traffic(&gate, 6, 5, 7);
    let direct = Arc::new(
        RateLimiter::with_clock(Quota::per_minute(2).unwrap(), ManualClock::new()).counted(),
    );
    for _ in 0..5 {
        let _ = direct.try_acquire();
    }
    let layer = RateLimitLayer::global(Quota::per_minute(1).unwrap());
    let _ = layer.gate().check(Some(&()));
    let _ = layer.gate().check(Some(&()));

    let registry = Registry::new();
    registry
        .register("api", Arc::clone(&gate))
        .register("outbound", Arc::clone(&direct))
        .register("edge", layer.clone())
        .register("outbound", Arc::clone(&direct));
    assert_eq!(registry.names(), ["api", "edge", "outbound"]);
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || registry.clone().publish());
    let text = handle.render();
    for line in [
        r#"turnstile_responses_total{limiter="api",status="200"} 12"#,
        r#"turnstile_responses_total{limiter="api",status="503"} 10"#,
        r#"turnstile_keys{limiter="api"} 4"#,
        r#"turnstile_decisions_total{limiter="outbound",outcome="admitted"} 2"#,
        r#"turnstile_decisions_total{limiter="outbound",outcome="denied"} 3"#,
        r#"turnstile_responses_total{limiter="edge",status="200"} 1"#,
        r#"turnstile_responses_total{limiter="edge",status="429"} 1"#,
        r#"turnstile_responses_total{limiter="edge",status="500"} 0"#,
        r#"turnstile_keys{limiter="edge"} 0"#,
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(line)),
            "missing {line:?} in:\n{text}"
        );
    }
}
