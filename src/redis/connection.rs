//! Connections with a deadline on every call.

use core::time::Duration;

use ::redis::sentinel::SentinelClient;
use ::redis::{Client, Cmd, Connection, ConnectionLike, RedisResult, Value};

use super::RedisConfigError;

/// How long a call to Redis may take: to connect, and for each command's
/// reply (which bounds the write too).
///
/// The defaults, 50 ms to connect and 5 ms per reply, suit a Redis on the same
/// network; a slow link or a loaded server needs more. A decision that misses
/// its deadline is an error, so a dead Redis costs a request at most the
/// deadline, with these longer cases, all inside redis-rs:
///
/// - connecting a blocking connection to a Redis that accepts but does not
///   answer (a hung process) can take about twice the connect deadline:
///   redis-rs reads each reply of its connection set-up (`CLIENT SETINFO`)
///   against the connect deadline, then the call waits its response deadline;
/// - the first call of a script after Redis lost its scripts (a restart, a
///   `SCRIPT FLUSH`) makes three round trips (`EVALSHA`, `SCRIPT LOAD`,
///   `EVALSHA`), each with the response deadline;
/// - on a Redis Cluster a call redirected (`MOVED`, `ASK`: its slot moved or
///   is moving) is sent on to the node named, at most three times, each
///   round trip with the response deadline, and the connect deadline more
///   for a node connected anew; on the blocking cluster connection a `MOVED`
///   first refreshes the slot map, within the call: `CLUSTER SLOTS` to the
///   nodes in turn until one answers (a node that fails is passed over),
///   then redis-rs's check of each node connection it keeps, a `PING` each,
///   and a connection to each node new to it: a round trip per node, each
///   with its deadline (the asynchronous one refreshes its own way, in
///   redis-rs);
/// - a connection to the primary Sentinels name asks them for it each time
///   it connects, on redis-rs's own connections to the Sentinels, and
///   redis-rs checks the named primary's role (`ROLE`) on a connection of
///   its own: neither has a deadline, so Sentinels, or a primary, that
///   accept connections and then hang (a `SIGSTOP`) hold that connect.
///
/// None of these sends a call again after it may have run: a call that
/// failed after it was written (a timeout above all: Redis may only have
/// been slow) is returned as it failed, on every topology. Only `NOSCRIPT`
/// (the script was not loaded) and a cluster's redirections, which prove
/// that it did not run, are followed.
///
/// ```no_run
/// use std::time::Duration;
/// use turnstile::redis::Deadlines;
///
/// let client = redis::Client::open("redis://127.0.0.1/")?;
/// let deadlines = Deadlines::default().response(Duration::from_millis(20))?;
/// let mut con = deadlines.blocking(client);
/// # let _ = &mut con;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    connect: Duration,
    response: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            connect: Duration::from_millis(50),
            response: Duration::from_millis(5),
        }
    }
}

impl Deadlines {
    /// The shortest deadline, 1 µs: a zero deadline is refused by the
    /// sockets below redis-rs, so every call would fail.
    const MIN: Duration = Duration::from_micros(1);

    /// The same deadlines with `connect` to connect (at least 1 µs).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::redis::{Deadlines, RedisConfigError};
    ///
    /// let deadlines = Deadlines::default().connect(Duration::from_secs(1))?;
    /// assert_eq!(deadlines.connect_timeout(), Duration::from_secs(1));
    /// assert!(matches!(
    ///     Deadlines::default().connect(Duration::ZERO),
    ///     Err(RedisConfigError::DeadlineTooShort { what: "connect deadline", .. })
    /// ));
    /// # Ok::<(), RedisConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`RedisConfigError::DeadlineTooShort`] below 1 µs (zero included).
    pub fn connect(mut self, connect: Duration) -> Result<Self, RedisConfigError> {
        self.connect = at_least_min("connect deadline", connect)?;
        Ok(self)
    }

    /// The same deadlines with `response` for each reply (at least 1 µs).
    ///
    /// # Errors
    ///
    /// [`RedisConfigError::DeadlineTooShort`] below 1 µs (zero included).
    pub fn response(mut self, response: Duration) -> Result<Self, RedisConfigError> {
        self.response = at_least_min("response deadline", response)?;
        Ok(self)
    }

