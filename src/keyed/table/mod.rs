//! One shard of a keyed limiter: an open-addressing table that readers search
//! without a lock, holding each key and its word in the slot its hash names.
//!
//! # Shape
//!
//! The shape of hashbrown's tables, made for lock-free readers:
//!
//! - **Slots** hold `(word, key)` pairs, 16 bytes for a `u64` key, at positions
//!   the key's hash names: a lookup that finds its key has its word on the
//!   same cache line.
//! - **Control bytes**, one per slot, in groups of eight read as one
//!   `AtomicU64`: `EMPTY`, a 7-bit tag of the key's hash (the slot holds a
//!   linked key), `LIMBO` (the slot holds a key a sweep unlinked, still with
//!   its word) or `DEAD` (the key was freed; the slot stays unusable until the
//!   table is rebuilt). A lookup reads a group, compares its key only in the
//!   slots whose tag matches, and stops at a group with an `EMPTY` byte. A
//!   million keys take about 2 MiB of control bytes over all shards, which
//!   mostly stay in the caches, where the map before this one read an index
//!   of 8-byte slots (16 MiB) and then an entry in an arena: a second cache
//!   miss per lookup (BENCHMARKS.md, "Why a million keys cost more than the
//!   floor" and "The keyed table: words inline"). In a table too large for
//!   the caches a lookup also prefetches the slot lines its key most likely
//!   sits in before it reads the control group, so that the two misses
//!   overlap ([`Table::prefetch_home`]).
//! - **Writers** (insert, sweep, rebuild) serialize on the shard's mutex and
//!   change control bytes with release stores of their group. Readers never
//!   take the mutex. A published table's bytes only ever go `EMPTY` → tag
//!   (insert), tag → `LIMBO` (unlink), `LIMBO` → tag (a returning key) and
//!   `LIMBO` → `DEAD` (freed): no byte becomes `EMPTY` again, so no probe
//!   that passed a slot can miss a key behind it, and a slot whose key a
//!   reader may be comparing is never written until the table is replaced.
//!
//! # Eviction without loss: unlink, wait out the readers, free only if still fresh
//!
//! A sweep that judges a word fresh-equivalent only *unlinks* it: its control
//! byte becomes `LIMBO`, and key and word stay in the slot. A decision that
//! found the slot before the unlink may still be running on its word, and its
//! compare-and-swap lands in the slot, which still holds it. The key is freed
//! (its byte `DEAD`) only when both hold:
//! 1. every reader pinned at the unlink has unpinned (a grace period,
//!    `crate::reclaim`), so no decision can still reach the word; and
//! 2. the word is fresh-equivalent at a clock reading taken by the writer under
//!    the shard's lock, after (1) has made it final.
//!
//! A decision for the key that arrives meanwhile does not find it (readers
//! pass `LIMBO` bytes) and takes the writer's path, which finds it in limbo and
//! links it again, so it decides on the key's real state. So no admission is
//! ever counted on a word that is then thrown away, and no decision ever starts
//! over from a fresh word while the old one could still change.
//!
//! # Rebuilds move words, so they close the table first
//!
//! Growing, shrinking or dropping `DEAD` slots builds a new table and moves
//! every held key and word into it. A decision must not land its
//! compare-and-swap in a word that has been copied, so a rebuild:
//! 1. marks the published table *closed* (the low bit of the shard's pointer)
//!    and takes a snapshot of the readers pinned: a reader that sees the mark
//!    takes the writer's path, which decides under the shard's mutex on the
//!    closed table's words;
//! 2. lets the lock go and waits for nothing: the first writer (an insert, a
//!    sweep, or a decision sent to the writer's path) to find the snapshot
//!    passed finishes the rebuild ([`Locked::settle`]); by then no decision
//!    can still be running on a word of the old table without the lock, and
//!    every word is final;
//! 3. judges each key in limbo once, freeing those whose words are
//!    fresh-equivalent, copies the rest into a table built aside, publishes
//!    it and frees the old one at once (no reader can reach it).
//!
//! So a reader stuck while pinned (descheduled, stopped) holds back only
//! this limiter's rebuilds, and decisions on the shard go on under its
//! mutex meanwhile; new keys go into the closed table until it is 7/8 full,
//! and past that wait for the rebuild. A rebuild happens when the table's
//! load passes 3/4 (so at most once per doubling) or falls below 1/8.
//!
//! Memory is bounded: slots hold linked keys (the keyed limiter bounds these by
//! its `max_keys`), keys in limbo (bounded by the same number again) or dead
//! slots, which a rebuild drops; a rebuild sizes the table for the keys it
//! keeps, so a table shrinks once a flood's keys are swept.

