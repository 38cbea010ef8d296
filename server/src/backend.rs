//! Where a limit's state lives: the [`Backend`] trait, and the in-process
//! backend, one turnstile [`KeyedLimiter`] per configured limit.
//!
//! A backend turns each limit of the configuration ([`LimitSpec`]) into a
//! [`LimitState`] when the configuration is loaded; a request then asks that
//! state for a decision on one key (the descriptor's values). Backends that
//! share a limit across replicas (turnstile's Redis modes) fit behind the
//! same two traits.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use turnstile::chain::Stage;
use turnstile::{
    Algorithm, Clock, FixedWindow, Gcra, KeyedBuilder, KeyedDecision, KeyedLimiter, Lend,
    LiveFixedWindow, LiveGcra, LiveSlidingWindow, LiveTokenBucket, Quota, QuotaError,
    RateLimitPolicy, Reconfigure, SlidingWindow,
};

use crate::clock::ServiceClock;

/// A limit's unit of time, as in envoyproxy/ratelimit's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// One minute.
    Minute,
    /// One hour.
    Hour,
    /// One day.
    Day,
    /// Seven days.
    Week,
    /// Thirty days (envoyproxy/ratelimit's month: a fixed length, not the
    /// calendar's).
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// The unit's length: envoyproxy/ratelimit's, a month 30 days and a
    /// year 365.
    pub const fn duration(self) -> Duration {
        Duration::from_secs(match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        })
    }

    /// Parse a unit as envoyproxy/ratelimit does (any case).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile_server::backend::Unit;
    ///
    /// assert_eq!(Unit::parse("MINUTE"), Some(Unit::Minute));
    /// assert_eq!(Unit::parse("fortnight"), None);
    /// // A month is 30 days, as envoyproxy/ratelimit counts it.
    /// let month = Unit::parse("month").map(Unit::duration);
    /// assert_eq!(month, Some(Duration::from_secs(30 * 86_400)));
    /// ```
    pub fn parse(text: &str) -> Option<Unit> {
        match text.to_ascii_lowercase().as_str() {
            "second" => Some(Unit::Second),
            "minute" => Some(Unit::Minute),
            "hour" => Some(Unit::Hour),
            "day" => Some(Unit::Day),
            "week" => Some(Unit::Week),
            "month" => Some(Unit::Month),
            "year" => Some(Unit::Year),
            _ => None,
        }
    }

    /// The unit's name in the configuration.
    pub const fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }
}

/// The algorithm that enforces a limit (the configuration's `algorithm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum AlgorithmKind {
    /// `requests_per_unit` per unit, counted in windows on the unit's
    /// boundaries: envoyproxy/ratelimit's own behaviour, so the default.
    #[default]
    FixedWindow,
    /// Two windows weighed together: at most about `requests_per_unit` in any
    /// interval of one unit.
    SlidingWindow,
    /// A bucket of `burst` tokens (default `requests_per_unit`) refilled at
    /// `requests_per_unit` per unit.
    TokenBucket,
    /// The generic cell rate algorithm: the token bucket's limits, decided
    /// from one theoretical arrival time.
    Gcra,
}

impl AlgorithmKind {
    /// Parse the configuration's name for it (as written: lower case).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile_server::backend::AlgorithmKind;
    ///
    /// assert_eq!(AlgorithmKind::parse("token_bucket"), Some(AlgorithmKind::TokenBucket));
    /// assert_eq!(AlgorithmKind::parse("Token_Bucket"), None);
    /// // A limit that names none is a fixed window, as envoyproxy/ratelimit's.
    /// assert_eq!(AlgorithmKind::default(), AlgorithmKind::FixedWindow);
    /// ```
    pub fn parse(text: &str) -> Option<AlgorithmKind> {
        match text {
            "fixed_window" => Some(AlgorithmKind::FixedWindow),
            "sliding_window" => Some(AlgorithmKind::SlidingWindow),
            "token_bucket" => Some(AlgorithmKind::TokenBucket),
            "gcra" => Some(AlgorithmKind::Gcra),
            _ => None,
        }
    }
}

/// One limit of the configuration, as a backend needs it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LimitSpec {
    /// The limit's full key, `domain.key_value.key…`, unique in a
    /// configuration.
    pub full_key: String,
    /// `requests_per_unit`: at least 1 (a limit of 0 denies everything and
    /// needs no state).
    pub requests_per_unit: u32,
    /// `unit`.
    pub unit: Unit,
    /// `algorithm`.
    pub algorithm: AlgorithmKind,
    /// `burst`, for the token bucket and GCRA.
    pub burst: Option<u32>,
}

