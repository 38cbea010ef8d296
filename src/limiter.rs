//! A direct (unkeyed) limiter: one cell, one algorithm, one clock.

use crate::admission::{Admission, Receipt, Stage, admit};
use crate::algorithm::Algorithm;
#[cfg(feature = "std")]
use crate::algorithm::live::LiveTokenBucket;
use crate::algorithm::not_yet::NotYet;
use crate::algorithm::switch::Reconfigure;
use crate::algorithm::token_bucket::TokenBucket;
use crate::algorithm::within_refund_horizon;
use crate::cell::Cell;
use crate::clock::Clock;
#[cfg(feature = "std")]
use crate::clock::RealClock;
use crate::decision::{Decision, KeyedDecision};
use crate::error::{AcquireError, QuotaError, check_permits};
use crate::quota::Quota;
#[cfg(feature = "std")]
use crate::reclaim::thread_slot;
#[cfg(feature = "std")]
use crate::tally::{ADMITTED, DENIED, Tally};
#[cfg(feature = "std")]
use alloc::boxed::Box;

/// A lock-free rate limiter for one stream of requests (one API, one client, one
/// outbound dependency). Share it by reference or in an `Arc`; every method takes
/// `&self`.
///
/// Each decision reads the clock once and runs one compare-and-swap on one
/// `AtomicU64`; a denial writes nothing.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Decision, ManualClock, Quota, RateLimiter};
///
/// let clock = ManualClock::new();
/// let limiter = RateLimiter::with_clock(Quota::new(3, 1, Duration::from_secs(1))?, clock.clone());
///
/// for left in [2, 1, 0] {
///     assert_eq!(limiter.try_acquire(), Decision::Allowed { remaining: left });
/// }
/// let denied = limiter.try_acquire();
/// assert_eq!(denied.retry_after().map(|r| r.duration()), Some(Duration::from_secs(1)));
///
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(limiter.remaining(), 2); // a peek spends nothing
/// assert!(limiter.try_acquire_n(2)?.is_allowed());
/// assert!(limiter.try_acquire_n(4).is_err()); // more than the bucket ever holds
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
// Aligned (and so sized) to the width crossbeam's `CachePadded` uses, 128 bytes
// on x86-64: two limiters side by side (in a `Vec`, a struct) never share a
// line, or a pair of lines the prefetcher fetches together. Two threads each
// on their own of two adjacent limiters ran 1.8x slower per decision without
// it (BENCHMARKS.md, "One direct limiter's size"). The word shares its line
// with the algorithm's parameters and the clock: every decision reads those
// anyway, and padding the word alone (256 bytes in all) was no faster.
#[cfg_attr(
    any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "powerpc64",
        target_arch = "arm64ec"
    ),
    repr(align(128))
)]
#[cfg_attr(
    not(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "powerpc64",
        target_arch = "arm64ec"
    )),
    repr(align(64))
)]
// Without `std` there is no default clock, and so no default algorithm
// either (a default must follow every parameter without one): a no_std
// limiter names both, `RateLimiter<TokenBucket, MyClock>`, which also
// compiles with `std`.
pub struct RateLimiter<
    #[cfg(feature = "std")] A = TokenBucket,
    #[cfg(not(feature = "std"))] A,
    #[cfg(feature = "std")] C = RealClock,
    #[cfg(not(feature = "std"))] C,
    M = Uncounted,
> {
    cell: Cell,
    algorithm: A,
    clock: C,
    /// Admitted and denied counts, if asked for ([`counted`](Self::counted)).
    counter: M,
}

/// A direct limiter's counters ([`RateLimiter::stats`]).
#[cfg(feature = "std")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DirectStats {
    /// Requests admitted.
    ///
    /// A request that several limits decide together (a
    /// [chain](crate::chain), a combined `tower::Limits` layer) is
    /// counted here only once all of them admitted it: one a later limit
    /// refused is not, though this limiter admitted it before its permits
    /// were given back.
    pub admitted: u64,
    /// Requests denied (a wait counts once, when its deadline refuses it;
    /// with several limits deciding together, only when this limiter is the
    /// one that refused).
    pub denied: u64,
}

