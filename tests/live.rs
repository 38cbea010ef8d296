//! Live reconfiguration ([`turnstile::LiveTokenBucket`]).
//!
//! - Against a model: random traces of acquire, peek, advance and quota
//!   changes on a direct and on a keyed limiter (with sweeps) decide exactly
//!   as `tests/model` does, where a change settles the bucket under the old
//!   quota, keeps at most the new capacity, and restarts the refill grid.
//! - Under threads: deciders race a thread that changes the quota and moves
//!   the clock; the permits admitted stay within the bound the changes allow,
//!   and the limiter ends on the last quota.

mod model;

#[path = "support/deciders.rs"]
mod deciders;
#[path = "support/live_ops.rs"]
mod live_ops;

use std::sync::Arc;
use std::time::Duration;

use deciders::Deciders;
use live_ops::{KEYS, Op};
use model::Model;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use turnstile::{
    Decision, KeyedBuilder, KeyedDecision, KeyedLimiter, LiveTokenBucket, ManualClock, Quota,
    QuotaError, RateLimiter, Tiered,
};

/// The quotas a trace switches between: lower, higher, faster, slower, with
/// amounts above one, all in whole microseconds.
fn quotas() -> Vec<Quota> {
    let q = |c, a, micros| Quota::new(c, a, Duration::from_micros(micros)).unwrap();
    vec![
        q(5, 1, 1_000),
        q(2, 1, 300),
        q(12, 3, 2_500),
        q(1, 1, 100),
        q(40, 7, 999),
        q(5, 5, 5_000),
    ]
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    live_ops::ops(false)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 600,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    }
}

/// What a limiter under test must answer.
trait Subject {
    fn acquire(&self, key: usize, n: u32) -> Result<Decision, ()>;
    fn remaining(&self, key: usize) -> u32;
    fn set_quota(&self, quota: Quota);
    fn sweep(&self);
}

impl Subject for RateLimiter<LiveTokenBucket, ManualClock> {
    fn acquire(&self, _key: usize, n: u32) -> Result<Decision, ()> {
        self.try_acquire_n(n).map_err(|_| ())
    }
    fn remaining(&self, _key: usize) -> u32 {
        RateLimiter::remaining(self)
    }
    fn set_quota(&self, quota: Quota) {
        RateLimiter::set_quota(self, quota).unwrap();
    }
    fn sweep(&self) {}
}

impl Subject for KeyedLimiter<usize, LiveTokenBucket, ManualClock> {
    fn acquire(&self, key: usize, n: u32) -> Result<Decision, ()> {
        self.try_acquire_n(&key, n)
            .map(|d| match d {
                KeyedDecision::Allowed { remaining } => Decision::Allowed { remaining },
                KeyedDecision::Denied { retry_after } => Decision::Denied { retry_after },
                other => panic!("no key bound at 3 keys: {other:?}"),
            })
            .map_err(|_| ())
    }
    fn remaining(&self, key: usize) -> u32 {
        KeyedLimiter::remaining(self, &key)
    }
    fn set_quota(&self, quota: Quota) {
        KeyedLimiter::set_quota(self, quota).unwrap();
    }
    fn sweep(&self) {
        KeyedLimiter::sweep(self);
    }
}

