//! Reservations: permits taken now, usable after a known wait.

use core::borrow::Borrow;
use core::cell::Cell;
use core::fmt;
use core::hash::{BuildHasher, Hash};
use core::time::Duration;

use crate::algorithm::gcra::Gcra;
use crate::algorithm::live::LiveTokenBucket;
use crate::algorithm::switch::LiveGcra;
use crate::algorithm::token_bucket::{self, TokenBucket};
use crate::algorithm::{Algorithm, within_refund_horizon};
use crate::clock::{Clock, RealClock, saturating_nanos};
use crate::decision::{Decision, KeyedDecision, RetryAfter};
use crate::error::AcquireError;
use crate::error::check_permits;
use crate::keyed::KeyedLimiter;
use crate::limiter::{Counter, RateLimiter, Uncounted};

/// Permits reserved from a token bucket or a GCRA meter
/// ([`RateLimiter::reserve_n`]): taken now, usable once
/// [`delay`](Reservation::delay) has passed. `A` is the algorithm: a
/// [`TokenBucket`] or a [`Gcra`], or their live forms ([`LiveTokenBucket`],
/// [`LiveGcra`]) whose quota can change.
///
/// Dropping a reservation keeps its permits taken (the caller goes ahead
/// after the delay). [`cancel`](Reservation::cancel) gives them back when that
/// can be done exactly. Neither `Clone` nor `Copy`: it cancels at most once.
#[must_use = "dropping a reservation keeps its permits taken; call `cancel` to give them back"]
pub struct Reservation<'a, C = RealClock, M = Uncounted, A = TokenBucket> {
    limiter: &'a RateLimiter<A, C, M>,
    /// The bucket's count of quota changes before the loan.
    changes: u64,
    previous: u64,
    written: u64,
    /// The loan's clock reading: a cancel
    /// [`REFUND_HORIZON_NANOS`](crate::algorithm::REFUND_HORIZON_NANOS) after
    /// it declines.
    at: u64,
    n: u32,
    delay: Duration,
}

/// Why a reservation was refused. Nothing was reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReserveError {
    /// `n = 0`, or more permits than the bucket ever holds.
    Acquire(AcquireError),
    /// The permits would be usable only after `retry_after`: later than the
    /// longest delay asked for, or than the bucket's fill time (a bucket
    /// lends at most one fill ahead).
    TooFar {
        /// When `n` permits will be there (what a denial would say now).
        retry_after: RetryAfter,
    },
    /// A keyed limiter held as many keys as it may, and none could be
    /// reclaimed: the new key was not stored
    /// ([`KeyedDecision::KeyLimit`](crate::KeyedDecision::KeyLimit)).
    KeyLimit {
        /// When a key can be stored again at the latest.
        retry_after: RetryAfter,
    },
}

impl fmt::Display for ReserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReserveError::Acquire(e) => e.fmt(f),
            ReserveError::TooFar { retry_after } => write!(
                f,
                "the permits would be usable only after {:?}, later than the reservation allows",
                retry_after.duration()
            ),
            ReserveError::KeyLimit { retry_after } => write!(
                f,
                "the keyed limiter holds as many keys as it may; a new key can be stored \
                 after {:?} at the latest",
                retry_after.duration()
            ),
        }
    }
}

impl std::error::Error for ReserveError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReserveError::Acquire(e) => Some(e),
            ReserveError::TooFar { .. } | ReserveError::KeyLimit { .. } => None,
        }
    }
}

