//! Limits shared by every replica of the service, kept in Redis: the
//! [`RedisBackend`], on turnstile's Redis modes.
//!
//! - **Leased** ([`RedisMode::Leased`], the default): each replica takes
//!   permits from the limit in Redis in batches (leases) and spends them in
//!   process, with no call per decision (turnstile's `LeasedLimiter`). A
//!   decision costs what the in-process backend's does while a lease covers
//!   it; a tokio task per limit fetches the next lease ahead of need and
//!   gives idle leases back. The price is a stated over-admission: over any
//!   interval of length `T`, all replicas together admit at most
//!   `B + r(T) + N·(L + ⌊L/2⌋)` for the token bucket and GCRA (`B` the burst,
//!   `r(T)` the refill over `T`, `N` the replicas, `L` the largest lease);
//!   the windows keep their own bounds with no lease term.
//! - **Exact** ([`RedisMode::Exact`]): every decision is one Lua script in
//!   Redis (turnstile's `Guarded`): all replicas together admit at most what
//!   one limiter would, `B + r(T)`, at the cost of one round trip per
//!   descriptor.
//!
//! Both run every algorithm of the configuration on the key and state of
//! turnstile's exact scripts.
//!
//! A check without spending (a descriptor's `hits_addend` set to 0, or
//! `is_negative_hits`) is answered as one hit would be now, taking nothing,
//! as the in-process backend answers it: from the lease held here when it
//! has a token (leased mode, no call), otherwise by a read-only script on
//! the limit's state in Redis (the decision's own, without its write), or
//! by the failure policy while Redis fails (a denial, or the local share's
//! answer without spending it).
//!
//! # Failures
//!
//! Every call has a deadline ([`Deadlines`]); a call that fails, or the
//! third in a row for one limit that runs past it, starts that limit's
//! backoff, during which its decisions are the failure policy's
//! ([`FailurePolicy`]): `Closed` denies (a leased replica still spends the
//! leases it holds), `Open` decides on this replica's share of the limit
//! (the limit over the number of replicas, a token bucket per key that
//! starts empty in each outage, its admissions charged to Redis when it
//! answers again). A request is never answered with a gRPC error for a
//! Redis failure. The limits share one connection (one server, or a
//! Sentinel primary), which after a failed attempt to connect makes no other
//! for the backoff: their calls then fail at once and each limit starts its
//! backoff, so that a Redis that accepts connections but does not answer
//! costs one request a reply's deadline and one attempt to connect, not one
//! attempt per descriptor.
//!
//! A replica's share starts empty in each outage (so that a failure and the
//! recovery after it never let the replicas admit a second burst), so the
//! first requests of an outage are denied until the share refills, at the
//! limit's rate over the replicas: a token bucket of 100 a day shared by 4
//! replicas gives its first permit after 57.6 minutes (a fixed window's
//! share refills whole, after a window). A limit that must keep admitting
//! through an outage needs a rate whose share refills within the outages
//! it must ride.
//!
//! What Redis did is counted for `/metrics` ([`RedisHealth`]: failed calls,
//! decisions made by the policy, degraded periods, limits failing now), and
//! the binary pings Redis at start-up and logs when Redis starts failing
//! and when it answers again.
//!
//! # Keys
//!
//! A limit's keys are `PREFIX:ALGORITHM:FULL_KEY:` followed by the
//! descriptor's values (each after its length; beyond 64 bytes, `#` and
//! their SHA-1): the domain, the descriptor path and the value, so that
//! limits never share a key, and a limit whose
//! algorithm changes starts on keys of its own rather than reading another
//! algorithm's state. No hash tag: each decision touches one key, so on a
//! Redis Cluster one limit's keys spread over the nodes.
//!
//! # Not blocking the runtime
//!
//! Decisions use turnstile's asynchronous calls on a multiplexed connection
//! (feature `tokio`): a request awaiting Redis holds no thread, and a leased
//! decision covered by a lease completes on its first poll. A blocking
//! connection in `spawn_blocking` would hold a thread per call in flight and
//! add a thread hand-off to every decision, leased ones included.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use redis::IntoConnectionInfo;
use redis::cluster::ClusterClientBuilder;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use turnstile::redis::{
    AnyAsyncConnection, AsyncRedisConnection, Deadlines, Guarded, LeasedBuilder, LeasedLimiter,
    MAX_LEASE, OnFailure, RedisAlgorithm, RedisLimiter,
};
use turnstile::{
    AcquireError, Clock, Decision, FixedWindow, Gcra, RateLimitPolicy, SlidingWindow, TokenBucket,
};