/// What a limit answers for one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted (or, for a check of 0 hits, a request of 1 would be):
    /// `remaining` permits are left, and after `reset` with no further
    /// requests the key would be back at its full allowance.
    Admitted {
        /// Permits left.
        remaining: u32,
        /// The time until the key's allowance is whole again.
        reset: Duration,
    },
    /// Over the limit: nothing was spent (the service may then spend what
    /// is left: see [`should_rate_limit`](crate::service::RateLimitService::should_rate_limit)).
    /// `retry_after` is the wait until
    /// the same request would be admitted, or `None` when it never can be
    /// (more hits than the limit's capacity).
    Denied {
        /// The wait until the request would be admitted.
        retry_after: Option<Duration>,
    },
}

/// A decision in progress: ready at once for a limit kept in process, a
/// future for one that may await a call to another process (Redis). The
/// service awaits it, so a backend that calls out never blocks the runtime's
/// threads.
pub enum Decide<'a> {
    /// Decided already.
    Ready(Verdict),
    /// Decided when this completes.
    Pending(Pin<Box<dyn Future<Output = Verdict> + Send + 'a>>),
}

impl fmt::Debug for Decide<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decide::Ready(verdict) => f.debug_tuple("Ready").field(verdict).finish(),
            Decide::Pending(_) => f.write_str("Pending"),
        }
    }
}

impl From<Verdict> for Decide<'_> {
    fn from(verdict: Verdict) -> Self {
        Decide::Ready(verdict)
    }
}

impl Future for Decide<'_> {
    type Output = Verdict;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Verdict> {
        match &mut *self {
            Decide::Ready(verdict) => Poll::Ready(*verdict),
            Decide::Pending(future) => future.as_mut().poll(cx),
        }
    }
}

/// A limit's state, shared by every request that matches it.
pub trait LimitState: Send + Sync + fmt::Debug {
    /// Spend `hits` permits for `key`, all or nothing; `hits = 0` spends
    /// nothing and answers whether a request of one permit would be admitted.
    fn decide<'a>(&'a self, key: &'a str, hits: u32) -> Decide<'a>;

    /// What `hits` permits for `key` would get now (one for `hits = 0`),
    /// spending nothing: the check before a request's descriptors spend
    /// together ([`with_stop_increments`](crate::service::RateLimitService::with_stop_increments)).
    /// By default the check of one permit, `decide(key, 0)`.
    fn check<'a>(&'a self, key: &'a str, hits: u32) -> Decide<'a> {
        let _ = hits;
        self.decide(key, 0)
    }

    /// Charge `n` permits for `key` from its next refills, where the
    /// algorithm can hold a debt (a token bucket or GCRA in process lends up to one
    /// fill ahead; the requests after wait until it is paid): the permits
    /// lent, at most `n`. By default none: the rest of a refused request's
    /// hits is forgiven (see
    /// [`should_rate_limit`](crate::service::RateLimitService::should_rate_limit)).
    fn lend(&self, key: &str, n: u32) -> u32 {
        let _ = (key, n);
        0
    }

    /// The `RateLimit-Policy` this limit can promise, if any.
    fn policy(&self) -> Option<&RateLimitPolicy>;

    /// The state for `spec`, a changed quota of this same limit (same
    /// `full_key` and `algorithm`), keeping every key's state by the
    /// algorithm's conversion rule; `None` when this state cannot change its
    /// quota, and the limit then starts fresh. Used on a configuration
    /// reload ([`reload`](crate::reload)).
    fn requota(&self, spec: &LimitSpec) -> Option<Arc<dyn LimitState>> {
        let _ = spec;
        None
    }

    /// Whether this state holds nothing a fresh one would not (every key
    /// swept: each was back at its whole allowance), so that dropping it and
    /// making the limit again later loses no count. May sweep to find out.
    /// `false` by default.
    fn reclaimable(&self) -> bool {
        false
    }
}

/// Makes the state of each configured limit.
pub trait Backend: Send + Sync + fmt::Debug {
    /// The state for `spec`, or what is wrong with it (a message for the
    /// configuration's error, which adds the file and line).
    fn limit(&self, spec: &LimitSpec) -> Result<Arc<dyn LimitState>, String>;
}

