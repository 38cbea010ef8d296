use crate::counter::Counter;
use crate::limit::Limit;
use crate::reservation::ReservationId;
use crate::storage::keys::*;
use crate::storage::local_reservations::{LocalReservationRegistry, ReservationRequest};
use crate::storage::redis::counters_cache::{
    CachedCounterValue, CountersCache, CountersCacheBuilder,
};
use crate::storage::redis::redis_async::AsyncRedisStorage;
use crate::storage::redis::scripts::BATCH_UPDATE_COUNTERS;
use crate::storage::redis::{
    DEFAULT_BATCH_SIZE, DEFAULT_FLUSHING_PERIOD_SEC, DEFAULT_MAX_CACHED_COUNTERS,
    DEFAULT_RESPONSE_TIMEOUT_MS,
};
use crate::storage::{AsyncCounterStorage, Authorization, StorageErr};
use async_trait::async_trait;
use metrics::gauge;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{ConnectionInfo, RedisError};
use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tracing::{error, info, info_span, warn, Instrument};

// This is just a first version.
//
// The idea is to improve throughput and latencies by caching the limits and
// counters in memory to reduce the number of accesses to Redis. Every counter
// read/write (`is_within_limits`, `update_counter`, `check`, `check_and_update`) goes through
// this cache - `get_counters`/`delete_counters`/`clear` are the exception, delegating straight
// to the underlying `AsyncRedisStorage` since they're not on the hot request path.
//
// There might be several instances of Limitador accessing the same Redis server
// at the same time. This means that cached values might not reflect updates
// done by other Limitador instances. That's the trade-off this implementation
// makes. In order to reduce the number of Redis queries, it sacrifices some
// rate-limit accuracy. We can go over limits, but the amount can be configured
// by tuning the constants below.
//
// Future improvements:
// - Introduce a mechanism to avoid going to Redis to fetch the same counter
// multiple times when it is not cached.

pub struct CachedRedisStorage {
    cached_counters: Arc<CountersCache>,
    async_redis_storage: AsyncRedisStorage,
    // Local-memory only, not shared across processes - see `LocalReservationRegistry`'s docs.
    // A starting point, matching the accuracy trade-offs this backend already makes for
    // counters themselves; not meant for production multi-replica deployments yet.
    reservations: LocalReservationRegistry,
}

#[async_trait]
impl AsyncCounterStorage for CachedRedisStorage {
    // Read-only: a cache hit is served from the local cache, a cache miss reads the authoritative
    // value live from Redis (see `check_reading_misses`).
    #[tracing::instrument(skip_all)]
    async fn is_within_limits(&self, counter: &Counter, delta: u64) -> Result<bool, StorageErr> {
        let mut counter = counter.clone();
        Ok(matches!(
            self.check_reading_misses(std::slice::from_mut(&mut counter), delta)
                .await?,
            Authorization::Ok
        ))
    }

    // Cache-backed, same trade-off as `check_and_update`: increments are applied locally and
    // flushed to Redis in the background (`Batcher`/`BATCH_UPDATE_COUNTERS`), rather than
    // written synchronously. This keeps Report/Commit's view of a counter consistent with
    // `check`/`check_and_update`'s, rather than requiring a separate live Redis read to see
    // increments applied through this method.
    #[tracing::instrument(skip_all)]
    async fn update_counter(&self, counter: &Counter, delta: u64) -> Result<(), StorageErr> {
        self.cached_counters.increase_by(counter, delta).await;
        Ok(())
    }

