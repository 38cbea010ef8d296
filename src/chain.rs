//! Several limiters deciding as one: a request is admitted only if every stage
//! admits it, and a denial anywhere gives back the permits earlier stages
//! took, by the exact-or-decline rule: never more than was taken, and a
//! stage that cannot give them back exactly (rarely, under contention) keeps
//! them spent (see "What is atomic and what is not" below).
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
//!   than if it had not been asked.
//! - **Counted once, where it was decided.** An admitted chain is counted as
//!   admitted once in each stage's stats ([`KeyedStats`](crate::KeyedStats),
//!   a [counted](crate::RateLimiter::counted) limiter's
//!   [`DirectStats`](crate::DirectStats)). A refused chain is counted as
//!   denied in the stage that refused it, and in no other: the stages before
//!   it, whose permits are given back (exactly or not), count it as neither
//!   admitted nor denied, and the stages after it are only looked at. So a
//!   stage's `admitted` counts the requests that went through it. An
//!   admitted chain given back later ([`ChainAdmission::refund`]) stays
//!   counted, as a refunded [`Admission`] does.
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

use core::fmt;

use crate::decision::KeyedDecision;
use crate::error::AcquireError;
use crate::error::check_permits;

pub use crate::admission::{Admission, Receipt, Stage};
pub use crate::keyed::KeyedStage;

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

/// The stages a chain decides on the stack, one frame each; a longer chain
/// keeps its receipts in a vector instead (`decide_keeping`), so that no
/// length of chain can overflow the stack.
const ON_THE_STACK: usize = 64;

fn decide(stages: &[&dyn Stage], n: u32) -> Chained {
    if stages.len() > ON_THE_STACK {
        return match decide_keeping(stages, n) {
            // The receipts are dropped: the permits stay taken.
            Ok(admission) => Chained {
                decision: KeyedDecision::Allowed {
                    remaining: admission.remaining,
                },
                denied_by: None,
            },
            Err(chained) => chained,
        };
    }
    let Some((first, rest)) = stages.split_first() else {
        return Chained {
            decision: KeyedDecision::Allowed {
                remaining: u32::MAX,
            },
            denied_by: None,
        };
    };
    // The last stage's admission is the chain's: counted at once. An
    // earlier stage's is counted once every later stage has admitted too.
    let last = rest.is_empty();
    let (decision, receipt) = if last {
        first.take_within(n)
    } else {
        first.take_pending(n)
    };
    // Given back if a later stage panics (user code runs there: a key's
    // `Hash` or `Eq`, a hasher, a clock), so that no path leaks it.
    let mut held = Held {
        stage: *first,
        receipt,
    };
    let KeyedDecision::Allowed { remaining } = decision else {
        return Chained {
            decision: longest_wait(decision, rest, n),
            denied_by: Some(0),
        };
    };
    // The rest of the chain, recursively: receipts live on the stack, one frame
    // per stage, and are given back in reverse order of taking.
    let rest = decide(rest, n);
    let receipt = held.receipt.take();
    match (rest.decision, rest.denied_by) {
        (KeyedDecision::Allowed { remaining: left }, _) => {
            if !last {
                first.count_admission();
            }
            Chained {
                decision: KeyedDecision::Allowed {
                    remaining: remaining.min(left),
                },
                denied_by: None,
            }
        }
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

/// A stage's receipt, given back if dropped while still held: a panic in a
/// later stage unwinds through it. The paths that return take it first.
struct Held<'a> {
    stage: &'a dyn Stage,
    receipt: Option<Receipt>,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(receipt) = self.receipt.take() {
            // Declined or not: the chain admitted nothing.
            let _ = self.stage.give_back(receipt);
        }
    }
}

/// Receipts taken so far by [`decide_keeping`], given back in reverse order
/// if dropped while still held (a denial, or a panic in a later stage).
struct Taken<'a>(Vec<(&'a dyn Stage, Receipt)>);

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        for (stage, receipt) in self.0.drain(..).rev() {
            // As in `decide`: the denial is the same either way.
            let _ = stage.give_back(receipt);
        }
    }
}

/// `denied`, with the longest retry-after among it and every later stage that
/// would deny too.
fn longest_wait(denied: KeyedDecision, later: &[&dyn Stage], n: u32) -> KeyedDecision {
    let longest = later
        .iter()
        .filter_map(|stage| stage.peek_within(n).retry_after())
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
/// [`try_acquire`] would have answered; the earlier stages' permits are given
/// back as [`try_acquire`] gives them back. Unlike
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
    let mut taken = Taken(Vec::with_capacity(stages.len()));
    let mut remaining = u32::MAX;
    for (i, &stage) in stages.iter().enumerate() {
        // Each admission counted only once the chain has admitted.
        match stage.take_pending(n) {
            (KeyedDecision::Allowed { remaining: left }, receipt) => {
                remaining = remaining.min(left);
                if let Some(receipt) = receipt {
                    taken.0.push((stage, receipt));
                }
            }
            (denied, _) => {
                // The earlier stages' permits, given back last first.
                drop(taken);
                return Err(Chained {
                    decision: longest_wait(denied, &stages[i + 1..], n),
                    denied_by: Some(i),
                });
            }
        }
    }
    for stage in stages {
        stage.count_admission();
    }
    Ok(ChainAdmission {
        taken: core::mem::take(&mut taken.0),
        n,
        remaining,
    })
}
