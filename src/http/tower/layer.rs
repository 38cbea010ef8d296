//! The layer itself: [`RateLimitLayer`], the [`RateLimit`] service it wraps,
//! its response future, and the header fields it sets.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::Arc;

use http::header::{HeaderValue, RETRY_AFTER, WWW_AUTHENTICATE};
use http::{Request, Response};

use super::denial::{Denial, DenialResponse, DenyWith, PlainDenial, close_if_body_unread};
use super::extract::{Global, KeyExtractor, RequestHead};
use super::fields::{Fields, add_policy_fields};
use super::{Layer, Service};
use crate::http::gate::{Gate, GateLimiter, GateStats, LimiterStats, Outcome};
use crate::keyed::KeyedLimiter;
use crate::limiter::RateLimiter;
use crate::quota::Quota;

/// Counts misconfigured requests, and logs the first once per layer (feature
/// `tracing`). Shared by the layer's clones.
#[derive(Clone, Debug, Default)]
pub(crate) struct Reported(Arc<ReportedInner>);

#[derive(Debug, Default)]
struct ReportedInner {
    count: core::sync::atomic::AtomicU64,
    #[cfg(feature = "tracing")]
    logged: core::sync::atomic::AtomicBool,
}

impl Reported {
    pub(crate) fn report(&self, problem: &'static str) {
        use core::sync::atomic::Ordering;
        // Relaxed: a count for operators. A locked add, on a path that answers
        // 500 to every request until the server is fixed, not on a decision.
        self.0.count.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "tracing")]
        {
            // Relaxed: the flag guards only the log line; a race logs twice
            // at worst.
            if !self.0.logged.load(Ordering::Relaxed)
                && !self.0.logged.swap(true, Ordering::Relaxed)
            {
                tracing::error!(
                    problem,
                    "rate-limit layer misconfigured: its requests are answered 500 until this is \
                     fixed (logged once per layer)"
                );
            }
        }
        #[cfg(not(feature = "tracing"))]
        let _ = problem;
    }

    pub(crate) fn count(&self) -> u64 {
        // Relaxed: a count, read for reporting.
        self.0.count.load(core::sync::atomic::Ordering::Relaxed)
    }
}

/// What a [`RateLimitLayer`] answered ([`RateLimitLayer::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LayerStats {
    /// The gate's answers: 200, 401, 429, 503, shadowed denials, keys.
    pub gate: GateStats,
    /// 500s: requests answered as a configuration error (a missing peer
    /// address), counted by this layer and its clones.
    pub misconfigured: u64,
}

/// The layer: wraps services in [`RateLimit`], all sharing one gate.
///
/// `R` builds denial responses: [`PlainDenial`] by default, or a function set
/// with [`deny_with`](RateLimitLayer::deny_with).
pub struct RateLimitLayer<
    X: KeyExtractor,
    L = KeyedLimiter<<X as KeyExtractor>::Key>,
    R = PlainDenial,
> {
    gate: Arc<Gate<L>>,
    extractor: X,
    respond: R,
    challenge: Option<HeaderValue>,
    reported: Reported,
}

impl<X: KeyExtractor, L> RateLimitLayer<X, L, PlainDenial> {
    /// A layer limiting requests by the key `extractor` picks, through `gate`
    /// (one keyed limiter, or tiers: [`Gate::tiered`]).
    pub fn new(gate: Gate<L>, extractor: X) -> RateLimitLayer<X, L, PlainDenial> {
        RateLimitLayer::shared(Arc::new(gate), extractor)
    }

    /// A layer on a gate shared with other code (to read its stats, say).
    pub fn shared(gate: Arc<Gate<L>>, extractor: X) -> RateLimitLayer<X, L, PlainDenial> {
        RateLimitLayer {
            gate,
            extractor,
            respond: PlainDenial,
            challenge: None,
            reported: Reported::default(),
        }
    }
}

