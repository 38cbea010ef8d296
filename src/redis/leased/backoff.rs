//! Failures: the backoff after a failed call to Redis, the one request that
//! probes Redis after it, and the failure policy's decisions meanwhile.

use core::time::Duration;

use super::stats::Counters;
use super::{LeasedLimiter, saturating_nanos};
use crate::clock::Clock;
use crate::decision::{Decision, KeyedDecision, RetryAfter};
use crate::redis::guarded::OnFailure;
use crate::sync::Ordering;

/// Whether this request may call Redis now.
pub(super) enum Turn {
    Call,
    Skip { wait: Duration },
}

impl<C: Clock> LeasedLimiter<C> {
    fn now_nanos(&self) -> u64 {
        // At least 1, so that 0 can mean "no backoff".
        saturating_nanos(self.epoch.elapsed()).max(1)
    }

    /// Whether a request may call Redis now; after a backoff, one request
    /// probes and the others wait for another backoff unless it succeeds.
    pub(super) fn turn(&self) -> Turn {
        // Relaxed: `retry_at` publishes no other data; at worst a request
        // calls Redis once more, or falls back once more, than it had to.
        let retry_at = self.retry_at.load(Ordering::Relaxed);
        if retry_at == 0 {
            return Turn::Call;
        }
        let now = self.now_nanos();
        if now < retry_at {
            return Turn::Skip {
                wait: Duration::from_nanos(retry_at - now),
            };
        }
        let next = now.saturating_add(saturating_nanos(self.backoff));
        // Relaxed: as above.
        match self
            .retry_at
            .compare_exchange(retry_at, next, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => Turn::Call,
            Err(_) => Turn::Skip { wait: self.backoff },
        }
    }

    pub(super) fn succeed(&self) {
        if self.is_backing_off() {
            // Relaxed: see `turn`.
            self.retry_at.store(0, Ordering::Relaxed);
        }
    }

    pub(super) fn fail(&self) {
        Counters::add(&self.counters.failures, 1);
        let next = self
            .now_nanos()
            .saturating_add(saturating_nanos(self.backoff));
        // Relaxed: see `turn`.
        self.retry_at.store(next, Ordering::Relaxed);
    }

    /// The failure policy's decision; `wait` is left until Redis is tried.
    pub(super) fn fallback(&self, key: &[u8], n: u32, wait: Duration) -> Decision {
        Counters::add(&self.counters.fallbacks, 1);
        // At least 1 ns: a backoff of zero still tells a client to come back
        // (Retry-After: 1), never that it was due already.
        let deny = Decision::Denied {
            retry_after: RetryAfter::from_nanos(saturating_nanos(wait).max(1)),
        };
        match &self.on_failure {
            OnFailure::Deny => deny,
            OnFailure::Local(local) => match local.try_acquire_n(key, n) {
                Ok(KeyedDecision::Allowed { remaining }) => Decision::Allowed { remaining },
                Ok(KeyedDecision::Denied { retry_after })
                | Ok(KeyedDecision::KeyLimit { retry_after }) => Decision::Denied { retry_after },
                Err(_) => deny,
            },
        }
    }
}
