//! A tower layer over a limit kept in Redis: see [`RedisRateLimitLayer`].

use core::fmt;
use core::future::Future;
use core::net::IpAddr;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::borrow::Cow;
use std::sync::Arc;

use http::{HeaderValue, Request, Response};

use super::{AnyAsyncConnection, AsyncRedisConnection, Guarded, LeasedLimiter, RedisLimiter};
use crate::algorithm::Algorithm;
use crate::clock::Clock;
use crate::decision::{Decision, RetryAfter};
use crate::http::gate::{Outcome, PolicyError, RateLimitPolicy};
use crate::http::tower::{BoxFuture, Refund};
use crate::http::tower::{
    Denial, DenialResponse, DenyWith, Fields, KeyExtractor, Layer, PlainDenial, Reported,
    RequestHead, ResponseFuture, Service, close_if_body_unread, deny, policy_fields,
};
use crate::reclaim::thread_slot;
use crate::tally::Tally;

/// A key as the bytes that follow the limiter's prefix in Redis: what a
/// [`KeyExtractor`]'s lookup type must be for a [`RedisRateLimitLayer`].
///
/// Text and bytes are themselves (borrowed, not copied); `()` ([`Global`](crate::http::tower::Global))
/// is empty, so the one key is the prefix alone; an IP address
/// ([`PeerIp`](crate::http::tower::PeerIp), [`ForwardedFor`](crate::http::tower::ForwardedFor))
/// is its text, `192.0.2.7` or `2001:db8:aa::`.
///
/// ```
/// use std::net::IpAddr;
/// use turnstile::redis::RedisKey;
///
/// assert_eq!(&*"k_live_1".redis_key(), b"k_live_1");
/// assert_eq!(&*"2001:db8:aa::".parse::<IpAddr>()?.redis_key(), b"2001:db8:aa::");
/// assert!(().redis_key().is_empty());
/// # Ok::<(), std::net::AddrParseError>(())
/// ```
pub trait RedisKey {
    /// The key's bytes.
    fn redis_key(&self) -> Cow<'_, [u8]>;
}

impl RedisKey for str {
    fn redis_key(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.as_bytes())
    }
}

impl RedisKey for String {
    fn redis_key(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.as_bytes())
    }
}

impl RedisKey for [u8] {
    fn redis_key(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self)
    }
}

impl RedisKey for Vec<u8> {
    fn redis_key(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self)
    }
}

impl RedisKey for () {
    fn redis_key(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&[])
    }
}

impl RedisKey for IpAddr {
    fn redis_key(&self) -> Cow<'_, [u8]> {
        Cow::Owned(self.to_string().into_bytes())
    }
}

impl RedisKey for u64 {
    fn redis_key(&self) -> Cow<'_, [u8]> {
        Cow::Owned(self.to_string().into_bytes())
    }
}

mod sealed {
    use super::*;

    /// A round trip's decision, boxed: made only when a decision waits for
    /// Redis, whose call costs far more than the allocation.
    pub(super) type Pending = Pin<Box<dyn Future<Output = Decision> + Send>>;

    /// A decision made at once, or the round trip that makes it.
    pub enum Decided {
        Now(Decision),
        Later(Pending),
    }

    impl fmt::Debug for Decided {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                Decided::Now(decision) => f.debug_tuple("Now").field(decision).finish(),
                Decided::Later(_) => f.write_str("Later"),
            }
        }
    }

    pub trait Decide {
        /// Decide one permit for `key`, awaiting nothing when no call is
        /// needed.
        fn decide(self: &Arc<Self>, con: &AnyAsyncConnection, key: &[u8]) -> Decided;

        /// The limiter in Redis.
        fn redis_limiter(&self) -> &RedisLimiter;

        /// Decide `n` permits for `key` on `con`, with what gives them back
        /// when the limit can (exact mode), for a combined layer.
        fn take_owned(
            self: &Arc<Self>,
            con: AnyAsyncConnection,
            key: Vec<u8>,
            n: u32,
        ) -> BoxFuture<(Decision, Option<Refund>)>;

        /// What `n` permits for `key` would get now, taking nothing, for a
        /// combined layer telling the wait of a limit that kept a refused
        /// request's permits.
        fn peek_owned(
            self: &Arc<Self>,
            con: AnyAsyncConnection,
            key: Vec<u8>,
            n: u32,
        ) -> BoxFuture<Decision>;
    }
}

