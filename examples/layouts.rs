//! Four ways to lay out a million keys' words in memory, and what one check
//! costs on each: the experiment behind BENCHMARKS "Why a million keys cost
//! more than the floor".
//!
//! ```text
//! cargo run --profile bench -p turnstile-dev --example layouts            # time all four
//! cargo run --profile bench -p turnstile-dev --example layouts -- index 200000
//! ```
//!
//! Every layout holds 1,000,000 `u64` keys over 8 shards, each key with one
//! 8-byte word, hashed with `ahash`; a check finds the key and bumps its word
//! with one compare-and-swap. Nothing else: no clock, no limiter, no locks, so
//! that only the memory layout differs.
//!
//! - `hashbrown`: one `hashbrown::HashTable<(u64, AtomicU64)>` (the floor's
//!   table): a control byte per bucket in one array, the key and word in
//!   another at the same position.
//! - `index`: turnstile's keyed map before 2026-12-01 (`src/keyed/table/`
//!   at commit `7fb37a1`): per shard an open-addressing index of 8-byte slots
//!   (a hash tag and an entry number) over an arena of 16-byte entries (key,
//!   word) that never move. The map now has the `hashbrown` layout.
//! - `index32`: `index` with 4-byte slots (an 8-bit tag and a 24-bit entry
//!   number): half the index.
//! - `inline`: per shard, 64-byte buckets of four (key, word) pairs, probed
//!   bucket by bucket: the word lives where the hash points.
//!
//! Without arguments, each layout is built in its own pass and walked five
//! times in a shuffled order (not the insertion order, so no layout is walked
//! sequentially), and the best pass is printed. With `LAYOUT N`, one layout is
//! built and `N` checks run inside `measured`, for callgrind:
//!
//! ```text
//! valgrind --tool=callgrind --cache-sim=yes --LL=4194304,16,64 --callgrind-out-file=/dev/null \
//!     --toggle-collect='*measured*' target/release/examples/layouts index 200000
//! ```
//!
//! (`--LL` sets a 4 MiB last-level cache, this machine's two L2 caches
//! together; the simulated default would be the host's whole L3, which the
//! machine shares.)

#[path = "shared/keys.rs"]
mod keys;

use std::hint::black_box;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const MANY: u64 = 1_000_000;
const SHARDS: usize = 8;

/// Add one to `word`: the compare-and-swap every layout's check ends with.
#[inline(always)]
fn bump(word: &AtomicU64) -> bool {
    // Relaxed: the words publish nothing in this experiment.
    let seen = word.load(Ordering::Relaxed);
    word.compare_exchange(seen, seen + 1, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
}

/// The shard of `hash` (its low bits; the layouts use the bits above).
fn shard_of(hash: u64) -> usize {
    hash as usize % SHARDS
}

/// Slots per shard that keep 1,000,000 keys under half full, as turnstile's
/// index does at this size.
const SLOTS: usize = 1 << 18;

trait Layout {
    fn check(&self, key: u64) -> bool;
}

struct Hashbrown {
    hasher: ahash::RandomState,
    table: hashbrown::HashTable<(u64, AtomicU64)>,
}

impl Hashbrown {
    fn new(keys: &[u64]) -> Hashbrown {
        let hasher = ahash::RandomState::new();
        let mut table = hashbrown::HashTable::new();
        for &key in keys {
            table.insert_unique(hasher.hash_one(key), (key, AtomicU64::new(0)), |e| {
                hasher.hash_one(e.0)
            });
        }
        Hashbrown { hasher, table }
    }
}

impl Layout for Hashbrown {
    #[inline]
    fn check(&self, key: u64) -> bool {
        let hash = self.hasher.hash_one(key);
        self.table
            .find(hash, |e| e.0 == key)
            .is_some_and(|e| bump(&e.1))
    }
}

/// An arena entry, aligned as turnstile's.
#[repr(align(16))]
struct Entry {
    word: AtomicU64,
    key: u64,
}

struct IndexShard {
    slots: Box<[u64]>,
    arena: Vec<Entry>,
}

struct Index {
    hasher: ahash::RandomState,
    shards: Vec<IndexShard>,
}

/// A slot: the top 32 bits of the hash, and the entry's number plus one (0 is
/// an empty slot).
const TAG: u64 = 0xFFFF_FFFF_0000_0000;

impl Index {
    fn new(keys: &[u64]) -> Index {
        let hasher = ahash::RandomState::new();
        let mut shards: Vec<IndexShard> = (0..SHARDS)
            .map(|_| IndexShard {
                slots: vec![0; SLOTS].into_boxed_slice(),
                arena: Vec::new(),
            })
            .collect();
        for &key in keys {
            let hash = hasher.hash_one(key);
            let shard = &mut shards[shard_of(hash)];
            let number = shard.arena.len() as u64 + 1;
            shard.arena.push(Entry {
                word: AtomicU64::new(0),
                key,
            });
            let mut pos = (hash >> 3) as usize % SLOTS;
            while shard.slots[pos] != 0 {
                pos = (pos + 1) % SLOTS;
            }
            shard.slots[pos] = (hash & TAG) | number;
        }
        Index { hasher, shards }
    }
}

impl Layout for Index {
    #[inline]
    fn check(&self, key: u64) -> bool {
        let hash = self.hasher.hash_one(key);
        let shard = &self.shards[shard_of(hash)];
        let mut pos = (hash >> 3) as usize % SLOTS;
        loop {
            let slot = shard.slots[pos];
            if slot == 0 {
                return false;
            }
            if slot & TAG == hash & TAG {
                let entry = &shard.arena[(slot as u32 - 1) as usize];
                if entry.key == key {
                    return bump(&entry.word);
                }
            }
            pos = (pos + 1) % SLOTS;
        }
    }
}

/// `Index` with 4-byte slots: the top 8 bits of the hash and a 24-bit entry
/// number plus one.
struct Index32 {
    hasher: ahash::RandomState,
    shards: Vec<(Box<[u32]>, Vec<Entry>)>,
}

impl Index32 {
    fn new(keys: &[u64]) -> Index32 {
        let hasher = ahash::RandomState::new();
        let mut shards: Vec<(Box<[u32]>, Vec<Entry>)> = (0..SHARDS)
            .map(|_| (vec![0; SLOTS].into_boxed_slice(), Vec::new()))
            .collect();
        for &key in keys {
            let hash = hasher.hash_one(key);
            let (slots, arena) = &mut shards[shard_of(hash)];
            let number = arena.len() as u32 + 1;
            arena.push(Entry {
                word: AtomicU64::new(0),
                key,
            });
            let mut pos = (hash >> 3) as usize % SLOTS;
            while slots[pos] != 0 {
                pos = (pos + 1) % SLOTS;
            }
            slots[pos] = ((hash >> 56) as u32) << 24 | number;
        }
        Index32 { hasher, shards }
    }
}

impl Layout for Index32 {
    #[inline]
    fn check(&self, key: u64) -> bool {
        let hash = self.hasher.hash_one(key);
        let (slots, arena) = &self.shards[shard_of(hash)];
        let mut pos = (hash >> 3) as usize % SLOTS;
        loop {
            let slot = slots[pos];
            if slot == 0 {
                return false;
            }
            if slot >> 24 == (hash >> 56) as u32 {
                let entry = &arena[(slot & 0xFF_FFFF) as usize - 1];
                if entry.key == key {
                    return bump(&entry.word);
                }
            }
            pos = (pos + 1) % SLOTS;
        }
    }
}

/// Four (key, word) pairs in one cache line; key 0 marks a free pair (the
/// experiment's keys are never 0).
#[repr(C, align(64))]
#[derive(Default)]
struct Bucket {
    pairs: [(u64, AtomicU64); 4],
}

struct Inline {
    hasher: ahash::RandomState,
    shards: Vec<Box<[Bucket]>>,
}

impl Inline {
    fn new(keys: &[u64]) -> Inline {
        let hasher = ahash::RandomState::new();
        let buckets = SLOTS / 4;
        let mut shards: Vec<Box<[Bucket]>> = (0..SHARDS)
            .map(|_| (0..buckets).map(|_| Bucket::default()).collect())
            .collect();
        for &key in keys {
            let hash = hasher.hash_one(key);
            let shard = &mut shards[shard_of(hash)];
            let mut pos = (hash >> 3) as usize % buckets;
            'placed: loop {
                for pair in shard[pos].pairs.iter_mut() {
                    if pair.0 == 0 {
                        pair.0 = key;
                        break 'placed;
                    }
                }
                pos = (pos + 1) % buckets;
            }
        }
        Inline { hasher, shards }
    }
}

