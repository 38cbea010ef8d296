//! The fixed window, the sliding window and GCRA against plain reference models
//! (unbounded integer time, no packing), their documented bounds, the sweep
//! criterion of every algorithm, and their typed errors. (The warm-up
//! bucket's model is in `tests/warm_up.rs`.)

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use turnstile::{
    AcquireError, Algorithm, Decision, FixedWindow, Gcra, ManualClock, Quota, QuotaError,
    RateLimiter, RetryAfter, SlidingWindow, TokenBucket, WarmUp,
};

/// A reference model: what a limiter must answer, written for clarity.
trait Reference {
    fn decide(&mut self, now: u64, n: u32) -> Decision;
    fn remaining(&self, now: u64) -> u32;
}

fn allowed(remaining: u128) -> Decision {
    Decision::Allowed {
        remaining: u32::try_from(remaining).unwrap(),
    }
}

fn denied(wait: u128) -> Decision {
    Decision::Denied {
        retry_after: RetryAfter::from_nanos(u64::try_from(wait).unwrap()),
    }
}

/// The rate-limiter pattern's `FixedWindowLimiter` in nanoseconds, with the
/// crate's rules for a reading in a window before the stored one (it counts
/// against the stored window) and for a count of zero (fresh in any window).
struct FixedModel {
    limit: u128,
    window: u128,
    start: u128,
    count: u128,
}

impl FixedModel {
    fn new(limit: u32, window: Duration) -> FixedModel {
        FixedModel {
            limit: limit.into(),
            window: window.as_nanos(),
            start: 0,
            count: 0,
        }
    }

    fn current(&self, now: u128) -> (u128, u128) {
        let index = now / self.window;
        if self.count == 0 || index > self.start {
            (index, 0)
        } else {
            (self.start, self.count)
        }
    }
}

impl Reference for FixedModel {
    fn decide(&mut self, now: u64, n: u32) -> Decision {
        let now = u128::from(now);
        let (start, count) = self.current(now);
        if count + u128::from(n) <= self.limit {
            self.start = start;
            self.count = count + u128::from(n);
            allowed(self.limit - self.count)
        } else {
            denied((start + 1) * self.window - now)
        }
    }

    fn remaining(&self, now: u64) -> u32 {
        let (_, count) = self.current(now.into());
        u32::try_from(self.limit - count).unwrap()
    }
}

/// The sliding window counter, evaluated as a function of time; a denial's wait
/// is found by binary search for the first nanosecond at which the request fits
/// (the estimate never rises while nothing is admitted).
struct SlidingModel {
    limit: u128,
    window: u128,
    /// The window the counts belong to.
    start: u128,
    previous: u128,
    current: u128,
}

impl SlidingModel {
    fn new(limit: u32, window: Duration) -> SlidingModel {
        SlidingModel {
            limit: limit.into(),
            window: window.as_nanos(),
            start: 0,
            previous: 0,
            current: 0,
        }
    }

    /// (window, previous count, current count, nanoseconds into the window at
    /// which the estimate is taken).
    fn at(&self, now: u128) -> (u128, u128, u128, u128) {
        let (index, into) = (now / self.window, now % self.window);
        if self.previous == 0 && self.current == 0 || index > self.start + 1 {
            (index, 0, 0, into)
        } else if index == self.start + 1 {
            (index, self.current, 0, into)
        } else if index == self.start {
            (index, self.previous, self.current, into)
        } else {
            // Behind: the stored window, at its start.
            (self.start, self.previous, self.current, 0)
        }
    }

    /// The estimate of the last window with `n` more, times the window.
    fn used(&self, now: u128, n: u128) -> u128 {
        let (_, p, c, e) = self.at(now);
        (c + n) * self.window + p * (self.window - e)
    }
}

impl Reference for SlidingModel {
    fn decide(&mut self, now: u64, n: u32) -> Decision {
        let now = u128::from(now);
        let n = u128::from(n);
        let used = self.used(now, n);
        if used <= self.limit * self.window {
            let (start, p, c, _) = self.at(now);
            (self.start, self.previous, self.current) = (start, p, c + n);
            return allowed(self.limit - used.div_ceil(self.window));
        }
        let (mut lo, mut hi) = (now, (self.start + 3) * self.window + now);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.used(mid, n) <= self.limit * self.window {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        denied(lo - now)
    }

    fn remaining(&self, now: u64) -> u32 {
        let room = (self.limit * self.window).saturating_sub(self.used(now.into(), 0));
        u32::try_from(room / self.window).unwrap()
    }
}

/// GCRA's virtual scheduling: a theoretical arrival time on unbounded time.
struct GcraModel {
    interval: u128,
    capacity: u128,
    tat: u128,
}

impl GcraModel {
    fn new(quota: Quota) -> GcraModel {
        GcraModel {
            interval: quota.period().as_nanos().div_ceil(quota.amount().into()),
            capacity: quota.capacity().into(),
            tat: 0,
        }
    }

