//! The one switch between `core`'s atomics and loom's model-checked ones.
//!
//! Every other module takes its atomics, `Arc` and spin hints from here, so that
//! `RUSTFLAGS="--cfg loom"` swaps the whole crate onto loom at once (the shape of
//! crossbeam-utils' `primitive` module and tokio's `loom` module).

#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::Arc;

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
