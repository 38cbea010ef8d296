//! A tower [`Layer`] and [`Service`] that put a [`Gate`] in front of any
//! service on the `http` crate's types: axum, hyper. Feature `tower`.
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
//!     type Response = Response<String>;
//!     type Error = Infallible;
//!     type Future = Ready<Result<Response<String>, Infallible>>;
//!     fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
//!         Poll::Ready(Ok(()))
//!     }
//!     fn call(&mut self, _: Request<()>) -> Self::Future {
//!         ready(Ok(Response::new(String::new())))
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
//! // No key: 401 with a challenge naming the header, and the inner service never runs.
//! let anonymous = send(Request::new(()));
//! assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
//! assert_eq!(anonymous.headers()["www-authenticate"], "ApiKey header=\"x-api-key\"");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The limiter is shared: the service is `Clone`, and every clone (axum clones
//! a service per connection) enforces the one limit. Denied requests never
//! reach the inner service. No client input can make the layer panic or answer
//! 500: keys are bounded in length, header values are built from numbers and
//! validated policy names.
//!
//! # Denial responses
//!
//! A denial's body comes from the layer's [`DenialResponse`]. The default,
//! [`PlainDenial`], sends an empty body (and needs a body type with `Default`
//! and `From<&'static str>`, as axum's and hyper's have). Set another with
//! [`RateLimitLayer::deny_with`], such as RFC 9457 problem details. Whatever the
//! hook returns, the layer then sets the status, `Retry-After` (whole seconds,
//! rounded up, on 429 and 503; removed from any other denial), the `RateLimit-Policy`/`RateLimit` fields when the gate has a
//! policy, and `WWW-Authenticate` on a 401, so a hook cannot lose them. The
//! hook runs only for denials: an admitted request costs nothing more.
//!
//! ```
//! use http::{Request, Response, StatusCode, header};
//! use turnstile::tower::{Denial, Global, Layer, RateLimitLayer};
//! use turnstile::{Gate, KeyedLimiter, Quota};
//! # use std::convert::Infallible;
//! # use std::future::{Ready, ready};
//! # use std::pin::pin;
//! # use std::task::{Context, Poll, Waker};
//! # use turnstile::tower::Service;
//! # #[derive(Clone)]
//! # struct Hello;
//! # impl Service<Request<()>> for Hello {
//! #     type Response = Response<String>;
//! #     type Error = Infallible;
//! #     type Future = Ready<Result<Response<String>, Infallible>>;
//! #     fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
//! #         Poll::Ready(Ok(()))
//! #     }
//! #     fn call(&mut self, _: Request<()>) -> Self::Future {
//! #         ready(Ok(Response::new(String::new())))
//! #     }
//! # }
//!
//! fn problem(denial: &Denial) -> Response<String> {
//!     let status = denial.status();
//!     let body = format!(
//!         r#"{{"type":"about:blank","title":"{}","status":{}}}"#,
//!         status.canonical_reason().unwrap_or(""),
//!         status.as_u16(),
//!     );
//!     let mut response = Response::new(body);
//!     response.headers_mut().insert(
//!         header::CONTENT_TYPE,
//!         header::HeaderValue::from_static("application/problem+json"),
//!     );
//!     response
//! }
//!
//! let gate = Gate::new(KeyedLimiter::<()>::new(Quota::per_minute(1)?)).with_derived_policy("all")?;
//! let layer = RateLimitLayer::new(gate, Global).deny_with(problem);
//! // `Hello` and `send` as in the first example.
//! let mut service = layer.layer(Hello);
//! # let mut send = |request: Request<()>| {
//! #     match pin!(service.call(request)).poll(&mut Context::from_waker(Waker::noop())) {
//! #         Poll::Ready(Ok(response)) => response,
//! #         _ => unreachable!("ready at once"),
//! #     }
//! # };
//! assert_eq!(send(Request::new(())).status(), StatusCode::OK);
//! let denied = send(Request::new(()));
//! assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(denied.headers()["content-type"], "application/problem+json");
//! assert_eq!(denied.headers()["retry-after"], "60");
//! assert_eq!(denied.headers()["ratelimit"], "\"all\";r=0;t=60");
//! assert_eq!(denied.body(), r#"{"type":"about:blank","title":"Too Many Requests","status":429}"#);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Misconfiguration
//!
//! A key extractor that reads something the *server* must provide (the peer
//! address, for [`PeerIp`] and [`ForwardedFor`]) reports its absence as a
//! configuration error ([`KeyExtractor::misconfiguration`]), not as a client
//! without a key: the layer answers **500**, through the [`DenialResponse`]
//! ([`Denial::Misconfigured`]; [`PlainDenial`] puts the message in a
//! `text/plain` body), and the inner service never runs. With the `tracing`
//! feature the layer also logs the message once, at error level, the first
//! time it happens (once per layer and its clones, not per request); without
//! it nothing is logged, and the 500 responses are the signal.

use core::borrow::Borrow;
use core::fmt;
use core::future::Future;
use core::hash::Hash;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use core::pin::Pin;
use core::str::FromStr;
use core::task::{Context, Poll};
use std::borrow::Cow;
use std::sync::Arc;

use http::header::{CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER, WWW_AUTHENTICATE};
use http::{Extensions, HeaderMap, Method, Request, Response, StatusCode, Uri};
pub use tower_layer::Layer;
pub use tower_service::Service;