use crate::backend::{
    AlgorithmKind, Backend, Decide, LimitSpec, LimitState, Reset, Verdict, bucket_quota,
    duration_nanos, policy_name,
};
use crate::clock::ServiceClock;

/// How replicas share a limit in Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RedisMode {
    /// One script per decision: exact, one round trip each.
    Exact,
    /// Leases spent in process: no round trip while a lease covers a
    /// decision, a stated over-admission.
    #[default]
    Leased,
}

impl RedisMode {
    /// Parse `exact` or `leased`.
    pub fn parse(text: &str) -> Option<RedisMode> {
        match text {
            "exact" => Some(RedisMode::Exact),
            "leased" => Some(RedisMode::Leased),
            _ => None,
        }
    }
}

/// What decides while Redis fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FailurePolicy {
    /// Fail open to this replica's share of each limit.
    #[default]
    Open,
    /// Fail closed: deny what the leases held here cannot serve.
    Closed,
}

impl FailurePolicy {
    /// Parse `open` or `closed`.
    pub fn parse(text: &str) -> Option<FailurePolicy> {
        match text {
            "open" => Some(FailurePolicy::Open),
            "closed" => Some(FailurePolicy::Closed),
            _ => None,
        }
    }
}

/// The Redis backend's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisOptions {
    /// Exact or leased.
    pub mode: RedisMode,
    /// What decides while Redis fails.
    pub on_failure: FailurePolicy,
    /// Deadlines of every call (default: connect 50 ms, response 5 ms).
    pub deadlines: Deadlines,
    /// How long no call is made after a failure (default 1 s).
    pub backoff: Duration,
    /// The replicas sharing the limits (default 1): a replica's share while
    /// failing open is each limit over this many.
    pub replicas: u32,
    /// The largest lease, `L` (default 64): a limit's leases hold at most
    /// this many permits, and at most a quarter of the limit's capacity
    /// over the replicas (at least 1), so that what the replicas hold stays
    /// a small part of the limit.
    pub max_lease: u32,
    /// How long a lease may be spent from (default 1 s).
    pub lease_lifetime: Duration,
    /// Distinct keys each limit holds leases for on this replica.
    pub max_keys: usize,
    /// The first part of every key (default `turnstile-rls`).
    pub prefix: String,
}

impl Default for RedisOptions {
    fn default() -> RedisOptions {
        RedisOptions {
            mode: RedisMode::default(),
            on_failure: FailurePolicy::default(),
            deadlines: Deadlines::default(),
            backoff: Duration::from_secs(1),
            replicas: 1,
            max_lease: 64,
            lease_lifetime: Duration::from_secs(1),
            max_keys: crate::backend::DEFAULT_MAX_KEYS_PER_LIMIT,
            prefix: "turnstile-rls".to_string(),
        }
    }
}

/// Why a Redis backend could not be made.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisBackendError {
    /// The URL is not one of the supported forms.
    Url {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        message: String,
    },
    /// The cluster's nodes could not be reached to learn its slots.
    Cluster {
        /// The client's message.
        message: String,
    },
}

impl fmt::Display for RedisBackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisBackendError::Url { url, message } => write!(
                f,
                "--redis {url}: {message} (give redis://HOST:PORT[/DB], \
                 redis+unix:///PATH, redis+cluster://HOST:PORT[,HOST:PORT…] or \
                 redis+sentinel://HOST:PORT[,HOST:PORT…]/PRIMARY_NAME)"
            ),
            RedisBackendError::Cluster { message } => {
                write!(f, "Redis Cluster: {message} (check that its nodes answer)")
            }
        }
    }
}

