//! Chains: admitted only if every stage admits; a denial gives back what earlier
//! stages took, with the longest retry-after.

use std::sync::Arc;
use std::time::Duration;

use turnstile::chain::{self, Stage};
use turnstile::{
    AcquireError, Algorithm, FixedWindow, Gcra, KeyedBuilder, KeyedDecision, KeyedLimiter,
    ManualClock, Quota, RateLimiter, SlidingWindow, TokenBucket,
};

const SECOND: Duration = Duration::from_secs(1);

fn keyed<A: Algorithm>(algorithm: A, clock: &ManualClock) -> KeyedLimiter<String, A, ManualClock> {
    KeyedBuilder::new(algorithm)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// A per-key stage of each algorithm, then a global bucket that is empty: every
/// per-key permit taken is given back, for every algorithm.
#[test]
fn a_later_denial_refunds_every_algorithm() {
    fn check<A: Algorithm + std::fmt::Debug>(algorithm: A) {
        let clock = ManualClock::new();
        clock.set(Duration::from_millis(250));
        let capacity = algorithm.capacity();
        let per_key = keyed(algorithm, &clock);
        let global = RateLimiter::with_clock(Quota::new(2, 2, SECOND).unwrap(), clock.clone());
        assert!(global.try_acquire_n(2).unwrap().is_allowed());

        for _ in 0..3 {
            let denied = chain::try_acquire_n(&[&per_key.stage("k"), &global], 2).unwrap();
            assert_eq!(denied.denied_by(), Some(1));
            assert!(denied.decision().is_denied());
            assert_eq!(
                per_key.remaining("k"),
                capacity,
                "{:?}",
                per_key.algorithm()
            );
        }
        // Once the global bucket refills, the chain admits and both are charged.
        clock.advance(SECOND);
        let admitted = chain::try_acquire_n(&[&per_key.stage("k"), &global], 2).unwrap();
        assert_eq!(admitted.decision(), KeyedDecision::Allowed { remaining: 0 });
        assert_eq!(per_key.remaining("k"), capacity - 2);
        assert_eq!(global.remaining(), 0);
    }
    check(TokenBucket::new(Quota::new(4, 1, SECOND).unwrap()));
    check(FixedWindow::new(4, SECOND).unwrap());
    check(SlidingWindow::new(4, SECOND).unwrap());
    check(Gcra::new(Quota::new(4, 1, SECOND).unwrap()));
}

#[test]
fn direct_stages_refund_too_and_the_first_denial_is_reported() {
    let clock = ManualClock::new();
    let a = RateLimiter::from_parts(FixedWindow::new(3, SECOND).unwrap(), clock.clone());
    let b = RateLimiter::from_parts(SlidingWindow::new(3, SECOND).unwrap(), clock.clone());
    let c = RateLimiter::from_parts(Gcra::new(Quota::new(1, 1, SECOND).unwrap()), clock.clone());
    assert!(c.try_acquire().is_allowed());
    let denied = chain::try_acquire(&[&a, &b, &c]);
    assert_eq!(denied.denied_by(), Some(2));
    assert_eq!((a.remaining(), b.remaining()), (3, 3));
    assert!(!denied.is_allowed());
}

#[test]
fn the_retry_after_is_the_longest_of_the_denying_stages() {
    let clock = ManualClock::new();
    let short = RateLimiter::with_clock(Quota::new(1, 1, SECOND).unwrap(), clock.clone());
    let long = RateLimiter::with_clock(Quota::new(1, 1, 5 * SECOND).unwrap(), clock.clone());
    let open = RateLimiter::with_clock(Quota::new(9, 1, SECOND).unwrap(), clock.clone());
    assert!(short.try_acquire().is_allowed() && long.try_acquire().is_allowed());

    for stages in [
        [&short as &dyn Stage, &long, &open],
        [&long, &short, &open],
        [&open, &short, &long],
    ] {
        let denied = chain::try_acquire(&stages);
        assert_eq!(
            denied.decision().retry_after().unwrap().duration(),
            5 * SECOND
        );
        assert_eq!(
            open.remaining(),
            9,
            "the open stage was refunded or never charged"
        );
    }
    // A stage after the denying one is only looked at: nothing is taken from it.
    let denied = chain::try_acquire(&[&short, &open]);
    assert_eq!(denied.denied_by(), Some(0));
    assert_eq!(open.remaining(), 9);
}

#[test]
fn an_admitted_chain_reports_the_fewest_left() {
    let clock = ManualClock::new();
    let big = RateLimiter::with_clock(Quota::new(10, 1, SECOND).unwrap(), clock.clone());
    let small = RateLimiter::from_parts(FixedWindow::new(3, SECOND).unwrap(), clock.clone());
    let admitted = chain::try_acquire_n(&[&big, &small], 2).unwrap();
    assert_eq!(admitted.decision(), KeyedDecision::Allowed { remaining: 1 });
    assert_eq!(admitted.denied_by(), None);
    assert_eq!((big.remaining(), small.remaining()), (8, 1));
}

#[test]
fn bad_requests_are_refused_before_any_stage_is_touched() {
    let clock = ManualClock::new();
    let big = RateLimiter::with_clock(Quota::new(10, 1, SECOND).unwrap(), clock.clone());
    let small = RateLimiter::from_parts(FixedWindow::new(3, SECOND).unwrap(), clock.clone());
    assert_eq!(
        chain::try_acquire_n(&[&big, &small], 0),
        Err(AcquireError::ZeroPermits)
    );
    assert_eq!(
        chain::try_acquire_n(&[&big, &small], 4),
        Err(AcquireError::InsufficientCapacity {
            requested: 4,
            capacity: 3
        })
    );
    assert_eq!((big.remaining(), small.remaining()), (10, 3));
    // An empty chain admits.
    let empty = chain::try_acquire(&[]);
    assert_eq!(
        empty.decision(),
        KeyedDecision::Allowed {
            remaining: u32::MAX
        }
    );
}

#[test]
fn a_key_bound_denial_is_reported_as_such_and_refunds() {
    let clock = ManualClock::new();
    let global = RateLimiter::with_clock(Quota::new(5, 1, SECOND).unwrap(), clock.clone());
    let per_key = KeyedLimiter::<String>::builder(Quota::new(2, 1, SECOND).unwrap())
        .clock(clock.clone())
        .max_keys(1)
        .build()
        .unwrap();
    assert!(chain::try_acquire(&[&global, &per_key.stage("a")]).is_allowed());
    let bounded = chain::try_acquire(&[&global, &per_key.stage("b")]);
    assert!(bounded.decision().is_key_limit(), "{bounded:?}");
    assert_eq!(bounded.denied_by(), Some(1));
    assert_eq!(global.remaining(), 4, "the global permit went back");
}

/// Two threads hammer a chain of per-key and global stages on a frozen clock.
/// Refunds must be exact: at the end every stage holds exactly its capacity
/// minus what the chain admitted from it, and nothing was over-admitted.
#[test]
fn concurrent_chains_never_over_admit_and_refund_exactly() {
    let clock = ManualClock::new();
    let per_key = Arc::new(keyed(FixedWindow::new(40, SECOND).unwrap(), &clock));
    let global = Arc::new(
        RateLimiter::with_clock(Quota::new(50, 1, SECOND).unwrap(), clock.clone()).counted(),
    );
    let keys = ["a", "b", "c"];
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let (per_key, global) = (per_key.clone(), global.clone());
            std::thread::spawn(move || {
                let mut admitted = [0u32; 3];
                for i in 0..20_000 {
                    let k = (i + t) % 3;
                    if chain::try_acquire(&[&per_key.stage(keys[k]), &*global]).is_allowed() {
                        admitted[k] += 1;
                    }
                }
                admitted
            })
        })
        .collect();
    let mut admitted = [0u32; 3];
    for t in threads {
        for (k, n) in t.join().unwrap().into_iter().enumerate() {
            admitted[k] += n;
        }
    }
    let total: u32 = admitted.iter().sum();
    assert!(total <= 50, "{admitted:?}");
    assert_eq!(global.remaining(), 50 - total);
    // Each chain counted once, where it was decided: admitted in both
    // stages, or denied in the one that refused.
    let (keyed, direct) = (per_key.stats(), global.stats());
    assert_eq!(
        (keyed.admitted, direct.admitted),
        (total.into(), total.into())
    );
    assert_eq!(keyed.denied + direct.denied, 40_000 - u64::from(total));
    for (k, key) in keys.iter().enumerate() {
        assert!(admitted[k] <= 40);
        assert_eq!(
            per_key.remaining(*key),
            40 - admitted[k],
            "{key}: {admitted:?}"
        );
    }
    // The chain stops only when the global bucket is empty (a per-key bucket of
    // 40 cannot run out first with three keys sharing 50).
    assert_eq!(total, 50);
}