use crate::clock::RealClock;
use crate::gate::{Gate, GateLimiter, GateStats, LimiterStats, Outcome, RateLimitPolicy};
use crate::keyed::KeyedLimiter;
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

/// Picks the key a request is limited by; `None` means it has none (401),
/// unless [`misconfiguration`](KeyExtractor::misconfiguration) says the server
/// failed to provide what the extractor needs (500).
///
/// A key can be borrowed from the request ([`Cow::Borrowed`]): the limiter
/// looks it up without allocating and makes an owned copy only when it stores
/// a new key.
///
/// ```
/// use std::borrow::Cow;
/// use http::Request;
/// use turnstile::tower::{KeyExtractor, RequestHead};
///
/// /// Limit by the `tenant` query parameter.
/// #[derive(Clone, Debug)]
/// struct Tenant;
///
/// impl KeyExtractor for Tenant {
///     type Key = String;
///     type Lookup = str;
///
///     fn extract<'r>(&self, request: &RequestHead<'r>) -> Option<Cow<'r, str>> {
///         let query = request.uri.query()?;
///         let tenant = query.split('&').find_map(|p| p.strip_prefix("tenant="))?;
///         (!tenant.is_empty() && tenant.len() <= 64).then_some(Cow::Borrowed(tenant))
///     }
/// }
///
/// let request = Request::get("/report?tenant=acme").body(())?;
/// assert_eq!(Tenant.extract(&RequestHead::of(&request)).as_deref(), Some("acme"));
/// assert_eq!(Tenant.challenge(), "ApiKey");
/// # Ok::<(), http::Error>(())
/// ```
pub trait KeyExtractor: Clone + Send + Sync + 'static {
    /// The key as the limiter stores it.
    type Key: Hash + Eq + Borrow<Self::Lookup> + Send + Sync + 'static;
    /// The key as it is looked up (`str` for a `String` key).
    type Lookup: Hash + Eq + ToOwned<Owned = Self::Key> + ?Sized;

    /// The key of `request`, or `None`.
    fn extract<'r>(&self, request: &RequestHead<'r>) -> Option<Cow<'r, Self::Lookup>>;

    /// Called only when [`extract`](KeyExtractor::extract) found no key: why,
    /// if the server (not the client) is at fault, such as a peer-address
    /// extension the server was not configured to add. The layer then answers
    /// 500 ([`Denial::Misconfigured`]) instead of 401. `None` by default.
    fn misconfiguration(&self, request: &RequestHead<'_>) -> Option<&'static str> {
        let _ = request;
        None
    }

    /// The `WWW-Authenticate` challenge a 401 carries (RFC 9110 requires one);
    /// [`RateLimitLayer::challenge`] overrides it. `ApiKey` by default.
    fn challenge(&self) -> HeaderValue {
        HeaderValue::from_static("ApiKey")
    }
}

/// One key for every request: the whole service shares one limit (a global
/// cap in front of a fragile backend, say).
///
/// ```
/// use http::Request;
/// use turnstile::tower::{Global, KeyExtractor, RequestHead};
///
/// let request = Request::new(());
/// assert_eq!(Global.extract(&RequestHead::of(&request)).as_deref(), Some(&()));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Global;

impl KeyExtractor for Global {
    type Key = ();
    type Lookup = ();

    fn extract<'r>(&self, _: &RequestHead<'r>) -> Option<Cow<'r, ()>> {
        Some(Cow::Borrowed(&()))
    }
}

type Validator = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The value of an API-key header: the key to use once the request is
/// authenticated (put this layer after the authentication, or validate keys
/// with [`validate`](ApiKeyHeader::validate)).
///
/// The key is the value with the spaces around it trimmed; inside, it may
/// hold spaces and tabs besides visible ASCII, so that `Authorization:
/// Bearer <token>` is keyed by the whole value. A missing header, a value
/// with any other byte, an empty one or one longer than the maximum (128
/// bytes by default; raise it with [`max_len`](ApiKeyHeader::max_len) for
/// longer credentials such as tokens) has no key: 401, with the challenge
/// `ApiKey header="NAME"` in `WWW-Authenticate`. The bound keeps a client from making the limiter store
/// megabyte keys. The key is borrowed from
/// the request; a `String` is made only for a new key.
#[derive(Clone)]
pub struct ApiKeyHeader {
    name: HeaderName,
    max_len: usize,
    validate: Option<Validator>,
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
    /// signature); others have no key (401). `validate` may capture state,
    /// such as the set of issued keys, and is shared by every clone.
    ///
    /// ```
    /// use std::collections::HashSet;
    /// use http::{Request, header::HeaderName};
    /// use turnstile::tower::{ApiKeyHeader, KeyExtractor, RequestHead};
    ///
    /// let issued: HashSet<String> = ["k_live_1".to_string()].into();
    /// let keys = ApiKeyHeader::new(HeaderName::from_static("x-api-key"))
    ///     .validate(move |key| issued.contains(key));
    /// let with = |key| Request::builder().header("x-api-key", key).body(()).unwrap();
    /// assert!(keys.extract(&RequestHead::of(&with("k_live_1"))).is_some());
    /// assert!(keys.extract(&RequestHead::of(&with("k_forged"))).is_none());
    /// ```
    pub fn validate(self, validate: impl Fn(&str) -> bool + Send + Sync + 'static) -> ApiKeyHeader {
        ApiKeyHeader {
            validate: Some(Arc::new(validate)),
            ..self
        }
    }
}

