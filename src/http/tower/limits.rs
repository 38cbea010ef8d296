//! Several limits in one layer, all or nothing: [`Limits`], built by
//! [`LimitsBuilder`], and the [`Limited`] service it wraps.

use core::borrow::Borrow;
use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use http::header::HeaderValue;
use http::response::Parts;
use http::{Request, Response};

use super::denial::{Denial, DenialResponse, DenyWith, PlainDenial, close_if_body_unread};
use super::extract::{KeyExtractor, RequestHead};
use super::fields::{
    Fields, RATELIMIT, RATELIMIT_POLICY, append_item, push_decimal, push_name, push_policy,
};
use super::layer::{Reported, deny};
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
/// limiters, or a limit in Redis (`LimitsBuilder::redis_limit`, features
/// `redis` and `tokio`; asked after every in-process limit, so that a
/// request refused in-process costs no call). A request is decided as
/// follows:
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
    /// Limits decided by a call (in Redis), asked after every in-process one
    /// admitted.
    remote: Vec<Arc<dyn Remote>>,
    cost: u32,
    refund_when: Option<When>,
    drain_when: Option<When>,
    cost_from_response: Option<CostOf>,
    challenge: Option<HeaderValue>,
    /// Write the `RateLimit` fields.
    advertise: bool,
    /// The whole `RateLimit-Policy` value when every limit advertises what it
    /// did when added, and how many items it has.
    policy_line: Option<(usize, HeaderValue)>,
    counts: Tally<COUNTERS>,
    /// Denials by each limit (the first that refused), in order: the
    /// in-process ones, then the remote ones.
    denied_by: Vec<AtomicU64>,
    reported: Reported,
}

impl Shared {
    /// Whether admitted requests are settled by their responses.
    fn settles(&self) -> bool {
        self.refund_when.is_some() || self.drain_when.is_some() || self.cost_from_response.is_some()
    }

