//! The one switch between `core`'s atomics and loom's model-checked ones.
//!
//! Every other module takes its atomics, `Arc` and spin hints from here, so that
//! `RUSTFLAGS="--cfg turnstile_loom"` swaps the whole crate onto loom at once (the shape of
//! crossbeam-utils' `primitive` module and tokio's `loom` module). The cfg has
//! the crate's own name, as crossbeam's `crossbeam_loom` does: under a plain
//! `--cfg loom` tokio swaps itself too and drops its networking, and the
//! dev-dependencies built with the loom tests (axum) no longer compile.
//!
//! Without the `std` feature only what the no_std surface uses is here:
//! `core`'s atomics, `alloc`'s `Arc` (with the `alloc` feature), and
//! [`WriterLock`] on a spin flag.

#[cfg(turnstile_loom)]
pub(crate) use loom::cell::UnsafeCell;
#[cfg(turnstile_loom)]
pub(crate) use loom::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering, fence,
};
#[cfg(turnstile_loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};

#[cfg(all(not(turnstile_loom), feature = "alloc"))]
pub(crate) use alloc::sync::Arc;
#[cfg(not(turnstile_loom))]
pub(crate) use core::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
#[cfg(all(not(turnstile_loom), feature = "std"))]
pub(crate) use core::sync::atomic::{AtomicPtr, AtomicUsize};
#[cfg(all(not(turnstile_loom), feature = "std"))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// Lock `mutex`, ignoring poison: every structure behind the crate's mutexes
/// is left consistent by each operation that can panic (allocation failure
/// aborts; the keyed map changes its books at the moment of each table
/// change, gives back reserved key places through drop guards, drops a key
/// only after it is off the books, and copies a rebuild aside before it
/// commits), so a panic in user code while it was held leaves nothing to
/// repair. `tests/keyed_faults.rs` panics at each such site.
#[cfg(feature = "std")]
#[inline]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A lock that guards no data, only a stretch of code: the writer's lock of a
/// [`LiveTokenBucket`](crate::LiveTokenBucket), which serializes quota
/// changes (decisions never take it). A [`Mutex`] with the `std` feature (and
/// so under loom), whose waiters sleep; without `std`, a flag taken by
/// compare-and-swap, whose waiters spin: a quota change holds it for the
/// conversion of one word, and no_std has nothing to sleep on. (A change
/// made from an interrupt handler that interrupted another change on the
/// same core would spin forever: the crate's docs say so.)
pub(crate) struct WriterLock {
    #[cfg(feature = "std")]
    mutex: Mutex<()>,
    #[cfg(not(feature = "std"))]
    held: AtomicBool,
}

/// A held [`WriterLock`], released when dropped.
pub(crate) struct WriterGuard<'a> {
    #[cfg(feature = "std")]
    _guard: MutexGuard<'a, ()>,
    #[cfg(not(feature = "std"))]
    held: &'a AtomicBool,
}

impl WriterLock {
    pub(crate) fn new() -> WriterLock {
        WriterLock {
            #[cfg(feature = "std")]
            mutex: Mutex::new(()),
            #[cfg(not(feature = "std"))]
            held: AtomicBool::new(false),
        }
    }

    /// Wait until the lock is free, and take it.
    pub(crate) fn lock(&self) -> WriterGuard<'_> {
        #[cfg(feature = "std")]
        {
            // Poison ignored, as in `lock`: a change leaves its slots whole.
            WriterGuard {
                _guard: lock(&self.mutex),
            }
        }
        #[cfg(not(feature = "std"))]
        {
            // Acquire on success: pairs with the Release store of the guard's
            // drop, so this holder sees every write the last holder made
            // under the lock (a `Mutex`'s ordering). Relaxed on failure: a
            // failed attempt reads nothing on the strength of it.
            while self
                .held
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                core::hint::spin_loop();
            }
            WriterGuard { held: &self.held }
        }
    }
}

#[cfg(not(feature = "std"))]
impl Drop for WriterGuard<'_> {
    fn drop(&mut self) {
        // Release: pairs with the Acquire of the next `lock`, publishing the
        // writes made under the lock.
        self.held.store(false, Ordering::Release);
    }
}

/// `core::cell::UnsafeCell` with loom's closure-based API, so that the same code
/// is checked for data races under loom.
#[cfg(all(not(turnstile_loom), feature = "std"))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(all(not(turnstile_loom), feature = "std"))]
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
#[cfg(feature = "std")]
#[inline(always)]
pub(crate) fn unwinding_under_loom() -> bool {
    cfg!(turnstile_loom) && std::thread::panicking()
}

/// What a writer does while it waits for the keyed map's readers to finish a
/// lookup (a grace period, `crate::reclaim`): let them run. Under loom,
/// `loom::thread::yield_now`, so that the model schedules the readers.
#[cfg(feature = "std")]
#[inline]
pub(crate) fn wait_for_readers() {
    #[cfg(turnstile_loom)]
    loom::thread::yield_now();
    #[cfg(not(turnstile_loom))]
    std::thread::yield_now();
}

#[cfg(all(test, not(turnstile_loom)))]
mod tests {
    use super::*;

    /// One holder at a time: each holder counts itself in and out of the
    /// stretch, and finds no one else there.
    #[test]
    fn the_writer_lock_admits_one_holder_at_a_time() {
        const THREADS: usize = 4;
        const ROUNDS: usize = 500;
        let lock = WriterLock::new();
        let inside = AtomicU64::new(0);
        let entries = AtomicU64::new(0);
        let start = std::sync::Barrier::new(THREADS);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    start.wait();
                    for _ in 0..ROUNDS {
                        let _held = lock.lock();
                        // Relaxed: the counts are checked against each
                        // other only; the lock orders the stretches.
                        assert_eq!(inside.fetch_add(1, Ordering::Relaxed), 0);
                        entries.fetch_add(1, Ordering::Relaxed);
                        // A stretch long enough for the others to try.
                        for _ in 0..100 {
                            core::hint::spin_loop();
                        }
                        assert_eq!(inside.fetch_sub(1, Ordering::Relaxed), 1);
                    }
                });
            }
        });
        assert_eq!(entries.into_inner(), (THREADS * ROUNDS) as u64);
    }
}
