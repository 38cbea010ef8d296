//! The HTTP gate, independent of any framework: a request's key in, a status
//! and headers out.

use core::borrow::Borrow;
use core::fmt;
use core::hash::{BuildHasher, Hash};
use core::time::Duration;

use crate::algorithm::Algorithm;
use crate::algorithm::fixed_window::FixedWindow;
use crate::algorithm::gcra::Gcra;
use crate::algorithm::sliding_window::SlidingWindow;
use crate::algorithm::token_bucket::TokenBucket;
use crate::clock::Clock;
use crate::decision::{KeyedDecision, RetryAfter};
use crate::error::AcquireError;
use crate::keyed::tiered::Tiered;
use crate::keyed::{KeyedLimiter, KeyedStats};
use crate::limiter::{Counter, RateLimiter};
use crate::quota::Quota;
use crate::reclaim::thread_slot;
use crate::sync::{AtomicBool, Ordering};
use crate::tally::Tally;

/// What the gate answers a request.
///
/// Its [`Display`](fmt::Display) is the rate-limiter pattern's trace format:
/// `200 OK (tokens left 2)`, `429 Too Many Requests, Retry-After: 1`,
/// `401 Unauthorized`, `503 Service Unavailable, Retry-After: 3`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use = "a denied request must not reach the work it would start"]
pub enum Outcome {
    /// 200: admitted, with `remaining` permits left for the key.
    Admitted {
        /// Permits left for the key.
        remaining: u32,
    },
    /// 401: the request carried no key, so there is no allowance to charge it
    /// to. (Authenticating the key is the caller's job.)
    Unauthorized,
    /// 429: the key is over its limit; retry after the wait, which the
    /// `Retry-After` header gives in whole seconds, rounded up.
    TooManyRequests {
        /// The exact wait.
        retry_after: RetryAfter,
    },
    /// 503: the limiter holds as many keys as it may
    /// ([`KeyedDecision::KeyLimit`]); a new key can be tracked once idle ones
    /// have been swept. Not the client's fault, so not a 429.
    Unavailable {
        /// When idle keys will have been swept.
        retry_after: RetryAfter,
    },
}

impl Outcome {
    /// The outcome for a request with `decision`, or with no key (`None`).
    pub const fn from_decision(decision: Option<KeyedDecision>) -> Outcome {
        match decision {
            None => Outcome::Unauthorized,
            Some(KeyedDecision::Allowed { remaining }) => Outcome::Admitted { remaining },
            Some(KeyedDecision::Denied { retry_after }) => Outcome::TooManyRequests { retry_after },
            Some(KeyedDecision::KeyLimit { retry_after }) => Outcome::Unavailable { retry_after },
        }
    }

    /// The HTTP status code: 200, 401, 429 or 503.
    pub const fn status(&self) -> u16 {
        match self {
            Outcome::Admitted { .. } => 200,
            Outcome::Unauthorized => 401,
            Outcome::TooManyRequests { .. } => 429,
            Outcome::Unavailable { .. } => 503,
        }
    }

    /// The status's reason phrase.
    pub const fn reason(&self) -> &'static str {
        match self {
            Outcome::Admitted { .. } => "OK",
            Outcome::Unauthorized => "Unauthorized",
            Outcome::TooManyRequests { .. } => "Too Many Requests",
            Outcome::Unavailable { .. } => "Service Unavailable",
        }
    }

    /// `true` for 200: let the request through.
    pub const fn is_admitted(&self) -> bool {
        matches!(self, Outcome::Admitted { .. })
    }

    /// The wait, for 429 and 503.
    pub const fn retry_after(&self) -> Option<RetryAfter> {
        match self {
            Outcome::TooManyRequests { retry_after } | Outcome::Unavailable { retry_after } => {
                Some(*retry_after)
            }
            Outcome::Admitted { .. } | Outcome::Unauthorized => None,
        }
    }

    /// The `Retry-After` value in whole seconds, rounded up (a client told to
    /// come back early only gets another 429), for 429 and 503.
    pub const fn retry_after_secs(&self) -> Option<u64> {
        match self.retry_after() {
            Some(wait) => Some(wait.header_secs()),
            None => None,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.status(), self.reason())?;
        match (self, self.retry_after_secs()) {
            (Outcome::Admitted { remaining }, _) => write!(f, " (tokens left {remaining})"),
            (_, Some(secs)) => write!(f, ", Retry-After: {secs}"),
            (_, None) => Ok(()),
        }
    }
}

