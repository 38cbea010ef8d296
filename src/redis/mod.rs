//! Distributed limits on Redis. Exact mode: every decision is one Lua script,
//! run atomically by Redis, with the same answer the in-process algorithm gives
//! (feature `redis`).
//!
//! Each algorithm of the crate ([`TokenBucket`], [`FixedWindow`],
//! [`SlidingWindow`], [`Gcra`]) has a twin script over the same state, in
//! integers a Lua number holds exactly (microseconds, and GCRA's nanoseconds
//! split in two): the same [`Decision`], the same `remaining`, the same exact
//! [`RetryAfter`] to the nanosecond, all or nothing for `n`
//! permits. Requests for 0 permits or for more than the capacity are refused
//! with [`AcquireError`] before anything is sent.
//!
//! ```no_run
//! use std::time::Duration;
//! use turnstile::redis::{Deadlines, RedisLimiter};
//! use turnstile::{Quota, TokenBucket};
//!
//! let client = redis::Client::open("redis://127.0.0.1/")?;
//! // A connection whose every call gives up after 5 ms, and reconnects after a failure.
//! let mut con = Deadlines::default().blocking(client);
//!
//! let quota = Quota::per_second(100)?.burst(20)?;
//! let limiter = RedisLimiter::new("api", TokenBucket::new(quota))?;
//! let decision = limiter.try_acquire(&mut con, "k_live_123")?;
//! if let Some(wait) = decision.retry_after() {
//!     println!("429 Too Many Requests, Retry-After: {}", wait.header_secs());
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Refunds
//!
//! [`RedisLimiter::try_acquire_refundable`] admits as
//! [`try_acquire`](RedisLimiter::try_acquire) does and returns, on an
//! admission, a [`RedisReceipt`]; [`RedisLimiter::refund`] gives the permits
//! back, in one script, only when it can be exact (the key left as it would
//! be without the admission) and otherwise declines, changing nothing. Its
//! documentation gives each algorithm's rule. [`Guarded`] refunds to whichever
//! admitted, Redis or its local fallback ([`GuardedReceipt`]).
//!
//! # Checks that spend nothing
//!
//! [`RedisLimiter::peek_n`] answers with the decision `n` permits would get
//! now, from the key's state in Redis, and writes nothing: the same
//! `remaining` and the same wait as [`try_acquire_n`](RedisLimiter::try_acquire_n)
//! at that moment. Each algorithm's peek is its decision's own script with
//! the one write left out.
//! [`Guarded::peek_n`] and [`LeasedLimiter::peek_n`] peek through their
//! failure policy and, in leased mode, the tokens this process holds.
//!
//! # Leased mode
//!
//! [`LeasedLimiter`] shares any algorithm's limit through the same key and
//! state, but takes its permits in batches (leases) and spends them in
//! process, with no call per decision; it states its bounds on
//! over-admission (for the windows, their own: a window's lease ends with
//! it), stranded tokens and Redis calls, and its failure policy.
//!
//! # Time
//!
//! By default a script reads Redis' own clock (`TIME`), so every process
//! sharing a limit decides on one clock and no client's clock is an input:
//! the calls take no time argument. Redis 5 and later replicate a script's
//! writes rather than the script, so replicas never read their own clocks; on
//! Redis 3.2 to 4 the scripts ask for that (`redis.replicate_commands()`). The
//! `_at` variants take the time instead, in microseconds since any epoch (the
//! Unix epoch to mix with `TIME`), for tests and replays. Time that goes back
//! is handled as in process: it never creates permits.
//!
//! # Keys and expiry
//!
//! A limiter's key for client `key` is its prefix followed by `key`; the
//! default prefix is `turnstile:{name}:`. Redis Cluster hashes only the part
//! between the first `{` and the next `}` when a key has one (a *hash tag*),
//! so every key of one limiter lives in one slot, on one node: a limiter can
//! be inspected or cleared there, and scripts over several of its keys would
//! not fail with `CROSSSLOT`. Each decision touches one key, so nothing needs
//! the tag today: a prefix without braces
//! ([`with_prefix`](RedisLimiter::with_prefix), e.g. `"turnstile:api:"`)
//! spreads one limiter's keys over the cluster's nodes instead.
//!
//! A key holds its state as a string of whole numbers joined by `:` (a token
//! bucket's `tokens:time`, for one), written together with its expiry by one
//! `SET … PX`; a denial writes nothing. A string that is not such a state
//! (written by something else) fails the call with an error naming the key
//! and is left as it is (taking it as fresh could admit a whole burst more
//! than the limit); a key of another type fails the call too (`WRONGTYPE`). The expiry,
//! rounded up to whole milliseconds, is when the state will be as good as
//! fresh: a token bucket when it would be full again, a fixed window when its
//! window ends, a sliding window when its counts weigh nothing (the end of the
//! next window), GCRA when its theoretical arrival time has passed. A key that
//! returns after that finds exactly the allowance it would have had, and idle
//! keys leave Redis. With explicit times the expiry counts the same durations
//! on Redis' clock: a replay run faster than real time keeps keys longer than
//! needed, one run slower could see a key expire before its trace's time
//! reaches that point; [`with_expiry_slack`](RedisLimiter::with_expiry_slack)
//! keeps every key longer by a fixed margin.
//!
//! # Deadlines and failures
//!
//! A decision over the network can fail: every call returns [`RedisLimitError`]
//! rather than panicking, whatever Redis answers. [`Guarded`] turns failures
//! into decisions by a policy ([`OnFailure`]: deny, or fall back to a limit in
//! this process), stops calling Redis for a backoff after each failure, and
//! counts them. [`Deadlines`] bounds each call: [`Deadlines::blocking`] gives a
//! connection with read and write timeouts that drops itself after an I/O error
//! or a timeout (a late reply must never be read as the next call's) and
//! reconnects on the next call; [`Deadlines::multiplexed`] gives tokio's
//! multiplexed connection with a response timeout, and
//! [`Deadlines::reconnecting`] one that also connects again after a call
//! found its connection dropped or timed out (a Redis restart, or a server
//! killed mid-request). A call that timed out may still have
//! been decided by Redis: it is never sent again.
//!
//! # Redis Cluster and Sentinel
//!
//! [`Deadlines::blocking_cluster`] and [`Deadlines::async_cluster`] connect to
//! a Redis Cluster, [`Deadlines::sentinel`] and
//! [`Deadlines::reconnecting_sentinel`] to the primary that Sentinels name
//! (asking them again after a failover). Like the single-server connections
//! they send no call twice: redis-rs's own cluster connection resends a call
//! that timed out (up to 16 times by default), so it could take a script's
//! tokens as often; the cluster connections here follow only redirections
//! (`MOVED`, `ASK`). The blocking refresher and the tower layer, which keep
//! a connection, take any of them through one sealed trait,
//! [`RedisConnection`] (blocking) or [`AsyncRedisConnection`] (tokio); the
//! per-call methods and the asynchronous refresher take any `ConnectionLike`
//! (the refresher: one of these, which connect again after a Redis restart;
//! not [`Deadlines::multiplexed`], which never does, nor redis-rs's own
//! cluster connection).
//!
//! # Behind a tower layer
//!
//! With features `tower` and `tokio` too, `RedisRateLimitLayer` puts a
//! [`Guarded`] or a [`LeasedLimiter`] in front of a service, with the HTTP
//! answers of `http::tower::RateLimitLayer`; a request
//! awaits only the round trip its decision needs (none while a lease covers
//! it).
//!
//! # Limits of the exact arithmetic
//!
//! Lua numbers are doubles, exact up to `2^53`. [`RedisLimiter::new`] refuses
//! the few configurations whose arithmetic would go past that
//! ([`RedisConfigError`]): token-bucket fill times and windows longer than
//! `2^47` µs (4.46 years, the in-process bound too), windows that are not a
//! whole number of microseconds, sliding windows whose `limit * window` reaches
//! `2^53` µs (65,535 per 38 hours, a million per 2.5 hours), and GCRA horizons
//! (`capacity * period / amount`) beyond `2^50` ns (13 days). Explicit times
//! must be below `2^52` µs (the year 2112).

