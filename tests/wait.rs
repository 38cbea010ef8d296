//! Client-side waits: blocking and asynchronous, with deadlines and jitter, on
//! the manual clock (no real time passes) and briefly on the real one.

use std::time::{Duration, Instant};

use turnstile::{
    AcquireError, FixedWindow, KeyedLimiter, ManualClock, Quota, RateLimiter, RealClock,
    TokenBucket, WaitError, WaitOptions,
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
    // Timed from before the token is spent: the next is due 30 ms after
    // that, however long this thread is held up in between.
    let start = Instant::now();
    assert!(limiter.try_acquire().is_allowed());
    let waited = limiter.wait(WaitOptions::new()).unwrap();
    let elapsed = start.elapsed();
    assert!(elapsed >= Duration::from_millis(25), "{elapsed:?}");
    // The wait is read on the limiter's clock (the TSC) and `elapsed` on
    // `Instant`: two clocks, a fraction of a microsecond apart at times.
    assert!(
        waited > Duration::ZERO && waited <= elapsed + Duration::from_millis(1),
        "{waited:?} of {elapsed:?}"
    );
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
    // Timed from before the token is spent, as above.
    let start = Instant::now();
    assert!(limiter.try_acquire().is_allowed());
    limiter.wait_async(WaitOptions::new()).await.unwrap();
    assert!(
        start.elapsed() >= Duration::from_millis(25),
        "{:?}",
        start.elapsed()
    );
}

type Keyed = KeyedLimiter<String, TokenBucket, ManualClock>;

fn keyed(capacity: u32, period: Duration, max_keys: usize) -> (Keyed, ManualClock) {
    let clock = ManualClock::new();
    let quota = Quota::new(capacity, 1, period).unwrap();
    let limiter = KeyedLimiter::<String>::builder(quota)
        .clock(clock.clone())
        .shards(1)
        .max_keys(max_keys)
        .build()
        .unwrap();
    (limiter, clock)
}

#[test]
fn a_keyed_wait_sleeps_each_keys_own_retry_after() {
    let (limiter, clock) = keyed(2, SECOND, 100);
    assert_eq!(
        limiter.wait_n("alice", 2, WaitOptions::new()),
        Ok(Duration::ZERO)
    );
    // Bob's bucket is his own: no wait, no sleep.
    assert_eq!(
        limiter.wait_n("bob", 2, WaitOptions::new()),
        Ok(Duration::ZERO)
    );
    assert_eq!(clock.elapsed(), Duration::ZERO);
    clock.advance(Duration::from_millis(300));
    assert_eq!(
        limiter.wait("alice", WaitOptions::new()),
        Ok(Duration::from_millis(700))
    );
    assert_eq!(clock.elapsed(), SECOND);
    // Bob refilled one token meanwhile; his second is one period after it.
    assert_eq!(limiter.wait_n("bob", 2, WaitOptions::new()), Ok(SECOND));
    assert_eq!(clock.elapsed(), 2 * SECOND);
    // A wait counts its outcome once: four admissions, no denial for the
    // tries it slept through.
    let stats = limiter.stats();
    assert_eq!((stats.admitted, stats.denied), (4, 0));
}

#[test]
fn a_keyed_deadline_fails_at_once_without_sleeping_and_counts_one_denial() {
    let (limiter, clock) = keyed(1, SECOND, 100);
    assert!(limiter.try_acquire("alice").is_allowed());
    let err = limiter
        .wait(
            "alice",
            WaitOptions::new().deadline(Duration::from_millis(999)),
        )
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
    assert_eq!(limiter.stats().denied, 1);
    // Another key is not held up by alice's deadline.
    assert_eq!(
        limiter.wait("bob", WaitOptions::new().deadline(Duration::ZERO)),
        Ok(Duration::ZERO)
    );
    // A deadline the wait fits in succeeds, exactly at it.
    assert_eq!(
        limiter.wait("alice", WaitOptions::new().deadline(SECOND)),
        Ok(SECOND)
    );
}

