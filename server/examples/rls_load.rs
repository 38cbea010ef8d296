//! `rls_load`: the rate-limit service under load over gRPC on 127.0.0.1,
//! against a no-op server on the same tonic stack.
//!
//! ```text
//! cargo run --release -p turnstile-server --example rls_load -- [--seconds 2] [--rounds 3] [--concurrency 64] [--connections 4]
//! ```
//!
//! Starts in process (a) a no-op `RateLimitService` that answers `OK`
//! without deciding and (b) turnstile-server with the in-process backend
//! (a token bucket per user, 1,000 users), each on its own runtime, and
//! drives each from a client runtime with `concurrency` requests in flight
//! over `connections` HTTP/2 connections:
//!
//! 1. at saturation (each in-flight slot sends its next request when the
//!    last is answered) for `seconds`: decisions/s and p50/p99/p999;
//! 2. paced at half of the round's saturation rate (the lower of the two
//!    servers', so both carry the same load) for `seconds`: p99, measured
//!    from each request's scheduled time (a late send counts as latency, so
//!    a stall is not hidden).
//!
//! The two servers alternate phase by phase for `rounds` rounds (the order
//! swapped each round), so that a change in the machine's load falls on
//! both. Prints each round, the medians over rounds, and the ratios the
//! service's targets are stated in.

use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService as Rls, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};
use turnstile_server::backend::InProcess;
use turnstile_server::config::Config;
use turnstile_server::server::{DEFAULT_MAX_MESSAGE, serve};
use turnstile_server::service::{Bounds, RateLimitService};

const CONFIG: &str = "\
domain: load
descriptors:
  - key: user
    rate_limit: { unit: second, requests_per_unit: 1000000, algorithm: token_bucket }
";

const USERS: usize = 1_000;

/// Answers OK to every descriptor without deciding.
#[derive(Debug)]
struct Noop;

#[tonic::async_trait]
impl Rls for Noop {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let statuses = request
            .get_ref()
            .descriptors
            .iter()
            .map(|_| DescriptorStatus {
                code: Code::Ok as i32,
                ..DescriptorStatus::default()
            })
            .collect();
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses,
            ..RateLimitResponse::default()
        }))
    }
}

struct Args {
    seconds: f64,
    rounds: usize,
    concurrency: usize,
    connections: usize,
}