use sealed::Decided;

/// A limit in Redis that a [`RedisRateLimitLayer`] can put in front of a
/// service: [`Guarded`] (exact mode, with its failure policy) or
/// [`LeasedLimiter`] (leased mode). Sealed.
pub trait RedisLimit: sealed::Decide + Send + Sync + 'static {}

impl<A, C> RedisLimit for Guarded<A, C>
where
    A: Algorithm + Send + Sync + 'static,
    C: Clock + Send + Sync + 'static,
{
}

impl<C: Clock + Send + Sync + 'static> RedisLimit for LeasedLimiter<C> {}

/// What a request for one permit gets when it cannot fail: never, since every
/// limit has a capacity of at least one; a denial rather than a panic.
fn unreachable_denial() -> Decision {
    Decision::Denied {
        retry_after: RetryAfter::from_nanos(1_000_000_000),
    }
}

impl<A, C> sealed::Decide for Guarded<A, C>
where
    A: Algorithm + Send + Sync + 'static,
    C: Clock + Send + Sync + 'static,
{
    fn decide(self: &Arc<Self>, con: &AnyAsyncConnection, key: &[u8]) -> Decided {
        match self.begin(key, 1) {
            Ok(Ok(decision)) => Decided::Now(decision),
            Ok(Err(call)) => {
                let (this, mut con, key) = (Arc::clone(self), con.clone(), key.to_vec());
                Decided::Later(Box::pin(async move {
                    this.call_async(&mut con, &key, 1, call)
                        .await
                        .unwrap_or_else(|_| unreachable_denial())
                }))
            }
            Err(_) => Decided::Now(unreachable_denial()),
        }
    }

    fn redis_limiter(&self) -> &RedisLimiter {
        self.limiter()
    }

    fn take_owned(
        self: &Arc<Self>,
        mut con: AnyAsyncConnection,
        key: Vec<u8>,
        n: u32,
    ) -> BoxFuture<(Decision, Option<Refund>)> {
        let this = Arc::clone(self);
        Box::pin(async move {
            match this.try_acquire_n_refundable_async(&mut con, &key, n).await {
                Ok((decision, receipt)) => {
                    let refund = receipt.map(|receipt| -> Refund {
                        Box::new(move |back| -> BoxFuture<bool> {
                            // Fewer permits than the admission took: the
                            // refund scripts give back the receipt's count,
                            // leaving the key as if only the rest was taken.
                            let receipt = receipt.for_permits(back);
                            Box::pin(async move { this.refund_async(&mut con, receipt).await })
                        })
                    });
                    (decision, refund)
                }
                // `n` was checked against the capacity when the layer was
                // built: never, but a denial rather than a panic.
                Err(_) => (unreachable_denial(), None),
            }
        })
    }

    fn peek_owned(
        self: &Arc<Self>,
        mut con: AnyAsyncConnection,
        key: Vec<u8>,
        n: u32,
    ) -> BoxFuture<Decision> {
        let this = Arc::clone(self);
        Box::pin(async move {
            this.peek_n_async(&mut con, &key, n)
                .await
                .unwrap_or_else(|_| unreachable_denial())
        })
    }
}

/// A leased limit's step decided in `call`, owned until its future first
/// runs: dropped before then (the response future dropped unpolled, the
/// prefetch's task never run), it undoes the step's claims, which would
/// otherwise leave the key's fetch claimed for good (every later request
/// waiting out the fetch wait) or forget a debt owed to Redis.
struct Pending<C: Clock> {
    limiter: Arc<LeasedLimiter<C>>,
    key: Vec<u8>,
    step: Option<super::leased::Step>,
}

