//! One limiter's admission and what gives it back: the [`Stage`] every limiter
//! that can refund implements, the [`Receipt`] of a take, and
//! [`Admission`]. Below the limiters (which return admissions) and the
//! [chain](crate::chain) (which runs several stages as one).

use core::fmt;

use crate::decision::KeyedDecision;
use crate::error::{AcquireError, check_permits};

/// Only the crate's own types are stages.
pub(crate) mod sealed {
    pub trait Sealed {}
}

/// Proof of an admission by one stage: what it needs to give the permits back.
///
/// Neither `Clone` nor `Copy`: a receipt is given back at most once, so an
/// admission is never refunded twice. (Held together with its stage, it is an
/// [`Admission`].)
#[derive(PartialEq, Eq)]
#[must_use = "a receipt is what gives the permits back; dropping it keeps them spent"]
pub struct Receipt {
    /// The word the admission wrote.
    pub(crate) written: u64,
    pub(crate) n: u32,
    /// The stage's count of parameter changes, read before the take
    /// ([`Algorithm::epoch`]): a refund after any change declines.
    pub(crate) epoch: u64,
    /// A clock reading no later than the admission's: a refund
    /// [`REFUND_HORIZON_NANOS`](crate::algorithm::REFUND_HORIZON_NANOS) after
    /// it declines.
    pub(crate) at: u64,
    /// The stage that took it (a direct limiter's word; a keyed limiter's
    /// table and the key's hash): given to another stage, it declines.
    pub(crate) owner: u64,
}

impl fmt::Debug for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the owner: for a direct limiter, an address.
        f.debug_struct("Receipt")
            .field("written", &self.written)
            .field("n", &self.n)
            .field("epoch", &self.epoch)
            .field("at", &self.at)
            .finish_non_exhaustive()
    }
}

/// One stage of a chain: a [`RateLimiter`](crate::RateLimiter), or one key of a [`KeyedLimiter`](crate::KeyedLimiter)
/// ([`KeyedLimiter::stage`](crate::KeyedLimiter::stage)). Sealed: the chain's guarantees rest on every
/// stage's refund never giving back more than its spend took.
pub trait Stage: sealed::Sealed {
    /// The most permits one request can get from this stage.
    fn capacity(&self) -> u32;

    /// Ask for `n` permits, returning the decision and, when admitted, the
    /// receipt to give them back.
    ///
    /// # Errors
    ///
    /// [`AcquireError::ZeroPermits`] for `n = 0`, and
    /// [`AcquireError::InsufficientCapacity`] when `n` is above
    /// [`capacity`](Stage::capacity) (no wait would admit it). Neither
    /// touches the stage.
    ///
    /// ```
    /// use turnstile::chain::Stage;
    /// use turnstile::{AcquireError, Quota, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Quota::per_second(5)?);
    /// let (decision, receipt) = limiter.take(2)?;
    /// assert!(decision.is_allowed() && receipt.is_some());
    /// assert_eq!(limiter.take(0), Err(AcquireError::ZeroPermits));
    /// assert_eq!(
    ///     limiter.take(6),
    ///     Err(AcquireError::InsufficientCapacity { requested: 6, capacity: 5 })
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    fn take(&self, n: u32) -> Result<(KeyedDecision, Option<Receipt>), AcquireError> {
        check_permits(n, self.capacity())?;
        Ok(self.take_within(n))
    }

    /// The decision `n` permits would get now, taking nothing.
    ///
    /// # Errors
    ///
    /// As [`take`](Stage::take).
    fn peek(&self, n: u32) -> Result<KeyedDecision, AcquireError> {
        check_permits(n, self.capacity())?;
        Ok(self.peek_within(n))
    }

    /// [`take`](Stage::take) for `n` the caller has checked (`1 <= n <=
    /// capacity()`).
    #[doc(hidden)]
    fn take_within(&self, n: u32) -> (KeyedDecision, Option<Receipt>);

    /// [`take_within`](Stage::take_within) for a stage of several deciding
    /// as one (a [chain](crate::chain)): a denial is counted in the stage's
    /// stats at once, an admission only when
    /// [`count_admission`](Stage::count_admission) says that every stage
    /// admitted. (A count taken back instead would make the stats go down.)
    #[doc(hidden)]
    fn take_pending(&self, n: u32) -> (KeyedDecision, Option<Receipt>);

    /// Count the admission of a [`take_pending`](Stage::take_pending) in the
    /// stage's stats: the whole it was part of admitted the request.
    #[doc(hidden)]
    fn count_admission(&self);

    /// [`peek`](Stage::peek) for `n` the caller has checked.
    #[doc(hidden)]
    fn peek_within(&self, n: u32) -> KeyedDecision;

    /// Give back what an admission took: `true` when the permits went back
    /// exactly, `false` when the stage declined (see the module's notes on
    /// when a refund can be exact) and keeps them spent.
    ///
    /// Only the stage that took the receipt takes it back: another key's, or
    /// another limiter's, declines (their words can be alike bit for bit).
    /// A direct limiter is named by where it lives: one moved since the take
    /// (into a `Vec` that grew, into an `Arc`) declines too, and a receipt
    /// must not outlive its limiter, since a new limiter made at the same
    /// address would take it. [`Admission`] and the chain's admissions
    /// borrow their stage, so neither can happen to them.
    fn give_back(&self, receipt: Receipt) -> bool;
}

