//! Fair waiting: a bounded FIFO queue of asynchronous waiters in front of a
//! limiter, a keyed limiter or a bulkhead (see [`Fair`]).

use core::fmt;
use core::future::poll_fn;
use core::hash::Hash;
use core::task::{Context, Poll, Waker};
use core::time::Duration;
use std::borrow::Borrow;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

use crate::algorithm::Algorithm;
use crate::clock::{Clock, Skip, skip_sleep};
use crate::concurrency::signal::{Listening, ReleaseSignal};
use crate::concurrency::{ConcurrencyLimiter, OwnedPermit, Permit};
use crate::decision::{Decision, KeyedDecision, RetryAfter};
use crate::error::check_permits;
use crate::error::{AcquireError, QuotaError};
use crate::keyed::KeyedLimiter;
use crate::limiter::{Counter, RateLimiter};
use crate::sync::lock;

/// Why a fair acquire gave up. Nothing was taken from the limiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FairError {
    /// `max_waiters` were already waiting: refused at once, without waiting.
    QueueFull {
        /// The bound on waiters.
        max_waiters: usize,
    },
    /// The permits could not be had within the deadline.
    DeadlineExceeded {
        /// The wait the limiter reported to the head when it gave up at once
        /// (the rest of the wait was predictable and too long, or a simulated
        /// clock could not move forward any more: then `deadline` is
        /// `Duration::MAX` if none was set); `None` when the deadline passed
        /// while still queued (or, for the bulkhead, while waiting for a
        /// permit to be dropped).
        needed: Option<RetryAfter>,
        /// The time already spent waiting.
        waited: Duration,
        /// The deadline.
        deadline: Duration,
    },
    /// A keyed limiter's key is new and the limiter holds `max_keys` keys
    /// already: it will not grow its memory for this key. Answered at once
    /// rather than waited out at the head of the queue, where it would hold
    /// every waiter behind it until idle keys can be swept (a
    /// [`KeyedLimiter::wait_n`](crate::KeyedLimiter::wait_n) outside a queue
    /// waits it out). `retry_after` is the limiter's hint
    /// ([`KeyedDecision::KeyLimit`]).
    KeyLimit {
        /// The time after which idle keys can be swept.
        retry_after: RetryAfter,
    },
    /// The request can never be admitted (`n = 0`, or more than the capacity
    /// or the bulkhead's limit). Refused before joining the queue.
    Acquire(AcquireError),
}

impl fmt::Display for FairError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FairError::QueueFull { max_waiters } => {
                write!(f, "the wait queue is full: {max_waiters} waiters already")
            }
            FairError::DeadlineExceeded {
                needed: Some(needed),
                waited,
                deadline,
            } => crate::wait::write_gave_up(f, needed.duration(), *waited, *deadline),
            FairError::DeadlineExceeded {
                needed: None,
                waited,
                deadline,
            } => write!(
                f,
                "still waiting after {waited:?}, the deadline of {deadline:?}"
            ),
            FairError::KeyLimit { retry_after } => write!(
                f,
                "the key is new and the keyed limiter is full; idle keys can be swept \
                 after {:?}",
                retry_after.duration()
            ),
            FairError::Acquire(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for FairError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FairError::Acquire(e) => Some(e),
            _ => None,
        }
    }
}

impl From<AcquireError> for FairError {
    fn from(e: AcquireError) -> FairError {
        FairError::Acquire(e)
    }
}

mod sealed {
    pub trait Sealed {}
    impl<A, C, M> Sealed for crate::RateLimiter<A, C, M> {}
    impl<K, A, C, S> Sealed for crate::KeyedLimiter<K, A, C, S> {}
    impl Sealed for std::sync::Arc<crate::ConcurrencyLimiter> {}
}

/// What a [`Fair`] wrapper can queue for: a [`RateLimiter`], a
/// [`KeyedLimiter`] (one queue per key) and an `Arc<`[`ConcurrencyLimiter`]`>`
/// (the `Arc`, so that it can also hand out [`OwnedPermit`]s). Sealed.
pub trait FairTarget: sealed::Sealed {
    /// What the queues are keyed by: `()` for one queue, the limiter's key
    /// type for a keyed limiter.
    type Key: Hash + Eq + Clone;
}

