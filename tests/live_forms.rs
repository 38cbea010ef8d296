//! Live quotas for GCRA and the two windows ([`turnstile::LiveGcra`],
//! [`turnstile::LiveFixedWindow`], [`turnstile::LiveSlidingWindow`]).
//!
//! - Against reference models: random traces of acquire, peek, advance and
//!   quota changes on a direct and on a keyed limiter (with sweeps) decide
//!   exactly as a plain model of each algorithm does, in unbounded integer
//!   time with no packing, where a change applies the conversion rule each
//!   form states.
//! - Under threads: deciders race a thread that changes the quota; the
//!   permits admitted stay within what the quotas in force allow.

#[path = "support/deciders.rs"]
mod deciders;
#[path = "support/live_ops.rs"]
mod live_ops;

use std::sync::Arc;
use std::time::Duration;

use deciders::Deciders;
use live_ops::{KEYS, Op};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use turnstile::{
    Algorithm, Decision, FixedWindow, KeyedBuilder, KeyedDecision, KeyedLimiter, LiveFixedWindow,
    LiveGcra, LiveSlidingWindow, ManualClock, Quota, QuotaError, RateLimiter, Reconfigure,
    SlidingWindow, Tiered,
};

/// A decision as the models give it: the permits left, or the wait in ns.
type Answer = Result<u32, u64>;

fn answer(decision: Decision) -> Answer {
    match decision {
        Decision::Allowed { remaining } => Ok(remaining),
        Decision::Denied { retry_after } => Err(retry_after.as_nanos()),
    }
}

/// A reference model of one key: plain integers, no packing.
trait Model: Clone + std::fmt::Debug {
    /// What a change is given.
    type Quota: Copy + std::fmt::Debug;
    fn new(quota: Self::Quota) -> Self;
    fn capacity(&self) -> u32;
    fn acquire(&mut self, now: u64, n: u32) -> Answer;
    fn remaining(&self, now: u64) -> u32;
    /// The conversion rule, at clock reading `now`.
    fn set_quota(&mut self, quota: Self::Quota, now: u64);
}

/// GCRA: `T = ceil(period / amount)`, horizon `capacity * T`.
#[derive(Clone, Debug)]
struct GcraModel {
    interval: u128,
    capacity: u128,
    tat: u128,
}

impl GcraModel {
    fn horizon(&self) -> u128 {
        self.capacity * self.interval
    }
}

impl Model for GcraModel {
    type Quota = Quota;
    fn new(quota: Quota) -> GcraModel {
        GcraModel {
            interval: quota
                .period()
                .as_nanos()
                .div_ceil(u128::from(quota.amount())),
            capacity: u128::from(quota.capacity()),
            tat: 0,
        }
    }
    fn capacity(&self) -> u32 {
        self.capacity as u32
    }
    fn acquire(&mut self, now: u64, n: u32) -> Answer {
        let now = u128::from(now);
        let tat = self.tat.max(now);
        let ahead = tat - now + u128::from(n) * self.interval;
        if ahead <= self.horizon() {
            self.tat = tat + u128::from(n) * self.interval;
            Ok(((self.horizon() - ahead) / self.interval) as u32)
        } else {
            Err((ahead - self.horizon()) as u64)
        }
    }
    fn remaining(&self, now: u64) -> u32 {
        let now = u128::from(now);
        let ahead = self.tat.max(now) - now;
        (self.horizon().saturating_sub(ahead) / self.interval) as u32
    }
    fn set_quota(&mut self, quota: Quota, now: u64) {
        let available = u128::from(self.remaining(now));
        let idle = self.tat <= u128::from(now);
        *self = GcraModel {
            tat: 0,
            ..GcraModel::new(quota)
        };
        if !idle {
            let kept = available.min(self.capacity);
            self.tat = u128::from(now) + (self.capacity - kept) * self.interval;
        }
    }
}

