//! Feature `io`: streams, sinks, readers and writers at a rate. Each wait
//! wakes its task once, when the permits are due (counted by a waker that
//! counts), a dropped wait spends nothing, large items and buffers are split
//! into decisions of at most the capacity, and many adapters on one limiter
//! share its rate.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use futures_core::Stream;
use futures_sink::Sink;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use turnstile::io::{KeyThrottle, ShapedRead, ShapedWrite, SinkExt, StreamExt};
use turnstile::{Clock, KeyedLimiter, ManualClock, Quota, RateLimiter};

/// A waker that counts its wake-ups and passes them on.
struct Counting {
    wakes: AtomicUsize,
    inner: Waker,
}

impl Counting {
    fn new(inner: Waker) -> Arc<Counting> {
        Arc::new(Counting {
            wakes: AtomicUsize::new(0),
            inner,
        })
    }

    fn wakes(&self) -> usize {
        // Relaxed: a count read by the thread that polls, after the wake-ups
        // it counts were delivered to it through the inner waker.
        self.wakes.load(Ordering::Relaxed)
    }
}

impl Wake for Counting {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Relaxed: a count, published to the poller as above.
        self.wakes.fetch_add(1, Ordering::Relaxed);
        self.inner.wake_by_ref();
    }
}

/// Poll `f` to completion with a counting waker: its output, the number of
/// polls and the number of wake-ups.
async fn counted<T>(f: impl Future<Output = T>) -> (T, usize, usize) {
    let mut f = std::pin::pin!(f);
    let mut polls = 0;
    let mut counter = None;
    let out = std::future::poll_fn(|cx| {
        let counter = counter.get_or_insert_with(|| Counting::new(cx.waker().clone()));
        let waker = Waker::from(Arc::clone(counter));
        polls += 1;
        f.as_mut().poll(&mut Context::from_waker(&waker))
    })
    .await;
    let wakes = counter.map_or(0, |c| c.wakes());
    (out, polls, wakes)
}

/// A clock on tokio's time, which tests pause and advance: the limiter and
/// the timer the adapters sleep on then agree.
#[derive(Clone, Debug)]
struct TokioClock(tokio::time::Instant);

impl TokioClock {
    fn new() -> TokioClock {
        TokioClock(tokio::time::Instant::now())
    }
}