mod cluster;
#[cfg(all(feature = "tower", feature = "tokio"))]
mod combined;
mod connection;
mod error;
mod failover;
mod guarded;
mod health;
#[cfg(all(feature = "tower", feature = "tokio"))]
mod layer;
mod leased;
mod refund;
mod topology;

#[cfg(feature = "tokio")]
pub use cluster::AsyncClusterConnection;
pub use cluster::BlockingClusterConnection;
#[cfg(feature = "tokio")]
pub use connection::ReconnectingConnection;
pub use connection::{BlockingConnection, Deadlines};
pub use error::{RedisConfigError, RedisLimitError};
pub use guarded::{AdmittedBy, Guarded, GuardedReceipt, GuardedStats, OnFailure};
#[cfg(all(feature = "tower", feature = "tokio"))]
pub use layer::{
    RedisKey, RedisLayerStats, RedisLimit, RedisRateLimit, RedisRateLimitLayer, RedisResponseFuture,
};
pub use leased::{LeasedBuilder, LeasedLimiter, LeasedStats, Refresher};

/// The largest lease, `2^23 − 1`: a process holds at most a lease and a
/// quarter, which the lease word's 24-bit count holds (defined here, beside
/// the errors that name it, for leased mode).
pub const MAX_LEASE: u32 = (1 << 23) - 1;

pub use refund::RedisReceipt;
pub use topology::RedisConnection;
#[cfg(feature = "tokio")]
pub use topology::{AnyAsyncConnection, AsyncRedisConnection};

use core::time::Duration;
use std::sync::LazyLock;

use ::redis::{ConnectionLike, Script, ScriptInvocation, Value};

use crate::algorithm::Algorithm;
use crate::algorithm::fixed_window::FixedWindow;
use crate::algorithm::gcra::Gcra;
use crate::algorithm::sliding_window::SlidingWindow;
use crate::algorithm::token_bucket::TokenBucket;
use crate::decision::{Decision, RetryAfter};
use crate::error::AcquireError;

/// Every script: the shared prelude (time, permits, exact division) and then
/// the algorithm's own part.
macro_rules! script {
    ($($file:literal),+) => {
        LazyLock::new(|| Script::new(concat!(include_str!("prelude.lua"), $(include_str!($file)),+)))
    };
}