/// How a direct limiter counts its decisions: [`Uncounted`] (the default, no
/// bytes and no instructions) or [`Counted`] (from
/// [`RateLimiter::counted`]). Sealed: these two are the kinds.
pub trait Counter: sealed::Sealed {
    /// Count one decision.
    #[doc(hidden)]
    fn count(&self, admitted: bool);
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Uncounted {}
    #[cfg(feature = "std")]
    impl Sealed for super::Counted {}
}

/// A direct limiter that counts nothing (the default).
#[derive(Clone, Copy, Debug, Default)]
pub struct Uncounted;

impl Counter for Uncounted {
    #[inline(always)]
    fn count(&self, _admitted: bool) {}
}

/// A direct limiter's admitted and denied counters: one cache-padded pair per
/// thread slot, each written only by its thread. Needs the `std` feature
/// (thread slots are thread-locals).
#[cfg(feature = "std")]
#[derive(Debug)]
pub struct Counted(Box<Tally>);

#[cfg(feature = "std")]
impl Counter for Counted {
    #[inline(always)]
    fn count(&self, admitted: bool) {
        self.0.count_outcome(admitted, thread_slot());
    }
}

#[cfg(feature = "std")]
impl RateLimiter {
    /// A token-bucket limiter for `quota` on the real clock.
    pub fn new(quota: Quota) -> RateLimiter {
        RateLimiter::with_clock(quota, RealClock::new())
    }
}

impl<C: Clock> RateLimiter<TokenBucket, C> {
    /// A token-bucket limiter for `quota` on `clock`
    /// ([`CoarseClock`](crate::CoarseClock) for speed,
    /// [`ManualClock`](crate::ManualClock) for tests).
    pub fn with_clock(quota: Quota, clock: C) -> RateLimiter<TokenBucket, C> {
        RateLimiter::from_parts(TokenBucket::new(quota), clock)
    }
}

#[cfg(feature = "std")]
impl RateLimiter<LiveTokenBucket> {
    /// A token-bucket limiter on the real clock whose quota can be changed
    /// while it serves ([`set_quota`](RateLimiter::set_quota)), up to a
    /// capacity of 65,535 (or `quota`'s, if larger; for more, build a
    /// [`LiveTokenBucket::with_ceiling`] and use
    /// [`from_parts`](RateLimiter::from_parts)).
    ///
    /// # Errors
    ///
    /// As [`LiveTokenBucket::new`].
    pub fn live(quota: Quota) -> Result<RateLimiter<LiveTokenBucket>, QuotaError> {
        Ok(RateLimiter::from_parts(
            LiveTokenBucket::new(quota)?,
            RealClock::new(),
        ))
    }
}

impl<A: Reconfigure, C: Clock, M: Counter> RateLimiter<A, C, M> {
    /// Change the quota while the limiter serves, from any thread: every
    /// live form ([`Reconfigure`]: [`LiveTokenBucket`](crate::LiveTokenBucket),
    /// [`LiveGcra`](crate::LiveGcra), [`LiveFixedWindow`](crate::LiveFixedWindow),
    /// [`LiveSlidingWindow`](crate::LiveSlidingWindow)). The state is
    /// converted by the form's stated rule (a bucket keeps what it holds up
    /// to the new capacity, and the new rate refills from this moment);
    /// decisions take no lock meanwhile, and each is decided wholly by the
    /// old quota or wholly by the new.
    ///
    /// ```
    /// use turnstile::{Quota, RateLimiter};
    ///
    /// let limiter = RateLimiter::live(Quota::per_second(100)?)?;
    /// assert!(limiter.try_acquire_n(50)?.is_allowed());
    /// limiter.set_quota(Quota::per_second(20)?)?;
    /// assert_eq!(limiter.quota(), Quota::per_second(20)?);
    /// assert!(limiter.remaining() <= 20);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As the form's constructor ([`LiveTokenBucket::with_ceiling`](crate::LiveTokenBucket::with_ceiling),
    /// [`LiveFixedWindow::with_ceiling`](crate::LiveFixedWindow::with_ceiling),
    /// [`LiveSlidingWindow::with_ceiling`](crate::LiveSlidingWindow::with_ceiling)):
    /// the quota is refused, and nothing changes, when it is above the
    /// form's ceiling or does not fit its word.
    pub fn set_quota(&self, quota: A::Quota) -> Result<(), QuotaError> {
        self.algorithm.reconfigure(quota, &mut |convert| {
            let now = self.clock.now();
            self.cell.convert(|word| convert(word, now));
        })
    }

