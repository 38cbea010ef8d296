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
pub(crate) use loom::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering, fence,
};
#[cfg(turnstile_loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};

#[cfg(not(turnstile_loom))]
pub(crate) use core::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering, fence,
};
#[cfg(not(turnstile_loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

/// Lock `mutex`, ignoring poison: every structure behind the crate's mutexes
/// is left consistent by each operation that can panic (allocation failure
/// aborts; the keyed map changes its books at the moment of each table
/// change, gives back reserved key places through drop guards, drops a key
/// only after it is off the books, and copies a rebuild aside before it
/// commits), so a panic in user code while it was held leaves nothing to
/// repair. `tests/keyed_faults.rs` panics at each such site.
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

/// What a compare-and-swap loop does after losing a race: outside loom,
/// nothing; it decides again on the value the failed swap returned, at once.
///
/// Not an exponential backoff (`crossbeam_utils::Backoff`, used before): on
/// one contended word the thread that just won holds the cache line and
/// wins again while the losers spin, so backoff trades fairness for a
/// burst of one thread's throughput, and loses both as threads are added.
/// Measured with `examples/scaling.rs` on 16 cores, every thread on one
/// direct limiter: with the backoff some threads made no decision at all in
/// 300 ms and the total fell from 26 M/s (one thread) to 5.0 M/s (16
/// threads); retrying at once, no thread's share fell below 2.4% (6.25% is
/// even) and 16 threads made 11.1 M/s, level with governor (BENCHMARKS.md,
/// "Many threads").
///
/// Under loom this is `loom::hint::spin_loop`, which yields to the model's
/// scheduler so that a retry loop cannot starve the thread it is waiting for.
#[inline(always)]
pub(crate) fn lost_race() {
    #[cfg(turnstile_loom)]
    loom::hint::spin_loop();
}

/// Whether this thread is unwinding from a failed loom model: drops then
/// skip their atomic operations, which loom cannot run once an execution
/// has failed (it aborts the process instead of reporting the failure).
/// Always `false` outside loom.
#[inline(always)]
pub(crate) fn unwinding_under_loom() -> bool {
    cfg!(turnstile_loom) && std::thread::panicking()
}

/// What a writer does while it waits for the keyed map's readers to finish a
/// lookup (a grace period, `crate::reclaim`): let them run. Under loom,
/// `loom::thread::yield_now`, so that the model schedules the readers.
#[inline]
pub(crate) fn wait_for_readers() {
    #[cfg(turnstile_loom)]
    loom::thread::yield_now();
    #[cfg(not(turnstile_loom))]
    std::thread::yield_now();
}
