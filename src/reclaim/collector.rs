//! Records: each keyed limiter's [`Collector`], a record per thread that has
//! used it; pins ([`Guard`]), the writer's path ([`Busy`]), and the
//! [`Snapshot`]s that tell a writer when a grace period has passed.

use core::sync::atomic::compiler_fence;

use crate::sync::{AtomicPtr, AtomicU64, Ordering, fence};

use super::barrier::mode;
use super::thread::{OWNED_SLOTS, indices, thread_owner};
use super::{BUSY, COUNT, FENCED, GENERATION_SHIFT, PIN_STEP, PINNED};

/// `seen`, the number in this thread's record, as this thread's own, and
/// whether this owner has pinned in it yet. A number an earlier owner of the
/// index wrote starts again from a count of zero under this owner's
/// generation: it still differs from every number the earlier owner wrote.
#[inline(always)]
fn own_number(seen: u64, mine: u64) -> (u64, bool) {
    if seen & !(COUNT | PINNED | FENCED | BUSY) == mine {
        (seen, seen & COUNT != 0)
    } else {
        (mine, false)
    }
}

/// One thread's record in one collector.
/// Aligned to 128 bytes (two lines: the adjacent-line prefetcher pairs them),
/// so that no other thread's record shares its lines.
#[repr(align(128))]
struct Record {
    word: AtomicU64,
    /// Set by a writer once it has seen this record prove that its owner no
    /// longer pins without a fence (see [`Collector::transition_done`]).
    clean: crate::sync::AtomicBool,
}

impl Record {
    fn new() -> Record {
        Record {
            word: AtomicU64::new(0),
            clean: crate::sync::AtomicBool::new(false),
        }
    }
}

/// Records held inline in the collector, for the first indices; bucket `b`
/// (from 1) holds `FIRST << b` more, allocated on first use. (Fewer under
/// loom, where each record a snapshot reads is a step of the model.)
const FIRST: usize = if cfg!(turnstile_loom) { 2 } else { 16 };
/// Buckets: enough for every index, or for the few threads of a loom model.
const BUCKETS: usize = if cfg!(turnstile_loom) {
    4
} else {
    (usize::BITS - FIRST.trailing_zeros()) as usize
};

/// The bucket and offset of index `index` (bucket 0: the inline records).
#[inline(always)]
fn bucket_of(index: usize) -> (usize, usize) {
    let shifted = index + FIRST;
    let bucket =
        (usize::BITS - 1 - shifted.leading_zeros()) as usize - FIRST.trailing_zeros() as usize;
    (bucket, shifted - (FIRST << bucket))
}

/// A keyed limiter's grace periods: a record per thread that has used it.
pub(crate) struct Collector {
    /// The records of the first `FIRST` indices: a pin by one of them reads
    /// no pointer.
    first: [Record; FIRST],
    /// Bucket `b` (from 1) points to `FIRST << b` records, allocated on
    /// first use; bucket 0 is `first`.
    buckets: [AtomicPtr<Record>; BUCKETS],
    /// Readers pinned without a record (their thread-locals were being
    /// destroyed).
    unrecorded: AtomicU64,
}

impl Default for Collector {
    fn default() -> Collector {
        Collector {
            first: core::array::from_fn(|_| Record::new()),
            buckets: core::array::from_fn(|_| AtomicPtr::new(core::ptr::null_mut())),
            unrecorded: AtomicU64::new(0),
        }
    }
}

impl core::fmt::Debug for Collector {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Collector")
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        if crate::sync::unwinding_under_loom() {
            return;
        }
        for (bucket, ptr) in self.buckets.iter().enumerate().skip(1) {
            // Relaxed: `&mut self` orders every earlier store before this.
            let ptr = ptr.load(Ordering::Relaxed);
            if !ptr.is_null() {
                // SAFETY: allocated by `records` as a boxed slice of this
                // length; `&mut self` means no thread holds a record.
                #[allow(unsafe_code)]
                drop(unsafe {
                    Box::from_raw(core::ptr::slice_from_raw_parts_mut(ptr, FIRST << bucket))
                });
            }
        }
    }
}