/// A keyed stage the chain never reached, whose key is new and whose key
/// bound is full, counts in the chain's retry-after: a client that waits it
/// is not refused by that stage's bound (the held keys having gone idle).
#[test]
fn a_later_keyed_stage_at_its_key_bound_counts_in_the_wait() {
    let clock = ManualClock::new();
    let secs = Duration::from_secs;
    let global = RateLimiter::with_clock(Quota::new(1, 1, secs(1)).unwrap(), clock.clone());
    let per_key = KeyedLimiter::<String>::builder(Quota::new(2, 1, secs(60)).unwrap())
        .clock(clock.clone())
        .max_keys(1)
        .shards(1)
        .build()
        .unwrap();
    assert!(per_key.try_acquire("x").is_allowed());
    assert!(global.try_acquire().is_allowed());
    let denied = chain::try_acquire(&[&global as &dyn Stage, &per_key.stage("y")]);
    assert_eq!(denied.denied_by(), Some(0));
    let wait = denied.decision().retry_after().unwrap().duration();
    assert_eq!(
        wait,
        secs(120),
        "the key bound's wait, not the global one's"
    );
    clock.advance(wait);
    let admitted = chain::try_acquire(&[&global as &dyn Stage, &per_key.stage("y")]);
    assert!(admitted.decision().is_allowed(), "{admitted:?}");

    // A key the stage holds peeks its own bucket, bound or not.
    clock.advance(secs(1));
    assert!(global.try_acquire().is_allowed());
    let denied = chain::try_acquire(&[&global as &dyn Stage, &per_key.stage("y")]);
    assert_eq!(denied.decision().retry_after().unwrap().duration(), secs(1));
}

