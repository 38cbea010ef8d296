//! The decision on one `RateLimitRequest`, whatever carried it (gRPC or the
//! JSON endpoint): [`RateLimitService::should_rate_limit`].

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit as PbUnit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use turnstile::{Outcome, RetryAfter};

use crate::backend::{AlgorithmKind, Backend, LimitSpec, LimitState, Unit, Verdict};
use crate::config::{Config, Rule};
use crate::metrics::{Metrics, Outcome as Counted};

/// Bounds on what one request may carry; a request beyond them is refused
/// with [`RequestError`] (gRPC `INVALID_ARGUMENT`, HTTP 400) before any
/// limit is touched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Descriptors per request (default 64).
    pub max_descriptors: usize,
    /// Entries per descriptor (default 16).
    pub max_entries: usize,
    /// Bytes in the domain (default 1,024). An entry's key or value is
    /// bounded only by the message size: Envoy allows a request whose
    /// rate-limit call fails (`failure_mode_deny` is off by default), so a
    /// bound on values would let a client that pads one header or path past
    /// it through every limit of the request. A long key costs no more
    /// memory for it (held as its hash past [`MAX_KEY_HELD`] bytes), nor a
    /// long series name in `/metrics`.
    pub max_length: usize,
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds {
            max_descriptors: 64,
            max_entries: 16,
            max_length: 1_024,
        }
    }
}

/// Why a request was refused without a decision.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestError {
    /// The domain is empty.
    EmptyDomain,
    /// The request has no descriptor.
    NoDescriptors,
    /// More descriptors than [`Bounds::max_descriptors`].
    TooManyDescriptors {
        /// Descriptors sent.
        count: usize,
        /// The bound.
        max: usize,
    },
    /// A descriptor with more entries than [`Bounds::max_entries`].
    TooManyEntries {
        /// The descriptor's index.
        descriptor: usize,
        /// Entries sent.
        count: usize,
        /// The bound.
        max: usize,
    },
    /// A domain longer than [`Bounds::max_length`].
    TooLong {
        /// `domain`.
        what: &'static str,
        /// Its length in bytes.
        length: usize,
        /// The bound.
        max: usize,
    },
    /// A descriptor's `limit` override in a unit this service does not
    /// keep (Envoy's `RateLimitUnit` `UNKNOWN`, or a number it does not
    /// define).
    UnsupportedOverrideUnit {
        /// The descriptor's index.
        descriptor: usize,
        /// The unit sent, as Envoy's enum numbers it.
        unit: i32,
    },
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::EmptyDomain => write!(f, "rate limit domain must not be empty"),
            RequestError::NoDescriptors => {
                write!(f, "rate limit descriptor list must not be empty")
            }
            RequestError::TooManyDescriptors { count, max } => {
                write!(f, "{count} descriptors in one request: send at most {max}")
            }
            RequestError::TooManyEntries {
                descriptor,
                count,
                max,
            } => write!(
                f,
                "descriptor {descriptor} has {count} entries: send at most {max}"
            ),
            RequestError::TooLong { what, length, max } => {
                write!(f, "a {what} of {length} bytes: send at most {max}")
            }
            RequestError::UnsupportedOverrideUnit { descriptor, unit } => {
                let name = RateLimitUnit::try_from(*unit)
                    .map_or_else(|_| unit.to_string(), |u| u.as_str_name().to_string());
                write!(
                    f,
                    "descriptor {descriptor}'s limit override has unit {name}: \
                     send SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR"
                )
            }
        }
    }
}

impl std::error::Error for RequestError {}

/// The header fields a response asks Envoy to add to its answer
/// (`response_headers_to_add`).
///
/// # Examples
///
/// The same request answered in each mode, by a fresh service each time:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
/// use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
/// use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
/// use turnstile::ManualClock;
/// use turnstile_server::backend::InProcess;
/// use turnstile_server::clock::ServiceClock;
/// use turnstile_server::config::Config;
/// use turnstile_server::service::{Bounds, EnvoyHeaderNames, RateLimitService, ResponseHeaders};
///
/// let yaml = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
/// let files = [("api.yaml".to_string(), yaml.to_string())];
/// let service = |headers| -> Result<RateLimitService, Box<dyn std::error::Error>> {
///     // A manual clock stands at 0, the start of a minute's window.
///     let backend = InProcess::new(ServiceClock::manual(ManualClock::new()), 1_000);
///     let config = Config::from_files(&files, &backend)?;
///     Ok(RateLimitService::new(config, Bounds::default(), false).with_response_headers(headers))
/// };
/// let request = RateLimitRequest {
///     domain: "api".to_string(),
///     descriptors: vec![RateLimitDescriptor {
///         entries: vec![Entry { key: "user".to_string(), value: "alice".to_string() }],
///         ..RateLimitDescriptor::default()
///     }],
///     hits_addend: 0,
/// };
/// let fields = |response: RateLimitResponse| -> Vec<String> {
///     let fields = response.response_headers_to_add.iter();
///     fields.map(|h| format!("{}: {}", h.key, h.value)).collect()
/// };
///
/// // Off, the default: no field.
/// let off = service(ResponseHeaders::default())?;
/// assert!(fields(off.should_rate_limit(&request).await?).is_empty());
///
/// // envoyproxy/ratelimit's: the limit, what this request left, and the
/// // seconds to the end of the window.
/// let envoy = service(ResponseHeaders::Envoy(EnvoyHeaderNames::default()))?;
/// assert_eq!(
///     fields(envoy.should_rate_limit(&request).await?),
///     ["RateLimit-Limit: 5", "RateLimit-Remaining: 4", "RateLimit-Reset: 60"]
/// );
///
/// // The IETF draft's: the policy (5 in a window of 60 seconds) and what is
/// // left under it.
/// let draft = service(ResponseHeaders::Draft)?;
/// assert_eq!(
///     fields(draft.should_rate_limit(&request).await?),
///     [r#"RateLimit-Policy: "api.user";q=5;w=60"#, r#"RateLimit: "api.user";r=4"#]
/// );
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ResponseHeaders {
    /// None (the default, as envoyproxy/ratelimit's).
    #[default]
    Off,
    /// The IETF draft's `RateLimit-Policy` and `RateLimit` (every limit
    /// applied, with its policy) and `Retry-After` when over a limit that a
    /// wait can admit (`--response-headers`).
    Draft,
    /// envoyproxy/ratelimit's (`LIMIT_RESPONSE_HEADERS_ENABLED=true`,
    /// `--response-headers=envoy`): three fields of the descriptor closest
    /// to its limit, chosen as it chooses it: the last descriptor over its
    /// limit if one is, else the first with the fewest permits left among
    /// those with a limit (an unlimited or unmatched descriptor has none).
    /// The limit field is its `requests_per_unit` alone (no quota policy);
    /// the remaining field its `limit_remaining`; the reset field its
    /// `duration_until_reset` in whole seconds rounded up (for a fixed
    /// window, the seconds to the end of the calendar's window, as
    /// envoyproxy/ratelimit computes it, which is also what it gives when
    /// the status has no `duration_until_reset`). No field when no
    /// descriptor has a limit.
    Envoy(EnvoyHeaderNames),
}

