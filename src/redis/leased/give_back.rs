//! Giving leases back: the keys that may hold a lease here ([`Holders`]),
//! the give-back passes over them (idle leases, or all at shutdown), and
//! forgetting the keys whose leases are spent or expired.

use core::time::Duration;
use std::collections::HashMap;

use ::redis::{ConnectionLike, RedisResult, ScriptInvocation, Value};

use super::local::LeaseWord;
use super::stats::Counters;
use super::{LeasedLimiter, saturating_nanos, word};
use crate::clock::Clock;
use crate::redis::failover::Failure;

impl<C: Clock> LeasedLimiter<C> {
    /// Give back the leases not topped up for the idle time (one script call
    /// per key), and forget the keys whose leases are spent or expired.
    /// Returns the tokens given back. Call it now and then (every idle time,
    /// say); a lease not given back expires after its lifetime anyway.
    pub fn give_back_idle(&self, con: &mut dyn ConnectionLike) -> u64 {
        self.give_back(con, Some(self.idle))
    }

    /// Give back every lease held here, however recent (at shutdown).
    pub fn give_back_all(&self, con: &mut dyn ConnectionLike) -> u64 {
        self.give_back(con, None)
    }

    /// [`give_back_idle`](Self::give_back_idle) on an asynchronous connection
    /// (feature `tokio` too).
    #[cfg(feature = "tokio")]
    pub async fn give_back_idle_async<Con: ::redis::aio::ConnectionLike>(
        &self,
        con: &mut Con,
    ) -> u64 {
        let idle = Some(self.idle);
        let mut total = 0;
        for key in self.idle_keys(idle) {
            match self.give_back_key_async(&key, idle, con).await {
                Step::Gave(tokens) => total += tokens,
                Step::Stop => break,
            }
        }
        total
    }

    fn give_back(&self, con: &mut dyn ConnectionLike, idle: Option<Duration>) -> u64 {
        let mut total = 0;
        for key in self.idle_keys(idle) {
            match self.give_back_key(&key, idle, con) {
                Step::Gave(tokens) => total += tokens,
                Step::Stop => break,
            }
        }
        total
    }

    /// Give back `key`'s lease if it is still idle: one step of a pass over
    /// [`idle_keys`](Self::idle_keys), which a refresher interleaves with
    /// the prefetches queued meanwhile.
    pub(super) fn give_back_key(
        &self,
        key: &[u8],
        idle: Option<Duration>,
        con: &mut dyn ConnectionLike,
    ) -> Step {
        // A failure starts a backoff: the rest wait for the next pass, so
        // that a dead Redis costs one call's deadlines, not one per key.
        if self.is_backing_off() {
            return Step::Stop;
        }
        let Some((tokens, window)) = self.take_lease(key, idle) else {
            return Step::Gave(0);
        };
        let result = self.give_back_invocation(key, tokens, window).invoke(con);
        let failed = stops(&result);
        let gave = self.settle_give_back(tokens, result);
        // A timeout need not start the backoff (a strike): the pass stops at
        // its own first failure all the same.
        if failed { Step::Stop } else { Step::Gave(gave) }
    }

    /// [`give_back_key`](Self::give_back_key) on an asynchronous connection.
    #[cfg(feature = "tokio")]
    pub(super) async fn give_back_key_async<Con: ::redis::aio::ConnectionLike>(
        &self,
        key: &[u8],
        idle: Option<Duration>,
        con: &mut Con,
    ) -> Step {
        if self.is_backing_off() {
            return Step::Stop;
        }
        let Some((tokens, window)) = self.take_lease(key, idle) else {
            return Step::Gave(0);
        };
        let result = self
            .give_back_invocation(key, tokens, window)
            .invoke_async(con)
            .await;
        let failed = stops(&result);
        let gave = self.settle_give_back(tokens, result);
        if failed { Step::Stop } else { Step::Gave(gave) }
    }

    /// The keys whose leases are idle (all that hold tokens, for `None`);
    /// forget those whose leases are spent or expired.
    pub(super) fn idle_keys(&self, idle: Option<Duration>) -> Vec<Vec<u8>> {
        if self.is_backing_off() {
            return Vec::new();
        }
        let now = self.local.clock().now();
        let mut holders = self.holders.lock().unwrap_or_else(|e| e.into_inner());
        let mut keys = Vec::new();
        holders.keys.retain(|key, _| {
            let mut state = Lease::Spent;
            self.local.transform_linked(key.as_slice(), |w| {
                state = self.lease_state(w, now, idle);
                None
            });
            if state == Lease::Idle(true) {
                keys.push(key.clone());
            }
            state != Lease::Spent
        });
        keys
    }

