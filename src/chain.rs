//! Several limiters deciding as one: a request is admitted only if every stage
//! admits it, and a denial anywhere leaves no permit taken anywhere.
//!
//! ```
//! use std::time::Duration;
//! use turnstile::{chain, KeyedLimiter, ManualClock, Quota, RateLimiter};
//!
//! let clock = ManualClock::new();
//! // Each key: 2 at once, one more every second. All keys together: 3 at once.
//! let per_key = KeyedLimiter::<String>::builder(Quota::new(2, 1, Duration::from_secs(1))?)
//!     .clock(clock.clone())
//!     .build()?;
//! let global = RateLimiter::with_clock(Quota::new(3, 1, Duration::from_secs(2))?, clock.clone());
//!
//! let alice = chain::try_acquire(&[&per_key.stage("alice"), &global]);
//! assert!(alice.is_allowed());
//! assert!(chain::try_acquire(&[&per_key.stage("alice"), &global]).is_allowed());
//! assert!(chain::try_acquire(&[&per_key.stage("bob"), &global]).is_allowed());
//!
//! // Bob's own bucket admits, the global one is empty: bob's token goes back.
//! let denied = chain::try_acquire(&[&per_key.stage("bob"), &global]);
//! assert_eq!(denied.denied_by(), Some(1));
//! assert_eq!(denied.decision().retry_after().unwrap().duration(), Duration::from_secs(2));
//! assert_eq!(per_key.remaining("bob"), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What is atomic and what is not
//!
//! Each stage's decision is one compare-and-swap on its own word, atomic as
//! always. The chain as a whole is **not** one atomic transaction: stages are
//! asked in order, and when stage `i` denies, the permits stages `0..i` took are
//! given back, each by one more compare-and-swap (the algorithm's
//! [`refund`](crate::Algorithm::refund), the inverse of its spend). So:
//!
//! - **Never over-admission.** A refund never leaves a stage admitting more
//!   than if it had not been asked; one admitted chain is counted once in each
//!   stage.
//! - **No double counting where a refund can be exact**, which is when it is
//!   known what the stage owes: always for the fixed and sliding windows (a
//!   count goes back into the window it was counted in; nothing is owed once
//!   that window has passed); for the token bucket when the refund fills the
//!   bucket, or when no refill was recorded and no other admission still stands
//!   on the word since the take (otherwise a refill may have been dropped at
//!   capacity, or the refill grid this admission started may have been used by
//!   later ones); for GCRA when no other decision moved the stage's word in
//!   between (time may have drained the meter through the spend, and its one
//!   number cannot tell). Otherwise, rare on a chain that runs in nanoseconds,
//!   the permits stay spent.
//!   .NET's `ChainedRateLimiter` keeps what the earlier limiters granted
//!   whenever a later one refuses, so a refused request always uses up the
//!   caller's own allowance.
//! - **Transient under-admission.** Between a stage's take and its refund
//!   (nanoseconds, no lock held), a concurrent request may see that stage's
//!   permits as spent and be denied. Order stages from the most to the least
//!   likely to deny (usually the per-key stage first) to keep refunds rare.
//!
//! The retry-after of a denial is the **longest** of every denying stage's: the
//! stage that denied, and each later stage asked without taking anything, so a
//! client that waits that long is not refused by a stage it never reached. A
//! later keyed stage whose key is new and whose key bound is full answers with
//! the bound's wait ([`KeyedDecision::KeyLimit`]), after which every key left
//! idle is sweepable.
//!
//! An admitted chain can be given back later, under the same rules, with
//! [`try_acquire_refundable`] and [`ChainAdmission::refund`]; one limiter's
//! admission with [`Admission::refund`].

use core::borrow::Borrow;
use core::fmt;
use core::hash::{BuildHasher, Hash};

use crate::algorithm::{Algorithm, within_refund_horizon};
use crate::clock::Clock;
use crate::decision::KeyedDecision;
use crate::error::AcquireError;
use crate::keyed::KeyedLimiter;
use crate::limiter::{Counter, RateLimiter, check_permits};

mod sealed {
    pub trait Sealed {}
}

/// Proof of an admission by one stage: what it needs to give the permits back.
///
/// Neither `Clone` nor `Copy`: a receipt is given back at most once, so an
/// admission is never refunded twice. (Held together with its stage, it is an
/// [`Admission`].)
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a receipt is what gives the permits back; dropping it keeps them spent"]
pub struct Receipt {
    /// The word the admission wrote.
    written: u64,
    n: u32,
    /// The stage's count of parameter changes, read before the take
    /// ([`Algorithm::epoch`]): a refund after any change declines.
    epoch: u64,
    /// A clock reading no later than the admission's: a refund
    /// [`REFUND_HORIZON_NANOS`](crate::algorithm::REFUND_HORIZON_NANOS) after
    /// it declines.
    at: u64,
}

