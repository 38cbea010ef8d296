//! Sweeping a keyed limiter: a shard's sweep with the limiter's rules (all
//! of it, or a bounded part), every shard's in turn, and the background
//! [`Sweeper`] thread.

use core::hash::{BuildHasher, Hash};

use super::Inner;
use super::table::Locked;
use crate::algorithm::Algorithm;
use crate::clock::Clock;

#[cfg(not(turnstile_loom))]
pub use sweeper::Sweeper;

impl<K, A, C, S> Inner<K, A, C, S>
where
    K: Hash + Eq,
    A: Algorithm,
    C: Clock,
    S: BuildHasher,
{
    /// Sweep up to `budget` table slots of a locked shard at `now` (read under
    /// its lock); returns the slots examined.
    pub(super) fn sweep_shard(&self, locked: &mut Locked<'_, K>, now: u64, budget: usize) -> usize {
        self.sweep_shard_idle_since(locked, now, budget, None)
    }

    /// [`sweep_shard`](Self::sweep_shard), unlinking only keys whose words
    /// were already fresh-equivalent at the reading `since`, if given, as well
    /// as at `now`.
    ///
    /// Every algorithm here reads a word at a reading before the one that
    /// wrote it as refilling (or expiring) nothing, so a word that an
    /// admission wrote at a reading after `since` is not fresh-equivalent at
    /// `since`: the keys this spares include every key admitted since then.
    /// The test only spares keys; whether a key may go is still decided at
    /// `now`, so eviction loses nothing either way.
    pub(super) fn sweep_shard_idle_since(
        &self,
        locked: &mut Locked<'_, K>,
        now: u64,
        budget: usize,
        since: Option<u64>,
    ) -> usize {
        let capacity = locked.capacity();
        let examined = capacity.min(budget);
        locked.sweep(
            |word| self.algorithm.is_fresh_equivalent(word, now),
            |word| since.is_none_or(|since| self.algorithm.is_fresh_equivalent(word, since)),
            budget,
            &self.collector,
            |k| self.hasher.hash_one(k),
            &self.counts(),
        );
        if budget >= capacity {
            // A whole sweep: the amortized schedule starts again.
            let linked = locked.linked();
            let writer = locked.writer();
            writer.inserts_since_sweep = 0;
            writer.sweep_threshold = self.sweep_every.max(linked);
            writer.swept_at = now;
        }
        examined
    }

    pub(super) fn sweep(&self) -> usize {
        let busy = self.collector.enter();
        // A full limbo stops a sweep unlinking anything, and its entries may
        // wait in a shard visited after the one with idle keys: free every
        // shard's limbo first (a sweep of budget 0 only frees limbo).
        for shard in self.shards.iter() {
            let mut locked = shard.lock(&busy);
            let now = self.clock.now();
            self.sweep_shard(&mut locked, now, 0);
        }
        let evicted = self
            .shards
            .iter()
            .map(|shard| {
                let mut locked = shard.lock(&busy);
                let now = self.clock.now();
                let before = locked.writer().evicted;
                self.sweep_shard(&mut locked, now, usize::MAX);
                (locked.writer().evicted - before) as usize
            })
            .sum();
        #[cfg(feature = "tracing")]
        tracing::debug!(
            evicted,
            keys = self.len(),
            max_keys = self.max_keys,
            shards = self.shards.len(),
            "turnstile keyed limiter swept"
        );
        evicted
    }
}

#[cfg(not(turnstile_loom))]
mod sweeper {
    use core::fmt;
    use core::hash::{BuildHasher, Hash};
    use core::time::Duration;
    use std::sync::{Arc, Weak};
    use std::thread::{self, JoinHandle};

    use crate::algorithm::Algorithm;
    use crate::clock::Clock;
    use crate::error::KeyedConfigError;
    use crate::keyed::{Inner, KeyedLimiter, MIN_SWEEP_INTERVAL};
    use crate::sync::{AtomicBool, Ordering};

    /// A background thread sweeping a [`KeyedLimiter`] every interval; dropping
    /// the handle stops it. It holds the limiter weakly, so it also stops once the
    /// limiter is dropped. Keep it for as long as the sweeping should go on
    /// (`let _sweeper = ...`, not `let _ = ...` or a bare statement, both of
    /// which drop it at once).
    #[must_use = "dropping the Sweeper stops its thread at once: keep it in a binding"]
    pub struct Sweeper {
        stop: Arc<AtomicBool>,
        thread: Option<JoinHandle<()>>,
    }