/// The names of envoyproxy/ratelimit's three header fields
/// (`LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`).
///
/// # Examples
///
/// Names of one's own, here on a request over its limit:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
/// use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
/// use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
/// use turnstile::ManualClock;
/// use turnstile_server::backend::InProcess;
/// use turnstile_server::clock::ServiceClock;
/// use turnstile_server::config::Config;
/// use turnstile_server::service::{Bounds, EnvoyHeaderNames, RateLimitService, ResponseHeaders};
///
/// let defaults = EnvoyHeaderNames::default();
/// assert_eq!(defaults.remaining, "RateLimit-Remaining");
/// let names = EnvoyHeaderNames {
///     limit: "X-RateLimit-Limit".to_string(),
///     remaining: "X-RateLimit-Remaining".to_string(),
///     reset: "X-RateLimit-Reset".to_string(),
/// };
///
/// let yaml = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
/// let backend = InProcess::new(ServiceClock::manual(ManualClock::new()), 1_000);
/// let config = Config::from_files(&[("api.yaml".to_string(), yaml.to_string())], &backend)?;
/// let service = RateLimitService::new(config, Bounds::default(), false)
///     .with_response_headers(ResponseHeaders::Envoy(names));
/// let request = RateLimitRequest {
///     domain: "api".to_string(),
///     descriptors: vec![RateLimitDescriptor {
///         entries: vec![Entry { key: "user".to_string(), value: "alice".to_string() }],
///         ..RateLimitDescriptor::default()
///     }],
///     hits_addend: 0,
/// };
/// service.should_rate_limit(&request).await?;
/// // The second request in the minute is over the limit of 1.
/// let response = service.should_rate_limit(&request).await?;
/// let fields: Vec<String> = response
///     .response_headers_to_add
///     .iter()
///     .map(|h| format!("{}: {}", h.key, h.value))
///     .collect();
/// assert_eq!(
///     fields,
///     ["X-RateLimit-Limit: 1", "X-RateLimit-Remaining: 0", "X-RateLimit-Reset: 60"]
/// );
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvoyHeaderNames {
    /// The limit's `requests_per_unit` (default `RateLimit-Limit`).
    pub limit: String,
    /// Its `limit_remaining` (default `RateLimit-Remaining`).
    pub remaining: String,
    /// Seconds until it resets (default `RateLimit-Reset`).
    pub reset: String,
}

impl Default for EnvoyHeaderNames {
    fn default() -> EnvoyHeaderNames {
        EnvoyHeaderNames {
            limit: "RateLimit-Limit".to_string(),
            remaining: "RateLimit-Remaining".to_string(),
            reset: "RateLimit-Reset".to_string(),
        }
    }
}

/// envoyproxy/ratelimit's three header fields for `statuses`
/// ([`ResponseHeaders::Envoy`]).
fn envoy_headers(statuses: &[DescriptorStatus], names: &EnvoyHeaderNames) -> Vec<HeaderValue> {
    let mut closest: Option<&DescriptorStatus> = None;
    let mut fewest = u32::MAX;
    for status in statuses {
        if status.current_limit.is_some() && status.limit_remaining < fewest {
            closest = Some(status);
            fewest = status.limit_remaining;
        }
        if status.code == Code::OverLimit as i32 {
            closest = Some(status);
            fewest = 0;
        }
    }
    let Some((status, limit)) = closest.and_then(|s| Some((s, s.current_limit.as_ref()?))) else {
        return Vec::new();
    };
    let reset = match &status.duration_until_reset {
        // A whole allowance (a check of 0 hits on a key with none spent)
        // says 0: envoyproxy/ratelimit says its window's end, as below.
        Some(d) if d.seconds > 0 || d.nanos > 0 => d.seconds.saturating_add(i64::from(d.nanos > 0)),
        _ => {
            let unit = unit_seconds(limit.unit);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(0));
            if unit == 0 { 0 } else { unit - now % unit }
        }
    };
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_string(),
        value,
        ..HeaderValue::default()
    };
    vec![
        header(&names.limit, limit.requests_per_unit.to_string()),
        header(&names.remaining, status.limit_remaining.to_string()),
        header(&names.reset, reset.to_string()),
    ]
}

/// The seconds in a unit, as envoyproxy/ratelimit counts them (a month of
/// 30 days, a year of 365); 0 for none.
fn unit_seconds(unit: i32) -> i64 {
    match PbUnit::try_from(unit) {
        Ok(PbUnit::Second) => 1,
        Ok(PbUnit::Minute) => 60,
        Ok(PbUnit::Hour) => 3_600,
        Ok(PbUnit::Day) => 86_400,
        Ok(PbUnit::Week) => 7 * 86_400,
        Ok(PbUnit::Month) => 30 * 86_400,
        Ok(PbUnit::Year) => 365 * 86_400,
        Ok(PbUnit::Unknown) | Err(_) => 0,
    }
}

/// Counters of the service's decisions.
#[derive(Debug, Default)]
pub struct Stats {
    requests: AtomicU64,
    over_limit: AtomicU64,
    shadow_denials: AtomicU64,
}

/// A copy of the counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Requests decided.
    pub requests: u64,
    /// Descriptors answered `OVER_LIMIT`.
    pub over_limit: u64,
    /// Descriptors over a limit in shadow mode, answered `OK`.
    pub shadow_denials: u64,
}

impl Stats {
    fn add(counter: &AtomicU64) {
        // A counter read only for reporting: it orders nothing else.
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        // Reporting only: each counter is read on its own, no order needed.
        StatsSnapshot {
            requests: self.requests.load(Ordering::Relaxed),
            over_limit: self.over_limit.load(Ordering::Relaxed),
            shadow_denials: self.shadow_denials.load(Ordering::Relaxed),
        }
    }
}