    /// The deadline to connect.
    pub fn connect_timeout(&self) -> Duration {
        self.connect
    }

    /// The deadline for each reply.
    pub fn response_timeout(&self) -> Duration {
        self.response
    }

    /// A blocking connection to `client`'s server with these deadlines. It
    /// connects on its first call, so this cannot fail.
    pub fn blocking(&self, client: Client) -> BlockingConnection {
        BlockingConnection {
            source: Source::Server(client),
            deadlines: *self,
            con: None,
        }
    }

    /// A blocking connection to the primary that `sentinel`'s Sentinels name
    /// (a [`SentinelClient`] built for `SentinelServerType::Master`), with
    /// these deadlines. It asks the Sentinels for the primary whenever it
    /// connects: on its first call, and on the call after one that failed on
    /// the connection or was refused by a primary demoted to replica
    /// (`READONLY`, after a failover). Asking the Sentinels, and redis-rs's
    /// check of the primary's role, have no deadline (see the type's
    /// documentation). Cannot fail: connecting happens on a call.
    ///
    /// ```no_run
    /// use redis::sentinel::{SentinelClient, SentinelServerType};
    /// use turnstile::redis::Deadlines;
    ///
    /// let sentinel = SentinelClient::build(
    ///     vec!["redis://127.0.0.1:26379/"],
    ///     "mymaster".to_owned(),
    ///     None,
    ///     SentinelServerType::Master,
    /// )?;
    /// let mut con = Deadlines::default().sentinel(sentinel);
    /// # let _ = &mut con;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sentinel(&self, sentinel: SentinelClient) -> BlockingConnection {
        BlockingConnection {
            source: Source::Sentinel(Box::new(sentinel)),
            deadlines: *self,
            con: None,
        }
    }

    /// A multiplexed tokio connection to `client`'s server with these
    /// deadlines (feature `tokio` too). It matches replies to requests itself,
    /// so a reply that arrives after its request timed out is dropped, never
    /// taken for the next one's; share it by cloning. It never connects
    /// again: once its server restarts, every call on it fails. For a
    /// connection kept for long (a refresher's, a layer's) use
    /// [`reconnecting`](Self::reconnecting).
    ///
    /// # Errors
    ///
    /// When the connection cannot be made within the connect deadline.
    #[cfg(feature = "tokio")]
    pub async fn multiplexed(
        &self,
        client: &Client,
    ) -> RedisResult<::redis::aio::MultiplexedConnection> {
        let config = ::redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect))
            .set_response_timeout(Some(self.response));
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// A shared asynchronous connection to `client`'s server with these
    /// deadlines that connects on its first call and again after a call
    /// found its connection dropped or ran past its deadline (feature `tokio`
    /// too): a multiplexed connection
    /// ([`multiplexed`](Self::multiplexed)) that survives a Redis restart.
    /// Clones share it. Cannot fail: connecting happens on a call, and a
    /// failure to connect is that call's error.
    #[cfg(feature = "tokio")]
    pub fn reconnecting(&self, client: Client) -> ReconnectingConnection {
        self.reconnecting_to(AsyncSource::Server(client))
    }

    /// [`reconnecting`](Self::reconnecting) to the primary that `sentinel`'s
    /// Sentinels name (feature `tokio` too): each attempt to connect asks
    /// them first, and a call refused by a primary demoted to replica
    /// (`READONLY`, after a failover) drops the connection too, so the next
    /// call finds the new primary. Asking the Sentinels has redis-rs's own
    /// timeouts, within the connect deadline of the calls that wait for it.
    #[cfg(feature = "tokio")]
    pub fn reconnecting_sentinel(&self, sentinel: SentinelClient) -> ReconnectingConnection {
        self.reconnecting_to(AsyncSource::Sentinel(tokio::sync::Mutex::new(sentinel)))
    }

    #[cfg(feature = "tokio")]
    fn reconnecting_to(&self, source: AsyncSource) -> ReconnectingConnection {
        ReconnectingConnection {
            shared: std::sync::Arc::new(Reconnect {
                source,
                deadlines: *self,
                connect_backoff: core::sync::atomic::AtomicU64::new(0),
                slot: std::sync::Mutex::new(Slot {
                    generation: 0,
                    con: None,
                    connecting: None,
                    down_until: None,
                }),
            }),
        }
    }
}