static TOKEN_BUCKET: LazyLock<Script> = script!("token_bucket_level.lua", "token_bucket.lua");
/// Leased mode's two scripts for each algorithm, on its own state: a lease
/// and a give-back.
static LEASE: LazyLock<Script> = script!("token_bucket_level.lua", "lease.lua");
static GIVE_BACK: LazyLock<Script> = script!("token_bucket_level.lua", "give_back.lua");
static GCRA_LEASE: LazyLock<Script> = script!("gcra_lease.lua");
static GCRA_GIVE_BACK: LazyLock<Script> = script!("gcra_give_back.lua");
static FIXED_WINDOW_LEASE: LazyLock<Script> = script!("fixed_window_lease.lua");
static FIXED_WINDOW_GIVE_BACK: LazyLock<Script> = script!("fixed_window_give_back.lua");
static SLIDING_WINDOW_LEASE: LazyLock<Script> = script!("sliding_window_lease.lua");
static SLIDING_WINDOW_GIVE_BACK: LazyLock<Script> = script!("sliding_window_give_back.lua");
static FIXED_WINDOW: LazyLock<Script> = script!("fixed_window.lua");
static SLIDING_WINDOW: LazyLock<Script> = script!("sliding_window.lua");
static GCRA: LazyLock<Script> = script!("gcra.lua");

/// A peek's script: the decision's own, with the state's one write
/// (`store_state`) made a no-op, so that it reads the key and answers as
/// the decision would, writing nothing.
macro_rules! peek {
    ($($file:literal),+) => {
        LazyLock::new(|| Script::new(concat!(
            include_str!("prelude.lua"),
            "local function store_state() end\n",
            $(include_str!($file)),+
        )))
    };
}

/// Each algorithm's peek.
static TOKEN_BUCKET_PEEK: LazyLock<Script> = peek!("token_bucket_level.lua", "token_bucket.lua");
static FIXED_WINDOW_PEEK: LazyLock<Script> = peek!("fixed_window.lua");
static SLIDING_WINDOW_PEEK: LazyLock<Script> = peek!("sliding_window.lua");
static GCRA_PEEK: LazyLock<Script> = peek!("gcra.lua");

/// A refundable decision's script: the decision's own part run as a function,
/// whose reply to an admission also carries the state it wrote (what the
/// refund compares against). A denial's reply is the decision's.
macro_rules! refundable {
    ($($file:literal),+) => {
        LazyLock::new(|| Script::new(concat!(
            include_str!("prelude.lua"),
            "local function decide()\n",
            $(include_str!($file),)+
            "\nend\nlocal reply = decide()\nif reply[1] == 1 then\n    reply[5] = wrote\nend\nreturn reply\n",
        )))
    };
}

/// Each algorithm's refundable decision and its refund.
static TOKEN_BUCKET_REFUNDABLE: LazyLock<Script> =
    refundable!("token_bucket_level.lua", "token_bucket.lua");
static TOKEN_BUCKET_REFUND: LazyLock<Script> = script!("refund.lua", "token_bucket_refund.lua");
static FIXED_WINDOW_REFUNDABLE: LazyLock<Script> = refundable!("fixed_window.lua");
static FIXED_WINDOW_REFUND: LazyLock<Script> = script!("refund.lua", "fixed_window_refund.lua");
static SLIDING_WINDOW_REFUNDABLE: LazyLock<Script> = refundable!("sliding_window.lua");
static SLIDING_WINDOW_REFUND: LazyLock<Script> = script!("refund.lua", "sliding_window_refund.lua");
static GCRA_REFUNDABLE: LazyLock<Script> = refundable!("gcra.lua");
static GCRA_REFUND: LazyLock<Script> = script!("refund.lua", "gcra_refund.lua");

/// The longest duration a script handles, in microseconds: `2^47` (4.46
/// years), the in-process bound on windows and fill times.
const MAX_MICROS: u64 = 1 << 47;
/// The largest `limit * window` (µs) of a sliding window: its products stay
/// exact below `2^53`.
const MAX_SLIDING_PRODUCT: u128 = 1 << 53;
/// The longest GCRA horizon, in nanoseconds: `2^50` (13 days).
const MAX_GCRA_HORIZON_NANOS: u128 = 1 << 50;
/// Explicit times must be below this many microseconds (2^52 µs from 1970 is
/// the year 2112), so that a time plus any duration above stays below `2^53`.
pub const MAX_EXPLICIT_MICROS: u64 = 1 << 52;

/// An algorithm that has a Redis script: one of the crate's four.
///
/// Built from the algorithm with `From`, so [`RedisLimiter::new`] takes any of
/// them directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisAlgorithm {
    /// The token bucket.
    TokenBucket(TokenBucket),
    /// The fixed window counter.
    FixedWindow(FixedWindow),
    /// The sliding window counter.
    SlidingWindow(SlidingWindow),
    /// The generic cell rate algorithm.
    Gcra(Gcra),
}

impl From<TokenBucket> for RedisAlgorithm {
    fn from(algorithm: TokenBucket) -> Self {
        RedisAlgorithm::TokenBucket(algorithm)
    }
}

impl From<FixedWindow> for RedisAlgorithm {
    fn from(algorithm: FixedWindow) -> Self {
        RedisAlgorithm::FixedWindow(algorithm)
    }
}

