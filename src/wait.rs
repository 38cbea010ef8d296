//! Waiting for permits on the client side: sleep until admitted, with an
//! optional deadline and jitter.

use core::fmt;
use core::time::Duration;

use crate::algorithm::Algorithm;
use crate::clock::{Clock, saturating_nanos};
use crate::decision::{Decision, RetryAfter};
use crate::error::AcquireError;
use crate::limiter::{Counter, RateLimiter, check_permits};

/// How long a wait may take, and how much random delay to add to each sleep.
///
/// ```
/// use std::time::Duration;
/// use turnstile::WaitOptions;
///
/// let options = WaitOptions::new()
///     .deadline(Duration::from_secs(2))
///     .jitter(Duration::from_millis(50));
/// # let _ = options;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitOptions {
    deadline: Option<Duration>,
    jitter: Duration,
}

impl WaitOptions {
    /// No deadline, no jitter.
    pub const fn new() -> WaitOptions {
        WaitOptions {
            deadline: None,
            jitter: Duration::ZERO,
        }
    }

    /// Give up, at once and without sleeping, when the permits cannot be had
    /// within `deadline` of the start of the wait.
    pub const fn deadline(self, deadline: Duration) -> WaitOptions {
        WaitOptions {
            deadline: Some(deadline),
            ..self
        }
    }

    /// Add a uniformly random delay of up to `max` to each sleep, so that
    /// clients denied together do not all come back at the same instant (a
    /// thundering herd). Jitter only lengthens a sleep, never shortens it (a
    /// client never wakes before its permits are due), and never past the
    /// deadline.
    pub const fn jitter(self, max: Duration) -> WaitOptions {
        WaitOptions {
            jitter: max,
            ..self
        }
    }
}

/// Why a wait gave up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitError {
    /// The permits would not be available within the deadline. Nothing was
    /// taken, and the wait did not sleep first: it gave up as soon as the limiter
    /// said how long it would take.
    DeadlineExceeded {
        /// How long the permits were still to be waited for, from the last try.
        needed: RetryAfter,
        /// The time already spent waiting.
        waited: Duration,
        /// The deadline.
        deadline: Duration,
    },
    /// The request can never be admitted (`n = 0`, or more than the capacity).
    Acquire(AcquireError),
}

impl fmt::Display for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitError::DeadlineExceeded {
                needed,
                waited,
                deadline,
            } => write!(
                f,
                "the permits need another {:?} after {waited:?} of waiting, past the \
                 deadline of {deadline:?}",
                needed.duration()
            ),
            WaitError::Acquire(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for WaitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WaitError::Acquire(e) => Some(e),
            WaitError::DeadlineExceeded { .. } => None,
        }
    }
}

impl From<AcquireError> for WaitError {
    fn from(e: AcquireError) -> WaitError {
        WaitError::Acquire(e)
    }
}

/// What to do after one try: done, or sleep this long and try again.
enum Step {
    Done(Duration),
    Sleep(Duration),
}

impl<A: Algorithm, C: Clock, M: Counter> RateLimiter<A, C, M> {
    /// Block until one permit is taken; returns how long that took by the
    /// limiter's clock. See [`wait_n`](Self::wait_n).
    ///
    /// # Errors
    ///
    /// [`WaitError::DeadlineExceeded`] as for `wait_n`.
    pub fn wait(&self, options: WaitOptions) -> Result<Duration, WaitError> {
        self.wait_n(1, options)
    }