/// A chain denied by an earlier stage reports the longest wait of the stages
/// that would deny too. A key waiting in limbo at a full key bound holds no
/// place under the bound, so its stage would meet the bound (`KeyLimit`, the
/// bound's wait); the look used to decide on its word as if it were held.
#[test]
fn a_denied_chain_counts_the_key_bound_for_a_key_in_limbo() {
    let clock = ManualClock::new();
    let per_key = KeyedBuilder::new(TokenBucket::new(Quota::new(5, 1, SECOND).unwrap()))
        .clock(clock.clone())
        .shards(1)
        .max_keys(1)
        .build()
        .unwrap();
    assert!(per_key.try_acquire(&"a".to_owned()).is_allowed());
    clock.advance(10 * SECOND);
    // "b" makes room by sweeping "a", which waits in limbo.
    assert!(per_key.try_acquire(&"b".to_owned()).is_allowed());
    // What a request for "a" now meets: the bound.
    let global = RateLimiter::with_clock(Quota::new(1, 1, SECOND).unwrap(), clock.clone());
    assert!(global.try_acquire().is_allowed());
    let denied = chain::try_acquire(&[&global, &per_key.stage("a")]);
    assert_eq!(denied.denied_by(), Some(0));
    let wait = denied
        .decision()
        .retry_after()
        .expect("a denial")
        .duration();
    assert!(wait >= 5 * SECOND, "{:?}", denied.decision());
    assert!(per_key.try_acquire("a").is_key_limit());
}

/// A chain of any length decides without overflowing the stack (past 64
/// stages the receipts are kept in a vector, not one stack frame each), and
/// as a short one: all or nothing, the fewest left, the first to deny.
#[test]
fn a_chain_of_a_hundred_thousand_stages_decides_as_a_short_one() {
    // On a thread with a small stack, where one frame per stage could not fit.
    let (decisions, first_left, last_left) = std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(|| {
            let clock = ManualClock::new();
            let limiters: Vec<RateLimiter<TokenBucket, ManualClock>> = (0..100_000)
                .map(|i| {
                    let capacity = if i == 70_000 { 2 } else { 5 };
                    RateLimiter::with_clock(Quota::new(capacity, 1, SECOND).unwrap(), clock.clone())
                })
                .collect();
            let stages: Vec<&dyn Stage> = limiters.iter().map(|l| l as &dyn Stage).collect();
            let decisions: Vec<_> = (0..3)
                .map(|_| {
                    let chained = chain::try_acquire(&stages);
                    (chained.decision(), chained.denied_by())
                })
                .collect();
            (
                decisions,
                limiters[0].remaining(),
                limiters[99_999].remaining(),
            )
        })
        .unwrap()
        .join()
        .expect("no stack overflow");
    assert_eq!(
        decisions[0],
        (KeyedDecision::Allowed { remaining: 1 }, None)
    );
    assert_eq!(
        decisions[1],
        (KeyedDecision::Allowed { remaining: 0 }, None)
    );
    assert!(decisions[2].0.is_denied(), "{decisions:?}");
    assert_eq!(decisions[2].1, Some(70_000));
    // The denial gave back what the stages before it took.
    assert_eq!((first_left, last_left), (3, 3));
}