/// A policy name, quota and window for the `RateLimit-Policy` and `RateLimit`
/// header fields of the IETF httpapi draft ("RateLimit header fields for
/// HTTP"): `RateLimit-Policy: "name";q=100;w=60` and
/// `RateLimit: "name";r=42` (with `;t=` the seconds to wait, on a denial).
///
/// In the draft, `q` is the quota (units, here permits) the policy allocates
/// and `w` the window in seconds over which it applies: a client that sends at
/// most `q` units in any `w` seconds is not refused.
/// [`from_algorithm`](RateLimitPolicy::from_algorithm) derives both from the
/// limiter's algorithm ([`AdvertisedQuota`]), so that they cannot drift from
/// what is enforced; [`new`](RateLimitPolicy::new) states them by hand.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Quota, RateLimitPolicy, TokenBucket};
///
/// // A bucket of 3 that gains one token every 10 s: a burst of 3 is always
/// // back 30 s later, and nothing larger is ever promised.
/// let bucket = TokenBucket::new(Quota::new(3, 1, Duration::from_secs(10))?);
/// let policy = RateLimitPolicy::from_algorithm("api", &bucket)?;
/// assert_eq!(policy.policy_value(), "\"api\";q=3;w=30");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimitPolicy {
    name: String,
    quota: u32,
    window_secs: u64,
}

/// Why a [`RateLimitPolicy`] was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyError {
    /// The name must be 1 to 64 characters from `A-Z a-z 0-9 _ - .`, so that
    /// it is safe inside a quoted header string.
    Name(String),
    /// The window must be at least one second (the fields count whole seconds).
    Window(Duration),
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::Name(name) => write!(
                f,
                "policy name {name:?}: use 1 to 64 characters from A-Z, a-z, 0-9, '_', '-', '.'"
            ),
            PolicyError::Window(window) => {
                write!(f, "policy window {window:?}: it must be at least 1 second")
            }
        }
    }
}

impl std::error::Error for PolicyError {}

impl RateLimitPolicy {
    /// A policy called `name` of `quota` units per `window` (whole seconds,
    /// rounded up).
    ///
    /// # Errors
    ///
    /// [`PolicyError::Name`] for a name that could break the header's syntax,
    /// [`PolicyError::Window`] for a window under one second.
    pub fn new(name: &str, quota: u32, window: Duration) -> Result<RateLimitPolicy, PolicyError> {
        let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
        if name.is_empty() || name.len() > 64 || !name.chars().all(valid) {
            return Err(PolicyError::Name(name.chars().take(80).collect()));
        }
        if window < Duration::from_secs(1) {
            return Err(PolicyError::Window(window));
        }
        Ok(RateLimitPolicy {
            name: name.to_string(),
            quota,
            window_secs: window
                .as_secs()
                .saturating_add(u64::from(window.subsec_nanos() > 0)),
        })
    }

    /// A policy called `name` that advertises what `algorithm` enforces
    /// ([`AdvertisedQuota`]): `q` the largest burst it always admits and `w`
    /// the time after which that burst is always admitted again, rounded up to
    /// whole seconds (a longer window for the same quota only promises less).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Quota, RateLimitPolicy};
    ///
    /// let per_second = RateLimitPolicy::from_algorithm("burst", &Quota::per_second(100)?.burst(20)?)?;
    /// // 20 at once, refilled in 200 ms: advertised over a whole second.
    /// assert_eq!(per_second.policy_value(), "\"burst\";q=20;w=1");
    /// let window = FixedWindow::new(50, Duration::from_secs(60))?;
    /// assert_eq!(RateLimitPolicy::from_algorithm("w", &window)?.policy_value(), "\"w\";q=50;w=60");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`PolicyError::Name`] as for [`new`](RateLimitPolicy::new).
    pub fn from_algorithm(
        name: &str,
        algorithm: &impl AdvertisedQuota,
    ) -> Result<RateLimitPolicy, PolicyError> {
        let (quota, window) = algorithm.advertised_quota();
        // Every algorithm's window is positive; a sub-second one is advertised
        // as one second (the fields count whole seconds).
        RateLimitPolicy::new(name, quota, window.max(Duration::from_secs(1)))
    }

