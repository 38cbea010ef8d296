//! The service's counters, served as Prometheus text (`GET /metrics`).
//!
//! | series | labels |
//! |---|---|
//! | `turnstile_rls_decisions_total` | `domain`, `descriptor` (the limit's full key, `domain.key_value.key`; for a request's `limit` override, `domain.limit_override`, whatever its quota), `outcome`: `ok`, `over_limit`, `shadow_over_limit` (a would-be denial in shadow mode, answered OK) |
//! | `turnstile_rls_detailed_decisions_total` | the same, with `descriptor` the request's own `domain.key_value.key_value` (past [`DETAILED_NAME_HELD`] bytes, cut and ended with `#` and its SHA-1): only for limits with `detailed_metric: true`, at most [`DETAILED_PER_LIMIT`] values per limit (two limits whose values give one name, as `key_value` joins them, share its series) |
//! | `turnstile_rls_detailed_overflow_total` | `domain`, `descriptor`: decisions of a detailed limit past its bound of values, counted only in its aggregate series |
//! | `turnstile_rls_unknown_domain_total`, `turnstile_rls_unknown_descriptor_total` | none: requests for a domain not configured, descriptors that match no limit |
//! | `turnstile_rls_requests_total`, `turnstile_rls_invalid_requests_total` | none: requests decided; requests refused before any decision, past the bounds or malformed (gRPC `INVALID_ARGUMENT` or `INTERNAL`, `/json` 400) |
//! | `turnstile_rls_config_reloads_total`, `turnstile_rls_config_reload_errors_total` | none |
//! | `turnstile_rls_override_refused_total` | none: descriptors whose `limit` override was a new quota past the bound of override limits, answered `OVER_LIMIT` |
//! | `turnstile_rls_global_shadow_mode_total` | none: requests over a limit answered `OK` by the global shadow mode (`--shadow-mode`, `SHADOW_MODE`) |
//! | `turnstile_rls_redis_failures_total`, `turnstile_rls_redis_fallbacks_total`, `turnstile_rls_redis_degraded_periods_total`, `turnstile_rls_redis_failing_limits` (a gauge) | none; only with a Redis backend: calls to Redis that failed, decisions the failure policy made instead of Redis, degraded periods (a limit's failed call to its next answered one), limits failing now ([`RedisHealth`]) |
//!
//! **Never an unbounded number of series**: no label takes a value from a
//! request except the detailed series, which keep at most
//! [`DETAILED_PER_LIMIT`] values per limit (the first seen) and count the
//! rest in `turnstile_rls_detailed_overflow_total`; limits are bounded by
//! the configuration, and at most [`MAX_LIMITS`] of them have series (more,
//! across reloads, are counted under `descriptor="_other"`).
//!
//! Hand-written exposition over the service's own atomic counters, rather
//! than the `metrics` crates: no global recorder (two services in one
//! process, as the tests run them, keep their own counts), no exporter
//! stack, and a decision's cost is one map look-up and one relaxed
//! increment.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use crate::config::Rule;
use crate::redis_backend::RedisHealth;

/// Values kept per `detailed_metric` limit.
pub const DETAILED_PER_LIMIT: usize = 100;

/// The longest `descriptor` label of a detailed series kept as it is.
pub const DETAILED_NAME_HELD: usize = 256;

/// A detailed series' name up to [`DETAILED_NAME_HELD`] bytes; a longer
/// one (values are as long as a request makes them) cut at a character
/// boundary and ended with `#` and the SHA-1 of the whole name in hex, so
/// that [`DETAILED_PER_LIMIT`] names cost at most 25.6 KB a limit, and two
/// names meet only by a SHA-1 collision.
fn bounded_name(name: String) -> String {
    if name.len() <= DETAILED_NAME_HELD {
        return name;
    }
    let digest = sha1_smol::Sha1::from(name.as_bytes()).digest().to_string();
    let mut cut = DETAILED_NAME_HELD - 1 - digest.len();
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut held = String::with_capacity(DETAILED_NAME_HELD);
    held.push_str(&name[..cut]);
    held.push('#');
    held.push_str(&digest);
    held
}