impl fmt::Debug for ApiKeyHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiKeyHeader")
            .field("name", &self.name)
            .field("max_len", &self.max_len)
            .field(
                "validate",
                &self.validate.as_ref().map(|_| "Fn(&str) -> bool"),
            )
            .finish()
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
        if let Some(validate) = &self.validate
            && !validate(value)
        {
            return None;
        }
        Some(Cow::Borrowed(value))
    }

    /// `ApiKey header="NAME"`, with the header's name.
    fn challenge(&self) -> HeaderValue {
        // A header name is a token, so the value is always valid.
        HeaderValue::from_str(&format!("ApiKey header=\"{}\"", self.name))
            .unwrap_or(HeaderValue::from_static("ApiKey"))
    }
}

/// The prefix length by which [`PeerIp`] groups IPv6 peers by default; see
/// [IPv6 grouping](PeerIp#ipv6-grouping).
///
/// ```
/// // One key for each /48: 2^(48 - 48) = 1 key for a /48 holder.
/// assert_eq!(turnstile::tower::DEFAULT_IPV6_PREFIX, 48);
/// ```
pub const DEFAULT_IPV6_PREFIX: u8 = 48;

const MISSING_PEER: &str = "turnstile: the rate-limit layer keys requests by the peer address, but \
     the request carries no peer-address extension: configure the server to add one (axum: \
     `into_make_service_with_connect_info::<SocketAddr>()` with `PeerIp::connect_info()`)";

/// The peer's IP address, from the connection: read from the request's
/// extensions, where the server put it.
///
/// [`PeerIp::new`] reads a `SocketAddr` extension; with feature `axum`,
/// [`PeerIp::connect_info`] reads axum's `ConnectInfo<SocketAddr>`, and
/// [`PeerIp::from_extension`] any other type. A request without the extension
/// is a server misconfiguration, not a client's fault: the layer answers 500
/// and (feature `tracing`) logs it once; see the [module docs](self#misconfiguration).
///
/// # IPv6 grouping
///
/// IPv6 peers are keyed by their first 48 bits by default
/// ([`DEFAULT_IPV6_PREFIX`]; change it with [`ipv6_prefix`](PeerIp::ipv6_prefix)).
/// A holder of a prefix of length `p` can present `2^(g - p)` distinct keys
/// when addresses are grouped by `g` bits (`p <= g`), and one key when
/// `p >= g`. Grouped by /64, a /48 holder (a routine allocation to one site)
/// can present `2^16 = 65,536` keys and fill a 10,000-key bound, after which
/// every new client gets 503. Grouped by /48 it presents `2^0 = 1` key, so no
/// single /48 holder can exhaust any bound of at least one key; a /40 holder
/// would present 256, a /32 holder 65,536. The cost: every host in one /48
/// shares one allowance, as hosts behind one IPv4 NAT do.
pub struct PeerIp<T = SocketAddr> {
    get: fn(&T) -> SocketAddr,
    ipv6_prefix: u8,
}

impl PeerIp<SocketAddr> {
    /// The peer address from a `SocketAddr` extension.
    ///
    /// ```
    /// use std::net::{IpAddr, SocketAddr};
    /// use http::Request;
    /// use turnstile::tower::{KeyExtractor, PeerIp, RequestHead};
    ///
    /// let mut request = Request::new(());
    /// request.extensions_mut().insert("[2001:db8:aa:bb::1]:443".parse::<SocketAddr>()?);
    /// let key = PeerIp::new().extract(&RequestHead::of(&request)).map(|k| k.into_owned());
    /// assert_eq!(key, Some("2001:db8:aa::".parse::<IpAddr>()?)); // grouped by /48
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new() -> PeerIp<SocketAddr> {
        PeerIp::from_extension(|addr| *addr)
    }
}

impl Default for PeerIp<SocketAddr> {
    fn default() -> Self {
        PeerIp::new()
    }
}

#[cfg(feature = "axum")]
impl PeerIp<axum::extract::ConnectInfo<SocketAddr>> {
    /// The peer address from axum's `ConnectInfo<SocketAddr>` extension, which
    /// `into_make_service_with_connect_info::<SocketAddr>()` adds. Feature
    /// `axum`.
    ///
    /// ```
    /// use std::net::{IpAddr, SocketAddr};
    /// use axum::extract::ConnectInfo;
    /// use http::Request;
    /// use turnstile::tower::{KeyExtractor, PeerIp, RequestHead};
    ///
    /// let peer = PeerIp::connect_info();
    /// let mut request = Request::new(());
    /// request.extensions_mut().insert(ConnectInfo("192.0.2.7:5000".parse::<SocketAddr>()?));
    /// let key = peer.extract(&RequestHead::of(&request)).map(|k| k.into_owned());
    /// assert_eq!(key, Some("192.0.2.7".parse::<IpAddr>()?));
    /// // Served without connect info: a configuration error, not a 401.
    /// let bare = Request::new(());
    /// assert!(peer.misconfiguration(&RequestHead::of(&bare)).is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn connect_info() -> PeerIp<axum::extract::ConnectInfo<SocketAddr>> {
        PeerIp::from_extension(|info: &axum::extract::ConnectInfo<SocketAddr>| info.0)
    }
}