/// A fixed window: the count of one absolute window number.
#[derive(Clone, Debug)]
struct FixedModel {
    limit: u64,
    window: u64,
    /// `(window number, count)`; `None` for a key with nothing counted.
    counted: Option<(u64, u64)>,
}

impl FixedModel {
    /// The count that applies at `now`, the window it is in, and how far
    /// ahead of `now`'s window that is.
    fn state(&self, now: u64) -> (u64, u64, u64) {
        let index = now / self.window;
        match self.counted {
            Some((w, count)) if w == index => (count, index, 0),
            Some((w, count)) if w > index => (count, w, w - index),
            _ => (0, index, 0),
        }
    }
}

impl Model for FixedModel {
    type Quota = (u32, u64);
    fn new((limit, window): (u32, u64)) -> FixedModel {
        FixedModel {
            limit: u64::from(limit),
            window,
            counted: None,
        }
    }
    fn capacity(&self) -> u32 {
        self.limit as u32
    }
    fn acquire(&mut self, now: u64, n: u32) -> Answer {
        let (count, window, ahead) = self.state(now);
        let n = u64::from(n);
        if count + n <= self.limit {
            self.counted = Some((window, count + n));
            Ok((self.limit - count - n) as u32)
        } else {
            Err((ahead + 1) * self.window - now % self.window)
        }
    }
    fn remaining(&self, now: u64) -> u32 {
        (self.limit - self.state(now).0) as u32
    }
    fn set_quota(&mut self, (limit, window): (u32, u64), now: u64) {
        let (count, counted, _) = self.state(now);
        let start = (counted * self.window).max(now);
        let left = self.limit - count;
        *self = FixedModel::new((limit, window));
        if count > 0 {
            let kept = left.min(self.limit);
            self.counted = Some((start / self.window, self.limit - kept));
        }
    }
}

/// A sliding window: the counts of one absolute window and the one before.
#[derive(Clone, Debug)]
struct SlidingModel {
    limit: u64,
    window: u64,
    /// `(window number, previous, current)`; `None` for a fresh key.
    counted: Option<(u64, u64, u64)>,
}

impl SlidingModel {
    /// `(previous, current, window, ahead, into)`: the counts at `now`, the
    /// window they are in, how far ahead of `now`'s that is, and the offset
    /// into it to evaluate at.
    fn state(&self, now: u64) -> (u64, u64, u64, u64, u64) {
        let index = now / self.window;
        let into = now % self.window;
        match self.counted {
            Some((w, p, c)) if w == index => (p, c, index, 0, into),
            Some((w, _, c)) if w + 1 == index => (c, 0, index, 0, into),
            Some((w, p, c)) if w > index => (p, c, w, w - index, 0),
            _ => (0, 0, index, 0, into),
        }
    }
}

impl Model for SlidingModel {
    type Quota = (u32, u64);
    fn new((limit, window): (u32, u64)) -> SlidingModel {
        SlidingModel {
            limit: u64::from(limit),
            window,
            counted: None,
        }
    }
    fn capacity(&self) -> u32 {
        self.limit as u32
    }
    fn acquire(&mut self, now: u64, n: u32) -> Answer {
        let (p, c, window, ahead, into) = self.state(now);
        let w = u128::from(self.window);
        let n = u64::from(n);
        // The estimate `c + n + p * (w - e) / w` against the limit, exactly.
        let estimate = u128::from(c + n) * w + u128::from(p) * (w - u128::from(into));
        if c + n <= self.limit && estimate <= u128::from(self.limit) * w {
            self.counted = Some((window, p, c + n));
            let left = (u128::from(self.limit) * w - estimate) / w;
            return Ok(left as u64 as u32);
        }
        let reading_into = u128::from(now % self.window);
        // The first offset (in this window or the next) where it fits.
        let target = if c + n <= self.limit {
            let room = u128::from(self.limit - c - n);
            u128::from(ahead) * w + w - (room * w / u128::from(p.max(1))).min(w)
        } else {
            let room = u128::from(self.limit - n);
            u128::from(ahead + 1) * w + w - (room * w / u128::from(c.max(1))).min(w)
        };
        Err(target.saturating_sub(reading_into) as u64)
    }
    fn remaining(&self, now: u64) -> u32 {
        let (p, c, _, _, into) = self.state(now);
        let w = u128::from(self.window);
        let used = u128::from(c) * w + u128::from(p) * (w - u128::from(into));
        ((u128::from(self.limit) * w).saturating_sub(used) / w) as u32
    }
    fn set_quota(&mut self, (limit, window): (u32, u64), now: u64) {
        let (p, c, counted, _, _) = self.state(now);
        let start = (counted * self.window).max(now);
        let left = u64::from(self.remaining(now));
        *self = SlidingModel::new((limit, window));
        if p | c != 0 {
            let kept = left.min(self.limit);
            self.counted = Some((start / self.window, 0, self.limit - kept));
        }
    }
}

