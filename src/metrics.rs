//! The counters, published through the [`metrics`](https://docs.rs/metrics)
//! crate's facade (feature `metrics`), so that any exporter serves them:
//! Prometheus, StatsD, OpenTelemetry.
//!
//! turnstile keeps its counts itself, per thread, with no locked instruction
//! on a decision; `publish` copies a snapshot into the facade as absolute
//! values. Call it where the exporter reads (a `/metrics` handler, just
//! before rendering) or on a timer. Every series carries a `limiter` label,
//! the name given to `publish`.
//!
//! | series | kind | labels |
//! |---|---|---|
//! | `turnstile_decisions_total` | counter | `limiter`, `outcome` = `admitted`, `denied`, `key_limit` |
//! | `turnstile_responses_total` | counter | `limiter`, `status` = `200`, `401`, `429`, `503`, `500` |
//! | `turnstile_shadowed_total` | counter | `limiter`, `status` = `429`, `503` (denials shadow mode let through) |
//! | `turnstile_evicted_total` | counter | `limiter` |
//! | `turnstile_keys` | gauge | `limiter` |
//! | `turnstile_redis_calls_total` | counter | `limiter`, `call` = `lease`, `give_back`, `exact` (feature `redis`) |
//! | `turnstile_redis_failures_total` | counter | `limiter` (feature `redis`) |
//! | `turnstile_redis_fallbacks_total` | counter | `limiter` (feature `redis`) |
//! | `turnstile_redis_refunds_total` | counter | `limiter`, `outcome` = `refunded`, `declined` (feature `redis`) |
//! | `turnstile_redis_degraded` | gauge | `limiter`: 1 while Redis is failing, else 0 (feature `redis`) |
//! | `turnstile_redis_degraded_periods_total` | counter | `limiter` (feature `redis`) |
//! | `turnstile_redis_fetch_waits_total` | counter | `limiter`: leased requests that waited for their key's fetch in flight instead of a call (feature `redis`) |
//! | `turnstile_redis_probes_total` | counter | `limiter`: leased requests a kept denial would have answered that asked Redis instead (feature `redis`) |
//!
//! Direct limiters and keyed limiters publish decisions; gates and layers
//! publish the responses they sent, and the keys and evictions of their
//! limiter.
//!
//! For a whole application, register every limiter, gate and layer once in
//! a [`Registry`] under its name, and call [`Registry::publish`] in the
//! `/metrics` handler: one call publishes them all.
//!
//! ```
//! use turnstile::{Gate, KeyedLimiter, Quota};
//!
//! let gate = Gate::new(KeyedLimiter::<String>::new(Quota::per_second(10)?));
//! let _ = gate.check(Some("alice"));
//! // With a recorder installed (an exporter's), this sets
//! // turnstile_responses_total{limiter="api",status="200"} to 1, and so on.
//! gate.stats().publish("api");
//! # Ok::<(), turnstile::QuotaError>(())
//! ```

use core::fmt;
use core::hash::{BuildHasher, Hash};
use std::sync::{Arc, Mutex};

use metrics::{counter, gauge};

use crate::http::gate::GateStats;
use crate::keyed::KeyedStats;
use crate::limiter::DirectStats;

/// A key count as a gauge value (exact below 2^53 keys).
#[allow(clippy::cast_precision_loss)]
fn keys_value(keys: usize) -> f64 {
    keys as f64
}

fn decisions(limiter: &str, outcome: &'static str, value: u64) {
    counter!("turnstile_decisions_total", "limiter" => limiter.to_owned(), "outcome" => outcome)
        .absolute(value);
}

fn responses(limiter: &str, status: &'static str, value: u64) {
    counter!("turnstile_responses_total", "limiter" => limiter.to_owned(), "status" => status)
        .absolute(value);
}

fn shadowed(limiter: &str, status: &'static str, value: u64) {
    counter!("turnstile_shadowed_total", "limiter" => limiter.to_owned(), "status" => status)
        .absolute(value);
}

fn keys_and_evictions(limiter: &str, keys: usize, evicted: u64) {
    counter!("turnstile_evicted_total", "limiter" => limiter.to_owned()).absolute(evicted);
    gauge!("turnstile_keys", "limiter" => limiter.to_owned()).set(keys_value(keys));
}