impl<C: Clock> Drop for Pending<C> {
    fn drop(&mut self) {
        if let Some(step) = self.step.take() {
            self.limiter.abandon(&self.key, step);
        }
    }
}

impl<C: Clock + Send + Sync + 'static> sealed::Decide for LeasedLimiter<C> {
    fn decide(self: &Arc<Self>, con: &AnyAsyncConnection, key: &[u8]) -> Decided {
        let Ok(step) = self.step(key, 1) else {
            return Decided::Now(unreachable_denial());
        };
        let decided = step.decided();
        if !step.calls() {
            return Decided::Now(decided.unwrap_or_else(unreachable_denial));
        }
        // The step's claims (the key's fetch, a debt) are held by `pending`
        // until the call begins, and undone if it never does.
        let mut pending = Pending {
            limiter: Arc::clone(self),
            key: key.to_vec(),
            step: Some(step),
        };
        let mut con = con.clone();
        let call = async move {
            let step = pending.step.take();
            let Pending { limiter, key, .. } = &pending;
            match step {
                Some(step) => limiter.complete_async(&mut con, key, 1, step).await,
                None => unreachable_denial(),
            }
        };
        match decided {
            // A prefetch: the request is decided, and the next lease is
            // fetched beside it, by a task of its own.
            Some(decision) => match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    drop(runtime.spawn(call));
                    Decided::Now(decision)
                }
                // Outside a runtime nothing can run beside the request: it
                // makes the call itself, and answers as decided.
                Err(_) => Decided::Later(Box::pin(call)),
            },
            None => Decided::Later(Box::pin(call)),
        }
    }

    fn redis_limiter(&self) -> &RedisLimiter {
        self.limiter()
    }

    /// Leased mode has no refunds: an admission a later limit refuses stays
    /// spent.
    fn take_owned(
        self: &Arc<Self>,
        mut con: AnyAsyncConnection,
        key: Vec<u8>,
        n: u32,
    ) -> BoxFuture<(Decision, Option<Refund>)> {
        let this = Arc::clone(self);
        Box::pin(async move {
            let decision = this.try_acquire_n_async(&mut con, &key, n).await;
            (decision.unwrap_or_else(|_| unreachable_denial()), None)
        })
    }

    fn peek_owned(
        self: &Arc<Self>,
        mut con: AnyAsyncConnection,
        key: Vec<u8>,
        n: u32,
    ) -> BoxFuture<Decision> {
        let this = Arc::clone(self);
        Box::pin(async move {
            this.peek_n_async(&mut con, &key, n)
                .await
                .unwrap_or_else(|_| unreachable_denial())
        })
    }
}

/// Counters of a [`RedisRateLimitLayer`], beside its misconfigurations.
const ADMITTED: usize = 0;
const UNAUTHORIZED: usize = 1;
const TOO_MANY_REQUESTS: usize = 2;

/// What a [`RedisRateLimitLayer`] and its clones answered
/// ([`RedisRateLimitLayer::stats`]), by status. Each counter is read in turn,
/// not all at one instant. The limit's own counts (calls to Redis, failures,
/// fallback decisions) are its `stats()`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisLayerStats {
    /// 200s: requests passed to the inner service.
    pub admitted: u64,
    /// 401s: requests without a key.
    pub unauthorized: u64,
    /// 429s: requests the limit denied, by Redis or by its failure policy.
    pub too_many_requests: u64,
    /// 500s: requests answered as a configuration error (a missing peer
    /// address).
    pub misconfigured: u64,
}

