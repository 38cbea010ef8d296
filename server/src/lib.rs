//! turnstile as a rate-limit service: Envoy's rate limit service protocol
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, gRPC)
//! answered by turnstile's lock-free keyed limiters, configured in
//! envoyproxy/ratelimit's YAML format ([`config`]).
//!
//! # The protocol
//!
//! A request names a domain and a list of descriptors, each a list of
//! `(key, value)` entries. Each descriptor is matched against the domain's
//! descriptor tree ([`Config::lookup`](config::Config::lookup)) and, if a
//! limit applies, spends its hits there; the response has one status per
//! descriptor and `OVER_LIMIT` overall if any is over. An unknown domain or
//! descriptor is answered `OK`, as envoyproxy/ratelimit answers it.
//!
//! Hits ([`RateLimitService::should_rate_limit`](service::RateLimitService::should_rate_limit)):
//! the request's `hits_addend`, where 0 is the same as unset and counts 1
//! (Envoy sends 0 on ordinary requests); a descriptor's own `hits_addend`
//! overrides it, and set to 0 it checks without spending (`OVER_LIMIT`
//! when not even one permit is left, with every backend: the Redis ones
//! read the limit's state with a script that writes nothing).
//!
//! A descriptor's `limit` override (with
//! [`with_overrides`](service::RateLimitService::with_overrides), as the
//! binary runs it) is decided as envoyproxy/ratelimit decides it: in a
//! configured domain, against that quota in a fixed window instead of the
//! configuration's limit.
//!
//! # `duration_until_reset`
//!
//! - **Over the limit**: the wait until the same request would be admitted,
//!   to the nanosecond, from the limiter's own denial (the token bucket and
//!   GCRA: until enough tokens have arrived; the fixed window: until it ends;
//!   the sliding window: until the weighted count has fallen enough). It is
//!   what a client that was refused needs: the time after which a retry
//!   succeeds, never earlier, and not the longer wait for a full allowance.
//!   The `Retry-After` field, when headers are on, is the longest such wait
//!   over the descriptors that are over, in whole seconds rounded up.
//! - **Admitted**: the time until the key's allowance is whole again if no
//!   other request came, an upper bound: the token bucket, the periods that
//!   refill what is missing; GCRA, one emission interval per missing permit;
//!   the fixed window, the end of the current window (as envoyproxy/ratelimit
//!   says); the sliding window, the end of the next window, when the current
//!   window's count stops weighing. With `limit_remaining` it tells a client
//!   how much it may send and when it may send all of it again (Envoy's
//!   `X-RateLimit-Reset`), never before that is true.
//!
//! Windows sit on the calendar's boundaries (UTC): [`ServiceClock`](clock::ServiceClock).
//!
//! # Backends
//!
//! Limits live in this process ([`InProcess`](backend::InProcess), the
//! default) or in Redis, shared by every replica
//! ([`RedisBackend`](redis_backend::RedisBackend), exact or leased mode, with
//! a failure policy and deadlines). With the Redis backends `remaining` is
//! what the decision saw: the global limit's in exact mode, the lease held by
//! this replica in leased mode; `duration_until_reset` of an admission is
//! counted from it.

pub mod backend;
pub mod clock;
pub mod config;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod redis_backend;
pub mod reload;
pub mod server;
pub mod service;
pub mod settings;
mod yaml;
