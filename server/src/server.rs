//! Starting the service: the gRPC listener (the rate-limit and health
//! services) and the HTTP listener, until a shutdown signal.

use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tonic::transport::server::{Connected, TcpConnectInfo};

use tonic_health::ServingStatus;

use crate::grpc::{GrpcService, SERVICE_NAME};
use crate::service::RateLimitService;

/// The service names the gRPC health service answers for: the server as a
/// whole (`""`), envoyproxy/ratelimit's name for itself (`ratelimit`, which
/// its Kubernetes probes and Envoy's health checks name), and the
/// rate-limit service's full name. Each is `SERVING` until the shutdown
/// begins ([`RateLimitService::set_serving`]), `NOT_SERVING` from then on.
pub const HEALTH_NAMES: [&str; 3] = ["", "ratelimit", SERVICE_NAME];

/// The largest gRPC message or HTTP body accepted (default 4 MiB, tonic's
/// default): a request beyond it is refused before it is decoded in full.
pub const DEFAULT_MAX_MESSAGE: usize = 4 << 20;

/// Requests in flight on one gRPC connection (HTTP/2's
/// `SETTINGS_MAX_CONCURRENT_STREAMS`; a client such as Envoy queues or opens
/// another connection past it). tonic's default is none, so one connection
/// could hold any number of requests of up to the message size at once.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 1_024;

/// Connections each listener (gRPC, HTTP) holds at once by default: past
/// them a new connection waits in the kernel's backlog until one closes, so
/// a flood of idle or slow connections on one port cannot take the file
/// descriptors the other port and the configuration's reload need.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1_024;

/// The bytes of `POST /json` bodies held at once, whatever the number of
/// connections sending them: each part of a body takes its share (by the
/// KiB) as it arrives, until the body is parsed, so a client that sends
/// slowly holds only what it has sent. A body waits for room within the
/// body timeout ([`ServeLimits::body_timeout`]). 64 MiB: sixteen bodies of
/// the 4 MiB message size.
pub const HTTP_BODY_BUDGET: usize = 64 << 20;

/// The bytes an HTTP connection buffers for a request's head: a head past
/// them is refused (`431`). 64 KiB: envoyproxy/ratelimit's requests and
/// probes are a few hundred bytes.
pub const HTTP_MAX_HEAD: usize = 64 << 10;

/// What the listeners hold to: sizes, connections and the HTTP deadlines
/// ([`serve_with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServeLimits {
    /// The largest gRPC message or HTTP body ([`DEFAULT_MAX_MESSAGE`]).
    pub max_message: usize,
    /// Connections each listener holds at once (at least 1;
    /// [`DEFAULT_MAX_CONNECTIONS`]).
    pub max_connections: usize,
    /// How long an HTTP client may take to send a request's head (the
    /// request line and header fields), from when the connection waits for
    /// it (an idle keep-alive connection included): past it the connection
    /// is closed. A client that sends its head a byte at a time (slowloris)
    /// holds its connection no longer. The gRPC listener closes a
    /// connection that has not sent HTTP/2's handshake within as long of its
    /// accept. 10 s by default.
    pub header_timeout: Duration,
    /// How long `POST /json` may take to receive its body (waiting for room
    /// in [`HTTP_BODY_BUDGET`] included): past it the request is
    /// answered `408 Request Timeout` and the connection closed. 10 s by
    /// default.
    pub body_timeout: Duration,
    /// How long the shutdown waits for the requests in flight once the
    /// listeners are closed: past it, the connections still open (a client
    /// that stopped reading its answer, a request that never ends) are cut
    /// and [`serve_with`] returns. 30 s by default.
    pub drain_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> ServeLimits {
        ServeLimits {
            max_message: DEFAULT_MAX_MESSAGE,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(30),
        }
    }
}

