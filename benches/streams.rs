//! A stream's overhead per item while tokens are available: turnstile's
//! `Throttled` beside governor's `RatelimitedStream`, in one group so that
//! the figures are ratios from one run.
//!
//! `cargo bench -p turnstile-bench --bench streams`
//!
//! - `stream_allow`: an endless stream of `()` through each adapter, every
//!   item admitted (a bucket too big to run dry), polled with a no-op waker;
//!   `bare` is the stream alone (the floor: what the adapters add is the
//!   gap to it). `turnstile-weighted` prices each item by a closure (cost 1).
//!
//! Both limiters read quanta's TSC; governor's stream is its default
//! configuration (`std` and `jitter` features, no jitter asked).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use criterion::{Criterion, criterion_group, criterion_main};
use futures_core::Stream;
use governor::prelude::StreamRateLimitExt;
use turnstile::io::StreamExt;

const ALLOW_RATE: u32 = u32::MAX;

/// An endless stream of `()`.
struct Repeat;

impl Stream for Repeat {
    type Item = ();
    #[inline]
    fn poll_next(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<()>> {
        Poll::Ready(Some(()))
    }
}

/// Poll `stream` for one item, which must be there.
#[inline]
fn one<S: Stream + Unpin>(stream: &mut S, cx: &mut Context<'_>) -> S::Item {
    match Pin::new(stream).poll_next(cx) {
        Poll::Ready(Some(item)) => item,
        _ => panic!("the allow bench must allow"),
    }
}

fn stream_allow(c: &mut Criterion) {
    let mut group = c.benchmark_group("stream_allow");
    let mut cx = Context::from_waker(Waker::noop());

    let mut bare = Repeat;
    group.bench_function("bare", |b| b.iter(|| one(black_box(&mut bare), &mut cx)));

    let ours = turnstile::RateLimiter::new(
        turnstile::Quota::per_second_with_burst(u64::from(ALLOW_RATE), ALLOW_RATE).unwrap(),
    );
    let mut stream = Repeat.throttle(&ours);
    group.bench_function("turnstile", |b| {
        b.iter(|| one(black_box(&mut stream), &mut cx))
    });

    let theirs = governor::RateLimiter::direct(governor::Quota::per_second(
        NonZeroU32::new(ALLOW_RATE).unwrap(),
    ));
    let mut stream = Repeat.ratelimit_stream(&theirs);
    group.bench_function("governor", |b| {
        b.iter(|| one(black_box(&mut stream), &mut cx))
    });

    let mut stream = Repeat.throttle_weighted(&ours, |_: &()| 1);
    group.bench_function("turnstile-weighted", |b| {
        b.iter(|| one(black_box(&mut stream), &mut cx))
    });
    group.finish();
}

criterion_group!(benches, stream_allow);
criterion_main!(benches);