    /// Count a denial by limit `by` (the remote ones after the in-process
    /// ones).
    fn count_denial(&self, by: usize, decision: KeyedDecision) {
        let which = match decision {
            KeyedDecision::KeyLimit { .. } => UNAVAILABLE,
            _ => TOO_MANY,
        };
        self.counts.add(which, thread_slot());
        if let Some(count) = self.denied_by.get(by) {
            // Relaxed: a count, on the denial path only.
            count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every in-process limit's item as it stands now, for `head`: on a
    /// denial (`refused`), with the wait of each that would refuse too.
    fn report(&self, head: &RequestHead<'_>, refused: bool, items: &mut Items) {
        if self.advertise {
            for limit in &self.limits {
                limit.report(head, self.cost, refused, items);
            }
        }
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
const LENT: usize = 9;
const COUNTERS: usize = 10;

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
    /// Permits charged after the response from a token bucket's next
    /// refills, beyond what it held (it lends at most one fill ahead): the
    /// requests after wait for them.
    pub lent: u64,
    /// Permits a response's cost asked for that the limit neither held nor
    /// could lend, and so were not charged: the whole over-admission
    /// settling allows.
    pub forgiven: u64,
    /// Permits taken by [`drain_when`](LimitsBuilder::drain_when).
    pub drained: u64,
}

/// Builds a [`Limits`] layer ([`Limits::builder`]).
pub struct LimitsBuilder {
    limits: Vec<Box<dyn Limit>>,
    pub(crate) remote: Vec<Arc<dyn Remote>>,
    advertise: bool,
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
            remote: Vec::new(),
            advertise: true,
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
        self.check_name(name)?;
        let cached = limiter
            .advertise_untiered()
            .map(|advertised| Cached::new(name, advertised));
        self.limits.push(Box::new(Entry {
            name: name.to_owned(),
            extractor,
            limiter,
            cached,
        }));
        Ok(self)
    }

    /// Refuse a name that could not be a policy name, or one already taken.
    pub(crate) fn check_name(&self, name: &str) -> Result<(), LimitsError> {
        RateLimitPolicy::new(name, 1, Duration::from_secs(1))?;
        let taken = self.limits.iter().map(|l| l.name());
        if taken
            .chain(self.remote.iter().map(|r| r.name()))
            .any(|n| n == name)
        {
            return Err(LimitsError::DuplicateName(name.to_owned()));
        }
        Ok(())
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
    /// **The bound.** The difference is taken from what the limit holds
    /// when the response arrives, then, for a token bucket (direct, keyed
    /// or tiered, live or not), lent from its next refills as a reservation
    /// is ([`RateLimiter::reserve_n`](crate::RateLimiter::reserve_n)): a
    /// debt the requests after it wait out ([`LimitsStats::lent`]). A
    /// bucket lends at most one fill time ahead; what it can neither hold
    /// nor lend, and the whole difference for the other algorithms and for
    /// limits in Redis, is *forgiven* and counted
    /// ([`LimitsStats::forgiven`]), not carried. So each limit admits, over
    /// any interval, no more permits than its own bound allows plus the
    /// permits forgiven in it, and each request can have at most its real
    /// cost less the up-front charge forgiven.
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

    /// Whether answers carry the `RateLimit-Policy` and `RateLimit` fields
    /// (`true` by default). Without them a layer costs less per request
    /// (BENCHMARKS.md, the layer group), and clients learn nothing but
    /// `Retry-After`.
    pub fn advertise(self, advertise: bool) -> Self {
        LimitsBuilder { advertise, ..self }
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
        let capacities = self.limits.iter().map(|l| (l.name(), l.capacity()));
        let remote = self.remote.iter().map(|r| (r.name(), r.capacity()));
        for (name, capacity) in capacities.chain(remote) {
            if self.cost == 0 || self.cost > capacity {
                return Err(LimitsError::Cost {
                    cost: self.cost,
                    limit: name.to_owned(),
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
        let denied_by = (0..self.limits.len() + self.remote.len())
            .map(|_| AtomicU64::new(0))
            .collect();
        let items: Option<Vec<&[u8]>> = self.limits.iter().map(|l| l.cached_item()).collect();
        let policy_line = items.filter(|items| !items.is_empty()).and_then(|items| {
            HeaderValue::from_bytes(&items.join(&b", "[..]))
                .ok()
                .map(|v| (items.len(), v))
        });
        Ok(Limits {
            shared: Arc::new(Shared {
                limits: self.limits,
                remote: self.remote,
                cost: self.cost,
                refund_when: self.refund_when,
                drain_when: self.drain_when,
                cost_from_response: self.cost_from_response,
                challenge: self.challenge,
                advertise: self.advertise,
                policy_line,
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
    pub fn names(&self) -> impl Iterator<Item = &str> {
        let shared = &self.shared;
        let remote = shared.remote.iter().map(|r| r.name());
        shared.limits.iter().map(|l| l.name()).chain(remote)
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
            denied_by: self
                .names()
                .zip(&shared.denied_by)
                // Relaxed: counts, read for reporting.
                .map(|(name, n)| (name.to_owned(), n.load(Ordering::Relaxed)))
                .collect(),
            refunded: sum(REFUNDED),
            refund_declined: sum(REFUND_DECLINED),
            charged: sum(CHARGED),
            lent: sum(LENT),
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

/// A service behind a [`Limits`] layer. It must be `Clone` (axum's routers
/// and handlers are; wrap another in `tower::buffer::Buffer`): a request
/// that waits for a limit in Redis takes the readied service with it and
/// leaves a clone for the next.
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
    Svc: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    R: DenialResponse<ResBody>,
    ReqBody: 'static,
{
    type Response = Response<ResBody>;
    type Error = Svc::Error;
    type Future = LimitedFuture<Svc, ReqBody, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let shared = &self.layer.shared;
        let head = RequestHead::of(&request);
        // Every key before any permit: a request without one spends nothing.
        let missing = shared
            .limits
            .iter()
            .find_map(|l| l.missing(&head).map(|d| (d, l.challenge())))
            .or_else(|| {
                let mut remote = shared.remote.iter();
                remote.find_map(|r| r.missing(&head).map(|d| (d, r.challenge())))
            });
        if let Some((denial, challenge)) = missing {
            match denial {
                Denial::Misconfigured(problem) => shared.reported.report(problem),
                _ => shared.counts.add(UNAUTHORIZED, thread_slot()),
            }
            let response = deny(
                &self.layer.respond,
                &denial,
                shared.challenge.as_ref(),
                || challenge,
                None,
            );
            return LimitedFuture::denied(closing(&request, response));
        }
        let remote_keys: Option<Vec<Vec<u8>>> =
            shared.remote.iter().map(|r| r.key(&head)).collect();
        let Some(remote_keys) = remote_keys else {
            return self.unauthorized(&request);
        };
        let remote = !remote_keys.is_empty();
        let mut decide = Decide {
            advertise: shared.advertise,
            // A remote limit may still refuse: the in-process admissions
            // are kept, to give them back then.
            keep: remote || shared.settles(),
            items: Items::default(),
            tickets: Vec::new(),
            depth: 0,
        };
        let verdict = match shared.limits.split_first() {
            None => Verdict::Admitted,
            Some((first, rest)) => first.decide(&head, shared.cost, rest, &mut decide),
        };
        match verdict {
            Verdict::Admitted if remote => {
                // `poll_ready` readied `inner`: that one goes with the
                // request, a clone stays for the next.
                let clone = self.inner.clone();
                let inner = core::mem::replace(&mut self.inner, clone);
                let decided = remote_phase(Arc::clone(shared), remote_keys, shared.cost);
                let layer = self.layer.clone();
                LimitedFuture::deciding(
                    decided,
                    Waiting {
                        inner,
                        request,
                        tickets: decide.tickets,
                        finish: Box::new(move |outcome, request, tickets| {
                            layer.finish_remote(outcome, request, tickets)
                        }),
                    },
                )
            }
            Verdict::Admitted => {
                shared.counts.add(ADMITTED, thread_slot());
                let (fields, settle) = if decide.keep {
                    // Told after the response is settled.
                    let settlement = Settlement {
                        shared: Arc::clone(shared),
                        tickets: decide.tickets,
                        remote: Vec::new(),
                    };
                    (None, Some(settlement))
                } else {
                    (decide.items.fields(shared.policy_line.as_ref()), None)
                };
                LimitedFuture::admitted(self.inner.call(request), fields, settle)
            }
            Verdict::Refused { by, decision } => {
                shared.count_denial(by, decision);
                // Every limit's state after this decision (the refunds made).
                let mut items = Items::default();
                shared.report(&head, true, &mut items);
                let outcome = Outcome::from_decision(Some(decision));
                let response = deny(
                    &self.layer.respond,
                    &Denial::Refused(outcome),
                    shared.challenge.as_ref(),
                    || HeaderValue::from_static("ApiKey"),
                    items.fields(shared.policy_line.as_ref()),
                );
                LimitedFuture::denied(closing(&request, response))
            }
            // Keys were all found above; an extractor that answers
            // differently the second time is treated as no key.
            Verdict::NoKey => self.unauthorized(&request),
        }
    }
}

impl<Svc, R> Limited<Svc, R> {
    /// A 401 for a key that an extractor found once and not again.
    fn unauthorized<ReqBody, B, E>(
        &self,
        request: &Request<ReqBody>,
    ) -> LimitedFuture<Svc, ReqBody, B>
    where
        Svc: Service<Request<ReqBody>, Response = Response<B>, Error = E>,
        R: DenialResponse<B>,
    {
        let shared = &self.layer.shared;
        shared.counts.add(UNAUTHORIZED, thread_slot());
        let response = deny(
            &self.layer.respond,
            &Denial::Refused(Outcome::Unauthorized),
            shared.challenge.as_ref(),
            || HeaderValue::from_static("ApiKey"),
            None,
        );
        LimitedFuture::denied(closing(request, response))
    }
}

impl<R> Limits<R> {
    /// How to go on once the remote limits have decided a request every
    /// in-process limit admitted (`tickets`).
    fn finish_remote<ReqBody, B>(
        &self,
        outcome: RemoteOutcome,
        request: &Request<ReqBody>,
        tickets: Vec<Box<dyn Ticket>>,
    ) -> Finish<B>
    where
        R: DenialResponse<B>,
    {
        let shared = &self.shared;
        let head = RequestHead::of(request);
        match outcome {
            RemoteOutcome::Admitted(taken) => {
                shared.counts.add(ADMITTED, thread_slot());
                let settlement = Settlement {
                    shared: Arc::clone(shared),
                    tickets,
                    remote: taken,
                };
                if shared.settles() {
                    return Finish::Admit(None, Some(settlement));
                }
                // Nothing to settle: the permits stay spent, and each limit
                // is told as it stands.
                let mut items = Items::default();
                shared.report(&head, false, &mut items);
                settlement.report_remote(&mut items, |_| 0);
                Finish::Admit(items.fields(shared.policy_line.as_ref()), None)
            }
            RemoteOutcome::Refused {
                by,
                decision,
                taken,
            } => {
                // The in-process admissions go back, the last first; the
                // answer is the same denial whether each refund is exact.
                for ticket in tickets.into_iter().rev() {
                    let _ = ticket.give_back();
                }
                let decision = KeyedDecision::from(decision);
                shared.count_denial(shared.limits.len() + by, decision);
                let mut items = Items::default();
                shared.report(&head, true, &mut items);
                if shared.advertise {
                    for (index, remaining, exact) in taken {
                        let r = if exact {
                            remaining.saturating_add(shared.cost)
                        } else {
                            remaining
                        };
                        push_remote(&mut items, shared, index, &State::Remaining(r));
                    }
                    if let Some(wait) = decision.retry_after() {
                        push_remote(&mut items, shared, by, &State::Wait(wait));
                    }
                }
                let outcome = Outcome::from_decision(Some(decision));
                let response = deny(
                    &self.respond,
                    &Denial::Refused(outcome),
                    shared.challenge.as_ref(),
                    || HeaderValue::from_static("ApiKey"),
                    items.fields(None),
                );
                Finish::Deny(response)
            }
        }
    }
}

/// Remote limit `index`'s item.
fn push_remote(items: &mut Items, shared: &Shared, index: usize, state: &State) {
    if let Some(limit) = shared.remote.get(index) {
        let advertised = limit.advertise().map(|(quota, window)| Advertised {
            quota,
            window,
            tier: None,
        });
        items.push(limit.name(), None, advertised, state);
    }
}

/// `response` to a denied `request`, telling the client to reconnect when
/// the request's body was left unread (see [`close_if_body_unread`]).
fn closing<ReqBody, B>(request: &Request<ReqBody>, mut response: Response<B>) -> Response<B> {
    close_if_body_unread(request.version(), request.headers(), response.headers_mut());
    response
}

/// A boxed future that can move between threads.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Gives back what a remote limit's admission took: `true` when exact.
pub(crate) type Refund = Box<dyn FnOnce() -> BoxFuture<bool> + Send + Sync>;

/// A limit decided by a call (one of the crate's limits in Redis), asked
/// only once every in-process limit admitted.
pub(crate) trait Remote: Send + Sync {
    fn name(&self) -> &str;
    /// The most permits one request can get.
    fn capacity(&self) -> u32;
    /// Why the request has no key for this limit, if it has none.
    fn missing(&self, head: &RequestHead<'_>) -> Option<Denial>;
    /// The challenge of a 401 for a key this limit did not find.
    fn challenge(&self) -> HeaderValue;
    /// The request's key, as the bytes the limit keeps it under.
    fn key(&self, head: &RequestHead<'_>) -> Option<Vec<u8>>;
    /// What the limit may advertise.
    fn advertise(&self) -> Option<(u32, Duration)>;
    /// Take `n` permits for `key`, and what gives them back (`None` when
    /// they cannot be).
    fn take(&self, key: Vec<u8>, n: u32) -> BoxFuture<(crate::decision::Decision, Option<Refund>)>;
}

/// A remote admission kept for settling: its limit's index, its key, the
/// permits left after it, and its refund.
pub(crate) struct RemoteTaken {
    index: usize,
    #[cfg_attr(not(all(feature = "redis", feature = "tokio")), allow(dead_code))]
    key: Vec<u8>,
    remaining: u32,
    refund: Option<Refund>,
}

/// What the remote limits answered.
pub(crate) enum RemoteOutcome {
    Admitted(Vec<RemoteTaken>),
    /// Remote limit `by` refused; the ones before it admitted and were given
    /// back (each its index, the permits it had left, and whether the refund
    /// was exact).
    Refused {
        by: usize,
        decision: crate::decision::Decision,
        taken: Vec<(usize, u32, bool)>,
    },
}

/// Ask the remote limits in order, all or nothing.
fn remote_phase(shared: Arc<Shared>, keys: Vec<Vec<u8>>, n: u32) -> BoxFuture<RemoteOutcome> {
    Box::pin(async move {
        let mut taken: Vec<RemoteTaken> = Vec::with_capacity(keys.len());
        for (index, (limit, key)) in shared.remote.iter().zip(keys).enumerate() {
            let (decision, refund) = limit.take(key.clone(), n).await;
            match decision {
                crate::decision::Decision::Allowed { remaining } => taken.push(RemoteTaken {
                    index,
                    key,
                    remaining,
                    refund,
                }),
                denied => {
                    let mut back = Vec::with_capacity(taken.len());
                    for earlier in taken.into_iter().rev() {
                        let exact = match earlier.refund {
                            Some(refund) => refund().await,
                            None => false,
                        };
                        back.push((earlier.index, earlier.remaining, exact));
                    }
                    back.reverse();
                    return RemoteOutcome::Refused {
                        by: index,
                        decision: denied,
                        taken: back,
                    };
                }
            }
        }
        RemoteOutcome::Admitted(taken)
    })
}

/// How a request goes on once its remote limits decided.
enum Finish<B> {
    Admit(Option<Fields>, Option<Settlement>),
    Deny(Response<B>),
}

/// Builds how a request goes on from its remote limits' answer.
type FinishWith<ReqBody, B> =
    Box<dyn FnOnce(RemoteOutcome, &Request<ReqBody>, Vec<Box<dyn Ticket>>) -> Finish<B> + Send>;

/// A request waiting for its remote limits.
struct Waiting<Svc, ReqBody, B> {
    inner: Svc,
    request: Request<ReqBody>,
    tickets: Vec<Box<dyn Ticket>>,
    finish: FinishWith<ReqBody, B>,
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
    /// Write the `RateLimit` items.
    advertise: bool,
    /// Keep tickets for settling.
    keep: bool,
    items: Items,
    tickets: Vec<Box<dyn Ticket>>,
    /// The index of the limit deciding now.
    depth: usize,
}

/// The `RateLimit-Policy` and `RateLimit` items being written, as bytes
/// (written by hand: `core::fmt` costs several times the decision itself).
struct Items {
    policy: Vec<u8>,
    value: Vec<u8>,
    /// Items written.
    count: usize,
    /// Whether every policy item was the limit's cached one.
    all_cached: bool,
}

impl Default for Items {
    fn default() -> Items {
        Items {
            policy: Vec::new(),
            value: Vec::new(),
            count: 0,
            all_cached: true,
        }
    }
}

/// A limit's `RateLimit-Policy` item, written once for the quota and window
/// it advertised when it was added (a limit without tiers).
struct Cached {
    quota: u32,
    window: Duration,
    item: Box<[u8]>,
}

impl Cached {
    fn new(name: &str, (quota, window): (u32, Duration)) -> Cached {
        let mut item = Vec::new();
        push_policy(&mut item, name, None, quota, window);
        Cached {
            quota,
            window,
            item: item.into(),
        }
    }
}

/// One limit's state, for its `RateLimit` item.
enum State {
    Remaining(u32),
    Wait(RetryAfter),
}

impl Items {
    fn push(
        &mut self,
        name: &str,
        cached: Option<&Cached>,
        advertised: Option<Advertised<'_>>,
        state: &State,
    ) {
        let Some(advertised) = advertised else {
            return;
        };
        self.count += 1;
        let (policy, value) = (&mut self.policy, &mut self.value);
        if policy.is_empty() {
            policy.reserve(96);
            value.reserve(96);
        } else {
            policy.extend_from_slice(b", ");
            value.extend_from_slice(b", ");
        }
        match cached {
            Some(cached)
                if advertised.tier.is_none()
                    && (cached.quota, cached.window) == (advertised.quota, advertised.window) =>
            {
                policy.extend_from_slice(&cached.item);
            }
            _ => {
                self.all_cached = false;
                push_policy(
                    policy,
                    name,
                    advertised.tier,
                    advertised.quota,
                    advertised.window,
                );
            }
        }
        push_name(value, name, advertised.tier);
        match state {
            State::Remaining(r) => {
                value.extend_from_slice(b";r=");
                push_decimal(value, (*r).into());
            }
            State::Wait(wait) => {
                value.extend_from_slice(b";r=0;t=");
                push_decimal(value, wait.header_secs());
            }
        }
    }

    /// The two field values; `line` is the whole `RateLimit-Policy` value
    /// of `limits` limits each with its cached item, shared rather than
    /// copied when every item written was that.
    fn fields(self, line: Option<&(usize, HeaderValue)>) -> Option<Fields> {
        if self.policy.is_empty() {
            return None;
        }
        let policy = match line {
            Some((limits, line)) if self.all_cached && self.count == *limits => Some(line.clone()),
            // Validated names and numbers make valid values.
            _ => HeaderValue::from_bytes(&self.policy).ok(),
        };
        Some([policy, HeaderValue::from_bytes(&self.value).ok()])
    }
}

/// One limit of a [`Limits`] layer, its types erased.
trait Limit: Send + Sync {
    fn name(&self) -> &str;
    /// The policy item it advertises for every key, when it has no tiers.
    fn cached_item(&self) -> Option<&[u8]>;
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
    /// This limit's item as it stands now: on a denial (`refused`), with
    /// the wait for `n` permits if it would refuse them too.
    fn report(&self, head: &RequestHead<'_>, n: u32, refused: bool, items: &mut Items);
}

/// A limit's name, extractor and limiter.
struct Entry<X, L> {
    name: String,
    extractor: X,
    limiter: Arc<L>,
    /// The policy item, for a limit without tiers.
    cached: Option<Cached>,
}

impl<X, L> Limit for Entry<X, L>
where
    X: KeyExtractor,
    L: GateLimiter<X::Lookup> + Send + Sync + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn cached_item(&self) -> Option<&[u8]> {
        self.cached.as_ref().map(|c| &*c.item)
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
        if cx.advertise && !cx.keep {
            cx.items.push(
                &self.name,
                self.cached.as_ref(),
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
            // Kept even when the admission wrote nothing (so took nothing):
            // its limit is still told after the response.
            (Verdict::Admitted, receipt) if cx.keep => {
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

    fn report(&self, head: &RequestHead<'_>, n: u32, refused: bool, items: &mut Items) {
        let Some(key) = self.extractor.extract(head) else {
            return;
        };
        let state = if refused {
            now_state(&*self.limiter, &key, n)
        } else {
            State::Remaining(now_remaining(&*self.limiter, &key))
        };
        items.push(
            &self.name,
            self.cached.as_ref(),
            self.limiter.advertise_for(&key),
            &state,
        );
    }
}

/// The permits `key` has left in `limiter` now.
fn now_remaining<L, Q>(limiter: &L, key: &Q) -> u32
where
    L: GateLimiter<Q> + ?Sized,
    Q: ?Sized,
{
    match limiter.stage_peek(key, 1) {
        KeyedDecision::Allowed { remaining } => remaining.saturating_add(1),
        _ => 0,
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
    lent: u64,
    forgiven: u64,
    drained: u64,
}

/// One limit's admission of a request, kept until its response.
trait Ticket: Send + Sync {
    /// Settle as `how`, then add the limit's item as it stands.
    fn settle(self: Box<Self>, how: Settle, items: &mut Items) -> Settled;
    /// Give the permits back, exactly or not at all (a later limit refused).
    fn give_back(self: Box<Self>) -> bool;
}

/// An admission by one limit, with what gives it back: `X`'s key, owned.
struct Held<X: KeyExtractor, L> {
    name: String,
    limiter: Arc<L>,
    key: X::Key,
    /// `None` when the admission wrote nothing, so took nothing.
    receipt: Option<Receipt>,
    n: u32,
}

impl<X, L> Ticket for Held<X, L>
where
    X: KeyExtractor,
    L: GateLimiter<X::Lookup> + Send + Sync + 'static,
{
    fn give_back(self: Box<Self>) -> bool {
        let key: &X::Lookup = self.key.borrow();
        // Nothing taken, nothing owed.
        self.receipt
            .is_none_or(|receipt| self.limiter.stage_give_back(key, receipt))
    }

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
                if receipt.is_none_or(|receipt| limiter.stage_give_back(key, receipt)) {
                    settled.refunded = 1;
                } else {
                    settled.refund_declined = 1;
                }
            }
            Settle::Drain => settled.drained = take_up_to(&*limiter, key, u32::MAX).0.into(),
            Settle::Cost(cost) if cost > n => charge(&*limiter, key, cost - n, &mut settled),
            Settle::Cost(cost) if cost < n => {
                if receipt.is_none_or(|receipt| limiter.stage_give_back(key, receipt)) {
                    settled.refunded = 1;
                    charge(&*limiter, key, cost, &mut settled);
                } else {
                    // The charge stays: more than used, never less.
                    settled.refund_declined = 1;
                }
            }
            Settle::Cost(_) => {}
        }
        let state = State::Remaining(now_remaining(&*limiter, key));
        items.push(&name, None, limiter.advertise_for(key), &state);
        settled
    }
}

/// Take up to `want` permits for `key`, as many as the limiter holds: the
/// permits taken and those it did not hold.
/// Charge `want` permits for `key` after a response: from what the limiter
/// holds, then from its next refills when it can lend (a token bucket, at
/// most one fill ahead: the requests after it wait), and what is left is
/// forgiven.
fn charge<L, Q>(limiter: &L, key: &Q, want: u32, settled: &mut Settled)
where
    L: GateLimiter<Q> + 'static,
    Q: ?Sized,
{
    let (taken, short) = take_up_to(limiter, key, want);
    let lent = if short > 0 {
        limiter.stage_owe(key, short)
    } else {
        0
    };
    settled.charged += u64::from(taken);
    settled.lent += u64::from(lent);
    settled.forgiven += u64::from(short - lent);
}

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
    /// The remote limits' admissions, in order.
    remote: Vec<RemoteTaken>,
}

impl Settlement {
    /// Settle every limit by the response, and say what each holds now.
    fn settle(mut self, parts: &Parts) -> Option<Fields> {
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
        let remote = core::mem::take(&mut self.remote);
        // In the order the limits were asked (the tickets were kept from the
        // last limit back).
        for ticket in core::mem::take(&mut self.tickets).into_iter().rev() {
            let settled = ticket.settle(how, &mut items);
            total.refunded += settled.refunded;
            total.refund_declined += settled.refund_declined;
            total.charged += settled.charged;
            total.lent += settled.lent;
            total.forgiven += settled.forgiven;
            total.drained += settled.drained;
        }
        total.count(shared);
        let cost = shared.cost;
        // What each remote limit is left with once settled, at most: its
        // item never promises more.
        let after = |taken: &RemoteTaken| match how {
            Settle::Drain => 0,
            Settle::Cost(real) if real > cost => taken.remaining.saturating_sub(real - cost),
            _ => taken.remaining,
        };
        if shared.advertise {
            for taken in &remote {
                push_remote(
                    &mut items,
                    shared,
                    taken.index,
                    &State::Remaining(after(taken)),
                );
            }
        }
        settle_remote(shared, remote, how);
        if !shared.advertise {
            return None;
        }
        items.fields(None)
    }

    /// Add each remote limit's item, with what it had left after the
    /// admission less `less(taken)`.
    fn report_remote(&self, items: &mut Items, less: impl Fn(&RemoteTaken) -> u32) {
        if !self.shared.advertise {
            return;
        }
        for taken in &self.remote {
            let r = taken.remaining.saturating_sub(less(taken));
            push_remote(items, &self.shared, taken.index, &State::Remaining(r));
        }
    }
}

/// Settle the remote admissions as `how`, beside the response: each is a
/// call, made by a task of its own on the current tokio runtime, counted
/// when it ends. Outside a runtime nothing can run beside the response: the
/// permits stay spent, and a refund counts as declined.
fn settle_remote(shared: &Arc<Shared>, remote: Vec<RemoteTaken>, how: Settle) {
    if remote.is_empty() || matches!(how, Settle::Keep) {
        return;
    }
    #[cfg(all(feature = "redis", feature = "tokio"))]
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let shared = Arc::clone(shared);
        drop(runtime.spawn(async move {
            let mut total = Settled::default();
            for taken in remote {
                let limit = match shared.remote.get(taken.index) {
                    Some(limit) => Arc::clone(limit),
                    None => continue,
                };
                settle_one(&*limit, taken, how, shared.cost, &mut total).await;
            }
            total.count(&shared);
        }));
        return;
    }
    let declined = remote.iter().filter(|t| t.refund.is_some()).count();
    if matches!(how, Settle::Refund) && declined > 0 {
        shared
            .counts
            .add_n(REFUND_DECLINED, thread_slot(), declined as u64);
    }
}

/// Settle one remote admission as `how` (charged `n` up front).
#[cfg(all(feature = "redis", feature = "tokio"))]
async fn settle_one(
    limit: &dyn Remote,
    taken: RemoteTaken,
    how: Settle,
    n: u32,
    total: &mut Settled,
) {
    let refund = |refund: Option<Refund>| async move {
        match refund {
            Some(refund) => refund().await,
            None => false,
        }
    };
    match how {
        Settle::Keep => {}
        Settle::Refund => {
            if refund(taken.refund).await {
                total.refunded += 1;
            } else {
                total.refund_declined += 1;
            }
        }
        Settle::Drain => {
            total.drained += u64::from(remote_take_up_to(limit, &taken.key, u32::MAX).await.0)
        }
        Settle::Cost(real) if real > n => {
            let (charged, short) = remote_take_up_to(limit, &taken.key, real - n).await;
            total.charged += u64::from(charged);
            total.forgiven += u64::from(short);
        }
        Settle::Cost(real) if real < n => {
            if refund(taken.refund).await {
                total.refunded += 1;
                let (charged, short) = remote_take_up_to(limit, &taken.key, real).await;
                total.charged += u64::from(charged);
                total.forgiven += u64::from(short);
            } else {
                total.refund_declined += 1;
            }
        }
        Settle::Cost(_) => {}
    }
}

/// Take up to `want` permits for `key` from a remote limit, which answers
/// all or nothing: the largest batch it admits, halving from what is asked
/// (at most one call per halving). The permits taken, and those not.
#[cfg(all(feature = "redis", feature = "tokio"))]
async fn remote_take_up_to(limit: &dyn Remote, key: &[u8], want: u32) -> (u32, u32) {
    let mut left = want;
    let mut ask = want.min(limit.capacity());
    while left > 0 && ask > 0 {
        let (decision, _) = limit.take(key.to_vec(), ask).await;
        if decision.is_allowed() {
            left -= ask;
            ask = ask.min(left);
        } else {
            ask /= 2;
        }
    }
    (want - left, left)
}

impl Settled {
    /// Add these counts to the layer's.
    fn count(&self, shared: &Shared) {
        let slot = thread_slot();
        for (which, n) in [
            (REFUNDED, self.refunded),
            (REFUND_DECLINED, self.refund_declined),
            (CHARGED, self.charged),
            (LENT, self.lent),
            (FORGIVEN, self.forgiven),
            (DRAINED, self.drained),
        ] {
            if n > 0 {
                shared.counts.add_n(which, slot, n);
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of a [`Limited`] service's response: the remote limits'
    /// decision first, when there are any, then the inner service's response
    /// or the denial.
    pub struct LimitedFuture<Svc, ReqBody, B>
    where
        Svc: Service<Request<ReqBody>>,
    {
        #[pin]
        state: Phase<Svc, ReqBody, B>,
    }
}

pin_project_lite::pin_project! {
    #[project = PhaseProj]
    enum Phase<Svc, ReqBody, B>
    where
        Svc: Service<Request<ReqBody>>,
    {
        Deciding {
            decided: BoxFuture<RemoteOutcome>,
            waiting: Option<Waiting<Svc, ReqBody, B>>,
        },
        Admitted {
            #[pin]
            future: Svc::Future,
            fields: Option<Fields>,
            settle: Option<Settlement>,
        },
        Denied {
            response: Option<Response<B>>,
        },
    }
}

impl<Svc, ReqBody, B> LimitedFuture<Svc, ReqBody, B>
where
    Svc: Service<Request<ReqBody>>,
{
    fn admitted(future: Svc::Future, fields: Option<Fields>, settle: Option<Settlement>) -> Self {
        LimitedFuture {
            state: Phase::Admitted {
                future,
                fields,
                settle,
            },
        }
    }

    fn denied(response: Response<B>) -> Self {
        LimitedFuture {
            state: Phase::Denied {
                response: Some(response),
            },
        }
    }

    fn deciding(decided: BoxFuture<RemoteOutcome>, waiting: Waiting<Svc, ReqBody, B>) -> Self {
        LimitedFuture {
            state: Phase::Deciding {
                decided,
                waiting: Some(waiting),
            },
        }
    }
}

impl<Svc, ReqBody, B, E> Future for LimitedFuture<Svc, ReqBody, B>
where
    Svc: Service<Request<ReqBody>, Response = Response<B>, Error = E>,
{
    type Output = Result<Response<B>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let next = match self.as_mut().project().state.project() {
                PhaseProj::Deciding { decided, waiting } => {
                    let outcome = match decided.as_mut().poll(cx) {
                        Poll::Ready(outcome) => outcome,
                        Poll::Pending => return Poll::Pending,
                    };
                    // Polled again after completing: stay pending rather
                    // than panic.
                    let Some(Waiting {
                        mut inner,
                        request,
                        tickets,
                        finish,
                    }) = waiting.take()
                    else {
                        return Poll::Pending;
                    };
                    match finish(outcome, &request, tickets) {
                        Finish::Admit(fields, settle) => Phase::Admitted {
                            future: inner.call(request),
                            fields,
                            settle,
                        },
                        Finish::Deny(response) => Phase::Denied {
                            response: Some(closing(&request, response)),
                        },
                    }
                }
                PhaseProj::Admitted {
                    future,
                    fields,
                    settle,
                } => {
                    return match future.poll(cx) {
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
                    };
                }
                // Polled again after completing: stay pending rather than
                // panic.
                PhaseProj::Denied { response } => {
                    return match response.take() {
                        Some(response) => Poll::Ready(Ok(response)),
                        None => Poll::Pending,
                    };
                }
            };
            self.as_mut().project().state.set(next);
        }
    }
}

impl<Svc, ReqBody, B> fmt::Debug for LimitedFuture<Svc, ReqBody, B>
where
    Svc: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitedFuture").finish_non_exhaustive()
    }
}