    fn conforms(&self, t: u128, n: u128) -> bool {
        self.tat.max(t) + n * self.interval <= t + self.capacity * self.interval
    }
}

impl Reference for GcraModel {
    fn decide(&mut self, now: u64, n: u32) -> Decision {
        let (now, n) = (u128::from(now), u128::from(n));
        if self.conforms(now, n) {
            self.tat = self.tat.max(now) + n * self.interval;
            return allowed(self.remaining_at(now));
        }
        let (mut lo, mut hi) = (now, self.tat + n * self.interval);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.conforms(mid, n) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        denied(lo - now)
    }

    fn remaining(&self, now: u64) -> u32 {
        u32::try_from(self.remaining_at(now.into())).unwrap()
    }
}

impl GcraModel {
    fn remaining_at(&self, now: u128) -> u128 {
        (0..=self.capacity)
            .rev()
            .find(|&k| k == 0 || self.conforms(now, k))
            .unwrap()
    }
}

/// How the clock moves between requests, relative to a time scale (the
/// window, or the emission interval).
#[derive(Clone, Debug)]
enum Move {
    Stay,
    /// Within one scale.
    Near(u64),
    /// Up to three scales.
    Across(u64),
    /// A long idle.
    Idle(u64),
    /// Back by up to three scales.
    Back(u64),
}

fn moves(backwards: bool) -> impl Strategy<Value = Move> {
    prop_oneof![
        2 => Just(Move::Stay),
        4 => any::<u64>().prop_map(Move::Near),
        4 => any::<u64>().prop_map(Move::Across),
        1 => any::<u64>().prop_map(Move::Idle),
        if backwards { 2 } else { 0 } => any::<u64>().prop_map(Move::Back),
    ]
}

/// Readings stay below `2^56` ns (2.3 years), inside every word's exact range.
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

/// A limit and a window the constructor accepts: mostly small limits, some
/// large; windows from nanoseconds to hours, lengthened to the limit's minimum.
fn limits_and_windows() -> impl Strategy<Value = (u32, u64)> {
    let limit = prop_oneof![
        4 => 1..=10u32,
        3 => 1..=1_000u32,
        1 => 1_000..=100_000u32,
        1 => 100_000..=u32::MAX,
    ];
    let window = prop_oneof![
        1 => 1..=1_000u64,
        3 => 1_000..=10_000_000u64,
        3 => 10_000_000..=10_000_000_000u64,
        1 => 10_000_000_000..=10_000_000_000_000u64,
    ];
    (limit, window)
}

fn window_for(limit: u32, window_ns: u64, counts: u32) -> Option<Duration> {
    let window = Duration::from_nanos(window_ns);
    let ok = match counts {
        1 => FixedWindow::new(limit, window).map(|_| ()),
        _ => SlidingWindow::new(limit, window).map(|_| ()),
    };
    match ok {
        Ok(()) => Some(window),
        Err(QuotaError::WindowTooShort { min, .. }) if min <= Duration::from_secs(3_600) => {
            Some(min)
        }
        Err(_) => None,
    }
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/algorithms.proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

/// Run a trace through `algorithm` in a limiter and through `model`: every
/// decision (with its remaining count or exact wait) and every peek agree.
fn agree<A: Algorithm>(
    algorithm: A,
    mut model: impl Reference,
    scale: u64,
    start: u64,
    trace: &[(Move, u32)],
) -> Result<(), TestCaseError> {
    let capacity = algorithm.capacity();
    let clock = ManualClock::new();
    let limiter = RateLimiter::from_parts(algorithm, clock.clone());
    let mut now = start.min(MAX_READING);
    for (i, (m, raw)) in trace.iter().enumerate() {
        now = step(now, m, scale);
        clock.set_nanos(now);
        let n = permits(*raw, capacity);
        prop_assert_eq!(
            limiter.remaining(),
            model.remaining(now),
            "peek at step {} ({} ns)",
            i,
            now
        );
        let ours = limiter.try_acquire_n(n).unwrap();
        let theirs = model.decide(now, n);
        prop_assert_eq!(ours, theirs, "step {} at {} ns, n = {}", i, now, n);
    }
    Ok(())
}

fn quotas() -> impl Strategy<Value = Quota> {
    (
        prop_oneof![3 => 1..=10u32, 2 => 1..=1_000u32, 1 => 1..=u32::MAX],
        1..=5u32,
        prop_oneof![1 => 1..=1_000u64, 3 => 1_000..=10_000_000u64],
    )
        .prop_filter_map("a quota the token bucket accepts", |(c, a, p)| {
            let q = Quota::new(c, a, Duration::from_micros(p)).ok()?;
            // A period on the capacity's time unit.
            let unit = q.time_unit().as_micros() as u64;
            Quota::new(c, a, Duration::from_micros(p.div_ceil(unit) * unit)).ok()
        })
}

proptest! {
    #![proptest_config(config(4_000))]

    #[test]
    fn fixed_window_agrees_with_the_pattern_model(
        (limit, window) in limits_and_windows(),
        start in 0..MAX_READING,
        backwards in any::<bool>(),
        trace in prop::collection::vec((moves(true), any::<u32>()), 1..60),
    ) {
        let Some(window) = window_for(limit, window, 1) else { return Ok(()) };
        let trace: Vec<_> = trace.into_iter()
            .filter(|(m, _)| backwards || !matches!(m, Move::Back(_)))
            .collect();
        agree(
            FixedWindow::new(limit, window).unwrap(),
            FixedModel::new(limit, window),
            window.as_nanos() as u64,
            start,
            &trace,
        )?;
    }

    #[test]
    fn sliding_window_agrees_with_the_model(
        (limit, window) in limits_and_windows(),
        start in 0..MAX_READING,
        backwards in any::<bool>(),
        trace in prop::collection::vec((moves(true), any::<u32>()), 1..60),
    ) {
        let Some(window) = window_for(limit, window, 2) else { return Ok(()) };
        let trace: Vec<_> = trace.into_iter()
            .filter(|(m, _)| backwards || !matches!(m, Move::Back(_)))
            .collect();
        agree(
            SlidingWindow::new(limit, window).unwrap(),
            SlidingModel::new(limit, window),
            window.as_nanos() as u64,
            start,
            &trace,
        )?;
    }

    #[test]
    fn gcra_agrees_with_virtual_scheduling(
        quota in quotas(),
        start in 0..MAX_READING,
        backwards in any::<bool>(),
        trace in prop::collection::vec((moves(true), any::<u32>()), 1..60),
    ) {
        let gcra = Gcra::new(quota);
        let scale = gcra.emission_interval().as_nanos() as u64 * u64::from(quota.capacity().min(8));
        let trace: Vec<_> = trace.into_iter()
            .filter(|(m, _)| backwards || !matches!(m, Move::Back(_)))
            .collect();
        agree(gcra, GcraModel::new(quota), scale, start, &trace)?;
    }

    /// The sliding window's documented bound: any interval of length
    /// `s <= window` admits at most `limit * (1 + s / window)`; any fixed window
    /// at most `limit`.
    #[test]
    fn sliding_window_stays_within_its_error_bound(
        limit in 1..=20u32,
        window_ms in 1..=2_000u64,
        trace in prop::collection::vec((moves(false), any::<u32>()), 1..150),
    ) {
        let window = Duration::from_millis(window_ms);
        let w = window.as_nanos() as u64;
        let clock = ManualClock::new();
        let limiter = RateLimiter::from_parts(SlidingWindow::new(limit, window).unwrap(), clock.clone());
        let mut now = 0;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (m, raw) in &trace {
            now = step(now, m, w / 4);
            clock.set_nanos(now);
            let n = permits(*raw, limit);
            if limiter.try_acquire_n(n).unwrap().is_allowed() {
                admitted.push((now, u64::from(n)));
            }
        }
        let limit = u64::from(limit);
        for j in 0..admitted.len() {
            let mut sum = 0;
            for i in (0..=j).rev() {
                sum += admitted[i].1;
                // The half-open interval of length `s` that ends at the later
                // admission and just includes the earlier one.
                let s = admitted[j].0 - admitted[i].0 + 1;
                if s <= w {
                    prop_assert!(
                        u128::from(sum) * u128::from(w) <= u128::from(limit) * u128::from(w + s),
                        "{} admitted in {} ns with a window of {} ns", sum, s, w
                    );
                }
                if admitted[i].0 / w == admitted[j].0 / w {
                    prop_assert!(sum <= limit, "{} admitted in one fixed window", sum);
                }
            }
        }
    }

    /// The sweep criterion of every algorithm: a word that
    /// `is_fresh_equivalent` says is fresh answers every later request exactly
    /// as a fresh word does.
    #[test]
    fn fresh_equivalent_words_behave_as_fresh(
        (limit, window) in limits_and_windows(),
        quota in quotas(),
        start in 0..MAX_READING,
        trace in prop::collection::vec((moves(false), any::<u32>()), 1..40),
        probes in prop::collection::vec((any::<u64>(), any::<u32>()), 1..8),
    ) {
        if let Some(window) = window_for(limit, window, 1) {
            fresh_equivalence(FixedWindow::new(limit, window).unwrap(), window.as_nanos() as u64, start, &trace, &probes)?;
        }
        if let Some(window) = window_for(limit, window, 2) {
            fresh_equivalence(SlidingWindow::new(limit, window).unwrap(), window.as_nanos() as u64, start, &trace, &probes)?;
        }
        let gcra = Gcra::new(quota);
        fresh_equivalence(gcra, gcra.emission_interval().as_nanos() as u64, start, &trace, &probes)?;
        let bucket = TokenBucket::new(quota);
        fresh_equivalence(bucket, quota.period().as_nanos() as u64, start, &trace, &probes)?;
        // Up to 16 token bits, the warm-up's time field spans more than the
        // trace's idles (2^50 ns): a wider capacity narrows it.
        if let (true, Ok(warm)) = (quota.capacity() <= 65_535, WarmUp::new(quota, quota.period() * 3, 3.0)) {
            fresh_equivalence(warm, quota.period().as_nanos() as u64, start, &trace, &probes)?;
        }
    }
}

/// A refund after any decisions in between never leaves the word admitting
/// more than the same decisions leave without the refunded admission; with no
/// decision in between, it restores exactly what the admission took.
fn refund_never_over_credits<A: Algorithm>(
    algorithm: A,
    scale: u64,
    start: u64,
    prefix: &[(Move, u32)],
    spend: u32,
    between: &[(Move, u32)],
    probes: &[(u64, u32)],
) -> Result<(), TestCaseError> {
    let capacity = algorithm.capacity();
    let (mut word, mut now) = (algorithm.fresh(), start);
    for (m, raw) in prefix {
        now = step(now, m, scale);
        if let (_, Some(next)) = algorithm.decide(word, now, permits(*raw, capacity)) {
            word = next;
        }
    }
    let n = permits(spend, capacity);
    let (_, Some(written)) = algorithm.decide(word, now, n) else {
        return Ok(()); // not admitted: nothing to give back
    };
    let (mut with, mut without) = (written, word);
    for (m, raw) in between {
        now = step(now, m, scale);
        let k = permits(*raw, capacity);
        match (
            algorithm.decide(with, now, k),
            algorithm.decide(without, now, k),
        ) {
            // Both admit or both deny: the same decision in both histories.
            ((a, next_with), (b, next_without)) if a.is_allowed() == b.is_allowed() => {
                with = next_with.unwrap_or(with);
                without = next_without.unwrap_or(without);
            }
            // The spend made this one fail: leave it out of both histories.
            _ => {}
        }
    }
    let refunded = algorithm.refund(with, written, n).unwrap_or(with);
    for &(later, raw) in probes {
        let t = now.saturating_add(later % scale.saturating_mul(4).max(1));
        let k = permits(raw, capacity);
        let (ours, truth) = (
            algorithm.remaining(refunded, t),
            algorithm.remaining(without, t),
        );
        prop_assert!(
            ours <= truth,
            "{} left after the refund, {} without the spend, at {}",
            ours,
            truth,
            t
        );
        if algorithm.decide(refunded, t, k).0.is_allowed() {
            prop_assert!(
                algorithm.decide(without, t, k).0.is_allowed(),
                "{} admitted only after the refund",
                k
            );
        }
        if between.is_empty() {
            prop_assert_eq!(ours, truth, "nothing in between: the refund is exact");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(3_000))]

    #[test]
    fn refunds_never_over_credit(
        (limit, window) in limits_and_windows(),
        quota in quotas(),
        start in 0..MAX_READING,
        prefix in prop::collection::vec((moves(false), any::<u32>()), 0..20),
        spend in any::<u32>(),
        between in prop::collection::vec((moves(false), any::<u32>()), 0..6),
        probes in prop::collection::vec((any::<u64>(), any::<u32>()), 1..8),
    ) {
        if let Some(window) = window_for(limit, window, 1) {
            let a = FixedWindow::new(limit, window).unwrap();
            refund_never_over_credits(a, window.as_nanos() as u64, start, &prefix, spend, &between, &probes)?;
        }
        if let Some(window) = window_for(limit, window, 2) {
            let a = SlidingWindow::new(limit, window).unwrap();
            refund_never_over_credits(a, window.as_nanos() as u64, start, &prefix, spend, &between, &probes)?;
        }
        let gcra = Gcra::new(quota);
        let scale = gcra.emission_interval().as_nanos() as u64;
        refund_never_over_credits(gcra, scale, start, &prefix, spend, &between, &probes)?;
        // Not the token bucket (nor the warm-up, which keeps its grid alike):
        // there a spend itself can bring refills sooner
        // (a bucket that is not full keeps its refill grid, a full one restarts
        // it), so histories with and without a spend are not ordered; its
        // refunds are checked against RFC 1363's bound below.
    }
}

fn fresh_equivalence<A: Algorithm>(
    algorithm: A,
    scale: u64,
    start: u64,
    trace: &[(Move, u32)],
    probes: &[(u64, u32)],
) -> Result<(), TestCaseError> {
    let capacity = algorithm.capacity();
    let (mut word, mut now) = (algorithm.fresh(), start);
    for (m, raw) in trace {
        now = step(now, m, scale);
        if let (_, Some(next)) = algorithm.decide(word, now, permits(*raw, capacity)) {
            word = next;
        }
        if algorithm.is_fresh_equivalent(word, now) {
            for &(later, raw) in probes {
                let t = now.saturating_add(later % scale.saturating_mul(4).max(1));
                let n = permits(raw, capacity);
                prop_assert_eq!(
                    algorithm.decide(word, t, n).0,
                    algorithm.decide(algorithm.fresh(), t, n).0
                );
                prop_assert_eq!(
                    algorithm.remaining(word, t),
                    algorithm.remaining(algorithm.fresh(), t)
                );
            }
        }
    }
    // And the word is fresh-equivalent after the documented idle time at most.
    let idle = u64::try_from(algorithm.fresh_after_idle().as_nanos()).unwrap();
    prop_assert!(algorithm.is_fresh_equivalent(word, now.saturating_add(idle)));
    Ok(())
}

/// The rate-limiter pattern's flow across the 1000 ms boundary, two per second
/// each way: the fixed window admits twice its limit in 150 ms; the sliding
/// window and the token bucket stay at the limit.
#[test]
fn boundary_burst_fixed_window_doubles_the_others_hold() {
    fn admitted_in_span<A: Algorithm>(algorithm: A) -> u32 {
        let clock = ManualClock::new();
        let limiter = RateLimiter::from_parts(algorithm, clock.clone());
        let mut admitted = 0;
        for at in [900, 950, 1000, 1050] {
            clock.set(Duration::from_millis(at));
            admitted += u32::from(limiter.try_acquire().is_allowed());
        }
        admitted
    }
    let second = Duration::from_secs(1);
    assert_eq!(admitted_in_span(FixedWindow::new(2, second).unwrap()), 4);
    assert_eq!(admitted_in_span(SlidingWindow::new(2, second).unwrap()), 2);
    let bucket = Quota::new(2, 1, Duration::from_millis(500)).unwrap();
    assert_eq!(admitted_in_span(TokenBucket::new(bucket)), 2);
    assert_eq!(admitted_in_span(Gcra::new(bucket)), 2);
}

/// A limit's worth at the very end of one window and again at the very start
/// of the next: the fixed window admits all of both, 2x its limit within 2 ms;
/// the sliding window admits only what the fading weight allows.
#[test]
fn burst_at_a_boundary() {
    let window = Duration::from_secs(1);
    let (fixed_clock, sliding_clock) = (ManualClock::new(), ManualClock::new());
    let fixed =
        RateLimiter::from_parts(FixedWindow::new(100, window).unwrap(), fixed_clock.clone());
    let sliding = RateLimiter::from_parts(
        SlidingWindow::new(100, window).unwrap(),
        sliding_clock.clone(),
    );
    let mut counts = [0, 0];
    for at in [999, 1_001] {
        fixed_clock.set(Duration::from_millis(at));
        sliding_clock.set(Duration::from_millis(at));
        for _ in 0..100 {
            counts[0] += u32::from(fixed.try_acquire().is_allowed());
            counts[1] += u32::from(sliding.try_acquire().is_allowed());
        }
    }
    assert_eq!(counts[0], 200);
    // At 1001 ms the previous window weighs 100 * 999/1000 = 99.9: no room.
    assert_eq!(counts[1], 100);
    // Half a window later it weighs 50: room for 50 (limit * (1 + s / w) with
    // s = 501 ms bounds it at 150).
    sliding_clock.set(Duration::from_millis(1_500));
    assert_eq!(sliding.remaining(), 50);
}

#[test]
fn bad_limits_and_windows_are_typed_errors() {
    let second = Duration::from_secs(1);
    assert_eq!(FixedWindow::new(0, second), Err(QuotaError::ZeroLimit));
    assert_eq!(SlidingWindow::new(0, second), Err(QuotaError::ZeroLimit));
    assert_eq!(
        FixedWindow::new(1, Duration::ZERO),
        Err(QuotaError::ZeroWindow)
    );
    assert_eq!(
        SlidingWindow::new(1, Duration::ZERO),
        Err(QuotaError::ZeroWindow)
    );
    let huge = Duration::from_secs(u64::MAX);
    for err in [
        FixedWindow::new(1, huge).unwrap_err(),
        SlidingWindow::new(1, huge).unwrap_err(),
    ] {
        assert!(
            matches!(err, QuotaError::WindowTooLong { window, .. } if window == huge),
            "{err}"
        );
    }
    // The longest window is accepted, one nanosecond more is not.
    let max = Duration::from_micros(1 << 47);
    assert!(FixedWindow::new(1, max).is_ok());
    assert!(FixedWindow::new(1, max + Duration::from_nanos(1)).is_err());
    // Windows the word cannot number for a limit, with the minimum named.
    let err = FixedWindow::new(u32::MAX, Duration::from_millis(1)).unwrap_err();
    assert_eq!(
        err,
        QuotaError::WindowTooShort {
            limit: u32::MAX,
            window: Duration::from_millis(1),
            min: Duration::from_nanos(65_536_000),
        }
    );
    assert!(err.to_string().contains("65.536ms"), "{err}");
    assert!(FixedWindow::new(u32::MAX, Duration::from_nanos(65_536_000)).is_ok());
    // A sliding window's two counts of 32 bits leave no window number: no
    // window of any length, said so (it named a shortest window of 8.9
    // years, longer than the longest).
    for limit in [u32::MAX, 1 << 31] {
        for window in [second, Duration::from_micros(1 << 47)] {
            assert_eq!(
                SlidingWindow::new(limit, window).map(|_| ()),
                Err(QuotaError::LimitTooLarge {
                    limit,
                    max: (1 << 31) - 1
                })
            );
        }
    }
    assert!(SlidingWindow::new((1 << 31) - 1, Duration::from_micros(1 << 47)).is_ok());
    assert!(SlidingWindow::new(1_000, Duration::from_micros(16)).is_ok());
    assert!(SlidingWindow::new(1_000, Duration::from_nanos(15_999)).is_err());
}

#[test]
fn zero_and_oversized_requests_are_typed_errors_for_every_algorithm() {
    fn check<A: Algorithm>(algorithm: A) {
        let capacity = algorithm.capacity();
        let limiter = RateLimiter::from_parts(algorithm, ManualClock::new());
        assert_eq!(limiter.try_acquire_n(0), Err(AcquireError::ZeroPermits));
        assert_eq!(
            limiter.try_acquire_n(capacity + 1),
            Err(AcquireError::InsufficientCapacity {
                requested: capacity + 1,
                capacity
            })
        );
        assert_eq!(
            limiter.remaining(),
            capacity,
            "a refused request takes nothing"
        );
        assert!(limiter.try_acquire_n(capacity).unwrap().is_allowed());
    }
    let quota = Quota::new(5, 1, Duration::from_secs(1)).unwrap();
    check(FixedWindow::new(5, Duration::from_secs(1)).unwrap());
    check(SlidingWindow::new(5, Duration::from_secs(1)).unwrap());
    check(Gcra::new(quota));
    check(TokenBucket::new(quota));
    check(WarmUp::new(quota, Duration::from_secs(3), 3.0).unwrap());
}

#[test]
fn no_algorithm_panics_or_admits_at_the_ends_of_time() {
    fn check<A: Algorithm + Copy>(algorithm: A) {
        let capacity = algorithm.capacity();
        for now in [0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
            for word in [0, 1, u64::MAX / 2, u64::MAX] {
                for n in [0, 1, capacity, capacity.saturating_add(1), u32::MAX] {
                    let _ = algorithm.decide(word, now, n);
                    let _ = algorithm.remaining(word, now);
                    let _ = algorithm.refund(word, word, n);
                    let _ = algorithm.is_fresh_equivalent(word, now);
                }
            }
        }
    }
    let quota = Quota::new(3, 1, Duration::from_secs(1)).unwrap();
    check(FixedWindow::new(3, Duration::from_secs(1)).unwrap());
    check(SlidingWindow::new(3, Duration::from_secs(1)).unwrap());
    check(Gcra::new(quota));
    check(TokenBucket::new(quota));
    check(WarmUp::new(quota, Duration::from_secs(3), 3.0).unwrap());
    // GCRA's TAT saturates at the end of the clock's range: it denies.
    let gcra = Gcra::new(quota);
    let (d, _) = gcra.decide(u64::MAX - 1, u64::MAX - 1, 3);
    assert!(d.is_denied());
}

/// A quota of one permit every few centuries: the token bucket admits its
/// burst, and GCRA did not (its interval saturated at 2^64 ns, and the
/// burst's first TAT overflowed: denied from the first request on, with a
/// wait of the whole range). GCRA and its live form now admit the burst,
/// then nothing for years.
#[test]
fn a_meter_of_one_permit_in_centuries_admits_its_burst() {
    for capacity in [1, 2, 3, 100] {
        // The longest period the bucket's word allows.
        let most = Quota::new(capacity, 1, Duration::from_secs(1))
            .unwrap()
            .max_fill_time();
        let period = Duration::from_micros(most.as_micros() as u64 / u64::from(capacity));
        let quota = Quota::new(capacity, 1, period).unwrap();
        let now = 1_000_000_000;
        fn burst_then_none<A: Algorithm>(algorithm: &A, capacity: u32, now: u64) {
            let mut word = algorithm.fresh();
            for left in (0..capacity).rev() {
                let (decision, next) = algorithm.decide(word, now, 1);
                assert_eq!(
                    decision,
                    Decision::Allowed { remaining: left },
                    "burst {capacity}"
                );
                word = next.unwrap();
            }
            // The next permit: no sooner than 2^62 ns over the capacity
            // (146 years for one, 1.46 for 100).
            let held = (1u64 << 62) / u64::from(capacity);
            let (decision, _) = algorithm.decide(word, now, 1);
            let wait = decision.retry_after().expect("the burst is spent");
            assert!(wait.as_nanos() >= held - 1, "burst {capacity}: {wait:?}");
            assert!(algorithm.decide(word, now + held - 2, 1).0.is_denied());
        }
        let gcra = Gcra::new(quota);
        burst_then_none(&gcra, capacity, now);
        burst_then_none(&turnstile::LiveGcra::new(quota), capacity, now);
        assert!(
            gcra.emission_interval() >= Duration::from_nanos((1 << 62) / u64::from(capacity) - 1)
        );
    }
}

#[test]
fn gcra_paces_and_bursts_as_configured() {
    let quota = Quota::new(3, 1, Duration::from_millis(100)).unwrap();
    let gcra = Gcra::new(quota);
    assert_eq!(gcra.emission_interval(), Duration::from_millis(100));
    assert_eq!(gcra.tolerance(), Duration::from_millis(200));
    let clock = ManualClock::new();
    let limiter = RateLimiter::from_parts(gcra, clock.clone());
    for left in [2, 1, 0] {
        assert_eq!(limiter.try_acquire(), Decision::Allowed { remaining: left });
    }
    // One permit back every 100 ms, not three at the end of a period.
    clock.advance(Duration::from_millis(150));
    assert_eq!(limiter.remaining(), 1);
    assert!(limiter.try_acquire().is_allowed());
    let wait = limiter.try_acquire().retry_after().unwrap();
    assert_eq!(wait.duration(), Duration::from_millis(50));
    // A batch quota paces at period / amount, rounded up: never faster.
    let batch = Gcra::new(Quota::new(10, 3, Duration::from_micros(10)).unwrap());
    assert_eq!(batch.emission_interval(), Duration::from_nanos(3_334));
}

#[test]
fn sweep_criterion_at_its_boundaries() {
    let second = Duration::from_secs(1);
    let s = 1_000_000_000;
    // Fixed window: a count is owed until its window ends.
    let fixed = FixedWindow::new(2, second).unwrap();
    let word = fixed.decide(fixed.fresh(), 500, 1).1.unwrap();
    assert!(!fixed.is_fresh_equivalent(word, s - 1));
    assert!(fixed.is_fresh_equivalent(word, s));
    // Sliding window: the count weighs on the next window too.
    let sliding = SlidingWindow::new(2, second).unwrap();
    let word = sliding.decide(sliding.fresh(), 500, 1).1.unwrap();
    assert!(!sliding.is_fresh_equivalent(word, 2 * s - 1));
    assert!(sliding.is_fresh_equivalent(word, 2 * s));
    // GCRA: fresh once the TAT is not after the reading.
    let gcra = Gcra::new(Quota::new(2, 1, second).unwrap());
    let word = gcra.decide(gcra.fresh(), 0, 1).1.unwrap();
    assert_eq!(word, s);
    assert!(!gcra.is_fresh_equivalent(word, s - 1));
    assert!(gcra.is_fresh_equivalent(word, s));
    // Token bucket: fresh once full again.
    let bucket = TokenBucket::new(Quota::new(2, 1, second).unwrap());
    let word = bucket.decide(bucket.fresh(), 0, 1).1.unwrap();
    assert!(!bucket.is_fresh_equivalent(word, s - 1));
    assert!(bucket.is_fresh_equivalent(word, s));
}

/// At the end of the clock's range GCRA's peek agrees with its decisions:
/// a permit whose cost would carry the TAT past `u64::MAX` is not counted.
#[test]
fn gcra_peeks_what_it_would_admit_at_the_end_of_the_clock() {
    let gcra = Gcra::new(Quota::new(10, 1, Duration::from_secs(1)).unwrap());
    let second = 1_000_000_000_u64;
    for now in [
        u64::MAX,
        u64::MAX - 1,
        u64::MAX - second / 2,
        u64::MAX - 3 * second,
    ] {
        let word = gcra.fresh();
        let remaining = gcra.remaining(word, now);
        for n in 1..=10 {
            assert_eq!(
                gcra.decide(word, now, n).0.is_allowed(),
                n <= remaining,
                "now = MAX - {}, n = {n}, remaining {remaining}",
                u64::MAX - now
            );
        }
    }
    assert_eq!(gcra.remaining(gcra.fresh(), u64::MAX - 3 * second), 3);
}

/// The shortest windows the documentation gives for each window type.
#[test]
fn window_minimums_are_as_documented() {
    let short = |r: Result<(), QuotaError>| match r {
        Err(QuotaError::WindowTooShort { min, .. }) => Some(min),
        _ => None,
    };
    let fixed = |limit, window| short(FixedWindow::new(limit, window).map(|_| ()));
    let sliding = |limit, window| short(SlidingWindow::new(limit, window).map(|_| ()));
    let (ns, us, ms) = (
        Duration::from_nanos,
        Duration::from_micros,
        Duration::from_millis,
    );
    assert_eq!(fixed(64, ns(1)), Some(ns(2)));
    assert_eq!(fixed(64, ns(2)), None);
    assert_eq!(fixed(65_535, ns(999)), Some(us(1)));
    assert_eq!(fixed(65_535, us(1)), None);
    assert_eq!(fixed(u32::MAX, ms(65)), Some(us(65_536)));
    assert_eq!(sliding(100, ns(100)), Some(ns(250)));
    assert_eq!(sliding(255, ns(999)), Some(us(1)));
    assert_eq!(sliding(1_023, us(15)), Some(us(16)));
    assert_eq!(sliding(65_535, ms(65)), Some(us(65_536)));
    assert_eq!(sliding(65_535, us(65_536)), None);
}

/// A quota of one permit per 584.5 years (2^64 ns and some) is valid; its
/// GCRA interval does not fit 64 bits of nanoseconds. It was cut to 64 bits:
/// 290 ms, a meter admitting three a second; then saturated, which denied
/// even the burst. It is held to 2^62 ns over the capacity (146 years for
/// one): the burst, then nothing.
#[test]
fn a_gcra_period_past_64_bits_of_nanoseconds_is_held_not_wrapped() {
    for period in [
        Duration::from_secs(18_446_744_074),
        Duration::from_micros(18_446_744_073_709_552),
        Duration::from_secs(1 << 40),
    ] {
        let Ok(quota) = Quota::with_period(period) else {
            continue;
        };
        let gcra = Gcra::new(quota);
        assert_eq!(
            gcra.emission_interval(),
            Duration::from_nanos(u64::MAX / 4),
            "{period:?}"
        );
        let clock = ManualClock::new();
        let limiter = RateLimiter::from_parts(gcra, clock.clone());
        let mut admitted = 0;
        for _ in 0..1_000 {
            clock.advance(Duration::from_millis(10));
            admitted += u32::from(limiter.try_acquire().is_allowed());
        }
        assert_eq!(
            admitted, 1,
            "the burst of 1, then none in 10 s at one per 584 years"
        );
    }
}