/// `value`, if it is at least [`Deadlines::MIN`].
fn at_least_min(what: &'static str, value: Duration) -> Result<Duration, RedisConfigError> {
    if value < Deadlines::MIN {
        return Err(RedisConfigError::DeadlineTooShort {
            what,
            value,
            min: Deadlines::MIN,
        });
    }
    Ok(value)
}

/// Whether a connection a call failed on with `e` is to be dropped: it
/// broke, or may have (an I/O error, a deadline passed: a reply may still be
/// in flight, or the peer gone without closing it), or redis-rs says it must
/// be replaced, or the server is no longer a primary (`READONLY`: a
/// Sentinel failover demoted it; a connection that asks the Sentinels again
/// finds the new one). Any other error reply from Redis keeps it.
pub(super) fn must_reconnect(e: &::redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
        || e.kind() == ::redis::ErrorKind::Server(::redis::ServerErrorKind::ReadOnly)
}

/// What a blocking connection connects to: one server, or the primary the
/// Sentinels name when it connects.
enum Source {
    Server(Client),
    Sentinel(Box<SentinelClient>),
}

impl Source {
    fn connect(&mut self, timeout: Duration) -> RedisResult<Connection> {
        match self {
            Source::Server(client) => client.get_connection_with_timeout(timeout),
            Source::Sentinel(sentinel) => {
                sentinel.get_client()?.get_connection_with_timeout(timeout)
            }
        }
    }
}

/// A blocking connection whose every call has a deadline, and which drops
/// itself after an I/O error or a timeout and connects again on the next
/// call.
///
/// A plain [`redis::Connection`](::redis::Connection) whose read timed out is
/// still open, and the late reply would be read as the next command's: a
/// decision for another key, or another script's answer. This connection never
/// reads past a failure. Built by [`Deadlines::blocking`] (one server) or
/// [`Deadlines::sentinel`] (the primary Sentinels name); use it wherever
/// redis-rs takes a [`ConnectionLike`].
pub struct BlockingConnection {
    source: Source,
    deadlines: Deadlines,
    con: Option<Connection>,
}

impl core::fmt::Debug for BlockingConnection {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BlockingConnection")
            .field("deadlines", &self.deadlines)
            .field("connected", &self.con.is_some())
            .field("sentinel", &matches!(self.source, Source::Sentinel(_)))
            .finish_non_exhaustive()
    }
}

impl BlockingConnection {
    /// The deadlines of every call.
    pub fn deadlines(&self) -> Deadlines {
        self.deadlines
    }

    /// Whether a connection is open now (one is made on the next call if not).
    pub fn is_connected(&self) -> bool {
        self.con.is_some()
    }

    /// The open connection, or a new one.
    fn get(&mut self) -> RedisResult<&mut Connection> {
        if self.con.is_none() {
            let con = self.source.connect(self.deadlines.connect)?;
            con.set_read_timeout(Some(self.deadlines.response))?;
            con.set_write_timeout(Some(self.deadlines.response))?;
            self.con = Some(con);
        }
        // Set just above.
        self.con
            .as_mut()
            .ok_or_else(|| ::redis::RedisError::from(std::io::Error::other("no connection")))
    }

    /// Run `call` on the connection; after a failure that may leave a reply
    /// in flight, or the connection broken, drop it.
    fn with<T>(&mut self, call: impl FnOnce(&mut Connection) -> RedisResult<T>) -> RedisResult<T> {
        let result = call(self.get()?);
        if let Err(e) = &result
            && must_reconnect(e)
        {
            self.con = None;
        }
        result
    }
}

impl ConnectionLike for BlockingConnection {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.with(|con| con.req_packed_command(cmd))
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.with(|con| con.req_packed_commands(cmd, offset, count))
    }

    fn req_command(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        self.with(|con| con.req_command(cmd))
    }

    fn get_db(&self) -> i64 {
        match &self.source {
            Source::Server(client) => client.get_connection_info().redis_settings().db(),
            Source::Sentinel(_) => self.con.as_ref().map_or(0, |con| con.get_db()),
        }
    }

    fn check_connection(&mut self) -> bool {
        self.with(|con| Ok(con.check_connection())).unwrap_or(false)
    }

    fn is_open(&self) -> bool {
        self.con.as_ref().is_some_and(|con| con.is_open())
    }
}