    /// Empty `key`'s lease word if its lease is still idle, and forget the
    /// key; the tokens it held, and the window their lease was counted in
    /// (0 but for the windows).
    fn take_lease(&self, key: &[u8], idle: Option<Duration>) -> Option<(u32, u64)> {
        // Held across the word's emptying and the key's removal: a lease
        // granted in between (which inserts the key under this lock) must not
        // lose its key to this removal. (Taking the word needs no shard lock,
        // so the order of the two locks is the one `idle_keys` keeps.)
        let mut holders = self.holders.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.local.clock().now();
        let mut took = 0;
        self.local.transform_linked(key, |w| {
            took = 0;
            if self.lease_state(w, now, idle) != Lease::Idle(true) {
                return None;
            }
            took = LeaseWord::usable(w, now);
            Some(word::with_tokens(w, 0))
        });
        if took == 0 {
            return None;
        }
        // Noted before the word took the lease, under this lock.
        let window = holders.keys.remove(key).unwrap_or(0);
        Some((took, window))
    }

    /// Forget the keys whose leases are spent, expired or gone, and prune
    /// again when the keys left have doubled: the set stays within twice the
    /// keys that hold tokens (so within twice `max_keys`), at a cost per
    /// insert that is constant on average, with or without give-back passes.
    pub(super) fn prune(&self, holders: &mut Holders, now: u64) {
        holders.keys.retain(|key, _| {
            let mut keep = false;
            self.local.transform_linked(key.as_slice(), |w| {
                // A fetch under way may be about to store a lease.
                keep = LeaseWord::usable(w, now) > 0 || w & word::FETCHING != 0;
                None
            });
            keep
        });
        holders.prune_at = holders.keys.len().saturating_mul(2).max(MIN_PRUNE);
    }

    /// What a give-back pass does with lease word `w` at `now`.
    fn lease_state(&self, w: u64, now: u64, idle: Option<Duration>) -> Lease {
        // First: a fetch under way (whose lease may not be stored yet, with
        // its key already noted) keeps the key, whatever the word holds now.
        if w & word::FETCHING != 0 {
            return Lease::Idle(false);
        }
        if LeaseWord::usable(w, now) == 0 {
            return Lease::Spent;
        }
        let Some(idle) = idle else {
            return Lease::Idle(true);
        };
        // The lease was granted a lifetime before its expiry.
        let granted = word::time(w).saturating_sub(self.lifetime_units);
        let idle_units = word::units_up(saturating_nanos(idle));
        Lease::Idle(word::units_down(now) >= granted.saturating_add(idle_units))
    }

    fn give_back_invocation(
        &self,
        key: &[u8],
        tokens: u32,
        window: u64,
    ) -> ScriptInvocation<'static> {
        let mut invocation = self.limiter.algorithm().lease_scripts().1.prepare_invoke();
        invocation
            .key(self.limiter.redis_key(key))
            .arg("")
            .arg(tokens)
            .arg(self.limiter.slack_millis);
        for param in &self.limiter.params {
            invocation.arg(*param);
        }
        // The windows' give-backs return the tokens to that window only.
        invocation.arg(window);
        invocation
    }

    fn settle_give_back(&self, tokens: u32, result: RedisResult<Value>) -> u64 {
        match result {
            Ok(reply) => {
                // Redis answered: as any call's answer, the backoff and the
                // degraded period end.
                self.succeed();
                Counters::add(&self.counters.give_back_calls, 1);
                // A window's give-back declines once its window has passed
                // (`{0, …}`): the tokens count nowhere any more.
                let declined = matches!(&reply, Value::Array(items)
                    if matches!(items.first(), Some(Value::Int(0))));
                if declined {
                    return 0;
                }
                Counters::add(&self.counters.tokens_given_back, u64::from(tokens));
                u64::from(tokens)
            }
            Err(e) => {
                // The tokens are lost to the bucket until it refills them.
                self.fail(&e);
                0
            }
        }
    }
}

