//! Rebuilds: a table closed for readers, its words moved once the readers
//! pinned before the close are gone (see the parent module's "Rebuilds move
//! words, so they close the table first"), and the room for a new key they
//! make.

use core::ptr;

use hashbrown::HashTable;

use super::limbo::{Limbo, limbo_hash};
use super::{
    CLOSED, Counts, EMPTY, GROUP, LIMBO, LSB, Locked, MAX_CAPACITY, MIN_CAPACITY, Table, byte,
    holding, is_linked, positions, tag,
};
use crate::reclaim::{Collector, Snapshot};
use crate::sync::Ordering;

/// A rebuild under way: the table is closed and waits for the readers pinned
/// before it closed.
pub(super) struct Closing {
    snapshot: Snapshot,
    /// Keys to make room for beyond those held (1 for a growth, 0 for a
    /// shrink).
    room: usize,
}

/// Why a new key cannot be stored now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NoRoom {
    /// The table cannot grow (2^31 slots), or it is full while its rebuild
    /// waits for a reader that a new key has already waited for in vain.
    Full,
    /// The table is full for now: its rebuild waits for readers pinned
    /// before it closed.
    Waiting,
}

/// Drops a table being filled, without dropping its keys (bitwise copies of
/// keys the old table still owns), unless disarmed: a rebuild's copy that
/// user code interrupts leaves the old table as it was.
struct DiscardCopy<'t, K> {
    table: &'t Table<K>,
    armed: bool,
}

impl<K> Drop for DiscardCopy<'_, K> {
    fn drop(&mut self) {
        if crate::sync::unwinding_under_loom() {
            return;
        }
        if self.armed {
            for group in self.table.ctrl.iter() {
                // Relaxed: no reader reaches this table.
                group.store(LSB * EMPTY as u64, Ordering::Relaxed);
            }
        }
    }
}

