//! Client-side waits: blocking and asynchronous, with deadlines and jitter, on
//! the manual clock (no real time passes) and briefly on the real one.

use std::time::{Duration, Instant};

use turnstile::{
    AcquireError, FixedWindow, ManualClock, Quota, RateLimiter, RealClock, WaitError, WaitOptions,
};

const SECOND: Duration = Duration::from_secs(1);

fn manual(
    capacity: u32,
    period: Duration,
) -> (
    RateLimiter<turnstile::TokenBucket, ManualClock>,
    ManualClock,
) {
    let clock = ManualClock::new();
    let quota = Quota::new(capacity, 1, period).unwrap();
    (RateLimiter::with_clock(quota, clock.clone()), clock)
}

#[test]
fn a_blocking_wait_sleeps_exactly_the_retry_after() {
    let (limiter, clock) = manual(2, SECOND);
    assert_eq!(limiter.wait_n(2, WaitOptions::new()), Ok(Duration::ZERO));
    clock.advance(Duration::from_millis(300));
    // The next token is due at 1 s: 700 ms from now.
    assert_eq!(
        limiter.wait(WaitOptions::new()),
        Ok(Duration::from_millis(700))
    );
    assert_eq!(clock.elapsed(), SECOND);
    // Two more need two periods.
    assert_eq!(limiter.wait_n(2, WaitOptions::new()), Ok(2 * SECOND));
    assert_eq!(clock.elapsed(), 3 * SECOND);
}

#[test]
fn a_deadline_shorter_than_the_wait_fails_at_once_without_sleeping() {
    let (limiter, clock) = manual(1, SECOND);
    assert!(limiter.try_acquire().is_allowed());
    let err = limiter
        .wait(WaitOptions::new().deadline(Duration::from_millis(999)))
        .unwrap_err();
    match err {
        WaitError::DeadlineExceeded {
            needed,
            waited,
            deadline,
        } => {
            assert_eq!(needed.duration(), SECOND);
            assert_eq!(waited, Duration::ZERO);
            assert_eq!(deadline, Duration::from_millis(999));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(clock.elapsed(), Duration::ZERO, "it did not sleep");
    assert!(err.to_string().contains("deadline"), "{err}");
    // A deadline the wait fits in succeeds.
    assert_eq!(
        limiter.wait(WaitOptions::new().deadline(SECOND)),
        Ok(SECOND)
    );
}

#[test]
fn jitter_lengthens_sleeps_but_never_shortens_them_or_passes_the_deadline() {
    let mut lengths = Vec::new();
    for _ in 0..200 {
        let (limiter, _clock) = manual(1, SECOND);
        assert!(limiter.try_acquire().is_allowed());
        let waited = limiter
            .wait(WaitOptions::new().jitter(Duration::from_millis(100)))
            .unwrap();
        assert!(
            waited >= SECOND && waited <= SECOND + Duration::from_millis(100),
            "{waited:?}"
        );
        lengths.push(waited);
        // With a deadline, jitter is cut to fit.
        let (limiter, _clock) = manual(1, SECOND);
        assert!(limiter.try_acquire().is_allowed());
        let options = WaitOptions::new()
            .jitter(Duration::from_secs(5))
            .deadline(Duration::from_millis(1_010));
        let waited = limiter.wait(options).unwrap();
        assert!(
            waited >= SECOND && waited <= Duration::from_millis(1_010),
            "{waited:?}"
        );
    }
    lengths.sort();
    lengths.dedup();
    assert!(
        lengths.len() > 100,
        "jitter spreads the wake-ups: {} distinct",
        lengths.len()
    );
}

#[test]
fn impossible_requests_are_errors_not_endless_waits() {
    let (limiter, clock) = manual(3, SECOND);
    assert_eq!(
        limiter.wait_n(0, WaitOptions::new()),
        Err(WaitError::Acquire(AcquireError::ZeroPermits))
    );
    assert_eq!(
        limiter.wait_n(4, WaitOptions::new()),
        Err(WaitError::Acquire(AcquireError::InsufficientCapacity {
            requested: 4,
            capacity: 3
        }))
    );
    assert_eq!(clock.elapsed(), Duration::ZERO);
}

#[test]
fn every_algorithm_can_be_waited_on() {
    let clock = ManualClock::new();
    let window = RateLimiter::from_parts(FixedWindow::new(2, SECOND).unwrap(), clock.clone());
    clock.set(Duration::from_millis(400));
    for _ in 0..2 {
        assert_eq!(window.wait(WaitOptions::new()), Ok(Duration::ZERO));
    }
    assert_eq!(
        window.wait(WaitOptions::new()),
        Ok(Duration::from_millis(600))
    );
}

/// On the real clock the wait sleeps: it never returns before the permit was
/// due (a lower bound only; sleeping longer is always allowed).
#[test]
fn a_real_wait_never_wakes_early() {
    let limiter = RateLimiter::with_clock(
        Quota::new(1, 1, Duration::from_millis(30)).unwrap(),
        RealClock::new(),
    );
    assert!(limiter.try_acquire().is_allowed());
    let start = Instant::now();
    let waited = limiter.wait(WaitOptions::new()).unwrap();
    assert!(
        start.elapsed() >= Duration::from_millis(25),
        "{:?}",
        start.elapsed()
    );
    assert!(waited >= Duration::from_millis(25), "{waited:?}");
}

#[tokio::test]
async fn an_async_wait_on_the_manual_clock() {
    let (limiter, clock) = manual(1, SECOND);
    assert_eq!(
        limiter.wait_async(WaitOptions::new()).await,
        Ok(Duration::ZERO)
    );
    assert_eq!(limiter.wait_async(WaitOptions::new()).await, Ok(SECOND));
    let err = limiter
        .wait_n_async(1, WaitOptions::new().deadline(Duration::from_millis(10)))
        .await
        .unwrap_err();
    assert!(matches!(err, WaitError::DeadlineExceeded { .. }));
    assert_eq!(clock.elapsed(), SECOND);
}

#[tokio::test]
async fn an_async_wait_on_the_real_clock_sleeps_on_the_timer() {
    let limiter = RateLimiter::with_clock(
        Quota::new(1, 1, Duration::from_millis(30)).unwrap(),
        RealClock::new(),
    );
    assert!(limiter.try_acquire().is_allowed());
    let start = Instant::now();
    limiter.wait_async(WaitOptions::new()).await.unwrap();
    assert!(
        start.elapsed() >= Duration::from_millis(25),
        "{:?}",
        start.elapsed()
    );
}