/// A pin: memory reachable while it is held stays allocated until it is
/// dropped. Not `Send`: it is the current thread's.
pub(crate) struct Guard<'a> {
    /// The word this guard pinned: its record's, or the collector's count
    /// of readers without a record (`shared`).
    word: &'a AtomicU64,
    shared: bool,
    slot: usize,
    _not_send: core::marker::PhantomData<*const ()>,
}

/// The current thread on a writer's path of a limiter (holding, or about to
/// take, a shard's lock): a re-entry from user code run meanwhile is refused.
pub(crate) struct Busy<'a> {
    record: Option<&'a Record>,
    _not_send: core::marker::PhantomData<*const ()>,
}

#[cold]
#[inline(never)]
#[track_caller]
fn reentered() -> ! {
    panic!(
        "turnstile: a keyed limiter was called again, on the same thread, from code it runs \
         in the middle of an operation (a key's Hash, Eq, ToOwned or Drop, the algorithm, or \
         the clock); that would wait for itself, so it is refused"
    )
}

impl Collector {
    /// The records of bucket `bucket`, allocating them on first use.
    #[inline(always)]
    fn bucket(&self, bucket: usize) -> &[Record] {
        if bucket == 0 {
            return &self.first;
        }
        // Acquire: pairs with the AcqRel exchange that published the records.
        let mut ptr = self.buckets[bucket].load(Ordering::Acquire);
        if ptr.is_null() {
            ptr = self.allocate(bucket);
        }
        // SAFETY: a non-null bucket pointer points to `FIRST << bucket`
        // initialized records, freed only when the collector is dropped.
        #[allow(unsafe_code)]
        unsafe {
            core::slice::from_raw_parts(ptr, FIRST << bucket)
        }
    }

    #[cold]
    #[inline(never)]
    fn allocate(&self, bucket: usize) -> *mut Record {
        let records: Box<[Record]> = (0..FIRST << bucket).map(|_| Record::new()).collect();
        let new = Box::into_raw(records).cast::<Record>();
        // AcqRel: Release publishes the new records; Acquire, on failure, sees
        // the winner's.
        match self.buckets[bucket].compare_exchange(
            core::ptr::null_mut(),
            new,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => new,
            Err(winner) => {
                // SAFETY: `new` came from `Box::into_raw` above and was never
                // published.
                #[allow(unsafe_code)]
                drop(unsafe {
                    Box::from_raw(core::ptr::slice_from_raw_parts_mut(new, FIRST << bucket))
                });
                winner
            }
        }
    }

    /// The current thread's record, or `None` while its thread-locals are
    /// being destroyed.
    #[inline(always)]
    fn record(&self) -> Option<(&Record, usize, u64)> {
        let (index, mine) = thread_owner()?;
        let record = match self.first.get(index) {
            Some(record) => record,
            None => self.record_beyond_first(index),
        };
        Some((record, index, mine))
    }

    #[cold]
    #[inline(never)]
    fn record_beyond_first(&self, index: usize) -> &Record {
        let (bucket, offset) = bucket_of(index);
        &self.bucket(bucket)[offset]
    }