    /// The `RateLimit-Policy` field value.
    pub fn policy_value(&self) -> String {
        format!("\"{}\";q={};w={}", self.name, self.quota, self.window_secs)
    }

    /// The `RateLimit` field value for `outcome`: the units left, and on a
    /// denial the seconds until the request could succeed. `None` for 401.
    pub fn value(&self, outcome: &Outcome) -> Option<String> {
        match outcome {
            Outcome::Admitted { remaining } => Some(format!("\"{}\";r={remaining}", self.name)),
            Outcome::Unauthorized => None,
            Outcome::TooManyRequests { retry_after } | Outcome::Unavailable { retry_after } => {
                Some(format!(
                    "\"{}\";r=0;t={}",
                    self.name,
                    retry_after.header_secs()
                ))
            }
        }
    }
}

/// An algorithm whose limit can be advertised in a `RateLimit-Policy` field:
/// the quota `q` and window `w` of [`RateLimitPolicy::from_algorithm`].
///
/// The pair must never promise more than the algorithm allows: a client that
/// sends `q` permits at once, and again each time `w` has passed, must never
/// be refused. `q` can be no larger than the largest burst (the capacity), so
/// each implementation advertises its capacity over the shortest window after
/// which that burst is certain to be available again:
///
/// - a token bucket ([`Quota`], [`TokenBucket`]): `q = capacity`,
///   `w = fill_time = ceil(capacity / amount) * period`, since a bucket
///   emptied at `t` has gained at least `capacity` tokens by `t + w`;
/// - [`Gcra`]: `q = capacity`, `w` the larger of the fill time and
///   `capacity` emission intervals (the interval is rounded up to whole
///   nanoseconds);
/// - [`FixedWindow`]: `q = limit`, `w = window`: two instants one window
///   apart lie in different windows;
/// - [`SlidingWindow`]: `q = limit`, `w = 2 * window`: one window later the
///   previous window's count still weighs fully, two windows later it is gone.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{AdvertisedQuota, Quota, SlidingWindow};
///
/// let bucket = Quota::new(5, 2, Duration::from_secs(10))?; // full again 30 s after a burst
/// assert_eq!(bucket.advertised_quota(), (5, Duration::from_secs(30)));
/// let sliding = SlidingWindow::new(10, Duration::from_secs(60))?;
/// assert_eq!(sliding.advertised_quota(), (10, Duration::from_secs(120)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait AdvertisedQuota {
    /// `(q, w)`: the permits a client may send at once, and the time after
    /// which it may do so again.
    fn advertised_quota(&self) -> (u32, Duration);
}

impl AdvertisedQuota for Quota {
    fn advertised_quota(&self) -> (u32, Duration) {
        (self.capacity(), self.fill_time())
    }
}

impl AdvertisedQuota for TokenBucket {
    fn advertised_quota(&self) -> (u32, Duration) {
        self.quota().advertised_quota()
    }
}

impl AdvertisedQuota for Gcra {
    fn advertised_quota(&self) -> (u32, Duration) {
        let quota = self.quota();
        let intervals = self.emission_interval().saturating_mul(quota.capacity());
        (quota.capacity(), quota.fill_time().max(intervals))
    }
}

impl AdvertisedQuota for FixedWindow {
    fn advertised_quota(&self) -> (u32, Duration) {
        (self.limit(), self.window())
    }
}