/// The rate-limit service: a configuration that can be swapped whole, and
/// the decisions on it.
#[derive(Debug)]
pub struct RateLimitService {
    config: ArcSwap<Config>,
    bounds: Bounds,
    headers: ResponseHeaders,
    stats: Stats,
    metrics: Metrics,
    overrides: Option<Overrides>,
    /// The global shadow mode: a request over a limit is answered `OK`.
    shadow_mode: bool,
    /// A request's descriptors spend only if none is over its limit
    /// ([`with_stop_increments`](RateLimitService::with_stop_increments)).
    stop_increments: bool,
    /// Whether the health checks answer serving: true from the start, false
    /// once the service is shutting down.
    serving: tokio::sync::watch::Sender<bool>,
}

/// The default bound on the distinct quotas that descriptors' `limit`
/// overrides may ask for ([`RateLimitService::with_overrides`]).
pub const DEFAULT_MAX_OVERRIDE_LIMITS: usize = 16;

/// The limits that descriptors set themselves with a `limit` override: one
/// per domain and quota, made by the backend the first time it is asked for
/// and kept (across reloads: the configuration does not name them).
struct Overrides {
    backend: Arc<dyn Backend>,
    max: usize,
    rules: RwLock<HashMap<(String, u32, Unit), Arc<Rule>>>,
    /// When the last search for a reclaimable limit ran (it sweeps every
    /// held limit, so at most once a second).
    last_reclaim: std::sync::Mutex<Option<std::time::Instant>>,
}

/// How often a full set of override limits is searched for one to reclaim.
const RECLAIM_EVERY: Duration = Duration::from_secs(1);

impl fmt::Debug for Overrides {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = self
            .rules
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        f.debug_struct("Overrides")
            .field("backend", &self.backend)
            .field("max", &self.max)
            .field("held", &held)
            .finish()
    }
}

impl Overrides {
    /// Drop one held limit that no request is deciding on and that holds
    /// nothing a fresh one would not (every key back at its whole allowance,
    /// swept: [`LimitState::reclaimable`]), to make room for a new quota:
    /// a slot is not kept for good by a quota asked for once. `false` when
    /// none is, or a search ran within the last second.
    fn reclaim(&self, rules: &mut HashMap<(String, u32, Unit), Arc<Rule>>) -> bool {
        {
            let mut last = self
                .last_reclaim
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let now = std::time::Instant::now();
            if last.is_some_and(|at| now.duration_since(at) < RECLAIM_EVERY) {
                return false;
            }
            *last = Some(now);
        }
        let idle = rules.iter().find_map(|(key, rule)| {
            // Only the map holds it: no request is deciding on it.
            let unused = Arc::strong_count(rule) == 1;
            (unused && rule.state.as_ref().is_none_or(|s| s.reclaimable())).then(|| key.clone())
        });
        match idle {
            Some(key) => rules.remove(&key).is_some(),
            None => false,
        }
    }

    /// The limit of `requests_per_unit` per `unit` in `domain`, made now if
    /// it is new; `None` when it is new and `max` limits are held already,
    /// or when the backend cannot make it.
    fn rule(&self, domain: &str, requests_per_unit: u32, unit: Unit) -> Option<Arc<Rule>> {
        let key = (domain.to_string(), requests_per_unit, unit);
        if let Some(rule) = self
            .rules
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return Some(Arc::clone(rule));
        }
        let mut rules = self.rules.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(rule) = rules.get(&key) {
            return Some(Arc::clone(rule));
        }
        if rules.len() >= self.max && !self.reclaim(&mut rules) {
            return None;
        }
        let full_key = format!(
            "{domain}.limit_override.{requests_per_unit}_per_{}",
            unit_name(unit)
        );
        let state = if requests_per_unit == 0 {
            // A limit of 0 denies everything and needs no state, as in the
            // configuration.
            None
        } else {
            let spec = LimitSpec {
                full_key: full_key.clone(),
                requests_per_unit,
                unit,
                algorithm: AlgorithmKind::FixedWindow,
                burst: None,
            };
            Some(self.backend.limit(&spec).ok()?)
        };
        let rule = Arc::new(Rule {
            full_key,
            series: format!("{domain}.limit_override"),
            name: None,
            requests_per_unit,
            unit: Some(unit),
            unlimited: false,
            shadow_mode: false,
            replaces: Vec::new(),
            detailed_metric: false,
            state,
        });
        rules.insert(key, Arc::clone(&rule));
        Some(rule)
    }
}

impl RateLimitService {
    /// A service deciding on `config`, refusing requests beyond `bounds`;
    /// with `headers`, each response carries the `RateLimit-Policy`,
    /// `RateLimit` and (when over a limit) `Retry-After` header fields for
    /// Envoy to add to its answer ([`ResponseHeaders::Draft`];
    /// envoyproxy/ratelimit's fields instead:
    /// [`with_response_headers`](Self::with_response_headers)).
    pub fn new(config: Config, bounds: Bounds, headers: bool) -> RateLimitService {
        RateLimitService {
            config: ArcSwap::from_pointee(config),
            bounds,
            headers: if headers {
                ResponseHeaders::Draft
            } else {
                ResponseHeaders::Off
            },
            stats: Stats::default(),
            metrics: Metrics::default(),
            overrides: None,
            shadow_mode: false,
            stop_increments: false,
            serving: tokio::sync::watch::Sender::new(true),
        }
    }

