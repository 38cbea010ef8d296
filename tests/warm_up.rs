//! The warm-up bucket against a reference model (unbounded integer time, one
//! period at a time, no packing), against the token bucket at zero warm-up,
//! its ramp under full demand, its cooling, and in both limiters.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use turnstile::{
    Algorithm, Decision, KeyedBuilder, ManualClock, Quota, RateLimiter, RetryAfter, TokenBucket,
    WarmUp, WarmUpError,
};

/// The warm-up bucket as its documentation states it, stepped one period at
/// a time on unbounded time: `⌊B(j)⌋` with the cold factor `cn / cd`.
#[derive(Clone, Debug)]
struct Model {
    capacity: u64,
    amount: u64,
    /// Time unit and period, in nanoseconds and units.
    unit_ns: u64,
    period: u64,
    /// `N`, and the cold factor as a fraction.
    warm: u64,
    cn: u128,
    cd: u128,
    tokens: u64,
    heat: u64,
    /// In units.
    base: u64,
}

impl Model {
    fn new(quota: Quota, warm: u64, cold_thousandths: u64) -> Model {
        let unit_ns = quota.time_unit().as_nanos() as u64;
        Model {
            capacity: quota.capacity().into(),
            amount: quota.amount().into(),
            unit_ns,
            period: quota.period().as_nanos() as u64 / unit_ns,
            warm,
            cn: cold_thousandths.into(),
            cd: 1_000,
            tokens: quota.capacity().into(),
            heat: 0,
            base: 0,
        }
    }

    /// `⌊B(j)⌋`.
    fn b(&self, j: u64) -> u64 {
        let n = self.warm;
        if n == 0 {
            return j;
        }
        if j > n {
            return self.b(n) + (j - n);
        }
        let (n, j) = (u128::from(n), u128::from(j));
        let num = 2 * n * j * self.cd + (self.cn - self.cd) * j * j;
        (num / (2 * self.cn * n)) as u64
    }

    /// One period of warming from `(tokens, heat)`.
    fn warm_one(&self, tokens: u64, heat: u64) -> (u64, u64) {
        let batch = self.b(heat + 1) - self.b(heat);
        (tokens + batch * self.amount, (heat + 1).min(self.warm))
    }

    /// `(tokens, heat, base)` as of unit `t`.
    fn at(&self, t: u64) -> (u64, u64, u64) {
        let (mut tokens, mut heat, mut base) = (self.tokens, self.heat, self.base);
        if t < base {
            return (tokens, heat, base);
        }
        if tokens >= self.capacity {
            let cooled = heat.saturating_sub((t - base) / self.period);
            return (self.capacity, cooled, t);
        }
        while base + self.period <= t {
            base += self.period;
            (tokens, heat) = self.warm_one(tokens, heat);
            if tokens >= self.capacity {
                let cooled = heat.saturating_sub((t - base) / self.period);
                return (self.capacity, cooled, t);
            }
        }
        (tokens, heat, base)
    }

    fn decide(&mut self, now_ns: u64, n: u32) -> Decision {
        let n = u64::from(n);
        let t = now_ns / self.unit_ns;
        let (tokens, heat, base) = self.at(t);
        if tokens >= n {
            (self.tokens, self.heat, self.base) = (tokens - n, heat, base);
            return Decision::Allowed {
                remaining: (tokens - n) as u32,
            };
        }
        let (mut have, mut h, mut at) = (tokens, heat, base);
        while have < n {
            (have, h) = self.warm_one(have, h);
            at += self.period;
        }
        Decision::Denied {
            retry_after: RetryAfter::from_nanos(at * self.unit_ns - now_ns),
        }
    }

    fn remaining(&self, now_ns: u64) -> u32 {
        self.at(now_ns / self.unit_ns).0 as u32
    }
}

#[derive(Clone, Debug)]
enum Move {
    Stay,
    Near(u64),
    Across(u64),
    Idle(u64),
    Back(u64),
}

fn moves() -> impl Strategy<Value = Move> {
    prop_oneof![
        2 => Just(Move::Stay),
        4 => any::<u64>().prop_map(Move::Near),
        4 => any::<u64>().prop_map(Move::Across),
        1 => any::<u64>().prop_map(Move::Idle),
        2 => any::<u64>().prop_map(Move::Back),
    ]
}

/// Readings stay below `2^56` ns, inside the exact range of every word here.
const MAX_READING: u64 = 1 << 56;

