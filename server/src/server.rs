//! Starting the service: the gRPC listener (the rate-limit and health
//! services) and the HTTP listener, until a shutdown signal.

use std::future::Future;
use std::io;
use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::server::TcpIncoming;

use crate::grpc::GrpcService;
use crate::service::RateLimitService;

/// The largest gRPC message or HTTP body accepted (default 4 MiB, tonic's
/// default): a request beyond it is refused before it is decoded in full.
pub const DEFAULT_MAX_MESSAGE: usize = 4 << 20;

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
    health
        .set_serving::<RateLimitServiceServer<GrpcService>>()
        .await;
    let rls = RateLimitServiceServer::new(GrpcService(Arc::clone(&service)))
        .max_decoding_message_size(max_message);
    let grpc_stop = stopped(stop_rx.clone());
    let grpc_task = tokio::spawn(async move {
        tonic::transport::Server::builder()
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