#[cfg(feature = "tower")]
fn refunds(limiter: &str, result: &'static str, value: u64) {
    counter!("turnstile_refunds_total", "limiter" => limiter.to_owned(), "result" => result)
        .absolute(value);
}

#[cfg(feature = "tower")]
fn settled_permits(limiter: &str, kind: &'static str, value: u64) {
    counter!("turnstile_settled_permits_total", "limiter" => limiter.to_owned(), "kind" => kind)
        .absolute(value);
}

#[cfg(feature = "redis")]
fn redis_calls(limiter: &str, call: &'static str, value: u64) {
    counter!("turnstile_redis_calls_total", "limiter" => limiter.to_owned(), "call" => call)
        .absolute(value);
}

#[cfg(feature = "redis")]
fn redis_refunds(limiter: &str, refunded: u64, declined: u64) {
    counter!("turnstile_redis_refunds_total", "limiter" => limiter.to_owned(), "outcome" => "refunded")
        .absolute(refunded);
    counter!("turnstile_redis_refunds_total", "limiter" => limiter.to_owned(), "outcome" => "declined")
        .absolute(declined);
}

#[cfg(feature = "redis")]
fn redis_failures(limiter: &str, failures: u64, fallbacks: u64) {
    counter!("turnstile_redis_failures_total", "limiter" => limiter.to_owned()).absolute(failures);
    counter!("turnstile_redis_fallbacks_total", "limiter" => limiter.to_owned())
        .absolute(fallbacks);
}

#[cfg(feature = "redis")]
fn redis_leased(limiter: &str, fetch_waits: u64, probes: u64) {
    counter!("turnstile_redis_fetch_waits_total", "limiter" => limiter.to_owned())
        .absolute(fetch_waits);
    counter!("turnstile_redis_probes_total", "limiter" => limiter.to_owned()).absolute(probes);
}

#[cfg(feature = "redis")]
fn redis_degraded(limiter: &str, degraded: bool, periods: u64) {
    let value = if degraded { 1.0 } else { 0.0 };
    gauge!("turnstile_redis_degraded", "limiter" => limiter.to_owned()).set(value);
    counter!("turnstile_redis_degraded_periods_total", "limiter" => limiter.to_owned())
        .absolute(periods);
}

/// Describe the series to the installed recorder (their help text). Once,
/// after installing it; optional.
pub fn describe() {
    metrics::describe_counter!(
        "turnstile_decisions_total",
        "Rate-limit decisions, by outcome (admitted, denied, key_limit)."
    );
    metrics::describe_counter!(
        "turnstile_responses_total",
        "Answers of a turnstile gate or layer, by HTTP status."
    );
    metrics::describe_counter!(
        "turnstile_shadowed_total",
        "Denials a gate in shadow mode let through, by the status it would have sent."
    );
    metrics::describe_counter!(
        "turnstile_evicted_total",
        "Idle keys a keyed limiter has evicted."
    );
    metrics::describe_gauge!("turnstile_keys", "Keys a keyed limiter holds now.");
    #[cfg(feature = "tower")]
    {
        metrics::describe_counter!(
            "turnstile_refunds_total",
            "Admissions given back by a layer settling responses, by result (exact, declined)."
        );
        metrics::describe_counter!(
            "turnstile_settled_permits_total",
            "Permits a layer settled after responses, by kind (charged, lent, forgiven, drained)."
        );
        metrics::describe_counter!(
            "turnstile_unsettled_total",
            "Admissions of a layer settling responses whose response never came (an error, or the future dropped)."
        );
        metrics::describe_counter!(
            "turnstile_denied_by_total",
            "Denials of a combined layer, by the limit that refused first."
        );
    }
    #[cfg(feature = "redis")]
    {
        metrics::describe_counter!(
            "turnstile_redis_calls_total",
            "Calls a Redis-backed limiter made that returned, by kind (lease, give_back, exact)."
        );
        metrics::describe_counter!(
            "turnstile_redis_failures_total",
            "Calls to Redis that failed: no connection, a timeout, an error reply."
        );
        metrics::describe_counter!(
            "turnstile_redis_fallbacks_total",
            "Decisions a Redis-backed limiter's failure policy made instead of Redis."
        );
        metrics::describe_counter!(
            "turnstile_redis_refunds_total",
            "Refunds of a Redis-backed limiter's admissions, by outcome (refunded, declined)."
        );
        metrics::describe_gauge!(
            "turnstile_redis_degraded",
            "1 while a Redis-backed limiter's calls fail (from a failed call until one succeeds), else 0."
        );
        metrics::describe_counter!(
            "turnstile_redis_degraded_periods_total",
            "Degraded periods of a Redis-backed limiter: each from a failed call until one succeeds."
        );
        metrics::describe_counter!(
            "turnstile_redis_fetch_waits_total",
            "Leased requests that found their key dry while its lease was fetched, and waited for that fetch instead of a call."
        );
        metrics::describe_counter!(
            "turnstile_redis_probes_total",
            "Leased requests a kept denial would have answered that asked Redis instead (one in every largest lease)."
        );
    }
}

