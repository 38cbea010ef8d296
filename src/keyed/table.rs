//! One shard of a keyed limiter: a hash index that readers search without a
//! lock, over an arena of entries that never move.
//!
//! # Shape
//!
//! - The **arena** holds entries `(word, key)` in chunks that are allocated
//!   once and never moved or freed while the shard lives: an entry's word is at
//!   one address for as long as the entry exists, so a decision's
//!   compare-and-swap can never land on a stale copy. Chunk `c` holds
//!   `16 << c` entries; an entry is named by its number in the arena.
//! - The **index** is an open-addressing table of `AtomicU64` slots, each
//!   `EMPTY`, `DELETED` or the top 32 bits of the key's hash with the entry's
//!   number. Readers probe it with acquire loads; the writer changes slots in
//!   place (insert, unlink) or publishes a whole new index (grow, shrink,
//!   dropping tombstones) and retires the old one, freeing it after a grace
//!   period (`crate::reclaim`).
//! - **Writers** (insert, sweep, rebuild, reclaim) serialize on the shard's
//!   mutex. Readers never take it.
//!
//! # Eviction without loss: unlink, wait out the readers, free only if still fresh
//!
//! A sweep that judges an entry's word fresh-equivalent only *unlinks* it:
//! marks its index slot `DELETED` and moves the entry to the shard's **limbo**.
//! A decision that found the entry before the unlink may still be running on
//! its word, and its compare-and-swap lands in the entry, which still exists.
//! The entry is freed only when both hold:
//! 1. every reader pinned at the unlink has unpinned (a grace period,
//!    `crate::reclaim`), so no decision can still reach the entry; and
//! 2. its word is fresh-equivalent at a clock reading taken by the writer after
//!    (1), under the shard's lock.
//!
//! A decision for the key that arrives while the entry is in limbo does not
//! find it in the index and takes the writer's path, which finds it in limbo
//! and links it again, so it decides on the key's real state. So no admission
//! is ever counted on a word that is then thrown away, and no decision ever
//! starts over from a fresh word while the old one could still change.
//!
//! Memory is bounded: entries are linked (the keyed limiter bounds these by its
//! `max_keys`) or in limbo (bounded by the same number again), and the arena
//! only reuses numbers freed after a grace period.

use core::borrow::Borrow;
use core::cmp::Reverse;
use core::mem::MaybeUninit;
use core::ptr;
use std::collections::BinaryHeap;

use hashbrown::HashTable;

use crate::cell::Cell;
use crate::reclaim::{Collector, Guard, Snapshot};
use crate::sync::{AtomicPtr, AtomicU64, Mutex, MutexGuard, Ordering, UnsafeCell, lock};

/// The first chunk holds `2^BASE_SHIFT` entries; each next one twice as many.
const BASE_SHIFT: u32 = 4;
/// Chunks in the arena: `16 * (2^28 - 1)` entries, just under `u32::MAX - 2`.
const CHUNKS: usize = 28;
/// The most entries one shard's arena can hold.
const ARENA_CAPACITY: u64 = (1 << BASE_SHIFT) * ((1 << CHUNKS) - 1);
/// The smallest index.
const MIN_INDEX: usize = 8;

/// An index slot that never held an entry: a probe for a key stops here.
const EMPTY: u64 = 0;
/// An index slot whose entry was unlinked: a probe goes on past it.
const DELETED: u64 = 1;
/// The bits of a full slot that hold the top of the key's hash.
const TAG: u64 = 0xFFFF_FFFF_0000_0000;
/// A full slot holds the entry's number plus this in its low 32 bits, so that
/// no full slot equals `EMPTY` or `DELETED`.
const FULL_OFFSET: u32 = 2;

/// A full index slot for entry `entry` of a key whose hash is `hash`.
#[inline(always)]
const fn full(hash: u64, entry: u32) -> u64 {
    (hash & TAG) | (entry + FULL_OFFSET) as u64
}

