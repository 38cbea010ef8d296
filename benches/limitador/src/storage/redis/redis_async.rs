extern crate redis;

use self::redis::aio::ConnectionManager;
use self::redis::ConnectionInfo;
use crate::counter::Counter;
use crate::limit::Limit;
use crate::reservation::ReservationId;
use crate::storage::keys::*;
use crate::storage::redis::is_limited;
use crate::storage::redis::scripts::{SCRIPT_RESERVE, SCRIPT_UPDATE_COUNTER, VALUES_AND_TTLS};
use crate::storage::{AsyncCounterStorage, Authorization, StorageErr};
use async_trait::async_trait;
use redis::{AsyncCommands, ErrorKind, RedisError};
use std::collections::HashSet;
use std::ops::Deref;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tracing::{info_span, Instrument};

// Note: this implementation does not guarantee exact limits. Ensuring that we
// never go over the limits would hurt performance. This implementation
// sacrifices a bit of accuracy to be more performant.

// TODO: the code of this implementation is almost identical to the blocking
// one. The only exception is that the functions defined are "async" and all the
// calls to the client need to include ".await". We'll need to think about how
// to remove this duplication.

#[derive(Clone)]
pub struct AsyncRedisStorage {
    conn_manager: ConnectionManager,
}

#[async_trait]
impl AsyncCounterStorage for AsyncRedisStorage {
    #[tracing::instrument(skip_all)]
    async fn is_within_limits(&self, counter: &Counter, delta: u64) -> Result<bool, StorageErr> {
        let mut con = self.conn_manager.clone();

        match con
            .get::<Vec<u8>, Option<i64>>(key_for_counter(counter))
            .instrument(info_span!("datastore"))
            .await?
        {
            Some(val) => {
                Ok(u64::try_from(val).unwrap_or(0).saturating_add(delta) <= counter.max_value())
            }
            None => Ok(counter.max_value().checked_sub(delta).is_some()),
        }
    }

    #[tracing::instrument(skip_all)]
    async fn update_counter(&self, counter: &Counter, delta: u64) -> Result<(), StorageErr> {
        let mut con = self.conn_manager.clone();

        redis::Script::new(SCRIPT_UPDATE_COUNTER)
            .key(key_for_counter(counter))
            .key(key_for_counters_of_limit(counter.limit()))
            .arg(counter.window().as_secs())
            .arg(delta)
            .invoke_async::<()>(&mut con)
            .instrument(info_span!("datastore"))
            .await?;

        Ok(())
    }

