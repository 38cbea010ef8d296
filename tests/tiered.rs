//! Per-key quotas through tiers: each key decided in its tier's limiter, by a
//! function of the key.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use turnstile::{KeyedLimiter, ManualClock, Quota, Tiered, TieredError, TokenBucket};

type Limiter = KeyedLimiter<String, TokenBucket, ManualClock>;

fn limiter(quota: Quota, clock: &ManualClock) -> Limiter {
    KeyedLimiter::<String>::builder(quota)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// free: 3 per minute; paid: 10 per minute; the tier from the key's prefix.
fn tiers(clock: &ManualClock) -> Tiered<String, impl Fn(&str) -> usize, TokenBucket, ManualClock> {
    Tiered::new(
        [
            ("free", limiter(Quota::per_minute(3).unwrap(), clock)),
            ("paid", limiter(Quota::per_minute(10).unwrap(), clock)),
        ],
        |key: &str| {
            if key.starts_with("paid_") {
                1
            } else if key.starts_with("gold_") {
                7 // no such tier: the first
            } else {
                0
            }
        },
    )
    .unwrap()
}

fn admitted(
    per_key: &Tiered<String, impl Fn(&str) -> usize, TokenBucket, ManualClock>,
    key: &str,
    tries: u32,
) -> u32 {
    (0..tries)
        .filter(|_| per_key.try_acquire(key).is_allowed())
        .count() as u32
}

#[test]
fn each_key_gets_its_tiers_quota() {
    let clock = ManualClock::new();
    let per_key = tiers(&clock);
    assert_eq!(admitted(&per_key, "free_a", 20), 3);
    assert_eq!(admitted(&per_key, "free_b", 20), 3);
    assert_eq!(admitted(&per_key, "paid_a", 20), 10);
    assert_eq!(per_key.tier_name("paid_a"), "paid");
    assert_eq!(per_key.tier_name("free_a"), "free");
    // One word per key, each in its own tier only.
    let stats = per_key.tier_stats();
    assert_eq!(stats[0].0, "free");
    assert_eq!(
        (stats[0].1.keys, stats[0].1.admitted, stats[0].1.denied),
        (2, 6, 34)
    );
    assert_eq!(
        (stats[1].1.keys, stats[1].1.admitted, stats[1].1.denied),
        (1, 10, 10)
    );
    assert_eq!(per_key.len(), 3);
    // A minute later each tier has refilled at its own rate.
    clock.advance(Duration::from_secs(60));
    assert_eq!(per_key.remaining("free_a"), 3);
    assert_eq!(per_key.remaining("paid_a"), 10);
}

#[test]
fn an_index_past_the_last_tier_means_the_first() {
    let clock = ManualClock::new();
    let per_key = tiers(&clock);
    assert_eq!(per_key.tier_name("gold_a"), "free");
    assert_eq!(admitted(&per_key, "gold_a", 20), 3);
}

#[test]
fn n_is_checked_against_the_keys_tier() {
    let clock = ManualClock::new();
    let per_key = tiers(&clock);
    assert!(per_key.try_acquire_n("paid_a", 10).unwrap().is_allowed());
    assert!(
        per_key.try_acquire_n("free_a", 10).is_err(),
        "beyond the free tier's capacity"
    );
    assert!(per_key.try_acquire_n("free_a", 0).is_err());
}

#[test]
fn an_upgrade_starts_fresh_in_the_new_tier_and_never_more() {
    let clock = ManualClock::new();
    let paid: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let lookup = Arc::clone(&paid);
    let per_key = Tiered::new(
        [
            ("free", limiter(Quota::per_minute(3).unwrap(), &clock)),
            ("paid", limiter(Quota::per_minute(10).unwrap(), &clock)),
        ],
        move |key: &str| usize::from(lookup.lock().unwrap().iter().any(|k| k == key)),
    )
    .unwrap();
    assert_eq!(admitted(&per_key, "alice", 5), 3);
    paid.lock().unwrap().push("alice".to_string());
    // The documented bound: the old tier's admissions plus the new tier's
    // capacity, within the same minute.
    assert_eq!(admitted(&per_key, "alice", 50), 10);
    // The free tier's word is idle and goes with a sweep once fresh again.
    clock.advance(Duration::from_secs(60));
    assert_eq!(per_key.tier(0).unwrap().sweep(), 1);
    assert_eq!(per_key.len(), 1);
}

#[test]
fn bad_tier_lists_are_typed_errors() {
    let clock = ManualClock::new();
    let none: Vec<(&str, Limiter)> = Vec::new();
    assert_eq!(
        Tiered::new(none, |_: &str| 0).unwrap_err(),
        TieredError::NoTiers
    );
    let twice = [
        ("free", limiter(Quota::per_minute(3).unwrap(), &clock)),
        ("free", limiter(Quota::per_minute(10).unwrap(), &clock)),
    ];
    let err = Tiered::new(twice, |_: &str| 0).unwrap_err();
    assert_eq!(err, TieredError::DuplicateName("free".into()));
    assert!(err.to_string().contains("free"));
}

#[test]
fn threads_on_both_tiers_are_counted_exactly() {
    let clock = ManualClock::new();
    let per_key = tiers(&clock);
    thread::scope(|scope| {
        for t in 0..4 {
            let per_key = &per_key;
            scope.spawn(move || {
                for i in 0..500 {
                    let key = if i % 2 == 0 {
                        format!("paid_{t}")
                    } else {
                        format!("free_{t}")
                    };
                    let _ = per_key.try_acquire(key.as_str());
                }
            });
        }
    });
    let stats = per_key.tier_stats();
    assert_eq!(stats[0].1.admitted, 4 * 3);
    assert_eq!(stats[1].1.admitted, 4 * 10);
    assert_eq!(stats[0].1.admitted + stats[0].1.denied, 4 * 250);
    assert_eq!(stats[1].1.admitted + stats[1].1.denied, 4 * 250);
}
