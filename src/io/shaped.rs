//! Readers and writers at a rate of bytes: tokio's `AsyncRead` and
//! `AsyncWrite`, one permit per byte.

use core::pin::Pin;
use core::task::{Context, Poll};
use std::io;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::Throttle;
use super::pace::Pacer;
use crate::wait::{WaitError, WaitOptions};

/// The most bytes one read or write asks its limiter for, unless
/// [`chunk`](ShapedWrite::chunk) says otherwise: 64 KiB (never more than a
/// quarter of the limiter's capacity, so that a wake-up that comes late
/// finds the bucket not yet full and loses nothing).
pub const DEFAULT_CHUNK: u32 = 64 * 1024;

/// The most bytes one decision asks for: the chunk, and at most a quarter of
/// the capacity (at least 1). A wait for a whole bucketful would be admitted
/// only once the bucket is full, and every microsecond the wake-up is late
/// (tokio's timer rounds up to its millisecond, the scheduler adds more)
/// would refill a full bucket for nothing: the rate would fall short by the
/// lateness. Waiting for a quarter leaves three quarters of the bucket to
/// absorb it.
fn grant_limit(chunk: u32, capacity: u32) -> u32 {
    chunk.min(capacity / 4).max(1)
}

/// Permits taken for bytes, and the wait for more: what a reader and a
/// writer share.
#[derive(Debug)]
struct Budget {
    pacer: Pacer,
    /// Bytes paid for and not moved yet.
    credit: u64,
    /// A writer: bytes asked for by the decision under way (0: none), and
    /// how many of them are still to be paid (a capacity lowered by a live
    /// quota while it waits splits the payment). A reader: `owed` is what
    /// its last read could not pay at once.
    asked: u64,
    owed: u64,
    /// A reader: it waited for its last read's payment, and has not read
    /// since (its next read needs no wait for a permit first).
    paid: bool,
    /// The most bytes one decision asks for.
    chunk: u32,
    options: WaitOptions,
}

impl Budget {
    const fn new() -> Budget {
        Budget {
            pacer: Pacer::new(),
            credit: 0,
            asked: 0,
            owed: 0,
            paid: false,
            chunk: DEFAULT_CHUNK,
            options: WaitOptions::new(),
        }
    }

