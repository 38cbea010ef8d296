//! Waiting for permits on the client side: sleep until admitted, with an
//! optional deadline and jitter.

#[cfg(feature = "tokio")]
pub(crate) mod fair;
pub(crate) mod reserve;

use core::borrow::Borrow;
use core::fmt;
use core::hash::{BuildHasher, Hash};
use core::time::Duration;

use crate::algorithm::Algorithm;
use crate::clock::{Clock, Skip, saturating_nanos, skip_sleep};
use crate::decision::{KeyedDecision, RetryAfter};
use crate::error::AcquireError;
use crate::error::check_permits;
use crate::keyed::KeyedLimiter;
use crate::limiter::{Counter, RateLimiter};

/// How long a wait may take, and how much random delay to add to each sleep.
///
/// ```
/// use std::time::Duration;
/// use turnstile::WaitOptions;
///
/// let options = WaitOptions::new()
///     .deadline(Duration::from_secs(2))
///     .jitter(Duration::from_millis(50));
/// # let _ = options;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitOptions {
    deadline: Option<Duration>,
    jitter: Duration,
}

impl WaitOptions {
    /// No deadline, no jitter.
    pub const fn new() -> WaitOptions {
        WaitOptions {
            deadline: None,
            jitter: Duration::ZERO,
        }
    }

    /// Give up, at once and without sleeping, when the permits cannot be had
    /// within `deadline` of the start of the wait.
    pub const fn deadline(self, deadline: Duration) -> WaitOptions {
        WaitOptions {
            deadline: Some(deadline),
            ..self
        }
    }

    /// Add a uniformly random delay of up to `max` to each sleep, so that
    /// clients denied together do not all come back at the same instant (a
    /// thundering herd). Jitter only lengthens a sleep, never shortens it (a
    /// client never wakes before its permits are due), and never past the
    /// deadline: it is cut so that the sleep is due at least a millisecond
    /// (a tick of tokio's timer) before it, and left out when there is no such
    /// room. (A sleep may still overrun by the operating system's scheduling,
    /// jittered or not.)
    pub const fn jitter(self, max: Duration) -> WaitOptions {
        WaitOptions {
            jitter: max,
            ..self
        }
    }
}

/// How long before the deadline a jittered sleep is due at the latest: one
/// tick of tokio's timer, which rounds sleeps up to whole milliseconds.
const JITTER_MARGIN: Duration = Duration::from_millis(1);

/// Why a wait gave up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitError {
    /// The permits would not be available within the deadline. Nothing was
    /// taken, and the wait did not sleep first: it gave up as soon as the limiter
    /// said how long it would take. Also returned, with or without a deadline
    /// (`deadline` is then `Duration::MAX`), when a simulated clock cannot move
    /// forward any more (a [`ManualClock`](crate::ManualClock) at the end of its
    /// range), where the wait would never end.
    DeadlineExceeded {
        /// How long the permits were still to be waited for, from the last try.
        needed: RetryAfter,
        /// The time already spent waiting.
        waited: Duration,
        /// The deadline.
        deadline: Duration,
    },
    /// The request can never be admitted (`n = 0`, or more than the capacity,
    /// also when a live quota change lowered the capacity below `n` during
    /// the wait).
    Acquire(AcquireError),
    /// The key is new and the keyed limiter is full (its key bound), and room
    /// is not certain within the deadline. Nothing was taken or stored, and
    /// the wait did not sleep first.
    KeyLimit {
        /// The key-bound refusal's retry-after, from the last try.
        needed: RetryAfter,
        /// The time already spent waiting.
        waited: Duration,
        /// The deadline.
        deadline: Duration,
    },
}

impl fmt::Display for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitError::DeadlineExceeded {
                needed,
                waited,
                deadline,
            } => write_gave_up(f, needed.duration(), *waited, *deadline),
            WaitError::Acquire(e) => e.fmt(f),
            WaitError::KeyLimit {
                needed,
                waited,
                deadline,
            } => write!(
                f,
                "the rate limiter holds its most keys; room for a new one is certain only \
                 after another {:?}, after {waited:?} of waiting, past the deadline of \
                 {deadline:?}",
                needed.duration()
            ),
        }
    }
}

