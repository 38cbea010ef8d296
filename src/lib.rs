//! A lock-free, concurrent, in-process rate limiter for the hot path.
//!
//! turnstile decides admission *before* work begins and rejects explicitly: a
//! denial carries the exact wait, and [`RetryAfter::header_secs`] rounds it up to
//! the whole seconds of an HTTP `Retry-After` header.
//!
//! Every algorithm is a pure function over one 64-bit word ([`Algorithm`]), run by
//! one compare-and-swap loop. The token bucket ([`TokenBucket`]) packs its token
//! count and last refill time into that word.
//!
//! ```
//! use turnstile::{Decision, Quota, RateLimiter};
//!
//! let limiter = RateLimiter::new(Quota::per_second(100)?.burst(20)?);
//! match limiter.try_acquire() {
//!     Decision::Allowed { remaining } => println!("go ahead, {remaining} left"),
//!     Decision::Denied { retry_after } => {
//!         println!("429 Too Many Requests, Retry-After: {}", retry_after.header_secs())
//!     }
//! }
//! # Ok::<(), turnstile::QuotaError>(())
//! ```
//!
//! # Where to start
//!
//! - **One limit** for a process or a resource: [`RateLimiter`]
//!   ([`try_acquire`](RateLimiter::try_acquire) for a [`Decision`] with the
//!   exact wait, [`check`](RateLimiter::check) to defer the wait,
//!   [`wait`](RateLimiter::wait) to pace a client).
//! - **A limit per key** (API key, user, IP address): [`KeyedLimiter`], its
//!   memory bounded by `max_keys` and idle keys swept
//!   ([`with_sweeper`](KeyedLimiter::with_sweeper)). Keys from untrusted
//!   input can be forged in any number: bound them tightly.
//! - **Different quotas per key**: [`Tiered`]. **A quota changed while
//!   serving**: the live forms, [`LiveTokenBucket`] ([`RateLimiter::live`],
//!   [`KeyedLimiter::live`]), [`LiveGcra`], [`LiveFixedWindow`] and
//!   [`LiveSlidingWindow`], then `set_quota` ([`Reconfigure`]), each with
//!   its stated rule for the state it keeps.
//! - **HTTP**: [`Gate`] turns decisions into 200/401/429/503 with
//!   `Retry-After` and `RateLimit` fields for any framework, in front of a
//!   keyed limiter, tiers, or one [`RateLimiter`] for the whole service; with
//!   feature `tower`, `tower::RateLimitLayer` (`per_key(extractor, quota)`,
//!   `global(quota)`) with the key extractors `tower::ApiKeyHeader`,
//!   `tower::PeerIp` and `tower::ForwardedFor`. **Metrics** for a whole app:
//!   `metrics::Registry` (feature `metrics`).
//! - **Several limits at once**, all or nothing: [`chain`]. **Counting only
//!   some outcomes** (failed logins): `try_acquire_refundable`, then
//!   [`Admission::refund`]. **Reserving ahead**: `reserve_n`, [`Reservation`].
//! - **Calls in flight** rather than calls per second: [`ConcurrencyLimiter`].
//!   **Waiting in arrival order**: `Fair` (feature `tokio`).
//! - **Algorithms**: [`TokenBucket`] (the default), [`Gcra`], [`FixedWindow`],
//!   [`SlidingWindow`], [`WarmUp`] (a token bucket that starts cold). **Clocks**: [`RealClock`] (the default),
//!   [`CoarseClock`] (cheaper to read), [`ManualClock`] (for tests),
//!   [`TickClock`] (a tick source of your own).
//! - **Without the standard library**: the algorithms and [`RateLimiter`],
//!   below.
//! - **One limit across processes**: the `redis` module (feature `redis`),
//!   exact or leased.
//! - **Bytes per second and streams**: the `io` module (feature `io`):
//!   streams and sinks at a rate, tokio readers and writers shaped to a
//!   rate with a burst, per connection or shared; rates of 10^10 per
//!   second and more with [`Quota::per_second_with_burst`].
//!
//! The [`guide`] is the manual, one chapter per topic, in reading order:
//! [`algorithms`](guide::algorithms) (the semantics and bounds of each),
//! [`keyed`](guide::keyed), [`http`](guide::http), [`waiting`](guide::waiting),
//! [`redis`](guide::redis), [`clocks`](guide::clocks),
//! [`observability`](guide::observability), [`production`](guide::production)
//! (the checklist), [`migrating`](guide::migrating) (from governor and Go's
//! x/time/rate) and [`design`](guide::design) (with the measurements). It says
//! how the crate meets each hazard the rate-limiter pattern names:
//! unsynchronized counters, unbounded per-key memory, untrusted keys, counters
//! split across servers.
//!
//! # Without the standard library
//!
//! The `std` feature is on by default, and every other feature but `alloc`
//! turns it on. Without it (`default-features = false`) the crate is `#![no_std]`, depends
//! on no other crate, and needs a target with 64-bit atomics (every limiter's
//! word is an `AtomicU64`). What it offers then:
//!
//! - every algorithm, each a pure function over one word: [`TokenBucket`],
//!   [`Gcra`], [`FixedWindow`], [`SlidingWindow`], [`WarmUp`], the live
//!   forms ([`LiveTokenBucket`], [`LiveGcra`], [`LiveFixedWindow`],
//!   [`LiveSlidingWindow`]), and the [`Algorithm`] trait;
//! - [`RateLimiter`], built with [`with_clock`](RateLimiter::with_clock) or
//!   [`from_parts`](RateLimiter::from_parts) on a clock of the application's
//!   own: a type that implements [`Clock`], or a closure over a monotonic
//!   tick source of any rate in a [`TickClock`]. Every decision is there
//!   (`try_acquire`, `check`, `try_acquire_n`, `remaining`), refunds
//!   ([`Admission`]), and `set_quota` on every live form;
//! - [`Quota`], [`Decision`], [`RetryAfter`], [`NotYet`], and the errors
//!   [`QuotaError`], [`AcquireError`], [`WarmUpError`] and [`RateLimited`]
//!   (each a `core::error::Error`);
//! - [`ManualClock`] with the `alloc` feature: its clones share one time
//!   through an `Arc`. It is the one use of `alloc`, which makes the
//!   application supply a global allocator; without the feature the crate
//!   links no `alloc`, and a [`TickClock`] over an atomic counter serves as
//!   a clock set by hand.
//!
//! Everything else needs `std`: the keyed map ([`KeyedLimiter`], [`Tiered`]),
//! waits and reservations, the clocks on the OS ([`RealClock`],
//! [`MonotonicClock`], [`TscClock`], [`CoarseClock`]), counting a direct
//! limiter's decisions ([`RateLimiter::counted`], whose counters are per
//! thread), [`chain`], [`ConcurrencyLimiter`], the [`Gate`] and the tower
//! layers, metrics and Redis. Without `std`, [`RateLimiter`]'s type
//! parameters have no defaults (there is no default clock): name them,
//! `RateLimiter<TokenBucket, MyClock>`, which compiles with `std` too.
//!
//! ```
//! use turnstile::{Clock, Quota, RateLimiter, TokenBucket};
//!
//! /// A clock on a hardware timer.
//! struct Timer;
//!
//! impl Clock for Timer {
//!     fn now(&self) -> u64 {
//!         // Nanoseconds since boot, read from the timer; never going back.
//!         # 5_000_000
//!     }
//! }
//!
//! let limiter: RateLimiter<TokenBucket, Timer> =
//!     RateLimiter::with_clock(Quota::per_second(10)?, Timer);
//! assert!(limiter.try_acquire().is_allowed());
//! # Ok::<(), turnstile::QuotaError>(())
//! ```
//!
//! Decisions take no lock and may be made anywhere, an interrupt handler
//! included. A [`LiveTokenBucket`]'s quota changes are serialized by a lock
//! that, without `std`, spins: a `set_quota` from an interrupt handler that
//! interrupted another `set_quota` on the same limiter, on the same core,
//! would spin forever. Change quotas from one context only.
// `unsafe` lives in the keyed map's lock-free table (`src/keyed/table/`) and in
// one system call (`membarrier`, `reclaim/`), each block with the argument
// for why it is sound.
#![deny(unsafe_code, unsafe_op_in_unsafe_fn)]
// Without the `std` feature, the crate is `no_std`, and uses `alloc` only with
// the `alloc` feature; unit tests keep the standard library, which their
// harness needs.
#![cfg_attr(not(any(feature = "std", test)), no_std)]
// On docs.rs (`--cfg docsrs`, nightly, every feature: Cargo.toml's
// `[package.metadata.docs.rs]`) each item behind a feature is labelled with
// it. The loom models' cfg is no user's choice: it labels nothing.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(docsrs, doc(auto_cfg(hide(turnstile_loom))))]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

