//! Limbo: keys a sweep unlinked, kept in place with their words until their
//! grace period has passed and their words are still fresh-equivalent (see
//! the parent module's "Eviction without loss"); the sweep that unlinks
//! them, the collection that frees them, and relinking a returning key.

use core::ptr;

use super::{CLOSED, Counts, DEAD, GROUP, LIMBO, Locked, MIN_CAPACITY, MSB, Table, positions, tag};
use crate::reclaim::Collector;
use crate::sync::Ordering;

/// A key in limbo: unlinked by sweep batch `batch`, at slot `pos`.
pub(super) struct Limbo {
    pub(super) pos: u32,
    pub(super) batch: u64,
}

/// The hash a limbo record is filed under.
#[inline]
pub(super) const fn limbo_hash(pos: u32) -> u64 {
    (pos as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// What a shard's sweep did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Swept {
    /// Keys unlinked into limbo.
    pub(crate) unlinked: usize,
    /// Keys freed from limbo (also counted off [`Counts::limbo`] already).
    pub(crate) freed: usize,
}

impl<K> Locked<'_, K> {
    /// Link again the key in limbo at slot `pos` (found by
    /// [`find_in_limbo`](Self::find_in_limbo) for `hash`, under this same
    /// lock, with no insert, sweep or settle since). The caller has reserved
    /// its place under the key bound.
    pub(crate) fn relink(&mut self, hash: u64, pos: u32, counts: &Counts<'_>) {
        let found = self
            .writer
            .limbo
            .find_entry(limbo_hash(pos), |l| l.pos == pos);
        debug_assert!(found.is_ok(), "slot {pos} is not in limbo");
        if let Ok(found) = found {
            found.remove();
        }
        self.table().set_ctrl(pos as usize, tag(hash));
        self.writer.linked += 1;
        counts.left_limbo();
    }

    /// Free the key in limbo at `pos` of `table` (the published one): off the
    /// books and its byte `DEAD` first, then dropped, so that a `Drop` that
    /// panics leaves nothing to drop twice.
    pub(super) fn free_limbo(&mut self, table: &Table<K>, pos: u32, counts: &Counts<'_>) {
        if let Ok(found) = self
            .writer
            .limbo
            .find_entry(limbo_hash(pos), |l| l.pos == pos)
        {
            found.remove();
        }
        table.set_ctrl(pos as usize, DEAD);
        counts.left_limbo();
        let slot = table.slot(pos as usize);
        // SAFETY: the key is unlinked and its grace period has passed (or the
        // table is closed and its readers are gone), so no reader can read
        // it; it is initialized (it was in limbo), and its byte is now `DEAD`,
        // so nothing reads or drops it again: this moves it out.
        // (A mutable access: under loom, one that races a reader's
        // comparison of the key is reported.)
        let key = slot.key.with_mut(|k| unsafe { ptr::read(k).assume_init() });
        drop(key);
    }

    /// Free the keys in limbo whose grace period has passed and whose words
    /// `evictable` accepts now, marking their slots `DEAD`; returns how many.
    fn collect(
        &mut self,
        evictable: &impl Fn(u64) -> bool,
        collector: &Collector,
        counts: &Counts<'_>,
    ) -> usize {
        while let Some((batch, snapshot)) = self.writer.pending.front_mut() {
            // The loom mutant `no_grace` frees without waiting for readers.
            if !(snapshot.passed(collector) || cfg!(turnstile_mutant = "no_grace")) {
                break;
            }
            self.writer.passed = *batch;
            self.writer.pending.pop_front();
        }
        if self.writer.limbo.is_empty() {
            return 0;
        }
        let past = self.writer.passed;
        // Relaxed: the lock keeps the table published.
        let table = self
            .shard
            .table
            .load(Ordering::Relaxed)
            .map_addr(|a| a & !CLOSED);
        // SAFETY: as in `table()`; read through the pointer so that the limbo
        // records can be borrowed mutably beside it.
        let table = unsafe { &*table };
        let due: Vec<u32> = self
            .writer
            .limbo
            .iter()
            .filter(|l| l.batch <= past)
            .map(|l| l.pos)
            .collect();
        let mut freed = 0;
        for pos in due {
            let word = table.slot(pos as usize).cell.load();
            // The loom mutant `no_recheck` frees without judging the word again.
            if evictable(word) || cfg!(turnstile_mutant = "no_recheck") {
                self.free_limbo(table, pos, counts);
                freed += 1;
            }
            // Otherwise a decision ran on it after the unlink: it stays, and a
            // decision for its key links it again.
        }
        freed
    }

    /// Finish a rebuild whose readers are gone, free the keys in limbo whose
    /// grace period has passed and whose words `evictable` still accepts,
    /// then unlink the linked keys whose words both `evictable` and `idle`
    /// accept into limbo, examining at most `budget` slots from where the
    /// last bounded sweep stopped (`usize::MAX`: the whole table), while
    /// limbo has room. Last, a table at under 1/8 load is rebuilt smaller.
    ///
    /// Each change is counted in `counts` as it is made, and the unlinked
    /// keys' snapshot is taken even if `evictable` or `idle` panics midway.
    pub(crate) fn sweep(
        &mut self,
        evictable: impl Fn(u64) -> bool,
        idle: impl Fn(u64) -> bool,
        budget: usize,
        collector: &Collector,
        hash_of: impl Fn(&K) -> u64,
        counts: &Counts<'_>,
    ) -> Swept {
        let mut swept = Swept {
            freed: self.settle(&evictable, collector, &hash_of, counts),
            ..Swept::default()
        };
        swept.freed += self.collect(&evictable, collector, counts);
        let capacity = self.capacity();
        let whole = budget >= capacity;
        let start = if whole { 0 } else { self.writer.cursor };
        let examine = budget.min(capacity);
        let batch = self.writer.batch + 1;
        // Relaxed: the lock keeps the table published.
        let table = self
            .shard
            .table
            .load(Ordering::Relaxed)
            .map_addr(|a| a & !CLOSED);
        // SAFETY: as in `collect`.
        let table = unsafe { &*table };
        let unlinking = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
            // A control group at a time: the part of it in the `examine`
            // slots from `start` (a multiple of `GROUP` apart from the
            // table's end).
            let mut i = 0;
            'examine: while i < examine {
                let first = (start + i) & (capacity - 1);
                let group = first / GROUP;
                let skip = first % GROUP;
                let take = (GROUP - skip).min(examine - i);
                i += take;
                let window = (MSB >> (8 * (GROUP - take))) << (8 * skip);
                // Relaxed: the writer's own bytes.
                let linked = !table.ctrl[group].load(Ordering::Relaxed) & MSB & window;
                for pos in positions(group, linked) {
                    let word = table.slot(pos).cell.load();
                    if !evictable(word) || !idle(word) {
                        continue;
                    }
                    if !counts.reserve_limbo() {
                        break 'examine;
                    }
                    // A reader that still sees the tag finds the word, which
                    // stays in place: its decision is kept (see the module's
                    // docs).
                    table.set_ctrl(pos, LIMBO);
                    self.writer.linked -= 1;
                    counts.unlinked();
                    let pos = pos as u32;
                    self.writer
                        .limbo
                        .insert_unique(limbo_hash(pos), Limbo { pos, batch }, |l| {
                            limbo_hash(l.pos)
                        });
                    self.writer.evicted += 1;
                    swept.unlinked += 1;
                }
            }
        }));
        if !whole {
            self.writer.cursor = (start + examine) & (capacity - 1);
        }
        if swept.unlinked > 0 {
            self.writer.batch = batch;
            let snapshot = collector.snapshot();
            self.writer.pending.push_back((batch, snapshot));
        }
        if let Err(panic) = unlinking {
            std::panic::resume_unwind(panic);
        }
        // Give memory back once the table is mostly empty.
        let held = self.writer.linked + self.writer.limbo.len();
        if capacity > MIN_CAPACITY && held * 8 < capacity && self.writer.closing.is_none() {
            self.close(0, collector);
            swept.freed += self.settle(&evictable, collector, &hash_of, counts);
        }
        swept
    }
}