    /// The quota in force.
    pub fn quota(&self) -> A::Quota {
        self.algorithm.quota()
    }
}

impl<A: Algorithm, C: Clock> RateLimiter<A, C> {
    /// A limiter running `algorithm` on `clock`, starting fresh.
    pub fn from_parts(algorithm: A, clock: C) -> RateLimiter<A, C> {
        RateLimiter {
            cell: Cell::new(algorithm.fresh()),
            algorithm,
            clock,
            counter: Uncounted,
        }
    }

    /// This limiter, counting admissions and denials for
    /// [`stats`](RateLimiter::stats). Needs the `std` feature.
    ///
    /// Off by default for a direct limiter: the counters are one cache-padded
    /// pair per thread slot (about 8 KiB), against the limiter's 128 bytes,
    /// and a limiter may be one of millions. A counted limiter's type says so
    /// (`RateLimiter<A, C, Counted>`); an uncounted one carries no counter and
    /// runs no counting instruction. Each thread adds to its own pair with a
    /// plain load and store, so counting adds no locked instruction to a
    /// decision. (Keyed limiters and gates always count.)
    ///
    /// ```
    /// use turnstile::{Quota, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Quota::per_minute(2)?).counted();
    /// for _ in 0..3 {
    ///     let _ = limiter.try_acquire();
    /// }
    /// let stats = limiter.stats();
    /// assert_eq!((stats.admitted, stats.denied), (2, 1));
    /// # Ok::<(), turnstile::QuotaError>(())
    /// ```
    #[cfg(feature = "std")]
    pub fn counted(self) -> RateLimiter<A, C, Counted> {
        RateLimiter {
            cell: self.cell,
            algorithm: self.algorithm,
            clock: self.clock,
            counter: Counted(Box::new(Tally::new())),
        }
    }
}

#[cfg(feature = "std")]
impl<A, C> RateLimiter<A, C, Counted> {
    /// The counters, summed over the threads that decided (each read in turn,
    /// not at one instant).
    pub fn stats(&self) -> DirectStats {
        DirectStats {
            admitted: self.counter.0.sum(ADMITTED),
            denied: self.counter.0.sum(DENIED),
        }
    }
}

impl<A: Algorithm, C: Clock, M: Counter> RateLimiter<A, C, M> {
    /// Count one decision, if counting.
    #[inline(always)]
    pub(crate) fn count(&self, admitted: bool) {
        self.counter.count(admitted);
    }

    /// Ask for one permit.
    #[inline(always)]
    pub fn try_acquire(&self) -> Decision {
        // Every algorithm's capacity is at least 1, so one permit is always a
        // valid request.
        let decision = self.cell.apply(&self.algorithm, self.clock.now(), 1);
        self.count(decision.is_allowed());
        decision
    }

