//! Redis Cluster connections that never send a call twice.
//!
//! redis-rs's cluster connections retry a failed command: the blocking one
//! up to 16 times by default, after a timeout too, and a script that timed
//! out may have run (it was only slow), so each retry could take the tokens
//! again. Setting its retries to 0 would stop those, and the redirections as
//! well (`MOVED`, `ASK`), which a cluster needs whenever a slot moves.
//!
//! So the cluster connections here give redis-rs node connections of their
//! own ([`Node`], [`AsyncNode`]) that turn every failure after a command
//! was written (an I/O error, a timeout, a reply that could not be read) into
//! an error redis-rs does not retry, and the server's "try again later"
//! answers (`TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `LOADING`, `READONLY`)
//! too, which redis-rs would retry after sleeping past the deadline. What
//! redis-rs still retries is what proves that the call did not run: `MOVED`
//! and `ASK` (the node does not serve the key's slot), a node it could not
//! connect to (nothing was written), and the node connection that a failure
//! left unusable, which refuses the next call before writing it. The outer
//! connection turns the disguised errors back into what they were.

use core::time::Duration;
use std::io;

use ::redis::cluster::ClusterClientBuilder;
use ::redis::{
    Arg, Cmd, Connection, ConnectionLike, ErrorKind, IntoConnectionInfo, RedisError, RedisResult,
    ServerErrorKind, Value,
};

use super::Deadlines;
use super::connection::must_reconnect;

/// How many times redis-rs may send a call again after an error that proves
/// it did not run: a `MOVED`, then an `ASK` while the slot migrates, then one
/// node connection replaced or connected.
const RETRIES: u32 = 3;

/// The code of the extension errors that carry a failure redis-rs must not
/// retry: the prefix, then the kind.
const AMBIGUOUS: &str = "TURNSTILE-UNSENT-NEVER-RETRIED";

/// The kinds of I/O error that survive the round trip through an extension
/// error, by name.
const IO_KINDS: [(io::ErrorKind, &str); 9] = [
    (io::ErrorKind::TimedOut, "TIMEDOUT"),
    (io::ErrorKind::WouldBlock, "WOULDBLOCK"),
    (io::ErrorKind::BrokenPipe, "BROKENPIPE"),
    (io::ErrorKind::ConnectionReset, "CONNRESET"),
    (io::ErrorKind::ConnectionAborted, "CONNABORTED"),
    (io::ErrorKind::UnexpectedEof, "EOF"),
    (io::ErrorKind::NotConnected, "NOTCONNECTED"),
    (io::ErrorKind::ConnectionRefused, "CONNREFUSED"),
    (io::ErrorKind::InvalidData, "INVALIDDATA"),
];

/// `e`, which a node connection met after writing a command, as an error
/// redis-rs does not retry (an extension error), or `e` itself when it is an
/// error reply redis-rs would not retry anyway.
fn never_retried(e: RedisError) -> RedisError {
    if let ErrorKind::Server(kind) = e.kind() {
        if !holds_off(kind) {
            return e;
        }
        return ::redis::make_extension_error(
            e.code().unwrap_or("ERR").to_owned(),
            e.detail().map(str::to_owned),
        );
    }
    let kind = if e.is_timeout() {
        "TIMEDOUT"
    } else {
        e.as_io_kind()
            .and_then(|kind| IO_KINDS.iter().find(|(k, _)| *k == kind))
            .map_or("INVALIDDATA", |(_, name)| name)
    };
    ::redis::make_extension_error(format!("{AMBIGUOUS}-{kind}"), Some(e.to_string()))
}