use core::borrow::Borrow;
use core::mem::MaybeUninit;
use std::collections::VecDeque;

use hashbrown::HashTable;

use crate::cell::Cell;
use crate::reclaim::{Busy, Guard, Snapshot};
use crate::sync::{
    AtomicPtr, AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering, UnsafeCell, lock,
};

// Limbo and the sweeps that fill and empty it; rebuilds. Both read and
// write keys in place, as the table's own code does.
#[allow(unsafe_code)]
mod limbo;
#[allow(unsafe_code)]
mod rebuild;

use limbo::Limbo;
use rebuild::Closing;
pub(crate) use rebuild::NoRoom;

/// Slots per control group.
const GROUP: usize = 8;
/// The smallest table: one group.
const MIN_CAPACITY: usize = GROUP;
/// The largest table: slot numbers fit in a `u32` with room to spare.
const MAX_CAPACITY: usize = 1 << 31;

/// A slot that never held a key: a probe for a key stops at its group.
const EMPTY: u8 = 0xFF;
/// A slot whose key a sweep unlinked; key and word are still there.
const LIMBO: u8 = 0x80;
/// A slot whose key was freed; unusable until the table is rebuilt.
const DEAD: u8 = 0x82;
/// Every byte of a group.
const LSB: u64 = 0x0101_0101_0101_0101;
/// The top bit of every byte of a group: clear only in a linked slot's tag.
const MSB: u64 = 0x8080_8080_8080_8080;
/// The low bit of the shard's table pointer: the table is closed for a rebuild.
const CLOSED: usize = 1;

/// The tag of a key's hash: 7 bits that neither the group index (the low
/// bits) nor the shard (the top bits) uses.
#[inline(always)]
const fn tag(hash: u64) -> u8 {
    ((hash >> 40) & 0x7F) as u8
}

/// The bytes of `group` equal to `tag`, as their top bits. May also report a
/// byte one above a match (the borrow of the subtraction), which is then also
/// a tag: every report is a linked slot, and the caller compares its key.
#[inline(always)]
const fn match_tag(group: u64, tag: u8) -> u64 {
    let x = group ^ (LSB * tag as u64);
    x.wrapping_sub(LSB) & !x & MSB
}

/// Whether `group` has an `EMPTY` byte (the only one with both top bits set).
#[inline(always)]
const fn has_empty(group: u64) -> bool {
    empties(group) != 0
}

/// The `EMPTY` bytes of `group`, as their top bits: exact, since `EMPTY` is the
/// only control byte with both top bits set.
#[inline(always)]
const fn empties(group: u64) -> u64 {
    group & (group << 1) & MSB
}

/// The bytes of `group` equal to `byte`, as their top bits (exact: no
/// borrow crosses bytes, unlike [`match_tag`]).
#[inline(always)]
const fn equal_bytes(group: u64, byte: u8) -> u64 {
    let x = group ^ (LSB * byte as u64);
    // A byte of `x` is zero exactly when neither its low seven bits carry
    // into its top bit nor its top bit is set.
    !(((x & !MSB) + !MSB) | x) & MSB
}

/// The bytes of `group` that hold a key (linked or in limbo), as their top
/// bits.
#[inline(always)]
const fn holding(group: u64) -> u64 {
    (!group & MSB) | equal_bytes(group, LIMBO)
}

/// The slot numbers of group `group` named by the top bits in `mask`.
#[inline(always)]
fn positions(group: usize, mut mask: u64) -> impl Iterator<Item = usize> {
    core::iter::from_fn(move || {
        if mask == 0 {
            return None;
        }
        let pos = group * GROUP + (mask.trailing_zeros() / 8) as usize;
        mask &= mask - 1;
        Some(pos)
    })
}