impl From<SlidingWindow> for RedisAlgorithm {
    fn from(algorithm: SlidingWindow) -> Self {
        RedisAlgorithm::SlidingWindow(algorithm)
    }
}

impl From<Gcra> for RedisAlgorithm {
    fn from(algorithm: Gcra) -> Self {
        RedisAlgorithm::Gcra(algorithm)
    }
}

/// What the algorithm enforces, as in process: the layer's `RateLimit-Policy`
/// field (`RedisRateLimitLayer::with_derived_policy`, with features `tower`
/// and `tokio`).
impl crate::http::gate::AdvertisedQuota for RedisAlgorithm {
    fn advertised_quota(&self) -> (u32, Duration) {
        match self {
            RedisAlgorithm::TokenBucket(a) => a.advertised_quota(),
            RedisAlgorithm::FixedWindow(a) => a.advertised_quota(),
            RedisAlgorithm::SlidingWindow(a) => a.advertised_quota(),
            RedisAlgorithm::Gcra(a) => a.advertised_quota(),
        }
    }
}

impl RedisAlgorithm {
    /// The most permits one request can get.
    pub fn capacity(&self) -> u32 {
        match self {
            RedisAlgorithm::TokenBucket(a) => a.capacity(),
            RedisAlgorithm::FixedWindow(a) => a.capacity(),
            RedisAlgorithm::SlidingWindow(a) => a.capacity(),
            RedisAlgorithm::Gcra(a) => a.capacity(),
        }
    }

    /// Leased mode's lease and give-back scripts for this algorithm (they
    /// take the decision's parameters, then the lease size, or the lease's
    /// window for a give-back).
    fn lease_scripts(&self) -> (&'static Script, &'static Script) {
        match self {
            RedisAlgorithm::TokenBucket(_) => (&LEASE, &GIVE_BACK),
            RedisAlgorithm::Gcra(_) => (&GCRA_LEASE, &GCRA_GIVE_BACK),
            RedisAlgorithm::FixedWindow(_) => (&FIXED_WINDOW_LEASE, &FIXED_WINDOW_GIVE_BACK),
            RedisAlgorithm::SlidingWindow(_) => (&SLIDING_WINDOW_LEASE, &SLIDING_WINDOW_GIVE_BACK),
        }
    }

    /// The peek's script: the decision's, writing nothing.
    fn peek_script(&self) -> &'static Script {
        match self {
            RedisAlgorithm::TokenBucket(_) => &TOKEN_BUCKET_PEEK,
            RedisAlgorithm::Gcra(_) => &GCRA_PEEK,
            RedisAlgorithm::FixedWindow(_) => &FIXED_WINDOW_PEEK,
            RedisAlgorithm::SlidingWindow(_) => &SLIDING_WINDOW_PEEK,
        }
    }

    /// The script and its parameters, or why the script cannot be exact.
    fn program(&self) -> Result<(&'static Script, Vec<u64>), RedisConfigError> {
        match self {
            RedisAlgorithm::TokenBucket(bucket) => {
                let quota = bucket.quota();
                let fill = quota.fill_time();
                if fill > Duration::from_micros(MAX_MICROS) {
                    return Err(RedisConfigError::TooLong {
                        what: "token bucket fill time",
                        value: fill,
                        max: Duration::from_micros(MAX_MICROS),
                    });
                }
                // Whole time units, as the in-process word keeps them (the
                // state's time is stored in microseconds, read in these).
                let unit = micros(quota.time_unit());
                Ok((
                    &TOKEN_BUCKET,
                    vec![
                        u64::from(quota.capacity()),
                        u64::from(quota.amount()),
                        micros(quota.period()) / unit,
                        micros(fill) / unit,
                        unit,
                    ],
                ))
            }
            RedisAlgorithm::FixedWindow(fixed) => {
                let window = whole_micros(fixed.window())?;
                Ok((&FIXED_WINDOW, vec![u64::from(fixed.limit()), window]))
            }
            RedisAlgorithm::SlidingWindow(sliding) => {
                let window = whole_micros(sliding.window())?;
                let limit = sliding.limit();
                if u128::from(limit) * u128::from(window) >= MAX_SLIDING_PRODUCT {
                    let max_window = (MAX_SLIDING_PRODUCT - 1) / u128::from(limit);
                    return Err(RedisConfigError::SlidingTooWide {
                        limit,
                        window: sliding.window(),
                        max_window: Duration::from_micros(
                            u64::try_from(max_window).unwrap_or(u64::MAX),
                        ),
                    });
                }
                Ok((&SLIDING_WINDOW, vec![u64::from(limit), window]))
            }
            RedisAlgorithm::Gcra(gcra) => {
                let interval = gcra.emission_interval().as_nanos();
                let horizon = interval * u128::from(gcra.capacity());
                if horizon > MAX_GCRA_HORIZON_NANOS {
                    return Err(RedisConfigError::TooLong {
                        what: "GCRA horizon (capacity times the emission interval)",
                        value: Duration::from_nanos(u64::try_from(horizon).unwrap_or(u64::MAX)),
                        max: Duration::from_nanos(MAX_GCRA_HORIZON_NANOS as u64),
                    });
                }
                // Both at most 2^50 by the check above.
                Ok((&GCRA, vec![interval as u64, horizon as u64]))
            }
        }
    }
}

