//! A service started in process on 127.0.0.1:0, and a client built from the
//! same protobuf types.

#![allow(
    dead_code,
    unreachable_pub,
    missing_docs,
    missing_debug_implementations
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tonic::transport::Channel;
use turnstile::ManualClock;
use turnstile_server::backend::InProcess;
use turnstile_server::clock::ServiceClock;
use turnstile_server::config::Config;
use turnstile_server::server::{ServeLimits, serve_with};
use turnstile_server::service::{
    Bounds, DEFAULT_MAX_OVERRIDE_LIMITS, RateLimitService, ResponseHeaders,
};

pub struct Running {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub client: RateLimitServiceClient<Channel>,
    pub service: Arc<RateLimitService>,
    pub clock: ManualClock,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

pub struct Options {
    pub bounds: Bounds,
    pub headers: bool,
    pub max_keys: usize,
    /// `with_overrides`' bound, as the binary sets it.
    pub max_overrides: usize,
    /// `with_response_headers`, when set (in place of `headers`).
    pub response_headers: Option<ResponseHeaders>,
    /// What the listeners hold to.
    pub limits: ServeLimits,
    /// `with_stop_increments`.
    pub stop_increments: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            bounds: Bounds::default(),
            headers: false,
            max_keys: 10_000,
            max_overrides: DEFAULT_MAX_OVERRIDE_LIMITS,
            response_headers: None,
            limits: ServeLimits::default(),
            stop_increments: false,
        }
    }
}

/// Start a service on `yaml` (one file per entry), on a manual clock at 0.
pub async fn start(files: &[(&str, &str)], options: Options) -> Running {
    let clock = ManualClock::new();
    let backend = Arc::new(InProcess::new(
        ServiceClock::manual(clock.clone()),
        options.max_keys,
    ));
    let files: Vec<(String, String)> = files
        .iter()
        .map(|(name, text)| (name.to_string(), text.to_string()))
        .collect();
    let config = Config::from_files(&files, &*backend).expect("a valid configuration");
    let mut service = RateLimitService::new(config, options.bounds, options.headers)
        .with_overrides(backend, options.max_overrides)
        .with_stop_increments(options.stop_increments);
    if let Some(headers) = options.response_headers {
        service = service.with_response_headers(headers);
    }
    let service = Arc::new(service);
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let http = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let (grpc_addr, http_addr) = (grpc.local_addr().unwrap(), http.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve_with(
        Arc::clone(&service),
        grpc,
        Some(http),
        options.limits,
        async move {
            let _ = stopped.await;
        },
    ));
    let client = RateLimitServiceClient::connect(format!("http://{grpc_addr}"))
        .await
        .expect("connect")
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20);
    Running {
        grpc: grpc_addr,
        http: http_addr,
        client,
        service,
        clock,
        stop: Some(stop),
        task: Some(task),
    }
}

impl Running {
    pub async fn ask(
        &mut self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        self.client
            .should_rate_limit(request)
            .await
            .map(|r| r.into_inner())
    }

    pub async fn decide(&mut self, request: RateLimitRequest) -> RateLimitResponse {
        self.ask(request).await.expect("an answer")
    }

    /// Send the shutdown signal and return at once: `serve` drains, and
    /// returns once no connection holds a request open.
    pub fn begin_shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Whether `serve` has returned.
    pub fn finished(&self) -> bool {
        self.task.as_ref().is_none_or(|task| task.is_finished())
    }

    /// Stop the service (if [`begin_shutdown`](Self::begin_shutdown) has
    /// not); `serve` must return Ok.
    pub async fn stop(mut self) {
        self.begin_shutdown();
        let result = self.task.take().unwrap().await.expect("the server task");
        assert!(result.is_ok(), "{result:?}");
    }
}

pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

pub fn with_hits(mut d: RateLimitDescriptor, hits: u64) -> RateLimitDescriptor {
    d.hits_addend = Some(UInt64Value { value: hits });
    d
}

pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors,
        hits_addend: 0,
    }
}

pub fn ok(status: &DescriptorStatus) -> bool {
    status.code == Code::Ok as i32
}

pub fn over(status: &DescriptorStatus) -> bool {
    status.code == Code::OverLimit as i32
}

pub fn overall_ok(response: &RateLimitResponse) -> bool {
    response.overall_code == Code::Ok as i32
}

pub fn reset_nanos(status: &DescriptorStatus) -> Option<u64> {
    status
        .duration_until_reset
        .as_ref()
        .map(|d| d.seconds as u64 * 1_000_000_000 + d.nanos as u64)
}

/// One HTTP/1.1 request to `addr` on a connection of its own: the status
/// and the body.
pub async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let status = answer[9..12].parse().unwrap();
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// The system allocator, counting the bytes held and the most held at once,
/// so that a test can bound what a request made the process hold (a test
/// binary installs it with `#[global_allocator]`).
pub struct Counting;

pub static HELD: AtomicUsize = AtomicUsize::new(0);
pub static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to `System` unchanged; the counters are
// only arithmetic on the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `System::alloc`, with the caller's layout.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            // Relaxed: statistics, read after the request has completed.
            let held = HELD.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(held, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        // SAFETY: as `System::dealloc`, with the caller's pointer and layout.
        unsafe { System.dealloc(p, layout) };
        // Relaxed: statistics only.
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}