impl DirectStats {
    /// Publish these counts as `turnstile_decisions_total` with the label
    /// `limiter`.
    pub fn publish(&self, limiter: &str) {
        decisions(limiter, "admitted", self.admitted);
        decisions(limiter, "denied", self.denied);
    }
}

impl KeyedStats {
    /// Publish these counts (decisions, evictions, keys) with the label
    /// `limiter`.
    pub fn publish(&self, limiter: &str) {
        decisions(limiter, "admitted", self.admitted);
        decisions(limiter, "denied", self.denied);
        decisions(limiter, "key_limit", self.denied_key_limit);
        keys_and_evictions(limiter, self.keys, self.evicted);
    }
}

impl GateStats {
    /// Publish these counts (responses by status, shadowed denials,
    /// evictions, keys) with the label `limiter`.
    pub fn publish(&self, limiter: &str) {
        responses(limiter, "200", self.admitted);
        responses(limiter, "401", self.unauthorized);
        responses(limiter, "429", self.too_many_requests);
        responses(limiter, "503", self.unavailable);
        shadowed(limiter, "429", self.shadowed_too_many_requests);
        shadowed(limiter, "503", self.shadowed_unavailable);
        keys_and_evictions(limiter, self.keys, self.evicted);
    }
}

#[cfg(feature = "tower")]
impl crate::http::tower::LayerStats {
    /// Publish the gate's counts and the layer's configuration errors
    /// (`turnstile_responses_total{status="500"}`) with the label `limiter`.
    pub fn publish(&self, limiter: &str) {
        self.gate.publish(limiter);
        responses(limiter, "500", self.misconfigured);
    }
}

#[cfg(feature = "tower")]
impl crate::http::tower::LimitsStats {
    /// Publish a combined layer's answers (`turnstile_responses_total` by
    /// status), its denials by limit (`turnstile_denied_by_total{limit}`),
    /// its refunds (`turnstile_refunds_total{result="exact"|"declined"}`)
    /// its settled permits (`turnstile_settled_permits_total{kind=
    /// "charged"|"lent"|"forgiven"|"drained"}`) and its admissions whose
    /// response never came (`turnstile_unsettled_total`), with the label
    /// `limiter`.
    pub fn publish(&self, limiter: &str) {
        responses(limiter, "200", self.admitted);
        responses(limiter, "401", self.unauthorized);
        responses(limiter, "429", self.too_many_requests);
        responses(limiter, "503", self.unavailable);
        responses(limiter, "500", self.misconfigured);
        for (limit, denied) in &self.denied_by {
            counter!(
                "turnstile_denied_by_total",
                "limiter" => limiter.to_owned(),
                "limit" => limit.clone()
            )
            .absolute(*denied);
        }
        refunds(limiter, "exact", self.refunded);
        refunds(limiter, "declined", self.refund_declined);
        settled_permits(limiter, "charged", self.charged);
        settled_permits(limiter, "lent", self.lent);
        settled_permits(limiter, "forgiven", self.forgiven);
        settled_permits(limiter, "drained", self.drained);
        counter!(
            "turnstile_unsettled_total",
            "limiter" => limiter.to_owned()
        )
        .absolute(self.unsettled);
    }
}

#[cfg(feature = "redis")]
impl crate::redis::GuardedStats {
    /// Write the counts as `turnstile_redis_failures_total{limiter}`,
    /// `turnstile_redis_fallbacks_total{limiter}`,
    /// `turnstile_redis_refunds_total{limiter,outcome}` (outcome `refunded`,
    /// `declined`) and `turnstile_redis_degraded_periods_total{limiter}`, and
    /// the gauge `turnstile_redis_degraded{limiter}` (1 while degraded, else
    /// 0).
    pub fn publish(&self, limiter: &str) {
        redis_failures(limiter, self.failures, self.fallbacks);
        redis_refunds(limiter, self.refunded, self.refund_declined);
        redis_degraded(limiter, self.degraded, self.degraded_periods);
    }
}