fn step(now: u64, m: &Move, scale: u64) -> u64 {
    let scale = scale.max(1);
    match *m {
        Move::Stay => now,
        Move::Near(r) => now.saturating_add(r % scale),
        Move::Across(r) => now.saturating_add(r % scale.saturating_mul(3)),
        Move::Idle(r) => now.saturating_add(r % (1 << 50)),
        Move::Back(r) => now.saturating_sub(r % scale.saturating_mul(3)),
    }
    .min(MAX_READING)
}

fn permits(raw: u32, capacity: u32) -> u32 {
    if raw.is_multiple_of(3) {
        1 + raw / 3 % capacity
    } else {
        1 + raw % capacity.min(3)
    }
}

/// Small quotas (so that the model's period-by-period steps stay few), warm-ups
/// of 0 to 40 periods, cold factors from 1 to 12 in thousandths.
fn configs() -> impl Strategy<Value = (Quota, u64, u64)> {
    (
        prop_oneof![3 => 1..=10u32, 1 => 1..=300u32],
        1..=5u32,
        prop_oneof![1 => 1..=1_000u64, 3 => 1_000..=1_000_000u64],
        prop_oneof![1 => Just(0u64), 4 => 1..=40u64],
        prop_oneof![
            1 => Just(1_000u64),
            2 => Just(3_000u64),
            3 => 1_000..=12_000u64
        ],
    )
        .prop_map(|(c, a, p, n, cold)| {
            // A refill is at most the bucket (`AmountAboveCapacity`).
            let quota = Quota::new(c, a.min(c), Duration::from_micros(p)).unwrap();
            (quota, n, cold)
        })
}

