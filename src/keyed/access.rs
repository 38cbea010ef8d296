//! What the rest of the crate calls on a keyed limiter beyond its public
//! API: decisions that also report the word written and when (chain stages,
//! reservations), uncounted tries (waits), peeks, refunds and in-place
//! changes of a linked key's word (leases), and the lookups behind them.

use core::borrow::Borrow;
use core::hash::{BuildHasher, Hash};

use super::{Inner, KeyedLimiter};
use crate::algorithm::Algorithm;
use crate::cell::Cell;
use crate::clock::Clock;
use crate::decision::KeyedDecision;

impl<K, A, C, S> KeyedLimiter<K, A, C, S>
where
    K: Hash + Eq,
    A: Algorithm,
    C: Clock,
    S: BuildHasher,
{
    /// Decide for `key`, also returning the word an admission wrote and a
    /// clock reading no later than the decision's (what a refund needs).
    #[inline]
    ///
    /// The last is the key's [`owner`](Self::owner): what its receipts carry.
    pub(crate) fn take<Q>(&self, key: &Q, n: u32) -> (KeyedDecision, Option<u64>, u64, u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (decision, written, at, hash) = self.inner.take(key, n, true);
        (decision, written, at, self.owner_of_hash(hash))
    }

    /// [`take`](Self::take) for a stage of several deciding as one
    /// ([`Stage::take_pending`](crate::chain::Stage::take_pending)): a
    /// denial for the rate is counted at once (one at the key bound always
    /// is), an admission only by [`count_outcome`](Self::count_outcome).
    #[inline]
    pub(crate) fn take_pending<Q>(&self, key: &Q, n: u32) -> (KeyedDecision, Option<u64>, u64, u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.take_pending_at(key, n, self.inner.clock.now())
    }

    /// [`take_pending`](Self::take_pending) at `now`, a reading of a clock
    /// whose readings are this limiter's ([`Clock::shared_readings`]): a
    /// combined layer's one reading for all its limits. Any reading is sound
    /// for a key found in the table; a new key reads this limiter's clock
    /// under its shard's lock, as `take` does.
    #[inline]
    pub(crate) fn take_pending_at<Q>(
        &self,
        key: &Q,
        n: u32,
        now: u64,
    ) -> (KeyedDecision, Option<u64>, u64, u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (decision, written, at, hash) =
            self.inner
                .take_with_at(&self.inner.algorithm, key, n, false, now);
        if let KeyedDecision::Denied { .. } = decision {
            self.count_outcome(false);
        }
        (decision, written, at, self.owner_of_hash(hash))
    }

    /// Who a receipt for `key` belongs to: this limiter's table and the
    /// key's hash, so that a receipt given back for another key, or to
    /// another limiter, declines (their words can be bit for bit alike).
    pub(crate) fn owner<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.owner_of_hash(self.inner.hasher.hash_one(key))
    }

    #[inline(always)]
    fn owner_of_hash(&self, hash: u64) -> u64 {
        // The table's address tells limiters apart (it lives as long as the
        // limiter, behind its `Arc`); the hash tells keys apart.
        hash ^ (core::ptr::from_ref(&*self.inner) as usize as u64).rotate_left(29)
    }

    /// [`take`](Self::take) without counting it in the limiter's stats: a
    /// combined layer settling a response's cost, which is no decision on a
    /// request.
    pub(crate) fn take_uncounted<Q>(&self, key: &Q, n: u32) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.inner.take(key, n, false).0.is_allowed()
    }

    /// Note that a reservation stamps a word `ahead` nanoseconds ahead of the
    /// clock, before its compare-and-swap writes it: key-limit denials wait
    /// that much longer for idle keys to become sweepable.
    pub(crate) fn note_loan(&self, ahead: u64) {
        self.inner.note_loan(ahead);
    }

    /// [`take`](Self::take), deciding with `algorithm` on this limiter's
    /// words (a reservation's); counted in the stats when `counted`.
    pub(crate) fn take_with<B, Q>(
        &self,
        algorithm: &B,
        key: &Q,
        n: u32,
        counted: bool,
    ) -> (KeyedDecision, Option<u64>, u64)
    where
        B: Algorithm,
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (decision, written, at, _) = self.inner.take_with(algorithm, key, n, counted);
        (decision, written, at)
    }

    /// Replace `key`'s word by `next(word)` if the key is linked and `next`
    /// gives one; whether it did.
    pub(crate) fn transform_linked<Q>(&self, key: &Q, next: impl FnMut(u64) -> Option<u64>) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.inner
            .on_linked_cell(key, |cell| cell.transform(next).is_some())
            .unwrap_or(false)
    }

    /// One try of a wait: the decision for `key`, not counted (the wait
    /// counts its outcome once, [`count_outcome`](Self::count_outcome)).
    pub(crate) fn try_uncounted<Q>(&self, key: &Q, n: u32) -> KeyedDecision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.inner.take(key, n, false).0
    }

    /// Count a wait's outcome: admitted, or refused by its deadline; or the
    /// admission of a [`take_pending`](Self::take_pending).
    pub(crate) fn count_outcome(&self, admitted: bool) {
        let inner = &*self.inner;
        inner
            .tally
            .count_outcome(admitted, crate::reclaim::thread_slot());
    }

    /// The decision `key` would get for `n` permits now, taking nothing and
    /// storing nothing.
    pub(crate) fn peek<Q>(&self, key: &Q, n: u32) -> KeyedDecision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let inner = &*self.inner;
        inner.on_word(key, |word, now, linked| {
            // A key not linked (new, or waiting in limbo) meets the key bound
            // first when it is full. (A request might still find a sweepable
            // key to make room; the peek takes nothing, so it answers with the
            // bound's wait, an upper bound on when room is certain.)
            if !linked && inner.len() >= inner.max_keys {
                return KeyedDecision::KeyLimit {
                    retry_after: inner.key_limit_wait(now),
                };
            }
            inner.algorithm.decide(word, now, n).0.into()
        })
    }

    /// Give back `n` permits an admission for `key` took (see
    /// [`Algorithm::refund`]); `true` when they went back. Only a key that is
    /// linked takes a refund. A key evicted since was fresh-equivalent with the
    /// permits spent, so nothing it owes matters any more: while it is not
    /// linked (waiting in limbo, or freed) the refund declines; created again,
    /// its word is a later one than `written` (a later refill time, window or
    /// theoretical arrival time), and every algorithm declines a refund
    /// against it, on a clock not set back behind the admission's reading
    /// meanwhile.
    pub(crate) fn refund<Q>(&self, key: &Q, written: u64, n: u32) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let inner = &*self.inner;
        inner
            .on_linked_cell(key, |cell| cell.refund(&inner.algorithm, written, n))
            .unwrap_or(false)
    }
}

