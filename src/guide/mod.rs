//! The guide to turnstile: one chapter per topic, each claim tied to the test
//! or the measurement (a section of `BENCHMARKS.md`) that backs it.
//!
//! In reading order:
//!
//! 1. [`algorithms`]: how a limiter decides. The token bucket, GCRA, the fixed
//!    and sliding windows, and how they relate to the leaky bucket; their exact
//!    semantics, the packed word, and which to choose.
//! 2. [`keyed`]: a limit per key. The memory bound (`max_keys`), sweeping,
//!    keys from untrusted input, tiers, and quotas changed while serving.
//! 3. [`http`]: answering over HTTP. The [`Gate`](crate::Gate) and its
//!    401/429/503, `Retry-After` and `RateLimit` fields, the tower layer and
//!    its key extractors, choosing the key, and shadow mode.
//! 4. [`waiting`]: waiting instead of being refused, and combining limits.
//!    Pacing a client, blocking and async waits, fair waiting, reservations,
//!    concurrency limits, chains and refunds.
//! 5. [`redis`]: one limit across processes. Exact and leased modes, which to
//!    use, their bounds, and the failure policy.
//! 6. [`clocks`]: which clock to read, what each costs, and what skewed
//!    readings can do.
//! 7. [`observability`]: counters, `metrics` and `tracing`.
//! 8. [`production`]: the checklist before a limit serves real traffic.
//! 9. [`migrating`]: from governor and from Go's x/time/rate.
//! 10. [`design`]: how it is built and why, the dependencies, the performance
//!     in brief, and the source layout.
//!
//! The behaviour the crate implements is the rate-limiter pattern's: its
//! traces are `tests/` and the examples, and the pattern's hazards each have a
//! chapter. Unsynchronized counters: one compare-and-swap per decision
//! ([`design`]). Unbounded per-key memory and untrusted keys: the key bound
//! ([`keyed`]). Counters split across servers: one limit in Redis ([`redis`]).
#![cfg_attr(
    not(all(
        feature = "tokio",
        feature = "tower",
        feature = "axum",
        feature = "tracing",
        feature = "metrics",
        feature = "redis"
    )),
    allow(rustdoc::broken_intra_doc_links)
)]

#[doc = include_str!("algorithms.md")]
pub mod algorithms {}

#[doc = include_str!("keyed.md")]
pub mod keyed {}

#[doc = include_str!("http.md")]
pub mod http {}

#[doc = include_str!("waiting.md")]
pub mod waiting {}

#[doc = include_str!("redis.md")]
pub mod redis {}

#[doc = include_str!("clocks.md")]
pub mod clocks {}

#[doc = include_str!("observability.md")]
pub mod observability {}

#[doc = include_str!("production.md")]
pub mod production {}

#[doc = include_str!("migrating.md")]
pub mod migrating {}

#[doc = include_str!("design.md")]
pub mod design {}
