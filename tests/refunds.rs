//! Public refunds ([`turnstile::Admission`]): over random traces of acquire,
//! refund and advance, on a direct and on a keyed limiter of every algorithm,
//! the permits *kept* (admitted and not refunded) stay within each algorithm's
//! own bound; an exact refund made at once can be re-admitted at once; a
//! declined refund changes nothing; and a key evicted (and created again)
//! since its admission declines.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use turnstile::{
    Algorithm, Clock, FixedWindow, Gcra, KeyedBuilder, KeyedLimiter, ManualClock, Quota,
    RateLimiter, SlidingWindow, TokenBucket,
};

const MICRO: u64 = 1_000;

/// One step of a trace.
#[derive(Clone, Debug)]
enum Op {
    /// Ask for `n` permits (as `1 + n % capacity`) for key `key % KEYS`
    /// (ignored by a direct limiter), keeping the admission.
    Acquire { key: usize, n: u32 },
    /// Refund the `i`-th held admission (`i % held`), if any is held.
    Refund { i: usize },
    /// Ask, and refund at once, without the clock moving.
    AcquireAndRefund { key: usize, n: u32 },
    /// Move the clock forward by whole microseconds.
    Advance { micros: u64 },
    /// Sweep a keyed limiter (nothing for a direct one).
    Sweep,
}

const KEYS: [u64; 3] = [0, 1, 2];

fn ops(scale_micros: u64) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        6 => (0..KEYS.len(), any::<u32>()).prop_map(|(key, n)| Op::Acquire { key, n }),
        4 => any::<usize>().prop_map(|i| Op::Refund { i }),
        2 => (0..KEYS.len(), any::<u32>()).prop_map(|(key, n)| Op::AcquireAndRefund { key, n }),
        4 => (0..=scale_micros * 3).prop_map(|micros| Op::Advance { micros }),
        1 => Just(Op::Sweep),
    ];
    prop::collection::vec(op, 1..120)
}

/// An admission's time (ns), permits, and whether it was refunded.
#[derive(Clone, Copy, Debug)]
struct Taken {
    at: u64,
    n: u64,
    refunded: bool,
}

/// The kept admissions, in time order, each as (time in ns, permits).
fn kept(taken: &[Taken]) -> Vec<(u64, u64)> {
    taken
        .iter()
        .filter(|t| !t.refunded)
        .map(|t| (t.at, t.n))
        .collect()
}

/// Each algorithm's own bound on the permits kept over any interval.
#[derive(Clone, Copy, Debug)]
enum Bound {
    /// RFC 1363: `capacity + amount * floor(T / period) + (amount - 1)`, with
    /// `T` in whole microseconds (the bucket's time unit at these capacities).
    TokenBucket {
        capacity: u64,
        amount: u64,
        period: u64,
    },
    /// `capacity + floor(T / interval)`: a burst of `capacity`, then one
    /// permit per emission interval.
    Gcra { capacity: u64, interval: u64 },
    /// At most `limit` in any one window.
    FixedWindow { limit: u64, window: u64 },
    /// At most `limit` in any fixed window, and `limit * (1 + s / window)` in
    /// any interval of length `s <= window`.
    SlidingWindow { limit: u64, window: u64 },
}