    /// Pin: one store to the thread's own record and a compiler fence (or a
    /// fence, in fence mode).
    ///
    /// # Panics
    ///
    /// If this thread is already pinned in this collector or on its writer's
    /// path: user code run by the limiter called into it again.
    #[inline(always)]
    pub(crate) fn pin(&self) -> Guard<'_> {
        let Some((record, index, mine)) = self.record() else {
            return self.pin_unrecorded();
        };
        // Relaxed: this thread is the record's only writer (an earlier owner
        // of its index exited, which the index mutex ordered before us).
        let seen = record.word.load(Ordering::Relaxed);
        // One test for the common case: this owner's number (its generation)
        // with a count (it has pinned here before), neither pinned nor busy.
        // Less its generation and one step, such a number is a multiple of
        // the step below 2^48; anything else sets a bit outside `COUNT`.
        if (seen & !FENCED).wrapping_sub(mine).wrapping_sub(PIN_STEP) & !COUNT != 0 {
            return self.pin_first_or_again(record, index, mine);
        }
        // The next count, pinned. A count that overflows after 2^45 pins
        // carries into the generation, which makes the record look unwritten
        // to its owner: one more fence, and a number still unlike any before.
        if mode::reader_fences() {
            self.publish_pin(record, (seen | FENCED) + (PIN_STEP | PINNED), true, index)
        } else {
            self.publish_pin(record, (seen & !FENCED) + (PIN_STEP | PINNED), false, index)
        }
    }

    /// The pin of a thread whose record holds no number of its own yet (its
    /// first pin here), or that is already pinned or busy here (a re-entry).
    #[cold]
    #[inline(never)]
    fn pin_first_or_again<'a>(&'a self, record: &'a Record, index: usize, mine: u64) -> Guard<'a> {
        // Relaxed: as in `pin`.
        let (seen, written) = own_number(record.word.load(Ordering::Relaxed), mine);
        if seen & (PINNED | BUSY) != 0 {
            reentered();
        }
        let saw_fence_mode = mode::reader_fences();
        let word = (seen & !FENCED) + (PIN_STEP | PINNED) + if saw_fence_mode { FENCED } else { 0 };
        // A thread's first pin in a record fences whatever the mode: a writer
        // that finds the record unwritten by its owner may then count on
        // every later pin of that owner seeing fence mode after a switch
        // (`Collector::transition_done`).
        self.publish_pin(record, word, saw_fence_mode || !written, index)
    }

    /// Store a pin's number and order it before the reader's loads.
    #[inline(always)]
    fn publish_pin<'a>(
        &'a self,
        record: &'a Record,
        word: u64,
        fences: bool,
        index: usize,
    ) -> Guard<'a> {
        // Release: a writer that reads this number (or a later one) acquires
        // every access this thread made under earlier pins.
        record.word.store(word, Ordering::Release);
        if fences {
            // SeqCst: the reader's half of the store-load pair. (The loom
            // mutant `no_pin_fence` leaves it out, and the models of this
            // protocol fail.)
            #[cfg(not(turnstile_mutant = "no_pin_fence"))]
            fence(Ordering::SeqCst);
        } else {
            // The writer's membarrier stands in for the hardware fence; the
            // compiler must still not move the loads above the store.
            compiler_fence(Ordering::SeqCst);
        }
        Guard {
            word: &record.word,
            shared: false,
            slot: index.min(OWNED_SLOTS),
            _not_send: core::marker::PhantomData,
        }
    }

    #[cold]
    pub(super) fn pin_unrecorded(&self) -> Guard<'_> {
        // SeqCst, then a fence: a full barrier between this count and the
        // loads that follow, whatever the barrier mode.
        self.unrecorded.fetch_add(1, Ordering::SeqCst);
        #[cfg(not(turnstile_mutant = "no_pin_fence"))]
        fence(Ordering::SeqCst);
        Guard {
            word: &self.unrecorded,
            shared: true,
            slot: OWNED_SLOTS,
            _not_send: core::marker::PhantomData,
        }
    }

    /// Mark this thread as on the limiter's writer's path until the returned
    /// guard is dropped.
    ///
    /// # Panics
    ///
    /// As [`pin`](Self::pin).
    pub(crate) fn enter(&self) -> Busy<'_> {
        let record = self.record().map(|(record, _, mine)| {
            // Relaxed: as in `pin`.
            let (seen, _) = own_number(record.word.load(Ordering::Relaxed), mine);
            if seen & (PINNED | BUSY) != 0 {
                reentered();
            }
            let fenced = if mode::reader_fences() { FENCED } else { 0 };
            // Release: as in `pin`; the FENCED bit, if set, tells a writer
            // that this thread's later pins all fence.
            record.word.store(seen | BUSY | fenced, Ordering::Release);
            record
        });
        Busy {
            record,
            _not_send: core::marker::PhantomData,
        }
    }

    /// Note the readers pinned now. Call it after unpublishing memory; the
    /// memory may be freed once [`Snapshot::passed`] says so.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let sound = mode::writer_barrier();
        let mut snapshot = Snapshot {
            pinned: Vec::new(),
            unrecorded: false,
            sound,
        };
        self.scan(&mut snapshot);
        snapshot
    }

    /// Note in `snapshot` every record pinned now, and whether any reader
    /// without a record is.
    fn scan(&self, snapshot: &mut Snapshot) {
        snapshot.pinned.clear();
        for (bucket, ptr) in self.buckets.iter().enumerate() {
            // Acquire: as in `bucket`.
            if bucket > 0 && ptr.load(Ordering::Acquire).is_null() {
                // Buckets fill in order of thread index, but one may be
                // allocated before a lower one: look at every bucket.
                continue;
            }
            for (offset, record) in self.bucket(bucket).iter().enumerate() {
                // Acquire: see `Snapshot::passed`.
                let word = record.word.load(Ordering::Acquire);
                if word & PINNED != 0 {
                    snapshot
                        .pinned
                        .push(((FIRST << bucket) - FIRST + offset, word));
                }
            }
        }
        // Acquire: see `Snapshot::passed`.
        snapshot.unrecorded = self.unrecorded.load(Ordering::Acquire) != 0;
    }

    /// The record of index `index`, which a scan found allocated.
    fn record_at(&self, index: usize) -> &Record {
        let (bucket, offset) = bucket_of(index);
        &self.bucket(bucket)[offset]
    }

    /// After a switch to fence mode that no global barrier confirmed: whether
    /// every record of this collector has shown that its owner pins with a
    /// fence from now on. A record is *clean* once, after this writer's
    /// fence:
    /// - it holds a number its current owner stored after seeing fence mode
    ///   (the `FENCED` bit; the store's Release orders every earlier unfenced
    ///   pin before this writer's reads, and the owner's later pins read the
    ///   mode after it), or
    /// - its current owner has not written it (that owner's first pin here
    ///   fences: if this writer does not see its store, that pin's fence comes
    ///   after this writer's in the fences' total order, after the switch, so
    ///   the owner's every later reading of the mode sees fence mode), or
    /// - its index belongs to no live thread (its next owner takes it after
    ///   this check, under the same mutex, and reads the mode after this
    ///   writer did).
    fn transition_done(&self) -> bool {
        if !mode::unconfirmed() {
            return true;
        }
        if !mode::reader_fences() {
            // Not switched yet: nothing to wait for here (the switch sets
            // the flag first).
            return false;
        }
        // SeqCst: the fence the argument above places after the switch.
        fence(Ordering::SeqCst);
        let indices = indices();
        for (bucket, ptr) in self.buckets.iter().enumerate() {
            // Acquire: as in `bucket`.
            if bucket > 0 && ptr.load(Ordering::Acquire).is_null() {
                continue;
            }
            for (offset, record) in self.bucket(bucket).iter().enumerate() {
                // Acquire: pairs with the Release below, by another writer.
                if record.clean.load(Ordering::Acquire) {
                    continue;
                }
                let index = (FIRST << bucket) - FIRST + offset;
                // Acquire: pairs with the owner's Release store of the word.
                let word = record.word.load(Ordering::Acquire);
                let clean = match indices.owner.get(index).copied().flatten() {
                    None => true,
                    Some(generation) => {
                        let mine = u64::from(generation) << GENERATION_SHIFT;
                        let (own, written) = own_number(word, mine);
                        !written || own & FENCED != 0
                    }
                };
                if !clean {
                    return false;
                }
                // Release: another writer that reads it acquires what this
                // one saw.
                record.clean.store(true, Ordering::Release);
            }
        }
        true
    }
}