/// The entry of a full slot; `None` for `EMPTY` and `DELETED`.
#[inline(always)]
const fn entry_of(slot: u64) -> Option<u32> {
    (slot as u32).checked_sub(FULL_OFFSET)
}

/// The hash an entry is filed under in limbo: the top 32 bits of its key's
/// hash (all a slot keeps), spread over 64 for the limbo table.
#[inline]
const fn limbo_hash(hash_or_slot: u64) -> u64 {
    (hash_or_slot >> 32).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The chunk of entry `entry`, and its offset there.
#[inline(always)]
const fn locate(entry: u32) -> (usize, usize) {
    let shifted = entry as u64 + (1 << BASE_SHIFT);
    let chunk = (u64::BITS - 1 - shifted.leading_zeros()) - BASE_SHIFT;
    (
        chunk as usize,
        (shifted - (1 << (chunk + BASE_SHIFT))) as usize,
    )
}

const fn chunk_len(chunk: usize) -> usize {
    1 << (chunk as u32 + BASE_SHIFT)
}

/// One entry of the arena. Aligned to 16 bytes so that a 16-byte entry (a
/// `u64` key) never straddles two cache lines.
#[repr(align(16))]
struct Entry<K> {
    cell: Cell,
    /// Initialized from the entry's allocation until it is freed; read by
    /// readers only while they hold a pin that the freeing waits for.
    key: UnsafeCell<MaybeUninit<K>>,
}

impl<K> Entry<K> {
    fn vacant() -> Entry<K> {
        Entry {
            cell: Cell::new(0),
            key: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }
}

/// One published index: its slots and their mask.
struct Index {
    mask: usize,
    slots: Box<[AtomicU64]>,
}

impl Index {
    fn with_capacity(capacity: usize) -> Index {
        Index {
            mask: capacity - 1,
            slots: (0..capacity).map(|_| AtomicU64::new(EMPTY)).collect(),
        }
    }

    fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Where a new slot for `hash` goes in an index no reader sees yet, or that
    /// the caller's writer lock guards: the first slot on its probe path that
    /// holds no entry.
    fn vacancy(&self, hash: u64) -> usize {
        let mut pos = hash as usize & self.mask;
        // Relaxed: the writer's own slots (it holds the shard's lock, or the
        // index is not yet published).
        while entry_of(self.slots[pos].load(Ordering::Relaxed)).is_some() {
            pos = (pos + 1) & self.mask;
        }
        pos
    }
}

/// An index unpublished by a rebuild, freed once the readers noted in its
/// snapshot have unpinned.
struct Retired {
    index: *mut Index,
    snapshot: Snapshot,
}

impl Retired {
    /// # Safety
    ///
    /// - `self.index` came from `Box::into_raw` and is freed nowhere else;
    /// - no reader can still hold it: it was unpublished before the snapshot
    ///   was taken, and the snapshot has passed (or no reader exists at all).
    unsafe fn free(self) {
        // SAFETY: as the function's contract says.
        drop(unsafe { Box::from_raw(self.index) });
    }
}

/// An entry in limbo: unlinked by sweep batch `batch`.
struct Limbo {
    hash: u64,
    entry: u32,
    batch: u64,
}

/// What the shard's mutex guards.
pub(crate) struct Writer {
    /// Entries linked in the index.
    linked: usize,
    /// Index slots not `EMPTY`: linked entries and tombstones.
    used: usize,
    /// Entry numbers handed out so far (the arena's high-water mark).
    next: u32,
    /// Numbers freed after their grace period, lowest first.
    free: BinaryHeap<Reverse<u32>>,
    limbo: HashTable<Limbo>,
    /// The last sweep batch.
    batch: u64,
    /// Sweep batches whose grace period may not have passed, oldest first.
    pending: std::collections::VecDeque<(u64, Snapshot)>,
    /// Every batch up to this one has passed its grace period.
    passed: u64,
    /// Indexes unpublished by rebuilds, waiting for their readers.
    retired: Vec<Retired>,
    /// Where the next bounded sweep of this shard starts in the index.
    cursor: usize,
    /// Inserts since the last full sweep, and how many trigger the next.
    pub(crate) inserts_since_sweep: usize,
    pub(crate) sweep_threshold: usize,
    pub(crate) denied_key_limit: u64,
    pub(crate) evicted: u64,
}

/// One shard.
pub(crate) struct Shard<K> {
    /// The published index.
    index: AtomicPtr<Index>,
    chunks: [AtomicPtr<Entry<K>>; CHUNKS],
    writer: Mutex<Writer>,
}

// SAFETY:
// - a shard owns its keys (in the arena) and shares them with readers on other
//   threads as `&K`: sending a shard sends the keys (`K: Send`), and sharing it
//   shares `&K` across threads (`K: Sync`);
// - its raw pointers (the published index, the chunks, retired indexes) point
//   to memory it owns, made only of atomics and keys;
// - every other field is an atomic or behind the mutex.
unsafe impl<K: Send> Send for Shard<K> {}
// SAFETY: as above.
unsafe impl<K: Send + Sync> Sync for Shard<K> {}

/// What a shard's sweep did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Swept {
    /// Entries unlinked into limbo.
    pub(crate) unlinked: usize,
    /// Entries freed from limbo.
    pub(crate) freed: usize,
}

impl<K> Shard<K> {
    pub(crate) fn new(sweep_threshold: usize) -> Shard<K> {
        Shard {
            index: AtomicPtr::new(Box::into_raw(Box::new(Index::with_capacity(MIN_INDEX)))),
            chunks: core::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
            writer: Mutex::new(Writer {
                linked: 0,
                used: 0,
                next: 0,
                free: BinaryHeap::new(),
                limbo: HashTable::new(),
                batch: 0,
                pending: std::collections::VecDeque::new(),
                passed: 0,
                retired: Vec::new(),
                cursor: 0,
                inserts_since_sweep: 0,
                sweep_threshold,
                denied_key_limit: 0,
                evicted: 0,
            }),
        }
    }

    /// Entry `entry`, which the caller knows is allocated: it read it from an
    /// index slot under a pin, or holds the writer lock.
    #[inline(always)]
    fn entry(&self, entry: u32) -> &Entry<K> {
        let (chunk, offset) = locate(entry);
        // Acquire: pairs with the Release that published the chunk. (The entry
        // number itself came through an acquire load of its index slot, which
        // the chunk's publication precedes, so this is belt and braces.)
        let base = self.chunks[chunk].load(Ordering::Acquire);
        // SAFETY:
        // - an allocated entry's chunk was published before the entry's
        //   number was handed out, so `base` is that chunk, `chunk_len(chunk)`
        //   entries long, and `offset` is within it;
        // - chunks are freed only when the shard is dropped, which needs
        //   `&mut self`, so the reference cannot outlive them.
        unsafe { &*base.add(offset) }
    }

    /// The word of `key`, if it is linked: the lock-free read path.
    ///
    /// The word stays allocated while `guard` is held, even if a sweep unlinks
    /// it meanwhile (it then waits in limbo, and a decision on it is kept).
    #[inline(always)]
    pub(crate) fn find<'g, Q>(
        &'g self,
        hash: u64,
        key: &Q,
        _guard: &'g Guard<'_>,
    ) -> Option<&'g Cell>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        // Acquire: pairs with the Release that published this index, after its
        // slots were written.
        let index = self.index.load(Ordering::Acquire);
        // SAFETY: a writer frees an index only after unpublishing it and then
        // seeing every pin taken before (such as `_guard`) released, so it is
        // alive for `'g`.
        let index = unsafe { &*index };
        // The entries it names live as long: an entry is freed only after a
        // grace period that waits for `_guard`.
        self.probe(index, hash, key).map(|(_, entry)| &entry.cell)
    }

    /// `key`'s entry in `index`, and its number. The caller keeps the index and
    /// the entries it names allocated: it holds a pin taken before it loaded
    /// the index, or the writer lock.
    #[inline(always)]
    fn probe<'i, Q>(&'i self, index: &Index, hash: u64, key: &Q) -> Option<(u32, &'i Entry<K>)>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let tag = hash & TAG;
        let mut pos = hash as usize & index.mask;
        loop {
            // Acquire: pairs with the writer's Release store of the slot, made
            // after it wrote the entry's key and word. (The writer probing its
            // own slots needs no ordering; an acquire load costs it nothing
            // extra on x86-64, and one probe serves both.)
            let slot = index.slots[pos].load(Ordering::Acquire);
            if slot == EMPTY {
                return None;
            }
            if slot & TAG == tag
                && let Some(number) = entry_of(slot)
            {
                let entry = self.entry(number);
                if self.key_is(entry, key) {
                    return Some((number, entry));
                }
            }
            pos = (pos + 1) & index.mask;
        }
    }

    /// Whether `entry`, which holds a key (it is linked or in limbo, and the
    /// caller holds a pin or the writer lock), holds `key`.
    #[inline(always)]
    fn key_is<Q>(&self, entry: &Entry<K>, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        // SAFETY: the key was written before the entry's slot was published
        // (the caller's acquire load, or its lock), and it is dropped only by a
        // writer holding the lock, after a grace period that waits for every
        // pin taken while the entry could be found.
        entry
            .key
            .with(|k| unsafe { (*k).assume_init_ref() }.borrow() == key)
    }

    /// Take the shard's writer lock.
    pub(crate) fn lock(&self) -> Locked<'_, K> {
        Locked {
            shard: self,
            writer: lock(&self.writer),
        }
    }

    /// Take the shard's writer lock if no one holds it.
    pub(crate) fn try_lock(&self) -> Option<Locked<'_, K>> {
        let writer = match self.writer.try_lock() {
            Ok(writer) => writer,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(Locked {
            shard: self,
            writer,
        })
    }
}

