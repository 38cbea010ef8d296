//! A tower [`Layer`] and [`Service`] that put a [`Gate`](crate::Gate) in front of any
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
//! # Several limits on one request
//!
//! [`Limits`] puts several limits (direct, keyed, tiered, and with features
//! `redis` and `tokio` limits in Redis) in one layer that decides each
//! request as one: every key read before any permit is taken, all or
//! nothing, the longest wait of the limits that refuse, one `RateLimit`
//! item per limit, and responses that can settle what a request cost
//! ([`LimitsBuilder::refund_when`], [`LimitsBuilder::cost_from_response`],
//! [`LimitsBuilder::drain_when`]). Layers stacked instead still tell every
//! limit: each appends its items to the `RateLimit-Policy` and `RateLimit`
//! Lists rather than replacing them.
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
//! # Denials and keep-alive
//!
//! The layer answers a denial without reading the request's body. Over
//! HTTP/1.x, hyper 1.x (under axum) then reads at most one more piece of that
//! body and, if it has not ended, closes the connection: after a response
//! that said nothing of it, so the client's next request on the connection
//! would fail with a broken pipe or a reset. So a denial of an HTTP/1.0 or
//! HTTP/1.1 request that may carry a body (`Content-Length` other than 0, or
//! any `Transfer-Encoding`) carries `Connection: close`: the client sees the
//! whole denial, then the end of the connection, and opens a new one. A
//! bodiless request's denial (most `GET`s) keeps the connection, and HTTP/2
//! and HTTP/3 responses never carry the field (it is not allowed there).
//!
//! ```
//! use http::{Request, StatusCode, Version, header};
//! use turnstile::tower::{Global, Layer, RateLimitLayer};
//! use turnstile::{Gate, KeyedLimiter, Quota};
//! # use std::convert::Infallible;
//! # use std::future::{Ready, ready};
//! # use std::pin::pin;
//! # use std::task::{Context, Poll, Waker};
//! # use http::Response;
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
//! let gate = Gate::new(KeyedLimiter::<()>::new(Quota::per_hour(1)?));
//! // `Hello` and `send` as in the first example.
//! let mut service = RateLimitLayer::new(gate, Global).layer(Hello);
//! # let mut send = |request: Request<()>| {
//! #     match pin!(service.call(request)).poll(&mut Context::from_waker(Waker::noop())) {
//! #         Poll::Ready(Ok(response)) => response,
//! #         _ => unreachable!("ready at once"),
//! #     }
//! # };
//! let upload = |version| {
//!     Request::post("/").version(version).header(header::CONTENT_LENGTH, "65536").body(())
//! };
//! assert_eq!(send(upload(Version::HTTP_11)?).status(), StatusCode::OK);
//! let denied = send(upload(Version::HTTP_11)?);
//! assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(denied.headers()["connection"], "close");
//! // No body, or HTTP/2: the connection stays.
//! assert!(send(Request::get("/").body(())?).headers().get("connection").is_none());
//! assert!(send(upload(Version::HTTP_2)?).headers().get("connection").is_none());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The layer does not read the body itself to keep the connection: its
//! service takes any request body type (`Request<()>` included), so draining
//! would need an `http_body::Body` bound, and a timer to stop a slow sender;
//! and a denied client is the last one a limiter should spend reads and time
//! on. hyper still drains what it can on its own (a small body that came
//! with the head) before it closes; the close costs the refused client one
//! reconnect. The Redis layer (`turnstile::redis::RedisRateLimitLayer`) does
//! the same. Admitted requests are untouched: their bodies are the inner
//! service's.
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

pub use tower_layer::Layer;
pub use tower_service::Service;

mod denial;
mod extract;
mod fields;
mod forwarded;
mod layer;
mod limits;

#[cfg(all(feature = "redis", feature = "tokio"))]
pub(crate) use denial::close_if_body_unread;
pub use denial::{Denial, DenialResponse, DenyWith, PlainDenial};
pub(crate) use extract::one_key_for_all;
pub use extract::{
    ApiKeyHeader, DEFAULT_IPV6_PREFIX, ExtractorConfigError, Global, KeyExtractor, PeerIp,
    RequestHead,
};
#[cfg(all(feature = "redis", feature = "tokio"))]
pub(crate) use fields::{Fields, policy_fields};
pub use forwarded::{ForwardedFor, IpNet, IpNetError};
pub use layer::{LayerStats, RateLimit, RateLimitLayer, ResponseFuture};
#[cfg(all(feature = "redis", feature = "tokio"))]
pub(crate) use layer::{Reported, deny};
#[cfg(all(feature = "redis", feature = "tokio"))]
pub(crate) use limits::{BoxFuture, Refund, Remote};
pub use limits::{Limited, LimitedFuture, Limits, LimitsBuilder, LimitsError, LimitsStats};