fn args() -> Result<Args, String> {
    let mut parsed = Args {
        seconds: 2.0,
        rounds: 3,
        concurrency: 64,
        connections: 4,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = || format!("{flag} {value}: give a positive number");
        match flag.as_str() {
            "--seconds" => {
                parsed.seconds = value.parse().ok().filter(|s| *s > 0.0).ok_or_else(bad)?;
            }
            "--rounds" => {
                parsed.rounds = value.parse().ok().filter(|n| *n > 0).ok_or_else(bad)?;
            }
            "--concurrency" => {
                parsed.concurrency = value.parse().ok().filter(|n| *n > 0).ok_or_else(bad)?;
            }
            "--connections" => {
                parsed.connections = value.parse().ok().filter(|n| *n > 0).ok_or_else(bad)?;
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(parsed)
}

/// Start a server on its own two-thread runtime; returns its address.
fn start_server(turnstile: bool) -> Result<std::net::SocketAddr, Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    if turnstile {
        let files = vec![("load.yaml".to_string(), CONFIG.to_string())];
        let config = Config::from_files(&files, &InProcess::default())?;
        let service = Arc::new(RateLimitService::new(config, Bounds::default(), false));
        runtime.spawn(serve(
            service,
            listener,
            None,
            DEFAULT_MAX_MESSAGE,
            std::future::pending(),
        ));
    } else {
        runtime.spawn(
            tonic::transport::Server::builder()
                .add_service(RateLimitServiceServer::new(Noop))
                .serve_with_incoming(TcpIncoming::from(listener)),
        );
    }
    // The runtime serves until the process ends.
    std::thread::spawn(move || runtime.block_on(std::future::pending::<()>()));
    Ok(addr)
}

fn request(i: usize) -> RateLimitRequest {
    RateLimitRequest {
        domain: "load".to_string(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".to_string(),
                value: format!("u{}", i % USERS),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

struct Run {
    rate: f64,
    latencies: Vec<u64>,
    errors: u64,
}

impl Run {
    fn percentile(&mut self, p: f64) -> Duration {
        self.latencies.sort_unstable();
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let i = ((self.latencies.len() as f64 * p).ceil() as usize).clamp(1, self.latencies.len());
        Duration::from_nanos(self.latencies[i - 1])
    }
}

/// Drive `clients` with `concurrency` slots for `seconds`; `pace` is the
/// total request rate to hold (`None`: saturation).
async fn drive(
    clients: &[RateLimitServiceClient<Channel>],
    concurrency: usize,
    seconds: f64,
    pace: Option<f64>,
) -> Run {
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::with_capacity(concurrency);
    for slot in 0..concurrency {
        let mut client = clients[slot % clients.len()].clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            // Paced: this slot's share of the rate, offset so slots interleave.
            let interval = pace.map(|rate| Duration::from_secs_f64(concurrency as f64 / rate));
            let mut next = start
                + interval.map_or(Duration::ZERO, |i| {
                    i.mul_f64(slot as f64 / concurrency as f64)
                });
            let mut i = slot;
            loop {
                if interval.is_some() {
                    tokio::time::sleep_until(next.into()).await;
                }
                let sent = if interval.is_some() {
                    next
                } else {
                    Instant::now()
                };
                if sent >= end {
                    break;
                }
                match client.should_rate_limit(request(i)).await {
                    Ok(_) => latencies.push(sent.elapsed().as_nanos() as u64),
                    Err(_) => errors += 1,
                }
                i += concurrency;
                if let Some(interval) = interval {
                    next += interval;
                }
            }
            (latencies, errors)
        }));
    }
    let mut run = Run {
        rate: 0.0,
        latencies: Vec::new(),
        errors: 0,
    };
    for task in tasks {
        if let Ok((latencies, errors)) = task.await {
            run.latencies.extend(latencies);
            run.errors += errors;
        }
    }
    run.rate = run.latencies.len() as f64 / start.elapsed().as_secs_f64();
    run
}

#[derive(Clone, Copy, Default)]
struct Measured {
    rate: f64,
    p50: Duration,
    p99: Duration,
    p999: Duration,
    half_p99: Duration,
    errors: u64,
}

async fn connect(
    addr: std::net::SocketAddr,
    args: &Args,
) -> Result<Vec<RateLimitServiceClient<Channel>>, Box<dyn std::error::Error>> {
    let mut clients = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        // One `connect` per client: its own HTTP/2 connection.
        clients.push(RateLimitServiceClient::connect(format!("http://{addr}")).await?);
    }
    // Warm-up: connections, the limiter's keys, the allocator.
    drive(&clients, args.concurrency, 0.5, None).await;
    Ok(clients)
}

/// One round: both servers at saturation, then both paced at half the
/// lower saturation rate; `order` says which goes first.
async fn round(
    servers: [&[RateLimitServiceClient<Channel>]; 2],
    args: &Args,
    swap: bool,
) -> [Measured; 2] {
    let order = if swap { [1, 0] } else { [0, 1] };
    let mut out = [Measured::default(); 2];
    for &s in &order {
        let mut run = drive(servers[s], args.concurrency, args.seconds, None).await;
        out[s] = Measured {
            rate: run.rate,
            p50: run.percentile(0.50),
            p99: run.percentile(0.99),
            p999: run.percentile(0.999),
            half_p99: Duration::ZERO,
            errors: run.errors,
        };
    }
    let pace = out[0].rate.min(out[1].rate) / 2.0;
    for &s in &order {
        let mut run = drive(servers[s], args.concurrency, args.seconds, Some(pace)).await;
        out[s].half_p99 = run.percentile(0.99);
        out[s].errors += run.errors;
    }
    out
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = match args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("rls_load: {message}");
            std::process::exit(2);
        }
    };
    let noop_addr = start_server(false)?;
    let turnstile_addr = start_server(true)?;
    let client = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "rls_load: {} in flight over {} connections, {} s per phase; load average {}",
        args.concurrency,
        args.connections,
        args.seconds,
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let noop = client.block_on(connect(noop_addr, &args))?;
    let turnstile = client.block_on(connect(turnstile_addr, &args))?;
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "| round | server | decisions/s | p50 µs | p99 µs | p999 µs | p99 at half saturation µs | errors |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    let names = ["no-op", "turnstile in-process"];
    let mut rounds = Vec::with_capacity(args.rounds);
    for r in 0..args.rounds {
        let measured = client.block_on(round([&noop, &turnstile], &args, r % 2 == 1));
        for (name, m) in names.iter().zip(&measured) {
            println!(
                "| {} | {name} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} |",
                r + 1,
                m.rate,
                us(m.p50),
                us(m.p99),
                us(m.p999),
                us(m.half_p99),
                m.errors
            );
        }
        rounds.push(measured);
    }
    let throughputs: Vec<f64> = rounds.iter().map(|m| m[1].rate / m[0].rate).collect();
    let latencies: Vec<f64> = rounds
        .iter()
        .map(|m| us(m[1].half_p99) / us(m[0].half_p99))
        .collect();
    let spread = |v: &[f64]| {
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
        format!("{lo:.3}–{hi:.3}")
    };
    let throughput = median(throughputs.clone());
    let latency = median(latencies.clone());
    println!(
        "throughput ratio, median of rounds {throughput:.3} (rounds {}; target >= 0.9: {}); p99 at half saturation ratio {latency:.3} (rounds {}; target <= 1.1: {})",
        spread(&throughputs),
        if throughput >= 0.9 { "met" } else { "missed" },
        spread(&latencies),
        if latency <= 1.1 { "met" } else { "missed" },
    );
    Ok(())
}
