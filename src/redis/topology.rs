//! The crate's connections, one trait for each kind of call: a single
//! server, a Redis Cluster or the primary Sentinels name, all with deadlines
//! and every call sent at most once.

use ::redis::ConnectionLike;

use super::Deadlines;

/// Keeps the connection traits to the crate's own connections: each makes
/// its calls at most once, which a limiter's bounds rely on.
pub(crate) mod sealed {
    pub trait Sealed {}
}

/// A blocking connection of this crate: every call has
/// [`Deadlines`], and none is sent twice (a call that failed may have been
/// decided, so it is returned as it failed; only redirections and
/// `NOSCRIPT`, which prove it did not run, are followed). Sealed;
/// implemented by:
///
/// - [`BlockingConnection`](super::BlockingConnection), to one server
///   ([`Deadlines::blocking`]) or to the primary Sentinels name
///   ([`Deadlines::sentinel`]);
/// - [`BlockingClusterConnection`](super::BlockingClusterConnection), to a
///   Redis Cluster ([`Deadlines::blocking_cluster`]).
///
/// Every blocking call of the crate takes a `&mut dyn ConnectionLike`, so
/// any of these, as well as a connection of redis-rs's own; those taking the
/// connection for good ([`LeasedLimiter::start_refresher`](super::LeasedLimiter::start_refresher))
/// take only these.
pub trait RedisConnection: ConnectionLike + Send + sealed::Sealed + 'static {
    /// The deadlines of every call.
    fn deadlines(&self) -> Deadlines;
}

/// An asynchronous connection of this crate, shared by cloning (feature
/// `tokio` too): every call has [`Deadlines`] and none is sent twice, as
/// for [`RedisConnection`]. Sealed; implemented by:
///
/// - [`ReconnectingConnection`](super::ReconnectingConnection), to one
///   server ([`Deadlines::reconnecting`]) or to the primary Sentinels name
///   ([`Deadlines::reconnecting_sentinel`]);
/// - [`AsyncClusterConnection`](super::AsyncClusterConnection), to a Redis
///   Cluster ([`Deadlines::async_cluster`]);
/// - [`AnyAsyncConnection`], any of them.
#[cfg(feature = "tokio")]
pub trait AsyncRedisConnection:
    ::redis::aio::ConnectionLike + Clone + Send + Sync + sealed::Sealed + 'static
{
    /// The deadlines of every call.
    fn deadlines(&self) -> Deadlines;

    /// This connection as any of them.
    fn into_any(self) -> AnyAsyncConnection;
}

/// Any of the crate's asynchronous connections
/// ([`AsyncRedisConnection`]): what a `RedisRateLimitLayer` (features
/// `tower` and `tokio`) keeps, whichever it was given. Clones share the
/// connection.
#[cfg(feature = "tokio")]
#[derive(Clone, Debug)]
pub struct AnyAsyncConnection {
    con: Any,
}

#[cfg(feature = "tokio")]
#[derive(Clone, Debug)]
enum Any {
    Reconnecting(super::ReconnectingConnection),
    Cluster(super::AsyncClusterConnection),
}

#[cfg(feature = "tokio")]
impl AnyAsyncConnection {
    fn reconnecting(con: super::ReconnectingConnection) -> AnyAsyncConnection {
        AnyAsyncConnection {
            con: Any::Reconnecting(con),
        }
    }

    fn cluster(con: super::AsyncClusterConnection) -> AnyAsyncConnection {
        AnyAsyncConnection {
            con: Any::Cluster(con),
        }
    }

    /// The connection, when it is a [`ReconnectingConnection`](super::ReconnectingConnection)
    /// (to one server, or to the primary Sentinels name).
    pub fn as_reconnecting(&self) -> Option<&super::ReconnectingConnection> {
        match &self.con {
            Any::Reconnecting(con) => Some(con),
            Any::Cluster(_) => None,
        }
    }

    /// The connection, when it is an [`AsyncClusterConnection`](super::AsyncClusterConnection).
    pub fn as_cluster(&self) -> Option<&super::AsyncClusterConnection> {
        match &self.con {
            Any::Cluster(con) => Some(con),
            Any::Reconnecting(_) => None,
        }
    }
}

#[cfg(feature = "tokio")]
impl ::redis::aio::ConnectionLike for AnyAsyncConnection {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a ::redis::Cmd,
    ) -> ::redis::RedisFuture<'a, ::redis::Value> {
        match &mut self.con {
            Any::Reconnecting(con) => con.req_packed_command(cmd),
            Any::Cluster(con) => con.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a ::redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> ::redis::RedisFuture<'a, Vec<::redis::Value>> {
        match &mut self.con {
            Any::Reconnecting(con) => con.req_packed_commands(pipeline, offset, count),
            Any::Cluster(con) => con.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.con {
            Any::Reconnecting(con) => con.get_db(),
            Any::Cluster(con) => con.get_db(),
        }
    }
}

#[cfg(feature = "tokio")]
impl sealed::Sealed for AnyAsyncConnection {}

#[cfg(feature = "tokio")]
impl AsyncRedisConnection for AnyAsyncConnection {
    fn deadlines(&self) -> Deadlines {
        match &self.con {
            Any::Reconnecting(con) => con.deadlines(),
            Any::Cluster(con) => con.deadlines(),
        }
    }

    fn into_any(self) -> AnyAsyncConnection {
        self
    }
}

impl sealed::Sealed for super::BlockingConnection {}

impl RedisConnection for super::BlockingConnection {
    fn deadlines(&self) -> Deadlines {
        super::BlockingConnection::deadlines(self)
    }
}

impl sealed::Sealed for super::BlockingClusterConnection {}

impl RedisConnection for super::BlockingClusterConnection {
    fn deadlines(&self) -> Deadlines {
        super::BlockingClusterConnection::deadlines(self)
    }
}

#[cfg(feature = "tokio")]
impl sealed::Sealed for super::ReconnectingConnection {}

#[cfg(feature = "tokio")]
impl AsyncRedisConnection for super::ReconnectingConnection {
    fn deadlines(&self) -> Deadlines {
        super::ReconnectingConnection::deadlines(self)
    }

    fn into_any(self) -> AnyAsyncConnection {
        AnyAsyncConnection::reconnecting(self)
    }
}

#[cfg(feature = "tokio")]
impl sealed::Sealed for super::AsyncClusterConnection {}

#[cfg(feature = "tokio")]
impl AsyncRedisConnection for super::AsyncClusterConnection {
    fn deadlines(&self) -> Deadlines {
        super::AsyncClusterConnection::deadlines(self)
    }

    fn into_any(self) -> AnyAsyncConnection {
        AnyAsyncConnection::cluster(self)
    }
}