/// A tower layer that puts a limit kept in Redis in front of a service on the
/// `http` crate's types (axum, hyper): [`Guarded`] (exact mode) or
/// [`LeasedLimiter`] (leased mode). Features `redis`, `tower` and `tokio`.
///
/// It answers as [`RateLimitLayer`](crate::http::tower::RateLimitLayer) does: the
/// key comes from a [`KeyExtractor`] (401 with `WWW-Authenticate` when there
/// is none, 500 when the server did not provide what the extractor needs);
/// an admitted request goes to the inner service; a denied one is answered
/// 429 with `Retry-After` in whole seconds, rounded up, through the layer's
/// [`DenialResponse`], and never reaches the inner service. Exact mode can
/// add the `RateLimit-Policy` and `RateLimit` fields
/// ([`with_derived_policy`](RedisRateLimitLayer::with_derived_policy)).
///
/// **When a request waits.** The layer decides in `call` whatever can be
/// decided without Redis, and the response future awaits only a round trip:
///
/// - leased mode, while the key's lease here covers the request: decided at
///   once, no call and nothing awaited. The request that takes the lease
///   below its low-water mark is answered at once too; the next lease is
///   fetched by a task of its own (or by a [`Refresher`](super::Refresher)).
///   A miss (no lease, or an empty one) awaits one call.
/// - exact mode: every request awaits one call, except while the limit backs
///   off from a failure, when its policy answers at once.
///
/// A call takes at most the connection's response deadline (three for a
/// script's first call after Redis lost its scripts), plus the connect
/// deadline for each of those that has to connect first
/// ([`ReconnectingConnection`](super::ReconnectingConnection)). A
/// call that fails is answered by the limit's failure policy
/// ([`OnFailure`](super::OnFailure): 429 when failing closed, the local limit
/// when failing open), and for the backoff after it no request calls Redis:
/// never a hang, never a panic, never a 5xx. After a Redis restart the
/// connection connects again and the limit is Redis' again. A response
/// future dropped while it awaits (a client that hung up) leaves nothing
/// claimed.
///
/// ```no_run
/// use std::future::poll_fn;
/// use std::time::Duration;
/// use http::{Request, header::HeaderName};
/// use turnstile::redis::{Deadlines, Guarded, OnFailure, RedisLimiter, RedisRateLimitLayer};
/// use turnstile::tower::{ApiKeyHeader, Layer, Service};
/// use turnstile::{Quota, TokenBucket};
/// # use std::convert::Infallible;
/// # use std::future::{Ready, ready};
/// # use std::task::{Context, Poll};
/// # use http::Response;
/// # #[derive(Clone)]
/// # struct Hello;
/// # impl Service<Request<()>> for Hello {
/// #     type Response = Response<String>;
/// #     type Error = Infallible;
/// #     type Future = Ready<Result<Response<String>, Infallible>>;
/// #     fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
/// #         Poll::Ready(Ok(()))
/// #     }
/// #     fn call(&mut self, _: Request<()>) -> Self::Future {
/// #         ready(Ok(Response::new(String::new())))
/// #     }
/// # }
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
/// let con = Deadlines::default().reconnecting(redis::Client::open("redis://127.0.0.1/")?);
/// let quota = Quota::per_second(100)?;
/// let limit = Guarded::new(
///     RedisLimiter::new("api", TokenBucket::new(quota))?,
///     OnFailure::local_share(quota, 4)?, // 4 replicas: a quarter each while Redis is out
///     Duration::from_secs(1),
/// );
/// let layer = RedisRateLimitLayer::new(limit, con, ApiKeyHeader::new(HeaderName::from_static("x-api-key")))
///     .with_derived_policy("api")?;
/// // The service behind the layer (with axum, a `Router`); `Hello` answers 200.
/// let mut service = layer.layer(Hello);
/// let request = Request::builder().header("x-api-key", "k_live_1").body(())?;
/// poll_fn(|cx| service.poll_ready(cx)).await?;
/// let response = service.call(request).await?;
/// println!("{} {:?}", response.status(), response.headers().get("retry-after"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RedisRateLimitLayer<L, X, R = PlainDenial> {
    limit: Arc<L>,
    con: AnyAsyncConnection,
    extractor: X,
    respond: R,
    challenge: Option<HeaderValue>,
    policy: Option<Arc<RateLimitPolicy>>,
    counts: Arc<Tally<3>>,
    reported: Reported,
}

