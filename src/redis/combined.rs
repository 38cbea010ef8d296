//! Limits in Redis as members of a combined layer
//! ([`Limits`](crate::tower::Limits)): [`LimitsBuilder::redis_limit`].

use core::time::Duration;
use std::sync::Arc;

use http::HeaderValue;

use super::layer::RedisKey;
use super::layer::RedisLimit;
use super::{AnyAsyncConnection, AsyncRedisConnection, RedisAlgorithm};
use crate::decision::Decision;
use crate::http::gate::{AdvertisedQuota, Outcome};
use crate::http::tower::{
    BoxFuture, Denial, KeyExtractor, LimitsBuilder, LimitsError, Refund, Remote, RequestHead,
};

/// A limit in Redis, its key extractor and its connection.
struct RedisEntry<X, L> {
    name: String,
    extractor: X,
    limit: Arc<L>,
    con: AnyAsyncConnection,
}

impl<X, L> Remote for RedisEntry<X, L>
where
    X: KeyExtractor,
    X::Lookup: RedisKey,
    L: RedisLimit,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn capacity(&self) -> u32 {
        self.limit.redis_limiter().capacity()
    }

    fn missing(&self, head: &RequestHead<'_>) -> Option<Denial> {
        if self.extractor.extract(head).is_some() {
            return None;
        }
        Some(match self.extractor.misconfiguration(head) {
            Some(problem) => Denial::Misconfigured(problem),
            None => Denial::Refused(Outcome::Unauthorized),
        })
    }

    fn challenge(&self) -> HeaderValue {
        self.extractor.challenge()
    }

    fn key(&self, head: &RequestHead<'_>) -> Option<Vec<u8>> {
        let key = self.extractor.extract(head)?;
        Some(key.redis_key().into_owned())
    }

    fn advertise(&self) -> Option<(u32, Duration)> {
        Some(self.limit.redis_limiter().algorithm().advertised_quota())
    }

    fn one_key_for_all(&self) -> bool {
        crate::http::tower::one_key_for_all::<X>()
    }

    fn take(&self, key: Vec<u8>, n: u32) -> BoxFuture<(Decision, Option<Refund>)> {
        self.limit.take_owned(self.con.clone(), key, n)
    }

    fn peek(&self, key: Vec<u8>, n: u32) -> BoxFuture<Decision> {
        self.limit.peek_owned(self.con.clone(), key, n)
    }

    fn refund_restores_state(&self) -> bool {
        // The token bucket's and GCRA's refund scripts are exact only on the
        // very state the admission wrote; the windows' take the permits out
        // of a count that may hold later admissions too.
        matches!(
            self.limit.redis_limiter().algorithm(),
            RedisAlgorithm::TokenBucket(_) | RedisAlgorithm::Gcra(_)
        )
    }
}

impl LimitsBuilder {
    /// Add a limit kept in Redis (features `redis` and `tokio`): a
    /// [`Guarded`](crate::redis::Guarded) limiter (exact mode, with its
    /// failure policy) or a [`LeasedLimiter`](crate::redis::LeasedLimiter),
    /// keyed by what `extractor` picks, called on `con` (any of the crate's
    /// asynchronous connections: one server, Sentinel or a cluster).
    ///
    /// Limits in Redis are asked **after** every in-process limit, whatever
    /// the order they were added in, and in their own order: a call is made
    /// only for a request every in-process limit admitted. When one refuses,
    /// the Redis limits before it give their permits back (exact mode: by its
    /// refund script, exact or declined; leased mode keeps them spent) and so
    /// do the in-process ones. One whose permits stay spent, or a window
    /// (whose refund takes the permits out of a count that other requests
    /// may have added to meanwhile), is then asked what the same request
    /// would get (a peek, which takes nothing): its
    /// wait, if it refuses now, is in the denial's, and its item tells what
    /// it holds. The Redis limits after it are not called, so the denial's
    /// wait does not include theirs.
    ///
    /// Settling by the response ([`refund_when`](Self::refund_when) and the
    /// others) reaches them too, by calls made beside the response on the
    /// tokio runtime; their `RateLimit` items then tell what they are left
    /// with at most.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use http::header::HeaderName;
    /// use turnstile::redis::{Deadlines, Guarded, OnFailure, RedisLimiter};
    /// use turnstile::tower::{ApiKeyHeader, Global, Limits};
    /// use turnstile::{KeyedLimiter, Quota, TokenBucket};
    ///
    /// let con = Deadlines::default()
    ///     .response(Duration::from_millis(20))?
    ///     .reconnecting(redis::Client::open("redis://127.0.0.1/")?);
    /// // 10,000 a second across every replica, in Redis.
    /// let fleet = Guarded::new(
    ///     RedisLimiter::new("fleet", TokenBucket::new(Quota::per_second(10_000)?))?,
    ///     OnFailure::local_share(Quota::per_second(10_000)?, 4)?,
    ///     Duration::from_secs(1),
    /// );
    /// let layer = Limits::builder()
    ///     .limit("key", ApiKeyHeader::new(HeaderName::from_static("x-api-key")),
    ///         KeyedLimiter::<String>::new(Quota::per_second(10)?))?
    ///     .redis_limit("fleet", Global, Arc::new(fleet), con)?
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`limit`](Self::limit).
    pub fn redis_limit<X, L>(
        mut self,
        name: &str,
        extractor: X,
        limit: Arc<L>,
        con: impl AsyncRedisConnection,
    ) -> Result<Self, LimitsError>
    where
        X: KeyExtractor,
        X::Lookup: RedisKey,
        L: RedisLimit,
    {
        self.check_name(name, &[])?;
        self.remote.push(Arc::new(RedisEntry {
            name: name.to_owned(),
            extractor,
            limit,
            con: con.into_any(),
        }));
        Ok(self)
    }
}
