//! A tower [`Layer`] and [`Service`] that put a [`Gate`] in front of any
//! service on the `http` crate's types whose response body has a `Default`
//! (the empty body a denial carries): axum, hyper. Feature `tower`.
//!
//! ```
//! use std::convert::Infallible;
//! use std::future::{Ready, ready};
//! use std::pin::pin;
//! use std::task::{Context, Poll, Waker};
//!
//! use http::{Request, Response, StatusCode, header::HeaderName};
//! use turnstile::tower::{ApiKeyHeader, Layer, RateLimitLayer, Service};
//! use turnstile::{Gate, KeyedLimiter, Quota};
//!
//! // The service behind the layer (with axum, a `Router`).
//! #[derive(Clone)]
//! struct Hello;
//! impl Service<Request<()>> for Hello {
//!     type Response = Response<()>;
//!     type Error = Infallible;
//!     type Future = Ready<Result<Response<()>, Infallible>>;
//!     fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
//!         Poll::Ready(Ok(()))
//!     }
//!     fn call(&mut self, _: Request<()>) -> Self::Future {
//!         ready(Ok(Response::new(())))
//!     }
//! }
//!
//! let gate = Gate::new(KeyedLimiter::<String>::new(Quota::per_minute(1)?));
//! let layer = RateLimitLayer::new(gate, ApiKeyHeader::new(HeaderName::from_static("x-api-key")));
//! let mut service = layer.layer(Hello);
//!
//! // Every future here is ready at once; a server's runtime would poll it.
//! let mut send = |request: Request<()>| {
//!     match pin!(service.call(request)).poll(&mut Context::from_waker(Waker::noop())) {
//!         Poll::Ready(Ok(response)) => response,
//!         _ => unreachable!("ready at once"),
//!     }
//! };
//! let request = || Request::builder().header("x-api-key", "k_1").body(()).unwrap();
//! assert_eq!(send(request()).status(), StatusCode::OK);
//! let denied = send(request());
//! assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(denied.headers()["retry-after"], "60");
//! // No key: 401, and the inner service never runs.
//! assert_eq!(send(Request::new(())).status(), StatusCode::UNAUTHORIZED);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The limiter is shared: the service is `Clone`, and every clone (axum clones
//! a service per connection) enforces the one limit. Denied requests never
//! reach the inner service; their response carries the gate's status and
//! headers and an empty body (`ResBody::default()`). No client input can make
//! the layer panic or answer 500: keys are bounded in length, header values
//! are built from numbers and validated policy names.

use core::borrow::Borrow;
use core::fmt;
use core::future::Future;
use core::hash::{BuildHasher, Hash};
use core::net::{IpAddr, SocketAddr};
use core::pin::Pin;
use core::str::FromStr;
use core::task::{Context, Poll};
use std::borrow::Cow;
use std::sync::Arc;

use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::{Extensions, HeaderMap, Method, Request, Response, StatusCode, Uri};
pub use tower_layer::Layer;
pub use tower_service::Service;

use crate::algorithm::Algorithm;
use crate::clock::{Clock, RealClock};
use crate::gate::{Gate, Outcome, RateLimitPolicy};
use crate::token_bucket::TokenBucket;

/// What a key extractor may look at: the request without its body.
#[derive(Clone, Copy, Debug)]
pub struct RequestHead<'a> {
    /// The method.
    pub method: &'a Method,
    /// The URI.
    pub uri: &'a Uri,
    /// The header fields.
    pub headers: &'a HeaderMap,
    /// The extensions, where servers put the connection's peer address.
    pub extensions: &'a Extensions,
}

impl<'a> RequestHead<'a> {
    /// The head of `request`.
    pub fn of<B>(request: &'a Request<B>) -> RequestHead<'a> {
        RequestHead {
            method: request.method(),
            uri: request.uri(),
            headers: request.headers(),
            extensions: request.extensions(),
        }
    }
}

/// Picks the key a request is limited by; `None` means it has none (401).
///
/// A key can be borrowed from the request ([`Cow::Borrowed`]): the limiter
/// looks it up without allocating and makes an owned copy only when it stores
/// a new key.
pub trait KeyExtractor: Clone + Send + Sync + 'static {
    /// The key as the limiter stores it.
    type Key: Hash + Eq + Borrow<Self::Lookup> + Send + Sync + 'static;
    /// The key as it is looked up (`str` for a `String` key).
    type Lookup: Hash + Eq + ToOwned<Owned = Self::Key> + ?Sized;

    /// The key of `request`, or `None`.
    fn extract<'r>(&self, request: &RequestHead<'r>) -> Option<Cow<'r, Self::Lookup>>;
}

