//! The token bucket through the direct limiter: requests of `n` permits, peeking,
//! clocks that go backwards, and time near and past the packed word's wrap.

mod model;

use std::time::Duration;

use model::Model;
use turnstile::{AcquireError, Clock, Decision, ManualClock, Quota, RateLimiter};

fn limiter(
    capacity: u32,
    amount: u32,
    period: Duration,
) -> (
    RateLimiter<turnstile::TokenBucket, ManualClock>,
    ManualClock,
) {
    let clock = ManualClock::new();
    let quota = Quota::new(capacity, amount, period).unwrap();
    (RateLimiter::with_clock(quota, clock.clone()), clock)
}

fn wait(d: Decision) -> Duration {
    d.retry_after().expect("a denial").duration()
}

#[test]
fn zero_permits_is_an_error_and_touches_nothing() {
    let (l, _) = limiter(3, 1, Duration::from_secs(1));
    let err = l.try_acquire_n(0).unwrap_err();
    assert_eq!(err, AcquireError::ZeroPermits);
    assert!(err.to_string().contains("remaining()"), "{err}");
    assert_eq!(l.remaining(), 3);
}

#[test]
fn more_permits_than_capacity_is_an_error_not_a_wait() {
    let (l, _) = limiter(3, 1, Duration::from_secs(1));
    for n in [4, 1_000, u32::MAX] {
        let err = l.try_acquire_n(n).unwrap_err();
        assert_eq!(
            err,
            AcquireError::InsufficientCapacity {
                requested: n,
                capacity: 3
            }
        );
        assert!(err.to_string().contains("between 1 and 3"), "{err}");
    }
    assert_eq!(l.remaining(), 3, "a refused request spends nothing");
    assert_eq!(l.try_acquire_n(3), Ok(Decision::Allowed { remaining: 0 }));
}

#[test]
fn n_permits_are_all_or_nothing_with_the_exact_wait() {
    let (l, clock) = limiter(5, 1, Duration::from_millis(100));
    assert_eq!(l.try_acquire_n(4), Ok(Decision::Allowed { remaining: 1 }));
    clock.set(Duration::from_millis(30));
    // 1 token now; 3 need two more refills: at 100 ms and 200 ms.
    let d = l.try_acquire_n(3).unwrap();
    assert_eq!(wait(d), Duration::from_millis(170));
    assert_eq!(l.remaining(), 1, "the denial took nothing");
    clock.set(Duration::from_millis(200));
    assert_eq!(l.try_acquire_n(3), Ok(Decision::Allowed { remaining: 0 }));
}

#[test]
fn batches_of_amount_tokens_arrive_each_whole_period() {
    let (l, clock) = limiter(10, 4, Duration::from_millis(100));
    assert!(l.try_acquire_n(10).unwrap().is_allowed());
    clock.set(Duration::from_millis(99));
    assert_eq!(l.remaining(), 0);
    // 6 tokens take two batches: at 100 and 200 ms.
    assert_eq!(
        wait(l.try_acquire_n(6).unwrap()),
        Duration::from_millis(101)
    );
    clock.set(Duration::from_millis(250));
    assert_eq!(l.remaining(), 8);
    clock.set(Duration::from_millis(300));
    assert_eq!(l.remaining(), 10, "capped at capacity");
}

#[test]
fn remaining_peeks_without_spending() {
    let (l, clock) = limiter(3, 1, Duration::from_secs(1));
    for _ in 0..5 {
        assert_eq!(l.remaining(), 3);
    }
    let _ = l.try_acquire_n(3).unwrap();
    clock.set(Duration::from_millis(2_500));
    for _ in 0..5 {
        assert_eq!(l.remaining(), 2);
    }
    assert_eq!(l.try_acquire(), Decision::Allowed { remaining: 1 });
}

#[test]
fn fraction_is_kept_while_not_full_and_dropped_when_full() {
    let (l, clock) = limiter(2, 1, Duration::from_millis(1_000));
    let _ = l.try_acquire_n(2).unwrap(); // empty, refill grid at 0
    clock.set(Duration::from_millis(1_700));
    assert_eq!(l.try_acquire(), Decision::Allowed { remaining: 0 }); // grid kept: next at 2000
    clock.set(Duration::from_millis(1_900));
    assert_eq!(wait(l.try_acquire()), Duration::from_millis(100));

    let (l, clock) = limiter(1, 1, Duration::from_millis(1_000));
    clock.set(Duration::from_millis(5_700)); // full: the fraction is dropped
    assert!(l.try_acquire().is_allowed());
    clock.set(Duration::from_millis(6_000));
    assert_eq!(
        wait(l.try_acquire()),
        Duration::from_millis(700),
        "grid restarted at 5700"
    );
}

