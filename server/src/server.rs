//! Starting the service: the gRPC listener (the rate-limit and health
//! services) and the HTTP listener, until a shutdown signal.

use std::future::Future;
use std::io;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::server::TcpIncoming;

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
    let grpc_task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
            .add_service(health_service)
            .add_service(rls)
            .serve_with_incoming_shutdown(TcpIncoming::from(grpc), grpc_stop)
            .await
    });
    let http_task = http.map(|listener| {
        let router = crate::http::router(Arc::clone(&service), max_message);
        let http_stop = stopped(stop_rx.clone());
        tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(http_stop)
                .await
        })
    });
    let grpc_result = grpc_task.await.map_err(io::Error::other)?;
    grpc_result.map_err(io::Error::other)?;
    if let Some(task) = http_task {
        task.await.map_err(io::Error::other)??;
    }
    Ok(())
}
