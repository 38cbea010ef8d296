//! What the layer answers a denied request: [`Denial`], and how its response
//! body is built ([`DenialResponse`], [`PlainDenial`], [`DenyWith`]).

use core::fmt;
use std::sync::Arc;

use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Response, StatusCode};

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