/// A duration's whole microseconds; validated durations fit.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A window in whole microseconds, at most `2^47`.
fn whole_micros(window: Duration) -> Result<u64, RedisConfigError> {
    if !window.subsec_nanos().is_multiple_of(1_000) {
        return Err(RedisConfigError::SubMicrosecondWindow { window });
    }
    let us = micros(window);
    if us > MAX_MICROS {
        return Err(RedisConfigError::TooLong {
            what: "window",
            value: window,
            max: Duration::from_micros(MAX_MICROS),
        });
    }
    Ok(us)
}

/// A rate limit kept in Redis, shared by every process that uses the same
/// name (prefix) and algorithm: one atomic script per decision (exact mode).
///
/// The limiter holds no connection and no state of its own: it is the
/// algorithm's parameters and the key prefix, cheap to clone and to share,
/// and each call takes the connection to use. Every process sharing a limit
/// must build it with the same algorithm and parameters: the state in Redis
/// means what the parameters say it means.
///
/// ```no_run
/// use std::time::Duration;
/// use turnstile::redis::{Deadlines, RedisLimiter};
/// use turnstile::{Decision, FixedWindow};
///
/// let mut con = Deadlines::default().blocking(redis::Client::open("redis://127.0.0.1/")?);
/// let logins = RedisLimiter::new("logins", FixedWindow::new(5, Duration::from_secs(60))?)?;
/// assert_eq!(logins.redis_key("alice"), b"turnstile:{logins}:alice");
/// match logins.try_acquire(&mut con, "alice")? {
///     Decision::Allowed { remaining } => println!("{remaining} attempts left this minute"),
///     Decision::Denied { retry_after } => println!("locked for {:?}", retry_after.duration()),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct RedisLimiter {
    algorithm: RedisAlgorithm,
    capacity: u32,
    script: &'static Script,
    params: Vec<u64>,
    prefix: Vec<u8>,
    /// Added to every expiry, in milliseconds.
    slack_millis: u64,
}

impl RedisLimiter {
    /// A limiter named `name` (its keys start `turnstile:{name}:`) enforcing
    /// `algorithm`.
    ///
    /// # Errors
    ///
    /// [`RedisConfigError::Name`] for an empty name or one with `{` or `}`
    /// (it sits inside the hash tag); the other variants when the algorithm's
    /// arithmetic would not stay exact in Lua's numbers (see the
    /// [module](self#limits-of-the-exact-arithmetic)).
    pub fn new(name: &str, algorithm: impl Into<RedisAlgorithm>) -> Result<Self, RedisConfigError> {
        if name.is_empty() || name.contains(['{', '}']) {
            return Err(RedisConfigError::Name {
                name: name.to_owned(),
            });
        }
        let algorithm = algorithm.into();
        let (script, params) = algorithm.program()?;
        Ok(RedisLimiter {
            algorithm,
            capacity: algorithm.capacity(),
            script,
            params,
            prefix: format!("turnstile:{{{name}}}:").into_bytes(),
            slack_millis: 0,
        })
    }

