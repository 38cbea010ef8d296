//! Free and paid API keys on one service: each key's quota from its tier, a
//! key upgraded while traffic runs, and the free tier's quota raised while
//! traffic runs. On a simulated clock.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use turnstile::{KeyedBuilder, LiveTokenBucket, ManualClock, Quota, Tiered};

/// A key's tier, from the set of paid keys.
type TierOf = Box<dyn Fn(&str) -> usize + Send + Sync>;

/// The service's limiter: free keys 5 per second, paid keys 50 per second,
/// each tier's quota changeable while it serves.
pub struct Service {
    pub clock: ManualClock,
    paid: Arc<RwLock<HashSet<String>>>,
    per_key: Tiered<String, TierOf, LiveTokenBucket, ManualClock>,
}

impl Service {
    pub fn new() -> Service {
        let clock = ManualClock::new();
        let tier = |quota: Quota| {
            KeyedBuilder::<String, _>::new(LiveTokenBucket::new(quota).expect("a valid quota"))
                .clock(clock.clone())
                .max_keys(10_000)
                .build()
                .expect("a valid configuration")
        };
        let paid: Arc<RwLock<HashSet<String>>> = Arc::default();
        let lookup = Arc::clone(&paid);
        // The tier function: a read of the set of paid keys. A key it cannot
        // place gets tier 0, the free one.
        let tier_of: TierOf = Box::new(move |key: &str| {
            usize::from(lookup.read().is_ok_and(|paid| paid.contains(key)))
        });
        let per_key = Tiered::new(
            [
                ("free", tier(Quota::per_second(5).expect("a valid quota"))),
                ("paid", tier(Quota::per_second(50).expect("a valid quota"))),
            ],
            tier_of,
        )
        .expect("two tiers");
        Service {
            clock,
            paid,
            per_key,
        }
    }

    /// Mark `key` as paid from now on.
    pub fn upgrade(&self, key: &str) {
        if let Ok(mut paid) = self.paid.write() {
            paid.insert(key.to_string());
        }
    }

    /// `tries` requests from `key` at the current instant; how many were
    /// admitted.
    pub fn burst(&self, key: &str, tries: u32) -> u32 {
        (0..tries)
            .filter(|_| self.per_key.try_acquire(key).is_allowed())
            .count() as u32
    }

    /// Change tier `name`'s quota for every key in it, from now on.
    pub fn set_quota(&self, name: &str, quota: Quota) {
        self.per_key
            .set_quota(name, quota)
            .expect("a known tier and a quota within its ceiling");
    }

    pub fn tier(&self, key: &str) -> &str {
        self.per_key.tier_name(key)
    }
}

/// The example's lines: one second of traffic from three keys, 100 requests
/// each per 100 ms, with `k_alice` upgraded half way and the free tier raised
/// to 10 per second at 700 ms.
pub fn story() -> Vec<String> {
    let service = Service::new();
    service.upgrade("k_paid");
    let keys = ["k_free", "k_paid", "k_alice"];
    let mut lines = Vec::new();
    let mut totals = [0u32; 3];
    for step in 0..10 {
        if step == 5 {
            service.upgrade("k_alice");
            lines.push("t=500 ms: k_alice upgraded to paid".to_string());
        }
        if step == 7 {
            service.set_quota("free", Quota::per_second(10).expect("a valid quota"));
            lines.push("t=700 ms: free tier raised to 10 per second".to_string());
        }
        let admitted: Vec<u32> = keys.iter().map(|key| service.burst(key, 100)).collect();
        for (total, a) in totals.iter_mut().zip(&admitted) {
            *total += a;
        }
        lines.push(format!(
            "t={:>3} ms: admitted k_free {:>2} ({}), k_paid {:>2} ({}), k_alice {:>2} ({})",
            step * 100,
            admitted[0],
            service.tier("k_free"),
            admitted[1],
            service.tier("k_paid"),
            admitted[2],
            service.tier("k_alice"),
        ));
        service.clock.advance(Duration::from_millis(100));
    }
    lines.push(format!(
        "in 1 s: k_free {}, k_paid {}, k_alice {}",
        totals[0], totals[1], totals[2]
    ));
    lines
}
