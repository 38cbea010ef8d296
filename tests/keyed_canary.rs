//! A stress test of the keyed map's memory reclamation: keys that notice being
//! read after they were freed.
//!
//! Each key owns a heap canary. Its `Drop` poisons the canary before the box
//! is freed; its `Hash` and `Eq` (which the map runs inside lock-free lookups
//! and under the writer's lock) first check that the canary of every key they
//! touch is still alive and belongs to that key. A lookup that compares a key
//! the map has already freed (a grace period that ended too early) finds a
//! poisoned canary, a canary the allocator has reused for another key, or a
//! box the allocator has written its own bookkeeping into: each is counted as
//! a violation, never a panic inside `Eq`, and the test fails at the end if
//! there was any. (A lookup that reaches a freed table's header may crash the
//! test outright instead: a failure all the same.) A key dropped twice finds
//! its canary already poisoned. Every
//! key made (new or cloned) and dropped is counted too: once the limiter is
//! dropped the two counts must agree.
//!
//! The load: reader threads decide on a few hot keys and on the keys a churn
//! thread has just inserted (and which are about to be evicted), some of them
//! lingering inside `Eq` on the stored key to widen the window in which a
//! writer could free it underneath; the churn thread floods new keys past a
//! small `max_keys` while advancing a manual clock, so that keys become
//! sweepable almost at once, and calls `sweep()` between floods. Sweeps at the
//! key bound, frees from limbo and table rebuilds (growth, and shrinking after
//! a full sweep) then run all the time beside the readers. Before each lookup
//! a reader makes a few stores that miss the caches, which keep its pin in
//! the store buffer longest ([`Scratch`]), and the test's allocator
//! overwrites freed slot arrays and canaries ([`Overwriting`]), so that a
//! lookup in a freed table meets broken keys rather than intact stale ones.
//!
//! `TURNSTILE_CANARY_SECS` sets how long it runs (default 2 seconds, fractions
//! allowed), `TURNSTILE_CANARY_READERS` how many reader threads (default 3).
//! CI runs it under `tests/shim/membarrier_fail.c`, which makes the expedited
//! and global membarrier calls that stand in for the readers' fences fail
//! after a successful registration (see `src/reclaim/`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hash::{Hash, Hasher};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use turnstile::{KeyedDecision, KeyedLimiter, ManualClock, Quota, TokenBucket};

/// A live canary's state.
const ALIVE: u64 = 0xA11C_E5A1_1CE5_A11C;
/// A dropped key's canary, written just before its box is freed.
const POISON: u64 = 0xDEAD_F00D_DEAD_F00D;
/// Words of a canary beyond its state and id: a body of its own, checked word
/// by word, so that a box the allocator has handed to another key (or written
/// into) does not pass for this key's.
const BODY: usize = 6;
/// A key's inline check word is its id xor this.
const INLINE: u64 = 0x1F1E_1D1C_1B1A_1918;
/// What the allocator below writes over a freed block of 64-byte alignment.
const FREED_BYTE: u8 = 0xA5;

/// The system allocator, except that a block aligned to 64 bytes or more is
/// overwritten before it is freed. Those are the keyed tables' slot arrays
/// (whose slot groups start on a cache line) and the canaries: a lookup still
/// reading a table that a rebuild freed then meets keys that fail their
/// inline check, instead of the intact bytes a freed block keeps until the
/// allocator reuses it. (The tables' control bytes and headers, less aligned,
/// are left as the system allocator leaves them: overwritten control bytes
/// would send such a lookup probing forever instead of failing.)
struct Overwriting;

