//! Streams, sinks and byte streams at a rate (feature `io`).
//!
//! Four adapters draw permits from a limiter as data passes:
//!
//! | adapter | wraps | one permit is | built with |
//! |---|---|---|---|
//! | [`Throttled`] | a [`Stream`](futures_core::Stream) | an item (or its [cost](Cost)) | [`StreamExt::throttle`], [`StreamExt::throttle_weighted`] |
//! | [`ThrottledSink`] | a [`Sink`](futures_sink::Sink) | an item (or its cost) | [`SinkExt::throttle_sink`], [`SinkExt::throttle_sink_weighted`] |
//! | [`ShapedRead`] | tokio's [`AsyncRead`](tokio::io::AsyncRead) | a byte read | [`ShapedRead::new`] |
//! | [`ShapedWrite`] | tokio's [`AsyncWrite`](tokio::io::AsyncWrite) | a byte written | [`ShapedWrite::new`] |
//!
//! The limiter is anything that is a [`Throttle`]: a [`RateLimiter`] owned by
//! one adapter (one connection's cap), borrowed (`&RateLimiter`) or shared
//! (`Arc<RateLimiter>`) by many (one cap for many connections), or one key
//! of a [`KeyedLimiter`] ([`KeyThrottle`]: a cap per host or per tenant,
//! shared by that key's connections).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use tokio::io::AsyncWriteExt;
//! use turnstile::io::ShapedWrite;
//! use turnstile::{Quota, RateLimiter};
//!
//! // 100 MB/s with bursts of 1 MiB, shared by every connection that holds it.
//! let cap = Arc::new(RateLimiter::new(Quota::per_second_with_burst(100_000_000, 1 << 20)?));
//! let mut out = ShapedWrite::new(tokio::io::sink(), Arc::clone(&cap));
//! out.write_all(&[0; 64 * 1024]).await?; // within the burst: at once
//! # Ok(())
//! # }
//! ```
//!
//! # How they wait
//!
//! Each adapter asks its limiter for the permits it needs. When they are
//! there it takes them and goes on; when they are not, it sleeps on tokio's
//! timer for the limiter's exact retry-after, so an adapter alone on its
//! limiter is woken once per wait, when the permits are due, and not before
//! (there is no polling loop; tokio's timer rounds a sleep up to its next
//! millisecond). That holds on a clock that reads what tokio's timer does
//! (`RealClock`, the default): a [`CoarseClock`](crate::CoarseClock), whose
//! readings lag by up to its tick, can find the permits not yet due when the
//! timer fires and sleep again (a few more wake-ups than waits). A
//! reader that owes nothing also waits, taking nothing, for one permit before
//! it reads (below). Adapters sharing a limiter are not queued: each sleeps
//! until the bucket could serve it, and one that finds that another took
//! the permits first sleeps again, so `n` adapters waiting on one limiter
//! wake up to `n` times for each chunk admitted to one of them (32 writers
//! of 1,000-byte chunks woke 1,664 times for 128 chunks: `tests/io.rs`
//! bounds it). Where thousands of connections wait on one cap, give them
//! larger chunks, or keyed caps of their own. On a
//! [`ManualClock`](crate::ManualClock) the clock is moved forward instead and
//! the task woken at once, as [`RateLimiter::wait`] does: tests take no
//! time. The adapters need a tokio runtime with its timer, as
//! [`wait_async`](RateLimiter::wait_async) does.
//!
//! **Nothing is taken before it is admitted.** A wait takes nothing while it
//! sleeps: dropping the future that polls an adapter (a `select!` that
//! picked another branch, a timeout) spends nothing, and the adapter carries
//! on where it was when polled again (a deadline of
//! [`WaitOptions`](crate::WaitOptions) counts the time waited, not the time
//! between the abandoned wait's end and the next poll).
//!
//! **Large items and large buffers are split.** One decision takes at most
//! the limiter's capacity, so no decision asks for more than the bucket: an
//! item whose cost is larger is paid in instalments of at most a bucketful,
//! and a read
//! or write asks for at most [`chunk`](ShapedWrite::chunk) bytes (64 KiB by
//! default, never more than a quarter of the capacity (and at least one
//! byte, for a capacity below 4), so that a wake-up
//! that comes late finds the bucket not yet full and loses nothing) and
//! moves at most that many.
//!
//! **Every byte is paid for once.** A writer takes permits for the bytes
//! it offers the inner writer; when that writes fewer (a short write), the
//! rest is credit for the next write (credit left when the writer is
//! dropped stays spent: at most one chunk). Credit does not expire, so
//! after a short write and a pause a writer can move, at one instant, a full
//! bucket and its credit: at most the capacity and one chunk (a quarter of
//! the capacity), as a reader can run one read ahead. A reader pays after it reads,
//! for the bytes that arrived: at once when the permits are there, else
//! the next read waits for them before reading more. An idle connection
//! holds no permits, and a reader is at most one read (one chunk) ahead of
//! its limiter. A read that owes nothing (unless its reader has just
//! waited for its own last payment) first waits, taking nothing, until the
//! limiter has a permit. A reader dropped (or unwrapped by `into_inner`)
//! while its last read is unpaid pays it then: a token bucket (the crate's
//! limiters' default, and `LiveTokenBucket`) or GCRA (`Gcra`, `LiveGcra`)
//! lends the permits, as a reservation does and no further than one fill
//! time ahead, so the
//! limiter's next permits come that much later and later reads wait for
//! them. Another algorithm, or a loan that would reach past one fill time,
//! takes them if they are there and otherwise leaves them unpaid. So
//! connections that each read a message and close one after another hold a
//! shared cap (within a chunk); readers that read at the same moment are
//! each one read ahead of it, as readers that pay after they read are: `n`
//! of them up to `n` chunks beyond the cap (of which a token bucket or GCRA
//! lends back, when they close, what fits within one fill time). Give many such
//! readers a small [`chunk`](ShapedRead::chunk). A reader's deadline
//! ([`ShapedRead::with_options`]) covers its wait for a permit too.
//!
//! # Holding a rate
//!
//! The rate the adapters achieve is the quota's, less what the timer's
//! lateness costs: a wait wakes up to a millisecond late (tokio's timer),
//! more on a loaded machine, and a burst absorbs that lateness only if it
//! holds more than what arrives meanwhile. Give the limiter a burst of at
//! least a few milliseconds of its rate (1 MB at 1 GB/s): then every wake-up
//! finds the time it lost refilled, and the rate holds (BENCHMARKS.md,
//! "Shaping bytes": within 0.02% of 1 MB/s and 300 MB/s over loopback TCP
//! for 10 s, within 0.13% of 1 GB/s over loopback TCP and into
//! `tokio::io::sink()`). [`Quota::per_second_with_burst`](crate::Quota::per_second_with_burst)
//! takes rates up to 10^10 per second and bursts up to `u32::MAX` bytes.
//!
//! Readers and writers of one limiter are served as they ask, not in
//! arrival order: a small request can pass a large one that waits for its
//! chunk. Keep chunks small beside the burst where many connections share
//! one limiter.