/// Serve `service` on `grpc` (and `http`, if given) until `shutdown`
/// completes; requests in flight are answered before this returns.
///
/// # Errors
///
/// The transport's error, if a listener fails.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
/// use tokio::net::{TcpListener, TcpStream};
/// use tokio::sync::oneshot;
/// use turnstile_server::config::Config;
/// use turnstile_server::server::{DEFAULT_MAX_MESSAGE, serve};
/// use turnstile_server::service::{Bounds, RateLimitService};
///
/// let service = Arc::new(RateLimitService::new(Config::default(), Bounds::default(), false));
/// let grpc = TcpListener::bind("127.0.0.1:0").await?;
/// let http = TcpListener::bind("127.0.0.1:0").await?;
/// let http_addr = http.local_addr()?;
/// let (stop, stopped) = oneshot::channel::<()>();
/// let shutdown = async move {
///     let _ = stopped.await;
/// };
/// let server = tokio::spawn(serve(
///     Arc::clone(&service),
///     grpc,
///     Some(http),
///     DEFAULT_MAX_MESSAGE,
///     shutdown,
/// ));
///
/// // envoyproxy/ratelimit's health check answers `OK` while serving.
/// let mut connection = TcpStream::connect(http_addr).await?;
/// connection
///     .write_all(b"GET /healthcheck HTTP/1.1\r\nHost: rls\r\nConnection: close\r\n\r\n")
///     .await?;
/// let mut answer = String::new();
/// connection.read_to_string(&mut answer).await?;
/// assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"));
/// assert!(answer.ends_with("\r\n\r\nOK"));
///
/// // The shutdown marks the service not serving, then closes the listeners.
/// let _ = stop.send(());
/// server.await??;
/// assert!(!service.serving());
/// # Ok(())
/// # }
/// ```
pub async fn serve<F>(
    service: Arc<RateLimitService>,
    grpc: TcpListener,
    http: Option<TcpListener>,
    max_message: usize,
    shutdown: F,
) -> io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let limits = ServeLimits {
        max_message,
        ..ServeLimits::default()
    };
    serve_with(service, grpc, http, limits, shutdown).await
}