    /// Whether the health checks (`GET /healthcheck`, gRPC health) answer
    /// serving. [`serve`](crate::server::serve) sets it false when its
    /// shutdown begins and closes its listeners right after: a gRPC health
    /// `Watch` opened before then, and anything reading this flag, see the
    /// service go down while its connections drain (decisions on them are
    /// still answered), and a probe that connects afresh finds the port
    /// closed. There is no delay between the two; a deployment that wants
    /// probes to fail before the port closes signals a readiness change of
    /// its own first (as Kubernetes does by removing the endpoint).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile_server::config::Config;
    /// use turnstile_server::service::{Bounds, RateLimitService};
    ///
    /// let service = RateLimitService::new(Config::default(), Bounds::default(), false);
    /// let mut watch = service.watch_serving();
    /// assert!(service.serving());
    /// service.set_serving(false);
    /// assert!(!service.serving());
    /// // A watcher (the gRPC health service's statuses) is told.
    /// assert!(watch.has_changed()?);
    /// assert!(!*watch.borrow_and_update());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_serving(&self, serving: bool) {
        self.serving.send_replace(serving);
    }

    /// What the health checks answer: [`set_serving`](Self::set_serving).
    pub fn serving(&self) -> bool {
        *self.serving.borrow()
    }

    /// Told of each change of [`serving`](Self::serving).
    pub fn watch_serving(&self) -> tokio::sync::watch::Receiver<bool> {
        self.serving.subscribe()
    }

    /// Add `headers` to each response (in place of what
    /// [`new`](Self::new)'s `headers` chose).
    #[must_use]
    pub fn with_response_headers(mut self, headers: ResponseHeaders) -> RateLimitService {
        self.headers = headers;
        self
    }

    /// The global shadow mode, as envoyproxy/ratelimit's `SHADOW_MODE`: a
    /// request over a limit is answered `OK` overall (its descriptors'
    /// statuses are left `OVER_LIMIT`, as there, and no `Retry-After` is
    /// added) and counted in `turnstile_rls_global_shadow_mode_total`. The
    /// limits still count what they admit, so turning the mode off enforces
    /// them from where they stand.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    /// use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    /// use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    /// use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    /// use turnstile::ManualClock;
    /// use turnstile_server::backend::InProcess;
    /// use turnstile_server::clock::ServiceClock;
    /// use turnstile_server::config::Config;
    /// use turnstile_server::service::{Bounds, RateLimitService};
    ///
    /// let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    /// let backend = InProcess::new(ServiceClock::manual(ManualClock::new()), 1_000);
    /// let config = Config::from_files(&[("d.yaml".to_string(), yaml.to_string())], &backend)?;
    /// let service = RateLimitService::new(config, Bounds::default(), false).with_shadow_mode(true);
    /// let request = RateLimitRequest {
    ///     domain: "d".to_string(),
    ///     descriptors: vec![RateLimitDescriptor {
    ///         entries: vec![Entry { key: "k".to_string(), value: "v".to_string() }],
    ///         ..RateLimitDescriptor::default()
    ///     }],
    ///     hits_addend: 0,
    /// };
    /// let first = service.should_rate_limit(&request).await?;
    /// assert_eq!(first.overall_code, Code::Ok as i32);
    /// // Over the limit: answered OK; the descriptor's status still says so.
    /// let over = service.should_rate_limit(&request).await?;
    /// assert_eq!(over.overall_code, Code::Ok as i32);
    /// assert_eq!(over.statuses[0].code, Code::OverLimit as i32);
    /// assert_eq!(service.metrics().global_shadowed(), 1);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_shadow_mode(mut self, shadow_mode: bool) -> RateLimitService {
        self.shadow_mode = shadow_mode;
        self
    }

    /// A request's descriptors spend together or not at all, as
    /// envoyproxy/ratelimit's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`:
    /// when two or more of them have limits, each limit is first checked
    /// for the descriptor's hits, spending nothing; if any would be over its
    /// limit, no descriptor spends, and each is answered by its check (the
    /// over ones `OVER_LIMIT` with their waits, the others `OK` with what
    /// they have now). Otherwise each spends as without the setting. A
    /// descriptor past the bound of override limits is over its limit too;
    /// a limit in shadow mode (`shadow_mode: true`) is not enforced, so over
    /// it the others still spend (the request goes on). The global shadow
    /// mode ([`with_shadow_mode`](Self::with_shadow_mode)) answers `OK` as
    /// always, and the limits count as if enforcing: a request that one of
    /// them is over spends nothing.
    /// Without it (the default, as there) each descriptor within its limit
    /// spends its hits whatever the others answer, and one refused for more
    /// hits than its key has left spends what is left; with it, a
    /// descriptor over its limit spends nothing even alone.
    ///
    /// The checks and the spending after them are two steps, not one: a
    /// request racing another on the same limits can still be refused by
    /// one descriptor after others have spent, as there; so can one whose
    /// Redis limit is leased, where a lease call may ask Redis for more than
    /// the check did (see `LeasedLimiter::peek_n`). Descriptors of one
    /// request on the same limit and key are checked for their hits
    /// together. The setting costs a check per limited descriptor of each
    /// request (with the Redis backends, a call each, but in leased mode
    /// where the lease held or a denial kept answers).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    /// use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    /// use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    /// use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    /// use turnstile::ManualClock;
    /// use turnstile_server::backend::InProcess;
    /// use turnstile_server::clock::ServiceClock;
    /// use turnstile_server::config::Config;
    /// use turnstile_server::service::{Bounds, RateLimitService};
    ///
    /// // 1 an hour per user, 10 an hour per path.
    /// let yaml = "domain: d\ndescriptors:\n  \
    ///     - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  \
    ///     - key: path\n    rate_limit: {unit: hour, requests_per_unit: 10}\n";
    /// let backend = InProcess::new(ServiceClock::manual(ManualClock::new()), 1_000);
    /// let config = Config::from_files(&[("d.yaml".to_string(), yaml.to_string())], &backend)?;
    /// let service =
    ///     RateLimitService::new(config, Bounds::default(), false).with_stop_increments(true);
    /// let one = |key: &str, value: &str| RateLimitDescriptor {
    ///     entries: vec![Entry { key: key.to_string(), value: value.to_string() }],
    ///     ..RateLimitDescriptor::default()
    /// };
    /// let request = |user: &str| RateLimitRequest {
    ///     domain: "d".to_string(),
    ///     descriptors: vec![one("user", user), one("path", "/")],
    ///     hits_addend: 0,
    /// };
    /// assert_eq!(service.should_rate_limit(&request("alice")).await?.overall_code, Code::Ok as i32);
    /// // alice is over her limit: the path's limit spends nothing for her.
    /// for _ in 0..20 {
    ///     let over = service.should_rate_limit(&request("alice")).await?;
    ///     assert_eq!(over.statuses[1].code, Code::Ok as i32);
    ///     assert_eq!(over.statuses[1].limit_remaining, 9);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_stop_increments(mut self, stop_increments: bool) -> RateLimitService {
        self.stop_increments = stop_increments;
        self
    }

    /// The bounds requests are held to.
    pub fn bounds(&self) -> Bounds {
        self.bounds
    }

    /// Honour descriptors' `limit` overrides, as envoyproxy/ratelimit does:
    /// in a configured domain, a descriptor that carries one is decided
    /// against `requests_per_unit` per `unit` in a fixed window (its
    /// algorithm), not the configuration's limit, with shadow mode, names
    /// and `replaces` off. The descriptor's keys and values together are its
    /// key in that limit, so descriptors that differ in any entry are
    /// counted apart, and one limit per domain and quota is kept, made by
    /// `backend` (in process or in Redis, as the configured limits) the
    /// first time it is asked for. At most `max` such limits are kept: a
    /// descriptor asking for a new quota past them takes the place of a held
    /// limit that holds nothing a fresh one would not (no request deciding
    /// on it, every key back at its whole allowance; searched for at most
    /// once a second), and is otherwise answered `OVER_LIMIT` (never
    /// unbounded memory, never admitted untracked) and counted in
    /// `turnstile_rls_override_refused_total`. Every unit of Envoy's enum is
    /// kept (`WEEK` by its number, 7); `UNKNOWN`, or a number Envoy does not
    /// define, is refused with [`RequestError::UnsupportedOverrideUnit`].
    ///
    /// Without this, an override is not read: the configuration decides.
    #[must_use]
    pub fn with_overrides(mut self, backend: Arc<dyn Backend>, max: usize) -> RateLimitService {
        self.overrides = Some(Overrides {
            backend,
            max,
            rules: RwLock::new(HashMap::new()),
            last_reclaim: std::sync::Mutex::new(None),
        });
        self
    }

    /// Replace the configuration: requests already deciding finish on the
    /// old one, every later one uses the new one.
    pub fn set_config(&self, config: Config) {
        self.config.store(Arc::new(config));
    }

    /// The configuration in use.
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// The counters.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// The counters behind `/metrics`.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    fn check_bounds(&self, request: &RateLimitRequest) -> Result<(), RequestError> {
        let bounds = self.bounds;
        if request.domain.is_empty() {
            return Err(RequestError::EmptyDomain);
        }
        if request.domain.len() > bounds.max_length {
            return Err(RequestError::TooLong {
                what: "domain",
                length: request.domain.len(),
                max: bounds.max_length,
            });
        }
        if request.descriptors.is_empty() {
            return Err(RequestError::NoDescriptors);
        }
        if request.descriptors.len() > bounds.max_descriptors {
            return Err(RequestError::TooManyDescriptors {
                count: request.descriptors.len(),
                max: bounds.max_descriptors,
            });
        }
        for (i, descriptor) in request.descriptors.iter().enumerate() {
            if descriptor.entries.len() > bounds.max_entries {
                return Err(RequestError::TooManyEntries {
                    descriptor: i,
                    count: descriptor.entries.len(),
                    max: bounds.max_entries,
                });
            }
            if let Some(limit) = &descriptor.limit
                && self.overrides.is_some()
                && override_unit(limit).is_none()
            {
                return Err(RequestError::UnsupportedOverrideUnit {
                    descriptor: i,
                    unit: limit.unit,
                });
            }
        }
        Ok(())
    }

    /// Decide `request`: one status per descriptor, `OVER_LIMIT` overall if
    /// any descriptor is.
    ///
    /// Hits: the request's `hits_addend`, where 0 (unset) counts 1; a
    /// descriptor's own `hits_addend`, when set, overrides it, and an explicit
    /// 0 checks without spending (`OVER_LIMIT` when not even one permit is
    /// left, with every backend; the Redis backends read the limit's state
    /// in Redis, or the lease held here: see
    /// [`RedisBackend`](crate::redis_backend::RedisBackend)).
    /// `is_negative_hits` (a give-back) is answered as a check: nothing is
    /// spent or returned.
    ///
    /// A descriptor refused for more hits than its key has left spends what
    /// is left (unless [`with_stop_increments`](Self::with_stop_increments)):
    /// envoyproxy/ratelimit counts a refused request's hits, and a count
    /// reported after the fact (Envoy's `apply_on_stream_done`, with the
    /// `hits_addend` an LLM's response reports) must use the limit up even
    /// when it is larger than what is left. The rest is lent where the limit
    /// can owe it ([`LimitState::lend`]: an
    /// in-process token bucket or GCRA, up to one fill ahead) and forgiven
    /// elsewhere. Its `duration_until_reset` is the wait for the same
    /// request after that.
    ///
    /// # Errors
    ///
    /// [`RequestError`] for an empty domain or descriptor list, or a request
    /// beyond the [`Bounds`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    /// use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    /// use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    /// use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    /// use turnstile::ManualClock;
    /// use turnstile_server::backend::InProcess;
    /// use turnstile_server::clock::ServiceClock;
    /// use turnstile_server::config::Config;
    /// use turnstile_server::service::{Bounds, RateLimitService, RequestError};
    ///
    /// let yaml = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
    /// let clock = ManualClock::new();
    /// let backend = InProcess::new(ServiceClock::manual(clock.clone()), 1_000);
    /// let config = Config::from_files(&[("api.yaml".to_string(), yaml.to_string())], &backend)?;
    /// let service = RateLimitService::new(config, Bounds::default(), false);
    /// let request = |domain: &str, key: &str, value: &str| RateLimitRequest {
    ///     domain: domain.to_string(),
    ///     descriptors: vec![RateLimitDescriptor {
    ///         entries: vec![Entry { key: key.to_string(), value: value.to_string() }],
    ///         ..RateLimitDescriptor::default()
    ///     }],
    ///     hits_addend: 0,
    /// };
    ///
    /// // Two a minute for each user.
    /// for left in [1, 0] {
    ///     let response = service.should_rate_limit(&request("api", "user", "alice")).await?;
    ///     assert_eq!(response.overall_code, Code::Ok as i32);
    ///     assert_eq!(response.statuses[0].limit_remaining, left);
    /// }
    /// // 15 seconds on, the third is over the limit until the minute ends.
    /// clock.advance(Duration::from_secs(15));
    /// let response = service.should_rate_limit(&request("api", "user", "alice")).await?;
    /// assert_eq!(response.overall_code, Code::OverLimit as i32);
    /// let wait = response.statuses[0].duration_until_reset.expect("a wait");
    /// assert_eq!((wait.seconds, wait.nanos), (45, 0));
    /// // Another user is counted apart.
    /// let response = service.should_rate_limit(&request("api", "user", "bob")).await?;
    /// assert_eq!(response.overall_code, Code::Ok as i32);
    /// // What no limit matches is answered OK, with no limit.
    /// let response = service.should_rate_limit(&request("api", "path", "/")).await?;
    /// assert_eq!(response.overall_code, Code::Ok as i32);
    /// assert!(response.statuses[0].current_limit.is_none());
    /// // A request without a domain is refused.
    /// let refused = service.should_rate_limit(&request("", "user", "alice")).await;
    /// assert_eq!(refused, Err(RequestError::EmptyDomain));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, RequestError> {
        if let Err(error) = self.check_bounds(request) {
            self.metrics.invalid();
            return Err(error);
        }
        Stats::add(&self.stats.requests);
        self.metrics.request();
        // An `Arc` rather than a guard: a decision may await a backend's call.
        let config = self.config.load_full();
        let known_domain = config.domains().any(|d| d == request.domain);
        if !known_domain {
            self.metrics.unknown_domain();
        }
        // A descriptor's `limit` override, in a configured domain, takes the
        // place of the configuration's limit: `Some(None)` for one past the
        // bound of override limits.
        let overridden: Vec<Option<Option<Arc<Rule>>>> = match &self.overrides {
            Some(overrides) if known_domain => request
                .descriptors
                .iter()
                .map(|d| {
                    let limit = d.limit.as_ref()?;
                    // Checked with the bounds.
                    let unit = override_unit(limit)?;
                    Some(overrides.rule(&request.domain, limit.requests_per_unit, unit))
                })
                .collect(),
            _ => Vec::new(),
        };
        // Each descriptor's limit, with the entries a `share_threshold`
        // wildcard counts under its pattern and the entries a wildcard
        // matched (their keys in the limit's key).
        let mut shares: Vec<(Shared<'_>, Vec<usize>)> = Vec::new();
        let rules: Vec<Option<&Arc<Rule>>> = request
            .descriptors
            .iter()
            .enumerate()
            .map(|(i, d)| match overridden.get(i) {
                Some(Some(rule)) => {
                    shares.push((Vec::new(), Vec::new()));
                    rule.as_ref()
                }
                _ => {
                    let entries = d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str()));
                    match config.matched(&request.domain, entries) {
                        Some(matched) => {
                            shares.push((matched.shared, matched.wild));
                            Some(matched.rule)
                        }
                        None => {
                            shares.push((Vec::new(), Vec::new()));
                            None
                        }
                    }
                }
            })
            .collect();
        // `replaces`: a limit named by another matched limit is not applied.
        let replaced: Vec<&str> = rules
            .iter()
            .flatten()
            .flat_map(|rule| rule.replaces.iter().map(String::as_str))
            .collect();
        let default_hits = if request.hits_addend == 0 {
            1
        } else {
            request.hits_addend
        };
        let limit_key = |i: usize, descriptor: &RateLimitDescriptor| {
            let (shared, wild) = shares
                .get(i)
                .map_or((&[][..], &[][..]), |(s, w)| (s.as_slice(), w.as_slice()));
            if matches!(overridden.get(i), Some(Some(Some(_)))) {
                compact(override_key(descriptor))
            } else {
                compact(descriptor_key(descriptor, shared, wild))
            }
        };
        let hits_of = |descriptor: &RateLimitDescriptor| {
            if descriptor.is_negative_hits {
                0
            } else {
                match &descriptor.hits_addend {
                    Some(hits) => u32::try_from(hits.value).unwrap_or(u32::MAX),
                    None => default_hits,
                }
            }
        };
        // With `stop_increments`, each limit checked first: the checks'
        // verdicts answer the request when any is over, and nothing spends.
        let mut checked: Vec<Option<Verdict>> = Vec::new();
        // The keys the checks worked out, for the decisions after them.
        let mut keys: Vec<Option<String>> = Vec::new();
        if self.stop_increments {
            let refused = (0..request.descriptors.len())
                .filter(|i| matches!(overridden.get(*i), Some(Some(None))))
                .count();
            let limited: Vec<(usize, &Arc<Rule>)> = rules
                .iter()
                .enumerate()
                .filter(|(i, _)| !matches!(overridden.get(*i), Some(Some(None))))
                .filter_map(|(i, rule)| Some((i, (*rule)?)))
                .filter(|(_, rule)| {
                    !rule.unlimited
                        && !rule
                            .name
                            .as_deref()
                            .is_some_and(|name| replaced.contains(&name))
                })
                .collect();
            if limited.len() + refused >= 2 {
                let mut over = refused > 0;
                checked = request.descriptors.iter().map(|_| None).collect();
                keys = request.descriptors.iter().map(|_| None).collect();
                // Descriptors on one limit and key are checked for their
                // hits together, each with those before it.
                // (Keyed by the rule's address: limits are told apart by identity.)
                let mut asked: HashMap<(usize, String), u32> = HashMap::new();
                for (i, rule) in limited {
                    let descriptor = &request.descriptors[i];
                    let key = limit_key(i, descriptor);
                    let together = asked
                        .entry((Arc::as_ptr(rule) as usize, key.clone()))
                        .or_insert(0);
                    *together = together.saturating_add(hits_of(descriptor));
                    let hits = *together;
                    let verdict = match &rule.state {
                        Some(state) => state.check(&key, hits).await,
                        None => Verdict::Denied { retry_after: None },
                    };
                    // A limit in shadow mode is not enforced: over it, the
                    // request still goes on (and spends the others).
                    over |= matches!(verdict, Verdict::Denied { .. }) && !rule.shadow_mode;
                    checked[i] = Some(verdict);
                    keys[i] = Some(key);
                }
                if !over {
                    checked.clear();
                }
            }
        }
        let mut response = RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..RateLimitResponse::default()
        };
        let mut policies = Vec::new();
        let mut values = Vec::new();
        let mut retry_after: Option<Duration> = None;
        for (i, (descriptor, rule)) in request.descriptors.iter().zip(rules).enumerate() {
            if let (Some(Some(None)), Some(limit)) = (overridden.get(i), &descriptor.limit) {
                // A new quota past the bound of override limits.
                self.metrics.override_refused();
                Stats::add(&self.stats.over_limit);
                response.overall_code = Code::OverLimit as i32;
                response.statuses.push(DescriptorStatus {
                    code: Code::OverLimit as i32,
                    current_limit: Some(RateLimit {
                        name: String::new(),
                        requests_per_unit: limit.requests_per_unit,
                        unit: pb_unit(override_unit(limit)) as i32,
                    }),
                    ..DescriptorStatus::default()
                });
                continue;
            }
            let shared = shares.get(i).map_or(&[][..], |(s, _)| s.as_slice());
            // A shared entry is its wildcard's pattern, in the limit's key as
            // in its metrics.
            let entries = || shared_entries(descriptor, shared);
            // Unlimited whether or not another matched limit replaces it, as
            // envoyproxy/ratelimit marks a descriptor unlimited before it
            // applies `replaces`.
            if let Some(rule) = rule.filter(|rule| rule.unlimited) {
                self.metrics
                    .decided(&request.domain, rule, entries(), Counted::Ok);
                response.statuses.push(DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..DescriptorStatus::default()
                });
                continue;
            }
            let replaced_here = rule.is_some_and(|rule| {
                rule.name
                    .as_deref()
                    .is_some_and(|name| replaced.contains(&name))
            });
            let rule = rule.filter(|rule| {
                !rule
                    .name
                    .as_deref()
                    .is_some_and(|name| replaced.contains(&name))
            });
            let Some(rule) = rule else {
                if known_domain && !replaced_here {
                    self.metrics.unknown_descriptor();
                }
                response.statuses.push(DescriptorStatus {
                    code: Code::Ok as i32,
                    ..DescriptorStatus::default()
                });
                continue;
            };
            let verdict = match checked.get_mut(i).and_then(Option::take) {
                // Another descriptor is over its limit: this one's check.
                Some(verdict) => verdict,
                None => match &rule.state {
                    Some(state) => {
                        let key = keys
                            .get_mut(i)
                            .and_then(Option::take)
                            .unwrap_or_else(|| limit_key(i, descriptor));
                        let hits = hits_of(descriptor);
                        let verdict = state.decide(&key, hits).await;
                        // With `stop_increments`, as envoyproxy/ratelimit with
                        // it, a request over the limit spends nothing.
                        if hits > 1
                            && !self.stop_increments
                            && matches!(verdict, Verdict::Denied { .. })
                        {
                            spend_what_is_left(&**state, &key, hits, verdict).await
                        } else {
                            verdict
                        }
                    }
                    // A limit of 0 per unit.
                    None => Verdict::Denied { retry_after: None },
                },
            };
            let mut status = DescriptorStatus {
                code: Code::Ok as i32,
                current_limit: Some(RateLimit {
                    name: rule.name.clone().unwrap_or_default(),
                    requests_per_unit: rule.requests_per_unit,
                    unit: pb_unit(rule.unit) as i32,
                }),
                ..DescriptorStatus::default()
            };
            let outcome = match verdict {
                Verdict::Admitted { remaining, reset } => {
                    status.limit_remaining = remaining;
                    status.duration_until_reset = Some(pb_duration(reset));
                    self.metrics
                        .decided(&request.domain, rule, entries(), Counted::Ok);
                    Some(Outcome::Admitted { remaining })
                }
                Verdict::Denied { retry_after: wait } => {
                    status.duration_until_reset = wait.map(pb_duration);
                    if rule.shadow_mode {
                        Stats::add(&self.stats.shadow_denials);
                        self.metrics.decided(
                            &request.domain,
                            rule,
                            entries(),
                            Counted::ShadowOverLimit,
                        );
                    } else {
                        Stats::add(&self.stats.over_limit);
                        self.metrics
                            .decided(&request.domain, rule, entries(), Counted::OverLimit);
                        status.code = Code::OverLimit as i32;
                        response.overall_code = Code::OverLimit as i32;
                        // No wait (more hits than the limit can ever hold, or
                        // a limit of 0): no retry helps, so no `Retry-After`
                        // of 0 inviting one at once. Another descriptor's
                        // wait, if any, still gives the field.
                        if let Some(wait) = wait {
                            retry_after = Some(retry_after.map_or(wait, |w| w.max(wait)));
                        }
                    }
                    // `None`: never admitted.
                    wait.map(|wait| Outcome::TooManyRequests {
                        retry_after: RetryAfter::from_nanos(
                            u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX),
                        ),
                    })
                }
            };
            if let Some(policy) = rule
                .state
                .as_ref()
                .and_then(|s| s.policy())
                .filter(|_| self.headers == ResponseHeaders::Draft)
            {
                policies.push(policy.policy_value());
                // Never admitted: `r=0` and no `t`, as no time passes after
                // which this request is admitted.
                let outcome = outcome.unwrap_or(Outcome::Admitted { remaining: 0 });
                values.extend(policy.value(&outcome));
            }
            response.statuses.push(status);
        }
        if self.shadow_mode && response.overall_code == Code::OverLimit as i32 {
            response.overall_code = Code::Ok as i32;
            retry_after = None;
            self.metrics.global_shadow();
        }
        if let ResponseHeaders::Envoy(names) = &self.headers {
            response.response_headers_to_add = envoy_headers(&response.statuses, names);
        }
        if self.headers == ResponseHeaders::Draft {
            let header = |key: &str, value: String| HeaderValue {
                key: key.to_string(),
                value,
                ..HeaderValue::default()
            };
            if !policies.is_empty() {
                response
                    .response_headers_to_add
                    .push(header("RateLimit-Policy", policies.join(", ")));
                response
                    .response_headers_to_add
                    .push(header("RateLimit", values.join(", ")));
            }
            if let Some(wait) = retry_after {
                let secs =
                    RetryAfter::from_nanos(u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX))
                        .header_secs();
                response
                    .response_headers_to_add
                    .push(header("Retry-After", secs.to_string()));
            }
        }
        Ok(response)
    }
}