impl Guard<'_> {
    /// The current thread's counter slot: below [`OWNED_SLOTS`], one no
    /// other live thread writes; otherwise the shared slot.
    #[inline(always)]
    pub(crate) fn slot(&self) -> usize {
        self.slot
    }
}

impl Drop for Guard<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        if crate::sync::unwinding_under_loom() {
            return;
        }
        // Release: every access made under this pin happens before a
        // writer's acquire load that sees the new number (or count). (The
        // loom mutant `relaxed_unpin` makes it Relaxed, and the models of
        // this protocol fail.)
        #[cfg(not(turnstile_mutant = "relaxed_unpin"))]
        let order = Ordering::Release;
        #[cfg(turnstile_mutant = "relaxed_unpin")]
        let order = Ordering::Relaxed;
        if self.shared {
            self.word.fetch_sub(1, order);
        } else {
            // Relaxed: this thread is the record's only writer.
            let word = self.word.load(Ordering::Relaxed);
            self.word.store(word & !PINNED, order);
        }
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if crate::sync::unwinding_under_loom() {
            return;
        }
        if let Some(record) = self.record {
            // Relaxed: this thread is the record's only writer.
            let word = record.word.load(Ordering::Relaxed);
            // Release: as in `Guard::drop`.
            record.word.store(word & !BUSY, Ordering::Release);
        }
    }
}