/// The message of a wait that gave up with `needed` still to wait after
/// `waited`: past its deadline, or (when the rest fits within the deadline, or
/// there is none) on a simulated clock that cannot move forward any more.
pub(crate) fn write_gave_up(
    f: &mut fmt::Formatter<'_>,
    needed: Duration,
    waited: Duration,
    deadline: Duration,
) -> fmt::Result {
    if waited.saturating_add(needed) > deadline {
        write!(
            f,
            "the permits need another {needed:?} after {waited:?} of waiting, past the \
             deadline of {deadline:?}"
        )
    } else if deadline == Duration::MAX {
        write!(
            f,
            "the permits need another {needed:?} after {waited:?} of waiting, and the \
             simulated clock cannot move forward any more"
        )
    } else {
        write!(
            f,
            "the permits need another {needed:?} after {waited:?} of waiting, within the \
             deadline of {deadline:?}, but the simulated clock cannot move forward any more"
        )
    }
}

impl std::error::Error for WaitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WaitError::Acquire(e) => Some(e),
            WaitError::DeadlineExceeded { .. } | WaitError::KeyLimit { .. } => None,
        }
    }
}

impl From<AcquireError> for WaitError {
    fn from(e: AcquireError) -> WaitError {
        WaitError::Acquire(e)
    }
}

/// What to do after one try: done, or sleep this long and try again.
pub(crate) enum Step {
    Done(Duration),
    /// Sleep this long; `true` when the denial was a refusal at a keyed
    /// limiter's key bound (counted there already).
    Sleep(Duration, bool),
}

/// What a wait needs from a limiter. Sealed: a public trait in a private
/// module, so that the I/O adapters' `Throttle` can name it as a supertrait
/// while no type outside the crate can implement it.
// Reachable from outside only as the supertrait of `io::Throttle`: without
// feature `io` nothing outside the crate can name it.
#[cfg_attr(not(feature = "io"), allow(unreachable_pub))]
pub(crate) mod sealed {
    use crate::clock::Clock;
    use crate::decision::KeyedDecision;

    /// What a wait needs from a limiter: its clock, one try that is not
    /// counted, and counting the wait's outcome once. Direct and keyed waits
    /// (and the I/O adapters) share everything else.
    pub trait Waitable {
        /// The limiter's clock.
        type Clock: Clock;

        /// Whether [`try_once`](Waitable::try_once) reads the clock itself
        /// (instead of deciding at the wait's reading).
        const READS_OWN_CLOCK: bool;

        /// The limiter's clock.
        fn wait_clock(&self) -> &Self::Clock;

        /// One decision for `n` permits. `now` is the wait's reading; a keyed
        /// limiter reads its clock itself, after it has found the key's word.
        fn try_once(&self, now: u64, n: u32) -> KeyedDecision;

        /// Count the outcome: admitted, or refused by the deadline.
        fn count(&self, admitted: bool);

        /// The most permits one decision can admit now (a live quota may lower
        /// it while a wait sleeps).
        fn capacity(&self) -> u32;

        /// The decision `n` permits would get at `now`, taking nothing (a
        /// keyed limiter reads its clock itself, as in `try_once`).
        #[cfg_attr(not(feature = "io"), allow(dead_code))]
        fn peek_once(&self, now: u64, n: u32) -> KeyedDecision;

        /// Take `n` permits now, into debt where the algorithm lends
        /// ([`Algorithm::owe`](crate::Algorithm::owe): the token buckets),
        /// for what was used before it was paid; otherwise only if they are
        /// there. Not counted. `false` when nothing was taken.
        #[cfg_attr(not(feature = "io"), allow(dead_code))]
        fn charge(&self, n: u32) -> bool {
            let now = self.wait_clock().now();
            self.try_once(now, n).is_allowed()
        }
    }

    /// A reference waits as what it refers to.
    impl<T: Waitable + ?Sized> Waitable for &T {
        type Clock = T::Clock;
        const READS_OWN_CLOCK: bool = T::READS_OWN_CLOCK;

        #[inline]
        fn wait_clock(&self) -> &T::Clock {
            (**self).wait_clock()
        }

        #[inline]
        fn try_once(&self, now: u64, n: u32) -> KeyedDecision {
            (**self).try_once(now, n)
        }

        #[inline]
        fn count(&self, admitted: bool) {
            (**self).count(admitted);
        }

        #[inline]
        fn capacity(&self) -> u32 {
            (**self).capacity()
        }

        fn charge(&self, n: u32) -> bool {
            (**self).charge(n)
        }

