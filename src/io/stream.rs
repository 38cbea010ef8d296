//! A stream whose items pass at a rate, and a sink whose items are sent at
//! one.

use core::fmt;
use core::pin::Pin;
use core::task::{Context, Poll};

use futures_core::Stream;
use futures_sink::Sink;

use super::pace::Pacer;
use super::{Cost, Throttle};
use crate::wait::WaitOptions;

/// The cost of the unweighted adapters: one permit per item.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PerItem;

impl<T> Cost<T> for PerItem {
    #[inline(always)]
    fn cost(&mut self, _item: &T) -> u64 {
        1
    }
}

/// The waits every item makes: no deadline, no jitter. (A deadline would
/// have nowhere to report its error in a stream of plain items.)
const NO_OPTIONS: WaitOptions = WaitOptions::new();

pin_project_lite::pin_project! {
    /// A [`Stream`] that yields each item of the inner stream once the
    /// limiter has admitted it: one permit per item, or the item's
    /// [cost](Cost). From [`StreamExt::throttle`] and
    /// [`StreamExt::throttle_weighted`].
    ///
    /// The inner stream is polled for the next item only when the one before
    /// has been yielded, so at most one item is held back (and
    /// [`into_inner`](Self::into_inner) returns it). While the permits are
    /// there, an item costs one decision on the limiter; while they are not,
    /// the task sleeps until they are due (see the [module](crate::io)).
    #[must_use = "streams do nothing unless polled"]
    pub struct Throttled<S: Stream, L, F = PerItem> {
        #[pin]
        inner: S,
        limiter: L,
        cost: F,
        pacer: Pacer,
        // The item held back, and the permits it still owes.
        item: Option<S::Item>,
        owed: u64,
    }
}

impl<S: Stream, L, F> Throttled<S, L, F> {
    /// The inner stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner stream, to poll it directly (items so taken pass no
    /// limiter).
    pub fn get_pin_mut(self: Pin<&mut Self>) -> Pin<&mut S> {
        self.project().inner
    }

    /// The limiter.
    pub fn limiter(&self) -> &L {
        &self.limiter
    }

    /// The inner stream and the item held back, if one was waiting for its
    /// permits (part of its cost may be paid already: a cost above the
    /// capacity is paid in instalments).
    pub fn into_inner(self) -> (S, Option<S::Item>) {
        (self.inner, self.item)
    }
}

