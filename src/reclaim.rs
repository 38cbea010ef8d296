//! Grace periods for the keyed map's lock-free readers: when may a writer free
//! memory that readers could still be reading?
//!
//! # The protocol
//!
//! Every thread that reads has a **record** in a global registry, one cache
//! line it alone writes. A reader *pins* by storing an odd number in its record
//! and *unpins* by storing the next even number; between the two it may read
//! any memory it reaches through the map. A writer that has unpublished some
//! memory (unlinked an entry, replaced an index) takes a **snapshot**: it
//! issues a heavy barrier, then notes every record that holds an odd number. The
//! memory may be freed once each noted record holds another number: every
//! reader that could have reached it has unpinned.
//!
//! The reader's store and its next loads form a store-load pair that needs a
//! full barrier between them (the writer's unpublish and its reading of the
//! records are the other pair). On Linux the writer provides both with
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, which runs a full barrier on
//! every thread of the process that is running, so a reader's pin is a plain
//! store and a compiler fence: no locked instruction on the read path. Where
//! `membarrier` is not available, the reader issues a `SeqCst` fence instead
//! (what crossbeam-epoch's `pin` does), and the writer too. Writers are rare (an
//! insert that grows an index, a sweep), so the barrier's cost (a few
//! microseconds) lands on them.
//!
//! Measured on the development machine (one hot key, coarse clock): a
//! crossbeam-epoch `pin()` around the lookup costs about as much as the whole
//! rest of the decision, because of its fence; this protocol costs one store to
//! the thread's own line on each side.
//!
//! A thread's record returns to the registry when the thread exits, and the
//! record's number is also the thread's counter slot ([`Guard::slot`]). A
//! thread that pins while its thread-locals are being destroyed is counted in
//! one shared counter instead, with locked adds.
//!
//! Under loom the same interface is a model loom checks: a pin is a read lock
//! and a snapshot has passed when a write lock can be taken (no reader at all),
//! which is later than the real protocol allows, never earlier.

#[cfg(not(turnstile_loom))]
pub(crate) use real::{Collector, Guard, Snapshot};

#[cfg(turnstile_loom)]
pub(crate) use model::{Collector, Guard, Snapshot};

/// The current thread's counter slot (see [`Tally`](crate::tally::Tally)),
/// without pinning.
#[inline]
pub(crate) fn thread_slot() -> usize {
    #[cfg(not(turnstile_loom))]
    return Collector.slot();
    #[cfg(turnstile_loom)]
    return OWNED_SLOTS;
}

/// How many threads own a counter slot of their own at once; the threads
/// beyond share one more slot, with a locked add.
pub(crate) const OWNED_SLOTS: usize = 64;

#[cfg(not(turnstile_loom))]
mod real {
    use core::sync::atomic::{AtomicU8, compiler_fence, fence};
    use std::sync::Once;

    use crossbeam_utils::CachePadded;

    use crate::sync::{AtomicU64, Mutex, Ordering, lock};

    /// One thread's record.
    struct Record {
        /// Odd while the thread is pinned; each unpin moves to the next even
        /// number, so a snapshot can tell a later pin from the one it saw.
        pin: CachePadded<AtomicU64>,
        /// The owner's counter slot: its place in the registry, or
        /// `OWNED_SLOTS` (the shared slot) for records beyond the first
        /// `OWNED_SLOTS`.
        slot: usize,
    }

    /// Every record ever made, and those whose threads have exited.
    struct Registry {
        records: Vec<&'static Record>,
        free: Vec<&'static Record>,
    }

