//! The one switch between `core`'s atomics and loom's model-checked ones.
//!
//! Every other module takes its atomics, `Arc` and spin hints from here, so that
//! `RUSTFLAGS="--cfg turnstile_loom"` swaps the whole crate onto loom at once (the shape of
//! crossbeam-utils' `primitive` module and tokio's `loom` module). The cfg has
//! the crate's own name, as crossbeam's `crossbeam_loom` does: under a plain
//! `--cfg loom` tokio swaps itself too and drops its networking, and the
//! dev-dependencies built with the loom tests (axum) no longer compile.

#[cfg(turnstile_loom)]
pub(crate) use loom::sync::Arc;
#[cfg(turnstile_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

#[cfg(not(turnstile_loom))]
pub(crate) use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(turnstile_loom))]
pub(crate) use std::sync::Arc;

/// The reader-writer lock of a keyed limiter's shard.
///
/// Outside loom this is `crossbeam_utils::sync::ShardedLock`: a read takes one of
/// several cache-padded sub-locks, chosen by the current thread, so readers on
/// different threads write different cache lines; a write takes them all. Under
/// loom it is loom's `RwLock`. Guards are returned directly: a poisoned lock can
/// only follow a panic while it was held, and the tables it guards are left
/// consistent by every operation that can panic (allocation failure aborts).
#[derive(Debug)]
pub(crate) struct ShardLock<T> {
    #[cfg(not(turnstile_loom))]
    inner: crossbeam_utils::sync::ShardedLock<T>,
    #[cfg(turnstile_loom)]
    inner: loom::sync::RwLock<T>,
}

#[cfg(not(turnstile_loom))]
pub(crate) type ReadGuard<'a, T> = crossbeam_utils::sync::ShardedLockReadGuard<'a, T>;
#[cfg(not(turnstile_loom))]
pub(crate) type WriteGuard<'a, T> = crossbeam_utils::sync::ShardedLockWriteGuard<'a, T>;
#[cfg(turnstile_loom)]
pub(crate) type ReadGuard<'a, T> = loom::sync::RwLockReadGuard<'a, T>;
#[cfg(turnstile_loom)]
pub(crate) type WriteGuard<'a, T> = loom::sync::RwLockWriteGuard<'a, T>;

impl<T> ShardLock<T> {
    pub(crate) fn new(value: T) -> Self {
        ShardLock {
            #[cfg(not(turnstile_loom))]
            inner: crossbeam_utils::sync::ShardedLock::new(value),
            #[cfg(turnstile_loom)]
            inner: loom::sync::RwLock::new(value),
        }
    }

    #[inline]
    pub(crate) fn read(&self) -> ReadGuard<'_, T> {
        self.inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[inline]
    pub(crate) fn write(&self) -> WriteGuard<'_, T> {
        self.inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A small per-thread index, for spreading per-thread counters over a few
/// cache lines: threads take consecutive values as they first ask.
#[cfg(not(turnstile_loom))]
#[inline]
pub(crate) fn thread_slot() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    std::thread_local! {
        // Relaxed: the value only needs to be some number; nothing is published.
        static SLOT: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    SLOT.try_with(|slot| *slot).unwrap_or(0)
}

/// Under loom every thread counts in slot 0: the counters are not part of any
/// model, and loom's thread-locals would only grow the state space.
#[cfg(turnstile_loom)]
#[inline]
pub(crate) fn thread_slot() -> usize {
    0
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