/// A stage asked directly for 0 permits or more than it holds answers a
/// typed error and takes nothing (it used to decide anyway: a denial with a
/// wait after which the same request was denied again).
#[test]
fn a_stage_refuses_zero_and_beyond_its_capacity_without_touching_it() {
    let clock = ManualClock::new();
    let direct = RateLimiter::with_clock(Quota::per_second(5).unwrap(), clock.clone());
    let keyed: KeyedLimiter<String, TokenBucket, ManualClock> =
        KeyedBuilder::new(TokenBucket::new(Quota::per_second(5).unwrap()))
            .clock(clock.clone())
            .build()
            .unwrap();
    let key = "a".to_owned();
    let stage = keyed.stage(&key);
    let stages: [&dyn Stage; 2] = [&direct, &stage];
    for s in stages {
        assert_eq!(s.take(0), Err(AcquireError::ZeroPermits));
        assert_eq!(s.peek(0), Err(AcquireError::ZeroPermits));
        for n in [6, u32::MAX] {
            let beyond = Err(AcquireError::InsufficientCapacity {
                requested: n,
                capacity: 5,
            });
            assert_eq!(s.take(n).map(|_| ()), beyond);
            assert_eq!(s.peek(n).map(|_| ()), beyond);
        }
        let (decision, receipt) = s.take(5).unwrap();
        assert_eq!(decision, KeyedDecision::Allowed { remaining: 0 });
        assert!(s.give_back(receipt.unwrap()));
        assert_eq!(s.peek(5), Ok(KeyedDecision::Allowed { remaining: 0 }));
    }
}

/// A key whose `Hash` panics when asked to: user code a keyed stage runs.
#[derive(Clone, PartialEq, Eq, Debug)]
struct Panicky(u32);

static PANIC_ON_HASH: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl std::hash::Hash for Panicky {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        assert!(
            !PANIC_ON_HASH.load(std::sync::atomic::Ordering::SeqCst),
            "the key's Hash panicked"
        );
        self.0.hash(state);
    }
}

/// A panic in a later stage (a key's `Hash`, here) gives back what the
/// earlier stages took, on the stack and in the refundable form alike: the
/// chain admitted nothing. They stayed spent until they refilled.
#[test]
fn a_panic_in_a_later_stage_gives_the_earlier_stages_back() {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::sync::atomic::Ordering;
    let clock = ManualClock::new();
    let global = RateLimiter::with_clock(
        Quota::new(1, 1, Duration::from_secs(3_600)).unwrap(),
        clock.clone(),
    );
    let per_key =
        KeyedLimiter::<Panicky>::builder(Quota::new(5, 1, Duration::from_secs(1)).unwrap())
            .clock(clock.clone())
            .build()
            .unwrap();
    let key = Panicky(7);
    PANIC_ON_HASH.store(true, Ordering::SeqCst);
    let on_the_stack = catch_unwind(AssertUnwindSafe(|| {
        chain::try_acquire(&[&global, &per_key.stage(&key)])
    }));
    let kept = catch_unwind(AssertUnwindSafe(|| {
        chain::try_acquire_refundable(&[&global, &per_key.stage(&key)]).is_ok()
    }));
    PANIC_ON_HASH.store(false, Ordering::SeqCst);
    assert!(on_the_stack.is_err() && kept.is_err());
    assert_eq!(global.remaining(), 1, "the earlier stage's permit");
    assert!(chain::try_acquire(&[&global, &per_key.stage(&key)]).is_allowed());
}