    /// Ask for one permit, and leave a denial's wait to be worked out only if
    /// asked for ([`NotYet::retry_after`]): `Ok` with the permits left, or
    /// `Err`. The same decision as [`try_acquire`](Self::try_acquire), with a
    /// cheaper denial.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ManualClock, Quota, RateLimiter};
    ///
    /// let clock = ManualClock::new();
    /// let limiter = RateLimiter::with_clock(Quota::new(1, 1, Duration::from_secs(1))?, clock.clone());
    /// assert_eq!(limiter.check().ok(), Some(0));
    /// clock.advance(Duration::from_millis(400));
    /// let not_yet = limiter.check().unwrap_err();
    /// assert_eq!(not_yet.retry_after().duration(), Duration::from_millis(600));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn check(&self) -> Result<u32, NotYet<'_, A>> {
        let now = self.clock.now();
        let admitted = self.cell.admit(&self.algorithm, now, 1);
        self.count(admitted.is_ok());
        admitted.map_err(|word| NotYet::rate(&self.algorithm, word, now, 1))
    }

    /// Ask for `n` permits, all or nothing.
    ///
    /// # Errors
    ///
    /// [`AcquireError::ZeroPermits`] for `n = 0` (use [`remaining`](Self::remaining)
    /// to look without spending), and [`AcquireError::InsufficientCapacity`] when
    /// `n` exceeds the capacity, since such a request can never succeed. Neither
    /// reads the clock or touches the bucket.
    #[inline]
    pub fn try_acquire_n(&self, n: u32) -> Result<Decision, AcquireError> {
        check_permits(n, self.algorithm.capacity())?;
        let decision = self.cell.apply(&self.algorithm, self.clock.now(), n);
        self.count(decision.is_allowed());
        Ok(decision)
    }

    /// Ask for one permit, keeping what is needed to give it back: `Ok` with
    /// an [`Admission`] to [`refund`](Admission::refund) (or drop, keeping the
    /// permit spent), or `Err` with the denial. The same decision as
    /// [`try_acquire`](Self::try_acquire), counted the same.
    ///
    /// For counting only some outcomes: admit every attempt, and refund the
    /// ones that should not count (a successful login, a cache hit).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ManualClock, Quota, RateLimiter};
    ///
    /// let clock = ManualClock::new();
    /// // 3 failures per minute.
    /// let failures = RateLimiter::with_clock(Quota::new(3, 3, Duration::from_secs(60))?, clock);
    /// for succeeded in [true, true, false, true] {
    ///     let attempt = failures.try_acquire_refundable().expect("under the limit");
    ///     if succeeded {
    ///         assert!(attempt.refund()); // a success does not count
    ///     }
    /// }
    /// assert_eq!(failures.remaining(), 2); // one failure counted
    /// # Ok::<(), turnstile::QuotaError>(())
    /// ```
    pub fn try_acquire_refundable(&self) -> Result<Admission<&Self>, Decision> {
        admit(self, 1).map_err(direct)
    }

    /// [`try_acquire_n`](Self::try_acquire_n), keeping what is needed to give
    /// the permits back ([`try_acquire_refundable`](Self::try_acquire_refundable)):
    /// `Ok(Err(_))` is a denial.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n): `n = 0`, or `n` above the
    /// capacity.
    pub fn try_acquire_n_refundable(
        &self,
        n: u32,
    ) -> Result<Result<Admission<&Self>, Decision>, AcquireError> {
        check_permits(n, self.algorithm.capacity())?;
        Ok(admit(self, n).map_err(direct))
    }

    /// The permits available now, without taking any.
    pub fn remaining(&self) -> u32 {
        self.algorithm.remaining(self.cell.load(), self.clock.now())
    }

    /// The most permits one request can get.
    pub fn capacity(&self) -> u32 {
        self.algorithm.capacity()
    }

    /// The algorithm and its parameters.
    pub fn algorithm(&self) -> &A {
        &self.algorithm
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    pub(crate) fn cell(&self) -> &Cell {
        &self.cell
    }
}

/// A direct limiter's denial, from the stage interface's keyed form (a
/// direct limiter has no key bound).
fn direct(denied: KeyedDecision) -> Decision {
    match denied {
        KeyedDecision::Allowed { remaining } => Decision::Allowed { remaining },
        KeyedDecision::Denied { retry_after } | KeyedDecision::KeyLimit { retry_after } => {
            Decision::Denied { retry_after }
        }
    }
}

impl<A: Algorithm, C: Clock, M: Counter> RateLimiter<A, C, M> {
    /// [`take`](Stage::take) at `now`, a reading of a clock whose readings
    /// are this limiter's ([`Clock::shared_readings`]): a reading of any age
    /// is sound, as for a decision whose compare-and-swap is retried.
    #[inline]
    pub(crate) fn take_at(&self, n: u32, now: u64) -> (KeyedDecision, Option<Receipt>) {
        self.take_counted(n, now, true)
    }

    /// [`take_at`](Self::take_at) for a stage of several deciding as one
    /// ([`Stage::take_pending`]): a denial is counted at once, an admission
    /// only by [`count_admission`](Stage::count_admission).
    #[inline]
    pub(crate) fn take_pending_at(&self, n: u32, now: u64) -> (KeyedDecision, Option<Receipt>) {
        let taken = self.take_counted(n, now, false);
        if !taken.0.is_allowed() {
            self.count(false);
        }
        taken
    }

