//! Waiting for a fetch in flight: a request that finds its key dry while
//! another request (or the refresher) is fetching the key's next lease waits
//! for that fetch, within the limiter's fetch wait, instead of asking Redis
//! for its own permits; and the signal that wakes it.

use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Instant;

use super::stats::Counters;
use super::{LeasedLimiter, RETRY_AT_ONCE, word};
use crate::clock::Clock;
use crate::decision::{Decision, KeyedDecision};
use crate::sync::{AtomicU64, Ordering, fence};

/// Wakes the requests that wait for a fetch when a key's fetch ends (its
/// lease stored, or its claim released). One per limiter, for all its keys:
/// a waiter woken by another key's fetch looks at its own word and waits
/// again.
#[derive(Default)]
pub(super) struct Signal {
    /// Requests waiting now: while there are none, a fetch's end costs one
    /// load, no lock.
    waiters: AtomicU64,
    /// Counts the fetches that ended while requests waited, under the lock
    /// the waiters check their words under.
    ended: Mutex<u64>,
    woken: Condvar,
    #[cfg(feature = "tokio")]
    notify: tokio::sync::Notify,
}

impl Signal {
    /// A fetch ended: its key's `FETCHING` flag is clear now. Wake the
    /// waiters, if any.
    pub(super) fn fetch_ended(&self) {
        // SeqCst fence, paired with the one in `Waiter::new`: either this
        // load sees the waiter counted, or the waiter's look at the word
        // (after its fence) sees the flag cleared before this fence. The word
        // itself is written Relaxed, so the fences make the order.
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fence above.
        if self.waiters.load(Ordering::Relaxed) == 0 {
            return;
        }
        *self.ended.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        self.woken.notify_all();
        #[cfg(feature = "tokio")]
        self.notify.notify_waiters();
    }
}

/// A request counted among the waiters, until dropped.
struct Waiter<'a> {
    signal: &'a Signal,
}

impl<'a> Waiter<'a> {
    fn new(signal: &'a Signal) -> Self {
        // Relaxed: ordered by the fence that follows.
        signal.waiters.fetch_add(1, Ordering::Relaxed);
        // SeqCst fence: see `Signal::fetch_ended`.
        fence(Ordering::SeqCst);
        Waiter { signal }
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        // Relaxed: a count; a notifier that still sees this waiter only wakes
        // nobody.
        self.signal.waiters.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<C: Clock> LeasedLimiter<C> {
    /// Whether `key`'s fetch is in flight.
    fn fetching(&self, key: &[u8]) -> bool {
        let mut fetching = false;
        self.local.transform_linked(key, |w| {
            fetching = w & word::FETCHING != 0;
            None
        });
        fetching
    }

    /// Clear `key`'s fetch claim (its fetch ended without a lease: a failure,
    /// a cancelled request, a refresher stopped) and wake its waiters.
    pub(super) fn release_fetch(&self, key: &[u8]) {
        self.local
            .transform_linked(key, |w| Some(w & !word::FETCHING));
        self.signal.fetch_ended();
    }

    /// Wait until `key`'s fetch ends or the fetch wait runs out.
    pub(super) fn wait_for_fetch(&self, key: &[u8]) {
        Counters::add(&self.counters.fetch_waits, 1);
        // `None`: a fetch wait beyond what a clock reading can hold, taken
        // as no deadline but the fetch's own end.
        let deadline = Instant::now().checked_add(self.fetch_wait);
        let _waiter = Waiter::new(&self.signal);
        let mut ended = self
            .signal
            .ended
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        while self.fetching(key) {
            let Some(deadline) = deadline else {
                ended = self
                    .signal
                    .woken
                    .wait(ended)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            };
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return;
            };
            if left.is_zero() {
                return;
            }
            ended = self
                .signal
                .woken
                .wait_timeout(ended, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// [`wait_for_fetch`](Self::wait_for_fetch) without blocking the thread.
    #[cfg(feature = "tokio")]
    pub(super) async fn wait_for_fetch_async(&self, key: &[u8]) {
        Counters::add(&self.counters.fetch_waits, 1);
        // `None`: no deadline but the fetch's own end, as above.
        let deadline = tokio::time::Instant::now().checked_add(self.fetch_wait);
        let _waiter = Waiter::new(&self.signal);
        loop {
            let notified = self.signal.notify.notified();
            let mut notified = core::pin::pin!(notified);
            // Registered before the word is looked at: a fetch that ends
            // after the look wakes it.
            notified.as_mut().enable();
            if !self.fetching(key) {
                return;
            }
            match deadline {
                Some(deadline) => {
                    if tokio::time::timeout_at(deadline, notified).await.is_err() {
                        return;
                    }
                }
                None => notified.await,
            }
        }
    }

    /// The answer of a request that waited for its key's fetch: from the
    /// lease it brought, or the denial it kept; with no call of its own.
    /// A fetch still in flight after the wait is answered as a call that
    /// timed out is, by the failure policy (the fetch's own call reports its
    /// failure, if it fails), and so is one that ended while Redis is
    /// failing (its call failed: the fetch's own request is answered by the
    /// policy too); one that brought too few tokens for this request, or
    /// none (the bucket is dry and a denial is kept), leaves a denial.
    pub(super) fn after_wait(&self, key: &[u8], n: u32) -> Decision {
        let (decision, _, _, _) = self.local.take(key, n);
        match decision {
            KeyedDecision::Allowed { remaining } => Decision::Allowed { remaining },
            KeyedDecision::Denied { retry_after } if retry_after.as_nanos() > 0 => {
                Decision::Denied { retry_after }
            }
            KeyedDecision::Denied { .. } | KeyedDecision::KeyLimit { .. } => {
                // Redis failing (the fetch waited for among the calls that
                // failed, short of the run of timeouts that backs off): as
                // the request's own call failing, and as the fetch's own
                // request is answered.
                if self.is_backing_off() || self.is_degraded() {
                    self.fallback(key, n, self.backoff)
                } else if self.fetching(key) {
                    self.fallback(key, n, self.fetch_wait)
                } else {
                    Decision::Denied {
                        retry_after: RETRY_AT_ONCE,
                    }
                }
            }
        }
    }
}