/// [`serve`], the listeners held to `limits`.
///
/// # Errors
///
/// As [`serve`].
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
/// use tokio::net::{TcpListener, TcpStream};
/// use tokio::sync::oneshot;
/// use turnstile_server::config::Config;
/// use turnstile_server::server::{ServeLimits, serve_with};
/// use turnstile_server::service::{Bounds, RateLimitService};
///
/// let service = Arc::new(RateLimitService::new(Config::default(), Bounds::default(), false));
/// let grpc = TcpListener::bind("127.0.0.1:0").await?;
/// let http = TcpListener::bind("127.0.0.1:0").await?;
/// let http_addr = http.local_addr()?;
/// let mut limits = ServeLimits::default();
/// limits.max_connections = 256;
/// limits.header_timeout = Duration::from_millis(200);
/// let (stop, stopped) = oneshot::channel::<()>();
/// let server = tokio::spawn(serve_with(service, grpc, Some(http), limits, async move {
///     let _ = stopped.await;
/// }));
///
/// // A client that never finishes its request's head is cut off.
/// let mut slow = TcpStream::connect(http_addr).await?;
/// slow.write_all(b"GET /healthz HTTP/1.1\r\n").await?;
/// let mut answer = Vec::new();
/// slow.read_to_end(&mut answer).await?;
///
/// let _ = stop.send(());
/// server.await??;
/// # Ok(())
/// # }
/// ```
pub async fn serve_with<F>(
    service: Arc<RateLimitService>,
    grpc: TcpListener,
    http: Option<TcpListener>,
    limits: ServeLimits,
    shutdown: F,
) -> io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let max_message = limits.max_message;
    let max_connections = limits.max_connections.max(1);
    let (stop_tx, stop_rx) = watch::channel(false);
    let draining = Arc::clone(&service);
    tokio::spawn(async move {
        shutdown.await;
        // The health checks fail first, as envoyproxy/ratelimit's do on
        // SIGTERM: what still reaches the service is answered while the
        // listeners close.
        draining.set_serving(false);
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        // An error means the sender is gone: stop as well.
        let _ = rx.wait_for(|stop| *stop).await;
    };

    let (health, health_service) = tonic_health::server::health_reporter();
    let mut serving = service.watch_serving();
    let status = |serving: bool| {
        if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        }
    };
    let now = *serving.borrow_and_update();
    for name in HEALTH_NAMES {
        health.set_service_status(name, status(now)).await;
    }
    // The gRPC health statuses follow the service's.
    let mut health_stop = stop_rx.clone();
    tokio::spawn(async move {
        loop {
            let changed = tokio::select! {
                // A change first: the shutdown marks the service not serving
                // just before it stops the listeners, and both are then
                // ready; picked at random, the stop left the statuses
                // `SERVING` to the end.
                biased;
                changed = serving.changed() => changed.is_ok(),
                _ = health_stop.wait_for(|stop| *stop) => false,
            };
            if !changed {
                return;
            }
            let now = *serving.borrow_and_update();
            for name in HEALTH_NAMES {
                health.set_service_status(name, status(now)).await;
            }
        }
    });
    let rls = GrpcService::new(Arc::clone(&service), max_message);
    let grpc_stop = stopped(stop_rx.clone());
    let (incoming, accepting) = Incoming::new(grpc, max_connections, limits.header_timeout);
    let grpc_task = tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
            .http2_keepalive_interval(Some(GRPC_KEEPALIVE.0))
            .http2_keepalive_timeout(Some(GRPC_KEEPALIVE.1))
            .add_service(health_service)
            .add_service(rls)
            .serve_with_incoming_shutdown(incoming, grpc_stop)
            .await;
        accepting.abort();
        served
    });
    let http_task = http.map(|listener| {
        let router = crate::http::router_with(Arc::clone(&service), &limits);
        let http_stop = stopped(stop_rx.clone());
        tokio::spawn(serve_http(
            listener,
            router,
            max_connections,
            limits.header_timeout,
            http_stop,
        ))
    });
    // From the shutdown on, the drain has its deadline.
    let drained = {
        let mut stop = stop_rx.clone();
        async move {
            let _ = stop.wait_for(|stop| *stop).await;
            tokio::time::sleep(limits.drain_timeout).await;
        }
    };
    let mut drained = pin!(drained);
    let mut grpc_task = grpc_task;
    let grpc_result = tokio::select! {
        result = &mut grpc_task => result,
        () = &mut drained => {
            grpc_task.abort();
            if let Some(task) = &http_task {
                task.abort();
            }
            return Ok(());
        }
    };
    grpc_result
        .map_err(io::Error::other)?
        .map_err(io::Error::other)?;
    if let Some(mut task) = http_task {
        tokio::select! {
            result = &mut task => result.map_err(io::Error::other)?,
            () = &mut drained => task.abort(),
        }
    }
    Ok(())
}

