//! A bound on calls in flight: the rate-limiter pattern's bulkhead.

use core::fmt;

use crossbeam_utils::CachePadded;

use crate::error::check_permits;
use crate::error::{AcquireError, QuotaError};
use crate::sync::{AtomicU64, Ordering};
// std's `Arc` even under loom: loom's cannot be a method receiver, and the
// counter inside is what the model checks.
use std::sync::Arc;

#[cfg(feature = "tokio")]
pub(crate) mod signal;

/// At most `limit` permits held at once, whatever the rate: a bulkhead in front
/// of a resource that is bounded by concurrency (connections, CPU, memory)
/// rather than by requests per second.
///
/// Acquiring returns a [`Permit`] that gives its share back when dropped, so a
/// call that panics or returns early cannot leak one (a permit passed to
/// `std::mem::forget` is never dropped, and holds its share for good). Lock-free: one
/// compare-and-swap on one counter to acquire, one atomic subtraction to release.
/// A refusal has no retry-after (nobody can say when a call will finish); an HTTP
/// gate answers it with 503.
///
/// ```
/// use turnstile::ConcurrencyLimiter;
///
/// let bulkhead = ConcurrencyLimiter::new(2)?;
/// let a = bulkhead.try_acquire().expect("1 of 2");
/// let b = bulkhead.try_acquire().expect("2 of 2");
/// assert!(bulkhead.try_acquire().is_none()); // two calls in flight already
/// drop(a); // the call finished
/// assert!(bulkhead.try_acquire().is_some());
/// # drop(b);
/// # Ok::<(), turnstile::QuotaError>(())
/// ```
///
/// # Orderings
///
/// A successful acquire is `Acquire` and a release is `Release`, the convention
/// of a semaphore: what one holder wrote before dropping its permit is visible
/// to the next holder of that share. The bound itself needs only the counter's
/// single modification order; loom checks both (`loom-tests/`).
pub struct ConcurrencyLimiter {
    in_flight: CachePadded<AtomicU64>,
    limit: u32,
    /// Wakes the head of a [`Fair`](crate::Fair) queue when a permit is dropped.
    #[cfg(feature = "tokio")]
    pub(crate) released: signal::ReleaseSignal,
}

impl ConcurrencyLimiter {
    /// At most `limit` permits in flight.
    ///
    /// # Errors
    ///
    /// [`QuotaError::ZeroLimit`] for 0: such a bulkhead would admit nothing.
    pub fn new(limit: u32) -> Result<ConcurrencyLimiter, QuotaError> {
        if limit == 0 {
            return Err(QuotaError::ZeroLimit);
        }
        Ok(ConcurrencyLimiter {
            in_flight: CachePadded::new(AtomicU64::new(0)),
            limit,
            #[cfg(feature = "tokio")]
            released: signal::ReleaseSignal::default(),
        })
    }

    /// One permit, if fewer than `limit` are held.
    #[inline]
    pub fn try_acquire(&self) -> Option<Permit<'_>> {
        // `then`, not `then_some`: a permit built eagerly would be dropped, and
        // released, when the reservation fails.
        self.reserve(1).then(|| Permit {
            limiter: self,
            n: 1,
        })
    }

    /// `n` permits at once (a call that weighs more), all or nothing.
    ///
    /// # Errors
    ///
    /// [`AcquireError::ZeroPermits`] for `n = 0` and
    /// [`AcquireError::InsufficientCapacity`] above the limit: such a request
    /// can never succeed.
    #[inline]
    pub fn try_acquire_n(&self, n: u32) -> Result<Option<Permit<'_>>, AcquireError> {
        check_permits(n, self.limit)?;
        Ok(self.reserve(n).then(|| Permit { limiter: self, n }))
    }

    /// One permit that owns a handle to the limiter, to move into a task or
    /// another thread.
    #[inline]
    pub fn try_acquire_owned(self: &Arc<Self>) -> Option<OwnedPermit> {
        self.reserve(1).then(|| OwnedPermit {
            limiter: Arc::clone(self),
            n: 1,
        })
    }

    /// `n` owned permits, all or nothing.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n).
    #[inline]
    pub fn try_acquire_n_owned(
        self: &Arc<Self>,
        n: u32,
    ) -> Result<Option<OwnedPermit>, AcquireError> {
        check_permits(n, self.limit)?;
        Ok(self.reserve(n).then(|| OwnedPermit {
            limiter: Arc::clone(self),
            n,
        }))
    }

    /// The permits held now.
    pub fn in_flight(&self) -> u32 {
        // Relaxed: a snapshot for monitoring; it orders nothing.
        // `<= limit <= u32::MAX`
        self.in_flight.load(Ordering::Relaxed) as u32
    }

    /// The permits free now.
    pub fn available(&self) -> u32 {
        self.limit - self.in_flight()
    }

    /// The most permits held at once.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    #[inline]
    fn reserve(&self, n: u32) -> bool {
        let n = u64::from(n);
        let limit = u64::from(self.limit);
        // Relaxed: only the input to the compare-and-swap below, which checks it.
        let mut held = self.in_flight.load(Ordering::Relaxed);
        loop {
            if held + n > limit {
                return false;
            }
            // Acquire on success: see the type's documentation. Relaxed on
            // failure: the value is only the input to the next attempt.
            match self.in_flight.compare_exchange_weak(
                held,
                held + n,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => held = actual,
            }
        }
    }

    #[inline]
    fn release(&self, n: u32) {
        // Release: see the type's documentation. Every permit was reserved, so
        // the count cannot go below zero. With a fair queue (feature `tokio`)
        // SeqCst, which includes Release: the subtraction must precede the
        // load of the queue's flag in the single order of SeqCst operations
        // (`fair::ReleaseSignal`). The same locked instruction on x86-64 and
        // AArch64.
        #[cfg(feature = "tokio")]
        {
            self.in_flight.fetch_sub(u64::from(n), Ordering::SeqCst);
            self.released.notify();
        }
        #[cfg(not(feature = "tokio"))]
        self.in_flight.fetch_sub(u64::from(n), Ordering::Release);
    }
}

impl fmt::Debug for ConcurrencyLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimiter")
            .field("in_flight", &self.in_flight())
            .field("limit", &self.limit)
            .finish()
    }
}

/// Permits held from a [`ConcurrencyLimiter`]; dropping it gives them back.
#[must_use = "dropping the permit releases it at once"]
pub struct Permit<'a> {
    limiter: &'a ConcurrencyLimiter,
    n: u32,
}

impl Permit<'_> {
    /// How many permits this holds.
    pub fn permits(&self) -> u32 {
        self.n
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.limiter.release(self.n);
    }
}

impl fmt::Debug for Permit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit").field("permits", &self.n).finish()
    }
}

/// Permits held from a [`ConcurrencyLimiter`] in an `Arc`, free to move between
/// threads and tasks; dropping it gives them back.
#[must_use = "dropping the permit releases it at once"]
pub struct OwnedPermit {
    limiter: Arc<ConcurrencyLimiter>,
    n: u32,
}

impl OwnedPermit {
    /// How many permits this holds.
    pub fn permits(&self) -> u32 {
        self.n
    }
}

impl Drop for OwnedPermit {
    fn drop(&mut self) {
        self.limiter.release(self.n);
    }
}

impl fmt::Debug for OwnedPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedPermit")
            .field("permits", &self.n)
            .finish()
    }
}
