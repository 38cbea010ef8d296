//! Counts that every decision adds to, without a locked instruction.

use core::fmt;

use crossbeam_utils::CachePadded;

use crate::decision::Decision;
use crate::reclaim::OWNED_SLOTS;
use crate::sync::{AtomicU64, Ordering};

/// `N` counters (the first two: admitted and denied), one cache-padded set
/// per thread slot.
///
/// A thread that owns its slot (a slot below [`OWNED_SLOTS`], from
/// [`Guard::slot`](crate::reclaim::Guard::slot) or
/// [`thread_slot`](crate::reclaim::thread_slot): its thread index, which no
/// other live thread holds) is the
/// only writer of that set, so it counts with a plain load and store: exact,
/// and no locked read-modify-write on the decision path. Threads beyond the
/// owned slots share one set and add with `fetch_add`. A reader sums the
/// slots, each read in turn (a snapshot of each counter, not of all at one
/// instant).
pub(crate) struct Tally<const N: usize = 2> {
    slots: Box<[CachePadded<[AtomicU64; N]>]>,
}

pub(crate) const ADMITTED: usize = 0;
pub(crate) const DENIED: usize = 1;

impl<const N: usize> Tally<N> {
    pub(crate) fn new() -> Tally<N> {
        Tally {
            slots: (0..=OWNED_SLOTS)
                .map(|_| CachePadded::new(core::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }

    /// Count one decision by the thread whose slot is `slot`.
    #[inline(always)]
    pub(crate) fn count(&self, decision: Decision, slot: usize) {
        self.count_outcome(decision.is_allowed(), slot);
    }

    /// Count one admission (`true`) or denial by the thread whose slot is `slot`.
    #[inline(always)]
    pub(crate) fn count_outcome(&self, allowed: bool, slot: usize) {
        self.add(usize::from(!allowed), slot);
    }

    /// Add one to counter `which` for the thread whose slot is `slot`.
    #[inline(always)]
    pub(crate) fn add(&self, which: usize, slot: usize) {
        self.add_n(which, slot, 1);
    }

    /// Add `n` to counter `which` for the thread whose slot is `slot`.
    #[inline(always)]
    pub(crate) fn add_n(&self, which: usize, slot: usize, n: u64) {
        // `slot <= OWNED_SLOTS`: a guard's slot, or the shared one.
        let counter = &self.slots[slot][which];
        if slot < OWNED_SLOTS {
            // Relaxed, as a load and a store: this thread is the slot's only
            // writer, so no other write can fall between them; the counts
            // publish nothing.
            counter.store(
                counter.load(Ordering::Relaxed).wrapping_add(n),
                Ordering::Relaxed,
            );
        } else {
            // Relaxed: the shared slot has several writers, so the add must be
            // atomic; it publishes nothing.
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Admitted decisions so far.
    pub(crate) fn admitted(&self) -> u64 {
        self.sum(ADMITTED)
    }

    /// Denied decisions so far.
    pub(crate) fn denied(&self) -> u64 {
        self.sum(DENIED)
    }

    /// Counter `which`, summed over the slots.
    pub(crate) fn sum(&self, which: usize) -> u64 {
        self.slots
            .iter()
            // Relaxed: counters, read for reporting.
            .map(|pair| pair[which].load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }
}

impl<const N: usize> fmt::Debug for Tally<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tally")
            .field("admitted", &self.admitted())
            .field("denied", &self.denied())
            .finish()
    }
}