    /// Bytes that may move now, at most `want` (`>= 1`): the credit, or
    /// else a new decision for `min(want, chunk, capacity)` bytes, waited
    /// for as the [module](crate::io) says.
    #[inline]
    fn poll_grant<L: Throttle>(
        &mut self,
        cx: &mut Context<'_>,
        limiter: &L,
        want: usize,
    ) -> Poll<io::Result<usize>> {
        if self.credit == 0 {
            if self.asked == 0 {
                let want = u32::try_from(want).unwrap_or(u32::MAX);
                self.asked = u64::from(want.min(grant_limit(self.chunk, limiter.capacity())));
                self.owed = self.asked;
            }
            match self
                .pacer
                .poll_pay(cx, limiter, &mut self.owed, &self.options)
            {
                Poll::Ready(Ok(())) => {
                    self.credit = self.asked;
                    self.asked = 0;
                }
                Poll::Ready(Err(e)) => {
                    // What was paid before the error stays credit.
                    self.credit = self.asked - self.owed;
                    self.asked = 0;
                    self.owed = 0;
                    return Poll::Ready(Err(wait_error(e)));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        // The credit is at most one chunk, a u32.
        Poll::Ready(Ok(usize::try_from(self.credit)
            .unwrap_or(usize::MAX)
            .min(want)))
    }

    /// `moved` bytes of the grant moved.
    #[inline]
    fn spend(&mut self, moved: usize) {
        let moved = u64::try_from(moved).unwrap_or(u64::MAX);
        self.credit = self.credit.saturating_sub(moved);
    }
}

/// A wait's error as an I/O error: only a deadline given with
/// `with_options`, or a simulated clock that cannot move forward any more.
fn wait_error(e: WaitError) -> io::Error {
    let kind = match e {
        WaitError::DeadlineExceeded { .. } | WaitError::KeyLimit { .. } => io::ErrorKind::TimedOut,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e)
}

pin_project_lite::pin_project! {
    /// An [`AsyncWrite`] that writes at most as many bytes as its limiter
    /// admits: one permit per byte. Reads (when the inner type is also an
    /// [`AsyncRead`], a socket) pass through unshaped; wrap in a
    /// [`ShapedRead`] as well to shape both directions.
    ///
    /// Each write offers the inner writer at most the bytes already paid for,
    /// and pays for at most a [`chunk`](Self::chunk) at a time (all or
    /// nothing, so it waits until that many are there, woken once, when they
    /// are due). Bytes paid for and not written (a short write) are credit
    /// for the next write. Flush and shutdown pass through.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tokio::io::AsyncWriteExt;
    /// use turnstile::io::ShapedWrite;
    /// use turnstile::{ManualClock, Quota, RateLimiter};
    ///
    /// // 1,000 bytes a second, bursts of 100, on a simulated clock.
    /// let clock = ManualClock::new();
    /// let limiter = RateLimiter::with_clock(Quota::new(100, 1, Duration::from_millis(1))?, clock.clone());
    /// let mut out = ShapedWrite::new(Vec::new(), limiter);
    /// out.write_all(&[7; 1_100]).await?; // 100 at once, then 1,000 at 1,000 a second
    /// assert_eq!(clock.elapsed(), Duration::from_secs(1));
    /// assert_eq!(out.get_ref().len(), 1_100);
    /// # Ok(())
    /// # }
    /// ```
    #[derive(Debug)]
    pub struct ShapedWrite<W, L> {
        #[pin]
        inner: W,
        limiter: L,
        budget: Budget,
    }
}

impl<W, L: Throttle> ShapedWrite<W, L> {
    /// `inner`, writing at the rate `limiter` allows.
    pub const fn new(inner: W, limiter: L) -> ShapedWrite<W, L> {
        ShapedWrite {
            inner,
            limiter,
            budget: Budget::new(),
        }
    }

    /// Ask the limiter for at most `bytes` per decision (at least 1; a
    /// quarter of the limiter's capacity caps it in any case, so that a late
    /// wake-up loses nothing to a full bucket). Smaller chunks let
    /// connections that share a limiter take turns more finely, at a
    /// decision per chunk; [`DEFAULT_CHUNK`] by default.
    #[must_use]
    pub fn chunk(mut self, bytes: u32) -> ShapedWrite<W, L> {
        self.budget.chunk = bytes.max(1);
        self
    }

    /// Give each wait a deadline or jitter: a write whose bytes would not be
    /// there within the deadline fails at once with
    /// [`io::ErrorKind::TimedOut`], taking nothing. The error carries the
    /// [`WaitError`]: `error.get_ref()` downcasts to it (as with any
    /// [`io::Error::new`], `source()` is the wrapped error's own source, not
    /// the `WaitError` itself).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tokio::io::AsyncWriteExt;
    /// use turnstile::io::ShapedWrite;
    /// use turnstile::{ManualClock, Quota, RateLimiter, WaitError, WaitOptions};
    ///
    /// let limiter = RateLimiter::with_clock(Quota::per_second(100)?, ManualClock::new());
    /// let mut out = ShapedWrite::new(Vec::new(), &limiter)
    ///     .with_options(WaitOptions::new().deadline(Duration::from_millis(1)));
    /// out.write_all(&[0; 100]).await?; // the burst
    /// let err = out.write(&[0; 10]).await.unwrap_err();
    /// assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    /// let wait = err.get_ref().and_then(|e| e.downcast_ref::<WaitError>());
    /// assert!(matches!(wait, Some(WaitError::DeadlineExceeded { .. })));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_options(mut self, options: WaitOptions) -> ShapedWrite<W, L> {
        self.budget.options = options;
        self
    }
}

impl<W, L> ShapedWrite<W, L> {
    /// The inner writer.
    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    /// The inner writer, mutably (bytes written through it pass no limiter).
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    /// The limiter.
    pub fn limiter(&self) -> &L {
        &self.limiter
    }

    /// Bytes paid for and not yet written.
    pub fn credit(&self) -> u64 {
        self.budget.credit
    }

    /// The inner writer.
    pub fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: AsyncWrite, L: Throttle> AsyncWrite for ShapedWrite<W, L> {
    #[inline]
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        if buf.is_empty() {
            return this.inner.poll_write(cx, buf);
        }
        let grant = match this.budget.poll_grant(cx, this.limiter, buf.len()) {
            Poll::Ready(Ok(grant)) => grant,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        };
        let written = this.inner.poll_write(cx, &buf[..grant]);
        if let Poll::Ready(Ok(n)) = written {
            this.budget.spend(n);
        }
        written
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

impl<W: AsyncRead, L> AsyncRead for ShapedWrite<W, L> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.project().inner.poll_read(cx, buf)
    }
}

pin_project_lite::pin_project! {
    /// An [`AsyncRead`] that reads at most as many bytes as its limiter
    /// admits: one permit per byte. Writes (when the inner type is also an
    /// [`AsyncWrite`]) pass through unshaped; wrap in a [`ShapedWrite`] as
    /// well to shape both directions.
    ///
    /// Each read lets the inner reader fill at most a [`chunk`](Self::chunk)
    /// of the caller's buffer, and pays for what it read: at once when the
    /// permits are there, else the next read first waits for them (woken
    /// once, when they are due) before it reads more. So a reader pays
    /// only for bytes that arrived (an idle connection holds no permits),
    /// and is at most one read ahead of its limiter: at most one chunk
    /// beyond what the limiter admitted has been delivered at any time.
    /// A read that owes nothing first waits, taking nothing, until the
    /// limiter has a permit (unless the reader has just waited for its own
    /// payment); dropped with its last read unpaid, a reader charges it (a
    /// token bucket lends it: see the [module](crate::io)'s "Every byte is
    /// paid for once", which also says what readers reading at once on one
    /// cap can take).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tokio::io::AsyncReadExt;
    /// use turnstile::io::ShapedRead;
    /// use turnstile::{ManualClock, Quota, RateLimiter};
    ///
    /// let clock = ManualClock::new();
    /// let limiter = RateLimiter::with_clock(Quota::new(100, 1, Duration::from_millis(1))?, clock.clone());
    /// let mut input = ShapedRead::new(&[1u8; 600][..], limiter);
    /// let mut all = Vec::new();
    /// input.read_to_end(&mut all).await?;
    /// assert_eq!(all.len(), 600);
    /// assert_eq!(clock.elapsed(), Duration::from_millis(500)); // 100 at once, 500 at 1,000 a second
    /// # Ok(())
    /// # }
    /// ```
    #[derive(Debug)]
    pub struct ShapedRead<R, L> {
        #[pin]
        inner: R,
        meter: Meter<L>,
    }
}

/// A reader's limiter and budget, kept together so that dropping the reader
/// (or taking its inner reader back) pays what its last read owes.
#[derive(Debug)]
struct Meter<L> {
    limiter: L,
    budget: Budget,
    /// The limiter's [`charge`](crate::wait::Waitable::charge), taken where
    /// `L: Throttle` is known (the reader's constructor), so that `Drop`
    /// needs no bound.
    charge: fn(&L, u32) -> bool,
}

impl<L> Drop for Meter<L> {
    /// Bytes delivered and not paid for yet are charged: lent by a token
    /// bucket (its next permits come that much later), taken by another
    /// algorithm if they are there. Without this, a connection that reads a
    /// message and closes would take one chunk free of a shared cap.
    fn drop(&mut self) {
        if self.budget.owed > 0 {
            // One read's bytes: at most a chunk, a u32.
            let owed = u32::try_from(self.budget.owed).unwrap_or(u32::MAX);
            self.budget.owed = 0;
            let _ = (self.charge)(&self.limiter, owed);
        }
    }
}

impl<R, L: Throttle> ShapedRead<R, L> {
    /// `inner`, read at the rate `limiter` allows.
    pub const fn new(inner: R, limiter: L) -> ShapedRead<R, L> {
        ShapedRead {
            inner,
            meter: Meter {
                limiter,
                budget: Budget::new(),
                charge: <L as crate::wait::Waitable>::charge,
            },
        }
    }

    /// As [`ShapedWrite::chunk`].
    #[must_use]
    pub fn chunk(mut self, bytes: u32) -> ShapedRead<R, L> {
        self.meter.budget.chunk = bytes.max(1);
        self
    }

    /// As [`ShapedWrite::with_options`].
    #[must_use]
    pub fn with_options(mut self, options: WaitOptions) -> ShapedRead<R, L> {
        self.meter.budget.options = options;
        self
    }
}

impl<R, L> ShapedRead<R, L> {
    /// The inner reader.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// The inner reader, mutably (bytes read through it pass no limiter).
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// The limiter.
    pub fn limiter(&self) -> &L {
        &self.meter.limiter
    }

    /// Bytes read and not paid for yet: the next read waits for them
    /// before it reads more, and dropping the reader charges them.
    pub fn owed(&self) -> u64 {
        self.meter.budget.owed
    }

    /// The inner reader. What the last read owes is charged first, as when
    /// the reader is dropped.
    pub fn into_inner(self) -> R {
        self.inner
    }
}

impl<R: AsyncRead, L: Throttle> AsyncRead for ShapedRead<R, L> {
    #[inline]
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        if buf.remaining() == 0 {
            return this.inner.poll_read(cx, buf);
        }
        let Meter {
            limiter, budget, ..
        } = this.meter;
        let limiter = &*limiter;
        // What the last read could not pay at once is paid first.
        if budget.owed > 0 {
            match budget
                .pacer
                .poll_pay(cx, limiter, &mut budget.owed, &budget.options)
            {
                Poll::Ready(Ok(())) => budget.paid = true,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(wait_error(e))),
                Poll::Pending => return Poll::Pending,
            }
        }
        // Otherwise no read while the limiter has nothing: wait, taking
        // nothing, for a permit to be there (a loan a dropped reader made, or
        // what others spent, is waited out first: readers that read and
        // close one after another would otherwise each take a read free of a
        // shared cap). A reader that has just waited for its own payment
        // reads on (until its next read delivers), one read ahead at most,
        // as before: its inner reader pending in between costs no second
        // wait.
        if !budget.paid {
            match budget
                .pacer
                .poll_take(cx, &crate::wait::Peeking(limiter), 1, &budget.options)
            {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(wait_error(e))),
                Poll::Pending => return Poll::Pending,
            }
        }
        let most = u32::try_from(buf.remaining()).unwrap_or(u32::MAX);
        let grant = most.min(grant_limit(budget.chunk, limiter.capacity()));
        // The inner reader fills at most the grant: a buffer over that part
        // of the caller's (initialized once, as tokio's own adapters do
        // without `unsafe`; a reused buffer is initialized already).
        let grant = usize::try_from(grant).unwrap_or(usize::MAX);
        let mut part = ReadBuf::new(buf.initialize_unfilled_to(grant));
        let read = this.inner.poll_read(cx, &mut part);
        let n = part.filled().len();
        if let Poll::Ready(Ok(())) = read {
            buf.advance(n);
            // At most the grant, a u32.
            let n = u32::try_from(n).unwrap_or(u32::MAX);
            if n > 0 {
                budget.paid = false;
                if !budget.pacer.try_take_now(limiter, n) {
                    budget.owed = u64::from(n);
                }
            }
        }
        read
    }
}

impl<R: AsyncWrite, L> AsyncWrite for ShapedRead<R, L> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}