/// Byte `i` of `group`.
#[inline(always)]
const fn byte(group: u64, i: usize) -> u8 {
    (group >> (8 * i)) as u8
}

/// Whether a control byte names a linked key.
#[inline(always)]
const fn is_linked(ctrl: u8) -> bool {
    ctrl & 0x80 == 0
}

/// Whether a control byte's slot holds a key (linked or in limbo).
#[cfg(test)]
const fn holds_key(ctrl: u8) -> bool {
    is_linked(ctrl) || ctrl == LIMBO
}

/// One slot. Aligned to 16 bytes so that a 16-byte slot (a `u64` key) never
/// straddles two cache lines.
#[repr(align(16))]
struct Slot<K> {
    cell: Cell,
    /// Initialized while the slot's control byte is a tag or `LIMBO`; read by
    /// readers only through a tag they loaded with acquire.
    key: UnsafeCell<MaybeUninit<K>>,
}

/// The slots of one control group, starting on a cache line: eight 16-byte
/// slots (a `u64` key) fill exactly two lines, which a lookup fetches before
/// it knows which slot holds its key ([`Table::prefetch_home`]).
#[repr(C, align(64))]
struct SlotGroup<K>([Slot<K>; GROUP]);

/// One table: control groups and slots.
struct Table<K> {
    /// `groups - 1`.
    group_mask: usize,
    /// Whether a lookup prefetches its key's likely slots
    /// ([`Table::prefetch_home`]): only in tables too large for the caches.
    prefetch: bool,
    ctrl: Box<[AtomicU64]>,
    slots: Box<[SlotGroup<K>]>,
}

/// The size of a keyed limiter's tables (all shards together) from which a
/// lookup prefetches its slots: twice a large L2 cache, beyond what one core
/// keeps cached.
///
/// Below it the slots are mostly cached, a prefetch saves nothing, and it
/// costs: it pulls in the lines around the key, whose words other threads may
/// be writing, and each such line must then be taken back from this core
/// before their next write. Two threads admitting on 1,024 keys each made
/// 22–23 M decisions per second with prefetching against 33–34 M without
/// (one thread: 38 M either way); BENCHMARKS.md, "Fetching the slots with
/// the control group".
const PREFETCH_FROM_BYTES: usize = 4 << 20;

/// The smallest table, in slots, of a limiter with `shards` shards whose
/// lookups prefetch ([`PREFETCH_FROM_BYTES`] over all shards).
pub(crate) fn prefetch_from<K>(shards: usize) -> usize {
    PREFETCH_FROM_BYTES / core::mem::size_of::<Slot<K>>() / shards.max(1)
}

