//! What the layer answers a denied request: [`Denial`], how its response
//! body is built ([`DenialResponse`], [`PlainDenial`], [`DenyWith`]), and
//! whether it closes the connection (`close_if_body_unread`).

use core::fmt;
use std::sync::Arc;

use http::header::{CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, TRANSFER_ENCODING};
use http::{HeaderMap, Response, StatusCode, Version};

use crate::http::gate::Outcome;

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
    /// ([`KeyExtractor::misconfiguration`](super::KeyExtractor::misconfiguration)).
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
/// and header fields (see [Denial responses](crate::tower#denial-responses)). Called
/// only for denials. A closure is the usual way
/// ([`RateLimitLayer::deny_with`](super::RateLimitLayer::deny_with)); a type can implement it too:
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
/// [`RateLimitLayer::deny_with`](super::RateLimitLayer::deny_with) (which has an example). Shared by every clone
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

/// Adds `Connection: close` to the headers of a denial (`response`) when the
/// denied request may carry a body that the layer leaves unread: an HTTP/1.0
/// or HTTP/1.1 request with a `Content-Length` other than 0, or with any
/// `Transfer-Encoding` (RFC 9112 §6.3: a request with neither has no body, so
/// its method does not matter). Returns whether the response now closes the
/// connection. HTTP/2 and HTTP/3 responses are never given the field: both
/// forbid it (RFC 9113 §8.2.2, RFC 9114 §4.2), and carry each request on a
/// stream of its own; a bodiless request's denial keeps the connection alive.
/// Called for denials only: an admitted request's body is the inner service's.
///
/// # Why: what hyper 1.x does with a body nobody reads
///
/// Read in hyper 1.12 (`src/proto/h1/`), for a server behind axum (whose
/// `serve` wraps the router in hyper-util's `TowerToHyperService`):
///
/// - `dispatch.rs` `poll_read_head` (l. 313-318) gives a request with a body
///   a channel-backed `Incoming`; a bodiless one gets `Incoming::empty()` and
///   never reaches the drain below.
/// - `Server::recv_msg` (l. 629) only *creates* the service's future: through
///   hyper-util's `Oneshot`, the tower service's `call`, and this layer's
///   decision, run when that future is first polled, in `poll_write`. Before
///   that, the same loop (`poll_loop`, l. 173-174: `poll_read` first) may
///   already have read the first piece of the body into the channel's one
///   slot.
/// - The layer then drops the request, and with it the `Incoming`. hyper
///   encodes the denial's head at once, and adds `Connection: close` itself
///   (`conn.rs` `enforce_version`, l. 701-720) only if keep-alive is already
///   disabled: it is not yet, so the response goes out promising keep-alive.
/// - Only on the next `poll_read` does the sender see the receiver gone
///   (`body/chan.rs` l. 69; `dispatch.rs` l. 239) and call
///   `conn.poll_drain_or_close_read` (`conn.rs` l. 876-892): *one* more
///   `poll_read_body`, at most one buffer's worth of a `Content-Length` body
///   or one chunk of a chunked one (`decode.rs` `Decoder::decode`), and if the
///   body has not ended by then (more left, or not yet arrived: `Pending`),
///   `close_read` (l. 894, 1084): reading closed and keep-alive disabled.
/// - `try_keep_alive` (l. 1100) then closes the connection, `Dispatcher::is_done`
///   (`dispatch.rs` l. 469) holds, and hyper shuts the socket down (l. 157).
///   Bytes of the body still unread in the kernel's buffer make that close a
///   TCP reset.
///
/// So a small body that arrived with the head is drained and the connection
/// lives on; anything larger (a 64 KiB upload, a chunked body whose last
/// chunk has not arrived) gets a response that looks reusable on a connection
/// the server is about to close: the client's next request on it fails with a
/// broken pipe or a connection reset. With `Connection: close` on the denial,
/// hyper marks the response the connection's last (`role.rs` l. 847-849,
/// `Encoder::set_last`), and the client knows to open a new connection.
///
/// The layer does not drain the body itself: its services take any request
/// body type (`Request<()>` included), so reading one would need a
/// `http_body::Body` bound or a new type parameter on the layers and their
/// futures, and a timer to bound a slow sender; and a denied client is the
/// last one a limiter should spend reads and time on. hyper's own one-step
/// drain stays, and the close costs one reconnect to a client that sent a body
/// it was refused.
pub(crate) fn close_if_body_unread(
    version: Version,
    request: &HeaderMap,
    response: &mut HeaderMap,
) -> bool {
    if !matches!(version, Version::HTTP_10 | Version::HTTP_11) {
        return false;
    }
    let chunked_or_coded = request.contains_key(TRANSFER_ENCODING);
    // Any value but a plain 0 may mean a body: one that does not parse is
    // answered 400 by hyper before a service sees it, but be safe.
    let sized = request
        .get_all(CONTENT_LENGTH)
        .iter()
        .any(|value| value.as_bytes().trim_ascii() != b"0");
    if !(chunked_or_coded || sized) {
        return false;
    }
    let closes = response.get_all(CONNECTION).iter().any(|value| {
        value
            .as_bytes()
            .split(|&b| b == b',')
            .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"close"))
    });
    if !closes {
        // Replaces any `keep-alive` a denial hook set: the two contradict.
        response.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    true
}

