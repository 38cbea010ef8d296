//! Grace periods for the keyed map's lock-free readers: when may a writer free
//! memory that readers could still be reading?
//!
//! # The protocol
//!
//! Each keyed limiter has its own [`Collector`]: a record per thread that has
//! used it, one cache line that thread alone writes. A reader *pins* by
//! storing a new odd number in its record and *unpins* by clearing that bit;
//! between the two it may read any memory it reaches through the map. A
//! writer that has unpublished some memory (unlinked a key, closed a table)
//! takes a **snapshot**: it issues a heavy barrier, then notes every record
//! that is pinned. The memory may be freed once each noted record holds
//! another number: every reader that could have reached it has unpinned.
//! Records are per limiter, so a reader stuck while pinned in one limiter
//! (descheduled, stopped in a debugger) holds back only that limiter's
//! grace periods.
//!
//! The reader's store and its next loads form a store-load pair that needs a
//! full barrier between them (the writer's unpublish and its reading of the
//! records are the other pair). On Linux the writer provides both with
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, which runs a full barrier
//! on every running thread of the process, so a reader's pin is a plain store
//! and a compiler fence: no locked instruction on the read path. Where
//! `membarrier` is not available (or `TURNSTILE_BARRIER=fence` is set) the
//! reader issues a `SeqCst` fence instead (what crossbeam-epoch's `pin`
//! does), and so does the writer.
//!
//! # When the barrier fails
//!
//! The mode is chosen once, at first use. If an expedited barrier later fails
//! (a seccomp filter installed after start-up, `ENOMEM`), readers pinned with
//! only a compiler fence may not be visible to the writer, and nothing may be
//! freed on the strength of that snapshot. The process switches to fence mode
//! for good, and the writer tries `MEMBARRIER_CMD_GLOBAL`, which is a valid
//! barrier of its own: if it succeeds, every reader has passed a full barrier
//! since the switch, and reclamation goes on as before. If it fails too, the
//! snapshot is marked *unsound*: it is trusted only once every record of its
//! limiter has shown a fenced pin or call (each store a thread makes to its
//! record says whether that thread had seen fence mode) or belongs to a thread
//! that has exited, and then only after the records are read again. Until
//! then the limiter frees nothing: evicted keys wait (at most `max_keys` of
//! them), a table that must be rebuilt stays as it is, and new keys are
//! refused at the bound. A failure is never ignored and never aborts; it is
//! counted ([`reclamation`]) and logged (feature `tracing`).
//!
//! # Re-entry
//!
//! A thread in the middle of an operation on a limiter is either pinned or
//! marked *busy* in its record (the writer's path, under a shard's lock).
//! Entering the same limiter again from user code run meanwhile (a key's
//! `Hash` or `Eq`, the algorithm, the clock) would wait for itself; it is
//! refused with a panic that says so.
//!
//! Under loom the same code runs in fence mode, with loom's atomics, so that
//! the models in `loom-tests/` check this protocol itself.

use core::sync::atomic::compiler_fence;

use crate::sync::{AtomicPtr, AtomicU64, Ordering, fence};

/// How many threads own a counter slot of their own at once; the threads
/// beyond share one more slot, with a locked add.
pub(crate) const OWNED_SLOTS: usize = 64;

/// The current thread's counter slot (see [`Tally`](crate::tally::Tally)),
/// without pinning: its thread index, or the shared slot past
/// [`OWNED_SLOTS`].
#[inline]
pub(crate) fn thread_slot() -> usize {
    thread_index().map_or(OWNED_SLOTS, |index| index.min(OWNED_SLOTS))
}

// ---------------------------------------------------------------------------
// The barrier mode, process-wide (membarrier registration is per process).

/// How the keyed limiters' readers and writers order a reader's pin before
/// its reads ([`reclamation`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BarrierMode {
    /// Readers pin with a compiler fence; writers issue
    /// `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` (Linux).
    Membarrier,
    /// Readers and writers each issue a `SeqCst` fence.
    Fence,
}