    #[tracing::instrument(skip_all)]
    async fn check<'a>(
        &self,
        counters: &mut Vec<Counter>,
        delta: u64,
    ) -> Result<Authorization, StorageErr> {
        self.check_reading_misses(counters, delta).await
    }

    // Notice that this method does not guarantee 100% accuracy when applying the
    // limits. In order to do so, we'd need to run this whole function
    // atomically, but that'd be too slow.
    // This function trades accuracy for speed.
    #[tracing::instrument(skip_all)]
    async fn check_and_update<'a>(
        &self,
        counters: &mut Vec<Counter>,
        delta: u64,
    ) -> Result<Authorization, StorageErr> {
        let auth = self.check_assuming_fresh_misses(counters, delta);
        if matches!(auth, Authorization::Ok) {
            for counter in counters.iter() {
                self.cached_counters.increase_by(counter, delta).await;
            }
        }
        Ok(auth)
    }

    #[tracing::instrument(skip_all)]
    async fn get_counters(
        &self,
        limits: &HashSet<Arc<Limit>>,
    ) -> Result<HashSet<Counter>, StorageErr> {
        self.async_redis_storage.get_counters(limits).await
    }

    #[tracing::instrument(skip_all)]
    async fn delete_counters(&self, limits: &HashSet<Arc<Limit>>) -> Result<(), StorageErr> {
        self.async_redis_storage.delete_counters(limits).await
    }

    #[tracing::instrument(skip_all)]
    async fn clear(&self) -> Result<(), StorageErr> {
        self.async_redis_storage.clear().await
    }

    // Local-memory only (see `LocalReservationRegistry`'s docs): admission is checked against
    // this instance's own cached view of each counter. A cache miss can't just default to 0.
    // Unlike `check_and_update` - which writes on every admitted call, so a wrong guess is
    // corrected in full by the very next flush (`apply_remote_delta` folds in whatever Redis has
    // beyond what we last accounted for, not just incremental drift) - `reserve` never writes to
    // this cache, so nothing reconciles a wrong guess afterward. And unlike a read-only `check`,
    // whose decision is discarded, an under-estimate here is admitted as a real hold in
    // `LocalReservationRegistry`, which every subsequent `reserve` call on this counter folds
    // into its own admission math via `outstanding()`, compounding the mistake for up to
    // `ReservationLimits::max_ttl`. Misses are fetched live from Redis instead (the read-only
    // `check` path does the same), in one batched round trip.
    #[tracing::instrument(skip_all)]
    async fn reserve(
        &self,
        counters: &mut Vec<Counter>,
        reservation_id: &ReservationId,
        check_amount: u64,
        hold_amount: u64,
        ttl: Duration,
    ) -> Result<Authorization, StorageErr> {
        let now = SystemTime::now();

        let mut values_and_window_ttls: Vec<Option<(u64, Duration)>> = counters
            .iter()
            .map(|counter| {
                self.cached_counters
                    .get(counter)
                    .map(|cached| (cached.hits(counter), cached.ttl()))
            })
            .collect();

        let missing: Vec<usize> = values_and_window_ttls
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.is_none().then_some(i))
            .collect();

        if !missing.is_empty() {
            let missing_counters: Vec<Counter> =
                missing.iter().map(|&i| counters[i].clone()).collect();
            let fetched = self
                .async_redis_storage
                .values_and_window_ttls(&missing_counters)
                .await?;
            for (i, value_ttl) in missing.into_iter().zip(fetched) {
                values_and_window_ttls[i] = Some(value_ttl);
            }
        }

        let values_and_window_ttls: Vec<(u64, Duration)> = values_and_window_ttls
            .into_iter()
            .map(|v| v.expect("every entry was either cached or just fetched"))
            .collect();

        Ok(self.reservations.reserve(
            counters,
            &values_and_window_ttls,
            ReservationRequest {
                reservation_id,
                check_amount,
                hold_amount,
                ttl,
                now,
            },
        ))
    }

    #[tracing::instrument(skip_all)]
    async fn release_reservation(
        &self,
        counters: &[Counter],
        reservation_id: &ReservationId,
    ) -> Result<bool, StorageErr> {
        Ok(self.reservations.release(counters, reservation_id))
    }
}

impl CachedRedisStorage {
    /// Annotate every counter already present in the local cache with its current
    /// `remaining`/`expires_in`, and track whether `delta` more would keep it within its limit.
    /// Returns the first limited authorization found (if any) and the indices of the counters that
    /// were not present in the cache, left for the caller to resolve. Never mutates the cache.
    fn annotate_cached(
        &self,
        counters: &mut [Counter],
        delta: u64,
    ) -> (Option<Authorization>, Vec<usize>) {
        let mut first_limited = None;
        let mut missing: Vec<usize> = vec![];

        for (idx, counter) in counters.iter_mut().enumerate() {
            match self.cached_counters.get(counter) {
                Some(val) => {
                    if first_limited.is_none() && val.is_limited(counter, delta) {
                        first_limited = Some(Authorization::Limited(
                            counter.limit().name().map(|n| n.to_owned()),
                        ));
                    }
                    // `remaining` reflects the counter's actual current state, not a projection
                    // of `delta` having been applied.
                    counter.set_remaining(val.remaining(counter));
                    // A zero ttl means the previous window has already elapsed even though a
                    // stale entry is still cached - report a fresh full window, the same as a
                    // counter that was never cached at all.
                    let ttl = val.ttl();
                    let ttl = if ttl.is_zero() { counter.window() } else { ttl };
                    counter.set_expires_in(ttl);
                }
                _ => missing.push(idx),
            }
        }

        (first_limited, missing)
    }