impl<T> PeerIp<T> {
    /// The peer address from an extension of type `T`.
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use turnstile::tower::PeerIp;
    ///
    /// /// What a custom server puts in each request's extensions.
    /// struct Peer(SocketAddr);
    ///
    /// let peer = PeerIp::from_extension(|p: &Peer| p.0);
    /// # let _ = peer;
    /// ```
    pub fn from_extension(get: fn(&T) -> SocketAddr) -> PeerIp<T> {
        PeerIp {
            get,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Group IPv6 peers by their first `bits` bits (0 to 128; 128 keys each
    /// address alone). See [IPv6 grouping](PeerIp#ipv6-grouping).
    ///
    /// ```
    /// use turnstile::tower::PeerIp;
    ///
    /// let per_subnet = PeerIp::new().ipv6_prefix(64);
    /// # let _ = per_subnet;
    /// ```
    pub fn ipv6_prefix(self, bits: u8) -> PeerIp<T> {
        PeerIp {
            ipv6_prefix: bits.min(128),
            ..self
        }
    }

    fn peer(&self, request: &RequestHead<'_>) -> Option<IpAddr>
    where
        T: Send + Sync + 'static,
    {
        Some(
            (self.get)(request.extensions.get::<T>()?)
                .ip()
                .to_canonical(),
        )
    }

    fn key(&self, ip: IpAddr) -> IpAddr {
        // An IPv4-mapped address is its IPv4 address.
        match ip.to_canonical() {
            IpAddr::V4(v4) => IpAddr::V4(v4),
            IpAddr::V6(v6) => {
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
        Some(Cow::Owned(self.key(self.peer(request)?)))
    }

    /// The peer-address extension is missing.
    fn misconfiguration(&self, request: &RequestHead<'_>) -> Option<&'static str> {
        request
            .extensions
            .get::<T>()
            .is_none()
            .then_some(MISSING_PEER)
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
///
/// ```
/// use turnstile::tower::IpNet;
///
/// let net: IpNet = "10.0.0.0/8".parse()?;
/// assert!(net.contains("10.1.2.3".parse()?));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
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
        let (addr, prefix) = match s.trim().split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| err())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            // Digits only: no sign, no spaces around the slash.
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
                p.parse::<u8>().map_err(|_| err())?
            }
            Some(_) => return Err(err()),
        };
        if prefix > max {
            return Err(err());
        }
        // An IPv4-mapped network (`::ffff:a.b.c.d/n`, n >= 96) is the IPv4
        // network it maps: `contains` compares mapped addresses as IPv4, so
        // kept as IPv6 it would match nothing.
        if let IpAddr::V6(v6) = addr
            && prefix >= 96
            && let Some(v4) = v6.to_ipv4_mapped()
        {
            return Ok(IpNet {
                addr: IpAddr::V4(v4),
                prefix: prefix - 96,
            });
        }
        Ok(IpNet { addr, prefix })
    }
}

impl IpNet {
    /// Whether `ip` is in this network. An IPv4-mapped IPv6 address
    /// (`::ffff:10.0.0.1`) is compared as its IPv4 address, and an IPv4
    /// address is in an IPv6 network that holds its mapped form (`::/0`
    /// holds every address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match (self.addr, ip.to_canonical()) {
            (IpAddr::V6(_), IpAddr::V4(v4)) => IpAddr::V6(v4.to_ipv6_mapped()),
            (_, ip) => ip,
        };
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

/// The most forwarded hops examined, whatever the header holds.
const MAX_HOPS: usize = 64;

/// Which header [`ForwardedFor`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ForwardHeader {
    XForwardedFor,
    Forwarded,
}

/// The client address from `X-Forwarded-For` ([`ForwardedFor::new`]) or RFC
/// 7239 `Forwarded` ([`ForwardedFor::rfc7239`]), believed **only** when the
/// connection comes from one of your trusted proxies.
///
/// The header is client input: anyone can send one, with any address, so a
/// limiter that trusted it could be evaded with a fresh address per request.
/// This extractor takes the peer address (as [`PeerIp`]); if the peer is a
/// trusted proxy, it reads the header's addresses right to left (every field
/// line, in order, is one list), skipping trusted proxies, and keys the request
/// by the first address that is not one (the client as your outermost proxy
/// saw it). An entry that does not parse, or an obfuscated or `unknown` node,
/// stops the walk at the last address vouched for. At most 64 entries are
/// examined. With no trusted proxies it is exactly [`PeerIp`].
///
/// An entry may carry a port: `203.0.113.9:4711` and `[2001:db8::1]:80` key by
/// the address. Read only the header your proxies set (and overwrite): a
/// header they pass through untouched is the client's to forge.
///
/// ```
/// use std::net::{IpAddr, SocketAddr};
/// use http::Request;
/// use turnstile::tower::{ForwardedFor, IpNet, KeyExtractor, PeerIp, RequestHead};
///
/// let proxies: Vec<IpNet> = vec!["10.0.0.0/8".parse()?];
/// let by_client = ForwardedFor::rfc7239(PeerIp::new(), proxies);
/// let mut request = Request::builder()
///     .header("forwarded", r#"for="[2001:db8:cafe::17]:4711";proto=https, for=10.0.0.9"#)
///     .body(())?;
/// request.extensions_mut().insert("10.0.0.1:443".parse::<SocketAddr>()?);
/// let key = by_client.extract(&RequestHead::of(&request)).map(|k| k.into_owned());
/// assert_eq!(key, Some("2001:db8:cafe::".parse::<IpAddr>()?));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ForwardedFor<T = SocketAddr> {
    peer: PeerIp<T>,
    trusted: Arc<[IpNet]>,
    header: ForwardHeader,
}

impl<T> ForwardedFor<T> {
    /// Believe `X-Forwarded-For` from peers in `trusted` only.
    ///
    /// ```
    /// use std::net::{IpAddr, SocketAddr};
    /// use http::Request;
    /// use turnstile::tower::{ForwardedFor, IpNet, KeyExtractor, PeerIp, RequestHead};
    ///
    /// let by_client = ForwardedFor::new(PeerIp::new(), ["10.0.0.0/8".parse::<IpNet>()?]);
    /// let mut request = Request::builder()
    ///     .header("x-forwarded-for", "6.6.6.6, 203.0.113.9:4711, 10.0.0.9")
    ///     .body(())?;
    /// request.extensions_mut().insert("10.0.0.1:443".parse::<SocketAddr>()?);
    /// let key = by_client.extract(&RequestHead::of(&request)).map(|k| k.into_owned());
    /// // The rightmost address no trusted proxy holds, without its port.
    /// assert_eq!(key, Some("203.0.113.9".parse::<IpAddr>()?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(peer: PeerIp<T>, trusted: impl IntoIterator<Item = IpNet>) -> ForwardedFor<T> {
        ForwardedFor {
            peer,
            trusted: trusted.into_iter().collect(),
            header: ForwardHeader::XForwardedFor,
        }
    }

    /// Believe the `for=` parameters of RFC 7239 `Forwarded` from peers in
    /// `trusted` only. Values may be tokens or quoted strings
    /// (`for="[2001:db8::1]:4711"`), elements may carry other parameters
    /// (`for=192.0.2.60;proto=http;by=203.0.113.43`), and an element without
    /// exactly one `for=` stops the walk.
    ///
    /// ```
    /// use std::net::{IpAddr, SocketAddr};
    /// use http::Request;
    /// use turnstile::tower::{ForwardedFor, IpNet, KeyExtractor, PeerIp, RequestHead};
    ///
    /// let by_client = ForwardedFor::rfc7239(PeerIp::new(), ["10.0.0.0/8".parse::<IpNet>()?]);
    /// let key = |forwarded: &str| -> Result<Option<IpAddr>, Box<dyn std::error::Error>> {
    ///     let mut request = Request::builder().header("forwarded", forwarded).body(())?;
    ///     request.extensions_mut().insert("10.0.0.1:443".parse::<SocketAddr>()?);
    ///     Ok(by_client.extract(&RequestHead::of(&request)).map(|k| k.into_owned()))
    /// };
    /// assert_eq!(key("for=192.0.2.60;proto=http;by=203.0.113.43")?, Some("192.0.2.60".parse()?));
    /// // An obfuscated client: the proxy that vouched last is the key.
    /// assert_eq!(key("for=_hidden, for=10.0.0.7")?, Some("10.0.0.7".parse()?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn rfc7239(peer: PeerIp<T>, trusted: impl IntoIterator<Item = IpNet>) -> ForwardedFor<T> {
        ForwardedFor {
            header: ForwardHeader::Forwarded,
            ..ForwardedFor::new(peer, trusted)
        }
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(ip))
    }

    /// Walk `hops`, rightmost first, from the trusted `peer`.
    fn walk(&self, peer: IpAddr, hops: impl Iterator<Item = Option<IpAddr>>) -> IpAddr {
        let mut client = peer;
        for hop in hops.take(MAX_HOPS) {
            let Some(ip) = hop else {
                break;
            };
            client = ip;
            if !self.is_trusted(ip) {
                break;
            }
        }
        client
    }
}