/// The error [`never_retried`] disguised, as it was: an I/O error of its
/// kind (so that `is_timeout` and the rest answer as they would have), or any
/// other error unchanged.
fn restored(e: RedisError) -> RedisError {
    let Some(kind) = e
        .code()
        .and_then(|code| code.strip_prefix(AMBIGUOUS))
        .and_then(|rest| rest.strip_prefix('-'))
    else {
        return e;
    };
    let kind = IO_KINDS
        .iter()
        .find(|(_, name)| *name == kind)
        .map_or(io::ErrorKind::InvalidData, |(k, _)| *k);
    let detail = e.detail().unwrap_or("the call failed").to_owned();
    RedisError::from(io::Error::new(kind, detail))
}

/// Whether an error reply asks the client to try again later: redis-rs would
/// sleep and retry, or refresh its slots and retry. The script did not run,
/// but the wait would outlast the deadline; the failure policy answers.
fn holds_off(kind: ServerErrorKind) -> bool {
    matches!(
        kind,
        ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::BusyLoading
            | ServerErrorKind::ReadOnly
    )
}

/// An error reply in a reply value, as [`never_retried`] turns it, or the
/// value.
fn settle_value(value: Value) -> RedisResult<Value> {
    match value {
        Value::ServerError(e) if e.kind().is_some_and(holds_off) => {
            Err(never_retried(RedisError::from(e)))
        }
        value => Ok(value),
    }
}

/// The error of a call on a node connection that an earlier failure left
/// unusable: nothing was written, and redis-rs replaces the connection and
/// sends the call on the new one.
fn unusable() -> RedisError {
    RedisError::from(io::Error::new(
        io::ErrorKind::NotConnected,
        "the node connection was dropped after a failed call",
    ))
}

/// Whether `cmd` is `CLUSTER SLOTS`, the query of redis-rs's slot refresh.
fn is_slot_query(cmd: &Cmd) -> bool {
    let mut args = cmd.args_iter();
    matches!(
        (args.next(), args.next(), args.next()),
        (Some(Arg::Simple(a)), Some(Arg::Simple(b)), None)
            if a.eq_ignore_ascii_case(b"CLUSTER") && b.eq_ignore_ascii_case(b"SLOTS")
    )
}

trait IoKind {
    fn as_io_kind(&self) -> Option<io::ErrorKind>;
}

impl IoKind for RedisError {
    /// The kind of the I/O error inside, read back from the ones redis-rs
    /// reports (it does not expose the error itself).
    fn as_io_kind(&self) -> Option<io::ErrorKind> {
        if !self.is_io_error() {
            return None;
        }
        if self.is_timeout() {
            return Some(io::ErrorKind::TimedOut);
        }
        if self.is_connection_refusal() {
            return Some(io::ErrorKind::ConnectionRefused);
        }
        if self.is_connection_dropped() {
            return Some(io::ErrorKind::ConnectionReset);
        }
        Some(io::ErrorKind::InvalidData)
    }
}

/// One node of a blocking cluster connection: a plain connection that, after
/// a failure that may leave a reply in flight, refuses every call (redis-rs
/// then connects again) and reports the failure as one it does not retry.
pub(crate) struct Node {
    con: Connection,
    broken: bool,
}

impl Node {
    /// Run `call` unless broken; a failure breaks the connection when it may
    /// leave a reply in flight, and is never retried.
    fn with<T>(&mut self, call: impl FnOnce(&mut Connection) -> RedisResult<T>) -> RedisResult<T> {
        if self.broken {
            return Err(unusable());
        }
        call(&mut self.con).map_err(|e| {
            if must_reconnect(&e) {
                self.broken = true;
            }
            never_retried(e)
        })
    }
}

impl ::redis::cluster::Connect for Node {
    fn connect<T: IntoConnectionInfo>(info: T, timeout: Option<Duration>) -> RedisResult<Self> {
        let con = <Connection as ::redis::cluster::Connect>::connect(info, timeout)?;
        Ok(Node { con, broken: false })
    }

    fn send_packed_command(&mut self, cmd: &[u8]) -> RedisResult<()> {
        self.with(|con| con.send_packed_command(cmd))
    }

    fn set_write_timeout(&self, dur: Option<Duration>) -> RedisResult<()> {
        self.con.set_write_timeout(dur)
    }