    /// The same limiter with its keys under `prefix` instead: the key for
    /// client `key` is `prefix` followed by `key`. Without a `{…}` in it, Redis
    /// Cluster hashes each whole key, spreading the limiter over its nodes.
    pub fn with_prefix(mut self, prefix: impl Into<Vec<u8>>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The same limiter with `slack` (whole milliseconds, rounded up) added to
    /// every key's expiry: keys stay that much longer than they need to. Worth
    /// a few seconds when explicit times may run slower than Redis' clock (a
    /// replay) or when a failover may move the keys to a server whose clock is
    /// behind; 0 by default, at most `2^47` µs (4.46 years), the bound on
    /// every duration the scripts keep.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::redis::{RedisConfigError, RedisLimiter};
    /// use turnstile::{Quota, TokenBucket};
    ///
    /// let limiter = RedisLimiter::new("replay", TokenBucket::new(Quota::per_second(10)?))?
    ///     .with_expiry_slack(Duration::from_secs(60))?;
    /// assert_eq!(limiter.expiry_slack(), Duration::from_secs(60));
    /// assert!(matches!(
    ///     limiter.with_expiry_slack(Duration::MAX),
    ///     Err(RedisConfigError::TooLong { what: "expiry slack", .. })
    /// ));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`RedisConfigError::TooLong`] for a slack over `2^47` µs: Redis would
    /// refuse, or Lua would round, the expiry it adds to.
    pub fn with_expiry_slack(mut self, slack: Duration) -> Result<Self, RedisConfigError> {
        let max = Duration::from_micros(MAX_MICROS);
        if slack > max {
            return Err(RedisConfigError::TooLong {
                what: "expiry slack",
                value: slack,
                max,
            });
        }
        // At most 2^47 µs: the milliseconds fit.
        self.slack_millis = u64::try_from(slack.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
        Ok(self)
    }

    /// The time added to every key's expiry.
    pub fn expiry_slack(&self) -> Duration {
        Duration::from_millis(self.slack_millis)
    }

    /// The prefix of this limiter's keys.
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// The algorithm this limiter enforces.
    pub fn algorithm(&self) -> &RedisAlgorithm {
        &self.algorithm
    }

    /// The most permits one request can get.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The Redis key holding `key`'s state.
    pub fn redis_key(&self, key: impl AsRef<[u8]>) -> Vec<u8> {
        let key = key.as_ref();
        let mut full = Vec::with_capacity(self.prefix.len() + key.len());
        full.extend_from_slice(&self.prefix);
        full.extend_from_slice(key);
        full
    }

    /// Ask for one permit for `key`, on Redis' clock.
    ///
    /// # Errors
    ///
    /// [`RedisLimitError::Redis`] when the call fails (the decision may or may
    /// not have been made), [`RedisLimitError::Reply`] for a reply that is not
    /// the script's.
    pub fn try_acquire(
        &self,
        con: &mut dyn ConnectionLike,
        key: impl AsRef<[u8]>,
    ) -> Result<Decision, RedisLimitError> {
        self.try_acquire_n(con, key, 1)
    }

    /// Ask for `n` permits for `key`, all or nothing, on Redis' clock.
    ///
    /// # Errors
    ///
    /// [`RedisLimitError::Acquire`] for `n = 0` or `n` above the capacity,
    /// before anything is sent; otherwise as [`try_acquire`](Self::try_acquire).
    pub fn try_acquire_n(
        &self,
        con: &mut dyn ConnectionLike,
        key: impl AsRef<[u8]>,
        n: u32,
    ) -> Result<Decision, RedisLimitError> {
        let invocation = self.invocation(key.as_ref(), n, None)?;
        self.decide(invocation.invoke(con))
    }

    /// Ask for `n` permits for `key` at `now_micros` microseconds since the
    /// epoch the caller's times share (the Unix epoch, to mix with calls on
    /// Redis' clock): for tests and replays.
    ///
    /// # Errors
    ///
    /// [`RedisLimitError::Time`] when `now_micros` is at or above
    /// [`MAX_EXPLICIT_MICROS`]; otherwise as [`try_acquire_n`](Self::try_acquire_n).
    pub fn try_acquire_n_at(
        &self,
        con: &mut dyn ConnectionLike,
        key: impl AsRef<[u8]>,
        n: u32,
        now_micros: u64,
    ) -> Result<Decision, RedisLimitError> {
        let invocation = self.invocation(key.as_ref(), n, Some(now_micros))?;
        self.decide(invocation.invoke(con))
    }

    /// [`try_acquire`](Self::try_acquire) on an asynchronous connection
    /// (feature `tokio` too).
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    #[cfg(feature = "tokio")]
    pub async fn try_acquire_async<C: ::redis::aio::ConnectionLike>(
        &self,
        con: &mut C,
        key: impl AsRef<[u8]>,
    ) -> Result<Decision, RedisLimitError> {
        self.try_acquire_n_async(con, key, 1).await
    }

    /// [`try_acquire_n`](Self::try_acquire_n) on an asynchronous connection
    /// (feature `tokio` too).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n).
    #[cfg(feature = "tokio")]
    pub async fn try_acquire_n_async<C: ::redis::aio::ConnectionLike>(
        &self,
        con: &mut C,
        key: impl AsRef<[u8]>,
        n: u32,
    ) -> Result<Decision, RedisLimitError> {
        let invocation = self.invocation(key.as_ref(), n, None)?;
        self.decide(invocation.invoke_async(con).await)
    }

    /// [`try_acquire_n_at`](Self::try_acquire_n_at) on an asynchronous
    /// connection (feature `tokio` too).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n_at`](Self::try_acquire_n_at).
    #[cfg(feature = "tokio")]
    pub async fn try_acquire_n_at_async<C: ::redis::aio::ConnectionLike>(
        &self,
        con: &mut C,
        key: impl AsRef<[u8]>,
        n: u32,
        now_micros: u64,
    ) -> Result<Decision, RedisLimitError> {
        let invocation = self.invocation(key.as_ref(), n, Some(now_micros))?;
        self.decide(invocation.invoke_async(con).await)
    }

    /// The decision `n` permits for `key` would get now, on Redis' clock,
    /// taking nothing: the same `remaining` and exact wait as
    /// [`try_acquire_n`](Self::try_acquire_n) at that moment, from one
    /// script that reads the key and writes nothing (a key never asked for
    /// stays absent). For a check before the work whose cost is charged
    /// after it (Envoy's `hits_addend` of 0).
    ///
    /// ```no_run
    /// use turnstile::redis::{Deadlines, RedisLimiter};
    /// use turnstile::{Quota, TokenBucket};
    ///
    /// let mut con = Deadlines::default().blocking(redis::Client::open("redis://127.0.0.1/")?);
    /// let tokens = RedisLimiter::new("llm", TokenBucket::new(Quota::per_minute(10_000)?))?;
    /// if tokens.peek_n(&mut con, "team-a", 1)?.is_allowed() {
    ///     // ... run the request, then charge what it used:
    ///     let used = 1_200;
    ///     let _ = tokens.try_acquire_n(&mut con, "team-a", used)?;
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n).
    pub fn peek_n(
        &self,
        con: &mut dyn ConnectionLike,
        key: impl AsRef<[u8]>,
        n: u32,
    ) -> Result<Decision, RedisLimitError> {
        let invocation = self.peek_invocation(key.as_ref(), n, None)?;
        self.decide(invocation.invoke(con))
    }

    /// [`peek_n`](Self::peek_n) at `now_micros`, as
    /// [`try_acquire_n_at`](Self::try_acquire_n_at).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n_at`](Self::try_acquire_n_at).
    pub fn peek_n_at(
        &self,
        con: &mut dyn ConnectionLike,
        key: impl AsRef<[u8]>,
        n: u32,
        now_micros: u64,
    ) -> Result<Decision, RedisLimitError> {
        let invocation = self.peek_invocation(key.as_ref(), n, Some(now_micros))?;
        self.decide(invocation.invoke(con))
    }

    /// [`peek_n`](Self::peek_n) on an asynchronous connection (feature
    /// `tokio` too).
    ///
    /// # Errors
    ///
    /// As [`peek_n`](Self::peek_n).
    #[cfg(feature = "tokio")]
    pub async fn peek_n_async<C: ::redis::aio::ConnectionLike>(
        &self,
        con: &mut C,
        key: impl AsRef<[u8]>,
        n: u32,
    ) -> Result<Decision, RedisLimitError> {
        let invocation = self.peek_invocation(key.as_ref(), n, None)?;
        self.decide(invocation.invoke_async(con).await)
    }

    /// The peek's script call for `n` permits for `key`.
    fn peek_invocation(
        &self,
        key: &[u8],
        n: u32,
        now_micros: Option<u64>,
    ) -> Result<ScriptInvocation<'static>, RedisLimitError> {
        self.invocation_of(
            self.algorithm.peek_script(),
            self.redis_key(key),
            n,
            now_micros,
        )
    }