impl<L: RedisLimit, X: KeyExtractor> RedisRateLimitLayer<L, X> {
    /// A layer limiting requests by the key `extractor` picks, through
    /// `limit`, calling Redis on `con`: any of the crate's asynchronous
    /// connections ([`AsyncRedisConnection`]), to one server, to a Redis
    /// Cluster or to the primary Sentinels name.
    pub fn new(
        limit: L,
        con: impl AsyncRedisConnection,
        extractor: X,
    ) -> RedisRateLimitLayer<L, X> {
        RedisRateLimitLayer::shared(Arc::new(limit), con, extractor)
    }

    /// A layer on a limit shared with other code (to read its stats, say).
    pub fn shared(
        limit: Arc<L>,
        con: impl AsyncRedisConnection,
        extractor: X,
    ) -> RedisRateLimitLayer<L, X> {
        RedisRateLimitLayer {
            limit,
            con: con.into_any(),
            extractor,
            respond: PlainDenial,
            challenge: None,
            policy: None,
            counts: Arc::new(Tally::new()),
            reported: Reported::default(),
        }
    }
}

impl<L, X, R> RedisRateLimitLayer<L, X, R> {
    /// The limit.
    pub fn limit(&self) -> &Arc<L> {
        &self.limit
    }

    /// The connection the layer calls Redis on.
    pub fn connection(&self) -> &AnyAsyncConnection {
        &self.con
    }

    /// What this layer and its clones have answered.
    pub fn stats(&self) -> RedisLayerStats {
        RedisLayerStats {
            admitted: self.counts.sum(ADMITTED),
            unauthorized: self.counts.sum(UNAUTHORIZED),
            too_many_requests: self.counts.sum(TOO_MANY_REQUESTS),
            misconfigured: self.reported.count(),
        }
    }

    /// Build denial responses with `respond`, as
    /// [`RateLimitLayer::deny_with`](crate::http::tower::RateLimitLayer::deny_with)
    /// does: the layer still sets the status and its header fields.
    pub fn deny_with<F, B>(self, respond: F) -> RedisRateLimitLayer<L, X, DenyWith<F>>
    where
        F: Fn(&Denial) -> Response<B> + Send + Sync + 'static,
    {
        RedisRateLimitLayer {
            limit: self.limit,
            con: self.con,
            extractor: self.extractor,
            respond: DenyWith::new(respond),
            challenge: self.challenge,
            policy: self.policy,
            counts: self.counts,
            reported: self.reported,
        }
    }

    /// The `WWW-Authenticate` challenge on a 401, instead of the extractor's.
    pub fn challenge(self, challenge: HeaderValue) -> RedisRateLimitLayer<L, X, R> {
        RedisRateLimitLayer {
            challenge: Some(challenge),
            ..self
        }
    }
}

impl<A, C, X, R> RedisRateLimitLayer<Guarded<A, C>, X, R> {
    /// Add `RateLimit-Policy` and `RateLimit` header fields to every answer
    /// but a 401 (exact mode only: an admission's `remaining` is the global
    /// bucket's, or while Redis fails the local limit's).
    pub fn with_policy(self, policy: RateLimitPolicy) -> RedisRateLimitLayer<Guarded<A, C>, X, R> {
        RedisRateLimitLayer {
            policy: Some(Arc::new(policy)),
            ..self
        }
    }

    /// Add `RateLimit` header fields derived from the limit's algorithm
    /// ([`RateLimitPolicy::from_algorithm`]).
    ///
    /// # Errors
    ///
    /// [`PolicyError::Name`] for a name that could break the header's syntax.
    pub fn with_derived_policy(
        self,
        name: &str,
    ) -> Result<RedisRateLimitLayer<Guarded<A, C>, X, R>, PolicyError> {
        let policy = RateLimitPolicy::from_algorithm(name, self.limit.limiter().algorithm())?;
        Ok(self.with_policy(policy))
    }
}