fn warm_up(quota: Quota, periods: u64, cold: u64) -> WarmUp {
    let warm = quota.period() * periods as u32;
    WarmUp::new(quota, warm, cold as f64 / 1_000.0).unwrap()
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/warm_up.proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(2_000))]

    /// Every decision (with its remaining count or exact wait) and every peek
    /// of the algorithm in a limiter equals the model's, over random traces
    /// with idles and clocks set back: no rounding, the model is exact.
    #[test]
    fn warm_up_agrees_with_the_model(
        (quota, periods, cold) in configs(),
        start in 0..MAX_READING,
        trace in prop::collection::vec((moves(), any::<u32>()), 1..80),
    ) {
        let algorithm = warm_up(quota, periods, cold);
        let mut model = Model::new(quota, periods, cold);
        let capacity = quota.capacity();
        let scale = quota.period().as_nanos() as u64 * u64::from(capacity.min(4));
        let clock = ManualClock::new();
        let limiter = RateLimiter::from_parts(algorithm, clock.clone());
        let mut now = start;
        for (i, (m, raw)) in trace.iter().enumerate() {
            now = step(now, m, scale);
            clock.set_nanos(now);
            let n = permits(*raw, capacity);
            prop_assert_eq!(limiter.remaining(), model.remaining(now), "peek at step {} ({} ns)", i, now);
            let ours = limiter.try_acquire_n(n).unwrap();
            let theirs = model.decide(now, n);
            prop_assert_eq!(ours, theirs, "step {} at {} ns, n = {}", i, now, n);
        }
    }

    /// `check` (the denial's wait worked out only when asked, and the ramp's
    /// inversion skipped until then) decides as `try_acquire` does, and its
    /// `retry_after` is the same exact wait; `decide_untimed` is `decide`
    /// but for a denial's wait.
    #[test]
    fn check_defers_the_same_wait(
        (quota, periods, cold) in configs(),
        start in 0..MAX_READING,
        trace in prop::collection::vec((moves(), any::<u32>()), 1..80),
    ) {
        let algorithm = warm_up(quota, periods, cold);
        let capacity = quota.capacity();
        let scale = quota.period().as_nanos() as u64 * u64::from(capacity.min(4));
        let clock = ManualClock::new();
        let acquired = RateLimiter::from_parts(algorithm, clock.clone());
        let checked = RateLimiter::from_parts(algorithm, clock.clone());
        let mut word = algorithm.fresh();
        let mut now = start;
        for (i, (m, raw)) in trace.iter().enumerate() {
            now = step(now, m, scale);
            clock.set_nanos(now);
            // Mostly single permits, as `check` takes, with bursts between.
            for _ in 0..(raw % 4) {
                let _ = acquired.try_acquire();
                let _ = checked.try_acquire();
            }
            let ours = acquired.try_acquire();
            match (ours, checked.check()) {
                (Decision::Allowed { remaining }, Ok(left)) => prop_assert_eq!(remaining, left, "step {}", i),
                (Decision::Denied { retry_after }, Err(not_yet)) => {
                    prop_assert_eq!(not_yet.retry_after(), retry_after, "step {} at {} ns", i, now);
                }
                (ours, theirs) => prop_assert!(false, "step {}: try_acquire {:?}, check {:?}", i, ours, theirs.map_err(|e| e.retry_after())),
            }
            let n = permits(*raw, capacity);
            let (full, untimed) = (algorithm.decide(word, now, n), algorithm.decide_untimed(word, now, n));
            prop_assert_eq!(full.1, untimed.1);
            prop_assert_eq!(full.0.is_allowed(), untimed.0.is_allowed());
            if full.0.is_allowed() {
                prop_assert_eq!(full.0, untimed.0);
            }
            if let Some(next) = full.1 {
                word = next;
            }
        }
    }

    /// Guava #2730 (a zero warm-up there disabled the limit): a zero warm-up is
    /// the token bucket of the same quota, word for word, whatever the cold
    /// factor.
    #[test]
    fn zero_warm_up_is_the_token_bucket_word_for_word(
        (quota, _, cold) in configs(),
        start in 0..MAX_READING,
        trace in prop::collection::vec((moves(), any::<u32>()), 1..80),
    ) {
        let warm = WarmUp::new(quota, Duration::ZERO, cold as f64 / 1_000.0).unwrap();
        let bucket = TokenBucket::new(quota);
        prop_assert_eq!(warm.fresh(), bucket.fresh());
        prop_assert_eq!(warm.fresh_after_idle(), bucket.fresh_after_idle());
        prop_assert_eq!(warm.advertise(), bucket.advertise());
        let capacity = quota.capacity();
        let scale = quota.period().as_nanos() as u64 * u64::from(capacity.min(4));
        let (mut word, mut now) = (warm.fresh(), start);
        for (m, raw) in &trace {
            now = step(now, m, scale);
            let n = permits(*raw, capacity);
            prop_assert_eq!(warm.remaining(word, now), bucket.remaining(word, now));
            let ours = warm.decide(word, now, n);
            prop_assert_eq!(ours, bucket.decide(word, now, n));
            if let Some(next) = ours.1 {
                prop_assert_eq!(warm.refund(next, next, n), bucket.refund(next, next, n));
                word = next;
            }
        }
    }

    /// A warm-up never admits more than its stable quota's bound: in any
    /// interval from one admission to a later one, at most `capacity` plus
    /// `amount` for every period the interval spans (rounded up, in time
    /// units), as a token bucket of that quota. (Not always less than such a
    /// token bucket on the same requests: one that fills drops its refill
    /// grid, a warm-up still filling keeps it, and may refill first.)
    #[test]
    fn warm_up_never_exceeds_its_stable_quota(
        (quota, periods, cold) in configs(),
        trace in prop::collection::vec((moves(), any::<u32>()), 1..80),
    ) {
        let capacity = quota.capacity();
        let unit = quota.time_unit().as_nanos() as u64;
        let period = quota.period().as_nanos() as u64 / unit;
        let scale = quota.period().as_nanos() as u64 * u64::from(capacity.min(4));
        let clock = ManualClock::new();
        let warm = RateLimiter::from_parts(warm_up(quota, periods, cold), clock.clone());
        let mut now = 0;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (m, raw) in &trace {
            // Forwards only: a clock set back is no demand.
            if matches!(m, Move::Back(_)) { continue; }
            now = step(now, m, scale);
            clock.set_nanos(now);
            // One permit at a time, as many as the permits drawn: full demand.
            let mut count = 0;
            for _ in 0..permits(*raw, capacity) {
                count += u64::from(warm.try_acquire().is_allowed());
            }
            if count > 0 {
                admitted.push((now / unit, count));
            }
        }
        for (i, &(first, _)) in admitted.iter().enumerate() {
            let mut sum = 0;
            for &(at, count) in &admitted[i..] {
                sum += count;
                let spans = (at - first).div_ceil(period);
                let bound = u64::from(capacity) + u64::from(quota.amount()) * spans;
                prop_assert!(sum <= bound, "{} admitted over {} periods, bound {}", sum, spans, bound);
            }
        }
    }
}