impl std::error::Error for RedisBackendError {}

/// Limits in Redis, shared by every replica that uses the same Redis and
/// key prefix (see the [module](self)).
#[derive(Clone)]
pub struct RedisBackend {
    con: AnyAsyncConnection,
    options: RedisOptions,
    clock: ServiceClock,
    health: Arc<RedisHealth>,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// A backend on `url`: `redis://[USER:PASSWORD@]HOST:PORT[/DB]` (one
    /// server), `redis+unix:///PATH[?user=USER&pass=PASSWORD]` (one server on
    /// a Unix socket), `redis+cluster://[USER:PASSWORD@]HOST:PORT,…` (a Redis
    /// Cluster, from any of its nodes, each node's credentials before it) or
    /// `redis+sentinel://[USER:PASSWORD@]HOST:PORT,…/NAME` (the primary named
    /// `NAME` by those Sentinels, found again after a failover; the
    /// credentials are the primary's). A single
    /// server or Sentinel connects on its first call, so a Redis that is
    /// down at start is a failure like any other (the policy decides); a
    /// cluster is asked for its slots here.
    ///
    /// # Errors
    ///
    /// [`RedisBackendError`] for a URL of another form, or a cluster none of
    /// whose nodes answer.
    pub async fn connect(url: &str, options: RedisOptions) -> Result<Self, RedisBackendError> {
        let deadlines = options.deadlines;
        let bad = |message: String| RedisBackendError::Url {
            url: url.to_string(),
            message,
        };
        let con = if let Some(rest) = url.strip_prefix("redis+cluster://") {
            let nodes: Vec<String> = rest
                .split(',')
                .filter(|n| !n.is_empty())
                .map(|n| format!("redis://{}", n.trim_end_matches('/')))
                .collect();
            if nodes.is_empty() {
                return Err(bad("no node named".to_string()));
            }
            deadlines
                .async_cluster(ClusterClientBuilder::new(nodes))
                .await
                .map_err(|e| RedisBackendError::Cluster {
                    message: e.to_string(),
                })?
                .into_any()
        } else if let Some(rest) = url.strip_prefix("redis+sentinel://") {
            // `USER:PASSWORD@` before the Sentinels: the primary's credentials.
            let (auth, rest) = match rest.split_once('@') {
                Some((auth, rest)) if !auth.contains('/') => (Some(auth), rest),
                _ => (None, rest),
            };
            let node = match auth {
                None => None,
                Some(auth) => {
                    let info = format!("redis://{auth}@localhost")
                        .into_connection_info()
                        .map_err(|e| bad(format!("its credentials: {e}")))?;
                    Some(
                        SentinelNodeConnectionInfo::default()
                            .set_redis_connection_info(info.redis_settings().clone()),
                    )
                }
            };
            let (hosts, name) = rest
                .split_once('/')
                .filter(|(_, name)| !name.is_empty())
                .ok_or_else(|| bad("the primary's name is missing after the `/`".to_string()))?;
            let sentinels: Vec<String> = hosts
                .split(',')
                .filter(|n| !n.is_empty())
                .map(|n| format!("redis://{n}"))
                .collect();
            if sentinels.is_empty() {
                return Err(bad("no Sentinel named".to_string()));
            }
            let client = SentinelClient::build(
                sentinels,
                name.to_string(),
                node,
                SentinelServerType::Master,
            )
            .map_err(|e| bad(e.to_string()))?;
            deadlines
                .reconnecting_sentinel(client)
                // Against a Redis that accepts but does not answer, one
                // attempt to connect a backoff, not one per limit called.
                .connect_backoff(options.backoff)
                .into_any()
        } else if ["redis://", "redis+unix://", "unix://"]
            .iter()
            .any(|scheme| url.starts_with(scheme))
        {
            let client = redis::Client::open(url).map_err(|e| bad(e.to_string()))?;
            deadlines
                .reconnecting(client)
                .connect_backoff(options.backoff)
                .into_any()
        } else {
            return Err(bad("an unknown scheme".to_string()));
        };
        Ok(RedisBackend::new(con, options))
    }