impl<K> Drop for Shard<K> {
    fn drop(&mut self) {
        let writer = self
            .writer
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Every allocated entry is linked or in limbo: drop their keys.
        // Relaxed: `&mut self` orders every earlier write before this.
        let index = self.index.load(Ordering::Relaxed);
        let mut allocated: Vec<u32> = writer.limbo.iter().map(|l| l.entry).collect();
        // SAFETY: `&mut self`: no reader holds the index, and it was never retired.
        let index = unsafe { Box::from_raw(index) };
        allocated.extend(index.slots.iter().filter_map(|s| {
            // Relaxed: `&mut self` orders every earlier write before this.
            entry_of(s.load(Ordering::Relaxed))
        }));
        drop(index);
        for retired in writer.retired.drain(..) {
            // SAFETY: `&mut self`: no reader exists any more.
            unsafe { retired.free() };
        }
        for entry in allocated {
            let (chunk, offset) = locate(entry);
            // Relaxed: as above.
            let base = self.chunks[chunk].load(Ordering::Relaxed);
            // SAFETY: an allocated entry lies in a published chunk, and its key
            // was initialized when it was allocated and not dropped since.
            unsafe {
                (*base.add(offset))
                    .key
                    .with_mut(|k| (*k).assume_init_drop())
            };
        }
        for (chunk, base) in self.chunks.iter().enumerate() {
            // Relaxed: as above.
            let base = base.load(Ordering::Relaxed);
            if !base.is_null() {
                let slice = ptr::slice_from_raw_parts_mut(base, chunk_len(chunk));
                // SAFETY: the chunk came from `Box::into_raw` of a slice of
                // this length and is freed nowhere else.
                drop(unsafe { Box::from_raw(slice) });
            }
        }
    }
}

