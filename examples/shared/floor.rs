//! The floor a keyed decision can reach, shared by `benches/keyed.rs` and
//! `examples/decision_cost/` so both measure the same thing.
//!
//! A [`Floor`] does the least work any keyed rate limiter must do per check:
//! one `ahash` of the key, one `hashbrown::HashTable` lookup, one clock reading
//! through [`turnstile::Clock`], and one compare-and-swap on the key's word (a
//! minimal GCRA: the word is the theoretical arrival time in nanoseconds). It
//! takes no lock, counts nothing, computes no wait, and never inserts or
//! evicts: its keys are fixed when it is built, and the table is read-only
//! afterwards. A limiter's distance from the floor is what its locking,
//! bookkeeping and generality cost.

use std::sync::atomic::{AtomicU64, Ordering};

use hashbrown::HashTable;

/// A fixed set of `u64` keys, each with one word, checked without locks.
pub struct Floor<C> {
    hasher: ahash::RandomState,
    table: HashTable<(u64, AtomicU64)>,
    clock: C,
    /// Nanoseconds between admissions at the sustained rate.
    interval: u64,
    /// How far the theoretical arrival time may run ahead of now: the burst
    /// beyond one admission, in nanoseconds.
    tolerance: u64,
}

impl<C: turnstile::Clock> Floor<C> {
    /// `keys`, each allowed `burst` admissions at once and one every `interval`
    /// after that, on `clock`.
    pub fn new(
        keys: impl IntoIterator<Item = u64>,
        clock: C,
        interval_nanos: u64,
        burst: u64,
    ) -> Floor<C> {
        let hasher = ahash::RandomState::new();
        let mut table = HashTable::new();
        for key in keys {
            let hash = hasher.hash_one(key);
            if table.find(hash, |(k, _)| *k == key).is_none() {
                table.insert_unique(hash, (key, AtomicU64::new(0)), |(k, _)| hasher.hash_one(*k));
            }
        }
        Floor {
            hasher,
            table,
            clock,
            interval: interval_nanos,
            tolerance: burst.saturating_sub(1).saturating_mul(interval_nanos),
        }
    }

    /// One check for `key`: `true` admitted, `false` denied. A key the floor
    /// was not built with is denied.
    #[inline]
    pub fn check(&self, key: u64) -> bool {
        let hash = self.hasher.hash_one(key);
        let now = self.clock.now();
        let Some((_, word)) = self.table.find(hash, |(k, _)| *k == key) else {
            return false;
        };
        // Relaxed: the word publishes no other data; any value of its
        // modification order is a valid input to the compare-and-swap below.
        let mut tat = word.load(Ordering::Relaxed);
        loop {
            let start = tat.max(now);
            if start - now > self.tolerance {
                // A denial changes nothing, so it writes nothing.
                return false;
            }
            // Relaxed on success and failure: no two admissions can spend the
            // same slot because the swap succeeds only against the value it
            // decided on; the failure value only feeds the next attempt.
            match word.compare_exchange(
                tat,
                start + self.interval,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(current) => tat = current,
            }
        }
    }
}