impl From<AcquireError> for ReserveError {
    fn from(e: AcquireError) -> Self {
        ReserveError::Acquire(e)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::TokenBucket {}
    impl Sealed for crate::LiveTokenBucket {}
    impl Sealed for crate::Gcra {}
    impl Sealed for crate::LiveGcra {}
}

/// An algorithm that can lend permits from its future, for reservations
/// ([`RateLimiter::reserve_n`], [`KeyedLimiter::reserve_n`]): [`TokenBucket`],
/// [`Gcra`] and their live forms [`LiveTokenBucket`] and [`LiveGcra`].
/// Sealed: a reservation's bound rests on each one's arithmetic. A token
/// bucket lends from the refill that completes the permits; a GCRA meter
/// moves its theoretical arrival time on by the permits' `n * T`, as the
/// admission of the same request at its usable time would (so its bound
/// holds with reservations counted then). The windows do not lend: a
/// window's count cannot be taken from a window that has not begun.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Gcra, ManualClock, Quota, RateLimiter};
///
/// let clock = ManualClock::new();
/// // A burst of 2, one permit back every 100 ms.
/// let meter = Gcra::new(Quota::new(2, 1, Duration::from_millis(100))?);
/// let limiter = RateLimiter::from_parts(meter, clock.clone());
/// assert_eq!(limiter.reserve_n(2, Duration::ZERO)?.delay(), Duration::ZERO);
/// let next = limiter.reserve(Duration::from_secs(1))?;
/// assert_eq!(next.delay(), Duration::from_millis(100));
/// // The one after it waits behind it.
/// assert_eq!(
///     limiter.try_acquire().retry_after().map(|r| r.duration()),
///     Some(Duration::from_millis(200))
/// );
/// // Nothing changed since: cancelling is exact.
/// assert!(next.cancel());
/// assert_eq!(
///     limiter.try_acquire().retry_after().map(|r| r.duration()),
///     Some(Duration::from_millis(100))
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A live form lends on the quota in force. A change keeps a loan's future
/// stamp, so reservations made before it keep their permits and later ones
/// queue behind them at the new rate; a cancel after the change declines.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{LiveTokenBucket, ManualClock, Quota, RateLimiter};
///
/// let clock = ManualClock::new();
/// let bucket = LiveTokenBucket::new(Quota::new(1, 1, Duration::from_millis(100))?)?;
/// let limiter = RateLimiter::from_parts(bucket, clock.clone());
/// assert!(limiter.try_acquire().is_allowed());
/// let first = limiter.reserve(Duration::from_secs(1))?;
/// assert_eq!(first.delay(), Duration::from_millis(100));
///
/// // Raised to one every 10 ms (20 at most): the next permit follows the
/// // loan at the new rate.
/// limiter.set_quota(Quota::new(20, 1, Duration::from_millis(10))?)?;
/// assert_eq!(limiter.reserve(Duration::from_secs(1))?.delay(), Duration::from_millis(110));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Lend: Algorithm + sealed::Sealed {
    /// Reserve `n` permits in `word` at clock reading `now`: the decision,
    /// the next word and the nanoseconds until the permits are there; or the
    /// wait, when it would be more than `max_ahead` nanoseconds or than one
    /// fill time of the quota `word` was decided under (which keeps the
    /// word's time within its span; a live form's quota may have changed
    /// since the caller looked).
    #[doc(hidden)]
    fn lend(
        &self,
        word: u64,
        now: u64,
        n: u32,
        max_ahead: u64,
    ) -> Result<(Decision, u64, u64), u64>;

    /// How many times the quota has changed (0, the default, for an
    /// algorithm whose quota cannot).
    #[doc(hidden)]
    fn changes(&self) -> u64 {
        0
    }

    /// Run `cancel` with changes of the quota held off, if none has started
    /// since [`changes`](Self::changes) returned `since`; `false` without
    /// running it otherwise. A cancel's test of the word for the one its
    /// reservation wrote is proof that nothing touched the word only while no
    /// change runs: two changes can convert a lent word away and back to the
    /// same bits. By default (a quota that cannot change) `cancel` runs.
    #[doc(hidden)]
    fn cancel_unless_changed(&self, since: u64, cancel: impl FnOnce() -> bool) -> bool {
        let _ = since;
        cancel()
    }
}