/// A shard with its writer lock held.
pub(crate) struct Locked<'a, K> {
    shard: &'a Shard<K>,
    writer: MutexGuard<'a, Writer>,
}

impl<'a, K> Locked<'a, K> {
    /// The published index: only writers publish, and this one holds the lock.
    fn index(&self) -> &'a Index {
        // Relaxed: the mutex's acquire orders the last publication before us.
        let index = self.shard.index.load(Ordering::Relaxed);
        // SAFETY: only a writer retires the published index, and this one
        // holds the lock; it stays published until this writer replaces it.
        unsafe { &*index }
    }

    /// The bookkeeping behind the lock.
    pub(crate) fn writer(&mut self) -> &mut Writer {
        &mut self.writer
    }

    /// Entries linked in this shard's index.
    pub(crate) fn linked(&self) -> usize {
        self.writer.linked
    }

    /// The word of entry `entry` (one the caller got from this lock).
    pub(crate) fn cell(&self, entry: u32) -> &'a Cell {
        &self.shard.entry(entry).cell
    }

    /// The entry of `key`, if linked.
    pub(crate) fn find<Q>(&self, hash: u64, key: &Q) -> Option<u32>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.shard
            .probe(self.index(), hash, key)
            .map(|(number, _)| number)
    }

    /// `key`'s entry, if it waits in limbo.
    pub(crate) fn find_in_limbo<Q>(&self, hash: u64, key: &Q) -> Option<u32>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let hash = limbo_hash(hash);
        self.writer
            .limbo
            .find(hash, |l| {
                l.hash == hash && self.shard.key_is(self.shard.entry(l.entry), key)
            })
            .map(|l| l.entry)
    }

    /// Take `entry` (found by [`find_in_limbo`](Self::find_in_limbo) for
    /// `hash`, under this same lock and with no sweep since) out of limbo, to
    /// link it again.
    pub(crate) fn remove_from_limbo(&mut self, hash: u64, entry: u32) {
        let hash = limbo_hash(hash);
        let found = self.writer.limbo.find_entry(hash, |l| l.entry == entry);
        debug_assert!(found.is_ok(), "entry {entry} is not in limbo");
        if let Ok(found) = found {
            found.remove();
        }
    }

    /// Every entry whose word still counts: those linked in the index and
    /// those waiting in limbo (which a returning key links again).
    pub(crate) fn for_each_held(&self, mut f: impl FnMut(&Cell)) {
        let index = self.index();
        for slot in index.slots.iter() {
            // Relaxed: the writer's own slots (this lock is held).
            if let Some(entry) = entry_of(slot.load(Ordering::Relaxed)) {
                f(&self.shard.entry(entry).cell);
            }
        }
        for limbo in self.writer.limbo.iter() {
            f(&self.shard.entry(limbo.entry).cell);
        }
    }

    /// Slots in the published index.
    pub(crate) fn capacity(&self) -> usize {
        self.index().capacity()
    }

    /// Allocate an entry for `key` with `word`, unlinked; `None` when the arena
    /// is full.
    pub(crate) fn allocate(&mut self, key: K, word: u64) -> Option<u32> {
        let entry = match self.writer.free.pop() {
            Some(Reverse(entry)) => entry,
            None => {
                if u64::from(self.writer.next) >= ARENA_CAPACITY {
                    return None;
                }
                let entry = self.writer.next;
                let (chunk, offset) = locate(entry);
                if offset == 0 {
                    let fresh: Box<[Entry<K>]> =
                        (0..chunk_len(chunk)).map(|_| Entry::vacant()).collect();
                    // Release: the chunk's entries are initialized before a
                    // reader can load its address.
                    self.shard.chunks[chunk]
                        .store(Box::into_raw(fresh).cast::<Entry<K>>(), Ordering::Release);
                }
                self.writer.next += 1;
                entry
            }
        };
        let slot = self.shard.entry(entry);
        // SAFETY: the entry is free: no index slot names it, and its last
        // grace period has passed, so no reader can read its key.
        slot.key.with_mut(|k| unsafe { (*k).write(key) });
        slot.cell.set(word);
        Some(entry)
    }

    /// Link `entry` (allocated, not linked) under `hash`. May publish a larger
    /// index first, rehashing linked keys with `hash_of`.
    pub(crate) fn link(
        &mut self,
        hash: u64,
        entry: u32,
        collector: &Collector,
        hash_of: impl Fn(&K) -> u64,
    ) {
        if (self.writer.used + 1) * 4 > self.index().capacity() * 3 {
            let capacity = ((self.writer.linked + 1) * 2)
                .next_power_of_two()
                .max(MIN_INDEX);
            self.rebuild(capacity, collector, &hash_of);
        }
        let index = self.index();
        let pos = index.vacancy(hash);
        // Relaxed: the writer's own slot.
        if index.slots[pos].load(Ordering::Relaxed) == EMPTY {
            self.writer.used += 1;
        }
        // Release: the entry's key and word, written before, are visible to a
        // reader whose acquire load finds this slot.
        index.slots[pos].store(full(hash, entry), Ordering::Release);
        self.writer.linked += 1;
    }

    /// Publish a new index of `capacity` slots holding the linked entries, and
    /// retire the old one.
    fn rebuild(&mut self, capacity: usize, collector: &Collector, hash_of: &impl Fn(&K) -> u64) {
        let old = self.index();
        let new = Index::with_capacity(capacity);
        for slot in old.slots.iter() {
            // Relaxed: the writer's own slots.
            if let Some(entry) = entry_of(slot.load(Ordering::Relaxed)) {
                // SAFETY: a linked entry has its key.
                let hash = self
                    .shard
                    .entry(entry)
                    .key
                    .with(|k| hash_of(unsafe { (*k).assume_init_ref() }));
                let pos = new.vacancy(hash);
                // Relaxed: the index is published below with Release.
                new.slots[pos].store(full(hash, entry), Ordering::Relaxed);
            }
        }
        // Release: pairs with readers' Acquire load of the index: the slots
        // written above are visible through it.
        let old = self
            .shard
            .index
            .swap(Box::into_raw(Box::new(new)), Ordering::Release);
        self.writer.used = self.writer.linked;
        self.writer.cursor = 0;
        self.writer.retired.push(Retired {
            index: old,
            snapshot: collector.snapshot(),
        });
        self.free_retired(collector);
    }

    /// Free the retired indexes whose readers have all unpinned.
    fn free_retired(&mut self, collector: &Collector) {
        let mut i = 0;
        while i < self.writer.retired.len() {
            if self.writer.retired[i].snapshot.passed(collector) {
                let retired = self.writer.retired.swap_remove(i);
                // SAFETY: unpublished before its snapshot, which has passed;
                // only this writer (under the lock) frees retired indexes.
                unsafe { retired.free() };
            } else {
                i += 1;
            }
        }
    }

    /// First free the entries in limbo whose grace period has passed and whose
    /// words `evictable` still accepts, and report how many to `freed` (so
    /// that their places count as room at once). Then unlink the linked
    /// entries whose words `evictable` accepts into limbo, examining at most
    /// `budget` index slots from where the last bounded sweep stopped
    /// (`usize::MAX`: the whole index), while `limbo_room` grants a place in
    /// limbo for each.
    pub(crate) fn sweep(
        &mut self,
        evictable: impl Fn(u64) -> bool,
        budget: usize,
        freed: impl FnOnce(usize),
        mut limbo_room: impl FnMut() -> bool,
        collector: &Collector,
        hash_of: impl Fn(&K) -> u64,
    ) -> Swept {
        let mut swept = Swept {
            unlinked: 0,
            freed: self.collect(&evictable, collector),
        };
        // Before unlinking: the places in limbo just freed are room for this
        // sweep's own unlinks.
        freed(swept.freed);
        let index = self.index();
        let capacity = index.capacity();
        let whole = budget >= capacity;
        let start = if whole { 0 } else { self.writer.cursor };
        let examine = budget.min(capacity);
        let batch = self.writer.batch + 1;
        for i in 0..examine {
            let pos = (start + i) & index.mask;
            // Relaxed: the writer's own slot.
            let slot = index.slots[pos].load(Ordering::Relaxed);
            let Some(entry) = entry_of(slot) else {
                continue;
            };
            if !evictable(self.shard.entry(entry).cell.load()) {
                continue;
            }
            if !limbo_room() {
                break;
            }
            // Release: orders nothing a reader needs (a reader that still sees
            // the full slot finds an entry that stays allocated); Release keeps
            // every slot store alike.
            index.slots[pos].store(DELETED, Ordering::Release);
            self.writer.linked -= 1;
            self.writer.limbo.insert_unique(
                limbo_hash(slot),
                Limbo {
                    hash: limbo_hash(slot),
                    entry,
                    batch,
                },
                |l| l.hash,
            );
            swept.unlinked += 1;
        }
        if !whole {
            self.writer.cursor = (start + examine) & index.mask;
        }
        if swept.unlinked > 0 {
            self.writer.batch = batch;
            let snapshot = collector.snapshot();
            self.writer.pending.push_back((batch, snapshot));
        }
        // Give memory back once the index is mostly empty or mostly tombstones.
        let capacity = self.index().capacity();
        let sparse = capacity > MIN_INDEX && self.writer.linked * 8 < capacity;
        let tombstones =
            self.writer.used * 2 > capacity && self.writer.linked * 4 < self.writer.used;
        if sparse || tombstones {
            let capacity = ((self.writer.linked + 1) * 2)
                .next_power_of_two()
                .max(MIN_INDEX);
            self.rebuild(capacity, collector, &hash_of);
        }
        swept
    }

    /// Free the entries in limbo whose grace period has passed and whose words
    /// `evictable` accepts now; returns how many.
    fn collect(&mut self, evictable: &impl Fn(u64) -> bool, collector: &Collector) -> usize {
        self.free_retired(collector);
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
        let shard = self.shard;
        let Writer { limbo, free, .. } = &mut *self.writer;
        let before = limbo.len();
        limbo.retain(|l| {
            if l.batch > past {
                return true;
            }
            let entry = shard.entry(l.entry);
            // The loom mutant `no_recheck` frees without judging the word again.
            if !(evictable(entry.cell.load()) || cfg!(turnstile_mutant = "no_recheck")) {
                // A decision ran on it after the unlink: it stays, and a
                // decision for its key links it again.
                return true;
            }
            // SAFETY: the entry is unlinked and its grace period has passed, so
            // no reader can reach it; its key is initialized (it was linked).
            entry.key.with_mut(|k| unsafe { (*k).assume_init_drop() });
            free.push(Reverse(l.entry));
            false
        });
        before - limbo.len()
    }
}

