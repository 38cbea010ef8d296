//! Property tests of the token bucket against the plain model in `model/`:
//! exact agreement over random traces, quotas and requests, and RFC 1363's bound.

mod model;

use std::time::Duration;

use model::Model;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use turnstile::{ManualClock, Quota, RateLimiter, TokenBucket};

/// A random valid quota: capacities from 1 to `u32::MAX` (so every token-field
/// width and time unit), amounts from 1 to the capacity (a larger refill is
/// refused: `QuotaError::AmountAboveCapacity`), periods from one
/// time unit to the longest the word allows.
fn quotas() -> impl Strategy<Value = Quota> {
    let capacity = prop_oneof![
        4 => 1..=8u32,
        4 => 1..=1_000u32,
        1 => 1_000..=70_000u32,
        1 => 70_000..=u32::MAX,
    ];
    (capacity, any::<u32>(), any::<u64>(), 0..4u8).prop_map(|(capacity, a, p, kind)| {
        // The unit and the longest fill time depend on the capacity alone; 2^16 µs
        // is a whole number of every capacity's unit.
        let probe = Quota::new(capacity, capacity, Duration::from_micros(1 << 16)).unwrap();
        let unit = probe.time_unit().as_micros() as u64;
        let max_fill_units = probe.max_fill_time().as_micros() as u64 / unit;
        // The fewest tokens per period that can refill this capacity in time.
        let min_amount = u64::from(capacity).div_ceil(max_fill_units) as u32;
        let amount = match kind {
            0 | 1 => 1,
            2 => 1 + a % 4,
            _ => 1 + a % capacity,
        }
        .max(min_amount)
        .min(capacity);
        let periods = u64::from(capacity.div_ceil(amount));
        let max_units = (max_fill_units / periods).max(1);
        // Mostly short periods (busy buckets), sometimes anything allowed.
        let units = if p % 4 == 0 {
            1 + p / 4 % max_units
        } else {
            1 + p / 4 % max_units.min(2_000)
        };
        Quota::new(capacity, amount, Duration::from_micros(units * unit)).unwrap()
    })
}

/// One step of a trace: how the clock moves, and the permits asked for.
#[derive(Clone, Debug)]
enum Move {
    Stay,
    /// Less than one period.
    Within(u64),
    /// Up to two fill times: partial and full refills.
    Refill(u64),
    /// Less than one time unit: sub-unit jitter.
    Jitter(u64),
    /// A long idle, short of the word's half span.
    Idle(u64),
    /// Back in time, by up to the same bound.
    Back(u64),
}

fn moves(backwards: bool) -> impl Strategy<Value = Move> {
    let back_weight = if backwards { 2 } else { 0 };
    prop_oneof![
        2 => Just(Move::Stay),
        4 => any::<u64>().prop_map(Move::Within),
        4 => any::<u64>().prop_map(Move::Refill),
        1 => any::<u64>().prop_map(Move::Jitter),
        1 => any::<u64>().prop_map(Move::Idle),
        back_weight => any::<u64>().prop_map(Move::Back),
    ]
}

fn permits(raw: u32, capacity: u32) -> u32 {
    if raw.is_multiple_of(3) {
        1 + raw / 3 % capacity
    } else {
        1 + raw % capacity.min(4)
    }
}

/// A clock that walks a trace, keeping every reading within the range in which
/// the packed word must agree exactly with unbounded time.
struct Walk {
    now: u64,
    max_seen: u64,
    period: u64,
    fill: u64,
    unit: u64,
    /// The furthest a reading may be from the latest one seen, either way.
    reach: u64,
}

impl Walk {
    fn new(quota: Quota, start: u64) -> Walk {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let (fill, unit) = (ns(quota.fill_time()), ns(quota.time_unit()));
        // A reading must stay within half the span of the oldest refill time the
        // word may hold, which is up to one fill time behind the latest reading.
        let half = ns(quota.max_fill_time());
        let reach = half.saturating_sub(fill).saturating_sub(unit).min(1 << 50);
        Walk {
            now: start,
            max_seen: start,
            period: ns(quota.period()),
            fill,
            unit,
            reach,
        }
    }

