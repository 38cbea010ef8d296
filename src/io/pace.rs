//! Waiting for permits inside a `poll` method: the waits of `src/wait/`
//! (the same exact retry-after, the same simulated sleeps on a
//! [`ManualClock`](crate::ManualClock)) as a state machine that a stream,
//! sink, reader or writer keeps between polls.

use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;
use std::future::Future;

use crate::clock::Clock;
use crate::decision::KeyedDecision;
use crate::error::AcquireError;
use crate::wait::{Step, WaitError, WaitOptions, Waitable, skip, step};

/// How far ahead a sleep that would overflow tokio's `Instant` is set
/// instead: thirty years, which no retry-after of a validated quota reaches.
const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 86_400);

/// How late past its timer's end a wait may be polled and still be the
/// wait that slept: tokio's timer rounds a sleep up to its next millisecond,
/// and the woken task waits for a worker. A wait polled later than this was
/// abandoned (see [`Pacer::poll_wait`]).
const TIMER_SLACK: Duration = Duration::from_millis(5);

/// A wait kept between polls: at most one armed timer, re-armed (never
/// reallocated) for each sleep.
///
/// A poll that finds the permits takes them and returns `Ready`; one that
/// does not sleeps for the limiter's exact retry-after, so the task is woken
/// when the permits are due (tokio's timer rounds the sleep up to its next
/// millisecond), and sleeps again if another adapter of the same limiter
/// took them first. Nothing is taken before the permits are admitted:
/// dropping the adapter, or the future polling it, while it sleeps spends
/// nothing.
#[derive(Debug, Default)]
pub(crate) struct Pacer {
    /// The timer, allocated on the first sleep and reset for each after.
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether `sleep` is armed for the current wait.
    sleeping: bool,
    /// The clock reading at the start of the current wait, for
    /// [`WaitOptions`]' deadline.
    start: Option<u64>,
}

impl Pacer {
    /// No wait under way, no timer yet.
    pub(crate) const fn new() -> Pacer {
        Pacer {
            sleep: None,
            sleeping: false,
            start: None,
        }
    }

    /// Take `n` permits (`1 <= n <= capacity`), or register the task to be
    /// woken when they are due.
    ///
    /// The fast path (permits there, no wait under way) is one clock reading
    /// and one decision. Errors are those of [`step`]: a deadline in
    /// `options`, a capacity lowered below `n` by a live quota, or a
    /// simulated clock that cannot move any more.
    #[inline]
    pub(crate) fn poll_take<W: Waitable + ?Sized>(
        &mut self,
        cx: &mut Context<'_>,
        w: &W,
        n: u32,
        options: &WaitOptions,
    ) -> Poll<Result<(), WaitError>> {
        if !self.sleeping && self.start.is_none() {
            let now = w.wait_clock().now();
            if let KeyedDecision::Allowed { .. } = w.try_once(now, n) {
                w.count(true);
                return Poll::Ready(Ok(()));
            }
            self.start = Some(now);
        }
        self.poll_wait(cx, w, n, options)
    }

    /// Take `n` permits if they are there now, without waiting, and without
    /// registering the task for a wake-up when they are not (`false`).
    #[inline]
    pub(crate) fn try_take_now<W: Waitable + ?Sized>(&self, w: &W, n: u32) -> bool {
        if self.sleeping || self.start.is_some() || n > w.capacity() {
            return false;
        }
        let now = w.wait_clock().now();
        let admitted = matches!(w.try_once(now, n), KeyedDecision::Allowed { .. });
        if admitted {
            w.count(true);
        }
        admitted
    }

    /// The slow path: sleep until the permits are due, then try again.
    #[cold]
    fn poll_wait<W: Waitable + ?Sized>(
        &mut self,
        cx: &mut Context<'_>,
        w: &W,
        n: u32,
        options: &WaitOptions,
    ) -> Poll<Result<(), WaitError>> {
        loop {
            if self.sleeping {
                if let Some(sleep) = self.sleep.as_mut() {
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    // Time past the timer's end before this poll, beyond what
                    // a wake-up takes, was nobody's wait: a wait abandoned
                    // (its future dropped by a timeout or a `select!`) and
                    // taken up by a later call counts toward the deadline
                    // only what it waited. A wake-up's own lateness (the
                    // timer's rounding, a busy worker) is waiting, and
                    // counts: discounted, it let a wait of many sleeps run
                    // past its deadline by up to a millisecond a sleep.
                    let late =
                        tokio::time::Instant::now().saturating_duration_since(sleep.deadline());
                    if late > TIMER_SLACK
                        && let Some(start) = self.start.as_mut()
                    {
                        *start = start
                            .saturating_add(u64::try_from(late.as_nanos()).unwrap_or(u64::MAX));
                    }
                }
                self.sleeping = false;
            }
            let start = *self.start.get_or_insert_with(|| w.wait_clock().now());
            let (d, key_limit) = match step(w, n, start, options) {
                Ok(Step::Done(_)) => {
                    self.start = None;
                    return Poll::Ready(Ok(()));
                }
                Ok(Step::Sleep(d, key_limit)) => (d, key_limit),
                Err(e) => {
                    self.start = None;
                    return Poll::Ready(Err(e));
                }
            };
            match skip(w, d, key_limit, start, options) {
                // A simulated clock moved forward: let other tasks run, and
                // come back at once (one wake-up per wait, as on a timer).
                Ok(true) => {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Ok(false) => self.arm(d),
                Err(e) => {
                    self.start = None;
                    return Poll::Ready(Err(e));
                }
            }
        }
    }

    /// Arm the timer to fire `d` from now.
    fn arm(&mut self, d: Duration) {
        let now = tokio::time::Instant::now();
        let deadline = now.checked_add(d).unwrap_or(now + FAR_FUTURE);
        match self.sleep.as_mut() {
            Some(sleep) => sleep.as_mut().reset(deadline),
            None => self.sleep = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
        self.sleeping = true;
    }

    /// Pay `owed` permits in decisions of at most the limiter's capacity,
    /// each one as [`poll_take`](Self::poll_take) takes it, counting down
    /// `owed` as they are admitted.
    ///
    /// A capacity lowered by a live quota while a decision waited is met by
    /// asking again for what the new capacity allows. A simulated clock that
    /// cannot move forward any more never admits again: the payment stays
    /// pending, without a wake-up (a wait on it would never end).
    pub(crate) fn poll_pay<W: Waitable + ?Sized>(
        &mut self,
        cx: &mut Context<'_>,
        w: &W,
        owed: &mut u64,
        options: &WaitOptions,
    ) -> Poll<Result<(), WaitError>> {
        while *owed > 0 {
            let capacity = w.capacity();
            if capacity == 0 {
                // An algorithm of the application's own that holds nothing:
                // no payment can ever be made.
                return Poll::Ready(Err(WaitError::Acquire(
                    AcquireError::InsufficientCapacity {
                        requested: 1,
                        capacity,
                    },
                )));
            }
            let n = u32::try_from(*owed).unwrap_or(u32::MAX).min(capacity);
            match self.poll_take(cx, w, n, options) {
                Poll::Ready(Ok(())) => *owed -= u64::from(n),
                // Lowered by a live quota since it was read: ask again for
                // what the new capacity allows.
                Poll::Ready(Err(WaitError::Acquire(AcquireError::InsufficientCapacity {
                    capacity: now,
                    ..
                }))) if now < n => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}