    /// Block until `n` permits are taken, sleeping for each denial's exact
    /// retry-after (plus jitter). For a client that must stay under someone
    /// else's limit: instead of sending, being refused and retrying, it waits
    /// its turn. On a [`ManualClock`](crate::ManualClock) the sleeps advance the
    /// clock instead, so tests take no time.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ManualClock, Quota, RateLimiter, WaitError, WaitOptions};
    ///
    /// let clock = ManualClock::new();
    /// let limiter = RateLimiter::with_clock(Quota::new(1, 1, Duration::from_secs(1))?, clock.clone());
    /// limiter.wait(WaitOptions::new())?; // at once
    /// let waited = limiter.wait(WaitOptions::new())?; // one second later
    /// assert_eq!(waited, Duration::from_secs(1));
    ///
    /// // A deadline shorter than the wait fails at once, without sleeping.
    /// let err = limiter.wait(WaitOptions::new().deadline(Duration::from_millis(500)));
    /// assert!(matches!(err, Err(WaitError::DeadlineExceeded { .. })));
    /// assert_eq!(clock.elapsed(), Duration::from_secs(1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`WaitError::DeadlineExceeded`] when a denial's wait would end past the
    /// deadline (returned before sleeping), and [`WaitError::Acquire`] for
    /// `n = 0` or `n` above the capacity.
    pub fn wait_n(&self, n: u32, options: WaitOptions) -> Result<Duration, WaitError> {
        check_permits(n, self.capacity())?;
        let start = self.clock().now();
        loop {
            match self.wait_step(n, start, &options)? {
                Step::Done(waited) => return Ok(waited),
                Step::Sleep(d) => {
                    if !self.clock().skip(d) {
                        std::thread::sleep(d);
                    }
                }
            }
        }
    }

    /// The asynchronous [`wait`](Self::wait), sleeping on tokio's timer.
    ///
    /// # Errors
    ///
    /// As [`wait_n`](Self::wait_n).
    #[cfg(feature = "tokio")]
    pub async fn wait_async(&self, options: WaitOptions) -> Result<Duration, WaitError> {
        self.wait_n_async(1, options).await
    }

    /// The asynchronous [`wait_n`](Self::wait_n): the task sleeps on tokio's
    /// timer (a [`ManualClock`](crate::ManualClock) advances instead). Dropping
    /// the future cancels the wait; nothing is taken until the permits are.
    ///
    /// # Errors
    ///
    /// As [`wait_n`](Self::wait_n).
    #[cfg(feature = "tokio")]
    pub async fn wait_n_async(&self, n: u32, options: WaitOptions) -> Result<Duration, WaitError> {
        check_permits(n, self.capacity())?;
        let start = self.clock().now();
        loop {
            match self.wait_step(n, start, &options)? {
                Step::Done(waited) => return Ok(waited),
                Step::Sleep(d) => {
                    if !self.clock().skip(d) {
                        tokio::time::sleep(d).await;
                    } else {
                        // Let other tasks run between simulated sleeps.
                        tokio::task::yield_now().await;
                    }
                }
            }
        }
    }

    /// One try: taken, or how long to sleep before the next; or the deadline.
    fn wait_step(&self, n: u32, start: u64, options: &WaitOptions) -> Result<Step, WaitError> {
        let now = self.clock().now();
        let decision = self.cell().apply(self.algorithm(), now, n);
        let waited = Duration::from_nanos(now.saturating_sub(start));
        let needed = match decision {
            Decision::Allowed { .. } => {
                self.count(true);
                return Ok(Step::Done(waited));
            }
            Decision::Denied { retry_after } => retry_after,
        };
        let mut sleep = needed.duration();
        let mut jitter = options.jitter;
        if let Some(deadline) = options.deadline {
            let left = deadline.saturating_sub(waited);
            if sleep > left {
                self.count(false);
                return Err(WaitError::DeadlineExceeded {
                    needed,
                    waited,
                    deadline,
                });
            }
            jitter = jitter.min(left - sleep);
        }
        if !jitter.is_zero() {
            sleep += Duration::from_nanos(random_below(saturating_nanos(jitter) + 1));
        }
        Ok(Step::Sleep(sleep))
    }
}

/// A uniformly random number below `bound` (`bound >= 1`), from a per-thread
/// xorshift generator seeded by std's random hasher keys: jitter needs spread,
/// not cryptographic strength.
fn random_below(bound: u64) -> u64 {
    use std::cell::Cell;
    use std::hash::{BuildHasher, Hasher};
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(0x9E37_79B9_7F4A_7C15);
            h.finish() | 1
        });
    }
    let x = STATE.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x
    });
    // Multiply-shift: uniform enough for jitter, with no division.
    ((u128::from(x) * u128::from(bound)) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_below_stays_below_and_spreads() {
        for bound in [1, 2, 3, 10, 1_000_000, u64::MAX] {
            for _ in 0..1_000 {
                assert!(random_below(bound) < bound);
            }
        }
        let mut seen = [false; 10];
        for _ in 0..1_000 {
            seen[random_below(10) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s), "{seen:?}");
    }
}