impl Lend for TokenBucket {
    fn lend(
        &self,
        word: u64,
        now: u64,
        n: u32,
        max_ahead: u64,
    ) -> Result<(Decision, u64, u64), u64> {
        token_bucket::reserve(self, word, now, n, max_ahead)
    }
}

impl Lend for LiveTokenBucket {
    fn lend(
        &self,
        word: u64,
        now: u64,
        n: u32,
        max_ahead: u64,
    ) -> Result<(Decision, u64, u64), u64> {
        self.reserve(word, now, n, max_ahead)
    }

    fn changes(&self) -> u64 {
        LiveTokenBucket::changes(self)
    }

    fn cancel_unless_changed(&self, since: u64, cancel: impl FnOnce() -> bool) -> bool {
        self.unless_changed(since, cancel).unwrap_or(false)
    }
}

impl Lend for Gcra {
    fn lend(
        &self,
        word: u64,
        now: u64,
        n: u32,
        max_ahead: u64,
    ) -> Result<(Decision, u64, u64), u64> {
        self.lend_within(word, now, n, max_ahead, u64::MAX)
    }
}

impl Lend for LiveGcra {
    fn lend(
        &self,
        word: u64,
        now: u64,
        n: u32,
        max_ahead: u64,
    ) -> Result<(Decision, u64, u64), u64> {
        LiveGcra::lend(self, word, now, n, max_ahead)
    }

    fn changes(&self) -> u64 {
        LiveGcra::changes(self)
    }

    fn cancel_unless_changed(&self, since: u64, cancel: impl FnOnce() -> bool) -> bool {
        self.unless_changed(since, cancel).unwrap_or(false)
    }
}

