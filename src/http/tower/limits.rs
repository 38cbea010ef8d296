//! Several limits in one layer, all or nothing: [`Limits`], built by
//! [`LimitsBuilder`], and the [`Limited`] service it wraps.

use core::borrow::Borrow;
use core::fmt;
use core::fmt::Write as _;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use http::header::HeaderValue;
use http::response::Parts;
use http::{Request, Response};

use super::denial::{Denial, DenialResponse, DenyWith, PlainDenial};
use super::extract::{KeyExtractor, RequestHead};
use super::layer::{Fields, RATELIMIT, RATELIMIT_POLICY, Reported, append_item, deny};
use super::{Layer, Service};
use crate::admission::Receipt;
use crate::decision::{KeyedDecision, RetryAfter};
use crate::http::gate::{Advertised, GateLimiter, Outcome, PolicyError, RateLimitPolicy};
use crate::reclaim::thread_slot;
use crate::sync::Ordering;
use crate::tally::Tally;

/// Why a [`LimitsBuilder`] refused its configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimitsError {
    /// A limit's name (or `name.tier`, for a limit with tiers) could not be a
    /// policy name in the `RateLimit` fields.
    Name(PolicyError),
    /// Two limits share a name: their fields could not be told apart.
    DuplicateName(String),
    /// [`cost`](LimitsBuilder::cost) of zero, or above the capacity of a
    /// limit (of its smallest tier): no request could ever be admitted.
    Cost {
        /// The cost asked for.
        cost: u32,
        /// The limit that cannot admit it.
        limit: String,
        /// Its capacity.
        capacity: u32,
    },
}

impl fmt::Display for LimitsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitsError::Name(e) => e.fmt(f),
            LimitsError::DuplicateName(name) => {
                write!(f, "two limits are named {name:?}: give each its own name")
            }
            LimitsError::Cost {
                cost: 0,
                limit: _,
                capacity: _,
            } => f.write_str("a request's cost must be at least 1 permit"),
            LimitsError::Cost {
                cost,
                limit,
                capacity,
            } => write!(
                f,
                "a request's cost of {cost} permits is above the capacity of limit {limit:?} \
                 ({capacity}): no request could be admitted"
            ),
        }
    }
}

impl std::error::Error for LimitsError {}

impl From<PolicyError> for LimitsError {
    fn from(e: PolicyError) -> LimitsError {
        LimitsError::Name(e)
    }
}

/// A response predicate.
type When = Arc<dyn Fn(&Parts) -> bool + Send + Sync>;
/// A response's real cost, when it says.
type CostOf = Arc<dyn Fn(&Parts) -> Option<u32> + Send + Sync>;

/// Several limits deciding each request as one, in one layer: the request is
/// admitted only if every limit admits it, and a denial by any one (or a
/// missing key) leaves no permit taken in the others.
///
/// Each limit has a name, a key extractor and a limiter: a
/// [`RateLimiter`](crate::RateLimiter) (one limit for every request), a
/// [`KeyedLimiter`](crate::KeyedLimiter) or [`Tiered`](crate::Tiered) keyed
/// limiters. A request is decided as follows:
///
/// 1. **Keys first.** Every limit's key is extracted before any permit is
///    taken: a request without one is answered 401 (or 500 for a server
///    misconfiguration, [`KeyExtractor::misconfiguration`]) and spends
///    nothing anywhere.
/// 2. **All or nothing, in order.** Limits are asked in the order they were
///    added. When limit `i` denies, the permits limits `0..i` took go back,
///    by the chain's exact-or-decline rule (see [`chain`](crate::chain):
///    never more than was taken; rarely, under contention, a token bucket or
///    GCRA keeps them spent rather than risk giving back too much). Put the
///    limit most likely to deny first (usually the per-key one).
/// 3. **The longest wait.** A denial answers 429 (503 when a new key met a
///    full key bound) with the longest retry-after of the limit that denied
///    and of every later limit that would deny too: a client that waits that
///    long is not refused by a limit it never reached. Earlier limits
///    admitted, so waiting longer than their own wait is not needed for them;
///    the wait is never shorter than any refusing limit's, so a client that
///    honours it is never told to come back too early.
/// 4. **Told honestly.** Every answer but a 401 carries one item per limit in
///    the `RateLimit-Policy` and `RateLimit` fields (structured-field Lists,
///    draft-ietf-httpapi-ratelimit-headers -07 onwards), appended to any a
///    layer closer to the service set: `r` is that limit's own remaining
///    after this decision, `t` its own wait when it refuses, and a limit with
///    tiers advertises the key's tier (`"api.paid";q=100;w=1`). Nothing is
///    advertised for an algorithm of your own that does not
///    [`advertise`](crate::Algorithm::advertise).
///
/// ```
/// use std::net::IpAddr;
/// use http::header::HeaderName;
/// use turnstile::tower::{ApiKeyHeader, Global, Limits, PeerIp};
/// use turnstile::{KeyedLimiter, Quota, RateLimiter};
///
/// let layer = Limits::builder()
///     // Per API key first: the most likely to refuse.
///     .limit("key", ApiKeyHeader::new(HeaderName::from_static("x-api-key")),
///         KeyedLimiter::<String>::new(Quota::per_second(10)?))?
///     .limit("ip", PeerIp::new(), KeyedLimiter::<IpAddr>::new(Quota::per_second(50)?))?
///     .limit("all", Global, RateLimiter::new(Quota::per_second(1_000)?))?
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// **Priced by the response.** A request is charged [`cost`](LimitsBuilder::cost)
/// permits (1 by default) in every limit when it is admitted; what the
/// response says can then change that, in every limit that admitted it:
/// [`refund_when`](LimitsBuilder::refund_when) gives the permits back (count
/// only failed logins), [`cost_from_response`](LimitsBuilder::cost_from_response)
/// settles the real cost (an LLM's tokens, read from a response header), and
/// [`drain_when`](LimitsBuilder::drain_when) empties the key's allowance (the
/// upstream answered 429). The fields of such a response are read after the
/// settlement, so they tell what is left then.
pub struct Limits<R = PlainDenial> {
    shared: Arc<Shared>,
    respond: R,
}