/// The in-process backend: each limit a turnstile [`KeyedLimiter`] keyed by
/// the descriptor's values, with a bound on the keys it holds.
///
/// The bound is the keyed limiter's: a key is dropped only once its state is
/// as good as fresh (a full bucket, a window that has passed), so a flood of
/// distinct values can never make the service forget a key that is over its
/// limit. A new value that arrives while the limit holds `max_keys` keys none
/// of which can be dropped is answered `OVER_LIMIT` (it is not tracked, so it
/// is not admitted), with `duration_until_reset` the time after which idle
/// keys can be dropped.
#[derive(Clone, Debug)]
pub struct InProcess {
    clock: ServiceClock,
    max_keys: usize,
}

/// The default bound on keys per limit.
pub const DEFAULT_MAX_KEYS_PER_LIMIT: usize = 100_000;

impl InProcess {
    /// Limits on `clock`, each holding at most `max_keys` keys (at least 1).
    pub fn new(clock: ServiceClock, max_keys: usize) -> InProcess {
        InProcess {
            clock,
            max_keys: max_keys.max(1),
        }
    }
}

impl Default for InProcess {
    fn default() -> InProcess {
        InProcess::new(ServiceClock::real(), DEFAULT_MAX_KEYS_PER_LIMIT)
    }
}

/// The quota of a token bucket or GCRA: `rate` per `unit`, burst `burst`.
pub(crate) fn bucket_quota(rate: u32, unit: Unit, burst: Option<u32>) -> Result<Quota, QuotaError> {
    let quota = match unit {
        Unit::Second => Quota::per_second(rate)?,
        Unit::Minute => Quota::per_minute(rate)?,
        Unit::Hour => Quota::per_hour(rate)?,
        Unit::Day => Quota::per_day(rate)?,
        Unit::Week | Unit::Month | Unit::Year => {
            // A day's refill with its period stretched by the unit's days:
            // the same precision, `rate` per unit. A year's refill from
            // empty (365 days) is well within a bucket's span (over two
            // years at any capacity).
            let daily = Quota::per_day(rate)?;
            let days = u32::try_from(unit.duration().as_secs() / 86_400).unwrap_or(1);
            Quota::new(daily.capacity(), daily.amount(), daily.period() * days)?
        }
    };
    match burst {
        Some(burst) if burst != quota.capacity() => match (quota.burst(burst), unit) {
            // A high rate refills in batches larger than a small burst (a
            // million a second: 16 tokens every 16 µs); per second, a refill
            // that fits the burst keeps the rate.
            (Err(QuotaError::AmountAboveCapacity { .. }), Unit::Second) => {
                Quota::per_second_with_burst(u64::from(rate), burst)
            }
            (result, _) => result,
        },
        _ => Ok(quota),
    }
}

impl Backend for InProcess {
    fn limit(&self, spec: &LimitSpec) -> Result<Arc<dyn LimitState>, String> {
        let name = policy_name(&spec.full_key);
        if matches!(
            spec.algorithm,
            AlgorithmKind::FixedWindow | AlgorithmKind::SlidingWindow
        ) && spec.burst.is_some()
        {
            return Err("`burst` applies to `token_bucket` and `gcra`; a window's burst is its `requests_per_unit`".to_string());
        }
        // Every algorithm in its live form, so that a reload that changes
        // the quota keeps every key's state (`requota`). A live decision
        // costs more callgrind instructions than the fixed form's (the token
        // bucket's admission 55 against 54; GCRA's and the windows' 15 to 29
        // more: BENCHMARKS.md, "Live quotas: instructions per decision"), a
        // few nanoseconds against a gRPC round trip.
        match spec.algorithm {
            AlgorithmKind::TokenBucket => self.live::<LiveTokenBucket>(spec, &name),
            AlgorithmKind::Gcra => self.live::<LiveGcra>(spec, &name),
            AlgorithmKind::FixedWindow => self.live::<LiveFixedWindow>(spec, &name),
            AlgorithmKind::SlidingWindow => self.live::<LiveSlidingWindow>(spec, &name),
        }
    }
}