/// The state of the keyed limiters' memory reclamation in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reclamation {
    /// The barrier mode in force.
    pub mode: BarrierMode,
    /// Expedited barriers that failed after the process registered for them.
    /// The first failure switches the process to [`BarrierMode::Fence`].
    pub failed_barriers: u64,
    /// `true` after such a failure until a `MEMBARRIER_CMD_GLOBAL` barrier
    /// has succeeded: until then each limiter frees memory only once every
    /// thread that used it has called it again, or exited.
    pub unconfirmed: bool,
}

/// How the keyed limiters' memory reclamation stands: the barrier mode chosen
/// at first use (set `TURNSTILE_BARRIER=fence` to choose fence mode), and how
/// many barriers failed since.
///
/// ```
/// let state = turnstile::reclamation();
/// assert_eq!(state.failed_barriers, 0);
/// ```
pub fn reclamation() -> Reclamation {
    mode::init();
    Reclamation {
        mode: if mode::reader_fences() {
            BarrierMode::Fence
        } else {
            BarrierMode::Membarrier
        },
        failed_barriers: mode::failed(),
        unconfirmed: mode::unconfirmed(),
    }
}

#[cfg(not(turnstile_loom))]
mod mode {
    use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering, fence};
    use std::sync::Once;

    const UNKNOWN: u8 = 0;
    const MEMBARRIER: u8 = 1;
    const FENCE: u8 = 2;

    /// The mode readers follow. Set once at start-up; may later go from
    /// `MEMBARRIER` to `FENCE`, never back.
    static MODE: AtomicU8 = AtomicU8::new(UNKNOWN);
    static INIT: Once = Once::new();
    /// Set before a switch to fence mode, cleared by a `CMD_GLOBAL` barrier
    /// that succeeded after it.
    static UNCONFIRMED: AtomicBool = AtomicBool::new(false);
    static FAILED: AtomicU64 = AtomicU64::new(0);

    /// Choose the mode, once. Every thread calls this before it takes a
    /// thread index, so a reader never sees `UNKNOWN`.
    pub(super) fn init() {
        INIT.call_once(|| {
            let forced = std::env::var_os("TURNSTILE_BARRIER");
            let mode = if forced.as_deref() == Some("fence".as_ref()) {
                FENCE
            } else if membarrier::register() {
                MEMBARRIER
            } else {
                FENCE
            };
            // Relaxed: the `Once` orders this store before every thread that
            // passes `call_once`.
            MODE.store(mode, Ordering::Relaxed);
        });
    }

    /// Whether a reader must fence its pin: the mode as this thread sees it.
    #[inline(always)]
    pub(super) fn reader_fences() -> bool {
        // Relaxed: a thread reading `MEMBARRIER` after the switch pins
        // without a fence, and says so in its record (no `FENCED` bit); the
        // writers then do not trust a snapshot until it has shown a fenced
        // store (`Collector::transition_done`).
        MODE.load(Ordering::Relaxed) != MEMBARRIER
    }

    pub(super) fn failed() -> u64 {
        // Relaxed: a count for display.
        FAILED.load(Ordering::Relaxed)
    }

    pub(super) fn unconfirmed() -> bool {
        // SeqCst: see `writer_barrier`.
        UNCONFIRMED.load(Ordering::SeqCst)
    }

    /// The writer's barrier, after its unpublishing stores and before it
    /// reads the records: `true` when it is sound for every reader, `false`
    /// when readers pinned without a fence may be missed (see the module's
    /// docs).
    pub(super) fn writer_barrier() -> bool {
        init();
        // SeqCst: ordered with `UNCONFIRMED` below, so that a writer that
        // sees fence mode also sees a switch's unconfirmed flag.
        if MODE.load(Ordering::SeqCst) == MEMBARRIER {
            match membarrier::expedited() {
                Ok(()) => return true,
                Err(errno) => switch_to_fence(errno),
            }
        }
        fence(Ordering::SeqCst);
        if !UNCONFIRMED.load(Ordering::SeqCst) {
            return true;
        }
        // The switch came before this call: a global barrier now makes every
        // thread pass a full barrier after it, so each later pin sees fence
        // mode and each earlier one is visible here.
        if membarrier::global().is_ok() {
            // SeqCst: as above.
            UNCONFIRMED.store(false, Ordering::SeqCst);
            return true;
        }
        false
    }

    #[cold]
    fn switch_to_fence(errno: i32) {
        // Relaxed: a count.
        let failures = FAILED.fetch_add(1, Ordering::Relaxed);
        // SeqCst, before the mode: a writer that reads `FENCE` reads this
        // flag (or a later confirmation) too.
        UNCONFIRMED.store(true, Ordering::SeqCst);
        let was = MODE.swap(FENCE, Ordering::SeqCst);
        if was == MEMBARRIER && failures == 0 {
            log_switch(errno);
        }
    }

    #[cfg(feature = "tracing")]
    fn log_switch(errno: i32) {
        tracing::error!(
            errno,
            "turnstile: membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) failed after start-up \
             (a seccomp filter, or the kernel out of memory); keyed limiters switch to fence \
             mode, and free memory only once a global barrier succeeds or every thread that \
             used them has called them again"
        );
    }

    #[cfg(not(feature = "tracing"))]
    fn log_switch(_errno: i32) {}

    #[cfg(target_os = "linux")]
    mod membarrier {
        const CMD_GLOBAL: libc::c_long = 1;
        const CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
        const CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

        fn call(cmd: libc::c_long) -> Result<(), i32> {
            // SAFETY: `membarrier(cmd, flags = 0, cpu_id = 0)` takes no pointers
            // and has no effect on memory this process owns; every failure
            // returns -1 with `errno`, which the caller handles.
            #[allow(unsafe_code)]
            let result = unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) };
            if result == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
            }
        }

        /// Register for expedited barriers and issue one; `false` where the
        /// kernel refuses either.
        pub(super) fn register() -> bool {
            call(CMD_REGISTER_PRIVATE_EXPEDITED).is_ok() && call(CMD_PRIVATE_EXPEDITED).is_ok()
        }

        pub(super) fn expedited() -> Result<(), i32> {
            call(CMD_PRIVATE_EXPEDITED)
        }

        pub(super) fn global() -> Result<(), i32> {
            call(CMD_GLOBAL)
        }
    }

    #[cfg(not(target_os = "linux"))]
    mod membarrier {
        pub(super) fn register() -> bool {
            false
        }

        pub(super) fn expedited() -> Result<(), i32> {
            Err(0)
        }

        pub(super) fn global() -> Result<(), i32> {
            Err(0)
        }
    }
}