#[cfg(all(test, not(turnstile_loom)))]
mod tests {
    use super::*;

    #[test]
    fn entries_map_to_chunks_without_gaps_or_overlap() {
        let mut expected = (0, 0);
        for entry in 0..100_000u32 {
            assert_eq!(locate(entry), expected, "entry {entry}");
            expected.1 += 1;
            if expected.1 == chunk_len(expected.0) {
                expected = (expected.0 + 1, 0);
            }
        }
        let last = (ARENA_CAPACITY - 1) as u32;
        assert_eq!(locate(last), (CHUNKS - 1, chunk_len(CHUNKS - 1) - 1));
        assert!(ARENA_CAPACITY + u64::from(FULL_OFFSET) <= u64::from(u32::MAX));
    }

    #[test]
    fn full_slots_are_never_empty_or_deleted() {
        for hash in [0, 1, u64::MAX, TAG, !TAG] {
            for entry in [0, 1, (ARENA_CAPACITY - 1) as u32] {
                let slot = full(hash, entry);
                assert_ne!(slot, EMPTY);
                assert_ne!(slot, DELETED);
                assert_eq!(entry_of(slot), Some(entry));
                assert_eq!(slot & TAG, hash & TAG);
            }
        }
        assert_eq!(entry_of(EMPTY), None);
        assert_eq!(entry_of(DELETED), None);
    }
}