/// Limits with series of their own.
pub const MAX_LIMITS: usize = 10_000;

/// A decision's outcome, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Within the limit (or unlimited).
    Ok,
    /// Over the limit, answered `OVER_LIMIT`.
    OverLimit,
    /// Over a limit in shadow mode, answered `OK`.
    ShadowOverLimit,
}

impl Outcome {
    const ALL: [Outcome; 3] = [Outcome::Ok, Outcome::OverLimit, Outcome::ShadowOverLimit];

    fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::OverLimit => "over_limit",
            Outcome::ShadowOverLimit => "shadow_over_limit",
        }
    }
}

#[derive(Debug, Default)]
struct Counts([AtomicU64; 3]);

impl Counts {
    fn add(&self, outcome: Outcome) {
        add(&self.0[outcome as usize]);
    }

    fn get(&self, outcome: Outcome) -> u64 {
        // Reporting only: orders nothing.
        self.0[outcome as usize].load(Ordering::Relaxed)
    }
}

fn add(counter: &AtomicU64) {
    // A counter read only for reporting: it orders nothing else.
    counter.fetch_add(1, Ordering::Relaxed);
}

#[derive(Debug, Default)]
struct LimitCounts {
    domain: String,
    counts: Counts,
    detailed: RwLock<HashMap<String, Arc<Counts>>>,
    overflow: AtomicU64,
}

/// The counters behind `/metrics`.
#[derive(Debug, Default)]
pub struct Metrics {
    limits: RwLock<HashMap<String, Arc<LimitCounts>>>,
    requests: AtomicU64,
    invalid: AtomicU64,
    unknown_domain: AtomicU64,
    unknown_descriptor: AtomicU64,
    reloads: AtomicU64,
    reload_errors: AtomicU64,
    override_refused: AtomicU64,
    global_shadow: AtomicU64,
    redis: OnceLock<Arc<RedisHealth>>,
}

impl Metrics {
    /// Serve the Redis backend's counts too (`turnstile_rls_redis_*`); the
    /// first call sets them, and a later one changes nothing.
    pub fn set_redis(&self, health: Arc<RedisHealth>) {
        let _ = self.redis.set(health);
    }

    /// A request was decided.
    pub fn request(&self) {
        add(&self.requests);
    }

    /// A request was refused as invalid.
    pub fn invalid(&self) {
        add(&self.invalid);
    }

    /// A request named a domain not configured.
    pub fn unknown_domain(&self) {
        add(&self.unknown_domain);
    }

    /// A descriptor matched no limit.
    pub fn unknown_descriptor(&self) {
        add(&self.unknown_descriptor);
    }

    /// A configuration reload succeeded.
    pub fn reloaded(&self) {
        add(&self.reloads);
    }

    /// A configuration reload failed (the old one stays in force).
    pub fn reload_failed(&self) {
        add(&self.reload_errors);
    }

    /// A descriptor's `limit` override asked for a new quota past the bound
    /// of override limits (answered `OVER_LIMIT`).
    pub fn override_refused(&self) {
        add(&self.override_refused);
    }

    /// A request over a limit was answered `OK` by the global shadow mode.
    pub fn global_shadow(&self) {
        add(&self.global_shadow);
    }

    /// Requests over a limit answered `OK` by the global shadow mode so far
    /// ([`global_shadow`](Self::global_shadow)).
    pub fn global_shadowed(&self) -> u64 {
        // Reporting only: orders nothing.
        self.global_shadow.load(Ordering::Relaxed)
    }

    /// Requests refused as invalid so far ([`invalid`](Self::invalid)).
    pub fn invalid_requests(&self) -> u64 {
        // Reporting only: orders nothing.
        self.invalid.load(Ordering::Relaxed)
    }

    /// Descriptors refused so ([`override_refused`](Self::override_refused)).
    pub fn overrides_refused(&self) -> u64 {
        // Reporting only: orders nothing.
        self.override_refused.load(Ordering::Relaxed)
    }