    #[tracing::instrument(skip_all)]
    async fn check<'a>(
        &self,
        counters: &mut Vec<Counter>,
        delta: u64,
    ) -> Result<Authorization, StorageErr> {
        Ok(self
            .evaluate(counters, delta)
            .await?
            .unwrap_or(Authorization::Ok))
    }

    #[tracing::instrument(skip_all)]
    async fn check_and_update<'a>(
        &self,
        counters: &mut Vec<Counter>,
        delta: u64,
    ) -> Result<Authorization, StorageErr> {
        let mut con = self.conn_manager.clone();
        let counter_keys: Vec<Vec<u8>> = counters.iter().map(key_for_counter).collect();

        if let Some(res) = self.evaluate(counters, delta).await? {
            return Ok(res);
        }

        let script = redis::Script::new(SCRIPT_UPDATE_COUNTER);
        let mut pipeline = redis::pipe();
        let mut pipeline = &mut pipeline;
        for (counter_idx, key) in counter_keys.iter().enumerate() {
            let counter = &counters[counter_idx];
            pipeline = pipeline
                .invoke_script(
                    script
                        .key(key)
                        .key(key_for_counters_of_limit(counter.limit()))
                        .arg(counter.window().as_secs())
                        .arg(delta),
                )
                .ignore()
        }
        if let Err(err) = pipeline
            .query_async::<()>(&mut con)
            .instrument(info_span!("datastore"))
            .await
        {
            if err.kind() == ErrorKind::NoScriptError {
                script.prepare_invoke().load_async(&mut con).await?;
                pipeline
                    .query_async::<()>(&mut con)
                    .instrument(info_span!("datastore"))
                    .await?;
            } else {
                Err(err)?;
            }
        }

        Ok(Authorization::Ok)
    }

    #[tracing::instrument(skip_all)]
    async fn get_counters(
        &self,
        limits: &HashSet<Arc<Limit>>,
    ) -> Result<HashSet<Counter>, StorageErr> {
        let mut res = HashSet::new();

        let mut con = self.conn_manager.clone();

        for limit in limits {
            let counter_keys = {
                con.smembers::<Vec<u8>, HashSet<Vec<u8>>>(key_for_counters_of_limit(limit))
                    .instrument(info_span!("datastore"))
                    .await?
            };

            for counter_key in counter_keys {
                let mut counter: Counter =
                    counter_from_counter_key(&counter_key, Arc::clone(limit));

                // If the key does not exist, it means that the counter expired,
                // so we don't have to return it.
                // TODO: we should delete the counter from the set of counters
                // associated with the limit taking into account that we should
                // do the "get" + "delete if none" atomically.
                // This does not cause any bugs, but consumes memory
                // unnecessarily.
                let option = {
                    con.get::<Vec<u8>, Option<i64>>(counter_key.clone())
                        .instrument(info_span!("datastore"))
                        .await?
                };
                if let Some(val) = option {
                    counter.set_remaining(
                        limit
                            .max_value()
                            .saturating_sub(u64::try_from(val).unwrap_or(0)),
                    );
                    let ttl: i64 = {
                        con.ttl(&counter_key)
                            .instrument(info_span!("datastore"))
                            .await?
                    };
                    counter.set_expires_in(Duration::from_secs(u64::try_from(ttl).unwrap_or(0)));

                    res.insert(counter);
                }
            }
        }

        Ok(res)
    }

    #[tracing::instrument(skip_all)]
    async fn delete_counters(&self, limits: &HashSet<Arc<Limit>>) -> Result<(), StorageErr> {
        for limit in limits {
            self.delete_counters_associated_with_limit(limit.deref())
                .instrument(info_span!("datastore"))
                .await?
        }
        Ok(())
    }

    #[tracing::instrument(skip_all)]
    async fn clear(&self) -> Result<(), StorageErr> {
        let mut con = self.conn_manager.clone();
        redis::cmd("FLUSHDB")
            .query_async::<()>(&mut con)
            .instrument(info_span!("datastore"))
            .await?;
        Ok(())
    }

    #[tracing::instrument(skip_all)]
    async fn reserve(
        &self,
        counters: &mut Vec<Counter>,
        reservation_id: &ReservationId,
        check_amount: u64,
        hold_amount: u64,
        ttl: Duration,
    ) -> Result<Authorization, StorageErr> {
        debug_assert!(hold_amount <= check_amount);

        let mut con = self.conn_manager.clone();

        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;

        let script = redis::Script::new(SCRIPT_RESERVE);
        let mut invocation = script.prepare_invoke();
        for counter in counters.iter() {
            invocation.key(key_for_counter(counter));
            invocation.key(key_for_reservations(counter));
            invocation.key(key_for_counters_of_limit(counter.limit()));
        }
        for counter in counters.iter() {
            invocation.arg(counter.window().as_secs());
            invocation.arg(counter.max_value());
        }
        invocation
            .arg(check_amount)
            .arg(hold_amount)
            .arg(ttl.as_millis() as i64)
            .arg(reservation_id.as_str())
            .arg(now_ms);

        let raw: Vec<i64> = invocation
            .invoke_async(&mut con)
            .instrument(info_span!("datastore"))
            .await?;
        let admitted = raw.last().copied().unwrap_or(0) == 1;

        let mut first_limited = None;
        for (i, counter) in counters.iter_mut().enumerate() {
            let value = raw[i * 3].max(0) as u64;
            let outstanding = raw[i * 3 + 1].max(0) as u64;
            let window_ttl_ms = raw[i * 3 + 2].max(0) as u64;
            // Admission is checked against `check_amount` (the raw, requested amount - see
            // `RateLimiter::reserve`'s doc comment), but `remaining` must reflect what's
            // actually held going forward, which is `hold_amount` - otherwise it understates
            // capacity whenever policy clamps the hold below what was requested. When denied,
            // `SCRIPT_RESERVE` never persists `hold_amount`, so it must be excluded here too.
            let total = value + outstanding + check_amount;
            let granted_hold = if admitted { hold_amount } else { 0 };

            let remaining = counter
                .max_value()
                .checked_sub(value + outstanding + granted_hold);
            counter.set_remaining(remaining.unwrap_or_default());
            counter.set_expires_in(Duration::from_millis(window_ttl_ms));
            if first_limited.is_none() && total > counter.max_value() {
                first_limited = Some(counter.limit().name().map(|n| n.to_owned()));
            }
        }

        if admitted {
            Ok(Authorization::Ok)
        } else {
            Ok(Authorization::Limited(first_limited.unwrap_or(None)))
        }
    }

    #[tracing::instrument(skip_all)]
    async fn release_reservation(
        &self,
        counters: &[Counter],
        reservation_id: &ReservationId,
    ) -> Result<bool, StorageErr> {
        if counters.is_empty() {
            return Ok(false);
        }

        let mut con = self.conn_manager.clone();

        let mut pipeline = redis::pipe();
        for counter in counters {
            pipeline.hdel(key_for_reservations(counter), reservation_id.as_str());
        }

        let removed: Vec<i64> = pipeline
            .query_async(&mut con)
            .instrument(info_span!("datastore"))
            .await?;

        Ok(removed.into_iter().any(|removed| removed > 0))
    }
}

