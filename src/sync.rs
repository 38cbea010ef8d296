//! The one switch between `core`'s atomics and loom's model-checked ones.
//!
//! Every other module takes its atomics, `Arc` and spin hints from here, so that
//! `RUSTFLAGS="--cfg loom"` swaps the whole crate onto loom at once (the shape of
//! crossbeam-utils' `primitive` module and tokio's `loom` module).

#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::Arc;

/// A reader-writer lock: `parking_lot`'s, or loom's under loom. Guards are
/// returned directly; loom's poisoning can only follow a panic inside a model,
/// which has already failed the test.
#[cfg(not(loom))]
pub(crate) use parking_lot::RwLock;

#[cfg(loom)]
#[derive(Debug)]
pub(crate) struct RwLock<T>(loom::sync::RwLock<T>);

#[cfg(loom)]
impl<T> RwLock<T> {
    pub(crate) fn new(value: T) -> Self {
        RwLock(loom::sync::RwLock::new(value))
    }

    pub(crate) fn read(&self) -> loom::sync::RwLockReadGuard<'_, T> {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn write(&self) -> loom::sync::RwLockWriteGuard<'_, T> {
        self.0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Exponential backoff for a compare-and-swap loop that lost a race.
///
/// Outside loom this is `crossbeam_utils::Backoff`. Under loom a spin is a
/// `loom::hint::spin_loop`, which yields to the model's scheduler so that a
/// retry loop cannot starve the thread it is waiting for.
#[cfg(not(loom))]
pub(crate) use crossbeam_utils::Backoff;

#[cfg(loom)]
#[derive(Debug, Default)]
pub(crate) struct Backoff;

#[cfg(loom)]
impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff
    }

    pub(crate) fn spin(&self) {
        loom::hint::spin_loop();
    }
}
