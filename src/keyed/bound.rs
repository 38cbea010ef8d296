//! The key bound: a place under it taken by each new key (and given back
//! by its guard unless kept), room made at the bound by sweeping with
//! bounded work, the pause after a look that found none, and the refusal
//! with its wait.

use core::hash::{BuildHasher, Hash};

use super::table::{Locked, Shard};
use super::{Inner, RECLAIM_BUDGET, RECLAIM_COOLDOWN_NS, reserve};
use crate::algorithm::Algorithm;
use crate::clock::{Clock, saturating_nanos};
use crate::decision::{KeyedDecision, RetryAfter};
use crate::reclaim::Busy;
use crate::sync::{AtomicUsize, Ordering};

impl<K, A, C, S> Inner<K, A, C, S>
where
    K: Hash + Eq,
    A: Algorithm,
    C: Clock,
    S: BuildHasher,
{
    /// A new key refused at the bound: counted, logged, and told when every
    /// key left idle is sweepable.
    pub(super) fn refuse_new_key(
        &self,
        locked: &mut Locked<'_, K>,
        now: u64,
    ) -> (KeyedDecision, Option<u64>) {
        locked.writer().denied_key_limit += 1;
        #[cfg(feature = "tracing")]
        self.log_key_limit(now);
        #[cfg(not(feature = "tracing"))]
        let _ = now;
        (
            KeyedDecision::KeyLimit {
                retry_after: self.key_limit_wait(now),
            },
            None,
        )
    }

    /// Room for one more key at the bound: look for sweepable keys, with
    /// bounded work, in this shard (`own`, locked) and then the others. A
    /// place reserved under the bound once one is found. Shards another
    /// thread holds are skipped and noted in `busy_shards`, for the caller to
    /// sweep once it has let its own lock go.
    #[cold]
    pub(super) fn reclaim(
        &self,
        own: &mut Locked<'_, K>,
        own_shard: &Shard<K>,
        now: u64,
        busy_shards: &mut Vec<usize>,
        busy: &Busy<'_>,
    ) -> Option<Reserved<'_>> {
        busy_shards.clear();
        // Relaxed: a hint about when to look again; a stale value costs one
        // extra look or one refusal within the cooldown.
        if now < self.reclaim_idle_until.load(Ordering::Relaxed) {
            return None;
        }
        // A full limbo stops a sweep unlinking anything; its entries may wait
        // in any shard, so free them everywhere first (a sweep of budget 0
        // only frees limbo).
        // Relaxed: a count, as in `reserve_key`.
        if self.limbo.load(Ordering::Relaxed) >= self.max_keys {
            self.sweep_shard(own, now, 0);
            for shard in self.shards.iter() {
                if let Some(mut other) = shard.try_lock(busy) {
                    let now = self.clock.now();
                    self.sweep_shard(&mut other, now, 0);
                }
            }
        }
        let mut budget = RECLAIM_BUDGET;
        budget -= self.sweep_shard(own, now, budget).min(budget);
        if let Some(reserved) = self.reserve_key() {
            return Some(reserved);
        }
        let shards = self.shards.len();
        // A cursor, as a clock hand: each look starts where the last one
        // stopped, so that looks one after another cover every shard in turn
        // (starting one shard further each time, they went over the same
        // shards again, and with many shards to few keys most new keys were
        // refused while idle keys sat further on). Shards with no linked key
        // are passed over without their lock and without spending the
        // budget. Relaxed: where to start is a hint; looks that race may
        // cover a shard twice, which costs work, not keys.
        let start = self.reclaim_from.load(Ordering::Relaxed);
        let mut i = 0;
        let found = loop {
            if i == shards || budget == 0 {
                break None;
            }
            let index = start.wrapping_add(i) & self.shard_mask;
            i += 1;
            let shard = &self.shards[index];
            if core::ptr::eq(&**shard, own_shard) || shard.linked_hint() == 0 {
                continue;
            }
            // `try_lock`: this thread holds its own shard's lock, so it must not
            // wait for another's (that thread may be waiting for ours).
            let Some(mut other) = shard.try_lock(busy) else {
                busy_shards.push(index);
                continue;
            };
            let now = self.clock.now();
            budget -= self.sweep_shard(&mut other, now, budget).min(budget);
            drop(other);
            if let Some(reserved) = self.reserve_key() {
                break Some(reserved);
            }
        };
        // Relaxed: as above.
        self.reclaim_from
            .store(start.wrapping_add(i) & self.shard_mask, Ordering::Relaxed);
        if found.is_none() && busy_shards.is_empty() {
            self.start_reclaim_cooldown(now);
        }
        found
    }

    /// Let new keys at the bound refuse without looking for room until a
    /// little after `now`: a flood of new keys does not make each one pay for
    /// a look that just found nothing.
    pub(super) fn start_reclaim_cooldown(&self, now: u64) {
        // Never past the moment the keys held can all be fresh (a window's
        // end): a key told to retry then finds room, even if a look just
        // before found none.
        let cooldown = saturating_nanos(self.algorithm.fresh_by(now)).min(RECLAIM_COOLDOWN_NS);
        // Relaxed: as in `reclaim`.
        self.reclaim_idle_until
            .store(now.saturating_add(cooldown), Ordering::Relaxed);
    }

    /// Log that the key bound refused a new key: at most once a second per
    /// limiter (by its clock), so a flood of new keys logs a line a second,
    /// not a line a request.
    #[cfg(feature = "tracing")]
    #[cold]
    fn log_key_limit(&self, now: u64) {
        const EVERY: u64 = 1_000_000_000;
        // Relaxed: the stamp guards only the log line; two threads racing
        // for it log once between them, or twice at worst.
        let last = self.key_limit_logged.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_add(1).saturating_sub(last) >= EVERY;
        if due
            && self
                .key_limit_logged
                .compare_exchange(
                    last,
                    now.saturating_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            tracing::warn!(
                max_keys = self.max_keys,
                keys = self.len(),
                retry_after_ms = self.algorithm.fresh_by(now).as_millis() as u64,
                "turnstile keyed limiter at its key bound: new keys are refused (KeyLimit, \
                 503) until idle keys are swept; logged at most once a second"
            );
        }
    }

    /// A key-limit denial's wait at `now`: by then every key left idle
    /// since is sweepable. The algorithm's time from `now` to fresh (a
    /// window's: to the end of its window), plus the furthest a reservation
    /// may have stamped a word ahead of the clock.
    pub(super) fn key_limit_wait(&self, now: u64) -> RetryAfter {
        // Relaxed: a bound noted before each loan it covers (see `note_loan`).
        let lent_ahead = self.lent_ahead.load(Ordering::Relaxed);
        RetryAfter::from_nanos(
            saturating_nanos(self.algorithm.fresh_by(now)).saturating_add(lent_ahead),
        )
    }

    /// Note, before a loan's word is written, how far ahead of the clock it
    /// stamps it.
    pub(super) fn note_loan(&self, ahead: u64) {
        // Relaxed: a bound read by key-limit denials; a denial that races the
        // first loan of a longer reach may still give the shorter wait, as it
        // would had it come just before the loan.
        if self.lent_ahead.load(Ordering::Relaxed) < ahead {
            self.lent_ahead.fetch_max(ahead, Ordering::Relaxed);
        }
    }

    /// Take one key place under the bound: given back when the guard is
    /// dropped, unless [kept](Reserved::keep) by the key that took it.
    pub(super) fn reserve_key(&self) -> Option<Reserved<'_>> {
        reserve(&self.len, self.max_keys).then(|| Reserved { count: &self.len })
    }
}

/// A place under the key bound, taken by a new key on its way in. Given
/// back when dropped (the key was not stored: refused, or user code run
/// meanwhile panicked), so that no path leaks it.
#[must_use]
pub(super) struct Reserved<'a> {
    count: &'a AtomicUsize,
}

impl Reserved<'_> {
    /// The key took its place: it stays counted.
    pub(super) fn keep(self) {
        core::mem::forget(self);
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if crate::sync::unwinding_under_loom() {
            return;
        }
        // Relaxed: as in `reserve`.
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}