// SAFETY: every call goes to `System` with the caller's arguments; the only
// addition writes inside a block the caller is giving back.
unsafe impl GlobalAlloc for Overwriting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        if layout.align() >= 64 {
            // SAFETY: `block` is a live block of `layout.size()` bytes that the
            // caller gives up here.
            unsafe { ptr::write_bytes(block, FREED_BYTE, layout.size()) };
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(block, layout) }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() < 64 {
            // SAFETY: the caller's contract, passed on.
            return unsafe { System.realloc(block, layout, new_size) };
        }
        // SAFETY: the caller's contract: `layout` with `new_size` is valid, and
        // `block` holds `layout.size()` bytes; the old block is freed (and
        // overwritten) through `dealloc`.
        unsafe {
            let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
            let new = System.alloc(new_layout);
            if !new.is_null() {
                ptr::copy_nonoverlapping(block, new, layout.size().min(new_size));
                self.dealloc(block, layout);
            }
            new
        }
    }
}

#[global_allocator]
static ALLOCATOR: Overwriting = Overwriting;

/// Keys made (new or cloned) and dropped.
static MADE: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
/// Comparisons made by the map, and those that found a stored key whose
/// canary was not alive.
static COMPARED: AtomicU64 = AtomicU64::new(0);
static DEAD_COMPARED: AtomicU64 = AtomicU64::new(0);
/// Hashes of a key whose canary was not alive (the map hashes stored keys
/// when it rebuilds a table).
static DEAD_HASHED: AtomicU64 = AtomicU64::new(0);
/// Clones of a key whose canary was not alive.
static DEAD_CLONED: AtomicU64 = AtomicU64::new(0);
/// A key that died while `Eq` lingered on it.
static DIED_DURING_COMPARE: AtomicU64 = AtomicU64::new(0);
/// Drops of a key whose canary was already not alive.
static DOUBLE_DROPPED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// How many rounds the next comparisons linger on the stored key,
    /// checking it again at each.
    static LINGER: Cell<u32> = const { Cell::new(0) };
}

/// The heap half of a key. Atomics throughout: they may be read after the box
/// was freed (the bug this test looks for), and the compiler must not assume
/// they are unchanged. Aligned to 64 bytes, so freed canaries are overwritten
/// (see [`Overwriting`]).
#[repr(align(64))]
struct Canary {
    state: AtomicU64,
    id: AtomicU64,
    body: [AtomicU64; BODY],
}

/// A key that checks itself whenever the map hashes or compares it: its
/// inline words, then its canary.
struct CanaryKey {
    /// From `Box::into_raw`; freed by `drop`. A raw pointer, so that a key
    /// read from freed memory can be checked before it is followed.
    canary: NonNull<Canary>,
    id: u64,
    /// `id ^ INLINE`.
    check: u64,
}

// SAFETY: the canary is owned by its key, freed only by the key's drop, and
// read and written only through atomics.
unsafe impl Send for CanaryKey {}
// SAFETY: as above.
unsafe impl Sync for CanaryKey {}

impl CanaryKey {
    fn new(id: u64) -> CanaryKey {
        MADE.fetch_add(1, Ordering::Relaxed);
        let canary = Box::new(Canary {
            state: AtomicU64::new(ALIVE),
            id: AtomicU64::new(id),
            body: core::array::from_fn(|i| AtomicU64::new(body_word(id, i))),
        });
        CanaryKey {
            canary: NonNull::from(Box::leak(canary)),
            id,
            check: id ^ INLINE,
        }
    }

    /// Whether the key's inline words are whole and its canary is alive and
    /// its own. Volatile reads: the key itself may sit in freed memory.
    fn alive(&self) -> bool {
        // SAFETY: `self` is a reference, so its fields are readable memory
        // unless the map hands out a key it freed (what this looks for).
        let (id, check, canary) = unsafe {
            (
                ptr::read_volatile(&self.id),
                ptr::read_volatile(&self.check),
                ptr::read_volatile(&self.canary),
            )
        };
        if id ^ check != INLINE {
            return false;
        }
        // SAFETY: the inline words are whole, so `canary` is this key's box,
        // alive until the key's drop.
        let canary = unsafe { canary.as_ref() };
        // Acquire: pairs with the Release of the poisoning in `drop`.
        canary.state.load(Ordering::Acquire) == ALIVE
            && canary.id.load(Ordering::Relaxed) == id
            && canary
                .body
                .iter()
                .enumerate()
                .all(|(i, word)| word.load(Ordering::Relaxed) == body_word(id, i))
    }
}

