//! Several limits in one layer, all or nothing: [`Limits`], built by
//! [`LimitsBuilder`], and the [`Limited`] service it wraps.
//!
//! - `decide`: one in-process limit ([`Limit`]) and the all-or-nothing walk
//!   over them;
//! - `items`: the `RateLimit` items written as a request is decided;
//! - `settle`: what an admission keeps for its response to settle;
//! - `remote`: limits decided by a call (in Redis), asked last;
//! - `service`: the [`Limited`] service and its response future.

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
use super::fields::{Digits, Fields, append_items, push_name, push_policy};
use super::layer::{Reported, deny};
use super::{Layer, Service};
use crate::admission::Receipt;
use crate::decision::{KeyedDecision, RetryAfter};
use crate::http::gate::{Advertised, GateLimiter, Outcome, PolicyError, RateLimitPolicy};
use crate::reclaim::thread_slot;
use crate::sync::Ordering;
use crate::tally::Tally;

mod decide;
mod items;
mod remote;
mod service;
mod settle;

use decide::{Entry, Limit};
use items::{Cached, Items, PolicyLine};
// `Refund` is named by the Redis limits and the settling of their admissions.
#[cfg_attr(not(all(feature = "redis", feature = "tokio")), allow(unused_imports))]
pub(crate) use remote::{BoxFuture, Refund, Remote};
pub use service::{Limited, LimitedFuture};