impl Clock for TokioClock {
    fn now(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A stream of the items of an iterator.
struct Iter<I>(I);

impl<I: Iterator + Unpin> Stream for Iter<I> {
    type Item = I::Item;
    fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<I::Item>> {
        Poll::Ready(self.0.next())
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

/// A sink that keeps what it is sent.
#[derive(Default)]
struct Collect<T>(Vec<T>);

impl<T: Unpin> Sink<T> for Collect<T> {
    type Error = std::convert::Infallible;
    fn poll_ready(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }
    fn start_send(mut self: Pin<&mut Self>, item: T) -> Result<(), Self::Error> {
        self.0.push(item);
        Ok(())
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }
    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }
}

/// A writer that takes at most `max` bytes per write, and counts them.
struct Short {
    max: usize,
    written: usize,
}

impl AsyncWrite for Short {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let n = buf.len().min(self.max);
        self.written += n;
        Poll::Ready(Ok(n))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A reader of `left` bytes, at most `max` per read.
struct Trickle {
    max: usize,
    left: usize,
}

impl AsyncRead for Trickle {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = buf.remaining().min(self.max).min(self.left);
        buf.put_slice(&vec![1; n]);
        self.left -= n;
        Poll::Ready(Ok(()))
    }
}

fn next<S: Stream + Unpin>(s: &mut S) -> impl Future<Output = Option<S::Item>> + '_ {
    std::future::poll_fn(move |cx| Pin::new(&mut *s).poll_next(cx))
}

#[tokio::test(start_paused = true)]
async fn a_waiting_writer_wakes_once_per_wait_exactly_when_its_bytes_are_due() {
    let clock = TokioClock::new();
    // 1 MB/s: one byte a microsecond, bursts of 40,000.
    let quota = Quota::per_second_with_burst(1_000_000, 40_000).unwrap();
    let limiter = RateLimiter::with_clock(quota, clock.clone());
    let mut out = ShapedWrite::new(tokio::io::sink(), &limiter).chunk(10_000);
    let data = vec![0u8; 100_000];
    let (written, polls, wakes) = counted(out.write_all(&data)).await;
    written.unwrap();
    // The burst at once, then six chunks, each a wait of 10 ms.
    assert_eq!(wakes, 6, "one wake-up per wait");
    assert_eq!(polls, 7, "no poll without a wake-up");
    let elapsed = Duration::from_nanos(clock.now());
    assert!(
        elapsed >= Duration::from_millis(60) && elapsed <= Duration::from_millis(66),
        "{elapsed:?}"
    );
    assert_eq!(out.credit(), 0);
}

/// Writers sharing one limiter are not queued: each sleeps until the bucket
/// could serve it, and one that finds another took the bytes first sleeps
/// again. The documented bound: each of `n` waiting writers wakes at most
/// once per chunk admitted to any of them, and the rate holds.
#[tokio::test(start_paused = true)]
async fn writers_sharing_a_limiter_wake_at_most_once_each_per_chunk_admitted() {
    for n in [2usize, 8, 32] {
        let clock = TokioClock::new();
        let quota = Quota::per_second_with_burst(1_000_000, 40_000).unwrap();
        let shared = Arc::new(RateLimiter::with_clock(quota, clock.clone()));
        assert!(shared.try_acquire_n(40_000).unwrap().is_allowed());
        let writers: Vec<_> = (0..n)
            .map(|_| {
                let limiter = Arc::clone(&shared);
                tokio::spawn(async move {
                    let mut out = ShapedWrite::new(tokio::io::sink(), limiter).chunk(1_000);
                    let data = vec![0u8; 100_000 / n];
                    let (written, _, wakes) = counted(out.write_all(&data)).await;
                    written.unwrap();
                    wakes
                })
            })
            .collect();
        let mut wakes = 0;
        for writer in writers {
            wakes += writer.await.unwrap();
        }
        // 100,000 bytes in chunks of at most 1,000: at least 100 admitted,
        // a partial last chunk per writer at most.
        let chunks = 100 + n;
        assert!(wakes <= n * chunks, "{n} writers: {wakes} wake-ups");
        assert!(wakes >= 100, "{n} writers: {wakes} wake-ups");
        // An empty bucket at 1 MB/s: 100,000 bytes take 100 ms.
        let elapsed = Duration::from_nanos(clock.now());
        assert!(
            elapsed >= Duration::from_millis(100) && elapsed <= Duration::from_millis(102),
            "{n} writers: {elapsed:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiting_reader_wakes_once_per_wait_and_pays_for_what_it_read() {
    let clock = TokioClock::new();
    let quota = Quota::per_second_with_burst(1_000_000, 10_000).unwrap();
    let limiter = RateLimiter::with_clock(quota, clock.clone());
    // The inner reader gives at most 3,000 bytes a read.
    let inner = Trickle {
        max: 3_000,
        left: 50_000,
    };
    let mut input = ShapedRead::new(inner, &limiter).chunk(10_000);
    let mut all = Vec::new();
    let (read, polls, wakes) = counted(input.read_to_end(&mut all)).await;
    assert_eq!(read.unwrap(), 50_000);
    assert!(wakes > 0, "40,000 bytes beyond the burst were waited for");
    assert_eq!(polls, wakes + 1, "no poll without a wake-up");
    // 40,000 bytes beyond the burst at 1 MB/s; each wait rounded up to
    // tokio's millisecond.
    let elapsed = Duration::from_nanos(clock.now());
    let least = Duration::from_millis(40);
    assert!(elapsed >= least, "{elapsed:?}");
    assert!(
        elapsed <= least + Duration::from_millis(wakes as u64),
        "{elapsed:?}"
    );
    // Every byte read was paid for, once: the limiter spent exactly 50,000.
    assert_eq!(input.owed(), 0);
    let elapsed_us = clock.now() / 1_000;
    assert_eq!(
        u64::from(limiter.remaining()),
        (10_000 + elapsed_us - 50_000).min(10_000),
        "at {elapsed_us} µs"
    );
}

/// Many short-lived connections on one shared cap, each reading one message
/// and closing with it unpaid: the dropped reader charges it (the token
/// bucket, or GCRA, lends it), so the cap holds. Before, each connection took its
/// message free once the bucket was empty: 250,000 bytes at once against a
/// cap of 1,000 a second.
#[tokio::test(start_paused = true)]
async fn readers_that_read_and_close_pay_a_shared_cap() {
    // 1,000 bytes a second, bursts of 1,000.
    let quota = Quota::new(1_000, 1, Duration::from_millis(1)).unwrap();
    read_and_close(turnstile::TokenBucket::new(quota)).await;
    // GCRA lends too: its bound over the same span is the same.
    read_and_close(turnstile::Gcra::new(quota)).await;
}

async fn read_and_close<A: turnstile::Algorithm + Send + Sync + 'static>(algorithm: A) {
    let clock = TokioClock::new();
    let cap = Arc::new(RateLimiter::from_parts(algorithm, clock.clone()));
    let mut delivered = 0u64;
    for _ in 0..1_000 {
        let data = [7u8; 250];
        let mut conn = ShapedRead::new(&data[..], Arc::clone(&cap));
        let mut message = [0u8; 250];
        conn.read_exact(&mut message).await.unwrap();
        delivered += 250;
        // Dropped here, possibly with the message unpaid.
    }
    let elapsed = Duration::from_nanos(clock.now());
    // The cap's bound: the burst, the refill over the time it took, and
    // the one message of the last reader (its charge is a loan the clock
    // has not reached).
    let allowed = 1_000 + elapsed.as_millis() as u64 + 250;
    assert!(
        delivered <= allowed,
        "delivered {delivered} bytes in {elapsed:?}; the cap allows {allowed}"
    );
    assert!(delivered >= 250_000, "every message is read");
    // The same with `into_inner`, which charges as a drop does.
    let data = [7u8; 250];
    let mut conn = ShapedRead::new(&data[..], Arc::clone(&cap));
    let mut message = [0u8; 250];
    conn.read_exact(&mut message).await.unwrap();
    let before = conn.owed();
    let _inner = conn.into_inner();
    assert!(before == 0 || cap.remaining() == 0, "charged: {before}");
}

/// An inner reader that is pending once before each read, as a socket
/// whose bytes arrive a little after they are asked for.
struct Stutter {
    max: usize,
    left: usize,
    ready: bool,
}

impl AsyncRead for Stutter {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.ready && self.left > 0 {
            self.ready = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.ready = false;
        let n = buf.remaining().min(self.max).min(self.left);
        buf.put_slice(&vec![1; n]);
        self.left -= n;
        Poll::Ready(Ok(()))
    }
}

/// A reader that has just waited for its payment reads on without waiting
/// for a permit first, even when its inner reader is pending in between: at
/// most one wake-up for the inner reader and one for the payment per read
/// (a wait for a permit before each such read made it three, 140 wake-ups
/// for 50 reads).
#[tokio::test(start_paused = true)]
async fn a_reader_that_paid_reads_on_without_another_wait() {
    let clock = TokioClock::new();
    // 1,000 bytes a second, bursts of 10: reads of 2 bytes (a quarter).
    let limiter = RateLimiter::with_clock(
        Quota::per_second_with_burst(1_000, 10).unwrap(),
        clock.clone(),
    );
    let inner = Stutter {
        max: 100,
        left: 100,
        ready: false,
    };
    let mut input = ShapedRead::new(inner, &limiter);
    let mut all = Vec::new();
    let (read, _polls, wakes) = counted(input.read_to_end(&mut all)).await;
    assert_eq!(read.unwrap(), 100);
    let reads = 100 / 2;
    assert!(wakes <= 2 * reads, "{wakes} wake-ups for {reads} reads");
}

#[tokio::test(start_paused = true)]
async fn an_idle_reader_holds_no_permits() {
    let clock = TokioClock::new();
    let limiter = RateLimiter::with_clock(
        Quota::new(100, 1, Duration::from_millis(1)).unwrap(),
        clock.clone(),
    );
    let (mut near, far) = tokio::io::duplex(1_024);
    let mut input = ShapedRead::new(far, &limiter);
    let mut buf = [0u8; 64];
    // Nothing to read yet: the read waits on the inner reader, paying nothing.
    assert!(
        tokio::time::timeout(Duration::from_millis(5), input.read(&mut buf))
            .await
            .is_err()
    );
    assert_eq!(limiter.remaining(), 100);
    near.write_all(b"hello").await.unwrap();
    assert_eq!(input.read(&mut buf).await.unwrap(), 5);
    assert_eq!(limiter.remaining(), 95);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_write_spends_nothing_it_did_not_write() {
    let clock = TokioClock::new();
    // 1,000 bytes a second, bursts of 100.
    let limiter = RateLimiter::with_clock(
        Quota::new(400, 1, Duration::from_millis(1)).unwrap(),
        clock.clone(),
    );
    let mut out = ShapedWrite::new(
        Short {
            max: usize::MAX,
            written: 0,
        },
        &limiter,
    )
    .chunk(100);
    // The burst goes at once, in four chunks; the next chunk waits 100 ms,
    // and is dropped after 50.
    let cancelled = tokio::time::timeout(Duration::from_millis(50), out.write_all(&[0; 500])).await;
    assert!(cancelled.is_err());
    assert_eq!(out.get_ref().written, 400);
    // 50 ms refilled 50 bytes, and the dropped wait took none of them.
    assert_eq!(clock.now(), 50_000_000);
    assert_eq!(limiter.remaining(), 50);
    assert_eq!(out.credit(), 0);
}

#[tokio::test(start_paused = true)]
async fn short_writes_keep_their_credit_for_the_next() {
    let clock = TokioClock::new();
    let limiter = RateLimiter::with_clock(
        Quota::new(400, 1, Duration::from_millis(1)).unwrap(),
        clock.clone(),
    );
    let mut out = ShapedWrite::new(
        Short {
            max: 30,
            written: 0,
        },
        &limiter,
    )
    .chunk(100);
    // One decision of 100 for a write the inner writer takes 30 of.
    assert_eq!(out.write(&[0; 100]).await.unwrap(), 30);
    assert_eq!((out.credit(), limiter.remaining()), (70, 300));
    // The next 70 bytes are paid for already: no decision, no wait.
    out.write_all(&[0; 70]).await.unwrap();
    assert_eq!(
        (out.credit(), limiter.remaining(), clock.now()),
        (0, 300, 0)
    );
    assert_eq!(out.get_ref().written, 100);
}

#[tokio::test(start_paused = true)]
async fn writers_sharing_a_limiter_share_its_rate() {
    let clock = TokioClock::new();
    let quota = Quota::per_second_with_burst(1_000_000, 10_000).unwrap();
    let shared = Arc::new(RateLimiter::with_clock(quota, clock.clone()));
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let limiter = Arc::clone(&shared);
            tokio::spawn(async move {
                let mut out = ShapedWrite::new(tokio::io::sink(), limiter).chunk(1_000);
                out.write_all(&[0; 25_000]).await.unwrap();
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    // 100,000 bytes: 10,000 of burst, then 90,000 at 1 MB/s (90 ms), to the
    // millisecond of tokio's timer.
    let elapsed = Duration::from_nanos(clock.now());
    assert!(
        elapsed >= Duration::from_millis(90) && elapsed <= Duration::from_millis(91),
        "{elapsed:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn connections_of_one_key_share_its_cap_and_other_keys_are_apart() {
    let clock = TokioClock::new();
    let quota = Quota::per_second_with_burst(1_000_000, 10_000).unwrap();
    let per_host = Arc::new(
        KeyedLimiter::<String>::builder(quota)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let writer = |host: &str| {
        ShapedWrite::new(
            tokio::io::sink(),
            KeyThrottle::new(Arc::clone(&per_host), host.to_owned()),
        )
        .chunk(1_000)
    };
    let (mut a1, mut a2, mut b) = (writer("a"), writer("a"), writer("b"));
    // Host b's burst is its own: at once.
    b.write_all(&[0; 10_000]).await.unwrap();
    assert_eq!(clock.now(), 0);
    // Host a's two connections share one bucket: 30,000 bytes take 20 ms.
    let (r1, r2) = tokio::join!(a1.write_all(&[0; 15_000]), a2.write_all(&[0; 15_000]));
    r1.unwrap();
    r2.unwrap();
    let elapsed = Duration::from_nanos(clock.now());
    assert!(
        elapsed >= Duration::from_millis(20) && elapsed <= Duration::from_millis(21),
        "{elapsed:?}"
    );
    assert_eq!(per_host.remaining("b"), 10_000, "b refilled meanwhile");
}

#[test]
fn a_stream_yields_each_item_when_its_permits_are_due_waking_once_per_wait() {
    let clock = ManualClock::new();
    let limiter = RateLimiter::with_clock(
        Quota::new(2, 1, Duration::from_millis(100)).unwrap(),
        clock.clone(),
    );
    let mut stream = Iter(0..6).throttle(&limiter);
    let counter = Counting::new(Waker::noop().clone());
    let waker = Waker::from(Arc::clone(&counter));
    let mut cx = Context::from_waker(&waker);
    let mut seen = Vec::new();
    let mut pendings = 0;
    loop {
        match Pin::new(&mut stream).poll_next(&mut cx) {
            Poll::Ready(Some(i)) => seen.push((i, clock.elapsed())),
            Poll::Ready(None) => break,
            Poll::Pending => {
                pendings += 1;
                // A simulated sleep: the clock moved to the due time and the
                // task was woken, once.
                assert_eq!(counter.wakes(), pendings);
            }
        }
    }
    let ms = Duration::from_millis;
    assert_eq!(
        seen,
        [
            (0, ms(0)),
            (1, ms(0)),
            (2, ms(100)),
            (3, ms(200)),
            (4, ms(300)),
            (5, ms(400))
        ]
    );
    assert_eq!(pendings, 4);
}

#[tokio::test(start_paused = true)]
async fn a_weighted_stream_pays_costs_above_the_capacity_in_instalments() {
    let clock = TokioClock::new();
    // 1,000 a second, bursts of 100.
    let limiter = RateLimiter::with_clock(
        Quota::new(100, 1, Duration::from_millis(1)).unwrap(),
        clock.clone(),
    );
    let frames = Iter([50u64, 0, 350, 10].into_iter());
    let mut stream = frames.throttle_weighted(&limiter, |len: &u64| *len);
    let mut at = Vec::new();
    while let Some(len) = next(&mut stream).await {
        at.push((len, clock.now() / 1_000_000));
    }
    // 50 from the burst; 0 free; 350 = the 50 left, then 300 more at 1 a ms;
    // 10 more 10 ms after.
    assert_eq!(at, [(50, 0), (0, 0), (350, 300), (10, 310)]);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_next_spends_nothing_and_the_item_waits_for_the_next_poll() {
    let clock = TokioClock::new();
    let limiter = RateLimiter::with_clock(
        Quota::new(1, 1, Duration::from_millis(100)).unwrap(),
        clock.clone(),
    );
    let mut stream = Iter(0..3).throttle(&limiter);
    assert_eq!(next(&mut stream).await, Some(0));
    // The second is due at 100 ms; give up at 30.
    assert!(
        tokio::time::timeout(Duration::from_millis(30), next(&mut stream))
            .await
            .is_err()
    );
    assert_eq!(limiter.remaining(), 0);
    // Held back, not lost, and nothing was taken for it: due at 100 ms.
    assert_eq!(stream.size_hint().0, 2);
    assert_eq!(next(&mut stream).await, Some(1));
    assert_eq!(clock.now() / 1_000_000, 100);
}

/// An inner sink that is never ready.
struct NeverReady;

impl Sink<u32> for NeverReady {
    type Error = ();

    fn poll_ready(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), ()>> {
        Poll::Pending
    }

    fn start_send(self: Pin<&mut Self>, _: u32) -> Result<(), ()> {
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), ()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), ()>> {
        Poll::Ready(Ok(()))
    }
}

/// Permits are taken only for an item the inner sink is ready for: a sink
/// dropped while its inner sink is not ready spends nothing (it spent the
/// item's cost before).
#[test]
fn a_sink_whose_inner_sink_is_not_ready_spends_nothing() {
    let clock = ManualClock::new();
    let limiter =
        RateLimiter::with_clock(Quota::new(10, 1, Duration::from_millis(1)).unwrap(), clock);
    {
        let mut sink = NeverReady.throttle_sink_weighted(&limiter, |_: &u32| 4);
        let mut cx = Context::from_waker(Waker::noop());
        let mut sink = Pin::new(&mut sink);
        assert!(sink.as_mut().poll_ready(&mut cx).is_ready());
        sink.as_mut().start_send(1).unwrap();
        assert!(sink.as_mut().poll_flush(&mut cx).is_pending());
    }
    assert_eq!(limiter.remaining(), 10, "the item was never sent");
}

#[tokio::test(start_paused = true)]
async fn a_sink_sends_each_item_when_its_permits_are_due() {
    let clock = TokioClock::new();
    let limiter = RateLimiter::with_clock(
        Quota::new(2, 1, Duration::from_millis(10)).unwrap(),
        clock.clone(),
    );
    let mut sink = Collect::default().throttle_sink(&limiter);
    let mut sent_at = Vec::new();
    for i in 0..5 {
        let mut sink = Pin::new(&mut sink);
        std::future::poll_fn(|cx| sink.as_mut().poll_ready(cx))
            .await
            .unwrap();
        sink.as_mut().start_send(i).unwrap();
        std::future::poll_fn(|cx| sink.as_mut().poll_flush(cx))
            .await
            .unwrap();
        sent_at.push(clock.now() / 1_000_000);
    }
    assert_eq!(sent_at, [0, 0, 10, 20, 30]);
    let (inner, held) = sink.into_inner();
    assert_eq!(inner.0, [0, 1, 2, 3, 4]);
    assert!(held.is_none());
}

#[test]
fn a_weighted_sink_holds_an_item_until_its_cost_is_paid() {
    let clock = ManualClock::new();
    let limiter = RateLimiter::with_clock(
        Quota::new(10, 1, Duration::from_millis(1)).unwrap(),
        clock.clone(),
    );
    let mut sink = Collect::default().throttle_sink_weighted(&limiter, |s: &&str| s.len() as u64);
    let mut cx = Context::from_waker(Waker::noop());
    let mut sink = Pin::new(&mut sink);
    assert!(sink.as_mut().poll_ready(&mut cx).is_ready());
    sink.as_mut().start_send("0123456789abcde").unwrap(); // 15: 10 now, 5 later
    let mut polls = 1;
    while sink.as_mut().poll_flush(&mut cx).is_pending() {
        polls += 1;
    }
    assert_eq!(clock.elapsed(), Duration::from_millis(5));
    assert_eq!(polls, 2, "one wait for the second instalment");
    assert_eq!(sink.get_ref().0, ["0123456789abcde"]);
}

#[tokio::test(start_paused = true)]
async fn a_large_buffer_is_split_so_no_decision_exceeds_the_bucket() {
    let clock = TokioClock::new();
    // A bucket of 1,000 and a default chunk of 64 KiB: a 10,000-byte write
    // is split into decisions of at most a quarter of the bucket.
    let limiter = RateLimiter::with_clock(
        Quota::new(1_000, 1, Duration::from_micros(100)).unwrap(),
        clock.clone(),
    );
    let mut out = ShapedWrite::new(
        Short {
            max: usize::MAX,
            written: 0,
        },
        &limiter,
    );
    let mut sizes = Vec::new();
    let mut left = 10_000;
    while left > 0 {
        let n = out.write(&vec![0; left]).await.unwrap();
        assert!(n <= 250, "{n}");
        sizes.push(n);
        left -= n;
    }
    assert_eq!(sizes, [250; 40]);
    // 9,000 at one a tenth of a millisecond.
    assert_eq!(clock.now() / 1_000_000, 900);
}

#[tokio::test(start_paused = true)]
async fn a_deadline_fails_a_write_at_once_taking_nothing() {
    use turnstile::WaitOptions;
    let clock = TokioClock::new();
    let limiter = RateLimiter::with_clock(
        Quota::new(100, 1, Duration::from_millis(1)).unwrap(),
        clock.clone(),
    );
    let mut out = ShapedWrite::new(tokio::io::sink(), &limiter)
        .chunk(100)
        .with_options(WaitOptions::new().deadline(Duration::from_millis(10)));
    out.write_all(&[0; 100]).await.unwrap();
    let err = out.write_all(&[0; 100]).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    assert_eq!(clock.now(), 0, "it did not sleep");
    assert_eq!(out.credit(), 0);
}

/// A write abandoned mid-wait (its future dropped by a timeout) and a write
/// made long after: the deadline counts only what the new write waits. It
/// counted from the abandoned wait's start, and failed at once with a wait
/// of 10.5 s "past the deadline of 2 s", where the permits came in 1 s.
#[tokio::test(start_paused = true)]
async fn a_deadline_counts_only_the_wait_of_the_write_taken_up() {
    use turnstile::WaitOptions;

    let clock = TokioClock::new();
    // 1 byte a millisecond, bursts of 4,000.
    let limiter = Arc::new(RateLimiter::with_clock(
        Quota::new(4_000, 1, Duration::from_millis(1)).unwrap(),
        clock.clone(),
    ));
    let mut out = ShapedWrite::new(tokio::io::sink(), Arc::clone(&limiter))
        .chunk(1_000)
        .with_options(WaitOptions::new().deadline(Duration::from_secs(2)));
    assert!(limiter.try_acquire_n(4_000).unwrap().is_allowed());
    let abandoned = tokio::time::timeout(Duration::from_millis(500), out.write(&[0; 1_000])).await;
    assert!(abandoned.is_err(), "the write waits for its bytes");
    tokio::time::sleep(Duration::from_secs(10)).await;
    // Another consumer empties the bucket: the next write waits 1 s.
    assert!(limiter.try_acquire_n(4_000).unwrap().is_allowed());
    let began = tokio::time::Instant::now();
    assert_eq!(out.write(&[0; 1_000]).await.unwrap(), 1_000);
    assert_eq!(began.elapsed(), Duration::from_secs(1));
}

/// An algorithm of the application's own whose capacity is 0 can never
/// admit: a write on it fails with the typed error instead of spinning in
/// one poll for ever.
#[tokio::test]
async fn a_writer_on_an_algorithm_that_holds_nothing_fails_instead_of_spinning() {
    use turnstile::{AcquireError, Algorithm, Decision, RetryAfter, WaitError};

    struct Nothing;
    impl Algorithm for Nothing {
        fn fresh(&self) -> u64 {
            0
        }
        fn capacity(&self) -> u32 {
            0
        }
        fn decide(&self, _: u64, _: u64, _: u32) -> (Decision, Option<u64>) {
            (
                Decision::Denied {
                    retry_after: RetryAfter::from_nanos(1_000_000),
                },
                None,
            )
        }
        fn remaining(&self, _: u64, _: u64) -> u32 {
            0
        }
        fn refund(&self, _: u64, _: u64, _: u32) -> Option<u64> {
            None
        }
        fn is_fresh_equivalent(&self, _: u64, _: u64) -> bool {
            true
        }
        fn fresh_after_idle(&self) -> Duration {
            Duration::ZERO
        }
    }
    let limiter = RateLimiter::from_parts(Nothing, turnstile::RealClock::default());
    let mut out = ShapedWrite::new(tokio::io::sink(), &limiter);
    let error = tokio::time::timeout(Duration::from_secs(10), out.write(&[0; 10]))
        .await
        .expect("the write returns")
        .unwrap_err();
    let inner = error.get_ref().and_then(|e| e.downcast_ref::<WaitError>());
    assert!(
        matches!(
            inner,
            Some(WaitError::Acquire(AcquireError::InsufficientCapacity {
                capacity: 0,
                ..
            }))
        ),
        "{error:?}"
    );
}

/// A write that sleeps many times under contention (another writer takes
/// each byte as it comes) fails at its deadline, as `wait_n_async` does: the
/// timer's rounding of each sleep is waiting too. It failed 39 ms late of a
/// 200 ms deadline, having discounted up to a millisecond a sleep.
#[tokio::test(start_paused = true)]
async fn a_deadline_holds_across_many_sleeps_under_contention() {
    use turnstile::WaitOptions;

    let clock = TokioClock::new();
    // 1 byte each 1.5 ms, bursts of 8.
    let limiter = Arc::new(RateLimiter::with_clock(
        Quota::new(8, 1, Duration::from_micros(1_500)).unwrap(),
        clock.clone(),
    ));
    assert!(limiter.try_acquire_n(8).unwrap().is_allowed());
    let other = Arc::clone(&limiter);
    let competitor = tokio::spawn(async move {
        let mut w = ShapedWrite::new(tokio::io::sink(), other).chunk(1);
        loop {
            w.write_all(&[0]).await.unwrap();
        }
    });
    tokio::task::yield_now().await;
    let deadline = Duration::from_millis(200);
    let mut out = ShapedWrite::new(tokio::io::sink(), Arc::clone(&limiter))
        .with_options(WaitOptions::new().deadline(deadline));
    let began = tokio::time::Instant::now();
    let result = out.write(&[0; 2]).await;
    let waited = began.elapsed();
    competitor.abort();
    let err = result.expect_err("the competitor takes every byte");
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    assert!(
        waited <= deadline + Duration::from_millis(2),
        "failed after {waited:?}, deadline {deadline:?}"
    );
}

/// After a short write and a pause, a writer moves at one instant at most a
/// full bucket and its credit, which is at most one chunk, as the module
/// documents (it once claimed a burst never exceeds the bucket).
#[tokio::test(start_paused = true)]
async fn a_burst_after_a_short_write_is_at_most_the_bucket_and_one_chunk() {
    let clock = TokioClock::new();
    let limiter = RateLimiter::with_clock(
        Quota::new(400, 1, Duration::from_millis(1)).unwrap(),
        clock.clone(),
    );
    // The default chunk, held to a quarter of the capacity: 100.
    let mut out = ShapedWrite::new(Short { max: 1, written: 0 }, &limiter);
    assert_eq!(out.write(&[0; 1_000]).await.unwrap(), 1);
    assert_eq!(out.credit(), 99);
    tokio::time::sleep(Duration::from_secs(60)).await;
    out.get_mut().max = usize::MAX;
    let before = clock.now();
    let mut at_once = 0;
    while clock.now() == before {
        let mut write = std::pin::pin!(out.write(&[0; 1_000]));
        match write
            .as_mut()
            .poll(&mut Context::from_waker(std::task::Waker::noop()))
        {
            Poll::Ready(written) => at_once += written.unwrap(),
            Poll::Pending => break,
        }
    }
    assert_eq!(at_once, 400 + 99, "the bucket and the credit, and no more");
    assert!(at_once <= 400 + 100);
}