    fn step(&mut self, m: &Move) -> u64 {
        let ceiling = self.max_seen.saturating_add(self.reach);
        let forward = |by: u64| self.now.saturating_add(by).min(ceiling);
        self.now = match *m {
            Move::Stay => self.now,
            Move::Within(r) => forward(r % self.period),
            Move::Refill(r) => forward(r % self.fill.saturating_mul(2).saturating_add(1)),
            Move::Jitter(r) => forward(r % self.unit),
            Move::Idle(r) => forward(r % (self.reach + 1)),
            Move::Back(r) => self
                .now
                .saturating_sub(r % (self.reach + 1))
                .max(self.max_seen.saturating_sub(self.reach)),
        };
        self.max_seen = self.max_seen.max(self.now);
        self.now
    }
}

/// Starting times: near zero, anywhere, or just before a wrap of the time field
/// (where one falls inside a u64 of nanoseconds).
fn start_for(quota: Quota, raw: u64, kind: u8) -> u64 {
    let span_ns = 2 * quota.max_fill_time().as_nanos();
    match kind {
        0 => raw % 1_000_000_000_000,
        1 if span_ns < u128::from(u64::MAX / 4) => {
            let span = span_ns as u64;
            let wraps = 1 + raw % 3;
            let fill = u64::try_from(quota.fill_time().as_nanos()).unwrap_or(u64::MAX);
            wraps * span - raw % fill.saturating_mul(2).saturating_add(1).min(span)
        }
        _ => raw % (1 << 62),
    }
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/properties.proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

fn run_against_model(
    mut model: Model,
    quota: Quota,
    start: u64,
    trace: &[(Move, u32)],
) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    let mut walk = Walk::new(quota, start);
    clock.set_nanos(start);
    let limiter: RateLimiter<TokenBucket, ManualClock> =
        RateLimiter::with_clock(quota, clock.clone());
    for (i, (m, raw)) in trace.iter().enumerate() {
        let now = walk.step(m);
        clock.set_nanos(now);
        let n = permits(*raw, quota.capacity());
        prop_assert_eq!(
            limiter.remaining(),
            model.remaining(now),
            "peek at step {} ({} ns)",
            i,
            now
        );
        let ours = limiter.try_acquire_n(n).unwrap();
        let theirs = model.acquire(now, n);
        prop_assert_eq!(ours, theirs, "step {} at {} ns, n = {}", i, now, n);
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(10_000))]

    /// Time only moves forward: every decision, wait and peek equals the
    /// rate-limiter pattern's algorithm on unbounded time, including traces that
    /// cross the word's wrap.
    #[test]
    fn agrees_with_the_pattern_model(
        quota in quotas(),
        start in (any::<u64>(), 0..3u8),
        trace in prop::collection::vec((moves(false), any::<u32>()), 1..60),
    ) {
        run_against_model(Model::pattern(quota), quota, start_for(quota, start.0, start.1), &trace)?;
    }
}

proptest! {
    #![proptest_config(config(3_000))]

    /// With readings that go backwards too, the bucket follows the documented
    /// rules: a reading behind the last refill refills nothing and moves nothing,
    /// and a denial changes nothing.
    #[test]
    fn agrees_with_the_model_when_time_goes_backwards(
        quota in quotas(),
        start in (any::<u64>(), 0..3u8),
        trace in prop::collection::vec((moves(true), any::<u32>()), 1..60),
    ) {
        let model = Model::denial_writes_nothing(quota);
        run_against_model(model, quota, start_for(quota, start.0, start.1), &trace)?;
    }

    /// RFC 1363: over any interval `T`, admitted permits never exceed
    /// `capacity + refill(T)`, where `refill(T) = amount * floor(T / period)`
    /// plus, for batches (`amount > 1`), the `amount - 1` tokens a batch arriving
    /// just after a burst can add. `T` is measured in the bucket's time units.
    #[test]
    fn never_admits_more_than_capacity_plus_refill(
        quota in quotas(),
        start in (any::<u64>(), 0..3u8),
        trace in prop::collection::vec((moves(false), any::<u32>()), 1..120),
    ) {
        let start = start_for(quota, start.0, start.1);
        let clock = ManualClock::new();
        clock.set_nanos(start);
        let mut walk = Walk::new(quota, start);
        let limiter = RateLimiter::with_clock(quota, clock.clone());
        let unit = quota.time_unit().as_nanos() as u64;
        let period = quota.period().as_nanos() as u64 / unit;
        let (capacity, amount) = (u64::from(quota.capacity()), u64::from(quota.amount()));
        // (time in units, permits) of each admission.
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (m, raw) in &trace {
            let now = walk.step(m);
            clock.set_nanos(now);
            let n = permits(*raw, quota.capacity());
            if limiter.try_acquire_n(n).unwrap().is_allowed() {
                admitted.push((now / unit, u64::from(n)));
            }
        }
        for i in 0..admitted.len() {
            let mut sum = 0;
            for j in i..admitted.len() {
                sum += admitted[j].1;
                let t = admitted[j].0 - admitted[i].0;
                let bound = capacity + amount * (t / period) + (amount - 1);
                prop_assert!(sum <= bound, "{} admitted in {} units; bound {}", sum, t, bound);
            }
        }
    }
}