    /// Determine whether `delta` more would keep every counter within its limit, annotating each
    /// with its `remaining`/`expires_in`. Cache hits are served from the local cache; cache misses
    /// are read live from Redis in one batched round trip. Reading the authoritative value on a
    /// miss (rather than assuming a fresh counter) avoids admitting an already-exhausted counter
    /// when the local cache is cold. Never mutates the cache.
    async fn check_reading_misses(
        &self,
        counters: &mut [Counter],
        delta: u64,
    ) -> Result<Authorization, StorageErr> {
        let (mut first_limited, missing) = self.annotate_cached(counters, delta);

        if !missing.is_empty() {
            let missing_counters: Vec<Counter> =
                missing.iter().map(|&i| counters[i].clone()).collect();
            let fetched = self
                .async_redis_storage
                .values_and_window_ttls(&missing_counters)
                .await?;
            for (&i, (value, ttl)) in missing.iter().zip(fetched) {
                let counter = &mut counters[i];
                if first_limited.is_none()
                    && counter
                        .max_value()
                        .checked_sub(value.saturating_add(delta))
                        .is_none()
                {
                    first_limited = Some(Authorization::Limited(
                        counter.limit().name().map(|n| n.to_owned()),
                    ));
                }
                counter.set_remaining(counter.max_value().saturating_sub(value));
                let ttl = if ttl.is_zero() { counter.window() } else { ttl };
                counter.set_expires_in(ttl);
            }
        }

        Ok(first_limited.unwrap_or(Authorization::Ok))
    }

    /// Determine whether `delta` more would keep every counter within its limit, annotating each
    /// with its `remaining`/`expires_in`. Cache hits are served from the local cache; a cache miss
    /// is assumed to be a fresh (`0`) counter without reading Redis. This trades accuracy for
    /// speed: an uncached counter that is actually over its limit elsewhere is admitted until the
    /// local cache learns its value. Synchronous - never touches Redis - and never mutates the
    /// cache.
    fn check_assuming_fresh_misses(&self, counters: &mut [Counter], delta: u64) -> Authorization {
        let (mut first_limited, missing) = self.annotate_cached(counters, delta);

        for &i in &missing {
            let counter = &mut counters[i];
            if first_limited.is_none() && counter.max_value().checked_sub(delta).is_none() {
                first_limited = Some(Authorization::Limited(
                    counter.limit().name().map(|n| n.to_owned()),
                ));
            }
            counter.set_remaining(counter.max_value());
            counter.set_expires_in(counter.window());
        }

        first_limited.unwrap_or(Authorization::Ok)
    }

    pub async fn new(redis_url: &str) -> Result<Self, RedisError> {
        Self::new_with_options(
            redis_url,
            DEFAULT_BATCH_SIZE,
            Duration::from_secs(DEFAULT_FLUSHING_PERIOD_SEC),
            DEFAULT_MAX_CACHED_COUNTERS,
            Duration::from_millis(DEFAULT_RESPONSE_TIMEOUT_MS),
        )
        .await
    }

    async fn new_with_options(
        redis_url: &str,
        batch_size: usize,
        flushing_period: Duration,
        max_cached_counters: usize,
        response_timeout: Duration,
    ) -> Result<Self, RedisError> {
        let info = ConnectionInfo::from_str(redis_url)?;
        let redis_conn_manager = ConnectionManager::new_with_config(
            redis::Client::open(info)
                .expect("This couldn't fail in the past, yet now it did somehow!"),
            ConnectionManagerConfig::default()
                .set_connection_timeout((response_timeout * 3) + Duration::from_millis(50))
                .set_response_timeout(response_timeout)
                .set_number_of_retries(1),
        )
        .await?;

        let cached_counters = CountersCacheBuilder::new()
            .max_cached_counters(max_cached_counters)
            .build(flushing_period);

        let counters_cache = Arc::new(cached_counters);
        let partitioned = Arc::new(AtomicBool::new(false));
        let async_redis_storage =
            AsyncRedisStorage::new_with_conn_manager(redis_conn_manager.clone()).await?;

        {
            let counters_cache_clone = counters_cache.clone();
            let conn = redis_conn_manager.clone();
            let p = Arc::clone(&partitioned);
            tokio::spawn(async move {
                loop {
                    flush_batcher_and_update_counters(
                        conn.clone(),
                        counters_cache_clone.clone(),
                        p.clone(),
                        batch_size,
                    )
                    .await;
                }
            });
        }

        async_redis_storage
            .load_script(BATCH_UPDATE_COUNTERS)
            .await?;

        Ok(Self {
            cached_counters: counters_cache,
            async_redis_storage,
            reservations: LocalReservationRegistry::new(max_cached_counters as u64),
        })
    }
}