/// The value of an API-key header: the key to use once the request is
/// authenticated (put this layer after the authentication, or validate keys
/// with [`validate`](ApiKeyHeader::validate)).
///
/// A missing header, a value that is not visible ASCII, an empty one or one
/// longer than the maximum (128 bytes by default) has no key: 401. The bound
/// keeps a client from making the limiter store megabyte keys. The key is
/// borrowed from the request; a `String` is made only for a new key.
#[derive(Clone, Debug)]
pub struct ApiKeyHeader {
    name: HeaderName,
    max_len: usize,
    validate: Option<fn(&str) -> bool>,
}

impl ApiKeyHeader {
    /// The key from header `name`.
    pub fn new(name: HeaderName) -> ApiKeyHeader {
        ApiKeyHeader {
            name,
            max_len: 128,
            validate: None,
        }
    }

    /// The longest key accepted, in bytes.
    pub fn max_len(self, max_len: usize) -> ApiKeyHeader {
        ApiKeyHeader { max_len, ..self }
    }

    /// Accept only keys for which `validate` is true (a known key, a valid
    /// signature); others have no key (401).
    pub fn validate(self, validate: fn(&str) -> bool) -> ApiKeyHeader {
        ApiKeyHeader {
            validate: Some(validate),
            ..self
        }
    }
}

impl KeyExtractor for ApiKeyHeader {
    type Key = String;
    type Lookup = str;

    fn extract<'r>(&self, request: &RequestHead<'r>) -> Option<Cow<'r, str>> {
        let value = request.headers.get(&self.name)?.to_str().ok()?.trim();
        if value.is_empty() || value.len() > self.max_len {
            return None;
        }
        if let Some(validate) = self.validate
            && !validate(value)
        {
            return None;
        }
        Some(Cow::Borrowed(value))
    }
}

/// The peer's IP address, from the connection: read from the request's
/// extensions, where the server put it. IPv6 addresses are grouped by their
/// first 64 bits by default (one subscriber's usual allocation: otherwise a
/// single client could rotate through 2^64 addresses); see
/// [`ipv6_prefix`](PeerIp::ipv6_prefix).
///
/// [`PeerIp::new`] reads a `SocketAddr` extension. For axum, which stores
/// `ConnectInfo<SocketAddr>`, use
/// `PeerIp::from_extension(|c: &ConnectInfo<SocketAddr>| c.0)`. A request
/// without the extension has no key (401): configure the server to provide it.
pub struct PeerIp<T = SocketAddr> {
    get: fn(&T) -> SocketAddr,
    ipv6_prefix: u8,
}

impl PeerIp<SocketAddr> {
    /// The peer address from a `SocketAddr` extension.
    pub fn new() -> PeerIp<SocketAddr> {
        PeerIp {
            get: |addr| *addr,
            ipv6_prefix: 64,
        }
    }
}

impl Default for PeerIp<SocketAddr> {
    fn default() -> Self {
        PeerIp::new()
    }
}

impl<T> PeerIp<T> {
    /// The peer address from an extension of type `T`.
    pub fn from_extension(get: fn(&T) -> SocketAddr) -> PeerIp<T> {
        PeerIp {
            get,
            ipv6_prefix: 64,
        }
    }

    /// Group IPv6 peers by their first `bits` bits (0 to 128; 128 keys each
    /// address alone).
    pub fn ipv6_prefix(self, bits: u8) -> PeerIp<T> {
        PeerIp {
            ipv6_prefix: bits.min(128),
            ..self
        }
    }

    fn key(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(_) => ip,
            IpAddr::V6(v6) => {
                // An IPv4-mapped address is its IPv4 address.
                if let Some(v4) = v6.to_ipv4_mapped() {
                    return IpAddr::V4(v4);
                }
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.ipv6_prefix))
                    .unwrap_or(0);
                IpAddr::V6((u128::from(v6) & mask).into())
            }
        }
    }
}

impl<T: Send + Sync + 'static> KeyExtractor for PeerIp<T> {
    type Key = IpAddr;
    type Lookup = IpAddr;

    fn extract<'r>(&self, request: &RequestHead<'r>) -> Option<Cow<'r, IpAddr>> {
        let peer = (self.get)(request.extensions.get::<T>()?);
        Some(Cow::Owned(self.key(peer.ip())))
    }
}

impl<T> Clone for PeerIp<T> {
    fn clone(&self) -> Self {
        PeerIp {
            get: self.get,
            ipv6_prefix: self.ipv6_prefix,
        }
    }
}