    /// A backend on a connection made already.
    pub fn new(con: AnyAsyncConnection, options: RedisOptions) -> RedisBackend {
        RedisBackend {
            con,
            options,
            clock: ServiceClock::real(),
            health: Arc::new(RedisHealth::default()),
        }
    }

    /// What the limits of this backend met in Redis so far, for
    /// `/metrics` and the log.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use turnstile_server::redis_backend::{RedisBackend, RedisOptions};
    ///
    /// // A single server connects on its first call: nothing is sent yet.
    /// let backend = RedisBackend::connect("redis://127.0.0.1:6379", RedisOptions::default()).await?;
    /// let counts = backend.health().counts();
    /// assert_eq!((counts.failures, counts.fallbacks, counts.failing_limits), (0, 0, 0));
    /// # Ok(())
    /// # }
    /// ```
    pub fn health(&self) -> Arc<RedisHealth> {
        Arc::clone(&self.health)
    }

    /// Ping Redis on behalf of the limits failing now, so that a limit with
    /// no request since its last call failed (idle, or dropped by a reload
    /// and kept for a later one) learns that Redis answers again: one
    /// limit's ping first, and the others' only if it succeeded (a Redis
    /// still down costs one call). Each ping counts as that limit's call
    /// would (a failure starts its backoff; a success ends it and its
    /// degraded period). Returns the limits still failing.
    pub async fn recover(&self) -> usize {
        let failing = self.health.failing();
        let Some((first, rest)) = failing.split_first() else {
            return 0;
        };
        if first.ping().await.is_ok() {
            for shared in rest {
                let _ = shared.ping().await;
            }
        }
        drop(failing);
        self.health.failing().len()
    }

    /// Send Redis a `PING`, within the connection's deadlines: at start-up,
    /// to say at once whether Redis answers (a single server or a Sentinel's
    /// primary connects on its first call).
    ///
    /// # Errors
    ///
    /// The client's message when the `PING` fails or runs past its
    /// deadline.
    pub async fn ping(&self) -> Result<Duration, String> {
        let start = std::time::Instant::now();
        let mut con = self.con.clone();
        redis::cmd("PING")
            .query_async::<String>(&mut con)
            .await
            .map(|_| start.elapsed())
            .map_err(|e| e.to_string())
    }

    /// The settings.
    pub fn options(&self) -> &RedisOptions {
        &self.options
    }

    /// The largest lease of a limit of `capacity`: a quarter of it over the
    /// replicas, within 1 and [`RedisOptions::max_lease`].
    pub fn lease_for(&self, capacity: u32) -> u32 {
        let replicas = self.options.replicas.max(1);
        (capacity / replicas.saturating_mul(4))
            .clamp(1, self.options.max_lease.max(1))
            .min(capacity.max(1))
            .min(MAX_LEASE)
    }

    fn on_failure(&self, algorithm: RedisAlgorithm) -> Result<OnFailure, String> {
        match self.options.on_failure {
            FailurePolicy::Closed => Ok(OnFailure::Deny),
            FailurePolicy::Open => {
                OnFailure::local_share_of(algorithm, self.options.replicas.max(1))
                    .map_err(|e| e.to_string())
            }
        }
    }
}