#[test]
fn keyed_jitter_stays_between_the_retry_after_and_the_deadline() {
    let mut lengths = Vec::new();
    for _ in 0..200 {
        let (limiter, _clock) = keyed(1, SECOND, 100);
        assert!(limiter.try_acquire("k").is_allowed());
        let waited = limiter
            .wait("k", WaitOptions::new().jitter(Duration::from_millis(100)))
            .unwrap();
        assert!(
            waited >= SECOND && waited <= SECOND + Duration::from_millis(100),
            "{waited:?}"
        );
        lengths.push(waited);
        let (limiter, _clock) = keyed(1, SECOND, 100);
        assert!(limiter.try_acquire("k").is_allowed());
        let options = WaitOptions::new()
            .jitter(Duration::from_secs(5))
            .deadline(Duration::from_millis(1_010));
        let waited = limiter.wait("k", options).unwrap();
        assert!(
            waited >= SECOND && waited <= Duration::from_millis(1_010),
            "{waited:?}"
        );
    }
    lengths.sort();
    lengths.dedup();
    assert!(lengths.len() > 100, "{} distinct", lengths.len());
}

#[test]
fn impossible_keyed_requests_are_typed_errors_that_touch_nothing() {
    let (limiter, clock) = keyed(3, SECOND, 100);
    assert_eq!(
        limiter.wait_n("k", 0, WaitOptions::new()),
        Err(WaitError::Acquire(AcquireError::ZeroPermits))
    );
    assert_eq!(
        limiter.wait_n("k", 4, WaitOptions::new().deadline(SECOND)),
        Err(WaitError::Acquire(AcquireError::InsufficientCapacity {
            requested: 4,
            capacity: 3
        }))
    );
    assert_eq!(clock.elapsed(), Duration::ZERO);
    assert_eq!(limiter.len(), 0, "no key stored");
    let stats = limiter.stats();
    assert_eq!((stats.admitted, stats.denied), (0, 0));
}

#[test]
fn a_full_key_bound_is_waited_out_like_a_denial_within_the_deadline() {
    // One key at most; a bucket of 2 refills one a second, so it is full (and
    // its key sweepable) 2 s after it was emptied: the key bound's retry-after.
    let (limiter, clock) = keyed(2, SECOND, 1);
    assert_eq!(
        limiter.wait_n("alice", 2, WaitOptions::new()),
        Ok(Duration::ZERO)
    );
    // Too short a deadline: a typed error at once, no sleep, nothing stored.
    let err = limiter
        .wait(
            "bob",
            WaitOptions::new().deadline(Duration::from_millis(1_999)),
        )
        .unwrap_err();
    match err {
        WaitError::KeyLimit {
            needed,
            waited,
            deadline,
        } => {
            assert_eq!(needed.duration(), 2 * SECOND);
            assert_eq!(waited, Duration::ZERO);
            assert_eq!(deadline, Duration::from_millis(1_999));
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("most keys"), "{err}");
    assert_eq!(clock.elapsed(), Duration::ZERO, "it did not sleep");
    assert_eq!(limiter.len(), 1);
    // Without one, the wait sleeps the retry-after, by when alice's bucket is
    // full and sweepable, and bob gets her slot.
    assert_eq!(limiter.wait("bob", WaitOptions::new()), Ok(2 * SECOND));
    assert_eq!(limiter.len(), 1);
    assert_eq!(limiter.remaining("bob"), 1);
    assert_eq!(
        limiter.remaining("alice"),
        2,
        "evicted at full, lost nothing"
    );
    let stats = limiter.stats();
    assert_eq!(stats.denied_key_limit, 2, "each refusal at the bound");
    assert_eq!((stats.admitted, stats.denied), (2, 0));
}

#[tokio::test]
async fn an_async_keyed_wait_on_the_manual_clock() {
    let (limiter, clock) = keyed(1, SECOND, 100);
    assert_eq!(
        limiter.wait_async("a", WaitOptions::new()).await,
        Ok(Duration::ZERO)
    );
    assert_eq!(
        limiter.wait_async("a", WaitOptions::new()).await,
        Ok(SECOND)
    );
    let err = limiter
        .wait_n_async(
            "a",
            1,
            WaitOptions::new().deadline(Duration::from_millis(10)),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, WaitError::DeadlineExceeded { .. }), "{err:?}");
    assert_eq!(clock.elapsed(), SECOND);
    assert_eq!(
        limiter.wait_n_async("a", 2, WaitOptions::new()).await,
        Err(WaitError::Acquire(AcquireError::InsufficientCapacity {
            requested: 2,
            capacity: 1
        }))
    );
}