#[test]
fn time_going_backwards_refills_nothing_and_moves_nothing_back() {
    let (l, clock) = limiter(3, 1, Duration::from_millis(1_000));
    clock.set(Duration::from_millis(10_000));
    let _ = l.try_acquire_n(3).unwrap(); // empty, last refill 10 000 ms
    clock.set(Duration::from_millis(10_500));
    let forward = wait(l.try_acquire());
    assert_eq!(forward, Duration::from_millis(500));

    // Five seconds back: no refill, and the wait counts from the stored time.
    clock.set(Duration::from_millis(5_000));
    assert_eq!(l.remaining(), 0);
    assert_eq!(wait(l.try_acquire()), Duration::from_millis(6_000));

    // Far back (to the clock's epoch) and the largest jump back the word can tell
    // from a forward one: still nothing.
    clock.set(Duration::ZERO);
    assert_eq!(l.remaining(), 0);
    assert!(l.try_acquire().is_denied());

    // Forward again: refills exactly as if the backward readings never happened.
    clock.set(Duration::from_millis(12_000));
    assert_eq!(l.remaining(), 2);
    assert_eq!(l.try_acquire_n(2), Ok(Decision::Allowed { remaining: 0 }));
    clock.set(Duration::from_millis(12_999));
    assert_eq!(wait(l.try_acquire()), Duration::from_millis(1));
}

#[test]
fn backwards_reading_spends_only_tokens_already_there() {
    let (l, clock) = limiter(3, 1, Duration::from_millis(1_000));
    clock.set(Duration::from_millis(10_000));
    let _ = l.try_acquire().is_allowed(); // 2 left, last refill 10 000 ms
    clock.set(Duration::from_millis(9_000));
    assert_eq!(l.try_acquire(), Decision::Allowed { remaining: 1 });
    assert_eq!(l.try_acquire(), Decision::Allowed { remaining: 0 });
    assert!(l.try_acquire().is_denied());
    clock.set(Duration::from_millis(11_000));
    assert_eq!(l.remaining(), 1, "the grid stayed at 10 000 ms");
}

#[test]
fn clock_extremes_never_panic() {
    let (l, clock) = limiter(u32::MAX, u32::MAX, Duration::from_micros(1 << 20));
    for t in [0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX, 0, u64::MAX] {
        clock.set_nanos(t);
        let _ = l.try_acquire_n(u32::MAX);
        let _ = l.try_acquire();
        let _ = l.remaining();
    }
    let (l, clock) = limiter(3, 1, Duration::from_secs(3_600));
    let _ = l.try_acquire_n(3);
    for t in [u64::MAX, 0, u64::MAX / 3, 7] {
        clock.set_nanos(t);
        let d = l.try_acquire();
        if let Some(r) = d.retry_after() {
            assert!(r.as_nanos() > 0);
        }
    }
}

/// Capacity 2^20 - 1 takes 20 token bits: 44 bits of time in 16 µs units, so the
/// time field wraps every 2^48 µs (~8.9 years), inside a u64 of nanoseconds.
const WIDE: u32 = (1 << 20) - 1;
const UNIT: Duration = Duration::from_micros(16);
const WRAP_NS: u64 = (1 << 48) * 1_000;
const HALF_NS: u64 = WRAP_NS / 2;

#[test]
fn decisions_across_the_wrap_match_unbounded_time() {
    let quota = Quota::new(WIDE, 1_000, UNIT * 64).unwrap();
    assert_eq!(quota.time_unit(), UNIT);
    for wraps in [1u64, 2, 50] {
        let clock = ManualClock::new();
        let l = RateLimiter::with_clock(quota, clock.clone());
        let mut model = Model::pattern(quota);
        let mut t = wraps * WRAP_NS - 2 * quota.fill_time().as_nanos() as u64;
        clock.set_nanos(t);
        for step in 0..20_000u64 {
            let n = [WIDE, 1, 999, 5_000, 300_000][(step % 5) as usize];
            assert_eq!(
                l.try_acquire_n(n).unwrap(),
                model.acquire(t, n),
                "at {t} ns, n {n}"
            );
            assert_eq!(l.remaining(), model.remaining(t));
            t += 213_731 + step * 17;
            clock.set_nanos(t);
        }
        assert!(
            t > wraps * WRAP_NS + quota.fill_time().as_nanos() as u64,
            "crossed the wrap"
        );
    }
}