mod pace;
mod shaped;
mod stream;

use core::borrow::Borrow;
use core::hash::{BuildHasher, Hash};
use core::ops::Deref;

use crate::algorithm::Algorithm;
use crate::clock::Clock;
use crate::decision::KeyedDecision;
use crate::keyed::KeyedLimiter;
use crate::wait::Waitable;

pub use shaped::{DEFAULT_CHUNK, ShapedRead, ShapedWrite};
pub use stream::{PerItem, SinkExt, StreamExt, Throttled, ThrottledSink};

#[cfg(doc)]
use crate::RateLimiter;

/// A limiter the adapters can draw permits from: a [`RateLimiter`], a
/// reference to one, an `Arc` of one, or one key of a keyed limiter
/// ([`KeyThrottle`]).
///
/// Sealed: implemented for the crate's limiters only (a [`RateLimiter`] over
/// any [`Algorithm`], the crate's or one of the
/// application's own), whose cells the adapters' guarantees rest on. An
/// algorithm of the application's own whose capacity is 0 makes a reader's
/// or writer's wait fail with
/// [`AcquireError::InsufficientCapacity`](crate::AcquireError::InsufficientCapacity);
/// a [`Throttled`] stream or a [`ThrottledSink`], which have no error of
/// their own to give, then stay pending for ever (as on a
/// [`ManualClock`](crate::ManualClock) that can move no further).
pub trait Throttle: Waitable {}