/// Tasks on one current-thread runtime wait on their own keys at once, each
/// sleeping on tokio's timer until its own key's permit is due (a lower bound
/// only: sleeping longer is always allowed).
#[tokio::test(flavor = "current_thread")]
async fn async_keyed_waits_share_a_current_thread_runtime() {
    let limiter = std::sync::Arc::new(
        KeyedLimiter::<u32>::builder(Quota::new(1, 1, Duration::from_millis(30)).unwrap())
            .clock(RealClock::new())
            .build()
            .unwrap(),
    );
    // Timed from before the tokens are spent, as above.
    let start = Instant::now();
    for key in 0..4 {
        assert!(limiter.try_acquire(&key).is_allowed());
    }
    let tasks: Vec<_> = (0..4)
        .map(|key| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.wait_async(&key, WaitOptions::new()).await })
        })
        .collect();
    for task in tasks {
        let waited = task.await.unwrap().unwrap();
        assert!(
            waited > Duration::ZERO && waited <= start.elapsed(),
            "{waited:?}"
        );
    }
    assert!(start.elapsed() >= Duration::from_millis(25));
    // Four admissions before the waits, one per wait, and no denial counted.
    let stats = limiter.stats();
    assert_eq!((stats.admitted, stats.denied), (8, 0));
}

/// tokio's clock as a limiter's clock: under a paused runtime it moves only
/// when every task is idle, straight to the next timer.
#[derive(Clone, Debug)]
struct TokioClock(tokio::time::Instant);