impl AdvertisedQuota for SlidingWindow {
    fn advertised_quota(&self) -> (u32, Duration) {
        (self.limit(), self.window().saturating_mul(2))
    }
}

/// A per-key limiter as an HTTP gate: no key is a 401, a key over its limit a
/// 429 with `Retry-After` in whole seconds rounded up, a new key past the key
/// bound a 503 with `Retry-After`; `RateLimit` header fields optionally.
///
/// ```
/// use turnstile::{Gate, KeyedLimiter, Outcome, Quota};
///
/// let gate = Gate::new(KeyedLimiter::<String>::new(Quota::per_second(2)?));
/// assert_eq!(gate.check(Some("alice")).status(), 200);
/// assert_eq!(gate.check(None::<&str>), Outcome::Unauthorized);
///
/// let outcome = gate.check(Some("alice"));
/// let outcome = if outcome.is_admitted() { gate.check(Some("alice")) } else { outcome };
/// assert_eq!(outcome.status(), 429);
/// assert_eq!(gate.headers(&outcome), vec![("Retry-After", "1".to_string())]);
/// # Ok::<(), turnstile::QuotaError>(())
/// ```
///
/// **Choosing the key.** Use an authenticated key (an API key or user id
/// checked before the gate) where there is one. The peer address is the
/// fallback for anonymous traffic, but users behind one NAT share it. A
/// forwarded header (`X-Forwarded-For`) is client input: trust it only from
/// proxies you run, or any client can claim a fresh address per request and
/// never be limited. Keys from unauthenticated input can be forged in any
/// number, so give them a limiter with a tight `max_keys`: past it, new keys get
/// 503 and memory stays bounded.
///
/// **Counting and shadow mode.** [`stats`](Self::stats) counts what the gate
/// answered (200, 401, 429, 503) with no locked instruction per request, in
/// per-thread counters of its own: decisions made on the limiter directly
/// ([`limiter`](Self::limiter), [`tiers`](Self::tiers)) are not among them.
/// In shadow mode ([`shadow`](Self::shadow),
/// [`set_shadow`](Self::set_shadow)) every denial is decided and counted but
/// answered 200 (with `remaining: 0`): a way to try a limit on live traffic
/// before enforcing it.
///
/// **Tiers.** [`Gate::tiered`] puts a [`Tiered`] set of keyed limiters
/// (different quotas for different keys) behind the gate instead of one
/// limiter; `L`, the limiter's type, is then that `Tiered`.
///
/// ```
/// use turnstile::{Gate, KeyedLimiter, Quota, Tiered};
///
/// let tiers = Tiered::new(
///     [
///         ("free", KeyedLimiter::<String>::new(Quota::per_minute(1)?)),
///         ("paid", KeyedLimiter::<String>::new(Quota::per_minute(100)?)),
///     ],
///     |key: &str| usize::from(key.starts_with("paid_")),
/// )?;
/// let gate = Gate::tiered(tiers);
/// assert_eq!(gate.check(Some("free_1")).status(), 200);
/// assert_eq!(gate.check(Some("free_1")).status(), 429);
/// assert_eq!(gate.check(Some("paid_1")).status(), 200);
/// assert_eq!(gate.check(Some("paid_1")).status(), 200);
/// assert_eq!(gate.stats().too_many_requests, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Gate<L = KeyedLimiter<String>> {
    limiter: L,
    policy: Option<RateLimitPolicy>,
    shadow: AtomicBool,
    counts: Tally<6>,
}

/// The gate's own counters, beside the limiter's.
const UNAUTHORIZED: usize = 0;
const SHADOWED_RATE: usize = 1;
const SHADOWED_KEY_LIMIT: usize = 2;
const TOO_MANY: usize = 3;
const UNAVAILABLE: usize = 4;
const ADMITTED: usize = 5;