/// A request refused for more hits than `key` has left spends what is left
/// (up to `hits`), and the rest where the limit can owe it
/// ([`LimitState::lend`]), as envoyproxy/ratelimit counts a refused
/// request's hits: otherwise a count reported after the fact (Envoy's
/// `apply_on_stream_done` with a descriptor's `hits_addend` read from the
/// response, an LLM's tokens) that is larger than what is left would be
/// refused and spend nothing, and the limit would never run out. Answered
/// with the wait the same request gets after that (`denied` if nothing was
/// taken or lent).
///
/// A few rounds: another request may take what was seen between the look
/// and the take, and what a replica holds of a leased limit is taken before
/// what Redis holds. Should the key give all of `hits` by then (a refill in
/// between), the request is admitted after all.
async fn spend_what_is_left(
    state: &dyn LimitState,
    key: &str,
    hits: u32,
    denied: Verdict,
) -> Verdict {
    let mut taken = 0u32;
    for _ in 0..4 {
        // A check answers with what the key holds now, nothing taken.
        let left = match state.check(key, 1).await {
            Verdict::Admitted { remaining, .. } => remaining,
            Verdict::Denied { .. } => break,
        };
        let ask = (hits - taken).min(left);
        if ask == 0 {
            break;
        }
        let verdict = state.decide(key, ask).await;
        if let Verdict::Admitted { .. } = verdict {
            taken += ask;
            if taken == hits {
                return verdict;
            }
        }
    }
    // The rest from the key's next refills, where its algorithm can owe
    // them (in process, a token bucket or GCRA: up to one fill ahead).
    let lent = state.lend(key, hits - taken);
    if taken == 0 && lent == 0 {
        return denied;
    }
    // The wait for the whole request now that the key is empty.
    match state.check(key, hits).await {
        // A refill since the last take: the request would fit now.
        Verdict::Admitted { .. } => Verdict::Denied {
            retry_after: Some(Duration::ZERO),
        },
        denied => denied,
    }
}