/// What one step of a give-back pass did.
pub(super) enum Step {
    /// The tokens given back (0: the lease was no longer idle, or the give
    /// back declined); the pass goes on.
    Gave(u64),
    /// The call failed, or the limiter is backing off: the pass stops.
    Stop,
}

/// Whether a give-back's `result` stops the pass: a failure of Redis does,
/// an error about its key alone ([`Failure::per_key`]: Redis answered) does
/// not, so that one such key keeps no other key's lease from going back.
fn stops(result: &RedisResult<Value>) -> bool {
    result.as_ref().is_err_and(|e| !e.per_key())
}

/// The keys that may hold a lease here, for give-back passes, each with the
/// window its last lease was counted in (0 but for the windows).
pub(super) struct Holders {
    pub(super) keys: HashMap<Vec<u8>, u64>,
    /// The size at which an insert first forgets the keys holding nothing.
    pub(super) prune_at: usize,
}

/// The least size at which [`Holders`] is pruned.
pub(super) const MIN_PRUNE: usize = 1_024;

/// A lease word as a give-back pass sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lease {
    /// No usable tokens: nothing to give back, and the key can be forgotten.
    Spent,
    /// Tokens held: given back (`true`) or kept (`false`: in use, or a fetch
    /// is under way).
    Idle(bool),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::token_bucket::TokenBucket;
    use crate::redis::RedisLimiter;
    use crate::redis::leased::{LeasedBuilder, Step};

    /// A give-back pass empties a key's word and then forgets the key; a
    /// lease granted in between must keep its key in `holders`, or no later
    /// pass (nor `give_back_all` at shutdown) sees it. The pass is held at
    /// the `holders` lock while a miss takes a new lease.
    #[test]
    fn a_lease_granted_during_a_give_back_keeps_its_key() {
        use crate::clock::ManualClock;
        use std::sync::Arc;
        let clock = ManualClock::new();
        let global = RedisLimiter::new(
            "race",
            TokenBucket::new(crate::Quota::per_second(1_000).unwrap()),
        )
        .unwrap();
        let limiter = Arc::new(
            LeasedBuilder::new(global, 8)
                .unwrap()
                .lifetime(Duration::from_secs(10))
                .clock(clock)
                .build()
                .unwrap(),
        );
        let granted = Value::Array([4, 0, 0, 0].into_iter().map(Value::Int).collect());
        let mut lost = 0;
        for i in 0..100 {
            let key = format!("k{i}").into_bytes();
            let Ok(Step::Lease(fetch)) = limiter.step(&key, 1) else {
                panic!("a first request takes a lease");
            };
            let _ = limiter.finish_lease(&key, 1, &fetch, Ok(granted.clone()));
            assert!(limiter.held(&key) > 0);
            let pause = limiter.holders.lock().unwrap();
            let pass = {
                let (limiter, key) = (Arc::clone(&limiter), key.clone());
                std::thread::spawn(move || limiter.take_lease(&key, None))
            };
            // Give the pass time to reach the lock (or, on the old order, to
            // empty the word first).
            let start = std::time::Instant::now();
            while limiter.held(&key) != 0 && start.elapsed() < Duration::from_millis(20) {
                std::thread::yield_now();
            }
            if limiter.held(&key) != 0 {
                // The pass waits for the lock before touching the word.
                drop(pause);
                let _ = pass.join().unwrap();
                continue;
            }
            // The word was emptied with the key still listed: a miss takes a
            // new lease before the pass forgets the key.
            let Ok(Step::Lease(fetch)) = limiter.step(&key, 1) else {
                panic!("a miss after the word was emptied");
            };
            let miss = {
                let (limiter, key, granted) = (Arc::clone(&limiter), key.clone(), granted.clone());
                std::thread::spawn(move || limiter.finish_lease(&key, 1, &fetch, Ok(granted)))
            };
            std::thread::sleep(Duration::from_millis(2));
            drop(pause);
            let _ = pass.join().unwrap();
            let _ = miss.join().unwrap();
            if limiter.held(&key) > 0 && !limiter.holders.lock().unwrap().keys.contains_key(&key) {
                lost += 1;
            }
        }
        assert_eq!(
            lost, 0,
            "{lost} keys hold a lease but are not kept for give-back passes"
        );
    }
}