/// Ask the processor to bring the cache line at `ptr` into its caches. Only a
/// hint: it reads nothing the program can see and never faults.
#[inline(always)]
fn prefetch<T>(ptr: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht0` needs SSE, which every x86-64 processor has; it
    // never faults and has no effect the program can observe, whatever the
    // address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(ptr.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}

impl<K> Table<K> {
    /// An empty table of `capacity` slots; its lookups prefetch if
    /// `capacity` is at least `prefetch_from`.
    fn with_capacity(capacity: usize, prefetch_from: usize) -> Table<K> {
        debug_assert!(capacity.is_power_of_two() && capacity >= MIN_CAPACITY);
        let groups = capacity / GROUP;
        Table {
            group_mask: groups - 1,
            prefetch: capacity >= prefetch_from,
            ctrl: (0..groups)
                .map(|_| AtomicU64::new(LSB * EMPTY as u64))
                .collect(),
            slots: (0..groups)
                .map(|_| {
                    SlotGroup(core::array::from_fn(|_| Slot {
                        cell: Cell::new(0),
                        key: UnsafeCell::new(MaybeUninit::uninit()),
                    }))
                })
                .collect(),
        }
    }

    fn capacity(&self) -> usize {
        self.slots.len() * GROUP
    }

    /// Slot `pos`.
    #[inline(always)]
    fn slot(&self, pos: usize) -> &Slot<K> {
        &self.slots[pos / GROUP].0[pos % GROUP]
    }

    /// Start fetching the lines where `hash`'s key most likely sits: the
    /// first two of its home group (the whole group for a `u64` key) and the
    /// first of the next group, where a probe goes when the home group is
    /// full. Issued before the control group is read, so that the slot's
    /// miss overlaps the control group's instead of following it: on a
    /// million keys this takes a check from two dependent misses to about
    /// one (BENCHMARKS.md, "Fetching the slots with the control group").
    #[inline(always)]
    fn prefetch_home(&self, hash: u64) {
        let home = hash as usize & self.group_mask;
        let groups = self.slots.as_ptr();
        let group = groups.wrapping_add(home);
        prefetch(group);
        prefetch(group.cast::<u8>().wrapping_add(64));
        prefetch(groups.wrapping_add((home + 1) & self.group_mask));
    }

    /// The slots holding a key (linked or in limbo), in order, a control
    /// group at a time. For the writer (its lock, or a table no reader
    /// reaches).
    fn held(&self) -> impl Iterator<Item = usize> + '_ {
        self.groups()
            .flat_map(|(group, bytes)| positions(group, holding(bytes)))
    }

    /// Each control group's number and bytes, in order. For the writer.
    fn groups(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        // Relaxed: the writer's own bytes.
        (self.ctrl.iter().map(|ctrl| ctrl.load(Ordering::Relaxed))).enumerate()
    }

    /// Set slot `pos`'s control byte. Writer only.
    fn set_ctrl(&self, pos: usize, ctrl: u8) {
        let group = &self.ctrl[pos / GROUP];
        let shift = 8 * (pos % GROUP);
        // Relaxed: the writer's own group.
        let old = group.load(Ordering::Relaxed);
        let new = (old & !(0xFF << shift)) | (u64::from(ctrl) << shift);
        // Release: a reader whose acquire load sees a new tag sees the key and
        // word written before it.
        group.store(new, Ordering::Release);
    }

    /// Walk `hash`'s probe sequence a group at a time: `visit(group, ctrl)`
    /// with each group's control bytes, loaded with `order`, until it returns
    /// `Some`, or up to and including the first group with an `EMPTY` byte
    /// (`None`: a key on this path would have been placed there or before).
    /// Triangular probing visits every group of a power-of-two table, and one
    /// group is always `EMPTY` somewhere (the load stays below 3/4), so the walk
    /// ends.
    #[inline(always)]
    fn probe<R>(
        &self,
        hash: u64,
        order: Ordering,
        mut visit: impl FnMut(usize, u64) -> Option<R>,
    ) -> Option<R> {
        let mut group = hash as usize & self.group_mask;
        let mut stride = 0;
        loop {
            let ctrl = self.ctrl[group].load(order);
            if let Some(found) = visit(group, ctrl) {
                return Some(found);
            }
            if has_empty(ctrl) {
                return None;
            }
            stride += 1;
            group = (group + stride) & self.group_mask;
        }
    }

    /// The slot of the linked key `key`. The caller keeps the table
    /// allocated: it holds a pin taken before it loaded the table, or the
    /// writer lock.
    #[inline(always)]
    fn find<Q>(&self, hash: u64, key: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let tag = tag(hash);
        if self.prefetch {
            self.prefetch_home(hash);
        }
        // Acquire: pairs with the writer's Release store of the group, made
        // after it wrote the slot's key and word.
        self.probe(hash, Ordering::Acquire, |group, ctrl| {
            let mut matches = match_tag(ctrl, tag);
            while matches != 0 {
                let pos = group * GROUP + (matches.trailing_zeros() / 8) as usize;
                if self.key_is(pos, key) {
                    return Some(pos);
                }
                matches &= matches - 1;
            }
            None
        })
    }

    /// The slot of `key` if it waits in limbo. Writer only.
    fn find_in_limbo<Q>(&self, hash: u64, key: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        // Relaxed: the writer's own bytes.
        self.probe(hash, Ordering::Relaxed, |group, ctrl| {
            positions(group, equal_bytes(ctrl, LIMBO)).find(|&pos| self.key_is(pos, key))
        })
    }

    /// The first `EMPTY` slot on `hash`'s probe path. Writer only.
    fn vacancy(&self, hash: u64) -> usize {
        // Relaxed: the writer's own bytes.
        self.probe(hash, Ordering::Relaxed, |group, ctrl| {
            positions(group, empties(ctrl)).next()
        })
        .unwrap_or_default()
    }

    /// Whether slot `pos`, whose control byte the caller read as a tag or
    /// `LIMBO` (acquire, or under the lock), holds `key`.
    #[inline(always)]
    fn key_is<Q>(&self, pos: usize, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        // SAFETY: the key was written before its control byte was published
        // (the caller's acquire load, or its lock), and it is dropped or moved
        // only by a writer under the lock, after a grace period that waits
        // for every pin under which the byte could be read as a tag.
        self.slot(pos)
            .key
            .with(|k| unsafe { (*k).assume_init_ref() }.borrow() == key)
    }

    /// Write `key` and `word` into slot `pos`, which is `EMPTY`, and give it
    /// control byte `ctrl` (a tag: linked; or `LIMBO`). Writer only.
    fn put(&self, pos: usize, key: K, word: u64, ctrl: u8) {
        let slot = self.slot(pos);
        // SAFETY: the slot is `EMPTY`: it never held a key in this table, so
        // no reader reads it (readers read keys only behind a tag).
        slot.key.with_mut(|k| unsafe { (*k).write(key) });
        slot.cell.set(word);
        self.set_ctrl(pos, ctrl);
    }
}

impl<K> Drop for Table<K> {
    fn drop(&mut self) {
        if crate::sync::unwinding_under_loom() {
            return;
        }
        if !core::mem::needs_drop::<K>() {
            return;
        }
        for pos in self.held() {
            // SAFETY: the byte says the key is initialized, and `&mut self`
            // means no reader holds the table.
            self.slot(pos)
                .key
                .with_mut(|k| unsafe { (*k).assume_init_drop() });
        }
    }
}

/// [`Writer::swept_at`] of a shard not swept yet.
pub(crate) const NEVER_SWEPT: u64 = u64::MAX;

/// What the shard's mutex guards.
pub(crate) struct Writer {
    /// Linked keys.
    linked: usize,
    /// Slots not `EMPTY`: linked, in limbo or dead.
    used: usize,
    /// The keys in limbo, by slot.
    limbo: HashTable<Limbo>,
    /// The last sweep batch.
    batch: u64,
    /// Sweep batches whose grace period may not have passed, oldest first.
    pending: VecDeque<(u64, Snapshot)>,
    /// Every batch up to this one has passed its grace period.
    passed: u64,
    /// The rebuild waiting for its grace period, if any.
    closing: Option<Closing>,
    /// A new key gave up waiting for that rebuild: until it finishes, new
    /// keys past 7/8 are refused without waiting.
    pub(crate) gave_up_waiting: bool,
    /// Where the next bounded sweep of this shard starts.
    cursor: usize,
    /// Inserts since the last full sweep, and how many trigger the next.
    pub(crate) inserts_since_sweep: usize,
    pub(crate) sweep_threshold: usize,
    /// The clock reading of the last full sweep ([`NEVER_SWEPT`] before the
    /// first): the next sweep that inserts trigger unlinks only keys idle
    /// since then.
    pub(crate) swept_at: u64,
    pub(crate) denied_key_limit: u64,
    pub(crate) evicted: u64,
}

/// The limiter's counts that a shard's changes keep, at the moment of each
/// change (so that a panic in user code between two changes loses none).
pub(crate) struct Counts<'a> {
    /// Keys linked, across shards (the key bound's count).
    pub(crate) linked: &'a AtomicUsize,
    /// Keys in limbo, across shards.
    pub(crate) limbo: &'a AtomicUsize,
    /// The bound on each.
    pub(crate) max_keys: usize,
}

impl Counts<'_> {
    /// Take one place in limbo under its bound.
    fn reserve_limbo(&self) -> bool {
        super::reserve(self.limbo, self.max_keys)
    }

    fn left_limbo(&self) {
        // Relaxed: as in `reserve_limbo`.
        self.limbo.fetch_sub(1, Ordering::Relaxed);
    }

    fn unlinked(&self) {
        // Relaxed: as in `reserve_limbo`.
        self.linked.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One shard.
pub(crate) struct Shard<K> {
    /// The published table; its low bit set ([`CLOSED`]) while a rebuild
    /// waits to move its words.
    table: AtomicPtr<Table<K>>,
    /// Tables of this many slots or more prefetch ([`prefetch_from`]).
    prefetch_from: usize,
    /// Linked keys, as the last writer left them ([`Shard::linked_hint`]).
    linked: AtomicUsize,
    writer: Mutex<Writer>,
}

// SAFETY:
// - a shard owns its keys (in its table) and shares them with readers on other
//   threads as `&K`: sending a shard sends the keys (`K: Send`), and sharing it
//   shares `&K` across threads (`K: Sync`);
// - its raw pointer points to a table it owns, made only of atomics and keys;
// - every other field is an atomic, behind the mutex, or never written after
//   the shard is made.
unsafe impl<K: Send> Send for Shard<K> {}
// SAFETY: as above.
unsafe impl<K: Send + Sync> Sync for Shard<K> {}

impl<K> Shard<K> {
    /// An empty shard; its tables of `prefetch_from` slots or more prefetch
    /// ([`prefetch_from`]).
    pub(crate) fn new(sweep_threshold: usize, prefetch_from: usize) -> Shard<K> {
        Shard {
            table: AtomicPtr::new(Box::into_raw(Box::new(Table::with_capacity(
                MIN_CAPACITY,
                prefetch_from,
            )))),
            prefetch_from,
            linked: AtomicUsize::new(0),
            writer: Mutex::new(Writer {
                linked: 0,
                used: 0,
                limbo: HashTable::new(),
                batch: 0,
                pending: VecDeque::new(),
                passed: 0,
                closing: None,
                gave_up_waiting: false,
                cursor: 0,
                inserts_since_sweep: 0,
                sweep_threshold,
                swept_at: NEVER_SWEPT,
                denied_key_limit: 0,
                evicted: 0,
            }),
        }
    }

    /// The word of `key`, if it is linked: the lock-free read path. `None`
    /// also while a rebuild has the table closed (the writer's path then
    /// decides under the lock).
    ///
    /// The word stays in place while `guard` is held, even if a sweep unlinks
    /// it meanwhile (it then waits in limbo, and a decision on it is kept),
    /// and no rebuild moves it.
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
        // Acquire: pairs with the Release that published this table, after
        // its slots were written.
        let table = self.table.load(Ordering::Acquire);
        if table.addr() & CLOSED != 0 {
            return None;
        }
        // SAFETY: a rebuild frees a table only after closing it and then
        // seeing every pin taken before (such as `_guard`) released; a reader
        // that pinned later sees it closed (the grace period's barrier) and
        // does not dereference it. So it is alive for `'g`.
        let table = unsafe { &*table };
        table.find(hash, key).map(|pos| &table.slot(pos).cell)
    }

    /// Take the shard's writer lock. `_busy`: the caller is marked as on the
    /// limiter's writer's path, so that user code run under the lock cannot
    /// enter the limiter again and wait for it.
    pub(crate) fn lock(&self, _busy: &Busy<'_>) -> Locked<'_, K> {
        Locked {
            shard: self,
            writer: lock(&self.writer),
        }
    }

    /// Linked keys in this shard as the last writer left them, read without
    /// the lock: a look for sweepable keys passes over a shard with none
    /// without locking it.
    pub(crate) fn linked_hint(&self) -> usize {
        // Relaxed: a hint. A stale count makes a look lock a shard with
        // nothing to sweep, or pass over one whose keys a later look finds.
        self.linked.load(Ordering::Relaxed)
    }

    /// Take the shard's writer lock if no one holds it.
    pub(crate) fn try_lock(&self, _busy: &Busy<'_>) -> Option<Locked<'_, K>> {
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
        if crate::sync::unwinding_under_loom() {
            return;
        }
        // Relaxed: `&mut self` orders every earlier write before this.
        let table = self.table.load(Ordering::Relaxed).map_addr(|a| a & !CLOSED);
        // SAFETY: the table came from `Box::into_raw` (closed or not), and
        // `&mut self` means no reader holds it. Its drop drops its keys.
        drop(unsafe { Box::from_raw(table) });
    }
}

/// A shard with its writer lock held.
pub(crate) struct Locked<'a, K> {
    shard: &'a Shard<K>,
    writer: MutexGuard<'a, Writer>,
}