    /// The configuration reloads so far: `(succeeded, failed)`.
    pub fn reloads(&self) -> (u64, u64) {
        // Reporting only: orders nothing.
        (
            self.reloads.load(Ordering::Relaxed),
            self.reload_errors.load(Ordering::Relaxed),
        )
    }

    /// `rule` decided `outcome` on a descriptor of `domain` whose entries
    /// are `entries`.
    pub fn decided<'a, I>(&self, domain: &str, rule: &Rule, entries: I, outcome: Outcome)
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        let limit = self.limit(domain, &rule.series);
        limit.counts.add(outcome);
        if rule.detailed_metric {
            let mut name = domain.to_string();
            for (key, value) in entries {
                name.push('.');
                name.push_str(key);
                if !value.is_empty() {
                    name.push('_');
                    name.push_str(value);
                }
            }
            let name = bounded_name(name);
            let found = limit
                .detailed
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&name)
                .cloned();
            let counts = found.or_else(|| {
                let mut detailed = limit
                    .detailed
                    .write()
                    .unwrap_or_else(PoisonError::into_inner);
                if detailed.len() < DETAILED_PER_LIMIT || detailed.contains_key(&name) {
                    Some(Arc::clone(detailed.entry(name).or_default()))
                } else {
                    None
                }
            });
            match counts {
                Some(counts) => counts.add(outcome),
                None => add(&limit.overflow),
            }
        }
    }

    fn limit(&self, domain: &str, full_key: &str) -> Arc<LimitCounts> {
        let found = self
            .limits
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(full_key)
            .cloned();
        if let Some(limit) = found {
            return limit;
        }
        let mut limits = self.limits.write().unwrap_or_else(PoisonError::into_inner);
        let key = if limits.len() < MAX_LIMITS || limits.contains_key(full_key) {
            full_key
        } else {
            "_other"
        };
        let limit = limits.entry(key.to_string()).or_insert_with(|| {
            Arc::new(LimitCounts {
                domain: if key == "_other" {
                    String::new()
                } else {
                    domain.to_string()
                },
                ..LimitCounts::default()
            })
        });
        Arc::clone(limit)
    }

    /// The counters in Prometheus' text exposition format (0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let scalar = |out: &mut String, name: &str, help: &str, counter: &AtomicU64| {
            // Reporting only: orders nothing.
            let value = counter.load(Ordering::Relaxed);
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}\n"
            );
        };
        scalar(
            &mut out,
            "turnstile_rls_requests_total",
            "Requests decided.",
            &self.requests,
        );
        scalar(
            &mut out,
            "turnstile_rls_invalid_requests_total",
            "Requests refused as invalid: past the bounds or malformed (gRPC INVALID_ARGUMENT or INTERNAL, /json 400).",
            &self.invalid,
        );
        scalar(
            &mut out,
            "turnstile_rls_unknown_domain_total",
            "Requests for a domain that is not configured (answered OK).",
            &self.unknown_domain,
        );
        scalar(
            &mut out,
            "turnstile_rls_unknown_descriptor_total",
            "Descriptors that match no limit (answered OK).",
            &self.unknown_descriptor,
        );
        scalar(
            &mut out,
            "turnstile_rls_config_reloads_total",
            "Configuration reloads put in force.",
            &self.reloads,
        );
        scalar(
            &mut out,
            "turnstile_rls_config_reload_errors_total",
            "Configuration reloads refused (the previous configuration stayed in force).",
            &self.reload_errors,
        );
        scalar(
            &mut out,
            "turnstile_rls_override_refused_total",
            "Descriptors whose limit override was a new quota past the bound of override limits (answered OVER_LIMIT).",
            &self.override_refused,
        );
        scalar(
            &mut out,
            "turnstile_rls_global_shadow_mode_total",
            "Requests over a limit answered OK by the global shadow mode.",
            &self.global_shadow,
        );
        if let Some(redis) = self.redis.get() {
            let counts = redis.counts();
            for (name, kind, help, value) in [
                (
                    "turnstile_rls_redis_failures_total",
                    "counter",
                    "Calls to Redis that failed (no connection, a timeout, an error reply).",
                    counts.failures,
                ),
                (
                    "turnstile_rls_redis_fallbacks_total",
                    "counter",
                    "Decisions made by the Redis failure policy instead of Redis.",
                    counts.fallbacks,
                ),
                (
                    "turnstile_rls_redis_degraded_periods_total",
                    "counter",
                    "Degraded periods: from a limit's failed Redis call to its next answered one.",
                    counts.degraded_periods,
                ),
                (
                    "turnstile_rls_redis_failing_limits",
                    "gauge",
                    "Limits whose last call to Redis failed.",
                    counts.failing_limits,
                ),
            ] {
                let _ = write!(
                    out,
                    "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
                );
            }
        }
        let limits = self.limits.read().unwrap_or_else(PoisonError::into_inner);
        let mut names: Vec<&String> = limits.keys().collect();
        names.sort_unstable();
        out.push_str("# HELP turnstile_rls_decisions_total Descriptors decided, per limit and outcome.\n# TYPE turnstile_rls_decisions_total counter\n");
        for name in &names {
            let limit = &limits[*name];
            for outcome in Outcome::ALL {
                series(
                    &mut out,
                    "turnstile_rls_decisions_total",
                    &limit.domain,
                    name,
                    Some(outcome),
                    limit.counts.get(outcome),
                );
            }
        }
        out.push_str("# HELP turnstile_rls_detailed_decisions_total Descriptors decided, per value of a limit with detailed_metric.\n# TYPE turnstile_rls_detailed_decisions_total counter\n");
        // Two limits can give one value's name (`key: a` per value, asked
        // for `b.c_v`, beside `a: b` above `c` per value, asked for `v`):
        // one series each name, their counts added, as a scrape of one
        // series twice is not valid exposition.
        let mut detailed_series: std::collections::BTreeMap<(&str, String), [u64; 3]> =
            std::collections::BTreeMap::new();
        for name in &names {
            let limit = &limits[*name];
            let detailed = limit
                .detailed
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            for (value, counts) in detailed.iter() {
                let sum = detailed_series
                    .entry((limit.domain.as_str(), value.clone()))
                    .or_default();
                for outcome in Outcome::ALL {
                    sum[outcome as usize] =
                        sum[outcome as usize].saturating_add(counts.get(outcome));
                }
            }
        }
        for ((domain, value), counts) in &detailed_series {
            for outcome in Outcome::ALL {
                series(
                    &mut out,
                    "turnstile_rls_detailed_decisions_total",
                    domain,
                    value,
                    Some(outcome),
                    counts[outcome as usize],
                );
            }
        }
        out.push_str("# HELP turnstile_rls_detailed_overflow_total Decisions of a detailed_metric limit past its bound of values.\n# TYPE turnstile_rls_detailed_overflow_total counter\n");
        for name in &names {
            let limit = &limits[*name];
            // Reporting only: orders nothing.
            let overflow = limit.overflow.load(Ordering::Relaxed);
            if overflow > 0 {
                series(
                    &mut out,
                    "turnstile_rls_detailed_overflow_total",
                    &limit.domain,
                    name,
                    None,
                    overflow,
                );
            }
        }
        out
    }
}

fn series(
    out: &mut String,
    metric: &str,
    domain: &str,
    descriptor: &str,
    outcome: Option<Outcome>,
    value: u64,
) {
    let _ = write!(
        out,
        "{metric}{{domain=\"{}\",descriptor=\"{}\"",
        escape(domain),
        escape(descriptor)
    );
    if let Some(outcome) = outcome {
        let _ = write!(out, ",outcome=\"{}\"", outcome.label());
    }
    let _ = writeln!(out, "}} {value}");
}

/// A label value as the text format needs it: `\`, `"` and newlines escaped.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}