/// What every clone of a [`Limits`] layer shares.
struct Shared {
    limits: Vec<Box<dyn Limit>>,
    cost: u32,
    refund_when: Option<When>,
    drain_when: Option<When>,
    cost_from_response: Option<CostOf>,
    challenge: Option<HeaderValue>,
    counts: Tally<COUNTERS>,
    /// Denials by each limit (the first that refused), in order.
    denied_by: Vec<AtomicU64>,
    reported: Reported,
}

impl Shared {
    /// Whether admitted requests keep what settling them needs.
    fn settles(&self) -> bool {
        self.refund_when.is_some() || self.drain_when.is_some() || self.cost_from_response.is_some()
    }
}

const ADMITTED: usize = 0;
const UNAUTHORIZED: usize = 1;
const TOO_MANY: usize = 2;
const UNAVAILABLE: usize = 3;
const REFUNDED: usize = 4;
const REFUND_DECLINED: usize = 5;
const CHARGED: usize = 6;
const FORGIVEN: usize = 7;
const DRAINED: usize = 8;
const COUNTERS: usize = 9;

/// What a [`Limits`] layer and its clones answered ([`Limits::stats`]). Each
/// counter is read in turn, not all at one instant.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimitsStats {
    /// Requests every limit admitted.
    pub admitted: u64,
    /// 401s: requests without a key for some limit.
    pub unauthorized: u64,
    /// 429s.
    pub too_many_requests: u64,
    /// 503s: a new key met a full key bound.
    pub unavailable: u64,
    /// 500s: the server did not provide what an extractor needs.
    pub misconfigured: u64,
    /// Each limit's name and the denials it made (as the first that
    /// refused), in the order the limits were added.
    pub denied_by: Vec<(String, u64)>,
    /// Refunds given back exactly, one per limit and settled request (by
    /// [`refund_when`](LimitsBuilder::refund_when), or a
    /// [`cost_from_response`](LimitsBuilder::cost_from_response) below the
    /// cost charged).
    pub refunded: u64,
    /// Refunds a limit declined, keeping the permits spent (never more than
    /// was taken is given back).
    pub refund_declined: u64,
    /// Permits charged after the response, beyond the cost taken up front.
    pub charged: u64,
    /// Permits a response's cost asked for that the limit did not hold, and
    /// so were not charged: the whole over-admission settling allows.
    pub forgiven: u64,
    /// Permits taken by [`drain_when`](LimitsBuilder::drain_when).
    pub drained: u64,
}

/// Builds a [`Limits`] layer ([`Limits::builder`]).
pub struct LimitsBuilder {
    limits: Vec<Box<dyn Limit>>,
    cost: u32,
    refund_when: Option<When>,
    drain_when: Option<When>,
    cost_from_response: Option<CostOf>,
    challenge: Option<HeaderValue>,
}