fn flip_partitioned(storage: &AtomicBool, partition: bool) -> bool {
    let we_flipped = storage
        .compare_exchange(!partition, partition, Ordering::Release, Ordering::Acquire)
        .is_ok();
    if we_flipped {
        if partition {
            gauge!("datastore_partitioned").set(1);
            error!("Partition to Redis detected!")
        } else {
            gauge!("datastore_partitioned").set(0);
            warn!("Partition to Redis resolved!");
        }
    }
    we_flipped
}

pub struct CachedRedisStorageBuilder {
    redis_url: String,
    batch_size: usize,
    flushing_period: Duration,
    max_cached_counters: usize,
    response_timeout: Duration,
}

impl CachedRedisStorageBuilder {
    pub fn new(redis_url: &str) -> Self {
        Self {
            redis_url: redis_url.to_string(),
            batch_size: DEFAULT_BATCH_SIZE,
            flushing_period: Duration::from_secs(DEFAULT_FLUSHING_PERIOD_SEC),
            max_cached_counters: DEFAULT_MAX_CACHED_COUNTERS,
            response_timeout: Duration::from_millis(DEFAULT_RESPONSE_TIMEOUT_MS),
        }
    }

    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    pub fn flushing_period(mut self, flushing_period: Duration) -> Self {
        self.flushing_period = flushing_period;
        self
    }

    pub fn max_cached_counters(mut self, max_cached_counters: usize) -> Self {
        self.max_cached_counters = max_cached_counters;
        self
    }

    pub fn response_timeout(mut self, response_timeout: Duration) -> Self {
        self.response_timeout = response_timeout;
        self
    }

    pub async fn build(self) -> Result<CachedRedisStorage, RedisError> {
        CachedRedisStorage::new_with_options(
            &self.redis_url,
            self.batch_size,
            self.flushing_period,
            self.max_cached_counters,
            self.response_timeout,
        )
        .await
    }
}

async fn update_counters<C: ConnectionLike>(
    redis_conn: &mut C,
    counters_and_deltas: HashMap<Counter, Arc<CachedCounterValue>>,
) -> Result<Vec<(Counter, u64, u64, SystemTime)>, (Vec<(Counter, u64, u64, SystemTime)>, StorageErr)>
{
    let redis_script = redis::Script::new(BATCH_UPDATE_COUNTERS);
    let mut script_invocation = redis_script.prepare_invoke();

    let res = if counters_and_deltas.is_empty() {
        Default::default()
    } else {
        let mut res: Vec<(Counter, u64, u64, SystemTime)> =
            Vec::with_capacity(counters_and_deltas.len());

        for (counter, value) in counters_and_deltas {
            let (delta, last_value_from_redis) = value
                .pending_writes_and_value()
                .expect("State machine is wrong!");
            if delta > 0 {
                script_invocation.key(key_for_counter(&counter));
                script_invocation.key(key_for_counters_of_limit(counter.limit()));
                script_invocation.arg(counter.window().as_secs());
                script_invocation.arg(delta);
                // We need to store the counter in the actual order we are sending it to the script
                res.push((counter, last_value_from_redis, delta, UNIX_EPOCH));
            }
        }

        // The redis crate is not working with tables, thus the response will be a Vec of counter values
        let script_res: Vec<i64> = match script_invocation
            .invoke_async(redis_conn)
            .instrument(info_span!("datastore"))
            .await
        {
            Ok(res) => res,
            Err(err) => {
                return Err((res, err.into()));
            }
        };

        // We need to update the values and ttls returned by redis
        let counters_range = 0..res.len();
        let script_res_range = (0..script_res.len()).step_by(2);

        for (i, j) in counters_range.zip(script_res_range) {
            let (_, val, delta, expires_at) = &mut res[i];
            *delta = u64::try_from(script_res[j])
                .unwrap_or(0)
                .saturating_sub(*val); // new value - previous one = remote writes
            *val = u64::try_from(script_res[j]).unwrap_or(0); // update to value to newest
            *expires_at =
                UNIX_EPOCH + Duration::from_millis(u64::try_from(script_res[j + 1]).unwrap_or(0));
        }
        res
    };

    Ok(res)
}