/// Why a [`LimitsBuilder`] refused its configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimitsError {
    /// A limit's name (or `name.tier`, for a limit with tiers) could not be a
    /// policy name in the `RateLimit` fields.
    Name(PolicyError),
    /// Two limits share a name, or one's name is an item name another's tiers
    /// make (`api` with tier `free` makes `api.free`): their fields could not
    /// be told apart.
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
                write!(
                    f,
                    "two limits advertise items named {name:?}: give each its own name"
                )
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
/// 1. **Keys first.** Every limit's key is extracted before any
///    permit is taken: a request without one is answered 401 (or 500 for a server
///    misconfiguration, [`KeyExtractor::misconfiguration`]) and spends
///    nothing anywhere.
/// 2. **All or nothing, in order.** Limits are asked in the order they were
///    added. When limit `i` denies, the permits limits `0..i` took go back,
///    by the chain's exact-or-decline rule (see [`chain`](crate::chain):
///    never more than was taken; a token bucket or GCRA whose word another
///    decision changed in between keeps them spent rather than risk giving
///    back too much). Between in-process limits that window is nanoseconds
///    and a kept permit rare. Limits in Redis are asked after every
///    in-process one, so there the window is a round trip: when a Redis
///    limit refuses, a busy in-process word (a global limit, a hot key)
///    has usually been changed meanwhile and keeps the permit; size such a
///    limit knowing that requests the Redis limit refuses can spend it. Put
///    the limit most likely to deny first (usually the per-key one).
/// 3. **The longest wait.** A denial answers 429 (503 when a new key met a
///    full key bound) with the longest retry-after of the limit that denied
///    and of every later in-process limit that would deny too (and, when a
///    limit in Redis denied, of every in-process limit whose permit its
///    give-back could not return, and of every earlier limit in Redis that
///    kept its permit and, asked again without taking, would refuse the
///    request now): a client that waits that long is not
///    refused by an in-process limit it never reached. Earlier limits
///    admitted, so waiting longer than their own wait is not needed for them;
///    the wait is never shorter than any refusing limit's, so a client that
///    honours it is never told to come back too early by a limit that was
///    asked. Limits in Redis are not asked when an in-process limit refuses
///    (that refusal costs no call), so their waits are not in it: a client
///    may still find one of them refusing when it comes back.
/// 4. **Told honestly.** Every 429 and 503, and every admission, carries an
///    item in the `RateLimit-Policy` and `RateLimit` fields
///    (structured-field Lists, draft-ietf-httpapi-ratelimit-headers -08
///    onwards) for each in-process limit and for each limit in Redis that
///    was asked (not those after a refusing one, nor any after an
///    in-process refusal), appended to any a layer closer to the service
///    set: `r` is that limit's own remaining after this decision, `t` its
///    own wait when it refuses, and a limit with tiers advertises the key's
///    tier (`"api.paid";q=100;w=1`). A 401 and a 500 carry none. Nothing is
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
/// upstream answered 429; a [`Global`](crate::tower::Global) limit is
/// never drained). The fields of such a response are read after the
/// in-process limits' settlement, so they tell what is left then; a limit
/// in Redis is settled by a call beside the response, and its item tells
/// at most what it holds after (a refund not yet made is not counted in).
///
/// **Counted where decided.** An in-process limiter's own stats
/// ([`KeyedLimiter::stats`](crate::KeyedLimiter::stats), a counted
/// [`RateLimiter::stats`](crate::RateLimiter::stats)) count a request as
/// admitted only once every limit, in process and in Redis, has admitted
/// it, and as denied only in the limit that refused it: a limit whose
/// permits went back because a later one refused counts it as neither, as
/// in a [chain](crate::chain).
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
    /// The whole `RateLimit-Policy` value of the limits' cached items, when
    /// every limit has one (none has tiers): used while each still
    /// advertises what it did when added.
    policy_line: Option<PolicyLine>,
    counts: Tally<COUNTERS>,
    /// Denials by each limit (the first that refused), in order: the
    /// in-process ones, then the remote ones.
    denied_by: Vec<AtomicU64>,
    reported: Reported,
    /// Whether every in-process limit reads one clock's readings
    /// ([`Clock::shared_readings`](crate::Clock::shared_readings)): then a
    /// request reads the time once, and every limit decides at that reading.
    one_reading: bool,
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
const UNSETTLED: usize = 10;
const COUNTERS: usize = 11;

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
    /// cost charged: in process, the permits it did not use).
    pub refunded: u64,
    /// Refunds a limit declined, keeping the permits spent (never more than
    /// was taken is given back).
    pub refund_declined: u64,
    /// Permits taken after the response, beyond the cost taken up front.
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
    /// Admitted requests of a layer that settles by the response whose
    /// response never came to be settled: the service answered with an
    /// error, or the response future was dropped first (the client went
    /// away, a timeout outside the layer). Their up-front charge stays:
    /// nothing is refunded, charged or drained for them.
    pub unsettled: u64,
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
    /// name already taken (by a limit, or by a `name.tier` of a limit's
    /// tiers, either way round).
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
        self.check_name(name, &limiter.tier_names())?;
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

    /// Refuse a name that could not be a policy name, or one already taken:
    /// by a limit's name, or by an item name a limit's tiers make
    /// (`api` with tiers `free` and `paid` takes `api.free` and `api.paid`),
    /// so that no two items of one field share a name.
    pub(crate) fn check_name(&self, name: &str, tiers: &[&str]) -> Result<(), LimitsError> {
        RateLimitPolicy::new(name, 1, Duration::from_secs(1))?;
        let mut wanted = vec![name.to_owned()];
        for tier in tiers {
            let item = format!("{name}.{tier}");
            RateLimitPolicy::new(&item, 1, Duration::from_secs(1))?;
            wanted.push(item);
        }
        let taken: Vec<String> = self
            .limits
            .iter()
            .flat_map(|l| l.item_names())
            .chain(self.remote.iter().map(|r| r.name().to_owned()))
            .collect();
        match wanted.into_iter().find(|w| taken.contains(w)) {
            Some(clash) => Err(LimitsError::DuplicateName(clash)),
            None => Ok(()),
        }
    }

    /// Charge each request `cost` permits in every limit (1 by default):
    /// the price taken up front, before the response can say the real one
    /// ([`cost_from_response`](Self::cost_from_response)).
    ///
    /// [`build`](Self::build) refuses a cost above some limit's capacity. A
    /// live quota ([`LiveTokenBucket`](crate::LiveTokenBucket)) changed below
    /// the cost afterwards can never admit a request: while it stands, the
    /// requests it would refuse get a 500 naming the problem (no wait would
    /// come true), and nothing is taken from the other limits.
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

    /// Empty the key's allowance, in every limit but a
    /// [`Global`](crate::tower::Global) one, when a response matches:
    /// `|parts| parts.status == 429` stops sending a key's requests upstream
    /// once the upstream refuses them. The permits taken are counted
    /// ([`LimitsStats::drained`]).
    ///
    /// A limit whose every request has the one key
    /// ([`Global`](crate::tower::Global), in process or in Redis), or whose
    /// limiter is a direct [`RateLimiter`](crate::RateLimiter) (one
    /// allowance, whatever the key), is not drained: it is every client's allowance, and a response to one client
    /// emptying it would let any client refuse all the others. A limit keyed
    /// by something many clients share (a tenant, an address behind a NAT)
    /// is emptied for all of them. The predicate sees every response the
    /// layer passes back, a 429 from a layer or handler inside it among
    /// them; where only the upstream's should drain, match what only the
    /// upstream sends.
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
    /// part of the charge it did not use back (exact or declined, as a
    /// refund). A declined refund keeps the charge: a request is never charged less
    /// than it used because of a refund.
    ///
    /// **The bound.** The difference is taken from what the limit holds
    /// when the response arrives, then, for a token bucket or a GCRA meter
    /// (direct, keyed or tiered, live or not), lent from its next permits as
    /// a reservation is ([`RateLimiter::reserve_n`](crate::RateLimiter::reserve_n)): a
    /// debt the requests after it wait out ([`LimitsStats::lent`]). Each
    /// lends at most one fill time ahead; what it can neither hold
    /// nor lend, and the whole difference for the other algorithms and for
    /// limits in Redis, is *forgiven* and counted
    /// ([`LimitsStats::forgiven`]), not carried. So each limit admits, over
    /// any interval, no more permits than its own bound allows plus the
    /// permits forgiven in it, and each request can have at most its real
    /// cost less the up-front charge forgiven. A real cost below the charge
    /// gives back only the permits it did not use, in one exact-or-decline
    /// step (in process, or one call for a limit in Redis in exact mode), so
    /// nothing of it is forgiven (or, declined, the whole charge stays; a
    /// leased limit has no refunds and always keeps it).
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
        let one_reading = self
            .limits
            .split_first()
            .and_then(|(first, rest)| {
                let shared = first.shared_readings()?;
                rest.iter()
                    .all(|l| l.shared_readings() == Some(shared))
                    .then_some(())
            })
            .is_some();
        let denied_by = (0..self.limits.len() + self.remote.len())
            .map(|_| AtomicU64::new(0))
            .collect();
        let items: Option<Vec<&[u8]>> = self.limits.iter().map(|l| l.cached_item()).collect();
        let policy_line = items.and_then(|items| PolicyLine::new(&items));
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
                one_reading,
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
            unsettled: sum(UNSETTLED),
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