/// One of the three forms under test: its model, and how to build it.
trait Form: Reconfigure + Send + Sync + Sized + 'static {
    type Model: Model;
    /// The quotas a trace switches between: lower, higher, faster, slower.
    fn quotas() -> Vec<<Self::Model as Model>::Quota>;
    fn setting(q: <Self::Model as Model>::Quota) -> Self::Quota;
    fn build(q: <Self::Model as Model>::Quota) -> Self;
}

impl Form for LiveGcra {
    type Model = GcraModel;
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
    fn setting(q: Quota) -> Quota {
        q
    }
    fn build(q: Quota) -> LiveGcra {
        LiveGcra::new(q)
    }
}

/// Limits and windows (µs) for both window forms: the same window lowered
/// and raised, and longer and shorter windows, on and off the old grid.
fn window_quotas() -> Vec<(u32, u64)> {
    vec![
        (5, 2_000_000),
        (2, 2_000_000),
        (12, 2_000_000),
        (1, 300_000),
        (40, 5_000_000),
        (7, 1_300_000),
    ]
}

impl Form for LiveFixedWindow {
    type Model = FixedModel;
    fn quotas() -> Vec<(u32, u64)> {
        window_quotas()
            .into_iter()
            .map(|(l, micros)| (l, micros * 1_000))
            .collect()
    }
    fn setting((limit, nanos): (u32, u64)) -> FixedWindow {
        FixedWindow::new(limit, Duration::from_nanos(nanos)).unwrap()
    }
    fn build(q: (u32, u64)) -> LiveFixedWindow {
        LiveFixedWindow::new(Self::setting(q)).unwrap()
    }
}

impl Form for LiveSlidingWindow {
    type Model = SlidingModel;
    fn quotas() -> Vec<(u32, u64)> {
        LiveFixedWindow::quotas()
    }
    fn setting((limit, nanos): (u32, u64)) -> SlidingWindow {
        SlidingWindow::new(limit, Duration::from_nanos(nanos)).unwrap()
    }
    fn build(q: (u32, u64)) -> LiveSlidingWindow {
        LiveSlidingWindow::new(Self::setting(q)).unwrap()
    }
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    live_ops::ops(true)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 400,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    }
}

/// What a limiter under test must answer.
trait Subject<A: Reconfigure> {
    fn acquire(&self, key: usize, n: u32) -> Result<Decision, ()>;
    fn remaining(&self, key: usize) -> u32;
    fn set_quota(&self, quota: A::Quota);
    fn sweep(&self);
}

impl<A: Reconfigure> Subject<A> for RateLimiter<A, ManualClock> {
    fn acquire(&self, _key: usize, n: u32) -> Result<Decision, ()> {
        self.try_acquire_n(n).map_err(|_| ())
    }
    fn remaining(&self, _key: usize) -> u32 {
        RateLimiter::remaining(self)
    }
    fn set_quota(&self, quota: A::Quota) {
        RateLimiter::set_quota(self, quota).unwrap();
    }
    fn sweep(&self) {}
}