impl<T: Waitable + ?Sized> Throttle for T {}

/// One key of a [`KeyedLimiter`], as a [`Throttle`]: every adapter holding
/// the same key of the same limiter shares that key's bucket (a bandwidth cap
/// per host, per tenant, per API key).
///
/// `L` is how the adapter holds the limiter: `Arc<KeyedLimiter<K>>` to own a
/// share of it, `&KeyedLimiter<K>` to borrow it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use tokio::io::AsyncWriteExt;
/// use turnstile::io::{KeyThrottle, ShapedWrite};
/// use turnstile::{KeyedLimiter, ManualClock, Quota};
///
/// // 10 MB/s per tenant, shared by all of a tenant's connections (on a
/// // simulated clock, so that nothing refills while the example runs).
/// let clock = ManualClock::new();
/// let per_tenant = Arc::new(
///     KeyedLimiter::<String>::builder(Quota::per_second_with_burst(10_000_000, 256 * 1024)?)
///         .clock(clock)
///         .build()?,
/// );
/// let tenant = KeyThrottle::new(Arc::clone(&per_tenant), "acme".to_owned());
/// let mut out = ShapedWrite::new(tokio::io::sink(), tenant);
/// out.write_all(b"hello").await?;
/// assert_eq!(per_tenant.remaining("acme"), 256 * 1024 - 5);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct KeyThrottle<L, K> {
    limiter: L,
    key: K,
}

impl<L, K> KeyThrottle<L, K> {
    /// `key`'s bucket in `limiter`.
    pub const fn new(limiter: L, key: K) -> KeyThrottle<L, K> {
        KeyThrottle { limiter, key }
    }

    /// The key.
    pub const fn key(&self) -> &K {
        &self.key
    }

    /// The limiter.
    pub const fn limiter(&self) -> &L {
        &self.limiter
    }
}

impl<L, K, A, C, S> Waitable for KeyThrottle<L, K>
where
    L: Deref<Target = KeyedLimiter<K, A, C, S>>,
    K: Hash + Eq + Borrow<K> + Clone,
    // 'static: they are named only through `L`'s target, so a borrow of
    // `self` implies nothing about their lifetimes (every algorithm, clock and
    // hasher of the crate is 'static).
    A: Algorithm + 'static,
    C: Clock + 'static,
    S: BuildHasher + 'static,
{
    type Clock = C;
    const READS_OWN_CLOCK: bool = true;

    #[inline]
    fn wait_clock(&self) -> &C {
        self.limiter.clock()
    }

    #[inline]
    fn try_once(&self, _now: u64, n: u32) -> KeyedDecision {
        self.limiter.try_uncounted(&self.key, n)
    }

    #[inline]
    fn peek_once(&self, _now: u64, n: u32) -> KeyedDecision {
        self.limiter.peek(&self.key, n)
    }

    fn charge(&self, n: u32) -> bool {
        let note = |ahead| self.limiter.note_loan(ahead);
        let debtor = crate::wait::Debtor {
            algorithm: self.limiter.algorithm(),
            on_loan: &note,
        };
        self.limiter
            .take_with(&debtor, &self.key, n, false)
            .0
            .is_allowed()
    }

    #[inline]
    fn count(&self, admitted: bool) {
        self.limiter.count_outcome(admitted);
    }

    #[inline]
    fn capacity(&self) -> u32 {
        self.limiter.algorithm().capacity()
    }
}

/// What an item costs in permits, for the weighted adapters
/// ([`StreamExt::throttle_weighted`], [`SinkExt::throttle_sink_weighted`]).
///
/// Any `FnMut(&T) -> u64` is one: `|frame: &Bytes| frame.len() as u64`
/// prices a frame by its bytes. A cost of 0 passes the item without a
/// decision; a cost above the limiter's capacity is paid in instalments of
/// at most the capacity, one after the other, before the item passes.
pub trait Cost<T> {
    /// The permits `item` costs.
    fn cost(&mut self, item: &T) -> u64;
}

impl<T, F: FnMut(&T) -> u64> Cost<T> for F {
    #[inline]
    fn cost(&mut self, item: &T) -> u64 {
        self(item)
    }
}
