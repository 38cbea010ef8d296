//! The client address behind proxies you trust: [`ForwardedFor`] reads
//! `X-Forwarded-For` or RFC 7239 `Forwarded` only from the networks
//! ([`IpNet`]) it is given.

use core::fmt;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use core::str::FromStr;
use std::borrow::Cow;
use std::sync::Arc;

use super::extract::{KeyExtractor, PeerIp, RequestHead};

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
/// Every address inside a trusted network is taken for a proxy and passed
/// over: list your proxies' addresses, not a network clients also sit in. A
/// client inside a listed network (another pod in `10.0.0.0/8`, say) that
/// goes through your proxy is passed over too, and the walk keys on the
/// entry it wrote itself, a fresh one per request if it likes.
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