/// A live form the in-process backend serves a limit with: how a limit's
/// configuration gives its quota, and how long a key takes to be whole.
trait LiveForm:
    Reconfigure + turnstile::AdvertisedQuota + Send + Sync + fmt::Debug + Sized + 'static
{
    /// The algorithm it serves.
    const KIND: AlgorithmKind;
    /// The quota `spec` configures.
    fn setting(spec: &LimitSpec) -> Result<Self::Quota, QuotaError>;
    /// A limiter's algorithm for `setting`.
    fn build(setting: Self::Quota) -> Result<Self, QuotaError>;
    /// How long a key takes to be whole again.
    fn reset(setting: &Self::Quota) -> Reset;
    /// Charge `n` permits for `key` from its next refills
    /// ([`LimitState::lend`]); none by default.
    fn lend(limiter: &KeyedLimiter<String, Self, ServiceClock>, key: &str, n: u32) -> u32 {
        let _ = (limiter, key, n);
        0
    }
}

impl LiveForm for LiveTokenBucket {
    const KIND: AlgorithmKind = AlgorithmKind::TokenBucket;
    fn setting(spec: &LimitSpec) -> Result<Quota, QuotaError> {
        bucket_quota(spec.requests_per_unit, spec.unit, spec.burst)
    }
    fn build(quota: Quota) -> Result<LiveTokenBucket, QuotaError> {
        LiveTokenBucket::new(quota)
    }
    fn reset(quota: &Quota) -> Reset {
        bucket_reset(*quota)
    }
    fn lend(limiter: &KeyedLimiter<String, Self, ServiceClock>, key: &str, n: u32) -> u32 {
        lend_kept(limiter, key, n)
    }
}

/// Reservations that are kept: batches of at most the capacity, a batch
/// halved when the limit refuses it (it lends at most one fill ahead), so a
/// debt of any size takes the limit as far as it goes.
fn lend_kept<A: Lend>(limiter: &KeyedLimiter<String, A, ServiceClock>, key: &str, n: u32) -> u32 {
    let mut left = n;
    let mut batch = n.min(limiter.algorithm().capacity());
    while left > 0 && batch > 0 {
        match limiter.reserve_n(key, batch, Duration::MAX) {
            // Kept when dropped: the permits are spent ahead.
            Ok(_kept) => {
                left -= batch;
                batch = batch.min(left);
            }
            Err(_) => batch /= 2,
        }
    }
    n - left
}

impl LiveForm for LiveGcra {
    const KIND: AlgorithmKind = AlgorithmKind::Gcra;
    fn setting(spec: &LimitSpec) -> Result<Quota, QuotaError> {
        bucket_quota(spec.requests_per_unit, spec.unit, spec.burst)
    }
    fn build(quota: Quota) -> Result<LiveGcra, QuotaError> {
        Ok(LiveGcra::new(quota))
    }
    fn reset(quota: &Quota) -> Reset {
        Reset::Gcra {
            interval: duration_nanos(Gcra::new(*quota).emission_interval()),
        }
    }
    /// As the token bucket's: the meter's arrival time moves on by the
    /// permits lent, at most one fill ahead.
    fn lend(limiter: &KeyedLimiter<String, Self, ServiceClock>, key: &str, n: u32) -> u32 {
        lend_kept(limiter, key, n)
    }
}

impl LiveForm for LiveFixedWindow {
    const KIND: AlgorithmKind = AlgorithmKind::FixedWindow;
    fn setting(spec: &LimitSpec) -> Result<FixedWindow, QuotaError> {
        FixedWindow::new(spec.requests_per_unit, spec.unit.duration())
    }
    fn build(window: FixedWindow) -> Result<LiveFixedWindow, QuotaError> {
        LiveFixedWindow::new(window)
    }
    fn reset(window: &FixedWindow) -> Reset {
        Reset::Fixed {
            window: duration_nanos(window.window()),
        }
    }
}

impl LiveForm for LiveSlidingWindow {
    const KIND: AlgorithmKind = AlgorithmKind::SlidingWindow;
    fn setting(spec: &LimitSpec) -> Result<SlidingWindow, QuotaError> {
        SlidingWindow::new(spec.requests_per_unit, spec.unit.duration())
    }
    fn build(window: SlidingWindow) -> Result<LiveSlidingWindow, QuotaError> {
        LiveSlidingWindow::new(window)
    }
    fn reset(window: &SlidingWindow) -> Reset {
        Reset::Sliding {
            window: duration_nanos(window.window()),
        }
    }
}

impl InProcess {
    fn live<A: LiveForm>(
        &self,
        spec: &LimitSpec,
        name: &str,
    ) -> Result<Arc<dyn LimitState>, String> {
        let quota_error = |error: QuotaError| error.to_string();
        let setting = A::setting(spec).map_err(quota_error)?;
        let algorithm = A::build(setting).map_err(quota_error)?;
        let keyed = self.keyed_state(algorithm, A::reset(&setting), name)?;
        Ok(Arc::new(Live(keyed)))
    }
}