impl<T: Send + Sync + 'static> KeyExtractor for ForwardedFor<T> {
    type Key = IpAddr;
    type Lookup = IpAddr;

    fn extract<'r>(&self, request: &RequestHead<'r>) -> Option<Cow<'r, IpAddr>> {
        let peer = self.peer.peer(request)?;
        let client = if !self.is_trusted(peer) {
            peer
        } else {
            match self.header {
                ForwardHeader::XForwardedFor => {
                    let hops = request
                        .headers
                        .get_all("x-forwarded-for")
                        .iter()
                        .rev()
                        .flat_map(|v| v.as_bytes().rsplit(|&b| b == b','))
                        .map(|entry| core::str::from_utf8(entry).ok().and_then(parse_node));
                    self.walk(peer, hops)
                }
                ForwardHeader::Forwarded => {
                    // Quoted strings may hold commas, so the elements are
                    // found by a quote-aware scan, and from the right: the
                    // elements a proxy appended are well-formed and lie right
                    // of anything the client sent, so a client's unclosed
                    // quote (which a left-to-right scan would run on through
                    // the proxy's element) cannot reach them.
                    let mut lines: Vec<_> = request
                        .headers
                        .get_all(http::header::FORWARDED)
                        .iter()
                        .map(|line| String::from_utf8_lossy(line.as_bytes()))
                        .collect();
                    lines.reverse();
                    let hops = lines
                        .iter()
                        .flat_map(|line| rsplit_unquoted(line, b','))
                        .map(forwarded_for);
                    self.walk(peer, hops)
                }
            }
        };
        Some(Cow::Owned(self.peer.key(client)))
    }

    /// The peer-address extension is missing.
    fn misconfiguration(&self, request: &RequestHead<'_>) -> Option<&'static str> {
        self.peer.misconfiguration(request)
    }
}