#[allow(unknown_lints, clippy::manual_inspect)]
#[tracing::instrument(skip_all)]
async fn flush_batcher_and_update_counters<C: ConnectionLike>(
    mut redis_conn: C,
    cached_counters: Arc<CountersCache>,
    partitioned: Arc<AtomicBool>,
    batch_size: usize,
) {
    let updated_counters = cached_counters
        .batcher()
        .consume(batch_size, |counters| {
            if !counters.is_empty() && !partitioned.load(Ordering::Acquire) {
                info!("Flushing {} counter updates", counters.len());
            }
            update_counters(&mut redis_conn, counters)
        })
        .await
        .map(|result| {
            flip_partitioned(&partitioned, false);
            result
        })
        .or_else(|(data, err)| {
            if err.is_transient() {
                let new_partition = flip_partitioned(&partitioned, true);
                if new_partition {
                    warn!("Error flushing {}", err);
                }
                let counters = data.len();
                let mut reverted = 0;
                for (counter, old_value, pending_writes, _) in data {
                    if cached_counters
                        .return_pending_writes(&counter, old_value, pending_writes)
                        .is_err()
                    {
                        error!("Couldn't revert writes back to {:?}", &counter);
                    } else {
                        reverted += 1;
                    }
                }
                if new_partition {
                    warn!("Reverted {} of {} counter increments", reverted, counters);
                }
                Ok(Vec::new())
            } else {
                Err(err)
            }
        })
        .expect("Unrecoverable Redis error!");

    for (counter, new_value, remote_deltas, ttl) in updated_counters {
        cached_counters.apply_remote_delta(counter, new_value, remote_deltas, ttl);
    }
}

#[cfg(test)]
mod tests {
    use crate::counter::Counter;
    use crate::limit::{Context, Expression, Limit};
    use crate::reservation::ReservationId;
    use crate::storage::keys::{key_for_counter, key_for_counters_of_limit};
    use crate::storage::redis::counters_cache::{
        CachedCounterValue, CountersCache, CountersCacheBuilder,
    };
    use crate::storage::redis::redis_cached::{flush_batcher_and_update_counters, update_counters};
    use crate::storage::redis::{AsyncRedisStorage, CachedRedisStorage, CachedRedisStorageBuilder};
    use crate::storage::{AsyncCounterStorage, Authorization};
    use redis::{Cmd, ErrorKind, RedisError, Value};
    use redis_test::{MockCmd, MockRedisConnection};
    use serial_test::serial;
    use std::collections::{HashMap, HashSet};
    use std::io;
    use std::ops::Add;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    fn counter(namespace: &str, max_value: u64) -> Counter {
        let limit = Limit::new(
            namespace,
            max_value,
            60,
            vec![],
            Vec::<Expression>::default(),
        );
        Counter::new(limit, &Context::default())
            .unwrap()
            .expect("must have a counter")
    }

    #[tokio::test]
    async fn errs_on_bad_url() {
        let result = CachedRedisStorage::new("cassandra://127.0.0.1:6379").await;
        assert!(result.is_err());
        assert_eq!(result.err().unwrap().kind(), ErrorKind::InvalidClientConfig);
    }

    #[tokio::test]
    async fn errs_on_connection_issue() {
        let result = CachedRedisStorage::new("redis://127.0.0.1:21").await;
        assert!(result.is_err());
        let error = result.err().unwrap();
        assert_eq!(error.kind(), ErrorKind::IoError);
        assert!(error.is_connection_refusal())
    }