        fn peek_once(&self, now: u64, n: u32) -> KeyedDecision {
            (**self).peek_once(now, n)
        }
    }

    /// A shared limiter waits as the limiter.
    impl<T: Waitable + ?Sized> Waitable for std::sync::Arc<T> {
        type Clock = T::Clock;
        const READS_OWN_CLOCK: bool = T::READS_OWN_CLOCK;

        #[inline]
        fn wait_clock(&self) -> &T::Clock {
            (**self).wait_clock()
        }

        #[inline]
        fn try_once(&self, now: u64, n: u32) -> KeyedDecision {
            (**self).try_once(now, n)
        }

        #[inline]
        fn count(&self, admitted: bool) {
            (**self).count(admitted);
        }

        #[inline]
        fn capacity(&self) -> u32 {
            (**self).capacity()
        }

        fn charge(&self, n: u32) -> bool {
            (**self).charge(n)
        }

        fn peek_once(&self, now: u64, n: u32) -> KeyedDecision {
            (**self).peek_once(now, n)
        }
    }
}

pub(crate) use sealed::Waitable;

/// An algorithm whose denials are loans where it lends
/// ([`Algorithm::owe`]): what [`Waitable::charge`] decides with. `on_loan`
/// is told how far ahead of the clock a loan stamps its word, before it is
/// written (a keyed limiter's key-limit denials wait that much longer).
#[cfg_attr(not(feature = "io"), allow(dead_code))]
pub(crate) struct Debtor<'a, A> {
    pub(crate) algorithm: &'a A,
    pub(crate) on_loan: &'a dyn Fn(u64),
}

impl<A: Algorithm> Algorithm for Debtor<'_, A> {
    fn fresh(&self) -> u64 {
        self.algorithm.fresh()
    }

    fn capacity(&self) -> u32 {
        self.algorithm.capacity()
    }

    fn decide(&self, word: u64, now: u64, n: u32) -> (crate::Decision, Option<u64>) {
        match self.algorithm.decide(word, now, n) {
            (crate::Decision::Denied { retry_after }, _) => {
                match self.algorithm.owe(word, now, n) {
                    Some((next, ahead)) => {
                        (self.on_loan)(ahead);
                        (crate::Decision::Allowed { remaining: 0 }, Some(next))
                    }
                    None => (crate::Decision::Denied { retry_after }, None),
                }
            }
            taken => taken,
        }
    }

    fn remaining(&self, word: u64, now: u64) -> u32 {
        self.algorithm.remaining(word, now)
    }

    fn refund(&self, _word: u64, _written: u64, _n: u32) -> Option<u64> {
        None
    }

    fn is_fresh_equivalent(&self, word: u64, now: u64) -> bool {
        self.algorithm.is_fresh_equivalent(word, now)
    }

    fn fresh_after_idle(&self) -> Duration {
        self.algorithm.fresh_after_idle()
    }

    const DEFERRED_WAIT: bool = A::DEFERRED_WAIT;
    const RECHECK_DENIAL: bool = A::RECHECK_DENIAL;
}

/// A limiter whose tries take nothing and count nothing: a wait on it ends
/// when the permits are there, leaving them (a shaped reader's wait before
/// it reads).
#[cfg_attr(not(feature = "io"), allow(dead_code))]
pub(crate) struct Peeking<'a, W: ?Sized>(pub(crate) &'a W);

impl<W: Waitable + ?Sized> Waitable for Peeking<'_, W> {
    type Clock = W::Clock;
    const READS_OWN_CLOCK: bool = W::READS_OWN_CLOCK;

    fn wait_clock(&self) -> &W::Clock {
        self.0.wait_clock()
    }

    fn try_once(&self, now: u64, n: u32) -> KeyedDecision {
        self.0.peek_once(now, n)
    }

    fn count(&self, _admitted: bool) {}

    fn capacity(&self) -> u32 {
        self.0.capacity()
    }

    fn peek_once(&self, now: u64, n: u32) -> KeyedDecision {
        self.0.peek_once(now, n)
    }

    fn charge(&self, _n: u32) -> bool {
        false
    }
}

impl<A: Algorithm, C: Clock, M: Counter> Waitable for RateLimiter<A, C, M> {
    type Clock = C;
    const READS_OWN_CLOCK: bool = false;