impl Backend for RedisBackend {
    fn limit(&self, spec: &LimitSpec) -> Result<Arc<dyn LimitState>, String> {
        let rate = spec.requests_per_unit;
        let unit = spec.unit.duration();
        let quota_error = |error: turnstile::QuotaError| error.to_string();
        let (algorithm, reset, tag, policy): (RedisAlgorithm, Reset, &str, _) = match spec.algorithm
        {
            AlgorithmKind::TokenBucket => {
                let quota = bucket_quota(rate, spec.unit, spec.burst).map_err(quota_error)?;
                let bucket = TokenBucket::new(quota);
                let reset = Reset::Bucket {
                    amount: u64::from(quota.amount()),
                    period: duration_nanos(quota.period()),
                };
                (bucket.into(), reset, "tb", policy_of(spec, &bucket))
            }
            AlgorithmKind::Gcra => {
                let quota = bucket_quota(rate, spec.unit, spec.burst).map_err(quota_error)?;
                let gcra = Gcra::new(quota);
                let reset = Reset::Gcra {
                    interval: duration_nanos(gcra.emission_interval()),
                };
                (gcra.into(), reset, "gcra", policy_of(spec, &gcra))
            }
            AlgorithmKind::FixedWindow | AlgorithmKind::SlidingWindow if spec.burst.is_some() => {
                return Err("`burst` applies to `token_bucket` and `gcra`; a window's burst is its `requests_per_unit`".to_string());
            }
            AlgorithmKind::FixedWindow => {
                let window = FixedWindow::new(rate, unit).map_err(quota_error)?;
                let reset = Reset::Fixed {
                    window: duration_nanos(unit),
                };
                (window.into(), reset, "fw", policy_of(spec, &window))
            }
            AlgorithmKind::SlidingWindow => {
                let window = SlidingWindow::new(rate, unit).map_err(quota_error)?;
                let reset = Reset::Sliding {
                    window: duration_nanos(unit),
                };
                (window.into(), reset, "sw", policy_of(spec, &window))
            }
        };
        let prefix = format!("{}:{tag}:{}:", self.options.prefix, spec.full_key);
        // The name only feeds the default prefix, replaced here; braces are
        // refused in it, and a full key may hold any character.
        let limiter = RedisLimiter::new("rls", algorithm)
            .map_err(|e| e.to_string())?
            .with_prefix(prefix);
        let capacity = limiter.capacity();
        let on_failure = self.on_failure(algorithm)?;
        let decider = match self.options.mode {
            RedisMode::Exact => Decider::Exact(Box::new(Guarded::new(
                limiter,
                on_failure,
                self.options.backoff,
            ))),
            RedisMode::Leased => {
                let leased = LeasedBuilder::new(limiter, self.lease_for(capacity))
                    .map_err(|e| e.to_string())?
                    .lifetime(self.options.lease_lifetime)
                    .on_failure(on_failure, self.options.backoff)
                    // A request waits for another's fetch no longer than its
                    // own call could take.
                    .fetch_wait(self.options.deadlines.response_timeout())
                    .max_keys(self.options.max_keys.max(1))
                    .build()
                    .map_err(|e| e.to_string())?;
                let leased = Arc::new(leased);
                // Prefetches and give-backs off the request path, when there
                // is a runtime to run them (there is in the service; a
                // configuration checked outside one fetches on requests).
                let refresher = tokio::runtime::Handle::try_current()
                    .ok()
                    .and_then(|_| leased.start_refresher_async(self.con.clone()));
                Decider::Leased {
                    leased,
                    _refresher: Refresher(refresher),
                }
            }
        };
        let shared = Arc::new(Shared {
            decider,
            con: self.con.clone(),
            capacity,
            reset,
            policy,
            clock: self.clock.clone(),
            health: Arc::clone(&self.health),
        });
        self.health.register(&shared);
        Ok(shared)
    }
}

fn policy_of<A: turnstile::AdvertisedQuota>(
    spec: &LimitSpec,
    algorithm: &A,
) -> Option<RateLimitPolicy> {
    RateLimitPolicy::from_algorithm(&policy_name(&spec.full_key), algorithm).ok()
}

/// A leased limit's refresher task, stopped when the limit is dropped (a
/// configuration replaced).
struct Refresher(Option<tokio::task::JoinHandle<()>>);

impl Drop for Refresher {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

enum Decider {
    // Boxed: a `Guarded` is some 400 bytes, a leased limit two pointers.
    Exact(Box<Guarded>),
    Leased {
        leased: Arc<LeasedLimiter>,
        _refresher: Refresher,
    },
}

/// A limit in Redis.
struct Shared {
    decider: Decider,
    con: AnyAsyncConnection,
    capacity: u32,
    reset: Reset,
    policy: Option<RateLimitPolicy>,
    clock: ServiceClock,
    health: Arc<RedisHealth>,
}

impl Shared {
    /// A `PING` as this limit's call ([`RedisBackend::recover`]).
    async fn ping(&self) -> Result<Duration, turnstile::redis::RedisLimitError> {
        let mut con = self.con.clone();
        match &self.decider {
            Decider::Exact(guarded) => guarded.ping_async(&mut con).await,
            Decider::Leased { leased, .. } => leased.ping_async(&mut con).await,
        }
    }