/// What a [`Gate`] answered ([`Gate::stats`]). Each counter is read in turn,
/// not all at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GateStats {
    /// 200s: requests admitted, including denials let through in shadow mode.
    pub admitted: u64,
    /// 401s: requests without a key.
    pub unauthorized: u64,
    /// 429s: requests over their key's limit.
    pub too_many_requests: u64,
    /// 503s: requests for a new key while the key bound was full.
    pub unavailable: u64,
    /// Requests the limiter denied (429) that shadow mode admitted.
    pub shadowed_too_many_requests: u64,
    /// Requests the key bound refused (503) that shadow mode admitted.
    pub shadowed_unavailable: u64,
    /// Keys held now.
    pub keys: usize,
    /// Keys evicted by sweeps.
    pub evicted: u64,
}

/// What a [`Gate`] decides with, for keys looked up as `Q`: a
/// [`KeyedLimiter`] ([`Gate::new`]) or a [`Tiered`] set of them
/// ([`Gate::tiered`]). Sealed: implemented for those two only.
pub trait GateLimiter<Q: ?Sized>: LimiterStats {
    /// One permit for `key`.
    #[doc(hidden)]
    fn acquire(&self, key: &Q) -> KeyedDecision;
    /// `n` permits for `key`.
    #[doc(hidden)]
    fn acquire_n(&self, key: &Q, n: u32) -> Result<KeyedDecision, AcquireError>;
}

/// The counts of the limiter behind a [`Gate`] (for a [`Tiered`] set,
/// summed over its tiers). Sealed: implemented for [`KeyedLimiter`] and
/// [`Tiered`] only.
pub trait LimiterStats: sealed::Sealed {
    /// The counts now.
    #[doc(hidden)]
    fn limiter_stats(&self) -> KeyedStats;
}

mod sealed {
    pub trait Sealed {}
    impl<K, A, C, S> Sealed for crate::keyed::KeyedLimiter<K, A, C, S> {}
    impl<K, F, A, C, S> Sealed for crate::keyed::tiered::Tiered<K, F, A, C, S> {}
    impl<A, C, M> Sealed for crate::limiter::RateLimiter<A, C, M> {}
}

impl<K, A, C, S> LimiterStats for KeyedLimiter<K, A, C, S>
where
    K: Hash + Eq,
    A: Algorithm,
    C: Clock,
    S: BuildHasher,
{
    fn limiter_stats(&self) -> KeyedStats {
        self.stats()
    }
}

impl<K, A, C, S, Q> GateLimiter<Q> for KeyedLimiter<K, A, C, S>
where
    K: Hash + Eq + Borrow<Q>,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    A: Algorithm,
    C: Clock,
    S: BuildHasher,
{
    #[inline]
    fn acquire(&self, key: &Q) -> KeyedDecision {
        self.try_acquire(key)
    }

    #[inline]
    fn acquire_n(&self, key: &Q, n: u32) -> Result<KeyedDecision, AcquireError> {
        self.try_acquire_n(key, n)
    }
}

impl<K, F, A, C, S> LimiterStats for Tiered<K, F, A, C, S>
where
    K: Hash + Eq,
    A: Algorithm,
    C: Clock,
    S: BuildHasher,
{
    fn limiter_stats(&self) -> KeyedStats {
        let mut sum = KeyedStats::default();
        for (_, stats) in self.tier_stats() {
            sum.keys += stats.keys;
            sum.admitted += stats.admitted;
            sum.denied += stats.denied;
            sum.denied_key_limit += stats.denied_key_limit;
            sum.evicted += stats.evicted;
        }
        sum
    }
}

impl<K, F, A, C, S, Q> GateLimiter<Q> for Tiered<K, F, A, C, S>
where
    F: Fn(&Q) -> usize,
    K: Hash + Eq + Borrow<Q>,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    A: Algorithm,
    C: Clock,
    S: BuildHasher,
{
    #[inline]
    fn acquire(&self, key: &Q) -> KeyedDecision {
        self.try_acquire(key)
    }

    #[inline]
    fn acquire_n(&self, key: &Q, n: u32) -> Result<KeyedDecision, AcquireError> {
        self.try_acquire_n(key, n)
    }
}

