//! Thread indices: a small number per live thread, reused after it exits;
//! the thread-locals that hold it, and the counter slot it gives a thread.

use super::GENERATION_SHIFT;
use super::barrier::mode;

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

pub(super) struct Indices {
    /// The next index never handed out.
    next: usize,
    /// Indices of exited threads, smallest first out.
    free: std::collections::BTreeSet<usize>,
    /// The generation of each index's live owner (`None`: free). Each
    /// owner of an index gets the next generation, so a record can tell
    /// whether its current owner has written it yet.
    pub(super) owner: Vec<Option<u16>>,
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
pub(super) fn indices() -> std::sync::MutexGuard<'static, Indices> {
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
pub(super) struct ModelIndices(
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
pub(super) fn indices() -> ModelIndices {
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
pub(super) fn thread_owner() -> Option<(usize, u64)> {
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