proptest! {
    #![proptest_config(config(3_000))]

    /// Refunds (what a chain gives back when a later stage denies) never break
    /// RFC 1363's bound: counting only the admissions that were not refunded,
    /// any interval `T` holds at most `capacity + refill(T)`, whatever
    /// decisions come between an admission and its refund.
    #[test]
    fn refunds_keep_capacity_plus_refill(
        quota in quotas(),
        start in (any::<u64>(), 0..3u8),
        trace in prop::collection::vec((moves(false), any::<u32>(), 0..4u8), 1..80),
    ) {
        use turnstile::Algorithm;
        let bucket = TokenBucket::new(quota);
        let start = start_for(quota, start.0, start.1);
        let mut walk = Walk::new(quota, start);
        let unit = quota.time_unit().as_nanos() as u64;
        let period = quota.period().as_nanos() as u64 / unit;
        let (capacity, amount) = (u64::from(quota.capacity()), u64::from(quota.amount()));
        let mut word = bucket.fresh();
        // (time in units, permits, refunded) of each admission.
        let mut admitted: Vec<(u64, u64, bool)> = Vec::new();
        // (due at step, admission index, written word, n)
        let mut pending: Vec<(usize, usize, u64, u32)> = Vec::new();
        for (i, (m, raw, refund_after)) in trace.iter().enumerate() {
            let now = walk.step(m);
            for &(_, at, written, n) in pending.iter().filter(|p| p.0 == i) {
                if let Some(next) = bucket.refund(word, written, n) {
                    word = next;
                    admitted[at].2 = true;
                }
            }
            pending.retain(|p| p.0 != i);
            let n = permits(*raw, quota.capacity());
            if let (decision, Some(next)) = bucket.decide(word, now, n) {
                prop_assert!(decision.is_allowed());
                word = next;
                admitted.push((now / unit, u64::from(n), false));
                if *refund_after > 0 {
                    pending.push((i + usize::from(*refund_after), admitted.len() - 1, next, n));
                }
            }
        }
        let kept: Vec<(u64, u64)> = admitted.iter().filter(|a| !a.2).map(|a| (a.0, a.1)).collect();
        for i in 0..kept.len() {
            let mut sum = 0;
            for j in i..kept.len() {
                sum += kept[j].1;
                let t = kept[j].0 - kept[i].0;
                let bound = capacity + amount * (t / period) + (amount - 1);
                prop_assert!(sum <= bound, "{} kept in {} units; bound {}", sum, t, bound);
            }
        }
    }
}

/// One step of a keyed trace.
#[derive(Clone, Debug)]
enum KeyedOp {
    Acquire { key: u64, n: u32 },
    Advance { micros: u64 },
    Sweep,
    Remaining { key: u64 },
}

fn keyed_ops() -> impl Strategy<Value = Vec<KeyedOp>> {
    let op = prop_oneof![
        8 => (0..300u64, 1..=3u32).prop_map(|(key, n)| KeyedOp::Acquire { key, n }),
        3 => (0..400_000u64).prop_map(|micros| KeyedOp::Advance { micros }),
        1 => Just(KeyedOp::Sweep),
        1 => (0..300u64).prop_map(|key| KeyedOp::Remaining { key }),
    ];
    proptest::collection::vec(op, 1..600)
}