impl fmt::Debug for LimitsBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitsBuilder")
            .field(
                "limits",
                &self.limits.iter().map(|l| l.name()).collect::<Vec<_>>(),
            )
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}

impl Limits {
    /// A builder with no limits yet, a cost of 1 permit, and no settling.
    pub fn builder() -> LimitsBuilder {
        LimitsBuilder {
            limits: Vec::new(),
            cost: 1,
            refund_when: None,
            drain_when: None,
            cost_from_response: None,
            challenge: None,
        }
    }
}

impl LimitsBuilder {
    /// Add a limit named `name`, keyed by what `extractor` picks, decided by
    /// `limiter` (a [`RateLimiter`](crate::RateLimiter), a
    /// [`KeyedLimiter`](crate::KeyedLimiter) or a [`Tiered`](crate::Tiered)
    /// set). Limits are asked in the order they are added.
    ///
    /// # Errors
    ///
    /// [`LimitsError::Name`] for a name (or, with tiers, a `name.tier`) that
    /// could break the fields' syntax, [`LimitsError::DuplicateName`] for a
    /// name already taken.
    pub fn limit<X, L>(self, name: &str, extractor: X, limiter: L) -> Result<Self, LimitsError>
    where
        X: KeyExtractor,
        L: GateLimiter<X::Lookup> + Send + Sync + 'static,
    {
        self.limit_shared(name, extractor, Arc::new(limiter))
    }

    /// [`limit`](Self::limit) on a limiter shared with other code (to read
    /// its stats, or change a tier's quota, say).
    ///
    /// # Errors
    ///
    /// As [`limit`](Self::limit).
    pub fn limit_shared<X, L>(
        mut self,
        name: &str,
        extractor: X,
        limiter: Arc<L>,
    ) -> Result<Self, LimitsError>
    where
        X: KeyExtractor,
        L: GateLimiter<X::Lookup> + Send + Sync + 'static,
    {
        RateLimitPolicy::new(name, 1, Duration::from_secs(1))?;
        for tier in limiter.tier_names() {
            RateLimitPolicy::new(&format!("{name}.{tier}"), 1, Duration::from_secs(1))?;
        }
        if self.limits.iter().any(|l| l.name() == name) {
            return Err(LimitsError::DuplicateName(name.to_owned()));
        }
        self.limits.push(Box::new(Entry {
            name: name.to_owned(),
            extractor,
            limiter,
        }));
        Ok(self)
    }

    /// Charge each request `cost` permits in every limit (1 by default):
    /// the price taken up front, before the response can say the real one
    /// ([`cost_from_response`](Self::cost_from_response)).
    pub fn cost(self, cost: u32) -> Self {
        LimitsBuilder { cost, ..self }
    }

    /// Give an admitted request's permits back, in every limit, when its
    /// response matches: `|parts| parts.status.is_success()` counts only
    /// failures (failed logins, say). Each refund is exact or declines
    /// ([`LimitsStats::refund_declined`]), as [`Admission::refund`](crate::Admission::refund).
    ///
    /// ```
    /// use http::header::HeaderName;
    /// use turnstile::tower::{ApiKeyHeader, Limits};
    /// use turnstile::{KeyedLimiter, Quota};
    ///
    /// // Five failed logins per user a minute; successful ones are free.
    /// let layer = Limits::builder()
    ///     .limit("login", ApiKeyHeader::new(HeaderName::from_static("x-user")),
    ///         KeyedLimiter::<String>::new(Quota::per_minute(5)?))?
    ///     .refund_when(|parts| parts.status.is_success())
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund_when<F>(self, when: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        LimitsBuilder {
            refund_when: Some(Arc::new(when)),
            ..self
        }
    }

    /// Empty the key's allowance, in every limit, when a response matches:
    /// `|parts| parts.status == 429` stops sending a key's requests upstream
    /// once the upstream refuses them. The permits taken are counted
    /// ([`LimitsStats::drained`]).
    pub fn drain_when<F>(self, when: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        LimitsBuilder {
            drain_when: Some(Arc::new(when)),
            ..self
        }
    }