#[cfg(test)]
mod tests {
    use http::header::{CONNECTION, CONTENT_LENGTH, HeaderMap, HeaderValue, TRANSFER_ENCODING};
    use http::{HeaderName, Version};

    use super::close_if_body_unread;

    fn request(fields: &[(HeaderName, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in fields {
            headers.append(name.clone(), HeaderValue::from_static(value));
        }
        headers
    }

    fn closes(version: Version, fields: &[(HeaderName, &'static str)]) -> Option<HeaderValue> {
        let mut response = HeaderMap::new();
        let said = close_if_body_unread(version, &request(fields), &mut response);
        assert_eq!(said, response.contains_key(CONNECTION));
        response.get(CONNECTION).cloned()
    }

    #[test]
    fn a_body_on_http1_closes() {
        for version in [Version::HTTP_10, Version::HTTP_11] {
            for fields in [
                &[(CONTENT_LENGTH, "16")][..],
                &[(CONTENT_LENGTH, "1048576")],
                &[(TRANSFER_ENCODING, "chunked")],
                &[(TRANSFER_ENCODING, "gzip, chunked")],
                &[(CONTENT_LENGTH, "0"), (TRANSFER_ENCODING, "chunked")],
                &[(CONTENT_LENGTH, "not a number")],
            ] {
                assert_eq!(
                    closes(version, fields).unwrap(),
                    "close",
                    "{version:?} {fields:?}"
                );
            }
        }
    }

    #[test]
    fn no_body_keeps_the_connection() {
        for version in [Version::HTTP_10, Version::HTTP_11] {
            assert_eq!(closes(version, &[]), None);
            assert_eq!(closes(version, &[(CONTENT_LENGTH, "0")]), None);
            assert_eq!(closes(version, &[(CONTENT_LENGTH, " 0 ")]), None);
        }
    }

    #[test]
    fn never_on_http2_or_later() {
        for version in [Version::HTTP_2, Version::HTTP_3, Version::HTTP_09] {
            assert_eq!(closes(version, &[(CONTENT_LENGTH, "16")]), None);
            assert_eq!(closes(version, &[(TRANSFER_ENCODING, "chunked")]), None);
        }
    }

    #[test]
    fn a_hook_s_close_is_kept_and_its_keep_alive_replaced() {
        let body = request(&[(CONTENT_LENGTH, "16")]);
        let mut response = HeaderMap::new();
        response.insert(CONNECTION, HeaderValue::from_static("x-hop, Close"));
        assert!(close_if_body_unread(Version::HTTP_11, &body, &mut response));
        assert_eq!(response[CONNECTION], "x-hop, Close");

        response.insert(CONNECTION, HeaderValue::from_static("keep-alive"));
        assert!(close_if_body_unread(Version::HTTP_11, &body, &mut response));
        assert_eq!(response.get_all(CONNECTION).iter().count(), 1);
        assert_eq!(response[CONNECTION], "close");
    }
}