impl<X: KeyExtractor> RateLimitLayer<X> {
    /// A layer limiting each key `extractor` picks to `quota`: the common case
    /// in one call, a [`KeyedLimiter`] with its defaults (the token bucket,
    /// the real clock, at most [`DEFAULT_MAX_KEYS`](crate::DEFAULT_MAX_KEYS)
    /// keys) behind a [`Gate`]. Build the gate yourself for anything else
    /// ([`RateLimitLayer::new`]).
    ///
    /// ```
    /// use http::header::HeaderName;
    /// use turnstile::Quota;
    /// use turnstile::tower::{ApiKeyHeader, RateLimitLayer};
    ///
    /// let layer: RateLimitLayer<ApiKeyHeader> = RateLimitLayer::per_key(
    ///     ApiKeyHeader::new(HeaderName::from_static("x-api-key")),
    ///     Quota::per_second(10)?.burst(20)?,
    /// );
    /// assert_eq!(layer.gate().limiter().max_keys(), turnstile::DEFAULT_MAX_KEYS);
    /// # Ok::<(), turnstile::QuotaError>(())
    /// ```
    pub fn per_key(extractor: X, quota: Quota) -> RateLimitLayer<X> {
        RateLimitLayer::new(Gate::new(KeyedLimiter::new(quota)), extractor)
    }
}

impl RateLimitLayer<Global, RateLimiter> {
    /// A layer limiting every request together to `quota`: one
    /// [`RateLimiter`] behind a [`Gate`], no keyed map.
    ///
    /// ```
    /// use turnstile::Quota;
    /// use turnstile::tower::{Global, RateLimitLayer};
    ///
    /// let layer: RateLimitLayer<Global, turnstile::RateLimiter> =
    ///     RateLimitLayer::global(Quota::per_second(1_000)?);
    /// assert_eq!(layer.stats().gate.keys, 0);
    /// # Ok::<(), turnstile::QuotaError>(())
    /// ```
    pub fn global(quota: Quota) -> RateLimitLayer<Global, RateLimiter> {
        RateLimitLayer::new(Gate::new(RateLimiter::new(quota)), Global)
    }
}

impl<X: KeyExtractor, L, R> RateLimitLayer<X, L, R> {
    /// The gate.
    pub fn gate(&self) -> &Arc<Gate<L>> {
        &self.gate
    }

    /// Build denial responses with `respond` (see the
    /// [module docs](crate::tower#denial-responses) for a problem-details example).
    /// The layer still sets the status, `Retry-After`, the `RateLimit` fields
    /// and `WWW-Authenticate` on what it returns. `respond` runs only for
    /// denials, and is shared, not copied, by every clone of the layer.
    ///
    /// ```
    /// use http::{Request, Response, StatusCode};
    /// use turnstile::tower::{Denial, Global, Layer, RateLimitLayer};
    /// use turnstile::{Gate, KeyedLimiter, Quota};
    /// # use std::convert::Infallible;
    /// # use std::future::{Ready, ready};
    /// # use std::pin::pin;
    /// # use std::task::{Context, Poll, Waker};
    /// # use turnstile::tower::Service;
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
    /// let layer = RateLimitLayer::new(Gate::new(KeyedLimiter::<()>::new(Quota::per_hour(1)?)), Global)
    ///     // A hook that even tries to change the status: the layer's wins.
    ///     .deny_with(|d: &Denial| Response::builder().status(418).body(format!("{:?}", d.status())).unwrap());
    /// // `Hello` answers 200; `send` polls the response future, ready at once
    /// // (both as in the module docs).
    /// let mut service = layer.layer(Hello);
    /// # let mut send = |request: Request<()>| {
    /// #     match pin!(service.call(request)).poll(&mut Context::from_waker(Waker::noop())) {
    /// #         Poll::Ready(Ok(response)) => response,
    /// #         _ => unreachable!("ready at once"),
    /// #     }
    /// # };
    /// send(Request::new(()));
    /// let denied = send(Request::new(()));
    /// assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    /// assert_eq!(denied.body(), "429");
    /// assert_eq!(denied.headers()["retry-after"], "3600");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn deny_with<F, B>(self, respond: F) -> RateLimitLayer<X, L, DenyWith<F>>
    where
        F: Fn(&Denial) -> Response<B> + Send + Sync + 'static,
    {
        RateLimitLayer {
            gate: self.gate,
            extractor: self.extractor,
            respond: DenyWith::new(respond),
            challenge: self.challenge,
            reported: self.reported,
        }
    }

