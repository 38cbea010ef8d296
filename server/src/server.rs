//! Starting the service: the gRPC listener (the rate-limit and health
//! services) and the HTTP listener, until a shutdown signal.

use std::future::Future;
use std::io;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::server::TcpIncoming;

use crate::grpc::GrpcService;
use crate::service::RateLimitService;

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
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        // An error means the sender is gone: stop as well.
        let _ = rx.wait_for(|stop| *stop).await;
    };

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<GrpcService>().await;
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