proptest! {
    #![proptest_config(config(2_000))]

    /// A refund with nothing written since its admission gives back exactly
    /// the bucket without it (every later decision the same), whenever the
    /// bucket is not full again; anything written since, and it declines.
    #[test]
    fn refunds_are_exact_or_declined(
        (quota, periods, cold) in configs(),
        start in 0..MAX_READING,
        prefix in prop::collection::vec((moves(), any::<u32>()), 0..30),
        spend in any::<u32>(),
        later in prop::collection::vec((any::<u64>(), any::<u32>()), 1..8),
    ) {
        let w = warm_up(quota, periods, cold);
        let capacity = quota.capacity();
        let scale = quota.period().as_nanos() as u64 * u64::from(capacity.min(4));
        let (mut word, mut now) = (w.fresh(), start);
        for (m, raw) in &prefix {
            now = step(now, m, scale);
            if let (_, Some(next)) = w.decide(word, now, permits(*raw, capacity)) {
                word = next;
            }
        }
        let n = permits(spend, capacity);
        let (_, Some(written)) = w.decide(word, now, n) else { return Ok(()) };
        let left = w.remaining(written, now);
        match w.refund(written, written, n) {
            Some(refunded) => {
                for &(dt, raw) in &later {
                    let t = now.saturating_add(dt % scale.saturating_mul(8).max(1));
                    let k = permits(raw, capacity);
                    prop_assert_eq!(w.remaining(refunded, t), w.remaining(word, t));
                    prop_assert_eq!(w.decide(refunded, t, k).0, w.decide(word, t, k).0);
                }
            }
            None => prop_assert!(
                left + n >= capacity && periods > 0,
                "declined with {} left of {} after {}", left, capacity, n
            ),
        }
        // Another admission since: declined.
        if let (_, Some(after)) = w.decide(written, now, 1) {
            prop_assert_eq!(w.refund(after, written, n), None);
        }
    }
}

/// Full demand from cold at every period boundary: the permits admitted in
/// each period.
fn admitted_per_period(algorithm: WarmUp, periods: usize) -> Vec<u64> {
    let clock = ManualClock::new();
    let period = algorithm.quota().period();
    let limiter = RateLimiter::from_parts(algorithm, clock.clone());
    let mut counts = Vec::new();
    for _ in 0..=periods {
        let mut admitted = 0;
        while limiter.try_acquire().is_allowed() {
            admitted += 1;
        }
        counts.push(admitted);
        clock.advance(period);
    }
    counts
}

/// Guava #3552 (there the stable rate could be missed): under full demand
/// from cold the admissions follow `C + A·⌊B(j)⌋`, the rate reaches the
/// stable rate exactly at the end of the warm-up period, and keeps it.
#[test]
fn stable_rate_is_reached_exactly_at_the_end_of_the_warm_up() {
    let quota = Quota::new(10, 2, Duration::from_millis(100)).unwrap();
    for (cold, cn) in [(1.0, 1_000u128), (2.0, 2_000), (3.0, 3_000), (5.5, 5_500)] {
        let n = 30u64;
        let w = WarmUp::new(quota, Duration::from_secs(3), cold).unwrap();
        assert_eq!(w.warm_up(), Duration::from_secs(3));
        let counts = admitted_per_period(w, 60);
        assert_eq!(counts[0], 10, "the fresh bucket's burst");
        let b = |j: u64| -> u64 {
            let (nn, j) = (u128::from(n), u128::from(j));
            ((2_000 * nn * j + (cn - 1_000) * j * j) / (2 * cn * nn)) as u64
        };
        let mut total = 0;
        for (j, &count) in counts.iter().enumerate() {
            total += count;
            let j = j as u64;
            let expected = 10 + 2 * if j <= n { b(j) } else { b(n) + j - n };
            assert_eq!(
                total, expected,
                "cold {cold}: cumulative through period {j}"
            );
            if j > n {
                assert_eq!(count, 2, "cold {cold}: period {j}, after the warm-up");
            }
        }
        // By the end of the warm-up, N·(1 + c)/(2c) batches: all N when c = 1.
        let ramp: u64 = counts[1..=n as usize].iter().sum();
        let expected = 2 * (n as f64 * (1.0 + cold) / (2.0 * cold)).floor() as u64;
        assert_eq!(ramp, expected, "cold {cold}");
        if cold > 1.0 {
            // Cold: the first periods at about 1/c of the rate.
            let first: u64 = counts[1..=6].iter().sum();
            assert!(first < 12, "cold {cold}: {first} in the first 6 periods");
            assert!(
                ramp < 2 * n,
                "cold {cold}: below the stable rate while warming"
            );
        }
    }
}