#[cfg(feature = "redis")]
impl crate::redis::LeasedStats {
    /// Write the counts as `turnstile_redis_calls_total{limiter,call}` (call
    /// `lease`, `give_back`, `exact`), `turnstile_redis_failures_total`,
    /// `turnstile_redis_fallbacks_total`,
    /// `turnstile_redis_degraded_periods_total`,
    /// `turnstile_redis_fetch_waits_total` and `turnstile_redis_probes_total`,
    /// and the gauge `turnstile_redis_degraded{limiter}` (1 while degraded,
    /// else 0).
    pub fn publish(&self, limiter: &str) {
        redis_calls(limiter, "lease", self.lease_calls);
        redis_calls(limiter, "give_back", self.give_back_calls);
        redis_calls(limiter, "exact", self.exact_calls);
        redis_failures(limiter, self.failures, self.fallbacks);
        redis_leased(limiter, self.fetch_waits, self.probes);
        redis_degraded(limiter, self.degraded, self.degraded_periods);
    }
}

#[cfg(all(feature = "redis", feature = "tower", feature = "tokio"))]
impl crate::redis::RedisLayerStats {
    /// Write the layer's answers as `turnstile_responses_total{limiter,status}`,
    /// as [`LayerStats::publish`](crate::http::tower::LayerStats::publish) does.
    pub fn publish(&self, limiter: &str) {
        responses(limiter, "200", self.admitted);
        responses(limiter, "401", self.unauthorized);
        responses(limiter, "429", self.too_many_requests);
        responses(limiter, "500", self.misconfigured);
    }
}

/// A limiter, gate or layer whose counts a [`Registry`] publishes under a
/// name: each type's `stats().publish(name)`. Implemented for
/// [`RateLimiter`](crate::RateLimiter) when counted
/// ([`counted`](crate::RateLimiter::counted)), [`KeyedLimiter`](crate::KeyedLimiter),
/// [`Gate`](crate::Gate), the tower layers ([`RateLimitLayer`](crate::tower::RateLimitLayer),
/// [`Limits`](crate::tower::Limits)), and the Redis limiters and layer;
/// and for an [`Arc`] of any of them, so that a limiter shared with the code
/// that decides can be registered as it is.
pub trait Observed: Send + Sync + 'static {
    /// Publish the counts now, with the label `limiter` = `name`.
    fn publish(&self, name: &str);
}

impl<T: Observed + ?Sized> Observed for Arc<T> {
    fn publish(&self, name: &str) {
        (**self).publish(name);
    }
}

impl<A, C> Observed for crate::limiter::RateLimiter<A, C, crate::limiter::Counted>
where
    Self: Send + Sync + 'static,
{
    fn publish(&self, name: &str) {
        self.stats().publish(name);
    }
}

impl<K, A, C, S> Observed for crate::keyed::KeyedLimiter<K, A, C, S>
where
    K: Hash + Eq,
    A: crate::algorithm::Algorithm,
    C: crate::clock::Clock,
    S: BuildHasher,
    Self: Send + Sync + 'static,
{
    fn publish(&self, name: &str) {
        self.stats().publish(name);
    }
}

/// A tiered set's counts, summed over its tiers (`tier_stats` has each
/// tier's).
impl<K, F, A, C, S> Observed for crate::keyed::tiered::Tiered<K, F, A, C, S>
where
    K: Hash + Eq,
    A: crate::algorithm::Algorithm,
    C: crate::clock::Clock,
    S: BuildHasher,
    Self: Send + Sync + 'static,
{
    fn publish(&self, name: &str) {
        use crate::http::gate::LimiterStats;
        self.limiter_stats().publish(name);
    }
}

impl<L> Observed for crate::http::gate::Gate<L>
where
    L: crate::http::gate::LimiterStats,
    Self: Send + Sync + 'static,
{
    fn publish(&self, name: &str) {
        self.stats().publish(name);
    }
}