impl<A, C, M> LimiterStats for RateLimiter<A, C, M>
where
    A: Algorithm,
    C: Clock,
    M: Counter,
{
    /// No keys, no evictions: the gate counts its own answers.
    fn limiter_stats(&self) -> KeyedStats {
        KeyedStats::default()
    }
}

/// Every key, and a request without one, is decided by the one limiter: a
/// limit on the whole service. (A request without a key is still a 401: the
/// gate answers that before asking the limiter.)
impl<A, C, M, Q> GateLimiter<Q> for RateLimiter<A, C, M>
where
    A: Algorithm,
    C: Clock,
    M: Counter,
    Q: ?Sized,
{
    #[inline]
    fn acquire(&self, _key: &Q) -> KeyedDecision {
        self.try_acquire().into()
    }

    #[inline]
    fn acquire_n(&self, _key: &Q, n: u32) -> Result<KeyedDecision, AcquireError> {
        self.try_acquire_n(n).map(Into::into)
    }
}

impl<K, A: AdvertisedQuota, C, S> Gate<KeyedLimiter<K, A, C, S>> {
    /// Add `RateLimit-Policy` and `RateLimit` header fields derived from the
    /// limiter's algorithm ([`RateLimitPolicy::from_algorithm`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Gate, KeyedLimiter, Quota};
    ///
    /// let limiter = KeyedLimiter::<String>::new(Quota::new(3, 1, Duration::from_secs(10))?);
    /// let gate = Gate::new(limiter).with_derived_policy("api")?;
    /// assert_eq!(gate.policy().unwrap().policy_value(), "\"api\";q=3;w=30");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`PolicyError::Name`] for a name that could break the header's syntax.
    pub fn with_derived_policy(self, name: &str) -> Result<Self, PolicyError> {
        let policy = RateLimitPolicy::from_algorithm(name, self.limiter.algorithm())?;
        Ok(self.with_policy(policy))
    }
}

impl<A: AdvertisedQuota + Algorithm, C: Clock, M: Counter> Gate<RateLimiter<A, C, M>> {
    /// Add `RateLimit-Policy` and `RateLimit` header fields derived from the
    /// limiter's algorithm, as for a keyed limiter: the quota is the whole
    /// service's.
    ///
    /// ```
    /// use turnstile::{Gate, Quota, RateLimiter};
    ///
    /// let gate = Gate::new(RateLimiter::new(Quota::per_second(100)?)).with_derived_policy("all")?;
    /// assert_eq!(gate.policy().unwrap().policy_value(), "\"all\";q=100;w=1");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`PolicyError::Name`] for a name that could break the header's syntax.
    pub fn with_derived_policy(self, name: &str) -> Result<Self, PolicyError> {
        let policy = RateLimitPolicy::from_algorithm(name, self.limiter.algorithm())?;
        Ok(self.with_policy(policy))
    }
}

impl<K, F, A, C, S> Gate<Tiered<K, F, A, C, S>> {
    /// A gate in front of `tiers`: each key is decided by its tier's limiter
    /// (see [`Tiered`]), without `RateLimit` header fields (the tiers' quotas
    /// differ; [`with_policy`](Gate::with_policy) sets one for all). The same
    /// as [`Gate::new`].
    pub fn tiered(tiers: Tiered<K, F, A, C, S>) -> Self {
        Gate::new(tiers)
    }

    /// The tiers behind the gate.
    pub fn tiers(&self) -> &Tiered<K, F, A, C, S> {
        &self.limiter
    }
}

impl<L> Gate<L> {
    /// A gate in front of `limiter`, without `RateLimit` header fields: a
    /// [`KeyedLimiter`] (a limit per key), a [`Tiered`] set of them (a quota
    /// per kind of key) or a [`RateLimiter`] (one limit for every request,
    /// whatever its key: no keyed map, no key bound).
    ///
    /// ```
    /// use turnstile::{Gate, Quota, RateLimiter};
    ///
    /// // One limit for the whole service: the key is not looked at.
    /// let gate = Gate::new(RateLimiter::new(Quota::per_minute(1)?));
    /// assert_eq!(gate.check(Some("alice")).status(), 200);
    /// assert_eq!(gate.check(Some("bob")).status(), 429);
    /// # Ok::<(), turnstile::QuotaError>(())
    /// ```
    pub fn new(limiter: L) -> Gate<L> {
        Gate {
            limiter,
            policy: None,
            shadow: AtomicBool::new(false),
            counts: Tally::new(),
        }
    }