/// The figures of the comparison with Guava's `SmoothWarmingUp` in the
/// documentation: 100 per second, a 30 s warm-up, full demand from cold; the
/// permits admitted from 0 s to 30 s inclusive, the burst of 100 among them,
/// are `100 + ⌊3000·(1 + c)/(2c)⌋`: the rate rises linearly in time. (Guava's
/// cost per permit, linear in its stored permits, admits `1 + ⌊6000/(1 + c)⌋`:
/// 1501, 546, 60 and 6.)
#[test]
fn the_ramp_admits_the_documented_permits_over_the_warm_up() {
    let quota = Quota::per_second(100).unwrap();
    for (cold, expected) in [
        (3.0, 2_100),
        (10.0, 1_750),
        (100.0, 1_615),
        (1_000.0, 1_601),
    ] {
        let w = WarmUp::new(quota, Duration::from_secs(30), cold).unwrap();
        let counts = admitted_per_period(w, 3_000);
        assert_eq!(counts.iter().sum::<u64>(), expected, "cold {cold}");
        // The refill at 30 s itself is one of them.
        assert_eq!(counts[3_000], 1, "cold {cold}");
    }
}

/// Full demand at a finer grain than the period (a request every
/// millisecond) admits the same as full demand at each refill.
#[test]
fn full_demand_at_any_grain_follows_the_ramp() {
    let quota = Quota::new(4, 1, Duration::from_millis(10)).unwrap();
    let w = WarmUp::new(quota, Duration::from_millis(200), 3.0).unwrap();
    let coarse = admitted_per_period(w, 40);
    let clock = ManualClock::new();
    let limiter = RateLimiter::from_parts(w, clock.clone());
    let mut fine = vec![0u64; 41];
    for ms in 0..=400u64 {
        clock.set(Duration::from_millis(ms));
        while limiter.try_acquire().is_allowed() {
            fine[(ms / 10) as usize] += 1;
        }
    }
    assert_eq!(fine, coarse);
}

/// A zero warm-up limits: burst then the token bucket's exact wait; and a
/// warm-up shorter than a period is one period, not none.
/// A cold bucket emptied: `check` refuses, and the wait it gives when
/// asked is `try_acquire`'s, the ramp's first batch (longer than a stable
/// period: cold, the rate is a third of the stable one).
#[test]
fn a_cold_denial_through_check_waits_as_try_acquire_says() {
    let quota = Quota::per_second_with_burst(10, 10).unwrap();
    let warm = WarmUp::new(quota, quota.period() * 4, 3.0).unwrap();
    let clock = ManualClock::new();
    clock.set_nanos(1_000_000_000);
    let limiter = RateLimiter::from_parts(warm, clock.clone());
    while limiter.try_acquire().is_allowed() {}
    let not_yet = limiter.check().unwrap_err();
    let Decision::Denied { retry_after } = limiter.try_acquire() else {
        panic!("an emptied bucket admitted");
    };
    assert_eq!(not_yet.retry_after(), retry_after);
    assert!(
        retry_after.duration() > quota.period(),
        "cold, the first batch takes longer than a stable period: {:?}",
        retry_after.duration()
    );
}

#[test]
fn zero_warm_up_limits_as_a_token_bucket() {
    let quota = Quota::new(3, 1, Duration::from_secs(1)).unwrap();
    for cold in [1.0, 3.0, 1_000.0] {
        let clock = ManualClock::new();
        let limiter = RateLimiter::from_parts(
            WarmUp::new(quota, Duration::ZERO, cold).unwrap(),
            clock.clone(),
        );
        for left in [2, 1, 0] {
            assert_eq!(limiter.try_acquire(), Decision::Allowed { remaining: left });
        }
        let denied = limiter.try_acquire();
        assert_eq!(
            denied.retry_after().unwrap().duration(),
            Duration::from_secs(1)
        );
    }
    let short = WarmUp::new(quota, Duration::from_nanos(1), 3.0).unwrap();
    assert_eq!(short.warm_up(), Duration::from_secs(1));
    let clock = ManualClock::new();
    let limiter = RateLimiter::from_parts(short, clock.clone());
    assert!(limiter.try_acquire_n(3).unwrap().is_allowed());
    clock.advance(Duration::from_secs(1));
    // B(1) = 4/6: cold, the first period refills nothing (a token bucket's would).
    assert!(limiter.try_acquire().is_denied());
    clock.advance(Duration::from_secs(1));
    assert!(limiter.try_acquire().is_allowed());
}