    /// Settle each admitted request's real cost from its response: `cost`
    /// returns the permits the request really used (read from a response
    /// header, say), or `None` to keep what was charged up front.
    ///
    /// In each limit: a real cost above the charge takes the difference
    /// (what the limit holds of it: see below); one below it gives the
    /// charge back (exact or declined, as a refund) and takes the real cost.
    /// A declined refund keeps the charge: a request is never charged less
    /// than it used because of a refund.
    ///
    /// **The bound.** The difference is taken only from what the limit
    /// holds when the response arrives; what it does not hold is *forgiven*
    /// and counted ([`LimitsStats::forgiven`]), not carried as a debt. So
    /// each limit admits, over any interval, no more permits than its own
    /// bound allows plus the permits forgiven in it, and each request can
    /// cause at most its real cost less the up-front charge to be forgiven.
    /// Charge up front the cost you expect ([`cost`](Self::cost)) to keep
    /// the forgiven share small.
    ///
    /// ```
    /// use http::header::HeaderName;
    /// use turnstile::tower::{ApiKeyHeader, Limits};
    /// use turnstile::{KeyedLimiter, Quota};
    ///
    /// // 10,000 model tokens per key a minute; 500 charged up front, the
    /// // rest settled from the `x-tokens-used` header of the response.
    /// let layer = Limits::builder()
    ///     .limit("tokens", ApiKeyHeader::new(HeaderName::from_static("x-api-key")),
    ///         KeyedLimiter::<String>::new(Quota::per_minute(10_000)?))?
    ///     .cost(500)
    ///     .cost_from_response(|parts| {
    ///         parts.headers.get("x-tokens-used")?.to_str().ok()?.parse().ok()
    ///     })
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cost_from_response<F>(self, cost: F) -> Self
    where
        F: Fn(&Parts) -> Option<u32> + Send + Sync + 'static,
    {
        LimitsBuilder {
            cost_from_response: Some(Arc::new(cost)),
            ..self
        }
    }

    /// The `WWW-Authenticate` challenge on a 401, instead of the challenge of
    /// the extractor that found no key ([`KeyExtractor::challenge`]).
    pub fn challenge(self, challenge: HeaderValue) -> Self {
        LimitsBuilder {
            challenge: Some(challenge),
            ..self
        }
    }

    /// The layer.
    ///
    /// # Errors
    ///
    /// [`LimitsError::Cost`] when the cost is zero or above some limit's
    /// capacity.
    pub fn build(self) -> Result<Limits, LimitsError> {
        for limit in &self.limits {
            let capacity = limit.capacity();
            if self.cost == 0 || self.cost > capacity {
                return Err(LimitsError::Cost {
                    cost: self.cost,
                    limit: limit.name().to_owned(),
                    capacity,
                });
            }
        }
        if self.cost == 0 {
            return Err(LimitsError::Cost {
                cost: 0,
                limit: String::new(),
                capacity: 0,
            });
        }
        let denied_by = self.limits.iter().map(|_| AtomicU64::new(0)).collect();
        Ok(Limits {
            shared: Arc::new(Shared {
                limits: self.limits,
                cost: self.cost,
                refund_when: self.refund_when,
                drain_when: self.drain_when,
                cost_from_response: self.cost_from_response,
                challenge: self.challenge,
                counts: Tally::new(),
                denied_by,
                reported: Reported::default(),
            }),
            respond: PlainDenial,
        })
    }
}

impl<R> Limits<R> {
    /// Build denial responses with `respond`, as
    /// [`RateLimitLayer::deny_with`](super::RateLimitLayer::deny_with): the
    /// layer still sets the status, `Retry-After`, the `RateLimit` fields and
    /// `WWW-Authenticate` over what it returns.
    pub fn deny_with<F, B>(self, respond: F) -> Limits<DenyWith<F>>
    where
        F: Fn(&Denial) -> Response<B> + Send + Sync + 'static,
    {
        Limits {
            shared: self.shared,
            respond: DenyWith::new(respond),
        }
    }

    /// The names of the limits, in the order they are asked.
    pub fn names(&self) -> impl ExactSizeIterator<Item = &str> {
        self.shared.limits.iter().map(|l| l.name())
    }

    /// What this layer and its clones have answered.
    pub fn stats(&self) -> LimitsStats {
        let shared = &self.shared;
        let sum = |which| shared.counts.sum(which);
        LimitsStats {
            admitted: sum(ADMITTED),
            unauthorized: sum(UNAUTHORIZED),
            too_many_requests: sum(TOO_MANY),
            unavailable: sum(UNAVAILABLE),
            misconfigured: shared.reported.count(),
            denied_by: shared
                .limits
                .iter()
                .zip(&shared.denied_by)
                // Relaxed: counts, read for reporting.
                .map(|(l, n)| (l.name().to_owned(), n.load(Ordering::Relaxed)))
                .collect(),
            refunded: sum(REFUNDED),
            refund_declined: sum(REFUND_DECLINED),
            charged: sum(CHARGED),
            forgiven: sum(FORGIVEN),
            drained: sum(DRAINED),
        }
    }
}