    /// The `WWW-Authenticate` challenge on a 401, instead of the extractor's
    /// ([`KeyExtractor::challenge`]): `Bearer realm="api"`, say.
    ///
    /// ```
    /// use http::{HeaderValue, header::HeaderName};
    /// use turnstile::tower::{ApiKeyHeader, RateLimitLayer};
    /// use turnstile::{Gate, KeyedLimiter, Quota};
    ///
    /// let layer = RateLimitLayer::new(
    ///     Gate::new(KeyedLimiter::<String>::new(Quota::per_second(10)?)),
    ///     ApiKeyHeader::new(HeaderName::from_static("authorization")),
    /// )
    /// .challenge(HeaderValue::from_static("Bearer realm=\"api\""));
    /// # let _ = layer;
    /// # Ok::<(), turnstile::QuotaError>(())
    /// ```
    pub fn challenge(self, challenge: HeaderValue) -> RateLimitLayer<X, L, R> {
        RateLimitLayer {
            challenge: Some(challenge),
            ..self
        }
    }
}

impl<X, L, R> RateLimitLayer<X, L, R>
where
    X: KeyExtractor,
    L: LimiterStats,
{
    /// What this layer and its clones have answered: the gate's counts (shared
    /// with any other user of the gate) and the configuration errors.
    pub fn stats(&self) -> LayerStats {
        LayerStats {
            gate: self.gate.stats(),
            misconfigured: self.reported.count(),
        }
    }
}

impl<X: KeyExtractor, L, R: Clone> Clone for RateLimitLayer<X, L, R> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            gate: Arc::clone(&self.gate),
            extractor: self.extractor.clone(),
            respond: self.respond.clone(),
            challenge: self.challenge.clone(),
            reported: self.reported.clone(),
        }
    }
}

impl<X: KeyExtractor + fmt::Debug, L, R> fmt::Debug for RateLimitLayer<X, L, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("extractor", &self.extractor)
            .field("challenge", &self.challenge)
            .finish_non_exhaustive()
    }
}

impl<Svc, X: KeyExtractor, L, R: Clone> Layer<Svc> for RateLimitLayer<X, L, R> {
    type Service = RateLimit<Svc, X, L, R>;

    fn layer(&self, inner: Svc) -> Self::Service {
        RateLimit {
            inner,
            layer: self.clone(),
        }
    }
}

/// A service behind a [`Gate`]: admitted requests go to `inner`, the rest are
/// answered at once.
pub struct RateLimit<
    Svc,
    X: KeyExtractor,
    L = KeyedLimiter<<X as KeyExtractor>::Key>,
    R = PlainDenial,
> {
    inner: Svc,
    layer: RateLimitLayer<X, L, R>,
}

impl<Svc: Clone, X: KeyExtractor, L, R: Clone> Clone for RateLimit<Svc, X, L, R> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<Svc: fmt::Debug, X: KeyExtractor + fmt::Debug, L, R> fmt::Debug for RateLimit<Svc, X, L, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("extractor", &self.layer.extractor)
            .finish_non_exhaustive()
    }
}