impl<T> fmt::Debug for PeerIp<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerIp")
            .field("ipv6_prefix", &self.ipv6_prefix)
            .finish_non_exhaustive()
    }
}

/// An IP network, `10.0.0.0/8` or `2001:db8::/32` (a bare address is a /32 or
/// /128), for naming trusted proxies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

/// Why an [`IpNet`] did not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpNetError(String);

impl fmt::Display for IpNetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not an IP network: expected ADDRESS or ADDRESS/PREFIX, the prefix at most \
             32 for IPv4 and 128 for IPv6",
            self.0
        )
    }
}

impl std::error::Error for IpNetError {}

impl FromStr for IpNet {
    type Err = IpNetError;

    fn from_str(s: &str) -> Result<IpNet, IpNetError> {
        let err = || IpNetError(s.chars().take(80).collect());
        let (addr, prefix) = match s.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s, None),
        };
        let addr: IpAddr = addr.trim().parse().map_err(|_| err())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p.trim().parse::<u8>().map_err(|_| err())?,
        };
        if prefix > max {
            return Err(err());
        }
        Ok(IpNet { addr, prefix })
    }
}

impl IpNet {
    /// Whether `ip` is in this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// The client address from `X-Forwarded-For`, believed **only** when the
/// connection comes from one of your trusted proxies.
///
/// The header is client input: anyone can send one, with any address, so a
/// limiter that trusted it could be evaded with a fresh address per request.
/// This extractor takes the peer address (as [`PeerIp`]); if the peer is a
/// trusted proxy, it reads the header's addresses right to left, skipping
/// trusted proxies, and keys the request by the first address that is not one
/// (the client as your outermost proxy saw it). An entry that does not parse
/// stops the walk at the last address vouched for. With no trusted proxies it
/// is exactly [`PeerIp`].
pub struct ForwardedFor<T = SocketAddr> {
    peer: PeerIp<T>,
    trusted: Arc<[IpNet]>,
}

impl<T> ForwardedFor<T> {
    /// Believe `X-Forwarded-For` from peers in `trusted` only.
    pub fn new(peer: PeerIp<T>, trusted: impl IntoIterator<Item = IpNet>) -> ForwardedFor<T> {
        ForwardedFor {
            peer,
            trusted: trusted.into_iter().collect(),
        }
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(ip))
    }
}

impl<T: Send + Sync + 'static> KeyExtractor for ForwardedFor<T> {
    type Key = IpAddr;
    type Lookup = IpAddr;

    fn extract<'r>(&self, request: &RequestHead<'r>) -> Option<Cow<'r, IpAddr>> {
        let peer = (self.peer.get)(request.extensions.get::<T>()?).ip();
        let mut client = peer;
        if self.is_trusted(peer) {
            // Every X-Forwarded-For field line, in order, is one list: walk it
            // from the right, at most 64 hops.
            let hops = request
                .headers
                .get_all("x-forwarded-for")
                .iter()
                .rev()
                .flat_map(|v| v.to_str().unwrap_or("?").rsplit(','))
                .take(64);
            for hop in hops {
                let Ok(ip) = hop.trim().parse::<IpAddr>() else {
                    break;
                };
                client = ip;
                if !self.is_trusted(ip) {
                    break;
                }
            }
        }
        Some(Cow::Owned(self.peer.key(client)))
    }
}

impl<T> Clone for ForwardedFor<T> {
    fn clone(&self) -> Self {
        ForwardedFor {
            peer: self.peer.clone(),
            trusted: Arc::clone(&self.trusted),
        }
    }
}

impl<T> fmt::Debug for ForwardedFor<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForwardedFor")
            .field("trusted", &self.trusted)
            .finish_non_exhaustive()
    }
}

/// The layer: wraps services in [`RateLimit`], all sharing one gate.
pub struct RateLimitLayer<X: KeyExtractor, A = TokenBucket, C = RealClock, S = ahash::RandomState> {
    gate: Arc<Gate<X::Key, A, C, S>>,
    extractor: X,
}

impl<X: KeyExtractor, A, C, S> RateLimitLayer<X, A, C, S> {
    /// A layer limiting requests by the key `extractor` picks, through `gate`.
    pub fn new(gate: Gate<X::Key, A, C, S>, extractor: X) -> RateLimitLayer<X, A, C, S> {
        RateLimitLayer::shared(Arc::new(gate), extractor)
    }

    /// A layer on a gate shared with other code (to read its stats, say).
    pub fn shared(gate: Arc<Gate<X::Key, A, C, S>>, extractor: X) -> RateLimitLayer<X, A, C, S> {
        RateLimitLayer { gate, extractor }
    }