impl AsyncRedisStorage {
    /// Shared by [`AsyncCounterStorage::check`] and [`AsyncCounterStorage::check_and_update`]:
    /// reads every counter's current value and ttl in one round trip (`VALUES_AND_TTLS` is a
    /// read-only `GET`+`PTTL` per key), annotating each with its `remaining`/`expires_in`, and
    /// returns the first counter found over its limit, if any. Never mutates any stored value.
    async fn evaluate(
        &self,
        counters: &mut [Counter],
        delta: u64,
    ) -> Result<Option<Authorization>, StorageErr> {
        let mut con = self.conn_manager.clone();
        let counter_keys: Vec<Vec<u8>> = counters.iter().map(key_for_counter).collect();

        let script = redis::Script::new(VALUES_AND_TTLS);
        let mut script_invocation = script.prepare_invoke();
        for counter_key in &counter_keys {
            script_invocation.key(counter_key);
        }

        let script_res: Vec<Option<i64>> = script_invocation
            .invoke_async(&mut con)
            .instrument(info_span!("datastore"))
            .await?;

        Ok(is_limited(counters, delta, script_res))
    }

    pub async fn new(redis_url: &str) -> Result<Self, RedisError> {
        let info = ConnectionInfo::from_str(redis_url)?;
        Self::new_with_conn_manager(
            ConnectionManager::new(
                redis::Client::open(info)
                    .expect("This couldn't fail in the past, yet now it did somehow!"),
            )
            .await?,
        )
        .await
    }

    pub async fn new_with_conn_manager(
        conn_manager: ConnectionManager,
    ) -> Result<Self, RedisError> {
        let store = Self { conn_manager };
        store.load_script(SCRIPT_UPDATE_COUNTER).await?;
        store.load_script(VALUES_AND_TTLS).await?;
        store.load_script(SCRIPT_RESERVE).await?;
        Ok(store)
    }

    async fn delete_counters_associated_with_limit(&self, limit: &Limit) -> Result<(), StorageErr> {
        let mut con = self.conn_manager.clone();

        let counter_keys = {
            con.smembers::<Vec<u8>, HashSet<Vec<u8>>>(key_for_counters_of_limit(limit))
                .instrument(info_span!("datastore"))
                .await?
        };

        for counter_key in counter_keys {
            con.del::<_, ()>(counter_key)
                .instrument(info_span!("datastore"))
                .await?;
        }

        con.del::<_, ()>(key_for_counters_of_limit(limit)).await?;

        Ok(())
    }

    pub(super) async fn load_script(&self, script: &str) -> Result<(), RedisError> {
        let mut con = self.conn_manager.clone();
        let script = redis::Script::new(script);
        script.prepare_invoke().load_async(&mut con).await?;
        Ok(())
    }