/// One stage of a chain: a [`RateLimiter`], or one key of a [`KeyedLimiter`]
/// ([`KeyedLimiter::stage`]). Sealed: the chain's guarantees rest on every
/// stage's refund never giving back more than its spend took.
pub trait Stage: sealed::Sealed {
    /// The most permits one request can get from this stage.
    fn capacity(&self) -> u32;

    /// Ask for `n` permits (`1 <= n <= capacity()`), returning the decision and,
    /// when admitted, the receipt to give them back.
    fn take(&self, n: u32) -> (KeyedDecision, Option<Receipt>);

    /// The decision `n` permits would get now, taking nothing.
    fn peek(&self, n: u32) -> KeyedDecision;

    /// Give back what an admission took: `true` when the permits went back
    /// exactly, `false` when the stage declined (see the module's notes on
    /// when a refund can be exact) and keeps them spent.
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
    fn take(&self, n: u32) -> (KeyedDecision, Option<Receipt>) {
        (**self).take(n)
    }

    fn peek(&self, n: u32) -> KeyedDecision {
        (**self).peek(n)
    }

    fn give_back(&self, receipt: Receipt) -> bool {
        (**self).give_back(receipt)
    }
}

impl<A: Algorithm, C: Clock, M: Counter> sealed::Sealed for RateLimiter<A, C, M> {}

impl<A: Algorithm, C: Clock, M: Counter> Stage for RateLimiter<A, C, M> {
    fn capacity(&self) -> u32 {
        RateLimiter::capacity(self)
    }

    #[inline]
    fn take(&self, n: u32) -> (KeyedDecision, Option<Receipt>) {
        let epoch = self.algorithm().epoch();
        let now = self.clock().now();
        let (decision, written) = self.cell().take(self.algorithm(), now, n);
        self.count(decision.is_allowed());
        (
            decision.into(),
            written.map(|written| Receipt {
                written,
                n,
                epoch,
                at: now,
            }),
        )
    }

    fn peek(&self, n: u32) -> KeyedDecision {
        let now = self.clock().now();
        self.algorithm().decide(self.cell().load(), now, n).0.into()
    }

    fn give_back(&self, receipt: Receipt) -> bool {
        if !within_refund_horizon(receipt.at, self.clock().now()) {
            return false;
        }
        let cell = self.cell();
        self.algorithm()
            .refund_unless_changed(receipt.epoch, &mut || {
                cell.refund(self.algorithm(), receipt.written, receipt.n)
            })
    }
}

/// One key of a [`KeyedLimiter`] as a chain stage ([`KeyedLimiter::stage`]).
pub struct KeyedStage<'a, K, Q: ?Sized, A, C, S> {
    limiter: &'a KeyedLimiter<K, A, C, S>,
    key: &'a Q,
}

impl<'a, K, A, C, S> KeyedLimiter<K, A, C, S> {
    /// `key`'s limit as a stage of a [chain](crate::chain).
    pub fn stage<Q>(&'a self, key: &'a Q) -> KeyedStage<'a, K, Q, A, C, S>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        KeyedStage { limiter: self, key }
    }
}

impl<K, Q, A, C, S> sealed::Sealed for KeyedStage<'_, K, Q, A, C, S> where Q: ?Sized {}

impl<K, Q, A, C, S> Stage for KeyedStage<'_, K, Q, A, C, S>
where
    K: Hash + Eq + Borrow<Q>,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    A: Algorithm,
    C: Clock,
    S: BuildHasher,
{
    fn capacity(&self) -> u32 {
        self.limiter.algorithm().capacity()
    }

    #[inline]
    fn take(&self, n: u32) -> (KeyedDecision, Option<Receipt>) {
        // The limiter reads the clock itself, and says when.
        let epoch = self.limiter.algorithm().epoch();
        let (decision, written, at) = self.limiter.take(self.key, n);
        (
            decision,
            written.map(|written| Receipt {
                written,
                n,
                epoch,
                at,
            }),
        )
    }

    fn peek(&self, n: u32) -> KeyedDecision {
        self.limiter.peek(self.key, n)
    }

    fn give_back(&self, receipt: Receipt) -> bool {
        let (limiter, key) = (self.limiter, self.key);
        if !within_refund_horizon(receipt.at, limiter.clock().now()) {
            return false;
        }
        limiter
            .algorithm()
            .refund_unless_changed(receipt.epoch, &mut || {
                limiter.refund(key, receipt.written, receipt.n)
            })
    }
}