impl<A, C, M> FairTarget for RateLimiter<A, C, M> {
    type Key = ();
}

impl<K: Hash + Eq + Clone, A, C, S> FairTarget for KeyedLimiter<K, A, C, S> {
    type Key = K;
}

impl FairTarget for Arc<ConcurrencyLimiter> {
    type Key = ();
}

/// A limiter with a bounded FIFO queue of asynchronous waiters in front of it:
/// acquires that admit waiters in arrival order, for a direct limiter
/// ([`RateLimiter`]), per key ([`KeyedLimiter`]) and for the bulkhead
/// ([`ConcurrencyLimiter`]). Share the wrapper by reference or in an `Arc`.
///
/// [`RateLimiter::wait_async`](crate::RateLimiter::wait_async) sleeps the exact
/// retry-after and tries again, so under load a waiter that arrived late can
/// wake first and take the permit an earlier one was sleeping for. A [`Fair`]
/// wrapper queues its waiters instead. The waits sleep on tokio's timer (a
/// [`ManualClock`](crate::ManualClock) skips them instead, as `wait_async`
/// does).
///
/// - **First come, first served.** Every acquire joins the back of a FIFO
///   queue (of its key, for a keyed limiter) when its future is first polled,
///   even when the queue is empty.
///   Only the waiter at the head tries the limiter: it sleeps on tokio's timer
///   for the exact retry-after the limiter reports, and tries again; the
///   bulkhead's head sleeps until a permit is dropped. When admitted, the head
///   leaves the queue and wakes the next waiter, which becomes the head. An
///   arrival never tries the limiter ahead of a waiter already queued.
/// - **Bounded.** At most `max_waiters` wait at once (over every key, for a
///   keyed limiter); one more is refused at once with
///   [`FairError::QueueFull`], without waiting and without taking anything.
/// - **Cancellation gives the place back.** Dropping an acquire's future
///   removes its waiter from the queue. A dropped head wakes the next waiter,
///   which becomes the head, so no wake-up is lost; a dropped waiter further
///   back is removed and wakes nobody. A waiter is woken once, when it becomes
///   the head; nothing is taken from the limiter until the permits are.
/// - **Deadlines.** With a deadline, the head gives up at once, without
///   sleeping, when the limiter's retry-after would end past it (counted on the
///   limiter's clock from the start of the acquire); a waiter still queued
///   behind others, whose wait cannot be predicted, gives up when the deadline
///   passes on tokio's timer. The bulkhead's waits are never predictable and
///   always end on the timer. Either way [`FairError::DeadlineExceeded`] is
///   returned and the waiter's place goes to the next.
///
/// # What is fair and what is not
///
/// Fairness holds among the wrapper's own waiters. The limiter's decision path
/// ([`RateLimiter::try_acquire`](crate::RateLimiter::try_acquire) and the
/// others) is unchanged, lock-free, and does not look at the queue: a caller of
/// the plain `try_acquire` on the same limiter ([`inner`](Fair::inner)) is not queued
/// and may take a permit the head was about to get. The head then sees the new
/// retry-after and waits again, still at the head. For strict order, send every
/// caller through the wrapper.
///
/// # Timer resolution
///
/// tokio's timer ticks in milliseconds and a sleep ends at the first tick
/// after its deadline, so the head oversleeps by up to a millisecond. A
/// limiter whose burst is 1 has nowhere to keep the time overslept (a full
/// bucket stops filling), and admits less than its rate: about one every
/// 2.1 ms on a 1,000/s limit. A burst of a few permits absorbs the overshoot:
/// 10,000 waiters on 1,000/s with a burst of 10 are admitted over 9.999 to
/// 10.004 s, against an ideal 9.999 s (`examples/fair_waiters.rs`).
///
/// # The queue
///
/// The queue itself is a `VecDeque` behind a mutex: the waiting path takes it
/// to join, to check whether it is the head, and to leave. Each waiter is
/// polled when it joins and when it becomes the head, so a queue of `w`
/// waiters costs `O(log w)` per poll (waiters are found by their arrival
/// number) and `O(1)` to hand over; a waiter that leaves from the middle
/// (cancelled, or past its deadline) costs `O(min(i, w - i))` at place `i`.
///
/// The head sleeps the exact wait the limiter gave it. Permits that appear
/// sooner (a live quota raised, a reservation cancelled, a refund) are seen
/// when it wakes, not before, and the waiters behind it wait as long, while
/// a plain `try_acquire` on the limiter may take them meanwhile. Per key, the queues live in one map behind
/// the same mutex and a key's queue is removed when it empties, so memory is
/// bounded by `max_waiters`, not by the number of keys ever seen.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Fair, ManualClock, Quota, RateLimiter};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// let clock = ManualClock::new();
/// let limiter = RateLimiter::with_clock(Quota::new(1, 1, Duration::from_secs(1))?, clock);
/// let fair = Fair::new(limiter, 1_000)?;
/// assert_eq!(fair.acquire(None).await?, Duration::ZERO); // the bucket's one token
/// // The next waits its turn: one period (a manual clock skips the sleep).
/// assert_eq!(fair.acquire(None).await?, Duration::from_secs(1));
/// // A deadline shorter than the wait gives up at once.
/// assert!(fair.acquire(Some(Duration::from_millis(10))).await.is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })
/// # }
/// ```
pub struct Fair<L: FairTarget> {
    inner: L,
    queues: WaitQueues<L::Key>,
}

