//! Reservations ([`turnstile::Reservation`], and per key
//! [`turnstile::KeyedReservation`]) over random traces of acquire,
//! reserve, cancel and advance, on token buckets of several shapes:
//!
//! - the permits kept (admitted, or reserved and not cancelled), each counted
//!   when it becomes usable, stay within RFC 1363's bound
//!   `capacity + amount * floor(T / period) + (amount - 1)`;
//! - a reservation's delay is exactly the wait a denial gave the same request
//!   at the same instant, and a reservation refused as too far changes
//!   nothing;
//! - a cancel that succeeds leaves the bucket as if the reservation had never
//!   been made; one that declines changes nothing.
//!
//! The same traces run on live buckets ([`LiveTokenBucket`]) with no change
//! of quota; a change between reservations is checked by hand at the end.
//! And on GCRA meters ([`Gcra`], [`LiveGcra`]), held to GCRA's own bound,
//! `capacity + floor(T / interval)`.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use turnstile::{
    Decision, Gcra, KeyedDecision, KeyedLimiter, KeyedReservation, Lend, LiveGcra, LiveTokenBucket,
    ManualClock, Quota, RateLimiter, Reservation, ReserveError, TokenBucket,
};

/// A limiter under test: a direct one, or one key of a keyed one (swept
/// before every decision, which must change nothing).
trait Subject {
    type Held<'a>: Held
    where
        Self: 'a;
    fn acquire(&self, n: u32) -> Decision;
    fn remaining(&self) -> u32;
    fn reserve(&self, n: u32, max_delay: Duration) -> Result<Self::Held<'_>, ReserveError>;
}

trait Held {
    fn delay(&self) -> Duration;
    fn cancel(self) -> bool;
}

impl<A: Lend> Subject for RateLimiter<A, ManualClock> {
    type Held<'a>
        = Reservation<'a, ManualClock, turnstile::Uncounted, A>
    where
        A: 'a;
    fn acquire(&self, n: u32) -> Decision {
        self.try_acquire_n(n).unwrap()
    }
    fn remaining(&self) -> u32 {
        RateLimiter::remaining(self)
    }
    fn reserve(&self, n: u32, max_delay: Duration) -> Result<Self::Held<'_>, ReserveError> {
        self.reserve_n(n, max_delay)
    }
}

impl<A: Lend> Held for Reservation<'_, ManualClock, turnstile::Uncounted, A> {
    fn delay(&self) -> Duration {
        Reservation::delay(self)
    }
    fn cancel(self) -> bool {
        Reservation::cancel(self)
    }
}

type Keyed<A = TokenBucket> = KeyedLimiter<u32, A, ManualClock>;

impl<A: Lend> Subject for Keyed<A> {
    type Held<'a>
        = KeyedReservation<'a, u32, u32, ManualClock, ahash::RandomState, A>
    where
        A: 'a;
    fn acquire(&self, n: u32) -> Decision {
        self.sweep();
        match self.try_acquire_n(&KEY, n).unwrap() {
            KeyedDecision::Allowed { remaining } => Decision::Allowed { remaining },
            KeyedDecision::Denied { retry_after } => Decision::Denied { retry_after },
            other => panic!("one key, no bound: {other:?}"),
        }
    }
    fn remaining(&self) -> u32 {
        KeyedLimiter::remaining(self, &KEY)
    }
    fn reserve(&self, n: u32, max_delay: Duration) -> Result<Self::Held<'_>, ReserveError> {
        self.sweep();
        self.reserve_n(&KEY, n, max_delay)
    }
}

impl<A: Lend> Held for KeyedReservation<'_, u32, u32, ManualClock, ahash::RandomState, A> {
    fn delay(&self) -> Duration {
        KeyedReservation::delay(self)
    }
    fn cancel(self) -> bool {
        KeyedReservation::cancel(self)
    }
}

type KeyedLive = Keyed<LiveTokenBucket>;

static KEY: u32 = 7;

const MICRO: u64 = 1_000;

#[derive(Clone, Debug)]
enum Op {
    /// Ask for `1 + n % capacity` permits.
    Acquire {
        n: u32,
    },
    /// Ask; when denied, reserve them with at most `max_delay_micros` of delay.
    Reserve {
        n: u32,
        max_delay_micros: u64,
    },
    /// Reserve, then cancel at once.
    ReserveAndCancel {
        n: u32,
    },
    /// Cancel the `i`-th reservation held (`i % held`).
    Cancel {
        i: usize,
    },
    Advance {
        micros: u64,
    },
}