impl core::fmt::Debug for Busy<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Busy")
    }
}

/// The readers pinned when a writer unpublished some memory.
pub(crate) struct Snapshot {
    /// Each pinned record's index and number.
    pinned: Vec<(usize, u64)>,
    unrecorded: bool,
    /// Whether the barrier before the scan was sound for every reader; if
    /// not, the snapshot waits for the limiter's records to show fence mode
    /// and then scans again.
    sound: bool,
}

impl Snapshot {
    /// Whether every reader noted has unpinned since: the memory
    /// unpublished before the snapshot can be freed.
    pub(crate) fn passed(&mut self, collector: &Collector) -> bool {
        if !self.sound {
            if !collector.transition_done() {
                return false;
            }
            // Every reader from now on fences, and every unfenced pin has
            // ended; scan again after a fence: any reader still pinned on the
            // memory is noted now.
            // SeqCst: the writer's half of the store-load pair.
            fence(Ordering::SeqCst);
            collector.scan(self);
            self.sound = true;
        }
        // Acquire: pairs with the Release of the reader's unpin (or of a
        // later pin), so its reads happen before the caller frees.
        self.pinned.retain(|&(index, word)| {
            collector.record_at(index).word.load(Ordering::Acquire) == word
        });
        // Acquire: as above, for readers without a record; they are not
        // told apart, so this waits for a moment with none.
        if self.unrecorded && collector.unrecorded.load(Ordering::Acquire) == 0 {
            self.unrecorded = false;
        }
        self.pinned.is_empty() && !self.unrecorded
    }
}

impl core::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Snapshot")
            .field("pinned", &self.pinned.len())
            .field("unrecorded", &self.unrecorded)
            .field("sound", &self.sound)
            .finish()
    }
}

#[cfg(all(test, not(turnstile_loom)))]
mod tests {
    use super::*;

    #[test]
    fn indices_map_onto_buckets_without_gaps_or_overlap() {
        let mut expected = (0, 0);
        for index in 0..10_000 {
            let (bucket, offset) = bucket_of(index);
            assert_eq!((bucket, offset), expected, "index {index}");
            assert!(offset < FIRST << bucket);
            expected = if offset + 1 == FIRST << bucket {
                (bucket + 1, 0)
            } else {
                (bucket, offset + 1)
            };
            assert_eq!((FIRST << bucket) - FIRST + offset, index);
        }
        assert!(bucket_of(usize::MAX - FIRST).0 < BUCKETS);
    }

    #[test]
    fn a_snapshot_waits_for_a_reader_pinned_before_it_and_not_after() {
        let collector = Collector::default();
        let guard = collector.pin();
        let mut snapshot = collector.snapshot();
        assert!(!snapshot.passed(&collector));
        drop(guard);
        assert!(snapshot.passed(&collector));
        let later = collector.pin();
        let mut snapshot = Collector::snapshot(&Collector::default());
        assert!(snapshot.passed(&collector), "another collector's reader");
        drop(later);
    }

    #[test]
    #[should_panic(expected = "called again")]
    fn pinning_twice_on_one_thread_is_refused() {
        let collector = Collector::default();
        let _outer = collector.pin();
        let _inner = collector.pin();
    }

    #[test]
    #[should_panic(expected = "called again")]
    fn pinning_on_a_writers_path_is_refused() {
        let collector = Collector::default();
        let _busy = collector.enter();
        let _inner = collector.pin();
    }

    #[test]
    fn a_busy_writer_is_not_waited_for_and_two_collectors_are_apart() {
        let (a, b) = (Collector::default(), Collector::default());
        let _busy = a.enter();
        let _pinned_in_b = b.pin();
        let mut snapshot = a.snapshot();
        assert!(snapshot.passed(&a));
    }
}