impl<A: Reconfigure> Subject<A> for KeyedLimiter<usize, A, ManualClock> {
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
    fn set_quota(&self, quota: A::Quota) {
        KeyedLimiter::set_quota(self, quota).unwrap();
    }
    fn sweep(&self) {
        KeyedLimiter::sweep(self);
    }
}

/// Run `ops` on `subject` and on one model per key, and require the same
/// answer at every step.
fn check<A: Form>(
    subject: &impl Subject<A>,
    clock: &ManualClock,
    keys: usize,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let quotas = A::quotas();
    let mut models: Vec<A::Model> = (0..keys).map(|_| A::Model::new(quotas[0])).collect();
    let mut now = 0u64;
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Acquire { key, n, raw } => {
                let key = key % keys;
                let capacity = models[key].capacity();
                let n = if raw { n } else { 1 + n % capacity };
                let got = subject.acquire(key, n);
                if n == 0 || n > capacity {
                    prop_assert!(got.is_err(), "step {}: n = {} accepted", step, n);
                } else {
                    let want = models[key].acquire(now, n);
                    prop_assert_eq!(
                        got.map(answer),
                        Ok(want),
                        "step {}: {:?} at {} ns",
                        step,
                        op,
                        now
                    );
                }
            }
            Op::Remaining { key } => {
                let key = key % keys;
                prop_assert_eq!(
                    subject.remaining(key),
                    models[key].remaining(now),
                    "step {} at {} ns",
                    step,
                    now
                );
            }
            Op::Advance { micros } => {
                now += micros * 1_000;
                clock.advance(Duration::from_micros(micros));
            }
            Op::SetQuota { i } => {
                let quota = quotas[i % quotas.len()];
                subject.set_quota(A::setting(quota));
                for model in &mut models {
                    model.set_quota(quota, now);
                }
            }
            Op::Sweep => subject.sweep(),
        }
    }
    Ok(())
}

fn direct<A: Form>(ops: &[Op]) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    let limiter = RateLimiter::from_parts(A::build(A::quotas()[0]), clock.clone());
    check::<A>(&limiter, &clock, 1, ops)
}

fn keyed<A: Form>(ops: &[Op]) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    let limiter = KeyedBuilder::<usize, _>::new(A::build(A::quotas()[0]))
        .clock(clock.clone())
        .shards(2)
        .build()
        .unwrap();
    check::<A>(&limiter, &clock, KEYS, ops)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn gcra_direct_decides_as_the_model_across_changes(ops in ops()) {
        direct::<LiveGcra>(&ops)?;
    }

    #[test]
    fn gcra_keyed_decides_as_the_model_across_changes_and_sweeps(ops in ops()) {
        keyed::<LiveGcra>(&ops)?;
    }

    #[test]
    fn fixed_window_direct_decides_as_the_model_across_changes(ops in ops()) {
        direct::<LiveFixedWindow>(&ops)?;
    }

    #[test]
    fn fixed_window_keyed_decides_as_the_model_across_changes_and_sweeps(ops in ops()) {
        keyed::<LiveFixedWindow>(&ops)?;
    }

    #[test]
    fn sliding_window_direct_decides_as_the_model_across_changes(ops in ops()) {
        direct::<LiveSlidingWindow>(&ops)?;
    }

    #[test]
    fn sliding_window_keyed_decides_as_the_model_across_changes_and_sweeps(ops in ops()) {
        keyed::<LiveSlidingWindow>(&ops)?;
    }
}