    /// [`take_at`](Self::take_at), counted in the stats when `counted` (not
    /// for a combined layer settling a response's cost, which is no decision
    /// on a request).
    #[inline]
    pub(crate) fn take_counted(
        &self,
        n: u32,
        now: u64,
        counted: bool,
    ) -> (KeyedDecision, Option<Receipt>) {
        let epoch = self.algorithm().epoch();
        let (decision, written) = self.cell().take(self.algorithm(), now, n);
        if counted {
            self.count(decision.is_allowed());
        }
        (
            decision.into(),
            written.map(|written| Receipt {
                written,
                n,
                epoch,
                at: now,
                owner: self.owner(),
            }),
        )
    }

    /// Who this limiter's receipts belong to: its word's address, so that a
    /// receipt given to another limiter (whose word can be this one's bit
    /// for bit) declines. A limiter moved after an admission declines its
    /// receipt too: it keeps the permits spent, as a declined refund does.
    /// (A number of the limiter's own would name it wherever it moves, but
    /// the default limiter has no byte to spare for one: 128 bytes would
    /// become 256.)
    #[inline(always)]
    fn owner(&self) -> u64 {
        core::ptr::from_ref(self.cell()) as usize as u64
    }
}

impl<A: Algorithm, C: Clock, M: Counter> crate::admission::sealed::Sealed for RateLimiter<A, C, M> {}

impl<A: Algorithm, C: Clock, M: Counter> Stage for RateLimiter<A, C, M> {
    fn capacity(&self) -> u32 {
        RateLimiter::capacity(self)
    }

    #[inline]
    fn take_within(&self, n: u32) -> (KeyedDecision, Option<Receipt>) {
        self.take_at(n, self.clock().now())
    }

    #[inline]
    fn take_pending(&self, n: u32) -> (KeyedDecision, Option<Receipt>) {
        self.take_pending_at(n, self.clock().now())
    }

    #[inline]
    fn count_admission(&self) {
        self.count(true);
    }

    fn peek_within(&self, n: u32) -> KeyedDecision {
        let now = self.clock().now();
        self.algorithm().decide(self.cell().load(), now, n).0.into()
    }

    fn give_back(&self, receipt: Receipt) -> bool {
        if receipt.owner != self.owner() || !within_refund_horizon(receipt.at, self.clock().now()) {
            return false;
        }
        let cell = self.cell();
        self.algorithm()
            .refund_unless_changed(receipt.epoch, &mut || {
                cell.refund(self.algorithm(), receipt.written, receipt.n)
            })
    }
}

/// The direct limiter as the no_std build has it (`cargo test
/// --no-default-features --lib` runs these too): on a clock of the
/// application's own, with no default parameter.
#[cfg(all(test, not(turnstile_loom)))]
mod tests {
    use core::num::NonZeroU64;
    use core::time::Duration;

    use super::*;
    use crate::algorithm::fixed_window::FixedWindow;
    use crate::algorithm::gcra::Gcra;
    // Named here: the module imports it only with `std`, and the tests run
    // without it too.
    use crate::algorithm::live::LiveTokenBucket;
    use crate::algorithm::sliding_window::SlidingWindow;
    use crate::algorithm::warm_up::WarmUp;
    use crate::clock::TickClock;
    use crate::sync::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// A 1 MHz tick counter and a clock over it.
    fn ticking() -> (Arc<AtomicU64>, TickClock<impl Fn() -> u64 + Send + Sync>) {
        let ticks = Arc::new(AtomicU64::new(0));
        let source = ticks.clone();
        let hz = NonZeroU64::new(1_000_000).expect("a million is not zero");
        // Relaxed: the test moves the counter on its own thread.
        (
            ticks,
            TickClock::new(hz, move || source.load(Ordering::Relaxed)),
        )
    }