impl InProcess {
    fn keyed_state<A>(&self, algorithm: A, reset: Reset, name: &str) -> Result<Keyed<A>, String>
    where
        A: Algorithm + turnstile::AdvertisedQuota,
    {
        let policy = RateLimitPolicy::from_algorithm(name, &algorithm).ok();
        let limiter = KeyedBuilder::new(algorithm)
            .clock(self.clock.clone())
            .max_keys(self.max_keys)
            .build()
            .map_err(|error| error.to_string())?;
        Ok(Keyed {
            limiter: Arc::new(limiter),
            reset,
            policy,
        })
    }
}

fn bucket_reset(quota: Quota) -> Reset {
    Reset::Bucket {
        amount: u64::from(quota.amount()),
        period: duration_nanos(quota.period()),
    }
}

/// A limit whose quota a reload can change in place: the keyed limiter is
/// shared between the old state and the new one, converted by
/// [`KeyedLimiter::set_quota`] by the live form's rule (never more available
/// than the new quota allows; permits created only where a key was full or
/// idle).
#[derive(Debug)]
struct Live<A: LiveForm>(Keyed<A>);

impl<A: LiveForm> LimitState for Live<A> {
    fn decide<'a>(&'a self, key: &'a str, hits: u32) -> Decide<'a> {
        self.0.decide(key, hits)
    }

    fn lend(&self, key: &str, n: u32) -> u32 {
        A::lend(&self.0.limiter, key, n)
    }

    fn check<'a>(&'a self, key: &'a str, hits: u32) -> Decide<'a> {
        self.0.check(key, hits)
    }

    fn policy(&self) -> Option<&RateLimitPolicy> {
        self.0.policy()
    }

    fn reclaimable(&self) -> bool {
        self.0.reclaimable()
    }

    fn requota(&self, spec: &LimitSpec) -> Option<Arc<dyn LimitState>> {
        if spec.algorithm != A::KIND {
            return None;
        }
        let setting = A::setting(spec).ok()?;
        // Refused (above the form's ceiling, or a quota its word cannot
        // keep): nothing changed, and the limit starts fresh.
        self.0.limiter.set_quota(setting).ok()?;
        let policy = RateLimitPolicy::from_algorithm(
            &policy_name(&spec.full_key),
            self.0.limiter.algorithm(),
        )
        .ok();
        Some(Arc::new(Live(Keyed {
            limiter: Arc::clone(&self.0.limiter),
            reset: A::reset(&setting),
            policy,
        })))
    }
}

/// A `RateLimit-Policy` name from a limit's full key: the key itself when
/// it is at most 64 characters a policy name may hold; otherwise those
/// characters (others as `_`), cut to 55, then `.` and 8 hex digits of a
/// hash of the whole key, so that two limits whose keys differ only past
/// the cut or in the characters replaced do not advertise one name.
pub(crate) fn policy_name(full_key: &str) -> String {
    const MOST: usize = 64;
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    if !full_key.is_empty() && full_key.len() <= MOST && full_key.chars().all(allowed) {
        return full_key.to_string();
    }
    let mut name: String = full_key
        .chars()
        .map(|c| if allowed(c) { c } else { '_' })
        .take(MOST - 9)
        .collect();
    // FNV-1a, 32 bits: stable across runs and builds, as a name must be.
    let hash = full_key.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    name.push_str(&format!(".{hash:08x}"));
    name
}

pub(crate) fn duration_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// How long a key takes to be whole again, per algorithm (an upper bound).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Reset {
    /// `amount` tokens every `period` ns: the missing tokens' periods.
    Bucket { amount: u64, period: u64 },
    /// One permit every `interval` ns: the missing permits' intervals.
    Gcra { interval: u64 },
    /// The end of the current window.
    Fixed { window: u64 },
    /// The end of the next window, when the current one's count has weighed
    /// out too.
    Sliding { window: u64 },
}

impl Reset {
    pub(crate) fn until_whole(self, missing: u64, now: u64) -> Duration {
        // A fixed window's reset is its end however much of it is used, as
        // envoyproxy/ratelimit answers (a check of 0 hits on a key not yet
        // seen included); every other form's is when nothing is missing.
        if missing == 0 && !matches!(self, Reset::Fixed { .. }) {
            return Duration::ZERO;
        }
        let nanos = match self {
            Reset::Bucket { amount, period } => {
                missing.div_ceil(amount.max(1)).saturating_mul(period)
            }
            Reset::Gcra { interval } => missing.saturating_mul(interval),
            Reset::Fixed { window } => window - now % window.max(1),
            Reset::Sliding { window } => (window - now % window.max(1)).saturating_add(window),
        };
        Duration::from_nanos(nanos)
    }
}

