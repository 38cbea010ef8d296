//! Degraded periods of a Redis-backed limiter ([`Guarded`](super::Guarded),
//! [`LeasedLimiter`](super::LeasedLimiter)): from a failed call to Redis until
//! a call succeeds again. Each period is counted, and logged (feature
//! `tracing`) once when it begins (`warn`) and once when it ends (`info`),
//! however many calls fail in between.

use core::fmt;
use std::time::Instant;

use crate::sync::{AtomicBool, AtomicU64, Mutex, Ordering, lock};

/// The least time between two `warn` events of one limiter: a Redis that
/// flaps (fails, answers, fails again) logs at most one period a second; the
/// periods in between are counted, and named in the next `warn`.
#[cfg(feature = "tracing")]
const WARN_EVERY: core::time::Duration = core::time::Duration::from_secs(1);

/// Who a [`Health`] reports for, in its log events.
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
#[derive(Clone, Copy)]
pub(crate) struct Source<'a> {
    /// `"exact"` or `"leased"`.
    pub(crate) mode: &'static str,
    /// The limiter's key prefix (its name).
    pub(crate) prefix: &'a [u8],
    /// `"deny"` or `"local"`.
    pub(crate) policy: &'static str,
    /// The backoff after each failure.
    pub(crate) backoff: core::time::Duration,
}

/// A limiter's counts when a period begins or ends: the recovery event
/// reports the difference.
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
#[derive(Clone, Copy, Default)]
pub(crate) struct Counts {
    pub(crate) failures: u64,
    pub(crate) fallbacks: u64,
}

/// Whether Redis is failing, and since when.
pub(crate) struct Health {
    /// Whether a period is open: read without the lock on every call's
    /// outcome, written only under it.
    degraded: AtomicBool,
    /// Periods begun so far.
    periods: AtomicU64,
    /// The open period, and what the log needs; locked only when a period
    /// may begin or end, not on a healthy call.
    period: Mutex<Period>,
}

// Without `tracing` only `since` is read: the rest is for the log.
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
#[derive(Default)]
struct Period {
    /// When the open period began; `None` when none is open.
    since: Option<Instant>,
    /// The counts when it began.
    at_start: Counts,
    /// Whether its beginning was logged (and so its end is).
    logged: bool,
    /// When the last `warn` was logged.
    last_warn: Option<Instant>,
    /// Periods not logged since then (within [`WARN_EVERY`] of a logged one).
    unlogged: u64,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            degraded: AtomicBool::new(false),
            periods: AtomicU64::new(0),
            period: Mutex::new(Period::default()),
        }
    }
}

impl fmt::Debug for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Health")
            .field("degraded", &self.is_degraded())
            .field("periods", &self.periods())
            .finish()
    }
}

impl Health {
    /// `true` from a failed call until a call succeeds.
    pub(crate) fn is_degraded(&self) -> bool {
        // Acquire: pairs with the Release store in `failed`, so that a
        // failure that finds the period open (and returns at once) reads,
        // in `periods`, the count that period's opening incremented before
        // it raised the flag; otherwise its fallback could take the period
        // for the previous one and skip emptying a local bucket that has
        // refilled since. A reader may still see a transition a moment late.
        self.degraded.load(Ordering::Acquire)
    }

    /// Degraded periods begun so far.
    pub(crate) fn periods(&self) -> u64 {
        // Relaxed: a count, publishing no other data.
        self.periods.load(Ordering::Relaxed)
    }

    /// The stretch of time now: degraded period `p` is `2p`, the healthy
    /// time after it `2p + 1` (before any failure, 1). A local share is
    /// emptied once per stretch, healthy ones included: a fallback while
    /// Redis is healthy (a request that waited out another's fetch) finds a
    /// bucket refilled since the last degraded period, and must not admit
    /// it whole.
    pub(crate) fn stretch(&self) -> u64 {
        loop {
            let periods = self.periods();
            // The flag read between two readings of the count that agree:
            // a flag raised by a later period's opening (Release after its
            // count) makes that count visible to the second reading.
            let degraded = self.is_degraded();
            if self.periods() == periods {
                return periods.saturating_mul(2) + u64::from(!degraded);
            }
        }
    }