    /// This limit's counts: failures, fallbacks, degraded periods, and
    /// whether it is failing now.
    fn counts(&self) -> RedisCounts {
        let (failures, fallbacks, degraded, degraded_periods) = match &self.decider {
            Decider::Exact(guarded) => {
                let s = guarded.stats();
                (s.failures, s.fallbacks, s.degraded, s.degraded_periods)
            }
            Decider::Leased { leased, .. } => {
                let s = leased.stats();
                (s.failures, s.fallbacks, s.degraded, s.degraded_periods)
            }
        };
        RedisCounts {
            failures,
            fallbacks,
            degraded_periods,
            failing_limits: u64::from(degraded),
        }
    }
}

impl Drop for Shared {
    /// A limit dropped (replaced by a reload) leaves its counts to the
    /// backend's totals, so that the counters never go back.
    fn drop(&mut self) {
        let mut counts = self.counts();
        counts.failing_limits = 0;
        self.health.retire(counts);
    }
}

/// What a backend's limits met in Redis, summed over every limit it made
/// (those a reload replaced included): `/metrics` serves it as
/// `turnstile_rls_redis_failures_total`, `turnstile_rls_redis_fallbacks_total`,
/// `turnstile_rls_redis_degraded_periods_total` and the gauge
/// `turnstile_rls_redis_failing_limits`.
#[derive(Debug, Default)]
pub struct RedisHealth {
    /// The limits alive, and the counts of those dropped.
    limits: Mutex<(Vec<Weak<Shared>>, RedisCounts)>,
    /// The counters last reported: a limit dropped while it is being read
    /// could otherwise make a sum smaller than the one before.
    reported: Mutex<RedisCounts>,
}

/// Counts of [`RedisHealth`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisCounts {
    /// Calls to Redis that failed (no connection, a timeout, an error
    /// reply), over every limit.
    pub failures: u64,
    /// Decisions made by the failure policy instead of Redis.
    pub fallbacks: u64,
    /// Degraded periods, each from a limit's failed call to the call of
    /// that limit that Redis answered next.
    pub degraded_periods: u64,
    /// Limits whose last call to Redis failed (a gauge).
    pub failing_limits: u64,
}

impl RedisCounts {
    fn add(&mut self, other: RedisCounts) {
        self.failures += other.failures;
        self.fallbacks += other.fallbacks;
        self.degraded_periods += other.degraded_periods;
        self.failing_limits += other.failing_limits;
    }
}

impl RedisHealth {
    fn register(&self, shared: &Arc<Shared>) {
        let mut limits = self.limits.lock().unwrap_or_else(PoisonError::into_inner);
        // The dropped limits' entries are pruned when the list is full, and
        // room is made for as many again as are alive (64 at least): a load
        // of `n` limits costs O(n) in all, and the list holds at most
        // twice the limits alive at its last pruning, or 64 more.
        if limits.0.len() >= limits.0.capacity() && limits.0.len() >= 64 {
            limits.0.retain(|weak| weak.strong_count() > 0);
            let alive = limits.0.len();
            limits.0.reserve(alive.max(64));
        }
        limits.0.push(Arc::downgrade(shared));
    }

    /// The limits whose last call failed.
    fn failing(&self) -> Vec<Arc<Shared>> {
        let limits = self.limits.lock().unwrap_or_else(PoisonError::into_inner);
        let alive: Vec<Arc<Shared>> = limits.0.iter().filter_map(Weak::upgrade).collect();
        drop(limits);
        alive
            .into_iter()
            .filter(|shared| shared.counts().failing_limits > 0)
            .collect()
    }