    fn set_read_timeout(&self, dur: Option<Duration>) -> RedisResult<()> {
        self.con.set_read_timeout(dur)
    }

    fn recv_response(&mut self) -> RedisResult<Value> {
        self.with(|con| con.recv_response()).and_then(settle_value)
    }
}

impl ConnectionLike for Node {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.with(|con| con.req_packed_command(cmd))
            .and_then(settle_value)
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
        if is_slot_query(cmd) {
            // redis-rs's blocking slot refresh asks the nodes it holds, in
            // its map's order, and gives up at the first error, while it
            // skips a reply that holds no slots. A node left unusable by a
            // failed call (or one that fails now) would end every refresh
            // that reaches it first; and once its slots have moved, no call
            // goes to it to replace it: every later `MOVED` would fail. An
            // empty reply sends the refresh on to the next node, and a
            // refresh that succeeds replaces this connection (it checks
            // each it keeps).
            return Ok(self
                .with(|con| con.req_command(cmd))
                .and_then(settle_value)
                .unwrap_or(Value::Nil));
        }
        self.with(|con| con.req_command(cmd)).and_then(settle_value)
    }

    fn get_db(&self) -> i64 {
        self.con.get_db()
    }

    fn check_connection(&mut self) -> bool {
        !self.broken && self.con.check_connection()
    }

    fn is_open(&self) -> bool {
        !self.broken && self.con.is_open()
    }
}

/// The builder's settings that make every call at most once and bound by
/// `deadlines`.
fn configured(builder: ClusterClientBuilder, deadlines: Deadlines) -> ClusterClientBuilder {
    builder
        .retries(RETRIES)
        // The retries left are redirections and connections replaced, sent
        // at once; no error that redis-rs would wait on reaches it.
        .min_retry_wait(1)
        .max_retry_wait(2)
        .connection_timeout(deadlines.connect_timeout())
        .response_timeout(deadlines.response_timeout())
}

/// A blocking Redis Cluster connection whose every call has a deadline and is
/// sent at most once, built by [`Deadlines::blocking_cluster`].
///
/// redis-rs routes each call to the node that serves its key and follows
/// `MOVED` and `ASK` redirections (up to three, sent at once). A call that
/// fails after it was written (a timeout above all: the script may have run)
/// is returned as it failed, never sent again, and the node's connection is
/// replaced before its next call, so a late reply is never read as another
/// call's. Error replies that ask to try later (`TRYAGAIN`, `CLUSTERDOWN`,
/// `MASTERDOWN`, `LOADING`, `READONLY`) are returned too, for the failure
/// policy, rather than waited out. It connects on its first call, and again
/// on the next call after connecting failed.
pub struct BlockingClusterConnection {
    client: ::redis::cluster::ClusterClient,
    deadlines: Deadlines,
    con: Option<::redis::cluster::ClusterConnection<Node>>,
}

impl core::fmt::Debug for BlockingClusterConnection {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BlockingClusterConnection")
            .field("deadlines", &self.deadlines)
            .field("connected", &self.con.is_some())
            .finish_non_exhaustive()
    }
}

impl BlockingClusterConnection {
    pub(super) fn new(
        builder: ClusterClientBuilder,
        deadlines: Deadlines,
    ) -> RedisResult<BlockingClusterConnection> {
        Ok(BlockingClusterConnection {
            client: configured(builder, deadlines).build()?,
            deadlines,
            con: None,
        })
    }

    /// The deadlines of every call.
    pub fn deadlines(&self) -> Deadlines {
        self.deadlines
    }

    /// Whether the cluster connection is made (it is on the next call if not).
    pub fn is_connected(&self) -> bool {
        self.con.is_some()
    }