impl<K> Drop for Locked<'_, K> {
    fn drop(&mut self) {
        if crate::sync::unwinding_under_loom() {
            return;
        }
        // Relaxed: a hint (see `Shard::linked_hint`), stored before the lock
        // is let go.
        self.shard
            .linked
            .store(self.writer.linked, Ordering::Relaxed);
    }
}

impl<K> Locked<'_, K> {
    /// The published table, closed or not: only writers publish, and this one
    /// holds the lock.
    fn table(&self) -> &Table<K> {
        // Relaxed: the mutex's acquire orders the last publication before us.
        let table = self
            .shard
            .table
            .load(Ordering::Relaxed)
            .map_addr(|a| a & !CLOSED);
        // SAFETY: only a writer replaces or frees the published table, and
        // this one holds the lock: the table stays allocated while `self` is
        // borrowed.
        unsafe { &*table }
    }

    /// The bookkeeping behind the lock.
    pub(crate) fn writer(&mut self) -> &mut Writer {
        &mut self.writer
    }

    /// Linked keys in this shard.
    pub(crate) fn linked(&self) -> usize {
        self.writer.linked
    }

    /// The word of slot `pos` (one the caller got from this lock, with no
    /// insert, sweep or settle since).
    pub(crate) fn cell(&self, pos: u32) -> &Cell {
        &self.table().slot(pos as usize).cell
    }

    /// The slot of `key`, if linked.
    #[inline]
    pub(crate) fn find<Q>(&self, hash: u64, key: &Q) -> Option<u32>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.table().find(hash, key).map(|pos| pos as u32)
    }

    /// The slot of `key`, if it waits in limbo.
    #[inline]
    pub(crate) fn find_in_limbo<Q>(&self, hash: u64, key: &Q) -> Option<u32>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        if self.writer.limbo.is_empty() {
            // No slot is `LIMBO`: nothing to probe for.
            return None;
        }
        self.table().find_in_limbo(hash, key).map(|pos| pos as u32)
    }

    /// Every word that still counts: linked keys' and those in limbo (which a
    /// returning key links again).
    pub(crate) fn for_each_held(&self, mut f: impl FnMut(&Cell)) {
        let table = self.table();
        for pos in table.held() {
            f(&table.slot(pos).cell);
        }
    }

    /// Slots in the published table.
    pub(crate) fn capacity(&self) -> usize {
        self.table().capacity()
    }

    /// Store `key` (not held: neither linked nor in limbo) with `word`,
    /// linked, in a slot [`make_room`](Self::make_room) made room for.
    pub(crate) fn put_new(&mut self, hash: u64, key: K, word: u64) -> u32 {
        let table = self.table();
        let pos = table.vacancy(hash);
        table.put(pos, key, word, tag(hash));
        self.writer.used += 1;
        self.writer.linked += 1;
        pos as u32
    }
}