impl<K, Q: fmt::Debug + ?Sized, A, C, S> fmt::Debug for KeyedStage<'_, K, Q, A, C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedStage")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// What a chain answered, and which stage denied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use = "a rate limiter's decision must be checked: a denied request must not proceed"]
pub struct Chained {
    decision: KeyedDecision,
    denied_by: Option<usize>,
}

impl Chained {
    /// The chain's decision: admitted with the fewest permits left in any stage,
    /// or denied (by a key bound, if the first denying stage hit one) with the
    /// longest retry-after of the denying stages.
    pub const fn decision(&self) -> KeyedDecision {
        self.decision
    }

    /// The index of the first stage that denied; `None` when admitted.
    pub const fn denied_by(&self) -> Option<usize> {
        self.denied_by
    }

    /// `true` when every stage admitted.
    pub const fn is_allowed(&self) -> bool {
        self.decision.is_allowed()
    }
}

/// Ask every stage for one permit; admitted only if all admit.
///
/// An empty chain admits, with `u32::MAX` left.
pub fn try_acquire(stages: &[&dyn Stage]) -> Chained {
    decide(stages, 1)
}

/// Ask every stage for `n` permits, all or nothing.
///
/// # Errors
///
/// [`AcquireError::ZeroPermits`] for `n = 0`, and
/// [`AcquireError::InsufficientCapacity`] when `n` is above the smallest
/// stage's capacity (that stage could never admit it). Neither touches a stage.
pub fn try_acquire_n(stages: &[&dyn Stage], n: u32) -> Result<Chained, AcquireError> {
    check_chain(stages, n)?;
    Ok(decide(stages, n))
}

/// Refuse `n` that no chain of `stages` can admit: zero, or above the smallest
/// stage's capacity.
fn check_chain(stages: &[&dyn Stage], n: u32) -> Result<(), AcquireError> {
    let capacity = stages
        .iter()
        .map(|s| s.capacity())
        .min()
        .unwrap_or(u32::MAX);
    check_permits(n, capacity)
}

fn decide(stages: &[&dyn Stage], n: u32) -> Chained {
    let Some((first, rest)) = stages.split_first() else {
        return Chained {
            decision: KeyedDecision::Allowed {
                remaining: u32::MAX,
            },
            denied_by: None,
        };
    };
    let (decision, receipt) = first.take(n);
    let KeyedDecision::Allowed { remaining } = decision else {
        return Chained {
            decision: longest_wait(decision, rest, n),
            denied_by: Some(0),
        };
    };
    // The rest of the chain, recursively: receipts live on the stack, one frame
    // per stage, and are given back in reverse order of taking.
    let rest = decide(rest, n);
    match (rest.decision, rest.denied_by) {
        (KeyedDecision::Allowed { remaining: left }, _) => Chained {
            decision: KeyedDecision::Allowed {
                remaining: remaining.min(left),
            },
            denied_by: None,
        },
        (denied, by) => {
            if let Some(receipt) = receipt {
                // Declined or not, the chain's answer is the same denial.
                let _ = first.give_back(receipt);
            }
            Chained {
                decision: denied,
                denied_by: by.map(|i| i + 1),
            }
        }
    }
}

/// `denied`, with the longest retry-after among it and every later stage that
/// would deny too.
fn longest_wait(denied: KeyedDecision, later: &[&dyn Stage], n: u32) -> KeyedDecision {
    let longest = later
        .iter()
        .filter_map(|stage| stage.peek(n).retry_after())
        .chain(denied.retry_after())
        .max();
    match (denied, longest) {
        (KeyedDecision::Denied { .. }, Some(retry_after)) => KeyedDecision::Denied { retry_after },
        (KeyedDecision::KeyLimit { .. }, Some(retry_after)) => {
            KeyedDecision::KeyLimit { retry_after }
        }
        (other, _) => other,
    }
}

/// An admission that can be given back: the stage that admitted (a borrowed
/// [`RateLimiter`], or one key of a [`KeyedLimiter`]) and its [`Receipt`].
///
/// From [`RateLimiter::try_acquire_refundable`],
/// [`KeyedLimiter::try_acquire_refundable`] and their `_n` forms. To count
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
    ///   (its new word is a later one, on which every algorithm declines).
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