/// A multiplexed tokio connection that connects on its first call and again
/// after a call found it dropped or timed out on it (a Redis restart, say),
/// with the deadlines of
/// [`Deadlines::reconnecting`] (one server) or
/// [`Deadlines::reconnecting_sentinel`] (the primary Sentinels name), which
/// build it (feature `tokio` too). Clones
/// share one connection.
///
/// A call takes at most the response deadline on a live connection (three,
/// for a script's first call after Redis lost its scripts; see [`Deadlines`]),
/// and the connect deadline more for each of those round trips that finds no
/// connection (one, unless another call's failure drops the connection
/// between a script's three). One attempt to connect runs at a time, a task
/// of its own with the whole connect deadline; the calls that find no
/// connection wait for it, each within its own connect deadline, rather than
/// each opening a connection, and a call dropped meanwhile leaves the
/// attempt to the next. A call that fails because the connection dropped,
/// that runs out of its deadline (the connection may be dead: a peer that
/// vanished without closing it, a server killed while a request was in
/// flight), or that fails with an I/O error or in a way after which the
/// connection must be replaced drops it, and the next call connects (an
/// error reply from Redis, such as a script's, keeps it): the call itself is
/// not sent again (it may have been decided). Use it wherever redis-rs takes
/// an asynchronous `ConnectionLike`.
///
/// ```no_run
/// use turnstile::redis::{Deadlines, RedisLimiter};
/// use turnstile::{Quota, TokenBucket};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
/// let mut con = Deadlines::default().reconnecting(redis::Client::open("redis://127.0.0.1/")?);
/// let limiter = RedisLimiter::new("api", TokenBucket::new(Quota::per_second(100)?))?;
/// let decision = limiter.try_acquire_async(&mut con, "k_live_123").await?;
/// # let _ = decision;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(feature = "tokio")]
#[derive(Clone)]
pub struct ReconnectingConnection {
    shared: std::sync::Arc<Reconnect>,
}

#[cfg(feature = "tokio")]
struct Reconnect {
    source: AsyncSource,
    deadlines: Deadlines,
    /// Nanoseconds after an attempt to connect failed before another is
    /// made ([`ReconnectingConnection::connect_backoff`]); 0: at once.
    connect_backoff: core::sync::atomic::AtomicU64,
    /// Locked only to clone or replace the connection, or to join or start
    /// an attempt to connect; never across an await.
    slot: std::sync::Mutex<Slot>,
}

/// A connection and its generation.
#[cfg(feature = "tokio")]
type Held = (u64, ::redis::aio::MultiplexedConnection);

/// The error of a call whose attempt to connect ended without an outcome
/// (its task was dropped: the runtime shut down).
#[cfg(feature = "tokio")]
fn abandoned() -> ::redis::RedisError {
    ::redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "the attempt to connect to Redis was abandoned",
    ))
}

/// The error of a call made while no attempt to connect is made, after one
/// failed ([`ReconnectingConnection::connect_backoff`]).
#[cfg(feature = "tokio")]
fn not_reached() -> ::redis::RedisError {
    ::redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        "Redis was not reached at the last attempt to connect; the next is made after the connect backoff",
    ))
}

/// The outcome of an attempt to connect, once it is made.
#[cfg(feature = "tokio")]
type Attempt = tokio::sync::watch::Receiver<Option<RedisResult<Held>>>;

/// The connection now, how many have been made (so that a failure on an
/// older one does not drop a newer one), and the attempt to connect under
/// way, if any.
#[cfg(feature = "tokio")]
struct Slot {
    generation: u64,
    con: Option<::redis::aio::MultiplexedConnection>,
    /// One attempt at a time, a task of its own with the whole connect
    /// deadline: the calls that find no connection wait for it, each within
    /// its own deadline, instead of each opening a connection (a burst of
    /// calls after the connection was dropped would open one each, and
    /// against a server that does not answer each would hold its socket
    /// until its deadline), and a call that gives up or is dropped leaves the
    /// attempt running for the next.
    connecting: Option<Attempt>,
    /// After an attempt to connect failed, the time before which no other
    /// is made: the calls until then fail at once.
    down_until: Option<std::time::Instant>,
}