    #[tokio::test]
    async fn batch_update_counters() {
        const NEW_VALUE_FROM_REDIS: u64 = 10;
        const INITIAL_VALUE_FROM_REDIS: u64 = 1;
        const LOCAL_INCREMENTS: u64 = 2;

        let mut counters_and_deltas = HashMap::new();
        let map = HashMap::from([("app_id".to_string(), "foo".to_string())]);
        let ctx = map.into();
        let counter = Counter::new(
            Limit::new(
                "test_namespace",
                10,
                60,
                vec!["req_method == 'GET'".try_into().expect("failed parsing!")],
                vec!["app_id".try_into().expect("failed parsing!")],
            ),
            &ctx,
        )
        .expect("counter creation failed!")
        .expect("must have a counter");

        let arc = Arc::new(CachedCounterValue::from_authority(
            &counter,
            INITIAL_VALUE_FROM_REDIS,
        ));
        arc.delta(&counter, LOCAL_INCREMENTS);
        counters_and_deltas.insert(counter.clone(), arc);

        let one_sec_from_now = SystemTime::now().add(Duration::from_secs(1));
        let mock_response = Value::Array(vec![
            Value::Int(NEW_VALUE_FROM_REDIS as i64),
            Value::Int(
                one_sec_from_now
                    .duration_since(UNIX_EPOCH)
                    .unwrap()
                    .as_millis() as i64,
            ),
        ]);

        let mut mock_client = MockRedisConnection::new(vec![MockCmd::new(
            redis::cmd("EVALSHA")
                .arg("4ea27f5b6faf30153f9e26e4d685d40435f3cc1d")
                .arg("2")
                .arg(key_for_counter(&counter))
                .arg(key_for_counters_of_limit(counter.limit()))
                .arg(60)
                .arg(LOCAL_INCREMENTS),
            Ok(mock_response),
        )]);

        let mut result = update_counters(&mut mock_client, counters_and_deltas)
            .await
            .unwrap();

        let (c, new_value, remote_increments, expire_at) = result.remove(0);
        assert_eq!(key_for_counter(&counter), key_for_counter(&c));
        assert_eq!(NEW_VALUE_FROM_REDIS, new_value);
        assert_eq!(
            NEW_VALUE_FROM_REDIS - INITIAL_VALUE_FROM_REDIS - LOCAL_INCREMENTS,
            remote_increments
        );
        assert_eq!(
            one_sec_from_now
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_millis(),
            expire_at.duration_since(UNIX_EPOCH).unwrap().as_millis()
        );
    }

    #[tokio::test]
    async fn flush_batcher_and_update_counters_test() {
        let map = HashMap::from([("app_id".to_string(), "foo".to_string())]);
        let ctx = map.into();
        let counter = Counter::new(
            Limit::new(
                "test_namespace",
                10,
                60,
                vec!["req_method == 'POST'".try_into().expect("failed parsing!")],
                vec!["app_id".try_into().expect("failed parsing!")],
            ),
            &ctx,
        )
        .expect("counter creation failed!")
        .expect("must have a counter");

        let mock_response = Value::Array(vec![
            Value::Int(8),
            Value::Int(
                SystemTime::now()
                    .add(Duration::from_secs(1))
                    .duration_since(UNIX_EPOCH)
                    .unwrap()
                    .as_millis() as i64,
            ),
        ]);

        let mock_client = MockRedisConnection::new(vec![MockCmd::new(
            redis::cmd("EVALSHA")
                .arg("4ea27f5b6faf30153f9e26e4d685d40435f3cc1d")
                .arg("2")
                .arg(key_for_counter(&counter))
                .arg(key_for_counters_of_limit(counter.limit()))
                .arg(60)
                .arg(2),
            Ok(mock_response),
        )]);

        let cache = CountersCacheBuilder::new().build(Duration::from_millis(10));
        cache
            .batcher()
            .add(
                counter.clone(),
                Arc::new(CachedCounterValue::load_from_authority_asap(&counter, 2)),
            )
            .await;

        let cached_counters: Arc<CountersCache> = Arc::new(cache);
        let partitioned = Arc::new(AtomicBool::new(false));

        if let Some(c) = cached_counters.get(&counter) {
            assert_eq!(c.hits(&counter), 2);
        }

        flush_batcher_and_update_counters(mock_client, cached_counters.clone(), partitioned, 100)
            .await;

        let c = cached_counters.get(&counter).unwrap();
        assert_eq!(c.hits(&counter), 8);
        assert_eq!(c.pending_writes(), Ok(0));
    }