fn ops(period_micros: u64) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        4 => any::<u32>().prop_map(|n| Op::Acquire { n }),
        5 => (any::<u32>(), 0..period_micros * 6)
            .prop_map(|(n, max_delay_micros)| Op::Reserve { n, max_delay_micros }),
        2 => any::<u32>().prop_map(|n| Op::ReserveAndCancel { n }),
        2 => any::<usize>().prop_map(|i| Op::Cancel { i }),
        4 => prop_oneof![Just(0), 0..period_micros * 2].prop_map(|micros| Op::Advance { micros }),
    ];
    prop::collection::vec(op, 1..120)
}

fn quotas() -> impl Strategy<Value = Quota> {
    prop_oneof![
        Just((1, 1, 1_000)),
        Just((3, 1, 1_000)),
        Just((5, 2, 700)),
        Just((10, 4, 2_000)),
        Just((7, 7, 500)),
    ]
    .prop_map(|(c, a, p)| Quota::new(c, a, Duration::from_micros(p)).unwrap())
}

/// A kept admission: when it is usable (ns), and its permits.
#[derive(Clone, Copy, Debug)]
struct Kept {
    at: u64,
    n: u64,
    cancelled: bool,
}

/// The algorithm whose bound the permits kept must keep.
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// A token bucket: RFC 1363's
    /// `capacity + amount * floor(T / period) + (amount - 1)`.
    Bucket,
    /// A GCRA meter: `capacity + floor(T / interval)`, the interval the
    /// meter's emission interval (whole nanoseconds, rounded up).
    Meter,
}

impl Shape {
    /// The longest a reservation may wait: one fill time (a meter's is its
    /// interval times the capacity, its interval rounded up).
    fn fill(self, quota: Quota) -> Duration {
        match self {
            Shape::Bucket => quota.fill_time(),
            Shape::Meter => Gcra::new(quota).emission_interval() * quota.capacity(),
        }
    }
}