impl Layout for Inline {
    #[inline]
    fn check(&self, key: u64) -> bool {
        let hash = self.hasher.hash_one(key);
        let shard = &self.shards[shard_of(hash)];
        let mut pos = (hash >> 3) as usize % shard.len();
        loop {
            for pair in &shard[pos].pairs {
                if pair.0 == key {
                    return bump(&pair.1);
                }
                if pair.0 == 0 {
                    return false;
                }
            }
            pos = (pos + 1) % shard.len();
        }
    }
}

#[inline(never)]
fn measured(layout: &dyn Layout, order: &[u64], n: u64) {
    for key in order.iter().cycle().take(n as usize) {
        black_box(layout.check(*key));
    }
}

/// The keys (never 0), inserted in one shuffled order.
fn keys() -> Vec<u64> {
    keys::shuffled(MANY).into_iter().map(|k| k + 1).collect()
}

/// A second shuffled order of the same keys, for the walk: `keys` reversed
/// and rotated would be walked in the arena's order.
fn walk_order(keys: &[u64]) -> Vec<u64> {
    keys::shuffled(MANY)
        .into_iter()
        .rev()
        .map(|i| keys[i as usize])
        .collect()
}

fn build(name: &str, keys: &[u64]) -> Option<Box<dyn Layout>> {
    Some(match name {
        "hashbrown" => Box::new(Hashbrown::new(keys)),
        "index" => Box::new(Index::new(keys)),
        "index32" => Box::new(Index32::new(keys)),
        "inline" => Box::new(Inline::new(keys)),
        _ => return None,
    })
}

fn main() -> ExitCode {
    let keys = keys();
    let order = walk_order(&keys);
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [name, n] = args.as_slice() {
        let (Some(layout), Ok(n)) = (build(name, &keys), n.parse()) else {
            eprintln!("usage: layouts [hashbrown|index|index32|inline N]");
            return ExitCode::FAILURE;
        };
        measured(layout.as_ref(), &order, n);
        return ExitCode::SUCCESS;
    }
    if !args.is_empty() {
        eprintln!("usage: layouts [hashbrown|index|index32|inline N]");
        return ExitCode::FAILURE;
    }
    for name in ["hashbrown", "index", "index32", "inline"] {
        let layout = build(name, &keys).expect("a known layout");
        let mut best = f64::MAX;
        for _ in 0..5 {
            let start = Instant::now();
            let admitted = order.iter().filter(|&&k| layout.check(k)).count();
            assert_eq!(admitted, order.len(), "every key is held");
            best = best.min(start.elapsed().as_nanos() as f64 / order.len() as f64);
        }
        println!("{name:>9}: {best:5.1} ns per check (best of 5 passes)");
    }
    ExitCode::SUCCESS
}