    // Used by `CachedRedisStorage::reserve` to prime its local cache on a miss with the real
    // value/ttl, the same way `check_and_update`'s own cache-miss path eventually reconciles
    // via `apply_remote_delta` - without this, a counter only ever touched through
    // Reserve/Commit would never get a cache entry at all, and `reserve` would always see it
    // as empty regardless of what's actually been committed to Redis.
    pub(super) async fn values_and_window_ttls(
        &self,
        counters: &[Counter],
    ) -> Result<Vec<(u64, Duration)>, StorageErr> {
        let mut con = self.conn_manager.clone();

        let script = redis::Script::new(VALUES_AND_TTLS);
        let mut invocation = script.prepare_invoke();
        for counter in counters {
            invocation.key(key_for_counter(counter));
        }

        let raw: Vec<Option<i64>> = invocation
            .invoke_async(&mut con)
            .instrument(info_span!("datastore"))
            .await?;

        Ok(counters
            .iter()
            .zip(raw.chunks(2))
            .map(|(counter, pair)| {
                let value = pair[0].unwrap_or(0).max(0) as u64;
                let ttl = match pair[1] {
                    Some(ms) if ms >= 0 => Duration::from_millis(ms as u64),
                    _ => counter.window(),
                };
                (value, ttl)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use crate::counter::Counter;
    use crate::limit::{Context, Expression, Limit};
    use crate::reservation::ReservationId;
    use crate::storage::keys::key_for_reservations;
    use crate::storage::redis::AsyncRedisStorage;
    use crate::storage::{AsyncCounterStorage, Authorization};
    use redis::ErrorKind;
    use serial_test::serial;
    use std::sync::Arc;
    use std::time::Duration;

    fn counter(namespace: &str, max_value: u64) -> Counter {
        let limit = Arc::new(Limit::new(
            namespace,
            max_value,
            60,
            vec![],
            Vec::<Expression>::default(),
        ));
        Counter::new(limit, &Context::default())
            .unwrap()
            .expect("must have a counter")
    }

    #[tokio::test]
    async fn errs_on_bad_url() {
        let result = AsyncRedisStorage::new("cassandra://127.0.0.1:6379").await;
        assert!(result.is_err());
        assert_eq!(result.err().unwrap().kind(), ErrorKind::InvalidClientConfig);
    }

    #[tokio::test]
    async fn errs_on_connection_issue() {
        let result = AsyncRedisStorage::new("redis://127.0.0.1:21").await;
        assert!(result.is_err());
        let error = result.err().unwrap();
        assert_eq!(error.kind(), ErrorKind::IoError);
        assert!(error.is_connection_refusal())
    }

    #[tokio::test]
    #[serial]
    async fn reserve_with_hold_amount_zero_creates_no_entry() {
        let storage = AsyncRedisStorage::new("redis://127.0.0.1:6379")
            .await
            .unwrap();
        storage.clear().await.unwrap();
        let mut counters = vec![counter("async_reserve_hold_zero_test", 10)];
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

        let mut con = storage.conn_manager.clone();
        let reservations_key = key_for_reservations(&counters[0]);
        let exists: bool = redis::cmd("EXISTS")
            .arg(&reservations_key)
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(!exists, "no reservation hash should have been written");

        let released = storage
            .release_reservation(&counters, &reservation_id)
            .await
            .unwrap();
        assert!(!released, "nothing should have been held to release");
    }

    #[tokio::test]
    #[serial]
    async fn reserve_with_check_amount_zero_creates_no_reservation_entry() {
        let storage = AsyncRedisStorage::new("redis://127.0.0.1:6379")
            .await
            .unwrap();
        storage.clear().await.unwrap();
        let mut counters = vec![counter("async_reserve_check_zero_test", 10)];
        let reservation_id = ReservationId::new();

        let auth = storage
            .reserve(
                &mut counters,
                &reservation_id,
                0,
                0,
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        assert!(matches!(auth, Authorization::Ok));

        let mut con = storage.conn_manager.clone();
        let reservations_key = key_for_reservations(&counters[0]);
        let exists: bool = redis::cmd("EXISTS")
            .arg(&reservations_key)
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(!exists, "no reservation hash should have been written");

        let released = storage
            .release_reservation(&counters, &reservation_id)
            .await
            .unwrap();
        assert!(!released, "nothing should have been held to release");
    }

    #[tokio::test]
    #[serial]
    async fn remaining_reflects_hold_amount_not_check_amount() {
        let storage = AsyncRedisStorage::new("redis://127.0.0.1:6379")
            .await
            .unwrap();
        storage.clear().await.unwrap();
        // max_value=1000, requesting/checking 500 but policy (e.g. max_fraction) clamps
        // the actual hold down to 100.
        let mut counters = vec![counter("async_remaining_reflects_hold_amount_test", 1000)];
        let reservation_id = ReservationId::new();

        let auth = storage
            .reserve(
                &mut counters,
                &reservation_id,
                500,
                100,
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        assert!(matches!(auth, Authorization::Ok));
        assert_eq!(
            counters[0].remaining(),
            Some(900),
            "remaining must reflect the 100 actually held, not the 500 that was checked"
        );

        // A second reservation for the remaining true capacity (900) must be admitted -
        // proving the backend's own admission math already agrees with `remaining`.
        let auth2 = storage
            .reserve(
                &mut counters,
                &ReservationId::new(),
                900,
                900,
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        assert!(matches!(auth2, Authorization::Ok));
    }
}
