//! Key extractors: what a request is limited by ([`KeyExtractor`]), and the
//! built-in ones that read no header a client controls beyond the API key:
//! [`Global`], [`ApiKeyHeader`], [`PeerIp`].

use core::borrow::Borrow;
use core::fmt;
use core::hash::Hash;
use core::net::{IpAddr, SocketAddr};
use std::borrow::Cow;
use std::sync::Arc;

use http::header::{HeaderName, HeaderValue};
use http::{Extensions, HeaderMap, Method, Request, Uri};

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
    /// 500 ([`Denial::Misconfigured`](super::Denial::Misconfigured)) instead of 401. `None` by default.
    fn misconfiguration(&self, request: &RequestHead<'_>) -> Option<&'static str> {
        let _ = request;
        None
    }

    /// The `WWW-Authenticate` challenge a 401 carries (RFC 9110 requires one);
    /// [`RateLimitLayer::challenge`](super::RateLimitLayer::challenge) overrides it. `ApiKey` by default.
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

/// Whether `X` keys every request alike (its key is `()`, as [`Global`]'s):
/// one allowance shared by every client, which a response about one client
/// (an upstream's 429 to it) must not empty for all.
pub(crate) fn one_key_for_all<X: KeyExtractor>() -> bool {
    core::any::TypeId::of::<X::Key>() == core::any::TypeId::of::<()>()
}

type Validator = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The value of an API-key header: the key to use once the request is
/// authenticated (put this layer after the authentication, or validate keys
/// with [`validate`](ApiKeyHeader::validate)).
///
/// The key is the value with the spaces around it trimmed; inside, it may
/// hold spaces and tabs besides visible ASCII, so that `Authorization:
/// Bearer <token>` is keyed by the whole value. The whole value, as sent:
/// `Bearer T`, `bearer T` and `Bearer  T` are three keys, though an
/// authenticator that compares the scheme without case (as RFC 9110 has it)
/// accepts all three as one credential. Where clients could so multiply
/// their allowance, key on the token the authentication validated (an
/// extractor of your own, or a [`validate`](ApiKeyHeader::validate) that
/// admits only the one spelling). A missing header, a value
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
        // `to_str` admits only visible ASCII and tabs, where ASCII
        // whitespace is all the whitespace there is: `trim_ascii` trims what
        // `trim` would, without `trim`'s walk over UTF-8 code points.
        let value = request.headers.get(&self.name)?.to_str().ok()?.trim_ascii();
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

/// Why a key extractor could not be configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExtractorConfigError {
    /// [`PeerIp::ipv6_prefix`] was given more bits than an IPv6 address has
    /// (128).
    Ipv6PrefixTooLong {
        /// The prefix length asked for.
        bits: u8,
    },
}

impl fmt::Display for ExtractorConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExtractorConfigError::Ipv6PrefixTooLong { bits } => write!(
                f,
                "an IPv6 prefix of {bits} bits; ipv6_prefix must be between 0 and 128 \
                 (128 keys each address alone)"
            ),
        }
    }
}

impl std::error::Error for ExtractorConfigError {}

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
/// and (feature `tracing`) logs it once; see the [module docs](crate::tower#misconfiguration).
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
    /// use turnstile::tower::{ExtractorConfigError, PeerIp};
    ///
    /// let per_subnet = PeerIp::new().ipv6_prefix(64)?;
    /// # let _ = per_subnet;
    /// assert!(matches!(
    ///     PeerIp::new().ipv6_prefix(200),
    ///     Err(ExtractorConfigError::Ipv6PrefixTooLong { bits: 200 })
    /// ));
    /// # Ok::<(), ExtractorConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ExtractorConfigError::Ipv6PrefixTooLong`] for more than 128 bits.
    pub fn ipv6_prefix(self, bits: u8) -> Result<PeerIp<T>, ExtractorConfigError> {
        if bits > 128 {
            return Err(ExtractorConfigError::Ipv6PrefixTooLong { bits });
        }
        Ok(PeerIp {
            ipv6_prefix: bits,
            ..self
        })
    }

    pub(super) fn peer(&self, request: &RequestHead<'_>) -> Option<IpAddr>
    where
        T: Send + Sync + 'static,
    {
        Some(
            (self.get)(request.extensions.get::<T>()?)
                .ip()
                .to_canonical(),
        )
    }

    pub(super) fn key(&self, ip: IpAddr) -> IpAddr {
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