/// Run `ops` on `subject` and on one model per key, and require the same
/// answer at every step.
fn check(
    subject: &impl Subject,
    clock: &ManualClock,
    keys: usize,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let quotas = quotas();
    let mut quota = quotas[0];
    let mut models: Vec<Model> = (0..keys)
        .map(|_| Model::denial_writes_nothing(quota))
        .collect();
    let mut now = 0u64;
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Acquire { key, n, raw } => {
                let key = key % keys;
                let n = if raw { n } else { 1 + n % quota.capacity() };
                let got = subject.acquire(key, n);
                if n == 0 || n > quota.capacity() {
                    prop_assert!(got.is_err(), "step {}: n = {} accepted", step, n);
                } else {
                    let want = models[key].acquire(now, n);
                    prop_assert_eq!(got, Ok(want), "step {}: {:?} at {} ns", step, op, now);
                }
            }
            Op::Remaining { key } => {
                let key = key % keys;
                prop_assert_eq!(
                    subject.remaining(key),
                    models[key].remaining(now),
                    "step {}",
                    step
                );
            }
            Op::Advance { micros } => {
                now += micros * 1_000;
                clock.advance(Duration::from_micros(micros));
            }
            Op::SetQuota { i } => {
                quota = quotas[i % quotas.len()];
                subject.set_quota(quota);
                for model in &mut models {
                    model.set_quota(quota, now);
                }
            }
            Op::Sweep => subject.sweep(),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_direct_limiter_decides_as_the_model_across_changes(ops in ops()) {
        let clock = ManualClock::new();
        let bucket = LiveTokenBucket::new(quotas()[0]).unwrap();
        let limiter = RateLimiter::from_parts(bucket, clock.clone());
        check(&limiter, &clock, 1, &ops)?;
    }

    #[test]
    fn a_keyed_limiter_decides_as_the_model_across_changes_and_sweeps(ops in ops()) {
        let clock = ManualClock::new();
        let limiter = KeyedBuilder::<usize, _>::new(LiveTokenBucket::new(quotas()[0]).unwrap())
            .clock(clock.clone())
            .shards(2)
            .build()
            .unwrap();
        check(&limiter, &clock, KEYS, &ops)?;
    }
}

/// Threads decide while another changes the quota and moves the clock. A
/// change creates tokens only in a full bucket, raising it to the new
/// capacity; so over the run the permits admitted are at most the first
/// capacity, plus for each stretch between changes the whole periods of that
/// stretch's quota times its amount, plus each raise of the capacity.
#[test]
fn concurrent_changes_admit_no_more_than_the_quotas_in_force_allow() {
    // Two pairs: one where the capacity changes (a raise may refill a full
    // bucket), one where only the rate does (the bound is then tight).
    for (slow, fast) in [
        (
            Quota::new(5, 1, Duration::from_millis(10)).unwrap(),
            Quota::new(20, 4, Duration::from_millis(10)).unwrap(),
        ),
        (
            Quota::new(10, 1, Duration::from_millis(10)).unwrap(),
            Quota::new(10, 4, Duration::from_millis(10)).unwrap(),
        ),
    ] {
        for keyed in [false, true] {
            let clock = ManualClock::new();
            let direct = Arc::new(RateLimiter::from_parts(
                LiveTokenBucket::new(slow).unwrap(),
                clock.clone(),
            ));
            let by_key = Arc::new(
                KeyedBuilder::<u32, _>::new(LiveTokenBucket::new(slow).unwrap())
                    .clock(clock.clone())
                    .shards(4)
                    .build()
                    .unwrap(),
            );
            let deciders = Deciders::start(3, {
                let (direct, by_key) = (direct.clone(), by_key.clone());
                move || {
                    if keyed {
                        by_key.try_acquire(&7).is_allowed()
                    } else {
                        direct.try_acquire().is_allowed()
                    }
                }
            });
            // Stretches of 0 to 30 ms, alternating quotas; the bound adds each
            // stretch's whole periods.
            let mut bound = u64::from(slow.capacity());
            let mut quota = slow;
            for i in 0..400u64 {
                let ms = (i * 7919) % 31;
                std::thread::sleep(Duration::from_micros(50));
                clock.advance(Duration::from_millis(ms));
                bound += ms / 10 * u64::from(quota.amount());
                let next = if i % 2 == 0 { fast } else { slow };
                bound += u64::from(next.capacity().saturating_sub(quota.capacity()));
                quota = next;
                if keyed {
                    by_key.set_quota(quota).unwrap();
                } else {
                    direct.set_quota(quota).unwrap();
                }
            }
            std::thread::sleep(Duration::from_millis(5));
            let admitted = deciders.stop();
            assert!(
                admitted <= bound,
                "keyed {keyed}: {admitted} admitted, bound {bound}"
            );
            println!("keyed {keyed}: {admitted} admitted, bound {bound}");
            // The deciders ran: at least the first burst went out.
            assert!(
                admitted >= u64::from(slow.capacity()),
                "keyed {keyed}: only {admitted} admitted"
            );
            let last = if keyed {
                by_key.quota()
            } else {
                direct.quota()
            };
            assert_eq!(last, quota);
            assert!(
                (if keyed {
                    by_key.remaining(&7)
                } else {
                    direct.remaining()
                }) <= quota.capacity()
            );
        }
    }
}