impl<K, A, C, S> Inner<K, A, C, S>
where
    K: Hash + Eq,
    A: Algorithm,
    C: Clock,
    S: BuildHasher,
{
    /// As [`decide`](Self::decide), also returning the word an admission
    /// wrote; counted in the tally only when `counted` (a wait counts its
    /// outcome once, not every try).
    fn take<Q>(&self, key: &Q, n: u32, counted: bool) -> (KeyedDecision, Option<u64>, u64, u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.take_with(&self.algorithm, key, n, counted)
    }

    /// [`take`](Self::take), deciding with `algorithm`: the limiter's own, or
    /// one acting for it on the same words (a reservation's). The reading
    /// returned is the first this takes: the decision's, or (for a key not
    /// found without the lock) an earlier one.
    fn take_with<B, Q>(
        &self,
        algorithm: &B,
        key: &Q,
        n: u32,
        counted: bool,
    ) -> (KeyedDecision, Option<u64>, u64, u64)
    where
        B: Algorithm,
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // As in `decide`: any reading will do for a word found in the table.
        self.take_with_at(algorithm, key, n, counted, self.clock.now())
    }

    /// [`take_with`](Self::take_with) at the reading `now`.
    #[inline(always)]
    fn take_with_at<B, Q>(
        &self,
        algorithm: &B,
        key: &Q,
        n: u32,
        counted: bool,
        now: u64,
    ) -> (KeyedDecision, Option<u64>, u64, u64)
    where
        B: Algorithm,
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        {
            let guard = self.collector.pin();
            if let Some(cell) = shard.find(hash, key, &guard) {
                let (decision, written) = self.decide_on(algorithm, cell, now, n, counted);
                return (decision, written, now, hash);
            }
        }
        let (decision, written) =
            self.insert_and_decide(algorithm, key, hash, shard, now, n, counted);
        (decision, written, now, hash)
    }

    /// `f(word, now, linked)` on `key`'s word (linked, or in limbo) and a
    /// reading taken after it was found; for a key not held, on a fresh word.
    /// `linked` is true only for a key that holds a place under the key bound
    /// (a key in limbo does not: linking it again takes one). Stores nothing.
    pub(super) fn on_word<Q, R>(&self, key: &Q, f: impl FnOnce(u64, u64, bool) -> R) -> R
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        {
            let guard = self.collector.pin();
            if let Some(cell) = shard.find(hash, key, &guard) {
                let word = cell.load();
                return f(word, self.clock.now(), true);
            }
        }
        // Not linked: it may wait in limbo with a word that still counts.
        let busy = self.collector.enter();
        let (locked, now) = self.lock_settled(shard, &busy);
        if let Some(entry) = locked.find(hash, key) {
            return f(locked.cell(entry).load(), now, true);
        }
        // In limbo the word still counts, but the key holds no place under
        // the bound: linking it again takes one, as a new key does.
        match locked.find_in_limbo(hash, key) {
            Some(entry) => f(locked.cell(entry).load(), now, false),
            None => f(self.algorithm.fresh(), now, false),
        }
    }

    /// `f` on `key`'s word cell, if the key is linked.
    fn on_linked_cell<Q, R>(&self, key: &Q, f: impl FnOnce(&Cell) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        {
            let guard = self.collector.pin();
            if let Some(cell) = shard.find(hash, key, &guard) {
                return Some(f(cell));
            }
        }
        // Not linked, or its shard's table is closed for a rebuild: decided
        // under the lock.
        let busy = self.collector.enter();
        let (locked, _) = self.lock_settled(shard, &busy);
        locked.find(hash, key).map(|entry| f(locked.cell(entry)))
    }
}