#[cfg(feature = "alloc")]
extern crate alloc;

#[cfg(all(turnstile_loom, not(feature = "std")))]
compile_error!("the loom models (`--cfg turnstile_loom`) need the `std` feature");

mod admission;
mod algorithm;
mod cell;
#[cfg(feature = "std")]
pub mod chain;
mod clock;
#[cfg(feature = "std")]
mod concurrency;
mod decision;
mod error;
#[cfg(all(feature = "std", any(doc, all(doctest, turnstile_docs))))]
pub mod guide;
#[cfg(feature = "std")]
mod http;
#[cfg(feature = "io")]
pub mod io;
#[cfg(feature = "std")]
mod keyed;
mod limiter;
#[cfg(feature = "metrics")]
pub mod metrics;
mod quota;
#[cfg(feature = "std")]
mod reclaim;
#[cfg(feature = "redis")]
pub mod redis;
mod sync;
#[cfg(feature = "std")]
mod tally;
#[cfg(feature = "std")]
mod wait;
mod word;

pub use admission::Admission;
pub use algorithm::Algorithm;
pub use algorithm::fixed_window::FixedWindow;
pub use algorithm::gcra::Gcra;
pub use algorithm::live::LiveTokenBucket;
pub use algorithm::not_yet::NotYet;
pub use algorithm::sliding_window::SlidingWindow;
pub use algorithm::switch::{LiveFixedWindow, LiveGcra, LiveSlidingWindow, Reconfigure};
pub use algorithm::token_bucket::TokenBucket;
pub use algorithm::warm_up::{WarmUp, WarmUpError};
#[cfg(feature = "std")]
pub use chain::ChainAdmission;
#[cfg(all(feature = "std", not(turnstile_loom)))]
pub use clock::CoarseClock;
#[cfg(feature = "alloc")]
pub use clock::ManualClock;
pub use clock::{Clock, TickClock};
#[cfg(feature = "std")]
pub use clock::{ClockSource, MonotonicClock, RealClock, TscClock};
#[cfg(feature = "std")]
pub use concurrency::{ConcurrencyLimiter, OwnedPermit, Permit};
pub use decision::{Decision, KeyedDecision, RateLimited, RetryAfter};
#[cfg(feature = "std")]
pub use error::KeyedConfigError;
pub use error::{AcquireError, QuotaError};
#[cfg(feature = "std")]
pub use http::gate::{
    AdvertisedQuota, Gate, GateLimiter, GateStats, LimiterStats, Outcome, PolicyError,
    RateLimitPolicy,
};
#[cfg(feature = "tower")]
pub use http::tower;
#[cfg(all(feature = "std", not(turnstile_loom)))]
pub use keyed::Sweeper;
#[cfg(feature = "std")]
pub use keyed::tiered::{Tiered, TieredError};
#[cfg(feature = "std")]
pub use keyed::{
    DEFAULT_MAX_KEYS, DEFAULT_SWEEP_EVERY, KeyedAdmission, KeyedBuilder, KeyedLimiter, KeyedStats,
    MIN_SWEEP_INTERVAL,
};
#[cfg(feature = "std")]
pub use limiter::{Counted, DirectStats};
pub use limiter::{Counter, RateLimiter, Uncounted};
pub use quota::Quota;
/// The grace-period protocol's interface, for the loom models only.
#[cfg(turnstile_loom)]
#[doc(hidden)]
pub use reclaim::model as reclaim_model;
#[cfg(feature = "std")]
pub use reclaim::{BarrierMode, Reclamation, reclamation};
#[cfg(feature = "tokio")]
pub use wait::fair::{Fair, FairError, FairTarget};
#[cfg(feature = "std")]
pub use wait::reserve::{KeyedReservation, Lend, Reservation, ReserveError};
#[cfg(feature = "std")]
pub use wait::{WaitError, WaitOptions};

// The README's examples are compiled and run as doc tests of the all-features
// twin only (`cargo test` at the workspace root), which has every feature and
// the dev-dependencies they use; its build script sets `turnstile_docs`
// (benches/all-features/Cargo.toml).
#[doc = include_str!("../README.md")]
#[cfg(all(doctest, turnstile_docs))]
pub struct ReadmeDoctests;