/// The pieces of `s` between `sep` bytes that are outside quoted strings.
fn split_unquoted(s: &str, sep: u8) -> impl Iterator<Item = &str> {
    let mut rest = Some(s);
    core::iter::from_fn(move || {
        let s = rest?;
        let (mut quoted, mut escaped) = (false, false);
        for (i, &b) in s.as_bytes().iter().enumerate() {
            if quoted {
                if escaped {
                    escaped = false;
                } else if b == b'\\' {
                    escaped = true;
                } else if b == b'"' {
                    quoted = false;
                }
            } else if b == b'"' {
                quoted = true;
            } else if b == sep {
                // `sep` is ASCII, so `i` and `i + 1` are character boundaries.
                rest = s.get(i + 1..);
                return s.get(..i);
            }
        }
        rest = None;
        Some(s)
    })
}

/// The pieces of `s` between `sep` bytes that are outside quoted strings,
/// last first: scanned from the right, a `"` closes a quoted string (read
/// backwards) and the next `"` not escaped by an odd run of backslashes
/// opens it. On well-formed input the pieces are `split_unquoted`'s; on a
/// line whose left part is malformed, the well-formed pieces right of it
/// still come out whole.
fn rsplit_unquoted(s: &str, sep: u8) -> impl Iterator<Item = &str> {
    let mut rest = Some(s);
    core::iter::from_fn(move || {
        let s = rest?;
        let bytes = s.as_bytes();
        let mut quoted = false;
        let mut i = bytes.len();
        while i > 0 {
            i -= 1;
            let b = bytes[i];
            if quoted {
                if b == b'"' {
                    let backslashes = bytes[..i].iter().rev().take_while(|&&c| c == b'\\').count();
                    if backslashes % 2 == 0 {
                        quoted = false;
                    }
                }
            } else if b == b'"' {
                quoted = true;
            } else if b == sep {
                // `sep` is ASCII, so `i` and `i + 1` are character boundaries.
                rest = s.get(..i);
                return s.get(i + 1..);
            }
        }
        rest = None;
        Some(s)
    })
}

/// The address of one `Forwarded` element's `for=` parameter; `None` when it
/// has none, several, or one that is not an address (`unknown`, `_hidden`).
fn forwarded_for(element: &str) -> Option<IpAddr> {
    let mut found = None;
    for pair in split_unquoted(element, b';') {
        if pair.trim().is_empty() {
            continue;
        }
        let (name, value) = pair.split_once('=')?;
        if !name.trim().eq_ignore_ascii_case("for") {
            continue;
        }
        if found.is_some() {
            return None;
        }
        let value = value.trim();
        let value = match value.strip_prefix('"') {
            // Addresses need no escapes: a quoted value with any is not one.
            Some(quoted) => quoted
                .strip_suffix('"')
                .filter(|v| !v.contains(['"', '\\']))?,
            None => value,
        };
        found = Some(parse_node(value)?);
    }
    found
}

/// An address with an optional port: `192.0.2.1`, `192.0.2.1:80`,
/// `2001:db8::1`, `[2001:db8::1]`, `[2001:db8::1]:80` (the port may be an
/// RFC 7239 obfuscated one, `_abc`). Anything else, `unknown` and obfuscated
/// identifiers included, is `None`.
fn parse_node(node: &str) -> Option<IpAddr> {
    let node = node.trim();
    if let Some(rest) = node.strip_prefix('[') {
        let (ip, after) = rest.split_once(']')?;
        if !after.is_empty() && !is_port(after.strip_prefix(':')?) {
            return None;
        }
        return ip.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip);
    }
    let (ip, port) = node.rsplit_once(':')?;
    if !is_port(port) {
        return None;
    }
    ip.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
}

/// RFC 7239's `node-port`: 1 to 5 digits, or `_` and an obfuscated name.
fn is_port(port: &str) -> bool {
    let digits = (1..=5).contains(&port.len()) && port.bytes().all(|b| b.is_ascii_digit());
    let obfuscated = port.strip_prefix('_').is_some_and(|name| {
        !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    });
    digits || obfuscated
}

impl<T> Clone for ForwardedFor<T> {
    fn clone(&self) -> Self {
        ForwardedFor {
            peer: self.peer.clone(),
            trusted: Arc::clone(&self.trusted),
            header: self.header,
        }
    }
}

impl<T> fmt::Debug for ForwardedFor<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForwardedFor")
            .field("trusted", &self.trusted)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

/// Why the layer answers a request itself: what a [`DenialResponse`] is given.
///
/// ```
/// use turnstile::{KeyedDecision, Outcome, RetryAfter};
/// use turnstile::tower::Denial;
///
/// let limited = Denial::Refused(Outcome::from_decision(Some(KeyedDecision::Denied {
///     retry_after: RetryAfter::from_nanos(1_200_000_000),
/// })));
/// assert_eq!(limited.status().as_u16(), 429);
/// assert_eq!(limited.retry_after_secs(), Some(2));
/// assert_eq!(Denial::Misconfigured("no peer").outcome(), None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Denial {
    /// The gate refused the request: 401, 429 or 503.
    Refused(Outcome),
    /// The server is misconfigured (500): the message says what is missing
    /// ([`KeyExtractor::misconfiguration`]).
    Misconfigured(&'static str),
}