/// A bucket that is full cools one degree a period; idle for
/// `fresh_after_idle` it is as cold as a fresh one, and an idle of half the
/// warm-up leaves it warmer than that.
#[test]
fn an_idle_bucket_cools_back_to_cold() {
    let quota = Quota::new(2, 1, Duration::from_millis(10)).unwrap();
    let w = WarmUp::new(quota, Duration::from_millis(400), 3.0).unwrap();
    let fresh = admitted_per_period(w, 60);
    for (idle, cold_again) in [
        (w.fresh_after_idle(), true),
        (Duration::from_millis(200), false),
    ] {
        let clock = ManualClock::new();
        let limiter = RateLimiter::from_parts(w, clock.clone());
        // Warm it up under full demand for 60 periods, then leave it.
        for _ in 0..60 {
            while limiter.try_acquire().is_allowed() {}
            clock.advance(quota.period());
        }
        // It refills at the stable rate (2 periods), then idles full.
        clock.advance(quota.period() * 2 + idle);
        let mut again = Vec::new();
        for _ in 0..=60 {
            let mut admitted = 0;
            while limiter.try_acquire().is_allowed() {
                admitted += 1;
            }
            again.push(admitted);
            clock.advance(quota.period());
        }
        if cold_again {
            assert_eq!(again, fresh, "idle {idle:?}: cold again");
        } else {
            let (warm, cold): (u64, u64) = (again[..20].iter().sum(), fresh[..20].iter().sum());
            assert!(warm > cold, "idle {idle:?}: {warm} against cold {cold}");
        }
    }
    // The sweep criterion at its boundary: fresh-equivalent exactly when full and cold.
    let word = w.decide(w.fresh(), 0, 2).1.unwrap();
    assert!(!w.is_fresh_equivalent(word, 0));
    let idle = w.fresh_after_idle().as_nanos() as u64;
    assert!(w.is_fresh_equivalent(word, idle));
}

/// In a keyed limiter a key warms up on its own; once idle long enough it is
/// swept, and comes back fresh, which is cold.
#[test]
fn a_swept_key_comes_back_cold() {
    let quota = Quota::new(2, 1, Duration::from_millis(10)).unwrap();
    let w = WarmUp::new(quota, Duration::from_millis(200), 3.0).unwrap();
    let clock = ManualClock::new();
    let keyed = KeyedBuilder::new(w).clock(clock.clone()).build().unwrap();
    let demand = |key: &str| {
        let mut admitted = 0u64;
        while keyed.try_acquire(key).is_allowed() {
            admitted += 1;
        }
        admitted
    };
    let mut cold_run = Vec::new();
    for _ in 0..40 {
        cold_run.push(demand("a"));
        clock.advance(quota.period());
    }
    // "a" is warm now: a new key "b" is cold beside it.
    let (mut a, mut b) = (0, 0);
    for _ in 0..10 {
        a += demand("a");
        b += demand("b");
        clock.advance(quota.period());
    }
    assert_eq!(a, 10, "warm: the stable rate");
    assert!(b < a, "cold: {b}");
    // Not swept while warm or not full.
    assert_eq!(keyed.sweep(), 0);
    clock.advance(w.fresh_after_idle());
    assert_eq!(keyed.sweep(), 2);
    assert_eq!(keyed.len(), 0);
    let mut again = Vec::new();
    for _ in 0..40 {
        again.push(demand("a"));
        clock.advance(quota.period());
    }
    assert_eq!(again, cold_run, "the swept key is cold again");
}

/// A capacity of 2^23 or more leaves the word no bits for a warm-up: the
/// error says that only a lower capacity makes room, not a shorter warm-up or
/// a longer refill period; one bit less leaves room for one period.
#[test]
fn a_capacity_with_no_room_for_a_warm_up_is_told_so() {
    let millisecond = Duration::from_millis(1);
    for quota in [
        Quota::new(1 << 23, 1, Duration::from_micros(256)).unwrap(),
        Quota::new(u32::MAX, u32::MAX, Duration::from_micros(65_536)).unwrap(),
    ] {
        let err = WarmUp::new(quota, millisecond, 3.0).unwrap_err();
        assert_eq!(
            err,
            WarmUpError::WarmUpTooLong {
                warm_up: millisecond,
                max: Duration::ZERO
            }
        );
        let message = err.to_string();
        assert!(message.contains("at any refill period"), "{message}");
        assert!(message.contains("below 8388608"), "{message}");
        assert!(!message.contains("at most 0ns"), "{message}");
        assert!(!message.contains("lengthen the refill period"), "{message}");
    }
    // 23 bits: a warm-up of one period (128 µs, the unit), and no more.
    let below = Quota::new((1 << 23) - 1, 1, Duration::from_micros(128)).unwrap();
    assert!(WarmUp::new(below, Duration::from_micros(128), 3.0).is_ok());
    let err = WarmUp::new(below, millisecond, 3.0).unwrap_err();
    assert_eq!(
        err,
        WarmUpError::WarmUpTooLong {
            warm_up: millisecond,
            max: Duration::from_micros(128)
        }
    );
    assert!(err.to_string().contains("at most 128µs"), "{err}");
    assert!(err.to_string().contains("shorten the warm-up"), "{err}");
}