    fn retire(&self, counts: RedisCounts) {
        let mut limits = self.limits.lock().unwrap_or_else(PoisonError::into_inner);
        limits.1.add(counts);
    }

    /// The counts now: those of the limits alive, and of those dropped.
    pub fn counts(&self) -> RedisCounts {
        let (mut sum, alive) = {
            let limits = self.limits.lock().unwrap_or_else(PoisonError::into_inner);
            let alive: Vec<Arc<Shared>> = limits.0.iter().filter_map(Weak::upgrade).collect();
            (limits.1, alive)
        };
        for shared in &alive {
            sum.add(shared.counts());
        }
        // The limits upgraded above are released only now, outside the
        // lock their `Drop` takes.
        drop(alive);
        let mut reported = self.reported.lock().unwrap_or_else(PoisonError::into_inner);
        reported.failures = reported.failures.max(sum.failures);
        reported.fallbacks = reported.fallbacks.max(sum.fallbacks);
        reported.degraded_periods = reported.degraded_periods.max(sum.degraded_periods);
        reported.failing_limits = sum.failing_limits;
        *reported
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match &self.decider {
            Decider::Exact(_) => "exact",
            Decider::Leased { .. } => "leased",
        };
        f.debug_struct("Shared")
            .field("mode", &mode)
            .field("capacity", &self.capacity)
            .field("reset", &self.reset)
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn verdict(&self, decision: Result<Decision, AcquireError>) -> Verdict {
        match decision {
            Ok(Decision::Allowed { remaining }) => Verdict::Admitted {
                remaining,
                reset: self.reset.until_whole(
                    u64::from(self.capacity.saturating_sub(remaining)),
                    self.clock.now(),
                ),
            },
            Ok(Decision::Denied { retry_after }) => Verdict::Denied {
                retry_after: Some(retry_after.duration()),
            },
            // More hits than the capacity: never admitted.
            Err(_) => Verdict::Denied { retry_after: None },
        }
    }
}

impl LimitState for Shared {
    fn decide<'a>(&'a self, key: &'a str, hits: u32) -> Decide<'a> {
        if hits == 0 {
            return self.check(key, 1);
        }
        Decide::Pending(Box::pin(async move {
            let mut con = self.con.clone();
            let decision = match &self.decider {
                Decider::Exact(guarded) => guarded.try_acquire_n_async(&mut con, key, hits).await,
                Decider::Leased { leased, .. } => {
                    leased.try_acquire_n_async(&mut con, key, hits).await
                }
            };
            self.verdict(decision)
        }))
    }

    /// The decision `hits` would get (one for 0), from the limit's state in
    /// Redis (or the lease held here), taking nothing. Admitted, the
    /// remaining is what is there now, as in process: the peek's, which is
    /// after the hits, with them added back.
    fn check<'a>(&'a self, key: &'a str, hits: u32) -> Decide<'a> {
        let n = hits.max(1);
        Decide::Pending(Box::pin(async move {
            let mut con = self.con.clone();
            let decision = match &self.decider {
                Decider::Exact(guarded) => guarded.peek_n_async(&mut con, key, n).await,
                Decider::Leased { leased, .. } => leased.peek_n_async(&mut con, key, n).await,
            };
            self.verdict(decision.map(|decision| match decision {
                Decision::Allowed { remaining } => Decision::Allowed {
                    remaining: remaining.saturating_add(n).min(self.capacity),
                },
                denied => denied,
            }))
        }))
    }

    fn policy(&self) -> Option<&RateLimitPolicy> {
        self.policy.as_ref()
    }

    /// The counts are in Redis, where a limit made again finds them; what a
    /// replica holds besides (leases not yet spent or expired, a local
    /// share's state and debts while Redis fails) keeps the limit
    /// ([`Guarded::holds_nothing`], [`LeasedLimiter::holds_nothing`]).
    fn reclaimable(&self) -> bool {
        match &self.decider {
            Decider::Exact(guarded) => guarded.holds_nothing(),
            Decider::Leased { leased, .. } => leased.holds_nothing(),
        }
    }
}