impl Denial {
    /// The status the layer gives the response: 401, 429, 503 or 500.
    ///
    /// ```
    /// use http::StatusCode;
    /// use turnstile::Outcome;
    /// use turnstile::tower::Denial;
    ///
    /// assert_eq!(Denial::Refused(Outcome::Unauthorized).status(), StatusCode::UNAUTHORIZED);
    /// assert_eq!(Denial::Misconfigured("no peer").status(), StatusCode::INTERNAL_SERVER_ERROR);
    /// ```
    pub fn status(&self) -> StatusCode {
        match self {
            Denial::Refused(outcome) => match outcome.status() {
                401 => StatusCode::UNAUTHORIZED,
                429 => StatusCode::TOO_MANY_REQUESTS,
                503 => StatusCode::SERVICE_UNAVAILABLE,
                // An admitted outcome is never a denial.
                _ => StatusCode::OK,
            },
            Denial::Misconfigured(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The gate's outcome, unless the layer is misconfigured.
    pub fn outcome(&self) -> Option<Outcome> {
        match self {
            Denial::Refused(outcome) => Some(*outcome),
            Denial::Misconfigured(_) => None,
        }
    }

    /// The `Retry-After` the layer sends, in whole seconds rounded up: 429 and
    /// 503 only.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.outcome().and_then(|o| o.retry_after_secs())
    }
}

/// Builds the response to a denied request, before the layer sets its status
/// and header fields (see [Denial responses](self#denial-responses)). Called
/// only for denials. A closure is the usual way
/// ([`RateLimitLayer::deny_with`]); a type can implement it too:
///
/// ```
/// use http::Response;
/// use turnstile::Outcome;
/// use turnstile::tower::{Denial, DenialResponse};
///
/// /// A one-line text body.
/// #[derive(Clone)]
/// struct Text;
///
/// impl DenialResponse<String> for Text {
///     fn respond(&self, denial: &Denial) -> Response<String> {
///         Response::new(format!("{}\n", denial.status()))
///     }
/// }
///
/// let response = Text.respond(&Denial::Refused(Outcome::Unauthorized));
/// assert_eq!(response.body(), "401 Unauthorized\n");
/// ```
pub trait DenialResponse<B>: Clone + Send + Sync + 'static {
    /// The response to `denial`.
    fn respond(&self, denial: &Denial) -> Response<B>;
}

/// The default [`DenialResponse`]: an empty body for 401, 429 and 503, and
/// for a misconfiguration (500) a `text/plain` body with the message.
///
/// ```
/// use http::Response;
/// use turnstile::Outcome;
/// use turnstile::tower::{Denial, DenialResponse, PlainDenial};
///
/// let limited: Response<String> = PlainDenial.respond(&Denial::Refused(Outcome::Unauthorized));
/// assert_eq!(limited.body(), "");
/// let broken: Response<String> = PlainDenial.respond(&Denial::Misconfigured("no peer address"));
/// assert_eq!(broken.body(), "no peer address");
/// assert_eq!(broken.headers()["content-type"], "text/plain; charset=utf-8");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlainDenial;

impl<B: Default + From<&'static str>> DenialResponse<B> for PlainDenial {
    fn respond(&self, denial: &Denial) -> Response<B> {
        match denial {
            Denial::Refused(_) => Response::new(B::default()),
            Denial::Misconfigured(message) => {
                let mut response = Response::new(B::from(message));
                response.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; charset=utf-8"),
                );
                response
            }
        }
    }
}

/// A [`DenialResponse`] from a function of the [`Denial`], made by
/// [`RateLimitLayer::deny_with`] (which has an example). Shared by every clone
/// of the layer.
pub struct DenyWith<F>(Arc<F>);

impl<F> DenyWith<F> {
    pub(crate) fn new(respond: F) -> DenyWith<F> {
        DenyWith(Arc::new(respond))
    }
}

impl<F> Clone for DenyWith<F> {
    fn clone(&self) -> Self {
        DenyWith(Arc::clone(&self.0))
    }
}

impl<F> fmt::Debug for DenyWith<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DenyWith").finish_non_exhaustive()
    }
}

impl<B, F> DenialResponse<B> for DenyWith<F>
where
    F: Fn(&Denial) -> Response<B> + Send + Sync + 'static,
{
    fn respond(&self, denial: &Denial) -> Response<B> {
        (self.0)(denial)
    }
}

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
    A = TokenBucket,
    C = RealClock,
    S = ahash::RandomState,
    R = PlainDenial,
    L = KeyedLimiter<<X as KeyExtractor>::Key, A, C, S>,
> {
    gate: Arc<Gate<X::Key, A, C, S, L>>,
    extractor: X,
    respond: R,
    challenge: Option<HeaderValue>,
    reported: Reported,
}

impl<X: KeyExtractor, A, C, S, L> RateLimitLayer<X, A, C, S, PlainDenial, L> {
    /// A layer limiting requests by the key `extractor` picks, through `gate`
    /// (one keyed limiter, or tiers: [`Gate::tiered`]).
    pub fn new(
        gate: Gate<X::Key, A, C, S, L>,
        extractor: X,
    ) -> RateLimitLayer<X, A, C, S, PlainDenial, L> {
        RateLimitLayer::shared(Arc::new(gate), extractor)
    }

    /// A layer on a gate shared with other code (to read its stats, say).
    pub fn shared(
        gate: Arc<Gate<X::Key, A, C, S, L>>,
        extractor: X,
    ) -> RateLimitLayer<X, A, C, S, PlainDenial, L> {
        RateLimitLayer {
            gate,
            extractor,
            respond: PlainDenial,
            challenge: None,
            reported: Reported::default(),
        }
    }
}

impl<X: KeyExtractor, A, C, S, R, L> RateLimitLayer<X, A, C, S, R, L> {
    /// The gate.
    pub fn gate(&self) -> &Arc<Gate<X::Key, A, C, S, L>> {
        &self.gate
    }