impl<K> Locked<'_, K> {
    /// Finish the rebuild under way if its grace period has passed; returns
    /// the keys it freed from limbo (already counted off). Every path that
    /// takes the lock calls this first, so a closed table does not stay
    /// closed past the first writer or decision after its readers are gone.
    pub(crate) fn settle(
        &mut self,
        evictable: &impl Fn(u64) -> bool,
        collector: &Collector,
        hash_of: &impl Fn(&K) -> u64,
        counts: &Counts<'_>,
    ) -> usize {
        let Some(closing) = &mut self.writer.closing else {
            return 0;
        };
        // The loom mutant `no_grace` moves words without waiting for readers.
        if !(closing.snapshot.passed(collector) || cfg!(turnstile_mutant = "no_grace")) {
            return 0;
        }
        self.finish(evictable, hash_of, counts)
    }

    /// Make room for one new key: start a rebuild at 3/4 load (finished at
    /// once if no reader is pinned), and refuse past 7/8 while one waits.
    /// Returns the keys a finished rebuild freed from limbo.
    pub(crate) fn make_room(
        &mut self,
        evictable: &impl Fn(u64) -> bool,
        collector: &Collector,
        hash_of: &impl Fn(&K) -> u64,
        counts: &Counts<'_>,
    ) -> Result<usize, NoRoom> {
        let mut freed = self.settle(evictable, collector, hash_of, counts);
        let used = self.writer.used + 1;
        if self.writer.closing.is_none() && used * 4 > self.capacity() * 3 {
            if !self.close(1, collector) {
                return Err(NoRoom::Full);
            }
            freed += self.settle(evictable, collector, hash_of, counts);
        }
        let used = self.writer.used + 1;
        if self.writer.closing.is_some() && used * 8 > self.capacity() * 7 {
            return Err(if self.writer.gave_up_waiting {
                NoRoom::Full
            } else {
                NoRoom::Waiting
            });
        }
        Ok(freed)
    }

    /// Close the table for a rebuild sized for the keys it keeps plus
    /// `room`: readers that load the pointer from now on take the writer's
    /// path, and the words move once the readers pinned before are gone
    /// ([`settle`](Self::settle)). `false` (nothing changed) when the new
    /// table would pass `MAX_CAPACITY`.
    pub(super) fn close(&mut self, room: usize, collector: &Collector) -> bool {
        let held = self.writer.linked + self.writer.limbo.len();
        if capacity_for(held + room) > MAX_CAPACITY {
            return false;
        }
        // Relaxed: the lock keeps the table published.
        let table = self.shard.table.load(Ordering::Relaxed);
        // Release: orders nothing readers read (they read nothing behind a
        // closed pointer); the snapshot's barrier does the rest.
        self.shard
            .table
            .store(table.map_addr(|a| a | CLOSED), Ordering::Release);
        self.writer.closing = Some(Closing {
            snapshot: collector.snapshot(),
            room,
        });
        true
    }

    /// Move every held key into a new table sized for them, once no reader
    /// can reach the closed one: first judge each key in limbo once, freeing
    /// those `evictable` accepts; then copy the rest into a table built
    /// aside; then publish it and free the old one. A panic in user code
    /// (`evictable`, a key's `Drop` or `Hash`) leaves the shard closed and
    /// consistent: the keys freed so far are gone from the books, and a copy
    /// under way is discarded; the next writer finishes the rebuild.
    ///
    /// No temporary the size of the table is allocated: freed memory of that
    /// size would stay resident in the allocator's heap.
    fn finish(
        &mut self,
        evictable: &impl Fn(u64) -> bool,
        hash_of: &impl Fn(&K) -> u64,
        counts: &Counts<'_>,
    ) -> usize {
        let room = self.writer.closing.as_ref().map_or(0, |c| c.room);
        // Relaxed: the lock keeps the table published.
        let old_ptr = self
            .shard
            .table
            .load(Ordering::Relaxed)
            .map_addr(|a| a & !CLOSED);
        // SAFETY: as in `table()`; read through the pointer so that the
        // bookkeeping can be borrowed mutably beside it. It stays allocated
        // until this function frees it, after its last use.
        let old = unsafe { &*old_ptr };
        // 1. Each key in limbo is judged once, by its final word (no reader
        // can reach the table, and this writer holds the lock): kept, or
        // freed here, so the count of keys kept is the books' count.
        let mut freed = 0;
        let waiting: Vec<u32> = self.writer.limbo.iter().map(|l| l.pos).collect();
        for pos in waiting {
            let word = old.slot(pos as usize).cell.load();
            // The loom mutant `no_recheck` frees without judging the word again.
            if evictable(word) || cfg!(turnstile_mutant = "no_recheck") {
                self.free_limbo(old, pos, counts);
                freed += 1;
            }
        }
        // 2. Copy every held key into a table built aside. The old table
        // keeps its keys until the copy is complete: a `Hash` that panics
        // midway leaves it whole, and the copies are forgotten.
        let held = self.writer.linked + self.writer.limbo.len();
        let new = Table::with_capacity(capacity_for(held + room), self.shard.prefetch_from);
        let mut limbo = HashTable::with_capacity(self.writer.limbo.len());
        let batch = self.writer.batch;
        let mut discard = DiscardCopy {
            table: &new,
            armed: true,
        };
        let mut moved = 0;
        for (group, bytes) in old.groups() {
            for pos in positions(group, holding(bytes)) {
                let ctrl = byte(bytes, pos % GROUP);
                let slot = old.slot(pos);
                // SAFETY: the byte says the key is initialized; the lock keeps
                // it in place.
                let hash = slot
                    .key
                    .with(|k| hash_of(unsafe { (*k).assume_init_ref() }));
                // SAFETY: as above. A bitwise copy: exactly one of the two
                // tables drops it (the new one once the old one's byte is
                // cleared below, or neither copy of the new one if this
                // loop is interrupted).
                let key = slot.key.with(|k| unsafe { ptr::read(k).assume_init() });
                let to = new.vacancy(hash);
                if is_linked(ctrl) {
                    new.put(to, key, slot.cell.load(), tag(hash));
                } else {
                    new.put(to, key, slot.cell.load(), LIMBO);
                    let to = to as u32;
                    limbo.insert_unique(limbo_hash(to), Limbo { pos: to, batch }, |l| {
                        limbo_hash(l.pos)
                    });
                }
                moved += 1;
            }
        }
        debug_assert_eq!(moved, held, "the books and the table disagree");
        discard.armed = false;
        drop(discard);
        // 3. Commit: the old table gives up the moved keys (their bytes
        // cleared, so that its drop drops none), and the new one is
        // published. Relaxed: no reader reaches the old table.
        for (group, bytes) in old.groups() {
            let held = holding(bytes);
            if held != 0 {
                old.ctrl[group].store(bytes | ((held >> 7) * EMPTY as u64), Ordering::Relaxed);
            }
        }
        self.writer.used = moved;
        self.writer.limbo = limbo;
        self.writer.cursor = 0;
        // The closing snapshot has passed, and with it every earlier batch's
        // (a reader one of them noted is either gone or was still pinned at
        // the closing one); keys unlinked since the close were never linked
        // in a table a reader could reach after it.
        self.writer.pending.clear();
        self.writer.passed = self.writer.batch;
        self.writer.closing = None;
        self.writer.gave_up_waiting = false;
        // Release: pairs with readers' Acquire load of the pointer: the slots
        // written above are visible through it. Clears the closed mark.
        self.shard
            .table
            .store(Box::into_raw(Box::new(new)), Ordering::Release);
        if cfg!(turnstile_mutant = "no_grace") {
            // Without the grace period a reader may still be in the old table:
            // leak it rather than free memory in use, so that the model
            // catches the lost decision, not a use after free.
            return freed;
        }
        // SAFETY: unpublished and closed before a grace period that has
        // passed, so no reader holds it; it came from `Box::into_raw`. It
        // holds no key any more.
        drop(unsafe { Box::from_raw(old_ptr) });
        freed
    }
}

/// The table capacity for `keys` keys: at most half full.
fn capacity_for(keys: usize) -> usize {
    keys.saturating_mul(2)
        .checked_next_power_of_two()
        .unwrap_or(usize::MAX)
        .max(MIN_CAPACITY)
}

#[cfg(all(test, not(turnstile_loom)))]
mod tests {
    use super::*;

    #[test]
    fn tables_are_sized_at_most_half_full() {
        assert_eq!(capacity_for(0), MIN_CAPACITY);
        assert_eq!(capacity_for(4), 8);
        assert_eq!(capacity_for(5), 16);
        assert_eq!(capacity_for(125_000), 262_144);
        assert_eq!(capacity_for(usize::MAX), usize::MAX);
    }
}