fn body_word(id: u64, i: usize) -> u64 {
    id.rotate_left(i as u32 * 8) ^ 0x5A5A_5A5A_5A5A_5A5A
}

impl Clone for CanaryKey {
    fn clone(&self) -> CanaryKey {
        if !self.alive() {
            DEAD_CLONED.fetch_add(1, Ordering::Relaxed);
        }
        CanaryKey::new(self.id)
    }
}

impl Drop for CanaryKey {
    fn drop(&mut self) {
        // SAFETY: the box is this key's, alive until the end of this drop
        // (unless the key is dropped twice, which the swap below reports).
        let canary = unsafe { self.canary.as_ref() };
        // Release: a reader that sees the poison sees the key as dropped.
        let was = canary.state.swap(POISON, Ordering::AcqRel);
        if was != ALIVE {
            DOUBLE_DROPPED.fetch_add(1, Ordering::Relaxed);
        }
        DROPPED.fetch_add(1, Ordering::Relaxed);
        // SAFETY: from `Box::leak` in `new`; this is the key's only drop.
        drop(unsafe { Box::from_raw(self.canary.as_ptr()) });
    }
}

impl Hash for CanaryKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        if !self.alive() {
            DEAD_HASHED.fetch_add(1, Ordering::Relaxed);
        }
        self.id.hash(state);
    }
}

impl PartialEq for CanaryKey {
    /// The map calls this as `stored == looked_up`.
    fn eq(&self, other: &CanaryKey) -> bool {
        COMPARED.fetch_add(1, Ordering::Relaxed);
        if !(self.alive() && other.alive()) {
            DEAD_COMPARED.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        for _ in 0..LINGER.with(Cell::get) {
            std::hint::spin_loop();
            if !self.alive() {
                DIED_DURING_COMPARE.fetch_add(1, Ordering::Relaxed);
                return false;
            }
        }
        self.id == other.id
    }
}

impl Eq for CanaryKey {}

/// Every violation counter, by name.
fn violations() -> [(&'static str, u64); 5] {
    [
        ("dead key compared", DEAD_COMPARED.load(Ordering::Relaxed)),
        ("dead key hashed", DEAD_HASHED.load(Ordering::Relaxed)),
        ("dead key cloned", DEAD_CLONED.load(Ordering::Relaxed)),
        (
            "key died during a comparison",
            DIED_DURING_COMPARE.load(Ordering::Relaxed),
        ),
        ("key dropped twice", DOUBLE_DROPPED.load(Ordering::Relaxed)),
    ]
}

/// xorshift64*: the readers' choices, without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(value) => value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a valid value")),
        Err(_) => default,
    }
}

/// Hot keys every reader spends: ids below this.
const HOT: u64 = 8;
/// The churn thread's first id.
const FIRST_CHURNED: u64 = 1 << 32;
/// Readers look up one of the last this many churned keys.
const RECENT: u64 = 96;
/// The key bound: small, so that a flood reaches it at once.
const MAX_KEYS: usize = 256;
/// The quota's period; the churn thread advances the clock by a tenth of it
/// per new key, so a key used once is sweepable ten inserts later.
const PERIOD: Duration = Duration::from_millis(1);
/// The largest flood: small floods make the tables grow, fill the key bound,
/// and shrink after the next full sweep, many times a second.
const MAX_FLOOD: u64 = 128;
/// One in this many lookups of churned keys lingers in `Eq`, for this many
/// rounds (a few microseconds), checking the stored key at each.
const LINGER_EVERY: u64 = 4;
const LINGER_ROUNDS: u32 = 64;
/// Stores a reader makes to cold cache lines before each lookup (see
/// [`Scratch`]).
const COLD_STORES: usize = 32;
/// Upper bound on one thread's operations per second of the run: a cap in
/// case the clock misbehaves, far above what a thread reaches.
const OPS_PER_SEC_CAP: f64 = 50_000_000.0;