proptest! {
    #![proptest_config(config(300))]

    /// The keyed map evicts without loss: on any trace of requests, clock
    /// steps and sweeps over a few hundred keys (enough to grow, shrink and
    /// rebuild shard tables, fill them with keys in limbo and dead slots, and
    /// link keys in limbo again), every decision and every peek equals that of
    /// a separate
    /// direct limiter per key that is never evicted.
    #[test]
    fn keyed_limiter_agrees_with_never_evicted_direct_limiters(
        ops in keyed_ops(),
        shards in prop_oneof![Just(1usize), Just(2), Just(8)],
        sweep_every in 1..64usize,
    ) {
        let quota = Quota::new(3, 1, Duration::from_millis(100)).unwrap();
        let clock = ManualClock::new();
        let keyed = turnstile::KeyedLimiter::<u64>::builder(quota)
            .clock(clock.clone())
            .shards(shards)
            .sweep_every(sweep_every)
            .build()
            .unwrap();
        let mut model: std::collections::HashMap<u64, RateLimiter<TokenBucket, ManualClock>> =
            std::collections::HashMap::new();
        let mut touched = std::collections::HashSet::new();
        for op in ops {
            match op {
                KeyedOp::Acquire { key, n } => {
                    let expected = model
                        .entry(key)
                        .or_insert_with(|| RateLimiter::with_clock(quota, clock.clone()))
                        .try_acquire_n(n)
                        .unwrap();
                    let got = keyed.try_acquire_n(&key, n).unwrap();
                    prop_assert_eq!(turnstile::KeyedDecision::from(expected), got);
                    touched.insert(key);
                }
                KeyedOp::Advance { micros } => clock.advance(Duration::from_micros(micros)),
                KeyedOp::Sweep => {
                    keyed.sweep();
                }
                KeyedOp::Remaining { key } => {
                    let expected = model.get(&key).map_or(3, |l| l.remaining());
                    prop_assert_eq!(keyed.remaining(&key), expected);
                }
            }
            prop_assert!(keyed.len() <= touched.len());
        }
        // Once every bucket is full again, one sweep leaves nothing held.
        clock.advance(Duration::from_secs(1));
        keyed.sweep();
        prop_assert_eq!(keyed.len(), 0);
        for key in touched {
            prop_assert_eq!(keyed.remaining(&key), 3);
        }
    }
}

proptest! {
    #![proptest_config(config(300))]

    /// The same with a key bound small enough to be reached all the time, so
    /// that new keys reclaim room from idle ones across shards: a request is
    /// either refused for the bound (and then changes nothing) or decided
    /// exactly as a never-evicted direct limiter for its key decides it; the
    /// bound holds after every step.
    #[test]
    fn a_bounded_keyed_limiter_refuses_or_agrees(
        ops in keyed_ops(),
        shards in prop_oneof![Just(1usize), Just(2), Just(8)],
        max_keys in 1..24usize,
    ) {
        let quota = Quota::new(3, 1, Duration::from_millis(100)).unwrap();
        let clock = ManualClock::new();
        let keyed = turnstile::KeyedLimiter::<u64>::builder(quota)
            .clock(clock.clone())
            .shards(shards)
            .max_keys(max_keys)
            .sweep_every(4)
            .build()
            .unwrap();
        let mut model: std::collections::HashMap<u64, RateLimiter<TokenBucket, ManualClock>> =
            std::collections::HashMap::new();
        for op in ops {
            match op {
                KeyedOp::Acquire { key, n } => {
                    let got = keyed.try_acquire_n(&key, n).unwrap();
                    if got.is_key_limit() {
                        continue;
                    }
                    let expected = model
                        .entry(key)
                        .or_insert_with(|| RateLimiter::with_clock(quota, clock.clone()))
                        .try_acquire_n(n)
                        .unwrap();
                    prop_assert_eq!(turnstile::KeyedDecision::from(expected), got);
                }
                KeyedOp::Advance { micros } => clock.advance(Duration::from_micros(micros)),
                KeyedOp::Sweep => {
                    keyed.sweep();
                }
                KeyedOp::Remaining { key } => {
                    let expected = model.get(&key).map_or(3, |l| l.remaining());
                    prop_assert_eq!(keyed.remaining(&key), expected);
                }
            }
            prop_assert!(keyed.len() <= max_keys);
        }
    }
}