impl<L, X: KeyExtractor, R: Clone> Clone for RedisRateLimitLayer<L, X, R> {
    fn clone(&self) -> Self {
        RedisRateLimitLayer {
            limit: Arc::clone(&self.limit),
            con: self.con.clone(),
            extractor: self.extractor.clone(),
            respond: self.respond.clone(),
            challenge: self.challenge.clone(),
            policy: self.policy.clone(),
            counts: Arc::clone(&self.counts),
            reported: self.reported.clone(),
        }
    }
}

impl<L, X: fmt::Debug, R> fmt::Debug for RedisRateLimitLayer<L, X, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRateLimitLayer")
            .field("connection", &self.con)
            .field("extractor", &self.extractor)
            .field("challenge", &self.challenge)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl<Svc, L, X: KeyExtractor, R: Clone> Layer<Svc> for RedisRateLimitLayer<L, X, R> {
    type Service = RedisRateLimit<Svc, L, X, R>;

    fn layer(&self, inner: Svc) -> Self::Service {
        RedisRateLimit {
            inner,
            layer: self.clone(),
        }
    }
}

/// How the layer answers a decision: the policy fields of an admission, or
/// the denial's response.
enum Answer<B> {
    Admit(Option<Fields>),
    Deny(Response<B>),
}

impl<L, X: KeyExtractor, R> RedisRateLimitLayer<L, X, R> {
    /// Count `decision`, and say how to answer it.
    fn answer<B>(&self, decision: Decision) -> Answer<B>
    where
        R: DenialResponse<B>,
    {
        let outcome = Outcome::from_decision(Some(decision.into()));
        if outcome.is_admitted() {
            self.counts.add(ADMITTED, thread_slot());
            Answer::Admit(self.policy.as_deref().map(|p| policy_fields(p, &outcome)))
        } else {
            self.counts.add(TOO_MANY_REQUESTS, thread_slot());
            let fields = self.policy.as_deref().map(|p| policy_fields(p, &outcome));
            Answer::Deny(self.deny(&Denial::Refused(outcome), fields))
        }
    }

    fn deny<B>(&self, denial: &Denial, fields: Option<Fields>) -> Response<B>
    where
        R: DenialResponse<B>,
    {
        deny(
            &self.respond,
            denial,
            self.challenge.as_ref(),
            || self.extractor.challenge(),
            fields,
        )
    }
}

/// A service behind a limit in Redis: admitted requests go to `inner`, the
/// rest are answered by the layer ([`RedisRateLimitLayer`]).
pub struct RedisRateLimit<Svc, L, X, R = PlainDenial> {
    inner: Svc,
    layer: RedisRateLimitLayer<L, X, R>,
}

