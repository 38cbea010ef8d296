//! The counters of a keyed limiter: [`KeyedStats`], summed over its shards
//! and thread slots.

use core::hash::{BuildHasher, Hash};

use super::KeyedLimiter;
use crate::algorithm::Algorithm;
use crate::clock::Clock;

/// Counters of a [`KeyedLimiter`], summed over its shards and thread slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyedStats {
    /// Keys held now.
    pub keys: usize,
    /// Requests admitted.
    ///
    /// A request that several limits decide together (a
    /// [chain](crate::chain), a combined `tower::Limits` layer) is
    /// counted here only once all of them admitted it: one a later limit
    /// refused is not, though this limiter admitted it before its permits
    /// were given back.
    pub admitted: u64,
    /// Requests denied by a key's rate (with several limits deciding
    /// together, only when this limiter is the one that refused).
    pub denied: u64,
    /// Requests for new keys denied because the limiter was full.
    pub denied_key_limit: u64,
    /// Keys evicted by sweeps.
    pub evicted: u64,
}

impl<K, A, C, S> KeyedLimiter<K, A, C, S>
where
    K: Hash + Eq,
    A: Algorithm,
    C: Clock,
    S: BuildHasher,
{
    /// Counters summed over the shards and thread slots (each read in turn, not
    /// at one instant).
    pub fn stats(&self) -> KeyedStats {
        let inner = &*self.inner;
        let mut stats = KeyedStats {
            keys: inner.len(),
            admitted: inner.tally.admitted(),
            denied: inner.tally.denied(),
            ..KeyedStats::default()
        };
        let busy = inner.collector.enter();
        for shard in inner.shards.iter() {
            let mut locked = shard.lock(&busy);
            let writer = locked.writer();
            stats.denied_key_limit += writer.denied_key_limit;
            stats.evicted += writer.evicted;
        }
        stats
    }
}