/// The entries a `share_threshold` wildcard matched, each with its pattern.
type Shared<'a> = Vec<(usize, &'a str)>;

/// The key of a descriptor in its limit: every entry's value (a
/// `share_threshold` wildcard's pattern for an entry it matched), and the
/// key of an entry a wildcard matched (given here: the limit's place in the
/// configuration fixes every other entry's key, and which entries a
/// wildcard matched), each after its length, so that no two descriptors
/// share a key by concatenation.
fn counter_key<'a>(entries: impl Iterator<Item = (Option<&'a str>, &'a str)>) -> String {
    let mut key = String::new();
    for (entry_key, value) in entries {
        for text in entry_key.into_iter().chain([value]) {
            key.push_str(&text.len().to_string());
            key.push(':');
            key.push_str(text);
        }
    }
    key
}

/// A descriptor's key in its configured limit ([`counter_key`]): `shared`,
/// the entries a `share_threshold` wildcard matched with their pattern;
/// `wild`, the entries a wildcard matched.
fn descriptor_key(
    descriptor: &RateLimitDescriptor,
    shared: &[(usize, &str)],
    wild: &[usize],
) -> String {
    counter_key(
        shared_entries(descriptor, shared)
            .enumerate()
            .map(|(j, (key, value))| (wild.contains(&j).then_some(key), value)),
    )
}