    #[tokio::test]
    async fn flush_batcher_reverts_on_err() {
        let map = HashMap::from([("app_id".to_string(), "foo".to_string())]);
        let ctx = map.into();
        let counter = Counter::new(
            Limit::new(
                "test_namespace",
                10,
                60,
                vec!["req_method == 'POST'".try_into().expect("failed parsing!")],
                vec!["app_id".try_into().expect("failed parsing!")],
            ),
            &ctx,
        )
        .expect("counter creation failed!")
        .expect("must have a counter");

        let error: RedisError = io::Error::new(io::ErrorKind::TimedOut, "That was long!").into();
        assert!(error.is_timeout());
        let mock_client = MockRedisConnection::new(vec![MockCmd::new::<&mut Cmd, Value>(
            redis::cmd("EVALSHA")
                .arg("4ea27f5b6faf30153f9e26e4d685d40435f3cc1d")
                .arg("2")
                .arg(key_for_counter(&counter))
                .arg(key_for_counters_of_limit(counter.limit()))
                .arg(60)
                .arg(3),
            Err(error),
        )]);

        let cache = CountersCacheBuilder::new().build(Duration::from_millis(10));
        let value = Arc::new(CachedCounterValue::from_authority(&counter, 2));
        value.delta(&counter, 3);
        cache.batcher().add(counter.clone(), value).await;

        let cached_counters: Arc<CountersCache> = Arc::new(cache);
        let partitioned = Arc::new(AtomicBool::new(false));

        if let Some(c) = cached_counters.get(&counter) {
            assert_eq!(c.hits(&counter), 5);
        }

        flush_batcher_and_update_counters(mock_client, cached_counters.clone(), partitioned, 100)
            .await;

        let c = cached_counters.get(&counter).unwrap();
        assert_eq!(c.hits(&counter), 5);
        assert_eq!(c.pending_writes(), Ok(3));
    }

    // Regression test: `update_counter` (Report/Commit's path) must be visible to `check`/
    // `is_within_limits` on this same instance immediately, without waiting for the
    // background flush to Redis. Both sides must go through `cached_counters` - if
    // `update_counter` ever went back to writing straight to Redis while `check` reads the
    // local cache (or vice versa), this instance would give wrong admission decisions for
    // counters it had itself just reported usage against.
    #[tokio::test]
    #[serial]
    async fn update_counter_is_immediately_visible_to_check_and_is_within_limits() {
        let storage = CachedRedisStorage::new("redis://127.0.0.1:6379")
            .await
            .unwrap();
        let mut counters = vec![counter("cached_update_counter_visibility_test", 10)];

        assert!(
            matches!(
                storage.check(&mut counters, 0).await.unwrap(),
                Authorization::Ok
            ),
            "a fresh counter must be within limits"
        );

        storage.update_counter(&counters[0], 7).await.unwrap();

        // 7 (just reported) + 4 > 10 (max_value): only detectable if `check` observes the
        // `update_counter` call above without any wait for a background flush to Redis.
        assert!(
            matches!(
                storage.check(&mut counters, 4).await.unwrap(),
                Authorization::Limited(_)
            ),
            "check must immediately see usage reported via update_counter"
        );
        assert!(
            !storage.is_within_limits(&counters[0], 4).await.unwrap(),
            "is_within_limits must immediately see usage reported via update_counter"
        );
    }

    // Regression test: on a cache miss, a read-only `check` must read the authoritative value
    // from Redis rather than assuming a fresh (0) counter. A cold instance (one that never wrote
    // this counter itself) would otherwise keep admitting a counter other instances have already
    // exhausted in Redis - `check` never writes, so nothing would ever warm its local cache.
    #[tokio::test]
    #[serial]
    async fn check_reads_authoritative_value_on_cache_miss() {
        // Another instance exhausts the counter directly in Redis.
        let authority = AsyncRedisStorage::new("redis://127.0.0.1:6379")
            .await
            .unwrap();
        let seed = counter("cached_check_cold_miss_test", 10);
        authority.update_counter(&seed, 10).await.unwrap();

        // A brand-new instance has never cached this counter: its `check` must still observe the
        // exhausted Redis value.
        let cold = CachedRedisStorage::new("redis://127.0.0.1:6379")
            .await
            .unwrap();
        let mut counters = vec![counter("cached_check_cold_miss_test", 10)];
        assert!(
            matches!(
                cold.check(&mut counters, 1).await.unwrap(),
                Authorization::Limited(_)
            ),
            "a cold check must read the exhausted counter from Redis, not assume 0"
        );
        assert_eq!(
            counters[0].remaining(),
            Some(0),
            "remaining must reflect the authoritative Redis value on a cache miss"
        );
    }