#[test]
fn a_refused_change_leaves_the_limiter_as_it_was() {
    let clock = ManualClock::new();
    let bucket = LiveTokenBucket::with_ceiling(Quota::per_second(10).unwrap(), 100).unwrap();
    let limiter = RateLimiter::from_parts(bucket, clock.clone());
    assert!(limiter.try_acquire_n(4).unwrap().is_allowed());
    let err = limiter
        .set_quota(Quota::per_second(1_000).unwrap())
        .unwrap_err();
    assert_eq!(
        err,
        QuotaError::AboveCeiling {
            capacity: 1_000,
            ceiling: 100
        }
    );
    assert!(err.to_string().contains("ceiling of 100"), "{err}");
    assert!(
        err.to_string().contains("`LiveTokenBucket::with_ceiling`"),
        "{err}"
    );
    assert_eq!(limiter.quota(), Quota::per_second(10).unwrap());
    assert_eq!(limiter.remaining(), 6);
    assert_eq!(limiter.algorithm().changes(), 0);
    // `n` above the capacity in force is refused, not decided.
    limiter.set_quota(Quota::per_second(3).unwrap()).unwrap();
    assert!(limiter.try_acquire_n(4).is_err());
}

#[test]
fn a_tier_is_changed_alone() {
    let clock = ManualClock::new();
    let tier = |q| {
        KeyedBuilder::<String, _>::new(LiveTokenBucket::new(q).unwrap())
            .clock(clock.clone())
            .build()
            .unwrap()
    };
    let per_key = Tiered::new(
        [
            ("free", tier(Quota::per_minute(2).unwrap())),
            ("paid", tier(Quota::per_minute(10).unwrap())),
        ],
        |key: &str| usize::from(key.starts_with("paid")),
    )
    .unwrap();
    assert!(per_key.try_acquire_n("free-1", 2).unwrap().is_allowed());
    assert!(!per_key.try_acquire("free-1").is_allowed());
    per_key
        .set_quota("free", Quota::per_minute(5).unwrap())
        .unwrap();
    // Raised: nothing is created at the change; the new rate refills after it.
    assert_eq!(per_key.remaining("free-1"), 0);
    clock.advance(Duration::from_secs(12));
    assert_eq!(per_key.remaining("free-1"), 1);
    assert_eq!(per_key.remaining("free-2"), 5);
    assert_eq!(per_key.remaining("paid-1"), 10);
    assert!(matches!(
        per_key.set_quota("gold", Quota::per_minute(1).unwrap()),
        Err(turnstile::TieredError::UnknownTier(name)) if name == "gold"
    ));
}

/// A change that finds a bucket full stamps it full at the change; a reading
/// taken before the change (behind that stamp) spends from it without moving
/// the time back, so it cannot refill again from its own earlier time.
#[test]
fn a_stale_reading_after_a_change_does_not_move_a_full_bucket_back() {
    let quota = Quota::new(1, 1, Duration::from_secs(1)).unwrap();
    let clock = ManualClock::new();
    let limiter = RateLimiter::from_parts(LiveTokenBucket::new(quota).unwrap(), clock.clone());
    assert!(limiter.try_acquire().is_allowed());
    clock.set(Duration::from_secs(1));
    limiter.set_quota(quota).unwrap();
    let admitted = [500, 1_600]
        .into_iter()
        .filter(|&ms| {
            clock.set(Duration::from_millis(ms));
            limiter.try_acquire().is_allowed()
        })
        .count();
    // One at 0 under the old quota, then the one token the full bucket holds
    // at the change; the next refill is due at 2 s.
    assert_eq!(admitted, 1);
}