    /// A call failed with `error`: the first failure of a period opens it
    /// (counted, and logged unless a `warn` was logged within the last
    /// second); any later one, during the backoff or a probe after it, only
    /// keeps it open. `counts` are the limiter's counts before this failure's
    /// own fallback.
    pub(crate) fn failed(&self, source: Source<'_>, error: &dyn fmt::Display, counts: Counts) {
        if self.is_degraded() {
            return;
        }
        let mut period = lock(&self.period);
        if period.since.is_some() {
            // Opened by another failure meanwhile.
            return;
        }
        let now = Instant::now();
        period.since = Some(now);
        period.at_start = counts;
        // The count first, then the flag. The count Relaxed: the lock orders
        // every write of it, and the Release below publishes it. The flag
        // Release: a thread that reads it set (Acquire, `is_degraded`) reads
        // this period's count too.
        self.periods.fetch_add(1, Ordering::Relaxed);
        self.degraded.store(true, Ordering::Release);
        #[cfg(feature = "tracing")]
        {
            let due = period
                .last_warn
                .is_none_or(|last| now.saturating_duration_since(last) >= WARN_EVERY);
            period.logged = due;
            if !due {
                period.unlogged += 1;
                return;
            }
            period.last_warn = Some(now);
            let unlogged = core::mem::take(&mut period.unlogged);
            drop(period);
            tracing::warn!(
                limiter = %String::from_utf8_lossy(source.prefix),
                mode = source.mode,
                policy = source.policy,
                backoff_ms = u64::try_from(source.backoff.as_millis()).unwrap_or(u64::MAX),
                error = %error,
                unlogged_periods = unlogged,
                "turnstile: Redis failed; the failure policy decides until a call to Redis \
                 succeeds (logged once per degraded period)"
            );
        }
        #[cfg(not(feature = "tracing"))]
        {
            drop(period);
            let _ = (source, error);
        }
    }

    /// A call to Redis succeeded: an open period ends (logged if its
    /// beginning was). `counts` are the limiter's counts now.
    pub(crate) fn succeeded(&self, source: Source<'_>, counts: Counts) {
        if !self.is_degraded() {
            return;
        }
        let mut period = lock(&self.period);
        let Some(since) = period.since.take() else {
            // Ended by another success meanwhile.
            return;
        };
        // Relaxed: lowering the flag publishes nothing (the lock orders it
        // with the period's opening and closing).
        self.degraded.store(false, Ordering::Relaxed);
        #[cfg(feature = "tracing")]
        {
            let at_start = period.at_start;
            let logged = core::mem::take(&mut period.logged);
            drop(period);
            if logged {
                tracing::info!(
                    limiter = %String::from_utf8_lossy(source.prefix),
                    mode = source.mode,
                    degraded_ms = u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX),
                    failures = counts.failures.saturating_sub(at_start.failures),
                    fallbacks = counts.fallbacks.saturating_sub(at_start.fallbacks),
                    "turnstile: Redis answers again; the degraded period is over"
                );
            }
        }
        #[cfg(not(feature = "tracing"))]
        {
            drop(period);
            let _ = (source, counts, since);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stretches alternate: healthy before any failure (1), degraded period
    /// `p` (2p), healthy after it (2p + 1); a failure that finds its period
    /// open stays in it.
    #[test]
    fn stretches_number_healthy_and_degraded_times_apart() {
        let health = Health::default();
        let source = Source {
            mode: "exact",
            prefix: b"t",
            policy: "local",
            backoff: core::time::Duration::from_millis(1),
        };
        let counts = Counts {
            failures: 0,
            fallbacks: 0,
        };
        assert_eq!(health.stretch(), 1);
        health.failed(source, &"down", counts);
        assert_eq!(health.stretch(), 2);
        health.failed(source, &"still down", counts);
        assert_eq!(health.stretch(), 2);
        health.succeeded(source, counts);
        assert_eq!(health.stretch(), 3);
        health.failed(source, &"down again", counts);
        assert_eq!(health.stretch(), 4);
    }
}