    /// Start a thread sweeping `inner` every `interval` (at least
    /// [`MIN_SWEEP_INTERVAL`]).
    pub(super) fn spawn<K, A, C, S>(
        inner: Weak<Inner<K, A, C, S>>,
        interval: Duration,
    ) -> std::io::Result<Sweeper>
    where
        K: Hash + Eq + Send + Sync + 'static,
        A: Algorithm + Send + Sync + 'static,
        C: Clock + 'static,
        S: BuildHasher + Send + Sync + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            thread::Builder::new()
                .name("turnstile-sweeper".into())
                .spawn(move || {
                    loop {
                        thread::park_timeout(interval);
                        // Acquire: pairs with the Release in `drop`, though the flag
                        // publishes nothing but itself.
                        if stop.load(Ordering::Acquire) {
                            return;
                        }
                        let Some(inner) = inner.upgrade() else {
                            return;
                        };
                        inner.sweep();
                    }
                })?
        };
        Ok(Sweeper {
            stop,
            thread: Some(thread),
        })
    }

    impl<K, A, C, S> KeyedLimiter<K, A, C, S>
    where
        K: Hash + Eq + Send + Sync + 'static,
        A: Algorithm + Send + Sync + 'static,
        C: Clock + 'static,
        S: BuildHasher + Send + Sync + 'static,
    {
        /// The limiter, with a thread of its own that sweeps every shard, one at
        /// a time, every `interval`, and stops when the limiter is dropped. Idle
        /// keys are then reclaimed even while no request comes, wherever the
        /// limiter is (inside a [`Gate`](crate::Gate), behind a tower layer). A
        /// sweeper started earlier this way is replaced.
        ///
        /// ```
        /// use std::time::Duration;
        /// use turnstile::{Gate, KeyedLimiter, Quota};
        ///
        /// let limiter = KeyedLimiter::<String>::builder(Quota::per_second(10)?)
        ///     .max_keys(100_000)
        ///     .build()?
        ///     .with_sweeper(Duration::from_secs(10))?;
        /// let gate = Gate::new(limiter);
        /// # drop(gate);
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        ///
        /// # Errors
        ///
        /// [`KeyedConfigError::SweepIntervalTooShort`] for an interval below
        /// [`MIN_SWEEP_INTERVAL`] (1 ms; zero included), and
        /// [`KeyedConfigError::SweeperThread`] when the thread could not start.
        pub fn with_sweeper(mut self, interval: Duration) -> Result<Self, KeyedConfigError> {
            check_interval(interval)?;
            let sweeper = spawn(Arc::downgrade(&self.inner), interval)
                .map_err(|e| KeyedConfigError::SweeperThread { kind: e.kind() })?;
            self.sweeper = Some(sweeper);
            Ok(self)
        }

        /// Start a thread that sweeps every shard, one at a time, every `interval`,
        /// for a limiter shared through an `Arc`; the thread stops when the handle
        /// or the limiter is dropped.
        ///
        /// ```
        /// use std::sync::Arc;
        /// use std::time::Duration;
        /// use turnstile::{KeyedLimiter, Quota};
        ///
        /// let limiter = Arc::new(KeyedLimiter::<u64>::new(Quota::per_second(10)?));
        /// // Kept in a binding: the thread sweeps for as long as `_sweeper` lives.
        /// let _sweeper = limiter.start_sweeper(Duration::from_secs(1))?;
        /// assert!(limiter.try_acquire(&7).is_allowed());
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        ///
        /// # Errors
        ///
        /// `InvalidInput` for an interval below [`MIN_SWEEP_INTERVAL`] (1 ms;
        /// zero included), carrying a
        /// [`KeyedConfigError::SweepIntervalTooShort`] (`get_ref` and
        /// `downcast_ref` reach it), or the thread could not be spawned.
        pub fn start_sweeper(self: &Arc<Self>, interval: Duration) -> std::io::Result<Sweeper> {
            check_interval(interval)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            spawn(Arc::downgrade(&self.inner), interval)
        }
    }

    /// A sweeper interval of at least [`MIN_SWEEP_INTERVAL`].
    fn check_interval(interval: Duration) -> Result<(), KeyedConfigError> {
        if interval < MIN_SWEEP_INTERVAL {
            return Err(KeyedConfigError::SweepIntervalTooShort {
                interval,
                min: MIN_SWEEP_INTERVAL,
            });
        }
        Ok(())
    }

    impl Drop for Sweeper {
        fn drop(&mut self) {
            // Release: see the thread's load.
            self.stop.store(true, Ordering::Release);
            if let Some(thread) = self.thread.take() {
                thread.thread().unpark();
                let _ = thread.join();
            }
        }
    }

    impl fmt::Debug for Sweeper {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("Sweeper").finish_non_exhaustive()
        }
    }
}