impl<A: Lend, C: Clock, M: Counter> RateLimiter<A, C, M> {
    /// Reserve one permit, usable after at most `max_delay`
    /// ([`reserve_n`](Self::reserve_n)).
    ///
    /// # Errors
    ///
    /// As [`reserve_n`](Self::reserve_n).
    pub fn reserve(&self, max_delay: Duration) -> Result<Reservation<'_, C, M, A>, ReserveError> {
        self.reserve_n(1, max_delay)
    }

    /// Reserve `n` permits now and learn when they are usable: at once if the
    /// bucket holds them (an admission), else after the exact wait until the
    /// refill that completes them. Requests after a reservation queue behind
    /// it: the bucket lends from its future, so nothing is admitted twice.
    ///
    /// The bound of the token bucket holds with reservations counted at the
    /// time they become usable. When the refill that completes a reservation
    /// brings more than the reservation needs (an `amount` above 1), the rest
    /// of that batch is dropped: a reservation may under-admit by less than
    /// `amount`, never over-admit. On a [`Gcra`] meter a reservation writes
    /// what admitting the same request at its usable time would, so GCRA's
    /// bound holds the same way, with nothing dropped (see [`Lend`]). A reservation counts as an admission in
    /// [`stats`](RateLimiter::stats), a refused one as a denial.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ManualClock, Quota, RateLimiter};
    ///
    /// let clock = ManualClock::new();
    /// let limiter = RateLimiter::with_clock(Quota::new(2, 1, Duration::from_millis(100))?, clock);
    /// let now = limiter.reserve_n(2, Duration::ZERO)?;
    /// assert_eq!(now.delay(), Duration::ZERO);
    /// // The bucket is empty: the next permit is lent from the refill at 100 ms.
    /// let later = limiter.reserve(Duration::from_secs(1))?;
    /// assert_eq!(later.delay(), Duration::from_millis(100));
    /// // Others queue behind it.
    /// assert_eq!(
    ///     limiter.try_acquire().retry_after().map(|r| r.duration()),
    ///     Some(Duration::from_millis(200))
    /// );
    /// // Too far: nothing is reserved.
    /// assert!(limiter.reserve(Duration::from_millis(150)).is_err());
    /// // Nothing changed since `later`: cancelling it is exact.
    /// assert!(later.cancel());
    /// assert_eq!(
    ///     limiter.try_acquire().retry_after().map(|r| r.duration()),
    ///     Some(Duration::from_millis(100))
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ReserveError::Acquire`] for `n = 0` or `n` above the capacity, and
    /// [`ReserveError::TooFar`] when the permits would be usable only after
    /// `max_delay`, or after the bucket's fill time. Neither changes the
    /// bucket.
    pub fn reserve_n(
        &self,
        n: u32,
        max_delay: Duration,
    ) -> Result<Reservation<'_, C, M, A>, ReserveError> {
        self.reserve_counted(n, max_delay, true)
    }

    /// [`reserve_n`](Self::reserve_n), counted in the stats when `counted`
    /// (not for a combined layer lending a response's cost, which is no
    /// decision on a request).
    pub(crate) fn reserve_counted(
        &self,
        n: u32,
        max_delay: Duration,
        counted: bool,
    ) -> Result<Reservation<'_, C, M, A>, ReserveError> {
        let bucket = self.algorithm();
        check_permits(n, bucket.capacity())?;
        let lender = Lender::new(bucket, max_delay, &|_| {});
        // Before the loan: a change that starts after this count can convert
        // the loan's word, and a cancel then sees a later count.
        let changes = bucket.changes();
        let now = self.clock().now();
        let (decision, written) = self.cell().take(&lender, now, n);
        if counted {
            self.count(decision.is_allowed());
        }
        match written {
            Some(written) => Ok(Reservation {
                limiter: self,
                changes,
                previous: lender.replaced.get(),
                written,
                at: now,
                n,
                delay: Duration::from_nanos(lender.wait.get()),
            }),
            None => Err(ReserveError::TooFar {
                retry_after: decision.retry_after().unwrap_or(RetryAfter::from_nanos(0)),
            }),
        }
    }
}

impl<A: Lend, C: Clock, M: Counter> Reservation<'_, C, M, A> {
    /// How long after the reservation (its clock reading) the permits are
    /// usable: zero when the bucket held them.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// The permits reserved.
    pub fn permits(&self) -> u32 {
        self.n
    }

    /// Give the permits back, for an action that will not be taken: `true`
    /// when the bucket is now exactly as if the reservation had never been
    /// made; `false` when it declined, keeping them taken, because the
    /// permits' time has passed (the clock is past the reservation's reading
    /// plus its [`delay`](Self::delay): they were usable, and may have been
    /// used, as Go's `x/time/rate` `Cancel` assumes too), or another
    /// decision changed the bucket since (later requests may already be
    /// queued behind this reservation, or have spent from it; undoing it then
    /// could admit more than the quota allows), or a live bucket's quota was
    /// changed since, or the clock has moved `2^45` µs (1.1 years) or more
    /// past the reservation's reading (the word's time may have come round
    /// its span, so that another word looks like this one's).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ManualClock, Quota, RateLimiter};
    ///
    /// let clock = ManualClock::new();
    /// let limiter = RateLimiter::with_clock(Quota::new(1, 1, Duration::from_secs(1))?, clock.clone());
    /// assert!(limiter.try_acquire().is_allowed());
    /// let next = limiter.reserve(Duration::from_secs(1))?;
    /// assert_eq!(next.delay(), Duration::from_secs(1));
    /// clock.advance(Duration::from_millis(1_001));
    /// // Usable since a millisecond ago: kept, as if used.
    /// assert!(!next.cancel());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cancel(self) -> bool {
        let now = self.limiter.clock().now();
        if !within_refund_horizon(self.at, now) || usable_since(self.at, self.delay, now) {
            return false;
        }
        let (previous, written) = (self.previous, self.written);
        let cell = self.limiter.cell();
        self.limiter
            .algorithm()
            .cancel_unless_changed(self.changes, || {
                cell.transform(|word| (word == written).then_some(previous))
                    .is_some()
            })
    }
}

/// Whether a reservation read at `at` whose permits were usable `delay`
/// after it is past that time at `now` (a reading behind `at` is not).
fn usable_since(at: u64, delay: Duration, now: u64) -> bool {
    let delay = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
    now.saturating_sub(at) > delay
}

impl<C, M, A> fmt::Debug for Reservation<'_, C, M, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("permits", &self.n)
            .field("delay", &self.delay)
            .finish()
    }
}

/// The token bucket's decision, lending from its future: what a reservation
/// runs in the compare-and-swap loop. It notes the word its last decision read
/// (the one a successful compare-and-swap replaced) and that decision's wait.
struct Lender<'a, A> {
    bucket: &'a A,
    max_ahead: u64,
    replaced: Cell<u64>,
    wait: Cell<u64>,
    /// Told how far ahead of the clock a loan stamps its word, before the
    /// compare-and-swap that writes it.
    on_loan: &'a dyn Fn(u64),
}

impl<'a, A: Lend> Lender<'a, A> {
    fn new(bucket: &'a A, max_delay: Duration, on_loan: &'a dyn Fn(u64)) -> Lender<'a, A> {
        Lender {
            bucket,
            on_loan,
            // And at most one fill time ahead, of the quota the word names:
            // each algorithm's `lend` holds to that itself.
            max_ahead: saturating_nanos(max_delay),
            replaced: Cell::new(0),
            wait: Cell::new(0),
        }
    }
}

impl<A: Lend> Algorithm for Lender<'_, A> {
    fn fresh(&self) -> u64 {
        self.bucket.fresh()
    }

    fn capacity(&self) -> u32 {
        self.bucket.capacity()
    }

    fn decide(&self, word: u64, now: u64, n: u32) -> (Decision, Option<u64>) {
        self.replaced.set(word);
        match self.bucket.lend(word, now, n, self.max_ahead) {
            Ok((decision, next, wait)) => {
                self.wait.set(wait);
                if wait > 0 {
                    (self.on_loan)(wait);
                }
                (decision, Some(next))
            }
            Err(wait) => (
                Decision::Denied {
                    retry_after: RetryAfter::from_nanos(wait),
                },
                None,
            ),
        }
    }

    fn remaining(&self, word: u64, now: u64) -> u32 {
        self.bucket.remaining(word, now)
    }

    fn refund(&self, _word: u64, _written: u64, _n: u32) -> Option<u64> {
        None
    }

    fn is_fresh_equivalent(&self, word: u64, now: u64) -> bool {
        self.bucket.is_fresh_equivalent(word, now)
    }

    fn fresh_after_idle(&self) -> Duration {
        self.bucket.fresh_after_idle()
    }

    // A live form's refusal (too far) is decided on parameters a change can
    // rewrite, as its denials are: checked against the word as theirs are.
    const DEFERRED_WAIT: bool = A::DEFERRED_WAIT;
    const RECHECK_DENIAL: bool = A::RECHECK_DENIAL;
}

/// Permits reserved for one key of a keyed token bucket or GCRA meter
/// ([`KeyedLimiter::reserve_n`]): as [`Reservation`], and it cancels by
/// looking the key up again. A key evicted since (it can be only once its
/// bucket has refilled, long after the permits were usable) declines.
#[must_use = "dropping a reservation keeps its permits taken; call `cancel` to give them back"]
pub struct KeyedReservation<'a, K, Q: ?Sized, C, S, A = TokenBucket> {
    limiter: &'a KeyedLimiter<K, A, C, S>,
    key: &'a Q,
    /// As in [`Reservation`].
    changes: u64,
    previous: u64,
    written: u64,
    at: u64,
    n: u32,
    delay: Duration,
}

impl<K, A, C, S> KeyedLimiter<K, A, C, S>
where
    K: Hash + Eq,
    A: Lend,
    C: Clock,
    S: BuildHasher,
{
    /// Reserve `n` permits for `key` now and learn when they are usable, as
    /// [`RateLimiter::reserve_n`] does for one bucket. A key not held yet is
    /// stored, under the key bound like any decision.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{KeyedLimiter, ManualClock, Quota};
    ///
    /// let limiter = KeyedLimiter::<String>::builder(Quota::new(1, 1, Duration::from_secs(1))?)
    ///     .clock(ManualClock::new())
    ///     .build()?;
    /// assert!(limiter.try_acquire("alice").is_allowed());
    /// let next = limiter.reserve_n("alice", 1, Duration::from_secs(5))?;
    /// assert_eq!(next.delay(), Duration::from_secs(1));
    /// assert!(next.cancel());
    /// assert_eq!(limiter.reserve_n("bob", 1, Duration::ZERO)?.delay(), Duration::ZERO);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`RateLimiter::reserve_n`], and [`ReserveError::KeyLimit`] when a
    /// new key meets a full key bound.
    pub fn reserve_n<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u32,
        max_delay: Duration,
    ) -> Result<KeyedReservation<'a, K, Q, C, S, A>, ReserveError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.reserve_counted(key, n, max_delay, true)
    }

    /// [`reserve_n`](Self::reserve_n), counted in the stats when `counted`
    /// (not for a combined layer lending a response's cost).
    pub(crate) fn reserve_counted<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u32,
        max_delay: Duration,
        counted: bool,
    ) -> Result<KeyedReservation<'a, K, Q, C, S, A>, ReserveError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let bucket = self.algorithm();
        check_permits(n, bucket.capacity())?;
        // A loan stamps its key's word ahead of the clock; key-limit denials
        // learn how far before the word is written.
        let note = |ahead| self.note_loan(ahead);
        let lender = Lender::new(bucket, max_delay, &note);
        // As in `RateLimiter::reserve_n`.
        let changes = bucket.changes();
        match self.take_with(&lender, key, n, counted) {
            (KeyedDecision::Allowed { .. }, Some(written), at) => Ok(KeyedReservation {
                limiter: self,
                key,
                changes,
                previous: lender.replaced.get(),
                written,
                at,
                n,
                delay: Duration::from_nanos(lender.wait.get()),
            }),
            (KeyedDecision::KeyLimit { retry_after }, _, _) => {
                Err(ReserveError::KeyLimit { retry_after })
            }
            (KeyedDecision::Denied { retry_after }, _, _) => {
                Err(ReserveError::TooFar { retry_after })
            }
            // A lender's admission always writes.
            (KeyedDecision::Allowed { .. }, None, _) => Err(ReserveError::TooFar {
                retry_after: RetryAfter::from_nanos(0),
            }),
        }
    }
}

impl<K, Q, A, C, S> KeyedReservation<'_, K, Q, C, S, A>
where
    K: Hash + Eq + Borrow<Q>,
    A: Lend,
    Q: Hash + Eq + ?Sized,
    C: Clock,
    S: BuildHasher,
{
    /// As [`Reservation::delay`].
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// The permits reserved.
    pub fn permits(&self) -> u32 {
        self.n
    }

    /// As [`Reservation::cancel`], on the key's word.
    pub fn cancel(self) -> bool {
        let (previous, written) = (self.previous, self.written);
        let (limiter, key) = (self.limiter, self.key);
        let now = limiter.clock().now();
        if !within_refund_horizon(self.at, now) || usable_since(self.at, self.delay, now) {
            return false;
        }
        limiter.algorithm().cancel_unless_changed(self.changes, || {
            limiter.transform_linked(key, |word| (word == written).then_some(previous))
        })
    }
}

impl<K, Q: fmt::Debug + ?Sized, C, S, A> fmt::Debug for KeyedReservation<'_, K, Q, C, S, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedReservation")
            .field("key", &self.key)
            .field("permits", &self.n)
            .field("delay", &self.delay)
            .finish()
    }
}