    /// Build denial responses with `respond` (see the
    /// [module docs](self#denial-responses) for a problem-details example).
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
    pub fn deny_with<F, B>(self, respond: F) -> RateLimitLayer<X, A, C, S, DenyWith<F>, L>
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
    pub fn challenge(self, challenge: HeaderValue) -> RateLimitLayer<X, A, C, S, R, L> {
        RateLimitLayer {
            challenge: Some(challenge),
            ..self
        }
    }
}

impl<X, A, C, S, R, L> RateLimitLayer<X, A, C, S, R, L>
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

impl<X: KeyExtractor, A, C, S, R: Clone, L> Clone for RateLimitLayer<X, A, C, S, R, L> {
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

impl<X: KeyExtractor + fmt::Debug, A, C, S, R, L> fmt::Debug for RateLimitLayer<X, A, C, S, R, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("extractor", &self.extractor)
            .field("challenge", &self.challenge)
            .finish_non_exhaustive()
    }
}

impl<Svc, X: KeyExtractor, A, C, S, R: Clone, L> Layer<Svc> for RateLimitLayer<X, A, C, S, R, L> {
    type Service = RateLimit<Svc, X, A, C, S, R, L>;

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
    A = TokenBucket,
    C = RealClock,
    S = ahash::RandomState,
    R = PlainDenial,
    L = KeyedLimiter<<X as KeyExtractor>::Key, A, C, S>,
> {
    inner: Svc,
    layer: RateLimitLayer<X, A, C, S, R, L>,
}

impl<Svc: Clone, X: KeyExtractor, A, C, S, R: Clone, L> Clone for RateLimit<Svc, X, A, C, S, R, L> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<Svc: fmt::Debug, X: KeyExtractor + fmt::Debug, A, C, S, R, L> fmt::Debug
    for RateLimit<Svc, X, A, C, S, R, L>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("extractor", &self.layer.extractor)
            .finish_non_exhaustive()
    }
}

impl<Svc, X, A, C, S, R, L, ReqBody, ResBody> Service<Request<ReqBody>>
    for RateLimit<Svc, X, A, C, S, R, L>
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
            return ResponseFuture::denied(layer.deny(&Denial::Misconfigured(problem)));
        }
        let outcome = layer.gate.check(key.as_deref());
        drop(key);
        if outcome.is_admitted() {
            // Only a policy adds fields to an admitted response.
            let fields = layer.gate.policy().map(|p| policy_fields(p, &outcome));
            ResponseFuture::admitted(self.inner.call(request), fields)
        } else {
            ResponseFuture::denied(layer.deny(&Denial::Refused(outcome)))
        }
    }
}

impl<X: KeyExtractor, A, C, S, R, L> RateLimitLayer<X, A, C, S, R, L> {
    /// The response to `denial`: the hook's, with the layer's status and
    /// fields set over it.
    fn deny<B>(&self, denial: &Denial) -> Response<B>
    where
        R: DenialResponse<B>,
    {
        deny(
            &self.respond,
            denial,
            &self.extractor,
            self.challenge.as_ref(),
            self.gate.policy(),
        )
    }
}

/// The response to `denial`: `respond`'s, with the layer's status and fields
/// set over it (`challenge`, or else the extractor's, on a 401; `policy`'s
/// fields on the others). Shared by every layer of the crate.
pub(crate) fn deny<B, R: DenialResponse<B>, X: KeyExtractor>(
    respond: &R,
    denial: &Denial,
    extractor: &X,
    challenge: Option<&HeaderValue>,
    policy: Option<&RateLimitPolicy>,
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
                None => extractor.challenge(),
            };
            headers.insert(WWW_AUTHENTICATE, challenge);
        }
        // A 401 has no `RateLimit` value, so no policy fields either.
        if let Some(policy) = policy {
            add_policy_fields(headers, policy_fields(policy, &outcome));
        }
    }
    response
}

/// The `RateLimit-Policy` and `RateLimit` field values for `outcome`.
pub(crate) fn policy_fields(
    policy: &RateLimitPolicy,
    outcome: &Outcome,
) -> [Option<HeaderValue>; 2] {
    // Validated policy names and numbers make valid values; anything else
    // would be left out, never a panic.
    let value = |s: Option<String>| s.and_then(|s| HeaderValue::from_str(&s).ok());
    [
        value(Some(policy.policy_value())),
        value(policy.value(outcome)),
    ]
}

pub(crate) fn add_policy_fields(headers: &mut HeaderMap, fields: [Option<HeaderValue>; 2]) {
    let [policy, value] = fields;
    if let (Some(policy), Some(value)) = (policy, value) {
        headers.insert(RATELIMIT_POLICY, policy);
        headers.insert(RATELIMIT, value);
    }
}

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

pin_project_lite::pin_project! {
    /// The future of a [`RateLimit`] service's response.
    pub struct ResponseFuture<F, B> {
        #[pin]
        state: State<F, B>,
    }
}

impl<F, B> ResponseFuture<F, B> {
    /// The inner service's response to an admitted request, with the policy
    /// `fields` added.
    pub(crate) fn admitted(
        future: F,
        fields: Option<[Option<HeaderValue>; 2]>,
    ) -> ResponseFuture<F, B> {
        ResponseFuture {
            state: State::Admitted { future, fields },
        }
    }

    pub(crate) fn denied(response: Response<B>) -> ResponseFuture<F, B> {
        ResponseFuture {
            state: State::Denied {
                response: Some(response),
            },
        }
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