/// A limit in process.
struct Keyed<A: Algorithm> {
    limiter: Arc<KeyedLimiter<String, A, ServiceClock>>,
    reset: Reset,
    policy: Option<RateLimitPolicy>,
}

impl<A: Algorithm> fmt::Debug for Keyed<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyed")
            .field("keys", &self.limiter.len())
            .field("reset", &self.reset)
            .finish_non_exhaustive()
    }
}

impl<A> LimitState for Keyed<A>
where
    A: Algorithm + Send + Sync,
{
    fn decide<'a>(&'a self, key: &'a str, hits: u32) -> Decide<'a> {
        self.decide_now(key, hits).into()
    }

    fn check<'a>(&'a self, key: &'a str, hits: u32) -> Decide<'a> {
        self.check_now(key, hits.max(1)).into()
    }

    fn policy(&self) -> Option<&RateLimitPolicy> {
        self.policy.as_ref()
    }

    fn reclaimable(&self) -> bool {
        // A sweep drops only keys whose state a fresh key would have.
        self.limiter.sweep();
        self.limiter.is_empty()
    }
}

impl<A: Algorithm> Keyed<A> {
    /// The decision `n` permits would get, taking nothing: its exact wait
    /// (a sliding window's is past the window's end while the previous
    /// window still counts) and the key bound (a new key with the map full
    /// is refused as a request would be). Admitted, `remaining` is what the
    /// key has now (nothing taken).
    fn check_now(&self, key: &str, n: u32) -> Verdict {
        match self.limiter.stage(key).peek(n) {
            Ok(KeyedDecision::Allowed { .. }) => self.admitted(self.limiter.remaining(key)),
            Ok(KeyedDecision::Denied { retry_after } | KeyedDecision::KeyLimit { retry_after }) => {
                Verdict::Denied {
                    retry_after: Some(retry_after.duration()),
                }
            }
            // More than the capacity: never admitted.
            Err(_) => Verdict::Denied { retry_after: None },
        }
    }

    /// Admitted with `remaining` left: the reset is when the key is whole
    /// again.
    fn admitted(&self, remaining: u32) -> Verdict {
        let capacity = self.limiter.algorithm().capacity();
        let now = self.limiter.clock().now();
        Verdict::Admitted {
            remaining,
            reset: self
                .reset
                .until_whole(u64::from(capacity.saturating_sub(remaining)), now),
        }
    }

    fn decide_now(&self, key: &str, hits: u32) -> Verdict {
        if hits == 0 {
            return self.check_now(key, 1);
        }
        match self.limiter.try_acquire_n(key, hits) {
            Ok(KeyedDecision::Allowed { remaining }) => self.admitted(remaining),
            Ok(KeyedDecision::Denied { retry_after } | KeyedDecision::KeyLimit { retry_after }) => {
                Verdict::Denied {
                    retry_after: Some(retry_after.duration()),
                }
            }
            // More hits than the capacity: never admitted.
            Err(_) => Verdict::Denied { retry_after: None },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::policy_name;
    use turnstile::RateLimitPolicy;

    /// Keys that differ past the cut or only in characters replaced get
    /// names of their own, each a valid policy name; a key that is a valid
    /// name already is its own.
    #[test]
    fn policy_names_stay_apart_and_valid() {
        let long = "d.".to_string() + &"k".repeat(70);
        let keys = [
            "d.user_alice".to_string(),
            long.clone() + "a",
            long + "b",
            "d.user_ä".to_string(),
            "d.user_ö".to_string(),
            "d.user a".to_string(),
            "d.user_a".to_string(),
        ];
        let names: Vec<String> = keys.iter().map(|k| policy_name(k)).collect();
        assert_eq!(names[0], "d.user_alice");
        assert_eq!(names[6], "d.user_a");
        for (i, a) in names.iter().enumerate() {
            assert!(
                RateLimitPolicy::new(a, 1, std::time::Duration::from_secs(1)).is_ok(),
                "{a:?}"
            );
            for b in &names[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(policy_name(&keys[1]), names[1], "stable");
    }
}