    /// The limiter behind the gate.
    pub fn limiter(&self) -> &L {
        &self.limiter
    }

    /// This gate in shadow mode: decide and count every request, and deny none
    /// for its rate: a 429 or 503 is answered 200 and counted as shadowed. A
    /// request without a valid key is still answered 401: it has no key to be
    /// limited under, so letting it through would let it past the limit once
    /// enforced too (and a layer still answers 500 for a missing peer
    /// address).
    ///
    /// ```
    /// use turnstile::{Gate, KeyedLimiter, Quota};
    ///
    /// let gate = Gate::new(KeyedLimiter::<String>::new(Quota::per_minute(1)?)).shadow();
    /// assert_eq!(gate.check(Some("alice")).status(), 200);
    /// assert_eq!(gate.check(Some("alice")).status(), 200); // would be 429
    /// let stats = gate.stats();
    /// assert_eq!((stats.admitted, stats.too_many_requests), (2, 0));
    /// assert_eq!(stats.shadowed_too_many_requests, 1);
    /// gate.set_shadow(false);
    /// assert_eq!(gate.check(Some("alice")).status(), 429);
    /// gate.set_shadow(true);
    /// assert_eq!(gate.check(None::<&str>).status(), 401); // no key: not a rate decision
    /// # Ok::<(), turnstile::QuotaError>(())
    /// ```
    pub fn shadow(self) -> Gate<L> {
        self.set_shadow(true);
        self
    }

    /// Turn shadow mode on or off, from any thread, while serving.
    pub fn set_shadow(&self, shadow: bool) {
        // Relaxed: a switch read on its own; a request decided just after the
        // change may still see the old mode.
        self.shadow.store(shadow, Ordering::Relaxed);
    }

    /// Whether the gate is in shadow mode.
    pub fn is_shadow(&self) -> bool {
        // Relaxed: as in `set_shadow`.
        self.shadow.load(Ordering::Relaxed)
    }

    /// Add `RateLimit-Policy` and `RateLimit` header fields to every answer
    /// ([`headers`](Self::headers)).
    pub fn with_policy(self, policy: RateLimitPolicy) -> Gate<L> {
        Gate {
            policy: Some(policy),
            ..self
        }
    }

    /// The `RateLimit` header policy, if one is set.
    pub fn policy(&self) -> Option<&RateLimitPolicy> {
        self.policy.as_ref()
    }

    /// `outcome` as an HTTP response with an empty body (feature `tower`,
    /// for the `http` crate's types): its status, and the fields of
    /// [`headers`](Self::headers). For a handler that calls the gate itself
    /// and answers a denial at once (an admitted request gets the handler's
    /// own response, with [`headers`](Self::headers) added if a policy is
    /// set).
    ///
    /// ```
    /// use turnstile::{Gate, KeyedLimiter, Quota};
    ///
    /// let gate = Gate::new(KeyedLimiter::<String>::new(Quota::per_hour(1)?));
    /// let _ = gate.check(Some("alice"));
    /// let outcome = gate.check(Some("alice"));
    /// let response: http::Response<String> = gate.response(&outcome);
    /// assert_eq!(response.status(), http::StatusCode::TOO_MANY_REQUESTS);
    /// assert_eq!(response.headers()["retry-after"], "3600");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "tower")]
    pub fn response<B: Default>(&self, outcome: &Outcome) -> http::Response<B> {
        let mut response = http::Response::new(B::default());
        *response.status_mut() = http::StatusCode::from_u16(outcome.status())
            .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
        for (name, value) in self.headers(outcome) {
            // The names are valid (`from_bytes` lowers their case); the values
            // are numbers and validated policy text.
            if let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(name.as_bytes()),
                http::HeaderValue::from_str(&value),
            ) {
                response.headers_mut().insert(name, value);
            }
        }
        response
    }

    /// The header fields to send with `outcome`: `Retry-After` (whole
    /// seconds, rounded up) on 429 and 503, and the `RateLimit` fields when a
    /// policy is set. Empty (and not allocated) for an admitted request without
    /// a policy.
    pub fn headers(&self, outcome: &Outcome) -> Vec<(&'static str, String)> {
        let mut headers = Vec::new();
        if let Some(secs) = outcome.retry_after_secs() {
            headers.push(("Retry-After", secs.to_string()));
        }
        if let Some(policy) = &self.policy
            && let Some(value) = policy.value(outcome)
        {
            headers.push(("RateLimit-Policy", policy.policy_value()));
            headers.push(("RateLimit", value));
        }
        headers
    }
}