    fn charge(&self, n: u32) -> bool {
        let now = self.clock().now();
        let debtor = Debtor {
            algorithm: self.algorithm(),
            on_loan: &|_| {},
        };
        self.cell().take(&debtor, now, n).0.is_allowed()
    }

    fn peek_once(&self, now: u64, n: u32) -> KeyedDecision {
        self.algorithm().decide(self.cell().load(), now, n).0.into()
    }

    #[inline]
    fn wait_clock(&self) -> &C {
        self.clock()
    }

    #[inline]
    fn try_once(&self, now: u64, n: u32) -> KeyedDecision {
        self.cell().apply(self.algorithm(), now, n).into()
    }

    #[inline]
    fn count(&self, admitted: bool) {
        RateLimiter::count(self, admitted);
    }

    fn capacity(&self) -> u32 {
        RateLimiter::capacity(self)
    }
}

/// One key of a keyed limiter, waiting.
struct KeyedWait<'a, K, Q: ?Sized, A, C, S> {
    limiter: &'a KeyedLimiter<K, A, C, S>,
    key: &'a Q,
}

impl<K, Q, A, C, S> Waitable for KeyedWait<'_, K, Q, A, C, S>
where
    K: Hash + Eq + Borrow<Q>,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    A: Algorithm,
    C: Clock,
    S: BuildHasher,
{
    type Clock = C;
    const READS_OWN_CLOCK: bool = true;

    fn wait_clock(&self) -> &C {
        self.limiter.clock()
    }

    fn try_once(&self, _now: u64, n: u32) -> KeyedDecision {
        self.limiter.try_uncounted(self.key, n)
    }

    fn peek_once(&self, _now: u64, n: u32) -> KeyedDecision {
        self.limiter.peek(self.key, n)
    }

    fn count(&self, admitted: bool) {
        self.limiter.count_outcome(admitted);
    }

    fn capacity(&self) -> u32 {
        self.limiter.algorithm().capacity()
    }
}

/// A blocking wait for `n` permits (`n` already checked).
fn block<W: Waitable>(w: &W, n: u32, options: &WaitOptions) -> Result<Duration, WaitError> {
    let start = w.wait_clock().now();
    loop {
        match step(w, n, start, options)? {
            Step::Done(waited) => return Ok(waited),
            Step::Sleep(d, key_limit) => {
                if !skip(w, d, key_limit, start, options)? {
                    std::thread::sleep(d);
                }
            }
        }
    }
}

/// A simulated sleep of `d` ([`Clock::skip`]): `Ok(true)` if the clock moved
/// forward instead of sleeping, `Ok(false)` if the caller must sleep. A
/// simulated clock that cannot move any more (a [`ManualClock`](crate::ManualClock)
/// at the end of its range) would make the wait spin for ever: it gives up as
/// past its deadline instead (at the key bound, with [`WaitError::KeyLimit`],
/// which the bound has counted already).
pub(crate) fn skip<W: Waitable + ?Sized>(
    w: &W,
    d: Duration,
    key_limit: bool,
    start: u64,
    options: &WaitOptions,
) -> Result<bool, WaitError> {
    match skip_sleep(w.wait_clock(), d) {
        Skip::Sleep => Ok(false),
        Skip::Skipped => Ok(true),
        Skip::Stuck => Err(give_up(
            w,
            RetryAfter::from_nanos(saturating_nanos(d)),
            key_limit,
            Duration::from_nanos(w.wait_clock().now().saturating_sub(start)),
            options.deadline.unwrap_or(Duration::MAX),
        )),
    }
}

/// The error of a wait that gives up needing `needed` more: at the key bound
/// (`key_limit`, which counted its own refusal) or for the rate, counted once
/// as a denial.
fn give_up<W: Waitable + ?Sized>(
    w: &W,
    needed: RetryAfter,
    key_limit: bool,
    waited: Duration,
    deadline: Duration,
) -> WaitError {
    if key_limit {
        return WaitError::KeyLimit {
            needed,
            waited,
            deadline,
        };
    }
    w.count(false);
    WaitError::DeadlineExceeded {
        needed,
        waited,
        deadline,
    }
}

/// An asynchronous wait for `n` permits (`n` already checked).
#[cfg(feature = "tokio")]
async fn sleep_until_admitted<W: Waitable>(
    w: &W,
    n: u32,
    options: &WaitOptions,
) -> Result<Duration, WaitError> {
    let start = w.wait_clock().now();
    loop {
        match step(w, n, start, options)? {
            Step::Done(waited) => return Ok(waited),
            Step::Sleep(d, key_limit) => {
                if !skip(w, d, key_limit, start, options)? {
                    tokio::time::sleep(d).await;
                } else {
                    // Let other tasks run between simulated sleeps.
                    tokio::task::yield_now().await;
                }
            }
        }
    }
}