#[cfg(all(test, not(turnstile_loom)))]
mod tests {
    use super::*;

    fn group(bytes: [u8; 8]) -> u64 {
        u64::from_le_bytes(bytes)
    }

    #[test]
    fn each_slot_group_starts_a_cache_line_and_a_u64_group_fills_two() {
        // `prefetch_home` fetches a group's first two lines: for `u64` keys
        // that is the whole group only if groups start on a line.
        assert_eq!(core::mem::size_of::<SlotGroup<u64>>(), 128);
        for capacity in [MIN_CAPACITY, 64, 4096] {
            let table = Table::<u64>::with_capacity(capacity, usize::MAX);
            assert_eq!(table.capacity(), capacity);
            for group in 0..capacity / GROUP {
                let first = table.slot(group * GROUP) as *const Slot<u64>;
                assert_eq!(first.addr() % 64, 0, "group {group} of {capacity}");
                let last = table.slot(group * GROUP + GROUP - 1) as *const Slot<u64>;
                assert_eq!(last.addr() - first.addr(), 112);
            }
        }
        // Larger keys take more lines per group, never padding between slots.
        assert_eq!(core::mem::size_of::<SlotGroup<String>>(), 8 * 32);
    }

    #[test]
    fn only_tables_larger_than_the_caches_prefetch() {
        // 4 MiB over all shards: 8 shards of 16-byte slots from 32,768 slots.
        let from = prefetch_from::<u64>(8);
        assert_eq!(from, 32_768);
        assert!(Table::<u64>::with_capacity(from, from).prefetch);
        assert!(!Table::<u64>::with_capacity(from / 2, from).prefetch);
        // Larger slots reach the size with fewer of them.
        assert_eq!(prefetch_from::<String>(8), 16_384);
    }

