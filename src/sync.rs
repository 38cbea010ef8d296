//! The one switch between `core`'s atomics and loom's model-checked ones.
//!
//! Every other module takes its atomics, `Arc` and spin hints from here, so that
//! `RUSTFLAGS="--cfg turnstile_loom"` swaps the whole crate onto loom at once (the shape of
//! crossbeam-utils' `primitive` module and tokio's `loom` module). The cfg has
//! the crate's own name, as crossbeam's `crossbeam_loom` does: under a plain
//! `--cfg loom` tokio swaps itself too and drops its networking, and the
//! dev-dependencies built with the loom tests (axum) no longer compile.

#[cfg(turnstile_loom)]
pub(crate) use loom::cell::UnsafeCell;
#[cfg(turnstile_loom)]
pub(crate) use loom::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
#[cfg(turnstile_loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};

#[cfg(not(turnstile_loom))]
pub(crate) use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(turnstile_loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

/// Lock `mutex`, ignoring poison: every structure behind the crate's mutexes
/// is left consistent by each operation that can panic (allocation failure
/// aborts), so a panic elsewhere while it was held leaves nothing to repair.
#[inline]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `core::cell::UnsafeCell` with loom's closure-based API, so that the same code
/// is checked for data races under loom.
#[cfg(not(turnstile_loom))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(turnstile_loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(value: T) -> UnsafeCell<T> {
        UnsafeCell(core::cell::UnsafeCell::new(value))
    }

    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// How many threads own a counter slot of their own at once; later threads
/// share one more slot, with a locked add.
pub(crate) const OWNED_SLOTS: usize = 64;

/// The counter slot of the current thread: below [`OWNED_SLOTS`], a slot no
/// other live thread writes (so a plain load and store counts exactly), or
/// `OWNED_SLOTS`, the shared slot. A thread's slot returns to the pool when the
/// thread exits.
#[cfg(not(turnstile_loom))]
#[inline]
pub(crate) fn thread_slot() -> usize {
    struct Owner(usize);

    static FREE: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());
    static NEXT: AtomicUsize = AtomicUsize::new(0);

    impl Owner {
        fn take() -> Owner {
            if let Some(slot) = lock(&FREE).pop() {
                return Owner(slot);
            }
            // Relaxed: the value only has to be unique, which the add alone ensures.
            Owner(NEXT.fetch_add(1, Ordering::Relaxed).min(OWNED_SLOTS))
        }
    }

    impl Drop for Owner {
        fn drop(&mut self) {
            if self.0 < OWNED_SLOTS {
                // The mutex orders this thread's last counts before the next
                // owner's first.
                lock(&FREE).push(self.0);
            }
        }
    }

    std::thread_local! {
        static OWNER: Owner = Owner::take();
    }
    OWNER.try_with(|owner| owner.0).unwrap_or(OWNED_SLOTS)
}

/// Under loom every thread counts in the shared slot: the counters are not part
/// of any model, and loom's thread-locals would only grow the state space.
#[cfg(turnstile_loom)]
#[inline]
pub(crate) fn thread_slot() -> usize {
    OWNED_SLOTS
}

/// Memory reclamation for the keyed map's lock-free readers.
///
/// Outside loom this is crossbeam-epoch's global collector: a reader pins the
/// current epoch for the length of one lookup and decision, and memory a writer
/// unlinks is freed (a deferred function runs) only once every thread pinned
/// at the time has unpinned.
///
/// Under loom it is a model with the same contract, checked by loom: a pin is a
/// read lock on the collector, and deferred functions run only when a writer
/// finds no reader at all (`try_write` succeeds), which is later than the epoch
/// scheme would run them, never earlier.
#[cfg(not(turnstile_loom))]
pub(crate) mod reclaim {
    use core::marker::PhantomData;

    /// The collector: crossbeam-epoch's global one, shared by every limiter.
    #[derive(Debug, Default)]
    pub(crate) struct Collector;

    /// A pinned epoch: memory reachable when it was taken stays allocated until
    /// it is dropped.
    pub(crate) struct Guard<'a> {
        inner: crossbeam_epoch::Guard,
        collector: PhantomData<&'a Collector>,
    }

    impl Collector {
        #[inline(always)]
        pub(crate) fn pin(&self) -> Guard<'_> {
            Guard {
                inner: crossbeam_epoch::pin(),
                collector: PhantomData,
            }
        }

        /// Run what deferred functions are due; crossbeam does this as threads
        /// pin, so this only pushes the local bag along.
        pub(crate) fn collect(&self) {
            crossbeam_epoch::pin().flush();
        }
    }

    impl Guard<'_> {
        /// Run `f` once no thread still holds a pin taken before this call.
        pub(crate) fn defer(&self, f: impl FnOnce() + Send + 'static) {
            self.inner.defer(f);
        }
    }
}

#[cfg(turnstile_loom)]
pub(crate) mod reclaim {
    use super::{Mutex, lock};

    type Deferred = Box<dyn FnOnce() + Send>;

    /// The model collector: pins are read locks; deferred functions wait for a
    /// moment with no reader at all.
    pub(crate) struct Collector {
        readers: loom::sync::RwLock<()>,
        deferred: Mutex<Vec<Deferred>>,
    }

    pub(crate) struct Guard<'a> {
        _read: loom::sync::RwLockReadGuard<'a, ()>,
        collector: &'a Collector,
    }

    impl Default for Collector {
        fn default() -> Self {
            Collector {
                readers: loom::sync::RwLock::new(()),
                deferred: Mutex::new(Vec::new()),
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
                collector: self,
            }
        }

        /// Run every deferred function if no reader holds a pin now: each pin
        /// taken before the functions were deferred has then been released.
        pub(crate) fn collect(&self) {
            let due = {
                let Ok(_quiet) = self.readers.try_write() else {
                    return;
                };
                core::mem::take(&mut *lock(&self.deferred))
            };
            due.into_iter().for_each(|f| f());
        }
    }

    impl Guard<'_> {
        pub(crate) fn defer(&self, f: impl FnOnce() + Send + 'static) {
            lock(&self.collector.deferred).push(Box::new(f));
        }
    }

    impl Drop for Collector {
        fn drop(&mut self) {
            let due = core::mem::take(&mut *lock(&self.deferred));
            due.into_iter().for_each(|f| f());
        }
    }
}

/// Exponential backoff for a compare-and-swap loop that lost a race.
///
/// Outside loom this is `crossbeam_utils::Backoff`. Under loom a spin is a
/// `loom::hint::spin_loop`, which yields to the model's scheduler so that a
/// retry loop cannot starve the thread it is waiting for.
#[cfg(not(turnstile_loom))]
pub(crate) use crossbeam_utils::Backoff;

#[cfg(turnstile_loom)]
#[derive(Debug, Default)]
pub(crate) struct Backoff;

#[cfg(turnstile_loom)]
impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff
    }

    pub(crate) fn spin(&self) {
        loom::hint::spin_loop();
    }
}