impl<Svc, X, L, R, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<Svc, X, L, R>
where
    Svc: Service<Request<ReqBody>, Response = Response<ResBody>>,
    X: KeyExtractor,
    L: GateLimiter<X::Lookup>,
    R: DenialResponse<ResBody>,
{
    type Response = Response<ResBody>;
    type Error = Svc::Error;
    type Future = ResponseFuture<Svc::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let layer = &self.layer;
        let head = RequestHead::of(&request);
        let key = layer.extractor.extract(&head);
        if key.is_none()
            && let Some(problem) = layer.extractor.misconfiguration(&head)
        {
            layer.reported.report(problem);
            let mut response = layer.deny(&Denial::Misconfigured(problem), None);
            close_if_body_unread(request.version(), request.headers(), response.headers_mut());
            return ResponseFuture::denied(response);
        }
        // The decision and the policy of this key's own limit (its tier's),
        // when one is set.
        let mut fields = None;
        let outcome = layer.gate.check_fields(key.as_deref(), &mut fields);
        drop(key);
        if outcome.is_admitted() {
            ResponseFuture::admitted(self.inner.call(request), fields)
        } else {
            let mut response = layer.deny(&Denial::Refused(outcome), fields);
            close_if_body_unread(request.version(), request.headers(), response.headers_mut());
            ResponseFuture::denied(response)
        }
    }
}

impl<X: KeyExtractor, L, R> RateLimitLayer<X, L, R> {
    /// The response to `denial`: the hook's, with the layer's status and
    /// fields set over it.
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

/// The response to `denial`: `respond`'s, with the layer's status and fields
/// set over it (`challenge`, or else the default one, on a 401; the policy
/// `fields` on the others). Shared by every layer of the crate.
pub(crate) fn deny<B, R: DenialResponse<B>>(
    respond: &R,
    denial: &Denial,
    challenge: Option<&HeaderValue>,
    default_challenge: impl FnOnce() -> HeaderValue,
    fields: Option<Fields>,
) -> Response<B> {
    let mut response = respond.respond(denial);
    *response.status_mut() = denial.status();
    let headers = response.headers_mut();
    // The layer owns `Retry-After`: set where the limit gives a wait, removed
    // where it gives none.
    match denial.retry_after_secs() {
        Some(secs) => headers.insert(RETRY_AFTER, HeaderValue::from(secs)),
        None => headers.remove(RETRY_AFTER),
    };
    if let Some(outcome) = denial.outcome() {
        if outcome == Outcome::Unauthorized {
            let challenge = match challenge {
                Some(challenge) => challenge.clone(),
                None => default_challenge(),
            };
            headers.insert(WWW_AUTHENTICATE, challenge);
        }
        // A 401 has no `RateLimit` value, so no policy fields either.
        if let Some(fields) = fields {
            add_policy_fields(headers, fields);
        }
    }
    response
}

pin_project_lite::pin_project! {
    /// The future of a [`RateLimit`] service's response.
    pub struct ResponseFuture<F, B> {
        // The inner future first and alone in its variant, the fields beside
        // the enum: the inner service's future is then written where it
        // stays (no copy of it through a temporary, 128 instructions a
        // request with axum's router).
        #[pin]
        state: State<F, B>,
        fields: Option<Fields>,
    }
}

impl<F, B> ResponseFuture<F, B> {
    /// The inner service's response to an admitted request, with the policy
    /// `fields` added.
    #[inline(always)]
    pub(crate) fn admitted(future: F, fields: Option<Fields>) -> ResponseFuture<F, B> {
        ResponseFuture {
            state: State::Admitted { future },
            fields,
        }
    }

    pub(crate) fn denied(response: Response<B>) -> ResponseFuture<F, B> {
        ResponseFuture {
            state: State::Denied {
                response: Some(response),
            },
            fields: None,
        }
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<F, B> {
        Admitted {
            #[pin]
            future: F,
        },
        Denied {
            response: Option<Response<B>>,
        },
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            StateProj::Admitted { future } => match future.poll(cx) {
                Poll::Ready(Ok(mut response)) => {
                    if let Some(fields) = this.fields.take() {
                        add_policy_fields(response.headers_mut(), fields);
                    }
                    Poll::Ready(Ok(response))
                }
                other => other,
            },
            // Polled again after completing: stay pending rather than panic.
            StateProj::Denied { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                None => Poll::Pending,
            },
        }
    }
}

impl<F, B> fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