impl<S, L, F> Stream for Throttled<S, L, F>
where
    S: Stream,
    L: Throttle,
    F: Cost<S::Item>,
{
    type Item = S::Item;

    #[inline]
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let this = self.project();
        if this.item.is_none() {
            match this.inner.poll_next(cx) {
                Poll::Ready(Some(item)) => {
                    *this.owed = this.cost.cost(&item);
                    *this.item = Some(item);
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
        match this
            .pacer
            .poll_pay(cx, this.limiter, this.owed, &NO_OPTIONS)
        {
            Poll::Ready(Ok(())) => Poll::Ready(this.item.take()),
            // Without a deadline a wait fails only where nothing can ever be
            // admitted (a limiter of capacity 0, a simulated clock that
            // cannot move any more): the stream has no error to give, and
            // stays pending (the module's docs say so).
            Poll::Ready(Err(_)) | Poll::Pending => Poll::Pending,
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let held = usize::from(self.item.is_some());
        let (low, high) = self.inner.size_hint();
        (
            low.saturating_add(held),
            high.and_then(|h| h.checked_add(held)),
        )
    }
}

impl<S, L, F> fmt::Debug for Throttled<S, L, F>
where
    S: Stream + fmt::Debug,
    L: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Throttled")
            .field("inner", &self.inner)
            .field("limiter", &self.limiter)
            .field("holding", &self.item.is_some())
            .field("owed", &self.owed)
            .finish_non_exhaustive()
    }
}

/// Rate-limited streams: [`throttle`](Self::throttle) and
/// [`throttle_weighted`](Self::throttle_weighted) on any [`Stream`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use turnstile::io::StreamExt;
/// use turnstile::{ManualClock, Quota, RateLimiter};
/// # struct Iter<I>(I);
/// # impl<I: Iterator + Unpin> futures_core::Stream for Iter<I> {
/// #     type Item = I::Item;
/// #     fn poll_next(mut self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>)
/// #         -> std::task::Poll<Option<I::Item>> { std::task::Poll::Ready(self.0.next()) }
/// # }
/// # let stream_of = |v: Vec<&'static str>| Iter(v.into_iter());
///
/// // 2 messages a second, bursts of 2, on a simulated clock.
/// let clock = ManualClock::new();
/// let limiter = RateLimiter::with_clock(Quota::new(2, 1, Duration::from_millis(500))?, clock.clone());
/// let mut messages = stream_of(vec!["a", "b", "c", "d"]).throttle(&limiter);
/// let mut seen = Vec::new();
/// while let Some(m) = std::future::poll_fn(|cx| std::pin::Pin::new(&mut messages).poll_next(cx)).await {
///     seen.push((m, clock.elapsed()));
/// }
/// assert_eq!(seen, [
///     ("a", Duration::ZERO),
///     ("b", Duration::ZERO),
///     ("c", Duration::from_millis(500)),
///     ("d", Duration::from_millis(1000)),
/// ]);
/// # use futures_core::Stream as _;
/// # Ok(())
/// # }
/// ```
pub trait StreamExt: Stream + Sized {
    /// Yield each item once `limiter` admits one permit for it.
    fn throttle<L: Throttle>(self, limiter: L) -> Throttled<Self, L> {
        self.throttle_weighted(limiter, PerItem)
    }

    /// Yield each item once `limiter` admits its [cost](Cost) (any
    /// `FnMut(&Item) -> u64`): a message priced by its bytes, a request by
    /// its weight.
    fn throttle_weighted<L: Throttle, F: Cost<Self::Item>>(
        self,
        limiter: L,
        cost: F,
    ) -> Throttled<Self, L, F> {
        Throttled {
            inner: self,
            limiter,
            cost,
            pacer: Pacer::new(),
            item: None,
            owed: 0,
        }
    }
}

impl<S: Stream> StreamExt for S {}

pin_project_lite::pin_project! {
    /// A [`Sink`] that sends each item to the inner sink once the limiter
    /// has admitted it: one permit per item, or the item's [cost](Cost).
    /// From [`SinkExt::throttle_sink`] and [`SinkExt::throttle_sink_weighted`].
    ///
    /// [`start_send`](Sink::start_send) holds the item;
    /// [`poll_ready`](Sink::poll_ready), [`poll_flush`](Sink::poll_flush)
    /// and [`poll_close`](Sink::poll_close) wait for the inner sink to be
    /// ready, then for the item's permits, and send it. So at most one item
    /// is held back, and permits are taken only for an item the inner sink
    /// is ready for: dropping a send future while it waits, or the sink
    /// while its inner sink is not ready, spends nothing (an item whose cost
    /// is paid in instalments keeps those already paid).
    #[must_use = "sinks do nothing unless polled"]
    pub struct ThrottledSink<Si, L, T, F = PerItem> {
        #[pin]
        inner: Si,
        limiter: L,
        cost: F,
        pacer: Pacer,
        // The item held back, and the permits it still owes.
        item: Option<T>,
        owed: u64,
    }
}

impl<Si, L, T, F> ThrottledSink<Si, L, T, F> {
    /// The inner sink.
    pub fn get_ref(&self) -> &Si {
        &self.inner
    }

    /// The limiter.
    pub fn limiter(&self) -> &L {
        &self.limiter
    }

    /// The inner sink and the item held back, if one was not sent yet.
    pub fn into_inner(self) -> (Si, Option<T>) {
        (self.inner, self.item)
    }
}

impl<Si, L, T, F> ThrottledSink<Si, L, T, F>
where
    Si: Sink<T>,
    L: Throttle,
{
    /// Send the item held back, if any: the inner sink's readiness, then
    /// the item's permits (none taken for an item the inner sink cannot
    /// take yet).
    fn poll_send(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Si::Error>> {
        let mut this = self.project();
        if this.item.is_none() {
            return Poll::Ready(Ok(()));
        }
        match this.inner.as_mut().poll_ready(cx) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        match this
            .pacer
            .poll_pay(cx, this.limiter, this.owed, &NO_OPTIONS)
        {
            Poll::Ready(Ok(())) => {}
            // As in `Throttled::poll_next`.
            Poll::Ready(Err(_)) | Poll::Pending => return Poll::Pending,
        }
        match this.item.take() {
            Some(item) => Poll::Ready(this.inner.start_send(item)),
            None => Poll::Ready(Ok(())),
        }
    }
}

impl<Si, L, T, F> Sink<T> for ThrottledSink<Si, L, T, F>
where
    Si: Sink<T>,
    L: Throttle,
    F: Cost<T>,
{
    type Error = Si::Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Si::Error>> {
        self.poll_send(cx)
    }

    fn start_send(self: Pin<&mut Self>, item: T) -> Result<(), Si::Error> {
        let this = self.project();
        *this.owed = this.cost.cost(&item);
        *this.item = Some(item);
        Ok(())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Si::Error>> {
        match self.as_mut().poll_send(cx) {
            Poll::Ready(Ok(())) => self.project().inner.poll_flush(cx),
            other => other,
        }
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Si::Error>> {
        match self.as_mut().poll_send(cx) {
            Poll::Ready(Ok(())) => self.project().inner.poll_close(cx),
            other => other,
        }
    }
}

impl<Si: fmt::Debug, L: fmt::Debug, T, F> fmt::Debug for ThrottledSink<Si, L, T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottledSink")
            .field("inner", &self.inner)
            .field("limiter", &self.limiter)
            .field("holding", &self.item.is_some())
            .field("owed", &self.owed)
            .finish_non_exhaustive()
    }
}

/// Rate-limited sinks: [`throttle_sink`](Self::throttle_sink) and
/// [`throttle_sink_weighted`](Self::throttle_sink_weighted) on any [`Sink`].
pub trait SinkExt<T>: Sink<T> + Sized {
    /// Send each item once `limiter` admits one permit for it.
    fn throttle_sink<L: Throttle>(self, limiter: L) -> ThrottledSink<Self, L, T> {
        self.throttle_sink_weighted(limiter, PerItem)
    }

    /// Send each item once `limiter` admits its [cost](Cost).
    fn throttle_sink_weighted<L: Throttle, F: Cost<T>>(
        self,
        limiter: L,
        cost: F,
    ) -> ThrottledSink<Self, L, T, F> {
        ThrottledSink {
            inner: self,
            limiter,
            cost,
            pacer: Pacer::new(),
            item: None,
            owed: 0,
        }
    }
}

impl<T, Si: Sink<T>> SinkExt<T> for Si {}