    /// The script call for `n` permits for `key`, after every check that needs
    /// no round trip.
    ///
    /// `invoke` sends EVALSHA and, only on a `NOSCRIPT` error, loads the script
    /// and sends it again. That retry cannot count a decision twice: `NOSCRIPT`
    /// means Redis did not find the script, so nothing ran. Any other failure
    /// (a timeout above all, after which the script may have run) is returned
    /// as it is, never retried.
    fn invocation(
        &self,
        key: &[u8],
        n: u32,
        now_micros: Option<u64>,
    ) -> Result<ScriptInvocation<'static>, RedisLimitError> {
        self.invocation_of(self.script, self.redis_key(key), n, now_micros)
    }

    /// [`invocation`](Self::invocation) of `script` (the decision's, or its
    /// refundable twin) on the Redis key `full_key`.
    fn invocation_of(
        &self,
        script: &'static Script,
        full_key: Vec<u8>,
        n: u32,
        now_micros: Option<u64>,
    ) -> Result<ScriptInvocation<'static>, RedisLimitError> {
        if n == 0 {
            return Err(AcquireError::ZeroPermits.into());
        }
        if n > self.capacity {
            return Err(AcquireError::InsufficientCapacity {
                requested: n,
                capacity: self.capacity,
            }
            .into());
        }
        let mut invocation = script.prepare_invoke();
        invocation.key(full_key);
        match now_micros {
            Some(now) if now >= MAX_EXPLICIT_MICROS => {
                return Err(RedisLimitError::Time { now_micros: now });
            }
            Some(now) => invocation.arg(now),
            None => invocation.arg(""),
        };
        invocation.arg(n).arg(self.slack_millis);
        for param in &self.params {
            invocation.arg(*param);
        }
        Ok(invocation)
    }

    fn decide(&self, reply: ::redis::RedisResult<Value>) -> Result<Decision, RedisLimitError> {
        parse_reply(&reply?, self.capacity)
    }
}

/// The script's reply, `{allowed, remaining, wait_us, wait_ns}`, as a
/// decision; anything else is a [`RedisLimitError::Reply`].
fn parse_reply(reply: &Value, capacity: u32) -> Result<Decision, RedisLimitError> {
    let Value::Array(items) = reply else {
        return Err(bad_reply(reply));
    };
    parse_items(reply, items, capacity)
}

/// A reply that is not the script's.
fn bad_reply(reply: &Value) -> RedisLimitError {
    RedisLimitError::Reply {
        reply: format!("{reply:?}"),
    }
}