#[test]
fn bad_parameters_are_typed_errors() {
    let quota = Quota::new(100, 1, Duration::from_millis(10)).unwrap();
    let second = Duration::from_secs(1);
    for cold in [0.0, 0.999, -3.0, f64::NAN, f64::INFINITY, 1_000.001] {
        let err = WarmUp::new(quota, second, cold).unwrap_err();
        assert!(
            matches!(err, WarmUpError::ColdFactor { .. }),
            "{cold}: {err}"
        );
        assert!(err.to_string().contains("from 1"), "{err}");
    }
    assert!(WarmUp::new(quota, second, 1.0).is_ok());
    assert!(WarmUp::new(quota, second, 1_000.0).is_ok());
    // 100 tokens take 7 bits: 17 left for the heat, 131,071 periods.
    let max = Duration::from_millis(10 * 131_071);
    assert!(WarmUp::new(quota, max, 3.0).is_ok());
    assert_eq!(
        WarmUp::new(quota, max + Duration::from_millis(1), 3.0),
        Err(WarmUpError::WarmUpTooLong {
            warm_up: max + Duration::from_millis(1),
            max
        })
    );
    let huge = Duration::MAX;
    assert!(matches!(
        WarmUp::new(quota, huge, 3.0),
        Err(WarmUpError::WarmUpTooLong { .. })
    ));
    // A capacity of 24 bits leaves no room for a warm-up; zero is still a
    // token bucket.
    let wide = Quota::new((1 << 24) - 1, 1, Duration::from_micros(1 << 8)).unwrap();
    assert_eq!(
        WarmUp::new(wide, second, 3.0),
        Err(WarmUpError::WarmUpTooLong {
            warm_up: second,
            max: Duration::ZERO
        })
    );
    assert!(WarmUp::new(wide, Duration::ZERO, 3.0).is_ok());
    // A cold fill beyond the word's half span.
    // 131,071 periods of 1,000 s are more than the 2^39 µs that a 40-bit
    // time field measures.
    let slow = Quota::new(100, 1, Duration::from_secs(1_000)).unwrap();
    let err = WarmUp::new(slow, Duration::from_secs(1_000 * 131_071), 3.0).unwrap_err();
    assert!(matches!(err, WarmUpError::ColdFillTooLong { .. }), "{err}");
    // A period longer than the half span the heat bits leave (2^46 µs and a
    // bit, with a capacity of 16 bits): refused, where a debug build
    // overflowed a subtraction first.
    let long = Quota::new(65_535, 65_535, Duration::from_micros((1 << 46) + 1)).unwrap();
    let err = WarmUp::new(long, Duration::from_micros(1), 2.0).unwrap_err();
    assert!(matches!(err, WarmUpError::ColdFillTooLong { .. }), "{err}");
}

#[test]
fn no_input_panics_or_admits_at_the_ends_of_time() {
    let quota = Quota::new(3, 1, Duration::from_secs(1)).unwrap();
    for periods in [0, 1, 7] {
        let w = WarmUp::new(quota, Duration::from_secs(periods), 3.0).unwrap();
        for now in [0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
            for word in [0, 1, w.fresh(), u64::MAX / 2, u64::MAX] {
                for n in [0, 1, 3, 4, u32::MAX] {
                    let _ = w.decide(word, now, n);
                    let _ = w.remaining(word, now);
                    let _ = w.refund(word, word, n);
                    let _ = w.is_fresh_equivalent(word, now);
                }
            }
        }
    }
}