/// Accept on `listener` while fewer than `max` of its connections are open.
/// An error that concerns one connection (reset before it was accepted) is
/// skipped; one of the process (no file descriptor left) is waited out, as
/// hyper's and axum's servers do, rather than ending the listener.
async fn accept(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
) -> (TcpStream, OwnedSemaphorePermit) {
    loop {
        let Ok(slot) = Arc::clone(slots).acquire_owned().await else {
            // The semaphore is never closed.
            std::future::pending::<()>().await;
            unreachable!();
        };
        match listener.accept().await {
            Ok((stream, _)) => {
                // A response's frames go out as they are written: with
                // Nagle's algorithm a frame written after another waits for
                // the peer's (delayed) ACK of the first, about 40 ms, on
                // every answer. A socket that refuses the option still
                // serves, only slower.
                let _ = stream.set_nodelay(true);
                return (stream, slot);
            }
            Err(error) if is_connection_error(&error) => {}
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// The HTTP listener: HTTP/1.1 connections, at most `max_connections` at
/// once, each given `header_timeout` for a request's head and
/// [`HTTP_MAX_HEAD`] bytes for it; on `stop`, each connection finishes the
/// request it is answering and closes.
async fn serve_http<F>(
    listener: TcpListener,
    router: axum::Router,
    max_connections: usize,
    header_timeout: Duration,
    stop: F,
) where
    F: Future<Output = ()>,
{
    let slots = Arc::new(Semaphore::new(max_connections));
    let (closing, closed) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut stop = pin!(stop);
    loop {
        let (stream, slot) = tokio::select! {
            accepted = accept(&listener, &slots) => accepted,
            () = &mut stop => break,
        };
        // Reap the connections that have closed, so the set holds only the
        // open ones.
        while connections.try_join_next().is_some() {}
        let service = TowerToHyperService::new(router.clone());
        let mut closed = closed.clone();
        connections.spawn(async move {
            let _slot = slot;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .max_buf_size(HTTP_MAX_HEAD);
            let mut connection = pin!(builder.serve_connection(TokioIo::new(stream), service));
            let mut closing = false;
            loop {
                tokio::select! {
                    _ = connection.as_mut() => return,
                    _ = closed.wait_for(|stop| *stop), if !closing => {
                        closing = true;
                        connection.as_mut().graceful_shutdown();
                    }
                }
            }
        });
    }
    drop(listener);
    let _ = closing.send(true);
    while connections.join_next().await.is_some() {}
}

/// The gRPC listener's connections, at most a number of them open at once:
/// an accepting task hands each to tonic with the slot it holds until it
/// closes. A connection that has not sent HTTP/2's handshake (its preface
/// and the header of its first frame, [`HANDSHAKE_BYTES`]) within
/// `first_byte` of its accept is closed, and tonic closes one that stops
/// answering HTTP/2 pings ([`GRPC_KEEPALIVE`]), so that idle or half-open
/// connections cannot hold the slots.
struct Incoming {
    accepted: mpsc::Receiver<io::Result<Limited>>,
}

impl Incoming {
    fn new(
        listener: TcpListener,
        max: usize,
        first_byte: Duration,
    ) -> (Incoming, tokio::task::JoinHandle<()>) {
        let slots = Arc::new(Semaphore::new(max));
        // One connection accepted ahead of tonic's taking it.
        let (tx, accepted) = mpsc::channel(1);
        let task = tokio::spawn(async move {
            loop {
                // Once tonic drops the stream (the shutdown has begun), the
                // listener closes at once: a new client is refused rather
                // than accepted and left unanswered.
                let (stream, slot) = tokio::select! {
                    accepted = accept(&listener, &slots) => accepted,
                    () = tx.closed() => return,
                };
                let limited = Limited {
                    stream,
                    handshake: Some(Box::pin(tokio::time::sleep(first_byte))),
                    received: 0,
                    _slot: slot,
                };
                if tx.send(Ok(limited)).await.is_err() {
                    return;
                }
            }
        });
        (Incoming { accepted }, task)
    }
}

impl futures_core::Stream for Incoming {
    type Item = io::Result<Limited>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.accepted.poll_recv(cx)
    }
}

/// HTTP/2's client preface (24 bytes) and the 9-byte header of the SETTINGS
/// frame that must follow it: what a gRPC client sends first.
const HANDSHAKE_BYTES: usize = 24 + 9;

/// How often the gRPC listener pings an idle connection (HTTP/2 `PING`),
/// and how long it waits for the answer before closing it. Envoy and every
/// gRPC client answer pings; a socket nobody reads stops answering.
pub const GRPC_KEEPALIVE: (Duration, Duration) = (Duration::from_secs(30), Duration::from_secs(10));

/// A gRPC connection and its slot among the listener's.
struct Limited {
    stream: TcpStream,
    /// Until [`HANDSHAKE_BYTES`] are read: when they must have come by.
    handshake: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Bytes read so far, counted until the handshake's.
    received: usize,
    _slot: OwnedSemaphorePermit,
}

impl Connected for Limited {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Limited {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let filled = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        if let Some(deadline) = &mut this.handshake {
            match read {
                Poll::Ready(Ok(())) => {
                    this.received += buf.filled().len() - filled;
                    if this.received >= HANDSHAKE_BYTES {
                        this.handshake = None;
                    }
                }
                Poll::Pending if deadline.as_mut().poll(cx).is_ready() => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "HTTP/2's handshake not sent within its deadline",
                    )));
                }
                _ => {}
            }
        }
        read
    }
}

impl AsyncWrite for Limited {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