    fn with<T>(
        &mut self,
        call: impl FnOnce(&mut ::redis::cluster::ClusterConnection<Node>) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let con = match &mut self.con {
            Some(con) => con,
            slot => {
                let con = self
                    .client
                    .get_generic_connection::<Node>()
                    .map_err(restored)?;
                con.set_write_timeout(Some(self.deadlines.response_timeout()))
                    .map_err(restored)?;
                slot.insert(con)
            }
        };
        call(con).map_err(restored)
    }
}

impl ConnectionLike for BlockingClusterConnection {
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
        0
    }

    fn check_connection(&mut self) -> bool {
        self.with(|con| Ok(con.check_connection())).unwrap_or(false)
    }

    fn is_open(&self) -> bool {
        self.con.as_ref().is_some_and(|con| con.is_open())
    }
}

impl Deadlines {
    /// A blocking Redis Cluster connection with these deadlines, on which no
    /// call is sent twice ([`BlockingClusterConnection`]). `builder` names
    /// the cluster's nodes and may set TLS and credentials; its retries,
    /// retry waits, connect and response timeouts are replaced by these
    /// deadlines and the connection's own retry rule. It connects on its
    /// first call.
    ///
    /// ```no_run
    /// use redis::cluster::ClusterClientBuilder;
    /// use turnstile::redis::Deadlines;
    ///
    /// let nodes = ClusterClientBuilder::new(vec!["redis://127.0.0.1:7000/", "redis://127.0.0.1:7001/"]);
    /// let mut con = Deadlines::default().blocking_cluster(nodes)?;
    /// # let _ = &mut con;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// When redis-rs refuses the builder's settings (no node, say).
    pub fn blocking_cluster(
        &self,
        builder: ClusterClientBuilder,
    ) -> RedisResult<BlockingClusterConnection> {
        BlockingClusterConnection::new(builder, *self)
    }

    /// An asynchronous Redis Cluster connection with these deadlines, on
    /// which no call is sent twice
    /// ([`AsyncClusterConnection`](super::AsyncClusterConnection), feature
    /// `tokio` too). As [`blocking_cluster`](Self::blocking_cluster), but it
    /// connects to the cluster here.
    ///
    /// # Errors
    ///
    /// When redis-rs refuses the builder's settings, or no node answers.
    #[cfg(feature = "tokio")]
    pub async fn async_cluster(
        &self,
        builder: ClusterClientBuilder,
    ) -> RedisResult<AsyncClusterConnection> {
        AsyncClusterConnection::new(builder, *self).await
    }
}

#[cfg(feature = "tokio")]
pub use self::tokio_cluster::AsyncClusterConnection;

#[cfg(feature = "tokio")]
mod tokio_cluster {
    use std::sync::{Arc, Mutex, MutexGuard};

    use ::redis::aio::{ConnectionLike as AsyncConnectionLike, MultiplexedConnection};
    use ::redis::cluster::ClusterClientBuilder;
    use ::redis::{
        AsyncConnectionConfig, Client, Cmd, IntoConnectionInfo, Pipeline, RedisFuture, RedisResult,
        Value,
    };

    use super::{configured, must_reconnect, never_retried, restored, settle_value};
    use crate::redis::Deadlines;

    /// One node of an asynchronous cluster connection: a multiplexed
    /// connection that is replaced, on the node's next call, after a failure
    /// that may have broken it, and whose failures redis-rs does not retry.
    #[derive(Clone)]
    pub(crate) struct AsyncNode {
        shared: Arc<NodeShared>,
    }

    struct NodeShared {
        client: Client,
        config: AsyncConnectionConfig,
        /// The connection and its generation; locked only to clone or
        /// replace it, never across an await.
        con: Mutex<(u64, Option<MultiplexedConnection>)>,
    }