#[cfg(feature = "tower")]
impl<X, L, R> Observed for crate::http::tower::RateLimitLayer<X, L, R>
where
    X: crate::http::tower::KeyExtractor,
    L: crate::http::gate::LimiterStats,
    Self: Send + Sync + 'static,
{
    fn publish(&self, name: &str) {
        self.stats().publish(name);
    }
}

#[cfg(feature = "tower")]
impl<R> Observed for crate::http::tower::Limits<R>
where
    Self: Send + Sync + 'static,
{
    fn publish(&self, name: &str) {
        self.stats().publish(name);
    }
}

#[cfg(feature = "redis")]
impl<A, C> Observed for crate::redis::Guarded<A, C>
where
    Self: Send + Sync + 'static,
{
    fn publish(&self, name: &str) {
        self.stats().publish(name);
    }
}

#[cfg(feature = "redis")]
impl<C: crate::clock::Clock> Observed for crate::redis::LeasedLimiter<C>
where
    Self: Send + Sync + 'static,
{
    fn publish(&self, name: &str) {
        self.stats().publish(name);
    }
}

#[cfg(all(feature = "redis", feature = "tower", feature = "tokio"))]
impl<L, X, R> Observed for crate::redis::RedisRateLimitLayer<L, X, R>
where
    Self: Send + Sync + 'static,
{
    fn publish(&self, name: &str) {
        self.stats().publish(name);
    }
}

/// Every limiter, gate and layer of an application under its name, published
/// together: the one place a `/metrics` handler asks.
///
/// Register each source once, where it is built (a layer is registered as a
/// clone: clones share their counts), and call [`publish`](Self::publish)
/// just before the exporter renders. A `Registry` is cheap to clone; clones
/// share the list. Registering a name again replaces its source.
///
/// ```
/// use std::sync::Arc;
/// use turnstile::metrics::Registry;
/// use turnstile::{Gate, KeyedLimiter, Quota, RateLimiter};
///
/// let registry = Registry::new();
/// let per_user = Arc::new(Gate::new(KeyedLimiter::<String>::new(Quota::per_second(10)?)));
/// let global = Arc::new(RateLimiter::new(Quota::per_second(1_000)?).counted());
/// registry.register("per_user", Arc::clone(&per_user));
/// registry.register("global", Arc::clone(&global));
/// assert_eq!(registry.names(), ["global", "per_user"]);
///
/// let _ = per_user.check(Some("alice"));
/// // In the `/metrics` handler, with the exporter's recorder installed: sets
/// // turnstile_responses_total{limiter="per_user",status="200"} to 1, and
/// // turnstile_decisions_total{limiter="global",...} from its counts.
/// registry.publish();
/// # Ok::<(), turnstile::QuotaError>(())
/// ```
///
/// With axum and `metrics-exporter-prometheus`, the whole handler is
/// `get(move || { registry.publish(); std::future::ready(handle.render()) })`
/// (the server example, `examples/server.rs`, serves it).
#[derive(Clone, Default)]
pub struct Registry {
    sources: Arc<Mutex<Sources>>,
}

/// The registered sources, by name, in name order.
type Sources = Vec<(String, Arc<dyn Observed>)>;

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Publish `source`'s counts under `name` from now on (replacing the
    /// source registered under that name, if any).
    pub fn register(&self, name: impl Into<String>, source: impl Observed) -> &Registry {
        let name = name.into();
        let source: Arc<dyn Observed> = Arc::new(source);
        let mut sources = self.lock();
        match sources.iter_mut().find(|(n, _)| *n == name) {
            Some((_, held)) => *held = source,
            None => sources.push((name, source)),
        }
        sources.sort_by(|a, b| a.0.cmp(&b.0));
        self
    }

    /// The registered names, in order.
    pub fn names(&self) -> Vec<String> {
        self.lock().iter().map(|(name, _)| name.clone()).collect()
    }

    /// Publish every registered source's counts now, each under its name.
    /// The sources are asked outside the registry's lock, so a slow one holds
    /// up no registration.
    pub fn publish(&self) {
        let sources: Vec<_> = self
            .lock()
            .iter()
            .map(|(name, source)| (name.clone(), Arc::clone(source)))
            .collect();
        for (name, source) in sources {
            source.publish(&name);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sources> {
        // A panic while holding the lock (in a sort or a push) leaves the
        // list whole: carry on with it.
        self.sources
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("names", &self.names())
            .finish()
    }
}