/// [`parse_reply`] on the reply's `items`.
fn parse_items(reply: &Value, items: &[Value], capacity: u32) -> Result<Decision, RedisLimitError> {
    let bad = || bad_reply(reply);
    let [
        Value::Int(allowed),
        Value::Int(remaining),
        Value::Int(us),
        Value::Int(ns),
    ] = items
    else {
        return Err(bad());
    };
    match allowed {
        1 => match u32::try_from(*remaining) {
            Ok(remaining) if remaining <= capacity => Ok(Decision::Allowed { remaining }),
            _ => Err(bad()),
        },
        0 => {
            if !(-999..=999).contains(ns) {
                return Err(bad());
            }
            // A wait below 0 ns is 0; one beyond u64 nanoseconds saturates,
            // as in process.
            let nanos = i128::from(*us) * 1_000 + i128::from(*ns);
            let nanos = u64::try_from(nanos.max(0)).unwrap_or(u64::MAX);
            Ok(Decision::Denied {
                retry_after: RetryAfter::from_nanos(nanos),
            })
        }
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Quota;

    fn array(values: &[i64]) -> Value {
        Value::Array(values.iter().map(|v| Value::Int(*v)).collect())
    }

    #[test]
    fn replies_become_decisions() {
        assert_eq!(
            parse_reply(&array(&[1, 4, 0, 0]), 5).unwrap(),
            Decision::Allowed { remaining: 4 }
        );
        assert_eq!(
            parse_reply(&array(&[0, 0, 700, -1]), 5).unwrap(),
            Decision::Denied {
                retry_after: RetryAfter::from_nanos(699_999)
            }
        );
        assert_eq!(
            parse_reply(&array(&[0, 0, -5, 0]), 5).unwrap(),
            Decision::Denied {
                retry_after: RetryAfter::from_nanos(0)
            }
        );
        assert_eq!(
            parse_reply(&array(&[0, 0, i64::MAX, 0]), 5).unwrap(),
            Decision::Denied {
                retry_after: RetryAfter::from_nanos(u64::MAX)
            }
        );
    }

    #[test]
    fn any_other_reply_is_an_error_not_a_panic() {
        let replies = [
            Value::Nil,
            Value::Okay,
            Value::Int(1),
            Value::BulkString(b"1".to_vec()),
            array(&[]),
            array(&[1, 2, 3]),
            array(&[1, 2, 3, 4, 5]),
            array(&[2, 0, 0, 0]),
            array(&[-1, 0, 0, 0]),
            array(&[1, 6, 0, 0]),
            array(&[1, -1, 0, 0]),
            array(&[0, 0, 1, 1_000]),
            Value::Array(vec![
                Value::Int(1),
                Value::Nil,
                Value::Int(0),
                Value::Int(0),
            ]),
        ];
        for reply in replies {
            assert!(
                matches!(parse_reply(&reply, 5), Err(RedisLimitError::Reply { .. })),
                "{reply:?}"
            );
        }
    }

    #[test]
    fn the_default_prefix_is_a_hash_tag_on_the_name() {
        let quota = Quota::per_second(10).unwrap();
        let limiter = RedisLimiter::new("api", TokenBucket::new(quota)).unwrap();
        assert_eq!(limiter.prefix(), b"turnstile:{api}:");
        assert_eq!(limiter.redis_key("alice"), b"turnstile:{api}:alice");
        let spread = limiter.with_prefix("rl:api:");
        assert_eq!(spread.redis_key(b"bob"), b"rl:api:bob");
        for name in ["", "a{b", "a}b"] {
            assert!(matches!(
                RedisLimiter::new(name, TokenBucket::new(quota)),
                Err(RedisConfigError::Name { .. })
            ));
        }
    }

    #[test]
    fn configurations_past_exact_lua_arithmetic_are_refused() {
        let sub_micro = FixedWindow::new(10, Duration::from_nanos(1_500)).unwrap();
        assert_eq!(
            RedisLimiter::new("x", sub_micro).unwrap_err(),
            RedisConfigError::SubMicrosecondWindow {
                window: Duration::from_nanos(1_500)
            }
        );
        // 65,535 per 38 hours fits; per 39 hours does not.
        let hour = Duration::from_secs(3_600);
        assert!(RedisLimiter::new("x", SlidingWindow::new(65_535, 38 * hour).unwrap()).is_ok());
        assert!(matches!(
            RedisLimiter::new("x", SlidingWindow::new(65_535, 39 * hour).unwrap()),
            Err(RedisConfigError::SlidingTooWide { limit: 65_535, .. })
        ));
        // A GCRA horizon of 13 days fits, 14 does not.
        let day = 24 * hour;
        let gcra = |days| Gcra::new(Quota::new(days, 1, day).unwrap());
        assert!(RedisLimiter::new("x", gcra(13)).is_ok());
        assert!(matches!(
            RedisLimiter::new("x", gcra(14)),
            Err(RedisConfigError::TooLong { .. })
        ));
        // A fill time of 5 years is past 2^47 µs.
        let slow = Quota::new(5, 1, 365 * day).unwrap();
        assert!(matches!(
            RedisLimiter::new("x", TokenBucket::new(slow)),
            Err(RedisConfigError::TooLong { .. })
        ));
    }

    #[test]
    fn requests_that_can_never_succeed_fail_before_any_call() {
        let limiter =
            RedisLimiter::new("x", TokenBucket::new(Quota::per_second(3).unwrap())).unwrap();
        assert!(matches!(
            limiter.invocation(b"k", 0, None),
            Err(RedisLimitError::Acquire(AcquireError::ZeroPermits))
        ));
        assert!(matches!(
            limiter.invocation(b"k", 4, None),
            Err(RedisLimitError::Acquire(
                AcquireError::InsufficientCapacity {
                    requested: 4,
                    capacity: 3
                }
            ))
        ));
        assert!(matches!(
            limiter.invocation(b"k", 1, Some(MAX_EXPLICIT_MICROS)),
            Err(RedisLimitError::Time { .. })
        ));
        assert!(
            limiter
                .invocation(b"k", 3, Some(MAX_EXPLICIT_MICROS - 1))
                .is_ok()
        );
    }
}
