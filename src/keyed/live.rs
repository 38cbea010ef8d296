//! A keyed limiter whose quota changes while it serves: [`KeyedLimiter::live`]
//! and [`KeyedLimiter::set_quota`], on a [`LiveTokenBucket`] per key.

use super::KeyedLimiter;
use super::builder::{KeyedBuilder, default_shards};
use crate::algorithm::live::LiveTokenBucket;
use crate::algorithm::switch::Reconfigure;
use crate::clock::Clock;
use crate::error::QuotaError;
use crate::quota::Quota;

impl<K> KeyedLimiter<K, LiveTokenBucket> {
    /// A token-bucket limiter per key whose quota can be changed while it
    /// serves ([`set_quota`](KeyedLimiter::set_quota)), with the defaults of
    /// [`KeyedLimiter::new`]; capacities up to 65,535 (or `quota`'s, if
    /// larger; for more, give [`KeyedBuilder::new`] a
    /// [`LiveTokenBucket::with_ceiling`]).
    ///
    /// ```
    /// use turnstile::{KeyedLimiter, Quota};
    ///
    /// let limiter = KeyedLimiter::live(Quota::per_minute(60)?)?;
    /// assert!(limiter.try_acquire("alice").is_allowed());
    /// limiter.set_quota(Quota::per_minute(600)?)?; // raised while serving
    /// assert_eq!(limiter.remaining("bob"), 600);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`LiveTokenBucket::new`].
    pub fn live(quota: Quota) -> Result<KeyedLimiter<K, LiveTokenBucket>, QuotaError> {
        Ok(KeyedBuilder::new(LiveTokenBucket::new(quota)?).assemble(default_shards()))
    }
}

impl<K, A: Reconfigure, C: Clock, S> KeyedLimiter<K, A, C, S> {
    /// Change every key's quota while the limiter serves: every live form
    /// ([`Reconfigure`]; see [`LiveTokenBucket`], [`LiveGcra`](crate::LiveGcra),
    /// [`LiveFixedWindow`](crate::LiveFixedWindow) and
    /// [`LiveSlidingWindow`](crate::LiveSlidingWindow) for what a change
    /// does to a key's state). Keys first seen from now on start in the new
    /// quota.
    ///
    /// The change converts each held key's word, one shard at a time under
    /// that shard's writer lock (the lock inserts and sweeps take; decisions
    /// on held keys take none and go on meanwhile, each on the quota its
    /// key's word belongs to). It costs a walk over every key, so it is for
    /// a changed configuration, not for every request. Changes are
    /// serialized.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{KeyedBuilder, LiveTokenBucket, ManualClock, Quota};
    ///
    /// let limiter = KeyedBuilder::<String, _>::new(LiveTokenBucket::new(Quota::per_minute(10)?)?)
    ///     .clock(ManualClock::new())
    ///     .build()?;
    /// assert!(limiter.try_acquire_n("alice", 8)?.is_allowed());
    /// limiter.set_quota(Quota::per_minute(5)?)?;
    /// assert_eq!(limiter.remaining("alice"), 2); // kept, within the new 5
    /// assert_eq!(limiter.remaining("bob"), 5); // a new key: the new quota
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As the form's constructor ([`LiveTokenBucket::with_ceiling`],
    /// [`LiveFixedWindow::with_ceiling`](crate::LiveFixedWindow::with_ceiling),
    /// [`LiveSlidingWindow::with_ceiling`](crate::LiveSlidingWindow::with_ceiling)):
    /// the quota is refused, and nothing changes, when it is above the
    /// form's ceiling or does not fit its word.
    pub fn set_quota(&self, quota: A::Quota) -> Result<(), QuotaError> {
        let inner = &*self.inner;
        inner.algorithm.reconfigure(quota, &mut |convert| {
            let busy = inner.collector.enter();
            for shard in inner.shards.iter() {
                let locked = shard.lock(&busy);
                // Read under the lock, as a sweep does.
                let now = inner.clock.now();
                locked.for_each_held(|cell| cell.convert(|word| convert(word, now)));
            }
        })
    }

    /// The quota in force.
    pub fn quota(&self) -> A::Quota {
        self.inner.algorithm.quota()
    }
}