#[cfg(feature = "tokio")]
impl core::fmt::Debug for ReconnectingConnection {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ReconnectingConnection")
            .field("deadlines", &self.shared.deadlines)
            .field("connected", &self.is_connected())
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "tokio")]
impl ReconnectingConnection {
    /// The deadlines of every call.
    pub fn deadlines(&self) -> Deadlines {
        self.shared.deadlines
    }

    /// Whether a connection is open now (one is made on the next call if not).
    pub fn is_connected(&self) -> bool {
        self.shared.lock().con.is_some()
    }

    /// After an attempt to connect fails, make no other for `backoff`: the
    /// calls until then fail at once, with an I/O error
    /// ([`ErrorKind::NotConnected`](std::io::ErrorKind::NotConnected)), not
    /// a timeout. Without it (`Duration::ZERO`, the default) each call that
    /// finds no connection tries again, and against a server that accepts
    /// connections but does not answer (stopped, or its host overloaded)
    /// each such call waits out the connect deadline: one request that
    /// calls for several limits waits that long for each. Applies to every
    /// clone.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::redis::Deadlines;
    ///
    /// let client = redis::Client::open("redis://127.0.0.1/")?;
    /// let con = Deadlines::default().reconnecting(client).connect_backoff(Duration::from_secs(1));
    /// assert_eq!(con.connect_backoff_time(), Duration::from_secs(1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn connect_backoff(self, backoff: Duration) -> Self {
        let nanos = u64::try_from(backoff.as_nanos()).unwrap_or(u64::MAX);
        // Relaxed: a setting read on its own; it publishes no other data.
        self.shared
            .connect_backoff
            .store(nanos, core::sync::atomic::Ordering::Relaxed);
        self
    }

    /// The time after a failed attempt to connect before another
    /// ([`connect_backoff`](Self::connect_backoff)).
    pub fn connect_backoff_time(&self) -> Duration {
        // Relaxed: see `connect_backoff`.
        Duration::from_nanos(
            self.shared
                .connect_backoff
                .load(core::sync::atomic::Ordering::Relaxed),
        )
    }

    /// The connection and its generation, or the one the attempt to connect
    /// under way makes (started here if none is): waited for within the
    /// connect deadline.
    async fn get(&self) -> RedisResult<Held> {
        let joined = {
            let mut slot = self.shared.lock();
            if let Some(con) = &slot.con {
                return Ok((slot.generation, con.clone()));
            }
            if let Some(until) = slot.down_until {
                if std::time::Instant::now() < until {
                    return Err(not_reached());
                }
                slot.down_until = None;
            }
            match &slot.connecting {
                // Under way: its sender is alive and has not answered.
                Some(attempt) if attempt.has_changed().is_ok() && attempt.borrow().is_none() => {
                    Some(attempt.clone())
                }
                _ => tokio::runtime::Handle::try_current().ok().map(|runtime| {
                    let attempt = Reconnect::start(&self.shared, &runtime);
                    slot.connecting = Some(attempt.clone());
                    attempt
                }),
            }
        };
        // Outside a tokio runtime nothing can run beside the call: it
        // connects itself.
        let Some(mut attempt) = joined else {
            let made = self.shared.source.connect(self.shared.deadlines).await;
            return self.shared.outcome(made);
        };
        let waited = tokio::time::timeout(
            self.shared.deadlines.connect,
            attempt.wait_for(Option::is_some),
        )
        .await;
        match waited {
            Ok(Ok(outcome)) => match &*outcome {
                Some(made) => made.clone(),
                // Not reached: waited for until it is `Some`.
                None => Err(abandoned()),
            },
            // The attempt's task ended unanswered (its runtime shut down).
            Ok(Err(_)) => Err(abandoned()),
            Err(_) => Err(::redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no connection to Redis within the connect deadline",
            ))),
        }
    }

    /// Run `call` on the connection; after a failure that leaves it unusable,
    /// or may have (a deadline passed: a server killed mid-request can leave
    /// the connection looking open until its next write fails), drop it so
    /// that the next call connects. Calls still in flight on it keep their
    /// own handle and finish as they would.
    async fn with<T>(
        &self,
        call: impl AsyncFnOnce(&mut ::redis::aio::MultiplexedConnection) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let (generation, mut con) = self.get().await?;
        let result = call(&mut con).await;
        if let Err(e) = &result
            && must_reconnect(e)
        {
            let mut slot = self.shared.lock();
            if slot.generation == generation {
                slot.con = None;
            }
        }
        result
    }
}