/// One try: taken, or how long to sleep before the next; or the deadline.
pub(crate) fn step<W: Waitable + ?Sized>(
    w: &W,
    n: u32,
    start: u64,
    options: &WaitOptions,
) -> Result<Step, WaitError> {
    let now = w.wait_clock().now();
    let decision = w.try_once(now, n);
    // A limiter that read the clock itself measured its retry-after from a
    // reading at least this late: counting the time waited up to it never
    // lets a sleep end past the deadline.
    let now = if W::READS_OWN_CLOCK {
        w.wait_clock().now().max(now)
    } else {
        now
    };
    let waited = Duration::from_nanos(now.saturating_sub(start));
    let (needed, key_limit) = match decision {
        KeyedDecision::Allowed { .. } => {
            w.count(true);
            return Ok(Step::Done(waited));
        }
        KeyedDecision::Denied { retry_after } => {
            // A live quota lowered below `n` since the wait began would deny
            // it for ever: refused as at the start.
            if let Err(e) = check_permits(n, w.capacity()) {
                w.count(false);
                return Err(e.into());
            }
            (retry_after, false)
        }
        KeyedDecision::KeyLimit { retry_after } => (retry_after, true),
    };
    let mut sleep = needed.duration();
    let mut jitter = options.jitter;
    if let Some(deadline) = options.deadline {
        let left = deadline.saturating_sub(waited);
        if sleep > left {
            return Err(give_up(w, needed, key_limit, waited, deadline));
        }
        // Cut so that the jittered sleep is due a timer tick before the
        // deadline: tokio's timer rounds a sleep up to its next millisecond,
        // so one planned to end on the deadline itself returned past it.
        jitter = jitter.min((left - sleep).saturating_sub(JITTER_MARGIN));
    }
    if !jitter.is_zero() {
        // Up to the jitter itself, inclusive; a jitter of 584 years or more
        // (`u64::MAX` ns) saturates there.
        let spread = saturating_nanos(jitter).saturating_add(1);
        sleep = sleep.saturating_add(Duration::from_nanos(random_below(spread)));
    }
    Ok(Step::Sleep(sleep, key_limit))
}

impl<A: Algorithm, C: Clock, M: Counter> RateLimiter<A, C, M> {
    /// Block until one permit is taken; returns how long that took by the
    /// limiter's clock. See [`wait_n`](Self::wait_n).
    ///
    /// # Errors
    ///
    /// [`WaitError::DeadlineExceeded`] as for `wait_n`.
    pub fn wait(&self, options: WaitOptions) -> Result<Duration, WaitError> {
        self.wait_n(1, options)
    }

    /// Block until `n` permits are taken, sleeping for each denial's exact
    /// retry-after (plus jitter). For a client that must stay under someone
    /// else's limit: instead of sending, being refused and retrying, it waits
    /// its turn. On a [`ManualClock`](crate::ManualClock) the sleeps advance the
    /// clock instead, so tests take no time.
    ///
    /// The rate a waiting loop achieves is at most the quota's, and below it
    /// by each sleep's lateness (the scheduler's, and tokio's millisecond
    /// timer for `wait_n_async`) and any jitter: with a
    /// burst of 1 the time a late wake-up loses is never made up. A burst of
    /// 2 or more absorbs it (at the cost of two permits close together after
    /// a late wake-up); keep the burst at 1 where the other side allows no
    /// burst at all.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ManualClock, Quota, RateLimiter, WaitError, WaitOptions};
    ///
    /// let clock = ManualClock::new();
    /// let limiter = RateLimiter::with_clock(Quota::new(1, 1, Duration::from_secs(1))?, clock.clone());
    /// limiter.wait(WaitOptions::new())?; // at once
    /// let waited = limiter.wait(WaitOptions::new())?; // one second later
    /// assert_eq!(waited, Duration::from_secs(1));
    ///
    /// // A deadline shorter than the wait fails at once, without sleeping.
    /// let err = limiter.wait(WaitOptions::new().deadline(Duration::from_millis(500)));
    /// assert!(matches!(err, Err(WaitError::DeadlineExceeded { .. })));
    /// assert_eq!(clock.elapsed(), Duration::from_secs(1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`WaitError::DeadlineExceeded`] when a denial's wait would end past the
    /// deadline (returned before sleeping), and [`WaitError::Acquire`] for
    /// `n = 0` or `n` above the capacity, at the start or, if a live quota
    /// lowers the capacity below `n` while the wait sleeps, at its next try.
    pub fn wait_n(&self, n: u32, options: WaitOptions) -> Result<Duration, WaitError> {
        check_permits(n, self.capacity())?;
        block(self, n, &options)
    }