impl<L: FairTarget> Fair<L> {
    /// `inner` with a queue of at most `max_waiters` waiters (over every key).
    ///
    /// # Errors
    ///
    /// [`QuotaError::ZeroWaiters`] for 0: such a queue would refuse every wait.
    pub fn new(inner: L, max_waiters: usize) -> Result<Fair<L>, QuotaError> {
        if max_waiters == 0 {
            return Err(QuotaError::ZeroWaiters);
        }
        Ok(Fair {
            inner,
            queues: WaitQueues::new(max_waiters),
        })
    }

    /// The limiter itself. Its plain decisions (`try_acquire` and the others)
    /// are not queued: see the [type's documentation](Fair).
    pub fn inner(&self) -> &L {
        &self.inner
    }

    /// The waiters queued now, the heads included (over every key).
    pub fn waiting(&self) -> usize {
        lock(&self.queues.state).waiting
    }

    /// The most waiters queued at once.
    pub fn max_waiters(&self) -> usize {
        self.queues.max_waiters
    }
}

impl<L: FairTarget + fmt::Debug> fmt::Debug for Fair<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fair")
            .field("inner", &self.inner)
            .field("waiting", &self.waiting())
            .field("max_waiters", &self.queues.max_waiters)
            .finish()
    }
}

impl<A: Algorithm, C: Clock, M: Counter> Fair<RateLimiter<A, C, M>> {
    /// Wait in turn for one permit; returns how long that took by the
    /// limiter's clock. See [`acquire_n`](Self::acquire_n).
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n).
    pub async fn acquire(&self, deadline: Option<Duration>) -> Result<Duration, FairError> {
        self.acquire_n(1, deadline).await
    }

    /// Wait in turn for `n` permits, all at once: join the queue, wait to be
    /// its head, then sleep each denial's exact retry-after until admitted.
    /// Returns the time waited by the limiter's clock. Dropping the future
    /// gives the place back.
    ///
    /// A head waiting for many permits holds up those behind it, as in any
    /// FIFO queue (.NET's `QueueLimit` with oldest-first order does the same).
    /// The limiter counts (when [counted](RateLimiter::counted)) one admission,
    /// or one denial when the head's deadline check refuses (or a live quota
    /// lowered below `n` while it waited, as under Errors); the head's
    /// retries are not counted, nor a waiter whose deadline passes in the
    /// queue.
    ///
    /// # Errors
    ///
    /// [`FairError::QueueFull`] at once when `max_waiters` are waiting,
    /// [`FairError::DeadlineExceeded`] as described in the
    /// [type's documentation](Fair), and [`FairError::Acquire`] for `n = 0` or
    /// `n` above the capacity (at the start, or at the head's next try when a
    /// live quota lowered the capacity below `n` while it waited).
    pub async fn acquire_n(
        &self,
        n: u32,
        deadline: Option<Duration>,
    ) -> Result<Duration, FairError> {
        let limiter = &self.inner;
        check_permits(n, limiter.capacity())?;
        let start = limiter.clock().now();
        let waited = || Duration::from_nanos(limiter.clock().now().saturating_sub(start));
        let ticket = self.queues.enqueue(())?;
        let result = within(deadline, waited, async {
            poll_fn(|cx| ticket.poll_head(cx)).await;
            loop {
                let now = limiter.clock().now();
                let elapsed = Duration::from_nanos(now.saturating_sub(start));
                match limiter.cell().apply(limiter.algorithm(), now, n) {
                    Decision::Allowed { .. } => {
                        limiter.count(true);
                        return Ok(elapsed);
                    }
                    Decision::Denied { retry_after } => {
                        // A live quota lowered below `n` since the wait began
                        // would deny it for ever: refused as at the start.
                        if let Err(e) = check_permits(n, limiter.capacity()) {
                            limiter.count(false);
                            return Err(e.into());
                        }
                        let slept = match fits(deadline, elapsed, retry_after) {
                            Ok(()) => sleep(limiter.clock(), retry_after, elapsed, deadline).await,
                            Err(e) => Err(e),
                        };
                        if let Err(e) = slept {
                            limiter.count(false);
                            return Err(e);
                        }
                    }
                }
            }
        })
        .await;
        // Admitted or given up: leave the queue, waking the next head.
        drop(ticket);
        result
    }
}