/// Two changes bring a word's generation bit back, and a refund checked only
/// that bit: given back after the bucket had been clamped to the new capacity
/// (twice to the same quota, as a configuration reload does), it filled the
/// bucket again and four were admitted at one instant under capacity 2.
#[test]
fn a_refund_after_two_changes_declines() {
    use turnstile::chain;
    let five = Quota::new(5, 1, Duration::from_secs(1)).unwrap();
    let two = Quota::new(2, 1, Duration::from_secs(1)).unwrap();
    let clock = ManualClock::new();
    // Direct.
    let direct = RateLimiter::from_parts(LiveTokenBucket::new(five).unwrap(), clock.clone());
    let admission = direct.try_acquire_n_refundable(3).unwrap().unwrap(); // 2 left
    direct.set_quota(two).unwrap();
    direct.set_quota(two).unwrap();
    assert!(direct.try_acquire_n(2).unwrap().is_allowed()); // none left
    assert!(!admission.refund(), "the quota changed since the admission");
    assert!(!direct.try_acquire_n(2).unwrap().is_allowed());
    // Keyed.
    let keyed = KeyedBuilder::<u32, _>::new(LiveTokenBucket::new(five).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    let admission = keyed.try_acquire_n_refundable(&7, 3).unwrap().unwrap();
    keyed.set_quota(two).unwrap();
    keyed.set_quota(two).unwrap();
    assert!(keyed.try_acquire_n(&7, 2).unwrap().is_allowed());
    assert!(!admission.refund());
    assert!(!keyed.try_acquire_n(&7, 2).unwrap().is_allowed());
    // A chain.
    let direct = RateLimiter::from_parts(LiveTokenBucket::new(five).unwrap(), clock.clone());
    let admitted = chain::try_acquire_n_refundable(&[&direct], 3)
        .unwrap()
        .unwrap();
    direct.set_quota(two).unwrap();
    direct.set_quota(two).unwrap();
    assert!(direct.try_acquire_n(2).unwrap().is_allowed());
    assert!(!admitted.refund());
    assert!(!direct.try_acquire_n(2).unwrap().is_allowed());
    // With no change, a refund still goes back exactly.
    let direct = RateLimiter::from_parts(LiveTokenBucket::new(five).unwrap(), clock);
    let admission = direct.try_acquire_n_refundable(3).unwrap().unwrap();
    assert!(admission.refund());
    assert!(direct.try_acquire_n(5).unwrap().is_allowed());
}

/// A denial's deferred wait was worked out on the parameters its word's
/// generation names, which two changes had rewritten: told 100 ms (neither the
/// denial's wait nor the current one), a caller retrying then was denied.
#[test]
fn a_not_yet_keeps_its_wait_across_two_changes() {
    let clock = ManualClock::new();
    let slow = Quota::new(1, 1, Duration::from_secs(1)).unwrap();
    let fast = Quota::new(1, 1, Duration::from_millis(100)).unwrap();
    let limiter = RateLimiter::from_parts(LiveTokenBucket::new(slow).unwrap(), clock.clone());
    assert!(limiter.check().is_ok());
    let not_yet = limiter.check().unwrap_err(); // try_acquire would say 1 s
    clock.set(Duration::from_millis(50));
    limiter.set_quota(slow).unwrap();
    limiter.set_quota(fast).unwrap(); // the next permit at 150 ms
    assert_eq!(not_yet.retry_after().duration(), Duration::from_secs(1));
    // Keyed.
    let keyed = KeyedBuilder::<u32, _>::new(LiveTokenBucket::new(slow).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(keyed.check(&1).is_ok());
    let not_yet = keyed.check(&1).unwrap_err();
    clock.advance(Duration::from_millis(50));
    keyed.set_quota(slow).unwrap();
    keyed.set_quota(fast).unwrap();
    assert_eq!(not_yet.retry_after().duration(), Duration::from_secs(1));
}