impl<T: Stage + ?Sized> sealed::Sealed for &T {}

/// A reference to a stage is the same stage (so an [`Admission`] can borrow
/// its limiter).
impl<T: Stage + ?Sized> Stage for &T {
    fn capacity(&self) -> u32 {
        (**self).capacity()
    }

    #[inline]
    fn take_within(&self, n: u32) -> (KeyedDecision, Option<Receipt>) {
        (**self).take_within(n)
    }

    #[inline]
    fn take_pending(&self, n: u32) -> (KeyedDecision, Option<Receipt>) {
        (**self).take_pending(n)
    }

    #[inline]
    fn count_admission(&self) {
        (**self).count_admission();
    }

    fn peek_within(&self, n: u32) -> KeyedDecision {
        (**self).peek_within(n)
    }

    fn give_back(&self, receipt: Receipt) -> bool {
        (**self).give_back(receipt)
    }
}

/// An admission that can be given back: the stage that admitted (a borrowed
/// [`RateLimiter`](crate::RateLimiter), or one key of a [`KeyedLimiter`](crate::KeyedLimiter)) and its [`Receipt`].
///
/// From [`RateLimiter::try_acquire_refundable`](crate::RateLimiter::try_acquire_refundable),
/// [`KeyedLimiter::try_acquire_refundable`](crate::KeyedLimiter::try_acquire_refundable) and their `_n` forms. To count
/// only some outcomes (failed logins, say), admit every attempt and
/// [`refund`](Admission::refund) the ones that should not count.
///
/// A refund is exact or declines; it never gives back more than the admission
/// took (see [`refund`](Admission::refund)). Dropping an admission keeps its
/// permits spent. It is neither `Clone` nor `Copy`, so it refunds at most once.
#[must_use = "dropping an admission keeps its permits spent; call `refund` to give them back"]
pub struct Admission<T: Stage> {
    stage: T,
    /// `None` when the admission wrote nothing (so took nothing).
    receipt: Option<Receipt>,
    n: u32,
    remaining: u32,
}

impl<T: Stage> Admission<T> {
    /// Permits the admission took.
    pub fn permits(&self) -> u32 {
        self.n
    }

    /// Permits left in the stage right after the admission.
    pub fn remaining(&self) -> u32 {
        self.remaining
    }

    /// Give the permits back: `true` when they went back exactly, so a request
    /// for them now is admitted as if this admission had never happened;
    /// `false` when the stage declined, keeping them spent (never more than
    /// the admission took is given back). Exact:
    ///
    /// - **fixed window**: until a decision has counted in a later window
    ///   (the permits no longer count then, and the refund declines);
    /// - **sliding window**: until a decision has counted two windows or more
    ///   after the one the permits were counted in (they weigh nothing then,
    ///   and the refund declines);
    /// - **token bucket**: when no refill was recorded on the word since the
    ///   admission and either the refund fills the bucket or no later admission
    ///   still stands on the word;
    /// - **GCRA**: when no other decision changed the word since the admission;
    /// - **live token bucket**: as the token bucket, when the quota has not
    ///   been changed since the admission (after any change it declines: the
    ///   change settled the bucket with the permits spent);
    /// - **one key of a keyed limiter**: as its algorithm, on the key's word.
    ///   A key evicted since (its word fresh-equivalent, the permits spent or
    ///   not) declines: while it is not held, and once it is created again
    ///   (its new word is a later one, on which every algorithm declines,
    ///   unless the clock was set back behind the admission's reading
    ///   between the eviction and the new word: see
    ///   [`ManualClock::set`](crate::ManualClock::set)).
    ///
    /// Whatever the algorithm, a refund asked when the clock reads `2^45` µs
    /// (1.1 years) or more past the admission's reading declines: a word
    /// keeps its time modulo a span (at least `2^47` µs), so after that long
    /// a later word could pass for the one the admission wrote.
    ///
    /// The limiter's admitted count is not changed: it counted the decision.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ManualClock, Quota, RateLimiter};
    ///
    /// let clock = ManualClock::new();
    /// let limiter = RateLimiter::with_clock(Quota::new(1, 1, Duration::from_secs(60))?, clock);
    /// let admission = limiter.try_acquire_refundable().expect("a full bucket admits");
    /// assert!(limiter.try_acquire().is_denied());
    /// assert!(admission.refund());
    /// assert!(limiter.try_acquire().is_allowed()); // at once
    /// # Ok::<(), turnstile::QuotaError>(())
    /// ```
    pub fn refund(self) -> bool {
        // An admission that wrote nothing took nothing: nothing is owed.
        self.receipt
            .is_none_or(|receipt| self.stage.give_back(receipt))
    }
}

impl<T: Stage + fmt::Debug> fmt::Debug for Admission<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("stage", &self.stage)
            .field("permits", &self.n)
            .field("remaining", &self.remaining)
            .finish()
    }
}

/// `stage`'s decision for `n` permits (checked by the caller: `1 <= n <=
/// capacity()`) as an [`Admission`], or the denial.
pub(crate) fn admit<T: Stage>(stage: T, n: u32) -> Result<Admission<T>, KeyedDecision> {
    match stage.take_within(n) {
        (KeyedDecision::Allowed { remaining }, receipt) => Ok(Admission {
            stage,
            receipt,
            n,
            remaining,
        }),
        (denied, _) => Err(denied),
    }
}