/// Between changes, a live form decides exactly as its fixed form.
#[test]
fn without_changes_each_form_decides_as_its_fixed_form() {
    fn same<L: Algorithm, P: Algorithm>(live: &L, plain: &P) {
        let (mut a, mut b) = (live.fresh(), plain.fresh());
        let mut now = 0;
        for (step, n) in [3u32, 3, 1, 4, 5, 1, 2, 2, 5, 1].into_iter().enumerate() {
            now += (step as u64 * 7_919 % 13) * 170_000_000;
            let n = n.min(plain.capacity());
            let (da, na) = live.decide(a, now, n);
            let (db, nb) = plain.decide(b, now, n);
            assert_eq!(da, db, "step {step} at {now} ns");
            assert_eq!(na.is_some(), nb.is_some());
            a = na.unwrap_or(a);
            b = nb.unwrap_or(b);
            assert_eq!(live.remaining(a, now), plain.remaining(b, now));
        }
    }
    let quota = Quota::new(5, 2, Duration::from_millis(700)).unwrap();
    same(&LiveGcra::new(quota), &turnstile::Gcra::new(quota));
    let fixed = FixedWindow::new(6, Duration::from_secs(1)).unwrap();
    same(&LiveFixedWindow::new(fixed).unwrap(), &fixed);
    let sliding = SlidingWindow::new(6, Duration::from_secs(1)).unwrap();
    same(&LiveSlidingWindow::new(sliding).unwrap(), &sliding);
}

/// An exhausted key stays refused across a change that lowers or raises the
/// quota, for each form, direct and keyed; a key first seen after the change
/// gets the new quota whole.
#[test]
fn an_exhausted_key_gets_nothing_from_a_change() {
    fn run<A: Form>() {
        let quotas = A::quotas();
        for (from, to) in [(0, 1), (0, 4)] {
            let clock = ManualClock::new();
            let limiter = KeyedBuilder::<u32, _>::new(A::build(quotas[from]))
                .clock(clock.clone())
                .build()
                .unwrap();
            let capacity = A::Model::new(quotas[from]).capacity();
            assert!(limiter.try_acquire_n(&1, capacity).unwrap().is_allowed());
            assert!(!limiter.try_acquire(&1).is_allowed());
            limiter.set_quota(A::setting(quotas[to])).unwrap();
            assert_eq!(limiter.remaining(&1), 0, "{from} -> {to}");
            assert!(!limiter.try_acquire(&1).is_allowed());
            assert_eq!(limiter.remaining(&2), A::Model::new(quotas[to]).capacity());
        }
    }
    run::<LiveGcra>();
    run::<LiveFixedWindow>();
    run::<LiveSlidingWindow>();
}