/// `stage`'s decision for `n` permits as an [`Admission`], or the denial.
pub(crate) fn admit<T: Stage>(stage: T, n: u32) -> Result<Admission<T>, KeyedDecision> {
    match stage.take(n) {
        (KeyedDecision::Allowed { remaining }, receipt) => Ok(Admission {
            stage,
            receipt,
            n,
            remaining,
        }),
        (denied, _) => Err(denied),
    }
}

/// An admitted chain that can be given back: every stage's [`Receipt`].
#[must_use = "dropping a chain admission keeps its permits spent; call `refund` to give them back"]
pub struct ChainAdmission<'a> {
    taken: Vec<(&'a dyn Stage, Receipt)>,
    n: u32,
    remaining: u32,
}

impl ChainAdmission<'_> {
    /// Permits the chain took from each stage.
    pub fn permits(&self) -> u32 {
        self.n
    }

    /// The fewest permits left in any stage right after the admission.
    pub fn remaining(&self) -> u32 {
        self.remaining
    }

    /// Give every stage its permits back, the last stage first: `true` when
    /// every stage's refund was exact. A stage that declines keeps its permits
    /// spent; the others are still given back (each stage's refund is exact or
    /// declines, as in [`Admission::refund`], never more than it took).
    pub fn refund(self) -> bool {
        let mut exact = true;
        for (stage, receipt) in self.taken.into_iter().rev() {
            exact &= stage.give_back(receipt);
        }
        exact
    }
}

impl fmt::Debug for ChainAdmission<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChainAdmission")
            .field("stages", &self.taken.len())
            .field("permits", &self.n)
            .field("remaining", &self.remaining)
            .finish()
    }
}

/// [`try_acquire`], keeping the receipts so that the admission can be given
/// back later ([`ChainAdmission::refund`]). A denial is `Err`, with what
/// [`try_acquire`] would have answered; nothing stays taken. Unlike
/// [`try_acquire`], it allocates (one receipt per stage).
///
/// ```
/// use std::time::Duration;
/// use turnstile::{chain, KeyedLimiter, ManualClock, Quota, RateLimiter};
///
/// let clock = ManualClock::new();
/// let per_key = KeyedLimiter::<String>::builder(Quota::new(2, 1, Duration::from_secs(1))?)
///     .clock(clock.clone())
///     .build()?;
/// let global = RateLimiter::with_clock(Quota::new(1, 1, Duration::from_secs(1))?, clock);
///
/// // The admission borrows its stages: the keyed stage needs a name.
/// let alice = per_key.stage("alice");
/// let admitted = chain::try_acquire_refundable(&[&alice, &global]).unwrap();
/// assert!(!chain::try_acquire(&[&per_key.stage("alice"), &global]).is_allowed());
/// assert!(admitted.refund()); // both stages exactly
/// assert_eq!((per_key.remaining("alice"), global.remaining()), (2, 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn try_acquire_refundable<'a>(stages: &[&'a dyn Stage]) -> Result<ChainAdmission<'a>, Chained> {
    decide_keeping(stages, 1)
}

/// [`try_acquire_n`], keeping the receipts: `Ok(Err(_))` is a denial.
///
/// # Errors
///
/// As [`try_acquire_n`].
pub fn try_acquire_n_refundable<'a>(
    stages: &[&'a dyn Stage],
    n: u32,
) -> Result<Result<ChainAdmission<'a>, Chained>, AcquireError> {
    check_chain(stages, n)?;
    Ok(decide_keeping(stages, n))
}

fn decide_keeping<'a>(stages: &[&'a dyn Stage], n: u32) -> Result<ChainAdmission<'a>, Chained> {
    let mut taken: Vec<(&'a dyn Stage, Receipt)> = Vec::with_capacity(stages.len());
    let mut remaining = u32::MAX;
    for (i, &stage) in stages.iter().enumerate() {
        match stage.take(n) {
            (KeyedDecision::Allowed { remaining: left }, receipt) => {
                remaining = remaining.min(left);
                if let Some(receipt) = receipt {
                    taken.push((stage, receipt));
                }
            }
            (denied, _) => {
                for (stage, receipt) in taken.into_iter().rev() {
                    // As in `decide`: the denial is the same either way.
                    let _ = stage.give_back(receipt);
                }
                return Err(Chained {
                    decision: longest_wait(denied, &stages[i + 1..], n),
                    denied_by: Some(i),
                });
            }
        }
    }
    Ok(ChainAdmission {
        taken,
        n,
        remaining,
    })
}