    /// The gate.
    pub fn gate(&self) -> &Arc<Gate<X::Key, A, C, S>> {
        &self.gate
    }
}

impl<X: KeyExtractor, A, C, S> Clone for RateLimitLayer<X, A, C, S> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            gate: Arc::clone(&self.gate),
            extractor: self.extractor.clone(),
        }
    }
}

impl<X: KeyExtractor + fmt::Debug, A, C, S> fmt::Debug for RateLimitLayer<X, A, C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("extractor", &self.extractor)
            .finish_non_exhaustive()
    }
}

impl<Svc, X: KeyExtractor, A, C, S> Layer<Svc> for RateLimitLayer<X, A, C, S> {
    type Service = RateLimit<Svc, X, A, C, S>;

    fn layer(&self, inner: Svc) -> Self::Service {
        RateLimit {
            inner,
            gate: Arc::clone(&self.gate),
            extractor: self.extractor.clone(),
        }
    }
}

/// A service behind a [`Gate`]: admitted requests go to `inner`, the rest are
/// answered at once.
pub struct RateLimit<Svc, X: KeyExtractor, A = TokenBucket, C = RealClock, S = ahash::RandomState> {
    inner: Svc,
    gate: Arc<Gate<X::Key, A, C, S>>,
    extractor: X,
}

impl<Svc: Clone, X: KeyExtractor, A, C, S> Clone for RateLimit<Svc, X, A, C, S> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            gate: Arc::clone(&self.gate),
            extractor: self.extractor.clone(),
        }
    }
}

impl<Svc: fmt::Debug, X: KeyExtractor + fmt::Debug, A, C, S> fmt::Debug
    for RateLimit<Svc, X, A, C, S>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("extractor", &self.extractor)
            .finish_non_exhaustive()
    }
}

impl<Svc, X, A, C, S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<Svc, X, A, C, S>
where
    Svc: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
    X: KeyExtractor,
    A: Algorithm,
    C: Clock,
    S: BuildHasher,
{
    type Response = Response<ResBody>;
    type Error = Svc::Error;
    type Future = ResponseFuture<Svc::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let key = self.extractor.extract(&RequestHead::of(&request));
        let outcome = self.gate.check(key.as_deref());
        drop(key);
        let state = if outcome.is_admitted() {
            // Only a policy adds fields to an admitted response.
            let fields = self.gate.policy().map(|p| policy_fields(p, &outcome));
            State::Admitted {
                future: self.inner.call(request),
                fields,
            }
        } else {
            State::Denied {
                response: Some(denial(&outcome, self.gate.policy())),
            }
        };
        ResponseFuture { state }
    }
}

/// The `RateLimit-Policy` and `RateLimit` field values for `outcome`.
fn policy_fields(policy: &RateLimitPolicy, outcome: &Outcome) -> [Option<HeaderValue>; 2] {
    // Validated policy names and numbers make valid values; anything else
    // would be left out, never a panic.
    let value = |s: Option<String>| s.and_then(|s| HeaderValue::from_str(&s).ok());
    [
        value(Some(policy.policy_value())),
        value(policy.value(outcome)),
    ]
}

fn add_policy_fields(headers: &mut HeaderMap, fields: [Option<HeaderValue>; 2]) {
    let [policy, value] = fields;
    if let (Some(policy), Some(value)) = (policy, value) {
        headers.insert(RATELIMIT_POLICY, policy);
        headers.insert(RATELIMIT, value);
    }
}

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// The answer to a request the gate refused: its status, `Retry-After` in
/// whole seconds rounded up (429, 503), the policy fields, an empty body.
fn denial<B: Default>(outcome: &Outcome, policy: Option<&RateLimitPolicy>) -> Response<B> {
    let mut response = Response::new(B::default());
    *response.status_mut() = match outcome.status() {
        401 => StatusCode::UNAUTHORIZED,
        429 => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    let headers = response.headers_mut();
    if let Some(secs) = outcome.retry_after_secs() {
        headers.insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    // A 401 has no `RateLimit` value, so no policy fields either.
    if let Some(policy) = policy {
        add_policy_fields(headers, policy_fields(policy, outcome));
    }
    response
}

pin_project_lite::pin_project! {
    /// The future of a [`RateLimit`] service's response.
    pub struct ResponseFuture<F, B> {
        #[pin]
        state: State<F, B>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<F, B> {
        Admitted {
            #[pin]
            future: F,
            fields: Option<[Option<HeaderValue>; 2]>,
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
        match self.project().state.project() {
            StateProj::Admitted { future, fields } => match future.poll(cx) {
                Poll::Ready(Ok(mut response)) => {
                    if let Some(fields) = fields.take() {
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