    /// Spend until denied at tick 0; the denial's wait, in whole ticks,
    /// rounded up, is when the next permit comes: not a tick before.
    fn waits_as_it_says<A: Algorithm>(algorithm: A) {
        let (ticks, clock) = ticking();
        let limiter: RateLimiter<A, _> = RateLimiter::from_parts(algorithm, clock);
        let capacity = limiter.capacity();
        let mut admitted = 0;
        let wait = loop {
            match limiter.try_acquire() {
                Decision::Allowed { .. } => admitted += 1,
                Decision::Denied { retry_after } => break retry_after.duration(),
            }
            assert!(
                admitted <= capacity,
                "admitted {admitted} above the capacity {capacity}"
            );
        };
        assert!(admitted >= 1, "a fresh limiter admits");
        assert!(!wait.is_zero());
        let due = u64::try_from(wait.as_nanos().div_ceil(1_000)).expect("a wait of seconds");
        // Relaxed: as in `ticking`.
        ticks.store(due - 1, Ordering::Relaxed);
        // `due - 1` ticks are less than the wait.
        assert!(
            limiter.check().is_err(),
            "admitted before its wait of {wait:?}"
        );
        ticks.store(due, Ordering::Relaxed);
        assert!(
            limiter.try_acquire().is_allowed(),
            "denied after its wait of {wait:?}"
        );
    }

    #[test]
    fn every_algorithm_waits_as_it_says_on_a_tick_clock() {
        let quota = Quota::new(3, 1, Duration::from_millis(7)).expect("a valid quota");
        waits_as_it_says(TokenBucket::new(quota));
        waits_as_it_says(Gcra::new(quota));
        waits_as_it_says(LiveTokenBucket::new(quota).expect("a valid live quota"));
        waits_as_it_says(WarmUp::new(quota, Duration::from_millis(70), 3.0).expect("valid"));
        waits_as_it_says(FixedWindow::new(3, Duration::from_millis(7)).expect("valid"));
        waits_as_it_says(SlidingWindow::new(3, Duration::from_millis(7)).expect("valid"));
    }

    #[test]
    fn a_refund_gives_the_permit_back() {
        let (_ticks, clock) = ticking();
        let quota = Quota::new(2, 1, Duration::from_secs(1)).expect("a valid quota");
        let limiter: RateLimiter<TokenBucket, _> = RateLimiter::with_clock(quota, clock);
        let before = limiter.remaining();
        let admission = limiter
            .try_acquire_refundable()
            .expect("a full bucket admits");
        assert_eq!(limiter.remaining(), before - 1);
        assert!(admission.refund());
        assert_eq!(limiter.remaining(), before);
        assert_eq!(
            limiter.try_acquire_n(quota.capacity() + 1),
            Err(AcquireError::InsufficientCapacity {
                requested: quota.capacity() + 1,
                capacity: quota.capacity(),
            })
        );
    }

    /// Quota changes from many threads at once, with decisions between them:
    /// the writer's lock (a spin flag without `std`) lets one change through
    /// at a time, so every change is counted and the last one is in force.
    #[test]
    fn concurrent_quota_changes_each_take_effect() {
        const THREADS: u64 = 4;
        const CHANGES: u64 = 200;
        let (ticks, clock) = ticking();
        let quotas = [
            Quota::new(10, 1, Duration::from_millis(10)).expect("a valid quota"),
            Quota::new(40, 4, Duration::from_millis(5)).expect("a valid quota"),
        ];
        let bucket = LiveTokenBucket::new(quotas[0]).expect("a valid live quota");
        let limiter = RateLimiter::from_parts(bucket, clock);
        let start = std::sync::Barrier::new(THREADS as usize);
        std::thread::scope(|s| {
            for thread in 0..THREADS {
                let (limiter, ticks, start) = (&limiter, &ticks, &start);
                s.spawn(move || {
                    start.wait();
                    for i in 0..CHANGES {
                        let quota = quotas[usize::from((thread + i) % 2 == 1)];
                        limiter.set_quota(quota).expect("below the ceiling");
                        // Relaxed: a counter, moved by every thread.
                        ticks.fetch_add(100, Ordering::Relaxed);
                        let _ = limiter.try_acquire();
                    }
                });
            }
        });
        assert_eq!(limiter.algorithm().changes(), THREADS * CHANGES);
        limiter.set_quota(quotas[1]).expect("below the ceiling");
        assert_eq!(limiter.quota(), quotas[1]);
        assert!(limiter.remaining() <= quotas[1].capacity());
    }
}