    #[test]
    fn exact_byte_masks_name_exactly_the_bytes_asked_for() {
        // Every byte value, beside every other, in both orders: the masks must
        // not carry or borrow from one byte into the next.
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                let g = group([a, b, a, b, b, a, 0xFF, 0x80]);
                let bytes = g.to_le_bytes();
                for (target, mask) in [(LIMBO, equal_bytes(g, LIMBO)), (a, equal_bytes(g, a))] {
                    for (i, &byte) in bytes.iter().enumerate() {
                        assert_eq!(
                            mask >> (8 * i + 7) & 1 == 1,
                            byte == target,
                            "{g:#x} {target:#x}"
                        );
                    }
                    assert_eq!(mask & !MSB, 0);
                }
                let (held, empty) = (holding(g), empties(g));
                // `empties` is exact on control bytes only (a tag, `LIMBO`,
                // `DEAD` or `EMPTY`): it reads both top bits.
                let control = |b: u8| is_linked(b) || [LIMBO, DEAD, EMPTY].contains(&b);
                for (i, &byte) in bytes.iter().enumerate() {
                    assert_eq!(held >> (8 * i + 7) & 1 == 1, holds_key(byte));
                    if control(a) && control(b) {
                        assert_eq!(empty >> (8 * i + 7) & 1 == 1, byte == EMPTY);
                    }
                }
            }
        }
        let g = group([0, LIMBO, EMPTY, DEAD, 5, LIMBO, 0x7F, EMPTY]);
        assert_eq!(
            positions(3, holding(g)).collect::<Vec<_>>(),
            [24, 25, 28, 29, 30]
        );
        assert_eq!(positions(0, empties(g)).collect::<Vec<_>>(), [2, 7]);
    }

    #[test]
    fn a_tag_matches_its_own_bytes_and_never_an_unlinked_slot() {
        for t in 0..=0x7Fu8 {
            let g = group([t, EMPTY, LIMBO, DEAD, t, t ^ 1, 0x7F - t, t]);
            let matches = match_tag(g, t);
            for i in [0, 4, 7] {
                assert_ne!(matches & (0x80 << (8 * i)), 0, "tag {t:#x} byte {i}");
            }
            for i in [1, 2, 3] {
                assert_eq!(matches & (0x80 << (8 * i)), 0, "tag {t:#x} byte {i}");
            }
            // Whatever else is reported is a linked slot.
            for i in 0..8 {
                if matches & (0x80 << (8 * i)) != 0 {
                    assert!(is_linked(byte(g, i)), "tag {t:#x} byte {i}");
                }
            }
        }
    }

    #[test]
    fn only_empty_bytes_end_a_probe() {
        assert!(!has_empty(group([0, 0x7F, LIMBO, DEAD, 1, 2, 3, 4])));
        for i in 0..8 {
            let mut bytes = [LIMBO; 8];
            bytes[i] = EMPTY;
            assert!(has_empty(group(bytes)), "byte {i}");
        }
        assert!(has_empty(u64::MAX));
        assert!(!holds_key(EMPTY) && !holds_key(DEAD));
        assert!(holds_key(LIMBO) && holds_key(0) && holds_key(0x7F));
    }
}