impl turnstile::Clock for TokioClock {
    fn now(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

fn live_bucket(capacity: u32, period: Duration) -> turnstile::LiveTokenBucket {
    turnstile::LiveTokenBucket::new(Quota::new(capacity, 1, period).unwrap()).unwrap()
}

/// A live quota lowered below a waiting `n` denied the wait for ever; with no
/// deadline it never returned. It is now refused as `n` above the capacity is
/// at the start.
#[test]
fn a_blocking_wait_whose_n_a_live_change_put_above_the_capacity_is_refused() {
    // A clock that never moves (and whose waits sleep for real): the wait
    // is never admitted, however late the change comes (a loaded machine may
    // run it after the wait's first sleep).
    struct Still;
    impl turnstile::Clock for Still {
        fn now(&self) -> u64 {
            1
        }
    }
    let limiter = std::sync::Arc::new(RateLimiter::from_parts(
        live_bucket(4, Duration::from_millis(100)),
        Still,
    ));
    assert!(limiter.try_acquire_n(4).unwrap().is_allowed());
    let (tx, rx) = std::sync::mpsc::channel();
    let waiting = std::sync::Arc::clone(&limiter);
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(waiting.wait_n(4, WaitOptions::new()));
    });
    // The wait sleeps 400 ms at a time meanwhile.
    std::thread::sleep(Duration::from_millis(100));
    limiter
        .set_quota(Quota::new(2, 1, Duration::from_millis(100)).unwrap())
        .unwrap();
    let result = rx.recv_timeout(Duration::from_secs(5));
    assert!(
        matches!(
            result,
            Ok(Err(WaitError::Acquire(
                AcquireError::InsufficientCapacity {
                    requested: 4,
                    capacity: 2
                }
            )))
        ),
        "{result:?}"
    );
    waiter.join().unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_async_wait_whose_n_a_live_change_put_above_the_capacity_is_refused() {
    let start = tokio::time::Instant::now();
    let limiter = std::sync::Arc::new(RateLimiter::from_parts(
        live_bucket(4, Duration::from_millis(10)),
        TokioClock(start),
    ));
    assert!(limiter.try_acquire_n(4).unwrap().is_allowed());
    let direct = tokio::spawn({
        let limiter = std::sync::Arc::clone(&limiter);
        async move { limiter.wait_n_async(4, WaitOptions::new()).await }
    });
    let keyed = std::sync::Arc::new(
        turnstile::KeyedBuilder::<u32, _>::new(live_bucket(4, Duration::from_millis(10)))
            .clock(TokioClock(start))
            .build()
            .unwrap(),
    );
    assert!(keyed.try_acquire_n(&1, 4).unwrap().is_allowed());
    let per_key = tokio::spawn({
        let keyed = std::sync::Arc::clone(&keyed);
        async move { keyed.wait_n_async(&1, 4, WaitOptions::new()).await }
    });
    tokio::task::yield_now().await;
    let lower = Quota::new(2, 1, Duration::from_millis(10)).unwrap();
    limiter.set_quota(lower).unwrap();
    keyed.set_quota(lower).unwrap();
    for wait in [direct, per_key] {
        let result = tokio::time::timeout(Duration::from_secs(3_600), wait).await;
        assert!(
            matches!(result, Ok(Ok(Err(WaitError::Acquire(_))))),
            "{result:?}"
        );
    }
}

/// Jitter was cut to end the sleep on the deadline itself, and tokio's timer
/// rounds a sleep up to its next millisecond, so a jittered wait returned
/// admitted past its deadline (8 ms against 7.5).
#[tokio::test(start_paused = true)]
async fn a_jittered_async_wait_returns_within_its_deadline() {
    let deadline = Duration::from_micros(7_500);
    for jitter in [Duration::ZERO, Duration::from_millis(5)] {
        for _ in 0..20 {
            let limiter = RateLimiter::with_clock(
                Quota::new(1, 1, Duration::from_millis(7)).unwrap(),
                TokioClock(tokio::time::Instant::now()),
            );
            assert!(limiter.try_acquire().is_allowed());
            let waited = limiter
                .wait_async(WaitOptions::new().deadline(deadline).jitter(jitter))
                .await
                .unwrap();
            assert!(waited <= deadline, "jitter {jitter:?}: waited {waited:?}");
        }
    }
}

/// A keyed wait refused at the key bound on a clock stuck at the end of its
/// range gave up as a rate denial: counted twice (the bound's own count and
/// a denial) and reported as `DeadlineExceeded`.
#[test]
fn a_key_bound_refusal_on_a_stuck_clock_is_reported_and_counted_once() {
    let clock = ManualClock::new();
    clock.set_nanos(u64::MAX);
    let keyed = KeyedLimiter::<u64>::builder(Quota::new(1, 1, Duration::from_secs(1)).unwrap())
        .clock(clock)
        .max_keys(1)
        .build()
        .unwrap();
    assert!(keyed.try_acquire(&1).is_allowed());
    let result = keyed.wait(&2, WaitOptions::new());
    assert!(
        matches!(result, Err(WaitError::KeyLimit { .. })),
        "{result:?}"
    );
    let stats = keyed.stats();
    assert_eq!((stats.denied, stats.denied_key_limit), (0, 1), "{stats:?}");
}

#[test]
fn a_stuck_clock_is_not_reported_as_a_passed_deadline() {
    // The clock can move only 500 ms more; the next token is a second away
    // after the first is spent.
    let clock = ManualClock::new();
    clock.set_nanos(u64::MAX - 500_000_000);
    let limiter = RateLimiter::with_clock(Quota::new(1, 1, SECOND).unwrap(), clock);
    assert!(limiter.try_acquire().is_allowed());
    let err = limiter
        .wait(WaitOptions::new().deadline(10 * SECOND))
        .unwrap_err();
    let WaitError::DeadlineExceeded {
        needed,
        waited,
        deadline,
    } = err
    else {
        panic!("{err:?}");
    };
    assert_eq!(deadline, 10 * SECOND);
    assert!(waited + needed.duration() <= deadline, "{err:?}");
    let message = err.to_string();
    assert!(!message.contains("past the deadline"), "{message}");
    assert!(message.contains("cannot move forward"), "{message}");

    // Without a deadline, likewise.
    let err = limiter.wait(WaitOptions::new()).unwrap_err();
    let message = err.to_string();
    assert!(message.contains("cannot move forward"), "{message}");
    assert!(!message.contains("deadline"), "{message}");
}