    static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
        records: Vec::new(),
        free: Vec::new(),
    });

    /// Readers pinned without a record (their thread-locals were being
    /// destroyed).
    static UNRECORDED: AtomicU64 = AtomicU64::new(0);

    const UNKNOWN: u8 = 0;
    const MEMBARRIER: u8 = 1;
    const FENCE: u8 = 2;

    /// How readers and writers pair their barriers; set once, before any
    /// thread registers, and never changed.
    static BARRIER: AtomicU8 = AtomicU8::new(UNKNOWN);
    static BARRIER_INIT: Once = Once::new();

    fn init_barrier() {
        BARRIER_INIT.call_once(|| {
            let mode = if membarrier::register() {
                MEMBARRIER
            } else {
                FENCE
            };
            // Relaxed: the `Once` orders this store before every thread that
            // passes `call_once` (each registers through it first).
            BARRIER.store(mode, Ordering::Relaxed);
        });
    }

    /// The reader's side: order its pin store before its next loads.
    #[inline(always)]
    fn reader_barrier() {
        // Relaxed: written once before this thread registered (see above).
        if BARRIER.load(Ordering::Relaxed) == MEMBARRIER {
            // The writer's membarrier stands in for the hardware fence; the
            // compiler must still not move the loads above the store.
            compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
    }

    /// The writer's side: after its unpublishing stores, before it reads the
    /// records.
    fn writer_barrier() {
        init_barrier();
        // Relaxed: as in `reader_barrier`.
        if BARRIER.load(Ordering::Relaxed) != MEMBARRIER || !membarrier::expedited() {
            fence(Ordering::SeqCst);
            if BARRIER.load(Ordering::Relaxed) == MEMBARRIER {
                // Readers do not fence in this mode, and the expedited barrier
                // failed: wait for every CPU to pass a quiescent state.
                membarrier::global();
            }
        }
    }

    #[cfg(target_os = "linux")]
    mod membarrier {
        const CMD_GLOBAL: libc::c_long = 1;
        const CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
        const CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

        fn call(cmd: libc::c_long) -> bool {
            // SAFETY: `membarrier(cmd, flags = 0, cpu_id = 0)` takes no pointers
            // and has no effect on memory this process owns; an unsupported
            // command returns -1 (EINVAL or ENOSYS), which is handled.
            #[allow(unsafe_code)]
            let result = unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) };
            result == 0
        }

        /// Register for expedited barriers; `false` where the kernel refuses.
        pub(super) fn register() -> bool {
            call(CMD_REGISTER_PRIVATE_EXPEDITED) && call(CMD_PRIVATE_EXPEDITED)
        }

        pub(super) fn expedited() -> bool {
            call(CMD_PRIVATE_EXPEDITED)
        }

        pub(super) fn global() {
            call(CMD_GLOBAL);
        }
    }

    #[cfg(not(target_os = "linux"))]
    mod membarrier {
        pub(super) fn register() -> bool {
            false
        }

        pub(super) fn expedited() -> bool {
            false
        }

        pub(super) fn global() {}
    }

    /// This thread's claim on a record, given back when the thread exits.
    struct Local {
        record: &'static Record,
    }

    impl Local {
        fn register() -> Local {
            init_barrier();
            let mut registry = lock(&REGISTRY);
            let record = match registry.free.pop() {
                Some(record) => record,
                None => {
                    let record: &'static Record = Box::leak(Box::new(Record {
                        pin: CachePadded::new(AtomicU64::new(0)),
                        slot: registry.records.len().min(super::OWNED_SLOTS),
                    }));
                    registry.records.push(record);
                    record
                }
            };
            Local { record }
        }
    }

    impl Drop for Local {
        fn drop(&mut self) {
            // Relaxed: this thread's own record.
            if self.record.pin.load(Ordering::Relaxed) & 1 == 0 {
                // The mutex orders this thread's last writes to the record
                // (and to its counter slot) before the next owner's first.
                lock(&REGISTRY).free.push(self.record);
            }
            // A record left pinned (a guard outlived the thread's locals) is
            // never reused.
        }
    }

    std::thread_local! {
        static LOCAL: Local = Local::register();
    }

    /// The collector: the global registry, shared by every limiter.
    #[derive(Debug, Default)]
    pub(crate) struct Collector;

    /// A pin: memory reachable while it is held stays allocated until it is
    /// dropped. Not `Send`: it is the current thread's.
    pub(crate) struct Guard<'a> {
        /// The record this guard pinned, or `None` for a guard nested in
        /// another of the same thread (which unpins) or one counted in
        /// `UNRECORDED`.
        record: Option<&'static Record>,
        slot: usize,
        unrecorded: bool,
        _not_send: core::marker::PhantomData<(&'a Collector, *const ())>,
    }

    impl Collector {
        /// Pin: one store to the thread's own record and a compiler fence.
        #[inline(always)]
        pub(crate) fn pin(&self) -> Guard<'_> {
            match LOCAL.try_with(|local| local.record) {
                Ok(record) => {
                    // Relaxed: this thread is the record's only writer.
                    let seen = record.pin.load(Ordering::Relaxed);
                    let outer = seen & 1 == 0;
                    if outer {
                        // Release: a writer that reads a later number of this
                        // record acquires every access made under earlier pins.
                        record.pin.store(seen | 1, Ordering::Release);
                        reader_barrier();
                    }
                    Guard {
                        record: outer.then_some(record),
                        slot: record.slot,
                        unrecorded: false,
                        _not_send: core::marker::PhantomData,
                    }
                }
                Err(_) => {
                    // SeqCst, then a fence: a full barrier between this count
                    // and the loads that follow, whatever the barrier mode.
                    UNRECORDED.fetch_add(1, Ordering::SeqCst);
                    fence(Ordering::SeqCst);
                    Guard {
                        record: None,
                        slot: super::OWNED_SLOTS,
                        unrecorded: true,
                        _not_send: core::marker::PhantomData,
                    }
                }
            }
        }

        /// The current thread's counter slot, without pinning.
        #[inline]
        pub(crate) fn slot(&self) -> usize {
            LOCAL
                .try_with(|local| local.record.slot)
                .unwrap_or(super::OWNED_SLOTS)
        }

        /// Note the readers pinned now. Call it after unpublishing memory; the
        /// memory may be freed once [`Snapshot::passed`] says so.
        pub(crate) fn snapshot(&self) -> Snapshot {
            writer_barrier();
            let registry = lock(&REGISTRY);
            let pinned = registry
                .records
                .iter()
                .filter_map(|record| {
                    // Acquire: see `Snapshot::passed`.
                    let pin = record.pin.load(Ordering::Acquire);
                    (pin & 1 == 1).then_some((*record, pin))
                })
                .collect();
            Snapshot {
                pinned,
                // Acquire: see `Snapshot::passed`.
                unrecorded: UNRECORDED.load(Ordering::Acquire) != 0,
            }
        }
    }

    impl Guard<'_> {
        /// The current thread's counter slot: below [`OWNED_SLOTS`](super::OWNED_SLOTS),
        /// one no other live thread writes; otherwise the shared slot.
        #[inline(always)]
        pub(crate) fn slot(&self) -> usize {
            self.slot
        }
    }

    impl Drop for Guard<'_> {
        #[inline(always)]
        fn drop(&mut self) {
            if let Some(record) = self.record {
                // Relaxed: this thread is the record's only writer.
                let pinned = record.pin.load(Ordering::Relaxed);
                // Release: every access made under this pin happens before a
                // writer's acquire load that sees the new number.
                record.pin.store(pinned.wrapping_add(1), Ordering::Release);
            } else if self.unrecorded {
                // Release: as above, for the shared count.
                UNRECORDED.fetch_sub(1, Ordering::Release);
            }
        }
    }

    /// The readers pinned when a writer unpublished some memory.
    pub(crate) struct Snapshot {
        pinned: Vec<(&'static Record, u64)>,
        unrecorded: bool,
    }

    impl Snapshot {
        /// Whether every reader noted has unpinned since: the memory
        /// unpublished before the snapshot can be freed.
        pub(crate) fn passed(&mut self, _collector: &Collector) -> bool {
            // Acquire: pairs with the Release of the reader's unpin (or of a
            // later pin), so its reads happen before the caller frees.
            self.pinned
                .retain(|(record, pin)| record.pin.load(Ordering::Acquire) == *pin);
            // Acquire: as above, for readers without a record; they are not
            // told apart, so this waits for a moment with none.
            if self.unrecorded && UNRECORDED.load(Ordering::Acquire) == 0 {
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
                .finish()
        }
    }
}

#[cfg(turnstile_loom)]
mod model {
    use crate::sync::Ordering;

    /// The model collector: pins are read locks.
    pub(crate) struct Collector {
        readers: loom::sync::RwLock<()>,
    }

    pub(crate) struct Guard<'a> {
        _read: loom::sync::RwLockReadGuard<'a, ()>,
    }

    /// A snapshot is only a note that something was unpublished.
    #[derive(Debug)]
    pub(crate) struct Snapshot;

    impl Default for Collector {
        fn default() -> Self {
            Collector {
                readers: loom::sync::RwLock::new(()),
            }
        }
    }

    impl core::fmt::Debug for Collector {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            f.write_str("Collector")
        }
    }

    impl Collector {
        pub(crate) fn pin(&self) -> Guard<'_> {
            Guard {
                _read: self
                    .readers
                    .read()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            }
        }

        pub(crate) fn slot(&self) -> usize {
            super::OWNED_SLOTS
        }

        pub(crate) fn snapshot(&self) -> Snapshot {
            // SeqCst: keeps the model's writer from reordering its unpublish
            // past the lock below (the lock orders it anyway).
            loom::sync::atomic::fence(Ordering::SeqCst);
            Snapshot
        }
    }

    impl Guard<'_> {
        pub(crate) fn slot(&self) -> usize {
            super::OWNED_SLOTS
        }
    }

    impl Snapshot {
        /// Passed when no reader holds a pin now: each pin taken before the
        /// snapshot has then been released (the lock orders them).
        pub(crate) fn passed(&mut self, collector: &Collector) -> bool {
            collector.readers.try_write().is_ok()
        }
    }
}