fn check_bound(quota: Quota, shape: Shape, kept: &[Kept]) -> Result<(), TestCaseError> {
    let mut kept: Vec<(u64, u64)> = kept
        .iter()
        .filter(|k| !k.cancelled)
        .map(|k| (k.at, k.n))
        .collect();
    kept.sort_unstable();
    let (capacity, amount) = (u64::from(quota.capacity()), u64::from(quota.amount()));
    let period = quota.period().as_micros() as u64;
    let interval = Gcra::new(quota).emission_interval().as_nanos() as u64;
    for i in 0..kept.len() {
        let mut sum = 0;
        for j in i..kept.len() {
            sum += kept[j].1;
            let bound = match shape {
                Shape::Bucket => {
                    let units = kept[j].0 / MICRO - kept[i].0 / MICRO;
                    capacity + amount * (units / period) + (amount - 1)
                }
                Shape::Meter => capacity + (kept[j].0 - kept[i].0) / interval,
            };
            prop_assert!(
                sum <= bound,
                "{} kept from {} ns to {} ns; bound {}",
                sum,
                kept[i].0,
                kept[j].0,
                bound
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 800,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn reservations_keep_the_bound_and_cancel_exactly(
        (quota, ops) in quotas().prop_flat_map(|q| (Just(q), ops(q.period().as_micros() as u64)))
    ) {
        let clock = ManualClock::new();
        let limiter = RateLimiter::from_parts(TokenBucket::new(quota), clock.clone());
        run(&limiter, &clock, quota, Shape::Bucket, &ops)?;
    }

    #[test]
    fn keyed_reservations_keep_the_bound_and_cancel_exactly_through_sweeps(
        (quota, ops) in quotas().prop_flat_map(|q| (Just(q), ops(q.period().as_micros() as u64)))
    ) {
        let clock = ManualClock::new();
        let limiter: Keyed = KeyedLimiter::<u32>::builder(quota)
            .clock(clock.clone())
            .shards(1)
            .build()
            .unwrap();
        run(&limiter, &clock, quota, Shape::Bucket, &ops)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 400,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn live_reservations_keep_the_bound_and_cancel_exactly(
        (quota, ops) in quotas().prop_flat_map(|q| (Just(q), ops(q.period().as_micros() as u64)))
    ) {
        let clock = ManualClock::new();
        let limiter = RateLimiter::from_parts(LiveTokenBucket::new(quota).unwrap(), clock.clone());
        run(&limiter, &clock, quota, Shape::Bucket, &ops)?;
    }

    #[test]
    fn keyed_live_reservations_keep_the_bound_and_cancel_exactly_through_sweeps(
        (quota, ops) in quotas().prop_flat_map(|q| (Just(q), ops(q.period().as_micros() as u64)))
    ) {
        let clock = ManualClock::new();
        let limiter: KeyedLive = turnstile::KeyedBuilder::<u32, _>::new(LiveTokenBucket::new(quota).unwrap())
            .clock(clock.clone())
            .shards(1)
            .build()
            .unwrap();
        run(&limiter, &clock, quota, Shape::Bucket, &ops)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 400,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn gcra_reservations_keep_the_bound_and_cancel_exactly(
        (quota, ops) in quotas().prop_flat_map(|q| (Just(q), ops(q.period().as_micros() as u64)))
    ) {
        let clock = ManualClock::new();
        let limiter = RateLimiter::from_parts(Gcra::new(quota), clock.clone());
        run(&limiter, &clock, quota, Shape::Meter, &ops)?;
    }

    #[test]
    fn keyed_gcra_reservations_keep_the_bound_and_cancel_exactly_through_sweeps(
        (quota, ops) in quotas().prop_flat_map(|q| (Just(q), ops(q.period().as_micros() as u64)))
    ) {
        let clock = ManualClock::new();
        let limiter: Keyed<Gcra> = turnstile::KeyedBuilder::<u32, _>::new(Gcra::new(quota))
            .clock(clock.clone())
            .shards(1)
            .build()
            .unwrap();
        run(&limiter, &clock, quota, Shape::Meter, &ops)?;
    }

    #[test]
    fn live_gcra_reservations_keep_the_bound_and_cancel_exactly(
        (quota, ops) in quotas().prop_flat_map(|q| (Just(q), ops(q.period().as_micros() as u64)))
    ) {
        let clock = ManualClock::new();
        let limiter = RateLimiter::from_parts(LiveGcra::new(quota), clock.clone());
        run(&limiter, &clock, quota, Shape::Meter, &ops)?;
    }

    #[test]
    fn keyed_live_gcra_reservations_keep_the_bound_and_cancel_exactly_through_sweeps(
        (quota, ops) in quotas().prop_flat_map(|q| (Just(q), ops(q.period().as_micros() as u64)))
    ) {
        let clock = ManualClock::new();
        let limiter: Keyed<LiveGcra> = turnstile::KeyedBuilder::<u32, _>::new(LiveGcra::new(quota))
            .clock(clock.clone())
            .shards(1)
            .build()
            .unwrap();
        run(&limiter, &clock, quota, Shape::Meter, &ops)?;
    }
}

fn run(
    limiter: &impl Subject,
    clock: &ManualClock,
    quota: Quota,
    shape: Shape,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let fill = shape.fill(quota);
    let mut now = 0u64;
    let mut kept: Vec<Kept> = Vec::new();
    // Reservations held: (index in `kept`, the reservation).
    let mut held = Vec::new();
    for op in ops {
        match *op {
            Op::Acquire { n } => {
                let n = 1 + n % quota.capacity();
                if limiter.acquire(n).is_allowed() {
                    kept.push(Kept {
                        at: now,
                        n: n.into(),
                        cancelled: false,
                    });
                }
            }
            Op::Reserve {
                n,
                max_delay_micros,
            } => {
                let n = 1 + n % quota.capacity();
                let wait = match limiter.acquire(n) {
                    Decision::Allowed { .. } => {
                        kept.push(Kept {
                            at: now,
                            n: n.into(),
                            cancelled: false,
                        });
                        continue;
                    }
                    Decision::Denied { retry_after } => retry_after,
                };
                let max_delay = Duration::from_micros(max_delay_micros);
                let before = limiter.remaining();
                match limiter.reserve(n, max_delay) {
                    Ok(reservation) => {
                        prop_assert_eq!(reservation.delay(), wait.duration());
                        prop_assert!(wait.duration() <= max_delay.min(fill));
                        kept.push(Kept {
                            at: now + wait.as_nanos(),
                            n: n.into(),
                            cancelled: false,
                        });
                        held.push((kept.len() - 1, reservation));
                    }
                    Err(ReserveError::TooFar { retry_after }) => {
                        prop_assert_eq!(retry_after, wait);
                        prop_assert!(wait.duration() > max_delay.min(fill));
                        prop_assert_eq!(limiter.remaining(), before);
                        let again = limiter.acquire(n);
                        prop_assert_eq!(again.retry_after(), Some(wait));
                    }
                    Err(other) => prop_assert!(false, "{}", other),
                }
            }
            Op::ReserveAndCancel { n } => {
                let n = 1 + n % quota.capacity();
                let before = (limiter.remaining(), limiter.acquire(n));
                if before.1.is_allowed() {
                    kept.push(Kept {
                        at: now,
                        n: n.into(),
                        cancelled: false,
                    });
                    continue;
                }
                if let Ok(reservation) = limiter.reserve(n, fill) {
                    prop_assert!(reservation.cancel(), "nothing changed since");
                    let after = (limiter.remaining(), limiter.acquire(n));
                    prop_assert_eq!(after, before);
                }
            }
            Op::Cancel { i } => {
                if held.is_empty() {
                    continue;
                }
                let (k, reservation) = held.remove(i % held.len());
                let before = limiter.remaining();
                if reservation.cancel() {
                    kept[k].cancelled = true;
                } else {
                    prop_assert_eq!(limiter.remaining(), before);
                }
            }
            Op::Advance { micros } => {
                now += micros * MICRO;
                clock.advance(Duration::from_micros(micros));
            }
        }
        check_bound(quota, shape, &kept)?;
    }
    Ok(())
}

#[test]
fn bad_requests_are_refused_with_typed_errors() {
    let limiter = RateLimiter::new(Quota::per_second(5).unwrap());
    assert!(matches!(
        limiter.reserve_n(0, Duration::from_secs(1)),
        Err(ReserveError::Acquire(_))
    ));
    let err = limiter.reserve_n(6, Duration::from_secs(1)).unwrap_err();
    assert!(matches!(err, ReserveError::Acquire(_)), "{err:?}");
    assert!(err.to_string().contains('6'), "{err}");
    // Lending stops one fill time ahead, whatever the delay allowed.
    let full = limiter.reserve_n(5, Duration::ZERO).unwrap();
    assert_eq!(full.delay(), Duration::ZERO);
    let ahead = limiter.reserve_n(5, Duration::from_secs(3_600)).unwrap();
    assert!(ahead.delay() <= Duration::from_secs(1), "{ahead:?}");
    assert!(matches!(
        limiter.reserve_n(5, Duration::from_secs(3_600)),
        Err(ReserveError::TooFar { .. })
    ));
}

#[test]
fn a_keyed_reservation_for_a_new_key_at_a_full_bound_is_refused_with_the_key_limit() {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<u32>::builder(Quota::new(2, 1, Duration::from_secs(1)).unwrap())
        .clock(clock.clone())
        .max_keys(1)
        .build()
        .unwrap();
    let held = limiter.reserve_n(&1, 2, Duration::ZERO).unwrap();
    assert_eq!(held.delay(), Duration::ZERO);
    let err = limiter
        .reserve_n(&2, 1, Duration::from_secs(10))
        .unwrap_err();
    assert_eq!(
        err,
        ReserveError::KeyLimit {
            retry_after: turnstile::RetryAfter::from_nanos(2_000_000_000)
        }
    );
    assert!(err.to_string().contains("as many keys"), "{err}");
    assert_eq!(limiter.len(), 1);
    // Key 1 is empty: its next permit is lent from the refill at 1 s.
    let lent = limiter.reserve_n(&1, 1, Duration::from_secs(10)).unwrap();
    assert_eq!(lent.delay(), Duration::from_secs(1));
    // A later decision on key 1 queues behind the loan.
    assert_eq!(
        limiter.try_acquire(&1).retry_after().map(|r| r.duration()),
        Some(Duration::from_secs(2))
    );
}

#[test]
fn a_live_reservation_outlives_a_change_and_later_ones_queue_at_the_new_rate() {
    outlives_a_change(|q| LiveTokenBucket::new(q).unwrap());
    // The meter's numbers are the bucket's here: one permit at a time.
    outlives_a_change(LiveGcra::new);
}

fn outlives_a_change<A>(live: impl Fn(Quota) -> A)
where
    A: Lend + turnstile::Reconfigure<Quota = Quota>,
{
    let clock = ManualClock::new();
    let limiter = RateLimiter::from_parts(
        live(Quota::new(2, 1, Duration::from_millis(100)).unwrap()),
        clock.clone(),
    );
    assert!(limiter.try_acquire_n(2).unwrap().is_allowed());
    let lent = limiter.reserve(Duration::from_secs(1)).unwrap();
    assert_eq!(lent.delay(), Duration::from_millis(100));

    // Four permits, one every 10 ms: the limit is empty and stamped with the
    // loan's permit at 100 ms, which the change keeps.
    limiter
        .set_quota(Quota::new(4, 1, Duration::from_millis(10)).unwrap())
        .unwrap();
    // A loan reaches at most one fill time (now 40 ms) ahead: the next
    // permit, at 110 ms, is too far for now.
    assert_eq!(
        limiter.reserve(Duration::from_secs(1)).unwrap_err(),
        ReserveError::TooFar {
            retry_after: turnstile::RetryAfter::from_nanos(110_000_000)
        }
    );
    clock.advance(Duration::from_millis(80));
    let next = limiter.reserve(Duration::from_secs(1)).unwrap();
    assert_eq!(next.delay(), Duration::from_millis(30));
    assert_eq!(
        limiter.try_acquire().retry_after().map(|r| r.duration()),
        Some(Duration::from_millis(40))
    );
    // The change rewrote the word under `lent`: it can no longer be undone
    // exactly, and declines; `next` was the last word written, and cancels.
    assert!(next.cancel());
    assert!(!lent.cancel());
    assert_eq!(
        limiter.try_acquire().retry_after().map(|r| r.duration()),
        Some(Duration::from_millis(30))
    );
    // More than the new capacity is refused before anything is decided.
    assert!(matches!(
        limiter.reserve_n(5, Duration::from_secs(1)),
        Err(ReserveError::Acquire(_))
    ));
}

/// Two changes can turn a lent word into another and back to the same bits
/// (a loan's time is ahead of the clock, and a conversion keeps a time that
/// is ahead): a cancel after them still declines, so the bucket that lent
/// admits no sooner than one that never lent.
#[test]
fn a_live_cancel_after_two_changes_declines_though_the_word_looks_untouched() {
    let quota = Quota::new(1, 1, Duration::from_millis(100)).unwrap();
    let clock = ManualClock::new();
    let live = || RateLimiter::from_parts(LiveTokenBucket::new(quota).unwrap(), clock.clone());
    let (lent, untouched) = (live(), live());
    assert!(lent.try_acquire().is_allowed());
    assert!(untouched.try_acquire().is_allowed());
    clock.advance(Duration::from_millis(25));
    let loan = lent.reserve(Duration::from_secs(1)).unwrap();
    assert_eq!(loan.delay(), Duration::from_millis(75));
    for _ in 0..2 {
        lent.set_quota(quota).unwrap();
        untouched.set_quota(quota).unwrap();
    }
    assert!(!loan.cancel());
    clock.advance(Duration::from_millis(75));
    assert!(!untouched.try_acquire().is_allowed());
    assert!(!lent.try_acquire().is_allowed());

    // Keyed, likewise.
    let keyed = turnstile::KeyedBuilder::<u64, _>::new(LiveTokenBucket::new(quota).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(keyed.try_acquire(&7).is_allowed());
    clock.advance(Duration::from_millis(25));
    let loan = keyed.reserve_n(&7, 1, Duration::from_secs(1)).unwrap();
    for _ in 0..2 {
        keyed.set_quota(quota).unwrap();
    }
    assert!(!loan.cancel());
    clock.advance(Duration::from_millis(75));
    assert!(!keyed.try_acquire(&7).is_allowed());

    // With no change in between, a cancel is exact.
    let loan = keyed.reserve_n(&7, 1, Duration::from_secs(1)).unwrap();
    assert!(loan.cancel());
}

/// A loan stamps its key's word up to one fill time ahead, so an idle key
/// holding one is sweepable that much later: once reservations have been
/// made, a key-limit denial's wait covers it, and a key refused at the bound
/// is admitted after waiting it.
#[test]
fn a_key_limit_wait_covers_keys_idle_with_a_loan() {
    let clock = ManualClock::new();
    let keyed = KeyedLimiter::<u64>::builder(Quota::new(1, 1, Duration::from_secs(1)).unwrap())
        .clock(clock.clone())
        .max_keys(1)
        .shards(1)
        .build()
        .unwrap();
    assert!(keyed.try_acquire(&1).is_allowed());
    let KeyedDecision::KeyLimit { retry_after } = keyed.try_acquire(&2) else {
        panic!("the bound holds one key");
    };
    assert_eq!(retry_after.duration(), Duration::from_secs(1));
    let loan = keyed.reserve_n(&1, 1, Duration::from_secs(1)).unwrap();
    assert_eq!(loan.delay(), Duration::from_secs(1));
    drop(loan);
    let KeyedDecision::KeyLimit { retry_after } = keyed.try_acquire(&2) else {
        panic!("the bound holds one key");
    };
    assert_eq!(retry_after.duration(), Duration::from_secs(2));
    clock.advance(retry_after.duration());
    assert!(keyed.try_acquire(&2).is_allowed());
}

/// A reservation cancelled `2^45` µs (1.1 years) or more after it was made
/// declines: the word's time may have come round its span since, so that
/// another word looks like the one the reservation wrote. Just inside that,
/// with nothing decided since and the permits not yet usable, the cancel is
/// exact. (A bucket of 2 refilled one a year: a reservation of both from
/// empty is usable two years on, past the horizon.)
#[test]
fn a_cancel_is_exact_up_to_the_horizon_and_declines_from_it() {
    const HORIZON_NANOS: u64 = (1 << 45) * 1_000;
    const YEAR: Duration = Duration::from_secs(365 * 86_400);
    let clock = ManualClock::new();
    let quota = Quota::new(2, 1, YEAR).unwrap();
    let direct = RateLimiter::with_clock(quota, clock.clone());
    let keyed = KeyedLimiter::<u64>::builder(quota)
        .clock(clock.clone())
        .build()
        .unwrap();
    let start = 1_000;
    clock.set_nanos(start);
    let drain = || {
        let left = direct.remaining();
        if left > 0 {
            assert!(direct.try_acquire_n(left).unwrap().is_allowed());
        }
        let left = keyed.remaining(&1);
        if left > 0 {
            assert!(keyed.try_acquire_n(&1, left).unwrap().is_allowed());
        }
    };
    drain();
    let (a, b) = (
        direct.reserve_n(2, Duration::MAX).unwrap(),
        keyed.reserve_n(&1, 2, Duration::MAX).unwrap(),
    );
    assert!(a.delay() > Duration::from_nanos(HORIZON_NANOS));
    clock.set_nanos(start + HORIZON_NANOS - 1);
    assert!(a.cancel(), "direct, just inside the horizon");
    assert!(b.cancel(), "keyed, just inside the horizon");
    let later = start + HORIZON_NANOS - 1;
    drain();
    let (a, b) = (
        direct.reserve_n(2, Duration::MAX).unwrap(),
        keyed.reserve_n(&1, 2, Duration::MAX).unwrap(),
    );
    assert!(a.delay() > Duration::from_nanos(HORIZON_NANOS));
    assert!(b.delay() > Duration::from_nanos(HORIZON_NANOS));
    clock.set_nanos(later + HORIZON_NANOS);
    assert!(!a.cancel(), "direct, at the horizon");
    assert!(!b.cancel(), "keyed, at the horizon");
}

/// A reservation whose permits are usable (the clock past its reading plus
/// its delay) may have been used: its cancel declines and keeps them, as Go's
/// `x/time/rate` does. It gave them back: a holder that acted and then
/// cancelled let the bucket admit 3 in a second where it allows 2.
#[test]
fn a_cancel_after_the_permits_were_usable_declines() {
    let clock = ManualClock::new();
    let quota = Quota::new(1, 1, Duration::from_secs(1)).unwrap();
    let direct = RateLimiter::with_clock(quota, clock.clone());
    let keyed = KeyedLimiter::<u64>::builder(quota)
        .clock(clock.clone())
        .build()
        .unwrap();
    clock.set_nanos(1_000);
    assert!(direct.try_acquire().is_allowed());
    assert!(keyed.try_acquire(&1).is_allowed());
    let (a, b) = (
        direct.reserve(Duration::from_secs(1)).unwrap(),
        keyed.reserve_n(&1, 1, Duration::from_secs(1)).unwrap(),
    );
    assert_eq!(a.delay(), Duration::from_secs(1));
    // At the usable time itself: not yet past it, exact.
    clock.advance(Duration::from_secs(1));
    assert!(a.cancel() && b.cancel());
    let (a, b) = (
        direct.reserve(Duration::from_secs(1)).unwrap(),
        keyed.reserve_n(&1, 1, Duration::from_secs(1)).unwrap(),
    );
    assert_eq!(a.delay(), Duration::ZERO, "the refill came");
    clock.advance(Duration::from_nanos(1));
    assert!(!a.cancel(), "direct, usable and maybe used");
    assert!(!b.cancel(), "keyed, usable and maybe used");
    assert!(direct.try_acquire().is_denied());
    assert!(keyed.try_acquire(&1).is_denied());
}