/// A stage's stats count what went through it: an admission only when the
/// whole chain admitted, a denial only in the stage that refused. A stage
/// that admitted and was given back because a later one refused counts
/// nothing (it counted an admission, that it kept, before).
#[test]
fn a_stage_counts_only_chains_that_went_through_and_its_own_refusals() {
    let clock = ManualClock::new();
    let per_key = KeyedLimiter::<String>::builder(Quota::new(5, 1, SECOND).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    let global =
        RateLimiter::with_clock(Quota::new(1, 1, SECOND).unwrap(), clock.clone()).counted();
    let alice = per_key.stage("alice");
    assert!(chain::try_acquire(&[&alice, &global]).is_allowed());
    for _ in 0..3 {
        assert_eq!(chain::try_acquire(&[&alice, &global]).denied_by(), Some(1));
    }
    let (keyed, direct) = (per_key.stats(), global.stats());
    assert_eq!(
        (keyed.admitted, keyed.denied),
        (1, 0),
        "alice went through once"
    );
    assert_eq!((direct.admitted, direct.denied), (1, 3));

    // The other way round: the keyed stage refuses after a counted direct
    // stage admitted.
    let wide = RateLimiter::with_clock(Quota::new(5, 1, SECOND).unwrap(), clock.clone()).counted();
    for _ in 0..5 {
        assert!(per_key.try_acquire("bob").is_allowed());
    }
    let bob = per_key.stage("bob");
    for _ in 0..3 {
        assert_eq!(chain::try_acquire(&[&wide, &bob]).denied_by(), Some(1));
    }
    let (keyed, direct) = (per_key.stats(), wide.stats());
    assert_eq!((keyed.admitted, keyed.denied), (1 + 5, 3));
    assert_eq!(
        (direct.admitted, direct.denied),
        (0, 0),
        "given back each time"
    );
    assert_eq!(wide.remaining(), 5);

    // The refundable form counts the same; refunding an admitted chain
    // later keeps it counted, as a refunded admission does.
    let carol = per_key.stage("carol");
    let admitted = chain::try_acquire_refundable(&[&wide, &carol]).unwrap();
    assert!(chain::try_acquire_refundable(&[&wide, &carol, &global]).is_err());
    assert!(admitted.refund());
    let (keyed, direct) = (per_key.stats(), wide.stats());
    assert_eq!((keyed.admitted, keyed.denied), (1 + 5 + 1, 3));
    assert_eq!((direct.admitted, direct.denied), (1, 0));
    assert_eq!(global.stats().denied, 3 + 1);
}

/// A chain longer than the stack holds (its receipts in a vector) counts as
/// a short one.
#[test]
fn a_long_chain_counts_as_a_short_one() {
    let clock = ManualClock::new();
    let limiters: Vec<_> = (0..100)
        .map(|i| {
            let capacity = if i == 70 { 1 } else { 5 };
            RateLimiter::with_clock(Quota::new(capacity, 1, SECOND).unwrap(), clock.clone())
                .counted()
        })
        .collect();
    let stages: Vec<&dyn Stage> = limiters.iter().map(|l| l as &dyn Stage).collect();
    assert!(chain::try_acquire(&stages).is_allowed());
    assert_eq!(chain::try_acquire(&stages).denied_by(), Some(70));
    for (i, limiter) in limiters.iter().enumerate() {
        let stats = limiter.stats();
        let denied = u64::from(i == 70);
        assert_eq!((stats.admitted, stats.denied), (1, denied), "stage {i}");
    }
}

/// A refusal at a later stage's key bound counts there (as a key-bound
/// refusal), and not as an admission in the stage before it.
#[test]
fn a_key_bound_refusal_counts_in_the_bound_only() {
    let clock = ManualClock::new();
    let bounded = KeyedLimiter::<String>::builder(Quota::new(5, 1, SECOND).unwrap())
        .clock(clock.clone())
        .max_keys(1)
        .build()
        .unwrap();
    let global =
        RateLimiter::with_clock(Quota::new(5, 1, SECOND).unwrap(), clock.clone()).counted();
    assert!(chain::try_acquire(&[&global, &bounded.stage("a")]).is_allowed());
    let refused = chain::try_acquire(&[&global, &bounded.stage("b")]);
    assert!(refused.decision().is_key_limit(), "{refused:?}");
    let (keyed, direct) = (bounded.stats(), global.stats());
    assert_eq!(
        (keyed.admitted, keyed.denied, keyed.denied_key_limit),
        (1, 0, 1)
    );
    assert_eq!((direct.admitted, direct.denied), (1, 0));
}