impl<R: Clone> Clone for Limits<R> {
    fn clone(&self) -> Self {
        Limits {
            shared: Arc::clone(&self.shared),
            respond: self.respond.clone(),
        }
    }
}

impl<R> fmt::Debug for Limits<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limits")
            .field("limits", &self.names().collect::<Vec<_>>())
            .field("cost", &self.shared.cost)
            .finish_non_exhaustive()
    }
}

impl<Svc, R: Clone> Layer<Svc> for Limits<R> {
    type Service = Limited<Svc, R>;

    fn layer(&self, inner: Svc) -> Self::Service {
        Limited {
            inner,
            layer: self.clone(),
        }
    }
}

/// A service behind a [`Limits`] layer.
pub struct Limited<Svc, R = PlainDenial> {
    inner: Svc,
    layer: Limits<R>,
}

impl<Svc: Clone, R: Clone> Clone for Limited<Svc, R> {
    fn clone(&self) -> Self {
        Limited {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<Svc: fmt::Debug, R> fmt::Debug for Limited<Svc, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limited")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

impl<Svc, R, ReqBody, ResBody> Service<Request<ReqBody>> for Limited<Svc, R>
where
    Svc: Service<Request<ReqBody>, Response = Response<ResBody>>,
    R: DenialResponse<ResBody>,
{
    type Response = Response<ResBody>;
    type Error = Svc::Error;
    type Future = LimitedFuture<Svc::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let shared = &self.layer.shared;
        let head = RequestHead::of(&request);
        // Every key before any permit: a request without one spends nothing.
        for limit in &shared.limits {
            if let Some(denial) = limit.missing(&head) {
                let challenge = || limit.challenge();
                match denial {
                    Denial::Misconfigured(problem) => shared.reported.report(problem),
                    _ => shared.counts.add(UNAUTHORIZED, thread_slot()),
                }
                let response = deny(
                    &self.layer.respond,
                    &denial,
                    shared.challenge.as_ref(),
                    challenge,
                    None,
                );
                return LimitedFuture::denied(response);
            }
        }
        let mut decide = Decide {
            keep: shared.settles(),
            items: Items::default(),
            tickets: Vec::new(),
            depth: 0,
        };
        let verdict = match shared.limits.split_first() {
            None => Verdict::Admitted,
            Some((first, rest)) => first.decide(&head, shared.cost, rest, &mut decide),
        };
        match verdict {
            Verdict::Admitted => {
                shared.counts.add(ADMITTED, thread_slot());
                let (fields, settle) = if decide.keep {
                    // Told after the response is settled.
                    (
                        None,
                        Some(Settlement {
                            shared: Arc::clone(shared),
                            tickets: decide.tickets,
                        }),
                    )
                } else {
                    (decide.items.fields(), None)
                };
                LimitedFuture::admitted(self.inner.call(request), fields, settle)
            }
            Verdict::Refused { by, decision } => {
                let which = match decision {
                    KeyedDecision::KeyLimit { .. } => UNAVAILABLE,
                    _ => TOO_MANY,
                };
                shared.counts.add(which, thread_slot());
                if let Some(count) = shared.denied_by.get(by) {
                    // Relaxed: a count, on the denial path only.
                    count.fetch_add(1, Ordering::Relaxed);
                }
                // Every limit's state after this decision (the refunds made).
                let mut items = Items::default();
                for limit in &shared.limits {
                    limit.report(&head, shared.cost, &mut items);
                }
                let outcome = Outcome::from_decision(Some(decision));
                let response = deny(
                    &self.layer.respond,
                    &Denial::Refused(outcome),
                    shared.challenge.as_ref(),
                    || HeaderValue::from_static("ApiKey"),
                    items.fields(),
                );
                LimitedFuture::denied(response)
            }
            Verdict::NoKey => {
                // Keys were all found above; an extractor that answers
                // differently the second time is treated as no key.
                shared.counts.add(UNAUTHORIZED, thread_slot());
                let response = deny(
                    &self.layer.respond,
                    &Denial::Refused(Outcome::Unauthorized),
                    shared.challenge.as_ref(),
                    || HeaderValue::from_static("ApiKey"),
                    None,
                );
                LimitedFuture::denied(response)
            }
        }
    }
}

/// How a request was decided.
enum Verdict {
    Admitted,
    /// Limit `by` refused first; `decision` carries the longest wait.
    Refused {
        by: usize,
        decision: KeyedDecision,
    },
    /// A key vanished between the check and the decision.
    NoKey,
}

/// What deciding a request collects.
struct Decide {
    /// Keep tickets for settling.
    keep: bool,
    items: Items,
    tickets: Vec<Box<dyn Ticket>>,
    /// The index of the limit deciding now.
    depth: usize,
}

/// The `RateLimit-Policy` and `RateLimit` items being written.
#[derive(Default)]
struct Items {
    policy: String,
    value: String,
}

/// One limit's state, for its `RateLimit` item.
enum State {
    Remaining(u32),
    Wait(RetryAfter),
}

impl Items {
    fn push(&mut self, name: &str, advertised: Option<Advertised<'_>>, state: &State) {
        let Some(advertised) = advertised else {
            return;
        };
        if !self.policy.is_empty() {
            self.policy.push_str(", ");
            self.value.push_str(", ");
        }
        let window = advertised.window.max(Duration::from_secs(1));
        let secs = window
            .as_secs()
            .saturating_add(u64::from(window.subsec_nanos() > 0));
        // Writing to a String cannot fail.
        let (policy, value) = (&mut self.policy, &mut self.value);
        let _ = match advertised.tier {
            Some(tier) => write!(policy, "\"{name}.{tier}\";q={};w={secs}", advertised.quota)
                .and_then(|()| write!(value, "\"{name}.{tier}\"")),
            None => write!(policy, "\"{name}\";q={};w={secs}", advertised.quota)
                .and_then(|()| write!(value, "\"{name}\"")),
        };
        let _ = match state {
            State::Remaining(r) => write!(value, ";r={r}"),
            State::Wait(wait) => write!(value, ";r=0;t={}", wait.header_secs()),
        };
    }

    fn fields(self) -> Option<Fields> {
        if self.policy.is_empty() {
            return None;
        }
        // Validated names and numbers make valid values.
        Some([
            HeaderValue::from_str(&self.policy).ok(),
            HeaderValue::from_str(&self.value).ok(),
        ])
    }
}

/// One limit of a [`Limits`] layer, its types erased.
trait Limit: Send + Sync {
    fn name(&self) -> &str;
    /// The most permits one request can get, whatever its key.
    fn capacity(&self) -> u32;
    /// Why the request has no key for this limit, if it has none.
    fn missing(&self, head: &RequestHead<'_>) -> Option<Denial>;
    /// The challenge of a 401 for a key this limit did not find.
    fn challenge(&self) -> HeaderValue;
    /// Decide this limit and then `rest`, all or nothing.
    fn decide(
        &self,
        head: &RequestHead<'_>,
        n: u32,
        rest: &[Box<dyn Limit>],
        cx: &mut Decide,
    ) -> Verdict;
    /// The wait `n` permits would have now, if this limit would refuse them.
    fn wait(&self, head: &RequestHead<'_>, n: u32) -> Option<RetryAfter>;
    /// This limit's item as it stands now, for `n` permits.
    fn report(&self, head: &RequestHead<'_>, n: u32, items: &mut Items);
}

/// A limit's name, extractor and limiter.
struct Entry<X, L> {
    name: String,
    extractor: X,
    limiter: Arc<L>,
}

impl<X, L> Limit for Entry<X, L>
where
    X: KeyExtractor,
    L: GateLimiter<X::Lookup> + Send + Sync + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn capacity(&self) -> u32 {
        self.limiter.min_capacity()
    }

    fn missing(&self, head: &RequestHead<'_>) -> Option<Denial> {
        if self.extractor.extract(head).is_some() {
            return None;
        }
        Some(match self.extractor.misconfiguration(head) {
            Some(problem) => Denial::Misconfigured(problem),
            None => Denial::Refused(Outcome::Unauthorized),
        })
    }

    fn challenge(&self) -> HeaderValue {
        self.extractor.challenge()
    }

    #[inline]
    fn decide(
        &self,
        head: &RequestHead<'_>,
        n: u32,
        rest: &[Box<dyn Limit>],
        cx: &mut Decide,
    ) -> Verdict {
        let Some(key) = self.extractor.extract(head) else {
            return Verdict::NoKey;
        };
        let by = cx.depth;
        let (decision, receipt) = self.limiter.stage_take(&key, n);
        let KeyedDecision::Allowed { remaining } = decision else {
            // The longest wait of this limit and every later one that would
            // refuse too; those are asked without taking anything.
            let longest = rest
                .iter()
                .filter_map(|later| later.wait(head, n))
                .chain(decision.retry_after())
                .max();
            let decision = match (decision, longest) {
                (KeyedDecision::KeyLimit { .. }, Some(retry_after)) => {
                    KeyedDecision::KeyLimit { retry_after }
                }
                (_, Some(retry_after)) => KeyedDecision::Denied { retry_after },
                (other, None) => other,
            };
            return Verdict::Refused { by, decision };
        };
        if !cx.keep {
            cx.items.push(
                &self.name,
                self.limiter.advertise_for(&key),
                &State::Remaining(remaining),
            );
        }
        cx.depth += 1;
        let verdict = match rest.split_first() {
            None => Verdict::Admitted,
            Some((next, rest)) => next.decide(head, n, rest, cx),
        };
        match (&verdict, receipt) {
            (Verdict::Admitted, Some(receipt)) if cx.keep => {
                cx.tickets.push(Box::new(Held::<X, L> {
                    name: self.name.clone(),
                    limiter: Arc::clone(&self.limiter),
                    key: key.into_owned(),
                    receipt,
                    n,
                }));
            }
            (Verdict::Admitted, _) => {}
            (_, Some(receipt)) => {
                // Declined or not, the answer is the same denial.
                let _ = self.limiter.stage_give_back(&key, receipt);
            }
            (_, None) => {}
        }
        verdict
    }

    fn wait(&self, head: &RequestHead<'_>, n: u32) -> Option<RetryAfter> {
        let key = self.extractor.extract(head)?;
        self.limiter.stage_peek(&key, n).retry_after()
    }

    fn report(&self, head: &RequestHead<'_>, n: u32, items: &mut Items) {
        let Some(key) = self.extractor.extract(head) else {
            return;
        };
        let state = now_state(&*self.limiter, &key, n);
        items.push(&self.name, self.limiter.advertise_for(&key), &state);
    }
}

/// `key`'s state in `limiter` now: the permits left, or the wait for `n`.
fn now_state<L, Q>(limiter: &L, key: &Q, n: u32) -> State
where
    L: GateLimiter<Q> + ?Sized,
    Q: ?Sized,
{
    match limiter.stage_peek(key, n) {
        // What is left after `n` more, plus those `n`: what is left now.
        KeyedDecision::Allowed { remaining } => State::Remaining(remaining.saturating_add(n)),
        denied => match denied.retry_after() {
            Some(wait) => State::Wait(wait),
            None => State::Remaining(0),
        },
    }
}

/// How an admitted request is settled by its response.
#[derive(Clone, Copy)]
enum Settle {
    /// Give the permits back.
    Refund,
    /// Empty the key's allowance.
    Drain,
    /// The request's real cost.
    Cost(u32),
    /// Keep what was charged.
    Keep,
}

/// What settling one limit did.
#[derive(Default)]
struct Settled {
    refunded: u64,
    refund_declined: u64,
    charged: u64,
    forgiven: u64,
    drained: u64,
}

/// One limit's admission of a request, kept until its response.
trait Ticket: Send + Sync {
    /// Settle as `how`, then add the limit's item as it stands.
    fn settle(self: Box<Self>, how: Settle, items: &mut Items) -> Settled;
}

/// An admission by one limit, with what gives it back: `X`'s key, owned.
struct Held<X: KeyExtractor, L> {
    name: String,
    limiter: Arc<L>,
    key: X::Key,
    receipt: Receipt,
    n: u32,
}

impl<X, L> Ticket for Held<X, L>
where
    X: KeyExtractor,
    L: GateLimiter<X::Lookup> + Send + Sync,
{
    fn settle(self: Box<Self>, how: Settle, items: &mut Items) -> Settled {
        let Held {
            name,
            limiter,
            key,
            receipt,
            n,
        } = *self;
        let key: &X::Lookup = key.borrow();
        let mut settled = Settled::default();
        match how {
            Settle::Keep => {}
            Settle::Refund => {
                if limiter.stage_give_back(key, receipt) {
                    settled.refunded = 1;
                } else {
                    settled.refund_declined = 1;
                }
            }
            Settle::Drain => settled.drained = take_up_to(&*limiter, key, u32::MAX).0.into(),
            Settle::Cost(cost) if cost > n => {
                let (taken, short) = take_up_to(&*limiter, key, cost - n);
                settled.charged = taken.into();
                settled.forgiven = short.into();
            }
            Settle::Cost(cost) if cost < n => {
                if limiter.stage_give_back(key, receipt) {
                    settled.refunded = 1;
                    let (taken, short) = take_up_to(&*limiter, key, cost);
                    settled.charged = taken.into();
                    settled.forgiven = short.into();
                } else {
                    // The charge stays: more than used, never less.
                    settled.refund_declined = 1;
                }
            }
            Settle::Cost(_) => {}
        }
        let state = now_state(&*limiter, key, 1);
        items.push(&name, limiter.advertise_for(key), &state);
        settled
    }
}

/// Take up to `want` permits for `key`, as many as the limiter holds: the
/// permits taken and those it did not hold.
fn take_up_to<L, Q>(limiter: &L, key: &Q, want: u32) -> (u32, u32)
where
    L: GateLimiter<Q> + ?Sized,
    Q: ?Sized,
{
    let mut left = want;
    // A few tries: another request may take what was seen between the look
    // and the take; what is still not taken then is reported short.
    for _ in 0..4 {
        if left == 0 {
            break;
        }
        let State::Remaining(holds) = now_state(limiter, key, 1) else {
            break;
        };
        let ask = left.min(holds).min(limiter.min_capacity());
        if ask == 0 {
            break;
        }
        if limiter.stage_take(key, ask).0.is_allowed() {
            left -= ask;
        }
    }
    (want - left, left)
}

/// The tickets of an admitted request, and where their counts go.
struct Settlement {
    shared: Arc<Shared>,
    tickets: Vec<Box<dyn Ticket>>,
}

impl Settlement {
    /// Settle every limit by the response, and say what each holds now.
    fn settle(self, parts: &Parts) -> Option<Fields> {
        let shared = &self.shared;
        let how = if shared.drain_when.as_ref().is_some_and(|when| when(parts)) {
            Settle::Drain
        } else if shared.refund_when.as_ref().is_some_and(|when| when(parts)) {
            Settle::Refund
        } else if let Some(cost) = shared
            .cost_from_response
            .as_ref()
            .and_then(|cost| cost(parts))
        {
            Settle::Cost(cost)
        } else {
            Settle::Keep
        };
        let mut items = Items::default();
        let mut total = Settled::default();
        // In the order the limits were asked (the tickets were kept from the
        // last limit back).
        for ticket in self.tickets.into_iter().rev() {
            let settled = ticket.settle(how, &mut items);
            total.refunded += settled.refunded;
            total.refund_declined += settled.refund_declined;
            total.charged += settled.charged;
            total.forgiven += settled.forgiven;
            total.drained += settled.drained;
        }
        let slot = thread_slot();
        for (which, n) in [
            (REFUNDED, total.refunded),
            (REFUND_DECLINED, total.refund_declined),
            (CHARGED, total.charged),
            (FORGIVEN, total.forgiven),
            (DRAINED, total.drained),
        ] {
            if n > 0 {
                shared.counts.add_n(which, slot, n);
            }
        }
        items.fields()
    }
}

pin_project_lite::pin_project! {
    /// The future of a [`Limited`] service's response.
    pub struct LimitedFuture<F, B> {
        #[pin]
        state: State2<F, B>,
    }
}

pin_project_lite::pin_project! {
    #[project = State2Proj]
    enum State2<F, B> {
        Admitted {
            #[pin]
            future: F,
            fields: Option<Fields>,
            settle: Option<Settlement>,
        },
        Denied {
            response: Option<Response<B>>,
        },
    }
}

impl<F, B> LimitedFuture<F, B> {
    fn admitted(future: F, fields: Option<Fields>, settle: Option<Settlement>) -> Self {
        LimitedFuture {
            state: State2::Admitted {
                future,
                fields,
                settle,
            },
        }
    }

    fn denied(response: Response<B>) -> Self {
        LimitedFuture {
            state: State2::Denied {
                response: Some(response),
            },
        }
    }
}

impl<F, B, E> Future for LimitedFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            State2Proj::Admitted {
                future,
                fields,
                settle,
            } => match future.poll(cx) {
                Poll::Ready(Ok(response)) => {
                    let (mut parts, body) = response.into_parts();
                    let fields = match settle.take() {
                        Some(settlement) => settlement.settle(&parts),
                        None => fields.take(),
                    };
                    if let Some([Some(policy), Some(value)]) = fields {
                        append_item(&mut parts.headers, RATELIMIT_POLICY, policy);
                        append_item(&mut parts.headers, RATELIMIT, value);
                    }
                    Poll::Ready(Ok(Response::from_parts(parts, body)))
                }
                // An error from the service: the permits stay spent.
                other => other,
            },
            // Polled again after completing: stay pending rather than panic.
            State2Proj::Denied { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                None => Poll::Pending,
            },
        }
    }
}

impl<F, B> fmt::Debug for LimitedFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitedFuture").finish_non_exhaustive()
    }
}