/// Under loom: fence mode, the one loom can check.
#[cfg(turnstile_loom)]
mod mode {
    pub(super) fn init() {}

    pub(super) fn reader_fences() -> bool {
        true
    }

    pub(super) fn failed() -> u64 {
        0
    }

    pub(super) fn unconfirmed() -> bool {
        false
    }

    pub(super) fn writer_barrier() -> bool {
        // SeqCst: the writer's half of the store-load pair.
        crate::sync::fence(crate::sync::Ordering::SeqCst);
        true
    }
}

// ---------------------------------------------------------------------------
// Thread indices: a small number per live thread, reused after it exits.

struct Indices {
    /// The next index never handed out.
    next: usize,
    /// Indices of exited threads, smallest first out.
    free: std::collections::BTreeSet<usize>,
    /// The generation of each index's live owner (`None`: free). Each
    /// owner of an index gets the next generation, so a record can tell
    /// whether its current owner has written it yet.
    owner: Vec<Option<u16>>,
    /// The generation the next owner of each index gets.
    next_generation: Vec<u16>,
    /// Under loom, the model execution these indices belong to: each
    /// execution starts afresh, so that every execution of a model hands out
    /// the same indices (loom requires a deterministic model).
    #[cfg(turnstile_loom)]
    execution: u64,
}

impl Indices {
    const fn new() -> Indices {
        Indices {
            next: 0,
            free: std::collections::BTreeSet::new(),
            owner: Vec::new(),
            next_generation: Vec::new(),
            #[cfg(turnstile_loom)]
            execution: 0,
        }
    }
}