#[test]
fn a_fresh_bucket_is_immune_to_wrap() {
    let quota = Quota::new(WIDE, 1, UNIT).unwrap();
    for now in [
        HALF_NS - 1,
        HALF_NS,
        HALF_NS + 1,
        WRAP_NS - 1,
        WRAP_NS,
        WRAP_NS + 1,
        3 * WRAP_NS + 7,
    ] {
        let clock = ManualClock::new();
        clock.set_nanos(now);
        let l = RateLimiter::with_clock(quota, clock.clone());
        assert_eq!(l.remaining(), WIDE, "at {now} ns");
        assert_eq!(
            l.try_acquire(),
            Decision::Allowed {
                remaining: WIDE - 1
            }
        );
    }
}

#[test]
fn a_non_full_bucket_idle_past_half_the_span_is_under_credited_never_over() {
    let period = UNIT * 64; // 1.024 ms
    let quota = Quota::new(WIDE, 1, period).unwrap();
    // Idle for half the span or more: the wrapped reading looks behind, so the
    // bucket refills nothing (it should be full).
    for idle in [HALF_NS, HALF_NS + 1, WRAP_NS - 1_000_000] {
        let clock = ManualClock::new();
        let l = RateLimiter::with_clock(quota, clock.clone());
        let _ = l.try_acquire_n(WIDE - 10).unwrap();
        clock.advance(Duration::from_nanos(idle));
        assert_eq!(
            l.remaining(),
            10,
            "idle {idle} ns: under-credited, not over"
        );
        assert!(l.try_acquire_n(11).unwrap().is_denied());
        // Once the clock comes round to the forward half it refills as usual.
        clock.advance(Duration::from_nanos(WRAP_NS - idle));
        assert_eq!(
            l.remaining(),
            10,
            "a whole span later reads as no time at all"
        );
        clock.advance(quota.fill_time());
        assert_eq!(l.remaining(), WIDE);
    }
    // Idle for a whole span and a bit: the wrapped elapsed time is the bit.
    let clock = ManualClock::new();
    let l = RateLimiter::with_clock(quota, clock.clone());
    let _ = l.try_acquire_n(WIDE - 10).unwrap();
    clock.advance(Duration::from_nanos(WRAP_NS) + period * 5); // 5 periods past a wrap
    assert_eq!(l.remaining(), 15, "5 periods, not a full bucket");
    // And one fill time of further use brings it back to the truth.
    clock.advance(quota.fill_time());
    assert_eq!(l.remaining(), WIDE);
    // Below half the span nothing is lost: a long idle reads exactly.
    let clock = ManualClock::new();
    let l = RateLimiter::with_clock(quota, clock.clone());
    let _ = l.try_acquire_n(WIDE).unwrap();
    clock.advance(Duration::from_nanos(HALF_NS - 1_000_000));
    assert_eq!(l.remaining(), WIDE);
}

#[test]
fn a_limiter_on_the_coarse_clock_refills() {
    let clock = turnstile::CoarseClock::new().unwrap();
    let l = RateLimiter::with_clock(
        Quota::new(1, 1, Duration::from_millis(10)).unwrap(),
        clock.clone(),
    );
    assert!(l.try_acquire().is_allowed());
    let denied = l.try_acquire();
    assert!(denied.is_denied());
    // The token is back once the coarse clock reads the denial's wait past
    // its reading then (waited for: on a loaded machine the clock's upkeep
    // thread may lag; 5 s is a hang guard).
    let due = clock.now() + u64::try_from(wait(denied).as_nanos()).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while clock.now() < due {
        assert!(
            std::time::Instant::now() < deadline,
            "the clock does not move"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(l.try_acquire().is_allowed());
}

/// `check` decides exactly as `try_acquire` does, and a denial's deferred wait
/// is exactly the wait `try_acquire` reports, for every algorithm, direct and
/// keyed, along one pseudo-random schedule of requests and clock steps.
#[test]
fn check_agrees_with_try_acquire_and_defers_the_exact_wait() {
    use turnstile::{Algorithm, FixedWindow, Gcra, KeyedBuilder, ManualClock, SlidingWindow};

    fn compare<A: Algorithm + Clone + std::fmt::Debug + Send + Sync + 'static>(algorithm: A) {
        let (a_clock, b_clock) = (ManualClock::new(), ManualClock::new());
        let a = turnstile::RateLimiter::from_parts(algorithm.clone(), a_clock.clone());
        let b = turnstile::RateLimiter::from_parts(algorithm.clone(), b_clock.clone());
        let ka = KeyedBuilder::<u64, A>::new(algorithm.clone())
            .clock(a_clock.clone())
            .build()
            .unwrap();
        let kb = KeyedBuilder::<u64, A>::new(algorithm.clone())
            .clock(b_clock.clone())
            .build()
            .unwrap();
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        let mut denials = 0;
        for step in 0..5_000 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let step_ns = (state >> 33) % 40_000_000;
            a_clock.advance(std::time::Duration::from_nanos(step_ns));
            b_clock.advance(std::time::Duration::from_nanos(step_ns));
            let key = (state >> 60) % 3;
            let expected = a.try_acquire();
            match (expected, b.check()) {
                (turnstile::Decision::Allowed { remaining }, Ok(left)) => {
                    assert_eq!(remaining, left)
                }
                (turnstile::Decision::Denied { retry_after }, Err(not_yet)) => {
                    denials += 1;
                    assert_eq!(
                        not_yet.retry_after(),
                        retry_after,
                        "{algorithm:?} step {step}"
                    );
                    assert!(!not_yet.is_key_limit());
                }
                (expected, got) => panic!("{algorithm:?} step {step}: {expected:?} vs {got:?}"),
            }
            match (ka.try_acquire(&key), kb.check(&key)) {
                (turnstile::KeyedDecision::Allowed { remaining }, Ok(left)) => {
                    assert_eq!(remaining, left)
                }
                (turnstile::KeyedDecision::Denied { retry_after }, Err(not_yet)) => {
                    assert_eq!(
                        not_yet.retry_after(),
                        retry_after,
                        "{algorithm:?} step {step}"
                    );
                }
                (expected, got) => {
                    panic!("{algorithm:?} keyed step {step}: {expected:?} vs {got:?}")
                }
            }
        }
        assert!(
            denials > 100,
            "{algorithm:?}: the schedule must deny often ({denials})"
        );
        assert_eq!(ka.stats().admitted, kb.stats().admitted);
        assert_eq!(ka.stats().denied, kb.stats().denied);
    }

    let quota = turnstile::Quota::new(5, 2, std::time::Duration::from_millis(300)).unwrap();
    compare(turnstile::TokenBucket::new(quota));
    compare(Gcra::new(quota));
    compare(FixedWindow::new(5, std::time::Duration::from_millis(700)).unwrap());
    compare(SlidingWindow::new(5, std::time::Duration::from_millis(700)).unwrap());
}

