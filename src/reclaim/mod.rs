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

mod barrier;
mod collector;
#[cfg(turnstile_loom)]
pub mod model;
mod thread;

pub use barrier::{BarrierMode, Reclamation, reclamation};
pub(crate) use collector::{Busy, Collector, Guard, Snapshot};
pub(crate) use thread::{OWNED_SLOTS, thread_slot};

// ---------------------------------------------------------------------------
// Records: their numbers, read by the collector (`collector.rs`) and, for
// the generation, by the thread indices (`thread.rs`).

/// A record's number: bit 0 set while pinned; bit 1 set when the owner had
/// seen fence mode before the store; bit 2 set while the owner is on a
/// writer's path; bits 3 to 47 count pins; bits 48 to 63 are the generation
/// of the thread that wrote it (see [`Indices::owner`](thread::Indices::owner)).
const PINNED: u64 = 1;
const FENCED: u64 = 2;
const BUSY: u64 = 4;
const PIN_STEP: u64 = 8;
const GENERATION_SHIFT: u32 = 48;
/// The counted part of a number.
const COUNT: u64 = ((1 << GENERATION_SHIFT) - 1) & !(PIN_STEP - 1);