impl<L: LimiterStats> Gate<L> {
    /// What the gate has answered so far.
    pub fn stats(&self) -> GateStats {
        let limiter: KeyedStats = self.limiter.limiter_stats();
        let shadowed_rate = self.counts.sum(SHADOWED_RATE);
        let shadowed_key_limit = self.counts.sum(SHADOWED_KEY_LIMIT);
        GateStats {
            admitted: self.counts.sum(ADMITTED) + shadowed_rate + shadowed_key_limit,
            unauthorized: self.counts.sum(UNAUTHORIZED),
            too_many_requests: self.counts.sum(TOO_MANY),
            unavailable: self.counts.sum(UNAVAILABLE),
            shadowed_too_many_requests: shadowed_rate,
            shadowed_unavailable: shadowed_key_limit,
            keys: limiter.keys,
            evicted: limiter.evicted,
        }
    }

    /// The outcome to answer for the limiter's `outcome`, counted.
    ///
    /// The gate counts the 429s and 503s it answers itself rather than
    /// deriving them from the limiter's denials less the shadowed ones: each
    /// count then only grows, as a counter must, even while shadowed denials
    /// are being counted between two reads.
    #[inline]
    fn answer(&self, outcome: Outcome) -> Outcome {
        let (enforced, shadowed) = match outcome {
            Outcome::Admitted { .. } => {
                self.counts.add(ADMITTED, thread_slot());
                return outcome;
            }
            Outcome::Unauthorized => {
                self.counts.add(UNAUTHORIZED, thread_slot());
                return outcome;
            }
            Outcome::TooManyRequests { .. } => (TOO_MANY, SHADOWED_RATE),
            Outcome::Unavailable { .. } => (UNAVAILABLE, SHADOWED_KEY_LIMIT),
        };
        if !self.is_shadow() {
            self.counts.add(enforced, thread_slot());
            return outcome;
        }
        self.counts.add(shadowed, thread_slot());
        Outcome::Admitted { remaining: 0 }
    }

    /// Decide a request by its key; `None` when it has none.
    #[inline]
    pub fn check<Q>(&self, key: Option<&Q>) -> Outcome
    where
        L: GateLimiter<Q>,
        Q: ?Sized,
    {
        self.answer(Outcome::from_decision(
            key.map(|key| self.limiter.acquire(key)),
        ))
    }

    /// Decide a request that costs `n` permits.
    ///
    /// # Errors
    ///
    /// As [`KeyedLimiter::try_acquire_n`]: `n = 0` or `n` above the capacity.
    /// A request without a key is a 401 whatever `n`.
    pub fn check_n<Q>(&self, key: Option<&Q>, n: u32) -> Result<Outcome, AcquireError>
    where
        L: GateLimiter<Q>,
        Q: ?Sized,
    {
        let outcome = match key {
            None => Outcome::Unauthorized,
            Some(key) => Outcome::from_decision(Some(self.limiter.acquire_n(key, n)?)),
        };
        Ok(self.answer(outcome))
    }
}