impl<Svc: Clone, L, X: KeyExtractor, R: Clone> Clone for RedisRateLimit<Svc, L, X, R> {
    fn clone(&self) -> Self {
        RedisRateLimit {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<Svc: fmt::Debug, L, X: fmt::Debug, R> fmt::Debug for RedisRateLimit<Svc, L, X, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRateLimit")
            .field("inner", &self.inner)
            .field("extractor", &self.layer.extractor)
            .finish_non_exhaustive()
    }
}

impl<Svc, L, X, R, ReqBody, ResBody> Service<Request<ReqBody>> for RedisRateLimit<Svc, L, X, R>
where
    Svc: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    L: RedisLimit,
    X: KeyExtractor,
    X::Lookup: RedisKey,
    R: DenialResponse<ResBody>,
{
    type Response = Response<ResBody>;
    type Error = Svc::Error;
    type Future = RedisResponseFuture<Svc, ReqBody, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let layer = &self.layer;
        let decided = {
            let head = RequestHead::of(&request);
            match layer.extractor.extract(&head) {
                Some(key) => layer.limit.decide(&layer.con, &key.redis_key()),
                None => {
                    let denial = match layer.extractor.misconfiguration(&head) {
                        Some(problem) => {
                            layer.reported.report(problem);
                            Denial::Misconfigured(problem)
                        }
                        None => {
                            layer.counts.add(UNAUTHORIZED, thread_slot());
                            Denial::Refused(Outcome::Unauthorized)
                        }
                    };
                    let mut response = layer.deny(&denial, None);
                    close_if_body_unread(
                        request.version(),
                        request.headers(),
                        response.headers_mut(),
                    );
                    return RedisResponseFuture::answering(ResponseFuture::denied(response));
                }
            }
        };
        match decided {
            Decided::Now(decision) => {
                RedisResponseFuture::answering(match layer.answer(decision) {
                    Answer::Admit(fields) => {
                        ResponseFuture::admitted(self.inner.call(request), fields)
                    }
                    Answer::Deny(mut response) => {
                        close_if_body_unread(
                            request.version(),
                            request.headers(),
                            response.headers_mut(),
                        );
                        ResponseFuture::denied(response)
                    }
                })
            }
            Decided::Later(decision) => {
                // `poll_ready` readied `inner`: that one goes with the
                // request, a clone stays for the next.
                let clone = self.inner.clone();
                let inner = core::mem::replace(&mut self.inner, clone);
                let layer = layer.clone();
                RedisResponseFuture {
                    state: Phase::Deciding {
                        decision,
                        waiting: Some(Waiting {
                            inner,
                            request,
                            answer: Box::new(move |decision| layer.answer(decision)),
                        }),
                    },
                }
            }
        }
    }
}

/// A request waiting for its decision.
struct Waiting<Svc, ReqBody, B> {
    inner: Svc,
    request: Request<ReqBody>,
    answer: Box<dyn FnOnce(Decision) -> Answer<B> + Send>,
}

pin_project_lite::pin_project! {
    /// The future of a [`RedisRateLimit`] service's response: a round trip's
    /// decision first, when one is needed, then the inner service's response
    /// or the denial.
    pub struct RedisResponseFuture<Svc, ReqBody, B>
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
            decision: sealed::Pending,
            waiting: Option<Waiting<Svc, ReqBody, B>>,
        },
        Answering {
            #[pin]
            future: ResponseFuture<Svc::Future, B>,
        },
    }
}

impl<Svc, ReqBody, B> RedisResponseFuture<Svc, ReqBody, B>
where
    Svc: Service<Request<ReqBody>>,
{
    fn answering(future: ResponseFuture<Svc::Future, B>) -> Self {
        RedisResponseFuture {
            state: Phase::Answering { future },
        }
    }
}

impl<Svc, ReqBody, B> Future for RedisResponseFuture<Svc, ReqBody, B>
where
    Svc: Service<Request<ReqBody>, Response = Response<B>>,
{
    type Output = Result<Response<B>, Svc::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let next = match self.as_mut().project().state.project() {
                PhaseProj::Answering { future } => return future.poll(cx),
                PhaseProj::Deciding { decision, waiting } => {
                    let decision = match decision.as_mut().poll(cx) {
                        Poll::Ready(decision) => decision,
                        Poll::Pending => return Poll::Pending,
                    };
                    // Taken once; polled again after that, stay pending
                    // rather than panic.
                    let Some(Waiting {
                        mut inner,
                        request,
                        answer,
                    }) = waiting.take()
                    else {
                        return Poll::Pending;
                    };
                    match answer(decision) {
                        Answer::Admit(fields) => {
                            ResponseFuture::admitted(inner.call(request), fields)
                        }
                        Answer::Deny(mut response) => {
                            close_if_body_unread(
                                request.version(),
                                request.headers(),
                                response.headers_mut(),
                            );
                            ResponseFuture::denied(response)
                        }
                    }
                }
            };
            self.as_mut()
                .project()
                .state
                .set(Phase::Answering { future: next });
        }
    }
}

impl<Svc, ReqBody, B> fmt::Debug for RedisResponseFuture<Svc, ReqBody, B>
where
    Svc: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisResponseFuture")
            .finish_non_exhaustive()
    }
}
