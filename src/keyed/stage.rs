//! One key of a keyed limiter as a stage of a [chain](crate::chain).

use core::borrow::Borrow;
use core::fmt;
use core::hash::{BuildHasher, Hash};

use crate::admission::{Receipt, Stage};
use crate::algorithm::{Algorithm, within_refund_horizon};
use crate::clock::Clock;
use crate::decision::KeyedDecision;
use crate::keyed::KeyedLimiter;

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

impl<K, Q, A, C, S> crate::admission::sealed::Sealed for KeyedStage<'_, K, Q, A, C, S> where
    Q: ?Sized
{
}

impl<K, Q, A, C, S> KeyedStage<'_, K, Q, A, C, S>
where
    K: Hash + Eq + Borrow<Q>,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    A: Algorithm,
    C: Clock,
    S: BuildHasher,
{
    /// [`take_pending`](Stage::take_pending) at `now`, a reading of a clock
    /// whose readings are the limiter's ([`Clock::shared_readings`]).
    #[inline]
    pub(crate) fn take_pending_at(&self, n: u32, now: u64) -> (KeyedDecision, Option<Receipt>) {
        let epoch = self.limiter.algorithm().epoch();
        let (decision, written, at, owner) = self.limiter.take_pending_at(self.key, n, now);
        (decision, receipt(written, n, epoch, at, owner))
    }
}

/// The receipt of an admission that wrote `written`.
#[inline(always)]
fn receipt(written: Option<u64>, n: u32, epoch: u64, at: u64, owner: u64) -> Option<Receipt> {
    written.map(|written| Receipt {
        written,
        n,
        epoch,
        at,
        owner,
    })
}

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
    fn take_within(&self, n: u32) -> (KeyedDecision, Option<Receipt>) {
        // The limiter reads the clock itself, and says when.
        let epoch = self.limiter.algorithm().epoch();
        let (decision, written, at, owner) = self.limiter.take(self.key, n);
        (decision, receipt(written, n, epoch, at, owner))
    }

    #[inline]
    fn take_pending(&self, n: u32) -> (KeyedDecision, Option<Receipt>) {
        // As `take_within`.
        let epoch = self.limiter.algorithm().epoch();
        let (decision, written, at, owner) = self.limiter.take_pending(self.key, n);
        (decision, receipt(written, n, epoch, at, owner))
    }

    #[inline]
    fn count_admission(&self) {
        self.limiter.count_outcome(true);
    }

    fn peek_within(&self, n: u32) -> KeyedDecision {
        self.limiter.peek(self.key, n)
    }

    fn give_back(&self, receipt: Receipt) -> bool {
        let (limiter, key) = (self.limiter, self.key);
        // Another key's receipt, or another limiter's, declines: its word
        // can be this key's bit for bit.
        if receipt.owner != limiter.owner(key) {
            return false;
        }
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