/// A word with the narrowest time field (40 bits of 1 µs: a span of 12.7
/// days) left idle past half its span comes back fresh, not read as a
/// reading behind its time that refills nothing until the clock comes round
/// (which denied every request for days), whether it was left full or
/// emptied; a reading set back within the stretch behind (at least 2^32 µs)
/// still creates nothing.
#[test]
fn a_bucket_idle_past_half_its_span_comes_back_fresh() {
    const DAY: u64 = 86_400;
    let quota = Quota::per_second(1_000).unwrap();
    let w = WarmUp::new(quota, Duration::from_secs(10), 3.0).unwrap();
    let fresh = {
        let clock = ManualClock::new();
        let limiter = RateLimiter::from_parts(w, clock.clone());
        assert!(limiter.try_acquire_n(1_000).unwrap().is_allowed());
        limiter.try_acquire().retry_after()
    };
    assert!(fresh.is_some());
    for idle in [
        Duration::from_secs(6 * DAY + DAY / 2),
        Duration::from_secs(7 * DAY),
        Duration::from_secs(12 * DAY),
        // The span, 2^40 µs, less a little over the stretch behind.
        Duration::from_micros((1 << 40) - (1 << 32) - 1_000_000),
    ] {
        for emptied in [true, false] {
            let clock = ManualClock::new();
            clock.set(Duration::from_secs(1_000));
            let limiter = RateLimiter::from_parts(w, clock.clone());
            assert!(limiter.try_acquire_n(1_000).unwrap().is_allowed());
            if !emptied {
                // Refilled, and used once a second for a minute: warm, not full.
                for _ in 0..60 {
                    clock.advance(Duration::from_secs(1));
                    assert!(limiter.try_acquire_n(10).unwrap().is_allowed());
                }
            }
            clock.advance(idle);
            assert_eq!(
                limiter.remaining(),
                1_000,
                "idle {idle:?}, emptied {emptied}"
            );
            assert!(
                limiter.try_acquire_n(1_000).unwrap().is_allowed(),
                "idle {idle:?}, emptied {emptied}"
            );
            // Cold again: the burst's aftermath is a fresh bucket's.
            assert_eq!(limiter.try_acquire().retry_after(), fresh, "idle {idle:?}");
            // And it refills from there, not stuck on an old time.
            clock.advance(Duration::from_secs(60));
            assert_eq!(limiter.remaining(), 1_000, "idle {idle:?}, a minute later");
        }
    }
    // A clock set back an hour, within the stretch: nothing is created.
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(10 * DAY));
    let limiter = RateLimiter::from_parts(w, clock.clone());
    assert!(limiter.try_acquire_n(1_000).unwrap().is_allowed());
    clock.set(Duration::from_secs(10 * DAY - 3_600));
    assert_eq!(limiter.remaining(), 0);
    assert!(!limiter.try_acquire().is_allowed());
}

/// Readings far off, as the word's documentation (and `ManualClock::set`'s)
/// says: a clock set back further than the stretch behind (here `2^32` µs,
/// 71.6 minutes) is taken as a reading after a long idle and finds the
/// bucket fresh; a warm word idle the span (`2^40` µs) and a second is read
/// as idle a second, and comes back warm, not cold as a fresh bucket.
#[test]
fn readings_past_the_stretch_or_the_span_are_read_as_documented() {
    const DAY: u64 = 86_400;
    let quota = Quota::per_second(1_000).unwrap();
    let w = WarmUp::new(quota, Duration::from_secs(10), 3.0).unwrap();
    let fresh = {
        let clock = ManualClock::new();
        let limiter = RateLimiter::from_parts(w, clock.clone());
        assert!(limiter.try_acquire_n(1_000).unwrap().is_allowed());
        limiter.try_acquire().retry_after().unwrap()
    };
    // Set back 72 minutes, past the stretch: refilled.
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(10 * DAY));
    let limiter = RateLimiter::from_parts(w, clock.clone());
    assert!(limiter.try_acquire_n(1_000).unwrap().is_allowed());
    assert_eq!(limiter.remaining(), 0);
    clock.set(Duration::from_secs(10 * DAY - 72 * 60));
    assert_eq!(limiter.remaining(), 1_000);
    // Warmed under full demand for 12 s, then idle the span and a second.
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(1_000));
    let limiter = RateLimiter::from_parts(w, clock.clone());
    assert!(limiter.try_acquire_n(1_000).unwrap().is_allowed());
    for _ in 0..12_000 {
        clock.advance(Duration::from_millis(1));
        while limiter.try_acquire().is_allowed() {}
    }
    let warm = limiter.try_acquire().retry_after().unwrap();
    assert!(warm < fresh, "warm {warm:?}, fresh {fresh:?}");
    clock.advance(Duration::from_micros(1 << 40) + Duration::from_secs(1));
    assert_eq!(limiter.remaining(), 1_000);
    assert!(limiter.try_acquire_n(1_000).unwrap().is_allowed());
    let after = limiter.try_acquire().retry_after().unwrap();
    assert!(after < fresh, "after {after:?}, fresh {fresh:?}");
}