    impl NodeShared {
        fn lock(&self) -> MutexGuard<'_, (u64, Option<MultiplexedConnection>)> {
            // The slot is valid whatever a panicking holder left.
            self.con.lock().unwrap_or_else(|e| e.into_inner())
        }
    }

    impl AsyncNode {
        /// The connection, or a new one. A failure to connect wrote
        /// nothing: redis-rs may retry it.
        async fn get(&self) -> RedisResult<(u64, MultiplexedConnection)> {
            {
                let slot = self.shared.lock();
                if let (generation, Some(con)) = &*slot {
                    return Ok((*generation, con.clone()));
                }
            }
            let con = self
                .shared
                .client
                .get_multiplexed_async_connection_with_config(&self.shared.config)
                .await?;
            let mut slot = self.shared.lock();
            if let (generation, Some(kept)) = &*slot {
                return Ok((*generation, kept.clone()));
            }
            slot.0 += 1;
            slot.1 = Some(con.clone());
            Ok((slot.0, con))
        }

        /// `result` of a call on connection `generation`, never retried when
        /// it failed; the connection is dropped after a failure that may
        /// have broken it.
        fn settle<T>(&self, generation: u64, result: RedisResult<T>) -> RedisResult<T> {
            result.map_err(|e| {
                if must_reconnect(&e) {
                    let mut slot = self.shared.lock();
                    if slot.0 == generation {
                        slot.1 = None;
                    }
                }
                never_retried(e)
            })
        }
    }

    impl ::redis::cluster_async::Connect for AsyncNode {
        fn connect_with_config<'a, T>(
            info: T,
            config: AsyncConnectionConfig,
        ) -> RedisFuture<'a, Self>
        where
            T: IntoConnectionInfo + Send + 'a,
        {
            Box::pin(async move {
                let client = Client::open(info.into_connection_info()?)?;
                let con = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                Ok(AsyncNode {
                    shared: Arc::new(NodeShared {
                        client,
                        config,
                        con: Mutex::new((1, Some(con))),
                    }),
                })
            })
        }
    }

    impl AsyncConnectionLike for AsyncNode {
        fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
            Box::pin(async move {
                let (generation, mut con) = self.get().await?;
                let result = con.req_packed_command(cmd).await;
                self.settle(generation, result).and_then(settle_value)
            })
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            pipeline: &'a Pipeline,
            offset: usize,
            count: usize,
        ) -> RedisFuture<'a, Vec<Value>> {
            Box::pin(async move {
                let (generation, mut con) = self.get().await?;
                let result = con.req_packed_commands(pipeline, offset, count).await;
                self.settle(generation, result)
            })
        }

        fn get_db(&self) -> i64 {
            self.shared
                .client
                .get_connection_info()
                .redis_settings()
                .db()
        }
    }

    /// An asynchronous Redis Cluster connection whose every call has a
    /// deadline and is sent at most once, built by
    /// [`Deadlines::async_cluster`] (feature `tokio` too). Clones share it.
    ///
    /// As [`BlockingClusterConnection`](super::BlockingClusterConnection):
    /// redis-rs routes each call and follows `MOVED` and `ASK` (up to three
    /// redirections, sent at once); a call that fails after it was written is
    /// returned, never sent again, and the node's connection is replaced
    /// before its next call when the failure may have broken it; error
    /// replies asking to try later are returned, not waited out.
    #[derive(Clone)]
    pub struct AsyncClusterConnection {
        con: ::redis::cluster_async::ClusterConnection<AsyncNode>,
        deadlines: Deadlines,
    }

    impl core::fmt::Debug for AsyncClusterConnection {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            f.debug_struct("AsyncClusterConnection")
                .field("deadlines", &self.deadlines)
                .finish_non_exhaustive()
        }
    }

    impl AsyncClusterConnection {
        pub(in crate::redis) async fn new(
            builder: ClusterClientBuilder,
            deadlines: Deadlines,
        ) -> RedisResult<AsyncClusterConnection> {
            let client = configured(builder, deadlines).build()?;
            let con = client
                .get_async_generic_connection::<AsyncNode>()
                .await
                .map_err(restored)?;
            Ok(AsyncClusterConnection { con, deadlines })
        }

        /// The deadlines of every call.
        pub fn deadlines(&self) -> Deadlines {
            self.deadlines
        }
    }

    impl AsyncConnectionLike for AsyncClusterConnection {
        fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
            Box::pin(async move { self.con.req_packed_command(cmd).await.map_err(restored) })
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            pipeline: &'a Pipeline,
            offset: usize,
            count: usize,
        ) -> RedisFuture<'a, Vec<Value>> {
            Box::pin(async move {
                self.con
                    .req_packed_commands(pipeline, offset, count)
                    .await
                    .map_err(restored)
            })
        }

        fn get_db(&self) -> i64 {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slot_query_is_told_from_other_commands() {
        assert!(is_slot_query(::redis::cmd("CLUSTER").arg("SLOTS")));
        assert!(is_slot_query(::redis::cmd("cluster").arg("slots")));
        assert!(!is_slot_query(::redis::cmd("CLUSTER").arg("SHARDS")));
        assert!(!is_slot_query(
            ::redis::cmd("CLUSTER").arg("SLOTS").arg("x")
        ));
        assert!(!is_slot_query(::redis::cmd("EVALSHA").arg("abc").arg(1)));
        assert!(!is_slot_query(&::redis::cmd("CLUSTER")));
    }

    fn io(kind: io::ErrorKind) -> RedisError {
        RedisError::from(io::Error::new(kind, "boom"))
    }

    #[test]
    fn failures_after_a_write_are_never_retried_and_come_back_as_they_were() {
        for kind in [
            io::ErrorKind::TimedOut,
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::UnexpectedEof,
            io::ErrorKind::BrokenPipe,
        ] {
            let original = io(kind);
            let hidden = never_retried(io(kind));
            assert!(
                matches!(hidden.retry_method(), ::redis::RetryMethod::NoRetry),
                "{kind:?}: {hidden:?}"
            );
            let back = restored(hidden);
            assert!(back.is_io_error(), "{back:?}");
            assert_eq!(back.is_timeout(), original.is_timeout(), "{kind:?}");
            assert_eq!(
                back.is_connection_dropped(),
                original.is_connection_dropped(),
                "{kind:?}"
            );
            assert!(must_reconnect(&back));
        }
    }

    fn reply(text: &str) -> RedisError {
        let value = ::redis::Value::ServerError(
            ::redis::parse_redis_value(format!("-{text}\r\n").as_bytes())
                .ok()
                .and_then(|v| match v {
                    Value::ServerError(e) => Some(e),
                    _ => None,
                })
                .expect("an error reply"),
        );
        settle_value(value).expect_err("an error")
    }

    #[test]
    fn replies_asking_to_wait_are_not_retried_and_redirections_are() {
        for text in [
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "CLUSTERDOWN The cluster is down",
            "LOADING Redis is loading the dataset in memory",
            "READONLY You can't write against a read only replica.",
        ] {
            let e = reply(text);
            assert!(
                matches!(e.retry_method(), ::redis::RetryMethod::NoRetry),
                "{text}: {e:?}"
            );
            let code = text.split(' ').next().unwrap_or_default();
            assert_eq!(restored(e).code(), Some(code));
        }
        // Left as they are: redis-rs follows them, or they are final.
        let moved = ::redis::Value::ServerError(
            match ::redis::parse_redis_value(b"-MOVED 3999 127.0.0.1:6381\r\n") {
                Ok(Value::ServerError(e)) => e,
                other => panic!("{other:?}"),
            },
        );
        assert!(matches!(settle_value(moved), Ok(Value::ServerError(_))));
        let moved = RedisError::from(
            match ::redis::parse_redis_value(b"-MOVED 3999 127.0.0.1:6381\r\n") {
                Ok(Value::ServerError(e)) => e,
                other => panic!("{other:?}"),
            },
        );
        assert!(matches!(
            never_retried(moved).retry_method(),
            ::redis::RetryMethod::MovedRedirect
        ));
    }
}