impl Bound {
    fn check(self, kept: &[(u64, u64)]) -> Result<(), TestCaseError> {
        for i in 0..kept.len() {
            let mut sum = 0;
            for j in i..kept.len() {
                sum += kept[j].1;
                let t = kept[j].0 - kept[i].0;
                match self {
                    Bound::TokenBucket {
                        capacity,
                        amount,
                        period,
                    } => {
                        let units = kept[j].0 / MICRO - kept[i].0 / MICRO;
                        let bound = capacity + amount * (units / period) + (amount - 1);
                        prop_assert!(
                            sum <= bound,
                            "{} kept in {} µs; bound {}",
                            sum,
                            units,
                            bound
                        );
                    }
                    Bound::Gcra { capacity, interval } => {
                        let bound = capacity + t / interval;
                        prop_assert!(sum <= bound, "{} kept in {} ns; bound {}", sum, t, bound);
                    }
                    Bound::FixedWindow { limit, window } => {
                        if kept[i].0 / window == kept[j].0 / window {
                            prop_assert!(sum <= limit, "{} kept in one window", sum);
                        }
                    }
                    Bound::SlidingWindow { limit, window } => {
                        if kept[i].0 / window == kept[j].0 / window {
                            prop_assert!(sum <= limit, "{} kept in one window", sum);
                        }
                        let s = t + 1;
                        if s <= window {
                            prop_assert!(
                                u128::from(sum) * u128::from(window)
                                    <= u128::from(limit) * u128::from(window + s),
                                "{} kept in {} ns with a window of {} ns",
                                sum,
                                s,
                                window
                            );
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// One algorithm under test: a way to build it, and its bound.
trait Case: Algorithm + Clone + std::fmt::Debug {
    fn bound(&self) -> Bound;
    /// The trace's time scale, in microseconds.
    fn scale_micros(&self) -> u64;
    /// Whether an exact refund of `n` always makes `n` more permits available
    /// now (up to the capacity). Not for the sliding window, where permits
    /// counted in the previous window weigh only part of one each.
    fn refund_restores_in_full(&self) -> bool {
        true
    }
}

impl Case for TokenBucket {
    fn bound(&self) -> Bound {
        let quota = self.quota();
        Bound::TokenBucket {
            capacity: u64::from(quota.capacity()),
            amount: u64::from(quota.amount()),
            period: quota.period().as_micros() as u64,
        }
    }
    fn scale_micros(&self) -> u64 {
        self.quota().period().as_micros() as u64
    }
}

impl Case for Gcra {
    fn bound(&self) -> Bound {
        Bound::Gcra {
            capacity: u64::from(self.quota().capacity()),
            interval: self.emission_interval().as_nanos() as u64,
        }
    }
    fn scale_micros(&self) -> u64 {
        self.emission_interval().as_micros() as u64
    }
}

impl Case for FixedWindow {
    fn bound(&self) -> Bound {
        Bound::FixedWindow {
            limit: u64::from(self.capacity()),
            window: self.window().as_nanos() as u64,
        }
    }
    fn scale_micros(&self) -> u64 {
        self.window().as_micros() as u64 / 2
    }
}

impl Case for SlidingWindow {
    fn bound(&self) -> Bound {
        Bound::SlidingWindow {
            limit: u64::from(self.capacity()),
            window: self.window().as_nanos() as u64,
        }
    }
    fn scale_micros(&self) -> u64 {
        self.window().as_micros() as u64 / 2
    }
    fn refund_restores_in_full(&self) -> bool {
        false
    }
}

/// The permits available after a refund of `n`, given those before it.
fn check_refund(
    algorithm: &impl Case,
    exact: bool,
    n: u32,
    before: u32,
    after: u32,
) -> Result<(), TestCaseError> {
    if !exact {
        prop_assert_eq!(after, before, "a declined refund changes nothing");
    } else if algorithm.refund_restores_in_full() {
        let full = before.saturating_add(n).min(algorithm.capacity());
        prop_assert_eq!(after, full, "an exact refund of {} after {}", n, before);
    } else {
        prop_assert!(after >= before, "{} then {}", before, after);
    }
    Ok(())
}

/// The trace on a direct limiter.
fn direct<A: Case>(algorithm: A, trace: &[Op]) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    let limiter = RateLimiter::from_parts(algorithm.clone(), clock.clone());
    let capacity = algorithm.capacity();
    let mut taken: Vec<Taken> = Vec::new();
    // Held admissions, each with its index in `taken`.
    let mut held = Vec::new();
    for op in trace {
        let now = clock.now();
        match *op {
            Op::Acquire { n, .. } => {
                let n = 1 + n % capacity;
                if let Ok(admission) = limiter.try_acquire_n_refundable(n).unwrap() {
                    prop_assert_eq!(admission.permits(), n);
                    held.push((taken.len(), admission));
                    taken.push(Taken {
                        at: now,
                        n: u64::from(n),
                        refunded: false,
                    });
                }
            }
            Op::Refund { i } if !held.is_empty() => {
                let (at, admission) = held.swap_remove(i % held.len());
                let n = admission.permits();
                let before = limiter.remaining();
                let exact = admission.refund();
                taken[at].refunded = exact;
                check_refund(&algorithm, exact, n, before, limiter.remaining())?;
            }
            Op::Refund { .. } => {}
            Op::AcquireAndRefund { n, .. } => {
                let n = 1 + n % capacity;
                let before = limiter.remaining();
                if let Ok(admission) = limiter.try_acquire_n_refundable(n).unwrap() {
                    let remaining = admission.remaining();
                    prop_assert!(admission.refund(), "a refund at once is exact");
                    prop_assert_eq!(limiter.remaining(), before);
                    // The refunded permits can be had again at once.
                    let again = limiter.try_acquire_n_refundable(n).unwrap();
                    let again = again.map_err(|d| TestCaseError::fail(format!("{d:?}")))?;
                    prop_assert_eq!(again.remaining(), remaining);
                    held.push((taken.len(), again));
                    taken.push(Taken {
                        at: now,
                        n: u64::from(n),
                        refunded: false,
                    });
                }
            }
            Op::Advance { micros } => clock.advance(Duration::from_micros(micros)),
            Op::Sweep => {}
        }
    }
    algorithm.bound().check(&kept(&taken))
}

/// The trace on a keyed limiter: each key's kept permits within the bound,
/// through sweeps that evict keys and admissions that create them again.
fn keyed<A: Case>(algorithm: A, trace: &[Op]) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    let limiter: KeyedLimiter<u64, A, ManualClock> = KeyedBuilder::new(algorithm.clone())
        .clock(clock.clone())
        .shards(1)
        .build()
        .unwrap();
    let capacity = algorithm.capacity();
    let mut taken: Vec<Vec<Taken>> = vec![Vec::new(); KEYS.len()];
    let mut held = Vec::new();
    for op in trace {
        let now = clock.now();
        match *op {
            Op::Acquire { key, n } => {
                let n = 1 + n % capacity;
                if let Ok(admission) = limiter.try_acquire_n_refundable(&KEYS[key], n).unwrap() {
                    held.push((key, taken[key].len(), admission));
                    taken[key].push(Taken {
                        at: now,
                        n: u64::from(n),
                        refunded: false,
                    });
                }
            }
            Op::Refund { i } if !held.is_empty() => {
                let (key, at, admission) = held.swap_remove(i % held.len());
                let n = admission.permits();
                let before = limiter.remaining(&KEYS[key]);
                let exact = admission.refund();
                taken[key][at].refunded = exact;
                let after = limiter.remaining(&KEYS[key]);
                check_refund(&algorithm, exact, n, before, after)?;
            }
            Op::Refund { .. } => {}
            Op::AcquireAndRefund { key, n } => {
                let n = 1 + n % capacity;
                let before = limiter.remaining(&KEYS[key]);
                if let Ok(admission) = limiter.try_acquire_n_refundable(&KEYS[key], n).unwrap() {
                    let remaining = admission.remaining();
                    prop_assert!(admission.refund(), "a refund at once is exact");
                    prop_assert_eq!(limiter.remaining(&KEYS[key]), before);
                    let again = limiter.try_acquire_n_refundable(&KEYS[key], n).unwrap();
                    let again = again.map_err(|d| TestCaseError::fail(format!("{d:?}")))?;
                    prop_assert_eq!(again.remaining(), remaining);
                    held.push((key, taken[key].len(), again));
                    taken[key].push(Taken {
                        at: now,
                        n: u64::from(n),
                        refunded: false,
                    });
                }
            }
            Op::Advance { micros } => clock.advance(Duration::from_micros(micros)),
            Op::Sweep => {
                let _ = limiter.sweep();
            }
        }
    }
    for per_key in &taken {
        algorithm.bound().check(&kept(per_key))?;
    }
    Ok(())
}

fn quota() -> impl Strategy<Value = Quota> {
    (1..=8u32, 1..=3u32, 1..=50u64).prop_map(|(capacity, amount, millis)| {
        Quota::new(
            capacity,
            amount.min(capacity),
            Duration::from_millis(millis),
        )
        .unwrap()
    })
}

fn window() -> impl Strategy<Value = (u32, Duration)> {
    (1..=8u32, 1..=50u64).prop_map(|(limit, millis)| (limit, Duration::from_millis(millis)))
}

/// An algorithm drawn by `algorithm`, with a trace at its own time scale.
fn with_trace<A: Case>(algorithm: impl Strategy<Value = A>) -> impl Strategy<Value = (A, Vec<Op>)> {
    algorithm.prop_flat_map(|a| {
        let scale = a.scale_micros().max(1);
        (Just(a), ops(scale))
    })
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/refunds.proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(400))]

    #[test]
    fn token_bucket_keeps_its_bound_with_refunds(
        (bucket, trace) in with_trace(quota().prop_map(TokenBucket::new)),
    ) {
        direct(bucket, &trace)?;
        keyed(bucket, &trace)?;
    }

    #[test]
    fn gcra_keeps_its_bound_with_refunds(
        (gcra, trace) in with_trace(quota().prop_map(Gcra::new)),
    ) {
        direct(gcra, &trace)?;
        keyed(gcra, &trace)?;
    }

    #[test]
    fn fixed_window_keeps_its_bound_with_refunds(
        (window, trace) in with_trace(window().prop_map(|(l, w)| FixedWindow::new(l, w).unwrap())),
    ) {
        direct(window, &trace)?;
        keyed(window, &trace)?;
    }

    #[test]
    fn sliding_window_keeps_its_bound_with_refunds(
        (window, trace) in with_trace(window().prop_map(|(l, w)| SlidingWindow::new(l, w).unwrap())),
    ) {
        direct(window, &trace)?;
        keyed(window, &trace)?;
    }
}

/// A key evicted since its admission (and created again) declines the refund,
/// and the new key's allowance is untouched.
#[test]
fn a_refund_for_an_evicted_key_declines() {
    fn check<A: Algorithm + std::fmt::Debug>(algorithm: A, idle: Duration) {
        let clock = ManualClock::new();
        clock.set(Duration::from_millis(7));
        let capacity = algorithm.capacity();
        let limiter: KeyedLimiter<String, A, ManualClock> = KeyedBuilder::new(algorithm)
            .clock(clock.clone())
            .build()
            .unwrap();
        // Evicted, not created again: nothing to refund into.
        let first = limiter.try_acquire_refundable("k").unwrap();
        clock.advance(idle);
        assert_eq!(limiter.sweep(), 1);
        assert!(!first.refund(), "{:?}", limiter.algorithm());
        assert_eq!(limiter.len(), 0);
        // Evicted and created again by a later admission.
        let second = limiter.try_acquire_refundable("k").unwrap();
        clock.advance(idle);
        assert_eq!(limiter.sweep(), 1);
        let third = limiter.try_acquire_refundable("k").unwrap();
        assert_eq!(limiter.remaining("k"), capacity - 1);
        assert!(!second.refund(), "{:?}", limiter.algorithm());
        assert_eq!(limiter.remaining("k"), capacity - 1, "not over-credited");
        // The live admission still refunds exactly.
        assert!(third.refund());
        assert_eq!(limiter.remaining("k"), capacity);
    }
    let second = Duration::from_secs(1);
    let quota = Quota::new(4, 1, second).unwrap();
    check(TokenBucket::new(quota), 4 * second);
    check(Gcra::new(quota), 4 * second);
    check(FixedWindow::new(4, second).unwrap(), second);
    check(SlidingWindow::new(4, second).unwrap(), 2 * second);
}

/// A chain's admission gives every stage back its permits; a stage that
/// cannot be exact declines and the chain says so, the other stages still
/// refunded.
#[test]
fn a_chain_admission_refunds_every_stage() {
    use turnstile::chain;
    let clock = ManualClock::new();
    let second = Duration::from_secs(1);
    let per_key: KeyedLimiter<String, TokenBucket, ManualClock> =
        KeyedLimiter::<String>::builder(Quota::new(3, 1, second).unwrap())
            .clock(clock.clone())
            .build()
            .unwrap();
    let global =
        RateLimiter::from_parts(Gcra::new(Quota::new(2, 1, second).unwrap()), clock.clone());
    let alice = per_key.stage("alice");
    let admitted = chain::try_acquire_refundable(&[&alice, &global]).unwrap();
    assert_eq!(admitted.permits(), 1);
    assert_eq!(admitted.remaining(), 1);
    assert!(admitted.refund());
    assert_eq!((per_key.remaining("alice"), global.remaining()), (3, 2));

    // Another decision on the GCRA stage moves its word: that stage declines.
    let admitted = chain::try_acquire_refundable(&[&alice, &global]).unwrap();
    assert!(global.try_acquire().is_allowed());
    assert!(!admitted.refund());
    assert_eq!(
        per_key.remaining("alice"),
        3,
        "the bucket stage still refunded"
    );
    assert_eq!(global.remaining(), 0, "the meter kept both permits");

    // A denied chain keeps nothing, and says which stage denied.
    let denied = chain::try_acquire_refundable(&[&alice, &global]).unwrap_err();
    assert_eq!(denied.denied_by(), Some(1));
    assert_eq!(per_key.remaining("alice"), 3);
    assert_eq!(
        chain::try_acquire_n_refundable(&[&alice, &global], 3).unwrap_err(),
        turnstile::AcquireError::InsufficientCapacity {
            requested: 3,
            capacity: 2
        }
    );
}

/// Bad requests are typed errors that touch nothing; a refund leaves the
/// counters as they were (the decision was counted), and an admission reports
/// what it took and left.
#[test]
fn refundable_requests_check_their_permits_and_refunds_keep_the_counts() {
    use turnstile::AcquireError;
    let clock = ManualClock::new();
    let second = Duration::from_secs(1);
    let direct =
        RateLimiter::with_clock(Quota::new(3, 1, second).unwrap(), clock.clone()).counted();
    assert_eq!(
        direct.try_acquire_n_refundable(0).unwrap_err(),
        AcquireError::ZeroPermits
    );
    assert_eq!(
        direct.try_acquire_n_refundable(4).unwrap_err(),
        AcquireError::InsufficientCapacity {
            requested: 4,
            capacity: 3
        }
    );
    assert_eq!(direct.remaining(), 3);
    let two = direct.try_acquire_n_refundable(2).unwrap().unwrap();
    assert_eq!((two.permits(), two.remaining()), (2, 1));
    assert!(
        direct
            .try_acquire_n_refundable(2)
            .unwrap()
            .unwrap_err()
            .is_denied()
    );
    assert!(two.refund());
    assert_eq!(direct.remaining(), 3);
    let stats = direct.stats();
    assert_eq!((stats.admitted, stats.denied), (1, 1));

    let keyed: KeyedLimiter<String, TokenBucket, ManualClock> =
        KeyedLimiter::<String>::builder(Quota::new(3, 1, second).unwrap())
            .clock(clock)
            .build()
            .unwrap();
    assert_eq!(
        keyed.try_acquire_n_refundable("k", 0).unwrap_err(),
        AcquireError::ZeroPermits
    );
    assert_eq!(
        keyed.try_acquire_n_refundable("k", 4).unwrap_err(),
        AcquireError::InsufficientCapacity {
            requested: 4,
            capacity: 3
        }
    );
    assert_eq!(keyed.len(), 0, "no key stored");
    let three = keyed.try_acquire_n_refundable("k", 3).unwrap().unwrap();
    assert_eq!((three.permits(), three.remaining()), (3, 0));
    let denied = keyed.try_acquire_refundable("k").unwrap_err();
    assert_eq!(denied.retry_after().unwrap().duration(), second);
    assert!(three.refund());
    assert_eq!(keyed.remaining("k"), 3);
    let stats = keyed.stats();
    assert_eq!((stats.admitted, stats.denied), (1, 1));
}

/// A refund followed by a reading behind it (a thread that read the clock
/// earlier) admits no more than if the refunded request had never been made:
/// a refund that empties a window keeps the window, and one that fills a
/// bucket keeps its time, so the stale reading cannot move either back.
#[test]
fn a_refund_then_a_stale_reading_admits_no_more_than_never_asking() {
    fn run<A: turnstile::Algorithm + Clone>(
        algorithm: A,
        first: u64,
        refunded: u64,
        stale: u64,
        later: u64,
    ) -> [u32; 2] {
        let ms = Duration::from_millis;
        [true, false].map(|asked| {
            let clock = ManualClock::new();
            let limiter = RateLimiter::from_parts(algorithm.clone(), clock.clone());
            clock.set(ms(first));
            assert!(limiter.try_acquire().is_allowed());
            if asked {
                clock.set(ms(refunded));
                assert!(limiter.try_acquire_refundable().unwrap().refund());
            }
            [stale, later]
                .into_iter()
                .filter(|&t| {
                    clock.set(ms(t));
                    limiter.try_acquire().is_allowed()
                })
                .count() as u32
        })
    }
    let second = Duration::from_secs(1);
    let fixed = FixedWindow::new(1, second).unwrap();
    let sliding = SlidingWindow::new(1, second).unwrap();
    let bucket = TokenBucket::new(Quota::new(1, 1, second).unwrap());
    for (name, [asked, never]) in [
        ("fixed window", run(fixed, 9_500, 10_500, 9_600, 10_600)),
        ("sliding window", run(sliding, 9_500, 11_500, 9_600, 11_600)),
        ("token bucket", run(bucket, 5_000, 6_500, 5_500, 6_600)),
    ] {
        assert!(
            asked <= never,
            "{name}: {asked} admitted after a refund, {never} without the request"
        );
    }
}

/// The span a token bucket of capacity 65,535 (time in whole microseconds)
/// and a fixed window of 1 µs keep their time in: `2^48` µs.
const SPAN_NANOS: u64 = (1 << 48) * MICRO;
/// How long after its admission a refund may still be exact: `2^45` µs.
const HORIZON_NANOS: u64 = (1 << 45) * MICRO;

/// An admission held while the clock comes round the word's time span, with
/// the limiter in use all along (each step below half the span), then the
/// word written at `start + span`, bit for bit the one the admission wrote:
/// the refund declines, and the instant admits no more than its limit.
#[test]
fn a_refund_after_the_clock_comes_round_the_span_declines() {
    fn run<A: Algorithm>(name: &str, algorithm: A, limit: u64) {
        let clock = ManualClock::new();
        let limiter = RateLimiter::from_parts(algorithm, clock.clone());
        let start = 5 * MICRO;
        clock.set_nanos(start);
        let held = limiter.try_acquire_refundable().unwrap();
        for step in 1..=4 {
            clock.set_nanos(start + SPAN_NANOS / 4 * step);
            assert!(limiter.try_acquire().is_allowed(), "{name}: step {step}");
        }
        let mut admitted = 1;
        while limiter.try_acquire().is_allowed() {
            admitted += 1;
        }
        assert!(!held.refund(), "{name}: a refund from a span ago");
        while limiter.try_acquire().is_allowed() {
            admitted += 1;
        }
        assert_eq!(admitted, limit, "{name}: admitted at one instant");
    }
    let bucket = TokenBucket::new(Quota::new(65_535, 1, Duration::from_secs(1)).unwrap());
    run("token bucket", bucket, 65_535);
    let fixed = FixedWindow::new(65_535, Duration::from_micros(1)).unwrap();
    run("fixed window", fixed, 65_535);
}

/// The same on one key of a keyed limiter, and at the edge of the horizon: a
/// refund just inside it, with nothing decided since, is still exact.
#[test]
fn a_refund_is_exact_up_to_the_horizon_and_declines_from_it() {
    let clock = ManualClock::new();
    let quota = Quota::new(65_535, 1, Duration::from_secs(1)).unwrap();
    let limiter = KeyedLimiter::<u64>::builder(quota)
        .clock(clock.clone())
        .build()
        .unwrap();
    let direct = RateLimiter::with_clock(quota, clock.clone());
    clock.set_nanos(MICRO);
    let (keyed, one) = (
        limiter.try_acquire_refundable(&7).unwrap(),
        direct.try_acquire_refundable().unwrap(),
    );
    clock.set_nanos(MICRO + HORIZON_NANOS - 1);
    assert!(keyed.refund(), "keyed, just inside the horizon");
    assert!(one.refund(), "direct, just inside the horizon");
    let (keyed, one) = (
        limiter.try_acquire_refundable(&7).unwrap(),
        direct.try_acquire_refundable().unwrap(),
    );
    clock.set_nanos(MICRO + 2 * HORIZON_NANOS - 1);
    assert!(!keyed.refund(), "keyed, at the horizon");
    assert!(!one.refund(), "direct, at the horizon");
    // A clock set back before the admission is within it.
    let one = direct.try_acquire_refundable().unwrap();
    clock.set_nanos(MICRO);
    assert!(one.refund(), "a reading behind the admission's");
}

/// A receipt belongs to the stage that took it: given back for another key,
/// or to another limiter, whose word can be bit for bit the same, it
/// declines (it gave back permits the other stage never spent).
#[test]
fn a_receipt_given_to_another_key_or_limiter_declines() {
    use turnstile::chain::Stage;

    let clock = ManualClock::new();
    let quota = Quota::new(10, 1, Duration::from_secs(1)).unwrap();
    let keyed = KeyedLimiter::<String>::builder(quota)
        .clock(clock.clone())
        .build()
        .unwrap();
    // bob and alice hold the same word: 4 tokens, refilled at 5 s.
    assert!(keyed.try_acquire_n("bob", 10).unwrap().is_allowed());
    clock.set(Duration::from_secs(5));
    assert!(keyed.try_acquire("bob").is_allowed());
    let (decision, receipt) = keyed.stage("alice").take(6).unwrap();
    assert!(decision.is_allowed());
    assert_eq!(keyed.remaining("alice"), keyed.remaining("bob"));
    assert!(
        !keyed.stage("bob").give_back(receipt.unwrap()),
        "bob's word is not alice's"
    );
    assert_eq!(keyed.remaining("bob"), 4);
    // Its own key takes it.
    let (_, receipt) = keyed.stage("alice").take(2).unwrap();
    assert!(keyed.stage("alice").give_back(receipt.unwrap()));
    assert_eq!(keyed.remaining("alice"), 4);

    // Two direct limiters of one quota on one clock hold the same words.
    let a = RateLimiter::with_clock(quota, clock.clone());
    let b = RateLimiter::with_clock(quota, clock.clone());
    assert!(b.try_acquire_n(6).unwrap().is_allowed());
    let (_, receipt) = a.take(6).unwrap();
    assert!(!b.give_back(receipt.unwrap()), "a's receipt, given to b");
    assert_eq!(b.remaining(), 4);
    let (_, receipt) = a.take(2).unwrap();
    assert!(a.give_back(receipt.unwrap()));
    assert_eq!(a.remaining(), 4, "its own limiter takes it back");

    // GCRA words decided at one reading are alike for any two keys.
    let gcra: KeyedLimiter<String, Gcra, ManualClock> =
        KeyedBuilder::new(Gcra::new(Quota::new(2, 1, Duration::from_secs(1)).unwrap()))
            .clock(clock.clone())
            .build()
            .unwrap();
    let (_, receipt) = gcra.stage("alice").take(1).unwrap();
    assert!(gcra.try_acquire("bob").is_allowed());
    assert!(!gcra.stage("bob").give_back(receipt.unwrap()));
    assert!(gcra.try_acquire("bob").is_allowed());
    assert!(
        gcra.try_acquire("bob").is_denied(),
        "bob keeps a capacity of 2"
    );
}