type Limiter = KeyedLimiter<CanaryKey, TokenBucket, ManualClock>;

/// What one reader did.
#[derive(Default)]
struct ReaderTally {
    decisions: u64,
    key_limits: u64,
}

/// A reader's own buffer, larger than the caches, that it writes a word of
/// each of [`COLD_STORES`] lines of just before each lookup, a page and a line
/// apart, so that they miss the caches and the TLB.
///
/// The point is the pin that follows: a store, which the processor may hold
/// in its store buffer (behind those misses) while the lookup's loads go
/// ahead. Without a fence on the reader's side, only the writer's barrier
/// makes that store visible before the writer reads the readers' records; a
/// barrier that fails unnoticed leaves exactly this window open, and the
/// stores ahead of the pin make it wide enough to hit.
struct Scratch {
    words: Vec<u64>,
    at: usize,
}

impl Scratch {
    /// Words in all: 16 MiB.
    const WORDS: usize = 2 << 20;
    /// A page and a cache line, in words.
    const STRIDE: usize = (4096 + 64) / 8;

    fn new() -> Scratch {
        Scratch {
            words: vec![0; Self::WORDS],
            at: 0,
        }
    }

    fn dirty(&mut self, value: u64) {
        for _ in 0..COLD_STORES {
            self.at = (self.at + Self::STRIDE) % Self::WORDS;
            // SAFETY: a valid, aligned `&mut u64`. Volatile: a buffer no one
            // reads would otherwise lose its stores to the optimizer.
            unsafe { ptr::write_volatile(&mut self.words[self.at], value) };
        }
    }
}

fn reader(
    limiter: &Limiter,
    latest: &AtomicU64,
    stop: &AtomicBool,
    seed: u64,
    cap: u64,
) -> ReaderTally {
    let mut rng = Rng(seed | 1);
    let mut tally = ReaderTally::default();
    let mut scratch = Scratch::new();
    while tally.decisions < cap && !stop.load(Ordering::Relaxed) {
        let r = rng.next();
        // Relaxed: any recent id will do.
        let newest = latest.load(Ordering::Relaxed);
        let id = match r % 8 {
            0..=2 => (r >> 32) & (HOT - 1),
            // Mostly keys the churn thread inserted a moment ago: the next
            // to be swept, freed and moved.
            3..=6 => newest.saturating_sub((r >> 16) % RECENT).max(FIRST_CHURNED),
            _ => FIRST_CHURNED + (r >> 16) % (newest - FIRST_CHURNED + 1),
        };
        let linger = id >= FIRST_CHURNED && (r >> 8).is_multiple_of(LINGER_EVERY);
        LINGER.with(|l| l.set(if linger { LINGER_ROUNDS } else { 0 }));
        let key = CanaryKey::new(id);
        scratch.dirty(r);
        if (r >> 12) & 15 == 0 {
            // Peeks look up without inserting.
            limiter.remaining(&key);
        } else if let KeyedDecision::KeyLimit { .. } = limiter.try_acquire(&key) {
            tally.key_limits += 1;
        }
        tally.decisions += 1;
    }
    LINGER.with(|l| l.set(0));
    tally
}

/// What the churn thread did.
#[derive(Default)]
struct ChurnTally {
    inserted: u64,
    floods: u64,
    swept: u64,
}

fn churn(
    limiter: &Limiter,
    clock: &ManualClock,
    latest: &AtomicU64,
    stop: &AtomicBool,
    cap: u64,
) -> ChurnTally {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut tally = ChurnTally::default();
    let mut next = FIRST_CHURNED;
    while tally.inserted < cap && !stop.load(Ordering::Relaxed) {
        // Floods of 1 to `MAX_FLOOD` keys: the small ones leave the tables
        // growing and shrinking around a few keys, the large ones reach the
        // key bound (the readers' inserts count towards it too).
        let flood = 1 + rng.next() % MAX_FLOOD;
        for _ in 0..flood {
            let key = CanaryKey::new(next);
            let _ = limiter.try_acquire(&key);
            // Relaxed: readers only pick ids near it.
            latest.store(next, Ordering::Relaxed);
            next += 1;
            clock.advance(PERIOD / 10);
        }
        tally.inserted += flood;
        tally.floods += 1;
        // Every key idle since the flood's middle is sweepable now.
        clock.advance(PERIOD);
        if !rng.next().is_multiple_of(4) {
            // The first sweep unlinks into limbo, the second frees what the
            // readers let go of and shrinks the tables.
            tally.swept += limiter.sweep() as u64;
            tally.swept += limiter.sweep() as u64;
        }
    }
    tally
}