/// A descriptor's entries as its limit counts them: a `share_threshold`
/// wildcard's pattern in place of the value of an entry it matched
/// (`shared`), in the limit's key as in its metrics.
fn shared_entries<'a>(
    descriptor: &'a RateLimitDescriptor,
    shared: &'a [(usize, &'a str)],
) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
    descriptor.entries.iter().enumerate().map(|(j, e)| {
        let value = shared
            .iter()
            .find(|(at, _)| *at == j)
            .map_or(e.value.as_str(), |(_, pattern)| pattern);
        (e.key.as_str(), value)
    })
}

/// The key of a descriptor in an override limit, which descriptors of every
/// shape share: every entry's key and value, each after its length.
fn override_key(descriptor: &RateLimitDescriptor) -> String {
    let mut key = String::new();
    for entry in &descriptor.entries {
        for text in [&entry.key, &entry.value] {
            key.push_str(&text.len().to_string());
            key.push(':');
            key.push_str(text);
        }
    }
    key
}

/// The longest key held as it is; a longer one is held as its hash.
pub const MAX_KEY_HELD: usize = 64;

/// `key` itself up to [`MAX_KEY_HELD`] bytes, and beyond it `#` and the
/// SHA-1 of the key in hex (41 bytes). A key's entries are bounded only by
/// [`Bounds`] and the message size (16 entries by default, of any length):
/// held whole, a limit's `--max-keys` keys could take gigabytes. Hashed, every key costs at most 64 bytes of text, and two
/// keys meet only by a SHA-1 collision, which no client can make with an
/// input that other clients' keys are. The hash is the same in every
/// replica (the Redis backends name their keys with it). A held key begins
/// with a digit (its first value's length) or is empty, so no key held as it
/// is reads as a hashed one.
fn compact(key: String) -> String {
    if key.len() <= MAX_KEY_HELD {
        return key;
    }
    let mut hashed = String::with_capacity(41);
    hashed.push('#');
    hashed.push_str(&sha1_smol::Sha1::from(key.as_bytes()).digest().to_string());
    hashed
}