    // Regression test: unlike the read-only `check`, `check_and_update` must NOT read Redis on a
    // cache miss - the enforcing path stays off Redis on the hot path and self-corrects via the
    // local write + next flush. A cold instance therefore admits a counter that is already
    // exhausted elsewhere in Redis (accuracy-for-speed), rather than blocking on a Redis round trip.
    #[tokio::test]
    #[serial]
    async fn check_and_update_assumes_fresh_on_cache_miss() {
        // Another instance exhausts the counter directly in Redis.
        let authority = AsyncRedisStorage::new("redis://127.0.0.1:6379")
            .await
            .unwrap();
        let seed = counter("cached_check_and_update_cold_miss_test", 10);
        authority.update_counter(&seed, 10).await.unwrap();

        // A brand-new instance has never cached this counter. `check_and_update` assumes a fresh
        // counter on the miss and admits, without reading the exhausted Redis value.
        let cold = CachedRedisStorage::new("redis://127.0.0.1:6379")
            .await
            .unwrap();
        let mut counters = vec![counter("cached_check_and_update_cold_miss_test", 10)];
        assert!(
            matches!(
                cold.check_and_update(&mut counters, 1).await.unwrap(),
                Authorization::Ok
            ),
            "a cold check_and_update must assume a fresh counter on a miss, not read Redis"
        );
    }

    // Cross-instance regression test: usage Reported through one cached instance (local cache +
    // background flush to Redis) must become visible to a *different*, cold instance's read-only
    // check, which now reads Redis on a cache miss. Exercises the full Report -> cache -> flush ->
    // Redis -> cold check path - both `Report` and `Check` previously went straight to Redis.
    #[tokio::test]
    #[serial]
    async fn report_on_one_instance_is_visible_to_check_on_another() {
        let limit = Arc::new(Limit::new(
            "cached_cross_instance_report_test",
            10,
            60,
            vec![],
            Vec::<Expression>::default(),
        ));
        let seed = Counter::new((*limit).clone(), &Context::default())
            .unwrap()
            .expect("must have a counter");

        // Reporting instance flushes to Redis quickly.
        let reporter = CachedRedisStorageBuilder::new("redis://127.0.0.1:6379")
            .flushing_period(Duration::from_millis(10))
            .build()
            .await
            .unwrap();
        // Start from a clean counter so `remaining` is deterministic across reruns.
        reporter
            .delete_counters(&HashSet::from([limit.clone()]))
            .await
            .unwrap();
        reporter.update_counter(&seed, 7).await.unwrap();

        // Let the reporter's background flush push the usage to Redis.
        tokio::time::sleep(Duration::from_millis(500)).await;

        // A different instance that never cached this counter must observe the reported usage,
        // both in its admission decision and in the `remaining` it reports.
        let other = CachedRedisStorage::new("redis://127.0.0.1:6379")
            .await
            .unwrap();
        let mut counters = vec![Counter::new((*limit).clone(), &Context::default())
            .unwrap()
            .expect("must have a counter")];
        assert!(
            matches!(
                other.check(&mut counters, 1).await.unwrap(),
                Authorization::Ok
            ),
            "1 more is within the limit of 10 with 7 already used on another instance"
        );
        assert_eq!(
            counters[0].remaining(),
            Some(3),
            "a cold instance's check must see the 7 reported by another instance (10 - 7)"
        );
        assert!(
            matches!(
                other.check(&mut counters, 4).await.unwrap(),
                Authorization::Limited(_)
            ),
            "7 (reported elsewhere) + 4 exceeds the limit of 10"
        );
    }

    #[tokio::test]
    #[serial]
    async fn reserve_with_hold_amount_zero_creates_no_entry() {
        let storage = CachedRedisStorage::new("redis://127.0.0.1:6379")
            .await
            .unwrap();
        let mut counters = vec![counter("cached_reserve_hold_zero_test", 10)];
        let reservation_id = ReservationId::new();

        let auth = storage
            .reserve(
                &mut counters,
                &reservation_id,
                10,
                0,
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        assert!(matches!(auth, Authorization::Ok));

        let released = storage
            .release_reservation(&counters, &reservation_id)
            .await
            .unwrap();
        assert!(!released, "nothing should have been held to release");
    }
}
