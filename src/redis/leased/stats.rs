//! The counts of a [`LeasedLimiter`]: [`LeasedStats`], and the counters
//! behind them.

use super::LeasedLimiter;
use crate::clock::Clock;
use crate::sync::{AtomicU64, Ordering};

/// A [`LeasedLimiter`]'s counts: what Redis was asked, and what the failure
/// policy answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeasedStats {
    /// Lease script calls that returned (with or without tokens).
    pub lease_calls: u64,
    /// Tokens those calls granted.
    pub tokens_leased: u64,
    /// Give-back script calls that returned.
    pub give_back_calls: u64,
    /// Tokens given back.
    pub tokens_given_back: u64,
    /// Exact-mode calls (a miss while another request was fetching, or a
    /// request larger than the largest lease).
    pub exact_calls: u64,
    /// Requests that found their key dry while its next lease was being
    /// fetched, and waited for that fetch instead of a call of their own.
    pub fetch_waits: u64,
    /// Requests that a kept denial would have answered, and that asked
    /// Redis instead: one in every largest lease `L` of them, so that a
    /// process's calls to a dry key follow its demand.
    pub probes: u64,
    /// Calls to Redis that failed (no connection, a timeout, an error reply),
    /// including those that failed for their key alone (it holds something
    /// other than this limiter's state), which start no degraded period.
    pub failures: u64,
    /// Decisions made by the failure policy instead of Redis (peeks
    /// included: a check before a request counts as well as the request).
    pub fallbacks: u64,
    /// Whether Redis is failing now: from a failed call until a call
    /// succeeds ([`LeasedLimiter::is_degraded`]). A call that failed for
    /// its key alone is answered, and counts as a success here.
    pub degraded: bool,
    /// Degraded periods so far: each begins with a failed call while none
    /// was open, and ends when a call succeeds.
    pub degraded_periods: u64,
    /// Permits the local share of [`OnFailure::Local`](crate::redis::OnFailure::Local)
    /// admitted that Redis has not yet been charged for: each key's next
    /// call that decides in Redis asks for them too (see the guide's
    /// failover rule).
    pub owed: u64,
}

impl LeasedStats {
    /// Every call to Redis that returned: lease, give-back and exact-mode
    /// calls.
    pub fn redis_calls(&self) -> u64 {
        self.lease_calls + self.give_back_calls + self.exact_calls
    }
}

/// Counters, each on its own.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) lease_calls: AtomicU64,
    pub(super) tokens_leased: AtomicU64,
    pub(super) give_back_calls: AtomicU64,
    pub(super) tokens_given_back: AtomicU64,
    pub(super) exact_calls: AtomicU64,
    pub(super) fetch_waits: AtomicU64,
    pub(super) probes: AtomicU64,
    pub(super) failures: AtomicU64,
    pub(super) fallbacks: AtomicU64,
}

impl Counters {
    pub(super) fn add(counter: &AtomicU64, by: u64) {
        // Relaxed: a count, which publishes no other data.
        counter.fetch_add(by, Ordering::Relaxed);
    }
}

impl<C: Clock> LeasedLimiter<C> {
    /// Counts so far.
    pub fn stats(&self) -> LeasedStats {
        // Relaxed: counts, which publish no other data.
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let c = &self.counters;
        LeasedStats {
            lease_calls: load(&c.lease_calls),
            tokens_leased: load(&c.tokens_leased),
            give_back_calls: load(&c.give_back_calls),
            tokens_given_back: load(&c.tokens_given_back),
            exact_calls: load(&c.exact_calls),
            fetch_waits: load(&c.fetch_waits),
            probes: load(&c.probes),
            failures: load(&c.failures),
            fallbacks: load(&c.fallbacks),
            degraded: self.health.is_degraded(),
            degraded_periods: self.health.periods(),
            owed: self.ledger.total(),
        }
    }
}