/// Envoy's number for a week in `RateLimitUnit` (newer than the enum this
/// crate is built with, which stops at `YEAR`; envoyproxy/ratelimit keeps it).
pub(crate) const WEEK_UNIT: i32 = 7;

/// An override's unit, if this service keeps it: every unit but `UNKNOWN`
/// (or a number Envoy does not define).
fn override_unit(limit: &RateLimitOverride) -> Option<Unit> {
    if limit.unit == WEEK_UNIT {
        return Some(Unit::Week);
    }
    match RateLimitUnit::try_from(limit.unit).ok()? {
        RateLimitUnit::Second => Some(Unit::Second),
        RateLimitUnit::Minute => Some(Unit::Minute),
        RateLimitUnit::Hour => Some(Unit::Hour),
        RateLimitUnit::Day => Some(Unit::Day),
        RateLimitUnit::Month => Some(Unit::Month),
        RateLimitUnit::Year => Some(Unit::Year),
        RateLimitUnit::Unknown => None,
    }
}

fn unit_name(unit: Unit) -> &'static str {
    unit.name()
}

fn pb_unit(unit: Option<Unit>) -> PbUnit {
    match unit {
        None => PbUnit::Unknown,
        Some(Unit::Second) => PbUnit::Second,
        Some(Unit::Minute) => PbUnit::Minute,
        Some(Unit::Hour) => PbUnit::Hour,
        Some(Unit::Day) => PbUnit::Day,
        Some(Unit::Week) => PbUnit::Week,
        Some(Unit::Month) => PbUnit::Month,
        Some(Unit::Year) => PbUnit::Year,
    }
}

fn pb_duration(duration: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX),
        // Below 10^9: fits an i32.
        nanos: i32::try_from(duration.subsec_nanos()).unwrap_or(0),
    }
}