#[test]
fn keys_are_never_read_after_they_are_freed_nor_dropped_twice() {
    let secs: f64 = env_or("TURNSTILE_CANARY_SECS", 2.0);
    let readers: usize = env_or("TURNSTILE_CANARY_READERS", 3);
    assert!(secs > 0.0 && readers > 0, "a run needs time and readers");
    let run_for = Duration::from_secs_f64(secs);
    let cap = (OPS_PER_SEC_CAP * secs) as u64;

    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<CanaryKey>::builder(Quota::new(2, 1, PERIOD).unwrap())
        .clock(clock.clone())
        .max_keys(MAX_KEYS)
        .shards(4)
        .sweep_every(64)
        .build()
        .unwrap();
    let latest = AtomicU64::new(FIRST_CHURNED);
    let stop = AtomicBool::new(false);

    let started = Instant::now();
    let (reads, churned) = std::thread::scope(|s| {
        let reads: Vec<_> = (0..readers)
            .map(|i| {
                let (limiter, latest, stop) = (&limiter, &latest, &stop);
                let seed = 0xC0FF_EE00 + i as u64 * 0x1_0001;
                s.spawn(move || reader(limiter, latest, stop, seed, cap))
            })
            .collect();
        let churned = {
            let (limiter, clock, latest, stop) = (&limiter, &clock, &latest, &stop);
            s.spawn(move || churn(limiter, clock, latest, stop, cap))
        };
        while started.elapsed() < run_for && !churned.is_finished() {
            std::thread::sleep(Duration::from_millis(10).min(run_for));
        }
        stop.store(true, Ordering::Relaxed);
        let reads: Vec<ReaderTally> = reads.into_iter().map(|r| r.join().unwrap()).collect();
        (reads, churned.join().unwrap())
    });
    let elapsed = started.elapsed();

    let stats = limiter.stats();
    let decisions: u64 = reads.iter().map(|r| r.decisions).sum();
    let key_limits: u64 = reads.iter().map(|r| r.key_limits).sum();
    let compared = COMPARED.load(Ordering::Relaxed);
    eprintln!(
        "keyed canary: {elapsed:.2?}, {readers} readers: {decisions} lookups \
         ({key_limits} refused at the key bound), {compared} key comparisons; churn: {} keys \
         in {} floods, {} swept by sweep(); limiter: {stats:?}",
        churned.inserted, churned.floods, churned.swept,
    );

    let found: Vec<_> = violations().into_iter().filter(|&(_, n)| n > 0).collect();
    assert!(
        found.is_empty(),
        "keys read after they were freed, or dropped twice: {found:?}"
    );
    // The run exercised what it is for.
    assert!(decisions > 0 && compared > 0, "no lookups compared a key");
    assert!(
        churned.inserted > MAX_KEYS as u64,
        "the churn never reached the key bound"
    );
    assert!(stats.evicted > 0, "nothing was evicted");

    drop(limiter);
    let (made, dropped) = (MADE.load(Ordering::SeqCst), DROPPED.load(Ordering::SeqCst));
    let found: Vec<_> = violations().into_iter().filter(|&(_, n)| n > 0).collect();
    assert!(found.is_empty(), "after dropping the limiter: {found:?}");
    assert_eq!(
        made,
        dropped,
        "keys made and dropped once the limiter is gone ({} leaked)",
        made as i128 - dropped as i128
    );
}
