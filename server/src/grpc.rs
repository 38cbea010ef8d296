//! `envoy.service.ratelimit.v3.RateLimitService` over tonic.

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService as Rls;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use crate::service::RateLimitService;

/// The gRPC face of a [`RateLimitService`].
#[derive(Clone, Debug)]
pub struct GrpcService(pub Arc<RateLimitService>);

#[tonic::async_trait]
impl Rls for GrpcService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        match self.0.should_rate_limit(request.get_ref()).await {
            Ok(response) => Ok(Response::new(response)),
            Err(error) => Err(Status::invalid_argument(error.to_string())),
        }
    }
}