    /// The asynchronous [`wait`](Self::wait), sleeping on tokio's timer.
    ///
    /// # Errors
    ///
    /// As [`wait_n`](Self::wait_n).
    #[cfg(feature = "tokio")]
    pub async fn wait_async(&self, options: WaitOptions) -> Result<Duration, WaitError> {
        self.wait_n_async(1, options).await
    }

    /// The asynchronous [`wait_n`](Self::wait_n): the task sleeps on tokio's
    /// timer (a [`ManualClock`](crate::ManualClock) advances instead). Dropping
    /// the future cancels the wait; nothing is taken until the permits are.
    ///
    /// # Errors
    ///
    /// As [`wait_n`](Self::wait_n).
    #[cfg(feature = "tokio")]
    pub async fn wait_n_async(&self, n: u32, options: WaitOptions) -> Result<Duration, WaitError> {
        check_permits(n, self.capacity())?;
        sleep_until_admitted(self, n, &options).await
    }
}

impl<K, A, C, S> KeyedLimiter<K, A, C, S>
where
    K: Hash + Eq,
    A: Algorithm,
    C: Clock,
    S: BuildHasher,
{
    /// Block until one permit for `key` is taken; returns how long that took
    /// by the limiter's clock. See [`wait_n`](Self::wait_n).
    ///
    /// # Errors
    ///
    /// As [`wait_n`](Self::wait_n).
    pub fn wait<Q>(&self, key: &Q, options: WaitOptions) -> Result<Duration, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.wait_n(key, 1, options)
    }

    /// Block until `n` permits for `key` are taken: the direct limiter's
    /// [`wait_n`](RateLimiter::wait_n), per key. Each denial's exact
    /// retry-after is slept (plus jitter, never past the deadline), and a
    /// deadline the permits would miss fails at once, without sleeping. On a
    /// [`ManualClock`](crate::ManualClock) the sleeps advance the clock.
    ///
    /// **At the key bound.** A new key refused because the limiter is full
    /// ([`KeyedDecision::KeyLimit`]) is waited out like a rate denial: the
    /// refusal is temporary, and its retry-after (the algorithm's
    /// [idle-to-fresh time](Algorithm::fresh_after_idle), by when every key
    /// idle since can be swept) is slept, within the deadline; when it would
    /// pass the deadline the wait fails at once with [`WaitError::KeyLimit`].
    /// That retry-after is the time by which room is certain, often long (a
    /// bucket's whole fill time): give such waits a deadline.
    ///
    /// Only the outcome is counted in [`stats`](Self::stats): one admission,
    /// or one denial when the deadline refuses a rate denial or a live
    /// quota lowered below `n` while it waited refuses it (each refusal at
    /// the key bound counts in `denied_key_limit`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{KeyedLimiter, ManualClock, Quota, WaitError, WaitOptions};
    ///
    /// let clock = ManualClock::new();
    /// let limiter = KeyedLimiter::<String>::builder(Quota::new(1, 1, Duration::from_secs(1))?)
    ///     .clock(clock.clone())
    ///     .build()?;
    /// assert_eq!(limiter.wait("alice", WaitOptions::new())?, Duration::ZERO);
    /// assert_eq!(limiter.wait("bob", WaitOptions::new())?, Duration::ZERO); // his own bucket
    /// assert_eq!(limiter.wait("alice", WaitOptions::new())?, Duration::from_secs(1));
    ///
    /// let err = limiter.wait("alice", WaitOptions::new().deadline(Duration::from_millis(500)));
    /// assert!(matches!(err, Err(WaitError::DeadlineExceeded { .. })));
    /// assert_eq!(clock.elapsed(), Duration::from_secs(1)); // it did not sleep
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`WaitError::DeadlineExceeded`] when a rate denial's wait would end past
    /// the deadline, [`WaitError::KeyLimit`] when a key-bound refusal's would
    /// (both returned before sleeping), and [`WaitError::Acquire`] for `n = 0`
    /// or `n` above the capacity (touching nothing), at the start or, if a
    /// live quota lowers the capacity below `n` while the wait sleeps, at its
    /// next try.
    pub fn wait_n<Q>(&self, key: &Q, n: u32, options: WaitOptions) -> Result<Duration, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        check_permits(n, self.algorithm().capacity())?;
        block(&KeyedWait { limiter: self, key }, n, &options)
    }

    /// The asynchronous [`wait`](Self::wait), sleeping on tokio's timer.
    ///
    /// # Errors
    ///
    /// As [`wait_n`](Self::wait_n).
    #[cfg(feature = "tokio")]
    pub async fn wait_async<Q>(&self, key: &Q, options: WaitOptions) -> Result<Duration, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.wait_n_async(key, 1, options).await
    }

    /// The asynchronous [`wait_n`](Self::wait_n): the task sleeps on tokio's
    /// timer (a [`ManualClock`](crate::ManualClock) advances instead).
    /// Dropping the future cancels the wait; nothing is taken until the
    /// permits are.
    ///
    /// # Errors
    ///
    /// As [`wait_n`](Self::wait_n).
    #[cfg(feature = "tokio")]
    pub async fn wait_n_async<Q>(
        &self,
        key: &Q,
        n: u32,
        options: WaitOptions,
    ) -> Result<Duration, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        check_permits(n, self.algorithm().capacity())?;
        sleep_until_admitted(&KeyedWait { limiter: self, key }, n, &options).await
    }
}

