//! The service's Redis backends under load, beside the in-process backend:
//! decisions per second at saturation (many concurrent gRPC streams) and
//! latency with one stream, and a bare Redis `PING` round trip on the same
//! kind of connection.
//!
//! ```text
//! redis-server --port 6390 --save "" --appendonly no &
//! cargo run --release -p turnstile-server --example rls_redis_load -- redis://127.0.0.1:6390/ [SECONDS] [STREAMS]
//! ```
//!
//! Client and servers share one process and its cores, as they share the
//! machine in any local run: the ratios, not the absolute figures, are the
//! result.

use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tokio::sync::oneshot;
use turnstile::redis::{AsyncRedisConnection, Deadlines};
use turnstile_server::backend::{Backend, InProcess};
use turnstile_server::config::Config;
use turnstile_server::redis_backend::{RedisBackend, RedisMode, RedisOptions};
use turnstile_server::server::{DEFAULT_MAX_MESSAGE, serve};
use turnstile_server::service::{Bounds, RateLimitService};

/// A limit the load never reaches: every decision is an admission, so the
/// figures are the decision's cost, not the denials'.
const YAML: &str = "domain: load
descriptors:
  - key: user
    rate_limit:
      unit: second
      requests_per_unit: 1000000
      algorithm: token_bucket
";

const USERS: usize = 64;

struct Stats {
    per_second: f64,
    p50: Duration,
    p99: Duration,
}

fn request(i: usize) -> RateLimitRequest {
    RateLimitRequest {
        domain: "load".to_string(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".to_string(),
                value: format!("user-{}", i % USERS),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Serve `backend`'s limits and drive them with `streams` concurrent
/// streams (over 4 connections) for `run`.
async fn drive(backend: &dyn Backend, streams: usize, run: Duration) -> Stats {
    let files = vec![("load.yaml".to_string(), YAML.to_string())];
    let config = Config::from_files(&files, backend).expect("the load's configuration");
    let service = Arc::new(RateLimitService::new(config, Bounds::default(), false));
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = grpc.local_addr().expect("an address");
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(serve(
        service,
        grpc,
        None,
        DEFAULT_MAX_MESSAGE,
        async move {
            let _ = stopped.await;
        },
    ));
    let mut clients = Vec::new();
    for _ in 0..streams.clamp(1, 4) {
        clients.push(
            RateLimitServiceClient::connect(format!("http://{addr}"))
                .await
                .expect("connect"),
        );
    }
    // Warm up: connections, leases, scripts loaded.
    for (i, client) in clients.iter_mut().enumerate() {
        for j in 0..USERS {
            let _ = client.should_rate_limit(request(i + j)).await;
        }
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..streams {
        let mut client = clients[s % clients.len()].clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut i = s;
            while start.elapsed() < run {
                let sent = Instant::now();
                let answer = client.should_rate_limit(request(i)).await;
                latencies.push(sent.elapsed());
                assert!(answer.is_ok(), "{answer:?}");
                i += streams;
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("a load task"));
    }
    let elapsed = start.elapsed();
    let _ = stop.send(());
    let _ = server.await;
    latencies.sort_unstable();
    Stats {
        per_second: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50: percentile(&latencies, 0.5),
        p99: percentile(&latencies, 0.99),
    }
}

fn show(name: &str, stats: &Stats) {
    println!(
        "{name:<28} {:>10.0}/s  p50 {:>9.1} µs  p99 {:>9.1} µs",
        stats.per_second,
        stats.p50.as_secs_f64() * 1e6,
        stats.p99.as_secs_f64() * 1e6
    );
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".to_string());
    let seconds: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let streams: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(64);
    let run = Duration::from_secs_f64(seconds);
    // Deadlines far above a loaded machine's round trip: the load measures
    // decisions, not the failure policy.
    let deadlines = Deadlines::default()
        .connect(Duration::from_secs(1))
        .and_then(|d| d.response(Duration::from_secs(1)))
        .expect("valid deadlines");
    let options = |mode| RedisOptions {
        mode,
        deadlines,
        max_lease: 1_000,
        ..RedisOptions::default()
    };
    let in_process = InProcess::default();
    let leased = RedisBackend::connect(&url, options(RedisMode::Leased))
        .await
        .expect("a Redis URL");
    let exact = RedisBackend::connect(&url, options(RedisMode::Exact))
        .await
        .expect("a Redis URL");

    // The machine is shared: the in-process and leased runs alternate, so
    // that each ratio compares neighbours in time.
    println!("saturation: {streams} streams, {seconds} s each, three rounds");
    for round in 1..=3 {
        let base = drive(&in_process, streams, run).await;
        show("in-process", &base);
        let lease = drive(&leased, streams, run).await;
        show("redis leased", &lease);
        println!(
            "round {round}: leased / in-process throughput {:.2} (target >= 0.8)",
            lease.per_second / base.per_second
        );
    }
    let ex = drive(&exact, streams, run).await;
    show("redis exact", &ex);

    println!("one stream, {seconds} s each");
    let base1 = drive(&in_process, 1, run).await;
    show("in-process", &base1);
    let exact1 = drive(&exact, 1, run).await;
    show("redis exact", &exact1);
    // A bare round trip on the same kind of connection (multiplexed, with
    // the same deadlines).
    let client = redis::Client::open(url.as_str()).expect("a Redis URL");
    let mut con = deadlines.reconnecting(client).into_any();
    let mut pings = Vec::new();
    let start = Instant::now();
    while start.elapsed() < run {
        let sent = Instant::now();
        let _: String = redis::cmd("PING")
            .query_async(&mut con)
            .await
            .expect("PING");
        pings.push(sent.elapsed());
    }
    pings.sort_unstable();
    let ping50 = percentile(&pings, 0.5);
    println!(
        "{:<28} {:>10.0}/s  p50 {:>9.1} µs  p99 {:>9.1} µs",
        "redis PING",
        pings.len() as f64 / run.as_secs_f64(),
        ping50.as_secs_f64() * 1e6,
        percentile(&pings, 0.99).as_secs_f64() * 1e6
    );
    // The exact script itself, called from here on the same kind of
    // connection: a round trip and the script's own time.
    let bare = turnstile::redis::RedisLimiter::new(
        "bare",
        turnstile::TokenBucket::new(turnstile::Quota::per_second(1_000_000).expect("a quota")),
    )
    .expect("a limiter");
    let mut scripts = Vec::new();
    let start = Instant::now();
    while start.elapsed() < run {
        let sent = Instant::now();
        let decision = bare.try_acquire_async(&mut con, "k").await;
        scripts.push(sent.elapsed());
        assert!(decision.is_ok(), "{decision:?}");
    }
    scripts.sort_unstable();
    println!(
        "{:<28} {:>10.0}/s  p50 {:>9.1} µs  p99 {:>9.1} µs",
        "exact script, bare",
        scripts.len() as f64 / run.as_secs_f64(),
        percentile(&scripts, 0.5).as_secs_f64() * 1e6,
        percentile(&scripts, 0.99).as_secs_f64() * 1e6
    );
    let added = exact1.p50.saturating_sub(base1.p50);
    println!(
        "exact's added p50 latency {:.1} µs vs PING p50 {:.1} µs: {:.2} round trips (target <= 1)",
        added.as_secs_f64() * 1e6,
        ping50.as_secs_f64() * 1e6,
        added.as_secs_f64() / ping50.as_secs_f64().max(1e-9)
    );
}