impl<K, A, C, S> Fair<KeyedLimiter<K, A, C, S>>
where
    K: Hash + Eq + Clone,
    A: Algorithm,
    C: Clock,
    S: BuildHasher,
{
    /// Wait in turn for one permit for `key`. See
    /// [`acquire_n`](Self::acquire_n).
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n).
    pub async fn acquire<Q>(
        &self,
        key: &Q,
        deadline: Option<Duration>,
    ) -> Result<Duration, FairError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.acquire_n(key, 1, deadline).await
    }

    /// Wait in turn, behind the earlier waiters for the same key only, for
    /// `n` permits for `key`; returns the time waited by the limiter's clock.
    /// Waiters for different keys do not wait for each other. The queue is
    /// bounded over every key together: `max_waiters` is the most waiting at
    /// once, whatever the keys, and a key's queue is removed when its last
    /// waiter leaves. Each try of a key's head is one decision of the keyed
    /// limiter, counted in its [`stats`](KeyedLimiter::stats).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Fair, KeyedLimiter, ManualClock, Quota};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
    /// let limiter = KeyedLimiter::<String>::builder(Quota::new(1, 1, Duration::from_secs(1))?)
    ///     .clock(ManualClock::new())
    ///     .build()?;
    /// let fair = Fair::new(limiter, 10_000)?;
    /// assert_eq!(fair.acquire("alice", None).await?, Duration::ZERO);
    /// assert_eq!(fair.acquire("bob", None).await?, Duration::ZERO); // another key
    /// assert_eq!(fair.acquire("alice", None).await?, Duration::from_secs(1));
    /// assert_eq!(fair.waiting(), 0); // every key's queue is gone
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Fair::<RateLimiter>::acquire_n`](Fair::acquire_n), and
    /// [`FairError::KeyLimit`] when the key is new and the limiter is full
    /// (the waiter leaves the queue at once).
    pub async fn acquire_n<Q>(
        &self,
        key: &Q,
        n: u32,
        deadline: Option<Duration>,
    ) -> Result<Duration, FairError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let limiter = &self.inner;
        check_permits(n, limiter.algorithm().capacity())?;
        let start = limiter.clock().now();
        let waited = || Duration::from_nanos(limiter.clock().now().saturating_sub(start));
        let ticket = self.queues.enqueue(key.to_owned())?;
        let result = within(deadline, waited, async {
            poll_fn(|cx| ticket.poll_head(cx)).await;
            loop {
                // `n` was checked above: the limiter cannot refuse it.
                let decision = limiter.try_acquire_n(key, n)?;
                let elapsed = waited();
                match decision {
                    KeyedDecision::Allowed { .. } => return Ok(elapsed),
                    KeyedDecision::KeyLimit { retry_after } => {
                        return Err(FairError::KeyLimit { retry_after });
                    }
                    KeyedDecision::Denied { retry_after } => {
                        fits(deadline, elapsed, retry_after)?;
                        sleep(limiter.clock(), retry_after, elapsed, deadline).await?;
                    }
                }
            }
        })
        .await;
        drop(ticket);
        result
    }

    /// The waiters queued now for `key`, its head included.
    pub fn waiting_for<Q>(&self, key: &Q) -> usize
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        lock(&self.queues.state)
            .queues
            .get(key)
            .map_or(0, VecDeque::len)
    }
}

impl Fair<Arc<ConcurrencyLimiter>> {
    /// Wait in turn for one permit of the bulkhead. See
    /// [`acquire_n`](Self::acquire_n).
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n).
    pub async fn acquire(&self, deadline: Option<Duration>) -> Result<Permit<'_>, FairError> {
        self.acquire_n(1, deadline).await
    }

    /// Wait in turn for `n` permits of the bulkhead, all at once: join the
    /// queue, wait to be its head, then wait until enough permits are dropped
    /// (a dropped permit wakes the head). Dropping the future gives the place
    /// back. Resilience4j's bulkhead waits the same way, with its
    /// `maxWaitDuration` as the deadline.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use turnstile::{ConcurrencyLimiter, Fair};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
    /// let fair = Arc::new(Fair::new(Arc::new(ConcurrencyLimiter::new(1)?), 100)?);
    /// let first = fair.acquire(None).await?;
    /// let waiter = tokio::spawn({
    ///     let fair = Arc::clone(&fair);
    ///     async move { fair.acquire_owned(None).await.map(|p| p.permits()) }
    /// });
    /// tokio::task::yield_now().await; // the waiter queues
    /// assert_eq!(fair.waiting(), 1);
    /// drop(first); // wakes it
    /// assert_eq!(waiter.await?, Ok(1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`FairError::QueueFull`] at once when `max_waiters` are waiting,
    /// [`FairError::DeadlineExceeded`] when the deadline passes first (on
    /// tokio's timer), and [`FairError::Acquire`] for `n = 0` or `n` above the
    /// limit.
    pub async fn acquire_n(
        &self,
        n: u32,
        deadline: Option<Duration>,
    ) -> Result<Permit<'_>, FairError> {
        check_permits(n, self.inner.limit())?;
        self.bulkhead(deadline, || self.inner.try_acquire_n(n).ok().flatten())
            .await
    }

    /// [`acquire`](Self::acquire) for an [`OwnedPermit`], to move into a task.
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n).
    pub async fn acquire_owned(
        &self,
        deadline: Option<Duration>,
    ) -> Result<OwnedPermit, FairError> {
        self.acquire_n_owned(1, deadline).await
    }

    /// [`acquire_n`](Self::acquire_n) for an [`OwnedPermit`].
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n).
    pub async fn acquire_n_owned(
        &self,
        n: u32,
        deadline: Option<Duration>,
    ) -> Result<OwnedPermit, FairError> {
        check_permits(n, self.inner.limit())?;
        self.bulkhead(deadline, || {
            self.inner.try_acquire_n_owned(n).ok().flatten()
        })
        .await
    }

    async fn bulkhead<P>(
        &self,
        deadline: Option<Duration>,
        take: impl Fn() -> Option<P>,
    ) -> Result<P, FairError> {
        let start = tokio::time::Instant::now();
        let ticket = self.queues.enqueue(())?;
        let signal = &self.inner.released;
        let result = within(deadline, || start.elapsed(), async {
            poll_fn(|cx| ticket.poll_head(cx)).await;
            // Declared after the ticket, so dropped before it: the head stops
            // listening for releases before it hands over.
            let owner = core::ptr::from_ref(self).addr();
            let _listening = Listening { signal, owner };
            Ok(poll_fn(|cx| poll_permit(signal, owner, cx, &take)).await)
        })
        .await;
        drop(ticket);
        result
    }
}

/// One poll of the head of wrapper `owner`'s queue: the permits, or a
/// promise to be woken by the next release.
fn poll_permit<P>(
    signal: &ReleaseSignal,
    owner: usize,
    cx: &mut Context<'_>,
    take: &impl Fn() -> Option<P>,
) -> Poll<P> {
    if let Some(permit) = take() {
        return Poll::Ready(permit);
    }
    signal.listen(owner, cx.waker());
    // A permit dropped between the first try and `listen` saw no listener:
    // try again (see `ReleaseSignal`).
    match take() {
        Some(permit) => Poll::Ready(permit),
        None => Poll::Pending,
    }
}

/// Run `wait`, giving up with [`FairError::DeadlineExceeded`] when the
/// deadline passes on tokio's timer first.
async fn within<T>(
    deadline: Option<Duration>,
    waited: impl Fn() -> Duration,
    wait: impl Future<Output = Result<T, FairError>>,
) -> Result<T, FairError> {
    match deadline {
        None => wait.await,
        Some(deadline) => match tokio::time::timeout(deadline, wait).await {
            Ok(result) => result,
            Err(_elapsed) => Err(FairError::DeadlineExceeded {
                needed: None,
                waited: waited(),
                deadline,
            }),
        },
    }
}

/// `Ok` when a wait of `needed` after `waited` ends within the deadline.
fn fits(deadline: Option<Duration>, waited: Duration, needed: RetryAfter) -> Result<(), FairError> {
    match deadline {
        Some(deadline) if needed.duration() > deadline.saturating_sub(waited) => {
            Err(FairError::DeadlineExceeded {
                needed: Some(needed),
                waited,
                deadline,
            })
        }
        _ => Ok(()),
    }
}

/// Sleep `needed` on tokio's timer, or skip it on a simulated clock (and let
/// other tasks run). A simulated clock that cannot move any more (a
/// [`ManualClock`](crate::ManualClock) at the end of its range) would keep the
/// head trying for ever: it gives up as past its deadline instead
/// (`Duration::MAX` when it has none).
async fn sleep<C: Clock>(
    clock: &C,
    needed: RetryAfter,
    waited: Duration,
    deadline: Option<Duration>,
) -> Result<(), FairError> {
    match skip_sleep(clock, needed.duration()) {
        Skip::Sleep => tokio::time::sleep(needed.duration()).await,
        Skip::Skipped => tokio::task::yield_now().await,
        Skip::Stuck => {
            return Err(FairError::DeadlineExceeded {
                needed: Some(needed),
                waited,
                deadline: deadline.unwrap_or(Duration::MAX),
            });
        }
    }
    Ok(())
}

/// One waiter's place in a queue.
#[derive(Debug)]
struct Slot {
    /// The waiter's arrival number: increasing along each queue, so a waiter
    /// is found by binary search.
    id: u64,
    /// Set while the waiter waits behind others; taken by the waiter ahead of
    /// it when that one leaves the head.
    waker: Option<Waker>,
}

#[derive(Debug)]
struct State<K> {
    /// One queue per key with waiters (a single one, at `()`, for an unkeyed
    /// limiter). A queue is removed when its last waiter leaves.
    queues: HashMap<K, VecDeque<Slot>>,
    /// Waiters in every queue.
    waiting: usize,
    next_id: u64,
}

/// The FIFO queues of a [`Fair`] wrapper.
#[derive(Debug)]
struct WaitQueues<K> {
    state: Mutex<State<K>>,
    max_waiters: usize,
}

impl<K: Hash + Eq + Clone> WaitQueues<K> {
    fn new(max_waiters: usize) -> WaitQueues<K> {
        WaitQueues {
            state: Mutex::new(State {
                queues: HashMap::new(),
                waiting: 0,
                next_id: 0,
            }),
            max_waiters,
        }
    }

    /// Join the back of `key`'s queue, or be refused if every place is taken.
    fn enqueue(&self, key: K) -> Result<Ticket<'_, K>, FairError> {
        let mut state = lock(&self.state);
        if state.waiting >= self.max_waiters {
            return Err(FairError::QueueFull {
                max_waiters: self.max_waiters,
            });
        }
        let id = state.next_id;
        // Hashing and cloning the key run the caller's code, which may panic:
        // the place is counted only once the slot is in its queue, so that a
        // panic leaves the count as it found it.
        state
            .queues
            .entry(key.clone())
            .or_default()
            .push_back(Slot { id, waker: None });
        // A u64 of arrivals does not wrap in any process's life.
        state.next_id = id.wrapping_add(1);
        state.waiting += 1;
        Ok(Ticket {
            queues: self,
            key,
            id,
        })
    }
}

/// A waiter's place in its queue; dropping it leaves the queue.
struct Ticket<'a, K: Hash + Eq> {
    queues: &'a WaitQueues<K>,
    key: K,
    id: u64,
}

impl<K: Hash + Eq> Ticket<'_, K> {
    /// Ready once this waiter is the head of its queue; until then, keep its
    /// waker for the waiter ahead to wake.
    ///
    /// Both this and `Drop` run under the queue's lock, so a waiter either
    /// stores its waker before the head leaves (and is woken) or looks after
    /// (and finds itself the head): no wake-up is lost.
    fn poll_head(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = lock(&self.queues.state);
        let Some(queue) = state.queues.get_mut(&self.key) else {
            // Unreachable: the queue holds this ticket's slot until it drops.
            return Poll::Ready(());
        };
        match queue.binary_search_by_key(&self.id, |slot| slot.id) {
            Ok(0) | Err(_) => Poll::Ready(()),
            Ok(at) => {
                let slot = &mut queue[at];
                match &mut slot.waker {
                    Some(waker) if waker.will_wake(cx.waker()) => {}
                    waker => *waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
        }
    }
}

impl<K: Hash + Eq> Drop for Ticket<'_, K> {
    fn drop(&mut self) {
        let next = {
            let mut state = lock(&self.queues.state);
            let mut next = None;
            let mut empty = false;
            if let Some(queue) = state.queues.get_mut(&self.key) {
                if let Ok(at) = queue.binary_search_by_key(&self.id, |slot| slot.id) {
                    queue.remove(at);
                    if at == 0 {
                        // The head left: the next waiter is the head now.
                        next = queue.front_mut().and_then(|slot| slot.waker.take());
                    }
                }
                empty = queue.is_empty();
            }
            if empty {
                state.queues.remove(&self.key);
            }
            state.waiting = state.waiting.saturating_sub(1);
            next
        };
        // Woken outside the lock, so that the new head's first poll does not
        // contend with this thread.
        if let Some(waker) = next {
            waker.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::sync::atomic::Ordering;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    /// A waker that counts its wakes.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn waker() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count::default());
        (Arc::clone(&count), Waker::from(count))
    }

    fn wakes(count: &Count) -> usize {
        count.0.load(Ordering::Relaxed)
    }

    #[test]
    fn the_head_hands_over_once_and_a_middle_waiter_wakes_nobody() {
        let queues = WaitQueues::<()>::new(3);
        let (a, b, c) = (
            queues.enqueue(()).unwrap(),
            queues.enqueue(()).unwrap(),
            queues.enqueue(()).unwrap(),
        );
        assert_eq!(
            queues.enqueue(()).err(),
            Some(FairError::QueueFull { max_waiters: 3 })
        );
        let (_, wa) = waker();
        let (cb, wb) = waker();
        let (cc, wc) = waker();
        assert!(a.poll_head(&mut Context::from_waker(&wa)).is_ready());
        assert!(b.poll_head(&mut Context::from_waker(&wb)).is_pending());
        assert!(c.poll_head(&mut Context::from_waker(&wc)).is_pending());
        // A second poll keeps one waker, not two.
        assert!(c.poll_head(&mut Context::from_waker(&wc)).is_pending());
        drop(b); // from the middle: nobody becomes the head
        assert_eq!((wakes(&cb), wakes(&cc)), (0, 0));
        drop(a); // the head: `c` is next, woken once
        assert_eq!(wakes(&cc), 1);
        assert!(c.poll_head(&mut Context::from_waker(&wc)).is_ready());
        drop(c);
        assert_eq!(wakes(&cc), 1);
        let state = lock(&queues.state);
        assert_eq!(state.waiting, 0);
        assert!(state.queues.is_empty());
    }

    #[test]
    fn keys_queue_apart_under_one_bound() {
        let queues = WaitQueues::<u8>::new(2);
        let (_, w) = waker();
        let a = queues.enqueue(1).unwrap();
        let b = queues.enqueue(2).unwrap();
        assert!(a.poll_head(&mut Context::from_waker(&w)).is_ready());
        assert!(b.poll_head(&mut Context::from_waker(&w)).is_ready());
        assert!(queues.enqueue(3).is_err());
        drop(a);
        assert_eq!(lock(&queues.state).queues.len(), 1);
        assert!(queues.enqueue(3).is_ok());
    }

    #[test]
    fn a_release_before_the_head_listens_is_not_lost() {
        let limiter = ConcurrencyLimiter::new(1).unwrap();
        let held = std::cell::RefCell::new(limiter.try_acquire());
        let (count, w) = waker();
        let _listening = Listening {
            signal: &limiter.released,
            owner: 1,
        };
        // The first try finds no permit; the holder drops it right then,
        // before the head listens, so the release wakes nobody.
        let take = || {
            let permit = limiter.try_acquire();
            if permit.is_none() {
                held.borrow_mut().take();
            }
            permit
        };
        let polled = poll_permit(&limiter.released, 1, &mut Context::from_waker(&w), &take);
        assert!(
            polled.is_ready(),
            "the retry after listening finds the permit"
        );
        assert_eq!(wakes(&count), 0);
        // A release while listening wakes the head (the first poll left it
        // listening: that release wakes it too, spuriously).
        drop(polled);
        assert_eq!(wakes(&count), 1);
        let _held = limiter.try_acquire().unwrap();
        let polled = poll_permit(&limiter.released, 1, &mut Context::from_waker(&w), &|| {
            limiter.try_acquire()
        });
        assert!(polled.is_pending());
        drop(_held);
        assert_eq!(wakes(&count), 2);
    }

    #[test]
    fn a_release_wakes_the_listener_only_while_it_listens() {
        let signal = ReleaseSignal::default();
        let (count, w) = waker();
        signal.notify();
        {
            let _listening = Listening {
                signal: &signal,
                owner: 1,
            };
            signal.listen(1, &w);
            signal.notify();
            signal.notify(); // the waker was taken: woken once
            assert_eq!(wakes(&count), 1);
            signal.listen(1, &w);
        }
        signal.notify();
        assert_eq!(wakes(&count), 1);
    }

    /// Two wrappers' heads on one bulkhead: one leaving must not stop the
    /// other being woken (a single waker slot, cleared by whichever head left,
    /// lost the other's wake-up).
    #[test]
    fn a_head_leaving_does_not_silence_another_wrappers_head() {
        let signal = ReleaseSignal::default();
        let (count_a, a) = waker();
        let (count_b, b) = waker();
        let leaving = Listening {
            signal: &signal,
            owner: 1,
        };
        signal.listen(1, &a);
        let _staying = Listening {
            signal: &signal,
            owner: 2,
        };
        signal.listen(2, &b);
        drop(leaving);
        signal.notify();
        assert_eq!((wakes(&count_a), wakes(&count_b)), (0, 1));
    }
}