#[cfg(feature = "tokio")]
impl Reconnect {
    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        // The slot is valid whatever a panicking holder left.
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Start an attempt to connect, on `runtime`, with the whole connect
    /// deadline; it keeps the connection it makes.
    fn start(this: &std::sync::Arc<Reconnect>, runtime: &tokio::runtime::Handle) -> Attempt {
        let (answer, attempt) = tokio::sync::watch::channel(None);
        let shared = std::sync::Arc::clone(this);
        drop(runtime.spawn(async move {
            let made = shared.source.connect(shared.deadlines).await;
            let outcome = shared.outcome(made);
            // Still the slot's attempt: another is started only once this
            // one has answered or its sender is gone.
            shared.lock().connecting = None;
            // No one may be waiting any more: nothing to tell then.
            let _ = answer.send(Some(outcome));
        }));
        attempt
    }

    /// An attempt to connect made: the connection kept, or the failure,
    /// after which no attempt is made for the connect backoff.
    fn outcome(&self, made: RedisResult<::redis::aio::MultiplexedConnection>) -> RedisResult<Held> {
        match made {
            Ok(con) => Ok(self.keep(con)),
            Err(e) => {
                // Relaxed: see `ReconnectingConnection::connect_backoff`.
                let backoff = self
                    .connect_backoff
                    .load(core::sync::atomic::Ordering::Relaxed);
                if backoff > 0 {
                    self.lock().down_until =
                        std::time::Instant::now().checked_add(Duration::from_nanos(backoff));
                }
                Err(e)
            }
        }
    }

    /// Keep `con` as the connection (or the one another call kept meanwhile),
    /// with its generation.
    fn keep(&self, con: ::redis::aio::MultiplexedConnection) -> Held {
        let mut slot = self.lock();
        // Connected: an earlier attempt's failure (one that raced this one)
        // no longer holds the calls back.
        slot.down_until = None;
        if let Some(kept) = &slot.con {
            return (slot.generation, kept.clone());
        }
        slot.generation += 1;
        slot.con = Some(con.clone());
        (slot.generation, con)
    }
}

#[cfg(feature = "tokio")]
impl ::redis::aio::ConnectionLike for ReconnectingConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> ::redis::RedisFuture<'a, Value> {
        Box::pin(self.with(async move |con| {
            ::redis::aio::ConnectionLike::req_packed_command(con, cmd).await
        }))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a ::redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> ::redis::RedisFuture<'a, Vec<Value>> {
        Box::pin(self.with(async move |con| {
            ::redis::aio::ConnectionLike::req_packed_commands(con, pipeline, offset, count).await
        }))
    }

    fn get_db(&self) -> i64 {
        match &self.shared.source {
            AsyncSource::Server(client) => client.get_connection_info().redis_settings().db(),
            AsyncSource::Sentinel(_) => 0,
        }
    }
}

/// What a reconnecting connection connects to: one server, or the primary
/// the Sentinels name at each attempt.
#[cfg(feature = "tokio")]
enum AsyncSource {
    Server(Client),
    Sentinel(tokio::sync::Mutex<SentinelClient>),
}

#[cfg(feature = "tokio")]
impl AsyncSource {
    async fn connect(
        &self,
        deadlines: Deadlines,
    ) -> RedisResult<::redis::aio::MultiplexedConnection> {
        match self {
            AsyncSource::Server(client) => deadlines.multiplexed(client).await,
            AsyncSource::Sentinel(sentinel) => {
                let client = sentinel.lock().await.async_get_client().await?;
                deadlines.multiplexed(&client).await
            }
        }
    }
}