/// A uniformly random number below `bound` (`bound >= 1`), from a per-thread
/// xorshift generator seeded by std's random hasher keys: jitter needs spread,
/// not cryptographic strength.
fn random_below(bound: u64) -> u64 {
    use std::cell::Cell;
    use std::hash::{BuildHasher, Hasher};
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(0x9E37_79B9_7F4A_7C15);
            h.finish() | 1
        });
    }
    let x = STATE.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x
    });
    // Multiply-shift: uniform enough for jitter, with no division.
    ((u128::from(x) * u128::from(bound)) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jitter_or_deadline_of_any_length_sleeps_at_least_the_wait_without_panicking() {
        use crate::{ManualClock, Quota};
        let clock = ManualClock::new();
        let limiter = RateLimiter::with_clock(
            Quota::new(1, 1, Duration::from_secs(1)).unwrap(),
            clock.clone(),
        );
        assert!(limiter.try_acquire().is_allowed());
        for options in [
            WaitOptions::new().jitter(Duration::MAX),
            WaitOptions::new()
                .jitter(Duration::MAX)
                .deadline(Duration::MAX),
            WaitOptions::new().deadline(Duration::MAX),
            WaitOptions::new().jitter(Duration::from_nanos(u64::MAX)),
        ] {
            match step(&limiter, 1, 0, &options) {
                Ok(Step::Sleep(sleep, _)) => {
                    assert!(sleep >= Duration::from_secs(1), "{sleep:?}")
                }
                Ok(Step::Done(_)) => panic!("the permit was spent"),
                Err(e) => panic!("{options:?}: {e}"),
            }
        }
    }

    #[test]
    fn a_wait_on_a_manual_clock_at_the_end_of_its_range_gives_up_instead_of_spinning() {
        use crate::{ManualClock, Quota};
        let clock = ManualClock::new();
        clock.set_nanos(u64::MAX);
        let limiter = RateLimiter::with_clock(
            Quota::new(1, 1, Duration::from_secs(1)).unwrap(),
            clock.clone(),
        );
        assert!(limiter.try_acquire().is_allowed());
        for options in [
            WaitOptions::new(),
            WaitOptions::new().deadline(Duration::MAX),
        ] {
            match limiter.wait(options) {
                Err(WaitError::DeadlineExceeded { deadline, .. }) => {
                    assert_eq!(deadline, Duration::MAX);
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn random_below_stays_below_and_spreads() {
        for bound in [1, 2, 3, 10, 1_000_000, u64::MAX] {
            for _ in 0..1_000 {
                assert!(random_below(bound) < bound);
            }
        }
        let mut seen = [false; 10];
        for _ in 0..1_000 {
            seen[random_below(10) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s), "{seen:?}");
    }
}