/// The bucket counts from the start of the time unit a request lands in: a
/// refill can come up to one unit early, never more (the README's
/// "Semantics" and `Quota::new` say so).
#[test]
fn a_refill_comes_at_most_one_time_unit_early() {
    use std::time::Duration;
    use turnstile::{ManualClock, Quota, RateLimiter};
    for (capacity, period, at) in [
        (1_u32, Duration::from_secs(1), Duration::from_nanos(999)),
        (
            1_048_575,
            Duration::from_millis(16),
            Duration::from_millis(1),
        ),
    ] {
        let quota = Quota::new(capacity, 1, period).unwrap();
        let unit = quota.time_unit();
        let clock = ManualClock::new();
        let limiter = RateLimiter::with_clock(quota, clock.clone());
        clock.set(at);
        assert!(limiter.try_acquire_n(capacity).unwrap().is_allowed());
        let wait = limiter.try_acquire().retry_after().unwrap().duration();
        assert!(
            wait <= period && period - wait < unit,
            "{capacity}: {wait:?}"
        );
    }
}

/// A denial becomes an owned error for `?`, with the wait and its kind; an
/// admission the tokens left.
#[test]
fn decisions_convert_to_results_for_the_question_mark() {
    use std::time::Duration;
    use turnstile::{KeyedDecision, KeyedLimiter, ManualClock, Quota, RateLimited, RateLimiter};
    let clock = ManualClock::new();
    let quota = Quota::new(2, 1, Duration::from_secs(3)).unwrap();
    let limiter = RateLimiter::with_clock(quota, clock.clone());
    assert_eq!(limiter.try_acquire().into_result(), Ok(1));
    assert_eq!(limiter.try_acquire().into_result(), Ok(0));
    let err = limiter.try_acquire().into_result().unwrap_err();
    assert_eq!(err.retry_after().duration(), Duration::from_secs(3));
    assert!(!err.is_key_limit());
    assert_eq!(err.to_string(), "rate limited: retry after 3s");
    let from_check = limiter.check().map_err(RateLimited::from).unwrap_err();
    assert_eq!(from_check, err);
    let boxed: Box<dyn std::error::Error> = Box::new(err);
    assert!(boxed.downcast_ref::<RateLimited>().is_some());

    let keyed = KeyedLimiter::<String, _, _>::builder(quota)
        .clock(clock)
        .max_keys(1)
        .build()
        .unwrap();
    assert_eq!(keyed.try_acquire("a").into_result(), Ok(1));
    let full = keyed.try_acquire("b");
    assert!(matches!(full, KeyedDecision::KeyLimit { .. }));
    let err = full.into_result().unwrap_err();
    assert!(err.is_key_limit());
    assert!(err.to_string().contains("most keys"), "{err}");
}