/// Every thread's index.
#[cfg(not(turnstile_loom))]
static INDICES: std::sync::Mutex<Indices> = std::sync::Mutex::new(Indices::new());

#[cfg(not(turnstile_loom))]
fn indices() -> std::sync::MutexGuard<'static, Indices> {
    INDICES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Under loom, the indices of each model: a loom model runs on one OS thread,
/// and models run side by side on several. A `std` mutex, as its critical
/// sections hold no loom operation (and a loom static would be gone before
/// the main thread's locals are dropped).
#[cfg(turnstile_loom)]
static INDICES: std::sync::Mutex<Vec<(std::thread::ThreadId, Indices)>> =
    std::sync::Mutex::new(Vec::new());

/// The current model's indices.
#[cfg(turnstile_loom)]
struct ModelIndices(
    std::sync::MutexGuard<'static, Vec<(std::thread::ThreadId, Indices)>>,
    usize,
);

#[cfg(turnstile_loom)]
impl core::ops::Deref for ModelIndices {
    type Target = Indices;

    fn deref(&self) -> &Indices {
        &self.0[self.1].1
    }
}

#[cfg(turnstile_loom)]
impl core::ops::DerefMut for ModelIndices {
    fn deref_mut(&mut self) -> &mut Indices {
        &mut self.0[self.1].1
    }
}

#[cfg(turnstile_loom)]
fn indices() -> ModelIndices {
    let mut all = INDICES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let model = std::thread::current().id();
    let at = match all.iter().position(|(id, _)| *id == model) {
        Some(at) => at,
        None => {
            all.push((model, Indices::new()));
            all.len() - 1
        }
    };
    ModelIndices(all, at)
}