/// Threads decide on one key while another thread changes the quota back and
/// forth on a frozen clock: nothing refills, a change creates permits only in
/// a full word, and the first decision empties it; so the permits admitted
/// are at most the larger limit.
#[test]
fn concurrent_changes_on_a_frozen_clock_admit_at_most_one_burst() {
    fn run<A: Form>(small: usize, large: usize) {
        let quotas = A::quotas();
        let bound = u64::from(A::Model::new(quotas[large]).capacity());
        for keyed in [false, true] {
            let clock = ManualClock::new();
            clock.set(Duration::from_secs(10));
            let direct = Arc::new(RateLimiter::from_parts(
                A::build(quotas[small]),
                clock.clone(),
            ));
            let by_key = Arc::new(
                KeyedBuilder::<u32, _>::new(A::build(quotas[small]))
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
            for i in 0..300 {
                std::thread::sleep(Duration::from_micros(30));
                let quota = A::setting(quotas[if i % 2 == 0 { large } else { small }]);
                if keyed {
                    by_key.set_quota(quota).unwrap();
                } else {
                    direct.set_quota(quota).unwrap();
                }
            }
            let admitted = deciders.stop();
            assert!(admitted <= bound, "keyed {keyed}: {admitted} > {bound}");
            // The deciders ran: the first burst went out.
            assert!(admitted >= 1, "keyed {keyed}: nothing admitted");
        }
    }
    run::<LiveGcra>(1, 4);
    run::<LiveFixedWindow>(1, 4);
    run::<LiveSlidingWindow>(1, 4);
}

#[test]
fn a_refused_change_leaves_the_limiter_as_it_was() {
    let window = FixedWindow::new(10, Duration::from_secs(1)).unwrap();
    let clock = ManualClock::new();
    let limiter = RateLimiter::from_parts(
        LiveFixedWindow::with_ceiling(window, 100).unwrap(),
        clock.clone(),
    );
    assert!(limiter.try_acquire_n(4).unwrap().is_allowed());
    let err = limiter
        .set_quota(FixedWindow::new(1_000, Duration::from_secs(1)).unwrap())
        .unwrap_err();
    assert_eq!(
        err,
        QuotaError::AboveCeiling {
            capacity: 1_000,
            ceiling: 100
        }
    );
    assert_eq!(limiter.quota(), window);
    assert_eq!(limiter.remaining(), 6);
    assert_eq!(limiter.algorithm().changes(), 0);
    // A sliding window too short for the live word's window number.
    let sliding =
        LiveSlidingWindow::new(SlidingWindow::new(10, Duration::from_secs(1)).unwrap()).unwrap();
    let limiter = RateLimiter::from_parts(sliding, clock);
    assert!(matches!(
        limiter.set_quota(SlidingWindow::new(10, Duration::from_millis(10)).unwrap()),
        Err(QuotaError::WindowTooShort { .. })
    ));
    assert_eq!(limiter.algorithm().changes(), 0);
    assert_eq!(limiter.remaining(), 10);
}

/// A window's limit above its live form's ceiling is refused with a message
/// that names the window's `with_ceiling`, not only the token bucket's.
#[test]
fn a_limit_above_the_ceiling_names_the_windows_with_ceiling() {
    let clock = ManualClock::new();
    let second = Duration::from_secs(1);
    let fixed = RateLimiter::from_parts(
        LiveFixedWindow::with_ceiling(FixedWindow::new(10, second).unwrap(), 100).unwrap(),
        clock.clone(),
    );
    let sliding = RateLimiter::from_parts(
        LiveSlidingWindow::with_ceiling(SlidingWindow::new(10, second).unwrap(), 100).unwrap(),
        clock,
    );
    for (err, form) in [
        (
            fixed
                .set_quota(FixedWindow::new(500, second).unwrap())
                .unwrap_err(),
            "`LiveFixedWindow::with_ceiling`",
        ),
        (
            sliding
                .set_quota(SlidingWindow::new(500, second).unwrap())
                .unwrap_err(),
            "`LiveSlidingWindow::with_ceiling`",
        ),
    ] {
        assert_eq!(
            err,
            QuotaError::AboveCeiling {
                capacity: 500,
                ceiling: 100
            }
        );
        let message = err.to_string();
        assert!(message.contains(form), "{message}");
        assert!(message.contains("window limit) of 500"), "{message}");
        assert!(message.contains("ceiling of 100"), "{message}");
        assert!(message.contains("at least 500"), "{message}");
    }
}

#[test]
fn a_tier_of_windows_is_changed_alone() {
    let clock = ManualClock::new();
    let tier = |limit| {
        let window = FixedWindow::new(limit, Duration::from_secs(60)).unwrap();
        KeyedBuilder::<String, _>::new(LiveFixedWindow::new(window).unwrap())
            .clock(clock.clone())
            .build()
            .unwrap()
    };
    let per_key = Tiered::new([("free", tier(2)), ("paid", tier(10))], |key: &str| {
        usize::from(key.starts_with("paid"))
    })
    .unwrap();
    assert!(per_key.try_acquire_n("free-1", 2).unwrap().is_allowed());
    per_key
        .set_quota(
            "free",
            FixedWindow::new(5, Duration::from_secs(60)).unwrap(),
        )
        .unwrap();
    assert_eq!(per_key.remaining("free-1"), 0);
    assert_eq!(per_key.remaining("free-2"), 5);
    assert_eq!(per_key.remaining("paid-1"), 10);
    clock.advance(Duration::from_secs(60));
    assert_eq!(per_key.remaining("free-1"), 5);
}

/// A refund across a change declines, for every form.
#[test]
fn a_refund_across_a_change_declines() {
    let clock = ManualClock::new();
    let quota = Quota::new(5, 1, Duration::from_secs(1)).unwrap();
    let limiter = RateLimiter::from_parts(LiveGcra::new(quota), clock.clone());
    let admission = limiter.try_acquire_n_refundable(3).unwrap().unwrap();
    limiter.set_quota(quota).unwrap();
    limiter.set_quota(quota).unwrap();
    assert!(!admission.refund());
    assert_eq!(limiter.remaining(), 2);
    // Without a change it goes back.
    let admission = limiter.try_acquire_n_refundable(2).unwrap().unwrap();
    assert!(admission.refund());
    assert_eq!(limiter.remaining(), 2);
}

/// A window too short for a live window's word names what its counts are
/// laid out for (the ceiling, 65,535 by default), not the limit asked for:
/// a limit of 1 takes a 10 ms sliding window on its own, so "lower the
/// limit" could never help; a lower ceiling does, and the message says how.
#[test]
fn a_window_too_short_for_a_live_word_names_its_ceiling() {
    let window = SlidingWindow::new(1, Duration::from_millis(10)).unwrap();
    let err = LiveSlidingWindow::new(window).unwrap_err();
    let QuotaError::WindowTooShort { limit, min, .. } = err else {
        panic!("{err:?}");
    };
    assert_eq!(limit, 65_535);
    assert!(min > Duration::from_millis(10), "{min:?}");
    assert!(err.to_string().contains("with_ceiling"), "{err}");
    // The ceiling the message points to: a live window of that 10 ms.
    assert!(LiveSlidingWindow::with_ceiling(window, 1).is_ok());
    let fixed = FixedWindow::new(1, Duration::from_nanos(1)).unwrap();
    assert!(matches!(
        LiveFixedWindow::new(fixed),
        Err(QuotaError::WindowTooShort { limit: 65_535, .. })
    ));
    // A plain window names its own limit, as before.
    assert!(matches!(
        SlidingWindow::new(65_535, Duration::from_micros(1)),
        Err(QuotaError::WindowTooShort { limit: 65_535, .. })
    ));
}

/// A live sliding window's word keeps two counts as wide as its ceiling and
/// a window number in what is left of 63 bits: at a ceiling of `2^30` or
/// more that is one bit, which cannot tell the next window from the one
/// before, and such a window denied for ever once a window was counted. It
/// is refused; below, the window moves on.
#[test]
fn a_live_sliding_window_without_room_to_number_its_windows_is_refused() {
    let window = Duration::from_micros(1 << 47);
    let plain = SlidingWindow::new(1, window).unwrap();
    for ceiling in [1 << 30, u32::MAX >> 1] {
        assert!(
            matches!(
                LiveSlidingWindow::with_ceiling(plain, ceiling),
                Err(QuotaError::LimitTooLarge {
                    max: 0x3fff_ffff,
                    ..
                })
            ),
            "ceiling {ceiling}"
        );
    }
    let big = SlidingWindow::new(1 << 30, window).unwrap();
    assert!(matches!(
        LiveSlidingWindow::new(big),
        Err(QuotaError::LimitTooLarge { .. })
    ));
    // The widest ceiling left: two windows later, the window admits again.
    let live = LiveSlidingWindow::with_ceiling(plain, (1 << 30) - 1).unwrap();
    let nanos = window.as_nanos() as u64;
    let (first, word) = live.decide(live.fresh(), 0, 1);
    assert!(first.is_allowed());
    let word = word.unwrap();
    assert!(live.decide(word, 1, 1).0.is_denied());
    assert!(live.decide(word, 2 * nanos + 1, 1).0.is_allowed());
}