/// This thread's claim on an index, given back when the thread exits, and
/// its generation (and under loom, its model execution).
struct ThreadIndex(usize, u16, #[cfg(turnstile_loom)] u64);

#[cfg(turnstile_loom)]
static EXECUTIONS: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

#[cfg(turnstile_loom)]
loom::lazy_static! {
    /// A number per loom execution: a loom static is made anew in each.
    static ref EXECUTION: u64 = EXECUTIONS.fetch_add(1, core::sync::atomic::Ordering::Relaxed) + 1;
}

impl ThreadIndex {
    fn acquire() -> ThreadIndex {
        // Before the index: a thread with an index reads a chosen mode.
        mode::init();
        #[cfg(turnstile_loom)]
        let execution = *EXECUTION;
        let mut indices = indices();
        #[cfg(turnstile_loom)]
        if indices.execution != execution {
            *indices = Indices::new();
            indices.execution = execution;
        }
        let index = match indices.free.pop_first() {
            Some(index) => index,
            None => {
                let index = indices.next;
                indices.next += 1;
                indices.owner.push(None);
                indices.next_generation.push(0);
                index
            }
        };
        let generation = indices.next_generation[index];
        indices.next_generation[index] = generation.wrapping_add(1);
        indices.owner[index] = Some(generation);
        ThreadIndex(
            index,
            generation,
            #[cfg(turnstile_loom)]
            execution,
        )
    }
}

impl Drop for ThreadIndex {
    fn drop(&mut self) {
        #[cfg(not(turnstile_loom))]
        FAST.with(|fast| fast.set(GONE));
        // The mutex orders this thread's last stores to its records (and to
        // its counter slots) before the next owner's first.
        let mut indices = indices();
        #[cfg(turnstile_loom)]
        if indices.execution != self.2 {
            // A thread of an earlier execution, dropped late.
            return;
        }
        indices.owner[self.0] = None;
        indices.free.insert(self.0);
    }
}

#[cfg(not(turnstile_loom))]
std::thread_local! {
    static THREAD: ThreadIndex = ThreadIndex::acquire();
}

#[cfg(turnstile_loom)]
loom::thread_local! {
    static THREAD: ThreadIndex = ThreadIndex::acquire();
}

/// The current thread's index; `None` while its thread-locals are being
/// destroyed.
#[inline(always)]
fn thread_index() -> Option<usize> {
    thread_owner().map(|(index, _)| index)
}

/// The current thread's index, and its generation where a record's number
/// keeps it (`generation << 48`), as [`thread_index`].
#[inline(always)]
fn thread_owner() -> Option<(usize, u64)> {
    #[cfg(not(turnstile_loom))]
    {
        // A plain thread-local read: `FAST` has no destructor, so no
        // initialization state to check.
        let packed = FAST.with(core::cell::Cell::get);
        if packed < GONE {
            const LOW: u64 = (1 << GENERATION_SHIFT) - 1;
            return Some(((packed & LOW) as usize, packed & !LOW));
        }
        thread_owner_slow(packed)
    }
    #[cfg(turnstile_loom)]
    THREAD
        .try_with(|thread| (thread.0, u64::from(thread.1) << GENERATION_SHIFT))
        .ok()
}

#[cfg(not(turnstile_loom))]
#[cold]
#[inline(never)]
fn thread_owner_slow(packed: u64) -> Option<(usize, u64)> {
    if packed == GONE {
        return None;
    }
    let (index, generation) = THREAD.try_with(|thread| (thread.0, thread.1)).ok()?;
    let mine = u64::from(generation) << GENERATION_SHIFT;
    FAST.with(|fast| fast.set(mine | index as u64));
    Some((index, mine))
}

/// `FAST` before this thread took an index.
#[cfg(not(turnstile_loom))]
const UNSET: u64 = u64::MAX;
/// `FAST` after this thread gave its index back (its thread-locals are being
/// destroyed).
#[cfg(not(turnstile_loom))]
const GONE: u64 = u64::MAX - 1;

#[cfg(not(turnstile_loom))]
std::thread_local! {
    /// This thread's generation and index, packed (`generation << 48 |
    /// index`, the generation where a record's number keeps it), or `UNSET`
    /// or `GONE`.
    static FAST: core::cell::Cell<u64> = const { core::cell::Cell::new(UNSET) };
}

// ---------------------------------------------------------------------------
// Records.

/// A record's number: bit 0 set while pinned; bit 1 set when the owner had
/// seen fence mode before the store; bit 2 set while the owner is on a
/// writer's path; bits 3 to 47 count pins; bits 48 to 63 are the generation
/// of the thread that wrote it (see [`Indices::owner`]).
const PINNED: u64 = 1;
const FENCED: u64 = 2;
const BUSY: u64 = 4;
const PIN_STEP: u64 = 8;
const GENERATION_SHIFT: u32 = 48;
/// The counted part of a number.
const COUNT: u64 = ((1 << GENERATION_SHIFT) - 1) & !(PIN_STEP - 1);

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
    fn pin_unrecorded(&self) -> Guard<'_> {
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

/// The protocol's interface, public under loom only, for the models in
/// `loom-tests/`.
#[cfg(turnstile_loom)]
pub mod model {
    /// A collector of its own.
    #[derive(Debug, Default)]
    pub struct Collector(super::Collector);

    /// A pin.
    pub struct Guard<'a>(#[allow(dead_code)] super::Guard<'a>);

    impl core::fmt::Debug for Guard<'_> {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            f.write_str("Guard")
        }
    }

    /// The readers pinned at an unpublish.
    #[derive(Debug)]
    pub struct Snapshot(super::Snapshot);

    impl Collector {
        /// Pin this thread.
        pub fn pin(&self) -> Guard<'_> {
            Guard(self.0.pin())
        }

        /// Pin as a thread whose thread-locals are gone does.
        pub fn pin_unrecorded(&self) -> Guard<'_> {
            Guard(self.0.pin_unrecorded())
        }

        /// Note the readers pinned now.
        pub fn snapshot(&self) -> Snapshot {
            Snapshot(self.0.snapshot())
        }
    }

    impl Snapshot {
        /// Whether every reader noted has unpinned.
        pub fn passed(&mut self, collector: &Collector) -> bool {
            self.0.passed(&collector.0)
        }
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
